#pragma once
/// @file
/// @brief Internal: the kernels of kat::nn::BatchNorm (team sums, per-channel statistics,
/// normalization, backward and the R-operator), as named functors.

#include "kat/core/math.hpp"
#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace kat::nn {

namespace detail {

/// Team-wide sum of f(m) for m in [0, count). Each work item adds 8 values held in
/// independent partial sums, so a CPU core is bound by load throughput rather than by the
/// latency of one long chain of additions (3x faster on Serial than one term per item). Item
/// k takes m = k, k + chunks, ..., k + 7·chunks, so consecutive GPU threads read consecutive
/// addresses, plus one of the count mod 8 leftover terms. The order of additions is fixed
/// for a given backend and team size (no atomics).
template <class Accum, class Member, class F>
KOKKOS_INLINE_FUNCTION Accum batch_norm_team_sum(const Member &team, std::size_t count,
                                                 const F &f) {
  const std::size_t chunks = count / 8;
  const std::size_t tail = count - 8 * chunks;
  Accum total = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, chunks > tail ? chunks : tail),
      [&](const std::size_t k, Accum &s) {
        Accum p0 = 0, p1 = 0, p2 = 0, p3 = 0, p4 = 0, p5 = 0, p6 = 0, p7 = 0;
        if (k < chunks) {
          p0 = f(k);
          p1 = f(k + chunks);
          p2 = f(k + 2 * chunks);
          p3 = f(k + 3 * chunks);
          p4 = f(k + 4 * chunks);
          p5 = f(k + 5 * chunks);
          p6 = f(k + 6 * chunks);
          p7 = f(k + 7 * chunks);
        }
        if (k < tail) {
          p0 += f(8 * chunks + k);
        }
        s += ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7));
      },
      total);
  return total;
}

/// Element-wise passes run one team per block of this many values of one channel: enough
/// teams to fill a GPU even for few channels, and per-channel constants loaded once per team
/// rather than once per element (an MDRangePolicy over (M, C) was 1.8x slower on Serial,
/// since the compiler cannot hoist loads that may alias the output).
constexpr std::size_t batch_norm_block = 4096;

/// The channel and the value range [begin, end) of one of a channel's blocks of
/// batch_norm_block values, for team `league_rank` of C·blocks_per_channel teams over M values
/// per channel.
struct BatchNormBlock {
  std::size_t channel, begin, end;
};
KOKKOS_INLINE_FUNCTION BatchNormBlock batch_norm_block_of(std::size_t league_rank,
                                                          std::size_t blocks_per_channel,
                                                          std::size_t M) {
  const std::size_t begin = (league_rank % blocks_per_channel) * batch_norm_block;
  return {league_rank / blocks_per_channel, begin,
          M - begin < batch_norm_block ? M : begin + batch_norm_block};
}

/// The statistics and running averages of channel c from oneDNN's mean and biased variance.
template <class Scalar, class MemorySpace> struct BatchNormDnnStatistics {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  const Scalar *mean;
  const Scalar *variance;
  Matrix<Scalar, MemorySpace> stats;
  accum_type eps;
  std::size_t M;
  Vector<Scalar, MemorySpace> running_mean;
  Vector<Scalar, MemorySpace> running_var;
  accum_type momentum;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    const accum_type mu = static_cast<accum_type>(mean[c]);
    const accum_type var = static_cast<accum_type>(variance[c]);
    stats(c, 0) = mean[c];
    stats(c, 1) = static_cast<Scalar>(accum_type(1) / math::sqrt(var + eps));
    const accum_type unbiased = var * static_cast<accum_type>(M) / static_cast<accum_type>(M - 1);
    running_mean(c) = static_cast<Scalar>(
        (accum_type(1) - momentum) * static_cast<accum_type>(running_mean(c)) + momentum * mu);
    running_var(c) = static_cast<Scalar>(
        (accum_type(1) - momentum) * static_cast<accum_type>(running_var(c)) + momentum * unbiased);
  }
};

/// Teams per channel of the statistics and backward sums: a channel's M values split into
/// segments of batch_norm_block values, each reduced by one team (two passes over 16 to 32 KB,
/// from cache) and combined in a fixed order by a second kernel, so that few channels still
/// fill a GPU: a team per channel gave a ResNet-14's 16 to 64 channels 16 to 64 teams on 132
/// multiprocessors, and the backward sums alone took 20 % of its step on an H200
/// (docs/benchmarks.md). The same segments on every backend, so hosts test the combination.
inline std::size_t batch_norm_segments(std::size_t M) {
  return M == 0 ? 1 : (M + batch_norm_block - 1) / batch_norm_block;
}

