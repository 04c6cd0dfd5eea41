#pragma once
/// @file
/// @brief Internal: window geometry and the common base of the 2-D pooling layers.

#include "kat/core/dnn.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/image.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kat::nn {

namespace detail {

/// Geometry of one 2-D pooling layer applied to one (C, H, W) input: PyTorch's rules with
/// ceil_mode = false and dilation 1. Plain ints, so kernels capture it by value.
struct Pool2dGeometry {
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int channels = 0, height = 0, width = 0; ///< input; channels == 0 until the shape is known
  int out_height = 0, out_width = 0;
  /// The plane is a channels_last batch seen through transposed_for() (h and w swapped): the
  /// window walks swap their loops back, so ties and sums keep the order of KAT's layout.
  bool transposed = false;

  /// The same pooling of a channels_last batch of `batch` images (element (n, c, h, w) at
  /// c + C·(w + W·(h + H·n))) read as a batch of C rows in KAT's layout: its "channels" are the
  /// images, its planes W x H (w fastest, as h is in KAT's layout), so KAT's kernels run on it
  /// with the channels in their vector lanes. Kernel, stride and padding swap with the axes.
  Pool2dGeometry transposed_for(int batch) const {
    Pool2dGeometry t = *this;
    t.kernel_h = kernel_w, t.kernel_w = kernel_h;
    t.stride_h = stride_w, t.stride_w = stride_h;
    t.pad_h = pad_w, t.pad_w = pad_h;
    t.channels = batch, t.height = width, t.width = height;
    t.out_height = out_width, t.out_width = out_height;
    t.transposed = true;
    return t;
  }

  std::size_t in_size() const {
    return static_cast<std::size_t>(channels) * static_cast<std::size_t>(height) *
           static_cast<std::size_t>(width);
  }
  std::size_t out_size() const {
    return static_cast<std::size_t>(channels) * static_cast<std::size_t>(out_height) *
           static_cast<std::size_t>(out_width);
  }
};

/// The input positions [begin, end) of one axis inside window o (padding excluded).
KOKKOS_INLINE_FUNCTION void pool_window_range(int o, int k, int s, int p, int size, int &begin,
                                              int &end) {
  const int start = o * s - p;
  begin = start < 0 ? 0 : start;
  end = start + k < size ? start + k : size;
}

/// The output positions o in [lo, hi] of one axis whose window covers input position i
/// (empty when lo > hi): window o spans padded positions [o s, o s + k - 1], and input i sits
/// at padded position i + p.
KOKKOS_INLINE_FUNCTION void pool_covering_range(int i, int k, int s, int p, int out, int &lo,
                                                int &hi) {
  const int first = i + p - k + 1; // smallest window start that still reaches i
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  hi = (i + p) / s;
  if (hi > out - 1) {
    hi = out - 1;
  }
}

/// Column of input element (c, h, w) in a batch matrix: h + H·(w + W·c).
KOKKOS_INLINE_FUNCTION std::size_t pool_input_column(const Pool2dGeometry &g, int c, int h, int w) {
  return static_cast<std::size_t>(h) +
         static_cast<std::size_t>(g.height) *
             (static_cast<std::size_t>(w) + static_cast<std::size_t>(g.width) * c);
}

/// Column of output element (c, oh, ow) in a batch matrix: oh + H_out·(ow + W_out·c).
KOKKOS_INLINE_FUNCTION std::size_t pool_output_column(const Pool2dGeometry &g, int c, int oh,
                                                      int ow) {
  return static_cast<std::size_t>(oh) +
         static_cast<std::size_t>(g.out_height) *
             (static_cast<std::size_t>(ow) + static_cast<std::size_t>(g.out_width) * c);
}

/// The window walk of the pooling forwards, for a team per (c, ow) (league rank c·W_out + ow):
/// for each output (c, oh, ow) of the team's threads, at column j, calls
/// kernel.element(team, j, col, index, first) for each input element of its window in
/// row-major order (h outer, so ties keep PyTorch's first maximum; w outer for a transposed
/// geometry, whose w is the image's h; col its column, index = h + H·w its place in the input
/// plane, first for the first one), then kernel.finish(team, j). Every window holds a real
/// input (padding <= kernel / 2), so each output gets a `first`.
template <class Member, class Kernel>
KOKKOS_INLINE_FUNCTION void pool2d_forward_windows(const Member &team, const Kernel &kernel) {
  const Pool2dGeometry &g = kernel.g;
  const int c = team.league_rank() / g.out_width;
  const int ow = team.league_rank() % g.out_width;
  int w_begin, w_end;
  detail::pool_window_range(ow, g.kernel_w, g.stride_w, g.pad_w, g.width, w_begin, w_end);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, g.out_height), [&](const int oh) {
    int h_begin, h_end;
    detail::pool_window_range(oh, g.kernel_h, g.stride_h, g.pad_h, g.height, h_begin, h_end);
    const std::size_t j = pool_output_column(g, c, oh, ow);
    const int outer_begin = g.transposed ? w_begin : h_begin;
    const int outer_end = g.transposed ? w_end : h_end;
    const int inner_begin = g.transposed ? h_begin : w_begin;
    const int inner_end = g.transposed ? h_end : w_end;
    bool first = true;
    for (int a = outer_begin; a < outer_end; ++a) {
      for (int b = inner_begin; b < inner_end; ++b) {
        const int h = g.transposed ? b : a;
        const int w = g.transposed ? a : b;
        kernel.element(team, j, pool_input_column(g, c, h, w), h + g.height * w, first);
        first = false;
      }
    }
    kernel.finish(team, j);
  });
}

