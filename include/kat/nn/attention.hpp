#pragma once
/// @file
/// @brief Multi-head scaled dot-product self-attention (the parameter-free core of a
/// transformer's attention block).

#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <KokkosBatched_Gemm_Decl.hpp>

#include <climits>
#include <cmath>
#include <cstddef>
#include <string>

namespace kat::nn {

namespace detail {

/// The sizes one attention pass works on. The N·heads (sample, head) pairs are independent.
struct AttentionGeometry {
  std::size_t batch = 0;     ///< N
  std::size_t positions = 0; ///< P = H·W
  std::size_t heads = 0;
  std::size_t head_dim = 0; ///< dh
  bool causal = false;

  KOKKOS_INLINE_FUNCTION std::size_t pairs() const { return batch * heads; }
  KOKKOS_INLINE_FUNCTION std::size_t model_dim() const { return heads * head_dim; }
  /// Offset of (sample n, position p, channel c) in a token matrix (x, y, dx, ...): row
  /// n + N·p, column c of the (N·P) x C row view.
  KOKKOS_INLINE_FUNCTION std::size_t token(std::size_t n, std::size_t p, std::size_t c) const {
    return n + batch * (p + positions * c);
  }
  /// Offset of A[t, s] of (sample n, head h) in the probabilities (and in R{A}, dA, dS):
  /// n + N·(h + heads·(t + P·s)), so the batch is fastest, as in the token matrices.
  KOKKOS_INLINE_FUNCTION std::size_t prob(std::size_t n, std::size_t h, std::size_t t,
                                          std::size_t s) const {
    return n + batch * (h + heads * (t + positions * s));
  }
};

/// The keys query t may attend to are s < attention_row_end(g, t): t + 1 when causal.
KOKKOS_INLINE_FUNCTION std::size_t attention_row_end(const AttentionGeometry &g, std::size_t t) {
  return g.causal ? t + 1 : g.positions;
}

// ---------------------------------------------------------------------------------------------
// Batched GEMMs: one team per (sample, head) pair, KokkosBatched team GEMMs on strided views.
// ---------------------------------------------------------------------------------------------

/// A strided 2-D block of a larger buffer, as KokkosBatched's GEMMs take it.
template <class Scalar, class MemorySpace>
using AttentionBlock = Kokkos::View<Scalar **, Kokkos::LayoutStride, MemorySpace,
                                    Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// The P x dh block of channels [c0, c0 + dh) of sample n in a token matrix at `base` (row
/// stride N, column stride N·P): no copy.
template <class MemorySpace, class Scalar>
KOKKOS_INLINE_FUNCTION AttentionBlock<Scalar, MemorySpace>
attention_token_block(Scalar *base, const AttentionGeometry &g, std::size_t n, std::size_t c0) {
  return AttentionBlock<Scalar, MemorySpace>(
      base + g.token(n, 0, c0),
      Kokkos::LayoutStride(g.positions, g.batch, g.head_dim, g.batch * g.positions));
}

/// The P x P block of (sample n, head h) in a buffer laid out as the probabilities.
template <class MemorySpace, class Scalar>
KOKKOS_INLINE_FUNCTION AttentionBlock<Scalar, MemorySpace>
attention_square_block(Scalar *base, const AttentionGeometry &g, std::size_t n, std::size_t h) {
  const std::size_t stride = g.batch * g.heads;
  return AttentionBlock<Scalar, MemorySpace>(
      base + g.prob(n, h, 0, 0),
      Kokkos::LayoutStride(g.positions, stride, g.positions, stride * g.positions));
}

using AttentionNoTrans = KokkosBatched::Trans::NoTranspose;
using AttentionTrans = KokkosBatched::Trans::Transpose;
/// Blocked (register tiles of 2 x 2 on GPUs, 4 x 4 on hosts) rather than Unblocked: on an
/// H100 (forward + backward, float, N = 128, heads 4, dh 16) 0.119 against 0.150 ms at P = 16,
/// 0.269 against 0.383 ms at P = 28, and 56.5 against 72.0 ms at N = 32, heads 8, dh 64,
/// P = 256 causal (nvcc 13.0, Kokkos 3.4.1, 2026-11-26); on the host about the same.
using AttentionGemmAlgo = KokkosBatched::Algo::Gemm::Blocked;

/// C = alpha op(A) op(B) + beta C for one team (KokkosBatched::TeamGemm), then a team barrier
/// so the team may read C at once.
template <class TransA, class TransB, class Member, class Scalar, class A, class B, class C>
KOKKOS_INLINE_FUNCTION void attention_team_gemm(const Member &team, Scalar alpha, const A &a,
                                                const B &b, Scalar beta, const C &c) {
  KokkosBatched::TeamGemm<Member, TransA, TransB, AttentionGemmAlgo>::invoke(team, alpha, a, b,
                                                                             beta, c);
  team.team_barrier();
}

/// Forward: per pair, S = Q Kᵀ/√dh into `a`, its row softmax in place (entries s > t are 0
/// when causal), then O = A V into y.
template <class ExecSpace, class MemorySpace, class Scalar>
void attention_gemm_forward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                            const Scalar *x, Scalar *y, Scalar *a) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::forward (batched GEMM)",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t n = team.league_rank() % g.batch, h = team.league_rank() / g.batch;
        const std::size_t D = g.model_dim(), c0 = h * g.head_dim, P = g.positions;
        const auto q = attention_token_block<MemorySpace>(x, g, n, c0);
        const auto k = attention_token_block<MemorySpace>(x, g, n, D + c0);
        const auto v = attention_token_block<MemorySpace>(x, g, n, 2 * D + c0);
        const auto s = attention_square_block<MemorySpace>(a, g, n, h);
        attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, q, k, Scalar(0), s);
        // Numerically stable softmax over the keys of each query t: subtract the row max.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          const std::size_t end = attention_row_end(g, t);
          Scalar m = s(t, 0);
          for (std::size_t c = 1; c < end; ++c) {
            m = s(t, c) > m ? s(t, c) : m;
          }
          Scalar sum = 0;
          for (std::size_t c = 0; c < end; ++c) {
            const Scalar e = math::exp(s(t, c) - m);
            s(t, c) = e;
            sum += e;
          }
          const Scalar inv = Scalar(1) / sum;
          for (std::size_t c = 0; c < end; ++c) {
            s(t, c) *= inv;
          }
          for (std::size_t c = end; c < P; ++c) {
            s(t, c) = Scalar(0);
          }
        });
        team.team_barrier();
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(
            team, Scalar(1), s, v, Scalar(0), attention_token_block<MemorySpace>(y, g, n, c0));
      });
}