/// Segment `s` of a channel's M values: [begin, end).
struct BatchNormSegment {
  std::size_t begin, end;
};
KOKKOS_INLINE_FUNCTION BatchNormSegment batch_norm_segment(std::size_t s, std::size_t M) {
  const std::size_t begin = s * batch_norm_block;
  return {begin, M - begin < batch_norm_block ? M : begin + batch_norm_block};
}

/// What team `row` = c·segments + s of a segment kernel reduces: channel c's values
/// [c·M + begin, c·M + begin + count), whose two sums go to row `row` of the partials.
struct BatchNormSegmentTeam {
  std::size_t row, channel, offset, count;
};
KOKKOS_INLINE_FUNCTION BatchNormSegmentTeam batch_norm_segment_team(std::size_t row,
                                                                    std::size_t segments,
                                                                    std::size_t M) {
  const std::size_t c = row / segments;
  const BatchNormSegment seg = batch_norm_segment(row % segments, M);
  return {row, c, M * c + seg.begin, seg.end - seg.begin};
}

/// Stores a segment team's two sums in its row of `partials`, once per team.
template <class Member, class Partials, class Accum>
KOKKOS_INLINE_FUNCTION void batch_norm_store_partials(const Member &team, const Partials &partials,
                                                      std::size_t row, Accum first, Accum second) {
  Kokkos::single(Kokkos::PerTeam(team), [&]() {
    partials(row, 0) = first;
    partials(row, 1) = second;
  });
}

/// A training forward's per-segment moments: for team c·segments + s, the sum of channel c's
/// values in segment s and the sum of their squared deviations from the segment's mean
/// (two passes, no cancellation), into partials(team, 0) and partials(team, 1).
template <class Scalar, class MemorySpace> struct BatchNormSegmentMoments {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  using member_type =
      typename Kokkos::TeamPolicy<typename MemorySpace::execution_space>::member_type;
  const Scalar *xp;
  std::size_t M;
  std::size_t segments;
  Matrix<accum_type, MemorySpace> partials;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type &team) const {
    const auto t =
        batch_norm_segment_team(static_cast<std::size_t>(team.league_rank()), segments, M);
    const Scalar *xs = xp + t.offset;
    const accum_type sum = batch_norm_team_sum<accum_type>(
        team, t.count, [&](const std::size_t m) { return static_cast<accum_type>(xs[m]); });
    const accum_type mean = sum / static_cast<accum_type>(t.count);
    const accum_type m2 = batch_norm_team_sum<accum_type>(team, t.count, [&](const std::size_t m) {
      const accum_type d = static_cast<accum_type>(xs[m]) - mean;
      return d * d;
    });
    batch_norm_store_partials(team, partials, t.row, sum, m2);
  }
};

/// A training forward's mean and 1/σ of channel c from its segments' moments (Chan, Golub &
/// LeVeque's pairwise update: M2 = Σ M2_s + Σ n_s (mean_s − mean)², in segment order), and
/// its running averages.
template <class Scalar, class MemorySpace> struct BatchNormForwardStatistics {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  Matrix<accum_type, MemorySpace> partials;
  std::size_t segments;
  std::size_t M;
  Matrix<Scalar, MemorySpace> stats;
  accum_type eps;
  Vector<Scalar, MemorySpace> running_mean;
  Vector<Scalar, MemorySpace> running_var;
  accum_type momentum;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    accum_type sum = 0;
    for (std::size_t s = 0; s < segments; ++s) {
      sum += partials(c * segments + s, 0);
    }
    const accum_type mean = sum / static_cast<accum_type>(M);
    accum_type m2 = 0;
    for (std::size_t s = 0; s < segments; ++s) {
      const auto seg = batch_norm_segment(s, M);
      const accum_type n = static_cast<accum_type>(seg.end - seg.begin);
      const accum_type d = partials(c * segments + s, 0) / n - mean;
      m2 += partials(c * segments + s, 1) + n * d * d;
    }
    const accum_type var = m2 / static_cast<accum_type>(M);
    stats(c, 0) = static_cast<Scalar>(mean);
    stats(c, 1) = static_cast<Scalar>(accum_type(1) / math::sqrt(var + eps));
    const accum_type unbiased = var * static_cast<accum_type>(M) / static_cast<accum_type>(M - 1);
    running_mean(c) = static_cast<Scalar>(
        (accum_type(1) - momentum) * static_cast<accum_type>(running_mean(c)) + momentum * mean);
    running_var(c) = static_cast<Scalar>(
        (accum_type(1) - momentum) * static_cast<accum_type>(running_var(c)) + momentum * unbiased);
  }
};

