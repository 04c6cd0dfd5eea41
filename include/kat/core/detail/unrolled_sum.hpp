#pragma once
/// @file
/// @brief Internal: a sum in interleaved partial sums, which compilers vectorize.

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat::detail {

/// Σ_i f(i) for i < n, in Accum: 16 interleaved partial sums over the full groups of 16 terms
/// (term i goes to partial i mod 16), added pairwise (partial k and k + 8, then k and k + 4,
/// ...), then the n mod 16 terms left in order. The leftover terms go to a sum of their own:
/// added into the partials by a runtime index, they kept the partials in memory instead of
/// registers (Dense's bias gradients 40 % slower in a ViT step). A fixed order, so
/// the result is deterministic, and no chain of additions as long as n: compilers turn the
/// partials into SIMD additions. One chain per column bound Dense's bias gradients and
/// LayerNorm's dγ, dβ on a host by an addition's latency per row (docs/benchmarks.md,
/// "Kernel design choices, measured"). 16, not 8: with AVX-512 (-march=native) GCC 12 made 8
/// partial sums half as fast as 16 in unrolled_dot; the baseline x86-64 build runs both at the
/// same speed.
template <class Accum, class F>
KOKKOS_INLINE_FUNCTION Accum unrolled_sum(std::size_t n, const F &f) {
  constexpr int lanes = 16;
  Accum s[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int k = 0; k < lanes; ++k) {
      s[k] += f(i + k);
    }
  }
  for (int width = lanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) {
      s[k] += s[k + width];
    }
  }
  Accum sum = s[0];
  for (; i < n; ++i) {
    sum += f(i);
  }
  return sum;
}

} // namespace kat::detail