/// Backward: per pair, dV = Aᵀ dO, dA = dO Vᵀ (into `work`), dS = A ⊙ (dA − rowsum(dA ⊙ A))
/// in place, dQ = dS K/√dh, dK = dSᵀ Q/√dh, into dx in the q|k|v layout.
template <class ExecSpace, class MemorySpace, class Scalar>
void attention_gemm_backward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                             const Scalar *x, const Scalar *a, const Scalar *dy, Scalar *dx,
                             Scalar *work) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::backward (batched GEMM)",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t n = team.league_rank() % g.batch, h = team.league_rank() / g.batch;
        const std::size_t D = g.model_dim(), c0 = h * g.head_dim, P = g.positions;
        const auto q = attention_token_block<MemorySpace>(x, g, n, c0);
        const auto k = attention_token_block<MemorySpace>(x, g, n, D + c0);
        const auto v = attention_token_block<MemorySpace>(x, g, n, 2 * D + c0);
        const auto d_o = attention_token_block<MemorySpace>(dy, g, n, c0);
        const auto ap = attention_square_block<MemorySpace>(a, g, n, h);
        const auto ds = attention_square_block<MemorySpace>(work, g, n, h);
        attention_team_gemm<AttentionTrans, AttentionNoTrans>(
            team, Scalar(1), ap, d_o, Scalar(0),
            attention_token_block<MemorySpace>(dx, g, n, 2 * D + c0));
        attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), d_o, v, Scalar(0),
                                                              ds);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar r = 0;
          for (std::size_t c = 0; c < P; ++c) {
            r += ds(t, c) * ap(t, c);
          }
          for (std::size_t c = 0; c < P; ++c) {
            ds(t, c) = ap(t, c) * (ds(t, c) - r);
          }
        });
        team.team_barrier();
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(
            team, scale, ds, k, Scalar(0), attention_token_block<MemorySpace>(dx, g, n, c0));
        attention_team_gemm<AttentionTrans, AttentionNoTrans>(
            team, scale, ds, q, Scalar(0), attention_token_block<MemorySpace>(dx, g, n, D + c0));
      });
}

/// R-operator of the forward: per pair, R{S} = (R{Q}Kᵀ + Q R{K}ᵀ)/√dh, R{A} = A ⊙ (R{S} −
/// rowsum(A ⊙ R{S})) into `ra`, R{O} = R{A} V + A R{V} into ry.
template <class ExecSpace, class MemorySpace, class Scalar>
void attention_gemm_forward_r(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                              const Scalar *x, const Scalar *rx, const Scalar *a, Scalar *ra,
                              Scalar *ry) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::forward_r (batched GEMM)",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t n = team.league_rank() % g.batch, h = team.league_rank() / g.batch;
        const std::size_t D = g.model_dim(), c0 = h * g.head_dim, P = g.positions;
        const auto q = attention_token_block<MemorySpace>(x, g, n, c0);
        const auto k = attention_token_block<MemorySpace>(x, g, n, D + c0);
        const auto v = attention_token_block<MemorySpace>(x, g, n, 2 * D + c0);
        const auto rq = attention_token_block<MemorySpace>(rx, g, n, c0);
        const auto rk = attention_token_block<MemorySpace>(rx, g, n, D + c0);
        const auto rv = attention_token_block<MemorySpace>(rx, g, n, 2 * D + c0);
        const auto ap = attention_square_block<MemorySpace>(a, g, n, h);
        const auto rs = attention_square_block<MemorySpace>(ra, g, n, h);
        attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, rq, k, Scalar(0), rs);
        attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, q, rk, Scalar(1), rs);
        // Masked entries have A = 0, so R{A} = 0 there too.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar r = 0;
          for (std::size_t c = 0; c < P; ++c) {
            r += ap(t, c) * rs(t, c);
          }
          for (std::size_t c = 0; c < P; ++c) {
            rs(t, c) = ap(t, c) * (rs(t, c) - r);
          }
        });
        team.team_barrier();
        const auto ro = attention_token_block<MemorySpace>(ry, g, n, c0);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), rs, v, Scalar(0),
                                                                ro);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), ap, rv, Scalar(1),
                                                                ro);
      });
}

