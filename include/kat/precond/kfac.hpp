#pragma once
/// @file
/// @brief K-FAC: Kronecker-factored approximate curvature preconditioning of layer gradients
/// (kat::precond::KFAC). Including it gives the whole K-FAC API: its options, hyperparameter
/// values and state (kfac_options.hpp), the strategy interface (kfac_strategy.hpp), the
/// per-layer state and math (kfac_layer.hpp) and the factors (kronecker_factor.hpp).

#include "kat/core/curvature.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/precond/detail/kfac_schedule.hpp"
#include "kat/precond/kfac_layer.hpp"
#include "kat/precond/kfac_options.hpp"
#include "kat/precond/kfac_strategy.hpp"
#include "kat/precond/kronecker_factor.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::precond {

/// K-FAC preconditioner (Martens & Grosse 2015; Grosse & Martens 2016 for convolutions), in the
/// formulation of KAISA (Pauloski et al. 2021, reference code kfac-pytorch) and exactly as
/// docs/algorithms.md section 1 states. It acts between backward and the base optimizer:
///
///     model.forward / loss / model.backward   (layers record a and g when kfac asks)
///     kfac.step(space);                       (preconditions the weight gradients in place)
///     sgd.step(space, params, grads);
///
/// Each registered layer is a KFACLayer (kfac_layer.hpp: its factors A and G, their
/// decompositions and damping, its P, with the formulas). KFAC schedules them: factors every
/// `factor_update_steps` steps, decompositions every `inv_update_steps` steps, P every step,
/// and then the KL clip over all layers, ν = min(1, sqrt(κ / |Σ_layers Σ P ⊙ ∇ · lr²|)), each
/// ν·P written over its ∇ (κ = `kl_clip`; 0 disables the clip). What a process builds,
/// decomposes and shares is its strategy's decision (set_strategy(), KFACStrategy). The
/// schedule itself, with the layers and the step's state, is kat::detail::KFACSchedule
/// (detail/kfac_schedule.hpp), which KFAC derives from privately; KFAC adds registration,
/// the queries and the checkpoint protocol.
///
/// Layers are registered with register_layer() (any code: views only, see
/// docs/guide.md, "K-FAC with your own network") or register_model() (every
/// kat::nn layer that supports curvature, containers included). Layers without a weight
/// matrix (BatchNorm) are left to the base optimizer.
///
/// @tparam Scalar         the model's scalar (gradients, a and g).
/// @tparam MemorySpace    where the model lives.
/// @tparam InverseScalar  precision of decompositions and of the preconditioning products
///                        (double by default).
/// @tparam FactorScalar   precision the factors are accumulated in (the model's by default).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace,
          class InverseScalar = double, class FactorScalar = Scalar>
