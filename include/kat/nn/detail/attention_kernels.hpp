#pragma once
/// @file
/// @brief Internal: the kernels of kat::nn::ScaledDotProductAttention (batched team GEMMs and
/// batch lanes, forward, backward and the R-operator), as named functors and their launchers.

#include "kat/core/math.hpp"

#include <Kokkos_Core.hpp>

#include <KokkosBatched_Gemm_Decl.hpp>

#include <cstddef>

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

/// The (sample n, head h) pair of one batched-GEMM team (team league_rank() = n + N·h) and
/// its blocks: the one team-block builder of every batched-GEMM pass.
template <class MemorySpace> struct AttentionPair {
  const AttentionGeometry &g;
  std::size_t n, h;

  template <class Member>
  KOKKOS_INLINE_FUNCTION AttentionPair(const Member &team, const AttentionGeometry &geometry)
      : g(geometry), n(team.league_rank() % geometry.batch),
        h(team.league_rank() / geometry.batch) {}

  /// The P x dh block of the head's channels in part `part` of a token matrix at `base`: 0
  /// for Q (and for y, dy and their R-images, which hold one part), 1 for K, 2 for V.
  template <class Scalar>
  KOKKOS_INLINE_FUNCTION AttentionBlock<Scalar, MemorySpace> token(Scalar *base,
                                                                   std::size_t part) const {
    return attention_token_block<MemorySpace>(base, g, n, part * g.model_dim() + h * g.head_dim);
  }
  /// The pair's P x P block in a buffer laid out as the probabilities.
  template <class Scalar>
  KOKKOS_INLINE_FUNCTION AttentionBlock<Scalar, MemorySpace> square(Scalar *base) const {
    return attention_square_block<MemorySpace>(base, g, n, h);
  }
};

using AttentionNoTrans = KokkosBatched::Trans::NoTranspose;
using AttentionTrans = KokkosBatched::Trans::Transpose;
/// Blocked (register tiles of 2 x 2 on GPUs, 4 x 4 on hosts) rather than Unblocked: faster at
/// every measured size on an H100, about the same on a host (docs/benchmarks.md, "Kernel design
/// choices, measured").
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

/// Row by row of a pair's P x P blocks: w = A ⊙ (w − rowsum(w ⊙ A)), the softmax's Jacobian
/// (symmetric) applied to w in place, then a team barrier. dS from dA in the backward, R{A}
/// from R{S} in forward_r (masked entries have A = 0, so they stay 0).
template <class Member, class ABlock, class WBlock>
KOKKOS_INLINE_FUNCTION void attention_softmax_jvp(const Member &team, std::size_t P,
                                                  const ABlock &ap, const WBlock &w) {
  using Scalar = typename WBlock::non_const_value_type;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
    Scalar r = 0;
    for (std::size_t c = 0; c < P; ++c) {
      r += w(t, c) * ap(t, c);
    }
    for (std::size_t c = 0; c < P; ++c) {
      w(t, c) = ap(t, c) * (w(t, c) - r);
    }
  });
  team.team_barrier();
}

/// Runs a batched-GEMM functor: one team per (sample, head) pair.
template <class ExecSpace, class Functor>
void attention_gemm_launch(const char *label, const ExecSpace &space, const AttentionGeometry &g,
                           const Functor &functor) {
  Kokkos::parallel_for(
      label, Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(g.pairs()), Kokkos::AUTO),
      functor);
}

/// The forward of attention_gemm_forward for the (sample, head) pair of the team.
template <class ExecSpace, class MemorySpace, class Scalar> struct AttentionGemmForward {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  Scalar *y;
  Scalar *a;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionPair<MemorySpace> pair(team, g);
    const std::size_t P = g.positions;
    const auto s = pair.square(a);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, pair.token(x, 0),
                                                          pair.token(x, 1), Scalar(0), s);
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
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), s, pair.token(x, 2),
                                                            Scalar(0), pair.token(y, 0));
  }
};