/// The gather of the pooling backwards, for a team per (c, w) (league rank c·W + w): for each
/// input element (c, h, w) of the team's threads, at column col, calls
/// kernel.element(team, col, o, self, first) for each output o whose window covers it, in a
/// fixed order (ow outer, oh outer for a transposed geometry; self = h + H·w, first for the
/// first one, which overwrites dx), so each dx element is one thread's: deterministic, no
/// atomics. An element no window covers (past the last one) gets dx = 0.
template <class Member, class Kernel>
KOKKOS_INLINE_FUNCTION void pool2d_backward_windows(const Member &team, const Kernel &kernel) {
  using Scalar = typename Kernel::Scalar;
  const Pool2dGeometry &g = kernel.g;
  const int c = team.league_rank() / g.width;
  const int w = team.league_rank() % g.width;
  int ow_lo, ow_hi;
  detail::pool_covering_range(w, g.kernel_w, g.stride_w, g.pad_w, g.out_width, ow_lo, ow_hi);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, g.height), [&](const int h) {
    int oh_lo, oh_hi;
    detail::pool_covering_range(h, g.kernel_h, g.stride_h, g.pad_h, g.out_height, oh_lo, oh_hi);
    const std::size_t col = pool_input_column(g, c, h, w);
    const int outer_lo = g.transposed ? oh_lo : ow_lo, outer_hi = g.transposed ? oh_hi : ow_hi;
    const int inner_lo = g.transposed ? ow_lo : oh_lo, inner_hi = g.transposed ? ow_hi : oh_hi;
    bool first = true;
    for (int a = outer_lo; a <= outer_hi; ++a) {
      for (int b = inner_lo; b <= inner_hi; ++b) {
        const int oh = g.transposed ? a : b;
        const int ow = g.transposed ? b : a;
        kernel.element(team, col, pool_output_column(g, c, oh, ow), h + g.height * w, first);
        first = false;
      }
    }
    if (first) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, kernel.n),
                           [&](const std::size_t e) { kernel.dx(e, col) = Scalar(0); });
    }
  });
}

/// Runs a pooling functor on `teams` teams, vector lanes over the batch.
template <class ExecSpace, class Functor>
void pool2d_launch(const char *label, const ExecSpace &space, int teams, const Functor &functor) {
  Kokkos::parallel_for(label,
                       Kokkos::TeamPolicy<ExecSpace>(space, teams, Kokkos::AUTO,
                                                     detail::batch_vector_length<ExecSpace>()),
                       functor);
}

