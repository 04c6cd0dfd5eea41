#pragma once
/// @file
/// @brief Internal: the kernels of kat::nn::LayerNorm (row statistics, normalization, the input
/// and parameter gradients and the R-operator), as named functors and their launchers.

#include "kat/core/detail/unrolled_sum.hpp"
#include "kat/core/host_isa.hpp"
#include "kat/core/math.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace kat::nn {

namespace detail {

/// What the layer-norm kernels share: the (N·P) x C column-major view of x (row r at
/// x[r + rows·c]), the affine parameters (null without them), and each row's mean and 1/σ
/// from the forward. Raw pointers, so a kernel captures it by value.
template <class Scalar> struct LayerNormRows {
  const Scalar *x = nullptr;
  std::size_t rows = 0, features = 0;
  const Scalar *gamma = nullptr;
  const Scalar *beta = nullptr;
  Scalar *mean = nullptr;
  Scalar *inv_std = nullptr;

  KOKKOS_INLINE_FUNCTION std::size_t at(std::size_t r, std::size_t c) const { return r + rows * c; }
  KOKKOS_INLINE_FUNCTION Scalar scale(std::size_t c) const {
    return gamma != nullptr ? gamma[c] : Scalar(1);
  }
  /// x̂ = (x − μ)/σ from the stored statistics.
  KOKKOS_INLINE_FUNCTION Scalar xhat(std::size_t r, std::size_t c) const {
    return (x[at(r, c)] - mean[r]) * inv_std[r];
  }
};

/// What the R-operator adds: R{x} (null for R{x} = 0), the direction's blocks v_γ, v_β (null
/// without affine), and per row mean(R{x}) and a = mean(x̂ ⊙ R{x}) from forward_r, with which
/// R{x̂} = (1/σ)(R{x} − mean(R{x}) − x̂ a).
template <class Scalar> struct LayerNormDirection {
  const Scalar *rx = nullptr;
  const Scalar *v_gamma = nullptr;
  const Scalar *v_beta = nullptr;
  Scalar *rx_mean = nullptr;
  Scalar *rx_dot = nullptr;

  KOKKOS_INLINE_FUNCTION Scalar rxhat(const LayerNormRows<Scalar> &d, std::size_t r, std::size_t c,
                                      Scalar xh) const {
    return rx != nullptr ? d.inv_std[r] * (rx[d.at(r, c)] - rx_mean[r] - xh * rx_dot[r])
                         : Scalar(0);
  }
};

/// Rows per work item of the blocked row kernels: a block of 32 on a host, where the loops then
/// run over the features outside and the block's rows inside, on contiguous memory; 1 on a
/// GPU, which runs these kernels for the R-operator only (a thread per row, consecutive threads
/// reading consecutive addresses; forward and dx run a team per row there). One row per item on a
/// host reads each feature 4·N·P bytes after the previous one (8 KB for N·P = 2048), a cache
/// and TLB miss each time: blocks of 32 were about ten times faster (docs/benchmarks.md,
/// "Kernel design choices, measured").
template <class ExecSpace> constexpr std::size_t layer_norm_block() {
  return Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible ? 32 : 1;
}

/// The first row r0 and the row count nb of work item `item` of blocks of B rows.
struct LayerNormBlock {
  std::size_t r0, nb;
};
template <std::size_t B>
KOKKOS_INLINE_FUNCTION LayerNormBlock layer_norm_block_of(std::size_t item, std::size_t rows) {
  const std::size_t r0 = item * B;
  return {r0, rows - r0 < B ? rows - r0 : B};
}

/// Calls kernel.block(r0, count) for work item `item` of blocks of B rows: count is
/// std::integral_constant<std::size_t, B> for a full block, so that its loops over the block's
/// rows have a compile-time trip count, else the remaining row count. The forward takes it
/// (faster); dx does not (its four row arrays at a compile-time count ran twice as slowly:
/// docs/benchmarks.md, "Kernel design choices, measured").
template <std::size_t B, class Kernel>
KOKKOS_INLINE_FUNCTION void layer_norm_run_block(std::size_t item, std::size_t rows,
                                                 const Kernel &kernel) {
  const LayerNormBlock k = layer_norm_block_of<B>(item, rows);
  if (k.nb == B) {
    kernel.block(k.r0, std::integral_constant<std::size_t, B>());
  } else {
    kernel.block(k.r0, k.nb);
  }
}

/// Runs Kernel<Accum, Scalar, B>{d, args...} on each block of B = layer_norm_block() rows.
template <template <class, class, std::size_t> class Kernel, class Accum, class ExecSpace,
          class Scalar, class... Args>
void layer_norm_launch_blocks(const char *label, const ExecSpace &space,
                              const LayerNormRows<Scalar> &d, const Args &...args) {
  constexpr std::size_t B = layer_norm_block<ExecSpace>();
  kat::detail::host_parallel_for(label, space, (d.rows + B - 1) / B,
                                 Kernel<Accum, Scalar, B>{d, args...});
}

/// Runs Kernel<Accum, ExecSpace, Scalar>{d, args...} with `league` teams of `team_size`.
template <template <class, class, class> class Kernel, class Accum, class ExecSpace, class Scalar,
          class TeamSize, class... Args>
void layer_norm_launch_teams(const char *label, const ExecSpace &space, std::size_t league,
                             TeamSize team_size, const LayerNormRows<Scalar> &d,
                             const Args &...args) {
  Kokkos::parallel_for(label, Kokkos::TeamPolicy<ExecSpace>(space, league, team_size),
                       Kernel<Accum, ExecSpace, Scalar>{d, args...});
}

/// The row statistics and y of layer_norm_forward_blocks, for the block of rows `item`.
template <class Accum, class Scalar, std::size_t B> struct LayerNormForwardBlocks {
  LayerNormRows<Scalar> d;
  Accum e;
  Scalar *y;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t item) const {
    layer_norm_run_block<B>(item, d.rows, *this);
  }