/// Forward: per pair, S = Q Kᵀ/√dh into `a`, its row softmax in place (entries s > t are 0
/// when causal), then O = A V into y.
template <class ExecSpace, class MemorySpace, class Scalar>
void attention_gemm_forward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                            const Scalar *x, Scalar *y, Scalar *a) {
  attention_gemm_launch("kat::nn::ScaledDotProductAttention::forward (batched GEMM)", space, g,
                        AttentionGemmForward<ExecSpace, MemorySpace, Scalar>{g, scale, x, y, a});
}

/// The backward of attention_gemm_backward for the (sample, head) pair of the team.
template <class ExecSpace, class MemorySpace, class Scalar> struct AttentionGemmBackward {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  const Scalar *a;
  const Scalar *dy;
  Scalar *dx;
  Scalar *work;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionPair<MemorySpace> pair(team, g);
    const auto d_o = pair.token(dy, 0);
    const auto ap = pair.square(a), ds = pair.square(work);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, Scalar(1), ap, d_o, Scalar(0),
                                                          pair.token(dx, 2));
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), d_o, pair.token(x, 2),
                                                          Scalar(0), ds);
    attention_softmax_jvp(team, g.positions, ap, ds);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, ds, pair.token(x, 1),
                                                            Scalar(0), pair.token(dx, 0));
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, ds, pair.token(x, 0),
                                                          Scalar(0), pair.token(dx, 1));
  }
};

/// Backward: per pair, dV = Aᵀ dO, dA = dO Vᵀ (into `work`), dS = A ⊙ (dA − rowsum(dA ⊙ A))
/// in place, dQ = dS K/√dh, dK = dSᵀ Q/√dh, into dx in the q|k|v layout.
template <class ExecSpace, class MemorySpace, class Scalar>
void attention_gemm_backward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                             const Scalar *x, const Scalar *a, const Scalar *dy, Scalar *dx,
                             Scalar *work) {
  attention_gemm_launch(
      "kat::nn::ScaledDotProductAttention::backward (batched GEMM)", space, g,
      AttentionGemmBackward<ExecSpace, MemorySpace, Scalar>{g, scale, x, a, dy, dx, work});
}

/// R{A} and R{O} of attention_gemm_forward_r for the (sample, head) pair of the team.
template <class ExecSpace, class MemorySpace, class Scalar> struct AttentionGemmForwardR {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  const Scalar *rx;
  const Scalar *a;
  Scalar *ra;
  Scalar *ry;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionPair<MemorySpace> pair(team, g);
    const auto ap = pair.square(a), rs = pair.square(ra);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, pair.token(rx, 0),
                                                          pair.token(x, 1), Scalar(0), rs);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, pair.token(x, 0),
                                                          pair.token(rx, 1), Scalar(1), rs);
    attention_softmax_jvp(team, g.positions, ap, rs);
    const auto ro = pair.token(ry, 0);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), rs, pair.token(x, 2),
                                                            Scalar(0), ro);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), ap, pair.token(rx, 2),
                                                            Scalar(1), ro);
  }
};

/// R-operator of the forward: per pair, R{S} = (R{Q}Kᵀ + Q R{K}ᵀ)/√dh, R{A} = A ⊙ (R{S} −
/// rowsum(A ⊙ R{S})) into `ra`, R{O} = R{A} V + A R{V} into ry.
template <class ExecSpace, class MemorySpace, class Scalar>
void attention_gemm_forward_r(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                              const Scalar *x, const Scalar *rx, const Scalar *a, Scalar *ra,
                              Scalar *ry) {
  attention_gemm_launch(
      "kat::nn::ScaledDotProductAttention::forward_r (batched GEMM)", space, g,
      AttentionGemmForwardR<ExecSpace, MemorySpace, Scalar>{g, scale, x, rx, a, ra, ry});
}