// The kernels of MaxPool2d and AvgPool2d as named functors, not extended lambdas: nvcc's wrapper
// of an extended lambda in a header is merged across translation units while its function
// pointers are not, which crashed MaxPool2d on the host (docs/backends.md).

/// dx(n, c, h, w) = Σ dy(n, c, oh, ow) over the windows whose argmax is (h, w), for a team
/// per (c, w) (max_pool2d_backward).
template <class ExecSpace, class MatrixView, class IndexView> struct MaxPool2dBackward {
  using Scalar = typename MatrixView::non_const_value_type;
  Pool2dGeometry g;
  std::size_t n;
  IndexView argmax;
  MatrixView dy;
  MatrixView dx;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void element(const Member &team, std::size_t col, std::size_t o, int self,
                                      bool first) const {
    if (first) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](const std::size_t e) {
        const Scalar d = dy(e, o); // unconditional load: vectorizes
        dx(e, col) = argmax(e, o) == self ? d : Scalar(0);
      });
      return;
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](const std::size_t e) {
      const Scalar d = dy(e, o);
      dx(e, col) += argmax(e, o) == self ? d : Scalar(0);
    });
  }

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    pool2d_backward_windows(team, *this);
  }
};

/// ry(i, j) = rx(i, argmax(i, j) in the same channel) (max_pool2d_gather).
template <class MatrixView, class IndexView> struct MaxPool2dGather {
  IndexView argmax;
  MatrixView rx;
  MatrixView ry;
  std::size_t out_plane;
  std::size_t in_plane;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    ry(i, j) = rx(i, static_cast<std::size_t>(argmax(i, j)) + in_plane * (j / out_plane));
  }
};

/// y = the maximum over each window and argmax its first position, for a team per (c, ow)
/// (max_pool2d_forward). The running maximum lives in y and argmax: one pass over the batch
/// per window element.
template <class ExecSpace, class MatrixView, class IndexView> struct MaxPool2dForward {
  using Scalar = typename MatrixView::non_const_value_type;
  Pool2dGeometry g;
  std::size_t n;
  IndexView argmax;
  MatrixView x;
  MatrixView y;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void element(const Member &team, std::size_t j, std::size_t col, int index,
                                      bool first) const {
    if (first) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](const std::size_t e) {
        y(e, j) = x(e, col);
        argmax(e, j) = index;
      });
      return;
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](const std::size_t e) {
      // Unconditional loads and selects, so host compilers vectorize.
      const Scalar v = x(e, col);
      const Scalar best = y(e, j);
      const std::int32_t best_index = argmax(e, j);
      const bool take = v > best || v != v; // NaN wins and propagates
      y(e, j) = take ? v : best;
      argmax(e, j) = take ? index : best_index;
    });
  }
  template <class Member> KOKKOS_INLINE_FUNCTION void finish(const Member &, std::size_t) const {}

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    pool2d_forward_windows(team, *this);
  }
};

/// y = window sums / (k_h · k_w), for a team per (c, ow) (avg_pool2d_forward): sum in
/// row-major order, then divide, as PyTorch.
template <class ExecSpace, class MatrixView> struct AvgPool2dForward {
  using Scalar = typename MatrixView::non_const_value_type;
  Pool2dGeometry g;
  std::size_t n;
  Scalar area;
  MatrixView x;
  MatrixView y;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void element(const Member &team, std::size_t j, std::size_t col, int,
                                      bool first) const {
    if (first) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                           [&](const std::size_t e) { y(e, j) = x(e, col); });
      return;
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                         [&](const std::size_t e) { y(e, j) += x(e, col); });
  }
  template <class Member>
  KOKKOS_INLINE_FUNCTION void finish(const Member &team, std::size_t j) const {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                         [&](const std::size_t e) { y(e, j) /= area; });
  }

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    pool2d_forward_windows(team, *this);
  }
};

