#pragma once
/// @file
/// @brief K-FAC: Kronecker-factored approximate curvature preconditioning of layer gradients
/// (kat::precond::KFAC). Including it gives the whole K-FAC API: its options, hyperparameter
/// values and state (kfac_options.hpp), the strategy interface (kfac_strategy.hpp) and the
/// factors (kronecker_factor.hpp).

#include "kat/core/blas.hpp"
#include "kat/core/curvature.hpp"
#include "kat/core/detail/convert.hpp"
#include "kat/core/error.hpp"
#include "kat/core/host_sync.hpp"
#include "kat/core/hyperparameter.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/precond/detail/kfac_kernels.hpp"
#include "kat/precond/kfac_options.hpp"
#include "kat/precond/kfac_strategy.hpp"
#include "kat/precond/kronecker_factor.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kat::precond {

/// K-FAC preconditioner (Martens & Grosse 2015, "Optimizing Neural Networks with
/// Kronecker-factored Approximate Curvature"; Grosse & Martens 2016 for convolutions), in the
/// formulation of KAISA (Pauloski et al. 2021, reference code kfac-pytorch) and exactly as
/// docs/algorithms.md section 1 states. It acts between backward and the base optimizer:
///
///     model.forward / loss / model.backward   (layers record a and g when kfac asks)
///     kfac.step(space);                       (preconditions the weight gradients in place)
///     sgd.step(space, params, grads);
///
/// For each registered layer with weight gradient ∇ = d[W b] (out x (in+1)), input rows `a`
/// (rows x (in+1), with the ones column) and output gradients `g` (rows x out):
///
/// - factors, every `factor_update_steps` steps: A = aᵀa / rows and G = gᵀg · N² / rows for a
///   batch-mean loss (N = samples in the batch: undoing the 1/N that g carries), or
///   G = gᵀg / rows for a sum. For Dense rows = N, so A = aᵀa/N and G = N·gᵀg; for Conv2d
///   rows = N·H_out·W_out (KAISA's convention). Both are running averages with
///   `factor_decay` α: F ← α·F + (1 − α)·F_new (the first update sets F = F_new),
///   symmetrized.
/// - decompositions, every `inv_update_steps` steps, in InverseScalar (double by default).
/// - eigen path: P = Q_G [(Q_Gᵀ ∇ Q_A) ⊘ (d_G d_Aᵀ + λ)] Q_Aᵀ, which is exactly
///   (A ⊗ G + λI)⁻¹ vec(∇), with the damping λ of the current step.
/// - inverse path: P = (G + λ_G I)⁻¹ ∇ (A + λ_A I)⁻¹ with λ_A = λ_G = √λ, or with
///   `pi_correction` π = sqrt((tr A / dim A) / (tr G / dim G)), λ_A = π√λ, λ_G = √λ/π
///   (π = 1 if either trace is 0). The damping is the one at the decomposition step.
/// - KL clip: ν = min(1, sqrt(κ / |Σ_layers Σ P ⊙ ∇ · lr²|)), every P is multiplied by ν and
///   written over ∇ (κ = `kl_clip`; 0 disables the clip).
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
class KFAC {
public:
  using scalar_type = Scalar;
  using memory_space = MemorySpace;
  using execution_space = typename MemorySpace::execution_space;
  using record_type = CurvatureRecord<Scalar, MemorySpace>;
  using factor_type = KroneckerFactor<FactorScalar, MemorySpace, InverseScalar>;
  using matrix_type = Matrix<Scalar, MemorySpace>;
  using inverse_matrix_type = Matrix<InverseScalar, MemorySpace>;
  using factor_scalar_type = FactorScalar;
  /// A factor (or batch estimate) matrix: dim x dim, FactorScalar.
  using factor_matrix_type = Matrix<FactorScalar, MemorySpace>;
  /// The strategy interface this KFAC asks (see set_strategy()).
  using strategy_type = KFACStrategy<KFAC>;
  /// What one decomposition step found on this process (KFACStrategy::agree_on_failures()).
  using DecompositionFailures = KFACDecompositionFailures;

  using Options = KFACOptions;
  using Values = KFACValues;
  using State = KFACState;

  /// @throws ValueError naming the option, its valid range and its value, for any constant
  ///   hyperparameter out of range, a null log, or pi_correction with the eigen method.
  explicit KFAC(Options options = Options()) : opt_(std::move(options)) {
    if (opt_.log == nullptr) {
      throw ValueError("kat::precond::KFAC: log must not be null");
    }
    if (opt_.pi_correction && opt_.compute_method == ComputeMethod::eigen) {
      throw ValueError("kat::precond::KFAC: pi_correction needs compute_method inverse, got eigen "
                       "(the eigen path damps the Kronecker product exactly)");
    }
    Values v{};
    if (opt_.factor_update_steps.is_constant()) {
      v.factor_update_steps = opt_.factor_update_steps.value();
      kat::detail::kfac_check_steps("factor_update_steps", v.factor_update_steps, -1);
    }
    if (opt_.inv_update_steps.is_constant()) {
      v.inv_update_steps = opt_.inv_update_steps.value();
      kat::detail::kfac_check_steps("inv_update_steps", v.inv_update_steps, -1);
    }
    if (opt_.factor_update_steps.is_constant() && opt_.inv_update_steps.is_constant()) {
      warn_if_not_multiple(v.factor_update_steps, v.inv_update_steps);
    }
    if (opt_.damping.is_constant())
      kat::detail::kfac_check_damping(opt_.damping.value(), -1);
    if (opt_.factor_decay.is_constant())
      kat::detail::kfac_check_decay(opt_.factor_decay.value(), -1);
    if (opt_.kl_clip.is_constant())
      kat::detail::kfac_check_nonnegative("kl_clip", opt_.kl_clip.value(), -1);
    if (opt_.lr.is_constant())
      kat::detail::kfac_check_nonnegative("lr", opt_.lr.value(), -1);
  }