/// R-operator of the backward (the product rule on each backward formula): per pair,
///   R{dV} = R{A}ᵀ dO + Aᵀ R{dO},   R{dA} = R{dO} Vᵀ + dO R{V}ᵀ,
///   R{dS} = R{A} ⊙ (dA − r) + A ⊙ (R{dA} − R{r}),  r = rowsum(dA ⊙ A),
///           R{r} = rowsum(R{dA} ⊙ A + dA ⊙ R{A}),
///   R{dQ} = (R{dS} K + dS R{K})/√dh,   R{dK} = (R{dS}ᵀ Q + dSᵀ R{Q})/√dh,
/// into rdx; dA and dS go through `work`, R{dA} and R{dS} through `rwork`.
template <class ExecSpace, class MemorySpace, class Scalar>
void attention_gemm_backward_r(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                               const Scalar *x, const Scalar *rx, const Scalar *a, const Scalar *ra,
                               const Scalar *dy, const Scalar *rdy, Scalar *rdx, Scalar *work,
                               Scalar *rwork) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::backward_r (batched GEMM)",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t n = team.league_rank() % g.batch, h = team.league_rank() / g.batch;
        const std::size_t D = g.model_dim(), c0 = h * g.head_dim, P = g.positions;
        const auto q = attention_token_block<MemorySpace>(x, g, n, c0);
        const auto k = attention_token_block<MemorySpace>(x, g, n, D + c0);
        const auto v = attention_token_block<MemorySpace>(x, g, n, 2 * D + c0);
        const auto rq = attention_token_block<MemorySpace>(rx, g, n, c0);
        const auto rk = attention_token_block<MemorySpace>(rx, g, n, D + c0);
        const auto rv = attention_token_block<MemorySpace>(rx, g, n, 2 * D + c0);
        const auto d_o = attention_token_block<MemorySpace>(dy, g, n, c0);
        const auto rdo = attention_token_block<MemorySpace>(rdy, g, n, c0);
        const auto ap = attention_square_block<MemorySpace>(a, g, n, h);
        const auto rap = attention_square_block<MemorySpace>(ra, g, n, h);
        const auto ds = attention_square_block<MemorySpace>(work, g, n, h);
        const auto rds = attention_square_block<MemorySpace>(rwork, g, n, h);
        const auto rdv = attention_token_block<MemorySpace>(rdx, g, n, 2 * D + c0);
        attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, Scalar(1), rap, d_o, Scalar(0),
                                                              rdv);
        attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, Scalar(1), ap, rdo, Scalar(1),
                                                              rdv);
        attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), d_o, v, Scalar(0),
                                                              ds);
        attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), rdo, v, Scalar(0),
                                                              rds);
        attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), d_o, rv, Scalar(1),
                                                              rds);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar r = 0, rr = 0;
          for (std::size_t c = 0; c < P; ++c) {
            r += ds(t, c) * ap(t, c);
            rr += rds(t, c) * ap(t, c) + ds(t, c) * rap(t, c);
          }
          for (std::size_t c = 0; c < P; ++c) {
            const Scalar da = ds(t, c);
            ds(t, c) = ap(t, c) * (da - r);
            rds(t, c) = rap(t, c) * (da - r) + ap(t, c) * (rds(t, c) - rr);
          }
        });
        team.team_barrier();
        const auto rdq = attention_token_block<MemorySpace>(rdx, g, n, c0);
        const auto rdk = attention_token_block<MemorySpace>(rdx, g, n, D + c0);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, rds, k, Scalar(0),
                                                                rdq);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, ds, rk, Scalar(1),
                                                                rdq);
        attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, rds, q, Scalar(0), rdk);
        attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, ds, rq, Scalar(1), rdk);
      });
}

// ---------------------------------------------------------------------------------------------
// Batch lanes: one team per (head, block of consecutive samples); every loop runs over the
// block's samples innermost, which are contiguous in the token matrices and in A.
// ---------------------------------------------------------------------------------------------

/// Most samples per block: the per-thread accumulators hold one value per sample.
constexpr int attention_max_lanes = 32;

/// Samples per block: attention_max_lanes on host backends, where 32 samples per loop took
/// 0.7x the time of 16 and 0.35x that of 8 (BM_AttentionForwardBackward, 1 thread; 64 gained
/// nothing more); on GPUs the vector length, up to 32 (lanes over consecutive samples
/// coalesce).
template <class ExecSpace> int attention_lane_block() {
  if (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    return attention_max_lanes;
  }
  const int max = Kokkos::TeamPolicy<ExecSpace>::vector_length_max();
  return max < attention_max_lanes ? max : attention_max_lanes;
}

/// The loop over a block's samples: vector lanes on GPUs, a plain (vectorizable) loop on
/// host backends.
template <class Member, class F>
KOKKOS_INLINE_FUNCTION void attention_lanes(const Member &team, int lanes, const F &f) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lanes), f);
}

/// Where one team's block is: head h, samples [n0, n0 + lanes).
struct AttentionLaneBlock {
  std::size_t h, n0;
  int lanes;
};

template <class Member>
KOKKOS_INLINE_FUNCTION AttentionLaneBlock attention_lane_block_of(const Member &team,
                                                                  const AttentionGeometry &g,
                                                                  int block) {
  const std::size_t blocks = (g.batch + block - 1) / block;
  const std::size_t h = team.league_rank() / blocks;
  const std::size_t n0 = (team.league_rank() % blocks) * std::size_t(block);
  const std::size_t left = g.batch - n0;
  return {h, n0, left < std::size_t(block) ? int(left) : block};
}

template <class ExecSpace>
Kokkos::TeamPolicy<ExecSpace> attention_lane_policy(const ExecSpace &space,
                                                    const AttentionGeometry &g, int block) {
  const std::size_t blocks = (g.batch + block - 1) / block;
  const bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  return Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(g.heads * blocks), Kokkos::AUTO,
                                       host ? 1 : block);
}

template <class ExecSpace, class Scalar>
void attention_lanes_forward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                             const Scalar *x, Scalar *y, Scalar *a) {
  using member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int block = attention_lane_block<ExecSpace>();
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::forward (batch lanes)",
      attention_lane_policy(space, g, block), KOKKOS_LAMBDA(const member &team) {
        const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
        const std::size_t D = g.model_dim(), dh = g.head_dim, P = g.positions, N = g.batch;
        const std::size_t c0 = blk.h * dh, NP = N * P, NH = N * g.heads;
        const Scalar *q = x + g.token(blk.n0, 0, c0);
        const Scalar *k = x + g.token(blk.n0, 0, D + c0);
        const Scalar *v = x + g.token(blk.n0, 0, 2 * D + c0);
        Scalar *o = y + g.token(blk.n0, 0, c0);
        Scalar *ap = a + g.prob(blk.n0, blk.h, 0, 0);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar acc[attention_max_lanes], m[attention_max_lanes];
          const std::size_t end = attention_row_end(g, t);
          // logits S[t, s] = Q_t·K_s/√dh
          for (std::size_t s = 0; s < end; ++s) {
            attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
            for (std::size_t j = 0; j < dh; ++j) {
              const Scalar *qj = q + N * t + NP * j;
              const Scalar *kj = k + N * s + NP * j;
              attention_lanes(team, blk.lanes, [&](const int l) { acc[l] += qj[l] * kj[l]; });
            }
            Scalar *as = ap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) { as[l] = acc[l] * scale; });
          }
          // softmax over s < end, stable: subtract the row max
          attention_lanes(team, blk.lanes, [&](const int l) {
            m[l] = ap[NH * t + l];
            acc[l] = 0;
          });
          for (std::size_t s = 1; s < end; ++s) {
            const Scalar *as = ap + NH * (t + P * s);
            attention_lanes(team, blk.lanes,
                            [&](const int l) { m[l] = as[l] > m[l] ? as[l] : m[l]; });
          }
          for (std::size_t s = 0; s < end; ++s) {
            Scalar *as = ap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) {
              const Scalar e = math::exp(as[l] - m[l]);
              as[l] = e;
              acc[l] += e;
            });
          }
          attention_lanes(team, blk.lanes, [&](const int l) { m[l] = Scalar(1) / acc[l]; });
          for (std::size_t s = 0; s < end; ++s) {
            Scalar *as = ap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) { as[l] *= m[l]; });
          }
          for (std::size_t s = end; s < P; ++s) {
            Scalar *as = ap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) { as[l] = Scalar(0); });
          }
          // O[t, j] = Σ_s A[t, s] V[s, j]
          for (std::size_t j = 0; j < dh; ++j) {
            attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
            for (std::size_t s = 0; s < end; ++s) {
              const Scalar *as = ap + NH * (t + P * s);
              const Scalar *vj = v + N * s + NP * j;
              attention_lanes(team, blk.lanes, [&](const int l) { acc[l] += as[l] * vj[l]; });
            }
            Scalar *oj = o + N * t + NP * j;
            attention_lanes(team, blk.lanes, [&](const int l) { oj[l] = acc[l]; });
          }
        });
      });
}

