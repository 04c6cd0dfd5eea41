#pragma once
/// @file
/// @brief kat::sparse::AGENT: adaptive gradient correction (Lei et al., "Balance is Essence:
/// Accelerating Sparse Training via Adaptive Gradient Correction", arXiv 2301.03573) as a
/// kat::train::GradientTransform. docs/sparse.md shows it in a hand-written loop.

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/train/gradient_transform.hpp"
#include "kat/train/process_group.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace kat::sparse {

/// AGENT's hyperparameters, with the defaults of the reference code (`StevenBoys/AGENT`,
/// A-ITOP/main.py).
struct AGENTOptions {
  /// Scale of the correction, >= 0 and finite; 0 turns AGENT off (plain gradients).
  double gamma = 0.1;
  /// Weight of a refresh's new estimate in the running balance coefficient, in [0, 1]
  /// (0: tau stays tau0; 1: tau is the latest estimate).
  double rho = 0.3;
  /// The balance coefficient tau before the first estimate (used in epoch 1), finite.
  double tau0 = 0.1;
};

/// What the latest AGENT::refresh() found, for logs.
struct AGENTRefresh {
  /// Batches visited, summed over the processes.
  std::uint64_t batches = 0;
  /// Samples in them, summed over the processes.
  std::uint64_t samples = 0;
  /// Whether tau was updated (false on the first refresh, with fewer than 2 batches in all,
  /// or when the losses at the old snapshot did not vary).
  bool tau_updated = false;
  /// The refresh's estimate tau_new = Cov(L(θ), L(θ̃)) / Var(L(θ̃)); NaN when tau was kept.
  double tau_estimate = std::numeric_limits<double>::quiet_NaN();
};

namespace detail {

// The kernels below are named functors, not extended device lambdas: nvcc's wrapper of an
// extended lambda in a header is merged across translation units while its function pointers
// are not (issue 31, docs/backends.md).

/// Entry i of agent_accumulate(): acc(i) += weight * g(i) in double.
template <class Index, class Accumulator, class Gradient> struct AGENTAccumulate {
  Accumulator acc;
  double weight;
  Gradient g;

  KOKKOS_INLINE_FUNCTION void operator()(const Index i) const {
    acc(i) += weight * static_cast<double>(g(i));
  }
};

/// Entry i of agent_correct(): grads(i) += c * (mu(i) - g_snapshot(i)).
template <class Index, class View, class Scalar> struct AGENTCorrect {
  View grads;
  Scalar c;
  View mu, g_snapshot;

  KOKKOS_INLINE_FUNCTION void operator()(const Index i) const {
    grads(i) += c * (mu(i) - g_snapshot(i));
  }
};

/// acc(i) += weight * g(i) for every i, in double (the refresh's sample-weighted sum).
template <class ExecutionSpace, class Accumulator, class Gradient>
void agent_accumulate(const ExecutionSpace &space, const Accumulator &acc, const Gradient &g,
                      double weight) {
  using Policy = Kokkos::RangePolicy<ExecutionSpace>;
  using Index = typename Policy::member_type;
  Kokkos::parallel_for("kat::sparse::AGENT::accumulate",
                       Policy(space, Index(0), static_cast<Index>(acc.extent(0))),
                       AGENTAccumulate<Index, Accumulator, Gradient>{acc, weight, g});
}

/// grads(i) += c * (mu(i) - g_snapshot(i)) for every i: the corrected gradient with c = γτ.
template <class ExecutionSpace, class View, class Scalar>
void agent_correct(const ExecutionSpace &space, const View &grads, const View &mu,
                   const View &g_snapshot, Scalar c) {
  using Policy = Kokkos::RangePolicy<ExecutionSpace>;
  using Index = typename Policy::member_type;
  Kokkos::parallel_for("kat::sparse::AGENT::correct",
                       Policy(space, Index(0), static_cast<Index>(grads.extent(0))),
                       AGENTCorrect<Index, View, Scalar>{grads, c, mu, g_snapshot});
}

} // namespace detail

