#pragma once
/// @file
/// @brief 2-D max pooling (torch.nn.MaxPool2d).

#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/pool2d.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kat::nn {

namespace detail {

/// dx(n, c, h, w) = Σ dy(n, c, oh, ow) over the windows whose recorded argmax is (h, w)
/// (MaxPool2d::backward, also its R-operator on R{dy}: with the argmax fixed the map is
/// linear).
template <class ExecSpace, class MatrixView, class IndexView>
void max_pool2d_backward(const ExecSpace &space, const Pool2dGeometry &g, const IndexView &argmax,
                         const MatrixView &dy, const MatrixView &dx) {
  pool2d_launch(
      "kat::nn::MaxPool2d::backward", space, g.channels * g.width,
      MaxPool2dBackward<ExecSpace, MatrixView, IndexView>{g, dx.extent(0), argmax, dy, dx});
}

/// y = the maximum over each window of x, and argmax the first position of it (MaxPool2d::forward).
template <class ExecSpace, class MatrixView, class IndexView>
void max_pool2d_forward(const ExecSpace &space, const Pool2dGeometry &g, const IndexView &argmax,
                        const MatrixView &x, const MatrixView &y) {
  pool2d_launch("kat::nn::MaxPool2d::forward", space, g.channels * g.out_width,
                MaxPool2dForward<ExecSpace, MatrixView, IndexView>{g, x.extent(0), argmax, x, y});
}

/// ry(n, c, oh, ow) = rx(n, c, h, w) at the recorded argmax (h, w) of each window: max pooling
/// with the choice of the last forward fixed (MaxPool2d::forward_r).
template <class ExecSpace, class MatrixView, class IndexView>
void max_pool2d_gather(const ExecSpace &space, const Pool2dGeometry &g, const IndexView &argmax,
                       const MatrixView &rx, const MatrixView &ry) {
  const std::size_t out_plane =
      static_cast<std::size_t>(g.out_height) * static_cast<std::size_t>(g.out_width);
  const std::size_t in_plane =
      static_cast<std::size_t>(g.height) * static_cast<std::size_t>(g.width);
  Kokkos::parallel_for("kat::nn::MaxPool2d::forward_r",
                       matrix_policy(space, ry.extent(0), ry.extent(1)),
                       MaxPool2dGather<MatrixView, IndexView>{argmax, rx, ry, out_plane, in_plane});
}

} // namespace detail

/// 2-D max pooling with PyTorch's semantics (torch.nn.MaxPool2d with ceil_mode = false,
/// dilation = 1, return_indices = false).
///
/// Shapes: input (C, H, W), a batch is N x (C·H·W) in KAT's feature order
/// `h + H * (w + W * c)` (see FeatureShape); output (C, H_out, W_out) with
/// H_out = floor((H + 2 p_h - k_h) / s_h) + 1 and likewise W_out.
///
/// - Padding is implicit -infinity: padded positions never win, and every window holds at
///   least one real input because padding <= kernel / 2.
/// - Ties resolve to the first maximum in row-major scan order over the window (h outer,
///   w inner), as PyTorch's CPU kernel; the gradient goes to that element only.
/// - NaN propagates: a window holding a NaN outputs NaN and its gradient goes to the last NaN
///   in scan order (PyTorch's `val > max || isnan(val)` rule). This relies on IEEE compares;
///   under -ffast-math the compiler may drop the NaN test.
///
/// A batch matrix does not carry (C, H, W): output_shape(input) records it (Sequential::add
/// calls it), and forward() takes x with input.size() columns.
///
/// forward() stores each output's argmax (index h + H * w within its input plane) in an
/// int32 workspace that grows only with the batch (workspace_allocations()). backward()
/// computes each dx element in one thread, gathering in a fixed order the dy of the outputs
/// whose window covers it and chose it: deterministic, no atomics.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class MaxPool2d final : public detail::Pool2dBase<Scalar, MemorySpace> {
  using base = detail::Pool2dBase<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @param kernel   (height, width) of the window, >= 1
  /// @param stride   (height, width) step, >= 1
  /// @param padding  (height, width) implicit -infinity padding per side, 0 <= p <= k / 2
  /// @throws ValueError on a value outside those ranges.
  MaxPool2d(std::array<int, 2> kernel, std::array<int, 2> stride,
            std::array<int, 2> padding = {0, 0})
      : base("MaxPool2d", true, kernel, stride, padding) {}

  /// Square window; `stride` 0 means stride = kernel (PyTorch's default).
  /// @throws ValueError as above.
  explicit MaxPool2d(int kernel, int stride = 0, int padding = 0)
      : base("MaxPool2d", true, kernel, stride, padding) {}

  /// Allocations of the argmax buffer so far; constant once the largest batch has been seen.
  std::size_t workspace_allocations() const { return argmax_.allocations(); }

private:
  // The passes are detail::Pool2dBase's. With each window's argmax fixed, max pooling is
  // linear: R{y} = R{x} at the argmax of the last forward (exact wherever the argmax is
  // unique, almost everywhere), and R{dx} = the backward of R{dy} through it.
  void pool_forward(const execution_space &space, const detail::Pool2dGeometry &g,
                    const matrix_type &x, const matrix_type &y) override {
    argmax_view_ = argmax_.matrix(x.extent(0), g.out_size());
    detail::max_pool2d_forward(space, g, argmax_view_, x, y);
  }
  void pool_backward(const execution_space &space, const matrix_type &dy,
                     const matrix_type &dx) override {
    detail::max_pool2d_backward(space, this->kernel_geometry_, argmax_view_, dy, dx);
  }
  void pool_forward_r(const execution_space &space, const matrix_type &rx,
                      const matrix_type &ry) override {
    detail::max_pool2d_gather(space, this->kernel_geometry_, argmax_view_, rx, ry);
  }

  Workspace<std::int32_t, MemorySpace> argmax_{"kat::nn::MaxPool2d::argmax"};
  Matrix<std::int32_t, MemorySpace> argmax_view_;
};

} // namespace kat::nn