template <class ExecSpace, class Scalar>
void attention_lanes_backward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                              const Scalar *x, const Scalar *a, const Scalar *dy, Scalar *dx,
                              Scalar *work) {
  using member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int block = attention_lane_block<ExecSpace>();
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::backward (batch lanes)",
      attention_lane_policy(space, g, block), KOKKOS_LAMBDA(const member &team) {
        const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
        const std::size_t D = g.model_dim(), dh = g.head_dim, P = g.positions, N = g.batch;
        const std::size_t c0 = blk.h * dh, NP = N * P, NH = N * g.heads;
        const Scalar *q = x + g.token(blk.n0, 0, c0);
        const Scalar *k = x + g.token(blk.n0, 0, D + c0);
        const Scalar *v = x + g.token(blk.n0, 0, 2 * D + c0);
        const Scalar *d_o = dy + g.token(blk.n0, 0, c0);
        Scalar *dq = dx + g.token(blk.n0, 0, c0);
        Scalar *dk = dx + g.token(blk.n0, 0, D + c0);
        Scalar *dv = dx + g.token(blk.n0, 0, 2 * D + c0);
        const Scalar *ap = a + g.prob(blk.n0, blk.h, 0, 0);
        Scalar *wp = work + g.prob(blk.n0, blk.h, 0, 0);
        // Query rows: dA = dO Vᵀ, dS = A ⊙ (dA − rowsum(dA ⊙ A)) into work, dQ = dS K/√dh.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar acc[attention_max_lanes], r[attention_max_lanes];
          const std::size_t end = attention_row_end(g, t);
          attention_lanes(team, blk.lanes, [&](const int l) { r[l] = 0; });
          for (std::size_t s = 0; s < end; ++s) {
            attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
            for (std::size_t j = 0; j < dh; ++j) {
              const Scalar *doj = d_o + N * t + NP * j;
              const Scalar *vj = v + N * s + NP * j;
              attention_lanes(team, blk.lanes, [&](const int l) { acc[l] += doj[l] * vj[l]; });
            }
            Scalar *ws = wp + NH * (t + P * s);
            const Scalar *as = ap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) {
              ws[l] = acc[l];
              r[l] += acc[l] * as[l];
            });
          }
          for (std::size_t s = 0; s < end; ++s) {
            Scalar *ws = wp + NH * (t + P * s);
            const Scalar *as = ap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) { ws[l] = as[l] * (ws[l] - r[l]); });
          }
          for (std::size_t j = 0; j < dh; ++j) {
            attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
            for (std::size_t s = 0; s < end; ++s) {
              const Scalar *ws = wp + NH * (t + P * s);
              const Scalar *kj = k + N * s + NP * j;
              attention_lanes(team, blk.lanes, [&](const int l) { acc[l] += ws[l] * kj[l]; });
            }
            Scalar *dqj = dq + N * t + NP * j;
            attention_lanes(team, blk.lanes, [&](const int l) { dqj[l] = acc[l] * scale; });
          }
        });
        team.team_barrier();
        // Key rows: dV = Aᵀ dO, dK = dSᵀ Q/√dh, over the queries t that see key s.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t s) {
          Scalar acc[attention_max_lanes], acc2[attention_max_lanes];
          const std::size_t begin = g.causal ? s : 0;
          for (std::size_t j = 0; j < dh; ++j) {
            attention_lanes(team, blk.lanes, [&](const int l) {
              acc[l] = 0;
              acc2[l] = 0;
            });
            for (std::size_t t = begin; t < P; ++t) {
              const Scalar *as = ap + NH * (t + P * s);
              const Scalar *ws = wp + NH * (t + P * s);
              const Scalar *doj = d_o + N * t + NP * j;
              const Scalar *qj = q + N * t + NP * j;
              attention_lanes(team, blk.lanes, [&](const int l) {
                acc[l] += as[l] * doj[l];
                acc2[l] += ws[l] * qj[l];
              });
            }
            Scalar *dvj = dv + N * s + NP * j;
            Scalar *dkj = dk + N * s + NP * j;
            attention_lanes(team, blk.lanes, [&](const int l) {
              dvj[l] = acc[l];
              dkj[l] = acc2[l] * scale;
            });
          }
        });
      });
}