/// Adaptive gradient correction (AGENT; Lei et al., "Balance is Essence: Accelerating Sparse
/// Training via Adaptive Gradient Correction", arXiv 2301.03573; docs/sparse.md): an SVRG-style
/// control variate with a learned balance coefficient. Each step's gradient becomes
///
///     ĝ = ∇L_b(θ) + γ·τ·(μ̃ − ∇L_b(θ̃))
///
/// where L_b is the loss of the current batch, θ̃ a snapshot of the flat parameters taken once
/// per epoch by refresh(), μ̃ the full gradient at θ̃ (the mean over all training samples:
/// per-batch gradients weighted by the batches' sample counts), and τ the balance coefficient.
/// From the second refresh on, refresh() estimates
///
///     τ_new = Cov(L(θ), L(θ̃_old)) / Var(L(θ̃_old))
///
/// from the per-batch mean losses at the current parameters θ and at the previous snapshot
/// θ̃_old (sample statistics with ddof = 1 over the batches of all processes; the ddof cancels)
/// and updates τ ← (1 − ρ)·τ + ρ·τ_new. The correction is dense: a sparse mask applied after
/// the optimizer step zeroes the masked weights as usual.
///
/// AGENT never sees the model: losses and gradients come from Evaluator callables, so it works
/// with any network, from a hand-written loop (docs/sparse.md) or a trainer. Per epoch:
///
///     agent.refresh(space, params, for_each_batch, group);   // 1 gradient + 1 loss per batch
///     for each batch:
///       ... forward, backward, gradient sync: grads = ∇L_b(θ) ...
///       agent.set_batch_evaluator(evaluate_this_batch);
///       agent.transform(space, params, grads);               // 1 gradient at θ̃
///       optimizer.step(space, params, grads);
///
/// Evaluators run work of their own. It must be enqueued on the execution space instance
/// handed to refresh()/transform(), or be complete when the evaluator returns. An evaluator
/// must not write its `params` argument, and must leave the model's own parameters and
/// gradient vector (the `params` and `grads` of transform()) as it found them: evaluate with a
/// second copy of the network, or save and restore.
///
/// Differences from the reference code (`StevenBoys/AGENT`, A-ITOP/main.py): μ̃ is the
/// sample-weighted mean (the reference divides a sum of batch gradients by the batch count),
/// and the first refresh keeps τ = tau0 (the reference already estimates τ_new on its first
/// pass, from a snapshot equal to the initial model: 1 for a deterministic network).
///
/// Memory: snapshot θ̃, full gradient μ̃ and a scratch gradient, n Scalars each; during
/// refresh() also n doubles in MemorySpace and n + 6 doubles on the host.
///
/// @tparam Scalar element type of the flat parameter and gradient vectors.
/// @tparam MemorySpace where they live.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class AGENT : public train::GradientTransform<Scalar, MemorySpace> {
  using base_type = train::GradientTransform<Scalar, MemorySpace>;

