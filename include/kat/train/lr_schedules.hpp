#pragma once
/// @file
/// @brief kat::optim's learning-rate schedules by name, with their options, as a
/// kat::train::Registry.

#include "kat/core/hyperparameter.hpp"
#include "kat/optim/lr_schedule.hpp"
#include "kat/train/registry.hpp"

#include <cstdint>
#include <functional>

namespace kat::train {

/// Builds a schedule from its options, the base rate and the run's length in steps.
using LRScheduleFactory = std::function<Hyperparameter<double>(
    const Config &options, double base_lr, std::int64_t total_steps)>;

/// "constant" (kat::optim::constant_lr), "cosine" (cosine_lr to 0 over the run) and "step"
/// (step_lr, options "step-size" and "gamma"). A factory throws what the schedule throws
/// (ValueError naming the argument), or ValueError naming an option that has no value or is
/// not a number.
inline Registry<LRScheduleFactory> lr_schedules() {
  Registry<LRScheduleFactory> r("schedule");
  r.add("constant", "Constant rate", {},
        [](const Config &, double lr, std::int64_t) { return optim::constant_lr(lr); });
  r.add("cosine", "Cosine annealing to 0 over the run (SGDR without restarts)", {},
        [](const Config &, double lr, std::int64_t total) { return optim::cosine_lr(lr, total); });
  r.add("step", "Step decay: times gamma every step-size steps",
        {{"step-size", "Steps between decays (schedule step)"},
         {"gamma", "Decay factor (schedule step)", "0.1"}},
        [](const Config &c, double lr, std::int64_t) {
          return optim::step_lr(lr, c.integer("step-size"), c.number("gamma"));
        });
  return r;
}

} // namespace kat::train
