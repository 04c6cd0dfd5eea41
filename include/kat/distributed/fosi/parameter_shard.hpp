#pragma once
/// @file
/// @brief kat::distributed::ParameterShard: one rank's contiguous, padded slice of a flat
/// parameter vector, as DHO2 shards its curvature (Gu et al., arXiv 2505.00982, Sec. 3).

#include "kat/core/error.hpp"

#include <algorithm>
#include <cstddef>

namespace kat::distributed {

/// Rank `rank` of `ranks` owns entries [offset, offset + size) of an n-vector. Every slice is
/// `padded` = ⌈n / ranks⌉ long with zeros past n, so slices gather into and scatter from a
/// ranks x padded buffer whose first n entries are the vector itself: rank r's slice starts
/// at r · padded, and only the last rank's may hold padding (size < padded).
struct ParameterShard {
  std::size_t n = 0;      ///< length of the whole vector
  int ranks = 1;          ///< number of slices
  int rank = 0;           ///< this slice, 0 <= rank < ranks
  std::size_t padded = 0; ///< ⌈n / ranks⌉, the length of every slice with its padding
  std::size_t offset = 0; ///< rank · padded, the first entry owned
  std::size_t size = 0;   ///< entries owned, min(padded, n - offset) >= 1
};

/// The slice of an n-vector that rank `rank` of `ranks` owns (see ParameterShard).
/// @throws ValueError naming the argument if ranks < 1, rank is outside [0, ranks), or n is
///   so small that the last rank would own nothing ((ranks - 1) ⌈n / ranks⌉ >= n; use fewer
///   ranks).
inline ParameterShard parameter_shard(std::size_t n, int rank, int ranks) {
  const char *who = "kat::distributed::parameter_shard";
  if (ranks < 1) {
    throw ValueError(kat::detail::concat(who, ": ranks must be >= 1, got ", ranks));
  }
  if (rank < 0 || rank >= ranks) {
    throw ValueError(kat::detail::concat(who, ": rank must be in [0, ", ranks, "), got ", rank));
  }
  const auto p = static_cast<std::size_t>(ranks);
  const std::size_t padded = (n + p - 1) / p;
  if (n == 0 || (p - 1) * padded >= n) {
    throw ValueError(kat::detail::concat(
        who, ": n = ", n, " entries in slices of ceil(n / ranks) = ", padded, " leave rank ",
        ranks - 1, " of ", ranks, " without entries; n must be > (ranks - 1) ceil(n / ranks)"));
  }
  ParameterShard s;
  s.n = n;
  s.ranks = ranks;
  s.rank = rank;
  s.padded = padded;
  s.offset = static_cast<std::size_t>(rank) * padded;
  s.size = std::min(padded, n - s.offset);
  return s;
}

} // namespace kat::distributed
