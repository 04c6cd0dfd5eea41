#pragma once
/// @file
/// @brief Global average pooling: the mean of each channel over its H x W plane.

#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/global_avg_pool2d_kernels.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace kat::nn {

namespace detail {

/// y(n, c) = the mean of channel c's plane of x (GlobalAvgPool2d::forward, also its
/// R-operator: the map is linear), x in `layout` (kat::ActivationLayout) with `plane` = H·W
/// values per channel.
template <class ExecSpace, class MatrixView>
void global_avg_pool2d_forward(const ExecSpace &space, const MatrixView &x, const MatrixView &y,
                               std::size_t plane,
                               ActivationLayout layout = ActivationLayout::features) {
  using Scalar = typename MatrixView::non_const_value_type;
  const Scalar count = static_cast<Scalar>(plane);
  const std::size_t n = y.extent(0), channels = y.extent(1);
  const Scalar *xp = x.data();
  Kokkos::parallel_for(
      "kat::nn::GlobalAvgPool2d::forward", matrix_policy(space, n, channels),
      GlobalAvgPool2dForward<MatrixView>{xp, y, plane, layout, n, channels, count});
}

/// dx(n, c, h, w) = dy(n, c) / plane, the transpose of global_avg_pool2d_forward, dx in
/// `layout`.
template <class ExecSpace, class MatrixView>
void global_avg_pool2d_backward(const ExecSpace &space, const MatrixView &dy, const MatrixView &dx,
                                std::size_t plane,
                                ActivationLayout layout = ActivationLayout::features) {
  using Scalar = typename MatrixView::non_const_value_type;
  const Scalar count = static_cast<Scalar>(plane);
  const std::size_t n = dy.extent(0), channels = dy.extent(1);
  Scalar *dxp = dx.data();
  Kokkos::parallel_for(
      "kat::nn::GlobalAvgPool2d::backward", matrix_policy(space, dx.extent(0), dx.extent(1)),
      GlobalAvgPool2dBackward<MatrixView>{dxp, dy, plane, layout, n, channels, count});
}

} // namespace detail

