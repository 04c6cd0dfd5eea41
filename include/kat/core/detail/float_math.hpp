#pragma once
/// @file
/// @brief Internal: e^x and the standard normal CDF Φ and density φ in float from arithmetic
/// alone (no libm call), so that an element-wise kernel over them vectorizes on a host.
///
/// glibc's erfcf and expf are scalar calls a compiler cannot vectorize without -ffast-math:
/// GELU's forward and backward, a ViT step's largest kernels after attention, spent about 5 ns
/// an element and thread in them (9 ns for erfcf alone). These are branch-free (integer-mask
/// selects), so GCC vectorizes a loop over them with whatever vector ISA it compiles for (3x
/// faster GELU with AVX2 than with SSE2: docs/backends.md, "The host's vector instructions"),
/// and the same code runs on a GPU.

#include "kat/core/math.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace kat::math::detail {

/// The bits of a float and the float of given bits (the type pun every supported compiler
/// defines for unions; kat::bfloat16 uses the same).
KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float f) {
  union {
    float f;
    std::uint32_t u;
  } v{f};
  return v.u;
}
KOKKOS_INLINE_FUNCTION float float_from_bits(std::uint32_t bits) {
  union {
    std::uint32_t u;
    float f;
  } v{bits};
  return v.f;
}

/// a where `mask` is all ones, b where it is 0, by bit operations: GCC does not if-convert a
/// select between two computed floats under the default -ftrapping-math, which keeps a loop
/// over them scalar; integer masks it vectorizes.
KOKKOS_INLINE_FUNCTION float select_float(std::uint32_t mask, float a, float b) {
  return float_from_bits((float_bits(a) & mask) | (float_bits(b) & ~mask));
}

/// All ones where f is a NaN, else 0 (an integer comparison of the bits).
KOKKOS_INLINE_FUNCTION std::uint32_t nan_mask(float f) {
  return 0u - static_cast<std::uint32_t>((float_bits(f) & 0x7fffffffu) > 0x7f800000u);
}

/// 2^n for an integer n in [-126, 127], built from its exponent bits.
KOKKOS_INLINE_FUNCTION float exp2_int(int n) {
  return float_from_bits(static_cast<std::uint32_t>(n + 127) << 23);
}

