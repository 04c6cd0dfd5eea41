#pragma once
/// @file
/// @brief Conv2d's geometry and its im2col and col2im kernels as named functors.

#include "kat/core/bfloat16.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace kat {
namespace nn {
namespace detail {

/// Geometry of one Conv2d applied to one (C, H, W) input, with PyTorch's output-size rule.
/// Plain ints, so kernels capture it by value.
struct Conv2dGeometry {
  int in_channels = 0, out_channels = 0;
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dilation_h = 1, dilation_w = 1;
  int height = 0, width = 0; ///< input; 0 until output_shape() has seen a shape
  int out_height = 0, out_width = 0;

  /// K = C_in * k_h * k_w, the number of patch columns (without the bias column).
  std::size_t patch_size() const {
    return static_cast<std::size_t>(in_channels) * static_cast<std::size_t>(kernel_h) *
           static_cast<std::size_t>(kernel_w);
  }
  /// H_out * W_out, the number of output positions per sample.
  std::size_t positions() const {
    return static_cast<std::size_t>(out_height) * static_cast<std::size_t>(out_width);
  }
  std::size_t in_size() const {
    return static_cast<std::size_t>(in_channels) * static_cast<std::size_t>(height) *
           static_cast<std::size_t>(width);
  }
  std::size_t out_size() const { return static_cast<std::size_t>(out_channels) * positions(); }
};

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// `v` as an im2col entry of type Out: itself, or rounded to nearest even for kat::bfloat16.
template <class Out, class Scalar> KOKKOS_INLINE_FUNCTION Out im2col_entry(Scalar v) {
  if constexpr (std::is_same<Out, bfloat16>::value) {
    return bfloat16::from_float(static_cast<float>(v));
  } else {
    return v;
  }
}

/// im2col for the output positions [p0, p1): a team per patch column k (conv2d_im2col),
/// writing entries of type Out (Scalar, or kat::bfloat16 for a bf16 product).
template <class ExecSpace, class Scalar, class Out = Scalar> struct Conv2dIm2col {
  Conv2dGeometry g;
  std::size_t n;
  const Scalar *x;
  std::size_t p0;
  std::size_t p1;
  Out *patches;
  std::size_t ho;
  std::size_t rows;
  std::size_t ow_first;
  int ow_count;
  int patch;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const int k = team.league_rank();
    const int i = k % g.kernel_h;
    const int j = (k / g.kernel_h) % g.kernel_w;
    const int c = k / (g.kernel_h * g.kernel_w);
    const int ih0 = i * g.dilation_h - g.pad_h; // input row of output row 0
    // Output rows whose input row is inside the image: [oh_valid_lo, oh_valid_hi).
    const int oh_valid_lo = ih0 >= 0 ? 0 : (-ih0 + g.stride_h - 1) / g.stride_h;
    const int oh_valid_hi = g.height - 1 - ih0 < 0 ? 0 : (g.height - 1 - ih0) / g.stride_h + 1;
    Out *column = patches + rows * static_cast<std::size_t>(k);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, ow_count), [&](const int t) {
      const std::size_t ow = ow_first + static_cast<std::size_t>(t);
      const std::size_t q_begin = p0 > ho * ow ? p0 : ho * ow;
      const std::size_t q_end = p1 < ho * (ow + 1) ? p1 : ho * (ow + 1);
      const int oh_begin = static_cast<int>(q_begin - ho * ow);
      const int oh_end = static_cast<int>(q_end - ho * ow);
      Out *dst = column + n * (q_begin - p0); // row of (oh_begin, ow)
      const int iw = static_cast<int>(ow) * g.stride_w - g.pad_w + j * g.dilation_w;
      const bool column_inside = k < patch && iw >= 0 && iw < g.width;
      const int a = column_inside ? (oh_valid_lo > oh_begin ? oh_valid_lo : oh_begin)
                                  : oh_end; // valid rows [a, b)
      const int b = column_inside ? (oh_valid_hi < oh_end ? oh_valid_hi : oh_end) : oh_end;
      const int copy_begin = a < b ? a : oh_end;
      const int copy_end = a < b ? b : oh_end;
      const Out outside = im2col_entry<Out>(k < patch ? Scalar(0) : Scalar(1));
      // Padding (or the bias column's ones) before and after the valid rows.
      Kokkos::parallel_for(
          Kokkos::ThreadVectorRange(team, n * static_cast<std::size_t>(copy_begin - oh_begin)),
          [&](const std::size_t e) { dst[e] = outside; });
      Kokkos::parallel_for(
          Kokkos::ThreadVectorRange(team, n * static_cast<std::size_t>(oh_end - copy_end)),
          [&](const std::size_t e) { dst[n * (copy_end - oh_begin) + e] = outside; });
      if (copy_begin == copy_end) {
        return;
      }
      const std::size_t plane =
          static_cast<std::size_t>(g.height) *
          (static_cast<std::size_t>(iw) + static_cast<std::size_t>(g.width) * c);
      Out *out = dst + n * static_cast<std::size_t>(copy_begin - oh_begin);
      const Scalar *in = x + n * (plane + static_cast<std::size_t>(copy_begin * g.stride_h + ih0));
      if (g.stride_h == 1) {
        Kokkos::parallel_for(
            Kokkos::ThreadVectorRange(team, n * static_cast<std::size_t>(copy_end - copy_begin)),
            [&](const std::size_t e) { out[e] = im2col_entry<Out>(in[e]); });
      } else {
        const std::size_t in_step = n * static_cast<std::size_t>(g.stride_h);
        for (int oh = copy_begin; oh < copy_end; ++oh) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                               [&](const std::size_t e) { out[e] = im2col_entry<Out>(in[e]); });
          out += n;
          in += in_step;
        }
      }
    });
  }
};

