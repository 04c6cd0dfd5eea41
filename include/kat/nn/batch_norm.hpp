#pragma once
/// @file
/// @brief Batch normalization over channels (BatchNorm1d / BatchNorm2d).

#include "kat/core/dnn.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/activation.hpp"
#include "kat/nn/detail/batch_norm_kernels.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace kat::nn {

/// Batch normalization (Ioffe & Szegedy, ICML 2015, Algorithm 1) with the semantics of
/// torch.nn.BatchNorm1d / BatchNorm2d.
///
/// Input and output are N x (C·H·W) matrices whose feature index is `h + H·(w + W·c)` (see
/// FeatureShape), so each channel's M = N·H·W values are contiguous; a flat input of F
/// features is C = F, H = W = 1. BatchNorm1d over (N, F) and BatchNorm2d over (N, C, H, W)
/// are therefore the same computation, and H·W is taken from the input's column count.
///
/// Training (training() true), per channel c over its M values:
///   μ = (1/M) Σ x,  σ² = (1/M) Σ (x − μ)²  (biased),  x̂ = (x − μ) / sqrt(σ² + eps),
///   y = γ x̂ + β,
/// and the running statistics are updated as PyTorch does:
///   running_mean ← (1 − momentum)·running_mean + momentum·μ,
///   running_var  ← (1 − momentum)·running_var  + momentum·σ²·M/(M − 1)  (unbiased).
/// Evaluation uses running_mean and running_var in place of μ and σ² and updates nothing.
///
/// Backward (Ioffe & Szegedy, sec. 3, the chain rule through μ and σ²), with
/// inv_std = 1/sqrt(σ² + eps):
///   dβ = Σ dy,  dγ = Σ dy·x̂,  dx = (γ·inv_std / M)·(M·dy − dβ − x̂·dγ).
/// After an evaluation forward the statistics are constants, so dx = dy·γ·inv_std (with the
/// running statistics) and dβ, dγ are as above with the evaluation x̂. Backward follows the
/// mode of the preceding forward, not the current training() flag.
///
/// R-operator (Pearlmutter 1994; see Layer), in evaluation mode only: with the running
/// statistics frozen, y = γ·inv_std·(x − running_mean) + β is affine in x and bilinear in
/// (γ, x), so for a direction (v_γ, v_β) and R{x}, with x̂ = inv_std·(x − running_mean):
///   R{y} = γ·inv_std·R{x} + v_γ·x̂ + v_β,
///   R{dγ} = Σ (R{dy}·x̂ + dy·inv_std·R{x}),  R{dβ} = Σ R{dy},
///   R{dx} = inv_std·(γ·R{dy} + v_γ·dy).
/// This is the Hessian of the network evaluation runs, the one kat::nn::hessian_vector_product
/// differentiates (it switches the model to evaluation). After a training forward the batch
/// statistics depend on every sample and forward_r() and backward_r() throw instead.
///
/// Parameters (affine = true): γ (C) then β (C) in the flat parameter buffer, initialized to
/// 1 and 0. The running statistics are state, not parameters: they live in views this layer
/// owns, outside the flat parameter and gradient buffers, so optimizers, all-reduces and
/// sparse masks never touch them. A checkpoint must save running_mean(), running_var() and
/// num_batches_tracked() besides the flat buffers, and restore them by writing into the same
/// views (deep_copy) and calling set_num_batches_tracked().
///
/// Precision: the per-channel sums (mean, variance, and the two backward sums) accumulate in
/// `accum_type` (double for float inputs) and the variance is computed in a second pass
/// around the mean, which avoids the cancellation of Σx² − Mμ² for data far from zero. The
/// element-wise passes run in Scalar.
///
/// Not supported (PyTorch options): momentum = None (cumulative average) and
/// track_running_stats = False.
///
/// Work: one team per channel for the reductions (TeamPolicy, league size C, a fixed
/// reduction order) and one team per block of detail::batch_norm_block values of a channel for
/// the element-wise passes, so those are parallel over all elements. A training forward reads
/// x three times (mean, variance, normalize) and writes y; backward reads dy three times and
/// x twice and writes dx. Each channel's reductions run in one team, so its values are read
/// again from cache on a CPU.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class BatchNorm final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  using vector_type = Vector<Scalar, MemorySpace>; ///< a per-channel vector (C)
  /// Type the per-channel sums accumulate in: double for float, Scalar if wider.
  using accum_type = std::common_type_t<Scalar, double>;

  /// @param channels  C, the number of channels (features for BatchNorm1d), > 0
  /// @param eps       added to the variance before the square root, finite and > 0
  /// @param momentum  weight of the batch statistics in the running averages, in [0, 1]
  /// @param affine    whether to learn the per-channel scale γ and shift β
  /// @throws ValueError for channels = 0, eps not finite or <= 0, momentum outside [0, 1].
  explicit BatchNorm(std::size_t channels, double eps = 1e-5, double momentum = 0.1,
                     bool affine = true)
      : channels_(channels), eps_(eps), momentum_(momentum), affine_(affine),
        stats_("kat::nn::BatchNorm::stats"), coefficients_("kat::nn::BatchNorm::coefficients") {
    if (channels_ == 0) {
      throw ValueError("kat::nn::BatchNorm: channels must be > 0, got channels = 0");
    }
    if (!(std::isfinite(eps_) && eps_ > 0.0)) {
      throw ValueError(
          kat::detail::concat("kat::nn::BatchNorm: eps must be finite and > 0, got eps = ", eps_));
    }
    if (!(momentum_ >= 0.0 && momentum_ <= 1.0)) {
      throw ValueError(kat::detail::concat(
          "kat::nn::BatchNorm: momentum must be in [0, 1], got momentum = ", momentum_));
    }
    running_mean_ = vector_type("kat::nn::BatchNorm::running_mean", channels_);
    running_var_ = vector_type("kat::nn::BatchNorm::running_var", channels_);
    Kokkos::deep_copy(running_var_, Scalar(1));
  }

  std::string name() const override { return "BatchNorm"; }
  /// C, the number of channels.
  std::size_t channels() const { return channels_; }
  /// Added to the variance before the square root.
  double eps() const { return eps_; }
  /// Weight of the batch statistics in the running averages.
  double momentum() const { return momentum_; }
  /// Whether γ and β are learned.
  bool affine() const { return affine_; }

  /// @throws ShapeError if input.channels differs from channels().
  FeatureShape output_shape(const FeatureShape &input) const override {
    kat::detail::require_extent("kat::nn::BatchNorm", "input channels", channels_,
                                static_cast<std::size_t>(input.channels));
    return input;
  }

  /// KAT's features layout in and out, or, in training for float on a host space with oneDNN
  /// (kat::dnn_available), channels16 (C a multiple of 16), channels_last or, in
  /// Precision::bf16, channels_last_bf16 or channels16_bf16 (C a multiple of 16) in and out
  /// (channels16 and the bf16 layouts only on CPUs with AVX-512, where oneDNN has kernels for
  /// them: kat::detail::dnn_reads_layout):
  /// oneDNN's batch normalization (the layer's own kernels would read each channel with a
  /// stride there). In those two x, y, dy and dx are bf16; the statistics, γ, β and their
  /// gradients are computed and kept in fp32.
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    if (in != out) {
      return false;
    }
    if (in == ActivationLayout::features) {
      return true;
    }
    return dnn_available<execution_space, Scalar>() && this->training_ &&
           layout_fits(in, static_cast<long long>(channels_), this->precision_) &&
           kat::detail::dnn_reads_layout(in);
  }

  /// In training (the R-operator, evaluation only, never sees it): y = max(0, BN(x)) in the
  /// normalization pass, and backward masks dy where y <= 0 inside its own passes.
  bool can_fuse_relu() const override { return this->training_; }

  /// 2C with affine (γ then β), else 0.
  std::size_t parameter_count() const override { return affine_ ? 2 * channels_ : 0; }
  /// With affine: "weight" γ (C, role weight) then "bias" β (C, role bias), PyTorch's names.
  std::vector<ParameterSpec> parameter_specs() const override {
    if (!affine_) {
      return {};
    }
    return {{"weight", ParameterRole::weight, {channels_}, 0},
            {"bias", ParameterRole::bias, {channels_}, channels_}};
  }

  /// Binds γ (C scalars) then β (C) when affine; nothing otherwise.
  void bind(Scalar *params, Scalar *grads) override {
    if (!affine_) {
      return;
    }
    gamma_ = vector_type(params, channels_);
    beta_ = vector_type(params + channels_, channels_);
    grad_gamma_ = vector_type(grads, channels_);
    grad_beta_ = vector_type(grads + channels_, channels_);
  }

  /// γ = 1, β = 0 (PyTorch), and the running statistics reset as by reset_running_stats();
  /// `seed` is unused.
  void reset_parameters(const execution_space &space, std::uint64_t /*seed*/) override {
    if (affine_) {
      require_bound("reset_parameters");
      Kokkos::deep_copy(space, gamma_, Scalar(1));
      Kokkos::deep_copy(space, beta_, Scalar(0));
    }
    reset_running_stats(space);
  }

  /// running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats(const execution_space &space) {
    Kokkos::deep_copy(space, running_mean_, Scalar(0));
    Kokkos::deep_copy(space, running_var_, Scalar(1));
    num_batches_tracked_ = 0;
  }

  /// γ (C), a view of the flat parameter buffer; empty without affine or before bind().
  const vector_type &gamma() const { return gamma_; }
  /// β (C), a view of the flat parameter buffer; empty without affine or before bind().
  const vector_type &beta() const { return beta_; }
  /// dL/dγ (C), a view of the flat gradient buffer.
  const vector_type &gamma_gradient() const { return grad_gamma_; }
  /// dL/dβ (C), a view of the flat gradient buffer.
  const vector_type &beta_gradient() const { return grad_beta_; }

  /// Running mean (C), owned by the layer; write into it (deep_copy) to restore a checkpoint.
  const vector_type &running_mean() const { return running_mean_; }
  /// Running unbiased variance (C), owned by the layer; writable like running_mean().
  const vector_type &running_var() const { return running_var_; }
  /// Number of training forwards so far (PyTorch's num_batches_tracked); checkpoint state.
  std::uint64_t num_batches_tracked() const { return num_batches_tracked_; }
  /// Sets num_batches_tracked() (restoring a checkpoint).
  void set_num_batches_tracked(std::uint64_t n) { num_batches_tracked_ = n; }

  /// "running_mean", "running_var" (Scalar, [C]) and "num_batches_tracked" (uint64).
  StateDict state_dict() const override {
    StateDict s;
    s.set_view("running_mean", running_mean_);
    s.set_view("running_var", running_var_);
    s.set("num_batches_tracked", static_cast<std::uint64_t>(num_batches_tracked_));
    return s;
  }
  void check_state_dict(const StateDict &state) const override {
    state.require_names("kat::nn::BatchNorm::load_state_dict",
                        {"running_mean", "running_var", "num_batches_tracked"});
    const std::vector<std::uint64_t> shape{channels_};
    state.checked<Scalar>("running_mean", shape);
    state.checked<Scalar>("running_var", shape);
    state.checked<std::uint64_t>("num_batches_tracked", {});
  }
  void load_state_dict(const StateDict &state) override {
    check_state_dict(state);
    state.copy_to("running_mean", running_mean_);
    state.copy_to("running_var", running_var_);
    num_batches_tracked_ = state.get<std::uint64_t>("num_batches_tracked");
  }

  /// Total (re)allocations of the layer's workspaces; constant after the first step.
  std::size_t workspace_allocations() const {
    return stats_.allocations() + coefficients_.allocations() + partials_.allocations();
  }

  /// @throws ShapeError if x's column count is not a positive multiple of channels(), y's
  ///         extents differ from x's, or either is not contiguous.
  /// @throws ValueError in training when a channel has only one value (N·H·W == 1), as
  ///         PyTorch ("Expected more than 1 value per channel when training").
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::BatchNorm::forward");
    const char *where = "kat::nn::BatchNorm::forward";
    const std::size_t n = x.extent(0);
    const std::size_t cols = x.extent(1);
    if (cols == 0 || cols % channels_ != 0) {
      throw ShapeError(kat::detail::concat(where,
                                           ": x columns must be a positive multiple of "
                                           "channels = ",
                                           channels_, ", got ", cols));
    }
    kat::detail::require_extent(where, "y rows", n, y.extent(0));
    kat::detail::require_extent(where, "y columns", cols, y.extent(1));
    require_contiguous(where, "x", x);
    require_contiguous(where, "y", y);
    if (affine_) {
      require_bound("forward");
    }
    const std::size_t C = channels_;
    const std::size_t M = n * (cols / C);
    const bool training = this->training_;
    if (training && M <= 1) {
      throw ValueError(kat::detail::concat(where,
                                           ": Expected more than 1 value per channel when "
                                           "training, got N * H * W = ",
                                           M, " (N = ", n, ", H * W = ", cols / C, ")"));
    }
    x_ = x;
    m_ = M;
    forward_training_ = training;
    stats_view_ = stats_.matrix(C, 2);
    const auto stats = stats_view_;
    const auto running_mean = running_mean_;
    const auto running_var = running_var_;
    const accum_type eps = static_cast<accum_type>(eps_);
    const Scalar *xp = x.data();
    dnn_forwarded_ = false;
    forward_fused_ = this->fused_relu_;
    relu_.remember(y);
    this->require_layouts_supported(where);
    if constexpr (dnn_available<execution_space, Scalar>()) {
      if (this->in_layout_ != ActivationLayout::features) {
        // oneDNN's batch statistics and normalization in its layout; the statistics
        // and the running averages are then formed from its mean and biased variance as on
        // KAT's own path (in accum_type).
        dnn_problem_ = BatchNormProblem{n,
                                        static_cast<int>(C),
                                        static_cast<int>(cols / C),
                                        affine_,
                                        eps_,
                                        this->in_layout_,
                                        forward_fused_};
        dnn_.forward(space, dnn_problem_, xp, affine_ ? gamma_.data() : nullptr, y.data());
        const Scalar *mean = dnn_.mean();
        const Scalar *variance = dnn_.variance();
        const accum_type momentum = static_cast<accum_type>(momentum_);
        Kokkos::parallel_for(
            "kat::nn::BatchNorm::dnn_statistics", Kokkos::RangePolicy<execution_space>(space, 0, C),
            detail::BatchNormDnnStatistics<Scalar, MemorySpace>{
                mean, variance, stats, eps, M, running_mean, running_var, momentum});
        ++num_batches_tracked_;
        dnn_forwarded_ = true;
        return;
      }
    }

    if (training) {
      ScopedRegion phase("kat::nn::BatchNorm::forward_statistics");
      const accum_type momentum = static_cast<accum_type>(momentum_);
      const std::size_t segments = detail::batch_norm_segments(M);
      const auto partials = partials_.matrix(C * segments, 2);
      Kokkos::parallel_for(
          "kat::nn::BatchNorm::forward_moments", team_policy(space, C * segments, Kokkos::AUTO),
          detail::BatchNormSegmentMoments<Scalar, MemorySpace>{xp, M, segments, partials});
      Kokkos::parallel_for(
          "kat::nn::BatchNorm::forward_statistics",
          Kokkos::RangePolicy<execution_space>(space, 0, C),
          detail::BatchNormForwardStatistics<Scalar, MemorySpace>{
              partials, segments, M, stats, eps, running_mean, running_var, momentum});
      ++num_batches_tracked_;
    } else {
      Kokkos::parallel_for("kat::nn::BatchNorm::forward_running_statistics",
                           Kokkos::RangePolicy<execution_space>(space, 0, C),
                           detail::BatchNormRunningStatistics<Scalar, MemorySpace>{
                               stats, running_mean, running_var, eps});
    }

    if (M == 0) {
      return;
    }
    ScopedRegion phase("kat::nn::BatchNorm::forward_normalize");
    const auto gamma = gamma_;
    const auto beta = beta_;
    const bool affine = affine_;
    Scalar *yp = y.data();
    const bool relu = forward_fused_;
    const std::size_t blocks = (M + detail::batch_norm_block - 1) / detail::batch_norm_block;
    Kokkos::parallel_for("kat::nn::BatchNorm::forward_normalize",
                         team_policy(space, C * blocks, Kokkos::AUTO),
                         detail::BatchNormForwardNormalize<Scalar, MemorySpace>{
                             blocks, M, stats, affine, gamma, beta, xp, yp, relu});
  }

  /// @throws Error if called before forward().
  /// @throws ShapeError if dy's (or a non-empty dx's) extents differ from the forward input's
  ///         or a view is not contiguous.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::BatchNorm::backward");
    const char *where = "kat::nn::BatchNorm::backward";
    if (stats_view_.extent(0) == 0) {
      throw Error(kat::detail::concat(where, ": called before forward"));
    }
    const std::size_t n = x_.extent(0);
    const std::size_t cols = x_.extent(1);
    kat::detail::require_extent(where, "dy rows", n, dy.extent(0));
    kat::detail::require_extent(where, "dy columns", cols, dy.extent(1));
    require_contiguous(where, "dy", dy);
    const bool need_dx = dx.extent(0) != 0;
    if (need_dx) {
      kat::detail::require_extent(where, "dx rows", n, dx.extent(0));
      kat::detail::require_extent(where, "dx columns", cols, dx.extent(1));
      require_contiguous(where, "dx", dx);
    }
    const bool affine = affine_;
    if (!affine && !need_dx) {
      return;
    }
    if (affine) {
      require_bound("backward");
    }
    const std::size_t C = channels_;
    const std::size_t M = m_;
    const bool training = forward_training_;
    const bool accumulate = this->accumulate_;
    if constexpr (dnn_available<execution_space, Scalar>()) {
      if (dnn_forwarded_) {
        Scalar *dxp = need_dx ? dx.data() : dnn_dx_.matrix(n, cols).data();
        dnn_.backward(space, dnn_problem_, x_.data(), dy.data(), affine ? gamma_.data() : nullptr,
                      dxp);
        if (affine) {
          const Scalar *ds = dnn_.diff_scale_shift();
          const auto grad_gamma = grad_gamma_;
          const auto grad_beta = grad_beta_;
          Kokkos::parallel_for("kat::nn::BatchNorm::dnn_parameter_gradients",
                               Kokkos::RangePolicy<execution_space>(space, 0, C),
                               detail::BatchNormDnnParameterGradients<Scalar, MemorySpace>{
                                   grad_gamma, grad_beta, accumulate, ds, C});
        }
        return;
      }
    }
    // The sums are needed for the parameter gradients and, in training, for dx.
    const bool need_sums = affine || training;
    coefficients_view_ = coefficients_.matrix(C, 3);
    const auto coef = coefficients_view_;
    const auto stats = stats_view_;
    const auto gamma = gamma_;
    const auto grad_gamma = grad_gamma_;
    const auto grad_beta = grad_beta_;
    const Scalar *xp = x_.data();
    const Scalar *dyp = dy.data();
    if (forward_fused_) {
      // The fused ReLU's backward: dy where y > 0, 0 elsewhere, in one vectorized pass. (Inside
      // the reductions below the select compiles to a branch that mispredicts half the time on
      // a CPU, since they sum in scalar partial sums: 12x slower than this extra pass.)
      dyp = relu_.mask(space, dy).data(); // valid until the next backward
    }
    {
      ScopedRegion phase("kat::nn::BatchNorm::backward_sums");
      const std::size_t segments = detail::batch_norm_segments(M);
      const auto partials = partials_.matrix(C * segments, 2);
      if (need_sums) {
        Kokkos::parallel_for("kat::nn::BatchNorm::backward_segment_sums",
                             team_policy(space, C * segments, Kokkos::AUTO),
                             detail::BatchNormSegmentBackwardSums<Scalar, MemorySpace>{
                                 xp, dyp, M, segments, stats, partials});
      }
      Kokkos::parallel_for("kat::nn::BatchNorm::backward_sums",
                           Kokkos::RangePolicy<execution_space>(space, 0, C),
                           detail::BatchNormBackwardSums<Scalar, MemorySpace>{
                               partials, segments, M, stats, need_sums, affine, grad_gamma,
                               grad_beta, accumulate, coef, gamma, training});
    }
    if (!need_dx || M == 0) {
      return;
    }
    ScopedRegion phase("kat::nn::BatchNorm::backward_dx");
    Scalar *dxp = dx.data();
    const std::size_t blocks = (M + detail::batch_norm_block - 1) / detail::batch_norm_block;
    // dx = γ·inv_std·(dy − dβ/M − x̂·dγ/M), with x̂·dγ/M = (x − μ)·(inv_std·dγ/M); in
    // evaluation both subtracted terms are 0.
    Kokkos::parallel_for(
        "kat::nn::BatchNorm::backward_dx", team_policy(space, C * blocks, Kokkos::AUTO),
        detail::BatchNormBackwardInput<Scalar, MemorySpace>{blocks, M, stats, coef, xp, dyp, dxp});
  }

  /// @name R-operator (evaluation mode; see the class comment for the formulas)
  /// @{
  bool supports_r_operator() const override { return true; }

  /// Binds the direction's and the product's γ and β blocks, laid out like bind()'s.
  void bind_direction(Scalar *v, Scalar *hv) override {
    if (!affine_) {
      return;
    }
    v_gamma_ = vector_type(v, channels_);
    v_beta_ = vector_type(v + channels_, channels_);
    hv_gamma_ = vector_type(hv, channels_);
    hv_beta_ = vector_type(hv + channels_, channels_);
  }

  /// ry = R{y} = γ·inv_std·rx + v_γ·x̂ + v_β (rx of extent 0: R{x} = 0) for the last forward,
  /// which must have run in evaluation mode; rx and ry as x and y (contiguous).
  /// @throws Error before forward(), after a training forward (the R-operator needs the
  ///   frozen running statistics of evaluation mode), or with affine parameters and no
  ///   direction bound; ShapeError on wrong extents.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::BatchNorm::forward_r");
    const char *where = "kat::nn::BatchNorm::forward_r";
    require_r_ready(where);
    const std::size_t n = x_.extent(0);
    const std::size_t cols = x_.extent(1);
    kat::detail::require_extent(where, "ry rows", n, ry.extent(0));
    kat::detail::require_extent(where, "ry columns", cols, ry.extent(1));
    require_contiguous(where, "ry", ry);
    const bool has_rx = rx.extent(0) != 0;
    if (has_rx) {
      kat::detail::require_extent(where, "rx rows", n, rx.extent(0));
      kat::detail::require_extent(where, "rx columns", cols, rx.extent(1));
      require_contiguous(where, "rx", rx);
    }
    rx_ = rx;
    const std::size_t C = channels_;
    const std::size_t M = m_;
    if (M == 0) {
      return;
    }
    const auto stats = stats_view_;
    const auto gamma = gamma_;
    const auto v_gamma = v_gamma_;
    const auto v_beta = v_beta_;
    const bool affine = affine_;
    const Scalar *xp = x_.data();
    const Scalar *rxp = rx.data();
    Scalar *ryp = ry.data();
    const std::size_t blocks = (M + detail::batch_norm_block - 1) / detail::batch_norm_block;
    Kokkos::parallel_for(
        "kat::nn::BatchNorm::forward_r", team_policy(space, C * blocks, Kokkos::AUTO),
        detail::BatchNormForwardR<Scalar, MemorySpace>{blocks, M, stats, affine, gamma, v_gamma,
                                                       v_beta, xp, has_rx, rxp, ryp});
  }

  /// After forward(), forward_r() and backward(dy, ·) in evaluation mode: adds R{dγ} and R{dβ}
  /// to the bound product buffer (with affine parameters) and, unless rdx is empty, writes
  /// rdx = R{dx}; dy, rdy and rdx as x (contiguous).
  /// @throws Error as forward_r(); ShapeError on wrong extents.
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::BatchNorm::backward_r");
    const char *where = "kat::nn::BatchNorm::backward_r";
    require_r_ready(where);
    const std::size_t n = x_.extent(0);
    const std::size_t cols = x_.extent(1);
    kat::detail::require_extent(where, "dy rows", n, dy.extent(0));
    kat::detail::require_extent(where, "dy columns", cols, dy.extent(1));
    require_contiguous(where, "dy", dy);
    kat::detail::require_extent(where, "rdy rows", n, rdy.extent(0));
    kat::detail::require_extent(where, "rdy columns", cols, rdy.extent(1));
    require_contiguous(where, "rdy", rdy);
    const bool need_rdx = rdx.extent(0) != 0;
    if (need_rdx) {
      kat::detail::require_extent(where, "rdx rows", n, rdx.extent(0));
      kat::detail::require_extent(where, "rdx columns", cols, rdx.extent(1));
      require_contiguous(where, "rdx", rdx);
    }
    const bool has_rx = rx_.extent(0) != 0;
    if (has_rx) {
      kat::detail::require_extent(where, "rx (of forward_r) rows", n, rx_.extent(0));
      kat::detail::require_extent(where, "rx (of forward_r) columns", cols, rx_.extent(1));
    }
    const std::size_t C = channels_;
    const std::size_t M = m_;
    const bool affine = affine_;
    const auto stats = stats_view_;
    const auto gamma = gamma_;
    const auto v_gamma = v_gamma_;
    const Scalar *xp = x_.data();
    const Scalar *rxp = rx_.data();
    const Scalar *dyp = dy.data();
    const Scalar *rdyp = rdy.data();
    if (affine) {
      ScopedRegion phase("kat::nn::BatchNorm::backward_r_sums");
      const auto hv_gamma = hv_gamma_;
      const auto hv_beta = hv_beta_;
      Kokkos::parallel_for("kat::nn::BatchNorm::backward_r_sums",
                           team_policy(space, C, Kokkos::AUTO),
                           detail::BatchNormBackwardRSums<Scalar, MemorySpace>{
                               xp, dyp, rdyp, M, stats, has_rx, rxp, hv_gamma, hv_beta});
    }
    if (!need_rdx || M == 0) {
      return;
    }
    ScopedRegion phase("kat::nn::BatchNorm::backward_r_dx");
    Scalar *rdxp = rdx.data();
    const std::size_t blocks = (M + detail::batch_norm_block - 1) / detail::batch_norm_block;
    // R{dx} = inv_std·(γ·R{dy} + v_γ·dy)
    Kokkos::parallel_for("kat::nn::BatchNorm::backward_r_dx",
                         team_policy(space, C * blocks, Kokkos::AUTO),
                         detail::BatchNormBackwardRInput<Scalar, MemorySpace>{
                             blocks, M, stats, affine, gamma, v_gamma, dyp, rdyp, rdxp});
  }
  /// @}