public:
  using scalar_type = Scalar;       ///< the gradients' element type
  using memory_space = MemorySpace; ///< where the gradients and AGENT's state live
  using typename base_type::execution_space;
  using typename base_type::vector_type;

  /// Evaluates one batch: returns the batch's mean loss at `params` (length n) and, when
  /// `grads.extent(0) != 0`, overwrites `grads` (length n) with that loss's gradient. With an
  /// empty `grads` only the loss is needed (forward only). What the gradient is averaged over
  /// differs between the two callers: see refresh() and set_batch_evaluator().
  using Evaluator = std::function<double(const vector_type &params, const vector_type &grads)>;
  /// Called once per training batch of this process by a BatchLoop: the batch's evaluator and
  /// its number of samples (> 0).
  using BatchVisitor = std::function<void(const Evaluator &evaluate, std::size_t samples)>;
  /// Calls its argument once per training batch of this process (one pass over the data).
  using BatchLoop = std::function<void(const BatchVisitor &visit)>;

  /// AGENT for a flat parameter vector of length `n`. Allocates the snapshot
  /// ("kat::sparse::AGENT::snapshot"), the full gradient ("kat::sparse::AGENT::full_gradient")
  /// and a scratch gradient ("kat::sparse::AGENT::scratch"), n Scalars each; τ = tau0.
  /// @throws ValueError naming the option, its valid range and its value if gamma is negative
  ///   or not finite, rho is outside [0, 1] or not finite, or tau0 is not finite.
  explicit AGENT(std::size_t n, const AGENTOptions &options = AGENTOptions())
      : options_(validated(options)), tau_(options.tau0),
        snapshot_("kat::sparse::AGENT::snapshot", n),
        full_gradient_("kat::sparse::AGENT::full_gradient", n),
        scratch_("kat::sparse::AGENT::scratch", n), size_(n) {}

  /// "agent", also the prefix of its checkpoint entries.
  std::string name() const override { return "agent"; }

  /// The pass at the start of an epoch (SVRG's outer loop): visits every
  /// training batch once through `for_each_batch` and
  ///
  /// 1. accumulates μ̃ = Σ_b samples_b·∇L_b(θ) / Σ_b samples_b over the batches of all
  ///    processes, with θ = `params`;
  /// 2. from the second refresh on, also evaluates each batch's loss at the previous snapshot
  ///    θ̃_old (the evaluator gets an empty `grads`), estimates τ_new from the pairs
  ///    (L_b(θ̃_old), L_b(θ)) of all batches of all processes and sets
  ///    τ ← (1 − ρ)·τ + ρ·τ_new. With fewer than 2 batches in all, or when the losses at θ̃_old
  ///    are all equal (Var = 0), τ is kept;
  /// 3. sets θ̃ ← θ (a copy) and μ̃ to the result of 1.
  ///
  /// One gradient evaluation per batch, plus (from the second refresh) one loss evaluation.
  /// Here an evaluator returns this process's own batch gradient (NOT averaged over the
  /// processes) and loss: AGENT weights and sums them over `group` itself. The statistics of
  /// τ_new are centred (two passes: the means from the first all-reduce, then the sums of
  /// products of deviations from a second one of 2 doubles), which avoids the cancellation of
  /// Σxy − Σx·Σy/m. μ̃ is summed in double, and reduced over the processes in one all-reduce of
  /// n + 6 doubles on the host (once per epoch, next to a full pass over the data).
  ///
  /// Collective over `group`: every process calls it at the same point of its loop. If
  /// anything throws, AGENT is unchanged; the errors AGENT raises itself (but the ShapeError,
  /// checked first) are raised after the all-reduce, on every process alike. An exception from
  /// `for_each_batch` or an evaluator leaves the other processes waiting in the all-reduce.
  ///
  /// @param space     where the accumulation and the snapshot copy are enqueued
  /// @param params    θ, the flat parameter vector (length n)
  /// @param for_each_batch calls its visitor once per training batch of this process
  /// @param group     the processes that share the training set (default: this one alone)
  /// @throws ShapeError if params.extent(0) != n.
  /// @throws ValueError if no process visited a batch, or a batch had 0 samples or an empty
  ///   evaluator (on every process, after the all-reduce).
  /// @throws NumericalError if μ̃, a loss sum or τ_new is not finite.
  void refresh(const execution_space &space, const vector_type &params,
               const BatchLoop &for_each_batch,
               const train::ProcessGroup &group = train::ProcessGroup()) {
    kat::ScopedRegion region("kat::sparse::AGENT::refresh");
    const char *where = "kat::sparse::AGENT::refresh";
    kat::detail::require_extent(where, "params.extent(0)", size_,
                                static_cast<std::size_t>(params.extent(0)));
    const bool estimate = refreshes_ > 0;
    const std::size_t n = size_;
    const Kokkos::View<double *, Kokkos::LayoutLeft, MemorySpace> acc(
        "kat::sparse::AGENT::refresh_accumulator", n);
    const vector_type g = scratch_;
    const vector_type previous = snapshot_;
    std::vector<double> at_theta, at_previous; // this process's per-batch losses
    double samples = 0, empty_batches = 0, no_evaluator = 0;
    const BatchVisitor visit = [&](const Evaluator &evaluate, std::size_t batch_samples) {
      // Counted, not thrown: the other processes must still reach the all-reduce.
      if (!evaluate) {
        ++no_evaluator;
        return;
      }
      if (batch_samples == 0) {
        ++empty_batches;
        return;
      }
      at_theta.push_back(evaluate(params, g));
      detail::agent_accumulate(space, acc, g, static_cast<double>(batch_samples));
      if (estimate) {
        at_previous.push_back(evaluate(previous, vector_type()));
      }
      samples += static_cast<double>(batch_samples);
    };
    for_each_batch(visit);

    // One all-reduce: [Σ samples·∇L_b (n), samples, batches, Σ L(θ̃_old), Σ L(θ), bad batches].
    std::vector<double> sums(n + 6);
    Kokkos::deep_copy(HostVector(sums.data(), n), acc);
    sums[n] = samples;
    sums[n + 1] = static_cast<double>(at_theta.size());
    sums[n + 2] = sum(at_previous);
    sums[n + 3] = sum(at_theta);
    sums[n + 4] = empty_batches;
    sums[n + 5] = no_evaluator;
    all_reduce(group, sums);
    const double total_samples = sums[n];
    const double batches = sums[n + 1];
    if (sums[n + 4] != 0 || sums[n + 5] != 0) {
      throw ValueError(kat::detail::concat(
          where, ": for_each_batch must visit batches with samples > 0 and an evaluator, got ",
          sums[n + 4], " batches with 0 samples and ", sums[n + 5],
          " without an evaluator (over all processes)"));
    }
    if (batches == 0) {
      throw ValueError(kat::detail::concat(
          where, ": for_each_batch must visit at least one batch, got 0 (over all processes)"));
    }

    // μ̃ = the weighted sum over the samples, on the host where the all-reduce left it.
    auto mu = Kokkos::create_mirror_view(Kokkos::HostSpace(), full_gradient_);
    for (std::size_t i = 0; i < n; ++i) {
      const double v = sums[i] / total_samples;
      if (!std::isfinite(v)) {
        throw NumericalError(kat::detail::concat(where, ": the full gradient must be finite, got ",
                                                 v, " at element ", i,
                                                 " (an evaluator returned a non-finite gradient)"));
      }
      mu(i) = static_cast<Scalar>(v);
    }

    AGENTRefresh report;
    report.batches = static_cast<std::uint64_t>(batches);
    report.samples = static_cast<std::uint64_t>(total_samples);
    double tau = tau_;
    if (estimate && batches >= 2) {
      const double mean_previous = sums[n + 2] / batches;
      const double mean_theta = sums[n + 3] / batches;
      if (!std::isfinite(mean_previous) || !std::isfinite(mean_theta)) {
        throw NumericalError(kat::detail::concat(
            where, ": the batch losses must be finite, got means ", mean_theta,
            " at the parameters and ", mean_previous, " at the previous snapshot"));
      }
      // Σ (x − x̄)², Σ (x − x̄)(y − ȳ) with x = L(θ̃_old), y = L(θ); the 1/(m − 1) cancels.
      std::vector<double> centred{0.0, 0.0};
      for (std::size_t b = 0; b < at_theta.size(); ++b) {
        const double dx = at_previous[b] - mean_previous;
        centred[0] += dx * dx;
        centred[1] += dx * (at_theta[b] - mean_theta);
      }
      all_reduce(group, centred);
      if (centred[0] > 0) {
        const double tau_new = centred[1] / centred[0];
        if (!std::isfinite(tau_new)) {
          throw NumericalError(
              kat::detail::concat(where, ": tau_new = Cov / Var must be finite, got ", centred[1],
                                  " / ", centred[0], " (times 1 / (m - 1), m = ", batches, ")"));
        }
        tau = (1.0 - options_.rho) * tau_ + options_.rho * tau_new;
        report.tau_updated = true;
        report.tau_estimate = tau_new;
      }
    }

    // Nothing throws from here on.
    Kokkos::deep_copy(full_gradient_, mu);
    Kokkos::deep_copy(space, snapshot_, params);
    tau_ = tau;
    ++refreshes_;
    last_refresh_ = report;
  }

  /// Sets the evaluator of the current batch for the following transform() calls (it stays
  /// until replaced). Its gradient must be reduced over the processes exactly as the step's
  /// gradient is (averaged, with data parallelism), since it is subtracted from it.
  void set_batch_evaluator(Evaluator evaluate) { evaluate_ = std::move(evaluate); }

  /// ĝ = ∇L_b(θ) + γ·τ·(μ̃ − ∇L_b(θ̃)), in place: calls the batch evaluator at θ̃ into the
  /// scratch gradient, then one kernel on `space`. When γ·τ is 0 (in Scalar) it returns at once
  /// without calling the evaluator, so `grads` is the plain gradient bit for bit.
  /// @param space  where the correction is enqueued
  /// @param params θ, the flat parameter vector (length n); not read
  /// @param grads  ∇L_b(θ) (length n), the synchronized gradient of the current batch;
  ///               becomes ĝ
  /// @throws Error if refresh() has not been called (no snapshot yet), or γ·τ != 0 and no
  ///   batch evaluator was set.
  /// @throws ShapeError if params or grads does not have length n.
  void transform(const execution_space &space, const vector_type &params,
                 const vector_type &grads) override {
    kat::ScopedRegion region("kat::sparse::AGENT::transform");
    const char *where = "kat::sparse::AGENT::transform";
    kat::detail::require_extent(where, "params.extent(0)", size_,
                                static_cast<std::size_t>(params.extent(0)));
    kat::detail::require_extent(where, "grads.extent(0)", size_,
                                static_cast<std::size_t>(grads.extent(0)));
    if (refreshes_ == 0) {
      throw Error(kat::detail::concat(
          where, ": call refresh() first: the snapshot θ̃ and the full gradient μ̃ are not set"));
    }
    const auto c = static_cast<Scalar>(options_.gamma * tau_);
    if (c == Scalar(0)) {
      return;
    }
    if (!evaluate_) {
      throw Error(kat::detail::concat(where, ": call set_batch_evaluator() first: gamma * tau is ",
                                      options_.gamma * tau_,
                                      ", so the gradient at the snapshot is needed"));
    }
    evaluate_(snapshot_, scratch_);
    detail::agent_correct(space, grads, full_gradient_, scratch_, c);
  }

  /// The balance coefficient τ in use.
  double tau() const { return tau_; }
  /// The options given at construction.
  const AGENTOptions &options() const { return options_; }
  /// Length n of the flat vectors.
  std::size_t size() const { return size_; }
  /// Number of refresh() calls (restored from a checkpoint).
  std::int64_t refreshes() const { return refreshes_; }
  /// The snapshot θ̃ (length n; zeros before the first refresh).
  const vector_type &snapshot() const { return snapshot_; }
  /// The full gradient μ̃ at θ̃ (length n; zeros before the first refresh).
  const vector_type &full_gradient() const { return full_gradient_; }
  /// What the latest refresh() of this object found (not part of the state).
  const AGENTRefresh &last_refresh() const { return last_refresh_; }

  /// "AGENT gradient correction: gamma <γ>, rho <ρ>, tau <τ>, refreshes <k>".
  std::string summary() const override {
    return kat::detail::concat("AGENT gradient correction: gamma ", options_.gamma, ", rho ",
                               options_.rho, ", tau ", tau_, ", refreshes ", refreshes_);
  }

  /// The bytes refresh() handed to `group`'s all-reduces on several processes (the
  /// evaluators' own communication is not counted), and 3·n·sizeof(Scalar) of state and
  /// scratch.
  train::TransformStats stats() const override {
    train::TransformStats s;
    s.bytes = bytes_;
    s.state_bytes = 3 * size_ * sizeof(Scalar);
    return s;
  }

  /// "tau" (float64), "refreshes" (int64), "snapshot" and "full_gradient" (Scalar, [n]):
  /// enough to continue bit-identically (fences).
  StateDict state_dict() const override {
    StateDict s;
    s.set("tau", tau_);
    s.set("refreshes", refreshes_);
    s.set_view("snapshot", snapshot_);
    s.set_view("full_gradient", full_gradient_);
    return s;
  }

  /// Restores state_dict(), after checking every entry, so a failed load changes nothing.
  /// @throws StateError naming the first entry that is missing, unexpected or of another
  ///   dtype or shape; ValueError if "refreshes" < 0 or "tau" is not finite.
  void load_state_dict(const StateDict &state) override {
    const std::string where = "kat::sparse::AGENT::load_state_dict";
    state.require_names(where, {"tau", "refreshes", "snapshot", "full_gradient"});
    const std::vector<std::uint64_t> shape{static_cast<std::uint64_t>(size_)};
    state.checked<Scalar>("snapshot", shape);
    state.checked<Scalar>("full_gradient", shape);
    const auto tau = state.get<double>("tau");
    const auto refreshes = state.get<std::int64_t>("refreshes");
    if (!std::isfinite(tau)) {
      throw ValueError(kat::detail::concat(where, ": tau must be finite, got ", tau));
    }
    if (refreshes < 0) {
      throw ValueError(kat::detail::concat(where, ": refreshes must be >= 0, got ", refreshes));
    }
    state.copy_to("snapshot", snapshot_);
    state.copy_to("full_gradient", full_gradient_);
    tau_ = tau;
    refreshes_ = refreshes;
    last_refresh_ = AGENTRefresh();
  }

