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

/// The sizes one attention pass works on. Pair b = n + N·h is (sample n, head h); the
/// N·heads pairs are independent.
struct AttentionGeometry {
  std::size_t batch = 0;     ///< N
  std::size_t positions = 0; ///< P = H·W
  std::size_t heads = 0;
  std::size_t head_dim = 0; ///< dh
  bool causal = false;

  KOKKOS_INLINE_FUNCTION std::size_t pairs() const { return batch * heads; }
  KOKKOS_INLINE_FUNCTION std::size_t model_dim() const { return heads * head_dim; }
  /// Offset of element (p = 0, j = 0) of part `part` (0 queries, 1 keys, 2 values) of pair b
  /// in the (N·P) x 3D row view of the input: row n + N·p, column part·D + h·dh + j. With
  /// part 0 it is also the offset of the pair's block in the N x D·P output.
  KOKKOS_INLINE_FUNCTION std::size_t token_offset(std::size_t b, std::size_t part) const {
    const std::size_t n = b % batch, h = b / batch;
    return n + batch * positions * (part * heads * head_dim + h * head_dim);
  }
};

/// A strided 2-D block of a larger buffer, as KokkosBatched's GEMMs take it.
template <class Scalar, class MemorySpace>
using AttentionBlock = Kokkos::View<Scalar **, Kokkos::LayoutStride, MemorySpace,
                                    Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// The P x dh block of part `part` of pair b inside a token matrix at `base` (row stride N,
/// column stride N·P): no copy.
template <class MemorySpace, class Scalar>
KOKKOS_INLINE_FUNCTION AttentionBlock<Scalar, MemorySpace>
attention_token_block(Scalar *base, const AttentionGeometry &g, std::size_t b, std::size_t part) {
  return AttentionBlock<Scalar, MemorySpace>(
      base + g.token_offset(b, part),
      Kokkos::LayoutStride(g.positions, g.batch, g.head_dim, g.batch * g.positions));
}

/// The P x P block of pair b in a buffer of N·heads such blocks, column-major (t fastest).
template <class MemorySpace, class Scalar>
KOKKOS_INLINE_FUNCTION AttentionBlock<Scalar, MemorySpace>
attention_square_block(Scalar *base, const AttentionGeometry &g, std::size_t b) {
  return AttentionBlock<Scalar, MemorySpace>(
      base + b * g.positions * g.positions,
      Kokkos::LayoutStride(g.positions, 1, g.positions, g.positions));
}

/// The GEMM of a team: C = alpha op(A) op(B) + beta C (KokkosBatched::TeamGemm), followed by a
/// team barrier so the team may read C at once.
template <class TransA, class TransB, class Algo, class Member, class Scalar, class A, class B,
          class C>
KOKKOS_INLINE_FUNCTION void attention_team_gemm(const Member &team, Scalar alpha, const A &a,
                                                const B &b, Scalar beta, const C &c) {
  KokkosBatched::TeamGemm<Member, TransA, TransB, Algo>::invoke(team, alpha, a, b, beta, c);
  team.team_barrier();
}

using AttentionNoTrans = KokkosBatched::Trans::NoTranspose;
using AttentionTrans = KokkosBatched::Trans::Transpose;
using AttentionGemmAlgo = KokkosBatched::Algo::Gemm::Unblocked;

/// Forward of ScaledDotProductAttention: per pair, S = Q Kᵀ/√dh into `a`, the row softmax
/// of S in place (entries s > t are 0 when causal), then O = A V into y. x: N x 3D·P, y:
/// N x D·P, a: N·heads·P·P (contiguous).
template <class ExecSpace, class Scalar, class MemorySpace>
void attention_forward(const ExecSpace &space, const AttentionGeometry &g, const Scalar *x,
                       Scalar *y, Scalar *a) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  using Algo = AttentionGemmAlgo;
  const Scalar scale = Scalar(1) / static_cast<Scalar>(std::sqrt(double(g.head_dim)));
  const std::size_t P = g.positions;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::forward",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t b = team.league_rank();
        const auto q = attention_token_block<MemorySpace>(x, g, b, 0);
        const auto k = attention_token_block<MemorySpace>(x, g, b, 1);
        const auto v = attention_token_block<MemorySpace>(x, g, b, 2);
        const auto s = attention_square_block<MemorySpace>(a, g, b);
        attention_team_gemm<AttentionNoTrans, AttentionTrans, Algo>(team, scale, q, k, Scalar(0),
                                                                    s);
        Scalar *ab = a + b * P * P;
        // Numerically stable softmax over s for each query t: subtract the row max.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          const std::size_t end = g.causal ? t + 1 : P;
          Scalar m = ab[t];
          for (std::size_t c = 1; c < end; ++c) {
            m = ab[t + P * c] > m ? ab[t + P * c] : m;
          }
          Scalar sum = 0;
          for (std::size_t c = 0; c < end; ++c) {
            const Scalar e = math::exp(ab[t + P * c] - m);
            ab[t + P * c] = e;
            sum += e;
          }
          const Scalar inv = Scalar(1) / sum;
          for (std::size_t c = 0; c < end; ++c) {
            ab[t + P * c] *= inv;
          }
          for (std::size_t c = end; c < P; ++c) {
            ab[t + P * c] = Scalar(0);
          }
        });
        team.team_barrier();
        const auto o = attention_token_block<MemorySpace>(y, g, b, 0);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans, Algo>(team, Scalar(1), s, v,
                                                                      Scalar(0), o);
      });
}

