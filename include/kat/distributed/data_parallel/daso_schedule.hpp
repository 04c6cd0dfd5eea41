#pragma once
/// @file
/// @brief kat::distributed::DASOSchedule: DASO's epoch-level schedule of global_skip,
/// local_skip and batches_to_wait (warm-up, cool-down, loss-plateau detection). Needs no MPI.

#include "kat/core/error.hpp"
#include "kat/core/state.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace kat::distributed {

/// How DASO synchronizes during an epoch (Coquelin et al., "Accelerating neural network
/// training with distributed asynchronous and selective optimization (DASO)", J. Big Data 9,
/// 2022, section "Method"):
///
/// - `global_skip` B: a global parameter synchronization starts every B steps; B < 1 means a
///   blocking synchronization after every step (warm-up, cool-down).
/// - `local_skip`: with local_skip > 1 the node-local gradient all-reduce is skipped on some
///   steps (see DASO); 1 means every step.
/// - `batches_to_wait` S: a global synchronization started at step b is received and merged at
///   step b + S (S = 0: at once, blocking).
struct DASOSkips {
  std::int64_t global_skip = 0;     ///< B (see above)
  std::int64_t local_skip = 0;      ///< the node-local all-reduce period (1: every step)
  std::int64_t batches_to_wait = 0; ///< S (see above)

  /// Whether every step ends with a blocking global average (global_skip < 1).
  bool blocking() const noexcept { return global_skip < 1; }
  /// Whether all three agree.
  bool operator==(const DASOSkips &o) const noexcept {
    return global_skip == o.global_skip && local_skip == o.local_skip &&
           batches_to_wait == o.batches_to_wait;
  }
  /// Whether any of the three differs.
  bool operator!=(const DASOSkips &o) const noexcept { return !(*this == o); }
};

/// Detects that a minimized metric stopped improving (PyTorch's ReduceLROnPlateau test in
/// "min" mode with a relative threshold, as the DASO reference's DetectMetricPlateau): a value
/// improves if it is below best x (1 - threshold) (best x (1 + threshold) for a negative best);
/// after more than `patience` epochs in a row without improvement test() reports a plateau
/// and starts counting anew.
class PlateauDetector {
public:
  /// @throws ValueError if threshold is not in [0, 1) or patience < 0.
  PlateauDetector(double threshold = 0.05, std::int64_t patience = 2)
      : threshold_(threshold), patience_(patience) {
    using kat::detail::concat;
    if (!(threshold >= 0 && threshold < 1)) {
      throw ValueError(concat(
          "kat::distributed::PlateauDetector: threshold must be in [0, 1), got ", threshold));
    }
    if (patience < 0) {
      throw ValueError(
          concat("kat::distributed::PlateauDetector: patience must be >= 0, got ", patience));
    }
  }

  /// Records `value` (an epoch's loss); true if it ends a plateau of more than patience()
  /// epochs without improvement. @throws ValueError if value is not finite.
  bool test(double value) {
    if (!std::isfinite(value)) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::PlateauDetector::test: the metric must be finite, got ", value));
    }
    const double bar = best_ >= 0 ? best_ * (1 - threshold_) : best_ * (1 + threshold_);
    if (value < bar) {
      best_ = value;
      bad_epochs_ = 0;
    } else {
      ++bad_epochs_;
    }
    if (bad_epochs_ > patience_) {
      bad_epochs_ = 0;
      return true;
    }
    return false;
  }

  /// The relative improvement threshold given at construction.
  double threshold() const noexcept { return threshold_; }
  /// The epochs without improvement tolerated before a plateau.
  std::int64_t patience() const noexcept { return patience_; }
  /// The best value so far (+infinity before the first).
  double best() const noexcept { return best_; }
  /// Epochs since the last improvement or plateau.
  std::int64_t bad_epochs() const noexcept { return bad_epochs_; }

  /// "best" (float64) and "bad_epochs" (int64).
  StateDict state_dict() const {
    StateDict s;
    s.set("best", best_);
    s.set("bad_epochs", bad_epochs_);
    return s;
  }
  /// Restores state_dict().
  /// @throws StateError if an entry is missing, unexpected or of another dtype or shape.
  void load_state_dict(const StateDict &s) {
    s.require_names("kat::distributed::PlateauDetector::load_state_dict", {"best", "bad_epochs"});
    best_ = s.get<double>("best");
    bad_epochs_ = s.get<std::int64_t>("bad_epochs");
  }

