#pragma once
/// @file
/// @brief The kernels of GlobalAvgPool2d as named functors.

#include "kat/core/activation_layout.hpp"
#include "kat/core/bfloat16.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// y(i, c) = the mean of channel c's plane of x, x in `layout` (global_avg_pool2d_forward).
template <class MatrixView> struct GlobalAvgPool2dForward {
  using Scalar = typename MatrixView::non_const_value_type;
  const Scalar *xp;
  MatrixView y;
  std::size_t plane;
  ActivationLayout layout;
  std::size_t n;
  std::size_t channels;
  Scalar count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t c) const {
    Scalar sum = 0;
    if (layout_stores_bf16(layout)) { // x holds bf16 values, summed in Scalar
      const auto *xb = reinterpret_cast<const bfloat16 *>(xp);
      for (std::size_t k = 0; k < plane; ++k) {
        sum += xb[kat::detail::activation_offset(layout, n, channels, plane, i, c, k)].to_float();
      }
    } else {
      for (std::size_t k = 0; k < plane; ++k) {
        sum += xp[kat::detail::activation_offset(layout, n, channels, plane, i, c, k)];
      }
    }
    y(i, c) = sum / count;
  }
};

/// dx(i, c, k) = dy(i, c) / plane, dx in `layout` (global_avg_pool2d_backward).
template <class MatrixView> struct GlobalAvgPool2dBackward {
  using Scalar = typename MatrixView::non_const_value_type;
  Scalar *dxp;
  MatrixView dy;
  std::size_t plane;
  ActivationLayout layout;
  std::size_t n;
  std::size_t channels;
  Scalar count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    const std::size_t c = j / plane, k = j % plane;
    const std::size_t at = kat::detail::activation_offset(layout, n, channels, plane, i, c, k);
    if (layout_stores_bf16(layout)) { // dx holds bf16 values
      reinterpret_cast<bfloat16 *>(dxp)[at] =
          bfloat16::from_float(static_cast<float>(dy(i, c) / count));
    } else {
      dxp[at] = dy(i, c) / count;
    }
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
