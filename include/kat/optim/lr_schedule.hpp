#pragma once
/// @file
/// @brief Learning-rate schedules as plain functions of the step index, mirroring
/// torch.optim.lr_scheduler's closed forms.

#include "kat/core/error.hpp"
#include "kat/optim/optimizer.hpp"

#include "kat/core/hyperparameter.hpp"
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <functional>
#include <string>
#include <utility>

namespace kat {
namespace optim {

/// A learning-rate schedule: the rate to use at 0-based index `step`. Whether the index
/// counts optimizer steps or epochs is the caller's choice (PyTorch's schedulers are usually
/// stepped per epoch); all lengths given to the factories below are in that same unit. Apply
/// it with `opt.set_lr(schedule(i))` before the i-th update (or epoch).
///
/// The schedules are closed forms of the step index, not PyTorch's chainable recurrences, so
/// they can be evaluated at any index (e.g. after restoring a checkpoint) and never drift.
/// Every schedule built here but constant_lr throws ValueError when called with step < 0.
/// A schedule is a kat::Hyperparameter<double>: the one mechanism for every value that may
/// change with the step (K-FAC's damping and KL-clip rate take the same type), so a constant
/// rate is stored in checkpoints as a constant and any `double(std::int64_t)` callable works.
using LRSchedule = Hyperparameter<double>;

namespace detail {

inline void require_step(const char *who, std::int64_t step) {
  require_option(step >= 0, who, "step", ">= 0", static_cast<double>(step));
}

} // namespace detail

/// lr(step) = lr for every step (torch.optim.lr_scheduler.ConstantLR with factor 1).
/// @throws ValueError if lr < 0 or not finite.
inline LRSchedule constant_lr(double lr) {
  detail::require_lr("kat::optim::constant_lr", lr);
  return LRSchedule(lr);
}

/// Step decay, torch.optim.lr_scheduler.StepLR:
/// lr(step) = base_lr * gamma^floor(step / step_size).
/// @throws ValueError if base_lr < 0, step_size < 1, gamma <= 0, or a rate is not finite.
inline LRSchedule step_lr(double base_lr, std::int64_t step_size, double gamma) {
  const char *who = "kat::optim::step_lr";
  detail::require_option(std::isfinite(base_lr) && base_lr >= 0.0, who, "base_lr",
                         "finite and >= 0", base_lr);
  detail::require_option(step_size >= 1, who, "step_size", ">= 1", static_cast<double>(step_size));
  detail::require_option(std::isfinite(gamma) && gamma > 0.0, who, "gamma", "finite and > 0",
                         gamma);
  return [base_lr, step_size, gamma](std::int64_t step) {
    detail::require_step("kat::optim::step_lr", step);
    return base_lr * std::pow(gamma, static_cast<double>(step / step_size));
  };
}

/// Cosine annealing without restarts (Loshchilov & Hutter 2017, "SGDR", Eq. 5 with one
/// period; torch.optim.lr_scheduler.CosineAnnealingLR's closed form, T_max = total_steps):
/// lr(step) = min_lr + (base_lr - min_lr) * (1 + cos(pi * min(step, total_steps) /
/// total_steps)) / 2. Unlike PyTorch, which keeps following the cosine back up after T_max,
/// the rate stays at min_lr from total_steps on.
/// @throws ValueError if base_lr < 0, min_lr < 0, total_steps < 1, or a rate is not finite.
inline LRSchedule cosine_lr(double base_lr, std::int64_t total_steps, double min_lr = 0) {
  const char *who = "kat::optim::cosine_lr";
  detail::require_option(std::isfinite(base_lr) && base_lr >= 0.0, who, "base_lr",
                         "finite and >= 0", base_lr);
  detail::require_option(total_steps >= 1, who, "total_steps", ">= 1",
                         static_cast<double>(total_steps));
  detail::require_option(std::isfinite(min_lr) && min_lr >= 0.0, who, "min_lr", "finite and >= 0",
                         min_lr);
  return [base_lr, total_steps, min_lr](std::int64_t step) {
    detail::require_step("kat::optim::cosine_lr", step);
    const double pi = 3.14159265358979323846;
    const double progress =
        static_cast<double>(std::min(step, total_steps)) / static_cast<double>(total_steps);
    return min_lr + (base_lr - min_lr) * (1.0 + std::cos(pi * progress)) / 2.0;
  };
}

/// Linear warm-up in front of another schedule (Goyal et al. 2017, "Accurate, Large Minibatch
/// SGD", Sec. 2.2; torch.optim.lr_scheduler.LinearLR with start_factor 1/warmup_steps chained
/// with `after`): lr(step) = after(step) * min(1, (step + 1) / warmup_steps). The first step
/// therefore already uses a nonzero rate, and step warmup_steps - 1 the full one.
/// @throws ValueError if warmup_steps < 1.
inline LRSchedule linear_warmup(std::int64_t warmup_steps, LRSchedule after) {
  const char *who = "kat::optim::linear_warmup";
  detail::require_option(warmup_steps >= 1, who, "warmup_steps", ">= 1",
                         static_cast<double>(warmup_steps));
  return [warmup_steps, after = std::move(after)](std::int64_t step) {
    detail::require_step("kat::optim::linear_warmup", step);
    const double factor =
        std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(warmup_steps));
    return after(step) * factor;
  };
}

} // namespace optim
} // namespace kat