/// Global average pooling, torch.nn.AdaptiveAvgPool2d(1) followed by a flatten:
/// (C, H, W) -> (C, 1, 1), y(n, c) = 1/(H·W) · Σ_{h,w} x(n, c, h, w).
///
/// Shapes: x is N x (C·H·W) in KAT's feature order `h + H * (w + W * c)` (see FeatureShape),
/// so each channel's H·W values are one contiguous block of columns; y is N x C, already a
/// flat feature vector for a following Dense layer. The computation depends only on C and
/// H·W, which forward() reads off the extents of x and y (C = y columns), so the layer needs
/// no recorded input shape. Each output sums its plane in a fixed order: deterministic.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class GlobalAvgPool2d final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  std::string name() const override { return "GlobalAvgPool2d"; }

  /// @throws ShapeError if a dimension of `input` is < 1.
  FeatureShape output_shape(const FeatureShape &input) const override {
    if (input.channels < 1 || input.height < 1 || input.width < 1) {
      throw ShapeError(kat::detail::concat("kat::nn::GlobalAvgPool2d: input channels, height and "
                                           "width must be >= 1, got ",
                                           input));
    }
    shape_channels_ = input.channels;
    return FeatureShape{input.channels, 1, 1};
  }

  /// Output in KAT's layout; input in it, in channels_last, for a channel count that is a
  /// multiple of 16 in oneDNN's channels16, or in Precision::bf16 in channels_last_bf16 or
  /// channels16_bf16 (so a network computing in those layouts ends here without converting
  /// its last activation; the means of bf16 values are summed in Scalar, dx is rounded to
  /// bf16).
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    return out == ActivationLayout::features &&
           (in == ActivationLayout::features || layout_fits(in, shape_channels_, this->precision_));
  }

  /// @throws ShapeError if y's rows differ from x's, y has no columns, or x's columns are
  /// not a multiple of y's (C).
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::GlobalAvgPool2d::forward");
    const char *where = "kat::nn::GlobalAvgPool2d::forward";
    const std::size_t n = x.extent(0);
    const std::size_t channels = y.extent(1);
    kat::detail::require_extent(where, "y rows", n, y.extent(0));
    if (channels == 0 || x.extent(1) == 0 || x.extent(1) % channels != 0) {
      throw ShapeError(kat::detail::concat(where,
                                           ": x columns must be a positive multiple of y "
                                           "columns (channels) ",
                                           channels, ", got ", x.extent(1)));
    }
    const std::size_t plane = x.extent(1) / channels;
    batch_ = n;
    channels_ = channels;
    plane_ = plane;
    detail::global_avg_pool2d_forward(space, x, y, plane, this->in_layout_);
  }

  /// dx(n, c, h, w) = dy(n, c) / (H·W).
  /// @throws Error before the first forward(); ShapeError if dy or dx (when not empty) do not
  /// match the last forward's x and y.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::GlobalAvgPool2d::backward");
    const char *where = "kat::nn::GlobalAvgPool2d::backward";
    if (channels_ == 0) {
      throw Error(kat::detail::concat(where, ": call forward() first"));
    }
    kat::detail::require_extent(where, "dy rows", batch_, dy.extent(0));
    kat::detail::require_extent(where, "dy columns", channels_, dy.extent(1));
    if (dx.extent(0) == 0) {
      return;
    }
    kat::detail::require_extent(where, "dx rows", batch_, dx.extent(0));
    kat::detail::require_extent(where, "dx columns", channels_ * plane_, dx.extent(1));
    detail::global_avg_pool2d_backward(space, dy, dx, plane_, this->in_layout_);
  }

  /// R-operator (see Layer). The layer is linear and has no parameters: R{y} = the channel
  /// means of R{x}, and R{dx}(n, c, h, w) = R{dy}(n, c) / (H·W) (no dy term).
  bool supports_r_operator() const override { return true; }

  /// ry = the channel means of rx (rx of extent 0: ry = 0), after forward().
  /// @throws Error before the first forward(); ShapeError if rx or ry do not match it.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::GlobalAvgPool2d::forward_r");
    const char *where = "kat::nn::GlobalAvgPool2d::forward_r";
    if (channels_ == 0) {
      throw Error(kat::detail::concat(where, ": call forward() first"));
    }
    kat::detail::require_extent(where, "ry rows", batch_, ry.extent(0));
    kat::detail::require_extent(where, "ry columns", channels_, ry.extent(1));
    if (rx.extent(0) == 0) {
      Kokkos::deep_copy(space, ry, Scalar(0));
      return;
    }
    kat::detail::require_extent(where, "rx rows", batch_, rx.extent(0));
    kat::detail::require_extent(where, "rx columns", channels_ * plane_, rx.extent(1));
    detail::global_avg_pool2d_forward(space, rx, ry, plane_, this->in_layout_);
  }

  /// rdx = the backward of rdy (skipped when rdx is empty); dy is not needed.
  /// @throws Error before the first forward(); ShapeError if rdy or rdx do not match it.
  void backward_r(const execution_space &space, const matrix_type & /*dy*/, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::GlobalAvgPool2d::backward_r");
    const char *where = "kat::nn::GlobalAvgPool2d::backward_r";
    if (channels_ == 0) {
      throw Error(kat::detail::concat(where, ": call forward() first"));
    }
    kat::detail::require_extent(where, "rdy rows", batch_, rdy.extent(0));
    kat::detail::require_extent(where, "rdy columns", channels_, rdy.extent(1));
    if (rdx.extent(0) == 0) {
      return;
    }
    kat::detail::require_extent(where, "rdx rows", batch_, rdx.extent(0));
    kat::detail::require_extent(where, "rdx columns", channels_ * plane_, rdx.extent(1));
    detail::global_avg_pool2d_backward(space, rdy, rdx, plane_, this->in_layout_);
  }

private:
  std::size_t batch_ = 0, channels_ = 0, plane_ = 0;
  mutable int shape_channels_ = 0; // the channels output_shape() last saw
};

} // namespace kat::nn
