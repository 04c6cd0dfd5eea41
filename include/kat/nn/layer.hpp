#pragma once
/// @file
/// @brief The interface every layer implements.

#include "kat/core/activation_layout.hpp"
#include "kat/core/curvature.hpp"
#include "kat/core/error.hpp"
#include "kat/core/precision.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/plan/graph.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kat::nn {

/// See kat/core/curvature.hpp.
using kat::CurvatureRecord;

/// What a parameter tensor is for, as optimizers and masks treat it: weight decay and sparse
/// masks usually act on weights (the weight matrices, batch norm's scale γ) and leave biases
/// (and batch norm's shift β) alone.
enum class ParameterRole { weight, bias };

/// One parameter tensor of a layer or model: its name ("weight", "bias"; a model prefixes the
/// layer's index path: "3.weight", "2.body.0.bias"), its role, its shape (the extents of the
/// view the layer uses; a matrix is column-major) and its offset, in scalars, from the start
/// of the layer's parameter block (a model's: of the flat buffer). The tensor occupies
/// [offset, offset + size()).
struct ParameterSpec {
  std::string name; ///< "weight", "bias"; prefixed by the layer's index path in a model
  ParameterRole role = ParameterRole::weight; ///< weight or bias
  std::vector<std::size_t> shape;             ///< extents of the view the layer uses
  std::size_t offset = 0;                     ///< first scalar, from the start of the block

  /// Number of scalars: the product of the shape.
  std::size_t size() const {
    std::size_t n = 1;
    for (const std::size_t e : shape) {
      n *= e;
    }
    return n;
  }
};

/// The shape of a batch of `batch` samples of shape `s` in a model graph (kat::plan::Graph):
/// [batch, C] for a flat shape, [batch, H·W, C] (positions, features) otherwise.
inline plan::Shape graph_shape(std::int64_t batch, FeatureShape s) {
  if (s.is_flat()) {
    return {batch, s.channels};
  }
  return {batch, static_cast<std::int64_t>(s.height) * s.width, s.channels};
}

