#pragma once
/// @file
/// @brief A chain of layers over one flat parameter buffer.

#include "kat/core/error.hpp"
#include "kat/core/parameter_buffer.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
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
  using layer_type = Layer<Scalar, MemorySpace>;
  using execution_space = typename MemorySpace::execution_space;
  using matrix_type = Matrix<Scalar, MemorySpace>;
  using vector_type = Vector<Scalar, MemorySpace>;

  /// @param input_shape  the shape of one input sample
  explicit Sequential(FeatureShape input_shape) : input_shape_(input_shape) {
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
    if (!layer) {
      throw ValueError("kat::nn::Sequential::add: layer must not be null");
    }
    const FeatureShape in = output_shape();
    FeatureShape out;
    try {
      out = layer->output_shape(in);
    } catch (const ShapeError &e) {
      throw ShapeError(kat::detail::concat("kat::nn::Sequential: layer ", layers_.size(), " (",
                                           layer->name(), ") cannot take input shape ", in, ": ",
                                           e.what()));
    }
    shapes_.push_back(out);
    layers_.push_back(std::move(layer));
    return *layers_.back();
  }

  /// Allocates the flat buffers, binds every layer to its block, and initializes parameters
  /// as a pure function of `seed` (identical on every backend).
  /// @throws Error if called twice or on an empty model.
  void compile(const execution_space &space, std::uint64_t seed) {
    if (compiled()) {
      throw Error("kat::nn::Sequential::compile: already compiled");
    }
    if (layers_.empty()) {
      throw Error("kat::nn::Sequential::compile: the model has no layers");
    }
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      buffer_.reserve(kat::detail::concat(i, ".", layers_[i]->name()),
                      layers_[i]->parameter_count());
    }
    buffer_.allocate();
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const auto &block = buffer_.blocks()[i];
      layers_[i]->bind(buffer_.parameters().data() + block.offset,
                       buffer_.gradients().data() + block.offset);
      layers_[i]->reset_parameters(space, counter_bits(seed, 0x5e9u, i));
    }
    activations_.resize(layers_.size());
    input_grads_.resize(layers_.size());
    compiled_ = true;
  }

  bool compiled() const { return compiled_; }

  /// Runs every layer; returns the output (batch x output_shape().size()), valid until the
  /// next forward. `x` (batch x input_shape().size()) must stay valid until backward().
  /// @throws ShapeError if x has the wrong number of columns.
  const matrix_type &forward(const execution_space &space, const matrix_type &x) {
    require_compiled("forward");
    ScopedRegion region("kat::nn::Sequential::forward");
    kat::detail::require_extent("kat::nn::Sequential::forward", "x columns", input_shape_.size(),
                                x.extent(1));
    const std::size_t n = x.extent(0);
    outputs_.resize(layers_.size());
    const matrix_type *in = &x;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      outputs_[i] = activations_[i].matrix(n, shapes_[i].size());
      layers_[i]->forward(space, *in, outputs_[i]);
      in = &outputs_[i];
    }
    return outputs_.back();
  }

  /// How backward() treats gradients().
  enum class Gradients {
    accumulate, ///< add to them (call zero_grad() first), as PyTorch does
    overwrite   ///< replace them: no zero_grad() needed, one pass over the buffer less
  };

  /// Back-propagates dy = dL/d(output) (batch x output size) through every layer, adding to
  /// gradients() or overwriting them.
  void backward(const execution_space &space, const matrix_type &dy,
                Gradients mode = Gradients::accumulate) {
    require_compiled("backward");
    ScopedRegion region("kat::nn::Sequential::backward");
    if (outputs_.empty()) {
      throw Error("kat::nn::Sequential::backward: call forward() first");
    }
    const std::size_t n = outputs_.back().extent(0);
    kat::detail::require_extent("kat::nn::Sequential::backward", "dy rows", n, dy.extent(0));
    kat::detail::require_extent("kat::nn::Sequential::backward", "dy columns",
                                output_shape().size(), dy.extent(1));
    const matrix_type *grad_out = &dy;
    grad_in_views_.resize(layers_.size());
    for (std::size_t i = layers_.size(); i-- > 0;) {
      matrix_type dx;
      if (i > 0) {
        dx = input_grads_[i].matrix(n, shapes_[i - 1].size());
      }
      layers_[i]->accumulate_gradients(mode == Gradients::accumulate);
      layers_[i]->backward(space, *grad_out, dx);
      grad_in_views_[i] = dx;
      grad_out = &grad_in_views_[i];
    }
  }

  /// Sets every gradient to zero.
  void zero_grad(const execution_space &space) {
    require_compiled("zero_grad");
    Kokkos::deep_copy(space, buffer_.gradients(), Scalar(0));
  }

  /// The flat parameter vector (length parameter_count()).
  const vector_type &parameters() const { return buffer_.parameters(); }
  /// The flat gradient vector (length parameter_count()).
  const vector_type &gradients() const { return buffer_.gradients(); }
  const ParameterBuffer<Scalar, MemorySpace> &buffer() const { return buffer_; }
  std::size_t parameter_count() const { return buffer_.size(); }

  const std::vector<std::unique_ptr<layer_type>> &layers() const { return layers_; }
  layer_type &layer(std::size_t i) { return *layers_.at(i); }

  /// Training mode (Dropout active, batch statistics in BatchNorm).
  void train() { set_training(true); }
  /// Evaluation mode.
  void eval() { set_training(false); }
  bool training() const { return training_; }

  FeatureShape input_shape() const { return input_shape_; }
  FeatureShape output_shape() const { return shapes_.empty() ? input_shape_ : shapes_.back(); }

  /// Total (re)allocations of activation workspaces; constant once training is steady.
  std::size_t workspace_allocations() const {
    std::size_t total = 0;
    for (const auto &w : activations_)
      total += w.allocations();
    for (const auto &w : input_grads_)
      total += w.allocations();
    return total;
  }

  /// One line per layer: index, name, output shape, parameter count.
  std::string summary() const {
    std::ostringstream os;
    os << "input " << input_shape_ << '\n';
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      os << "  " << i << ' ' << layers_[i]->name() << " -> " << shapes_[i] << ", "
         << layers_[i]->parameter_count() << " parameters\n";
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
  void set_training(bool on) {
    training_ = on;
    for (auto &l : layers_)
      l->train(on);
  }

  FeatureShape input_shape_;
  std::vector<std::unique_ptr<layer_type>> layers_;
  std::vector<FeatureShape> shapes_;
  ParameterBuffer<Scalar, MemorySpace> buffer_;
  std::vector<Workspace<Scalar, MemorySpace>> activations_, input_grads_;
  std::vector<matrix_type> outputs_, grad_in_views_;
  bool compiled_ = false;
  bool training_ = true;
};

} // namespace kat::nn
