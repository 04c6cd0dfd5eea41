#pragma once
/// @file
/// @brief Internal: an ordered chain of layers with their activation workspaces, shared by
/// Sequential and the Residual container.

#include "kat/core/dnn.hpp"
#include "kat/core/error.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/activation.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::nn::detail {

template <class Scalar, class MemorySpace> class LayerChain {
public:
  using layer_type = Layer<Scalar, MemorySpace>;
  using execution_space = typename MemorySpace::execution_space;
  using matrix_type = Matrix<Scalar, MemorySpace>;

  /// @param owner  prefix of error messages ("kat::nn::Sequential")
  LayerChain(FeatureShape input, std::string owner)
      : input_shape_(input), owner_(std::move(owner)) {}

  /// Appends a layer after checking it accepts the current output shape.
  layer_type &add(std::unique_ptr<layer_type> layer) {
    if (!layer) {
      throw ValueError(owner_ + "::add: layer must not be null");
    }
    const FeatureShape in = output_shape();
    FeatureShape out;
    try {
      out = layer->output_shape(in);
    } catch (const ShapeError &e) {
      throw ShapeError(kat::detail::concat(owner_, ": layer ", layers_.size(), " (", layer->name(),
                                           ") cannot take input shape ", in, ": ", e.what()));
    }
    shapes_.push_back(out);
    layers_.push_back(std::move(layer));
    activations_.emplace_back(owner_ + "::activation");
    input_grads_.emplace_back(owner_ + "::input_gradient");
    r_activations_.emplace_back(owner_ + "::r_activation");
    r_input_grads_.emplace_back(owner_ + "::r_input_gradient");
    return *layers_.back();
  }

  /// Appends the layers to `graph` (Layer::describe) as "0", "1", ... in the current scope,
  /// from `x`; returns the last output (x for an empty chain).
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x) const {
    FeatureShape in = input_shape_;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      x = layers_[i]->describe(graph, x, in, std::to_string(i));
      in = shapes_[i];
    }
    return x;
  }

  /// Adds layer i's state as "<prefix>.<i>.<entry>".
  void save_state(StateDict &state, const std::string &prefix) const {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      state.merge(kat::detail::concat(prefix, '.', i), layers_[i]->state_dict());
    }
  }
  /// Checks the entries under "<prefix>." against the layers' check_state_dict(): every one
  /// must name a layer, and each layer must accept its own (throws StateError naming the
  /// layer's prefix).
  void check_state(const StateDict &state, const std::string &prefix) const {
    const std::string head = prefix + ".";
    for (const auto &entry : state.entries()) {
      const std::string &n = entry.first;
      if (n.compare(0, head.size(), head) != 0) {
        continue;
      }
      const std::size_t dot = n.find('.', head.size());
      const std::string index = n.substr(head.size(), dot - head.size());
      const bool valid = dot != std::string::npos && !index.empty() && index.size() < 10 &&
                         index.find_first_not_of("0123456789") == std::string::npos &&
                         std::stoul(index) < layers_.size() &&
                         index == std::to_string(std::stoul(index));
      if (!valid) {
        throw StateError(kat::detail::concat(owner_, ": unexpected state entry '", n, "' (",
                                             layers_.size(), " layers)"));
      }
    }
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::string sub = kat::detail::concat(prefix, '.', i);
      try {
        layers_[i]->check_state_dict(state.sub(sub));
      } catch (const StateError &e) {
        throw StateError(kat::detail::concat("under '", sub, "': ", e.what()));
      }
    }
  }
  /// Restores every layer's state from the entries under "<prefix>.<i>." (check_state()
  /// first).
  void load_state(const StateDict &state, const std::string &prefix) {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->load_state_dict(state.sub(kat::detail::concat(prefix, '.', i)));
    }
  }

  bool empty() const { return layers_.empty(); }
  std::size_t size() const { return layers_.size(); }
  const std::vector<std::unique_ptr<layer_type>> &layers() const { return layers_; }
  FeatureShape input_shape() const { return input_shape_; }
  FeatureShape output_shape() const { return shapes_.empty() ? input_shape_ : shapes_.back(); }
  FeatureShape shape_after(std::size_t i) const { return shapes_.at(i); }

  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (const auto &l : layers_)
      n += l->parameter_count();
    return n;
  }

  /// Binds the layers to consecutive blocks starting at params / grads.
  /// Every layer's tensors as "<prefix>.<i>.<name>" ("<i>.<name>" for an empty prefix), with
  /// offsets counted from `offset` (the chain's first scalar).
  std::vector<ParameterSpec> parameter_specs(const std::string &prefix, std::size_t offset) const {
    std::vector<ParameterSpec> specs;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::string head =
          prefix.empty() ? std::to_string(i) + "." : kat::detail::concat(prefix, '.', i, '.');
      for (ParameterSpec s : layers_[i]->parameter_specs()) {
        s.name = head + s.name;
        s.offset += offset;
        specs.push_back(std::move(s));
      }
      offset += layers_[i]->parameter_count();
    }
    return specs;
  }

  void bind(Scalar *params, Scalar *grads) {
    for (auto &l : layers_) {
      l->bind(params, grads);
      params += l->parameter_count();
      grads += l->parameter_count();
    }
  }

  /// Layer i draws from its own stream of `seed`.
  void reset_parameters(const execution_space &space, std::uint64_t seed) {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->reset_parameters(space, counter_bits(seed, 0x5e9u, i));
    }
  }

  /// Runs the layers; the result lives in the last layer's workspace (or is x for an empty
  /// chain) and stays valid until the next forward. With `out` (a container's own output,
  /// batch x output size), the last layer writes there instead, and the result is *out.
  const matrix_type &forward(const execution_space &space, const matrix_type &x,
                             const matrix_type *out = nullptr) {
    kat::detail::require_extent((owner_ + "::forward").c_str(), "x columns", input_shape_.size(),
                                x.extent(1));
    input_ = x;
    const std::size_t n = x.extent(0);
    outputs_.resize(layers_.size());
    const matrix_type *in = &input_;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const bool last = out != nullptr && i + 1 == layers_.size();
      if (skipped(i)) {
        outputs_[i] = *in; // y = x: no workspace, no copy
        if (last) {
          Kokkos::deep_copy(space, *out, *in);
          outputs_[i] = *out;
        }
      } else {
        outputs_[i] = last ? *out : activations_[i].matrix(n, shapes_[i].size());
        layers_[i]->forward(space, *in, outputs_[i]);
      }
      in = &outputs_[i];
    }
    return *in;
  }

  /// Called by backward() after layer i's backward has been enqueued (see set_backward_hook).
  using BackwardHook = std::function<void(std::size_t)>;

  /// Installs (or, with an empty function, removes) the hook backward() calls after each
  /// layer, with the layer's index, in decreasing order.
  void set_backward_hook(BackwardHook hook) { backward_hook_ = std::move(hook); }
  bool has_backward_hook() const { return static_cast<bool>(backward_hook_); }
  /// Removes the hook and returns it (to be set again with set_backward_hook).
  BackwardHook take_backward_hook() { return std::exchange(backward_hook_, BackwardHook()); }

  /// Back-propagates dy through the layers. The first layer writes its input gradient into
  /// `dx` (skipped when dx is empty). Parameter gradients are added or overwritten. After each
  /// layer (pass-through layers included) the backward hook, if set, gets the layer's index.
  void backward(const execution_space &space, const matrix_type &dy, const matrix_type &dx,
                bool accumulate) {
    if (outputs_.size() != layers_.size() || layers_.empty()) {
      throw Error(owner_ + "::backward: call forward() first");
    }
    const std::size_t n = outputs_.back().extent(0);
    kat::detail::require_extent((owner_ + "::backward").c_str(), "dy rows", n, dy.extent(0));
    kat::detail::require_extent((owner_ + "::backward").c_str(), "dy columns",
                                output_shape().size(), dy.extent(1));
    grad_views_.resize(layers_.size());
    const matrix_type *grad_out = &dy;
    for (std::size_t i = layers_.size(); i-- > 0;) {
      if (skipped(i)) {
        // dx = dy: no workspace and no copy, except into the caller's dx.
        grad_views_[i] = i > 0 ? *grad_out : dx;
        if (i == 0 && dx.extent(0) != 0) {
          Kokkos::deep_copy(space, dx, *grad_out);
        }
        grad_out = &grad_views_[i];
      } else {
        grad_views_[i] = i > 0 ? input_grads_[i].matrix(n, shapes_[i - 1].size()) : dx;
        layers_[i]->accumulate_gradients(accumulate);
        layers_[i]->backward(space, *grad_out, grad_views_[i]);
        grad_out = &grad_views_[i];
      }
      if (backward_hook_) {
        backward_hook_(i);
      }
    }
  }

  void train(bool on) {
    for (auto &l : layers_)
      l->train(on);
  }

  void set_precision(Precision p) {
    for (auto &l : layers_)
      l->set_precision(p);
  }

  /// Whether every activation inside the chain can be given a layout both its producer and
  /// its consumer support (Layer::supports_layouts), for the chain's input in `in` and its
  /// output in `out`.
  bool layouts_feasible(ActivationLayout in, ActivationLayout out) const {
    return plan_layouts(in, out, nullptr);
  }

  /// Sets every layer's layouts for the next forward(): for each activation the first of
  /// kat::activation_layouts_by_preference (channels_last_bf16, channels16_bf16,
  /// channels_last, channels16, features; the channels16 ones first where oneDNN's bf16
  /// convolutions compute in nChw16c) that both
  /// neighbouring layers (and, through same-layout layers such as activations, the rest of the
  /// chain) support.
  /// @throws Error if no assignment exists (see layouts_feasible()).
  void negotiate_layouts(ActivationLayout in, ActivationLayout out) {
    std::vector<ActivationLayout> chosen;
    if (!plan_layouts(in, out, &chosen)) {
      throw Error(kat::detail::concat(owner_, ": no activation layouts take input ", to_string(in),
                                      " to output ", to_string(out)));
    }
    ActivationLayout cur = in;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->set_layouts(cur, chosen[i]);
      cur = chosen[i];
    }
  }

  /// Lets every layer that can (Layer::can_fuse_relu()) apply the ReLU layer that follows it,
  /// which forward() and backward() then skip as they skip a pass-through layer; undoes the
  /// fusions that no longer apply (a mode changed). Called before each forward, after
  /// negotiate_layouts().
  void fuse_relus() {
    absorbed_.assign(layers_.size(), 0);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const bool next_is_relu =
          i + 1 < layers_.size() &&
          dynamic_cast<const ReLU<Scalar, MemorySpace> *>(layers_[i + 1].get()) != nullptr;
      const bool fuse = next_is_relu && !absorbed_[i] && layers_[i]->can_fuse_relu();
      layers_[i]->fuse_relu(fuse);
      if (fuse) {
        absorbed_[i + 1] = 1;
      }
    }
  }

  /// The first layer without an R-operator, or nullptr if every layer has one.
  const layer_type *first_without_r_operator() const {
    for (const auto &l : layers_) {
      if (!l->supports_r_operator()) {
        return l.get();
      }
    }
    return nullptr;
  }

  /// Binds the layers to consecutive blocks of a direction v and a product buffer hv.
  void bind_direction(Scalar *v, Scalar *hv) {
    for (auto &l : layers_) {
      l->bind_direction(v, hv);
      v += l->parameter_count();
      hv += l->parameter_count();
    }
  }

  /// R-operator forward pass after forward(): R{output} for the bound direction and `rx` =
  /// R{input} (extent 0: zero). While R{x} is zero, layers without parameters are skipped
  /// (their R{y} is zero too); the result has extent 0 if it is zero (no layer has
  /// parameters and rx was empty). Valid until the next forward_r. With `out`, the last layer
  /// writes R{y} there instead (zero filled when R{y} is zero), and the result is *out.
  const matrix_type &forward_r(const execution_space &space, const matrix_type &rx,
                               const matrix_type *out = nullptr) {
    if (outputs_.size() != layers_.size() || layers_.empty()) {
      throw Error(owner_ + "::forward_r: call forward() first");
    }
    const std::size_t n = outputs_.back().extent(0);
    r_input_ = rx;
    r_outputs_.assign(layers_.size(), matrix_type());
    const matrix_type *in = &r_input_;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const bool last = out != nullptr && i + 1 == layers_.size();
      const bool zero_in = in->extent(0) == 0;
      if (zero_in && layers_[i]->parameter_count() == 0) {
        // R{x} = 0 and no parameters: R{y} = 0. r_outputs_[i] stays empty.
        if (last) {
          Kokkos::deep_copy(space, *out, Scalar(0));
          r_outputs_[i] = *out;
        }
      } else if (skipped(i)) {
        r_outputs_[i] = *in;
        if (last) {
          Kokkos::deep_copy(space, *out, *in);
          r_outputs_[i] = *out;
        }
      } else {
        r_outputs_[i] = last ? *out : r_activations_[i].matrix(n, shapes_[i].size());
        layers_[i]->forward_r(space, *in, r_outputs_[i]);
      }
      in = &r_outputs_[i];
    }
    return *in;
  }

  /// The backward pass of a Hessian-vector product, after forward() and forward_r(): for each
  /// layer from the last, backward(dy, dx) as backward() does (parameter gradients added or
  /// overwritten; no backward hook) and backward_r(dy, rdy, rdx), which adds R{∂L/∂θ} to the
  /// bound product buffer. The first layer writes into `dx` and `rdx` (either skipped when
  /// empty). Layers whose R{x} was zero in forward_r() are the first ones of the chain, have
  /// no parameter below them, and are skipped, with dx and rdx (they are not needed). With
  /// `parameter_gradients` false the layers' backward() may skip the parameter gradients
  /// (Layer::compute_parameter_gradients), when the caller discards them.
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &dx, const matrix_type &rdx, bool accumulate,
                  bool parameter_gradients = true) {
    if (r_outputs_.size() != layers_.size() || layers_.empty()) {
      throw Error(owner_ + "::backward_r: call forward() and forward_r() first");
    }
    const std::size_t n = outputs_.back().extent(0);
    kat::detail::require_extent((owner_ + "::backward_r").c_str(), "rdy rows", n, rdy.extent(0));
    kat::detail::require_extent((owner_ + "::backward_r").c_str(), "rdy columns",
                                output_shape().size(), rdy.extent(1));
    grad_views_.resize(layers_.size());
    r_grad_views_.resize(layers_.size());
    const matrix_type *grad_out = &dy;
    const matrix_type *r_grad_out = &rdy;
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const bool zero_in = (i == 0 ? r_input_ : r_outputs_[i - 1]).extent(0) == 0;
      if (r_outputs_[i].extent(0) == 0) {
        break; // this layer and all before it saw R{x} = 0 and have no parameters
      }
      // Below a layer whose R{x} was zero, nobody needs dx or R{dx}.
      const bool need_dx = !zero_in;
      if (skipped(i)) {
        grad_views_[i] = i > 0 ? *grad_out : dx;
        r_grad_views_[i] = i > 0 ? *r_grad_out : rdx;
        if (i == 0) {
          if (dx.extent(0) != 0) {
            Kokkos::deep_copy(space, dx, *grad_out);
          }
          if (rdx.extent(0) != 0) {
            Kokkos::deep_copy(space, rdx, *r_grad_out);
          }
        }
      } else {
        const std::size_t in_cols = i > 0 ? shapes_[i - 1].size() : input_shape_.size();
        grad_views_[i] =
            i == 0 ? dx : (need_dx ? input_grads_[i].matrix(n, in_cols) : matrix_type());
        r_grad_views_[i] =
            i == 0 ? rdx : (need_dx ? r_input_grads_[i].matrix(n, in_cols) : matrix_type());
        layers_[i]->accumulate_gradients(accumulate);
        layers_[i]->compute_parameter_gradients(parameter_gradients);
        try {
          layers_[i]->backward(space, *grad_out, grad_views_[i]);
        } catch (...) {
          layers_[i]->compute_parameter_gradients(true);
          throw;
        }
        layers_[i]->compute_parameter_gradients(true);
        layers_[i]->backward_r(space, *grad_out, *r_grad_out, r_grad_views_[i]);
      }
      if (!need_dx) {
        break;
      }
      grad_out = &grad_views_[i];
      r_grad_out = &r_grad_views_[i];
    }
  }

  /// The R part alone of a Hessian-vector product's backward pass, for a chain whose
  /// backward(dy, ·) has run after forward() and forward_r() (a container whose own backward()
  /// ran the chain's): for each layer from the last, backward_r(dy_i, rdy_i, rdx_i), dy_i being
  /// the input gradient backward() left in the workspaces. Adds R{∂L/∂θ} to the bound product
  /// buffer; the parameter gradients are not touched. The first layer writes `rdx` (skipped
  /// when empty). The first layers, those whose R{x} was zero in forward_r() (they have no
  /// parameters), are skipped when rdx is empty; otherwise each maps R{dy} to R{dx} with its
  /// backward(): with R{x} = 0 and no parameters, R{dx} = (∂y/∂x)ᵀ R{dy}.
  void backward_r_after_backward(const execution_space &space, const matrix_type &dy,
                                 const matrix_type &rdy, const matrix_type &rdx) {
    if (r_outputs_.size() != layers_.size() || grad_views_.size() != layers_.size() ||
        layers_.empty()) {
      throw Error(owner_ + "::backward_r: call forward(), forward_r() and backward() first");
    }
    const std::size_t n = outputs_.back().extent(0);
    kat::detail::require_extent((owner_ + "::backward_r").c_str(), "rdy rows", n, rdy.extent(0));
    kat::detail::require_extent((owner_ + "::backward_r").c_str(), "rdy columns",
                                output_shape().size(), rdy.extent(1));
    const bool want_rdx = rdx.extent(0) != 0;
    r_grad_views_.resize(layers_.size());
    const matrix_type *r_grad_out = &rdy;
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const bool zero_out = r_outputs_[i].extent(0) == 0; // R{x} = 0, no parameters
      if (zero_out && !want_rdx) {
        break; // and so are all the layers before it
      }
      const bool zero_in = (i == 0 ? r_input_ : r_outputs_[i - 1]).extent(0) == 0;
      // R{dx} feeds the layer below, whose own R{dy} is needed unless it is skipped.
      const bool need_rdx = want_rdx || !zero_in;
      const matrix_type &dy_i = i + 1 < layers_.size() ? grad_views_[i + 1] : dy;
      if (skipped(i)) {
        r_grad_views_[i] = i > 0 ? *r_grad_out : rdx;
        if (i == 0 && want_rdx) {
          Kokkos::deep_copy(space, rdx, *r_grad_out);
        }
      } else {
        const std::size_t in_cols = i > 0 ? shapes_[i - 1].size() : input_shape_.size();
        r_grad_views_[i] =
            i == 0 ? rdx : (need_rdx ? r_input_grads_[i].matrix(n, in_cols) : matrix_type());
        if (zero_out) {
          layers_[i]->backward(space, *r_grad_out, r_grad_views_[i]);
        } else {
          layers_[i]->backward_r(space, dy_i, *r_grad_out, r_grad_views_[i]);
        }
      }
      if (!need_rdx) {
        break;
      }
      r_grad_out = &r_grad_views_[i];
    }
  }

  /// (Re)allocations of the chain's activation workspaces so far.
  std::size_t workspace_allocations() const {
    std::size_t total = 0;
    for (const auto &w : activations_)
      total += w.allocations();
    for (const auto &w : input_grads_)
      total += w.allocations();
    for (const auto &w : r_activations_)
      total += w.allocations();
    for (const auto &w : r_input_grads_)
      total += w.allocations();
    return total;
  }