/// Base class of all layers. A layer maps a batch x in_shape.size() matrix to a batch x
/// out_shape.size() matrix (see FeatureShape for image layouts).
///
/// @tparam Scalar       float (training) or double (gradient checks)
/// @tparam MemorySpace  where parameters and activations live; work runs on its
///                      execution space.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class Layer {
public:
  using scalar_type = Scalar;       ///< float (training) or double (gradient checks)
  using memory_space = MemorySpace; ///< where parameters and activations live
  using execution_space = typename MemorySpace::execution_space; ///< where the layer's work runs
  using matrix_type = Matrix<Scalar, MemorySpace>; ///< a batch: batch x features, column-major
  using const_matrix_type = Matrix<const Scalar, MemorySpace>; ///< a read-only batch

  virtual ~Layer() = default;

  /// Short type name for messages and summaries ("Dense", "ReLU", ...).
  virtual std::string name() const = 0;

  /// The output shape for `input`; validates it.
  /// @throws ShapeError if the layer cannot take `input`.
  virtual FeatureShape output_shape(const FeatureShape &input) const = 0;

  /// Number of scalars this layer keeps in the model's flat parameter buffer.
  virtual std::size_t parameter_count() const { return 0; }

  /// Binds the layer's weights and gradients to `parameter_count()` scalars at `params` and
  /// `grads` (device pointers into the flat buffers).
  virtual void bind(Scalar * /*params*/, Scalar * /*grads*/) {}

  /// Draws initial parameters as a pure function of `seed` (see kat/core/random.hpp).
  virtual void reset_parameters(const execution_space & /*space*/, std::uint64_t /*seed*/) {}

  /// y = f(x). `x` is batch x in, `y` batch x out, both preallocated by the caller; `x` must
  /// stay valid and unchanged until backward().
  virtual void forward(const execution_space &space, const matrix_type &x,
                       const matrix_type &y) = 0;

  /// Whether y = x exactly (same extents, same memory layout, no parameters), so that a
  /// container may skip forward() and backward() and pass the input (or dy) through as the
  /// output (or dx) without a copy. false by default; Flatten says true.
  virtual bool passes_through() const { return false; }

  /// @name Activation layouts (see kat::ActivationLayout)
  /// @{

  /// Whether the layer, in its current mode, can take its input (and give dx) in layout `in`
  /// and give its output (and take dy) in layout `out`. Only `features` for both by default.
  virtual bool supports_layouts(ActivationLayout in, ActivationLayout out) const {
    return in == ActivationLayout::features && out == ActivationLayout::features;
  }
  /// Sets the layouts of the next forward() (and of the backward and R passes after it);
  /// containers call it before forward() with a pair supports_layouts() accepts.
  /// @throws ValueError for a pair supports_layouts() refuses.
  virtual void set_layouts(ActivationLayout in, ActivationLayout out) {
    if (!supports_layouts(in, out)) {
      throw ValueError(kat::detail::concat("kat::nn::", name(), "::set_layouts: input layout ",
                                           to_string(in), " and output layout ", to_string(out),
                                           " are not supported in the layer's current mode"));
    }
    in_layout_ = in;
    out_layout_ = out;
  }
  /// The input layout of the next forward(), set by set_layouts().
  ActivationLayout input_layout() const { return in_layout_; }
  /// The output layout of the next forward(), set by set_layouts().
  ActivationLayout output_layout() const { return out_layout_; }
  /// @}

  /// @name Fusing the ReLU that follows
  /// @{

  /// Whether the layer, in its current mode, can apply a ReLU to its own output (y =
  /// max(0, f(x)), and in backward dy set to 0 where y <= 0), so that a container skips the
  /// ReLU layer that follows it and the activation is not read and written once more in
  /// each direction. false by default.
  virtual bool can_fuse_relu() const { return false; }
  /// Set by containers before forward() (Sequential, Residual), only where can_fuse_relu().
  /// @throws ValueError for `on` where can_fuse_relu() is false.
  void fuse_relu(bool on) {
    if (on && !can_fuse_relu()) {
      throw ValueError(kat::detail::concat("kat::nn::", name(),
                                           "::fuse_relu: the layer cannot apply a following ReLU "
                                           "in its current mode"));
    }
    fused_relu_ = on;
  }
  /// Whether a container asked the layer to apply the following ReLU (fuse_relu()).
  bool fuses_relu() const { return fused_relu_; }
  /// @}

  /// Given dy = dL/dy, adds the parameter gradients to the gradient buffer (or overwrites it,
  /// see accumulate_gradients()) and writes dx = dL/dx. `dx` may be an empty view (extent 0)
  /// when nobody needs it, and the layer then skips computing it.
  virtual void backward(const execution_space &space, const matrix_type &dy,
                        const matrix_type &dx) = 0;

  /// true (default): backward adds to the parameter gradients, as PyTorch does. false:
  /// backward overwrites them, which saves clearing the buffer before every step. Every layer
  /// with parameters must honour both modes for all of its gradient entries.
  void accumulate_gradients(bool on) { accumulate_ = on; }
  /// Whether backward adds to the parameter gradients (see accumulate_gradients()).
  bool accumulates_gradients() const { return accumulate_; }

  /// true (default): backward() computes the parameter gradients. false: backward() may
  /// skip them, leaving the gradient entries unspecified, and compute dx only (Dense and
  /// Conv2d skip their weight-gradient GEMMs). The backward pass of a Hessian-vector product
  /// needs only dx from backward() and sets it.
  void compute_parameter_gradients(bool on) { parameter_gradients_ = on; }
  /// Whether backward computes the parameter gradients (see compute_parameter_gradients()).
  bool computes_parameter_gradients() const { return parameter_gradients_; }

  /// Switches between training and evaluation behaviour (Dropout, BatchNorm).
  virtual void train(bool on) { training_ = on; }
  /// Whether the layer is in training mode.
  bool training() const { return training_; }

  /// The layers a container (Residual) holds, so preconditioners and masks can reach every
  /// weight matrix; empty for an ordinary layer.
  virtual std::vector<Layer *> sublayers() { return {}; }

  /// Sets the precision of the matrix products and convolutions of forward() and backward()
  /// (kat::Precision; Dense and Conv2d honour it, other layers compute in fp32 either way),
  /// here and in every sublayer. The R-operator passes (FOSI's Hessian-vector products) stay
  /// in fp32: Lanczos needs an operator that is symmetric to fp32 rounding.
  virtual void set_precision(Precision p) {
    precision_ = p;
    for (Layer *l : sublayers()) {
      l->set_precision(p);
    }
  }
  /// The precision set by set_precision() (fp32 by default).
  Precision precision() const { return precision_; }

  /// The layer's parameter tensors, in its block's order, covering exactly
  /// [0, parameter_count()); empty for a layer without parameters.
  virtual std::vector<ParameterSpec> parameter_specs() const { return {}; }

  /// The layer's state beyond its parameters (those live in the model's flat buffer):
  /// running statistics, random-stream counters (kat/core/state.hpp). Empty by default.
  virtual StateDict state_dict() const { return {}; }
  /// Throws StateError unless `state` is what this layer's load_state_dict() accepts;
  /// changes nothing. By default the state must be empty.
  virtual void check_state_dict(const StateDict &state) const {
    state.require_names("kat::nn::" + name() + "::load_state_dict", {});
  }
  /// Restores what state_dict() saved.
  /// @throws StateError as check_state_dict(), before anything changes.
  virtual void load_state_dict(const StateDict &state) { check_state_dict(state); }

  /// Whether this layer can record the K-FAC quantities `a` and `g`.
  virtual bool supports_curvature() const { return false; }
  /// Asks the layer to record `a` in forward and `g` in backward from now on.
  void record_curvature(bool on) {
    if (on && !supports_curvature()) {
      throw ValueError(kat::detail::concat("kat::nn::", name(),
                                           "::record_curvature: this layer has no weight matrix "
                                           "to precondition"));
    }
    recording_ = on;
  }
  /// Whether the layer records a and g (record_curvature()).
  bool recording_curvature() const { return recording_; }
  /// The recorded quantities (empty views unless recording and after a forward/backward).
  virtual CurvatureRecord<Scalar, MemorySpace> curvature() const { return {}; }

  /// @name Model graph (kat::plan; TAP, Shi et al. 2023)
  /// @{

  /// Appends this layer to `graph` as operators reading `x`, the layer's input (shape
  /// graph_shape(batch, in)), under the local name `name` in the graph's current scope, and
  /// returns the output tensor. By default one operator of type name() with the layer's
  /// parameter shapes and output graph_shape(batch, output_shape(in)); layers whose structure
  /// a tensor-parallel plan needs (Dense, attention, LayerNorm, embeddings) and containers
  /// (which open a scope named `name` for their layers) override it.
  /// @throws as kat::plan::Graph::add.
  virtual plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                                  const std::string &name) const {
    return graph.add(this->name(), name, {x},
                     graph_shape(graph.tensor(x).shape[0], output_shape(in)), parameter_shapes());
  }
  /// @}

  /// @name R-operator (Pearlmutter 1994, "Fast exact multiplication by the Hessian")
  /// R{·} is the directional derivative d/dr ·(θ + r v)|_{r=0} along a parameter direction v.
  /// A layer that supports it computes, after forward(x, y):
  ///   forward_r:  R{y} = ∂y/∂x · R{x} + ∂y/∂θ · v
  /// and, after backward(dy, dx), given dy and R{dy}:
  ///   backward_r: R{dx} = R{∂L/∂x} and adds R{∂L/∂θ} to the product buffer hv.
  /// Run through a whole model (kat::nn::hessian_vector_product) these give H v exactly, at
  /// about the cost of two forward and backward passes.
  /// @{

  /// Whether forward_r() and backward_r() are implemented. false by default: a model holding
  /// such a layer refuses Hessian-vector products with an error naming it.
  virtual bool supports_r_operator() const { return false; }

  /// Binds the layer's blocks of a parameter direction `v` and of the product buffer `hv`
  /// (parameter_count() scalars each, device pointers laid out like bind()'s).
  virtual void bind_direction(Scalar * /*v*/, Scalar * /*hv*/) {}

  /// ry = R{y} (batch x out, preallocated) for the x of the last forward(), the bound
  /// direction v and `rx` = R{x} (batch x in). An `rx` of extent 0 stands for R{x} = 0 (the
  /// model's input does not depend on θ); only layers with parameters receive one. `rx` must
  /// stay valid and unchanged until backward_r().
  /// @throws Error if the layer has no R-operator.
  virtual void forward_r(const execution_space & /*space*/, const matrix_type & /*rx*/,
                         const matrix_type & /*ry*/) {
    throw Error(kat::detail::concat("kat::nn::", name(),
                                    "::forward_r: this layer has no R-operator, so no exact "
                                    "Hessian-vector product can pass through it"));
  }

  /// After forward(), forward_r() and backward(dy, dx): given the same `dy` and `rdy` =
  /// R{dy} (batch x out), adds R{∂L/∂θ} to the bound `hv` (always accumulates) and writes
  /// `rdx` = R{dx} (batch x in; skipped when `rdx` has extent 0).
  /// @throws Error if the layer has no R-operator.
  virtual void backward_r(const execution_space & /*space*/, const matrix_type & /*dy*/,
                          const matrix_type & /*rdy*/, const matrix_type & /*rdx*/) {
    throw Error(kat::detail::concat("kat::nn::", name(),
                                    "::backward_r: this layer has no R-operator, so no exact "
                                    "Hessian-vector product can pass through it"));
  }
  /// @}