/// e^a in float for any a: a = n ln2 + r with |r| <= ln2/2 (n = a·log2(e) rounded by a
/// truncating conversion, which -ffast-math cannot reorder as it can the 1.5·2^23 trick; Cody &
/// Waite's two-constant reduction), e^r by its Taylor polynomial of degree 7 (remainder below 6e-9
/// relative), scaled by 2^n as 2^(n/2)·2^(n − n/2) so that results down to the subnormals are
/// formed. The argument is clamped to [−104, 89] first (a NaN is returned as it came): e^a
/// underflows to 0 below and overflows to +inf above, as expf's does. Relative error within 2 ulp
/// over the normal range (tests/test_gelu_math.cpp checks it against double).
KOKKOS_INLINE_FUNCTION float exp_float(float a) {
  // The clamp on the bits (sign and magnitude; NaN's magnitude is above every limit): a float
  // clamp before the int conversion below kept GCC from vectorizing the loop.
  const std::uint32_t u = float_bits(a), sign = u & 0x80000000u, magnitude = u & 0x7fffffffu;
  const std::uint32_t limit = sign != 0 ? 0x42d00000u /* 104 */ : 0x42b20000u /* 89 */;
  const float c = float_from_bits(sign | (magnitude < limit ? magnitude : limit));
  constexpr float log2e = 1.44269504088896341f;
  const float scaled = c * log2e;
  // scaled is in [−150.1, 128.4]: shifted positive, truncation is floor, so n = ⌊scaled + 1/2⌋.
  const int ni = static_cast<int>(scaled + 256.5f) - 256;
  const float n = static_cast<float>(ni);
  constexpr float ln2_hi = 0.693145751953125f; // 12 significant bits: n·ln2_hi is exact
  constexpr float ln2_lo = 1.42860682030941723212e-6f;
  const float r = (c - n * ln2_hi) - n * ln2_lo;
  const float p =
      1.0f +
      r * (1.0f + r * (0.5f + r * (1.0f / 6 +
                                   r * (1.0f / 24 +
                                        r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
  const int n1 = ni / 2;
  return select_float(nan_mask(a), a, p * exp2_int(n1) * exp2_int(ni - n1));
}

/// t = 1/(1 + z/2) for z = |x|/√2, and Q(t), a polynomial approximation of the scaled
/// complementary error function over t: Q(t) ≈ erfc(z)·exp(z²)/t, so that
///   Φ(−|x|) = erfc(z)/2 = t·exp(−x²/2)·Q(t)/2.
/// This is the form of Press et al., "Numerical Recipes" (2nd ed., sec. 6.2, erfcc), with
/// erfcc's exp(P(t)) replaced by one polynomial (no second exponential): degree 9, from
/// Chebyshev interpolation of erfc(z)·exp(z²)/t on t in [0.15, 1] (|x| <= 16, past where Φ(−|x|)
/// underflows) in long double, coefficients rounded to float (scripts/fit_normal_tail.cpp prints
/// them; Q(1) = 1 in float, so Φ(0) = 1/2 exactly). Q(0) ≈ 1/(2√π), the asymptote. Evaluated
/// in float, t·Q(t) is within 2.8e-7 relative of erfc(z)·exp(z²) over |x| <= 15.5 (measured by
/// that program).
KOKKOS_INLINE_FUNCTION void normal_tail_terms(float ax, float &t, float &q) {
  const float z = ax * 0.70710678118654752f;
  t = 1.0f / (1.0f + 0.5f * z);
  q = 2.820641100e-01f +
      t * (2.828835249e-01f +
           t * (2.382433861e-01f +
                t * (2.283391058e-01f +
                     t * (-1.091971472e-01f +
                          t * (4.467795789e-01f +
                               t * (-7.068771720e-01f +
                                    t * (4.610407948e-01f +
                                         t * (-1.387226135e-01f + t * 1.544642448e-02f))))))));
}

/// |x| clamped to 64 (Φ and φ are 0 or 1 in float long before; ±inf would give inf − inf in
/// exp_minus_half_square) by its bits, as exp_float clamps; a NaN becomes 64, and the callers
/// return the NaN they were given.
KOKKOS_INLINE_FUNCTION float clamped_magnitude(float x) {
  const std::uint32_t m = float_bits(x) & 0x7fffffffu;
  return float_from_bits(m < 0x42800000u ? m : 0x42800000u); // 64
}

/// exp(−x²/2) for x = |x| in [0, 64] without the rounding of x² (which would cost up to
/// x²/2·2^-24 relative: 3e-6 at x = 10), as in fdlibm's erfc: with s, x with its 12 low
/// significand bits cleared, −x²/2 = head + rest where head = −s²/2 is exact (s has 12
/// significant bits) and rest = (s − x)(s + x)/2 is below 2^-11·x² in magnitude; the result is
/// exp_float(head) times e^rest by its Taylor polynomial of degree 5 (|rest| <= 0.1 wherever the
/// result is above 0 in float, a remainder below 2e-9 relative; beyond, exp_float(head) is 0).
KOKKOS_INLINE_FUNCTION float exp_minus_half_square(float ax) {
  const float s = float_from_bits(float_bits(ax) & 0xfffff000u);
  const float head = -0.5f * (s * s);
  const float rest = 0.5f * ((s - ax) * (s + ax));
  const float e_rest =
      1.0f + rest * (1.0f + rest * (0.5f + rest * (1.0f / 6 + rest * (1.0f / 24 + rest / 120))));
  return exp_float(head) * e_rest;
}

/// e^x: exp_float for float (vectorizable), libm's (Kokkos's) for other types.
template <class T> KOKKOS_INLINE_FUNCTION T exp_vectorizable(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp_float(x);
  } else {
    return math::exp(x);
  }
}

/// Φ(x) = erfc(−x/√2)/2, the standard normal CDF, and φ(x) = exp(−x²/2)/√(2π), its density,
/// in float, from one exponential: e = exp(−x²/2) (exp_minus_half_square), φ = e/√(2π), and
/// the tail Φ(−|x|) = t·e·Q(t)/2 (normal_tail_terms); erfc(−z) = 2 − erfc(z) gives x > 0 as
/// 1 − Φ(−|x|). Relative error within 1e-6 for both (from Q, exp_float's 2 ulp and the float
/// products), measured against double precision in tests/test_gelu_math.cpp. NaN gives NaN; ±inf
/// give Φ = 1 and 0, φ = 0.
KOKKOS_INLINE_FUNCTION void normal_cdf_pdf(float x, float &cdf, float &pdf) {
  const float ax = clamped_magnitude(x);
  float t, q;
  normal_tail_terms(ax, t, q);
  const float e = exp_minus_half_square(ax);
  const float tail = 0.5f * t * q * e;
  const std::uint32_t negative = 0u - (float_bits(x) >> 31), nan = nan_mask(x);
  cdf = select_float(nan, x, select_float(negative, tail, 1.0f - tail)); // −0 too: both are 1/2
  pdf = select_float(nan, x, 0.39894228040143267794f * e);
}

/// Φ(x) alone, as normal_cdf_pdf computes it.
KOKKOS_INLINE_FUNCTION float normal_cdf(float x) {
  float cdf, pdf;
  normal_cdf_pdf(x, cdf, pdf);
  return cdf;
}

/// φ(x) = exp(−x²/2)/√(2π) alone, as normal_cdf_pdf computes it.
KOKKOS_INLINE_FUNCTION float normal_pdf(float x) {
  return select_float(nan_mask(x), x,
                      0.39894228040143267794f * exp_minus_half_square(clamped_magnitude(x)));
}

} // namespace kat::math::detail
