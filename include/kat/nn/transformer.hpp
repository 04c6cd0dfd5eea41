#pragma once
/// @file
/// @brief The pre-norm transformer encoder block: x + Attn(LN(x)), then h + MLP(LN(h)).

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/attention.hpp"
#include "kat/nn/dense.hpp"
#include "kat/nn/detail/layer_chain.hpp"
#include "kat/nn/gelu.hpp"
#include "kat/nn/layer.hpp"
#include "kat/nn/layer_norm.hpp"
#include "kat/nn/residual.hpp"

#include <Kokkos_Core.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::nn {

/// Settings of a TransformerEncoderBlock beyond its width.
struct TransformerBlockOptions {
  /// Attention heads; must divide the width D.
  std::size_t heads = 4;
  /// Width of the MLP's hidden layer (4·D in Vaswani et al. and ViT; 0: 4·D).
  std::size_t mlp_hidden = 0;
  /// GPT's causal mask: position t attends to positions s <= t only.
  bool causal = false;
  /// LayerNorm's ε.
  double layer_norm_eps = 1e-5;
};

/// The pre-norm transformer encoder block of ViT (Dosovitskiy et al. 2021, eq. 2-3) and GPT-2
/// (Radford et al. 2019, sec. 2.3), for an input `{D, H, W}` of P = H·W positions (tokens) with
/// D features each (see kat::FeatureShape; output shape = input shape):
///
///     h = x + W_o · Attention(W_qkv · LN₁(x))        (multi-head self-attention)
///     y = h + W₂ · GELU(W₁ · LN₂(h))                  (MLP)
///
/// It is two Residual layers (kat::nn::Residual, identity shortcuts) in sequence: `attention()`
/// holds LayerNorm(D), Dense(D, 3D) per position (queries|keys|values), ScaledDotProductAttention
/// (heads, D/heads) and Dense(D, D) per position; `mlp()` holds LayerNorm(D), Dense(D, hidden) per
/// position, GELU and Dense(hidden, D) per position. Every weight matrix is a per-position Dense,
/// so K-FAC preconditions all four (a with N·P rows, samples N), and every part has an
/// R-operator (Hessian-vector products, FOSI).
///
/// Parameters, in the block's region of the flat buffer: the attention residual's then the MLP's
/// ("attention.body.<i>.<name>", "mlp.body.<i>.<name>"). Initialization: each sublayer's own
/// (PyTorch's Linear for the Dense layers, γ = 1 and β = 0 for the LayerNorms).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class TransformerEncoderBlock final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  using residual_type = Residual<Scalar, MemorySpace>; ///< a pre-norm residual sub-block

  /// @param input    `{D, H, W}`: D features at each of H·W positions
  /// @param options  heads, MLP width, causal mask, LayerNorm ε (TransformerBlockOptions)
  /// @throws ValueError if heads is 0 or does not divide D.
  TransformerEncoderBlock(FeatureShape input, TransformerBlockOptions options)
      : TransformerEncoderBlock(input, options, make_attention(input, checked(input, options)),
                                make_mlp(input, checked(input, options))) {}

  /// A block of two given residuals: `attention` (x + Attn(LN(x))) and `mlp` (h + MLP(LN(h))),
  /// both taking and giving `input`. The tensor-parallel executor builds them with column- and
  /// row-parallel layers (kat/distributed/tensor_parallel/tensor_parallel_model.hpp).
  /// @throws ValueError for a null residual or bad options; ShapeError if a residual does not
  ///   map `input` to itself.
  TransformerEncoderBlock(FeatureShape input, TransformerBlockOptions options,
                          std::unique_ptr<residual_type> attention,
                          std::unique_ptr<residual_type> mlp)
      : input_(input), options_(checked(input, options)),
        chain_(input, "kat::nn::TransformerEncoderBlock") {
    if (!attention || !mlp) {
      throw ValueError("kat::nn::TransformerEncoderBlock: the attention and mlp residuals must "
                       "not be null");
    }
    attention_ = attention.get();
    mlp_ = mlp.get();
    chain_.add(std::move(attention));
    chain_.add(std::move(mlp));
    if (chain_.output_shape() != input) {
      throw ShapeError(kat::detail::concat("kat::nn::TransformerEncoderBlock: the residuals must "
                                           "map the input shape ",
                                           input, " to itself, got ", chain_.output_shape()));
    }
  }

  /// `o` with mlp_hidden = 0 replaced by 4·D.
  /// @throws ValueError if the input shape is not positive or heads does not divide D.
  static TransformerBlockOptions checked(FeatureShape input, TransformerBlockOptions o) {
    const std::size_t d = static_cast<std::size_t>(input.channels);
    if (input.channels <= 0 || input.height <= 0 || input.width <= 0) {
      throw ValueError(kat::detail::concat(
          "kat::nn::TransformerEncoderBlock: input shape must be positive, got ", input));
    }
    if (o.heads == 0 || d % o.heads != 0) {
      throw ValueError(kat::detail::concat("kat::nn::TransformerEncoderBlock: heads must divide "
                                           "the width D = ",
                                           d, ", got heads = ", o.heads));
    }
    if (o.mlp_hidden == 0) {
      o.mlp_hidden = 4 * d;
    }
    return o;
  }

  /// x + W_o · Attention(W_qkv · LN(x)) for `input` (options as checked by checked()).
  static std::unique_ptr<residual_type> make_attention(FeatureShape input,
                                                       const TransformerBlockOptions &o) {
    const std::size_t d = static_cast<std::size_t>(input.channels);
    auto r = std::make_unique<residual_type>(input);
    r->template add<LayerNorm>(d, o.layer_norm_eps);
    r->template add<Dense>(d, 3 * d, true, DenseInput::per_position);
    r->template add<ScaledDotProductAttention>(o.heads, d / o.heads, o.causal);
    r->template add<Dense>(d, d, true, DenseInput::per_position);
    return r;
  }
  /// h + W₂ · GELU(W₁ · LN(h)) for `input`.
  static std::unique_ptr<residual_type> make_mlp(FeatureShape input,
                                                 const TransformerBlockOptions &o) {
    const std::size_t d = static_cast<std::size_t>(input.channels);
    auto r = std::make_unique<residual_type>(input);
    r->template add<LayerNorm>(d, o.layer_norm_eps);
    r->template add<Dense>(d, o.mlp_hidden, true, DenseInput::per_position);
    r->template add<GELU>();
    r->template add<Dense>(o.mlp_hidden, d, true, DenseInput::per_position);
    return r;
  }

  std::string name() const override { return "TransformerEncoderBlock"; }

  /// The options given at construction.
  const TransformerBlockOptions &options() const { return options_; }
  /// D, the features per position.
  std::size_t width() const { return static_cast<std::size_t>(input_.channels); }
  /// H·W, the positions.
  std::size_t positions() const { return static_cast<std::size_t>(input_.height * input_.width); }
  /// x + Attn(LN₁(x)), mutable.
  residual_type &attention() { return *attention_; }
  /// h + MLP(LN₂(h)), mutable.
  residual_type &mlp() { return *mlp_; }
  /// x + Attn(LN₁(x)), read-only.
  const residual_type &attention() const { return *attention_; }
  /// h + MLP(LN₂(h)), read-only.
  const residual_type &mlp() const { return *mlp_; }

  /// @throws ShapeError unless `input` is the constructor's.
  FeatureShape output_shape(const FeatureShape &input) const override {
    if (input != input_) {
      throw ShapeError(kat::detail::concat("kat::nn::TransformerEncoderBlock: input shape must be ",
                                           input_, ", got ", input));
    }
    return input_;
  }

  /// In scope `name`: the residuals' operators in scopes "attention" and "mlp"
  /// (Residual::describe), so every block of a model is one scope for repeated-block folding.
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                          const std::string &name) const override {
    (void)in;
    graph.push_scope(name);
    x = attention_->describe(graph, x, input_, "attention");
    x = mlp_->describe(graph, x, input_, "mlp");
    graph.pop_scope();
    return x;
  }

  std::size_t parameter_count() const override { return chain_.parameter_count(); }
  std::vector<ParameterSpec> parameter_specs() const override {
    auto specs = chain_.parameter_specs("", 0);
    for (auto &s : specs) {
      s.name = (s.name.compare(0, 2, "0.") == 0 ? "attention." : "mlp.") + s.name.substr(2);
    }
    return specs;
  }
  /// Binds the block's layers' parameters in order.
  void bind(Scalar *params, Scalar *grads) override { chain_.bind(params, grads); }
  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    chain_.reset_parameters(space, seed);
  }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::TransformerEncoderBlock::forward");
    kat::detail::require_extent("kat::nn::TransformerEncoderBlock::forward", "y columns",
                                input_.size(), y.extent(1));
    chain_.forward(space, x, &y); // the MLP residual writes y itself
  }
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::TransformerEncoderBlock::backward");
    chain_.backward(space, dy, dx, this->accumulate_);
  }

  bool supports_r_operator() const override { return chain_.first_without_r_operator() == nullptr; }
  /// Binds the direction's and the product's blocks, laid out like bind()'s.
  void bind_direction(Scalar *v, Scalar *hv) override { chain_.bind_direction(v, hv); }
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::TransformerEncoderBlock::forward_r");
    chain_.forward_r(space, rx, &ry);
  }
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::TransformerEncoderBlock::backward_r");
    chain_.backward_r_after_backward(space, dy, rdy, rdx);
  }

  void train(bool on) override {
    base::train(on);
    chain_.train(on);
  }
  std::vector<base *> sublayers() override { return {attention_, mlp_}; }

  /// The two residuals' states as "attention.<entry>" and "mlp.<entry>" (empty unless a
  /// sublayer keeps state).
  StateDict state_dict() const override {
    StateDict s;
    s.merge("attention", attention_->state_dict());
    s.merge("mlp", mlp_->state_dict());
    return s;
  }
  void check_state_dict(const StateDict &state) const override {
    for (const auto &entry : state.entries()) {
      const std::string &n = entry.first;
      if (n.compare(0, 10, "attention.") != 0 && n.compare(0, 4, "mlp.") != 0) {
        throw StateError(kat::detail::concat(
            "kat::nn::TransformerEncoderBlock::load_state_dict: unexpected state entry '", n, "'"));
      }
    }
    attention_->check_state_dict(state.sub("attention"));
    mlp_->check_state_dict(state.sub("mlp"));
  }
  void load_state_dict(const StateDict &state) override {
    check_state_dict(state);
    attention_->load_state_dict(state.sub("attention"));
    mlp_->load_state_dict(state.sub("mlp"));
  }

private:
  FeatureShape input_;
  TransformerBlockOptions options_;
  detail::LayerChain<Scalar, MemorySpace> chain_;
  residual_type *attention_ = nullptr;
  residual_type *mlp_ = nullptr;
};

} // namespace kat::nn
