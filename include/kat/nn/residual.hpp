#pragma once
/// @file
/// @brief Residual block y = f(x) + s(x), with s the identity or a projection.

#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/activation.hpp"
#include "kat/nn/detail/layer_chain.hpp"
#include "kat/nn/detail/residual_kernels.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::nn {

namespace detail {

/// c = a + b element-wise over equally shaped contiguous matrices (c may alias a), or
/// c = max(0, a + b) with `relu`; with `bf16` the matrices hold bf16 values
/// (ActivationLayout::channels_last_bf16, channels16_bf16), summed in fp32 and rounded once.
template <class ExecSpace, class MatrixView>
void elementwise_add(const ExecSpace &space, const MatrixView &a, const MatrixView &b,
                     const MatrixView &c, bool relu = false, bool bf16 = false) {
  using value = typename MatrixView::non_const_value_type;
  if (bf16) {
    const auto *ap = reinterpret_cast<const bfloat16 *>(a.data());
    const auto *bp = reinterpret_cast<const bfloat16 *>(b.data());
    auto *cp = reinterpret_cast<bfloat16 *>(c.data());
    if (relu) {
      parallel_for_elements("kat::nn::Residual::add_relu_bf16", space, c.span(),
                            ResidualAddBf16<true>{ap, bp, cp});
    } else {
      parallel_for_elements("kat::nn::Residual::add_bf16", space, c.span(),
                            ResidualAddBf16<false>{ap, bp, cp});
    }
    return;
  }
  const value *ap = a.data();
  const value *bp = b.data();
  value *cp = c.data();
  if (relu) {
    parallel_for_elements("kat::nn::Residual::add_relu", space, c.span(),
                          ResidualAddRelu<value>{ap, bp, cp});
    return;
  }
  parallel_for_elements("kat::nn::Residual::add", space, c.span(), ResidualAdd<value>{ap, bp, cp});
}

} // namespace detail