private:
  double threshold_;
  std::int64_t patience_;
  double best_ = std::numeric_limits<double>::infinity();
  std::int64_t bad_epochs_ = 0;
};

/// DASO's schedule hyperparameters; the defaults are the reference's (Heat's DASO class).
struct DASOScheduleOptions {
  /// Epochs at the start with a blocking global average after every step.
  std::int64_t warmup_epochs = 4;
  /// Epochs at the end with a blocking global average after every step.
  std::int64_t cooldown_epochs = 4;
  /// The skips of the first epoch after warm-up.
  DASOSkips after_warmup{4, 1, 1};
  /// global_skip after a plateau at global_skip = 1 (then local_skip = batches_to_wait =
  /// max_global_skips / local_skip_factor).
  std::int64_t max_global_skips = 8;
  /// On a plateau with global_skip > 1, global_skip and local_skip are divided by it.
  std::int64_t skip_reduction_factor = 2;
  /// See max_global_skips.
  std::int64_t local_skip_factor = 4;
  /// The plateau detector's relative threshold ("stability_level" in the reference).
  double stability_level = 0.05;
  /// The plateau detector's patience in epochs.
  std::int64_t patience = 2;
};

/// The epoch-level schedule of DASO (the reference's `epoch_loss_logic`). After each epoch
/// e (1-based) of E, with the epoch's mean training loss over all ranks:
///
/// 1. e < warmup_epochs: blocking (0, 0, 0) for the next epoch; done.
/// 2. e = warmup_epochs: after_warmup, (4, 1, 1) by default; continue.
/// 3. e >= E - cooldown_epochs: blocking for the next epoch; done.
/// 4. The plateau detector (stability_level, patience) sees the loss. On a plateau with
///    global_skip > 1: global_skip and local_skip are divided by skip_reduction_factor
///    (integer division) and batches_to_wait decreases by 1, with local_skip and
///    batches_to_wait at least 1 while global_skip > 0. On a plateau with global_skip = 1:
///    (max_global_skips, max_global_skips / local_skip_factor, the same).
///
/// The first epoch is blocking when warmup_epochs > 0 and after_warmup otherwise (the
/// reference starts blocking whatever its warm-up, which with 0 warm-up epochs never ends; a
/// deviation, so that warmup_epochs = 0 means none). So the first warmup_epochs and the last
/// cooldown_epochs epochs are blocking, and a run of at most warmup + cooldown epochs is
/// blocking throughout.
class DASOSchedule {
public:
  /// @param options the hyperparameters
  /// @param epochs  E, the run's number of epochs (for the cool-down), >= 1
  /// @throws ValueError naming the option whose value is out of range (negative epochs,
  ///   after_warmup.global_skip or local_skip < 1 or batches_to_wait < 0, max_global_skips,
  ///   skip_reduction_factor or local_skip_factor < 1, stability_level outside [0, 1),
  ///   patience < 0, epochs < 1).
  DASOSchedule(const DASOScheduleOptions &options, std::int64_t epochs)
      : options_(options), epochs_(epochs),
        detector_(checked(options).stability_level, options.patience) {
    if (epochs < 1) {
      throw ValueError(
          kat::detail::concat("kat::distributed::DASOSchedule: epochs must be >= 1, got ", epochs));
    }
    skips_ = options_.warmup_epochs > 0 ? DASOSkips{} : options_.after_warmup;
  }

