#pragma once
/// @file
/// @brief GELU activation, the exact form x·Φ(x).

#include "kat/core/detail/float_math.hpp"
#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/activation_kernels.hpp"
#include "kat/nn/detail/element_product.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <string>
#include <type_traits>

namespace kat::nn {

namespace detail {

/// GELU and its first two derivatives at x, from Φ(x) = (1 + erf(x/√2))/2 and
/// φ(x) = exp(−x²/2)/√(2π):
///   f = x Φ,  f' = Φ + x φ,  f'' = φ (2 − x²)  (since φ' = −x φ).
/// Φ is evaluated as erfc(−x/√2)/2, the same function without the cancellation of 1 + erf for
/// x << 0 (in float, 1 + erf(−5/√2) keeps one digit; in double, x = −10 gives 0 instead of
/// −7.6e-23). f'' is formed as 2φ − (xφ)x, so that a huge |x| gives 0 rather than 0·∞ = NaN.
/// In float, Φ and φ come from kat::math::detail::normal_cdf / normal_cdf_pdf (arithmetic only,
/// relative error within 1e-6), which vectorize where erfcf and expf, scalar libm
/// calls, did not: GELU's kernels ran 5 ns an element on a host in them. double keeps libm's.
struct GELUOp {
  template <class T> KOKKOS_INLINE_FUNCTION static T cdf(T x) {
    if constexpr (std::is_same_v<T, float>) {
      return math::detail::normal_cdf(x);
    } else {
      return T(0.5) * math::erfc(x * T(-0.70710678118654752440));
    }
  }
  template <class T> KOKKOS_INLINE_FUNCTION static T pdf(T x) {
    if constexpr (std::is_same_v<T, float>) {
      return math::detail::normal_pdf(x);
    } else {
      return T(0.39894228040143267794) * math::exp(T(-0.5) * x * x);
    }
  }
  template <class T> KOKKOS_INLINE_FUNCTION static T f(T x) { return x * cdf(x); }
  /// f(x), and f'(x) into d1: one evaluation of Φ and φ for both (GELU's training forward;
  /// d1() alone is the same evaluation, so a kept derivative equals a recomputed one).
  template <class T> KOKKOS_INLINE_FUNCTION static T f_and_d1(T x, T &d1) {
    T c, p;
    if constexpr (std::is_same_v<T, float>) {
      math::detail::normal_cdf_pdf(x, c, p);
    } else {
      c = cdf(x);
      p = pdf(x);
    }
    d1 = c + x * p;
    return x * c;
  }
  template <class T> KOKKOS_INLINE_FUNCTION static T d1(T x) {
    T d;
    f_and_d1(x, d);
    return d;
  }
  template <class T> KOKKOS_INLINE_FUNCTION static T d2(T x) {
    const T p = pdf(x);
    return T(2) * p - (x * p) * x;
  }
};

/// y = GELU(x) over `count` contiguous values.
template <class ExecSpace, class Scalar>
void gelu_forward(const ExecSpace &space, std::size_t count, const Scalar *x, Scalar *y) {
  parallel_for_elements("kat::nn::GELU::forward", space, count,
                        ActivationForward<GELUOp, Scalar>{x, y});
}

/// y = GELU(x) and g = GELU'(x) over `count` contiguous values.
template <class ExecSpace, class Scalar>
void gelu_forward_with_derivative(const ExecSpace &space, std::size_t count, const Scalar *x,
                                  Scalar *y, Scalar *g) {
  parallel_for_elements("kat::nn::GELU::forward", space, count,
                        ActivationForwardWithDerivative<GELUOp, Scalar>{x, y, g});
}

/// out = GELU'(x) ⊙ d: dx from dy in backward, R{y} from R{x} in forward_r.
template <class ExecSpace, class Scalar>
void gelu_times_derivative(const ExecSpace &space, const char *label, std::size_t count,
                           const Scalar *x, const Scalar *d, Scalar *out) {
  parallel_for_elements(label, space, count, TimesDerivative<GELUOp, Scalar>{x, d, out});
}

/// R{dx} = GELU'(x) R{dy} + GELU''(x) R{x} dy.
template <class ExecSpace, class Scalar>
void gelu_backward_r(const ExecSpace &space, std::size_t count, const Scalar *x, const Scalar *rx,
                     const Scalar *dy, const Scalar *rdy, Scalar *rdx) {
  parallel_for_elements("kat::nn::GELU::backward_r", space, count,
                        InputActivationBackwardR<GELUOp, Scalar>{x, rx, dy, rdy, rdx});
}

} // namespace detail

/// Gaussian error linear unit (Hendrycks & Gimpel 2016, "Gaussian Error Linear Units",
/// sec. 2), the exact form PyTorch's nn.GELU() uses by default (approximate='none'):
///   y = x Φ(x) = x/2 · (1 + erf(x/√2)),
/// element-wise, no parameters, output shape = input shape, any activation layout (the same in
/// and out). Φ is computed as erfc(−x/√2)/2, which keeps its relative accuracy for x << 0
/// where 1 + erf cancels.
///
/// Backward: dx = dy ⊙ (Φ(x) + x φ(x)), with φ the standard normal density. Unlike ReLU, Tanh
/// and Sigmoid, GELU is not invertible and its derivative cannot be read off y: in training
/// the forward, which evaluates Φ(x) anyway, also writes GELU'(x) into a workspace of x's size
/// (one batch of the layer's features, grown only with the batch: workspace_allocations()), and
/// backward multiplies by it, instead of evaluating Φ and φ a second time (the bulk of GELU's
/// cost: its backward went from about as slow as its forward to a pass over memory). The
/// layer also keeps x (the input of the last forward, which must stay valid until backward)
/// for a backward after an evaluation-mode forward and for the R-operator.
///
/// R-operator (Pearlmutter 1994; see Layer): R{y} = y'(x) R{x},
/// R{dx} = y'(x) R{dy} + y''(x) R{x} dy with y'' = φ(x)(2 − x²).
///
/// All matrices must be contiguous (the kernels run over their raw spans).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class GELU final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  std::string name() const override { return "GELU"; }
  FeatureShape output_shape(const FeatureShape &input) const override { return input; }
  /// Element-wise, so any layout of Scalar values (none that stores bf16), the same in and out.
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    return in == out && !layout_stores_bf16(in);
  }

  /// @throws ShapeError if y's extents differ from x's or either is not contiguous.
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::GELU::forward");
    require_contiguous("forward", "x", x);
    require_same("forward", x, y, "y");
    x_ = x;
    if (this->training_) {
      g_ = derivative_.matrix(x.extent(0), x.extent(1));
      detail::gelu_forward_with_derivative(space, x.span(), x.data(), y.data(), g_.data());
    } else {
      g_ = matrix_type();
      detail::gelu_forward(space, x.span(), x.data(), y.data());
    }
  }

  /// (Re)allocations of the workspace that keeps GELU'(x) between forward and backward.
  std::size_t workspace_allocations() const { return derivative_.allocations(); }

  /// dx = dy ⊙ GELU'(x); nothing to do when dx has extent 0.
  /// @throws ShapeError if dy or dx differ from the last forward's x in extents.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::GELU::backward");
    if (dx.extent(0) == 0) {
      return;
    }
    require_same("backward", x_, dy, "dy");
    require_same("backward", x_, dx, "dx");
    if (g_.extent(0) != 0) {
      detail::element_product(space, "kat::nn::GELU::backward", g_.span(), g_.data(), dy.data(),
                              dx.data());
      return;
    }
    detail::gelu_times_derivative(space, "kat::nn::GELU::backward", x_.span(), x_.data(), dy.data(),
                                  dx.data());
  }

  bool supports_r_operator() const override { return true; }

  /// R{y} = GELU'(x) ⊙ R{x}; an `rx` of extent 0 (R{x} = 0) gives R{y} = 0.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::GELU::forward_r");
    require_same("forward_r", x_, ry, "ry");
    rx_ = rx;
    if (rx.extent(0) == 0) {
      Kokkos::deep_copy(space, ry, Scalar(0));
      return;
    }
    require_same("forward_r", x_, rx, "rx");
    detail::gelu_times_derivative(space, "kat::nn::GELU::forward_r", x_.span(), x_.data(),
                                  rx.data(), ry.data());
  }

  /// R{dx} = GELU'(x) R{dy} + GELU''(x) R{x} dy (the first term only after an empty rx).
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::GELU::backward_r");
    if (rdx.extent(0) == 0) {
      return;
    }
    require_same("backward_r", x_, dy, "dy");
    require_same("backward_r", x_, rdy, "rdy");
    require_same("backward_r", x_, rdx, "rdx");
    if (rx_.extent(0) == 0) {
      detail::gelu_times_derivative(space, "kat::nn::GELU::backward_r", x_.span(), x_.data(),
                                    rdy.data(), rdx.data());
      return;
    }
    require_same("backward_r", x_, rx_, "rx (of forward_r)");
    detail::gelu_backward_r(space, x_.span(), x_.data(), rx_.data(), dy.data(), rdy.data(),
                            rdx.data());
  }

private:
  static void require_contiguous(const char *where, const char *what, const matrix_type &v) {
    if (!v.span_is_contiguous()) {
      throw ShapeError(kat::detail::concat("kat::nn::GELU::", where, ": ", what,
                                           " must be contiguous, got strides ", v.stride(0), ", ",
                                           v.stride(1), " for ", v.extent(0), "x", v.extent(1)));
    }
  }
  // Element-wise over the raw span: equal extents and contiguous memory.
  static void require_same(const char *where, const matrix_type &ref, const matrix_type &v,
                           const char *what) {
    if (v.extent(0) != ref.extent(0) || v.extent(1) != ref.extent(1)) {
      throw ShapeError(kat::detail::concat("kat::nn::GELU::", where, ": ", what, " must be ",
                                           ref.extent(0), "x", ref.extent(1), ", got ", v.extent(0),
                                           "x", v.extent(1)));
    }
    require_contiguous(where, what, v);
  }

  matrix_type x_, rx_;
  matrix_type g_; // GELU'(x) of the last forward, in training; empty otherwise
  Workspace<Scalar, MemorySpace> derivative_{"kat::nn::GELU::derivative"};
};

} // namespace kat::nn