protected:
  /// parameter_specs()' shapes, for describe().
  std::vector<plan::Shape> parameter_shapes() const {
    std::vector<plan::Shape> shapes;
    for (const auto &spec : parameter_specs()) {
      shapes.emplace_back(spec.shape.begin(), spec.shape.end());
    }
    return shapes;
  }

  /// For forward(): throws Error(where + ": layouts <in> -> <out> set but not supported in
  /// the layer's current mode") when set_layouts() chose a pair the layer's mode no longer
  /// supports (a mode changed since).
  void require_layouts_supported(const std::string &where) const {
    if (!supports_layouts(in_layout_, out_layout_)) {
      throw Error(kat::detail::concat(where, ": layouts ", to_string(in_layout_), " -> ",
                                      to_string(out_layout_),
                                      " set but not supported in the layer's current mode"));
    }
  }

  bool training_ = true;                                     ///< training mode (train())
  Precision precision_ = Precision::fp32;                    ///< set_precision()
  bool recording_ = false;                                   ///< record_curvature()
  bool accumulate_ = true;                                   ///< accumulate_gradients()
  bool parameter_gradients_ = true;                          ///< compute_parameter_gradients()
  ActivationLayout in_layout_ = ActivationLayout::features;  ///< input layout set by set_layouts()
  ActivationLayout out_layout_ = ActivationLayout::features; ///< output layout set by set_layouts()
  bool fused_relu_ = false;                                  ///< fuse_relu()
};

} // namespace kat::nn
