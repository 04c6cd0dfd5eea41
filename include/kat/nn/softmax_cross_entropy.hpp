#pragma once
/// @file
/// @brief Softmax followed by cross-entropy, fused and numerically stable.

#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/loss_kernels.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace kat::nn {

namespace detail {

/// Σ_i [log Σ_c exp(z_ic − max_c z_ic) + max_c z_ic − z_{i,y_i}] over the rows of the logits z
/// (N x C), in double, on `space`; with `with_grad` also grad(i, c) = (softmax(z_i)_c −
/// [c = y_i])·inv_n. A label outside [0, C) adds +∞ (and leaves its grad row unwritten).
template <class ExecSpace, class ZView, class LabelView>
double softmax_cross_entropy_sum(const ExecSpace &space, const ZView &z, const LabelView &labels,
                                 const ZView &grad, bool with_grad,
                                 typename ZView::non_const_value_type inv_n) {
  const std::size_t n = z.extent(0);
  const int classes = static_cast<int>(z.extent(1));
  // Captured from the host: std::numeric_limits is not callable in every device compiler.
  const double invalid = std::numeric_limits<double>::infinity();
  double total = 0;
  Kokkos::parallel_reduce(
      "kat::nn::SoftmaxCrossEntropy", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
      SoftmaxCrossEntropySum<ZView, LabelView>{z, labels, grad, classes, invalid, with_grad, inv_n},
      total);
  return total;
}

/// rdz(i, :) = inv_n (p_i ⊙ rz_i − p_i ⟨p_i, rz_i⟩) with p_i = softmax(z_i): the Hessian of
/// the mean cross-entropy with respect to the logits applied to rz, row by row.
template <class ExecSpace, class ZView>
void softmax_cross_entropy_hessian_product(const ExecSpace &space, const ZView &z, const ZView &rz,
                                           const ZView &rdz,
                                           typename ZView::non_const_value_type inv_n) {
  const int classes = static_cast<int>(z.extent(1));
  Kokkos::parallel_for("kat::nn::SoftmaxCrossEntropy::hessian_product",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, z.extent(0)),
                       SoftmaxCrossEntropyHessianProduct<ZView>{z, rz, rdz, classes, inv_n});
}

/// The smallest i with labels(i) outside [0, classes), or labels.extent(0) if there is none.
template <class ExecSpace, class LabelView>
std::int64_t first_invalid_label(const ExecSpace &space, const LabelView &labels, int classes) {
  const std::size_t n = labels.extent(0);
  std::int64_t first_bad = static_cast<std::int64_t>(n);
  Kokkos::parallel_reduce(
      "kat::nn::SoftmaxCrossEntropy::check_labels", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
      FirstInvalidLabel<LabelView>{labels, classes}, Kokkos::Min<std::int64_t>(first_bad));
  return first_bad;
}

} // namespace detail

