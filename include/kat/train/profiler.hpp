#pragma once
/// @file
/// @brief A callback that profiles each epoch: where K-FAC's step spends its time, what the
/// gradient sync and the transforms communicate, and the state they hold.

#include "kat/core/region_timer.hpp"
#include "kat/train/callback.hpp"
#include "kat/train/trainer.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace kat::train {

/// Where one process's K-FAC steps spent their time, in seconds, from the exclusive (self)
/// times of the call paths under kat::precond::KFAC::step. Every region's exclusive time lands
/// in exactly one component, so they add up to `total`, the inclusive time of the steps:
/// `comm` is every region at or below a kat::distributed:: region (the strategy's collectives,
/// wherever K-FAC calls them, waiting for the slowest process included); the rest goes to the
/// K-FAC phase it runs in (update_factors, decompose, precondition) or to `other` (the step's
/// own bookkeeping).
struct KFACTimes {
  double factors = 0;       ///< updating the Kronecker factors (seconds)
  double comm = 0;          ///< the strategy's collectives, waiting included (seconds)
  double decomposition = 0; ///< eigendecompositions or inverses of the factors (seconds)
  double precondition = 0;  ///< preconditioning the gradients (seconds)
  double other = 0;         ///< the step's own bookkeeping (seconds)
  double total = 0;         ///< the inclusive time of the steps (seconds), the sum of the above

  /// The split of `timer`'s call paths.
  static KFACTimes of(const RegionTimer &timer) {
    KFACTimes t;
    const auto is_comm = [](const std::string &name) {
      return name.rfind("kat::distributed::", 0) == 0;
    };
    for (const auto &e : timer.paths()) {
      const auto step = std::find(e.path.begin(), e.path.end(), "kat::precond::KFAC::step");
      if (step == e.path.end()) {
        continue;
      }
      if (step + 1 == e.path.end()) {
        t.total += e.seconds;
        t.other += e.self_seconds;
        continue;
      }
      const std::string &phase = *(step + 1);
      double &part = std::any_of(step + 1, e.path.end(), is_comm)    ? t.comm
                     : phase == "kat::precond::KFAC::update_factors" ? t.factors
                     : phase == "kat::precond::KFAC::decompose"      ? t.decomposition
                     : phase == "kat::precond::KFAC::precondition"   ? t.precondition
                                                                     : t.other;
      part += e.self_seconds;
    }
    return t;
  }
};

