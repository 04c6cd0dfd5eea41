#pragma once
/// @file
/// @brief A callback that reports training on the console: a live progress bar and a line per
/// epoch.

#include "kat/core/error.hpp"
#include "kat/train/callback.hpp"
#include "kat/train/trainer.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

namespace kat::train {

/// Prints, after every epoch,
///
///     epoch  3  0.873 s     68724 samples/s  train loss 0.2809  test loss 0.3336  test
///     accuracy 88.03%
///
/// followed, with a gradient sync, by "  exposed communication <s> s" (this process's
/// SyncStats::exposed_seconds), then EpochSummary::note on the same line and
/// EpochSummary::lines below it (callbacks added before this one fill them). With `live`, a
/// progress bar on the current line is redrawn at most ten times a second during the epoch (for a
/// terminal). Only the process constructed with `enabled` prints; pass false on the others.
/// Every line is flushed and checked: output that does not arrive (stdout redirected to a full
/// disk or /dev/full) throws IOError naming the stream and the system's reason, so a run whose
/// report was lost does not end as a success.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class ConsoleLogger : public Callback<Scalar, MemorySpace> {
public:
  using trainer_type = Trainer<Scalar, MemorySpace>; ///< the Trainer whose progress is printed
  using Clock = std::chrono::steady_clock;           ///< the clock of the progress line's rate

  /// @param enabled   print a line per epoch; false: print nothing
  /// @param live      also redraw a progress line with the samples per second, at most every
  ///   0.1 s (only when enabled)
  /// @param out       where to print
  /// @param out_name  names `out` in errors ("standard output")
  ConsoleLogger(bool enabled, bool live, std::FILE *out = stdout,
                std::string out_name = "standard output")
      : enabled_(enabled), live_(enabled && live), out_(out), out_name_(std::move(out_name)) {}

  std::string name() const override { return "console_logger"; }

  /// Starts the epoch's clock for the progress line.
  void on_epoch_begin(trainer_type &trainer) override {
    t0_ = Clock::now();
    last_ = t0_ - std::chrono::seconds(1);
    seen_at_start_ = trainer.position().seen;
  }

  /// Redraws the progress line when live (at most every 0.1 s, and at the epoch's last batch).
  /// @throws IOError naming the stream if the write fails.
  void on_step_end(trainer_type &trainer) override {
    const Position &p = trainer.position();
    const std::size_t batches = trainer.train_loader().batches();
    const auto done = static_cast<std::size_t>(p.batch);
    const auto now = Clock::now();
    if (!live_ || (now - last_ < std::chrono::milliseconds(100) && done != batches)) {
      return;
    }
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - t0_).count();
    const double rate = static_cast<double>(p.seen - seen_at_start_) *
                        trainer.process_group().size() / std::max(seconds, 1e-9);
    const int width = 30;
    const int filled = static_cast<int>(width * done / std::max<std::size_t>(batches, 1));
    std::fprintf(out_, "\repoch %lld/%lld [%s%s] %zu/%zu loss %.4f %.0f samples/s",
                 static_cast<long long>(p.epoch), static_cast<long long>(trainer.epochs()),
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
                 batches, p.loss_sum / static_cast<double>(std::max<std::uint64_t>(p.seen, 1)),
                 rate);
    flush();
  }

  /// Prints the epoch's line (time, samples/s, losses, accuracy, exposed communication, the
  /// summary's note) and the summary's extra lines.
  /// @throws IOError naming the stream if the write fails.
  void on_epoch_end(trainer_type &trainer, EpochSummary &s) override {
    if (!enabled_) {
      return;
    }
    char exposed[64] = "";
    if (trainer.gradient_sync()) {
      std::snprintf(exposed, sizeof exposed, "  exposed communication %.3f s",
                    trainer.gradient_sync()->sync_stats().exposed_seconds);
    }
    if (live_) {
      std::fprintf(out_, "\r\033[K");
    }
    std::fprintf(out_,
                 "epoch %2lld  %.3f s  %8.0f samples/s  train loss %.4f  test loss %.4f  "
                 "test accuracy %.2f%%%s%s\n",
                 static_cast<long long>(s.epoch), s.wall_seconds, s.samples_per_second,
                 s.train_loss, s.test_loss, 100 * s.test_accuracy, exposed, s.note.c_str());
    for (const auto &line : s.lines) {
      std::fprintf(out_, "%s\n", line.c_str());
    }
    flush();
  }

private:
  /// Flushes `out_`. @throws IOError naming the stream if this or an earlier write failed.
  void flush() {
    errno = 0;
    if (std::fflush(out_) != 0 || std::ferror(out_) != 0) {
      const int e = errno;
      throw IOError("kat::train::ConsoleLogger: writing " + out_name_ + ": " +
                    (e != 0 ? std::strerror(e) : "write failed"));
    }
  }

  bool enabled_, live_;
  std::FILE *out_;
  std::string out_name_;
  Clock::time_point t0_, last_;
  std::uint64_t seen_at_start_ = 0;
};

} // namespace kat::train
