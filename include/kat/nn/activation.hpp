#pragma once
/// @file
/// @brief Element-wise activations: ReLU, Tanh, Sigmoid.

#include "kat/core/bfloat16.hpp"
#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/activation_kernels.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <string>
#include <type_traits>

namespace kat::nn {

namespace detail {

// Each op gives f(x), and dL/dx from y = f(x) and dL/dy, so backward needs only the output;
// for the R-operator also R{y} = f'(x) R{x} and R{dx} = f'(x) R{dy} + f''(x) R{x} dy, from y.
struct ReLUOp {
  static const char *name() { return "ReLU"; }
  template <class T> KOKKOS_INLINE_FUNCTION static T f(T x) { return x > T(0) ? x : T(0); }
  // A select of the already-loaded dy: GCC vectorizes it, whereas dy * T(y > 0) stays a
  // scalar loop with a branch that mispredicts about half the time.
  template <class T> KOKKOS_INLINE_FUNCTION static T backward(T y, T dy) {
    return y > T(0) ? dy : T(0);
  }
  template <class T> KOKKOS_INLINE_FUNCTION static T forward_r(T y, T rx) {
    return y > T(0) ? rx : T(0);
  }
  // f'' = 0 away from 0 (and taken as 0 at 0, as f' is).
  template <class T> KOKKOS_INLINE_FUNCTION static T backward_r(T y, T /*rx*/, T /*dy*/, T rdy) {
    return y > T(0) ? rdy : T(0);
  }
};

struct TanhOp {
  static const char *name() { return "Tanh"; }
  template <class T> KOKKOS_INLINE_FUNCTION static T f(T x) { return math::tanh(x); }
  template <class T> KOKKOS_INLINE_FUNCTION static T backward(T y, T dy) {
    return dy * (T(1) - y * y);
  }
  template <class T> KOKKOS_INLINE_FUNCTION static T forward_r(T y, T rx) {
    return rx * (T(1) - y * y);
  }
  // f' = 1 − y², f'' = −2 y (1 − y²)
  template <class T> KOKKOS_INLINE_FUNCTION static T backward_r(T y, T rx, T dy, T rdy) {
    return (T(1) - y * y) * (rdy - T(2) * y * rx * dy);
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
  template <class T> KOKKOS_INLINE_FUNCTION static T forward_r(T y, T rx) {
    return rx * (y * (T(1) - y));
  }
  // f' = y (1 − y), f'' = y (1 − y)(1 − 2y)
  template <class T> KOKKOS_INLINE_FUNCTION static T backward_r(T y, T rx, T dy, T rdy) {
    return (y * (T(1) - y)) * (rdy + (T(1) - T(2) * y) * rx * dy);
  }
};

/// out = dy where y > 0, 0 elsewhere (a ReLU's backward from its output y); with `bf16` the
/// three matrices hold bf16 values (ActivationLayout::channels_last_bf16, channels16_bf16).
template <class ExecSpace, class MatrixView>
void relu_mask(const ExecSpace &space, const MatrixView &y, const MatrixView &dy,
               const MatrixView &out, bool bf16 = false) {
  using value = typename MatrixView::non_const_value_type;
  if (bf16) {
    parallel_for_elements("kat::nn::relu_mask_bf16", space, out.span(),
                          ReluMaskBf16{reinterpret_cast<const bfloat16 *>(y.data()),
                                       reinterpret_cast<const bfloat16 *>(dy.data()),
                                       reinterpret_cast<bfloat16 *>(out.data())});
    return;
  }
  const value *yp = y.data();
  const value *dyp = dy.data();
  value *op = out.data();
  parallel_for_elements("kat::nn::relu_mask", space, out.span(), ReluMask<value>{yp, dyp, op});
}

/// The backward of a ReLU that a layer applies to its own output (Layer::can_fuse_relu): the
/// layer remembers its output y in forward(), and mask() gives dy where y > 0, 0 elsewhere, in
/// a workspace of its own, for the layer's own backward to take instead of dy.
template <class Scalar, class MemorySpace> class FusedReluBackward {
public:
  using matrix_type = Matrix<Scalar, MemorySpace>;

  /// @param region  the profiling region of mask(), also the workspace's label
  explicit FusedReluBackward(const char *region) : region_(region), masked_(region) {}

  /// Remembers the output y, in `layout` (one that stores bf16: y and the later dy hold bf16).
  void remember(const matrix_type &y, ActivationLayout layout = ActivationLayout::features) {
    y_ = y;
    bf16_ = layout_stores_bf16(layout);
  }

  template <class ExecSpace> matrix_type mask(const ExecSpace &space, const matrix_type &dy) {
    ScopedRegion region(region_);
    const matrix_type masked = masked_.matrix(dy.extent(0), dy.extent(1));
    relu_mask(space, y_, dy, masked, bf16_);
    return masked;
  }

  std::size_t allocations() const { return masked_.allocations(); }

private:
  const char *region_;
  Workspace<Scalar, MemorySpace> masked_;
  matrix_type y_;
  bool bf16_ = false; // y_ holds bf16 values
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
  /// Element-wise, so any layout of Scalar values, the same in and out; a ReLU also
  /// channels_last_bf16 and channels16_bf16 (max(0, x) and its backward are exact on bf16
  /// values).
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    return in == out && (!layout_stores_bf16(in) || std::is_same_v<Op, detail::ReLUOp>);
  }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region(std::string("kat::nn::") + Op::name() + "::forward");
    require_same(x, y, "y");
    this->require_layouts_supported(std::string("kat::nn::") + Op::name() + "::forward");
    y_ = y;
    const std::size_t count = x.span();
    forward_bf16_ = layout_stores_bf16(this->in_layout_);
    if constexpr (std::is_same_v<Op, detail::ReLUOp>) {
      if (forward_bf16_) { // the span's count of bf16 values, in the first half of the buffers
        parallel_for_elements("kat::nn::Activation::forward_bf16", space, count,
                              detail::ReluForwardBf16{reinterpret_cast<const bfloat16 *>(x.data()),
                                                      reinterpret_cast<bfloat16 *>(y.data())});
        return;
      }
    }
    const Scalar *xp = x.data();
    Scalar *yp = y.data();
    parallel_for_elements("kat::nn::Activation::forward", space, count,
                          detail::ActivationForward<Op, Scalar>{xp, yp});
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
    if (forward_bf16_) { // only a ReLU takes bf16 values (supports_layouts())
      detail::relu_mask(space, y_, dy, dx, true);
      return;
    }
    const Scalar *yp = y_.data();
    const Scalar *dyp = dy.data();
    Scalar *dxp = dx.data();
    parallel_for_elements("kat::nn::Activation::backward", space, count,
                          detail::ActivationBackward<Op, Scalar>{yp, dyp, dxp});
  }

