#pragma once
/// @file
/// @brief Internal: the kernels of kat::nn::ScaledDotProductAttention (batched team GEMMs and
/// batch lanes, forward, backward and the R-operator), as named functors and their launchers.

#include "kat/core/detail/float_math.hpp"
#include "kat/core/detail/unroll.hpp"
#include "kat/core/host_isa.hpp"
#include "kat/core/math.hpp"

#include <Kokkos_Core.hpp>

#include <KokkosBatched_Gemm_Decl.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#if KAT_HOST_ISA_DISPATCH
#include <immintrin.h>
#endif

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

/// A full block's sample count as a compile-time constant (host backends).
using AttentionFullLanes = std::integral_constant<int, attention_max_lanes>;

/// The loop over a block's samples: vector lanes on GPUs, a plain (vectorizable) loop on
/// host backends.
template <class Member, class F>
KOKKOS_INLINE_FUNCTION void attention_lanes(const Member &team, int lanes, const F &f) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lanes), f);
}

/// The loop over a full block's samples on a host: a trip count known at compile time, so
/// GCC vectorizes it without a remainder and keeps the accumulators in registers. A loop of
/// runtime length, four 8-float vectors long, spent its hottest instructions in the checks
/// around them: forward + backward took a fifth less time so (docs/benchmarks.md, "Kernel
/// design choices, measured").
template <class Member, class F>
KOKKOS_INLINE_FUNCTION void attention_lanes(const Member &, AttentionFullLanes, const F &f) {
  for (int l = 0; l < attention_max_lanes; ++l) {
    f(l);
  }
}