/// An evaluation forward's mean and 1/σ of channel c, from the running statistics.
template <class Scalar, class MemorySpace> struct BatchNormRunningStatistics {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  Matrix<Scalar, MemorySpace> stats;
  Vector<Scalar, MemorySpace> running_mean;
  Vector<Scalar, MemorySpace> running_var;
  accum_type eps;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    stats(c, 0) = running_mean(c);
    stats(c, 1) = static_cast<Scalar>(accum_type(1) /
                                      math::sqrt(static_cast<accum_type>(running_var(c)) + eps));
  }
};

/// y = γ x̂ + β (then the fused ReLU, if any) on the team's block of a channel.
template <class Scalar, class MemorySpace> struct BatchNormForwardNormalize {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  using member_type =
      typename Kokkos::TeamPolicy<typename MemorySpace::execution_space>::member_type;
  std::size_t blocks;
  std::size_t M;
  Matrix<Scalar, MemorySpace> stats;
  bool affine;
  Vector<Scalar, MemorySpace> gamma;
  Vector<Scalar, MemorySpace> beta;
  const Scalar *xp;
  Scalar *yp;
  bool relu;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type &team) const {
    const auto range = batch_norm_block_of(static_cast<std::size_t>(team.league_rank()), blocks, M);
    const std::size_t c = range.channel, begin = range.begin, end = range.end;
    const Scalar mean = stats(c, 0);
    const Scalar scale = affine ? gamma(c) * stats(c, 1) : stats(c, 1);
    const Scalar shift = affine ? beta(c) : Scalar(0);
    const Scalar *xc = xp + M * c;
    Scalar *yc = yp + M * c;
    // (x − μ)·(γ·inv_std) + β rather than x·a + b: no cancellation when |μ| ≫ σ.
    if (relu) { // the fused ReLU (see Layer::can_fuse_relu)
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](const std::size_t m) {
        const Scalar v = (xc[m] - mean) * scale + shift;
        yc[m] = v > Scalar(0) ? v : Scalar(0);
      });
    } else {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end),
                           [&](const std::size_t m) { yc[m] = (xc[m] - mean) * scale + shift; });
    }
  }
};

/// dγ and dβ of channel c from oneDNN's diff_scale_shift.
template <class Scalar, class MemorySpace> struct BatchNormDnnParameterGradients {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  Vector<Scalar, MemorySpace> grad_gamma;
  Vector<Scalar, MemorySpace> grad_beta;
  bool accumulate;
  const Scalar *ds;
  std::size_t C;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    grad_gamma(c) = accumulate ? grad_gamma(c) + ds[c] : ds[c];
    grad_beta(c) = accumulate ? grad_beta(c) + ds[C + c] : ds[C + c];
  }
};

/// The backward sums of segment s of channel c for team c·segments + s: Σ dy and
/// Σ dy·(x − μ) into partials(team, 0) and partials(team, 1).
template <class Scalar, class MemorySpace> struct BatchNormSegmentBackwardSums {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  using member_type =
      typename Kokkos::TeamPolicy<typename MemorySpace::execution_space>::member_type;
  const Scalar *xp;
  const Scalar *dyp;
  std::size_t M;
  std::size_t segments;
  Matrix<Scalar, MemorySpace> stats;
  Matrix<accum_type, MemorySpace> partials;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type &team) const {
    const auto t =
        batch_norm_segment_team(static_cast<std::size_t>(team.league_rank()), segments, M);
    const Scalar *xs = xp + t.offset;
    const Scalar *dys = dyp + t.offset;
    const accum_type mean = static_cast<accum_type>(stats(t.channel, 0));
    const accum_type dbeta = batch_norm_team_sum<accum_type>(
        team, t.count, [&](const std::size_t m) { return static_cast<accum_type>(dys[m]); });
    const accum_type dxmu =
        batch_norm_team_sum<accum_type>(team, t.count, [&](const std::size_t m) {
          return static_cast<accum_type>(dys[m]) * (static_cast<accum_type>(xs[m]) - mean);
        });
    batch_norm_store_partials(team, partials, t.row, dbeta, dxmu);
  }
};

