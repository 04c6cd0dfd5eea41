#pragma once
/// @file
/// @brief Learned additive position embedding (ViT's E_pos).

#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/normal.hpp"
#include "kat/nn/detail/row_vectors.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kat::nn {

/// Learned additive position embedding: the E_pos of the Vision Transformer (Dosovitskiy et
/// al., ICLR 2021, "An Image is Worth 16x16 Words", eq. 1), and GPT's learned positions.
///
/// Input and output are N x (C·P) matrices of sequences of P = H·W positions with C features
/// each, FeatureShape {C, H, W} with C == features and H·W == positions (see the token layout
/// in FeatureShape: feature index p + P·c for position p = h + H·w):
///   y[n, p, c] = x[n, p, c] + E[p, c].
///
/// The parameter "weight" E is a positions x features column-major matrix: E(p, c) is at
/// offset p + positions·c, the order of one sample's feature index, so E is added to every
/// row of the batch matrix like a bias. (PyTorch keeps its pos_embedding (1, P, C) row-major,
/// offset p·C + c: the transpose in memory.) Initialized N(0, 0.02²) as in ViT's reference
/// implementation (vit_jax: posemb_init = normal(stddev=0.02), "from BERT"; timm's
/// trunc_normal_(std=0.02) cuts at ±2, 100 standard deviations, the same in effect), drawn as
/// a pure function of the seed.
///
/// Backward: dx = dy, dE = Σ_n dy (a column sum over the batch), added to or overwriting the
/// gradient as accumulate_gradients() says. R-operator (Pearlmutter 1994; see Layer):
/// R{y} = R{x} + V_E, R{dx} = R{dy}, hv_E += Σ_n R{dy}.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class PositionEmbedding final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  using vector_type = Vector<Scalar, MemorySpace>; ///< the flat table (positions x features)

  /// @param features   C, the features per position, > 0
  /// @param positions  P, the positions per sample (H·W), > 0
  /// @throws ValueError if either is 0.
  PositionEmbedding(std::size_t features, std::size_t positions)
      : features_(features), positions_(positions) {
    if (features_ == 0 || positions_ == 0) {
      throw ValueError(kat::detail::concat("kat::nn::PositionEmbedding: features and positions "
                                           "must be > 0, got features = ",
                                           features_, ", positions = ", positions_));
    }
  }

  std::string name() const override { return "PositionEmbedding"; }
  /// D, the features at each position.
  std::size_t features() const { return features_; }
  /// P, the positions.
  std::size_t positions() const { return positions_; }

  /// @throws ShapeError unless input.channels == features() and height·width == positions().
  FeatureShape output_shape(const FeatureShape &input) const override {
    const char *where = "kat::nn::PositionEmbedding";
    kat::detail::require_extent(where, "input channels (features)", features_,
                                static_cast<std::size_t>(input.channels));
    kat::detail::require_extent(where, "input height * width (positions)", positions_,
                                static_cast<std::size_t>(input.height) *
                                    static_cast<std::size_t>(input.width));
    return input;
  }

  /// positions · features.
  std::size_t parameter_count() const override { return positions_ * features_; }
  /// "weight" E (role weight, shape {positions, features}, column-major).
  std::vector<ParameterSpec> parameter_specs() const override {
    return {{"weight", ParameterRole::weight, {positions_, features_}, 0}};
  }

  /// Binds E (positions() x features() scalars).
  void bind(Scalar *params, Scalar *grads) override {
    weight_ = vector_type(params, parameter_count());
    grad_weight_ = vector_type(grads, parameter_count());
  }

  /// E ~ N(0, 0.02²), a pure function of `seed`.
  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    require_bound("reset_parameters");
    detail::normal_(space, weight_, 0.0, 0.02, seed, 0);
  }

  /// E as positions x features column-major matrix, a view of the flat parameter buffer.
  matrix_type weight() const { return matrix_type(weight_.data(), positions_, features_); }
  /// dL/dE, positions x features, a view of the flat gradient buffer.
  matrix_type weight_gradient() const {
    return matrix_type(grad_weight_.data(), positions_, features_);
  }

  /// y = x + E (E broadcast over the batch).
  /// @throws ShapeError if x does not have positions·features columns or y differs from x.
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::PositionEmbedding::forward");
    const char *where = "kat::nn::PositionEmbedding::forward";
    require_bound("forward");
    kat::detail::require_extent(where, "x columns (positions * features)", parameter_count(),
                                x.extent(1));
    kat::detail::require_extent(where, "y rows", x.extent(0), y.extent(0));
    kat::detail::require_extent(where, "y columns", x.extent(1), y.extent(1));
    n_ = x.extent(0);
    detail::add_row_vector(space, "kat::nn::PositionEmbedding::forward", x, weight_, y);
  }

  /// dE (+)= Σ_n dy unless compute_parameter_gradients(false); dx = dy unless dx has extent 0.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::PositionEmbedding::backward");
    const char *where = "kat::nn::PositionEmbedding::backward";
    require_matrix(where, "dy", dy);
    if (this->parameter_gradients_) {
      detail::column_sums(space, "kat::nn::PositionEmbedding::backward_weight", dy, grad_weight_,
                          this->accumulate_);
    }
    if (dx.extent(0) != 0) {
      require_matrix(where, "dx", dx);
      if (dx.data() != dy.data()) {
        Kokkos::deep_copy(space, dx, dy);
      }
    }
  }

  /// One "PositionEmbedding" operator {positions, features}.
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                          const std::string &name) const override {
    return graph.add("PositionEmbedding", name, {x},
                     graph_shape(graph.tensor(x).shape[0], output_shape(in)),
                     this->parameter_shapes(),
                     {{"positions", static_cast<std::int64_t>(positions())},
                      {"features", static_cast<std::int64_t>(features())}});
  }

  bool supports_r_operator() const override { return true; }

  /// Binds the direction's and the product's E blocks.
  void bind_direction(Scalar *v, Scalar *hv) override {
    v_weight_ = vector_type(v, parameter_count());
    hv_weight_ = vector_type(hv, parameter_count());
  }

  /// R{y} = R{x} + V_E (V_E alone for an `rx` of extent 0).
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::PositionEmbedding::forward_r");
    const char *where = "kat::nn::PositionEmbedding::forward_r";
    require_direction(where);
    require_matrix(where, "ry", ry);
    if (rx.extent(0) == 0) {
      detail::fill_rows(space, "kat::nn::PositionEmbedding::forward_r", v_weight_, ry);
      return;
    }
    require_matrix(where, "rx", rx);
    detail::add_row_vector(space, "kat::nn::PositionEmbedding::forward_r", rx, v_weight_, ry);
  }

  /// hv_E += Σ_n R{dy}; R{dx} = R{dy} unless rdx has extent 0.
  void backward_r(const execution_space &space, const matrix_type & /*dy*/, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::PositionEmbedding::backward_r");
    const char *where = "kat::nn::PositionEmbedding::backward_r";
    require_direction(where);
    require_matrix(where, "rdy", rdy);
    detail::column_sums(space, "kat::nn::PositionEmbedding::backward_r_weight", rdy, hv_weight_,
                        true);
    if (rdx.extent(0) != 0) {
      require_matrix(where, "rdx", rdx);
      if (rdx.data() != rdy.data()) {
        Kokkos::deep_copy(space, rdx, rdy);
      }
    }
  }

private:
  void require_bound(const char *what) const {
    if (weight_.extent(0) == 0) {
      throw Error(kat::detail::concat("kat::nn::PositionEmbedding::", what,
                                      ": no parameters bound (bind)"));
    }
  }
  void require_direction(const char *where) const {
    if (v_weight_.extent(0) == 0) {
      throw Error(kat::detail::concat(where, ": no direction bound (bind_direction)"));
    }
  }
  // A matrix of the last forward's batch size by positions · features.
  void require_matrix(const char *where, const char *what, const matrix_type &m) const {
    if (m.extent(0) != n_ || m.extent(1) != parameter_count()) {
      throw ShapeError(kat::detail::concat(where, ": ", what, " must be ", n_, "x",
                                           parameter_count(), ", got ", m.extent(0), "x",
                                           m.extent(1)));
    }
  }

  std::size_t features_, positions_;
  std::size_t n_ = 0;
  vector_type weight_, grad_weight_, v_weight_, hv_weight_;
};

} // namespace kat::nn
