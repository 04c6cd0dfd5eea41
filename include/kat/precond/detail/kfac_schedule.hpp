#pragma once
/// @file
/// @brief Internal: the schedule of a kat::precond::KFAC step (kat::detail::KFACSchedule): the
/// registered layers, the order in which a step stages and commits factors, decomposes,
/// preconditions and KL-clips them with the strategy's hooks, and the state that schedule keeps.

#include "kat/core/curvature.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/precond/detail/kfac_status.hpp"
#include "kat/precond/kfac_layer.hpp"
#include "kat/precond/kfac_options.hpp"
#include "kat/precond/kfac_strategy.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::detail {

/// The step engine of kat::precond::KFAC, which derives from it privately: the registered
/// layers (Entry), the options, the strategy pointer, the step counter, the shared scratch and
/// status buffers, and the step itself (run_step(): stage_factors(), resolve_factors(),
/// decompose(), precondition(), finish_step(); KFAC::step() documents the order and the
/// strategy's part). KFAC keeps registration, the public queries and the state protocol.
///
/// @tparam Owner  the KFAC deriving from this (names the strategy type KFACStrategy<Owner>; it
///                is incomplete here, and only member function bodies use the strategy).
/// Other parameters as KFAC's.
template <class Owner, class Scalar, class MemorySpace, class InverseScalar, class FactorScalar>
class KFACSchedule {
protected:
  using execution_space = typename MemorySpace::execution_space;
  using record_type = CurvatureRecord<Scalar, MemorySpace>;
  using layer_type = precond::KFACLayer<Scalar, MemorySpace, InverseScalar, FactorScalar>;
  using factor_type = typename layer_type::factor_type;
  using matrix_type = Matrix<Scalar, MemorySpace>;
  using vector_type = Vector<Scalar, MemorySpace>;
  using factor_matrix_type = Matrix<FactorScalar, MemorySpace>;
  using strategy_type = precond::KFACStrategy<Owner>;
  using KFACOptions = precond::KFACOptions;
  using KFACValues = precond::KFACValues;

  /// Checks the options (kfac_check_options()) and warns, once, when both update intervals are
  /// constant and inv_update_steps is not a multiple of factor_update_steps.
  explicit KFACSchedule(KFACOptions options) : opt_(std::move(options)) {
    kfac_check_options(opt_);
    if (opt_.factor_update_steps.is_constant() && opt_.inv_update_steps.is_constant()) {
      warn_if_not_multiple(opt_.factor_update_steps.value(), opt_.inv_update_steps.value());
    }
  }

  /// The strategy set (strategy_), or the local one (KFAC::strategy()).
  const strategy_type &active_strategy() const {
    static const precond::KFACLocalStrategy<Owner> local{};
    if (strategy_ != nullptr) {
      return *strategy_;
    }
    return local;
  }

  /// Whether the next step updates factors (KFAC::needs_curvature()).
  bool curvature_due() const {
    const std::int64_t every = opt_.factor_update_steps(steps_);
    kfac_check_steps("factor_update_steps", every, steps_);
    return steps_ % every == 0;
  }

  /// A registered layer: its KFACLayer and what the schedule needs to know about it.
  struct Entry {
    Entry(const std::string &name, std::string t, std::function<record_type()> v,
          std::function<void(bool)> r, std::size_t out, std::size_t cols)
        : layer(name, out, cols), type(std::move(t)), views(std::move(v)), record(std::move(r)) {}
    layer_type layer;
    std::string type;
    std::function<record_type()> views;
    std::function<void(bool)> record;
    record_type current;  // views() of this step
    bool owned = true;    // builds its factors here (KFACStrategy::builds_factors)
    bool asked = false;   // what the record callback was last told
    bool applied = false; // preconditioned in this step
    // Whether some process that computes A's (G's) decomposition holds one, as the last
    // agreement on failures told every process; false until the first agreement after
    // construction or a load (sharing strategies: a layer without both is left to the base
    // optimizer on every process).
    std::array<bool, 2> held_somewhere{false, false};
    // Both of the layer's decompositions are held somewhere (held_somewhere).
    bool held() const { return held_somewhere[0] && held_somewhere[1]; }
  };
  using status_type = KFACStatus<InverseScalar, Scalar, MemorySpace>;

  /// Seed of the Freivalds vectors (stream: the registration index).
  static constexpr std::uint64_t probe_seed = 0x4b4641435f464143ull;

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