/// Channel c's dγ = inv_std Σ dy·(x − μ) and dβ = Σ dy from its segments' sums (in segment
/// order; zero without need_sums), and the coefficients of dx.
template <class Scalar, class MemorySpace> struct BatchNormBackwardSums {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  Matrix<accum_type, MemorySpace> partials;
  std::size_t segments;
  std::size_t M;
  Matrix<Scalar, MemorySpace> stats;
  bool need_sums;
  bool affine;
  Vector<Scalar, MemorySpace> grad_gamma;
  Vector<Scalar, MemorySpace> grad_beta;
  bool accumulate;
  Matrix<Scalar, MemorySpace> coef;
  Vector<Scalar, MemorySpace> gamma;
  bool training;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    const Scalar inv_std = stats(c, 1);
    accum_type dbeta = 0;
    accum_type dxmu = 0;
    if (need_sums) {
      for (std::size_t s = 0; s < segments; ++s) {
        dbeta += partials(c * segments + s, 0);
        dxmu += partials(c * segments + s, 1);
      }
    }
    // Σ dy·x̂ = inv_std · Σ dy·(x − μ)
    const accum_type dgamma = static_cast<accum_type>(inv_std) * dxmu;
    if (affine) {
      grad_gamma(c) = static_cast<Scalar>(
          accumulate ? static_cast<accum_type>(grad_gamma(c)) + dgamma : dgamma);
      grad_beta(c) =
          static_cast<Scalar>(accumulate ? static_cast<accum_type>(grad_beta(c)) + dbeta : dbeta);
    }
    const accum_type inv_m = accum_type(1) / static_cast<accum_type>(M);
    coef(c, 0) = affine ? gamma(c) * inv_std : inv_std;
    coef(c, 1) = training ? static_cast<Scalar>(dbeta * inv_m) : Scalar(0);
    coef(c, 2) = training ? static_cast<Scalar>(static_cast<accum_type>(inv_std) * dgamma * inv_m)
                          : Scalar(0);
  }
};

/// dx on the team's block of a channel, from the coefficients of BatchNormBackwardSums.
template <class Scalar, class MemorySpace> struct BatchNormBackwardInput {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  using member_type =
      typename Kokkos::TeamPolicy<typename MemorySpace::execution_space>::member_type;
  std::size_t blocks;
  std::size_t M;
  Matrix<Scalar, MemorySpace> stats;
  Matrix<Scalar, MemorySpace> coef;
  const Scalar *xp;
  const Scalar *dyp;
  Scalar *dxp;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type &team) const {
    const auto range = batch_norm_block_of(static_cast<std::size_t>(team.league_rank()), blocks, M);
    const std::size_t c = range.channel, begin = range.begin, end = range.end;
    const Scalar mean = stats(c, 0);
    const Scalar a = coef(c, 0);
    const Scalar b = coef(c, 1);
    const Scalar k = coef(c, 2);
    const Scalar *xc = xp + M * c;
    const Scalar *dyc = dyp + M * c;
    Scalar *dxc = dxp + M * c;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](const std::size_t m) {
      dxc[m] = a * (dyc[m] - b - (xc[m] - mean) * k);
    });
  }
};