template <class ExecSpace, class Scalar>
void attention_lanes_forward_r(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                               const Scalar *x, const Scalar *rx, const Scalar *a, Scalar *ra,
                               Scalar *ry) {
  using member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int block = attention_lane_block<ExecSpace>();
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::forward_r (batch lanes)",
      attention_lane_policy(space, g, block), KOKKOS_LAMBDA(const member &team) {
        const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
        const std::size_t D = g.model_dim(), dh = g.head_dim, P = g.positions, N = g.batch;
        const std::size_t c0 = blk.h * dh, NP = N * P, NH = N * g.heads;
        const std::size_t qo = g.token(blk.n0, 0, c0), ko = g.token(blk.n0, 0, D + c0),
                          vo = g.token(blk.n0, 0, 2 * D + c0);
        const Scalar *ap = a + g.prob(blk.n0, blk.h, 0, 0);
        Scalar *rap = ra + g.prob(blk.n0, blk.h, 0, 0);
        Scalar *ro = ry + g.token(blk.n0, 0, c0);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar acc[attention_max_lanes], r[attention_max_lanes];
          const std::size_t end = attention_row_end(g, t);
          // R{S}[t, s] = (R{Q}_t·K_s + Q_t·R{K}_s)/√dh, and r = Σ_s A R{S}
          attention_lanes(team, blk.lanes, [&](const int l) { r[l] = 0; });
          for (std::size_t s = 0; s < end; ++s) {
            attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
            for (std::size_t j = 0; j < dh; ++j) {
              const std::size_t tj = N * t + NP * j, sj = N * s + NP * j;
              const Scalar *qj = x + qo + tj, *rqj = rx + qo + tj;
              const Scalar *kj = x + ko + sj, *rkj = rx + ko + sj;
              attention_lanes(team, blk.lanes,
                              [&](const int l) { acc[l] += rqj[l] * kj[l] + qj[l] * rkj[l]; });
            }
            const Scalar *as = ap + NH * (t + P * s);
            Scalar *ras = rap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) {
              ras[l] = acc[l] * scale;
              r[l] += as[l] * ras[l];
            });
          }
          // R{A} = A ⊙ (R{S} − r); 0 where masked
          for (std::size_t s = 0; s < end; ++s) {
            const Scalar *as = ap + NH * (t + P * s);
            Scalar *ras = rap + NH * (t + P * s);
            attention_lanes(team, blk.lanes,
                            [&](const int l) { ras[l] = as[l] * (ras[l] - r[l]); });
          }
          for (std::size_t s = end; s < P; ++s) {
            Scalar *ras = rap + NH * (t + P * s);
            attention_lanes(team, blk.lanes, [&](const int l) { ras[l] = Scalar(0); });
          }
          // R{O}[t, j] = Σ_s R{A}[t, s] V[s, j] + A[t, s] R{V}[s, j]
          for (std::size_t j = 0; j < dh; ++j) {
            attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
            for (std::size_t s = 0; s < end; ++s) {
              const Scalar *as = ap + NH * (t + P * s), *ras = rap + NH * (t + P * s);
              const Scalar *vj = x + vo + N * s + NP * j, *rvj = rx + vo + N * s + NP * j;
              attention_lanes(team, blk.lanes,
                              [&](const int l) { acc[l] += ras[l] * vj[l] + as[l] * rvj[l]; });
            }
            Scalar *roj = ro + N * t + NP * j;
            attention_lanes(team, blk.lanes, [&](const int l) { roj[l] = acc[l]; });
          }
        });
      });
}

template <class ExecSpace, class Scalar>
void attention_lanes_backward_r(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                                const Scalar *x, const Scalar *rx, const Scalar *a,
                                const Scalar *ra, const Scalar *dy, const Scalar *rdy, Scalar *rdx,
                                Scalar *work, Scalar *rwork) {
  using member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int block = attention_lane_block<ExecSpace>();
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::backward_r (batch lanes)",
      attention_lane_policy(space, g, block), KOKKOS_LAMBDA(const member &team) {
        const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
        const std::size_t D = g.model_dim(), dh = g.head_dim, P = g.positions, N = g.batch;
        const std::size_t c0 = blk.h * dh, NP = N * P, NH = N * g.heads;
        const std::size_t qo = g.token(blk.n0, 0, c0), ko = g.token(blk.n0, 0, D + c0),
                          vo = g.token(blk.n0, 0, 2 * D + c0), oo = g.token(blk.n0, 0, c0);
        const std::size_t po = g.prob(blk.n0, blk.h, 0, 0);
        // Query rows: dA, R{dA}, then dS (into work), R{dS} (into rwork) and R{dQ}.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar acc[attention_max_lanes], racc[attention_max_lanes];
          Scalar r[attention_max_lanes], rr[attention_max_lanes];
          const std::size_t end = attention_row_end(g, t);
          attention_lanes(team, blk.lanes, [&](const int l) {
            r[l] = 0;
            rr[l] = 0;
          });
          for (std::size_t s = 0; s < end; ++s) {
            attention_lanes(team, blk.lanes, [&](const int l) {
              acc[l] = 0;
              racc[l] = 0;
            });
            for (std::size_t j = 0; j < dh; ++j) {
              const std::size_t tj = N * t + NP * j, sj = N * s + NP * j;
              const Scalar *doj = dy + oo + tj, *rdoj = rdy + oo + tj;
              const Scalar *vj = x + vo + sj, *rvj = rx + vo + sj;
              attention_lanes(team, blk.lanes, [&](const int l) {
                acc[l] += doj[l] * vj[l];
                racc[l] += rdoj[l] * vj[l] + doj[l] * rvj[l];
              });
            }
            const std::size_t ts = po + NH * (t + P * s);
            const Scalar *as = a + ts, *ras = ra + ts;
            Scalar *ws = work + ts, *rws = rwork + ts;
            attention_lanes(team, blk.lanes, [&](const int l) {
              ws[l] = acc[l];
              rws[l] = racc[l];
              r[l] += acc[l] * as[l];
              rr[l] += racc[l] * as[l] + acc[l] * ras[l];
            });
          }
          for (std::size_t s = 0; s < end; ++s) {
            const std::size_t ts = po + NH * (t + P * s);
            const Scalar *as = a + ts, *ras = ra + ts;
            Scalar *ws = work + ts, *rws = rwork + ts;
            attention_lanes(team, blk.lanes, [&](const int l) {
              const Scalar da = ws[l];
              ws[l] = as[l] * (da - r[l]);
              rws[l] = ras[l] * (da - r[l]) + as[l] * (rws[l] - rr[l]);
            });
          }
          // R{dQ}[t, j] = (Σ_s R{dS}[t, s] K[s, j] + dS[t, s] R{K}[s, j])/√dh
          for (std::size_t j = 0; j < dh; ++j) {
            attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
            for (std::size_t s = 0; s < end; ++s) {
              const std::size_t ts = po + NH * (t + P * s), sj = N * s + NP * j;
              const Scalar *ws = work + ts, *rws = rwork + ts;
              const Scalar *kj = x + ko + sj, *rkj = rx + ko + sj;
              attention_lanes(team, blk.lanes,
                              [&](const int l) { acc[l] += rws[l] * kj[l] + ws[l] * rkj[l]; });
            }
            Scalar *rdqj = rdx + qo + N * t + NP * j;
            attention_lanes(team, blk.lanes, [&](const int l) { rdqj[l] = acc[l] * scale; });
          }
        });
        team.team_barrier();
        // Key rows: R{dV} = R{A}ᵀ dO + Aᵀ R{dO}, R{dK} = (R{dS}ᵀ Q + dSᵀ R{Q})/√dh.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t s) {
          Scalar acc[attention_max_lanes], acc2[attention_max_lanes];
          const std::size_t begin = g.causal ? s : 0;
          for (std::size_t j = 0; j < dh; ++j) {
            attention_lanes(team, blk.lanes, [&](const int l) {
              acc[l] = 0;
              acc2[l] = 0;
            });
            for (std::size_t t = begin; t < P; ++t) {
              const std::size_t ts = po + NH * (t + P * s), tj = N * t + NP * j;
              const Scalar *as = a + ts, *ras = ra + ts, *ws = work + ts, *rws = rwork + ts;
              const Scalar *doj = dy + oo + tj, *rdoj = rdy + oo + tj;
              const Scalar *qj = x + qo + tj, *rqj = rx + qo + tj;
              attention_lanes(team, blk.lanes, [&](const int l) {
                acc[l] += ras[l] * doj[l] + as[l] * rdoj[l];
                acc2[l] += rws[l] * qj[l] + ws[l] * rqj[l];
              });
            }
            Scalar *rdvj = rdx + vo + N * s + NP * j;
            Scalar *rdkj = rdx + ko + N * s + NP * j;
            attention_lanes(team, blk.lanes, [&](const int l) {
              rdvj[l] = acc[l];
              rdkj[l] = acc2[l] * scale;
            });
          }
        });
      });
}

} // namespace detail