/// dx = the transpose of AvgPool2dForward applied to dy, for a team per (c, w)
/// (avg_pool2d_backward): dy / area from each covering window (PyTorch adds dy / area per
/// window too).
template <class ExecSpace, class MatrixView> struct AvgPool2dBackward {
  using Scalar = typename MatrixView::non_const_value_type;
  Pool2dGeometry g;
  std::size_t n;
  Scalar area;
  MatrixView dy;
  MatrixView dx;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void element(const Member &team, std::size_t col, std::size_t o, int,
                                      bool first) const {
    if (first) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                           [&](const std::size_t e) { dx(e, col) = dy(e, o) / area; });
      return;
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                         [&](const std::size_t e) { dx(e, col) += dy(e, o) / area; });
  }

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    pool2d_backward_windows(team, *this);
  }
};

/// Common part of MaxPool2d and AvgPool2d: hyperparameter validation, output_shape() (which
/// also fixes the input (C, H, W) that forward() expects: a batch matrix does not carry it),
/// and the four passes with their extent checks, profiling regions and oneDNN dispatch; a
/// derived layer supplies only its kernels (pool_forward, pool_backward, pool_forward_r).
template <class Scalar, class MemorySpace> class Pool2dBase : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  std::string name() const override { return type_; }

  /// (height, width) of the window.
  std::array<int, 2> kernel() const { return {geometry_.kernel_h, geometry_.kernel_w}; }
  /// (height, width) step between windows.
  std::array<int, 2> stride() const { return {geometry_.stride_h, geometry_.stride_w}; }
  /// (height, width) implicit padding on each side.
  std::array<int, 2> padding() const { return {geometry_.pad_h, geometry_.pad_w}; }

  /// (C, H, W) -> (C, floor((H + 2 p_h - k_h) / s_h) + 1, floor((W + 2 p_w - k_w) / s_w) + 1).
  /// Also records `input` as the shape forward() takes (Sequential::add calls this once per
  /// layer; calling it again with another shape re-targets the layer).
  /// @throws ShapeError if a dimension is < 1 or the padded input is smaller than the kernel.
  /// KAT's layout in and out; in training, for float on a host space with oneDNN
  /// (kat::dnn_available), also oneDNN's channels16 (a channel count that is a multiple of 16;
  /// oneDNN's pooling) or channels_last in and out (KAT's kernels on the transposed batch,
  /// bit-identical to KAT's layout), and in Precision::bf16 channels16_bf16 (a
  /// multiple of 16) or channels_last_bf16 (channels16 and the bf16 layouts only on CPUs with
  /// AVX-512, where oneDNN has kernels for them: kat::detail::dnn_reads_layout), where x, y, dy and
  /// dx hold bf16 values (a maximum is one of its inputs, so max pooling is exact; an average is
  /// computed in fp32 and rounded once) and the convolution before it writes bf16; unless an
  /// R-operator direction is bound (the R passes reuse KAT's own forward records).
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    return in == out &&
           (in == ActivationLayout::features ||
            (dnn_available<execution_space, Scalar>() && this->training_ && !direction_bound_ &&
             layout_fits(in, geometry_.channels, this->precision_) &&
             kat::detail::dnn_reads_layout(in)));
  }

  void bind_direction(Scalar * /*v*/, Scalar * /*hv*/) override { direction_bound_ = true; }

  /// y = the pooled x; x: N x (C·H·W), y: N x (C·H_out·W_out).
  /// @throws Error if output_shape() has not seen an input shape; ShapeError on other extents.
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region(kat::detail::concat("kat::nn::", type_, "::forward"));
    const Pool2dGeometry g = begin_forward(x, y);
    if (this->in_layout_ == ActivationLayout::channels_last) {
      // KAT's kernels on the transposed view: oneDNN 2.6's AVX2 max pooling with its training
      // workspace took 14.0 ms a forward + backward of the CNN's first pooling, this 4.2
      // (BM_PoolLayouts, docs/benchmarks.md).
      kernel_geometry_ = g.transposed_for(static_cast<int>(batch_));
      pool_forward(space, kernel_geometry_, channel_rows(x, g.in_size()),
                   channel_rows(y, g.out_size()));
      return;
    }
    if (dnn_forward(space, x, y, max_)) {
      return;
    }
    pool_forward(space, g, x, y);
  }

  /// dx = the transpose of the (last forward's) pooling applied to dy; an empty dx skips the
  /// work.
  /// @throws Error before the first forward(); ShapeError if dy or dx do not match it.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region(kat::detail::concat("kat::nn::", type_, "::backward"));
    check_backward(dy, dx);
    if (dnn_backward(space, dy, dx)) {
      return;
    }
    if (dx.extent(0) == 0) {
      return;
    }
    if (kernel_geometry_.transposed) { // the forward ran on a channels_last batch
      pool_backward(space, channel_rows(dy, forward_geometry_.out_size()),
                    channel_rows(dx, forward_geometry_.in_size()));
      return;
    }
    pool_backward(space, dy, dx);
  }

  /// R-operator (see Layer). Both poolings are linear in x once max pooling's argmax is fixed,
  /// and have no parameters: R{dx} = backward applied to R{dy} (no dy term).
  bool supports_r_operator() const override { return true; }

  /// ry = R{y} for rx = R{x} (rx of extent 0: ry = 0), after forward().
  /// @throws Error before the first forward() or after one in another layout than KAT's; ShapeError
  /// if rx or ry do not match it.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region(kat::detail::concat("kat::nn::", type_, "::forward_r"));
    require_kat_forward("forward_r");
    if (!check_forward_r(rx, ry)) {
      Kokkos::deep_copy(space, ry, Scalar(0));
      return;
    }
    pool_forward_r(space, rx, ry);
  }

  /// rdx = the backward of rdy (skipped when rdx is empty); dy is not needed.
  /// @throws Error before the first forward() or after one in another layout than KAT's; ShapeError
  /// if rdy or rdx do not match it.
  void backward_r(const execution_space &space, const matrix_type & /*dy*/, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region(kat::detail::concat("kat::nn::", type_, "::backward_r"));
    require_kat_forward("backward_r");
    check_backward(rdy, rdx, "backward_r");
    if (rdx.extent(0) == 0) {
      return;
    }
    pool_backward(space, rdy, rdx);
  }

  FeatureShape output_shape(const FeatureShape &input) const override {
    if (input.channels < 1 || input.height < 1 || input.width < 1) {
      throw ShapeError(kat::detail::concat("kat::nn::", type_,
                                           ": input channels, height and width must be >= 1, "
                                           "got ",
                                           input));
    }
    Pool2dGeometry g = geometry_;
    const int padded_h = input.height + 2 * g.pad_h;
    const int padded_w = input.width + 2 * g.pad_w;
    if (padded_h < g.kernel_h || padded_w < g.kernel_w) {
      throw ShapeError(kat::detail::concat("kat::nn::", type_, ": input ", input, " with padding ",
                                           format_pair(padding()), " must be at least the kernel ",
                                           format_pair(kernel()), " in height and width, got ",
                                           format_pair({padded_h, padded_w}), " after padding"));
    }
    g.channels = input.channels;
    g.height = input.height;
    g.width = input.width;
    g.out_height = (padded_h - g.kernel_h) / g.stride_h + 1;
    g.out_width = (padded_w - g.kernel_w) / g.stride_w + 1;
    geometry_ = g;
    return FeatureShape{g.channels, g.out_height, g.out_width};
  }

