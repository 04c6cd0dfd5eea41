#pragma once
/// @file
/// @brief A growable scratch buffer that hands out matrices of any shape that fits.

#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace kat {

/// Reusable device memory for activations and other per-step temporaries. A matrix of
/// rows x cols is an unmanaged LayoutLeft view over the first rows * cols scalars, so a last
/// partial batch reuses the full batch's memory: after the first step of a given batch size
/// no step allocates.
template <class Scalar, class MemorySpace = DefaultMemorySpace> class Workspace {
public:
  /// An empty workspace; `label` names its allocations.
  explicit Workspace(std::string label = "kat::Workspace") : label_(std::move(label)) {}

  /// A rows x cols matrix; grows (reallocates, contents lost) when it does not fit.
  Matrix<Scalar, MemorySpace> matrix(std::size_t rows, std::size_t cols) {
    const std::size_t need = rows * cols;
    if (need > data_.extent(0)) {
      data_ = Vector<Scalar, MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label_),
                                          need);
      ++allocations_;
    }
    return Matrix<Scalar, MemorySpace>(data_.data(), rows, cols);
  }

  /// Number of scalars currently allocated.
  std::size_t capacity() const { return data_.extent(0); }
  /// Number of (re)allocations so far; constant in a steady-state loop.
  std::size_t allocations() const { return allocations_; }

private:
  std::string label_;
  Vector<Scalar, MemorySpace> data_;
  std::size_t allocations_ = 0;
};

} // namespace kat