/// Where one team's block is: head h, samples [n0, n0 + lanes); the team-block builder of
/// every batch-lanes pass. Lanes is int, or AttentionFullLanes for a full block on a host.
template <class Lanes = int> struct AttentionLaneBlock {
  std::size_t h, n0;
  Lanes lanes;

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

/// A block's sample count as an int, for a runtime count or AttentionFullLanes alike
/// (integral_constant's conversion is a host function, which nvcc will not call from a
/// KOKKOS_INLINE_FUNCTION).
KOKKOS_INLINE_FUNCTION int attention_lane_count(int lanes) { return lanes; }
KOKKOS_INLINE_FUNCTION int attention_lane_count(AttentionFullLanes) { return attention_max_lanes; }

template <class Member>
KOKKOS_INLINE_FUNCTION AttentionLaneBlock<>
attention_lane_block_of(const Member &team, const AttentionGeometry &g, int block) {
  const std::size_t blocks = (g.batch + block - 1) / block;
  const std::size_t h = team.league_rank() / blocks;
  const std::size_t n0 = (team.league_rank() % blocks) * std::size_t(block);
  const std::size_t left = g.batch - n0;
  return {h, n0, left < std::size_t(block) ? int(left) : block};
}

/// One product of a host batch-lanes chunk, the same for each of its samples: C[i, k] =
/// alpha Σ_{r < depth} A[i, r] B[r, k], with the vector of element (i, r) of A at
/// a + i·a_row + r·a_dep (B's and C's alike), its W samples (the chunk width) contiguous.
template <class Scalar> struct AttentionLaneGemm {
  const Scalar *a;
  std::size_t a_row, a_dep;
  const Scalar *b;
  std::size_t b_dep, b_col;
  Scalar *c;
  std::size_t c_row, c_col;
  std::size_t depth;
  Scalar alpha;
};

/// Register tile of the host's batch-lanes products: attention_tile_rows x attention_tile_cols
/// outputs of one sample vector each, 2 + 8 vector loads per 8 fused multiply-adds (a dot
/// product at a time took 2 per multiply-add). 2 x 4 accumulators and the 2 loaded vectors of A
/// fit AVX2's 16 registers (and, of 16 floats, AVX-512's 32).
constexpr int attention_tile_rows = 2;
constexpr int attention_tile_cols = 4;
/// Samples per vector of the host's tiles in the copy compiled for the build's -march: 8
/// floats, one AVX2 register (the build's baseline, docs/backends.md). Each chunk of a team's
/// block packs this many samples; W, the chunk width of the host functions below, is this or
/// attention_avx512_width.
constexpr int attention_tile_width = 8;
/// The chunk width of the AVX-512 copy of the host kernels (kat/core/host_isa.hpp): one 512-bit
/// register of Scalar (16 floats). Each sample's arithmetic is the same in either copy, in the
/// same order, so both give the same bits; the wider copy runs where host_vector_isa() is
/// avx512 and the width differs from attention_tile_width (float; attention_run).
template <class Scalar> constexpr int attention_avx512_width = 64 / int(sizeof(Scalar));

/// The body of attention_lane_tile: columns [0, K) of rows [0, I) of a product with chunks of
/// W samples (AttentionLaneGemm's operands, passed one by one: read through a struct in the
/// loop, GCC 12 kept the accumulators in memory).
template <int W, int I, int K, class Scalar>
KOKKOS_FORCEINLINE_FUNCTION void
attention_lane_tile_body(const Scalar *a, std::size_t a_row, std::size_t a_dep, const Scalar *b,
                         std::size_t b_dep, std::size_t b_col, Scalar *c, std::size_t c_row,
                         std::size_t c_col, std::size_t depth, Scalar alpha) {
  Scalar acc[I][K][W];
  KAT_IMPL_UNROLL
  for (int i = 0; i < I; ++i) {
    KAT_IMPL_UNROLL
    for (int k = 0; k < K; ++k) {
      for (int l = 0; l < W; ++l) {
        acc[i][k][l] = Scalar(0);
      }
    }
  }
  for (std::size_t r = 0; r < depth; ++r, a += a_dep, b += b_dep) {
    KAT_IMPL_UNROLL
    for (int i = 0; i < I; ++i) {
      KAT_IMPL_UNROLL
      for (int k = 0; k < K; ++k) {
        for (int l = 0; l < W; ++l) {
#if KAT_HOST_ISA_DISPATCH
          // Fused explicitly: GCC contracts a * b + acc into one only when optimizing, and the
          // AVX-512 copy's intrinsics always fuse; both copies must give the same bits at -O0.
          acc[i][k][l] = std::fma(a[i * a_row + l], b[k * b_col + l], acc[i][k][l]);
#else
          acc[i][k][l] += a[i * a_row + l] * b[k * b_col + l];
#endif
        }
      }
    }
  }
  KAT_IMPL_UNROLL
  for (int i = 0; i < I; ++i) {
    KAT_IMPL_UNROLL
    for (int k = 0; k < K; ++k) {
      for (int l = 0; l < W; ++l) {
        c[i * c_row + k * c_col + l] = alpha * acc[i][k][l];
      }
    }
  }
}

/// attention_lane_tile_body out of line: a register tile is a function of its own (inlined into
/// its callers' loops, GCC kept fewer of the accumulators in registers).
template <int W, int I, int K, class Scalar>
KAT_IMPL_HOST_NOINLINE KOKKOS_INLINE_FUNCTION void
attention_lane_tile(const Scalar *a, std::size_t a_row, std::size_t a_dep, const Scalar *b,
                    std::size_t b_dep, std::size_t b_col, Scalar *c, std::size_t c_row,
                    std::size_t c_col, std::size_t depth, Scalar alpha) {
  attention_lane_tile_body<W, I, K>(a, a_row, a_dep, b, b_dep, b_col, c, c_row, c_col, depth,
                                    alpha);
}

#if KAT_HOST_ISA_DISPATCH
/// attention_lane_tile of 16-float chunks compiled for AVX-512, one zmm register a vector (the
/// AVX-512 copy's tiles: `flatten` does not inline a noinline function, so the copy calls this
/// one). Written with intrinsics: GCC 12 vectorized attention_lane_tile_body at this width with
/// a vpermd on every load, 4 times slower than the AVX2 tile. Each output is the same chain of
/// fused multiply-adds as there, then one multiplication by alpha: the same bits.
template <int I, int K>
__attribute__((noinline)) KAT_IMPL_AVX512_TARGET void
attention_lane_tile_avx512(const float *a, std::size_t a_row, std::size_t a_dep, const float *b,
                           std::size_t b_dep, std::size_t b_col, float *c, std::size_t c_row,
                           std::size_t c_col, std::size_t depth, float alpha) {
  __m512 acc[I][K];
  for (int i = 0; i < I; ++i) {
    for (int k = 0; k < K; ++k) {
      acc[i][k] = _mm512_setzero_ps();
    }
  }
  for (std::size_t r = 0; r < depth; ++r, a += a_dep, b += b_dep) {
    __m512 av[I];
    for (int i = 0; i < I; ++i) {
      av[i] = _mm512_loadu_ps(a + i * a_row);
    }
    for (int k = 0; k < K; ++k) {
      const __m512 bv = _mm512_loadu_ps(b + k * b_col);
      for (int i = 0; i < I; ++i) {
        acc[i][k] = _mm512_fmadd_ps(av[i], bv, acc[i][k]);
      }
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int i = 0; i < I; ++i) {
    for (int k = 0; k < K; ++k) {
      _mm512_storeu_ps(c + i * c_row + k * c_col, _mm512_mul_ps(scale, acc[i][k]));
    }
  }
}
#endif

/// The tile of W-sample chunks: the AVX-512 copy's for attention_avx512_width where the build
/// carries it, else attention_lane_tile.
template <int W, int I, int K, class Scalar>
KOKKOS_INLINE_FUNCTION void attention_tile_call(const AttentionLaneGemm<Scalar> &g,
                                                std::size_t k0) {
#if KAT_HOST_ISA_DISPATCH
  if constexpr (W != attention_tile_width) { // float chunks of 16 (attention_avx512_width)
    static_assert(W == 16 && std::is_same_v<Scalar, float>, "the AVX-512 tiles are float's");
    attention_lane_tile_avx512<I, K>(g.a, g.a_row, g.a_dep, g.b + k0 * g.b_col, g.b_dep, g.b_col,
                                     g.c + k0 * g.c_col, g.c_row, g.c_col, g.depth, g.alpha);
    return;
  }
#endif
  attention_lane_tile<W, I, K>(g.a, g.a_row, g.a_dep, g.b + k0 * g.b_col, g.b_dep, g.b_col,
                               g.c + k0 * g.c_col, g.c_row, g.c_col, g.depth, g.alpha);
}

/// Columns [0, cols) of rows [0, I) of g's product in chunks of W samples: tiles of
/// attention_tile_cols columns, then one column at a time.
template <int W, int I, class Scalar>
KOKKOS_INLINE_FUNCTION void attention_lane_rows(const AttentionLaneGemm<Scalar> &g,
                                                std::size_t cols) {
  constexpr int K = attention_tile_cols;
  std::size_t k0 = 0;
  for (; k0 + K <= cols; k0 += K) {
    attention_tile_call<W, I, K>(g, k0);
  }
  for (; k0 < cols; ++k0) {
    attention_tile_call<W, I, 1>(g, k0);
  }
}

/// The buffers and constants of one attention pass (one struct for all four, so the kernels
/// and their launch are shared): each pass reads and writes the ones its doc names.
template <class Scalar> struct AttentionArgs {
  AttentionGeometry g;
  Scalar scale = 0;                           ///< 1/√dh
  const Scalar *x = nullptr;                  ///< N x 3D·P, q|k|v
  const Scalar *rx = nullptr;                 ///< R{x}
  Scalar *a = nullptr;                        ///< the probabilities A (forward writes them)
  Scalar *ra = nullptr;                       ///< R{A} (forward_r writes them)
  const Scalar *dy = nullptr, *rdy = nullptr; ///< dy and R{dy}, N x D·P
  Scalar *out = nullptr;                      ///< y, dx, R{y} or R{dx}
  Scalar *work = nullptr, *rwork = nullptr;   ///< A-sized scratch: dA/dS and R{dA}/R{dS}
};

// ---------------------------------------------------------------------------------------------
// Host batch lanes: a team's block of samples in chunks of W samples (attention_tile_width, or
// attention_avx512_width in the AVX-512 copy), the head's
// blocks of Q, K, V (and dO, A) copied into the team's scratch as [row][column][sample], so that
// the register tiles read contiguous vectors. Read in place, the token matrices' column stride
// N·P (8 KB for the ViT's batch of 128) put a head's columns on a few L1 sets, and the tiles
// waited on the caches below (docs/benchmarks.md, "Kernel design choices, measured").
// ---------------------------------------------------------------------------------------------

/// Copies a rows x cols block of sample vectors for the block's `lanes` samples into the chunks:
/// chunk q's copy of element (r, c), samples [q·W, q·W + W), is at dst + q·stride +
/// (r·cols + c)·W, from src + r·row + c·col + q·W. A partial chunk's missing samples are 0, so
/// that its unused lanes stay finite. Each element's samples are read in one pass (128 bytes
/// for a full block of floats), not a chunk's W at a time.
template <int W, class Scalar>
KOKKOS_INLINE_FUNCTION void attention_pack(const Scalar *src, std::size_t row, std::size_t col,
                                           std::size_t rows, std::size_t cols, int lanes,
                                           Scalar *dst, std::size_t stride) {
  for (std::size_t c = 0; c < cols; ++c) {
    for (std::size_t r = 0; r < rows; ++r) {
      const Scalar *from = src + r * row + c * col;
      Scalar *to = dst + (r * cols + c) * W;
      int l0 = 0;
      for (; l0 + W <= lanes; l0 += W, to += stride) {
        for (int l = 0; l < W; ++l) {
          to[l] = from[l0 + l];
        }
      }
      if (l0 < lanes) {
        for (int l = 0; l < W; ++l) {
          to[l] = l0 + l < lanes ? from[l0 + l] : Scalar(0);
        }
      }
    }
  }
}

/// The reverse of attention_pack for the block's `lanes` samples.
template <int W, class Scalar>
KOKKOS_INLINE_FUNCTION void attention_unpack(const Scalar *src, std::size_t stride,
                                             std::size_t rows, std::size_t cols, int lanes,
                                             Scalar *dst, std::size_t row, std::size_t col) {
  for (std::size_t c = 0; c < cols; ++c) {
    for (std::size_t r = 0; r < rows; ++r) {
      const Scalar *from = src + (r * cols + c) * W;
      Scalar *to = dst + r * row + c * col;
      int l0 = 0;
      for (; l0 + W <= lanes; l0 += W, from += stride) {
        for (int l = 0; l < W; ++l) {
          to[l0 + l] = from[l];
        }
      }
      for (int l = 0; l0 + l < lanes; ++l) {
        to[l0 + l] = from[l];
      }
    }
  }
}

/// rows(std::integral_constant<int, I>, r0) for r0 = 0, I, 2I, ... < count with
/// I = attention_tile_rows, then I = 1 for the rows left.
template <class Rows>
KOKKOS_INLINE_FUNCTION void attention_host_row_tiles(std::size_t count, const Rows &rows) {
  constexpr int I = attention_tile_rows;
  std::size_t r0 = 0;
  for (; r0 + I <= count; r0 += I) {
    rows(std::integral_constant<int, I>(), r0);
  }
  for (; r0 < count; ++r0) {
    rows(std::integral_constant<int, 1>(), r0);
  }
}

/// The packed blocks of one chunk of `width` samples: P x dh for tokens, P x P for A and dS
/// (width 1: the scalars per sample).
struct AttentionChunkSizes {
  std::size_t token, square;
  KOKKOS_INLINE_FUNCTION AttentionChunkSizes(const AttentionGeometry &g, int width)
      : token(g.positions * g.head_dim * std::size_t(width)),
        square(g.positions * g.positions * std::size_t(width)) {}
};

/// Copies the head's Q, K and V for samples [n0, n0 + lanes) into each chunk's first three
/// token blocks (forward and backward alike).
template <int W, class Scalar>
KOKKOS_INLINE_FUNCTION void attention_pack_qkv(const AttentionArgs<Scalar> &p, std::size_t h,
                                               std::size_t n0, int lanes, Scalar *scratch,
                                               std::size_t stride) {
  const AttentionGeometry &g = p.g;
  const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, d = g.model_dim();
  const std::size_t token = AttentionChunkSizes(g, W).token;
  for (std::size_t part = 0; part < 3; ++part) {
    attention_pack<W>(p.x + g.token(n0, 0, part * d + h * dh), N, N * P, P, dh, lanes,
                      scratch + part * token, stride);
  }
}

/// Forward of a block (head h, samples [n0, n0 + lanes)) in chunks of W samples: S = Q Kᵀ/√dh,
/// its row softmax, O = A V, all on the packed copies; writes A and y. Scratch per chunk:
/// 4 token blocks and 1 square.
template <int W, class Scalar>
KOKKOS_INLINE_FUNCTION void attention_forward_block(const AttentionArgs<Scalar> &p, std::size_t h,
                                                    std::size_t n0, int lanes, Scalar *scratch) {
  const AttentionGeometry &g = p.g;
  const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
  const AttentionChunkSizes size(g, W);
  const std::size_t stride = 4 * size.token + size.square;
  const std::size_t k_at = size.token, v_at = 2 * size.token, o_at = 3 * size.token;
  const std::size_t s_at = 4 * size.token;
  attention_pack_qkv<W>(p, h, n0, lanes, scratch, stride);
  for (int l0 = 0; l0 < lanes; l0 += W) {
    Scalar *qp = scratch + std::size_t(l0 / W) * stride, *kp = qp + k_at, *vp = qp + v_at;
    Scalar *op = qp + o_at, *sp = qp + s_at;
    attention_host_row_tiles(P, [&](auto rows, const std::size_t t0) {
      constexpr int I = decltype(rows)::value;
      const std::size_t end = attention_row_end(g, t0 + I - 1);
      attention_lane_rows<W, I>(AttentionLaneGemm<Scalar>{qp + t0 * dh * W, dh * W, W, kp, W,
                                                          dh * W, sp + t0 * P * W, P * W, W, dh,
                                                          p.scale},
                                end);
      for (std::size_t t = t0; t < t0 + I; ++t) {
        // the stable softmax of row t over s < its end, 0 from there on
        const std::size_t row_end = attention_row_end(g, t);
        Scalar *st = sp + t * P * W;
        Scalar m[W], sum[W];
        for (int l = 0; l < W; ++l) {
          m[l] = st[l];
          sum[l] = 0;
        }
        for (std::size_t s = 1; s < row_end; ++s) {
          for (int l = 0; l < W; ++l) {
            m[l] = st[s * W + l] > m[l] ? st[s * W + l] : m[l];
          }
        }
        for (std::size_t s = 0; s < row_end; ++s) {
          for (int l = 0; l < W; ++l) {
            const Scalar e = math::detail::exp_vectorizable(st[s * W + l] - m[l]);
            st[s * W + l] = e;
            sum[l] += e;
          }
        }
        for (int l = 0; l < W; ++l) {
          m[l] = Scalar(1) / sum[l];
        }
        for (std::size_t s = 0; s < row_end; ++s) {
          for (int l = 0; l < W; ++l) {
            st[s * W + l] *= m[l];
          }
        }
        for (std::size_t s = row_end; s < P; ++s) {
          for (int l = 0; l < W; ++l) {
            st[s * W + l] = Scalar(0);
          }
        }
      }
      attention_lane_rows<W, I>(AttentionLaneGemm<Scalar>{sp + t0 * P * W, P * W, W, vp, dh * W, W,
                                                          op + t0 * dh * W, dh * W, W, end,
                                                          Scalar(1)},
                                dh);
    });
  }
  attention_unpack<W>(scratch + o_at, stride, P, dh, lanes, p.out + g.token(n0, 0, h * dh), N, NP);
  attention_unpack<W>(scratch + s_at, stride, P, P, lanes, p.a + g.prob(n0, h, 0, 0), NH, NH * P);
}

/// Backward of a block in chunks of W samples: dA = dO Vᵀ, dS = A ⊙ (dA − rowsum(dA ⊙ A)),
/// dQ = dS K/√dh, dV = Aᵀ dO, dK = dSᵀ Q/√dh on the packed copies; writes dx. Scratch per
/// chunk: 7 token blocks and 2 squares.
template <int W, class Scalar>
KOKKOS_INLINE_FUNCTION void attention_backward_block(const AttentionArgs<Scalar> &p, std::size_t h,
                                                     std::size_t n0, int lanes, Scalar *scratch) {
  const AttentionGeometry &g = p.g;
  const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
  const AttentionChunkSizes size(g, W);
  const std::size_t stride = 7 * size.token + 2 * size.square, tk = size.token;
  const std::size_t d = g.model_dim();
  attention_pack_qkv<W>(p, h, n0, lanes, scratch, stride);
  attention_pack<W>(p.dy + g.token(n0, 0, h * dh), N, NP, P, dh, lanes, scratch + 3 * tk, stride);
  attention_pack<W>(p.a + g.prob(n0, h, 0, 0), NH, NH * P, P, P, lanes, scratch + 7 * tk, stride);
  for (int l0 = 0; l0 < lanes; l0 += W) {
    Scalar *qp = scratch + std::size_t(l0 / W) * stride, *kp = qp + tk, *vp = kp + tk;
    Scalar *dop = vp + tk, *dqp = dop + tk, *dkp = dqp + tk, *dvp = dkp + tk;
    Scalar *ap = dvp + tk, *dsp = ap + size.square;
    // Query rows: dA, dS (0 where masked), dQ.
    attention_host_row_tiles(P, [&](auto rows, const std::size_t t0) {
      constexpr int I = decltype(rows)::value;
      const std::size_t end = attention_row_end(g, t0 + I - 1);
      attention_lane_rows<W, I>(AttentionLaneGemm<Scalar>{dop + t0 * dh * W, dh * W, W, vp, W,
                                                          dh * W, dsp + t0 * P * W, P * W, W, dh,
                                                          Scalar(1)},
                                end);
      for (std::size_t t = t0; t < t0 + I; ++t) {
        const std::size_t row_end = attention_row_end(g, t);
        Scalar *wt = dsp + t * P * W;
        const Scalar *at = ap + t * P * W;
        Scalar r[W];
        for (int l = 0; l < W; ++l) {
          r[l] = 0;
        }
        for (std::size_t s = 0; s < row_end; ++s) {
          for (int l = 0; l < W; ++l) {
            r[l] += wt[s * W + l] * at[s * W + l];
          }
        }
        for (std::size_t s = 0; s < row_end; ++s) {
          for (int l = 0; l < W; ++l) {
            wt[s * W + l] = at[s * W + l] * (wt[s * W + l] - r[l]);
          }
        }
        for (std::size_t s = row_end; s < P; ++s) {
          for (int l = 0; l < W; ++l) {
            wt[s * W + l] = Scalar(0);
          }
        }
      }
      attention_lane_rows<W, I>(AttentionLaneGemm<Scalar>{dsp + t0 * P * W, P * W, W, kp, dh * W, W,
                                                          dqp + t0 * dh * W, dh * W, W, end,
                                                          p.scale},
                                dh);
    });
    // Key rows: dV = Aᵀ dO and dK = dSᵀ Q/√dh over the queries t that see key s0 (A and dS are
    // 0 where a query does not see a key).
    attention_host_row_tiles(P, [&](auto rows, const std::size_t s0) {
      constexpr int I = decltype(rows)::value;
      const std::size_t begin = g.causal ? s0 : 0;
      attention_lane_rows<W, I>(
          AttentionLaneGemm<Scalar>{ap + (begin * P + s0) * W, W, P * W, dop + begin * dh * W,
                                    dh * W, W, dvp + s0 * dh * W, dh * W, W, P - begin, Scalar(1)},
          dh);
      attention_lane_rows<W, I>(
          AttentionLaneGemm<Scalar>{dsp + (begin * P + s0) * W, W, P * W, qp + begin * dh * W,
                                    dh * W, W, dkp + s0 * dh * W, dh * W, W, P - begin, p.scale},
          dh);
    });
  }
  attention_unpack<W>(scratch + 4 * tk, stride, P, dh, lanes, p.out + g.token(n0, 0, h * dh), N,
                      NP);
  attention_unpack<W>(scratch + 5 * tk, stride, P, dh, lanes, p.out + g.token(n0, 0, d + h * dh), N,
                      NP);
  attention_unpack<W>(scratch + 6 * tk, stride, P, dh, lanes,
                      p.out + g.token(n0, 0, 2 * d + h * dh), N, NP);
}

/// The team's scratch for `per_sample` scalars per sample of a full block of
/// attention_max_lanes (the same for every chunk width).
template <class Scalar, class Member>
KOKKOS_INLINE_FUNCTION Scalar *attention_host_scratch(const Member &team, std::size_t per_sample) {
  return static_cast<Scalar *>(
      team.team_scratch(0).get_shmem(sizeof(Scalar) * per_sample * attention_max_lanes));
}

// ---------------------------------------------------------------------------------------------
// The four passes, each as both kernel families: gemm(team, p, pair) for the (sample, head)
// pair of a batched-GEMM team, lanes(team, p, blk) for the head and block of samples of a
// batch-lanes team.
// ---------------------------------------------------------------------------------------------

/// Forward: S = Q Kᵀ/√dh into A, its row softmax in place (entries s > t are 0 when causal),
/// then O = A V into `out` (y). Reads x; writes a and out.
struct AttentionForwardPass {
  static constexpr const char *label = "kat::nn::ScaledDotProductAttention::forward";

  template <class Member, class Scalar, class MemorySpace>
  KOKKOS_INLINE_FUNCTION static void gemm(const Member &team, const AttentionArgs<Scalar> &p,
                                          const AttentionPair<MemorySpace> &pair) {
    const AttentionGeometry &g = p.g;
    const Scalar scale = p.scale;
    const std::size_t P = g.positions;
    const auto s = pair.square(p.a);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, pair.token(p.x, 0),
                                                          pair.token(p.x, 1), Scalar(0), s);
    // Numerically stable softmax over the keys of each query t: subtract the row max.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
      const std::size_t end = attention_row_end(g, t);
      Scalar m = s(t, 0);
      for (std::size_t c = 1; c < end; ++c) {
        m = s(t, c) > m ? s(t, c) : m;
      }
      Scalar sum = 0;
      for (std::size_t c = 0; c < end; ++c) {
        const Scalar e = math::detail::exp_vectorizable(s(t, c) - m);
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
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), s, pair.token(p.x, 2),
                                                            Scalar(0), pair.token(p.out, 0));
  }

  /// Scratch of the host kernels per sample, in scalars: 4 token blocks and 1 square.
  KOKKOS_INLINE_FUNCTION static std::size_t host_scratch(const AttentionGeometry &g) {
    const AttentionChunkSizes size(g, 1);
    return 4 * size.token + size.square;
  }

  /// W: the host kernels' chunk width (attention_tile_width, or attention_avx512_width in the
  /// AVX-512 copy).
  template <int W, class Member, class Scalar, class Lanes>
  KOKKOS_INLINE_FUNCTION static void lanes(const Member &team, const AttentionArgs<Scalar> &p,
                                           const AttentionLaneBlock<Lanes> &blk) {
    using exec = typename Member::execution_space;
    if constexpr (Kokkos::SpaceAccessibility<exec, Kokkos::HostSpace>::accessible) {
      attention_forward_block<W>(p, blk.h, blk.n0, attention_lane_count(blk.lanes),
                                 attention_host_scratch<Scalar>(team, host_scratch(p.g)));
    } else {
      const AttentionGeometry &g = p.g;
      const Scalar scale = p.scale;
      const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
      const Scalar *q = p.x + blk.token(g, 0), *k = p.x + blk.token(g, 1),
                   *v = p.x + blk.token(g, 2);
      Scalar *o = p.out + blk.token(g, 0);
      Scalar *ap = p.a + blk.prob(g);
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
            const Scalar e = math::detail::exp_vectorizable(as[l] - m[l]);
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
  }
};

/// Backward: dV = Aᵀ dO, dA = dO Vᵀ (into `work`), dS = A ⊙ (dA − rowsum(dA ⊙ A)) in place,
/// dQ = dS K/√dh, dK = dSᵀ Q/√dh, into `out` (dx) in the q|k|v layout. Reads x, a, dy.
struct AttentionBackwardPass {
  static constexpr const char *label = "kat::nn::ScaledDotProductAttention::backward";

  template <class Member, class Scalar, class MemorySpace>
  KOKKOS_INLINE_FUNCTION static void gemm(const Member &team, const AttentionArgs<Scalar> &p,
                                          const AttentionPair<MemorySpace> &pair) {
    const AttentionGeometry &g = p.g;
    const Scalar scale = p.scale;
    const auto d_o = pair.token(p.dy, 0);
    const auto ap = pair.square(p.a), ds = pair.square(p.work);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, Scalar(1), ap, d_o, Scalar(0),
                                                          pair.token(p.out, 2));
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, Scalar(1), d_o, pair.token(p.x, 2),
                                                          Scalar(0), ds);
    attention_softmax_jvp(team, g.positions, ap, ds);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, ds, pair.token(p.x, 1),
                                                            Scalar(0), pair.token(p.out, 0));
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, ds, pair.token(p.x, 0),
                                                          Scalar(0), pair.token(p.out, 1));
  }

  /// Scratch of the host kernels per sample, in scalars: 7 token blocks and 2 squares.
  KOKKOS_INLINE_FUNCTION static std::size_t host_scratch(const AttentionGeometry &g) {
    const AttentionChunkSizes size(g, 1);
    return 7 * size.token + 2 * size.square;
  }

  /// W: as AttentionForwardPass::lanes.
  template <int W, class Member, class Scalar, class Lanes>
  KOKKOS_INLINE_FUNCTION static void lanes(const Member &team, const AttentionArgs<Scalar> &p,
                                           const AttentionLaneBlock<Lanes> &blk) {
    using exec = typename Member::execution_space;
    if constexpr (Kokkos::SpaceAccessibility<exec, Kokkos::HostSpace>::accessible) {
      attention_backward_block<W>(p, blk.h, blk.n0, attention_lane_count(blk.lanes),
                                  attention_host_scratch<Scalar>(team, host_scratch(p.g)));
    } else {
      const AttentionGeometry &g = p.g;
      const Scalar scale = p.scale;
      const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
      const Scalar *q = p.x + blk.token(g, 0), *k = p.x + blk.token(g, 1),
                   *v = p.x + blk.token(g, 2);
      const Scalar *d_o = p.dy + blk.token(g, 0);
      Scalar *dq = p.out + blk.token(g, 0), *dk = p.out + blk.token(g, 1),
             *dv = p.out + blk.token(g, 2);
      const Scalar *ap = p.a + blk.prob(g);
      Scalar *wp = p.work + blk.prob(g);
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
  }
};