/// R{dx} of attention_gemm_backward_r for the (sample, head) pair of the team.
template <class ExecSpace, class MemorySpace, class Scalar> struct AttentionGemmBackwardR {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  const Scalar *rx;
  const Scalar *a;
  const Scalar *ra;
  const Scalar *dy;
  const Scalar *rdy;
  Scalar *rdx;
  Scalar *work;
  Scalar *rwork;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionPair<MemorySpace> pair(team, g);
    const std::size_t P = g.positions;
    const auto v = pair.token(x, 2), rv = pair.token(rx, 2);
    const auto d_o = pair.token(dy, 0), rdo = pair.token(rdy, 0);
    const auto ap = pair.square(a), rap = pair.square(ra);
    const auto ds = pair.square(work), rds = pair.square(rwork);
    const auto rdv = pair.token(rdx, 2);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, Scalar(1), rap, d_o, Scalar(0),
                                                          rdv);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, Scalar(1), ap, rdo, Scalar(1), rdv);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), d_o, v, Scalar(0), ds);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), rdo, v, Scalar(0), rds);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), d_o, rv, Scalar(1), rds);
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
    const auto q = pair.token(x, 0), k = pair.token(x, 1);
    const auto rq = pair.token(rx, 0), rk = pair.token(rx, 1);
    const auto rdq = pair.token(rdx, 0), rdk = pair.token(rdx, 1);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, rds, k, Scalar(0), rdq);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, ds, rk, Scalar(1), rdq);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, rds, q, Scalar(0), rdk);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, ds, rq, Scalar(1), rdk);
  }
};

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
  attention_gemm_launch("kat::nn::ScaledDotProductAttention::backward_r (batched GEMM)", space, g,
                        AttentionGemmBackwardR<ExecSpace, MemorySpace, Scalar>{
                            g, scale, x, rx, a, ra, dy, rdy, rdx, work, rwork});
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

/// Where one team's block is: head h, samples [n0, n0 + lanes); the team-block builder of
/// every batch-lanes pass.
struct AttentionLaneBlock {
  std::size_t h, n0;
  int lanes;

  /// Offset of the block's first sample at position 0 in the head's channels of part `part`
  /// of a token matrix: 0 for Q (and for y, dy and their R-images), 1 for K, 2 for V.
  KOKKOS_INLINE_FUNCTION std::size_t token(const AttentionGeometry &g, std::size_t part) const {
    return g.token(n0, 0, part * g.model_dim() + h * g.head_dim);
  }
  /// Offset of A[0, 0] of the block's first sample and head in the probabilities' layout.
  KOKKOS_INLINE_FUNCTION std::size_t prob(const AttentionGeometry &g) const {
    return g.prob(n0, h, 0, 0);
  }
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

/// Runs a batch-lanes functor (which has a member `int block`, set here to
/// attention_lane_block()): one team per (head, block of samples).
template <class ExecSpace, class Functor>
void attention_lanes_launch(const char *label, const ExecSpace &space, const AttentionGeometry &g,
                            Functor functor) {
  const int block = attention_lane_block<ExecSpace>();
  functor.block = block;
  const std::size_t blocks = (g.batch + block - 1) / block;
  const bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  Kokkos::parallel_for(label,
                       Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(g.heads * blocks),
                                                     Kokkos::AUTO, host ? 1 : block),
                       functor);
}

/// A and O of attention_lanes_forward for the team's head and block of samples.
template <class ExecSpace, class Scalar> struct AttentionLanesForward {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  Scalar *y;
  Scalar *a;
  int block;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
    const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
    const Scalar *q = x + blk.token(g, 0), *k = x + blk.token(g, 1), *v = x + blk.token(g, 2);
    Scalar *o = y + blk.token(g, 0);
    Scalar *ap = a + blk.prob(g);
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
        attention_lanes(team, blk.lanes, [&](const int l) { m[l] = as[l] > m[l] ? as[l] : m[l]; });
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
  }
};

