#pragma once
/// @file
/// @brief The element-wise kernels of the activations (ReLU, Tanh, Sigmoid, GELU) as named
/// functors, over raw contiguous spans.

#include "kat/core/bfloat16.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// out[i] = dy[i] where y[i] > 0, 0 elsewhere (relu_mask).
template <class Value> struct ReluMask {
  const Value *yp;
  const Value *dyp;
  Value *op;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    // Both loaded, then a select: vectorized (a conditional load of dy is a branch that
    // mispredicts half the time).
    const Value d = dyp[i];
    op[i] = yp[i] > Value(0) ? d : Value(0);
  }
};

/// y[i] = max(0, x[i]) on bf16 values (a ReLU on a layout that stores bf16):
/// exact, as in fp32 (NaN gives 0, as `x > 0 ? x : 0` does).
struct ReluForwardBf16 {
  const bfloat16 *xp;
  bfloat16 *yp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const bfloat16 x = xp[i];
    yp[i] = x.to_float() > 0.0f ? x : bfloat16{};
  }
};

/// out[i] = dy[i] where y[i] > 0, 0 elsewhere, on bf16 values (ReluMask's bf16 form).
struct ReluMaskBf16 {
  const bfloat16 *yp;
  const bfloat16 *dyp;
  bfloat16 *op;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const bfloat16 d = dyp[i];
    op[i] = yp[i].to_float() > 0.0f ? d : bfloat16{};
  }
};

/// y[i] = Op::f(x[i]): an activation's forward (Activation, GELU).
template <class Op, class Scalar> struct ActivationForward {
  const Scalar *xp;
  Scalar *yp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const { yp[i] = Op::f(xp[i]); }
};

/// dx[i] = Op::backward(y[i], dy[i]): an activation's backward from its output y.
template <class Op, class Scalar> struct ActivationBackward {
  const Scalar *yp;
  const Scalar *dyp;
  Scalar *dxp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    dxp[i] = Op::backward(yp[i], dyp[i]);
  }
};

/// R{y}[i] = Op::forward_r(y[i], R{x}[i]): an activation's R-operator forward.
template <class Op, class Scalar> struct ActivationForwardR {
  const Scalar *yp;
  const Scalar *rxp;
  Scalar *ryp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    ryp[i] = Op::forward_r(yp[i], rxp[i]);
  }
};

/// R{dx}[i] = Op::backward_r(y[i], R{x}[i], dy[i], R{dy}[i]): an activation's R-operator backward.
template <class Op, class Scalar> struct ActivationBackwardR {
  const Scalar *yp;
  const Scalar *rxp;
  const Scalar *dyp;
  const Scalar *rdyp;
  Scalar *rdxp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    rdxp[i] = Op::backward_r(yp[i], rxp[i], dyp[i], rdyp[i]);
  }
};

/// y[i] = Op::f(x[i]) and g[i] = Op::d1(x[i]) from one evaluation (Op::f_and_d1): a training
/// forward that keeps the derivative for backward (GELU).
template <class Op, class Scalar> struct ActivationForwardWithDerivative {
  const Scalar *xp;
  Scalar *yp;
  Scalar *gp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    Scalar g;
    yp[i] = Op::f_and_d1(xp[i], g);
    gp[i] = g;
  }
};

/// out[i] = Op::d1(x[i]) * d[i], f'(x) ⊙ d (GELU: dx from dy, R{y} from R{x}).
template <class Op, class Scalar> struct TimesDerivative {
  const Scalar *x;
  const Scalar *d;
  Scalar *out;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    out[i] = Op::d1(x[i]) * d[i];
  }
};

/// R{dx}[i] = Op::d1(x) R{dy} + Op::d2(x) R{x} dy, from the input x (GELU's backward_r).
template <class Op, class Scalar> struct InputActivationBackwardR {
  const Scalar *x;
  const Scalar *rx;
  const Scalar *dy;
  const Scalar *rdy;
  Scalar *rdx;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const Scalar xi = x[i];
    rdx[i] = Op::d1(xi) * rdy[i] + Op::d2(xi) * rx[i] * dy[i];
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