/// col2im as a gather over the band [ih_lo, ih_hi] x [iw_lo, iw_hi]: a team per (c, iw)
/// (conv2d_col2im).
template <class ExecSpace, class Scalar> struct Conv2dCol2im {
  Conv2dGeometry g;
  std::size_t n;
  const Scalar *dpatches;
  std::size_t rows;
  Scalar *dx;
  int ih_lo;
  int iw_lo;
  bool overwrite;
  int band_h;
  int band_w;
  long long base;
  long long first;
  long long last;
  int step_qh;
  int step_rh;
  int step_qw;
  int step_rw;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const int c = team.league_rank() / band_w;
    const int iw = iw_lo + team.league_rank() % band_w;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, band_h), [&](const int t) {
      const int ih = ih_lo + t;
      Scalar *out =
          dx + n * (static_cast<std::size_t>(ih) +
                    static_cast<std::size_t>(g.height) *
                        (static_cast<std::size_t>(iw) + static_cast<std::size_t>(g.width) * c));
      if (overwrite) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                             [&](const std::size_t e) { out[e] = Scalar(0); });
      }
      // th = ih + p_h - i d_h = qh s_h + rh and tw = iw + p_w - j d_w = qw s_w + rw with
      // 0 <= r < s, stepped without divisions: th >= 0 iff qh >= 0, and it is a window
      // start iff rh == 0, at output row qh.
      int qh = (ih + g.pad_h) / g.stride_h, rh = (ih + g.pad_h) % g.stride_h;
      const int qw0 = (iw + g.pad_w) / g.stride_w, rw0 = (iw + g.pad_w) % g.stride_w;
      for (int i = 0; i < g.kernel_h && qh >= 0; ++i) {
        if (rh == 0 && qh < g.out_height) {
          int qw = qw0, rw = rw0;
          for (int j = 0; j < g.kernel_w && qw >= 0; ++j) {
            const long long p = qh + static_cast<long long>(g.out_height) * qw;
            if (rw == 0 && qw < g.out_width && p >= first && p < last) {
              const std::size_t k = static_cast<std::size_t>(i + g.kernel_h * (j + g.kernel_w * c));
              const Scalar *src = dpatches + n * static_cast<std::size_t>(p - base) + rows * k;
              Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                                   [&](const std::size_t e) { out[e] += src[e]; });
            }
            qw -= step_qw;
            rw -= step_rw;
            if (rw < 0) {
              rw += g.stride_w;
              --qw;
            }
          }
        }
        qh -= step_qh;
        rh -= step_rh;
        if (rh < 0) {
          rh += g.stride_h;
          --qh;
        }
      }
    });
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