/// Mean cross-entropy of softmax(logits) against integer class labels, as
/// torch.nn.CrossEntropyLoss with reduction = 'mean':
///
///   L = (1/N) Σ_i [ log Σ_c exp(z_ic) − z_{i,y_i} ],   dL/dz_ic = (softmax(z_i)_c − [c = y_i]) / N
///
/// log-sum-exp is taken after subtracting each row's maximum, so no logit overflows.
/// logits: N x C; labels: N integers in [0, C).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class SoftmaxCrossEntropy {
public:
  using execution_space = typename MemorySpace::execution_space; ///< where the loss runs
  using matrix_type = Matrix<Scalar, MemorySpace>;               ///< logits: batch x classes
  using label_view = Vector<const std::int32_t, MemorySpace>;    ///< one class index per sample

  /// The mean loss.
  /// @throws ShapeError if labels.extent(0) != logits.extent(0);
  /// @throws ValueError if a label is outside [0, C); NumericalError if a logit is not finite.
  double forward(const execution_space &space, const matrix_type &logits,
                 const label_view &labels) const {
    return run(space, logits, labels, matrix_type());
  }

  /// The mean loss, and dL/dlogits written to `grad` (N x C). Errors as forward().
  double forward_backward(const execution_space &space, const matrix_type &logits,
                          const label_view &labels, const matrix_type &grad) const {
    kat::detail::require_extent("kat::nn::SoftmaxCrossEntropy", "grad rows", logits.extent(0),
                                grad.extent(0));
    kat::detail::require_extent("kat::nn::SoftmaxCrossEntropy", "grad columns", logits.extent(1),
                                grad.extent(1));
    return run(space, logits, labels, grad);
  }

  /// rdz = ∇²_z L · rz, the Hessian of the mean loss with respect to the logits applied to
  /// rz: rdz_i = (p_i ⊙ rz_i − p_i ⟨p_i, rz_i⟩) / N with p_i = softmax(z_i); it does not
  /// depend on the labels and is positive semi-definite. The R-operator of dL/dz
  /// (Pearlmutter 1994) that kat::nn::hessian_vector_product and
  /// kat::nn::gauss_newton_vector_product use. logits, rz, rdz: N x C.
  /// @throws ShapeError if rz or rdz is not N x C, or N = 0.
  void hessian_product(const execution_space &space, const matrix_type &logits,
                       const matrix_type &rz, const matrix_type &rdz) const {
    ScopedRegion region("kat::nn::SoftmaxCrossEntropy::hessian_product");
    const char *who = "kat::nn::SoftmaxCrossEntropy::hessian_product";
    kat::detail::require_extent(who, "rz rows", logits.extent(0), rz.extent(0));
    kat::detail::require_extent(who, "rz columns", logits.extent(1), rz.extent(1));
    kat::detail::require_extent(who, "rdz rows", logits.extent(0), rdz.extent(0));
    kat::detail::require_extent(who, "rdz columns", logits.extent(1), rdz.extent(1));
    if (logits.extent(0) == 0) {
      throw ShapeError("kat::nn::SoftmaxCrossEntropy::hessian_product: the batch must not be "
                       "empty");
    }
    detail::softmax_cross_entropy_hessian_product(
        space, logits, rz, rdz, Scalar(1) / static_cast<Scalar>(logits.extent(0)));
  }

private:
  double run(const execution_space &space, const matrix_type &z, const label_view &labels,
             const matrix_type &grad) const {
    ScopedRegion region("kat::nn::SoftmaxCrossEntropy");
    const std::size_t n = z.extent(0);
    kat::detail::require_extent("kat::nn::SoftmaxCrossEntropy", "labels length", n,
                                labels.extent(0));
    if (n == 0) {
      throw ShapeError("kat::nn::SoftmaxCrossEntropy: the batch must not be empty");
    }
    const bool with_grad = grad.extent(0) != 0;
    const Scalar inv_n = Scalar(1) / static_cast<Scalar>(n);
    const double total =
        detail::softmax_cross_entropy_sum(space, z, labels, grad, with_grad, inv_n);
    if (!std::isfinite(total)) {
      report_non_finite(space, z, labels);
    }
    return total / static_cast<double>(n);
  }

  [[noreturn]] static void report_non_finite(const execution_space &space, const matrix_type &z,
                                             const label_view &labels) {
    const std::size_t n = z.extent(0);
    const int classes = static_cast<int>(z.extent(1));
    const std::int64_t first_bad = detail::first_invalid_label(space, labels, classes);
    if (first_bad < static_cast<std::int64_t>(n)) {
      std::int32_t value = 0;
      Kokkos::deep_copy(Kokkos::View<std::int32_t, Kokkos::HostSpace>(&value),
                        Kokkos::subview(labels, first_bad));
      throw ValueError(kat::detail::concat("kat::nn::SoftmaxCrossEntropy: labels(", first_bad,
                                           ") must be in [0, ", classes, "), got ", value));
    }
    throw NumericalError("kat::nn::SoftmaxCrossEntropy: the logits contain NaN or Inf");
  }
};

} // namespace kat::nn