/// How ScaledDotProductAttention computes its passes; both give the same results up to
/// rounding and keep A in the same layout.
///
/// Measured (BM_AttentionForwardBackward and a GPU timing of the same passes: forward +
/// backward, float, N = 128, heads 4, dh 16, P = 16 and 28, causal or not):
///  - host (AMD EPYC, 1 OpenMP thread, SSE2 code as KAT builds by default, 2026-11-26):
///    batch_lanes 13-25 GFLOP/s, batched_gemm 2.5-2.8 GFLOP/s (4.7-9.2x the time);
///  - H100 (nvcc 13.0): batched_gemm 0.12-0.27 ms (210-290 GFLOP/s), batch_lanes 1.7-9.1 ms
///    (8-16 GFLOP/s): it launches only heads·N/32 teams.
enum class AttentionKernel {
  /// batch_lanes on host backends, batched_gemm on GPUs.
  automatic,
  /// One team per (sample, head) pair running KokkosBatched team GEMMs on strided views.
  batched_gemm,
  /// One team per (head, block of consecutive samples), every loop running over the block's
  /// samples innermost (contiguous in memory): vectorized on CPUs.
  batch_lanes,
};

/// Multi-head scaled dot-product self-attention (Vaswani et al. 2017, "Attention is all you
/// need", eq. 1 and sec. 3.2.2), without the projections: the Q/K/V projection and the
/// output projection are position-wise Dense layers around it (kat::DenseInput::per_position).
///
/// Shapes: input `{3·D, H, W}`, output `{D, H, W}`, D = heads·head_dim, P = H·W positions
/// (tokens). In the (N·P) x 3D row view of the N x 3D·P batch matrix (row n + N·p is token p
/// of sample n, see kat::FeatureShape), channels [0, D) are the queries, [D, 2D) the keys and
/// [2D, 3D) the values; head h owns channels [h·dh, (h+1)·dh) of each. For sample n, head h
/// and query position t:
///
///   O[t, h·dh + j] = Σ_s A[t, s] V[s, h·dh + j],   A = softmax_s(Q_t · K_s / √dh),
///
/// with s ≤ t only when `causal` (GPT's mask: a token attends to itself and the tokens
/// before it, in the order p = h + H·w). The softmax subtracts each row's maximum, so large
/// logits do not overflow.
///
/// Work (see AttentionKernel): on host backends one team per (head, block of 32 consecutive
/// samples), every loop vectorized over the samples, which are contiguous in memory; on GPUs
/// one team per (sample, head) pair running KokkosBatched team GEMMs on strided views of x, y
/// and dx (no copies), with the softmax and its derivatives as row loops in the same kernel.
/// The probabilities A (N·heads x P x P, see probabilities()) are kept from forward() for the
/// backward and R passes. No parameters. Memory: A, and in backward one more buffer of A's
/// size (dS); the R passes keep R{A} and use one more.
///
/// R-operator (Pearlmutter 1994): forward_r gives R{O} from R{x} (R{Q}, R{K}, R{V});
/// backward_r gives R{dx} by the product rule on each backward formula.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class ScaledDotProductAttention final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  using vector_type = Vector<Scalar, MemorySpace>;

  /// @param heads     number of heads (>= 1)
  /// @param head_dim  channels per head dh (>= 1); the model width is D = heads·head_dim
  /// @param causal    mask s > t (each position attends only to itself and earlier ones)
  /// @throws ValueError if heads or head_dim is 0.
  ScaledDotProductAttention(std::size_t heads, std::size_t head_dim, bool causal = false)
      : heads_(heads), head_dim_(head_dim), causal_(causal),
        attention_("kat::nn::ScaledDotProductAttention::A"),
        work_("kat::nn::ScaledDotProductAttention::dA"),
        r_attention_("kat::nn::ScaledDotProductAttention::RA"),
        r_work_("kat::nn::ScaledDotProductAttention::RdA"),
        zero_rx_("kat::nn::ScaledDotProductAttention::zero_rx") {
    if (heads_ == 0 || head_dim_ == 0) {
      throw ValueError(kat::detail::concat("kat::nn::ScaledDotProductAttention: heads and "
                                           "head_dim must be >= 1, got heads = ",
                                           heads_, ", head_dim = ", head_dim_));
    }
  }

  std::string name() const override { return "ScaledDotProductAttention"; }
  std::size_t heads() const { return heads_; }
  std::size_t head_dim() const { return head_dim_; }
  /// D = heads·head_dim, the output channels.
  std::size_t model_dim() const { return heads_ * head_dim_; }
  bool causal() const { return causal_; }

  /// `{D, H, W}` for an input `{3·D, H, W}`.
  /// @throws ShapeError if the input channels are not 3·heads·head_dim or H, W < 1.
  FeatureShape output_shape(const FeatureShape &input) const override {
    const char *where = "kat::nn::ScaledDotProductAttention::output_shape";
    if (input.channels < 0 || static_cast<std::size_t>(input.channels) != 3 * model_dim()) {
      throw ShapeError(kat::detail::concat(
          where, ": input channels must be 3 * heads * head_dim = ", 3 * model_dim(), ", got ",
          input.channels));
    }
    if (input.height < 1 || input.width < 1) {
      throw ShapeError(
          kat::detail::concat(where, ": input height and width must be >= 1, got ", input));
    }
    return FeatureShape{static_cast<int>(model_dim()), input.height, input.width};
  }

  /// y = attention(x). x: N x 3D·P, y: N x D·P; P is read off x's columns. x must stay
  /// valid and unchanged until backward() and backward_r().
  /// @throws ShapeError if x's columns are not a positive multiple of 3·heads·head_dim, y's
  /// extents are not N x D·P, x or y is not contiguous, or, with the batched GEMM kernels, x
  /// or A has 2^31 - 1 or more entries (KokkosBatched's int offsets).
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::ScaledDotProductAttention::forward");
    const char *where = "kat::nn::ScaledDotProductAttention::forward";
    const std::size_t d3 = 3 * model_dim();
    if (x.extent(1) == 0 || x.extent(1) % d3 != 0) {
      throw ShapeError(kat::detail::concat(
          where, ": x columns must be a positive multiple of 3 * heads * head_dim = ", d3,
          " (3·D channels times H·W positions), got ", x.extent(1)));
    }
    require_contiguous(where, "x", x);
    const std::size_t positions = x.extent(1) / d3;
    if (uses_batched_gemm()) {
      // KokkosBatched indexes with int: offsets run up to the size of x and of A.
      const std::size_t limit = static_cast<std::size_t>(INT_MAX);
      const std::size_t a_size = x.extent(0) * heads_ * positions * positions;
      if (x.span() >= limit || a_size >= limit) {
        throw ShapeError(kat::detail::concat(
            where,
            ": with the batched GEMM kernels x and A (N·heads·P² entries) must have fewer "
            "than ",
            INT_MAX, " entries (KokkosBatched's int offsets), got ", x.span(), " and ", a_size));
      }
    }
    kat::detail::require_extent(where, "y rows", x.extent(0), y.extent(0));
    kat::detail::require_extent(where, "y columns", model_dim() * positions, y.extent(1));
    require_contiguous(where, "y", y);
    geometry_.batch = x.extent(0);
    geometry_.positions = positions;
    geometry_.heads = heads_;
    geometry_.head_dim = head_dim_;
    geometry_.causal = causal_;
    x_ = x;
    r_ready_ = false;
    if (geometry_.batch == 0) {
      return;
    }
    const std::size_t p = geometry_.positions;
    probabilities_ = vector_type(attention_.matrix(geometry_.pairs() * p * p, 1).data(),
                                 geometry_.pairs() * p * p);
    if (uses_batched_gemm()) {
      detail::attention_gemm_forward<execution_space, MemorySpace>(
          space, geometry_, scale(), x.data(), y.data(), probabilities_.data());
    } else {
      detail::attention_lanes_forward(space, geometry_, scale(), x.data(), y.data(),
                                      probabilities_.data());
    }
  }

  /// dx from dy (N x D·P), in the q|k|v layout of x; skipped when dx has extent 0.
  /// @throws Error before the first forward(); ShapeError if dy or dx do not match it or are
  /// not contiguous.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::ScaledDotProductAttention::backward");
    const char *where = "kat::nn::ScaledDotProductAttention::backward";
    require_forward(where);
    require_output_like(where, "dy", dy);
    if (dx.extent(0) == 0) {
      return;
    }
    require_input_like(where, "dx", dx);
    if (geometry_.batch == 0) {
      return;
    }
    const std::size_t count = probabilities_.extent(0);
    Scalar *work = work_.matrix(count, 1).data();
    if (uses_batched_gemm()) {
      detail::attention_gemm_backward<execution_space, MemorySpace>(
          space, geometry_, scale(), x_.data(), probabilities_.data(), dy.data(), dx.data(), work);
    } else {
      detail::attention_lanes_backward(space, geometry_, scale(), x_.data(), probabilities_.data(),
                                       dy.data(), dx.data(), work);
    }
  }

  /// R-operator (see Layer): parameter-free, so R{y} depends on R{x} only.
  /// One "Attention" operator {heads, head_dim, positions, causal}.
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                          const std::string &name) const override {
    return graph.add("Attention", name, {x},
                     graph_shape(graph.tensor(x).shape[0], output_shape(in)),
                     this->parameter_shapes(),
                     {{"heads", static_cast<std::int64_t>(heads_)},
                      {"head_dim", static_cast<std::int64_t>(head_dim_)},
                      {"positions", static_cast<std::int64_t>(in.height) * in.width},
                      {"causal", causal_}});
  }

  bool supports_r_operator() const override { return true; }

  /// ry = R{y} (N x D·P) for rx = R{x} (N x 3D·P; extent 0 stands for R{x} = 0), after
  /// forward(). rx must stay valid and unchanged until backward_r().
  /// @throws Error before the first forward(); ShapeError if rx or ry do not match it or are
  /// not contiguous.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::ScaledDotProductAttention::forward_r");
    const char *where = "kat::nn::ScaledDotProductAttention::forward_r";
    require_forward(where);
    require_output_like(where, "ry", ry);
    if (rx.extent(0) == 0) {
      rx_ = zero_rx_.matrix(x_.extent(0), x_.extent(1));
      Kokkos::deep_copy(space, rx_, Scalar(0));
    } else {
      require_input_like(where, "rx", rx);
      rx_ = rx;
    }
    r_ready_ = true;
    if (geometry_.batch == 0) {
      return;
    }
    const std::size_t count = probabilities_.extent(0);
    r_probabilities_ = vector_type(r_attention_.matrix(count, 1).data(), count);
    if (uses_batched_gemm()) {
      detail::attention_gemm_forward_r<execution_space, MemorySpace>(
          space, geometry_, scale(), x_.data(), rx_.data(), probabilities_.data(),
          r_probabilities_.data(), ry.data());
    } else {
      detail::attention_lanes_forward_r(space, geometry_, scale(), x_.data(), rx_.data(),
                                        probabilities_.data(), r_probabilities_.data(), ry.data());
    }
  }

  /// rdx = R{dx} (N x 3D·P; skipped when extent 0) for dy and rdy = R{dy} (N x D·P), after
  /// forward() and forward_r(). No parameters, so hv is untouched.
  /// @throws Error before forward_r(); ShapeError if dy, rdy or rdx do not match or are not
  /// contiguous.
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::ScaledDotProductAttention::backward_r");
    const char *where = "kat::nn::ScaledDotProductAttention::backward_r";
    require_forward(where);
    if (!r_ready_) {
      throw Error(kat::detail::concat(where, ": call forward_r() after forward() first"));
    }
    require_output_like(where, "dy", dy);
    require_output_like(where, "rdy", rdy);
    if (rdx.extent(0) == 0) {
      return;
    }
    require_input_like(where, "rdx", rdx);
    if (geometry_.batch == 0) {
      return;
    }
    const std::size_t count = probabilities_.extent(0);
    Scalar *work = work_.matrix(count, 1).data();
    Scalar *rwork = r_work_.matrix(count, 1).data();
    if (uses_batched_gemm()) {
      detail::attention_gemm_backward_r<execution_space, MemorySpace>(
          space, geometry_, scale(), x_.data(), rx_.data(), probabilities_.data(),
          r_probabilities_.data(), dy.data(), rdy.data(), rdx.data(), work, rwork);
    } else {
      detail::attention_lanes_backward_r(space, geometry_, scale(), x_.data(), rx_.data(),
                                         probabilities_.data(), r_probabilities_.data(), dy.data(),
                                         rdy.data(), rdx.data(), work, rwork);
    }
  }

  /// The attention probabilities A of the last forward(), N·heads·P·P values: A[t, s] of
  /// sample n and head h at n + N·(h + heads·(t + P·s)) (the batch fastest, as in the token
  /// matrices). Rows sum to 1; entries s > t are 0 when causal. Empty before the first
  /// forward().
  const vector_type &probabilities() const { return probabilities_; }

  /// Chooses the kernels of later passes (default AttentionKernel::automatic).
  void set_kernel(AttentionKernel kernel) { kernel_ = kernel; }
  AttentionKernel kernel() const { return kernel_; }
  /// Whether the passes run AttentionKernel::batched_gemm (after resolving automatic).
  bool uses_batched_gemm() const {
    switch (kernel_) {
    case AttentionKernel::batched_gemm:
      return true;
    case AttentionKernel::batch_lanes:
      return false;
    case AttentionKernel::automatic:
    default:
      return !Kokkos::SpaceAccessibility<execution_space, Kokkos::HostSpace>::accessible;
    }
  }

