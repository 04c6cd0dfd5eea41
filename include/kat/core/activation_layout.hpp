#pragma once
/// @file
/// @brief The memory layouts a batch of activations may take between layers.

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
  /// oneDNN's nChw16c, the layout its CPU convolutions compute in: element (n, c, h, w) at
  /// (((n (C/16) + c/16) H + h) W + w) 16 + c mod 16. Only for C a multiple of 16, so it
  /// holds exactly N·C·H·W values, in the same N x (C·H·W) matrix (whose element indices
  /// then mean nothing). Used between layers that compute through oneDNN, so consecutive
  /// convolutions, batch normalizations, activations and residual additions exchange
  /// activations without converting them.
  channels16 = 1,
};

/// "features" or "channels16".
inline const char *to_string(ActivationLayout layout) {
  return layout == ActivationLayout::features ? "features" : "channels16";
}

namespace detail {
/// Offset of element (n, c, hw) of an (N, C, P = H·W) batch in `layout`.
KOKKOS_INLINE_FUNCTION std::size_t activation_offset(ActivationLayout layout, std::size_t N,
                                                     std::size_t C, std::size_t P, std::size_t n,
                                                     std::size_t c, std::size_t hw) {
  return layout == ActivationLayout::features ? n + N * (hw + P * c)
                                              : ((n * (C / 16) + c / 16) * P + hw) * 16 + c % 16;
}
} // namespace detail

} // namespace kat
