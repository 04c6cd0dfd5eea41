#pragma once
/// @file
/// @brief 2-D average pooling (torch.nn.AvgPool2d).

#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/pool2d.hpp" // detail::Pool2dBase, the window geometry both layers share

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>

namespace kat::nn {

namespace detail {

/// y = window sums / (k_h · k_w) for the geometry g (AvgPool2d::forward, also its R-operator:
/// the map is linear).
template <class ExecSpace, class MatrixView>
void avg_pool2d_forward(const ExecSpace &space, const Pool2dGeometry &g, const MatrixView &x,
                        const MatrixView &y) {
  using Scalar = typename MatrixView::non_const_value_type;
  const Scalar area = static_cast<Scalar>(g.kernel_h * g.kernel_w);
  pool2d_launch("kat::nn::AvgPool2d::forward", space, g.channels * g.out_width,
                AvgPool2dForward<ExecSpace, MatrixView>{g, x.extent(0), area, x, y});
}

/// dx = the transpose of avg_pool2d_forward applied to dy (AvgPool2d::backward, also its
/// R-operator on R{dy}).
template <class ExecSpace, class MatrixView>
void avg_pool2d_backward(const ExecSpace &space, const Pool2dGeometry &g, const MatrixView &dy,
                         const MatrixView &dx) {
  using Scalar = typename MatrixView::non_const_value_type;
  const Scalar area = static_cast<Scalar>(g.kernel_h * g.kernel_w);
  pool2d_launch("kat::nn::AvgPool2d::backward", space, g.channels * g.width,
                AvgPool2dBackward<ExecSpace, MatrixView>{g, dx.extent(0), area, dy, dx});
}

} // namespace detail

/// 2-D average pooling with PyTorch's default semantics (torch.nn.AvgPool2d with
/// ceil_mode = false, count_include_pad = true, no divisor_override).
///
/// Shapes: input (C, H, W), a batch is N x (C·H·W) in KAT's feature order
/// `h + H * (w + W * c)` (see FeatureShape); output (C, H_out, W_out) with
/// H_out = floor((H + 2 p_h - k_h) / s_h) + 1 and likewise W_out.
///
/// Padding is implicit zeros that count in the mean: every output is the window's sum of
/// real inputs divided by k_h · k_w (with ceil_mode = false no window reaches beyond the
/// padding, so PyTorch's divisor is always the full kernel area).
///
/// A batch matrix does not carry (C, H, W): output_shape(input) records it (Sequential::add
/// calls it), and forward() takes x with input.size() columns. backward() computes each dx
/// element in one thread, gathering dy / (k_h · k_w) from the windows that cover it in a
/// fixed order: deterministic, no atomics.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class AvgPool2d final : public detail::Pool2dBase<Scalar, MemorySpace> {
  using base = detail::Pool2dBase<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @param kernel   (height, width) of the window, >= 1
  /// @param stride   (height, width) step, >= 1
  /// @param padding  (height, width) implicit zero padding per side, 0 <= p <= k / 2
  /// @throws ValueError on a value outside those ranges.
  AvgPool2d(std::array<int, 2> kernel, std::array<int, 2> stride,
            std::array<int, 2> padding = {0, 0})
      : base("AvgPool2d", false, kernel, stride, padding) {}

  /// Square window; `stride` 0 means stride = kernel (PyTorch's default).
  /// @throws ValueError as above.
  explicit AvgPool2d(int kernel, int stride = 0, int padding = 0)
      : base("AvgPool2d", false, kernel, stride, padding) {}

private:
  // The passes are detail::Pool2dBase's. Average pooling is linear, so R{y} = avgpool(R{x})
  // and R{dx} = the backward of R{dy}.
  void pool_forward(const execution_space &space, const detail::Pool2dGeometry &g,
                    const matrix_type &x, const matrix_type &y) override {
    detail::avg_pool2d_forward(space, g, x, y);
  }
  void pool_backward(const execution_space &space, const matrix_type &dy,
                     const matrix_type &dx) override {
    detail::avg_pool2d_backward(space, this->kernel_geometry_, dy, dx);
  }
  void pool_forward_r(const execution_space &space, const matrix_type &rx,
                      const matrix_type &ry) override {
    detail::avg_pool2d_forward(space, this->kernel_geometry_, rx, ry);
  }
};

} // namespace kat::nn