class KFAC
    : private kat::detail::KFACSchedule<KFAC<Scalar, MemorySpace, InverseScalar, FactorScalar>,
                                        Scalar, MemorySpace, InverseScalar, FactorScalar> {
public:
  using scalar_type = Scalar;       ///< the model's scalar (gradients, a and g)
  using memory_space = MemorySpace; ///< where the model and the factors live
  using execution_space = typename MemorySpace::execution_space; ///< where K-FAC's kernels run
  using record_type = CurvatureRecord<Scalar, MemorySpace>;      ///< a layer's recorded a and g
  /// One registered layer's state and math.
  using layer_type = KFACLayer<Scalar, MemorySpace, InverseScalar, FactorScalar>;
  /// A layer's factor A or G with its decompositions.
  using factor_type = typename layer_type::factor_type;
  using matrix_type = Matrix<Scalar, MemorySpace>; ///< a gradient matrix in the model's scalar
  using vector_type = Vector<Scalar, MemorySpace>; ///< a flat vector in the model's scalar
  /// A matrix in the decompositions' precision.
  using inverse_matrix_type = Matrix<InverseScalar, MemorySpace>;
  using factor_scalar_type = FactorScalar; ///< the precision the factors are accumulated in
  /// A factor (or batch estimate) matrix: dim x dim, FactorScalar.
  using factor_matrix_type = Matrix<FactorScalar, MemorySpace>;
  /// The strategy interface this KFAC asks (see set_strategy()).
  using strategy_type = KFACStrategy<KFAC>;
  /// What one decomposition step found on this process (KFACStrategy::agree_on_failures()).
  using DecompositionFailures = KFACDecompositionFailures;

  using Options = KFACOptions; ///< the hyperparameters (KFACOptions)
  using Values = KFACValues;   ///< their values at one step (KFACValues)
  using State = KFACState;     ///< a host copy of the state (KFACState)

  /// @throws ValueError naming the option, its valid range and its value, for any constant
  ///   hyperparameter out of range, a null log, or pi_correction with the eigen method.
  explicit KFAC(Options options = Options()) : Schedule(std::move(options)) {}

  KFAC(const KFAC &) = delete;
  KFAC &operator=(const KFAC &) = delete;

  /// The options given at construction.
  const Options &options() const { return opt_; }

  /// Registers a layer given only by views (no kat::nn needed).
  ///
  /// @param name     unique name, used in errors, skip_layers and checkpoints.
  /// @param views    called once per step() (and once here): returns the layer's current
  ///                 CurvatureRecord: weight_gradient
  ///                 (out x (in+1), LayoutLeft, preconditioned in place by step()) must be
  ///                 valid from registration on; a (rows x (in+1)), g (rows x out) and
  ///                 samples (N) must be valid after the backward of every step for which
  ///                 needs_curvature() (with Options::factored_preconditioning:
  ///                 wants_curvature(i)) was true before its forward.
  /// @param record   optional: called with wants_curvature(i) for the next step, so a layer
  ///                 can skip recording a and g when they are not needed.
  /// @param type     optional type name matched by skip_layers.
  /// @return whether the layer was registered (false when skip_layers names it).
  /// @throws ValueError if `name` is already registered or `views` is empty;
  ///   ShapeError if weight_gradient is empty.
  bool register_layer(const std::string &name, std::function<record_type()> views,
                      std::function<void(bool)> record = {}, const std::string &type = "") {
    if (!views) {
      throw ValueError(kat::detail::concat("kat::precond::KFAC::register_layer: views of layer '",
                                           name, "' must be a callable, got an empty function"));
    }
    for (const auto &l : layers_) {
      if (l->layer.name() == name) {
        throw ValueError(kat::detail::concat("kat::precond::KFAC::register_layer: name '", name,
                                             "' is already registered"));
      }
    }
    if (kat::detail::kfac_skips(opt_, name) ||
        (!type.empty() && kat::detail::kfac_skips(opt_, type))) {
      return false;
    }
    const record_type r = views();
    const matrix_type &grad = r.weight_gradient;
    if (grad.extent(0) == 0 || grad.extent(1) == 0) {
      throw ShapeError(kat::detail::concat(
          "kat::precond::KFAC::register_layer: weight_gradient of layer '", name,
          "' must be a non-empty out x (in+1) matrix, got ", grad.extent(0), "x", grad.extent(1)));
    }
    layers_.push_back(std::make_unique<Entry>(name, type, std::move(views), std::move(record),
                                              grad.extent(0), grad.extent(1)));
    Entry &l = *layers_.back();
    l.owned = strategy().builds_factors(layers_.size() - 1);
    l.layer.locate(grad_buffer_, grad); // its place for step(space, grads)
    tell_record(l, needs_curvature());
    return true;
  }

  /// Registers every layer of a kat::nn model (Sequential) that supports curvature, walking
  /// into containers (Residual). Names are the index path in the model ("0", "3.1"), types
  /// the layer's name() ("Dense", "Conv2d"). Turns on the layers' recording as needed.
  /// The first call records the model's gradients() as the gradient buffer: step(space, grads)
  /// finds each layer's weight gradient in a vector laid out like it.
  /// @return the number of layers registered.
  template <class Model> std::size_t register_model(Model &model) {
    if (grad_buffer_.data() == nullptr) {
      grad_buffer_ = model.gradients();
    }
    std::size_t count = 0;
    const auto &layers = model.layers();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      count += register_nn_layer(std::to_string(i), *layers[i]);
    }
    return count;
  }

  /// Number of registered layers.
  std::size_t size() const { return layers_.size(); }
  /// The registered names, in registration order.
  std::vector<std::string> layer_names() const {
    std::vector<std::string> names;
    for (const auto &l : layers_)
      names.push_back(l->layer.name());
    return names;
  }
  /// Registered layer i: its factors, decompositions and preconditioning (KFACLayer).
  const layer_type &layer(std::size_t i) const { return layers_.at(i)->layer; }
  /// Factor A (activations) of registered layer i.
  const factor_type &factor_a(std::size_t i) const { return layer(i).factor_a(); }
  /// Factor G (output gradients) of registered layer i.
  const factor_type &factor_g(std::size_t i) const { return layer(i).factor_g(); }

  /// Number of completed step() calls.
  std::int64_t steps() const { return steps_; }

  /// Sets the strategy this process follows (KFACStrategy: which factors it builds and
  /// decomposes, what it reduces, shares and agrees on with other processes), or, with
  /// nullptr, the local one (the default: everything here, nothing communicated). The KFAC
  /// does not own it: it must stay alive while set. The distributed strategies
  /// (kat::distributed::DKFAC, KAISA, DPKFAC) set themselves in their constructor and restore
  /// the local strategy in their destructor.
  ///
  /// KFACStrategy::builds_factors() is asked now for every registered layer and for layers
  /// registered later. A layer not built here records no a and g (its record callback is told
  /// false), builds and decomposes no factors and allocates no factor or decomposition memory
  /// (set the strategy before the first step: factors already built are kept but no longer
  /// updated), and is preconditioned here only when the strategy shares gradients.
  void set_strategy(strategy_type *strategy) {
    strategy_ = strategy;
    const bool next = needs_curvature();
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      Entry &l = *layers_[i];
      l.owned = this->strategy().builds_factors(i);
      if (!l.owned) {
        l.layer.set_ready(false);
      }
      tell_record(l, next);
    }
    forget_held(); // the new strategy's agreement says where its decompositions are
  }
  /// The strategy this process follows (a KFACLocalStrategy unless set_strategy() set another).
  const strategy_type &strategy() const { return active_strategy(); }
  /// strategy().report(): what the strategy communicates and stores on this process.
  KFACStrategyReport strategy_report() const { return strategy().report(); }
  /// Whether this process builds the factors of registered layer i
  /// (KFACStrategy::builds_factors()).
  bool owned(std::size_t i) const { return layers_.at(i)->owned; }

  /// Bytes of memory the K-FAC state holds now on this process: every layer's factors and
  /// batch buffers, decompositions (with their double buffers) and preconditioned-gradient
  /// buffer, plus the shared work and conversion buffers. Buffers are allocated on first use
  /// (the decompositions' second buffers at the second decomposition), so this grows during
  /// the first steps and is constant afterwards. A layer not built here
  /// (KFACStrategy::builds_factors()) holds only its preconditioned-gradient buffer.
  std::size_t state_bytes() const {
    std::size_t bytes = scratch_.bytes();
    for (const auto &l : layers_) {
      bytes += l->layer.bytes();
    }
    return bytes;
  }

  /// Whether the next step() updates factors, so a and g must be recorded during the
  /// forward/backward before it.
  bool needs_curvature() const { return curvature_due(); }

  /// Whether registered layer i should record a and g during the forward/backward before the
  /// next step(): needs_curvature() for an owned layer, and with
  /// Options::factored_preconditioning also every step for an owned layer that the factored
  /// form may serve (until its first step, and afterwards while factored_flops() for its rows
  /// is below direct_flops()). The layer's record callback is told exactly this. A layer
  /// registered without a record callback must then supply a and g of the current batch on
  /// every step, or empty views (the layer is then preconditioned directly).
  bool wants_curvature(std::size_t i) const {
    return wants_record(*layers_.at(i), needs_curvature());
  }

  /// Whether the last step() preconditioned registered layer i in factored form
  /// (Options::factored_preconditioning).
  bool factored(std::size_t i) const { return layer(i).factored(); }
  /// The relative difference ‖∇v − gᵀ(av)‖₂ / ‖|g|ᵀ(|a||v|)‖₂ of registered layer i's last
  /// factored-preconditioning check (0 before any).
  double factored_check(std::size_t i) const { return layer(i).factored_check(); }
  /// KFACLayer::factored_tolerance(): rows·ε(Scalar) + 2(rows + cols)·ε(double).
  static double factored_tolerance(std::size_t rows, std::size_t cols) {
    return layer_type::factored_tolerance(rows, cols);
  }
  /// KFACLayer::direct_flops(): 2·out·cols·(out + cols).
  static double direct_flops(std::size_t out, std::size_t cols) {
    return layer_type::direct_flops(out, cols);
  }
  /// KFACLayer::factored_flops(): 2·rows·(out² + cols² + out·cols).
  static double factored_flops(std::size_t out, std::size_t cols, std::size_t rows) {
    return layer_type::factored_flops(out, cols, rows);
  }

  /// ν of the last step (1 when the clip did not act or is disabled).
  double kl_scale() const { return kl_scale_; }
  /// Σ_layers Σ P ⊙ ∇ of the last step (before the clip).
  double vg_sum() const { return vg_sum_; }

  /// One K-FAC step: updates factors and decompositions when due, then overwrites every
  /// registered weight gradient with its (KL-clipped) preconditioned gradient.
  ///
  /// The host waits for the device once per step, to read back one small status buffer (the
  /// KL clip's Σ P ⊙ ∇, and whether any factor, check or preconditioned gradient went wrong),
  /// plus once more on a step that decomposes after updating factors (the decomposition
  /// needs to know that the new factors are finite). Everything else is enqueued on `space`.
  /// A step that throws changes no factor and no gradient, and steps() does not advance.
  ///
  /// In order, with the strategy's part (KFACStrategy) in brackets (the steps are members of
  /// kat::detail::KFACSchedule, precond/detail/kfac_schedule.hpp):
  /// 1. stage_factors(): on a factor-update step, each layer's batch estimates
  ///    (KFACLayer::stage_factors) [builds_factors, reduce_factor], committed by
  ///    resolve_factors() once known finite;
  /// 2. decompose(): on a decomposition step (or for a layer with factors but none yet), the
  ///    eigendecompositions or inverses [computes_decomposition, agree_on_failures,
  ///    share_decomposition];
  /// 3. precondition(): each layer's P (KFACLayer::precondition), Σ P ⊙ ∇, ν and ∇ ← ν·P in
  ///    fused kernels [shares_gradients, share_gradient];
  /// 4. the status read-back (kat::detail::KFACStatus) and finish_step(): throws the step's
  ///    first failure or commits.
  ///
  /// @throws ValueError if a callable hyperparameter returns a value out of range (naming it
  ///   and the step); ShapeError if a layer's a, g or weight_gradient do not match its
  ///   registration or a and g are missing on a factor-update step; NumericalError if a
  ///   factor or decomposition is not finite or a decomposition fails (unless
  ///   keep_previous_on_failure) or a preconditioned gradient is not finite.
  void step(const execution_space &space) { run_step(space, nullptr); }

  /// step(space) on `grads` instead of the registered weight-gradient views: each layer's
  /// gradient is read from and written to `grads` at the offset and strides its registered
  /// weight_gradient has in the gradient buffer that register_model() recorded (the model's
  /// gradients()); entries of `grads` outside the layers' matrices are left as they are. With
  /// `grads` that buffer itself, this is step(space). Errors as step(), and
  /// @throws ValueError if a registered layer's weight gradient is not in that buffer
  ///   (registered by register_layer() elsewhere or from a second model, or no model
  ///   registered); ShapeError if `grads` is not as long as the buffer.
  void step(const execution_space &space, const vector_type &grads) {
    const char *where = "kat::precond::KFAC::step(space, grads)";
    for (const auto &l : layers_) {
      if (!l->layer.located()) {
        throw ValueError(kat::detail::concat(
            where, ": the weight gradient of layer '", l->layer.name(),
            "' is not in the gradient buffer of a model given to register_model(), so its "
            "place in grads is unknown; call step(space) to precondition the registered views"));
      }
    }
    kat::detail::require_extent(where, "grads length (the registered model's parameter count)",
                                grad_buffer_.extent(0), grads.extent(0));
    run_step(space, &grads);
  }

  /// The hyperparameters evaluated (and validated) at `step`.
  Values values(std::int64_t step) const { return kat::detail::kfac_values(opt_, step); }

  /// Step counter, hyperparameter values and factors, copied to the host.
  State state() const {
    State s;
    s.steps = steps_;
    s.values = values(steps_);
    for (const auto &l : layers_) {
      s.layers.push_back(l->layer.state());
    }
    return s;
  }

  /// The preconditioner's state (kat/core/state.hpp), everything a run needs to continue
  /// exactly: "steps" (int64), the hyperparameter values at that step ("values.damping", ...,
  /// float64; "values.factor_update_steps" and "values.inv_update_steps" int64) and per
  /// registered layer i "layers.<i>.name" (text), "layers.<i>.ready" (uint8: it has a
  /// decomposition to precondition with) and its factors' states "layers.<i>.A.*" and
  /// "layers.<i>.G.*" (KroneckerFactor::state_dict(): the factor and its current
  /// decomposition). A distributed strategy's ranks each save their own: what a rank holds
  /// (its factors, the decompositions it computed or received) is its state. Fences.
  StateDict state_dict() const {
    StateDict s;
    kat::detail::kfac_save_values(s, steps_, values(steps_));
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->layer.save_state_dict(s, kat::detail::concat("layers.", i));
    }
    return s;
  }

  /// Restores what state_dict() saved into a KFAC with the same layers registered in the same
  /// order: the step counter, the constant hyperparameters (callables are kept as they are),
  /// the factors and their decompositions; nothing is recomputed, so the next step is the one
  /// the saving run would have taken. Everything is checked first: a failed load changes
  /// nothing.
  /// @throws StateError naming the first entry that is missing, unexpected, of another dtype
  ///   or shape, or a layer name that differs; ValueError if a stored value is out of range.
  void load_state_dict(const StateDict &state) {
    const std::string where = "kat::precond::KFAC::load_state_dict";
    std::vector<std::string> names = kat::detail::kfac_value_names();
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::string head = kat::detail::concat("layers.", i);
      layer_type::state_dict_names(names, head);
      layers_[i]->layer.check_state_dict(state, head, where, i);
    }
    state.require_names(where, names);
    const auto [steps, v] = kat::detail::kfac_load_values(state, where);
    kat::detail::kfac_restore_constants(opt_, v);
    steps_ = steps;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->layer.load_state_dict(state, kat::detail::concat("layers.", i));
    }
    forget_held(); // the restored decompositions are agreed on at the next step
    tell_records();
  }

  /// Restores state() output: the step counter, the constant hyperparameters (callables are
  /// kept as they are) and the factors; recomputes the decompositions of restored factors.
  /// @throws ShapeError if the layers (names, order or dimensions) differ from the
  ///   registered ones; ValueError if a stored hyperparameter is out of range.
  void load_state(const execution_space &space, const State &s) {
    const char *where = "kat::precond::KFAC::load_state";
    kat::detail::require_extent(where, "number of layers", layers_.size(), s.layers.size());
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const layer_type &l = layers_[i]->layer;
      if (s.layers[i].name != l.name()) {
        throw ShapeError(kat::detail::concat(where, ": layer ", i, " must be '", l.name(),
                                             "', got '", s.layers[i].name, "'"));
      }
      l.check_state(where, s.layers[i]);
    }
    kat::detail::kfac_check_values(s.values, s.steps);
    if (s.steps < 0) {
      throw ValueError(kat::detail::concat(where, ": steps must be >= 0, got ", s.steps));
    }
    kat::detail::kfac_restore_constants(opt_, s.values);
    steps_ = s.steps;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i]->owned) { // (otherwise another process builds this layer's factors)
        layers_[i]->layer.load_state(space, s.layers[i]);
      }
    }
    // The decompositions of the last decomposition step are recomputed from the restored
    // factors, with the damping of the current step (a full decomposition step: its agreement
    // says again where the decompositions are held).
    decompose(space, opt_.damping(steps_));
    tell_records();
  }

