#pragma once
/// @file
/// @brief Multi-head scaled dot-product self-attention (the parameter-free core of a
/// transformer's attention block).

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/attention_kernels.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <climits>
#include <cmath>
#include <cstddef>
#include <string>

namespace kat::nn {

/// How ScaledDotProductAttention computes its passes; both give the same results up to
/// rounding and keep A in the same layout.
///
/// batch_lanes is 10 to 19 times faster on a host (4.7 to 9.2 before its forward and backward
/// ran on packed copies), batched_gemm an order of magnitude faster on an H100, where
/// batch_lanes launches only heads·N/32 teams (docs/benchmarks.md, "Kernel design choices,
/// measured").
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
/// samples), every loop vectorized over the samples, which are contiguous in memory (forward
/// and backward copy the head's block into the team's scratch as vectors of 8 samples and
/// compute the products in 2 x 4 register tiles of them); on GPUs
/// one team per (sample, head) pair running KokkosBatched team GEMMs on strided views of x, y
/// and dx (no copies), with the softmax and its derivatives as row loops in the same kernel.
/// The probabilities A (N·heads x P x P, see probabilities()) are kept from forward() for the
/// backward and R passes. No parameters. Memory: A, and in backward one more buffer of A's
/// size (dS); the R passes keep R{A} and use one more. On a host each thread running a pass
/// also holds its team's scratch, 32 samples' copies: in backward 7 P x dh blocks and 2 P x P
/// blocks a sample (288 KB in float for P = 16, dh = 16; as much as A for 64 (sample, head)
/// pairs when P >> dh); in forward 4 P x dh blocks and 1 P x P block a sample.
///
/// R-operator (Pearlmutter 1994): forward_r gives R{O} from R{x} (R{Q}, R{K}, R{V});
/// backward_r gives R{dx} by the product rule on each backward formula.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class ScaledDotProductAttention final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  using vector_type = Vector<Scalar, MemorySpace>; ///< a flat vector (the stored probabilities)

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
  /// Number of heads.
  std::size_t heads() const { return heads_; }
  /// Channels per head, dh.
  std::size_t head_dim() const { return head_dim_; }
  /// D = heads·head_dim, the output channels.
  std::size_t model_dim() const { return heads_ * head_dim_; }
  /// Whether position t attends only to positions s <= t.
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
    run<detail::AttentionForwardPass>(space, pass_args(y)); // x_ is x by now
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
    detail::AttentionArgs<Scalar> args = pass_args(dx);
    args.dy = dy.data();
    args.work = work_.matrix(probabilities_.extent(0), 1).data();
    run<detail::AttentionBackwardPass>(space, args);
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
    run<detail::AttentionForwardRPass>(space, pass_args(ry));
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
    detail::AttentionArgs<Scalar> args = pass_args(rdx);
    args.dy = dy.data();
    args.rdy = rdy.data();
    args.work = work_.matrix(count, 1).data();
    args.rwork = r_work_.matrix(count, 1).data();
    run<detail::AttentionBackwardRPass>(space, args);
  }

  /// The attention probabilities A of the last forward(), N·heads·P·P values: A[t, s] of
  /// sample n and head h at n + N·(h + heads·(t + P·s)) (the batch fastest, as in the token
  /// matrices). Rows sum to 1; entries s > t are 0 when causal. Empty before the first
  /// forward().
  const vector_type &probabilities() const { return probabilities_; }

  /// Chooses the kernels of later passes (default AttentionKernel::automatic).
  void set_kernel(AttentionKernel kernel) { kernel_ = kernel; }
  /// The kernel choice set by set_kernel().
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

  /// The buffers every pass may read (geometry, scale, x, R{x}, A, R{A}) and its output.
  detail::AttentionArgs<Scalar> pass_args(const matrix_type &out) const {
    detail::AttentionArgs<Scalar> args;
    args.g = geometry_;
    args.scale = scale();
    args.x = x_.data();
    args.rx = rx_.data();
    args.a = probabilities_.data();
    args.ra = r_probabilities_.data();
    args.out = out.data();
    return args;
  }
  /// Runs pass Pass with the kernels uses_batched_gemm() chooses.
  template <class Pass>
  void run(const execution_space &space, const detail::AttentionArgs<Scalar> &args) const {
    detail::attention_run<Pass, MemorySpace>(space, args, uses_batched_gemm());
  }
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