/// Backward: per pair, dV = Aᵀ dO, dA = dO Vᵀ (into `work`), dS = A ⊙ (dA − rowsum(dA ⊙ A))
/// in place, dQ = dS K/√dh, dK = dSᵀ Q/√dh, all into dx in the q|k|v layout.
template <class ExecSpace, class Scalar, class MemorySpace>
void attention_backward(const ExecSpace &space, const AttentionGeometry &g, const Scalar *x,
                        const Scalar *a, const Scalar *dy, Scalar *dx, Scalar *work) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  using Algo = AttentionGemmAlgo;
  const Scalar scale = Scalar(1) / static_cast<Scalar>(std::sqrt(double(g.head_dim)));
  const std::size_t P = g.positions;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::backward",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t b = team.league_rank();
        const auto q = attention_token_block<MemorySpace>(x, g, b, 0);
        const auto k = attention_token_block<MemorySpace>(x, g, b, 1);
        const auto v = attention_token_block<MemorySpace>(x, g, b, 2);
        const auto do_ = attention_token_block<MemorySpace>(dy, g, b, 0);
        const auto ap = attention_square_block<MemorySpace>(a, g, b);
        const auto ds = attention_square_block<MemorySpace>(work, g, b);
        attention_team_gemm<AttentionTrans, AttentionNoTrans, Algo>(
            team, Scalar(1), ap, do_, Scalar(0), attention_token_block<MemorySpace>(dx, g, b, 2));
        attention_team_gemm<AttentionNoTrans, AttentionTrans, Algo>(team, Scalar(1), do_, v,
                                                                    Scalar(0), ds);
        const Scalar *ab = a + b * P * P;
        Scalar *db = work + b * P * P;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar r = 0;
          for (std::size_t c = 0; c < P; ++c) {
            r += db[t + P * c] * ab[t + P * c];
          }
          for (std::size_t c = 0; c < P; ++c) {
            db[t + P * c] = ab[t + P * c] * (db[t + P * c] - r);
          }
        });
        team.team_barrier();
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans, Algo>(
            team, scale, ds, k, Scalar(0), attention_token_block<MemorySpace>(dx, g, b, 0));
        attention_team_gemm<AttentionTrans, AttentionNoTrans, Algo>(
            team, scale, ds, q, Scalar(0), attention_token_block<MemorySpace>(dx, g, b, 1));
      });
}

