#pragma once
/// @file
/// @brief The memory layouts a batch of activations may take between layers.

#include "kat/core/precision.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {

/// How a batch of N samples with (C, H, W) features is laid out in memory. Containers
/// (Sequential, Residual) choose a layout for every activation between two layers, among
/// those both layers support (Layer::supports_layouts); the model's input and output are
/// always `features`.
enum class ActivationLayout : std::uint8_t {
  /// KAT's layout: an N x (C·H·W) column-major matrix with feature index h + H (w + W c), so
  /// element (n, c, h, w) is at n + N (h + H (w + W c)) and each channel's N·H·W values are
  /// contiguous.
  features = 0,
  /// oneDNN's nChw16c, the layout its CPU f32 convolutions compute in: element (n, c, h, w) at
  /// (((n (C/16) + c/16) H + h) W + w) 16 + c mod 16. Only for C a multiple of 16, so it
  /// holds exactly N·C·H·W values, in the same N x (C·H·W) matrix (whose element indices
  /// then mean nothing). Used between layers that compute through oneDNN in fp32, so
  /// consecutive convolutions, batch normalizations, activations and residual additions
  /// exchange activations without converting them.
  channels16 = 1,
  /// Channels last (oneDNN's nhwc, PyTorch's torch.channels_last): element (n, c, h, w) at
  /// ((n H + h) W + w) C + c, any C, in the same N x (C·H·W) matrix. Used between layers
  /// that compute through oneDNN in Precision::bf16: its AMX convolutions read bf16 and write
  /// f32 in this order, so the activations between them need only a conversion to bf16, no
  /// transposition (with channels16 every convolution reordered its input and its output).
  channels_last = 2,
  /// Channels last with the values stored as kat::bfloat16 (round to nearest even): element
  /// (n, c, h, w) is the bf16 value number ((n H + h) W + w) C + c of the buffer, so the
  /// N·C·H·W values take the first half of the N x (C·H·W) float matrix. Used in
  /// Precision::bf16 between layers that read and write bf16 activations themselves (oneDNN's
  /// convolutions, batch normalization and pooling, a ReLU; Flatten's input), as autocast
  /// keeps a convolution's output in bf16: half the memory traffic, and no conversion before
  /// the next convolution. Only layers that say so take it (layout_fits() is false for it);
  /// their docs name it.
  channels_last_bf16 = 3,
  /// oneDNN's nChw16c (as channels16, C a multiple of 16) with the values stored as
  /// kat::bfloat16: element (n, c, h, w) is the bf16 value number
  /// (((n (C/16) + c/16) H + h) W + w) 16 + c mod 16 of the buffer. The bf16-storage layout of
  /// CPUs whose oneDNN bf16 convolutions compute in nChw16c (AVX512-BF16 without AMX, such as
  /// AMD's Zen 4), as channels_last_bf16 is that of CPUs with AMX: the same layers take it, and
  /// LayerChain prefers whichever of the two the convolutions pick here
  /// (kat::detail::dnn_bf16_blocked()).
  channels16_bf16 = 4,
};

/// The layouts, in the order containers prefer them where oneDNN's bf16 convolutions compute
/// channels last (kat::nn::detail::LayerChain picks the first one both neighbouring layers
/// support); where they compute in nChw16c, LayerChain swaps the channels-last and the
/// channels16 layouts of each kind (bf16 storage, then Scalar).
inline constexpr ActivationLayout activation_layouts_by_preference[] = {
    ActivationLayout::channels_last_bf16, ActivationLayout::channels16_bf16,
    ActivationLayout::channels_last, ActivationLayout::channels16, ActivationLayout::features};

/// Whether `layout` stores bf16 values (channels_last_bf16, channels16_bf16) rather than the
/// layer's Scalar.
KOKKOS_INLINE_FUNCTION constexpr bool layout_stores_bf16(ActivationLayout layout) {
  return layout == ActivationLayout::channels_last_bf16 ||
         layout == ActivationLayout::channels16_bf16;
}

/// Whether `layout` orders a batch as oneDNN's nChw16c (channels16, channels16_bf16).
KOKKOS_INLINE_FUNCTION constexpr bool layout_blocks16(ActivationLayout layout) {
  return layout == ActivationLayout::channels16 || layout == ActivationLayout::channels16_bf16;
}

/// "features", "channels16", "channels_last", "channels_last_bf16" or "channels16_bf16".
inline const char *to_string(ActivationLayout layout) {
  switch (layout) {
  case ActivationLayout::channels16_bf16:
    return "channels16_bf16";
  case ActivationLayout::channels_last_bf16:
    return "channels_last_bf16";
  case ActivationLayout::channels16:
    return "channels16";
  case ActivationLayout::channels_last:
    return "channels_last";
  default:
    return "features";
  }
}

/// Whether a batch of `channels` Scalar values per position can take `layout`: features and
/// channels_last with any count, channels16 with a positive multiple of 16; never a layout
/// that stores bf16 values (the layers that take those check layout_fits_bf16() themselves).
constexpr bool layout_fits(ActivationLayout layout, long long channels) {
  return channels > 0 && !layout_stores_bf16(layout) &&
         (!layout_blocks16(layout) || channels % 16 == 0);
}

/// Whether `layout` stores bf16 values and a batch of `channels` per position can take it:
/// channels_last_bf16 with any positive count, channels16_bf16 with a positive multiple of 16.
constexpr bool layout_fits_bf16(ActivationLayout layout, long long channels) {
  return channels > 0 && layout_stores_bf16(layout) &&
         (!layout_blocks16(layout) || channels % 16 == 0);
}

/// Whether a layer computing in `precision` can hold a batch of `channels` per position in
/// `layout`: layout_fits(), or in Precision::bf16 also layout_fits_bf16() (fp32 never stores
/// bf16 values).
constexpr bool layout_fits(ActivationLayout layout, long long channels, Precision precision) {
  return layout_stores_bf16(layout)
             ? precision == Precision::bf16 && layout_fits_bf16(layout, channels)
             : layout_fits(layout, channels);
}

namespace detail {
/// Offset of element (n, c, hw) of an (N, C, P = H·W) batch in `layout`, where hw indexes the
/// plane in the layout's own order (h + H w in features, h W + w in oneDNN's layouts): for
/// kernels that treat every position of a plane alike (a global average).
KOKKOS_INLINE_FUNCTION std::size_t activation_offset(ActivationLayout layout, std::size_t N,
                                                     std::size_t C, std::size_t P, std::size_t n,
                                                     std::size_t c, std::size_t hw) {
  switch (layout) {
  case ActivationLayout::channels16:
  case ActivationLayout::channels16_bf16: // in bf16 values
    return ((n * (C / 16) + c / 16) * P + hw) * 16 + c % 16;
  case ActivationLayout::channels_last:
  case ActivationLayout::channels_last_bf16: // in bf16 values
    return (n * P + hw) * C + c;
  default:
    return n + N * (hw + P * c);
  }
}
} // namespace detail

} // namespace kat
