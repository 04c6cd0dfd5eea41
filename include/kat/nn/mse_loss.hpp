#pragma once
/// @file
/// @brief Mean squared error.

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/loss_kernels.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>

namespace kat::nn {

namespace detail {

/// Σ_i (y_i − t_i)² in double over `count` contiguous elements, on `space`; with `with_grad`
/// also grad_i = scale·(y_i − t_i).
template <class ExecSpace, class Scalar>
double squared_error_sum(const ExecSpace &space, const Scalar *y, const Scalar *t, Scalar *grad,
                         std::size_t count, bool with_grad, Scalar scale) {
  double total = 0;
  Kokkos::parallel_reduce("kat::nn::MSELoss", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
                          SquaredErrorSum<Scalar>{y, t, grad, with_grad, scale}, total);
  return total;
}

} // namespace detail

/// Mean squared error over all N·D elements, as torch.nn.MSELoss with reduction = 'mean':
///
///   L = (1/(N·D)) Σ_ij (y_ij − t_ij)²,   dL/dy_ij = 2 (y_ij − t_ij) / (N·D)
///
/// prediction y and target t: N x D.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class MSELoss {
public:
  using execution_space = typename MemorySpace::execution_space; ///< where the loss runs
  using matrix_type = Matrix<Scalar, MemorySpace>; ///< predictions and targets: batch x outputs
  using const_matrix_type = Matrix<const Scalar, MemorySpace>; ///< a read-only matrix

  /// The mean loss.
  /// @throws ShapeError if the shapes differ or are empty; NumericalError if the loss is not
  /// finite.
  double forward(const execution_space &space, const matrix_type &y,
                 const const_matrix_type &target) const {
    return run(space, y, target, matrix_type());
  }

  /// The mean loss, and dL/dy written to `grad` (N x D). Errors as forward().
  double forward_backward(const execution_space &space, const matrix_type &y,
                          const const_matrix_type &target, const matrix_type &grad) const {
    kat::detail::require_extent("kat::nn::MSELoss", "grad rows", y.extent(0), grad.extent(0));
    kat::detail::require_extent("kat::nn::MSELoss", "grad columns", y.extent(1), grad.extent(1));
    return run(space, y, target, grad);
  }

  /// rdy = ∇²_y L · ry = 2 ry / (N·D), the Hessian of the mean loss with respect to the
  /// prediction applied to ry (the R-operator of dL/dy, Pearlmutter 1994); y, ry, rdy: N x D.
  /// @throws ShapeError if ry or rdy is not N x D, or y is empty.
  void hessian_product(const execution_space &space, const matrix_type &y, const matrix_type &ry,
                       const matrix_type &rdy) const {
    ScopedRegion region("kat::nn::MSELoss::hessian_product");
    const char *who = "kat::nn::MSELoss::hessian_product";
    kat::detail::require_extent(who, "ry rows", y.extent(0), ry.extent(0));
    kat::detail::require_extent(who, "ry columns", y.extent(1), ry.extent(1));
    kat::detail::require_extent(who, "rdy rows", y.extent(0), rdy.extent(0));
    kat::detail::require_extent(who, "rdy columns", y.extent(1), rdy.extent(1));
    const std::size_t count = y.extent(0) * y.extent(1);
    if (count == 0) {
      throw ShapeError("kat::nn::MSELoss::hessian_product: the prediction must not be empty");
    }
    const Scalar scale = Scalar(2) / static_cast<Scalar>(count);
    const Scalar *r = ry.data();
    Scalar *out = rdy.data();
    Kokkos::parallel_for("kat::nn::MSELoss::hessian_product",
                         Kokkos::RangePolicy<execution_space>(space, 0, count),
                         detail::MSEHessianProduct<Scalar>{scale, r, out});
  }

private:
  double run(const execution_space &space, const matrix_type &y, const const_matrix_type &t,
             const matrix_type &grad) const {
    ScopedRegion region("kat::nn::MSELoss");
    kat::detail::require_extent("kat::nn::MSELoss", "target rows", y.extent(0), t.extent(0));
    kat::detail::require_extent("kat::nn::MSELoss", "target columns", y.extent(1), t.extent(1));
    const std::size_t count = y.extent(0) * y.extent(1);
    if (count == 0) {
      throw ShapeError("kat::nn::MSELoss: the prediction must not be empty");
    }
    const bool with_grad = grad.extent(0) != 0;
    const Scalar scale = Scalar(2) / static_cast<Scalar>(count);
    const double total =
        detail::squared_error_sum(space, y.data(), t.data(), grad.data(), count, with_grad, scale);
    if (!std::isfinite(total)) {
      throw NumericalError("kat::nn::MSELoss: the prediction or target contains NaN or Inf");
    }
    return total / static_cast<double>(count);
  }
};

} // namespace kat::nn
