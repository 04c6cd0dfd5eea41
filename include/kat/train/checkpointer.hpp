#pragma once
/// @file
/// @brief A callback that saves crash-safe checkpoints of a Trainer's run, tied to the run's
/// identity, and resuming.

#include "kat/core/error.hpp"
#include "kat/io/checkpoint.hpp"
#include "kat/train/callback.hpp"
#include "kat/train/process_group.hpp"
#include "kat/train/trainer.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kat::train {

/// A run's identity, stored in every checkpoint's metadata: its id (metadata "run") and its
/// configuration, key-value text pairs stored as "config.<key>" (kat_train stores its parsed
/// command-line options there and compares them on resume).
struct RunIdentity {
  std::string id;                                            ///< "" for an anonymous run
  std::vector<std::pair<std::string, std::string>> config{}; ///< keys: [A-Za-z0-9_.-]
};

/// The identity stored in a checkpoint's header (metadata "run" and "config.*").
inline RunIdentity stored_identity(const kat::io::CheckpointHeader &header) {
  RunIdentity r;
  r.id = header.find("run").value_or("");
  for (const auto &[key, value] : header.metadata) {
    if (key.compare(0, 7, "config.") == 0) {
      r.config.emplace_back(key.substr(7), value);
    }
  }
  return r;
}

/// Saves the Trainer's whole state (Trainer::state_dict()) with kat::io::CheckpointDirectory:
/// one file per process and checkpoint, written to a temporary file, synced and renamed, so a
/// crash never leaves a partial checkpoint under a checkpoint's name; the newest `keep` of this
/// run (set_run()) are kept, by the step stored in each file. With `every` = N > 0 it saves
/// after every N-th optimizer step and after the last epoch; with 0, after every epoch. On
/// several processes old files are deleted only once every process holds the new step (one
/// barrier per save).
///
/// Each file's metadata hold the run id ("run"), "step", "rank", "ranks", the trainer's
/// position ("epoch", "batch": where the resumed run continues) and the run's configuration
/// ("config.<key>"), all readable without the state (kat::io::read_checkpoint_header()).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Checkpointer : public Callback<Scalar, MemorySpace> {
public:
  using trainer_type = Trainer<Scalar, MemorySpace>; ///< the Trainer whose state is saved

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
  /// The checkpoint directory (this rank's files, the run set by set_run()).
  const kat::io::CheckpointDirectory &directory() const { return dir_; }

  /// The run whose checkpoints this writes and prunes (by default an anonymous one, id "").
  /// Give every process the same identity; a resumed run gives the id its checkpoint holds.
  /// @throws ValueError if the id holds a newline or a NUL, or a configuration key is not
  ///   1 to 121 of [A-Za-z0-9_.-] (the key is checked by the next save).
  void set_run(RunIdentity run) {
    dir_.set_run(run.id);
    run_ = std::move(run);
  }
  /// The run set by set_run().
  const RunIdentity &run() const { return run_; }

  /// The checkpoints in the directory, of any rank, that are not this run's (another run id,
  /// or a file whose header is unusable), for a run to refuse a directory it would share.
  std::vector<kat::io::CheckpointFile> foreign() const {
    std::vector<kat::io::CheckpointFile> out;
    for (auto &f : dir_.scan()) {
      if (!f.usable() || f.run != run_.id) {
        out.push_back(std::move(f));
      }
    }
    return out;
  }

  /// The newest checkpoint (by stored step) every process holds, of the one run whose
  /// checkpoints for this process count the directory holds (a process killed while saving may
  /// lack the newest one). Call it before set_run() to find the run to resume. Collective.
  /// @throws ValueError if there is none for this number of processes, naming the directory
  ///   and the process counts whose checkpoints it does hold; if the directory holds this
  ///   rank's checkpoints of several runs, naming them.
  std::string latest() const {
    std::vector<kat::io::CheckpointFile> mine;
    std::vector<std::string> runs;
    for (auto &f : dir_.scan()) {
      if (f.usable() && f.rank == dir_.rank() && f.ranks == dir_.ranks()) {
        if (std::find(runs.begin(), runs.end(), f.run) == runs.end()) {
          runs.push_back(f.run);
        }
        mine.push_back(std::move(f));
      }
    }
    if (runs.size() > 1) {
      std::string list;
      for (const auto &r : runs) {
        list += (list.empty() ? "" : ", ") + (r.empty() ? std::string("(anonymous)") : r);
      }
      throw ValueError(kat::detail::concat("kat::train::Checkpointer::latest: ", dir_.directory(),
                                           " holds checkpoints of ", runs.size(), " runs (", list,
                                           "): resume one by its file, or move the others away"));
    }
    const std::int64_t step = group_->min(mine.empty() ? -1 : mine.back().step);
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
    for (const auto &f : mine) {
      if (f.step == step) {
        return f.path;
      }
    }
    throw ValueError(kat::detail::concat("kat::train::Checkpointer::latest: rank ", dir_.rank(),
                                         " holds no checkpoint of step ", step, " in ",
                                         dir_.directory(), ", the newest step every rank holds"));
  }

  /// Saves the trainer's state as its current step. Collective on several processes.
  void save(const trainer_type &trainer) {
    const bool alone = group_->size() == 1;
    const Position &p = trainer.position();
    kat::io::CheckpointMetadata metadata{{"epoch", std::to_string(p.epoch)},
                                         {"batch", std::to_string(p.batch)}};
    for (const auto &[key, value] : run_.config) {
      metadata.emplace_back("config." + key, value);
    }
    dir_.save(p.step, trainer.state_dict(), alone, metadata);
    if (!alone) {
      group_->barrier();
      dir_.prune();
    }
  }

  /// Saves every `every` steps, except at an epoch's last step (on_epoch_end() saves that one
  /// as the start of the next epoch).
  void on_step_end(trainer_type &trainer) override {
    const Position &p = trainer.position();
    // A step that ends the epoch is saved by on_epoch_end, as the start of the next epoch.
    if (every_ > 0 && p.step % every_ == 0 &&
        static_cast<std::size_t>(p.batch) < trainer.train_loader().batches()) {
      save(trainer);
    }
  }

  /// Saves with every = 0, at a step that is a multiple of `every`, and after the last epoch.
  void on_epoch_end(trainer_type &trainer, EpochSummary &summary) override {
    if (every_ == 0 || trainer.position().step % every_ == 0 || summary.epoch == trainer.epochs()) {
      save(trainer);
    }
  }

private:
  kat::io::CheckpointDirectory dir_;
  std::int64_t every_;
  const ProcessGroup *group_;
  RunIdentity run_;
};

/// Restores `trainer` from the checkpoint file `path` (kat::io::load_checkpoint, then
/// Trainer::load_state_dict, whose messages start with the path), so that fit() continues the
/// saved run bit for bit.
/// @throws IOError, FormatError, StateError or ValueError naming the file and what is wrong
///   with it.
template <class Scalar, class MemorySpace>
void resume(Trainer<Scalar, MemorySpace> &trainer, const std::string &path) {
  trainer.load_state_dict(kat::io::load_checkpoint(path), path);
}

} // namespace kat::train