  KFAC(const KFAC &) = delete;
  KFAC &operator=(const KFAC &) = delete;

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
      if (l->name == name) {
        throw ValueError(kat::detail::concat("kat::precond::KFAC::register_layer: name '", name,
                                             "' is already registered"));
      }
    }
    if (skipped(name) || (!type.empty() && skipped(type))) {
      return false;
    }
    const record_type r = views();
    if (r.weight_gradient.extent(0) == 0 || r.weight_gradient.extent(1) == 0) {
      throw ShapeError(
          kat::detail::concat("kat::precond::KFAC::register_layer: weight_gradient of layer '",
                              name, "' must be a non-empty out x (in+1) matrix, got ",
                              r.weight_gradient.extent(0), "x", r.weight_gradient.extent(1)));
    }
    const std::size_t out = r.weight_gradient.extent(0), cols = r.weight_gradient.extent(1);
    const std::string label = "kat::precond::KFAC::" + name;
    layers_.push_back(
        std::make_unique<Entry>(name, type, std::move(views), std::move(record), out, cols, label));
    layers_.back()->owned = strategy().builds_factors(layers_.size() - 1);
    tell_record(*layers_.back(), needs_curvature());
    return true;
  }

  /// Registers every layer of a kat::nn model (Sequential) that supports curvature, walking
  /// into containers (Residual). Names are the index path in the model ("0", "3.1"), types
  /// the layer's name() ("Dense", "Conv2d"). Turns on the layers' recording as needed.
  /// @return the number of layers registered.
  template <class Model> std::size_t register_model(Model &model) {
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
      names.push_back(l->name);
    return names;
  }
  /// Factor A (activations) of registered layer i.
  const factor_type &factor_a(std::size_t i) const { return layers_.at(i)->A; }
  /// Factor G (output gradients) of registered layer i.
  const factor_type &factor_g(std::size_t i) const { return layers_.at(i)->G; }

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
        l.ready = false;
      }
      tell_record(l, next);
    }
  }
  /// The strategy this process follows (a KFACLocalStrategy unless set_strategy() set another).
  const strategy_type &strategy() const {
    static const KFACLocalStrategy<KFAC> local{};
    if (strategy_ != nullptr) {
      return *strategy_;
    }
    return local;
  }
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
    std::size_t bytes = (work_.capacity() + cast_.capacity() + factored_a_.capacity() +
                         factored_g_.capacity() + factored_u_.capacity() + factored_v_.capacity()) *
                            sizeof(InverseScalar) +
                        (check_rows_.capacity() + check_out_.capacity()) * sizeof(double);
    for (const auto &l : layers_) {
      bytes += l->A.bytes() + l->G.bytes() + l->p.span() * sizeof(InverseScalar) +
               l->probe.span() * sizeof(double);
    }
    return bytes;
  }

  /// Whether the next step() updates factors, so a and g must be recorded during the
  /// forward/backward before it.
  bool needs_curvature() const {
    const std::int64_t every = opt_.factor_update_steps(steps_);
    kat::detail::kfac_check_steps("factor_update_steps", every, steps_);
    return steps_ % every == 0;
  }

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
  bool factored(std::size_t i) const { return layers_.at(i)->factored; }

  /// The relative difference ‖∇v − gᵀ(av)‖₂ / ‖|g|ᵀ(|a||v|)‖₂ of registered layer i's last
  /// factored-preconditioning check (0 before any).
  double factored_check(std::size_t i) const { return layers_.at(i)->check; }
  /// The largest relative difference that check accepts for a batch of `rows` rows and `cols`
  /// columns of a: rows·ε(Scalar) + 2(rows + cols)·ε(double) (see Options).
  static double factored_tolerance(std::size_t rows, std::size_t cols) {
    return static_cast<double>(rows) * static_cast<double>(std::numeric_limits<Scalar>::epsilon()) +
           2.0 * static_cast<double>(rows + cols) * std::numeric_limits<double>::epsilon();
  }

  /// Flops of the first half of the direct preconditioning of an out x cols gradient,
  /// G⁻¹∇ then (·)A⁻¹ (inverse path) or Q_Gᵀ∇ then (·)Q_A (eigen path): 2·out·cols·(out + cols).
  static double direct_flops(std::size_t out, std::size_t cols) {
    const double o = static_cast<double>(out), c = static_cast<double>(cols);
    return 2.0 * o * c * (o + c);
  }
  /// Flops of the same product in factored form from a batch of `rows` rows: G⁻¹gᵀ, aA⁻¹ and
  /// their product, 2·rows·(out² + cols² + out·cols). A layer is preconditioned in factored
  /// form when this is strictly below direct_flops().
  static double factored_flops(std::size_t out, std::size_t cols, std::size_t rows) {
    const double o = static_cast<double>(out), c = static_cast<double>(cols);
    return 2.0 * static_cast<double>(rows) * (o * o + c * c + o * c);
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
  /// In order, with the strategy's part (KFACStrategy) in brackets:
  /// 1. stage_factors(): on a factor-update step, each layer's batch estimates
  ///    (KroneckerFactor::stage_update) [builds_factors, reduce_factor], committed by
  ///    resolve_factors() once known finite;
  /// 2. decompose(): on a decomposition step (or for a layer with factors but none yet), the
  ///    eigendecompositions or inverses [computes_decomposition, agree_on_failures,
  ///    share_decomposition];
  /// 3. precondition(): each layer's P, Σ P ⊙ ∇, ν and ∇ ← ν·P in fused kernels
  ///    [shares_gradients, share_gradient];
  /// 4. read_status() and finish_step(): the one read-back; throws the step's first failure
  ///    or commits.
  ///
  /// @throws ValueError if a callable hyperparameter returns a value out of range (naming it
  ///   and the step); ShapeError if a layer's a, g or weight_gradient do not match its
  ///   registration or a and g are missing on a factor-update step; NumericalError if a
  ///   factor or decomposition is not finite or a decomposition fails (unless
  ///   keep_previous_on_failure) or a preconditioned gradient is not finite.
  void step(const execution_space &space) {
    ScopedRegion region("kat::precond::KFAC::step");
    const Values v = values(steps_);
    warn_if_not_multiple(v.factor_update_steps, v.inv_update_steps);
    for (auto &l : layers_) {
      l->current = l->views(); // once per step: the callback may do work
    }
    const bool factor_step = steps_ % v.factor_update_steps == 0;
    // Besides every inv_update_steps, a layer whose first factors came late (a skipped
    // non-finite update) is decomposed as soon as it has them, not up to inv_update_steps later.
    const bool only_missing = steps_ % v.inv_update_steps != 0;
    try {
      clear_status(space);
      if (factor_step) {
        stage_factors(space, v.factor_decay);
        if (decomposes(only_missing)) {
          read_status(space); // the decompositions need the new factors, known to be finite
          resolve_factors(true);
        }
      }
      decompose(space, v.damping, only_missing);
      precondition(space, v);
      read_status(space);
      finish_step();
    } catch (...) {
      for (auto &l : layers_) {
        l->A.discard_update();
        l->G.discard_update();
        l->current = record_type();
      }
      throw;
    }
    ++steps_;
    for (auto &l : layers_) {
      l->current = record_type(); // do not keep the layer's workspaces alive
    }
    const bool next = needs_curvature();
    for (auto &l : layers_) {
      tell_record(*l, next);
    }
  }

  /// The hyperparameters evaluated (and validated) at `step`.
  Values values(std::int64_t step) const { return kat::detail::kfac_values(opt_, step); }

  /// Step counter, hyperparameter values and factors, copied to the host.
  State state() const {
    State s;
    s.steps = steps_;
    s.values = values(steps_);
    for (const auto &l : layers_) {
      typename State::Layer out;
      out.name = l->name;
      out.a_dim = l->A.dim();
      out.g_dim = l->G.dim();
      out.a_updates = l->A.updates();
      out.g_updates = l->G.updates();
      out.A = factor_host_vector(l->A);
      out.G = factor_host_vector(l->G);
      s.layers.push_back(std::move(out));
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
    s.set("steps", steps_);
    const Values v = values(steps_);
    s.set("values.factor_update_steps", v.factor_update_steps);
    s.set("values.inv_update_steps", v.inv_update_steps);
    s.set("values.damping", v.damping);
    s.set("values.factor_decay", v.factor_decay);
    s.set("values.kl_clip", v.kl_clip);
    s.set("values.lr", v.lr);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const Entry &l = *layers_[i];
      const std::string head = kat::detail::concat("layers.", i);
      s.set_text(head + ".name", l.name);
      s.set(head + ".ready", static_cast<std::uint8_t>(l.ready ? 1 : 0));
      s.merge(head + ".A", l.A.state_dict());
      s.merge(head + ".G", l.G.state_dict());
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
    std::vector<std::string> names{
        "steps",          "values.factor_update_steps", "values.inv_update_steps",
        "values.damping", "values.factor_decay",        "values.kl_clip",
        "values.lr"};
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const Entry &l = *layers_[i];
      const std::string head = kat::detail::concat("layers.", i);
      names.insert(names.end(), {head + ".name", head + ".ready", head + ".A.", head + ".G."});
      const std::string name = state.text(head + ".name");
      if (name != l.name) {
        throw StateError(kat::detail::concat(where, ": layer ", i, " must be '", l.name,
                                             "', the state has '", name, "'"));
      }
      state.checked<std::uint8_t>(head + ".ready", {});
      try {
        l.A.check_state_dict(state.sub(head + ".A"));
        l.G.check_state_dict(state.sub(head + ".G"));
      } catch (const StateError &e) {
        throw StateError(kat::detail::concat(where, ": layer '", l.name, "': ", e.what()));
      }
    }
    state.require_names(where, names);
    Values v;
    const auto steps = state.get<std::int64_t>("steps");
    v.factor_update_steps = state.get<std::int64_t>("values.factor_update_steps");
    v.inv_update_steps = state.get<std::int64_t>("values.inv_update_steps");
    v.damping = state.get<double>("values.damping");
    v.factor_decay = state.get<double>("values.factor_decay");
    v.kl_clip = state.get<double>("values.kl_clip");
    v.lr = state.get<double>("values.lr");
    if (steps < 0) {
      throw ValueError(kat::detail::concat(where, ": steps must be >= 0, got ", steps));
    }
    kat::detail::kfac_check_values(v, steps);
    restore_constants(v);
    steps_ = steps;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      Entry &l = *layers_[i];
      const std::string head = kat::detail::concat("layers.", i);
      l.A.load_state_dict(state.sub(head + ".A"));
      l.G.load_state_dict(state.sub(head + ".G"));
      l.ready = state.get<std::uint8_t>(head + ".ready") != 0;
    }
    const bool next = needs_curvature();
    for (auto &l : layers_) {
      tell_record(*l, next);
    }
  }

  /// Restores state() output: the step counter, the constant hyperparameters (callables are
  /// kept as they are) and the factors; recomputes the decompositions of restored factors.
  /// @throws ShapeError if the layers (names, order or dimensions) differ from the
  ///   registered ones; ValueError if a stored hyperparameter is out of range.
  void load_state(const execution_space &space, const State &s) {
    const char *where = "kat::precond::KFAC::load_state";
    kat::detail::require_extent(where, "number of layers", layers_.size(), s.layers.size());
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const auto &l = *layers_[i];
      const auto &in = s.layers[i];
      if (in.name != l.name) {
        throw ShapeError(kat::detail::concat(where, ": layer ", i, " must be '", l.name, "', got '",
                                             in.name, "'"));
      }
      kat::detail::require_extent(where, "A dimension", l.A.dim(), in.a_dim);
      kat::detail::require_extent(where, "G dimension", l.G.dim(), in.g_dim);
      kat::detail::require_extent(where, "A entries", in.a_dim * in.a_dim, in.A.size());
      kat::detail::require_extent(where, "G entries", in.g_dim * in.g_dim, in.G.size());
    }
    kat::detail::kfac_check_values(s.values, s.steps);
    if (s.steps < 0) {
      throw ValueError(kat::detail::concat(where, ": steps must be >= 0, got ", s.steps));
    }
    restore_constants(s.values);
    steps_ = s.steps;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      auto &l = *layers_[i];
      const auto &in = s.layers[i];
      if (!l.owned)
        continue; // another process builds this layer's factors
      if (in.a_updates > 0)
        l.A.assign(space, host_matrix<FactorScalar>(in.A, in.a_dim));
      if (in.g_updates > 0)
        l.G.assign(space, host_matrix<FactorScalar>(in.G, in.g_dim));
    }
    // The decompositions of the last decomposition step are recomputed from the restored
    // factors, with the damping of the current step.
    decompose(space, opt_.damping(steps_));
    const bool next = needs_curvature();
    for (auto &l : layers_) {
      tell_record(*l, next);
    }
  }

