#pragma once
/// @file
/// @brief A chain of layers over one flat parameter buffer.

#include "kat/core/error.hpp"
#include "kat/core/parameter_buffer.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/layer_chain.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kat::nn {

/// Layers applied in order. The model owns one flat parameter vector and one flat gradient
/// vector (ParameterBuffer); each layer's weights are views into them. Activations and their
/// gradients live in per-layer workspaces sized for the largest batch seen, so a training
/// loop allocates only during its first step.
///
/// @code
/// kat::nn::Sequential<> model(kat::FeatureShape{1, 28, 28});
/// model.add<kat::nn::Flatten>();
/// model.add<kat::nn::Dense>(784, 256);
/// model.add<kat::nn::ReLU>();
/// model.add<kat::nn::Dense>(256, 10);
/// model.compile(space, /*seed=*/42);
/// auto logits = model.forward(space, x);   // x: N x 784
/// @endcode
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class Sequential {
public:
  using layer_type = Layer<Scalar, MemorySpace>;                 ///< the layers' base class
  using execution_space = typename MemorySpace::execution_space; ///< where the model runs
  using matrix_type = Matrix<Scalar, MemorySpace>; ///< a batch: batch x features, column-major
  using vector_type = Vector<Scalar, MemorySpace>; ///< a flat parameter-length vector

  /// How backward() treats gradients().
  enum class Gradients {
    accumulate, ///< add to them (call zero_grad() first), as PyTorch does
    overwrite   ///< replace them: no zero_grad() needed, one pass over the buffer less
  };

  /// @param input_shape  the shape of one input sample
  /// @throws ValueError if the shape is empty.
  explicit Sequential(FeatureShape input_shape) : chain_(input_shape, "kat::nn::Sequential") {
    if (input_shape.size() == 0) {
      throw ValueError(kat::detail::concat("kat::nn::Sequential: input_shape must be non-empty, "
                                           "got ",
                                           input_shape));
    }
  }

  /// Constructs a `L<Scalar, MemorySpace>` from `args` and appends it.
  /// @throws ShapeError if the layer cannot take the previous layer's output shape.
  template <template <class, class> class L, class... Args>
  L<Scalar, MemorySpace> &add(Args &&...args) {
    auto layer = std::make_unique<L<Scalar, MemorySpace>>(std::forward<Args>(args)...);
    auto &ref = *layer;
    add(std::move(layer));
    return ref;
  }

  /// Appends a layer. @throws Error after compile(); ShapeError on a shape mismatch.
  layer_type &add(std::unique_ptr<layer_type> layer) {
    if (compiled()) {
      throw Error("kat::nn::Sequential::add: the model is already compiled");
    }
    return chain_.add(std::move(layer));
  }

  /// Allocates the flat buffers, binds every layer to its block, and initializes parameters
  /// as a pure function of `seed` (identical on every backend).
  /// @throws Error if called twice or on an empty model.
  void compile(const execution_space &space, std::uint64_t seed) {
    if (compiled()) {
      throw Error("kat::nn::Sequential::compile: already compiled");
    }
    if (chain_.empty()) {
      throw Error("kat::nn::Sequential::compile: the model has no layers");
    }
    for (std::size_t i = 0; i < chain_.size(); ++i) {
      buffer_.reserve(kat::detail::concat(i, ".", chain_.layers()[i]->name()),
                      chain_.layers()[i]->parameter_count());
    }
    buffer_.allocate();
    chain_.bind(buffer_.parameters().data(), buffer_.gradients().data());
    chain_.reset_parameters(space, seed);
    compiled_ = true;
  }

  /// Whether compile() has run.
  bool compiled() const { return compiled_; }

  /// Runs every layer; returns the output (batch x output_shape().size()), valid until the
  /// next forward. `x` (batch x input_shape().size()) must stay valid until backward().
  /// @throws ShapeError if x has the wrong number of columns.
  const matrix_type &forward(const execution_space &space, const matrix_type &x) {
    require_compiled("forward");
    ScopedRegion region("kat::nn::Sequential::forward");
    // Input and output in KAT's layout; inside, oneDNN's blocked layout between the layers
    // that compute in it (see kat::ActivationLayout), chosen again for every forward since
    // it depends on the layers' modes (training, recording curvature).
    chain_.negotiate_layouts(ActivationLayout::features, ActivationLayout::features);
    chain_.fuse_relus();
    return chain_.forward(space, x);
  }

  /// Back-propagates dy = dL/d(output) (batch x output size) through every layer, adding to
  /// gradients() or overwriting them.
  void backward(const execution_space &space, const matrix_type &dy,
                Gradients mode = Gradients::accumulate) {
    require_compiled("backward");
    ScopedRegion region("kat::nn::Sequential::backward");
    chain_.backward(space, dy, matrix_type(), mode == Gradients::accumulate);
  }

  /// Called by backward() after each layer's backward, with the layer's index i (the index
  /// into layers() and into buffer().blocks(), whose block i holds layer i's parameters).
  using BackwardHook = std::function<void(std::size_t)>;

  /// Installs `hook`, called by every later backward() right after layer i's backward has
  /// been enqueued on the execution space, for i = layers().size() - 1 down to 0 (pass-through
  /// and parameter-free layers included). When it runs, layer i's gradient block is final for
  /// this backward (possibly still being written by kernels on the space: fence, or use a
  /// call that fences, before reading it on the host), and so are the blocks of every later
  /// layer. Data-parallel training uses it to start all-reducing gradient buckets while
  /// backward goes on (kat::distributed::DataParallel::backward_hook). The hook may throw; the
  /// exception leaves backward() with the remaining layers not processed.
  /// An empty function removes the hook; without one backward() pays one branch per layer.
  void set_backward_hook(BackwardHook hook) { chain_.set_backward_hook(std::move(hook)); }
  /// Removes the backward hook.
  void clear_backward_hook() { chain_.set_backward_hook(BackwardHook()); }
  /// Whether a backward hook is installed.
  bool has_backward_hook() const { return chain_.has_backward_hook(); }

  /// @name R-operator passes (Pearlmutter 1994), the parts of an exact Hessian-vector product
  /// kat::nn::hessian_vector_product (kat/nn/hessian_vector_product.hpp) composes them with a
  /// loss; most users want that. Each layer's R-operator is documented in Layer.
  /// @{

  /// The parameter direction v (length parameter_count(), laid out like parameters()) that
  /// forward_r() differentiates along; allocated on first use, then reused. Fill it before
  /// forward_r().
  const vector_type &direction() {
    require_compiled("direction");
    ensure_direction();
    return direction_;
  }
  /// The product buffer: after backward_r(), R{∂L/∂θ} for the direction (H v when dy is the
  /// gradient of a loss L and rdy its R{dy}).
  const vector_type &direction_product() {
    require_compiled("direction_product");
    ensure_direction();
    return direction_product_;
  }

  /// Whether every layer has an R-operator (Layer::supports_r_operator()).
  bool supports_r_operator() const { return chain_.first_without_r_operator() == nullptr; }

  /// After forward(x): R{output} (batch x output size) along direction(), with R{x} = 0.
  /// Valid until the next forward_r(); extent 0 if the model has no parameters.
  /// @throws Error naming the first layer without an R-operator, or before forward().
  const matrix_type &forward_r(const execution_space &space) {
    require_compiled("forward_r");
    require_r_operator("forward_r");
    ensure_direction();
    ScopedRegion region("kat::nn::Sequential::forward_r");
    return chain_.forward_r(space, matrix_type());
  }

  /// After forward_r(): back-propagates dy and rdy = R{dy} together and overwrites
  /// direction_product() with R{∂L/∂θ}. The layers skip the parameter gradients of this pass
  /// where they can (Layer::compute_parameter_gradients), and what they write goes to a
  /// scratch buffer: gradients() is left as it was, and no backward hook runs.
  /// @throws Error naming the first layer without an R-operator, or before forward_r();
  ///   ShapeError if dy or rdy is not batch x output size.
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy) {
    require_compiled("backward_r");
    require_r_operator("backward_r");
    ensure_direction();
    ScopedRegion region("kat::nn::Sequential::backward_r");
    Kokkos::deep_copy(space, direction_product_, Scalar(0));
    const GradientsRebound rebound(*this, scratch_gradients_);
    chain_.backward_r(space, dy, rdy, matrix_type(), matrix_type(), /*accumulate=*/false,
                      /*parameter_gradients=*/false);
  }

  /// After forward(): back-propagates `dy` (batch x output size) through the network
  /// linearized at that forward and overwrites direction_product() with Jᵀ dy, J = ∂ output /
  /// ∂θ (with dy = H_L J v from forward_r(), Jᵀ H_L J v: the Gauss-Newton product). Runs the
  /// layers' ordinary backward; gradients() is left as it was, and no backward hook runs.
  /// @throws Error before forward(); ShapeError if dy is not batch x output size.
  void backward_to_direction_product(const execution_space &space, const matrix_type &dy) {
    require_compiled("backward_to_direction_product");
    ensure_direction();
    ScopedRegion region("kat::nn::Sequential::backward_to_direction_product");
    const GradientsRebound rebound(*this, direction_product_);
    const BackwardHook hook = chain_.take_backward_hook();
    try {
      chain_.backward(space, dy, matrix_type(), /*accumulate=*/false);
    } catch (...) {
      chain_.set_backward_hook(hook);
      throw;
    }
    chain_.set_backward_hook(hook);
  }
  /// @}

  /// Sets every gradient to zero.
  void zero_grad(const execution_space &space) {
    require_compiled("zero_grad");
    Kokkos::deep_copy(space, buffer_.gradients(), Scalar(0));
  }

  /// The flat parameter vector (length parameter_count()).
  const vector_type &parameters() const { return buffer_.parameters(); }
  /// The flat gradient vector (length parameter_count()).
  const vector_type &gradients() const { return buffer_.gradients(); }
  /// The flat buffers and their blocks: after compile(), block i ("i.<layer name>") is layer
  /// i's parameters, [offset, offset + size) of parameters() and gradients(), in layer order
  /// and contiguous (size 0 for layers without parameters).
  const ParameterBuffer<Scalar, MemorySpace> &buffer() const { return buffer_; }
  /// Scalars in the flat parameter buffer, over all layers.
  std::size_t parameter_count() const { return chain_.parameter_count(); }

  /// Every parameter tensor of the model, in flat-buffer order: "<i>.<name>" for layer i
  /// ("<i>.body.<j>.<name>" inside a Residual), offsets into parameters() and gradients().
  /// Masks, weight-decay exclusions and checkpoints address weights by these names.
  std::vector<ParameterSpec> parameter_specs() const { return chain_.parameter_specs("", 0); }

  /// The model's state (kat/core/state.hpp): "parameters" (Scalar, [parameter_count()]) and
  /// each layer's own state (running statistics, mask counters) as "layers.<i>.<entry>"
  /// (nested containers add their own parts: "layers.<i>.body.<j>.<entry>"). Fences.
  /// @throws Error before compile().
  StateDict state_dict() const {
    require_compiled("state_dict");
    StateDict s;
    s.set_view("parameters", buffer_.parameters());
    chain_.save_state(s, "layers");
    return s;
  }

  /// Restores what state_dict() saved into a model of the same architecture, after checking
  /// every entry (a failed load changes nothing). Gradients are untouched.
  /// @throws StateError naming the first entry that is missing, unexpected or of another
  ///   dtype or shape; Error before compile().
  void load_state_dict(const StateDict &state) {
    require_compiled("load_state_dict");
    for (const auto &entry : state.entries()) {
      if (entry.first != "parameters" && entry.first.compare(0, 7, "layers.") != 0) {
        throw StateError(kat::detail::concat("kat::nn::Sequential::load_state_dict: unexpected "
                                             "state entry '",
                                             entry.first, "'"));
      }
    }
    state.checked<Scalar>("parameters", {static_cast<std::uint64_t>(parameter_count())});
    chain_.check_state(state, "layers");
    state.copy_to("parameters", buffer_.parameters());
    chain_.load_state(state, "layers");
  }

  /// The layers, in order.
  const std::vector<std::unique_ptr<layer_type>> &layers() const { return chain_.layers(); }
  /// Layer i. @throws std::out_of_range for i >= layers().size()
  layer_type &layer(std::size_t i) { return *chain_.layers().at(i); }

  /// Training mode (Dropout active, batch statistics in BatchNorm).
  void train() { set_training(true); }
  /// Evaluation mode.
  void eval() { set_training(false); }
  /// Whether the model is in training mode.
  bool training() const { return training_; }

  /// Mixed precision: the forward and backward matrix products and convolutions of every
  /// layer present (and their sublayers) in `p` (Layer::set_precision; kat::Precision says
  /// which operations change). Parameters, gradients and the flat buffers stay in Scalar, so
  /// optimizers, preconditioners and checkpoints see no difference. Call after the layers
  /// are added; may be changed between steps.
  void set_precision(Precision p) {
    precision_ = p;
    chain_.set_precision(p);
  }
  /// The precision last given to set_precision() (fp32 by default).
  Precision precision() const { return precision_; }

  /// The shape of one input sample.
  FeatureShape input_shape() const { return chain_.input_shape(); }
  /// The shape of one output sample.
  FeatureShape output_shape() const { return chain_.output_shape(); }

  /// Total (re)allocations of the activation workspaces; constant once training is steady.
  /// (kat::AllocationTracker counts every allocation, layers' own workspaces included.)
  std::size_t workspace_allocations() const { return chain_.workspace_allocations(); }

  /// One line per layer: index, name, output shape, parameter count.
  /// The model as a graph of operators (kat::plan::Graph, for tensor-parallel planning): an
  /// input "input" of graph_shape(batch, input_shape()), then each layer i under the name "i"
  /// (containers as scopes "i", their layers named by the parameter names' paths, e.g.
  /// "2.attention.body.1"), in the precision of Scalar.
  /// @throws ValueError if batch < 1.
  plan::Graph describe(std::int64_t batch) const {
    if (batch < 1) {
      throw ValueError(
          kat::detail::concat("kat::nn::Sequential::describe: batch must be >= 1, got ", batch));
    }
    plan::Graph graph(static_cast<std::int64_t>(sizeof(Scalar)), "kat::nn::Sequential");
    const plan::TensorId x = graph.add_input("input", graph_shape(batch, input_shape()));
    chain_.describe(graph, x);
    return graph;
  }

  /// One line per layer (index, name, output shape, parameters) and the total.
  std::string summary() const {
    std::ostringstream os;
    os << "input " << input_shape() << '\n';
    for (std::size_t i = 0; i < chain_.size(); ++i) {
      os << "  " << i << ' ' << chain_.layers()[i]->name() << " -> " << chain_.shape_after(i)
         << ", " << chain_.layers()[i]->parameter_count() << " parameters\n";
    }
    os << "total " << parameter_count() << " parameters";
    return os.str();
  }

