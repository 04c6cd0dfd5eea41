#pragma once
/// @file
/// @brief Sparse training: static masks, SET and RigL mask updates, as a training-step
/// callback and as calls for a hand-written loop.

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/dense.hpp"
#include "kat/nn/layer.hpp"
#include "kat/nn/sequential.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/sparse/density.hpp"
#include "kat/sparse/mask.hpp"
#include "kat/train/callback.hpp"
#include "kat/train/trainer.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kat::sparse {

/// How the mask changes during training.
enum class SparseMethod {
  /// The initial mask is kept (static sparse training).
  static_mask,
  /// SET (Mocanu et al. 2018, "Scalable training of artificial neural networks with adaptive
  /// sparse connectivity", Algorithm 1): drop the smallest |w|, regrow at random.
  set,
  /// RigL (Evci et al. 2020, "Rigging the Lottery", Algorithm 1): drop the smallest |w|,
  /// regrow where the dense gradient |∇L| is largest.
  rigl
};

/// "static", "set" or "rigl".
inline std::string to_string(SparseMethod m) {
  return m == SparseMethod::static_mask ? "static" : (m == SparseMethod::set ? "set" : "rigl");
}

/// Parses "static", "set" or "rigl".
/// @throws ValueError naming `what` and the accepted values otherwise.
inline SparseMethod parse_sparse_method(const std::string &text,
                                        const char *what = "sparse_method") {
  if (text == "static") {
    return SparseMethod::static_mask;
  }
  if (text == "set") {
    return SparseMethod::set;
  }
  if (text == "rigl") {
    return SparseMethod::rigl;
  }
  throw ValueError(
      kat::detail::concat(what, " must be 'static', 'set' or 'rigl', got '", text, "'"));
}

/// Options of SparseTraining, named as in the RigL paper; defaults are its reference values.
struct SparseTrainingOptions {
  /// Static mask, SET (random regrowth) or RigL (gradient regrowth).
  SparseMethod method = SparseMethod::rigl;
  /// Global fraction of active entries of the masked tensors, in (0, 1] (1 - sparsity).
  double density = 0.05;
  /// How the density is spread over the tensors: ERK (default) or uniform.
  SparseInit init = SparseInit::erk;
  /// f0: the fraction of each tensor's active weights dropped at an update, before the
  /// cosine decay f(t) = f0/2 · (1 + cos(π t / T_end)). In [0, 1]. The references use 0.3
  /// for RigL and 0.5 for SET (default_drop_fraction()).
  double drop_fraction = 0.3;
  /// ΔT: steps between mask updates, >= 1.
  std::int64_t delta_t = 100;
  /// T_end as a fraction of the training steps, in [0, 1]: no update at or after it.
  double t_end = 0.75;
  /// Seed of the initial mask and of SET's regrowth (the same on every process).
  std::uint64_t seed = 0;
};

/// The reference drop fraction of a method: 0.5 for SET, 0.3 otherwise.
inline double default_drop_fraction(SparseMethod m) { return m == SparseMethod::set ? 0.5 : 0.3; }

/// What the last mask update did, per masked tensor.
struct MaskUpdate {
  std::int64_t step = -1;           ///< the step it happened at (-1: none yet)
  double drop_fraction = 0;         ///< f(t) used
  std::vector<std::size_t> dropped; ///< ⌊f(t)·n_active⌋ per tensor
  std::vector<std::size_t> grown;   ///< entries active now that were inactive before
};