/// Residual connection (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016,
/// eq. (1) and, with a shortcut chain, eq. (2)): y = f(x) + s(x), where f is the body chain
/// and s the shortcut chain — the identity when empty, typically a 1x1 strided Conv2d with
/// BatchNorm when the body changes the shape.
///
/// Build the block completely, then add it to a Sequential:
/// @code
/// auto block = std::make_unique<kat::nn::Residual<>>(kat::FeatureShape{16, 28, 28});
/// block->add<kat::nn::Conv2d>(16, 32, 3, 2, 1);
/// block->add<kat::nn::BatchNorm2d>(32);
/// block->add_shortcut<kat::nn::Conv2d>(16, 32, 1, 2, 0, 1, false);
/// model.add(std::move(block));
/// @endcode
/// The block's parameters are its body's followed by its shortcut's, inside the block's one
/// region of the model's flat buffer.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Residual final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @param input  the shape the block takes
  explicit Residual(FeatureShape input)
      : input_(input), body_(input, "kat::nn::Residual(body)"),
        shortcut_(input, "kat::nn::Residual(shortcut)"), sum_ws_("kat::nn::Residual::dx"),
        r_sum_ws_("kat::nn::Residual::rdx") {}

  /// Appends a `L<Scalar, MemorySpace>` to the body f.
  template <template <class, class> class L, class... Args>
  L<Scalar, MemorySpace> &add(Args &&...args) {
    auto layer = std::make_unique<L<Scalar, MemorySpace>>(std::forward<Args>(args)...);
    auto &ref = *layer;
    body_.add(std::move(layer));
    return ref;
  }
  /// Appends a `L<Scalar, MemorySpace>` to the shortcut s.
  template <template <class, class> class L, class... Args>
  L<Scalar, MemorySpace> &add_shortcut(Args &&...args) {
    auto layer = std::make_unique<L<Scalar, MemorySpace>>(std::forward<Args>(args)...);
    auto &ref = *layer;
    shortcut_.add(std::move(layer));
    return ref;
  }

  std::string name() const override { return "Residual"; }

  /// @throws ShapeError if `input` differs from the constructor's, the body is empty, or the
  /// body's and shortcut's outputs differ.
  FeatureShape output_shape(const FeatureShape &input) const override {
    if (input != input_) {
      throw ShapeError(
          kat::detail::concat("kat::nn::Residual: input shape must be ", input_, ", got ", input));
    }
    if (body_.empty()) {
      throw ShapeError("kat::nn::Residual: the body has no layers");
    }
    if (body_.output_shape() != shortcut_.output_shape()) {
      throw ShapeError(
          kat::detail::concat("kat::nn::Residual: the body's output shape ", body_.output_shape(),
                              " must equal the shortcut's ", shortcut_.output_shape(),
                              shortcut_.empty() ? " (identity shortcut: add a projection)" : ""));
    }
    return body_.output_shape();
  }

  std::size_t parameter_count() const override {
    return body_.parameter_count() + shortcut_.parameter_count();
  }
  /// The body's then the shortcut's tensors, as "body.<i>.<name>" and "shortcut.<i>.<name>".
  std::vector<ParameterSpec> parameter_specs() const override {
    std::vector<ParameterSpec> specs = body_.parameter_specs("body", 0);
    const auto s = shortcut_.parameter_specs("shortcut", body_.parameter_count());
    specs.insert(specs.end(), s.begin(), s.end());
    return specs;
  }

  /// Binds the body's parameters, then the shortcut's after them.
  void bind(Scalar *params, Scalar *grads) override {
    body_.bind(params, grads);
    const std::size_t nb = body_.parameter_count();
    shortcut_.bind(params + nb, grads + nb);
  }
  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    body_.reset_parameters(space, counter_bits(seed, 0xb0d7u, 0));
    shortcut_.reset_parameters(space, counter_bits(seed, 0x5c07u, 0));
  }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::Residual::forward");
    // y = f(x) + s(x) element-wise: both branches take x and give y in the layout the
    // enclosing container chose (the same for input and output, see supports_layouts()).
    body_.negotiate_layouts(this->in_layout_, this->out_layout_);
    shortcut_.negotiate_layouts(this->in_layout_, this->out_layout_);
    body_.fuse_relus();
    shortcut_.fuse_relus();
    const matrix_type &fx = body_.forward(space, x);
    const matrix_type &sx = shortcut_.empty() ? x : shortcut_.forward(space, x);
    kat::detail::require_extent("kat::nn::Residual::forward", "y columns", fx.extent(1),
                                y.extent(1));
    forward_fused_ = this->fused_relu_;
    forward_bf16_ = layout_stores_bf16(this->in_layout_);
    relu_.remember(y, this->in_layout_);
    detail::elementwise_add(space, fx, sx, y, forward_fused_, forward_bf16_);
  }

  /// In scope `name`: the body's layers in scope "body", the shortcut's in "shortcut", and an
  /// "Add" operator "add" of the two (of the body's output and x for an identity shortcut).
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                          const std::string &name) const override {
    graph.push_scope(name);
    graph.push_scope("body");
    const plan::TensorId f = body_.describe(graph, x);
    graph.pop_scope();
    plan::TensorId s = x;
    if (!shortcut_.empty()) {
      graph.push_scope("shortcut");
      s = shortcut_.describe(graph, x);
      graph.pop_scope();
    }
    const plan::TensorId y =
        graph.add("Add", "add", {f, s}, graph_shape(graph.tensor(x).shape[0], output_shape(in)));
    graph.pop_scope();
    return y;
  }

  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Residual::backward");
    const bool acc = this->accumulate_;
    if (forward_fused_) {
      // The fused ReLU's backward: dy where y > 0, 0 elsewhere, for both branches.
      backward_branches(space, relu_.mask(space, dy), dx, acc);
      return;
    }
    backward_branches(space, dy, dx, acc);
  }

  /// In training, unless an R-operator direction is bound (the R passes would need the
  /// mask too): y = max(0, f(x) + s(x)) in one pass.
  bool can_fuse_relu() const override { return this->training_ && !direction_bound_; }