/// R-operator of the forward: R{S} = (R{Q}Kᵀ + Q R{K}ᵀ)/√dh, R{A} = A ⊙ (R{S} −
/// rowsum(A ⊙ R{S})) into `ra`, R{O} = R{A} V + A R{V} into `out` (R{y}). Reads x, rx, a.
struct AttentionForwardRPass {
  static constexpr const char *label = "kat::nn::ScaledDotProductAttention::forward_r";
  /// No thread scratch: the R passes run on the unpacked blocks.
  KOKKOS_INLINE_FUNCTION static std::size_t host_scratch(const AttentionGeometry &) { return 0; }

  template <class Member, class Scalar, class MemorySpace>
  KOKKOS_INLINE_FUNCTION static void gemm(const Member &team, const AttentionArgs<Scalar> &p,
                                          const AttentionPair<MemorySpace> &pair) {
    const AttentionGeometry &g = p.g;
    const Scalar scale = p.scale;
    const auto ap = pair.square(p.a), rs = pair.square(p.ra);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, pair.token(p.rx, 0),
                                                          pair.token(p.x, 1), Scalar(0), rs);
    attention_team_gemm<AttentionNoTrans, AttentionTrans>(team, scale, pair.token(p.x, 0),
                                                          pair.token(p.rx, 1), Scalar(1), rs);
    attention_softmax_jvp(team, g.positions, ap, rs);
    const auto ro = pair.token(p.out, 0);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), rs, pair.token(p.x, 2),
                                                            Scalar(0), ro);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, Scalar(1), ap,
                                                            pair.token(p.rx, 2), Scalar(1), ro);
  }

  /// W: unused (the R passes read the token matrices in place).
  template <int W, class Member, class Scalar, class Lanes>
  KOKKOS_INLINE_FUNCTION static void lanes(const Member &team, const AttentionArgs<Scalar> &p,
                                           const AttentionLaneBlock<Lanes> &blk) {
    const AttentionGeometry &g = p.g;
    const Scalar scale = p.scale;
    const std::size_t dh = g.head_dim, P = g.positions, N = g.batch, NP = N * P, NH = N * g.heads;
    const std::size_t qo = blk.token(g, 0), ko = blk.token(g, 1), vo = blk.token(g, 2);
    const Scalar *ap = p.a + blk.prob(g);
    Scalar *rap = p.ra + blk.prob(g);
    Scalar *ro = p.out + qo;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
      Scalar acc[attention_max_lanes], r[attention_max_lanes];
      const std::size_t end = attention_row_end(g, t);
      // R{S}[t, s] = (R{Q}_t·K_s + Q_t·R{K}_s)/√dh, and r = Σ_s A R{S}
      attention_lanes(team, blk.lanes, [&](const int l) { r[l] = 0; });
      for (std::size_t s = 0; s < end; ++s) {
        attention_lanes(team, blk.lanes, [&](const int l) { acc[l] = 0; });
        for (std::size_t j = 0; j < dh; ++j) {
          const std::size_t tj = N * t + NP * j, sj = N * s + NP * j;
          const Scalar *qj = p.x + qo + tj, *rqj = p.rx + qo + tj;
          const Scalar *kj = p.x + ko + sj, *rkj = p.rx + ko + sj;
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
          const Scalar *vj = p.x + vo + N * s + NP * j, *rvj = p.rx + vo + N * s + NP * j;
          attention_lanes(team, blk.lanes,
                          [&](const int l) { acc[l] += ras[l] * vj[l] + as[l] * rvj[l]; });
        }
        Scalar *roj = ro + N * t + NP * j;
        attention_lanes(team, blk.lanes, [&](const int l) { roj[l] = acc[l]; });
      }
    });
  }
};

