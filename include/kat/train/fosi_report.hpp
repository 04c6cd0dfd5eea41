#pragma once
/// @file
/// @brief FOSI's per-epoch report: the current curvature estimate on the epoch line and, when
/// profiling, the cost of its refreshes and projections.

#include "kat/optim/fosi.hpp"
#include "kat/train/callback.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>

namespace kat::train {

/// Adds FOSI's state to each epoch's summary (Sivan et al., ICLR 2024): the epoch line gets
/// "λ_max X, c Y" (the largest estimated Hessian eigenvalue and the complement scale
/// c = clip(|λ_max| / |λ_k|, 1, learning_rate_clip)), the metrics `fosi_lambda_max` and
/// `fosi_c`. With `profile` (which turns on FOSI::set_profile) also the mean Lanczos wall time
/// per refresh during the epoch and the mean projection time per step: "Lanczos 1.2 s/refresh
/// (1), projections 0.41 ms/step, curvature 12.7 MiB", metrics `fosi_lanczos_s` (seconds per
/// refresh, 0 without a refresh in the epoch), `fosi_projection_ms` and
/// `fosi_curvature_bytes` (FOSI::curvature_bytes(), this process's). With `communicated`, a
/// counter of the bytes this process has passed to MPI for FOSI (DHO2: its and its curvature
/// operator's communicators), profiling adds their mean per step over the epoch, refreshes
/// included ("5,120 B/step", metric `fosi_bytes_per_step`; 0 without a counter). When FOSI
/// estimates asynchronously (DHO2 with curvature ranks), every epoch line also reports the
/// staleness of the estimates installed in the epoch and how much of their estimation was
/// hidden: "stale 3.0 steps (max 4, 2 estimates), estimation 12.41 s, waited 0.52 s",
/// metrics `fosi_staleness_mean`, `fosi_staleness_max` (steps; 0 without an estimate in the
/// epoch), `fosi_estimation_s` (Lanczos seconds on the curvature ranks) and `fosi_waited_s`
/// (seconds this rank blocked for an estimate). `fosi` must outlive it.
template <class Scalar, class MemorySpace>
class FOSIReport final : public Callback<Scalar, MemorySpace> {
public:
  /// The Trainer FOSI runs in.
  using trainer_type = typename Callback<Scalar, MemorySpace>::trainer_type;

  /// @param fosi          the optimizer reported on; must outlive this object
  /// @param profile       also time the Lanczos runs and projections (FOSI::set_profile)
  /// @param communicated  a counter of the bytes passed to MPI for FOSI (empty: none)
  FOSIReport(optim::FOSI<Scalar, MemorySpace> &fosi, bool profile,
             std::function<std::uint64_t()> communicated = {})
      : fosi_(fosi), profile_(profile), communicated_(std::move(communicated)) {
    fosi_.set_profile(profile);
  }

  std::string name() const override { return "FOSIReport"; }