private:
  using HostVector =
      Kokkos::View<double *, Kokkos::LayoutLeft, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

  static const AGENTOptions &validated(const AGENTOptions &o) {
    const char *who = "kat::sparse::AGENT";
    if (!(std::isfinite(o.gamma) && o.gamma >= 0.0)) {
      throw ValueError(kat::detail::concat(who, ": gamma must be finite and >= 0, got ", o.gamma));
    }
    if (!(std::isfinite(o.rho) && o.rho >= 0.0 && o.rho <= 1.0)) {
      throw ValueError(kat::detail::concat(who, ": rho must be in [0, 1], got ", o.rho));
    }
    if (!std::isfinite(o.tau0)) {
      throw ValueError(kat::detail::concat(who, ": tau0 must be finite, got ", o.tau0));
    }
    return o;
  }

  static double sum(const std::vector<double> &values) {
    double s = 0;
    for (const double v : values) {
      s += v;
    }
    return s;
  }

  void all_reduce(const train::ProcessGroup &group, std::vector<double> &values) {
    group.sum(values);
    if (group.size() > 1) {
      bytes_ += values.size() * sizeof(double);
    }
  }

  AGENTOptions options_;
  double tau_;
  vector_type snapshot_;
  vector_type full_gradient_;
  vector_type scratch_;
  std::size_t size_;
  std::int64_t refreshes_ = 0;
  std::uint64_t bytes_ = 0;
  Evaluator evaluate_;
  AGENTRefresh last_refresh_;
};

} // namespace kat::sparse
