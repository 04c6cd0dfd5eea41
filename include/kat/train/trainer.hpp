#pragma once
/// @file
/// @brief kat::train::Trainer: runs epochs of training steps composed of the step's roles.

#include "kat/core/error.hpp"
#include "kat/core/hyperparameter.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/data/data_loader.hpp"
#include "kat/nn/metrics.hpp"
#include "kat/nn/sequential.hpp"
#include "kat/nn/softmax_cross_entropy.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/train/callback.hpp"
#include "kat/train/gradient_sync.hpp"
#include "kat/train/gradient_transform.hpp"
#include "kat/train/process_group.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::train {

/// The test set's loss and accuracy, summed over the processes.
struct Evaluation {
  double loss_sum = 0;       ///< summed per-sample cross-entropy
  std::uint64_t correct = 0; ///< correctly classified samples
  std::uint64_t samples = 0; ///< samples evaluated
  /// The mean per-sample loss (0 without samples).
  double loss() const { return samples > 0 ? loss_sum / static_cast<double>(samples) : 0.0; }
  /// The fraction of samples classified correctly, in [0, 1] (0 without samples).
  double accuracy() const {
    return samples > 0 ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0;
  }
};

/// Trains a classifier (a kat::nn::Sequential ending in logits, softmax cross-entropy with
/// integer labels) by composing the roles of a training step. One step, in order:
///
///     callbacks' on_step_begin
///     model.forward → loss → model.backward   (GradientSync::on_gradients_ready per layer)
///     GradientSync::before_step               (the gradients agree over the processes)
///     callbacks' on_after_backward            (sparse masks: mask updates, masked gradients)
///     each GradientTransform::transform       (in the order added: preconditioners, ...)
///     Optimizer::set_lr(lr(step)), Optimizer::step
///                                             (both skipped when a callback called
///                                             skip_optimizer_step(); the step still counts)
///     GradientSync::after_step
///     callbacks' on_step_end                  (progress, checkpoints, mask updates, ...)
///
/// Around each epoch the gradient sync gets begin_epoch() before the first step, end_epoch()
/// after the last (before evaluation) and on_epoch_end() with the summary before the
/// callbacks' on_epoch_end().
///
/// Every role is usable without the Trainer (see docs/guide.md, "A training loop of your
/// own"); the Trainer owns no component, so each must outlive fit(). On several processes
/// (set_process_group()) the loader yields this process's share of each global batch
/// (set_epoch_order() with kat::distributed::DistributedSampler), the test set is split
/// round-robin, and the reported losses and accuracies are summed over the processes.
///
/// The state of a run (state_dict()) holds everything a resumed run needs to continue bit
/// for bit: "model.", "optimizer.", "loader.", "trainer." (the Position and the run's
/// identity), each transform's state under its name(), the gradient sync's under "sync."
/// and each callback's under "callbacks.<name()>." (those that have state).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class Trainer {
public:
  using execution_space = typename MemorySpace::execution_space; ///< where the steps run
  using model_type = nn::Sequential<Scalar, MemorySpace>;        ///< the network trained
  using loader_type = data::DataLoader<Scalar, MemorySpace>;     ///< yields the batches
  using optimizer_type = optim::Optimizer<Scalar, MemorySpace>;  ///< updates the parameters
  /// Makes the gradients agree over the processes.
  using sync_type = GradientSync<Scalar, MemorySpace>;
  /// Rewrites the gradients before the optimizer.
  using transform_type = GradientTransform<Scalar, MemorySpace>;
  using callback_type = Callback<Scalar, MemorySpace>; ///< hooks at fixed points of fit()
  /// The sample order of 0-based epoch e on this process (indices into the training set).
  using EpochOrder = std::function<std::vector<std::size_t>(std::size_t epoch)>;

  /// @param model        compiled; its parameters and gradients are the flat buffers
  /// @param optimizer    built over model.parameters() (same length)
  /// @param train_loader yields this process's training batches
  /// @throws ShapeError if the optimizer's length is not the model's parameter count.
  Trainer(model_type &model, optimizer_type &optimizer, loader_type &train_loader)
      : model_(&model), optimizer_(&optimizer), train_(&train_loader), lr_(optimizer.lr()),
        group_(std::make_shared<ProcessGroup>()) {
    kat::detail::require_extent("kat::train::Trainer", "optimizer.size()", model.parameter_count(),
                                optimizer.size());
  }
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  /// The learning rate of step i, applied with Optimizer::set_lr before the step (default:
  /// the optimizer's rate at construction, constant). kat::optim's schedules are such
  /// Hyperparameters.
  void set_lr(Hyperparameter<double> lr) { lr_ = std::move(lr); }
  /// Makes the gradients agree over the processes (none by default).
  void set_gradient_sync(std::shared_ptr<sync_type> sync) { sync_ = std::move(sync); }
  /// Appends a gradient transform; transforms run in the order added.
  void add_transform(std::shared_ptr<transform_type> transform) {
    require_non_null(transform.get(), "add_transform", "transform");
    transforms_.push_back(std::move(transform));
  }
  /// Appends a callback; callbacks run in the order added.
  void add_callback(std::shared_ptr<callback_type> callback) {
    require_non_null(callback.get(), "add_callback", "callback");
    callbacks_.push_back(std::move(callback));
  }
  /// The test set evaluated after every epoch (none by default: test loss and accuracy 0).
  void set_test_loader(loader_type *test) { test_ = test; }
  /// The processes training together (default: this one alone).
  void set_process_group(std::shared_ptr<const ProcessGroup> group) {
    require_non_null(group.get(), "set_process_group", "group");
    group_ = std::move(group);
  }
  /// Each epoch's sample order on this process (default: the loader's own shuffle).
  void set_epoch_order(EpochOrder order) { order_ = std::move(order); }
  /// Key-value pairs that describe the run ("model", "mlp"): saved in the state and checked
  /// on load, so a checkpoint of another configuration cannot continue this run.
  void set_identity(std::vector<std::pair<std::string, std::string>> identity) {
    identity_ = std::move(identity);
  }

  /// The model given at construction.
  model_type &model() const { return *model_; }
  /// The optimizer given at construction.
  optimizer_type &optimizer() const { return *optimizer_; }
  /// The training loader given at construction.
  loader_type &train_loader() const { return *train_; }
  /// The processes training together.
  const ProcessGroup &process_group() const { return *group_; }
  /// The gradient sync (null: none).
  const std::shared_ptr<sync_type> &gradient_sync() const { return sync_; }
  /// The gradient transforms, in the order they run.
  const std::vector<std::shared_ptr<transform_type>> &transforms() const { return transforms_; }
  /// The learning-rate schedule.
  const Hyperparameter<double> &lr() const { return lr_; }
  /// Where the run stands: during fit() updated after every step; between epochs, batch 0 of
  /// the next epoch.
  const Position &position() const { return position_; }
  /// The last epoch fit() runs to (its argument).
  std::int64_t epochs() const { return epochs_; }
  /// Ends fit() after the current epoch's on_epoch_end().
  void request_stop() { stop_ = true; }
  /// Called from on_after_backward(): this step runs neither the gradient transforms nor the
  /// optimizer (RigL and SET skip the optimizer step at a mask update); position().step still
  /// advances, so learning-rate schedules keep counting steps.
  void skip_optimizer_step() { skip_ = true; }
  /// The batch of the train_step() in progress (inputs, batch x features; labels): for
  /// components that evaluate it again (AGENT's gradient at its snapshot). Empty before the
  /// first step.
  const typename model_type::matrix_type &batch_inputs() const { return batch_x_; }
  /// The labels of that batch (one class index per sample).
  const Vector<std::int32_t, MemorySpace> &batch_labels() const { return batch_y_; }
  /// The execution space of the fit() or train_step() in progress (a default instance
  /// before the first), for callbacks that launch work.
  const execution_space &space() const { return space_; }

  /// Trains until epoch `epochs` (1-based, inclusive) is done, starting from position():
  /// a fresh run at epoch 1, a resumed run inside or after the epoch it was saved in.
  /// @throws ValueError if epochs < 1; whatever a component throws (the model's backward
  ///   hook is removed first).
  void fit(const execution_space &space, std::int64_t epochs) {
    if (epochs < 1) {
      throw ValueError(
          kat::detail::concat("kat::train::Trainer::fit: epochs must be >= 1, got ", epochs));
    }
    epochs_ = epochs;
    stop_ = false;
    space_ = space;
    HookGuard hook(*this, space);
    for (auto &c : callbacks_) {
      c->on_train_begin(*this);
    }
    for (std::int64_t epoch = position_.epoch; epoch <= epochs && !stop_; ++epoch) {
      run_epoch(space, epoch);
    }
    for (auto &c : callbacks_) {
      c->on_train_end(*this);
    }
  }

  /// One training step on the batch (x, y): see the class description. Returns the batch's
  /// mean loss. Advances position().step; fit() also keeps the epoch's counters.
  double train_step(const execution_space &space, const typename model_type::matrix_type &x,
                    const Vector<std::int32_t, MemorySpace> &y) {
    const std::size_t n = x.extent(0);
    space_ = space;
    batch_x_ = x;
    batch_y_ = y;
    const auto &logits = model_->forward(space, x);
    const auto dlogits = dlogits_.matrix(n, logits.extent(1));
    const double loss = loss_.forward_backward(space, logits, y, dlogits);
    model_->backward(space, dlogits, model_type::Gradients::overwrite);
    if (sync_) {
      sync_->before_step(space);
    }
    skip_ = false;
    for (auto &c : callbacks_) {
      c->on_after_backward(*this);
    }
    const double lr = lr_(position_.step++);
    if (!skip_) {
      for (auto &t : transforms_) {
        t->transform(space, model_->parameters(), model_->gradients());
      }
      optimizer_->set_lr(lr);
      optimizer_->step(space, model_->parameters(), model_->gradients());
    }
    skip_ = false;
    if (sync_) {
      sync_->after_step(space);
    }
    return loss;
  }

  /// The test set's loss and accuracy (set_test_loader()), summed over the processes: each
  /// evaluates samples rank, rank + size, ... Collective. The model is in eval() mode during
  /// it and in train() mode after.
  Evaluation evaluate(const execution_space &space) {
    Evaluation e;
    if (test_ == nullptr) {
      return e;
    }
    ScopedRegion region("kat::train::Trainer::evaluate");
    model_->eval();
    if (group_->size() > 1) {
      std::vector<std::size_t> shard;
      for (std::size_t i = static_cast<std::size_t>(group_->rank()); i < test_->size();
           i += static_cast<std::size_t>(group_->size())) {
        shard.push_back(i);
      }
      test_->start_epoch(0, std::move(shard));
    } else {
      test_->start_epoch(0);
    }
    nn::SoftmaxCrossEntropy<Scalar, MemorySpace> ce;
    typename model_type::matrix_type x;
    Vector<std::int32_t, MemorySpace> y;
    double loss_sum = 0;
    std::size_t correct = 0;
    while (test_->next(space, x, y)) {
      const auto &logits = model_->forward(space, x);
      loss_sum += ce.forward(space, logits, y) * static_cast<double>(x.extent(0));
      correct += nn::count_correct(space, logits, Vector<const std::int32_t, MemorySpace>(y));
    }
    model_->train();
    std::vector<double> sums{loss_sum, static_cast<double>(correct),
                             static_cast<double>(test_->epoch_size())};
    group_->sum(sums);
    e.loss_sum = sums[0];
    e.correct = static_cast<std::uint64_t>(sums[1]);
    e.samples = static_cast<std::uint64_t>(sums[2]);
    return e;
  }

  /// The run's state (see the class description). Fences; copies to the host.
  StateDict state_dict() const {
    StateDict s;
    s.merge("model", model_->state_dict());
    s.merge("optimizer", optimizer_->state_dict());
    s.merge("loader", train_->state_dict());
    s.merge("trainer", position_state());
    for (const auto &t : transforms_) {
      s.merge(t->name(), t->state_dict());
    }
    if (sync_) {
      s.merge("sync", sync_->state_dict());
    }
    for (const auto &c : callbacks_) {
      s.merge("callbacks." + c->name(), c->state_dict());
    }
    return s;
  }

  /// Restores state_dict() after checking that the state holds exactly the parts this
  /// trainer's components have and that its identity (set_identity()) is this run's.
  /// `where` starts every error message (a file name, say).
  /// @throws StateError naming the entry that is missing, unexpected, or of another dtype or
  ///   shape; ValueError naming the identity key whose value differs, or a position that is
  ///   not one. The identity and position are checked before anything changes.
  void load_state_dict(const StateDict &state,
                       const std::string &where = "kat::train::Trainer::load_state_dict") {
    // Every part this trainer's components have (a component without state has none).
    std::vector<std::string> parts{"model.", "optimizer.", "loader.", "trainer."};
    for (const auto &t : transforms_) {
      if (!t->state_dict().entries().empty()) {
        parts.push_back(t->name() + ".");
      }
    }
    if (sync_ && !sync_->state_dict().entries().empty()) {
      parts.push_back("sync.");
    }
    for (const auto &c : callbacks_) {
      if (!c->state_dict().entries().empty()) {
        parts.push_back("callbacks." + c->name() + ".");
      }
    }
    state.require_names(where, parts);
    const Position p = checked_position(state.sub("trainer"), where);
    model_->load_state_dict(state.sub("model"));
    optimizer_->load_state_dict(state.sub("optimizer"));
    train_->load_state_dict(state.sub("loader"));
    for (auto &t : transforms_) {
      t->load_state_dict(state.sub(t->name()));
    }
    if (sync_) {
      sync_->load_state_dict(state.sub("sync"));
    }
    for (auto &c : callbacks_) {
      c->load_state_dict(state.sub("callbacks." + c->name()));
    }
    position_ = p;
  }