  void on_epoch_begin(trainer_type &trainer) override {
    (void)trainer;
    mark();
  }
  void on_step_end(trainer_type &trainer) override {
    (void)trainer;
    ++epoch_steps_;
    if (fosi_.refresh_count() != refreshes_seen_) {
      refreshes_seen_ = fosi_.refresh_count();
      ++epoch_refreshes_;
      epoch_lanczos_seconds_ += fosi_.last_lanczos_seconds();
      const std::int64_t stale = fosi_.staleness().last_steps;
      epoch_stale_sum_ += stale;
      epoch_stale_max_ = std::max(epoch_stale_max_, stale);
    }
  }
  void on_epoch_end(trainer_type &trainer, EpochSummary &summary) override {
    (void)trainer;
    std::ostringstream os;
    os << std::setprecision(4) << "λ_max " << fosi_.lambda_max() << ", c " << fosi_.scaling();
    summary.metrics.push_back({"fosi_lambda_max", fosi_.lambda_max(), 6});
    summary.metrics.push_back({"fosi_c", fosi_.scaling(), 6});
    if (asynchronous()) {
      const auto &st = fosi_.staleness();
      const double mean =
          epoch_refreshes_ > 0 ? double(epoch_stale_sum_) / double(epoch_refreshes_) : 0.0;
      const double estimation = st.estimation_seconds - estimation_at_start_;
      const double waited = st.waited_seconds - waited_at_start_;
      os << std::fixed << std::setprecision(1) << ", stale " << mean << " steps (max "
         << epoch_stale_max_ << ", " << epoch_refreshes_ << " estimates), estimation "
         << std::setprecision(2) << estimation << " s, waited " << waited << " s"
         << std::defaultfloat << std::setprecision(4);
      summary.metrics.push_back({"fosi_staleness_mean", mean, 2});
      summary.metrics.push_back({"fosi_staleness_max", double(epoch_stale_max_), 0});
      summary.metrics.push_back({"fosi_estimation_s", estimation, 3});
      summary.metrics.push_back({"fosi_waited_s", waited, 3});
    }
    if (profile_) {
      const double lanczos =
          epoch_refreshes_ > 0 ? epoch_lanczos_seconds_ / double(epoch_refreshes_) : 0.0;
      const std::int64_t steps = fosi_.projected_steps() - steps_at_start_;
      const double projection_ms =
          steps > 0 ? (fosi_.projection_seconds() - seconds_at_start_) / double(steps) * 1e3 : 0.0;
      const double curvature = static_cast<double>(fosi_.curvature_bytes());
      os << std::fixed << std::setprecision(3) << ", Lanczos " << lanczos << " s/refresh ("
         << epoch_refreshes_ << "), projections " << projection_ms << " ms/step, curvature "
         << std::setprecision(1) << curvature / (1024.0 * 1024.0) << " MiB";
      double bytes_per_step = 0;
      if (communicated_) {
        const auto bytes = static_cast<double>(communicated_() - bytes_at_start_);
        bytes_per_step = epoch_steps_ > 0 ? bytes / double(epoch_steps_) : 0.0;
        os << std::setprecision(0) << ", " << bytes_per_step << " B/step";
      }
      summary.metrics.push_back({"fosi_lanczos_s", lanczos, 4});
      summary.metrics.push_back({"fosi_projection_ms", projection_ms, 4});
      summary.metrics.push_back({"fosi_curvature_bytes", curvature, 0});
      summary.metrics.push_back({"fosi_bytes_per_step", bytes_per_step, 1});
    }
    summary.note += "  " + os.str();
  }

private:
  bool asynchronous() const { return fosi_.partition() && fosi_.partition()->asynchronous(); }

  void mark() {
    epoch_stale_sum_ = 0;
    epoch_stale_max_ = 0;
    estimation_at_start_ = fosi_.staleness().estimation_seconds;
    waited_at_start_ = fosi_.staleness().waited_seconds;
    refreshes_seen_ = fosi_.refresh_count();
    epoch_refreshes_ = 0;
    epoch_lanczos_seconds_ = 0;
    steps_at_start_ = fosi_.projected_steps();
    seconds_at_start_ = fosi_.projection_seconds();
    epoch_steps_ = 0;
    bytes_at_start_ = communicated_ ? communicated_() : 0;
  }

  optim::FOSI<Scalar, MemorySpace> &fosi_;
  bool profile_;
  std::function<std::uint64_t()> communicated_;
  std::int64_t refreshes_seen_ = 0, epoch_refreshes_ = 0, steps_at_start_ = 0, epoch_steps_ = 0;
  std::uint64_t bytes_at_start_ = 0;
  double epoch_lanczos_seconds_ = 0, seconds_at_start_ = 0;
  std::int64_t epoch_stale_sum_ = 0, epoch_stale_max_ = 0;
  double estimation_at_start_ = 0, waited_at_start_ = 0;
};

} // namespace kat::train