/// R-operator of the backward (the product rule on each backward formula):
///   R{dV} = R{A}ᵀ dO + Aᵀ R{dO},   R{dA} = R{dO} Vᵀ + dO R{V}ᵀ,
///   R{dS} = R{A} ⊙ (dA − r) + A ⊙ (R{dA} − R{r}),  r = rowsum(dA ⊙ A),
///           R{r} = rowsum(R{dA} ⊙ A + dA ⊙ R{A}),
///   R{dQ} = (R{dS} K + dS R{K})/√dh,   R{dK} = (R{dS}ᵀ Q + dSᵀ R{Q})/√dh,
/// into `out` (R{dx}); dA and dS go through `work`, R{dA} and R{dS} through `rwork`. Reads x,
/// rx, a, ra, dy, rdy.
struct AttentionBackwardRPass {
  static constexpr const char *label = "kat::nn::ScaledDotProductAttention::backward_r";
  /// No thread scratch: the R passes run on the unpacked blocks.
  KOKKOS_INLINE_FUNCTION static std::size_t host_scratch(const AttentionGeometry &) { return 0; }

  template <class Member, class Scalar, class MemorySpace>
  KOKKOS_INLINE_FUNCTION static void gemm(const Member &team, const AttentionArgs<Scalar> &p,
                                          const AttentionPair<MemorySpace> &pair) {
    const AttentionGeometry &g = p.g;
    const Scalar scale = p.scale;
    const std::size_t P = g.positions;
    const auto v = pair.token(p.x, 2), rv = pair.token(p.rx, 2);
    const auto d_o = pair.token(p.dy, 0), rdo = pair.token(p.rdy, 0);
    const auto ap = pair.square(p.a), rap = pair.square(p.ra);
    const auto ds = pair.square(p.work), rds = pair.square(p.rwork);
    const auto rdv = pair.token(p.out, 2);
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
    const auto q = pair.token(p.x, 0), k = pair.token(p.x, 1);
    const auto rq = pair.token(p.rx, 0), rk = pair.token(p.rx, 1);
    const auto rdq = pair.token(p.out, 0), rdk = pair.token(p.out, 1);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, rds, k, Scalar(0), rdq);
    attention_team_gemm<AttentionNoTrans, AttentionNoTrans>(team, scale, ds, rk, Scalar(1), rdq);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, rds, q, Scalar(0), rdk);
    attention_team_gemm<AttentionTrans, AttentionNoTrans>(team, scale, ds, rq, Scalar(1), rdk);
  }

  /// W: unused (the R passes read the token matrices in place).
  template <int W, class Member, class Scalar, class Lanes>
  KOKKOS_INLINE_FUNCTION static void lanes(const Member &team, const AttentionArgs<Scalar> &p,
                                           const AttentionLaneBlock<Lanes> &blk) {
    const AttentionGeometry &g = p.g;
    const Scalar scale = p.scale;
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
          const Scalar *doj = p.dy + oo + tj, *rdoj = p.rdy + oo + tj;
          const Scalar *vj = p.x + vo + sj, *rvj = p.rx + vo + sj;
          attention_lanes(team, blk.lanes, [&](const int l) {
            acc[l] += doj[l] * vj[l];
            racc[l] += rdoj[l] * vj[l] + doj[l] * rvj[l];
          });
        }
        const std::size_t ts = po + NH * (t + P * s);
        const Scalar *as = p.a + ts, *ras = p.ra + ts;
        Scalar *ws = p.work + ts, *rws = p.rwork + ts;
        attention_lanes(team, blk.lanes, [&](const int l) {
          ws[l] = acc[l];
          rws[l] = racc[l];
          r[l] += acc[l] * as[l];
          rr[l] += racc[l] * as[l] + acc[l] * ras[l];
        });
      }
      for (std::size_t s = 0; s < end; ++s) {
        const std::size_t ts = po + NH * (t + P * s);
        const Scalar *as = p.a + ts, *ras = p.ra + ts;
        Scalar *ws = p.work + ts, *rws = p.rwork + ts;
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
          const Scalar *ws = p.work + ts, *rws = p.rwork + ts;
          const Scalar *kj = p.x + ko + sj, *rkj = p.rx + ko + sj;
          attention_lanes(team, blk.lanes,
                          [&](const int l) { acc[l] += rws[l] * kj[l] + ws[l] * rkj[l]; });
        }
        Scalar *rdqj = p.out + qo + N * t + NP * j;
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
          const Scalar *as = p.a + ts, *ras = p.ra + ts, *ws = p.work + ts, *rws = p.rwork + ts;
          const Scalar *doj = p.dy + oo + tj, *rdoj = p.rdy + oo + tj;
          const Scalar *qj = p.x + qo + tj, *rqj = p.rx + qo + tj;
          attention_lanes(team, blk.lanes, [&](const int l) {
            acc[l] += ras[l] * doj[l] + as[l] * rdoj[l];
            acc2[l] += rws[l] * qj[l] + ws[l] * rqj[l];
          });
        }
        Scalar *rdvj = p.out + vo + N * s + NP * j;
        Scalar *rdkj = p.out + ko + N * s + NP * j;
        attention_lanes(team, blk.lanes, [&](const int l) {
          rdvj[l] = acc[l];
          rdkj[l] = acc2[l] * scale;
        });
      }
    });
  }
};