/// Sparse training of a model's weights (kat/sparse; the methods notes' section 5): a Mask
/// initialized uniform or ERK to a global density, applied to the weights and to the
/// optimizer's state after every optimizer step, and updated every ΔT steps until T_end by
/// SET or RigL.
///
/// One step, in the Trainer or a hand-written loop (step t counted from 0):
///
///     begin_step(t)                      before forward: a RigL update step needs the dense
///                                        gradient of sparse-path layers (attach())
///     forward, backward, gradient sync   (the gradient agrees over the processes)
///     take = after_backward(space, t, params, grads)
///                                        at an update step (t > 0, t % ΔT == 0, t < T_end):
///                                        drop ⌊f(t)·n⌋ active weights of smallest |w| per
///                                        tensor, regrow as many among the inactive ones (RigL:
///                                        largest |∇L| of the dense gradient, ties to the lower
///                                        index; SET: uniformly at random), zero the new
///                                        weights and their optimizer state, return false:
///                                        the reference codes skip the optimizer step there.
///                                        Then (every step) the gradient is masked, as the
///                                        RigL reference's gradient hooks do.
///     if (take) { transforms; optimizer.step }
///     after_step(space, params, optimizer)   masks the weights and the optimizer state
///
/// Every process computes the same mask: the selections read the (synchronized) gradient and
/// the parameters, which agree, and SET draws from a seed shared by all.
///
/// In a Trainer it is a Callback (on_step_begin, on_after_backward, on_step_end); its state
/// (the mask and the update count) goes to checkpoints under "callbacks.sparse.".
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class SparseTraining : public train::Callback<Scalar, MemorySpace> {
public:
  using execution_space = typename MemorySpace::execution_space; ///< where the mask kernels run
  using vector_type = kat::Vector<Scalar, MemorySpace>; ///< a flat n-vector (parameters, gradients)
  using optimizer_type =
      optim::Optimizer<Scalar, MemorySpace>; ///< the optimizer whose state is masked too
  using trainer_type =
      train::Trainer<Scalar, MemorySpace>;                ///< the Trainer this callback is added to
  using model_type = nn::Sequential<Scalar, MemorySpace>; ///< the model whose tensors are masked

  /// Builds the mask over `tensors` of a flat parameter vector of length n and draws its
  /// initial pattern (per-tensor densities from layer_densities()). Parameters are not
  /// touched until begin() (or the Trainer's on_train_begin).
  /// @throws ValueError naming the option if density is outside (0, 1], drop_fraction or
  ///   t_end outside [0, 1], or delta_t < 1; Mask's errors for bad tensors.
  SparseTraining(std::size_t n, std::vector<ParameterSpec> tensors,
                 const SparseTrainingOptions &options)
      : opt_(validated(options)), mask_(n, std::move(tensors)) {
    std::vector<std::vector<std::size_t>> shapes;
    for (const auto &t : mask_.tensors()) {
      shapes.push_back(t.shape);
    }
    densities_ = layer_densities(shapes, opt_.density, opt_.init);
    mask_.initialize(densities_, opt_.seed);
  }

  /// Over a model's default_masked_tensors().
  SparseTraining(const model_type &model, const SparseTrainingOptions &options)
      : SparseTraining(model.parameter_count(), default_masked_tensors(model.parameter_specs()),
                       options) {}

  std::string name() const override { return "sparse"; }
  /// The options given at construction.
  const SparseTrainingOptions &options() const { return opt_; }
  /// The current mask.
  const Mask<Scalar, MemorySpace> &mask() const { return mask_; }
  /// The initial per-tensor densities (layer_densities()).
  const std::vector<double> &initial_densities() const { return densities_; }
  /// The last update (step -1 before the first).
  const MaskUpdate &last_update() const { return last_; }
  /// Mask updates so far.
  std::int64_t updates() const { return updates_; }
  /// With `on`, the epoch's console note also gives the seconds spent in mask updates.
  void set_profile(bool on) { profile_ = on; }
  /// Host seconds spent in mask updates (fenced) since reset_update_seconds().
  double update_seconds() const { return update_seconds_; }
  /// Restarts update_seconds() at 0 (the Trainer does so at every epoch's start).
  void reset_update_seconds() { update_seconds_ = 0; }

  /// The number of training steps T, from which T_end = ⌊t_end·T⌋ (in a Trainer: its epochs
  /// times the loader's batches per epoch, set at every epoch's start). Until set, no update
  /// happens.
  /// @throws ValueError if steps < 0.
  void set_total_steps(std::int64_t steps) {
    if (steps < 0) {
      throw ValueError(kat::detail::concat(
          "kat::sparse::SparseTraining::set_total_steps: steps must be >= 0, got ", steps));
    }
    total_steps_ = steps;
  }
  /// T, set by set_total_steps() (0 until then).
  std::int64_t total_steps() const { return total_steps_; }
  /// T_end in steps: ⌊t_end · total_steps()⌋.
  std::int64_t end_step() const {
    return static_cast<std::int64_t>(std::floor(opt_.t_end * static_cast<double>(total_steps_)));
  }
  /// Whether step t (0-based) updates the mask: not static, t > 0, t % ΔT == 0, t < T_end.
  bool is_update_step(std::int64_t t) const {
    return opt_.method != SparseMethod::static_mask && t > 0 && t % opt_.delta_t == 0 &&
           t < end_step();
  }
  /// f(t) = f0/2 · (1 + cos(π t / T_end)) (RigL's cosine decay), 0 from T_end on.
  double drop_fraction_at(std::int64_t t) const {
    const std::int64_t end = end_step();
    if (t >= end || end <= 0) {
      return 0.0;
    }
    const double pi = 3.14159265358979323846;
    return 0.5 * opt_.drop_fraction *
           (1.0 + std::cos(pi * static_cast<double>(t) / static_cast<double>(end)));
  }

  /// Binds the mask to `model`'s Dense layers (kat::nn::Dense::set_weight_mask), so those
  /// below their crossover density multiply with the active weights only (CSR products) and
  /// every bound layer writes masked weight gradients; rebinds after every mask update. The
  /// Trainer calls it in on_train_begin(). Without it every layer computes densely with the
  /// masked weights, with the same results up to rounding.
  void attach(const execution_space &space, model_type &model) {
    bound_.clear();
    std::vector<nn::Dense<Scalar, MemorySpace> *> dense;
    for (const auto &layer : model.layers()) {
      collect(layer.get(), dense);
    }
    const Scalar *base = model.parameters().data();
    for (auto *d : dense) {
      const auto offset = static_cast<std::size_t>(d->weight().data() - base);
      for (std::size_t t = 0; t < mask_.tensors().size(); ++t) {
        if (mask_.tensors()[t].offset == offset &&
            mask_.tensors()[t].size() == d->in_features() * d->out_features()) {
          bound_.emplace_back(d, t);
        }
      }
    }
    rebind(space);
  }

  /// Dense layers bound by attach() that run the sparse products.
  std::size_t sparse_layers() const {
    std::size_t n = 0;
    for (const auto &b : bound_) {
      n += b.first->uses_sparse_path() ? 1 : 0;
    }
    return n;
  }

  /// Zeroes the inactive weights and their optimizer state (once, before training).
  void begin(const execution_space &space, const vector_type &params,
             const optimizer_type *optimizer) const {
    if (optimizer != nullptr) {
      mask_.apply(space, params, *optimizer);
    } else {
      mask_.apply(space, params);
    }
  }

  /// Before step t's forward: at a RigL update step, asks the layers bound by attach() for
  /// the dense weight gradient that growth ranks (they write masked gradients otherwise).
  void begin_step(std::int64_t t) {
    if (opt_.method == SparseMethod::rigl && is_update_step(t)) {
      for (auto &b : bound_) {
        b.first->request_dense_weight_gradient();
      }
    }
  }

  /// After step t's backward and gradient synchronization: updates the mask at an update
  /// step, then masks `grads`. Returns whether the optimizer (and the gradient transforms)
  /// should take this step: false at an update step.
  /// @throws ShapeError if params or grads have another length than the mask.
  bool after_backward(const execution_space &space, std::int64_t t, const vector_type &params,
                      const vector_type &grads, const optimizer_type *optimizer) {
    bool take = true;
    if (is_update_step(t)) {
      update(space, t, params, grads, optimizer);
      take = false;
    }
    mask_.apply(space, grads);
    return take;
  }

  /// After the optimizer step: the inactive weights and their optimizer state are 0 again.
  void after_step(const execution_space &space, const vector_type &params,
                  const optimizer_type &optimizer) const {
    mask_.apply(space, params, optimizer);
  }

  /// The mask update of step t (usually called through after_backward()): see the class
  /// description. Changes the parameters, the optimizer state (zeroing grown entries) and
  /// the mask; fences.
  void update(const execution_space &space, std::int64_t t, const vector_type &params,
              const vector_type &grads, const optimizer_type *optimizer) {
    const char *where = "kat::sparse::SparseTraining::update";
    kat::detail::require_extent(where, "params length", mask_.size(),
                                static_cast<std::size_t>(params.extent(0)));
    kat::detail::require_extent(where, "grads length", mask_.size(),
                                static_cast<std::size_t>(grads.extent(0)));
    ScopedRegion region("kat::sparse::SparseTraining::update");
    const auto t0 = std::chrono::steady_clock::now();
    space.fence();
    const auto p_host = Kokkos::create_mirror_view(params);
    Kokkos::deep_copy(p_host, params);
    decltype(Kokkos::create_mirror_view(grads)) g_host;
    if (opt_.method == SparseMethod::rigl) {
      g_host = Kokkos::create_mirror_view(grads);
      Kokkos::deep_copy(g_host, grads);
    }
    const double f = drop_fraction_at(t);
    std::vector<std::uint8_t> host = mask_.host();
    MaskUpdate report;
    report.step = t;
    report.drop_fraction = f;
    std::vector<std::size_t> grown_index;
    for (std::size_t k = 0; k < mask_.tensors().size(); ++k) {
      const auto &tensor = mask_.tensors()[k];
      std::uint8_t *m = host.data() + tensor.offset;
      const std::size_t size = tensor.size();
      std::vector<std::size_t> active, inactive;
      for (std::size_t i = 0; i < size; ++i) {
        (m[i] ? active : inactive).push_back(i);
      }
      const auto drop =
          static_cast<std::size_t>(std::floor(f * static_cast<double>(active.size())));
      // The `drop` active entries of smallest |w|, ties to the lower index.
      const Scalar *w = p_host.data() + tensor.offset;
      auto by_magnitude = [&](std::size_t a, std::size_t b) {
        const Scalar wa = std::abs(w[a]), wb = std::abs(w[b]);
        return wa < wb || (wa == wb && a < b);
      };
      if (drop > 0 && drop < active.size()) {
        std::nth_element(active.begin(), active.begin() + static_cast<std::ptrdiff_t>(drop),
                         active.end(), by_magnitude);
      }
      std::vector<std::uint8_t> was_active(m, m + size);
      for (std::size_t i = 0; i < drop; ++i) {
        m[active[i]] = 0;
      }
      // Candidates: every entry inactive after the drop (the dropped ones included, as in the
      // RigL reference); a dropped entry regrown keeps its weight.
      std::vector<std::size_t> candidates = inactive;
      candidates.insert(candidates.end(), active.begin(),
                        active.begin() + static_cast<std::ptrdiff_t>(drop));
      std::sort(candidates.begin(), candidates.end());
      if (opt_.method == SparseMethod::rigl) {
        const Scalar *g = g_host.data() + tensor.offset;
        auto by_gradient = [&](std::size_t a, std::size_t b) {
          const Scalar ga = std::abs(g[a]), gb = std::abs(g[b]);
          return ga > gb || (ga == gb && a < b);
        };
        if (drop > 0 && drop < candidates.size()) {
          std::nth_element(candidates.begin(),
                           candidates.begin() + static_cast<std::ptrdiff_t>(drop), candidates.end(),
                           by_gradient);
        }
      } else {
        kat::HostRng rng(
            kat::counter_bits(opt_.seed, 0x534554ULL + k, static_cast<std::uint64_t>(updates_)));
        for (std::size_t i = 0; i < drop; ++i) {
          const std::size_t j =
              i + static_cast<std::size_t>(rng.uniform_index(candidates.size() - i));
          std::swap(candidates[i], candidates[j]);
        }
      }
      std::size_t grown = 0;
      for (std::size_t i = 0; i < drop; ++i) {
        const std::size_t e = candidates[i];
        m[e] = 1;
        if (!was_active[e]) {
          grown_index.push_back(tensor.offset + e);
          ++grown;
        }
      }
      report.dropped.push_back(drop);
      report.grown.push_back(grown);
    }
    mask_.set(std::move(host));
    // New connections start at 0 with zero optimizer state; dropped ones are masked below.
    Kokkos::View<std::size_t *, MemorySpace> grown_dev("kat::sparse::SparseTraining::grown",
                                                       grown_index.size());
    {
      const auto mirror = Kokkos::create_mirror_view(grown_dev);
      std::copy(grown_index.begin(), grown_index.end(), mirror.data());
      Kokkos::deep_copy(grown_dev, mirror);
    }
    detail::zero_at(space, params, grown_dev);
    if (optimizer != nullptr) {
      for (const auto &b : optimizer->state_buffers()) {
        detail::zero_at(space, b, grown_dev);
      }
      mask_.apply(space, params, *optimizer);
    } else {
      mask_.apply(space, params);
    }
    rebind(space);
    space.fence();
    ++updates_;
    last_ = std::move(report);
    update_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  /// One line: method, density, init and schedule.
  std::string summary() const {
    std::ostringstream os;
    os << "sparse: " << to_string(opt_.method) << ", density " << std::setprecision(4)
       << mask_.density() << " (" << to_string(opt_.init) << ", " << mask_.tensors().size()
       << " masked tensors, " << mask_.active_total() << " of " << mask_.masked_total()
       << " weights active)";
    if (opt_.method != SparseMethod::static_mask) {
      os << ", drop_fraction " << opt_.drop_fraction << " cosine, delta_t " << opt_.delta_t
         << ", t_end " << opt_.t_end;
    }
    if (!bound_.empty()) {
      os << ", sparse products in " << sparse_layers() << " of " << bound_.size()
         << " Dense layers";
    }
    return os.str();
  }

  // Callback: the Trainer's step.
  /// attach() to the Trainer's model, then begin(): the inactive weights and their optimizer
  /// state are zeroed.
  void on_train_begin(trainer_type &trainer) override {
    attach(trainer.space(), trainer.model());
    begin(trainer.space(), trainer.model().parameters(), &trainer.optimizer());
  }
  /// Sets total_steps() to the epochs times the loader's batches per epoch, and restarts
  /// update_seconds().
  void on_epoch_begin(trainer_type &trainer) override {
    // The loader knows this process's share of an epoch only once the epoch has started.
    set_total_steps(trainer.epochs() * static_cast<std::int64_t>(trainer.train_loader().batches()));
    reset_update_seconds();
  }
  /// begin_step() of the Trainer's step.
  void on_step_begin(trainer_type &trainer) override { begin_step(trainer.position().step); }
  /// after_backward(): a mask update at an update step, which then skips the optimizer step;
  /// the gradients masked.
  void on_after_backward(trainer_type &trainer) override {
    if (!after_backward(trainer.space(), trainer.position().step, trainer.model().parameters(),
                        trainer.model().gradients(), &trainer.optimizer())) {
      trainer.skip_optimizer_step();
    }
  }
  /// after_step(): the inactive weights and their optimizer state are 0 again.
  void on_step_end(trainer_type &trainer) override {
    after_step(trainer.space(), trainer.model().parameters(), trainer.optimizer());
  }
  /// Adds the density (and with set_profile() the update seconds) to the epoch's note, and
  /// "density" and "mask_update_s" to its metrics.
  void on_epoch_end(trainer_type &trainer, train::EpochSummary &summary) override {
    (void)trainer;
    std::ostringstream os;
    os << std::fixed << std::setprecision(4) << "density " << mask_.density();
    if (profile_) {
      os << std::setprecision(3) << ", mask updates " << update_seconds_ << " s";
    }
    summary.note += "  " + os.str();
    summary.metrics.push_back({"density", mask_.density(), 6});
    summary.metrics.push_back({"mask_update_s", update_seconds_, 4});
  }

  /// "active" (the mask, uint8 [n]) and "updates" (int64).
  StateDict state_dict() const override {
    StateDict s = mask_.state_dict();
    s.set("updates", updates_);
    return s;
  }
  /// @throws StateError / ValueError as Mask::load_state_dict, or if "updates" < 0.
  void load_state_dict(const StateDict &state) override {
    const char *where = "kat::sparse::SparseTraining::load_state_dict";
    state.require_names(where, {"active", "updates"});
    const auto updates = state.get<std::int64_t>("updates");
    if (updates < 0) {
      throw ValueError(kat::detail::concat(where, ": updates must be >= 0, got ", updates));
    }
    StateDict m;
    m.set("active",
          state.get_vector<std::uint8_t>("active", {static_cast<std::uint64_t>(mask_.size())}));
    mask_.load_state_dict(m);
    updates_ = updates;
    rebind(execution_space());
  }

private:
  static const SparseTrainingOptions &validated(const SparseTrainingOptions &o) {
    const char *who = "kat::sparse::SparseTraining";
    auto fail = [&](const char *option, const char *expected, double value) {
      throw ValueError(
          kat::detail::concat(who, ": ", option, " must be ", expected, ", got ", value));
    };
    if (!(std::isfinite(o.density) && o.density > 0.0 && o.density <= 1.0)) {
      fail("density", "in (0, 1]", o.density);
    }
    if (!(o.drop_fraction >= 0.0 && o.drop_fraction <= 1.0)) {
      fail("drop_fraction", "in [0, 1]", o.drop_fraction);
    }
    if (!(o.t_end >= 0.0 && o.t_end <= 1.0)) {
      fail("t_end", "in [0, 1]", o.t_end);
    }
    if (o.delta_t < 1) {
      fail("delta_t", ">= 1", static_cast<double>(o.delta_t));
    }
    return o;
  }

  static void collect(nn::Layer<Scalar, MemorySpace> *layer,
                      std::vector<nn::Dense<Scalar, MemorySpace> *> &out) {
    if (auto *d = dynamic_cast<nn::Dense<Scalar, MemorySpace> *>(layer)) {
      out.push_back(d);
    }
    for (auto *sub : layer->sublayers()) {
      collect(sub, out);
    }
  }

  void rebind(const execution_space &space) {
    for (auto &b : bound_) {
      b.first->set_weight_mask(space, mask_.active(b.second));
    }
  }

  SparseTrainingOptions opt_;
  Mask<Scalar, MemorySpace> mask_;
  std::vector<double> densities_;
  std::int64_t total_steps_ = 0;
  std::int64_t updates_ = 0;
  double update_seconds_ = 0;
  bool profile_ = false;
  std::vector<std::pair<nn::Dense<Scalar, MemorySpace> *, std::size_t>> bound_;
  MaskUpdate last_;
};

} // namespace kat::sparse