private:
  /// Whether forward and backward pass layer i's input through: a pass-through layer, or a
  /// ReLU the layer before applies.
  bool skipped(std::size_t i) const {
    return layers_[i]->passes_through() || (i < absorbed_.size() && absorbed_[i]);
  }

  // Bit masks of layouts: bit 0 features, bit 1 channels16, bit 2 channels_last, bit 3
  // channels_last_bf16, bit 4 channels16_bf16.
  static unsigned layout_bit(ActivationLayout l) { return 1u << static_cast<unsigned>(l); }

  /// kat::activation_layouts_by_preference, with channels16 before channels_last (in bf16
  /// storage and in Scalar) where oneDNN's bf16 convolutions compute in nChw16c on this CPU
  /// (kat::detail::dnn_bf16_blocked()): the layouts their neighbours then exchange without a
  /// reorder.
  static const std::array<ActivationLayout, 5> &layout_preference() {
    using L = ActivationLayout;
    static_assert(activation_layouts_by_preference[0] == L::channels_last_bf16 &&
                      activation_layouts_by_preference[1] == L::channels16_bf16 &&
                      activation_layouts_by_preference[2] == L::channels_last &&
                      activation_layouts_by_preference[3] == L::channels16 &&
                      activation_layouts_by_preference[4] == L::features,
                  "layout_preference() swaps the pairs (0, 1) and (2, 3)");
    static const std::array<ActivationLayout, 5> order = [] {
      std::array<ActivationLayout, 5> o{};
      std::copy(std::begin(activation_layouts_by_preference),
                std::end(activation_layouts_by_preference), o.begin());
      if (kat::detail::dnn_bf16_blocked()) {
        std::swap(o[0], o[1]);
        std::swap(o[2], o[3]);
      }
      return o;
    }();
    return order;
  }

  /// The layouts of the activations after each layer (into `chosen` unless null): from the
  /// last layer back, which layouts can still reach `out`; then from the first forward, the
  /// first of activation_layouts_by_preference reachable and producible from the previous
  /// choice (in layout_preference()'s order).
  bool plan_layouts(ActivationLayout in, ActivationLayout out,
                    std::vector<ActivationLayout> *chosen) const {
    const std::size_t n = layers_.size();
    if (n == 0) {
      return in == out;
    }
    std::vector<unsigned> reachable(n, 0); // layouts after layer i that can reach `out`
    reachable[n - 1] = layout_bit(out);
    for (std::size_t i = n - 1; i > 0; --i) {
      for (ActivationLayout a : layout_preference()) {
        for (ActivationLayout b : layout_preference()) {
          if ((reachable[i] & layout_bit(b)) && layers_[i]->supports_layouts(a, b)) {
            reachable[i - 1] |= layout_bit(a);
          }
        }
      }
      if (reachable[i - 1] == 0) {
        return false;
      }
    }
    ActivationLayout cur = in;
    if (chosen) {
      chosen->assign(n, ActivationLayout::features);
    }
    for (std::size_t i = 0; i < n; ++i) {
      bool found = false;
      for (ActivationLayout b : layout_preference()) {
        if ((reachable[i] & layout_bit(b)) && layers_[i]->supports_layouts(cur, b)) {
          cur = b;
          found = true;
          break;
        }
      }
      if (!found) {
        return false;
      }
      if (chosen) {
        (*chosen)[i] = cur;
      }
    }
    return true;
  }

  FeatureShape input_shape_;
  std::string owner_;
  std::vector<std::unique_ptr<layer_type>> layers_;
  std::vector<FeatureShape> shapes_;
  std::vector<Workspace<Scalar, MemorySpace>> activations_, input_grads_;
  std::vector<matrix_type> outputs_, grad_views_;
  std::vector<char> absorbed_; // layers fuse_relus() let the previous layer apply
  matrix_type input_;
  // The R-operator passes' workspaces and views (R{y}, R{dx} per layer; R{x} of the chain).
  std::vector<Workspace<Scalar, MemorySpace>> r_activations_, r_input_grads_;
  std::vector<matrix_type> r_outputs_, r_grad_views_;
  matrix_type r_input_;
  BackwardHook backward_hook_;
};

} // namespace kat::nn::detail