  /// The block's nb rows from r0: a compile-time count for a full block.
  template <class Count>
  KOKKOS_INLINE_FUNCTION void block(const std::size_t r0, const Count nb) const {
    const std::size_t R = d.rows, C = d.features;
    Accum mu[B], sq[B];
    for (std::size_t b = 0; b < B; ++b) {
      mu[b] = 0;
      sq[b] = 0;
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar *xc = d.x + r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        mu[b] += static_cast<Accum>(xc[b]);
      }
    }
    for (std::size_t b = 0; b < nb; ++b) {
      mu[b] /= static_cast<Accum>(C);
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar *xc = d.x + r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        const Accum dev = static_cast<Accum>(xc[b]) - mu[b];
        sq[b] += dev * dev;
      }
    }
    Scalar m[B], is[B];
    for (std::size_t b = 0; b < nb; ++b) {
      m[b] = static_cast<Scalar>(mu[b]);
      is[b] = static_cast<Scalar>(Accum(1) / math::sqrt(sq[b] / static_cast<Accum>(C) + e));
      d.mean[r0 + b] = m[b];
      d.inv_std[r0 + b] = is[b];
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar gc = d.scale(c), bc = d.beta != nullptr ? d.beta[c] : Scalar(0);
      const Scalar *xc = d.x + r0 + R * c;
      Scalar *yc = y + r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        yc[b] = gc * ((xc[b] - m[b]) * is[b]) + bc;
      }
    }
  }
};

/// Per row: μ, σ² (biased, in a second pass around μ), 1/σ = 1/sqrt(σ² + eps), stored, and
/// y = γ ⊙ x̂ + β, for blocks of layer_norm_block() rows.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_forward_blocks(const ExecSpace &space, const LayerNormRows<Scalar> &d, double eps,
                               Scalar *y) {
  layer_norm_launch_blocks<LayerNormForwardBlocks, Accum>("kat::nn::LayerNorm::forward", space, d,
                                                          static_cast<Accum>(eps), y);
}

/// dx of layer_norm_backward_input_blocks, for the block of rows `item`.
template <class Accum, class Scalar, std::size_t B> struct LayerNormBackwardInputBlocks {
  LayerNormRows<Scalar> d;
  const Scalar *dy;
  Scalar *dx;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t item) const {
    const LayerNormBlock k = layer_norm_block_of<B>(item, d.rows);
    const std::size_t R = d.rows, C = d.features, nb = k.nb;
    Scalar m[B], is[B];
    Accum sg[B], sgx[B];
    for (std::size_t b = 0; b < B; ++b) {
      m[b] = b < nb ? d.mean[k.r0 + b] : Scalar(0);
      is[b] = b < nb ? d.inv_std[k.r0 + b] : Scalar(0);
      sg[b] = 0;
      sgx[b] = 0;
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar gc = d.scale(c);
      const Scalar *xc = d.x + k.r0 + R * c;
      const Scalar *dyc = dy + k.r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        const Scalar g = gc * dyc[b];
        sg[b] += static_cast<Accum>(g);
        sgx[b] += static_cast<Accum>(g * ((xc[b] - m[b]) * is[b]));
      }
    }
    Scalar mg[B], mgx[B];
    for (std::size_t b = 0; b < nb; ++b) {
      mg[b] = static_cast<Scalar>(sg[b] / static_cast<Accum>(C));
      mgx[b] = static_cast<Scalar>(sgx[b] / static_cast<Accum>(C));
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar gc = d.scale(c);
      const Scalar *xc = d.x + k.r0 + R * c;
      const Scalar *dyc = dy + k.r0 + R * c;
      Scalar *dxc = dx + k.r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        const Scalar xh = (xc[b] - m[b]) * is[b];
        dxc[b] = is[b] * (gc * dyc[b] - mg[b] - xh * mgx[b]);
      }
    }
  }
};

/// dx = (1/σ)(g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)) with g = dx̂ = γ ⊙ dy, per row, in blocks of
/// layer_norm_block() rows.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_input_blocks(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                      const Scalar *dy, Scalar *dx) {
  layer_norm_launch_blocks<LayerNormBackwardInputBlocks, Accum>(
      "kat::nn::LayerNorm::backward_input", space, d, dy, dx);
}

/// Threads per team of the team-per-row kernels: on a GPU a multiple of a warp (and of a HIP
/// wavefront), at least C up to 256, so every thread has a feature or a few; 1 on a host
/// (where only the tests run these kernels, to check them against the blocked ones).
template <class ExecSpace> int layer_norm_team_size(std::size_t features) {
  if (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    return 1;
  }
  return features <= 64 ? 64 : features <= 128 ? 128 : 256;
}

/// The row statistics and y of layer_norm_forward_teams, for the row of the team.
template <class Accum, class ExecSpace, class Scalar> struct LayerNormForwardTeams {
  LayerNormRows<Scalar> d;
  Accum e;
  Scalar *y;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const std::size_t r = team.league_rank();
    const std::size_t C = d.features;
    Accum sum = 0, sq = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, C),
        [&](const std::size_t c, Accum &s) { s += static_cast<Accum>(d.x[d.at(r, c)]); }, sum);
    const Accum mu = sum / static_cast<Accum>(C);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, C),
        [&](const std::size_t c, Accum &s) {
          const Accum dev = static_cast<Accum>(d.x[d.at(r, c)]) - mu;
          s += dev * dev;
        },
        sq);
    const Scalar m = static_cast<Scalar>(mu);
    const Scalar is = static_cast<Scalar>(Accum(1) / math::sqrt(sq / static_cast<Accum>(C) + e));
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      d.mean[r] = m;
      d.inv_std[r] = is;
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const std::size_t c) {
      const Scalar bc = d.beta != nullptr ? d.beta[c] : Scalar(0);
      y[d.at(r, c)] = d.scale(c) * ((d.x[d.at(r, c)] - m) * is) + bc;
    });
  }
};

/// The forward of layer_norm_forward_blocks with a team per row, for GPUs: one thread per row
/// leaves a GPU nearly idle at transformer sizes (N·P = 2048 rows are 2048 threads), while a
/// team spreads a row's C features over its threads, and the 32-byte sectors of x serve the
/// teams of 8 neighbouring rows through the cache: 1.4 to 5 times faster on an H100
/// (docs/benchmarks.md, "Kernel design choices, measured").
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_forward_teams(const ExecSpace &space, const LayerNormRows<Scalar> &d, double eps,
                              Scalar *y) {
  layer_norm_launch_teams<LayerNormForwardTeams, Accum>(
      "kat::nn::LayerNorm::forward", space, d.rows, layer_norm_team_size<ExecSpace>(d.features), d,
      static_cast<Accum>(eps), y);
}

/// dx of layer_norm_backward_input_teams, for the row of the team.
template <class Accum, class ExecSpace, class Scalar> struct LayerNormBackwardInputTeams {
  LayerNormRows<Scalar> d;
  const Scalar *dy;
  Scalar *dx;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const std::size_t r = team.league_rank();
    const std::size_t C = d.features;
    Accum sg = 0, sgx = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, C),
        [&](const std::size_t c, Accum &s) {
          s += static_cast<Accum>(d.scale(c) * dy[d.at(r, c)]);
        },
        sg);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, C),
        [&](const std::size_t c, Accum &s) {
          s += static_cast<Accum>(d.scale(c) * dy[d.at(r, c)] * d.xhat(r, c));
        },
        sgx);
    const Scalar mg = static_cast<Scalar>(sg / static_cast<Accum>(C));
    const Scalar mgx = static_cast<Scalar>(sgx / static_cast<Accum>(C));
    const Scalar is = d.inv_std[r];
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const std::size_t c) {
      dx[d.at(r, c)] = is * (d.scale(c) * dy[d.at(r, c)] - mg - d.xhat(r, c) * mgx);
    });
  }
};

/// The input gradient of layer_norm_backward_input_blocks with a team per row, for GPUs.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_input_teams(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                     const Scalar *dy, Scalar *dx) {
  layer_norm_launch_teams<LayerNormBackwardInputTeams, Accum>(
      "kat::nn::LayerNorm::backward_input", space, d.rows,
      layer_norm_team_size<ExecSpace>(d.features), d, dy, dx);
}

/// y = LayerNorm(x) and the row statistics: blocks of rows on a host, a team per row on a GPU.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_forward(const ExecSpace &space, const LayerNormRows<Scalar> &d, double eps,
                        Scalar *y) {
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    layer_norm_forward_blocks<Accum>(space, d, eps, y);
  } else {
    layer_norm_forward_teams<Accum>(space, d, eps, y);
  }
}

/// dx of LayerNorm: blocks of rows on a host, a team per row on a GPU.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_input(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                               const Scalar *dy, Scalar *dx) {
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    layer_norm_backward_input_blocks<Accum>(space, d, dy, dx);
  } else {
    layer_norm_backward_input_teams<Accum>(space, d, dy, dx);
  }
}

/// dγ and dβ of layer_norm_backward_parameters, for the feature of the team.
template <class Accum, class ExecSpace, class Scalar> struct LayerNormBackwardParameters {
  LayerNormRows<Scalar> d;
  const Scalar *dy;
  Scalar *dgamma;
  Scalar *dbeta;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const std::size_t c = team.league_rank();
    Accum sg = 0, sb = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, d.rows),
        [&](const std::size_t r, Accum &s) {
          s += static_cast<Accum>(dy[d.at(r, c)] * d.xhat(r, c));
        },
        sg);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, d.rows),
        [&](const std::size_t r, Accum &s) { s += static_cast<Accum>(dy[d.at(r, c)]); }, sb);
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      dgamma[c] = static_cast<Scalar>(accumulate ? dgamma[c] + sg : sg);
      dbeta[c] = static_cast<Scalar>(accumulate ? dbeta[c] + sb : sb);
    });
  }
};

