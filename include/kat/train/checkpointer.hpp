#pragma once
/// @file
/// @brief A callback that saves crash-safe checkpoints of a Trainer's run, and resuming.

#include "kat/core/error.hpp"
#include "kat/io/checkpoint.hpp"
#include "kat/train/callback.hpp"
#include "kat/train/process_group.hpp"
#include "kat/train/trainer.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace kat::train {

/// Saves the Trainer's whole state (Trainer::state_dict()) with kat::io::CheckpointDirectory:
/// one file per process and checkpoint, written to a temporary file, synced and renamed, so a
/// crash never leaves a partial checkpoint under a checkpoint's name; the newest `keep` are
/// kept. With `every` = N > 0 it saves after every N-th optimizer step and after the last
/// epoch; with 0, after every epoch. On several processes old files are deleted only once
/// every process holds the new step (one barrier per save).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Checkpointer : public Callback<Scalar, MemorySpace> {
public:
  using trainer_type = Trainer<Scalar, MemorySpace>;

  /// @param directory where the checkpoints go (created if missing)
  /// @param every     optimizer steps between checkpoints; 0: at the end of every epoch
  /// @param keep      how many of the newest checkpoints to keep (>= 1)
  /// @param group     the processes training together; must outlive this object
  /// @throws ValueError if every < 0 or keep < 1; IOError if the directory cannot be made.
  Checkpointer(const std::string &directory, std::int64_t every, std::size_t keep,
               const ProcessGroup &group)
      : dir_(directory, keep, group.rank(), group.size()), every_(every), group_(&group) {
    if (every < 0) {
      throw ValueError(
          kat::detail::concat("kat::train::Checkpointer: every must be >= 0, got ", every));
    }
  }

  std::string name() const override { return "checkpointer"; }
  const kat::io::CheckpointDirectory &directory() const { return dir_; }

  /// The newest checkpoint every process holds (a process killed while saving may lack the
  /// newest one). Collective.
  /// @throws ValueError if there is none for this number of processes, naming the directory
  ///   and the process counts whose checkpoints it does hold.
  std::string latest() const {
    const std::int64_t step = group_->min(dir_.latest().value_or(-1));
    if (step < 0) {
      std::string held;
      for (const int r : dir_.rank_counts()) {
        held += (held.empty() ? "" : ", ") + std::to_string(r);
      }
      throw ValueError(kat::detail::concat(
          "kat::train::Checkpointer::latest: no checkpoint for ", group_->size(),
          " rank(s) in every rank's view of ", dir_.directory(),
          held.empty() ? std::string() : " (it holds checkpoints of " + held + " rank(s))"));
    }
    return dir_.path(step);
  }

  /// Saves the trainer's state as its current step. Collective on several processes.
  void save(const trainer_type &trainer) {
    const bool alone = group_->size() == 1;
    dir_.save(trainer.position().step, trainer.state_dict(), alone);
    if (!alone) {
      group_->barrier();
      dir_.prune();
    }
  }

  void on_step_end(trainer_type &trainer) override {
    const Position &p = trainer.position();
    // A step that ends the epoch is saved by on_epoch_end, as the start of the next epoch.
    if (every_ > 0 && p.step % every_ == 0 &&
        static_cast<std::size_t>(p.batch) < trainer.train_loader().batches()) {
      save(trainer);
    }
  }

  void on_epoch_end(trainer_type &trainer, EpochSummary &summary) override {
    if (every_ == 0 || trainer.position().step % every_ == 0 || summary.epoch == trainer.epochs()) {
      save(trainer);
    }
  }

private:
  kat::io::CheckpointDirectory dir_;
  std::int64_t every_;
  const ProcessGroup *group_;
};

/// Restores `trainer` from the checkpoint file `path` (kat::io::load_checkpoint, then
/// Trainer::load_state_dict, whose messages start with the path), so that fit() continues the
/// saved run bit for bit.
/// @throws IOError, StateError or ValueError naming the file and what is wrong with it.
template <class Scalar, class MemorySpace>
void resume(Trainer<Scalar, MemorySpace> &trainer, const std::string &path) {
  trainer.load_state_dict(kat::io::load_checkpoint(path), path);
}

} // namespace kat::train