/// R{y} on the team's block of a channel (evaluation mode).
template <class Scalar, class MemorySpace> struct BatchNormForwardR {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  using member_type =
      typename Kokkos::TeamPolicy<typename MemorySpace::execution_space>::member_type;
  std::size_t blocks;
  std::size_t M;
  Matrix<Scalar, MemorySpace> stats;
  bool affine;
  Vector<Scalar, MemorySpace> gamma;
  Vector<Scalar, MemorySpace> v_gamma;
  Vector<Scalar, MemorySpace> v_beta;
  const Scalar *xp;
  bool has_rx;
  const Scalar *rxp;
  Scalar *ryp;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type &team) const {
    const auto range = batch_norm_block_of(static_cast<std::size_t>(team.league_rank()), blocks, M);
    const std::size_t c = range.channel, begin = range.begin, end = range.end;
    const Scalar mean = stats(c, 0);
    const Scalar inv_std = stats(c, 1);
    const Scalar scale = affine ? gamma(c) * inv_std : inv_std;
    const Scalar v_scale = affine ? v_gamma(c) * inv_std : Scalar(0);
    const Scalar shift = affine ? v_beta(c) : Scalar(0);
    const Scalar *xc = xp + M * c;
    Scalar *ryc = ryp + M * c;
    if (has_rx) {
      const Scalar *rxc = rxp + M * c;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](const std::size_t m) {
        ryc[m] = rxc[m] * scale + (xc[m] - mean) * v_scale + shift;
      });
    } else {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end),
                           [&](const std::size_t m) { ryc[m] = (xc[m] - mean) * v_scale + shift; });
    }
  }
};

/// R{dγ} and R{dβ} of the team's channel, added to the product buffer.
template <class Scalar, class MemorySpace> struct BatchNormBackwardRSums {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  using member_type =
      typename Kokkos::TeamPolicy<typename MemorySpace::execution_space>::member_type;
  const Scalar *xp;
  const Scalar *dyp;
  const Scalar *rdyp;
  std::size_t M;
  Matrix<Scalar, MemorySpace> stats;
  bool has_rx;
  const Scalar *rxp;
  Vector<Scalar, MemorySpace> hv_gamma;
  Vector<Scalar, MemorySpace> hv_beta;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type &team) const {
    const std::size_t c = static_cast<std::size_t>(team.league_rank());
    const Scalar *xc = xp + M * c;
    const Scalar *dyc = dyp + M * c;
    const Scalar *rdyc = rdyp + M * c;
    const accum_type mean = static_cast<accum_type>(stats(c, 0));
    const accum_type inv_std = static_cast<accum_type>(stats(c, 1));
    const accum_type rdbeta = batch_norm_team_sum<accum_type>(
        team, M, [&](const std::size_t m) { return static_cast<accum_type>(rdyc[m]); });
    // R{dγ} = inv_std · Σ (R{dy}·(x − μ) + dy·R{x})
    accum_type rdgamma = batch_norm_team_sum<accum_type>(team, M, [&](const std::size_t m) {
      return static_cast<accum_type>(rdyc[m]) * (static_cast<accum_type>(xc[m]) - mean);
    });
    if (has_rx) {
      const Scalar *rxc = rxp + M * c;
      rdgamma += batch_norm_team_sum<accum_type>(team, M, [&](const std::size_t m) {
        return static_cast<accum_type>(dyc[m]) * static_cast<accum_type>(rxc[m]);
      });
    }
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      hv_gamma(c) = static_cast<Scalar>(static_cast<accum_type>(hv_gamma(c)) + inv_std * rdgamma);
      hv_beta(c) = static_cast<Scalar>(static_cast<accum_type>(hv_beta(c)) + rdbeta);
    });
  }
};

/// R{dx} on the team's block of a channel (evaluation mode).
template <class Scalar, class MemorySpace> struct BatchNormBackwardRInput {
  using accum_type = std::common_type_t<Scalar, double>; ///< as BatchNorm::accum_type
  using member_type =
      typename Kokkos::TeamPolicy<typename MemorySpace::execution_space>::member_type;
  std::size_t blocks;
  std::size_t M;
  Matrix<Scalar, MemorySpace> stats;
  bool affine;
  Vector<Scalar, MemorySpace> gamma;
  Vector<Scalar, MemorySpace> v_gamma;
  const Scalar *dyp;
  const Scalar *rdyp;
  Scalar *rdxp;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type &team) const {
    const auto range = batch_norm_block_of(static_cast<std::size_t>(team.league_rank()), blocks, M);
    const std::size_t c = range.channel, begin = range.begin, end = range.end;
    const Scalar inv_std = stats(c, 1);
    const Scalar a = affine ? gamma(c) * inv_std : inv_std;
    const Scalar b = affine ? v_gamma(c) * inv_std : Scalar(0);
    const Scalar *dyc = dyp + M * c;
    const Scalar *rdyc = rdyp + M * c;
    Scalar *rdxc = rdxp + M * c;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end),
                         [&](const std::size_t m) { rdxc[m] = a * rdyc[m] + b * dyc[m]; });
  }
};

} // namespace detail

} // namespace kat::nn
