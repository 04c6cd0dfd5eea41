#pragma once
/// @file
/// @brief Layer normalization over the features of each position (nn.LayerNorm over the last
/// dimension).

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/layer_norm_kernels.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace kat::nn {

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
  using vector_type = Vector<Scalar, MemorySpace>; ///< a per-feature vector (γ, β)
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
  /// The features each position is normalized over.
  std::size_t normalized_features() const { return features_; }
  /// Added to the variance before the square root.
  double eps() const { return eps_; }
  /// Whether γ and β are learned.
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

  /// Binds γ (features) then β (features) when affine; nothing otherwise.
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

  /// Binds the direction's and the product's γ and β blocks, laid out like bind()'s.
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