/// Pass::gemm for the (sample, head) pair of the team: team league_rank() = n + N·h.
template <class Pass, class ExecSpace, class MemorySpace, class Scalar> struct AttentionGemmKernel {
  AttentionArgs<Scalar> p;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    Pass::gemm(team, p, AttentionPair<MemorySpace>(team, p.g));
  }
};

/// Pass::lanes for the team's head and block of `block` samples, the host kernels in chunks of
/// W samples.
template <class Pass, class ExecSpace, class Scalar, int W = attention_tile_width>
struct AttentionLanesKernel {
  AttentionArgs<Scalar> p;
  int block;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const AttentionLaneBlock<> blk = attention_lane_block_of(team, p.g, block);
    if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
      if (blk.lanes == attention_max_lanes) {
        Pass::template lanes<W>(team, p, AttentionLaneBlock<AttentionFullLanes>{blk.h, blk.n0, {}});
        return;
      }
    }
    Pass::template lanes<W>(team, p, blk);
  }
};

#if KAT_HOST_ISA_DISPATCH
/// AttentionLanesKernel's AVX-512 copy (kat/core/host_isa.hpp): chunks of
/// attention_avx512_width samples, the team's work compiled for AVX-512 (`flatten` inlines it
/// all but the register tiles, which have their own AVX-512 copy).
template <class Pass, class ExecSpace, class Scalar> struct AttentionLanesKernelAvx512 {
  AttentionLanesKernel<Pass, ExecSpace, Scalar, attention_avx512_width<Scalar>> kernel;

  KAT_IMPL_AVX512_LOOP void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    kernel(team);
  }
};
#endif