private:
  void require_compiled(const char *what) const {
    if (!compiled_) {
      throw Error(kat::detail::concat("kat::nn::Sequential::", what, ": call compile() first"));
    }
  }
  void require_r_operator(const char *what) const {
    if (const auto *layer = chain_.first_without_r_operator()) {
      throw Error(kat::detail::concat("kat::nn::Sequential::", what, ": layer ", layer->name(),
                                      " has no R-operator (Layer::supports_r_operator()), so "
                                      "the model has no exact Hessian-vector product"));
    }
  }
  void ensure_direction() {
    if (direction_.extent(0) != parameter_count()) {
      direction_ = vector_type("kat::nn::Sequential::direction", parameter_count());
      direction_product_ = vector_type("kat::nn::Sequential::direction_product", parameter_count());
      scratch_gradients_ = vector_type("kat::nn::Sequential::scratch_gradients", parameter_count());
      chain_.bind_direction(direction_.data(), direction_product_.data());
    }
  }
  // Binds the layers' gradients to `to` for its lifetime, then back to gradients().
  struct GradientsRebound {
    GradientsRebound(Sequential &m, const vector_type &to) : model(m) {
      model.chain_.bind(model.buffer_.parameters().data(), to.data());
    }
    ~GradientsRebound() {
      model.chain_.bind(model.buffer_.parameters().data(), model.buffer_.gradients().data());
    }
    GradientsRebound(const GradientsRebound &) = delete;
    GradientsRebound &operator=(const GradientsRebound &) = delete;
    Sequential &model;
  };
  void set_training(bool on) {
    training_ = on;
    chain_.train(on);
  }

  detail::LayerChain<Scalar, MemorySpace> chain_;
  ParameterBuffer<Scalar, MemorySpace> buffer_;
  vector_type direction_, direction_product_, scratch_gradients_;
  bool compiled_ = false;
  bool training_ = true;
  Precision precision_ = Precision::fp32;
};

} // namespace kat::nn