private:
  using Schedule =
      kat::detail::KFACSchedule<KFAC, Scalar, MemorySpace, InverseScalar, FactorScalar>;
  using Schedule::active_strategy;
  using Schedule::curvature_due;
  using Schedule::decompose;
  using Schedule::forget_held;
  using Schedule::kl_scale_;
  using Schedule::layers_;
  using Schedule::opt_;
  using Schedule::run_step;
  using Schedule::scratch_;
  using Schedule::steps_;
  using Schedule::strategy_;
  using Schedule::tell_record;
  using Schedule::tell_records;
  using Schedule::vg_sum_;
  using Schedule::wants_record;
  using typename Schedule::Entry;

  template <class L> std::size_t register_nn_layer(const std::string &path, L &layer) {
    std::size_t count = 0;
    const auto subs = layer.sublayers();
    for (std::size_t j = 0; j < subs.size(); ++j) {
      count += register_nn_layer(path + "." + std::to_string(j), *subs[j]);
    }
    if (!layer.supports_curvature()) {
      return count;
    }
    L *ptr = &layer;
    const bool added = register_layer(
        path, [ptr]() { return ptr->curvature(); }, [ptr](bool on) { ptr->record_curvature(on); },
        layer.name());
    return count + (added ? 1 : 0);
  }

  vector_type grad_buffer_; // the first registered model's gradients() (step(space, grads))
};

} // namespace kat::precond
