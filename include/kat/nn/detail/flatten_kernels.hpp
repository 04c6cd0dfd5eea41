#pragma once
/// @file
/// @brief The kernels of Flatten as named functors: a batch from another activation layout into
/// KAT's feature order, and back.

#include "kat/core/activation_layout.hpp"
#include "kat/core/bfloat16.hpp"
#include "kat/core/policy.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// Where element (i, j) of an N x (C·H·W) batch in KAT's feature order (column j =
/// h + H (w + W c)) sits in a buffer holding the batch in `layout` (oneDNN's layouts walk a
/// plane as h W + w).
KOKKOS_INLINE_FUNCTION std::size_t flatten_source_offset(ActivationLayout layout, std::size_t n,
                                                         std::size_t channels, std::size_t height,
                                                         std::size_t width, std::size_t i,
                                                         std::size_t j) {
  const std::size_t plane = height * width;
  const std::size_t c = j / plane, r = j % plane;
  const std::size_t h = r % height, w = r / height;
  return kat::detail::activation_offset(layout, n, channels, plane, i, c, h * width + w);
}

/// y(i, j) = element j (KAT's feature order) of sample i of x, x in `layout`, bf16 values
/// widened exactly (flatten_forward).
template <class MatrixView> struct FlattenFromLayout {
  using Scalar = typename MatrixView::non_const_value_type;
  const Scalar *xp;
  MatrixView y;
  ActivationLayout layout;
  std::size_t channels, height, width;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    const std::size_t at =
        flatten_source_offset(layout, y.extent(0), channels, height, width, i, j);
    if (layout_stores_bf16(layout)) {
      y(i, j) = static_cast<Scalar>(reinterpret_cast<const bfloat16 *>(xp)[at].to_float());
    } else {
      y(i, j) = xp[at];
    }
  }
};

/// The transpose of FlattenFromLayout: dy in KAT's feature order into dx in `layout`, rounded
/// to bf16 (nearest even) where the layout stores bf16 (flatten_backward).
template <class MatrixView> struct FlattenToLayout {
  using Scalar = typename MatrixView::non_const_value_type;
  MatrixView dy;
  Scalar *dxp;
  ActivationLayout layout;
  std::size_t channels, height, width;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    const std::size_t at =
        flatten_source_offset(layout, dy.extent(0), channels, height, width, i, j);
    if (layout_stores_bf16(layout)) {
      reinterpret_cast<bfloat16 *>(dxp)[at] = bfloat16::from_float(static_cast<float>(dy(i, j)));
    } else {
      dxp[at] = dy(i, j);
    }
  }
};

/// y = x (a batch of (C, H, W) samples in `layout`) in KAT's feature order.
template <class ExecSpace, class MatrixView>
void flatten_forward(const ExecSpace &space, const MatrixView &x, const MatrixView &y,
                     ActivationLayout layout, std::size_t channels, std::size_t height,
                     std::size_t width) {
  Kokkos::parallel_for("kat::nn::Flatten::forward", matrix_policy(space, y.extent(0), y.extent(1)),
                       FlattenFromLayout<MatrixView>{x.data(), y, layout, channels, height, width});
}

/// dx (in `layout`) = dy (in KAT's feature order): the transpose of flatten_forward.
template <class ExecSpace, class MatrixView>
void flatten_backward(const ExecSpace &space, const MatrixView &dy, const MatrixView &dx,
                      ActivationLayout layout, std::size_t channels, std::size_t height,
                      std::size_t width) {
  Kokkos::parallel_for("kat::nn::Flatten::backward",
                       matrix_policy(space, dy.extent(0), dy.extent(1)),
                       FlattenToLayout<MatrixView>{dy, dx.data(), layout, channels, height, width});
}

} // namespace detail
} // namespace nn
} // namespace kat