  /// The skips of the epoch in progress.
  const DASOSkips &skips() const noexcept { return skips_; }
  /// Sets E, the run's number of epochs (a trainer knows it only when training starts).
  /// @throws ValueError if epochs < 1.
  void set_epochs(std::int64_t epochs) {
    if (epochs < 1) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::DASOSchedule::set_epochs: epochs must be >= 1, got ", epochs));
    }
    epochs_ = epochs;
  }
  /// The options given at construction.
  const DASOScheduleOptions &options() const noexcept { return options_; }
  /// The training's epochs (set_epochs()).
  std::int64_t epochs() const noexcept { return epochs_; }
  /// The plateau test of the loss.
  const PlateauDetector &detector() const noexcept { return detector_; }

  /// After epoch `epoch` (1-based) ended with mean training loss `loss`: the skips of the next
  /// epoch (also skips() afterwards). @throws ValueError for a non-finite loss after warm-up.
  DASOSkips epoch_end(std::int64_t epoch, double loss) {
    if (epoch < options_.warmup_epochs) {
      skips_ = DASOSkips{};
      return skips_;
    }
    if (epoch == options_.warmup_epochs) {
      skips_ = options_.after_warmup;
    }
    if (epoch >= epochs_ - options_.cooldown_epochs) {
      skips_ = DASOSkips{};
      return skips_;
    }
    const bool plateau = detector_.test(loss);
    if (plateau && skips_.global_skip > 1) {
      skips_.global_skip /= options_.skip_reduction_factor;
      skips_.local_skip /= options_.skip_reduction_factor;
      skips_.batches_to_wait -= 1;
      if (skips_.global_skip > 0) {
        skips_.batches_to_wait = std::max<std::int64_t>(skips_.batches_to_wait, 1);
        skips_.local_skip = std::max<std::int64_t>(skips_.local_skip, 1);
      }
    } else if (plateau && skips_.global_skip == 1) {
      skips_.global_skip = options_.max_global_skips;
      skips_.local_skip = options_.max_global_skips / options_.local_skip_factor;
      skips_.batches_to_wait = options_.max_global_skips / options_.local_skip_factor;
    }
    return skips_;
  }

  /// The skips and the detector's state.
  StateDict state_dict() const {
    StateDict s;
    s.set("global_skip", skips_.global_skip);
    s.set("local_skip", skips_.local_skip);
    s.set("batches_to_wait", skips_.batches_to_wait);
    s.merge("plateau", detector_.state_dict());
    return s;
  }
  /// @throws StateError on missing or unexpected entries.
  void load_state_dict(const StateDict &s) {
    s.require_names("kat::distributed::DASOSchedule::load_state_dict",
                    {"global_skip", "local_skip", "batches_to_wait", "plateau."});
    skips_.global_skip = s.get<std::int64_t>("global_skip");
    skips_.local_skip = s.get<std::int64_t>("local_skip");
    skips_.batches_to_wait = s.get<std::int64_t>("batches_to_wait");
    detector_.load_state_dict(s.sub("plateau"));
  }

private:
  static const DASOScheduleOptions &checked(const DASOScheduleOptions &o) {
    using kat::detail::concat;
    const auto at_least = [](const char *name, std::int64_t value, std::int64_t min) {
      if (value < min) {
        throw ValueError(
            concat("kat::distributed::DASOSchedule: ", name, " must be >= ", min, ", got ", value));
      }
    };
    at_least("warmup_epochs", o.warmup_epochs, 0);
    at_least("cooldown_epochs", o.cooldown_epochs, 0);
    at_least("after_warmup.global_skip", o.after_warmup.global_skip, 1);
    at_least("after_warmup.local_skip", o.after_warmup.local_skip, 1);
    at_least("after_warmup.batches_to_wait", o.after_warmup.batches_to_wait, 0);
    at_least("max_global_skips", o.max_global_skips, 1);
    at_least("skip_reduction_factor", o.skip_reduction_factor, 1);
    at_least("local_skip_factor", o.local_skip_factor, 1);
    at_least("patience", o.patience, 0);
    if (!(o.stability_level >= 0 && o.stability_level < 1)) {
      throw ValueError(concat("kat::distributed::DASOSchedule: stability_level must be in [0, 1), "
                              "got ",
                              o.stability_level));
    }
    return o;
  }

  DASOScheduleOptions options_;
  std::int64_t epochs_;
  PlateauDetector detector_;
  DASOSkips skips_;
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat
