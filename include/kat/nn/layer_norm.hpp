#pragma once
/// @file
/// @brief Layer normalization over the features of each position (nn.LayerNorm over the last
/// dimension).

#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

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
/// and TLB miss each time: float, N·P = 2048 rows of C = 768, Serial (2026-11-26), forward
/// 21.5 ms and backward 41.6 ms one row at a time, 2.0 and 4.8 ms in blocks of 32 (blocks of
/// 16 to 128 rows were within the noise of each other).
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

/// Per row: μ, σ² (biased, in a second pass around μ), 1/σ = 1/sqrt(σ² + eps), stored, and
/// y = γ ⊙ x̂ + β, for blocks of layer_norm_block() rows.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_forward_blocks(const ExecSpace &space, const LayerNormRows<Scalar> &d, double eps,
                               Scalar *y) {
  constexpr std::size_t B = layer_norm_block<ExecSpace>();
  const Accum e = static_cast<Accum>(eps);
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::forward", Kokkos::RangePolicy<ExecSpace>(space, 0, (d.rows + B - 1) / B),
      KOKKOS_LAMBDA(const std::size_t item) {
        const LayerNormBlock k = layer_norm_block_of<B>(item, d.rows);
        const std::size_t R = d.rows, C = d.features, nb = k.nb;
        Accum mu[B], sq[B];
        for (std::size_t b = 0; b < B; ++b) {
          mu[b] = 0;
          sq[b] = 0;
        }
        for (std::size_t c = 0; c < C; ++c) {
          const Scalar *xc = d.x + k.r0 + R * c;
          for (std::size_t b = 0; b < nb; ++b) {
            mu[b] += static_cast<Accum>(xc[b]);
          }
        }
        for (std::size_t b = 0; b < nb; ++b) {
          mu[b] /= static_cast<Accum>(C);
        }
        for (std::size_t c = 0; c < C; ++c) {
          const Scalar *xc = d.x + k.r0 + R * c;
          for (std::size_t b = 0; b < nb; ++b) {
            const Accum dev = static_cast<Accum>(xc[b]) - mu[b];
            sq[b] += dev * dev;
          }
        }
        Scalar m[B], is[B];
        for (std::size_t b = 0; b < nb; ++b) {
          m[b] = static_cast<Scalar>(mu[b]);
          is[b] = static_cast<Scalar>(Accum(1) / math::sqrt(sq[b] / static_cast<Accum>(C) + e));
          d.mean[k.r0 + b] = m[b];
          d.inv_std[k.r0 + b] = is[b];
        }
        for (std::size_t c = 0; c < C; ++c) {
          const Scalar gc = d.scale(c), bc = d.beta != nullptr ? d.beta[c] : Scalar(0);
          const Scalar *xc = d.x + k.r0 + R * c;
          Scalar *yc = y + k.r0 + R * c;
          for (std::size_t b = 0; b < nb; ++b) {
            yc[b] = gc * ((xc[b] - m[b]) * is[b]) + bc;
          }
        }
      });
}

/// dx = (1/σ)(g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)) with g = dx̂ = γ ⊙ dy, per row, in blocks of
/// layer_norm_block() rows.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_input_blocks(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                      const Scalar *dy, Scalar *dx) {
  constexpr std::size_t B = layer_norm_block<ExecSpace>();
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::backward_input",
      Kokkos::RangePolicy<ExecSpace>(space, 0, (d.rows + B - 1) / B),
      KOKKOS_LAMBDA(const std::size_t item) {
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
      });
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

/// The forward of layer_norm_forward_blocks with a team per row, for GPUs: one thread per row
/// leaves a GPU nearly idle at transformer sizes (N·P = 2048 rows are 2048 threads), while a
/// team spreads a row's C features over its threads, and the 32-byte sectors of x serve the
/// teams of 8 neighbouring rows through the cache. H100, float, N·P = 2048 (2026-11-26): C = 768
/// forward 0.39 ms one thread per row, 0.078 ms a team per row (backward 0.41 and 0.12 ms);
/// C = 64, 0.040 and 0.018 ms (backward 0.050 and 0.035 ms).
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_forward_teams(const ExecSpace &space, const LayerNormRows<Scalar> &d, double eps,
                              Scalar *y) {
  using team_policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename team_policy::member_type;
  const Accum e = static_cast<Accum>(eps);
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::forward",
      team_policy(space, d.rows, layer_norm_team_size<ExecSpace>(d.features)),
      KOKKOS_LAMBDA(const member &team) {
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
        const Scalar is =
            static_cast<Scalar>(Accum(1) / math::sqrt(sq / static_cast<Accum>(C) + e));
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          d.mean[r] = m;
          d.inv_std[r] = is;
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const std::size_t c) {
          const Scalar bc = d.beta != nullptr ? d.beta[c] : Scalar(0);
          y[d.at(r, c)] = d.scale(c) * ((d.x[d.at(r, c)] - m) * is) + bc;
        });
      });
}

/// The input gradient of layer_norm_backward_input_blocks with a team per row, for GPUs.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_input_teams(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                     const Scalar *dy, Scalar *dx) {
  using team_policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename team_policy::member_type;
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::backward_input",
      team_policy(space, d.rows, layer_norm_team_size<ExecSpace>(d.features)),
      KOKKOS_LAMBDA(const member &team) {
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
      });
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

/// dγ (+)= Σ_r dy ⊙ x̂ and dβ (+)= Σ_r dy over all rows, one team per feature (the rows of a
/// feature are contiguous), as Dense's bias gradient.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_parameters(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                    const Scalar *dy, Scalar *dgamma, Scalar *dbeta,
                                    bool accumulate) {
  using team_policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename team_policy::member_type;
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::backward_parameters", team_policy(space, d.features, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member &team) {
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
      });
}

/// Per row: mean(R{x}) and a = mean(x̂ ⊙ R{x}) (stored, when R{x} is given), and
/// R{y} = γ ⊙ R{x̂} + v_γ ⊙ x̂ + v_β, in blocks of layer_norm_block() rows.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_forward_r(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                          const LayerNormDirection<Scalar> &v, Scalar *ry) {
  constexpr std::size_t B = layer_norm_block<ExecSpace>();
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::forward_r",
      Kokkos::RangePolicy<ExecSpace>(space, 0, (d.rows + B - 1) / B),
      KOKKOS_LAMBDA(const std::size_t item) {
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
      });
}

/// R{dx} per row, in blocks of layer_norm_block() rows. With g = γ ⊙ dy,
/// R{g} = v_γ ⊙ dy + γ ⊙ R{dy}, P(g) = g − mean(g) − x̂ mean(g ⊙ x̂) (so dx = P(g)/σ) and
/// R{1/σ} = −a/σ:
///   R{dx} = −(a/σ) dx + (1/σ)(R{g} − mean(R{g}) − R{x̂} mean(g ⊙ x̂)
///                             − x̂ (mean(R{g} ⊙ x̂) + mean(g ⊙ R{x̂}))).
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_r_input(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                 const LayerNormDirection<Scalar> &v, const Scalar *dy,
                                 const Scalar *rdy, Scalar *rdx) {
  constexpr std::size_t B = layer_norm_block<ExecSpace>();
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::backward_r_input",
      Kokkos::RangePolicy<ExecSpace>(space, 0, (d.rows + B - 1) / B),
      KOKKOS_LAMBDA(const std::size_t item) {
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
      });
}

/// hv_γ += Σ_r (R{dy} ⊙ x̂ + dy ⊙ R{x̂}) and hv_β += Σ_r R{dy}, one team per feature.
template <class Accum, class ExecSpace, class Scalar>
void layer_norm_backward_r_parameters(const ExecSpace &space, const LayerNormRows<Scalar> &d,
                                      const LayerNormDirection<Scalar> &v, const Scalar *dy,
                                      const Scalar *rdy, Scalar *hv_gamma, Scalar *hv_beta) {
  using team_policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename team_policy::member_type;
  Kokkos::parallel_for(
      "kat::nn::LayerNorm::backward_r_parameters", team_policy(space, d.features, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member &team) {
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
      });
}

} // namespace detail

/// Layer normalization (Ba, Kiros & Hinton 2016, "Layer Normalization", eq. 15-16) with the
/// semantics of torch.nn.LayerNorm(C) over the last dimension of (N, P, C).
///
/// Input and output are N x (C·P) matrices of P = H·W positions (tokens) with C features each,
/// FeatureShape {C, H, W} (feature index p + P·c; a flat input of C features is P = 1). Their
/// memory is the (N·P) x C column-major matrix whose row r = n + N·p is token p of sample n,
/// and each row is normalized over its C features:
///   μ = (1/C) Σ_c x,  σ² = (1/C) Σ_c (x − μ)²  (biased),  x̂ = (x − μ)/sqrt(σ² + eps),
///   y = γ ⊙ x̂ + β  (y = x̂ without elementwise_affine).
/// Training and evaluation are the same (no running statistics).
///
/// Backward, per row, with 1/σ = 1/sqrt(σ² + eps) and dx̂ = γ ⊙ dy:
///   dx = (1/σ)(dx̂ − mean(dx̂) − x̂ ⊙ mean(dx̂ ⊙ x̂)),
/// and over all N·P rows dγ = Σ dy ⊙ x̂, dβ = Σ dy (added to or overwriting the gradient as
/// accumulate_gradients() says; skipped with compute_parameter_gradients(false)).
///
/// R-operator (Pearlmutter 1994; see Layer), for R{x} (possibly 0) and a direction (v_γ, v_β):
/// with a = mean(x̂ ⊙ R{x}), R{1/σ} = −a/σ and
///   R{x̂} = (1/σ)(R{x} − mean(R{x}) − x̂ a),  R{y} = γ ⊙ R{x̂} + v_γ ⊙ x̂ + v_β;
/// backward_r differentiates dx through g = γ ⊙ dy (R{g} = v_γ ⊙ dy + γ ⊙ R{dy}, see
/// detail::layer_norm_backward_r_input) and adds R{dγ} = Σ (R{dy} ⊙ x̂ + dy ⊙ R{x̂}),
/// R{dβ} = Σ R{dy} to the product buffer.
///
/// Parameters (elementwise_affine = true): γ (C) then β (C), initialized 1 and 0.
///
/// Work: on a host, one thread per block of 32 rows for the statistics and the element-wise
/// passes (see detail::layer_norm_block); on a GPU, a team per row for forward and dx (see
/// detail::layer_norm_forward_teams) and a thread per row for the R-operator's passes. A
/// forward reads x three times and writes y, keeping each row's μ and 1/σ in a workspace. The
/// parameter-gradient sums run one team per feature.
/// The row sums accumulate in `accum_type` (double for float) and the variance is formed
/// around the mean. No curvature record (supports_curvature() is false).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class LayerNorm final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  using vector_type = Vector<Scalar, MemorySpace>;
  /// Type the per-row sums accumulate in: double for float, Scalar if wider.
  using accum_type = std::common_type_t<Scalar, double>;

  /// @param normalized_features  C, the features of each position, > 0
  /// @param eps                  added to the variance before the square root, finite, > 0
  /// @param elementwise_affine   whether to learn the per-feature scale γ and shift β
  /// @throws ValueError for normalized_features = 0 or eps not finite or <= 0.
  explicit LayerNorm(std::size_t normalized_features, double eps = 1e-5,
                     bool elementwise_affine = true)
      : features_(normalized_features), eps_(eps), affine_(elementwise_affine),
        stats_("kat::nn::LayerNorm::stats"), r_stats_("kat::nn::LayerNorm::r_stats") {
    if (features_ == 0) {
      throw ValueError("kat::nn::LayerNorm: normalized_features must be > 0, got "
                       "normalized_features = 0");
    }
    if (!(std::isfinite(eps_) && eps_ > 0.0)) {
      throw ValueError(
          kat::detail::concat("kat::nn::LayerNorm: eps must be finite and > 0, got eps = ", eps_));
    }
  }

  std::string name() const override { return "LayerNorm"; }
  std::size_t normalized_features() const { return features_; }
  double eps() const { return eps_; }
  bool elementwise_affine() const { return affine_; }

  /// @throws ShapeError unless input.channels == normalized_features().
  FeatureShape output_shape(const FeatureShape &input) const override {
    kat::detail::require_extent("kat::nn::LayerNorm", "input channels (normalized_features)",
                                features_, static_cast<std::size_t>(input.channels));
    return input;
  }

  /// 2C with elementwise_affine (γ then β), else 0.
  std::size_t parameter_count() const override { return affine_ ? 2 * features_ : 0; }
  /// With elementwise_affine: "weight" γ ({C}, role weight) then "bias" β ({C}, role bias).
  std::vector<ParameterSpec> parameter_specs() const override {
    if (!affine_) {
      return {};
    }
    return {{"weight", ParameterRole::weight, {features_}, 0},
            {"bias", ParameterRole::bias, {features_}, features_}};
  }

  void bind(Scalar *params, Scalar *grads) override {
    if (!affine_) {
      return;
    }
    gamma_ = vector_type(params, features_);
    beta_ = vector_type(params + features_, features_);
    grad_gamma_ = vector_type(grads, features_);
    grad_beta_ = vector_type(grads + features_, features_);
  }

  /// γ = 1, β = 0 (PyTorch); `seed` is unused.
  void reset_parameters(const execution_space &space, std::uint64_t /*seed*/) override {
    if (affine_) {
      require_bound("reset_parameters");
      Kokkos::deep_copy(space, gamma_, Scalar(1));
      Kokkos::deep_copy(space, beta_, Scalar(0));
    }
  }

  /// γ (C), a view of the flat parameter buffer; empty without affine or before bind().
  const vector_type &gamma() const { return gamma_; }
  /// β (C), a view of the flat parameter buffer; empty without affine or before bind().
  const vector_type &beta() const { return beta_; }
  /// dL/dγ (C), a view of the flat gradient buffer.
  const vector_type &gamma_gradient() const { return grad_gamma_; }
  /// dL/dβ (C), a view of the flat gradient buffer.
  const vector_type &beta_gradient() const { return grad_beta_; }

  /// Total (re)allocations of the layer's workspaces; constant after the first step.
  std::size_t workspace_allocations() const {
    return stats_.allocations() + r_stats_.allocations();
  }

  /// @throws ShapeError if x's column count is not a positive multiple of
  ///         normalized_features(), y's extents differ from x's, or either is not contiguous.
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::LayerNorm::forward");
    const char *where = "kat::nn::LayerNorm::forward";
    const std::size_t cols = x.extent(1);
    if (cols == 0 || cols % features_ != 0) {
      throw ShapeError(kat::detail::concat(where,
                                           ": x columns must be a positive multiple of "
                                           "normalized_features = ",
                                           features_, ", got ", cols));
    }
    require_contiguous(where, "x", x);
    if (affine_) {
      require_bound("forward");
    }
    require_like(where, "y", x, y);
    x_ = x;
    const std::size_t rows = x.extent(0) * (cols / features_);
    const auto stats = stats_.matrix(rows, 2);
    rows_ = detail::LayerNormRows<Scalar>{x.data(),
                                          rows,
                                          features_,
                                          affine_ ? gamma_.data() : nullptr,
                                          affine_ ? beta_.data() : nullptr,
                                          stats.data(),
                                          stats.data() + rows};
    detail::layer_norm_forward<accum_type>(space, rows_, eps_, y.data());
  }

  /// @throws ShapeError if dy (or a dx of nonzero extent) differs from the last forward's x
  ///         in extents or is not contiguous.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::LayerNorm::backward");
    const char *where = "kat::nn::LayerNorm::backward";
    require_like_x(where, "dy", dy);
    if (affine_ && this->parameter_gradients_) {
      detail::layer_norm_backward_parameters<accum_type>(
          space, rows_, dy.data(), grad_gamma_.data(), grad_beta_.data(), this->accumulate_);
    }
    if (dx.extent(0) != 0) {
      require_like_x(where, "dx", dx);
      detail::layer_norm_backward_input<accum_type>(space, rows_, dy.data(), dx.data());
    }
  }

  /// One "LayerNorm" operator {features}.
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                          const std::string &name) const override {
    return graph.add(
        "LayerNorm", name, {x}, graph_shape(graph.tensor(x).shape[0], output_shape(in)),
        this->parameter_shapes(), {{"features", static_cast<std::int64_t>(features_)}});
  }

  bool supports_r_operator() const override { return true; }

  void bind_direction(Scalar *v, Scalar *hv) override {
    if (!affine_) {
      return;
    }
    v_gamma_ = vector_type(v, features_);
    v_beta_ = vector_type(v + features_, features_);
    hv_gamma_ = vector_type(hv, features_);
    hv_beta_ = vector_type(hv + features_, features_);
  }

  /// R{y} for R{x} = `rx` (0 when rx has extent 0) and the bound direction.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::LayerNorm::forward_r");
    const char *where = "kat::nn::LayerNorm::forward_r";
    require_direction(where);
    require_like_x(where, "ry", ry);
    direction_ = detail::LayerNormDirection<Scalar>{};
    if (affine_) {
      direction_.v_gamma = v_gamma_.data();
      direction_.v_beta = v_beta_.data();
    }
    if (rx.extent(0) != 0) {
      require_like_x(where, "rx", rx);
      const auto r_stats = r_stats_.matrix(rows_.rows, 2);
      direction_.rx = rx.data();
      direction_.rx_mean = r_stats.data();
      direction_.rx_dot = r_stats.data() + rows_.rows;
    }
    detail::layer_norm_forward_r<accum_type>(space, rows_, direction_, ry.data());
  }

  /// Adds R{dγ}, R{dβ} to the bound product buffer and writes R{dx} (skipped when rdx has
  /// extent 0), for the rx of the last forward_r.
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::LayerNorm::backward_r");
    const char *where = "kat::nn::LayerNorm::backward_r";
    require_direction(where);
    require_like_x(where, "dy", dy);
    require_like_x(where, "rdy", rdy);
    if (affine_) {
      detail::layer_norm_backward_r_parameters<accum_type>(
          space, rows_, direction_, dy.data(), rdy.data(), hv_gamma_.data(), hv_beta_.data());
    }
    if (rdx.extent(0) != 0) {
      require_like_x(where, "rdx", rdx);
      detail::layer_norm_backward_r_input<accum_type>(space, rows_, direction_, dy.data(),
                                                      rdy.data(), rdx.data());
    }
  }

private:
  void require_bound(const char *what) const {
    if (gamma_.extent(0) == 0) {
      throw Error(
          kat::detail::concat("kat::nn::LayerNorm::", what, ": no parameters bound (bind)"));
    }
  }
  void require_direction(const char *where) const {
    if (affine_ && v_gamma_.extent(0) == 0) {
      throw Error(kat::detail::concat(where, ": no direction bound (bind_direction)"));
    }
  }
  static void require_contiguous(const char *where, const char *what, const matrix_type &m) {
    if (!m.span_is_contiguous()) {
      throw ShapeError(kat::detail::concat(where, ": ", what, " must be contiguous, got strides ",
                                           m.stride(0), ", ", m.stride(1), " for ", m.extent(0),
                                           "x", m.extent(1)));
    }
  }
  // The extents of `ref`, contiguous.
  static void require_like(const char *where, const char *what, const matrix_type &ref,
                           const matrix_type &m) {
    if (m.extent(0) != ref.extent(0) || m.extent(1) != ref.extent(1)) {
      throw ShapeError(kat::detail::concat(where, ": ", what, " must be ", ref.extent(0), "x",
                                           ref.extent(1), ", got ", m.extent(0), "x", m.extent(1)));
    }
    require_contiguous(where, what, m);
  }
  // The last forward's x's extents, contiguous.
  void require_like_x(const char *where, const char *what, const matrix_type &m) const {
    require_like(where, what, x_, m);
  }

  std::size_t features_;
  double eps_;
  bool affine_;
  vector_type gamma_, beta_, grad_gamma_, grad_beta_;
  vector_type v_gamma_, v_beta_, hv_gamma_, hv_beta_;
  matrix_type x_;
  Workspace<Scalar, MemorySpace> stats_, r_stats_;
  detail::LayerNormRows<Scalar> rows_;
  detail::LayerNormDirection<Scalar> direction_;
};

} // namespace kat::nn
