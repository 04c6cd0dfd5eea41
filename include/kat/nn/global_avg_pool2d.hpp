#pragma once
/// @file
/// @brief Global average pooling: the mean of each channel over its H x W plane.

#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace kat::nn {

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
    return FeatureShape{input.channels, 1, 1};
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
    const Scalar count = static_cast<Scalar>(plane);
    Kokkos::parallel_for(
        "kat::nn::GlobalAvgPool2d::forward", matrix_policy(space, n, channels),
        KOKKOS_LAMBDA(const std::size_t i, const std::size_t c) {
          Scalar sum = 0;
          for (std::size_t k = c * plane; k < (c + 1) * plane; ++k) {
            sum += x(i, k);
          }
          y(i, c) = sum / count;
        });
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
    const std::size_t plane = plane_;
    const Scalar count = static_cast<Scalar>(plane);
    Kokkos::parallel_for(
        "kat::nn::GlobalAvgPool2d::backward", matrix_policy(space, batch_, channels_ * plane),
        KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) {
          dx(i, j) = dy(i, j / plane) / count;
        });
  }

private:
  std::size_t batch_ = 0, channels_ = 0, plane_ = 0;
};

} // namespace kat::nn
