#pragma once
/// @file
/// @brief kat::sparse::AGENTProbe: runs an AGENT gradient correction inside a Trainer, with
/// a second copy of the network (the probe) that evaluates batches at other parameters.

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/data/data_loader.hpp"
#include "kat/nn/sequential.hpp"
#include "kat/nn/softmax_cross_entropy.hpp"
#include "kat/sparse/agent.hpp"
#include "kat/train/callback.hpp"
#include "kat/train/trainer.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::sparse {

/// The Trainer's side of AGENT (kat/sparse/agent.hpp): a Callback that
///
///   - at the start of every epoch (not of an epoch resumed in its middle, whose snapshot the
///     checkpoint restored) calls AGENT::refresh() over `refresh_loader`'s batches, this
///     process's share of the training set, evaluated with the probe: each batch's local
///     gradient at θ and its loss at θ and at the previous snapshot;
///   - sets AGENT's batch evaluator to the Trainer's current batch (Trainer::batch_inputs()),
///     evaluated with the probe and then averaged over the processes by `average`, as the
///     step's gradient is.
///
/// The probe is a second network of the same architecture: evaluating it never disturbs the
/// trained model (its gradients, the activations K-FAC recorded, batch-norm statistics).
/// Its parameters are overwritten by every evaluation. The AGENT itself is a gradient
/// transform: add it to the Trainer before any preconditioner (correct, then precondition).
///
/// Cost: each step one more forward and backward (the probe at θ̃), each epoch one gradient
/// pass over the data and, from the second epoch, one forward pass.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class AGENTProbe : public train::Callback<Scalar, MemorySpace> {
public:
  /// Where the probe's passes run.
  using execution_space = typename MemorySpace::execution_space;
  /// A flat n-vector (parameters, gradients).
  using vector_type = kat::Vector<Scalar, MemorySpace>;
  /// The probe network's type.
  using model_type = nn::Sequential<Scalar, MemorySpace>;
  /// A batch: batch x features, column-major.
  using matrix_type = typename model_type::matrix_type;
  /// A batch's class labels.
  using label_vector = kat::Vector<std::int32_t, MemorySpace>;
  /// The loader of the refresh pass.
  using loader_type = data::DataLoader<Scalar, MemorySpace>;
  /// The Trainer this callback is added to.
  using trainer_type = train::Trainer<Scalar, MemorySpace>;
  /// The correction the probe serves.
  using agent_type = AGENT<Scalar, MemorySpace>;
  /// Replaces a gradient (length n) by its mean over the processes; empty on one process.
  using Average = std::function<void(const execution_space &, const vector_type &)>;

  /// @param agent          the correction, also added to the Trainer as a transform
  /// @param probe          a compiled network of the trained model's architecture
  /// @param refresh_loader this process's training samples for the refresh pass (its own
  ///                       loader, not the Trainer's, whose order and position it would
  ///                       disturb); `refresh_order`, when not empty, is passed to its
  ///                       start_epoch() (a shard of the training set)
  /// @param refresh_order  passed to refresh_loader's start_epoch() when not empty
  /// @param average        the mean over the processes of a gradient (empty: one process)
  /// @throws ValueError if agent is null; ShapeError if the probe's parameter count is not
  ///   agent->size().
  AGENTProbe(std::shared_ptr<agent_type> agent, model_type &probe, loader_type &refresh_loader,
             std::vector<std::size_t> refresh_order = {}, Average average = {})
      : agent_(std::move(agent)), probe_(&probe), loader_(&refresh_loader),
        order_(std::move(refresh_order)), average_(std::move(average)) {
    if (!agent_) {
      throw ValueError("kat::sparse::AGENTProbe: agent must not be null");
    }
    kat::detail::require_extent("kat::sparse::AGENTProbe", "probe.parameter_count()",
                                agent_->size(), probe.parameter_count());
  }

  std::string name() const override { return "agent_probe"; }
  /// The correction this probe evaluates batches for.
  const std::shared_ptr<agent_type> &agent() const { return agent_; }
  /// Host seconds of the last refresh pass (fenced).
  double refresh_seconds() const { return refresh_seconds_; }

  /// The mean loss of batch (x, y) at `params` and, when grads is not empty, its gradient
  /// (overwriting grads, length n), averaged over the processes when `averaged`. Uses the
  /// probe, in the training mode it is in (on_epoch_begin() sets training mode).
  double evaluate(const execution_space &space, const vector_type &params, const vector_type &grads,
                  const matrix_type &x, const label_vector &y, bool averaged) {
    kat::ScopedRegion region("kat::sparse::AGENTProbe::evaluate");
    Kokkos::deep_copy(space, probe_->parameters(), params);
    const auto &logits = probe_->forward(space, x);
    if (grads.extent(0) == 0) {
      return loss_.forward(space, logits, y);
    }
    const auto dlogits = dlogits_.matrix(x.extent(0), logits.extent(1));
    const double loss = loss_.forward_backward(space, logits, y, dlogits);
    probe_->backward(space, dlogits, model_type::Gradients::overwrite);
    Kokkos::deep_copy(space, grads, probe_->gradients());
    if (averaged && average_) {
      average_(space, grads);
    }
    return loss;
  }

  /// The refresh pass: AGENT::refresh() over the refresh loader's batches at `params`.
  void refresh(const execution_space &space, const vector_type &params,
               const train::ProcessGroup &group) {
    const auto t0 = std::chrono::steady_clock::now();
    if (order_.empty()) {
      loader_->start_epoch(0);
    } else {
      loader_->start_epoch(0, order_);
    }
    agent_->refresh(
        space, params,
        [&](const typename agent_type::BatchVisitor &visit) {
          matrix_type x;
          label_vector y;
          while (loader_->next(space, x, y)) {
            visit([&](const vector_type &p,
                      const vector_type &g) { return evaluate(space, p, g, x, y, false); },
                  x.extent(0));
          }
        },
        group);
    space.fence();
    refresh_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Callback
  /// Gives the AGENT a batch evaluator that runs the probe on the Trainer's current batch.
  void on_train_begin(trainer_type &trainer) override {
    trainer_type *t = &trainer;
    agent_->set_batch_evaluator([this, t](const vector_type &p, const vector_type &g) {
      return evaluate(t->space(), p, g, t->batch_inputs(), t->batch_labels(), true);
    });
  }
  /// Runs the refresh pass over refresh_loader at the current parameters, in training mode
  /// (skipped when resuming inside an epoch whose snapshot the checkpoint holds).
  void on_epoch_begin(trainer_type &trainer) override {
    if (trainer.position().batch == 0 || agent_->refreshes() == 0) {
      probe_->train(); // the step's mode: dropout and batch statistics as in training
      refresh(trainer.space(), trainer.model().parameters(), trainer.process_group());
    } else {
      refresh_seconds_ = 0; // resumed inside the epoch: the checkpoint holds its snapshot
    }
  }
  /// Adds τ and the refresh seconds to the epoch's note and metrics ("agent_tau",
  /// "agent_refresh_s").
  void on_epoch_end(trainer_type &trainer, train::EpochSummary &summary) override {
    (void)trainer;
    char note[96];
    std::snprintf(note, sizeof note, "  AGENT tau %.4f, refresh %.3f s", agent_->tau(),
                  refresh_seconds_);
    summary.note += note;
    summary.metrics.push_back({"agent_tau", agent_->tau(), 6});
    summary.metrics.push_back({"agent_refresh_s", refresh_seconds_, 4});
  }
  /// Removes the batch evaluator, which points at the Trainer.
  void on_train_end(trainer_type &trainer) override {
    (void)trainer;
    agent_->set_batch_evaluator({}); // it points at the trainer
  }

private:
  std::shared_ptr<agent_type> agent_;
  model_type *probe_;
  loader_type *loader_;
  std::vector<std::size_t> order_;
  Average average_;
  nn::SoftmaxCrossEntropy<Scalar, MemorySpace> loss_;
  Workspace<Scalar, MemorySpace> dlogits_{"kat::sparse::AGENTProbe::dlogits"};
  double refresh_seconds_ = 0;
};

} // namespace kat::sparse
