#pragma once
/// @file
/// @brief kat::bfloat16, the 16-bit "brain floating point" storage format, for sending values
/// in half the bytes of float (DASO's blocking parameter averages).

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kat {

/// A bfloat16 number: the upper 16 bits of an IEEE-754 binary32 (sign, 8 exponent bits, 7
/// mantissa bits), so it has float's range with 8 significant bits (relative spacing 2^-7).
/// A storage and transport format: convert to float for arithmetic.
///
/// from_float() rounds to nearest, ties to even (as PyTorch's `tensor.to(torch.bfloat16)`);
/// values beyond the largest finite bfloat16 (about 3.39e38) round to infinity, NaN stays a
/// (quiet) NaN. to_float() is exact.
struct bfloat16 {
  std::uint16_t bits = 0; ///< the 16 bits: sign, 8 exponent bits, 7 mantissa bits

  /// The bfloat16 nearest to `f` (ties to even).
  KOKKOS_INLINE_FUNCTION static bfloat16 from_float(float f) {
    union {
      float f;
      std::uint32_t u;
    } v{f};
    bfloat16 out;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) { // NaN: keep the sign, make it quiet
      out.bits = static_cast<std::uint16_t>((v.u >> 16) | 0x0040u);
      return out;
    }
    const std::uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    out.bits = static_cast<std::uint16_t>((v.u + rounding) >> 16);
    return out;
  }

  /// The exact float value.
  KOKKOS_INLINE_FUNCTION float to_float() const {
    union {
      std::uint32_t u;
      float f;
    } v{static_cast<std::uint32_t>(bits) << 16};
    return v.f;
  }
};

static_assert(sizeof(bfloat16) == 2, "kat::bfloat16 must be 2 bytes");

} // namespace kat
