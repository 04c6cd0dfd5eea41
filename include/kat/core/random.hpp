#pragma once
/// @file
/// @brief Seeded, counter-based random numbers.
///
/// Every random value KAT draws on a device is a pure function of (seed, stream, index):
/// a SplitMix64 hash (Steele, Lea & Flood, OOPSLA 2014) of the three. Unlike a per-thread
/// generator pool, the result does not depend on the backend, the thread count or the order
/// in which threads run, so initial weights and dropout masks are identical on Serial,
/// OpenMP, CUDA and HIP for the same seed.

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kat {

/// SplitMix64 finalizer: a bijective 64-bit mix with full avalanche.
KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The 64 random bits of element `index` of stream `stream` under `seed`.
KOKKOS_INLINE_FUNCTION std::uint64_t counter_bits(std::uint64_t seed, std::uint64_t stream,
                                                  std::uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

/// Uniform double in [0, 1) from the top 53 bits of counter_bits.
KOKKOS_INLINE_FUNCTION double counter_uniform(std::uint64_t seed, std::uint64_t stream,
                                              std::uint64_t index) {
  return static_cast<double>(counter_bits(seed, stream, index) >> 11) * 0x1.0p-53;
}

/// Host-side generator for shuffles and sampling (SplitMix64 sequence). Its sequence is
/// fixed by this header, unlike std::shuffle and std::uniform_int_distribution, whose
/// results differ between standard libraries.
class HostRng {
public:
  /// Starts the sequence at `seed`.
  explicit HostRng(std::uint64_t seed) : state_(seed) {}

  /// The next 64 random bits.
  std::uint64_t next() { return splitmix64(state_++); }

  /// Unbiased integer in [0, bound) (Lemire's multiply-and-reject), bound > 0.
  std::uint64_t uniform_index(std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t r = next();
      const unsigned __int128 m = static_cast<unsigned __int128>(r) * bound;
      if (static_cast<std::uint64_t>(m) >= threshold) {
        return static_cast<std::uint64_t>(m >> 64);
      }
    }
  }

  /// Fisher-Yates shuffle of [first, last).
  template <class RandomIt> void shuffle(RandomIt first, RandomIt last) {
    const auto n = static_cast<std::uint64_t>(last - first);
    for (std::uint64_t i = n; i > 1; --i) {
      const std::uint64_t j = uniform_index(i);
      using std::swap;
      swap(first[i - 1], first[j]);
    }
  }

private:
  std::uint64_t state_;
};

} // namespace kat
