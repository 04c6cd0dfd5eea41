#pragma once
/// @file
/// @brief Step callbacks: code that runs at fixed points of training (schedules, mask
/// updates, curvature refreshes, checkpoints, metrics, progress).

#include "kat/core/state.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kat::train {

template <class Scalar, class MemorySpace> class Trainer;

/// Where a training run stands between two steps. A run stopped at a Position and resumed
/// from it continues exactly as if it had not stopped.
struct Position {
  std::int64_t step = 0;  ///< optimizer steps so far (the index of the next step)
  std::int64_t epoch = 1; ///< the epoch in progress, 1-based
  std::int64_t batch = 0; ///< batches of it done on this process
  double loss_sum = 0;    ///< this epoch's summed training loss so far (this process's)
  std::uint64_t seen = 0; ///< this epoch's training samples so far (this process's)
};

/// One number a callback adds to an epoch's summary (a metrics column).
struct Metric {
  std::string name; ///< a column name: lower case, digits and '_'
  double value = 0; ///< the column's value
  int decimals = 6; ///< digits after the point when written as text
};

/// One finished epoch, summed over the processes. Callbacks that run earlier in
/// on_epoch_end() may add metrics, line notes and extra lines for the ones after them.
struct EpochSummary {
  std::int64_t epoch = 0;         ///< 1-based
  double wall_seconds = 0;        ///< the training part of the epoch (evaluation excluded)
  double samples_per_second = 0;  ///< training samples of all processes per wall second
  double train_loss = 0;          ///< mean training loss over the epoch's samples
  double test_loss = 0;           ///< mean test loss (0 without a test set)
  double test_accuracy = 0;       ///< fraction in [0, 1] (0 without a test set)
  double lr = 0;                  ///< the learning rate of the epoch's last step
  std::vector<Metric> metrics;    ///< more columns (a profile's)
  std::string note;               ///< appended to the epoch's console line
  std::vector<std::string> lines; ///< printed after the epoch's console line
};

/// A step callback: hooks at fixed points of Trainer::fit(), in the ensmallen style. Every
/// hook does nothing by default; override the ones needed. Callbacks run in the order they
/// were added. A hook may call Trainer::request_stop() to end training after the current
/// epoch.
///
///     on_train_begin                       once, after a resume was applied
///       on_epoch_begin                     each epoch (also a resumed one)
///         on_step_begin                    each step, before forward
///           on_after_backward              after backward and the gradient sync, before
///                                          the transforms and the optimizer; may call
///                                          Trainer::skip_optimizer_step()
///         on_step_end                      after the optimizer step
///       on_epoch_end                       after the epoch's evaluation
///     on_train_end                         once, also after request_stop()
///
/// Stateful callbacks (a schedule with an internal counter, a sparse mask) return their
/// state from state_dict(); it is saved in checkpoints under "callbacks.<name()>".
template <class Scalar, class MemorySpace> class Callback {
public:
  using trainer_type = Trainer<Scalar, MemorySpace>; ///< the Trainer the hooks are called from

  virtual ~Callback() = default;
  /// A short name for logs and checkpoint entries.
  virtual std::string name() const = 0;
  /// Once at the start of Trainer::fit(), after a resume was applied.
  virtual void on_train_begin(trainer_type &trainer) { (void)trainer; }
  /// At the start of each epoch (also of a resumed one); trainer.position().epoch is its number.
  virtual void on_epoch_begin(trainer_type &trainer) { (void)trainer; }
  /// At the start of each step, before forward; trainer.position().step is its index.
  virtual void on_step_begin(trainer_type &trainer) { (void)trainer; }
  /// After backward and the gradient sync, before the gradient transforms and the optimizer
  /// step: the gradients are final here. May call Trainer::skip_optimizer_step().
  virtual void on_after_backward(trainer_type &trainer) { (void)trainer; }
  /// After the optimizer step.
  virtual void on_step_end(trainer_type &trainer) { (void)trainer; }
  /// After the epoch's evaluation, with its summary; may add metrics, a note or lines to
  /// `summary` for the callbacks after it.
  virtual void on_epoch_end(trainer_type &trainer, EpochSummary &summary) {
    (void)trainer;
    (void)summary;
  }
  /// Once at the end of Trainer::fit(), also after Trainer::request_stop().
  virtual void on_train_end(trainer_type &trainer) { (void)trainer; }
  /// State a checkpoint must hold to continue bit-identically.
  virtual StateDict state_dict() const { return {}; }
  /// Restores state_dict(). @throws StateError on entries this object does not expect.
  virtual void load_state_dict(const StateDict &state) {
    state.require_names("kat::train::Callback(" + name() + ")::load_state_dict", {});
  }
};

} // namespace kat::train