/// Profiles every epoch and reports it through the EpochSummary: a line for the console
/// (EpochSummary::lines) and the metrics columns named by columns() (EpochSummary::metrics),
/// so add it before a ConsoleLogger and a MetricsWriter. Per epoch:
///
/// - with gradient transforms: the K-FAC step's time per step split as KFACTimes (max and
///   mean over the processes), the transforms' communicated bytes per step and per
///   second-order update (a step where TransformStats::next_updates_curvature was true), and
///   their state bytes (max, min and rank 0's);
/// - with a gradient sync: its bytes per step and exposed communication time (max process).
///
/// Collective in on_epoch_end() (a gather over the process group). Timing uses a
/// kat::RegionTimer, which needs Kokkos initialized and at most one at a time.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Profiler : public Callback<Scalar, MemorySpace> {
public:
  using trainer_type = Trainer<Scalar, MemorySpace>; ///< the Trainer profiled

  std::string name() const override { return "profiler"; }

  /// The metrics columns on_epoch_end() fills, in order.
  static std::vector<std::string> columns() {
    return {"factor_ms",
            "comm_ms",
            "decomposition_ms",
            "precondition_ms",
            "kfac_bytes_per_step",
            "kfac_bytes_per_second_order_update",
            "second_order_updates",
            "gradient_bytes_per_step",
            "exposed_comm_seconds",
            "kfac_state_bytes_max",
            "kfac_state_bytes_min",
            "other_ms",
            "kfac_step_ms"};
  }

  /// Starts the region timer.
  void on_train_begin(trainer_type &) override { timer_.emplace(); }
  /// Stops the region timer.
  void on_train_end(trainer_type &) override { timer_.reset(); }

  /// Clears the epoch's timings and byte counts.
  void on_epoch_begin(trainer_type &) override {
    if (timer_) {
      timer_->reset();
    }
    steps_ = updates_ = bytes_ = update_bytes_ = 0;
  }

  /// Notes the transforms' communicated bytes before the step and whether it updates curvature.
  void on_step_begin(trainer_type &trainer) override {
    before_ = 0;
    update_ = false;
    for (const auto &t : trainer.transforms()) {
      const TransformStats s = t->stats();
      before_ += s.bytes;
      update_ = update_ || s.next_updates_curvature;
    }
  }

  /// Adds the step's communicated bytes (to the second-order updates' too where it was one).
  void on_step_end(trainer_type &trainer) override {
    std::uint64_t after = 0;
    for (const auto &t : trainer.transforms()) {
      after += t->stats().bytes;
    }
    ++steps_;
    bytes_ += after - before_;
    if (update_) {
      ++updates_;
      update_bytes_ += after - before_;
    }
  }

  /// Gathers the epoch's figures over the process group (collective) and adds its console line
  /// and the columns() metrics to `summary`.
  void on_epoch_end(trainer_type &trainer, EpochSummary &summary) override {
    const KFACTimes local = timer_ ? KFACTimes::of(*timer_) : KFACTimes{};
    const double ms = steps_ > 0 ? 1e3 / static_cast<double>(steps_) : 0.0;
    std::size_t state = 0;
    for (const auto &t : trainer.transforms()) {
      state += t->stats().state_bytes;
    }
    const SyncStats sync =
        trainer.gradient_sync() ? trainer.gradient_sync()->sync_stats() : SyncStats{};
    std::vector<double> mine;
    for (const auto field : fields()) {
      mine.push_back(local.*field * ms);
    }
    mine.push_back(sync.exposed_seconds);
    mine.push_back(static_cast<double>(state));
    const auto all = trainer.process_group().gather(mine);

    const std::size_t n = fields().size();
    KFACTimes max, mean;
    double exposed = 0, state_max = 0, state_min = all[0][n + 1];
    for (const auto &r : all) {
      for (std::size_t i = 0; i < n; ++i) {
        max.*fields()[i] = std::max(max.*fields()[i], r[i]);
        mean.*fields()[i] += r[i] / static_cast<double>(all.size());
      }
      exposed = std::max(exposed, r[n]);
      state_max = std::max(state_max, r[n + 1]);
      state_min = std::min(state_min, r[n + 1]);
    }
    const double per_step = steps_ > 0 ? static_cast<double>(bytes_) / double(steps_) : 0.0;
    const double per_update =
        updates_ > 0 ? static_cast<double>(update_bytes_) / double(updates_) : 0.0;
    const double gradient_per_step =
        sync.steps > 0 ? static_cast<double>(sync.bytes) / static_cast<double>(sync.steps) : 0.0;
    summary.metrics.insert(summary.metrics.end(),
                           {{"factor_ms", max.factors, 6},
                            {"comm_ms", max.comm, 6},
                            {"decomposition_ms", max.decomposition, 6},
                            {"precondition_ms", max.precondition, 6},
                            {"kfac_bytes_per_step", per_step, 1},
                            {"kfac_bytes_per_second_order_update", per_update, 1},
                            {"second_order_updates", static_cast<double>(updates_), 0},
                            {"gradient_bytes_per_step", gradient_per_step, 1},
                            {"exposed_comm_seconds", exposed, 6},
                            {"kfac_state_bytes_max", state_max, 0},
                            {"kfac_state_bytes_min", state_min, 0},
                            {"other_ms", max.other, 6},
                            {"kfac_step_ms", max.total, 6}});

    // The console line.
    const int ranks = static_cast<int>(all.size());
    const bool transforms = !trainer.transforms().empty();
    const bool communicates = transforms && (ranks > 1 || bytes_ > 0);
    char buf[512];
    std::vector<std::string> parts;
    if (transforms) {
      const auto pair = [&](const char *label, double KFACTimes::*field) {
        if (ranks > 1) {
          std::snprintf(buf, sizeof buf, "%s %.3f | %.3f ms", label, max.*field, mean.*field);
        } else {
          std::snprintf(buf, sizeof buf, "%s %.3f ms", label, max.*field);
        }
        return std::string(buf);
      };
      std::string times =
          pair("factors", &KFACTimes::factors) + ", " + pair("comm", &KFACTimes::comm) + ", " +
          pair("decomposition", &KFACTimes::decomposition) + ", " +
          pair("precondition", &KFACTimes::precondition) + ", " + pair("other", &KFACTimes::other) +
          " of " + pair("K-FAC step", &KFACTimes::total);
      if (ranks > 1) {
        std::snprintf(buf, sizeof buf, " (per step, max | mean over %d ranks)", ranks);
      } else {
        std::snprintf(buf, sizeof buf, " (per step)");
      }
      parts.push_back(times + buf);
      const char *s = updates_ == 1 ? "" : "s";
      if (communicates) {
        std::snprintf(buf, sizeof buf,
                      "K-FAC %.0f B/step, %.0f B per second-order update (%llu update%s)", per_step,
                      per_update, static_cast<unsigned long long>(updates_), s);
      } else {
        std::snprintf(buf, sizeof buf, "K-FAC %llu second-order update%s, no communication",
                      static_cast<unsigned long long>(updates_), s);
      }
      parts.emplace_back(buf);
    }
    if (trainer.gradient_sync()) {
      std::snprintf(buf, sizeof buf, "gradients %.0f B/step, exposed %.3f s (max rank)",
                    gradient_per_step, exposed);
      parts.emplace_back(buf);
    }
    if (transforms) {
      if (ranks > 1) {
        std::snprintf(buf, sizeof buf,
                      "K-FAC state %.2f MB (max rank), %.2f MB (min), %.2f MB (rank 0)",
                      state_max / 1e6, state_min / 1e6, all[0][n + 1] / 1e6);
      } else {
        std::snprintf(buf, sizeof buf, "K-FAC state %.2f MB", state_max / 1e6);
      }
      parts.emplace_back(buf);
    }
    std::string line = "profile: ";
    for (std::size_t i = 0; i < parts.size(); ++i) {
      line += (i ? "; " : "") + parts[i];
    }
    summary.lines.push_back(parts.empty() ? line + "nothing to profile (no K-FAC, one rank)"
                                          : line);
  }

private:
  using Field = double KFACTimes::*;
  static const std::vector<Field> &fields() {
    static const std::vector<Field> f{&KFACTimes::factors,       &KFACTimes::comm,
                                      &KFACTimes::decomposition, &KFACTimes::precondition,
                                      &KFACTimes::other,         &KFACTimes::total};
    return f;
  }

  std::optional<RegionTimer> timer_;
  std::uint64_t steps_ = 0, updates_ = 0, bytes_ = 0, update_bytes_ = 0, before_ = 0;
  bool update_ = false;
};

} // namespace kat::train