/// dγ and dβ of layer_norm_backward_parameters on a host, for feature c, each in
/// kat::detail::unrolled_sum's partial sums (the second pass reads the feature's dy again, from
/// cache).
template <class Accum, class Scalar> struct LayerNormBackwardParametersHost {
  LayerNormRows<Scalar> d;
  const Scalar *dy;
  Scalar *dgamma;
  Scalar *dbeta;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    const Scalar *dyc = dy + d.at(0, c);
    const Accum sg = kat::detail::unrolled_sum<Accum>(
        d.rows, [&](std::size_t r) { return static_cast<Accum>(dyc[r] * d.xhat(r, c)); });
    const Accum sb = kat::detail::unrolled_sum<Accum>(
        d.rows, [&](std::size_t r) { return static_cast<Accum>(dyc[r]); });
    dgamma[c] = static_cast<Scalar>(accumulate ? dgamma[c] + sg : sg);
    dbeta[c] = static_cast<Scalar>(accumulate ? dbeta[c] + sb : sb);
  }
};

/// dγ (+)= Σ_r dy ⊙ x̂ and dβ (+)= Σ_r dy over all rows (the rows of a feature are
/// contiguous), as Dense's bias gradient: a thread per feature on a host
/// (LayerNormBackwardParametersHost), a team per feature on a GPU.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_parameters(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                    const Scalar *dy, Scalar *dgamma, Scalar *dbeta,
                                    bool accumulate) {
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    Kokkos::parallel_for(
        "kat::nn::LayerNorm::backward_parameters",
        Kokkos::RangePolicy<ExecSpace>(space, 0, d.features),
        LayerNormBackwardParametersHost<Accum, Scalar>{d, dy, dgamma, dbeta, accumulate});
    return;
  }
  layer_norm_launch_teams<LayerNormBackwardParameters, Accum>(
      "kat::nn::LayerNorm::backward_parameters", space, d.features, Kokkos::AUTO, d, dy, dgamma,
      dbeta, accumulate);
}

/// R{y} and the row sums of layer_norm_forward_r, for the block of rows `item`.
template <class Accum, class Scalar, std::size_t B> struct LayerNormForwardR {
  LayerNormRows<Scalar> d;
  LayerNormDirection<Scalar> v;
  Scalar *ry;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t item) const {
    const LayerNormBlock k = layer_norm_block_of<B>(item, d.rows);
    const std::size_t R = d.rows, C = d.features, nb = k.nb;
    const bool has_rx = v.rx != nullptr;
    Scalar m[B], is[B], rm[B], a[B];
    Accum s[B], sx[B];
    for (std::size_t b = 0; b < B; ++b) {
      m[b] = b < nb ? d.mean[k.r0 + b] : Scalar(0);
      is[b] = b < nb ? d.inv_std[k.r0 + b] : Scalar(0);
      s[b] = 0;
      sx[b] = 0;
    }
    if (has_rx) {
      for (std::size_t c = 0; c < C; ++c) {
        const Scalar *xc = d.x + k.r0 + R * c;
        const Scalar *rxc = v.rx + k.r0 + R * c;
        for (std::size_t b = 0; b < nb; ++b) {
          s[b] += static_cast<Accum>(rxc[b]);
          sx[b] += static_cast<Accum>((xc[b] - m[b]) * is[b] * rxc[b]);
        }
      }
    }
    for (std::size_t b = 0; b < nb; ++b) {
      rm[b] = static_cast<Scalar>(s[b] / static_cast<Accum>(C));
      a[b] = static_cast<Scalar>(sx[b] / static_cast<Accum>(C));
      if (has_rx) {
        v.rx_mean[k.r0 + b] = rm[b];
        v.rx_dot[k.r0 + b] = a[b];
      }
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar gc = d.scale(c);
      const Scalar vg = v.v_gamma != nullptr ? v.v_gamma[c] : Scalar(0);
      const Scalar vb = v.v_beta != nullptr ? v.v_beta[c] : Scalar(0);
      const Scalar *xc = d.x + k.r0 + R * c;
      const Scalar *rxc = has_rx ? v.rx + k.r0 + R * c : nullptr;
      Scalar *ryc = ry + k.r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        const Scalar xh = (xc[b] - m[b]) * is[b];
        const Scalar rxh = has_rx ? is[b] * (rxc[b] - rm[b] - xh * a[b]) : Scalar(0);
        ryc[b] = gc * rxh + vg * xh + vb;
      }
    }
  }
};

