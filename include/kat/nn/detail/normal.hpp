#pragma once
/// @file
/// @brief Normally distributed initial values as a pure function of (seed, stream, index).

#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/random.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

namespace kat::nn::detail {

/// A standard normal draw for element `index` of stream `stream` under `seed`: Marsaglia's
/// polar method (Marsaglia & Bray 1964) on the SplitMix64 sequence started at
/// counter_bits(seed, stream, index), so the value does not depend on the backend or on
/// the thread order. It needs only log and sqrt (no cos, which kat::math lacks). Each try
/// is accepted with probability π/4; after 64 rejected tries (probability below 1e-42) it
/// gives 0.
KOKKOS_INLINE_FUNCTION double counter_normal(std::uint64_t seed, std::uint64_t stream,
                                             std::uint64_t index) {
  const std::uint64_t key = counter_bits(seed, stream, index);
  for (std::uint64_t attempt = 0; attempt < 64; ++attempt) {
    const double u =
        2.0 * static_cast<double>(splitmix64(key + 2 * attempt) >> 11) * 0x1.0p-53 - 1.0;
    const double w =
        2.0 * static_cast<double>(splitmix64(key + 2 * attempt + 1) >> 11) * 0x1.0p-53 - 1.0;
    const double s = u * u + w * w;
    if (s > 0.0 && s < 1.0) {
      return u * math::sqrt(-2.0 * math::log(s) / s);
    }
  }
  return 0.0;
}

/// v(i) = mean + stddev · counter_normal(seed, stream, i), as View's value type (normal_). A named
/// functor, not an extended lambda: nvcc's wrapper of an extended lambda in a header is merged
/// across translation units while its function pointers are not (docs/backends.md).
template <class View> struct NormalFill {
  // Not named value_type, which Kokkos reads as a reduction's.
  using Value = typename View::non_const_value_type;
  View v;
  double mean;
  double stddev;
  std::uint64_t seed;
  std::uint64_t stream;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    v(i) = static_cast<Value>(mean + stddev * counter_normal(seed, stream, i));
  }
};

/// Fills `v` with N(mean, stddev²) draws, element i from counter_normal(seed, stream, i)
/// (the embeddings' initialization: torch.nn.Embedding's N(0, 1), ViT's N(0, 0.02²)).
/// @throws ValueError if mean or stddev is not finite or stddev < 0.
template <class ExecSpace, class View>
void normal_(const ExecSpace &space, const View &v, double mean, double stddev, std::uint64_t seed,
             std::uint64_t stream) {
  static_assert(View::rank == 1, "kat::nn::detail::normal_: needs a rank-1 view");
  if (!(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0.0)) {
    throw ValueError(kat::detail::concat("kat::nn::normal_: mean and stddev must be finite with "
                                         "stddev >= 0, got mean = ",
                                         mean, ", stddev = ", stddev));
  }
  Kokkos::parallel_for("kat::nn::normal_", Kokkos::RangePolicy<ExecSpace>(space, 0, v.extent(0)),
                       NormalFill<View>{v, mean, stddev, seed, stream});
}

} // namespace kat::nn::detail
