#pragma once
/// @file
/// @brief Dense's handle on its sparse products, behind a virtual interface so that only the
/// translation units that set a weight mask compile them.

#include "kat/core/csr_weight.hpp"
#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat::nn::detail {

/// The sparse products of a layer y = x Wᵀ with a weight mask. Dense calls them from its
/// virtual forward() and backward(), which every translation unit that creates a Dense
/// compiles; `KokkosSparse::spmv` instantiates dozens of kernels per scalar type (tens of
/// seconds of compilation), so Dense reaches them through this interface and only
/// set_weight_mask(), a non-virtual template member compiled where it is called, creates the
/// implementation (CsrProducts).
template <class Scalar, class MemorySpace> class SparseProducts {
public:
  using execution_space = typename MemorySpace::execution_space;
  using const_matrix = Matrix<const Scalar, MemorySpace>;
  using matrix = Matrix<Scalar, MemorySpace>;

  virtual ~SparseProducts() = default;
  /// Builds the structure of `active` unless built (see kat::sparse::CsrWeight::build).
  virtual void build(const execution_space &space,
                     const Kokkos::View<const std::uint8_t *, MemorySpace> &active) = 0;
  virtual bool built() const = 0;
  virtual std::size_t nnz() const = 0;
  /// y = x Wᵀ + beta y
  virtual void multiply(const execution_space &space, const const_matrix &w, const const_matrix &x,
                        Scalar beta, const matrix &y) = 0;
  /// dx = dy W
  virtual void multiply_transposed(const execution_space &space, const const_matrix &w,
                                   const const_matrix &dy, const matrix &dx) = 0;
  /// dW (+)= mask ⊙ dyᵀ x
  virtual void sampled_gradient(const execution_space &space, const const_matrix &dy,
                                const const_matrix &x, const matrix &dw, bool accumulate) = 0;
};

/// SparseProducts over a kat::sparse::CsrWeight.
template <class Scalar, class MemorySpace>
class CsrProducts final : public SparseProducts<Scalar, MemorySpace> {
  using base = SparseProducts<Scalar, MemorySpace>;

public:
  using typename base::const_matrix;
  using typename base::execution_space;
  using typename base::matrix;

  CsrProducts(std::size_t rows, std::size_t cols) : csr_(rows, cols) {}

  void build(const execution_space &space,
             const Kokkos::View<const std::uint8_t *, MemorySpace> &active) override {
    if (!csr_.built()) {
      csr_.build(space, active);
    }
  }
  bool built() const override { return csr_.built(); }
  std::size_t nnz() const override { return csr_.nnz(); }
  void multiply(const execution_space &space, const const_matrix &w, const const_matrix &x,
                Scalar beta, const matrix &y) override {
    csr_.multiply(space, w, x, beta, y);
  }
  void multiply_transposed(const execution_space &space, const const_matrix &w,
                           const const_matrix &dy, const matrix &dx) override {
    csr_.multiply_transposed(space, w, dy, Scalar(0), dx);
  }
  void sampled_gradient(const execution_space &space, const const_matrix &dy, const const_matrix &x,
                        const matrix &dw, bool accumulate) override {
    csr_.sampled_gradient(space, dy, x, dw, accumulate);
  }

private:
  kat::sparse::CsrWeight<Scalar, MemorySpace> csr_;
};

} // namespace kat::nn::detail
