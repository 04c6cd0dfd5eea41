#pragma once
/// @file
/// @brief The kernels of the losses (MSELoss, SoftmaxCrossEntropy) as named functors.

#include "kat/core/math.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// sum += (y_i − t_i)² in double, and with `with_grad` grad_i = scale·(y_i − t_i).
template <class Scalar> struct SquaredErrorSum {
  const Scalar *y;
  const Scalar *t;
  Scalar *grad;
  bool with_grad;
  Scalar scale;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, double &sum) const {
    const Scalar d = y[i] - t[i];
    sum += static_cast<double>(d) * static_cast<double>(d);
    if (with_grad) {
      grad[i] = scale * d;
    }
  }
};

/// out_i = scale·r_i: MSELoss's Hessian (2/(N·D) times the identity) applied to r.
template <class Scalar> struct MSEHessianProduct {
  Scalar scale;
  const Scalar *r;
  Scalar *out;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const { out[i] = scale * r[i]; }
};

/// Row i's softmax cross-entropy added to sum in double, and with `with_grad` its gradient row
/// (softmax − one-hot)·inv_n; a label outside [0, classes) adds `invalid` (+∞).
template <class ZView, class LabelView> struct SoftmaxCrossEntropySum {
  using Scalar = typename ZView::non_const_value_type;
  ZView z;
  LabelView labels;
  ZView grad;
  int classes;
  double invalid;
  bool with_grad;
  Scalar inv_n;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, double &sum) const {
    const int label = labels(i);
    Scalar zmax = z(i, 0);
    for (int c = 1; c < classes; ++c) {
      zmax = z(i, c) > zmax ? z(i, c) : zmax;
    }
    Scalar denom = 0;
    for (int c = 0; c < classes; ++c) {
      denom += math::exp(z(i, c) - zmax);
    }
    if (label < 0 || label >= classes) {
      sum += invalid; // reported precisely by the caller
      return;
    }
    // (zmax - z_y) first: adding log(denom) to a large zmax would round it away.
    sum += static_cast<double>((zmax - z(i, label)) + math::log(denom));
    if (with_grad) {
      const Scalar inv_denom = Scalar(1) / denom;
      for (int c = 0; c < classes; ++c) {
        const Scalar p = math::exp(z(i, c) - zmax) * inv_denom;
        grad(i, c) = (p - (c == label ? Scalar(1) : Scalar(0))) * inv_n;
      }
    }
  }
};

/// rdz(i, :) = inv_n (p_i ⊙ rz_i − p_i ⟨p_i, rz_i⟩), p_i = softmax(z_i), for row i.
template <class ZView> struct SoftmaxCrossEntropyHessianProduct {
  using Scalar = typename ZView::non_const_value_type;
  ZView z;
  ZView rz;
  ZView rdz;
  int classes;
  Scalar inv_n;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    Scalar zmax = z(i, 0);
    for (int c = 1; c < classes; ++c) {
      zmax = z(i, c) > zmax ? z(i, c) : zmax;
    }
    Scalar denom = 0;
    Scalar dot = 0;
    for (int c = 0; c < classes; ++c) {
      const Scalar e = math::exp(z(i, c) - zmax);
      denom += e;
      dot += e * rz(i, c);
    }
    const Scalar inv_denom = Scalar(1) / denom;
    const Scalar mean = dot * inv_denom; // ⟨p_i, rz_i⟩
    for (int c = 0; c < classes; ++c) {
      const Scalar p = math::exp(z(i, c) - zmax) * inv_denom;
      rdz(i, c) = p * (rz(i, c) - mean) * inv_n;
    }
  }
};

/// m = min(m, i) where labels(i) is outside [0, classes) (with a Kokkos::Min reducer).
template <class LabelView> struct FirstInvalidLabel {
  LabelView labels;
  int classes;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, std::int64_t &m) const {
    if ((labels(i) < 0 || labels(i) >= classes) && static_cast<std::int64_t>(i) < m) {
      m = static_cast<std::int64_t>(i);
    }
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
