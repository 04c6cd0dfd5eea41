// Several training ranks (MPI): synchronous data parallelism (kat::distributed::DataParallel),
// or DASO's hierarchical asynchronous scheme (--dist-strategy daso and its options,
// docs/distributed.md), as the trainer's gradient sync, with a distributed sampler.
#include "run.hpp"

#include <kat/distributed/data_parallel/daso.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>

#include <cstdio>

namespace kat_train {
namespace {

class DataParallelism : public Component {
public:
  void add_flags(Run &r) override {
    r.add_options("daso", "daso",
                  "DASO: hierarchical asynchronous data parallelism (--dist-strategy daso, "
                  "docs/distributed.md)",
                  kat::distributed::daso_option_specs());
  }

  void check(Run &r) override {
    const bool daso_chosen = daso(r.config);
    for (const auto &f : r.flags) {
      if (f.given() && f.owner == "daso" && !daso_chosen) {
        throw CLI::ValidationError("--" + f.name, "needs --dist-strategy daso");
      }
    }
    if (daso_chosen && r.checkpoint_every > 0) {
      throw CLI::ValidationError("--checkpoint-every",
                                 "must be 0 with --dist-strategy daso (its parameter sends are in "
                                 "flight inside an epoch; it checkpoints at epoch ends)");
    }
  }

  void attach(Run &r, const Space &space) override {
    auto &trainer = *r.trainer;
    const auto &group = *r.group;
    trainer.set_process_group(
        std::shared_ptr<const kat::train::ProcessGroup>(&group, [](const auto *) {}));
    if (group.size() > 1 && daso(r.config)) {
      auto sync = std::make_shared<kat::distributed::DASO<Scalar, Mem>>(
          *r.train_comm, *r.model, kat::distributed::daso_options(r.config));
      sync->broadcast_parameters(space);
      trainer.set_gradient_sync(sync);
      r.communicators.push_back(&sync->node_communicator());
      r.communicators.push_back(&sync->global_communicator());
      r.columns.insert(r.columns.end(),
                       {"daso_global_skip", "daso_local_skip", "daso_batches_to_wait"});
      if (r.profile) { // DASO's local and global communication, split
        r.columns.insert(r.columns.end(),
                         {"daso_local_bytes", "daso_global_bytes", "daso_internode_bytes",
                          "daso_local_s", "daso_global_s"});
      }
    } else if (group.size() > 1) {
      auto sync =
          std::make_shared<kat::distributed::DataParallel<Scalar, Mem>>(*r.train_comm, *r.model);
      sync->broadcast_parameters(space); // equal seeds give equal models; make sure of it
      trainer.set_gradient_sync(sync);
    }
    if (group.size() > 1) {
      const auto *sampler = &*r.sampler;
      trainer.set_epoch_order([sampler](std::size_t e) { return sampler->indices(e); });
    }
  }

  void describe(Run &r) override {
    if (r.trainer->gradient_sync()) {
      std::printf("%s; global batch %d (%zu per rank), %zu samples per rank and epoch\n",
                  r.trainer->gradient_sync()->summary().c_str(), r.batch_size, r.local_batch,
                  r.sampler->per_rank());
    }
  }
};
const auto data_parallelism = register_component<DataParallelism>(40);

} // namespace
} // namespace kat_train