protected:
  /// `max`: max pooling (else average), for oneDNN.
  Pool2dBase(const char *type, bool max, std::array<int, 2> kernel, std::array<int, 2> stride,
             std::array<int, 2> padding)
      : type_(type), max_(max) {
    const std::string where = kat::detail::concat("kat::nn::", type_, ": ");
    if (kernel[0] < 1 || kernel[1] < 1) {
      throw ValueError(where + "kernel must be >= 1 in both dimensions, got " +
                       format_pair(kernel));
    }
    if (stride[0] < 1 || stride[1] < 1) {
      throw ValueError(where + "stride must be >= 1 in both dimensions, got " +
                       format_pair(stride));
    }
    if (padding[0] < 0 || padding[1] < 0) {
      throw ValueError(where + "padding must be >= 0 in both dimensions, got " +
                       format_pair(padding));
    }
    if (2 * padding[0] > kernel[0] || 2 * padding[1] > kernel[1]) {
      // PyTorch's rule; it keeps every window overlapping the input.
      throw ValueError(where + "padding must be at most half the kernel, (" +
                       std::to_string(kernel[0] / 2) + ", " + std::to_string(kernel[1] / 2) +
                       ") for kernel " + format_pair(kernel) + ", got " + format_pair(padding));
    }
    geometry_.kernel_h = kernel[0];
    geometry_.kernel_w = kernel[1];
    geometry_.stride_h = stride[0];
    geometry_.stride_w = stride[1];
    geometry_.pad_h = padding[0];
    geometry_.pad_w = padding[1];
  }

  Pool2dBase(const char *type, bool max, int kernel, int stride, int padding)
      : Pool2dBase(type, max, {kernel, kernel},
                   {stride == 0 ? kernel : stride, stride == 0 ? kernel : stride},
                   {padding, padding}) {}

  /// The kernels: y from x for the geometry of this forward() (KAT's layout) ...
  virtual void pool_forward(const execution_space &space, const Pool2dGeometry &g,
                            const matrix_type &x, const matrix_type &y) = 0;
  /// ... dx from dy (also R{dx} from R{dy}) and R{y} from R{x}, for kernel_geometry_.
  virtual void pool_backward(const execution_space &space, const matrix_type &dy,
                             const matrix_type &dx) = 0;
  virtual void pool_forward_r(const execution_space &space, const matrix_type &rx,
                              const matrix_type &ry) = 0;

  /// Validates forward's buffers against the recorded input shape and returns the geometry
  /// backward() will use.
  Pool2dGeometry begin_forward(const matrix_type &x, const matrix_type &y) {
    const std::string where = kat::detail::concat("kat::nn::", type_, "::forward");
    if (geometry_.channels == 0) {
      throw Error(where + ": the input shape is unknown; call output_shape(input) first "
                          "(Sequential::add does)");
    }
    kat::detail::require_extent(where.c_str(), "x columns", geometry_.in_size(), x.extent(1));
    kat::detail::require_extent(where.c_str(), "y rows", x.extent(0), y.extent(0));
    kat::detail::require_extent(where.c_str(), "y columns", geometry_.out_size(), y.extent(1));
    this->require_layouts_supported(where);
    forward_geometry_ = geometry_;
    kernel_geometry_ = geometry_;
    batch_ = x.extent(0);
    forwarded_ = true;
    dnn_forwarded_ = false;
    return forward_geometry_;
  }

  /// A channels_last batch matrix (N x `size`) as the C x (size / C · N) matrix of its channel
  /// vectors (Pool2dGeometry::transposed_for), over the same memory.
  matrix_type channel_rows(const matrix_type &m, std::size_t size) const {
    const auto c = static_cast<std::size_t>(forward_geometry_.channels);
    return matrix_type(m.data(), c, size / c * m.extent(0));
  }

  /// On oneDNN's path (channels16 and the bf16 layouts): y = pooled x through
  /// oneDNN, and true; false (nothing done) on KAT's layout. Call after begin_forward().
  bool dnn_forward(const execution_space &space, const matrix_type &x, const matrix_type &y,
                   bool max) {
    if constexpr (dnn_available<execution_space, Scalar>()) {
      if (this->in_layout_ != ActivationLayout::features) {
        const Pool2dGeometry &g = forward_geometry_;
        dnn_problem_ =
            Pool2dProblem{batch_,      g.channels, g.height,   g.width,         g.out_height,
                          g.out_width, g.kernel_h, g.kernel_w, g.stride_h,      g.stride_w,
                          g.pad_h,     g.pad_w,    max,        this->in_layout_};
        if (batch_ != 0) {
          dnn_.forward(space, dnn_problem_, x.data(), y.data());
        }
        dnn_forwarded_ = true;
        return true;
      }
    }
    (void)space, (void)x, (void)y, (void)max;
    return false;
  }

  /// backward of a forward that dnn_forward() served (true), else false.
  bool dnn_backward(const execution_space &space, const matrix_type &dy, const matrix_type &dx) {
    if constexpr (dnn_available<execution_space, Scalar>()) {
      if (dnn_forwarded_) {
        if (batch_ != 0 && dx.extent(0) != 0) {
          dnn_.backward(space, dnn_problem_, dy.data(), dx.data());
        }
        return true;
      }
    }
    (void)space, (void)dy, (void)dx;
    return false;
  }

  /// The R passes need KAT's own forward in KAT's layout.
  void require_kat_forward(const char *what) const {
    if (dnn_forwarded_ || kernel_geometry_.transposed) {
      throw Error(
          kat::detail::concat("kat::nn::", type_, "::", what, ": the last forward() ran in the ",
                              to_string(this->in_layout_),
                              " layout; run forward() again now that a direction is bound"));
    }
  }

  /// Validates forward_r's buffers against the last forward(); false if rx is empty (R{x} = 0,
  /// so R{y} = 0: a pooling layer has no parameters).
  bool check_forward_r(const matrix_type &rx, const matrix_type &ry) const {
    const std::string where = kat::detail::concat("kat::nn::", type_, "::forward_r");
    if (!forwarded_) {
      throw Error(where + ": call forward() first");
    }
    kat::detail::require_extent(where.c_str(), "ry rows", batch_, ry.extent(0));
    kat::detail::require_extent(where.c_str(), "ry columns", forward_geometry_.out_size(),
                                ry.extent(1));
    if (rx.extent(0) == 0) {
      return false;
    }
    kat::detail::require_extent(where.c_str(), "rx rows", batch_, rx.extent(0));
    kat::detail::require_extent(where.c_str(), "rx columns", forward_geometry_.in_size(),
                                rx.extent(1));
    return true;
  }

  /// Validates backward's (or, with what = "backward_r", backward_r's rdy and rdx) buffers
  /// against the last forward().
  void check_backward(const matrix_type &dy, const matrix_type &dx,
                      const char *what = "backward") const {
    const std::string where = kat::detail::concat("kat::nn::", type_, "::", what);
    if (!forwarded_) {
      throw Error(where + ": call forward() first");
    }
    kat::detail::require_extent(where.c_str(), "dy rows", batch_, dy.extent(0));
    kat::detail::require_extent(where.c_str(), "dy columns", forward_geometry_.out_size(),
                                dy.extent(1));
    if (dx.extent(0) != 0) {
      kat::detail::require_extent(where.c_str(), "dx rows", batch_, dx.extent(0));
      kat::detail::require_extent(where.c_str(), "dx columns", forward_geometry_.in_size(),
                                  dx.extent(1));
    }
  }

  std::string type_;
  bool max_;
  mutable Pool2dGeometry geometry_; // hyperparameters + the shape output_shape() last saw
  Pool2dGeometry forward_geometry_; // what the last forward() ran with
  Pool2dGeometry kernel_geometry_;  // ... as KAT's kernels saw it (transposed in channels_last)
  std::size_t batch_ = 0;
  bool forwarded_ = false;
  bool dnn_forwarded_ = false;
  bool direction_bound_ = false;
  Pool2dProblem dnn_problem_;
  DnnIfAvailable<Pool2dDnn, execution_space, Scalar> dnn_;
};

} // namespace detail

} // namespace kat::nn
