#pragma once
/// @file
/// @brief The training-step role that makes the processes' gradients agree.

#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/train/callback.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace kat::train {

/// What a GradientSync has communicated, for logs and profiles.
struct SyncStats {
  std::uint64_t steps = 0;    ///< steps synchronized since reset_stats()
  std::uint64_t bytes = 0;    ///< payload bytes handed to the network since reset_stats()
  double exposed_seconds = 0; ///< time before_step() waited for it (not hidden by backward)
};

/// Role of a training step: makes the gradients of all processes agree before the gradient
/// transforms and the optimizer see them (data parallelism: their mean). The step calls, in
/// order:
///
///     on_gradients_ready(space, layer)  during backward, once per layer, last layer first
///     before_step(space)                after backward: the gradients must be final after it
///     (gradient transforms, optimizer step)
///     after_step(space)                 after the optimizer (e.g. parameter averaging)
///
/// and around each epoch (kat::train::Trainer::fit; a hand-written loop calls them too when its
/// sync needs them, as DASO does):
///
///     begin_epoch(space, epoch, epochs, steps, first)   before the epoch's first step
///     end_epoch(space)                  after its last step, before evaluation: nothing of
///                                       the epoch may still be in flight afterwards
///     on_epoch_end(summary)             with the epoch's loss summed over the processes,
///                                       before the callbacks see the summary
///
/// kat::train::Trainer installs on_gradients_ready() as the model's backward hook; a
/// hand-written loop does the same with kat::nn::Sequential::set_backward_hook. Implementations:
/// none (one process needs no synchronization), kat::distributed::DataParallel,
/// kat::distributed::DASO.
template <class Scalar, class MemorySpace> class GradientSync {
public:
  /// Where the synchronization's kernels run.
  using execution_space = typename MemorySpace::execution_space;
  using vector_type = Vector<Scalar, MemorySpace>; ///< the flat gradient vector

  virtual ~GradientSync() = default;
  /// A short name for logs and checkpoint entries ("data_parallel").
  virtual std::string name() const = 0;
  /// Layer `layer`'s gradients (an index of the model's flat-buffer blocks) are complete once
  /// the work enqueued on `space` is done; so are those of every later layer. A bucketed
  /// implementation starts communicating the buckets this completes.
  virtual void on_gradients_ready(const execution_space &space, std::size_t layer) = 0;
  /// Completes the synchronization: on return the gradients are the agreed ones.
  virtual void before_step(const execution_space &space) = 0;
  /// After the optimizer updated the parameters.
  virtual void after_step(const execution_space &space) { (void)space; }
  /// Epoch `epoch` (1-based) of `epochs` starts; it has `steps` steps on every process, of
  /// which `first` (> 0 in a resumed epoch) are done already.
  virtual void begin_epoch(const execution_space &space, std::int64_t epoch, std::int64_t epochs,
                           std::size_t steps, std::size_t first) {
    (void)space;
    (void)epoch;
    (void)epochs;
    (void)steps;
    (void)first;
  }
  /// The epoch's last step is done: complete whatever is in flight.
  virtual void end_epoch(const execution_space &space) { (void)space; }
  /// The epoch's summary (its mean training loss is over all processes): a sync may adapt
  /// to it and add metrics and a note.
  virtual void on_epoch_end(EpochSummary &summary) { (void)summary; }
  /// What it does and how it is configured, for logs.
  virtual std::string summary() const { return name(); }
  /// What was communicated since the last reset_stats().
  virtual SyncStats sync_stats() const { return {}; }
  /// Starts counting sync_stats() anew (the trainer calls it at the start of every epoch).
  virtual void reset_stats() {}
  /// State a checkpoint must hold to continue bit-identically (kat/core/state.hpp).
  virtual StateDict state_dict() const { return {}; }
  /// Restores state_dict(). @throws StateError on entries this object does not expect.
  virtual void load_state_dict(const StateDict &state) {
    state.require_names("kat::train::GradientSync(" + name() + ")::load_state_dict", {});
  }
};

} // namespace kat::train