/// Per row: mean(R{x}) and a = mean(x̂ ⊙ R{x}) (stored, when R{x} is given), and
/// R{y} = γ ⊙ R{x̂} + v_γ ⊙ x̂ + v_β, in blocks of layer_norm_block() rows.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_forward_r(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                          const LayerNormDirection<Scalar> &v, Scalar *ry) {
  layer_norm_launch_blocks<LayerNormForwardR, Accum>("kat::nn::LayerNorm::forward_r", space, d, v,
                                                     ry);
}

/// R{dx} of layer_norm_backward_r_input, for the block of rows `item`.
template <class Accum, class Scalar, std::size_t B> struct LayerNormBackwardRInput {
  LayerNormRows<Scalar> d;
  LayerNormDirection<Scalar> v;
  const Scalar *dy;
  const Scalar *rdy;
  Scalar *rdx;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t item) const {
    const LayerNormBlock k = layer_norm_block_of<B>(item, d.rows);
    const std::size_t R = d.rows, C = d.features, nb = k.nb;
    const bool has_rx = v.rx != nullptr;
    Scalar m[B], is[B], rm[B], a[B];
    Accum sg[B], sgx[B], srg[B], srgx[B], sgrx[B];
    for (std::size_t b = 0; b < B; ++b) {
      const bool in = b < nb;
      m[b] = in ? d.mean[k.r0 + b] : Scalar(0);
      is[b] = in ? d.inv_std[k.r0 + b] : Scalar(0);
      rm[b] = in && has_rx ? v.rx_mean[k.r0 + b] : Scalar(0);
      a[b] = in && has_rx ? v.rx_dot[k.r0 + b] : Scalar(0);
      sg[b] = sgx[b] = srg[b] = srgx[b] = sgrx[b] = 0;
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar gc = d.scale(c);
      const Scalar vg = v.v_gamma != nullptr ? v.v_gamma[c] : Scalar(0);
      const Scalar *xc = d.x + k.r0 + R * c;
      const Scalar *rxc = has_rx ? v.rx + k.r0 + R * c : nullptr;
      const Scalar *dyc = dy + k.r0 + R * c;
      const Scalar *rdyc = rdy + k.r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        const Scalar xh = (xc[b] - m[b]) * is[b];
        const Scalar rxh = has_rx ? is[b] * (rxc[b] - rm[b] - xh * a[b]) : Scalar(0);
        const Scalar g = gc * dyc[b];
        const Scalar rg = gc * rdyc[b] + vg * dyc[b];
        sg[b] += static_cast<Accum>(g);
        sgx[b] += static_cast<Accum>(g * xh);
        srg[b] += static_cast<Accum>(rg);
        srgx[b] += static_cast<Accum>(rg * xh);
        sgrx[b] += static_cast<Accum>(g * rxh);
      }
    }
    const Accum n = static_cast<Accum>(C);
    // Zero-initialized: only the first nb are set and read, which the compiler cannot prove.
    Scalar mg[B] = {}, mgx[B] = {}, mrg[B] = {}, coupled[B] = {};
    for (std::size_t b = 0; b < nb; ++b) {
      mg[b] = static_cast<Scalar>(sg[b] / n);
      mgx[b] = static_cast<Scalar>(sgx[b] / n);
      mrg[b] = static_cast<Scalar>(srg[b] / n);
      coupled[b] = static_cast<Scalar>((srgx[b] + sgrx[b]) / n);
    }
    for (std::size_t c = 0; c < C; ++c) {
      const Scalar gc = d.scale(c);
      const Scalar vg = v.v_gamma != nullptr ? v.v_gamma[c] : Scalar(0);
      const Scalar *xc = d.x + k.r0 + R * c;
      const Scalar *rxc = has_rx ? v.rx + k.r0 + R * c : nullptr;
      const Scalar *dyc = dy + k.r0 + R * c;
      const Scalar *rdyc = rdy + k.r0 + R * c;
      Scalar *rdxc = rdx + k.r0 + R * c;
      for (std::size_t b = 0; b < nb; ++b) {
        const Scalar xh = (xc[b] - m[b]) * is[b];
        const Scalar rxh = has_rx ? is[b] * (rxc[b] - rm[b] - xh * a[b]) : Scalar(0);
        const Scalar g = gc * dyc[b];
        const Scalar rg = gc * rdyc[b] + vg * dyc[b];
        const Scalar dxv = is[b] * (g - mg[b] - xh * mgx[b]);
        rdxc[b] = is[b] * (rg - mrg[b] - rxh * mgx[b] - xh * coupled[b]) - is[b] * a[b] * dxv;
      }
    }
  }
};