/// R-operator of the forward: per pair, R{S} = (R{Q}Kᵀ + Q R{K}ᵀ)/√dh, R{A} = A ⊙ (R{S} −
/// rowsum(A ⊙ R{S})) into `ra`, R{O} = R{A} V + A R{V} into ry.
template <class ExecSpace, class Scalar, class MemorySpace>
void attention_forward_r(const ExecSpace &space, const AttentionGeometry &g, const Scalar *x,
                         const Scalar *rx, const Scalar *a, Scalar *ra, Scalar *ry) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  using Algo = AttentionGemmAlgo;
  const Scalar scale = Scalar(1) / static_cast<Scalar>(std::sqrt(double(g.head_dim)));
  const std::size_t P = g.positions;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::forward_r",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t b = team.league_rank();
        const auto q = attention_token_block<MemorySpace>(x, g, b, 0);
        const auto k = attention_token_block<MemorySpace>(x, g, b, 1);
        const auto v = attention_token_block<MemorySpace>(x, g, b, 2);
        const auto rq = attention_token_block<MemorySpace>(rx, g, b, 0);
        const auto rk = attention_token_block<MemorySpace>(rx, g, b, 1);
        const auto rv = attention_token_block<MemorySpace>(rx, g, b, 2);
        const auto ap = attention_square_block<MemorySpace>(a, g, b);
        const auto rs = attention_square_block<MemorySpace>(ra, g, b);
        attention_team_gemm<AttentionNoTrans, AttentionTrans, Algo>(team, scale, rq, k, Scalar(0),
                                                                    rs);
        attention_team_gemm<AttentionNoTrans, AttentionTrans, Algo>(team, scale, q, rk, Scalar(1),
                                                                    rs);
        const Scalar *ab = a + b * P * P;
        Scalar *rb = ra + b * P * P;
        // Masked entries have A = 0, so R{A} = 0 there too.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar r = 0;
          for (std::size_t c = 0; c < P; ++c) {
            r += ab[t + P * c] * rb[t + P * c];
          }
          for (std::size_t c = 0; c < P; ++c) {
            rb[t + P * c] = ab[t + P * c] * (rb[t + P * c] - r);
          }
        });
        team.team_barrier();
        const auto ro = attention_token_block<MemorySpace>(ry, g, b, 0);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans, Algo>(team, Scalar(1), rs, v,
                                                                      Scalar(0), ro);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans, Algo>(team, Scalar(1), ap, rv,
                                                                      Scalar(1), ro);
      });
}