private:
  // Installs the gradient sync (if any) as the model's backward hook for the duration of
  // fit(); without one, a hook the caller installed is left alone.
  struct HookGuard {
    HookGuard(Trainer &t, const execution_space &space) : model(t.model_) {
      if (auto sync = t.sync_) {
        model->set_backward_hook(
            [sync, space](std::size_t layer) { sync->on_gradients_ready(space, layer); });
        installed = true;
      }
    }
    HookGuard(const HookGuard &) = delete;
    HookGuard &operator=(const HookGuard &) = delete;
    ~HookGuard() {
      if (installed) {
        model->clear_backward_hook();
      }
    }
    model_type *model;
    bool installed = false;
  };

  static void require_non_null(const void *p, const char *member, const char *argument) {
    if (p == nullptr) {
      throw ValueError(kat::detail::concat("kat::train::Trainer::", member, ": ", argument,
                                           " must not be null"));
    }
  }

  void run_epoch(const execution_space &space, std::int64_t epoch) {
    using Clock = std::chrono::steady_clock;
    // A run resumed inside this epoch continues the restored loader's order and position.
    const bool resumed = epoch == position_.epoch && position_.batch > 0;
    if (!resumed) {
      const auto e = static_cast<std::size_t>(epoch - 1);
      if (order_) {
        train_->start_epoch(e, order_(e));
      } else {
        train_->start_epoch(e);
      }
      position_ = {position_.step, epoch, 0, 0.0, 0};
    }
    if (sync_) {
      sync_->reset_stats();
      sync_->begin_epoch(space, epoch, epochs_, train_->batches(),
                         static_cast<std::size_t>(position_.batch));
    }
    group_->barrier(); // the epoch's wall time starts together everywhere
    for (auto &c : callbacks_) {
      c->on_epoch_begin(*this);
    }
    const std::uint64_t seen_at_start = position_.seen; // for the rate of a resumed epoch
    const auto t0 = Clock::now();
    typename model_type::matrix_type x;
    Vector<std::int32_t, MemorySpace> y;
    while (train_->next(space, x, y)) {
      for (auto &c : callbacks_) {
        c->on_step_begin(*this);
      }
      const double loss = train_step(space, x, y);
      position_.loss_sum += loss * static_cast<double>(x.extent(0));
      position_.seen += x.extent(0);
      ++position_.batch;
      for (auto &c : callbacks_) {
        c->on_step_end(*this);
      }
    }
    if (sync_) {
      sync_->end_epoch(space);
    }
    space.fence();
    EpochSummary summary;
    summary.epoch = epoch;
    summary.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const Evaluation test = evaluate(space);
    std::vector<double> train_sums{position_.loss_sum, static_cast<double>(position_.seen),
                                   static_cast<double>(position_.seen - seen_at_start)};
    group_->sum(train_sums);
    summary.train_loss = train_sums[1] > 0 ? train_sums[0] / train_sums[1] : 0.0;
    summary.samples_per_second = train_sums[2] / summary.wall_seconds;
    summary.test_loss = test.loss();
    summary.test_accuracy = test.accuracy();
    summary.lr = optimizer_->lr();
    position_ = {position_.step, epoch + 1, 0, 0.0, 0};
    if (sync_) {
      sync_->on_epoch_end(summary);
    }
    for (auto &c : callbacks_) {
      c->on_epoch_end(*this, summary);
    }
  }

  StateDict position_state() const {
    StateDict s;
    s.set("step", position_.step);
    s.set("epoch", position_.epoch);
    s.set("batch", position_.batch);
    s.set("loss_sum", position_.loss_sum);
    s.set("seen", position_.seen);
    for (const auto &[key, value] : identity_) {
      s.set_text(key, value);
    }
    return s;
  }

  Position checked_position(const StateDict &s, const std::string &where) const {
    std::vector<std::string> names{"step", "epoch", "batch", "loss_sum", "seen"};
    for (const auto &[key, value] : identity_) {
      names.push_back(key);
      const std::string saved = s.text(key);
      if (saved != value) {
        throw ValueError(kat::detail::concat(where, ": the checkpoint was written with ", key, " ",
                                             saved, ", this run has ", key, " ", value));
      }
    }
    s.require_names(where, names);
    Position p;
    p.step = s.get<std::int64_t>("step");
    p.epoch = s.get<std::int64_t>("epoch");
    p.batch = s.get<std::int64_t>("batch");
    p.loss_sum = s.get<double>("loss_sum");
    p.seen = s.get<std::uint64_t>("seen");
    if (p.step < 0 || p.epoch < 1 || p.batch < 0) {
      throw ValueError(kat::detail::concat(where, ": step ", p.step, ", epoch ", p.epoch,
                                           ", batch ", p.batch, " are not a position"));
    }
    return p;
  }

  model_type *model_;
  optimizer_type *optimizer_;
  loader_type *train_;
  loader_type *test_ = nullptr;
  Hyperparameter<double> lr_;
  std::shared_ptr<sync_type> sync_;
  std::vector<std::shared_ptr<transform_type>> transforms_;
  std::vector<std::shared_ptr<callback_type>> callbacks_;
  std::shared_ptr<const ProcessGroup> group_;
  EpochOrder order_;
  std::vector<std::pair<std::string, std::string>> identity_;
  Position position_;
  std::int64_t epochs_ = 0;
  bool stop_ = false;
  bool skip_ = false;
  execution_space space_{};
  typename model_type::matrix_type batch_x_;
  Vector<std::int32_t, MemorySpace> batch_y_;
  nn::SoftmaxCrossEntropy<Scalar, MemorySpace> loss_;
  Workspace<Scalar, MemorySpace> dlogits_{"kat::train::Trainer::dlogits"};
};

} // namespace kat::train