private:
  using team_policy = Kokkos::TeamPolicy<execution_space>;

  void require_bound(const char *what) const {
    if (gamma_.extent(0) != channels_) {
      throw Error(kat::detail::concat("kat::nn::BatchNorm::", what,
                                      ": the layer has affine parameters but bind() was not "
                                      "called"));
    }
  }

  void require_r_ready(const char *where) const {
    if (stats_view_.extent(0) == 0) {
      throw Error(kat::detail::concat(where, ": call forward() first"));
    }
    if (forward_training_) {
      throw Error(kat::detail::concat(
          where, ": the R-operator needs evaluation mode (frozen running statistics), but the last "
                 "forward ran in training mode, whose batch statistics couple the samples; call "
                 "train(false) (Sequential::eval()) before forward(), as "
                 "kat::nn::hessian_vector_product does"));
    }
    if (affine_ && v_gamma_.extent(0) != channels_) {
      throw Error(kat::detail::concat(where, ": no direction bound (bind_direction)"));
    }
  }

  static void require_contiguous(const char *where, const char *what, const matrix_type &v) {
    if (!v.span_is_contiguous()) {
      throw ShapeError(kat::detail::concat(where, ": ", what,
                                           " must be contiguous (no padding), got a span of ",
                                           v.span(), " for ", v.extent(0), " x ", v.extent(1)));
    }
  }

  std::size_t channels_;
  double eps_, momentum_;
  bool affine_;
  vector_type gamma_, beta_, grad_gamma_, grad_beta_;
  vector_type running_mean_, running_var_;
  std::uint64_t num_batches_tracked_ = 0;
  // Saved by forward for backward: the input, M = N·H·W and the mode.
  matrix_type x_;
  std::size_t m_ = 0;
  bool forward_training_ = true;
  // R-operator: the direction's and the product's (γ, β) blocks, and R{x} of the last
  // forward_r (extent 0: zero).
  vector_type v_gamma_, v_beta_, hv_gamma_, hv_beta_;
  matrix_type rx_;
  // stats: C x 2 (mean, inv_std) used by the last forward; coefficients: C x 3 for dx.
  Workspace<Scalar, MemorySpace> stats_, coefficients_;
  // Per-segment sums of the statistics and backward sums (detail::batch_norm_segments).
  Workspace<accum_type, MemorySpace> partials_{"kat::nn::BatchNorm::partials"};
  // oneDNN's path (channels16 or channels_last, in training): its problem, whether the last forward
  // took it, and a dx it writes when the caller needs none.
  BatchNormProblem dnn_problem_;
  bool dnn_forwarded_ = false;
  bool forward_fused_ = false; // whether the last forward applied the following ReLU
  detail::FusedReluBackward<Scalar, MemorySpace> relu_{"kat::nn::BatchNorm::relu_backward"};
  DnnIfAvailable<BatchNormDnn, execution_space, Scalar> dnn_;
  Workspace<Scalar, MemorySpace> dnn_dx_{"kat::nn::BatchNorm::dnn_dx"};
  matrix_type stats_view_, coefficients_view_;
};

/// torch.nn.BatchNorm1d: input N x F (C = F, H = W = 1).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
using BatchNorm1d = BatchNorm<Scalar, MemorySpace>;

/// torch.nn.BatchNorm2d: input N x (C·H·W) in FeatureShape order.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
using BatchNorm2d = BatchNorm<Scalar, MemorySpace>;

} // namespace kat::nn