private:
  Scalar scale() const { return Scalar(1) / static_cast<Scalar>(std::sqrt(double(head_dim_))); }
  std::size_t out_columns() const { return model_dim() * geometry_.positions; }

  static void require_contiguous(const char *where, const char *what, const matrix_type &m) {
    if (m.extent(1) > 1 && m.stride(1) != m.extent(0)) {
      throw ShapeError(kat::detail::concat(
          where, ": ", what, " must be contiguous (column stride = rows = ", m.extent(0),
          "), got column stride ", m.stride(1)));
    }
  }
  void require_forward(const char *where) const {
    if (geometry_.heads == 0) {
      throw Error(kat::detail::concat(where, ": call forward() first"));
    }
  }
  void require_output_like(const char *where, const char *what, const matrix_type &m) const {
    kat::detail::require_extent(where, (std::string(what) + " rows").c_str(), geometry_.batch,
                                m.extent(0));
    kat::detail::require_extent(where, (std::string(what) + " columns").c_str(), out_columns(),
                                m.extent(1));
    require_contiguous(where, what, m);
  }
  void require_input_like(const char *where, const char *what, const matrix_type &m) const {
    kat::detail::require_extent(where, (std::string(what) + " rows").c_str(), geometry_.batch,
                                m.extent(0));
    kat::detail::require_extent(where, (std::string(what) + " columns").c_str(), 3 * out_columns(),
                                m.extent(1));
    require_contiguous(where, what, m);
  }

  std::size_t heads_, head_dim_;
  bool causal_;
  detail::AttentionGeometry geometry_; // of the last forward(); heads 0 before it
  matrix_type x_, rx_;
  bool r_ready_ = false;
  AttentionKernel kernel_ = AttentionKernel::automatic;
  Workspace<Scalar, MemorySpace> attention_, work_, r_attention_, r_work_, zero_rx_;
  vector_type probabilities_, r_probabilities_;
};

} // namespace kat::nn