/// R{dx} per row, in blocks of layer_norm_block() rows. With g = γ ⊙ dy,
/// R{g} = v_γ ⊙ dy + γ ⊙ R{dy}, P(g) = g − mean(g) − x̂ mean(g ⊙ x̂) (so dx = P(g)/σ) and
/// R{1/σ} = −a/σ:
///   R{dx} = −(a/σ) dx + (1/σ)(R{g} − mean(R{g}) − R{x̂} mean(g ⊙ x̂)
///                             − x̂ (mean(R{g} ⊙ x̂) + mean(g ⊙ R{x̂}))).
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_r_input(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                 const LayerNormDirection<Scalar> &v, const Scalar *dy,
                                 const Scalar *rdy, Scalar *rdx) {
  layer_norm_launch_blocks<LayerNormBackwardRInput, Accum>("kat::nn::LayerNorm::backward_r_input",
                                                           space, d, v, dy, rdy, rdx);
}

/// R{dγ} and R{dβ} of layer_norm_backward_r_parameters, for the feature of the team.
template <class Accum, class ExecSpace, class Scalar> struct LayerNormBackwardRParameters {
  LayerNormRows<Scalar> d;
  LayerNormDirection<Scalar> v;
  const Scalar *dy;
  const Scalar *rdy;
  Scalar *hv_gamma;
  Scalar *hv_beta;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const std::size_t c = team.league_rank();
    Accum sg = 0, sb = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, d.rows),
        [&](const std::size_t r, Accum &s) {
          const std::size_t k = d.at(r, c);
          const Scalar xh = d.xhat(r, c);
          s += static_cast<Accum>(rdy[k] * xh + dy[k] * v.rxhat(d, r, c, xh));
        },
        sg);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, d.rows),
        [&](const std::size_t r, Accum &s) { s += static_cast<Accum>(rdy[d.at(r, c)]); }, sb);
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      hv_gamma[c] = static_cast<Scalar>(hv_gamma[c] + sg);
      hv_beta[c] = static_cast<Scalar>(hv_beta[c] + sb);
    });
  }
};

/// hv_γ += Σ_r (R{dy} ⊙ x̂ + dy ⊙ R{x̂}) and hv_β += Σ_r R{dy}, one team per feature.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_r_parameters(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                      const LayerNormDirection<Scalar> &v, const Scalar *dy,
                                      const Scalar *rdy, Scalar *hv_gamma, Scalar *hv_beta) {
  layer_norm_launch_teams<LayerNormBackwardRParameters, Accum>(
      "kat::nn::LayerNorm::backward_r_parameters", space, d.features, Kokkos::AUTO, d, v, dy, rdy,
      hv_gamma, hv_beta);
}

} // namespace detail

} // namespace kat::nn