/// Runs attention pass Pass (AttentionForwardPass, ...) on p: with the batched GEMMs, one team
/// per (sample, head) pair; else with batch lanes, one team per (head, block of
/// attention_lane_block() samples).
template <class Pass, class MemorySpace, class ExecSpace, class Scalar>
void attention_run(const ExecSpace &space, const AttentionArgs<Scalar> &p, bool batched_gemm) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  if (batched_gemm) {
    Kokkos::parallel_for(std::string(Pass::label) + " (batched GEMM)",
                         policy(space, static_cast<int>(p.g.pairs()), Kokkos::AUTO),
                         AttentionGemmKernel<Pass, ExecSpace, MemorySpace, Scalar>{p});
    return;
  }
  const int block = attention_lane_block<ExecSpace>();
  const std::size_t blocks = (p.g.batch + block - 1) / block;
  const bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  const int league = static_cast<int>(p.g.heads * blocks);
  // One thread per team on hosts: a team's chunks share its scratch.
  policy lanes = host ? policy(space, league, 1, 1) : policy(space, league, Kokkos::AUTO, block);
  const std::size_t scratch =
      host ? Pass::host_scratch(p.g) * sizeof(Scalar) * attention_max_lanes : 0;
  if (scratch > 0) {
    lanes.set_scratch_size(0, Kokkos::PerTeam(scratch));
  }
  const std::string label = std::string(Pass::label) + " (batch lanes)";
#if KAT_HOST_ISA_DISPATCH
  // The passes with packed copies (forward, backward) in their AVX-512 copy where chosen, for
  // a Scalar of which a 512-bit register holds more samples than the compiled tiles (float).
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible &&
                attention_avx512_width<Scalar> != attention_tile_width) {
    if (scratch > 0 && kat::host_vector_isa() == kat::HostVectorIsa::avx512) {
      Kokkos::parallel_for(label, lanes,
                           AttentionLanesKernelAvx512<Pass, ExecSpace, Scalar>{{p, block}});
      return;
    }
  }
#endif
  Kokkos::parallel_for(label, lanes, AttentionLanesKernel<Pass, ExecSpace, Scalar>{p, block});
}

} // namespace detail

} // namespace kat::nn
