#pragma once
/// @file
/// @brief Element-wise activations: ReLU, Tanh, Sigmoid.

#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <string>

namespace kat::nn {

namespace detail {

// Each op gives f(x), and dL/dx from y = f(x) and dL/dy, so backward needs only the output.
struct ReLUOp {
  static const char *name() { return "ReLU"; }
  template <class T> KOKKOS_INLINE_FUNCTION static T f(T x) { return x > T(0) ? x : T(0); }
  // A select of the already-loaded dy: GCC vectorizes it, whereas dy * T(y > 0) stays a
  // scalar loop with a branch that mispredicts about half the time.
  template <class T> KOKKOS_INLINE_FUNCTION static T backward(T y, T dy) {
    return y > T(0) ? dy : T(0);
  }
};

struct TanhOp {
  static const char *name() { return "Tanh"; }
  template <class T> KOKKOS_INLINE_FUNCTION static T f(T x) { return math::tanh(x); }
  template <class T> KOKKOS_INLINE_FUNCTION static T backward(T y, T dy) {
    return dy * (T(1) - y * y);
  }
};

struct SigmoidOp {
  static const char *name() { return "Sigmoid"; }
  // Branches keep exp's argument non-positive, so neither side overflows.
  template <class T> KOKKOS_INLINE_FUNCTION static T f(T x) {
    if (x >= T(0)) {
      return T(1) / (T(1) + math::exp(-x));
    }
    const T e = math::exp(x);
    return e / (T(1) + e);
  }
  template <class T> KOKKOS_INLINE_FUNCTION static T backward(T y, T dy) {
    return dy * (y * (T(1) - y));
  }
};

} // namespace detail

/// y = f(x) element-wise; shape-preserving, no parameters.
template <class Op, class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Activation final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  std::string name() const override { return Op::name(); }
  FeatureShape output_shape(const FeatureShape &input) const override { return input; }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region(std::string("kat::nn::") + Op::name() + "::forward");
    require_same(x, y, "y");
    y_ = y;
    const std::size_t count = x.span();
    const Scalar *xp = x.data();
    Scalar *yp = y.data();
    Kokkos::parallel_for(
        "kat::nn::Activation::forward", Kokkos::RangePolicy<execution_space>(space, 0, count),
        KOKKOS_LAMBDA(const std::size_t i) { yp[i] = Op::f(xp[i]); });
  }

  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region(std::string("kat::nn::") + Op::name() + "::backward");
    if (dx.extent(0) == 0) {
      return;
    }
    require_same(y_, dy, "dy");
    require_same(y_, dx, "dx");
    const std::size_t count = dy.span();
    const Scalar *yp = y_.data();
    const Scalar *dyp = dy.data();
    Scalar *dxp = dx.data();
    Kokkos::parallel_for(
        "kat::nn::Activation::backward", Kokkos::RangePolicy<execution_space>(space, 0, count),
        KOKKOS_LAMBDA(const std::size_t i) { dxp[i] = Op::backward(yp[i], dyp[i]); });
  }

private:
  // Element-wise over the raw span is valid only for contiguous matrices of equal extents.
  static void require_same(const matrix_type &ref, const matrix_type &v, const char *what) {
    if (v.extent(0) != ref.extent(0) || v.extent(1) != ref.extent(1)) {
      throw ShapeError(kat::detail::concat("kat::nn::", Op::name(), ": ", what, " must be ",
                                           ref.extent(0), "x", ref.extent(1), ", got ", v.extent(0),
                                           "x", v.extent(1)));
    }
  }

  matrix_type y_;
};

/// Rectified linear unit, y = max(x, 0) (Nair & Hinton 2010); the derivative at 0 is 0, as
/// in PyTorch.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
using ReLU = Activation<detail::ReLUOp, Scalar, MemorySpace>;
/// Hyperbolic tangent.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
using Tanh = Activation<detail::TanhOp, Scalar, MemorySpace>;
/// Logistic sigmoid, 1 / (1 + exp(-x)), evaluated without overflow.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
using Sigmoid = Activation<detail::SigmoidOp, Scalar, MemorySpace>;

} // namespace kat::nn