/// R-operator of the backward (the product rule on each backward formula): per pair,
///   R{dV} = R{A}ᵀ dO + Aᵀ R{dO},   R{dA} = R{dO} Vᵀ + dO R{V}ᵀ,
///   R{dS} = R{A} ⊙ (dA − r) + A ⊙ (R{dA} − R{r}),  r = rowsum(dA ⊙ A),
///           R{r} = rowsum(R{dA} ⊙ A + dA ⊙ R{A}),
///   R{dQ} = (R{dS} K + dS R{K})/√dh,   R{dK} = (R{dS}ᵀ Q + dSᵀ R{Q})/√dh,
/// into rdx; dA and dS go through `work`, R{dA} and R{dS} through `rwork`.
template <class ExecSpace, class Scalar, class MemorySpace>
void attention_backward_r(const ExecSpace &space, const AttentionGeometry &g, const Scalar *x,
                          const Scalar *rx, const Scalar *a, const Scalar *ra, const Scalar *dy,
                          const Scalar *rdy, Scalar *rdx, Scalar *work, Scalar *rwork) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename policy::member_type;
  using Algo = AttentionGemmAlgo;
  const Scalar scale = Scalar(1) / static_cast<Scalar>(std::sqrt(double(g.head_dim)));
  const std::size_t P = g.positions;
  Kokkos::parallel_for(
      "kat::nn::ScaledDotProductAttention::backward_r",
      policy(space, static_cast<int>(g.pairs()), Kokkos::AUTO), KOKKOS_LAMBDA(const member &team) {
        const std::size_t b = team.league_rank();
        const auto q = attention_token_block<MemorySpace>(x, g, b, 0);
        const auto k = attention_token_block<MemorySpace>(x, g, b, 1);
        const auto v = attention_token_block<MemorySpace>(x, g, b, 2);
        const auto rq = attention_token_block<MemorySpace>(rx, g, b, 0);
        const auto rk = attention_token_block<MemorySpace>(rx, g, b, 1);
        const auto rv = attention_token_block<MemorySpace>(rx, g, b, 2);
        const auto do_ = attention_token_block<MemorySpace>(dy, g, b, 0);
        const auto rdo = attention_token_block<MemorySpace>(rdy, g, b, 0);
        const auto ap = attention_square_block<MemorySpace>(a, g, b);
        const auto rap = attention_square_block<MemorySpace>(ra, g, b);
        const auto ds = attention_square_block<MemorySpace>(work, g, b);
        const auto rds = attention_square_block<MemorySpace>(rwork, g, b);
        const auto rdv = attention_token_block<MemorySpace>(rdx, g, b, 2);
        attention_team_gemm<AttentionTrans, AttentionNoTrans, Algo>(team, Scalar(1), rap, do_,
                                                                    Scalar(0), rdv);
        attention_team_gemm<AttentionTrans, AttentionNoTrans, Algo>(team, Scalar(1), ap, rdo,
                                                                    Scalar(1), rdv);
        attention_team_gemm<AttentionNoTrans, AttentionTrans, Algo>(team, Scalar(1), do_, v,
                                                                    Scalar(0), ds);
        attention_team_gemm<AttentionNoTrans, AttentionTrans, Algo>(team, Scalar(1), rdo, v,
                                                                    Scalar(0), rds);
        attention_team_gemm<AttentionNoTrans, AttentionTrans, Algo>(team, Scalar(1), do_, rv,
                                                                    Scalar(1), rds);
        const Scalar *ab = a + b * P * P;
        const Scalar *rab = ra + b * P * P;
        Scalar *db = work + b * P * P;
        Scalar *rdb = rwork + b * P * P;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](const std::size_t t) {
          Scalar r = 0, rr = 0;
          for (std::size_t c = 0; c < P; ++c) {
            const std::size_t i = t + P * c;
            r += db[i] * ab[i];
            rr += rdb[i] * ab[i] + db[i] * rab[i];
          }
          for (std::size_t c = 0; c < P; ++c) {
            const std::size_t i = t + P * c;
            const Scalar da = db[i];
            db[i] = ab[i] * (da - r);
            rdb[i] = rab[i] * (da - r) + ab[i] * (rdb[i] - rr);
          }
        });
        team.team_barrier();
        const auto rdq = attention_token_block<MemorySpace>(rdx, g, b, 0);
        const auto rdk = attention_token_block<MemorySpace>(rdx, g, b, 1);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans, Algo>(team, scale, rds, k,
                                                                      Scalar(0), rdq);
        attention_team_gemm<AttentionNoTrans, AttentionNoTrans, Algo>(team, scale, ds, rk,
                                                                      Scalar(1), rdq);
        attention_team_gemm<AttentionTrans, AttentionNoTrans, Algo>(team, scale, rds, q, Scalar(0),
                                                                    rdk);
        attention_team_gemm<AttentionTrans, AttentionNoTrans, Algo>(team, scale, ds, rq, Scalar(1),
                                                                    rdk);
      });
}

} // namespace detail

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
/// Work: one Kokkos team per (sample, head) pair; the products are KokkosBatched team GEMMs
/// on strided views of x, y and dx (no copies), the softmax and its derivatives row loops in
/// the same kernel. The probabilities A (N·heads x P x P) are kept from forward() for the
/// backward and R passes. No parameters.
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
  /// extents are not N x D·P, x or y is not contiguous, or x has 2^31 or more entries
  /// (KokkosBatched's int strides).
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
    if (x.span() >= static_cast<std::size_t>(INT_MAX)) {
      throw ShapeError(kat::detail::concat(where, ": x must have fewer than ", INT_MAX,
                                           " entries (KokkosBatched's int strides), got ",
                                           x.span()));
    }
    const std::size_t positions = x.extent(1) / d3;
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
    detail::attention_forward<execution_space, Scalar, MemorySpace>(
        space, geometry_, x.data(), y.data(), probabilities_.data());
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
    detail::attention_backward<execution_space, Scalar, MemorySpace>(
        space, geometry_, x_.data(), probabilities_.data(), dy.data(), dx.data(),
        work_.matrix(count, 1).data());
  }

  /// R-operator (see Layer): parameter-free, so R{y} depends on R{x} only.
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
    detail::attention_forward_r<execution_space, Scalar, MemorySpace>(
        space, geometry_, x_.data(), rx_.data(), probabilities_.data(), r_probabilities_.data(),
        ry.data());
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
    detail::attention_backward_r<execution_space, Scalar, MemorySpace>(
        space, geometry_, x_.data(), rx_.data(), probabilities_.data(), r_probabilities_.data(),
        dy.data(), rdy.data(), rdx.data(), work_.matrix(count, 1).data(),
        r_work_.matrix(count, 1).data());
  }

  /// The attention probabilities A of the last forward(): N·heads blocks of P x P, block
  /// n + N·h (sample n, head h) at offset (n + N·h)·P², entry A[t, s] at t + P·s within it
  /// (rows sum to 1; entries s > t are 0 when causal). Empty before the first forward().
  const vector_type &probabilities() const { return probabilities_; }

private:
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
  Workspace<Scalar, MemorySpace> attention_, work_, r_attention_, r_work_, zero_rx_;
  vector_type probabilities_, r_probabilities_;
};

} // namespace kat::nn