  /// Whether layer `l` should record a and g before the next step, given `next` =
  /// curvature_due() (KFAC::wants_curvature()).
  bool wants_record(const Entry &l, bool next) const {
    return l.owned && (next || (opt_.factored_preconditioning && l.layer.factored_every_step()));
  }
  /// Tells layer `l`'s record callback wants_record(l, next) and remembers it (Entry::asked).
  void tell_record(Entry &l, bool next) {
    l.asked = wants_record(l, next);
    if (l.record) {
      l.record(l.asked);
    }
  }
  /// tell_record() for every layer, for the next step.
  void tell_records() {
    const bool next = curvature_due();
    for (auto &l : layers_) {
      tell_record(*l, next);
    }
  }

  /// Warns once (to Options::log) that inv_update_steps is not a multiple of
  /// factor_update_steps.
  void warn_if_not_multiple(std::int64_t factor_every, std::int64_t inv_every) {
    if (!warned_multiple_ && inv_every % factor_every != 0) {
      warned_multiple_ = true;
      *opt_.log << "kat::precond::KFAC: warning: inv_update_steps (" << inv_every
                << ") is not a multiple of factor_update_steps (" << factor_every
                << "); some decompositions will reuse unchanged factors\n";
    }
  }

  /// Writes "kat::precond::KFAC: warning: <message>" to Options::log.
  void warn(const std::string &message) const {
    *opt_.log << "kat::precond::KFAC: warning: " << message << '\n';
  }

  /// step(space), or with `grads` step(space, grads) (each layer's gradient in grads).
  void run_step(const execution_space &space, const vector_type *grads) {
    ScopedRegion region("kat::precond::KFAC::step");
    const KFACValues v = kfac_values(opt_, steps_);
    warn_if_not_multiple(v.factor_update_steps, v.inv_update_steps);
    for (auto &l : layers_) {
      l->current = l->views(); // once per step: the callback may do work
      if (grads != nullptr) {
        l->current.weight_gradient = l->layer.gradient_in(*grads);
      }
    }
    const bool factor_step = steps_ % v.factor_update_steps == 0;
    // Besides every inv_update_steps, a layer whose first factors came late (a skipped
    // non-finite update) is decomposed as soon as it has them, not up to inv_update_steps later.
    const bool only_missing = steps_ % v.inv_update_steps != 0;
    try {
      status_.clear(space, layers_.size());
      if (factor_step) {
        stage_factors(space, v.factor_decay);
        if (decomposes(only_missing)) {
          status_.read(space); // the decompositions need the new factors, known to be finite
          resolve_factors(true);
        }
      }
      decompose(space, v.damping, only_missing);
      precondition(space, v);
      status_.read(space);
      finish_step();
    } catch (...) {
      for (auto &l : layers_) {
        l->layer.discard_staged();
        l->current = record_type();
      }
      throw;
    }
    ++steps_;
    for (auto &l : layers_) {
      l->current = record_type(); // do not keep the layer's workspaces alive
    }
    tell_records();
  }