  /// R-operator (see Layer): R{y} = f'(x) R{x}, R{dx} = f'(x) R{dy} + f''(x) R{x} dy.
  bool supports_r_operator() const override { return true; }

  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region(std::string("kat::nn::") + Op::name() + "::forward_r");
    if (forward_bf16_) {
      throw Error(kat::detail::concat("kat::nn::", Op::name(),
                                      "::forward_r: the forward ran on bf16 values "
                                      "(channels_last_bf16 or channels16_bf16); the R-operator "
                                      "needs KAT's layout"));
    }
    require_same(y_, rx, "rx");
    require_same(y_, ry, "ry");
    rx_ = rx;
    const std::size_t count = rx.span();
    const Scalar *yp = y_.data();
    const Scalar *rxp = rx.data();
    Scalar *ryp = ry.data();
    parallel_for_elements("kat::nn::Activation::forward_r", space, count,
                          detail::ActivationForwardR<Op, Scalar>{yp, rxp, ryp});
  }

  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region(std::string("kat::nn::") + Op::name() + "::backward_r");
    if (rdx.extent(0) == 0) {
      return;
    }
    require_same(y_, rx_, "rx (of forward_r)");
    require_same(y_, dy, "dy");
    require_same(y_, rdy, "rdy");
    require_same(y_, rdx, "rdx");
    const std::size_t count = dy.span();
    const Scalar *yp = y_.data();
    const Scalar *rxp = rx_.data();
    const Scalar *dyp = dy.data();
    const Scalar *rdyp = rdy.data();
    Scalar *rdxp = rdx.data();
    parallel_for_elements("kat::nn::Activation::backward_r", space, count,
                          detail::ActivationBackwardR<Op, Scalar>{yp, rxp, dyp, rdyp, rdxp});
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

  matrix_type y_, rx_;
  bool forward_bf16_ = false; // the last forward ran on bf16 values
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