private:
  void backward_branches(const execution_space &space, const matrix_type &dy, const matrix_type &dx,
                         bool acc) {
    if (dx.extent(0) == 0) {
      body_.backward(space, dy, dx, acc);
      if (!shortcut_.empty()) {
        shortcut_.backward(space, dy, dx, acc);
      }
      return;
    }
    // dL/dx = f'(x)ᵀ dy + s'(x)ᵀ dy: the body writes into dx, the shortcut's part is added.
    body_.backward(space, dy, dx, acc);
    if (shortcut_.empty()) {
      detail::elementwise_add(space, dx, dy, dx, false, forward_bf16_);
      return;
    }
    const matrix_type ds = sum_ws_.matrix(dx.extent(0), dx.extent(1));
    shortcut_.backward(space, dy, ds, acc);
    detail::elementwise_add(space, dx, ds, dx, false, forward_bf16_);
  }

public:
  /// @name R-operator (see Layer)
  /// y = f(x) + s(x) gives R{y} = R{f(x)} + R{s(x)} and R{dx} = R{f's dx} + R{s's dx}: the body's
  /// and the shortcut's chains run their R passes (an identity shortcut contributes R{x} and
  /// R{dy}), on the direction's blocks laid out as bind() lays out the parameters. An rx of
  /// extent 0 (R{x} = 0) is handed to both chains as such.
  /// @{

  /// Whether every layer of the body and of the shortcut has an R-operator.
  bool supports_r_operator() const override {
    return body_.first_without_r_operator() == nullptr &&
           shortcut_.first_without_r_operator() == nullptr;
  }

  /// Binds the direction's and the product's blocks, laid out like bind()'s.
  void bind_direction(Scalar *v, Scalar *hv) override {
    direction_bound_ = true;
    body_.bind_direction(v, hv);
    const std::size_t nb = body_.parameter_count();
    shortcut_.bind_direction(v + nb, hv + nb);
  }

  /// ry = R{f(x)} + R{s(x)} after forward(), for R{x} = rx (extent 0: zero).
  /// @throws Error naming a layer without an R-operator, or before forward().
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::Residual::forward_r");
    require_r_operator("forward_r");
    require_unfused("forward_r");
    // Extent 0 stands for zero in both.
    const matrix_type rf = body_.forward_r(space, rx);
    const matrix_type rs = shortcut_.empty() ? rx : shortcut_.forward_r(space, rx);
    const char *where = "kat::nn::Residual::forward_r";
    kat::detail::require_extent(where, "ry columns", body_.output_shape().size(), ry.extent(1));
    const std::size_t rows = rf.extent(0) != 0 ? rf.extent(0) : rs.extent(0);
    if (rows != 0) {
      kat::detail::require_extent(where, "ry rows", rows, ry.extent(0));
    }
    if (rf.extent(0) != 0 && rs.extent(0) != 0) {
      detail::elementwise_add(space, rf, rs, ry);
    } else if (rf.extent(0) != 0) {
      Kokkos::deep_copy(space, ry, rf);
    } else if (rs.extent(0) != 0) {
      Kokkos::deep_copy(space, ry, rs);
    } else {
      Kokkos::deep_copy(space, ry, Scalar(0));
    }
  }

  /// After forward(), forward_r() and backward(dy, ·): adds the body's and the shortcut's
  /// R{∂L/∂θ} to the bound product buffer and, unless rdx is empty, writes rdx = R{dx}.
  /// @throws Error naming a layer without an R-operator, or out of order.
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::Residual::backward_r");
    require_r_operator("backward_r");
    require_unfused("backward_r");
    body_.backward_r_after_backward(space, dy, rdy, rdx);
    if (shortcut_.empty()) {
      if (rdx.extent(0) != 0) {
        detail::elementwise_add(space, rdx, rdy, rdx);
      }
      return;
    }
    if (rdx.extent(0) == 0) {
      shortcut_.backward_r_after_backward(space, dy, rdy, rdx);
      return;
    }
    const matrix_type rds = r_sum_ws_.matrix(rdx.extent(0), rdx.extent(1));
    shortcut_.backward_r_after_backward(space, dy, rdy, rds);
    detail::elementwise_add(space, rdx, rds, rdx);
  }
  /// @}

  /// The same layout in and out (the addition is element-wise, and an identity shortcut
  /// passes x through), one both branches can take to itself; channels_last_bf16 and
  /// channels16_bf16 only in Precision::bf16 (the sums are then rounded to bf16, as
  /// autocast's are).
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    return in == out && (!layout_stores_bf16(in) || this->precision_ == Precision::bf16) &&
           body_.layouts_feasible(in, out) && shortcut_.layouts_feasible(in, out);
  }

  void train(bool on) override {
    base::train(on);
    body_.train(on);
    shortcut_.train(on);
  }

  std::vector<base *> sublayers() override {
    std::vector<base *> all;
    for (const auto &l : body_.layers())
      all.push_back(l.get());
    for (const auto &l : shortcut_.layers())
      all.push_back(l.get());
    return all;
  }

  /// The body's and the shortcut's layer states, as "body.<i>.<entry>" and
  /// "shortcut.<i>.<entry>".
  StateDict state_dict() const override {
    StateDict s;
    body_.save_state(s, "body");
    shortcut_.save_state(s, "shortcut");
    return s;
  }
  void check_state_dict(const StateDict &state) const override {
    for (const auto &entry : state.entries()) {
      const std::string &n = entry.first;
      if (n.compare(0, 5, "body.") != 0 && n.compare(0, 9, "shortcut.") != 0) {
        throw StateError(kat::detail::concat("kat::nn::Residual::load_state_dict: unexpected "
                                             "state entry '",
                                             n, "'"));
      }
    }
    body_.check_state(state, "body");
    shortcut_.check_state(state, "shortcut");
  }
  void load_state_dict(const StateDict &state) override {
    check_state_dict(state);
    body_.load_state(state, "body");
    shortcut_.load_state(state, "shortcut");
  }

  /// The body's layers F (an internal chain; see sublayers() for the layers themselves).
  const detail::LayerChain<Scalar, MemorySpace> &body() const { return body_; }
  /// The shortcut's layers (empty: the identity).
  const detail::LayerChain<Scalar, MemorySpace> &shortcut() const { return shortcut_; }

  /// (Re)allocations of the block's own workspaces so far.
  std::size_t workspace_allocations() const {
    return body_.workspace_allocations() + shortcut_.workspace_allocations() +
           sum_ws_.allocations() + r_sum_ws_.allocations() + relu_.allocations();
  }

private:
  void require_r_operator(const char *what) const {
    const auto *layer = body_.first_without_r_operator();
    if (layer == nullptr) {
      layer = shortcut_.first_without_r_operator();
    }
    if (layer != nullptr) {
      throw Error(kat::detail::concat("kat::nn::Residual::", what, ": layer ", layer->name(),
                                      " has no R-operator"));
    }
  }

  void require_unfused(const char *what) const {
    if (forward_fused_) {
      throw Error(kat::detail::concat("kat::nn::Residual::", what,
                                      ": the last forward() applied the following ReLU itself "
                                      "(a training forward before a direction was bound); run "
                                      "forward() again"));
    }
  }

  FeatureShape input_;
  detail::LayerChain<Scalar, MemorySpace> body_, shortcut_;
  Workspace<Scalar, MemorySpace> sum_ws_, r_sum_ws_;
  detail::FusedReluBackward<Scalar, MemorySpace> relu_{"kat::nn::Residual::relu_backward"};
  bool forward_fused_ = false; // whether the last forward applied the following ReLU
  bool forward_bf16_ = false;  // whether the last forward ran on bf16 values
  bool direction_bound_ = false;
};

} // namespace kat::nn