private:
  /// The constant hyperparameters take `v`'s values (callables stay as they are).
  void restore_constants(const Values &v) {
    const auto restore = [](auto &option, auto value) {
      if (option.is_constant()) {
        option = value;
      }
    };
    restore(opt_.factor_update_steps, v.factor_update_steps);
    restore(opt_.inv_update_steps, v.inv_update_steps);
    restore(opt_.damping, v.damping);
    restore(opt_.factor_decay, v.factor_decay);
    restore(opt_.kl_clip, v.kl_clip);
    restore(opt_.lr, v.lr);
  }

  struct Entry {
    Entry(std::string n, std::string t, std::function<record_type()> v, std::function<void(bool)> r,
          std::size_t out_, std::size_t cols_, const std::string &label)
        : name(std::move(n)), type(std::move(t)), views(std::move(v)), record(std::move(r)),
          out(out_), cols(cols_), A(label + "::A", cols_), G(label + "::G", out_),
          p(Kokkos::view_alloc(label + "::P", Kokkos::WithoutInitializing), out_, cols_) {}
    std::string name, type;
    std::function<record_type()> views;
    std::function<void(bool)> record;
    std::size_t out, cols;
    factor_type A, G;
    inverse_matrix_type p;  // this step's preconditioned gradient, before the KL scale
    bool ready = false;     // has a decomposition to precondition with
    bool applied = false;   // preconditioned in this step
    bool owned = true;      // builds its factors here (KFACStrategy::builds_factors)
    record_type current;    // views() of this step
    bool asked = false;     // what the record callback was last told (this step's recording)
    bool every_step = true; // factored_preconditioning: record on every step (see wants_record)
    bool factored = false;  // the last step used the factored form
    Vector<double, MemorySpace> probe; // Freivalds vector v (cols), on first factored use
    double check = 0;                  // the last check's relative difference
    std::size_t check_rows = 0;        // rows of a in this step's check
  };

  /// Seed of the Freivalds vectors (stream: the registration index).
  static constexpr std::uint64_t probe_seed = 0x4b4641435f464143ull;

  // The status buffer (one double each; status_ on the device, read back once per step):
  // Σ P ⊙ ∇, the KL clip's ν, the non-finite count of each staged factor (A then G of each
  // layer), each layer's factored-preconditioning verdict (0 passed, 1 failed) and its two
  // squared norms.
  using segment_type = kat::detail::PGSegment<InverseScalar, Scalar>;
  static constexpr std::size_t vg_slot = 0, scale_slot = 1;
  static std::size_t factor_slot(std::size_t layer, char which) {
    return 2 + 2 * layer + (which == 'G' ? 1 : 0);
  }
  std::size_t verdict_slot(std::size_t layer) const { return 2 + 2 * layers_.size() + layer; }
  std::size_t check_slot(std::size_t layer) const { return 2 + 3 * layers_.size() + 2 * layer; }

  /// KFACStrategy::reduce_factor as KroneckerFactor::stage_update's batch hook (a named type:
  /// nvcc does not accept a function-local lambda type there).
  struct BatchHook {
    strategy_type *strategy;
    std::size_t index;
    char which;
    void operator()(const execution_space &space, const factor_matrix_type &batch) const {
      strategy->reduce_factor(space, batch, index, which);
    }
  };

  bool wants_record(const Entry &l, bool next) const {
    return l.owned && (next || (opt_.factored_preconditioning && l.every_step));
  }
  void tell_record(Entry &l, bool next) {
    l.asked = wants_record(l, next);
    if (l.record) {
      l.record(l.asked);
    }
  }

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

  static std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  }

  bool skipped(const std::string &name) const {
    const std::string n = lower(name);
    for (const auto &s : opt_.skip_layers) {
      if (lower(s) == n)
        return true;
    }
    return false;
  }

  void warn_if_not_multiple(std::int64_t factor_every, std::int64_t inv_every) {
    if (!warned_multiple_ && inv_every % factor_every != 0) {
      warned_multiple_ = true;
      *opt_.log << "kat::precond::KFAC: warning: inv_update_steps (" << inv_every
                << ") is not a multiple of factor_update_steps (" << factor_every
                << "); some decompositions will reuse unchanged factors\n";
    }
  }

  void warn(const std::string &message) const {
    *opt_.log << "kat::precond::KFAC: warning: " << message << '\n';
  }

  /// "kat::precond::KFAC::step: layer '<name>'", for messages (built only when one is thrown).
  static std::string context(const Entry &l) {
    return "kat::precond::KFAC::step: layer '" + l.name + "'";
  }

  /// Checks the record of `l` for a factor update and returns it.
  record_type checked_record(const Entry &l) const {
    const record_type &r = l.current;
    const std::string where = context(l);
    if (r.a.extent(0) == 0 || r.g.extent(0) == 0) {
      throw ShapeError(kat::detail::concat(
          where, ": a and g must be recorded on a factor-update step (step ", steps_, "), got a ",
          r.a.extent(0), "x", r.a.extent(1), " and g ", r.g.extent(0), "x", r.g.extent(1),
          "; turn on recording when needs_curvature() is true"));
    }
    kat::detail::require_extent(where.c_str(), "a columns", l.cols,
                                static_cast<std::size_t>(r.a.extent(1)));
    kat::detail::require_extent(where.c_str(), "g columns", l.out,
                                static_cast<std::size_t>(r.g.extent(1)));
    kat::detail::require_extent(where.c_str(), "g rows (= a rows)",
                                static_cast<std::size_t>(r.a.extent(0)),
                                static_cast<std::size_t>(r.g.extent(0)));
    if (r.samples == 0 || r.a.extent(0) % r.samples != 0) {
      throw ShapeError(kat::detail::concat(where, ": samples must divide the ", r.a.extent(0),
                                           " rows of a and be > 0, got ", r.samples));
    }
    return r;
  }

  /// Stages every owned layer's factor updates (KroneckerFactor::stage_update) with the
  /// counts of non-finite entries going to the status buffer; nothing is committed yet.
  void stage_factors(const execution_space &space, double decay) {
    ScopedRegion region("kat::precond::KFAC::update_factors");
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      Entry &l = *layers_[index];
      if (!l.owned) {
        continue;
      }
      const record_type r = checked_record(l);
      const double rows = static_cast<double>(r.a.extent(0));
      const double n = static_cast<double>(r.samples);
      const double g_scale = opt_.loss_reduction == LossReduction::mean ? n * n / rows : 1.0 / rows;
      stage_factor(space, l.A, r.a, 1.0 / rows, decay, index, 'A');
      stage_factor(space, l.G, r.g, g_scale, decay, index, 'G');
    }
  }

  /// factor.stage_update into the factor's status slot, through the strategy's
  /// reduce_factor() when it reduces factors.
  template <class XView>
  void stage_factor(const execution_space &space, factor_type &factor, const XView &x, double scale,
                    double decay, std::size_t index, char which) {
    const auto bad = Kokkos::subview(status_, factor_slot(index, which));
    if (strategy_ == nullptr || !strategy_->reduces_factors()) {
      factor.stage_update(space, x, scale, decay, bad);
      return;
    }
    factor.stage_update(space, x, scale, decay, bad, BatchHook{strategy_, index, which});
  }

  /// Whether decompose(space, damping, only_missing) would decompose some layer once the
  /// staged factor updates are committed.
  bool decomposes(bool only_missing) const {
    for (const auto &lp : layers_) {
      const Entry &l = *lp;
      const bool a = l.A.updates() > 0 || l.A.has_staged_update();
      const bool g = l.G.updates() > 0 || l.G.has_staged_update();
      if (l.owned && a && g && !(only_missing && l.ready)) {
        return true;
      }
    }
    return false;
  }

  /// What went wrong with a staged update of factor `which` of layer l that is not finite.
  std::string factor_failure(const Entry &l, char which) const {
    return kat::detail::concat("layer '", l.name, "' factor ", which, " at step ", steps_, ": ",
                               which == 'A' ? "the batch estimate aᵀa/rows has a NaN or an infinity"
                                            : "the batch estimate of gᵀg has a NaN or an infinity");
  }

  /// The failure of the first staged factor update whose status slot counts non-finite
  /// entries (empty if none).
  std::string factor_error() const {
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      const Entry &l = *layers_[index];
      for (const char which : {'A', 'G'}) {
        const factor_type &f = which == 'A' ? l.A : l.G;
        if (f.has_staged_update() && status_host_(factor_slot(index, which)) != 0) {
          return factor_failure(l, which);
        }
      }
    }
    return {};
  }

  /// Commits the staged factor updates whose status (read back) is finite. A non-finite one
  /// throws NumericalError (`may_throw`, without keep_previous_on_failure: every staged update
  /// is discarded first) or is discarded with a warning.
  void resolve_factors(bool may_throw) {
    if (may_throw && !opt_.keep_previous_on_failure) {
      const std::string error = factor_error();
      if (!error.empty()) {
        for (auto &l : layers_) {
          l->A.discard_update();
          l->G.discard_update();
        }
        throw NumericalError("kat::precond::KFAC: " + error);
      }
    }
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      Entry &l = *layers_[index];
      for (const char which : {'A', 'G'}) {
        factor_type &f = which == 'A' ? l.A : l.G;
        if (!f.has_staged_update()) {
          continue;
        }
        if (status_host_(factor_slot(index, which)) == 0) {
          f.commit_update();
          continue;
        }
        f.discard_update();
        warn(factor_failure(l, which) + "; keeping the previous factor");
      }
    }
  }

  /// Decomposes every layer's factors, or with `only_missing` those of layers that have
  /// factors but no decomposition yet: first the decompositions this process computes
  /// (failures collected), then the strategy's agreement on failures, then its
  /// share_decomposition() for each decomposed factor.
  /// @throws NumericalError (the same on every process with an agreement) if a decomposition
  ///   failed, unless keep_previous_on_failure.
  void decompose(const execution_space &space, double damping, bool only_missing = false) {
    ScopedRegion region("kat::precond::KFAC::decompose");
    std::vector<std::size_t> due;
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      const Entry &l = *layers_[index];
      if (l.owned && l.A.updates() > 0 && l.G.updates() > 0 && !(only_missing && l.ready)) {
        due.push_back(index); // (a layer without factors: a factor update failed and was skipped)
      }
    }
    // With an agreement every process takes part on every full decomposition step, whether or
    // not it decomposes anything itself (DP-KFAC: a rank that owns no layer).
    const bool agrees = strategy().agrees_on_failures();
    if (due.empty() && (only_missing || !agrees)) {
      return;
    }
    DecompositionFailures failures;
    failures.failed.assign(2 * layers_.size(), 0);
    std::vector<std::string> local(2 * layers_.size()); // this process's messages
    const bool eigen = opt_.compute_method == ComputeMethod::eigen;
    for (const std::size_t index : due) {
      Entry &l = *layers_[index];
      double da = 0, dg = 0;
      if (!eigen) {
        double pi = 1.0;
        if (opt_.pi_correction) {
          const double ta = l.A.mean_eigenvalue(space), tg = l.G.mean_eigenvalue(space);
          if (ta > 0.0 && tg > 0.0 && std::isfinite(ta) && std::isfinite(tg)) {
            pi = std::sqrt(ta / tg);
          }
        }
        const double root = std::sqrt(damping);
        da = pi * root;
        dg = root / pi;
      }
      for (const char which : {'A', 'G'}) {
        if (!strategy().computes_decomposition(index, which)) {
          continue;
        }
        factor_type &f = which == 'A' ? l.A : l.G;
        try {
          if (eigen) {
            f.compute_eigen(space);
          } else {
            f.compute_inverse(space, which == 'A' ? da : dg);
          }
        } catch (const NumericalError &e) {
          const std::size_t k = 2 * index + (which == 'G' ? 1 : 0);
          failures.failed[k] = 1;
          local[k] = kat::detail::concat("layer '", l.name, "' factor ", which, " at step ", steps_,
                                         ": the decomposition failed: ", e.what());
          if (failures.message.empty()) {
            failures.message = local[k];
          }
          if (!agrees && !opt_.keep_previous_on_failure) {
            throw NumericalError("kat::precond::KFAC: " + failures.message);
          }
        }
      }
    }
    if (agrees && !only_missing) {
      strategy_->agree_on_failures(space, failures);
    }
    if (!failures.message.empty()) {
      if (!opt_.keep_previous_on_failure) {
        throw NumericalError("kat::precond::KFAC: " + failures.message);
      }
      bool first = true;
      for (std::size_t k = 0; k < failures.failed.size(); ++k) {
        if (failures.failed[k] == 0) {
          continue;
        }
        const std::string what =
            !local[k].empty() ? local[k]
            : first           ? failures.message
                              : kat::detail::concat("layer '", layers_[k / 2]->name, "' factor ",
                                          k % 2 == 0 ? 'A' : 'G', " at step ", steps_,
                                                    ": the decomposition failed elsewhere");
        warn(what + "; keeping the previous decomposition");
        first = false;
      }
    }
    for (const std::size_t index : due) {
      Entry &l = *layers_[index];
      if (strategy_ != nullptr) {
        for (const char which : {'A', 'G'}) {
          if (failures.failed[2 * index + (which == 'G' ? 1 : 0)] == 0) {
            strategy_->share_decomposition(space, index, which, which == 'A' ? l.A : l.G);
          }
        }
      }
      l.ready = eigen ? l.A.has_eigen() && l.G.has_eigen() : l.A.has_inverse() && l.G.has_inverse();
    }
  }

  /// Computes every applied layer's P, then, in one reduction over all of them, Σ P ⊙ ∇ into
  /// the status buffer, the KL clip's ν from it (NaN when something failed this step) and
  /// ∇ = ν·P, all enqueued on `space` (finish_step() reads the outcome back).
  void precondition(const execution_space &space, const Values &v) {
    ScopedRegion region("kat::precond::KFAC::precondition");
    const bool shared = strategy().shares_gradients();
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      Entry &l = *layers_[index];
      l.applied = false;
      l.factored = false;
      if (!shared && !(l.owned && l.ready)) {
        continue; // left to the base optimizer
      }
      const matrix_type grad = l.current.weight_gradient;
      if (grad.extent(0) != l.out || grad.extent(1) != l.cols) {
        throw ShapeError(kat::detail::concat(context(l), ": weight_gradient must be ", l.out, "x",
                                             l.cols, " as registered, got ", grad.extent(0), "x",
                                             grad.extent(1)));
      }
      if (l.owned && l.ready) {
        l.factored = use_factored(l);
        if (l.factored) {
          check_factored(space, l, index);
        }
        if (opt_.compute_method == ComputeMethod::eigen) {
          precondition_eigen(space, l, grad, v.damping);
        } else {
          precondition_inverse(space, l, grad);
        }
      } else if (l.owned) {
        kat::detail::convert(space, grad, l.p); // shared, no decomposition: P = ∇
      }
      l.applied = true;
    }
    if (shared) {
      for (std::size_t i = 0; i < layers_.size(); ++i) {
        strategy_->share_gradient(space, i, layers_[i]->p);
      }
    }
    const std::size_t chunks = update_segments(space);
    if (chunks > 0) {
      kat::detail::segment_dot(space, segments_, chunks, Kokkos::subview(status_, vg_slot));
    }
    // Without keep_previous_on_failure a non-finite factor fails the step; with it the
    // factor is only kept, so only the factored-preconditioning verdicts count.
    const std::size_t fail_begin =
        opt_.keep_previous_on_failure ? verdict_slot(0) : factor_slot(0, 'A');
    kat::detail::kl_scale(space, status_, vg_slot, scale_slot, fail_begin,
                          verdict_slot(layers_.size()), v.kl_clip, v.lr);
    if (chunks > 0) {
      kat::detail::segment_apply(space, segments_, chunks, Kokkos::subview(status_, scale_slot));
    }
  }

  /// The fused kernels' view of the applied layers (P and ∇ pointers, in registration
  /// order); copied to the device only when it changed (not in a steady state).
  /// @return the number of chunks of all applied layers together.
  std::size_t update_segments(const execution_space &space) {
    constexpr std::size_t chunk = kat::detail::fused_chunk<execution_space>;
    std::vector<segment_type> segments;
    std::size_t chunks = 0;
    for (const auto &lp : layers_) {
      const Entry &l = *lp;
      if (!l.applied) {
        continue;
      }
      const matrix_type &grad = l.current.weight_gradient;
      segment_type seg;
      seg.p = l.p.data();
      seg.g = grad.data();
      seg.out = l.out;
      seg.ld = l.cols > 1 ? static_cast<std::size_t>(grad.stride(1)) : l.out;
      seg.n = l.out * l.cols;
      seg.chunk = chunks;
      segments.push_back(seg);
      chunks += (seg.n + chunk - 1) / chunk;
    }
    const bool same = segments.size() == segments_host_.extent(0) &&
                      std::equal(segments.begin(), segments.end(), segments_host_.data());
    if (!same) {
      segments_ = Kokkos::View<segment_type *, MemorySpace>(
          Kokkos::view_alloc("kat::precond::KFAC::segments", Kokkos::WithoutInitializing),
          segments.size());
      segments_host_ = Kokkos::create_mirror_view(segments_);
      std::copy(segments.begin(), segments.end(), segments_host_.data());
      Kokkos::deep_copy(space, segments_, segments_host_);
    }
    return chunks;
  }

  /// Zeroes the status buffer (allocated on first use, or when layers were registered).
  void clear_status(const execution_space &space) {
    const std::size_t n = verdict_slot(layers_.size()) + 2 * layers_.size();
    if (status_.extent(0) != n) {
      status_ = Vector<double, MemorySpace>("kat::precond::KFAC::status", n);
      status_host_ = Kokkos::create_mirror_view(status_);
    }
    kat::detail::clear(space, status_);
  }

  /// Copies the status buffer to the host: the one place a step waits for the device.
  void read_status(const execution_space &space) {
    Kokkos::deep_copy(space, status_host_, status_);
    kat::detail::fence(space);
  }

  /// From the status read back after precondition(): throws the step's first failure (a
  /// non-finite factor, a failed factored-preconditioning check, a non-finite Σ P ⊙ ∇; the
  /// kernels then left every gradient as it was), or commits the staged factors and records
  /// Σ P ⊙ ∇ and ν.
  void finish_step() {
    if (!opt_.keep_previous_on_failure) {
      resolve_factors(true); // throws (discarding every staged update) if one is not finite
    }
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      if (layers_[index]->factored) {
        check_verdict(*layers_[index], index);
      }
    }
    const double vg = status_host_(vg_slot);
    if (!std::isfinite(vg)) {
      report_non_finite();
    }
    resolve_factors(false);
    vg_sum_ = vg;
    kl_scale_ = status_host_(scale_slot);
  }

  /// Names the first applied layer whose Σ P ⊙ ∇ is not finite (blocking reductions: this
  /// runs only when the step already failed).
  [[noreturn]] void report_non_finite() {
    const execution_space space;
    for (const auto &lp : layers_) {
      const Entry &l = *lp;
      if (l.applied &&
          !std::isfinite(kat::detail::elementwise_dot(space, l.p, l.current.weight_gradient))) {
        throw NumericalError(
            kat::detail::concat(context(l), ": the preconditioned gradient is not finite at step ",
                                steps_, " (is the gradient finite?)"));
      }
    }
    throw NumericalError(kat::detail::concat(
        "kat::precond::KFAC::step: the sum of P ⊙ ∇ over the layers is not finite at step ", steps_,
        " (is the gradient finite?)"));
  }

  /// `x` as an InverseScalar matrix, converted into `ws`: the view itself when the types agree.
  static inverse_matrix_type to_inverse(const execution_space &space, const matrix_type &x,
                                        Workspace<InverseScalar, MemorySpace> &ws) {
    if constexpr (std::is_same<Scalar, InverseScalar>::value) {
      (void)space;
      (void)ws;
      return x;
    } else {
      const inverse_matrix_type c = ws.matrix(x.extent(0), x.extent(1));
      kat::detail::convert(space, x, c);
      return c;
    }
  }
  /// The gradient as an InverseScalar matrix: the view itself when the types agree.
  inverse_matrix_type as_inverse(const execution_space &space, const matrix_type &grad) {
    return to_inverse(space, grad, cast_);
  }

  /// Whether layer l is preconditioned in factored form this step: the option is on, a and g
  /// of this step's batch were recorded (the record callback was told so, or there is none),
  /// and the factored product is cheaper for their rows. Remembers the cost decision so that
  /// a layer that stays direct records only on factor-update steps.
  bool use_factored(Entry &l) const {
    if (!opt_.factored_preconditioning || (l.record && !l.asked)) {
      return false;
    }
    const record_type &r = l.current;
    if (r.a.extent(0) == 0 && r.g.extent(0) == 0) {
      return false; // not supplied this step: direct
    }
    checked_record(l); // shapes
    const std::size_t rows = r.a.extent(0);
    l.every_step = factored_flops(l.out, l.cols, rows) < direct_flops(l.out, l.cols);
    return l.every_step;
  }

  /// op(left) gᵀ a right into dst (out x cols), from this step's a and g: G⁻¹(gᵀa)A⁻¹ with
  /// left = G⁻¹, right = A⁻¹ (inverse path), or Q_Gᵀ(gᵀa)Q_A with left = Q_G transposed,
  /// right = Q_A (eigen path).
  void factored_product(const execution_space &space, const Entry &l,
                        const inverse_matrix_type &left, Trans left_trans,
                        const inverse_matrix_type &right, const inverse_matrix_type &dst) {
    const inverse_matrix_type a = to_inverse(space, l.current.a, factored_a_);
    const inverse_matrix_type g = to_inverse(space, l.current.g, factored_g_);
    const std::size_t rows = a.extent(0);
    const inverse_matrix_type u = factored_u_.matrix(l.out, rows);
    const inverse_matrix_type v = factored_v_.matrix(rows, l.cols);
    const InverseScalar one(1), zero(0);
    gemm(space, left_trans, Trans::T, one, left, g, zero, u); // op(L) gᵀ, out x rows
    gemm(space, Trans::N, Trans::N, one, a, right, zero, v);  // a R, rows x cols
    gemm(space, Trans::N, Trans::N, one, u, v, zero, dst);
  }

  /// Freivalds' check that this step's weight gradient is the recorded batch's gᵀa, with a
  /// fixed random v (cols, uniform in [-1, 1), drawn once per layer): in double,
  /// ‖∇v − gᵀ(av)‖₂ <= τ ‖|g|ᵀ(|a||v|)‖₂ with τ = rows·ε(Scalar) + 2(rows + cols)·ε(double).
  /// Any summation order of ∇ = gᵀa in Scalar errs by at most γ_rows (|g|ᵀ|a|) entry-wise
  /// (γ_n = nu/(1 − nu) <= n·ε for unit roundoff u = ε/2, Higham, "Accuracy and Stability of
  /// Numerical Algorithms", sec. 3.5), so a gradient that is gᵀa never fails; the second term
  /// covers the check's own double rounding. Cost O(out·cols + rows·(cols + out)). The check
  /// is enqueued on `space` with its verdict going to the status buffer; check_verdict()
  /// reports it once the step's status is read back (the apply kernel writes no gradient of a
  /// step whose check failed).
  void check_factored(const execution_space &space, Entry &l, std::size_t index) {
    ScopedRegion region("kat::precond::KFAC::factored_check");
    const record_type &r = l.current;
    const std::size_t rows = r.a.extent(0), out = l.out, cols = l.cols;
    if (l.probe.extent(0) != cols) {
      l.probe = Vector<double, MemorySpace>(
          Kokkos::view_alloc("kat::precond::KFAC::" + l.name + "::probe",
                             Kokkos::WithoutInitializing),
          cols);
      kat::detail::fill_probe(space, l.probe, probe_seed, index);
    }
    kat::detail::freivalds_check(space, r.a, r.g, r.weight_gradient, l.probe,
                                 check_rows_.matrix(rows, 2), check_out_.matrix(out, 2), status_,
                                 check_slot(index), verdict_slot(index),
                                 factored_tolerance(rows, cols));
    l.check_rows = rows;
  }

  /// The outcome of check_factored() for layer l, from the status read back.
  /// @throws NumericalError if the check is not finite, ValueError if it failed.
  void check_verdict(Entry &l, std::size_t index) {
    const double diff = std::sqrt(status_host_(check_slot(index)));
    const double bound = std::sqrt(status_host_(check_slot(index) + 1));
    if (!std::isfinite(diff) || !std::isfinite(bound)) {
      throw NumericalError(kat::detail::concat(
          context(l), ": factored_preconditioning: the check ‖∇v − gᵀ(av)‖ is not finite at step ",
          steps_, " (are the gradient, a and g finite?)"));
    }
    const double tol = factored_tolerance(l.check_rows, l.cols);
    l.check = bound > 0 ? diff / bound : (diff > 0 ? std::numeric_limits<double>::infinity() : 0);
    if (status_host_(verdict_slot(index)) != 0) {
      throw ValueError(kat::detail::concat(
          context(l), ": factored_preconditioning at step ", steps_,
          ": the weight gradient is not the recorded batch's gᵀa: ‖∇v − gᵀ(av)‖₂ / "
          "‖|g|ᵀ(|a||v|)‖₂ = ",
          l.check, ", allowed ", tol,
          " (rounding of gᵀa in the model's precision). The option requires the gradient to be "
          "exactly gᵀa of the batch recorded in a and g: no accumulation over several "
          "batches or backward passes, no data-parallel averaging, no clipping, weight decay "
          "or other change before KFAC::step; turn factored_preconditioning off otherwise"));
    }
  }

  void precondition_eigen(const execution_space &space, Entry &l, const matrix_type &grad,
                          double damping) {
    const inverse_matrix_type w = work_.matrix(l.out, l.cols);
    const auto &qa = l.A.eigenvectors();
    const auto &qg = l.G.eigenvectors();
    const auto da = l.A.eigenvalues();
    const auto dg = l.G.eigenvalues();
    const InverseScalar one(1), zero(0);
    if (l.factored) {
      factored_product(space, l, qg, Trans::T, qa, l.p); // (Q_Gᵀ gᵀ)(a Q_A)
    } else {
      const inverse_matrix_type g = as_inverse(space, grad);
      gemm(space, Trans::T, Trans::N, one, qg, g, zero, w);   // Q_Gᵀ ∇
      gemm(space, Trans::N, Trans::N, one, w, qa, zero, l.p); // (Q_Gᵀ ∇) Q_A
    }
    kat::detail::eigen_scale(space, l.p, dg, da, static_cast<InverseScalar>(damping));
    gemm(space, Trans::N, Trans::N, one, qg, l.p, zero, w); // Q_G (·)
    gemm(space, Trans::N, Trans::T, one, w, qa, zero, l.p); // (·) Q_Aᵀ
  }

  void precondition_inverse(const execution_space &space, Entry &l, const matrix_type &grad) {
    if (l.factored) {
      factored_product(space, l, l.G.inverse(), Trans::N, l.A.inverse(), l.p); // (G⁻¹gᵀ)(aA⁻¹)
      return;
    }
    const inverse_matrix_type g = as_inverse(space, grad);
    const inverse_matrix_type w = work_.matrix(l.out, l.cols);
    const InverseScalar one(1), zero(0);
    gemm(space, Trans::N, Trans::N, one, l.G.inverse(), g, zero, w);
    gemm(space, Trans::N, Trans::N, one, w, l.A.inverse(), zero, l.p);
  }

  /// A factor's entries (column-major); dim² zeros if it was never allocated.
  static std::vector<double> factor_host_vector(const factor_type &f) {
    if (f.factor().extent(0) != f.dim()) {
      return std::vector<double>(f.dim() * f.dim(), 0.0);
    }
    return to_host_vector(f.factor());
  }

  template <class View> static std::vector<double> to_host_vector(const View &m) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
    std::vector<double> out(m.extent(0) * m.extent(1));
    for (std::size_t j = 0; j < m.extent(1); ++j)
      for (std::size_t i = 0; i < m.extent(0); ++i)
        out[i + m.extent(0) * j] = static_cast<double>(h(i, j));
    return out;
  }

  template <class T>
  static Kokkos::View<T **, Kokkos::LayoutLeft, Kokkos::HostSpace>
  host_matrix(const std::vector<double> &values, std::size_t dim) {
    Kokkos::View<T **, Kokkos::LayoutLeft, Kokkos::HostSpace> h("kat::precond::KFAC::load_state",
                                                                dim, dim);
    for (std::size_t j = 0; j < dim; ++j)
      for (std::size_t i = 0; i < dim; ++i)
        h(i, j) = static_cast<T>(values[i + dim * j]);
    return h;
  }

  Options opt_;
  strategy_type *strategy_ = nullptr; // nullptr: the local strategy
  std::vector<std::unique_ptr<Entry>> layers_;
  Workspace<InverseScalar, MemorySpace> work_{"kat::precond::KFAC::work"};
  Workspace<InverseScalar, MemorySpace> cast_{"kat::precond::KFAC::cast"};
  // factored_preconditioning: a and g converted, G⁻¹gᵀ (or Q_Gᵀgᵀ), aA⁻¹ (or aQ_A), and the
  // check's (av, |a||v|) and (∇v − gᵀav, |g|ᵀ|a||v|).
  Workspace<InverseScalar, MemorySpace> factored_a_{"kat::precond::KFAC::factored_a"};
  Workspace<InverseScalar, MemorySpace> factored_g_{"kat::precond::KFAC::factored_g"};
  Workspace<InverseScalar, MemorySpace> factored_u_{"kat::precond::KFAC::factored_u"};
  Workspace<InverseScalar, MemorySpace> factored_v_{"kat::precond::KFAC::factored_v"};
  Workspace<double, MemorySpace> check_rows_{"kat::precond::KFAC::check_rows"};
  Workspace<double, MemorySpace> check_out_{"kat::precond::KFAC::check_out"};
  Vector<double, MemorySpace> status_;
  typename Vector<double, MemorySpace>::HostMirror status_host_;
  Kokkos::View<segment_type *, MemorySpace> segments_;
  typename Kokkos::View<segment_type *, MemorySpace>::HostMirror segments_host_;
  std::int64_t steps_ = 0;
  double kl_scale_ = 1.0, vg_sum_ = 0.0;
  bool warned_multiple_ = false;
};

} // namespace kat::precond