template <class ExecSpace, class Scalar>
void attention_lanes_forward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                             const Scalar *x, Scalar *y, Scalar *a) {
  attention_lanes_launch("kat::nn::ScaledDotProductAttention::forward (batch lanes)", space, g,
                         AttentionLanesForward<ExecSpace, Scalar>{g, scale, x, y, a, 0});
}

/// dx of attention_lanes_backward for the team's head and block of samples.
template <class ExecSpace, class Scalar> struct AttentionLanesBackward {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  const Scalar *a;
  const Scalar *dy;
  Scalar *dx;
  Scalar *work;
  int block;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
    const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
    const Scalar *q = x + blk.token(g, 0), *k = x + blk.token(g, 1), *v = x + blk.token(g, 2);
    const Scalar *d_o = dy + blk.token(g, 0);
    Scalar *dq = dx + blk.token(g, 0), *dk = dx + blk.token(g, 1), *dv = dx + blk.token(g, 2);
    const Scalar *ap = a + blk.prob(g);
    Scalar *wp = work + blk.prob(g);
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
  }
};

template <class ExecSpace, class Scalar>
void attention_lanes_backward(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                              const Scalar *x, const Scalar *a, const Scalar *dy, Scalar *dx,
                              Scalar *work) {
  attention_lanes_launch(
      "kat::nn::ScaledDotProductAttention::backward (batch lanes)", space, g,
      AttentionLanesBackward<ExecSpace, Scalar>{g, scale, x, a, dy, dx, work, 0});
}

/// R{A} and R{O} of attention_lanes_forward_r for the team's head and block of samples.
template <class ExecSpace, class Scalar> struct AttentionLanesForwardR {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  const Scalar *rx;
  const Scalar *a;
  Scalar *ra;
  Scalar *ry;
  int block;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
    const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
    const std::size_t qo = blk.token(g, 0), ko = blk.token(g, 1), vo = blk.token(g, 2);
    const Scalar *ap = a + blk.prob(g);
    Scalar *rap = ra + blk.prob(g);
    Scalar *ro = ry + qo;
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
        attention_lanes(team, blk.lanes, [&](const int l) { ras[l] = as[l] * (ras[l] - r[l]); });
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
  }
};

template <class ExecSpace, class Scalar>
void attention_lanes_forward_r(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                               const Scalar *x, const Scalar *rx, const Scalar *a, Scalar *ra,
                               Scalar *ry) {
  attention_lanes_launch("kat::nn::ScaledDotProductAttention::forward_r (batch lanes)", space, g,
                         AttentionLanesForwardR<ExecSpace, Scalar>{g, scale, x, rx, a, ra, ry, 0});
}

/// R{dx} of attention_lanes_backward_r for the team's head and block of samples.
template <class ExecSpace, class Scalar> struct AttentionLanesBackwardR {
  AttentionGeometry g;
  Scalar scale;
  const Scalar *x;
  const Scalar *rx;
  const Scalar *a;
  const Scalar *ra;
  const Scalar *dy;
  const Scalar *rdy;
  Scalar *rdx;
  Scalar *work;
  Scalar *rwork;
  int block;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionLaneBlock blk = attention_lane_block_of(team, g, block);
    const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
    const std::size_t qo = blk.token(g, 0), ko = blk.token(g, 1), vo = blk.token(g, 2), oo = qo;
    const std::size_t po = blk.prob(g);
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
  }
};

template <class ExecSpace, class Scalar>
void attention_lanes_backward_r(const ExecSpace &space, const AttentionGeometry &g, Scalar scale,
                                const Scalar *x, const Scalar *rx, const Scalar *a,
                                const Scalar *ra, const Scalar *dy, const Scalar *rdy, Scalar *rdx,
                                Scalar *work, Scalar *rwork) {
  attention_lanes_launch("kat::nn::ScaledDotProductAttention::backward_r (batch lanes)", space, g,
                         AttentionLanesBackwardR<ExecSpace, Scalar>{g, scale, x, rx, a, ra, dy, rdy,
                                                                    rdx, work, rwork, 0});
}

} // namespace detail

} // namespace kat::nn
