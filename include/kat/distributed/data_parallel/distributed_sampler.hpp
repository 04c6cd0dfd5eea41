#pragma once
/// @file
/// @brief kat::distributed::DistributedSampler: one seeded permutation of a data set, shared by all
/// ranks, cut into disjoint equal shards, one per rank. Needs no MPI (it only takes the rank
/// and the rank count), so it also compiles without KAT_ENABLE_MPI.

#include "kat/core/error.hpp"
#include "kat/core/random.hpp"

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace kat::distributed {

/// Splits the samples of a data set of n samples among P ranks for data-parallel training.
///
/// Every epoch e has one permutation π of [0, n), the same on every rank: with shuffling,
/// the Fisher-Yates permutation drawn from `HostRng(seed ^ splitmix64(e))`, which is exactly
/// the order kat::data::DataLoader uses for (seed, e); without shuffling, the identity.
///
/// **Equal shards, tail dropped.** Each rank gets m = floor(n / P) samples. The last
/// n - P m entries of π (fewer than P) are left out of that epoch; they differ from epoch to
/// epoch, so with shuffling no sample is left out for good. (PyTorch's DistributedSampler
/// instead pads by repeating samples; dropping keeps every sample weighted once.) Rank r's
/// shard is the strided slice
///
///     shard_r[i] = π[r + P i],   i = 0, ..., m - 1,
///
/// so shards are disjoint and their union is π[0, P m). Strided rather than contiguous so
/// that the global batch k of a data-parallel step — the union over ranks of their local
/// batches k of b samples — is π[k P b, (k + 1) P b): the same samples as batch k of a single
/// process with batch size P b and the same seed.
///
/// **Equal batches.** Every rank has the same number of samples, so with the same local batch
/// size every rank runs the same number of batches (and of collectives) per epoch.
///
/// Use with kat::data::DataLoader through its start_epoch(epoch, order):
/// @code
///   kat::distributed::DistributedSampler sampler(train.size(), comm.rank(), comm.size(), seed);
///   kat::data::DataLoader<float> loader(train, local_batch, /*shuffle=*/false, seed);
///   for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
///     loader.start_epoch(epoch, sampler.indices(epoch));
///     while (loader.next(space, x, y)) { ... }
///   }
/// @endcode
/// (Every rank holds the whole data set; only the order differs.)
class DistributedSampler {
public:
  /// @param n        number of samples in the data set
  /// @param rank     this rank, 0 <= rank < size
  /// @param size     number of ranks P, > 0
  /// @param seed     the permutation seed; must be the same on every rank
  /// @param shuffle  false: π is the identity (rank r gets r, r + P, r + 2P, ...)
  /// @throws ValueError if size <= 0 or rank is outside [0, size).
  DistributedSampler(std::size_t n, int rank, int size, std::uint64_t seed, bool shuffle = true)
      : n_(n), rank_(rank), size_(size), seed_(seed), shuffle_(shuffle) {
    if (size <= 0) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::DistributedSampler: size must be > 0, got ", size));
    }
    if (rank < 0 || rank >= size) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::DistributedSampler: rank must be in [0, size = ", size, "), got ",
          rank));
    }
  }

  /// Samples in the data set, n.
  std::size_t dataset_size() const { return n_; }
  /// This rank, in [0, size()).
  int rank() const { return rank_; }
  /// P, the ranks sharing the data set.
  int size() const { return size_; }
  /// The shuffle's seed (the same on every rank).
  std::uint64_t seed() const { return seed_; }
  /// Whether each epoch's order is a shuffle.
  bool shuffle() const { return shuffle_; }

  /// Samples per rank and epoch, floor(n / P) (0 when n < P).
  std::size_t per_rank() const { return n_ / static_cast<std::size_t>(size_); }
  /// Samples left out of each epoch, n - P floor(n / P) < P.
  std::size_t dropped() const { return n_ - per_rank() * static_cast<std::size_t>(size_); }
  /// Batches per epoch on every rank for a local batch size `batch` (> 0): ceil(per_rank() /
  /// batch), or floor with drop_last (as kat::data::DataLoader counts them).
  /// @throws ValueError if batch == 0.
  std::size_t batches(std::size_t batch, bool drop_last = false) const {
    if (batch == 0) {
      throw ValueError("kat::distributed::DistributedSampler::batches: batch must be > 0, got 0");
    }
    return drop_last ? per_rank() / batch : (per_rank() + batch - 1) / batch;
  }

  /// The permutation π of epoch `epoch` shared by all ranks (length n).
  std::vector<std::size_t> permutation(std::size_t epoch) const {
    std::vector<std::size_t> order(n_);
    std::iota(order.begin(), order.end(), std::size_t(0));
    if (shuffle_) {
      kat::HostRng rng(seed_ ^ kat::splitmix64(static_cast<std::uint64_t>(epoch)));
      rng.shuffle(order.begin(), order.end());
    }
    return order;
  }

  /// This rank's shard of epoch `epoch`, in the order it is to be visited: π[rank + P i] for
  /// i < per_rank(). Pure function of (n, rank, P, seed, shuffle, epoch).
  std::vector<std::size_t> indices(std::size_t epoch) const { return shard(epoch, rank_); }

  /// Rank `r`'s shard of epoch `epoch` (what indices() returns on rank r).
  /// @throws ValueError if r is outside [0, size()).
  std::vector<std::size_t> shard(std::size_t epoch, int r) const {
    if (r < 0 || r >= size_) {
      throw ValueError(
          kat::detail::concat("kat::distributed::DistributedSampler::shard: r must be in "
                              "[0, size = ",
                              size_, "), got ", r));
    }
    const std::vector<std::size_t> order = permutation(epoch);
    const std::size_t m = per_rank();
    const auto p = static_cast<std::size_t>(size_);
    std::vector<std::size_t> out(m);
    for (std::size_t i = 0; i < m; ++i) {
      out[i] = order[static_cast<std::size_t>(r) + p * i];
    }
    return out;
  }

private:
  std::size_t n_;
  int rank_;
  int size_;
  std::uint64_t seed_;
  bool shuffle_;
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat
