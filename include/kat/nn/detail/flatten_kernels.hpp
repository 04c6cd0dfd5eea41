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

/// Element (i, j) of a batch in KAT's feature order, `features`, and the same element of a
/// batch in `layout` at `other`: with ToLayout false, features(i, j) = other's element (bf16
/// values widened exactly; Flatten's forward), with ToLayout true the transpose, other's element
/// = features(i, j), rounded to bf16 (nearest even) where the layout stores bf16
/// (its backward): flatten_permute.
template <class MatrixView, bool ToLayout> struct FlattenPermute {
  using Scalar = typename MatrixView::non_const_value_type;
  MatrixView features;
  Scalar *other;
  ActivationLayout layout;
  std::size_t channels, height, width;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    const std::size_t at =
        flatten_source_offset(layout, features.extent(0), channels, height, width, i, j);
    auto *bf16 = reinterpret_cast<bfloat16 *>(other);
    if constexpr (ToLayout) {
      if (layout_stores_bf16(layout)) {
        bf16[at] = bfloat16::from_float(static_cast<float>(features(i, j)));
      } else {
        other[at] = features(i, j);
      }
    } else {
      features(i, j) =
          layout_stores_bf16(layout) ? static_cast<Scalar>(bf16[at].to_float()) : other[at];
    }
  }
};

/// Without ToLayout, `features` (N x C·H·W, KAT's order) = the batch of (C, H, W) samples at
/// `other` in `layout` (Flatten's forward); with ToLayout the transpose, `other` = `features`
/// (its backward: dy into dx).
template <bool ToLayout, class ExecSpace, class MatrixView>
void flatten_permute(const ExecSpace &space, const MatrixView &features,
                     typename MatrixView::non_const_value_type *other, ActivationLayout layout,
                     std::size_t channels, std::size_t height, std::size_t width) {
  Kokkos::parallel_for(
      ToLayout ? "kat::nn::Flatten::backward" : "kat::nn::Flatten::forward",
      matrix_policy(space, features.extent(0), features.extent(1)),
      FlattenPermute<MatrixView, ToLayout>{features, other, layout, channels, height, width});
}

} // namespace detail
} // namespace nn
} // namespace kat