  /// Stages every owned layer's factor updates (KFACLayer::stage_factors, through the
  /// strategy's reduce_factor() when it reduces factors) with the counts of non-finite entries
  /// going to the status buffer; nothing is committed yet.
  void stage_factors(const execution_space &space, double decay) {
    ScopedRegion region("kat::precond::KFAC::update_factors");
    const bool hook = strategy_ != nullptr && strategy_->reduces_factors();
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      Entry &l = *layers_[index];
      if (!l.owned) {
        continue;
      }
      const auto bad_a = status_.at(status_type::factor_slot(index, 'A'));
      const auto bad_g = status_.at(status_type::factor_slot(index, 'G'));
      if (hook) {
        l.layer.stage_factors(space, l.current, opt_.loss_reduction, decay, steps_, bad_a, bad_g,
                              BatchHook{strategy_, index, 'A'}, BatchHook{strategy_, index, 'G'});
      } else {
        l.layer.stage_factors(space, l.current, opt_.loss_reduction, decay, steps_, bad_a, bad_g);
      }
    }
  }

  /// Whether every layer's decompositions of A and G are held where the strategy computes
  /// them, as the last agreement on failures said (the same answer on every process; false
  /// before the first agreement).
  bool held_everywhere() const {
    return std::all_of(layers_.begin(), layers_.end(), [](const auto &e) { return e->held(); });
  }

  /// Forgets what the last agreement said about held decompositions (a load replaced them):
  /// the next decompose() agrees again.
  void forget_held() {
    for (auto &e : layers_) {
      e->held_somewhere = {false, false};
    }
  }

  /// Whether decompose(space, damping, only_missing) would decompose some layer once the
  /// staged factor updates are committed.
  bool decomposes(bool only_missing) const {
    for (const auto &e : layers_) {
      const factor_type &a = e->layer.factor_a(), &g = e->layer.factor_g();
      if (e->owned && (a.updates() > 0 || a.has_staged_update()) &&
          (g.updates() > 0 || g.has_staged_update()) && !(only_missing && e->layer.ready())) {
        return true;
      }
    }
    return false;
  }

  /// Commits the staged factor updates whose status (read back) is finite. A non-finite one
  /// throws NumericalError (`may_throw`, without keep_previous_on_failure: every staged update
  /// is discarded first) or is discarded with a warning.
  void resolve_factors(bool may_throw) {
    for (std::size_t i = 0; may_throw && !opt_.keep_previous_on_failure && i < layers_.size();
         ++i) {
      const layer_type &l = layers_[i]->layer;
      if (const char which = l.staged_failure(bad(i, 'A'), bad(i, 'G'))) {
        const std::string error = l.factor_failure(which, steps_);
        for (auto &e : layers_) {
          e->layer.discard_staged();
        }
        throw NumericalError("kat::precond::KFAC: " + error);
      }
    }
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      for (const auto &failure :
           layers_[i]->layer.resolve_staged(bad(i, 'A'), bad(i, 'G'), steps_)) {
        warn(failure + "; keeping the previous factor");
      }
    }
  }
  /// The count of non-finite entries of layer i's staged factor `which`, as read back.
  double bad(std::size_t i, char which) const {
    return status_(status_type::factor_slot(i, which));
  }

  /// Decomposes every layer's factors, or with `only_missing` those of layers that have
  /// factors but no decomposition yet: first the decompositions this process computes
  /// (KFACLayer::decompose, failures collected), then the strategy's agreement on failures,
  /// then its share_decomposition() for each decomposed factor.
  /// @throws NumericalError (the same on every process with an agreement) if a decomposition
  ///   failed, unless keep_previous_on_failure.
  void decompose(const execution_space &space, double damping, bool only_missing = false) {
    ScopedRegion region("kat::precond::KFAC::decompose");
    std::vector<std::size_t> due;
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      const layer_type &l = layers_[index]->layer;
      if (layers_[index]->owned && l.factor_a().updates() > 0 && l.factor_g().updates() > 0 &&
          !(only_missing && l.ready())) {
        due.push_back(index); // (a layer without factors: a factor update failed and was skipped)
      }
    }
    // With an agreement every process takes part on every full decomposition step, whether or
    // not it decomposes anything itself (DP-KFAC: a rank that owns no layer), and on the other
    // steps until the last agreement said that every decomposition is held somewhere (after a
    // failed first decomposition, and once after a load), so that a layer decomposed late is
    // used on every process at once.
    const bool agreeing = active_strategy().agrees_on_failures();
    const bool agrees = agreeing && (!only_missing || !held_everywhere());
    if (due.empty() && !agrees) {
      return;
    }
    precond::KFACDecompositionFailures failures;
    failures.failed.assign(2 * layers_.size(), 0);
    std::vector<std::string> local(2 * layers_.size()); // this process's messages
    const bool stop = !agreeing && !opt_.keep_previous_on_failure;
    for (const std::size_t index : due) {
      const std::array<std::string, 2> failed = layers_[index]->layer.decompose(
          space, opt_.compute_method, damping, opt_.pi_correction,
          active_strategy().computes_decomposition(index, 'A'),
          active_strategy().computes_decomposition(index, 'G'), steps_, stop);
      for (std::size_t k = 2 * index; k < 2 * index + 2; ++k) {
        if (!failed[k % 2].empty()) {
          failures.failed[k] = 1;
          local[k] = failed[k % 2];
          if (failures.message.empty()) {
            failures.message = local[k];
          }
          if (stop) {
            throw NumericalError("kat::precond::KFAC: " + failures.message);
          }
        }
      }
    }
    if (agrees) {
      // What this process holds, not what it decomposed now: a failed decomposition keeps the
      // previous one, and after a load the decompositions are restored, not recomputed.
      failures.held.assign(2 * layers_.size(), 0);
      for (std::size_t k = 0; k < failures.held.size(); ++k) {
        const Entry &e = *layers_[k / 2];
        const char which = k % 2 == 0 ? 'A' : 'G';
        failures.held[k] = e.owned && active_strategy().computes_decomposition(k / 2, which) &&
                                   e.layer.has_decomposition(which, opt_.compute_method)
                               ? 1
                               : 0;
      }
      strategy_->agree_on_failures(space, failures);
    }
    if (!failures.message.empty()) {
      if (!opt_.keep_previous_on_failure) {
        throw NumericalError("kat::precond::KFAC: " + failures.message);
      }
      bool first = true;
      for (std::size_t k = 0; k < failures.failed.size(); ++k) {
        if (failures.failed[k] != 0) {
          const std::string what = !local[k].empty() ? local[k]
                                   : first
                                       ? failures.message
                                       : concat("layer '", layers_[k / 2]->layer.name(),
                                                "' factor ", k % 2 == 0 ? 'A' : 'G', " at step ",
                                                steps_, ": the decomposition failed elsewhere");
          warn(what + "; keeping the previous decomposition");
          first = false;
        }
      }
    }
    if (agrees) {
      for (std::size_t k = 0; k < failures.held.size(); ++k) { // the same on every process
        layers_[k / 2]->held_somewhere[k % 2] = failures.held[k] != 0;
      }
    }
    for (const std::size_t index : due) {
      layer_type &l = layers_[index]->layer;
      for (const char which : {'A', 'G'}) {
        if (strategy_ != nullptr && failures.failed[2 * index + (which == 'G' ? 1 : 0)] == 0) {
          strategy_->share_decomposition(space, index, which, l.factor(which));
        }
      }
      l.set_ready(l.has_decomposition(opt_.compute_method));
    }
  }

  /// Computes every applied layer's P (KFACLayer::precondition), then, in fused kernels over
  /// all of them, Σ P ⊙ ∇ into the status buffer, the KL clip's ν from it (NaN when something
  /// failed this step) and ∇ = ν·P, all enqueued on `space` (finish_step() reads the outcome).
  void precondition(const execution_space &space, const KFACValues &v) {
    ScopedRegion region("kat::precond::KFAC::precondition");
    const bool shared = active_strategy().shares_gradients();
    const bool agreed = active_strategy().agrees_on_failures();
    std::vector<typename status_type::segment_type> segments;
    for (std::size_t index = 0; index < layers_.size(); ++index) {
      Entry &e = *layers_[index];
      layer_type &l = e.layer;
      e.applied = false;
      l.clear_form();
      if (!shared && !(e.owned && l.ready())) {
        continue; // left to the base optimizer
      }
      if (shared && agreed && !e.held()) {
        continue; // no process has its decompositions: left to the base optimizer everywhere
      }
      const matrix_type grad = e.current.weight_gradient;
      l.check_gradient(grad);
      if (e.owned && l.ready()) {
        const bool allowed = opt_.factored_preconditioning && !(e.record && !e.asked);
        if (l.choose_form(e.current, allowed, steps_)) {
          l.check_factored(space, e.current, scratch_, status_.device(), status_.check_slot(index),
                           status_.verdict_slot(index), probe_seed, index);
        }
        l.precondition(space, e.current, grad, opt_.compute_method, v.damping, scratch_);
      } else if (e.owned) {
        l.copy_gradient(space, grad); // shared, no decomposition: P = ∇
      }
      e.applied = true;
      segments.push_back(l.segment(grad));
    }
    if (shared) {
      for (std::size_t i = 0; i < layers_.size(); ++i) {
        if (layers_[i]->applied) { // the same layers on every process
          strategy_->share_gradient(space, i, layers_[i]->layer.preconditioned());
        }
      }
    }
    status_.kl_clip(space, std::move(segments), opt_.keep_previous_on_failure, v.kl_clip, v.lr);
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
      layer_type &l = layers_[index]->layer;
      if (l.factored()) {
        l.check_verdict(status_.host(), status_.check_slot(index), status_.verdict_slot(index),
                        steps_);
      }
    }
    const double vg = status_(status_type::vg_slot);
    if (!std::isfinite(vg)) {
      report_non_finite();
    }
    resolve_factors(false);
    vg_sum_ = vg;
    kl_scale_ = status_(status_type::scale_slot);
  }

  /// Names the first applied layer whose Σ P ⊙ ∇ is not finite (blocking reductions: this
  /// runs only when the step already failed).
  [[noreturn]] void report_non_finite() {
    const execution_space space;
    for (const auto &e : layers_) {
      if (e->applied) {
        e->layer.check_finite(space, e->current.weight_gradient, steps_);
      }
    }
    throw NumericalError(
        concat("kat::precond::KFAC::step: the sum of P ⊙ ∇ over the layers is not finite at step ",
               steps_, " (is the gradient finite?)"));
  }

  KFACOptions opt_;
  strategy_type *strategy_ = nullptr; // nullptr: the local strategy
  std::vector<std::unique_ptr<Entry>> layers_;
  typename layer_type::scratch_type scratch_;
  status_type status_;
  std::int64_t steps_ = 0;
  double kl_scale_ = 1.0, vg_sum_ = 0.0;
  bool warned_multiple_ = false;
};

} // namespace kat::detail
