// kat_train: trains a network on Fashion-MNIST (or MNIST) with KAT.
//
//   kat_train --model mlp --optimizer sgd --lr 0.05 --momentum 0.9 --epochs 10
//
// A thin shell over components (examples/train/run.hpp): each method registers its flags,
// checks and construction from its own file in examples/train/ (models, optimizers, K-FAC,
// FOSI and DHO2, sparse training and AGENT, data parallelism and DASO, tensor parallelism,
// emulated nodes, metrics and checkpoints). This file holds the basic flags, loads the data and
// walks the phases. The training itself is kat::train::Trainer.
//
// Built with -DKAT_ENABLE_MPI=ON, `mpirun -n P kat_train ...` trains data-parallel
// (kat::distributed::DataParallel): --batch-size is the global batch; see docs/distributed.md.
// Kokkos options (--kokkos-num-threads=N, ...) are passed on to Kokkos.
#include "stdout_check.hpp"
#include "train/run.hpp"

#include <kat/data/dataset.hpp>
#include <kat/version.hpp>
#ifdef KAT_ENABLE_MPI
#include <kat/distributed/comm/mpi_environment.hpp>
#include <kat/distributed/comm/process_group.hpp>
#include <kat/distributed/comm/thread_budget.hpp>
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <optional>
#include <string>

namespace kat_train {
namespace {

// What --version prints: KAT's version and what this kat_train was built with.
std::string version_text() {
  const int k = KOKKOS_VERSION; // major * 10000 + minor * 100 + patch
  std::string text = std::string("kat_train (KAT) ") + KAT_VERSION_STRING + "\nKokkos " +
                     std::to_string(k / 10000) + "." + std::to_string(k / 100 % 100) + "." +
                     std::to_string(k % 100) + ", " + Space::name() + " backend";
#ifdef KAT_ENABLE_MPI
  text += ", MPI";
#endif
#ifdef KAT_ENABLE_ONEDNN
  text += ", oneDNN";
#endif
  return text;
}

// The flags every run has: the data, the batch, the epochs, the seed.
class Basics : public Component {
public:
  void add_flags(Run &r) override {
    r.app.set_version_flag("--version", version_text());
    r.data_dir = kat::data::default_fashion_mnist_dir;
    r.app.add_option("--data-dir", r.data_dir, "Directory with the IDX files (raw or .gz)")
        ->capture_default_str();
    add_integer(r.app, "--epochs", r.epochs, 1, 1000000, "Passes over the training set");
    add_integer(r.app, "--batch-size", r.batch_size, 1, 1 << 20,
                "Samples per step (with MPI: the global batch)");
    add_integer(r.app, "--seed", r.seed, 0, std::numeric_limits<std::int64_t>::max(),
                "Seed for initialization and shuffling");
    add_integer(r.app, "--train-subset", r.train_subset, 0, std::int64_t(1) << 32,
                "Train on the first N images only (0: all)");
  }

  // Flags that only mean something with another (output.cpp registers them).
  void check(Run &r) override {
    for (const char *name : {"--checkpoint-every", "--keep-checkpoints"}) {
      const CLI::Option *o = r.app.get_option_no_throw(name);
      if (o != nullptr && o->count() > 0 && r.checkpoint_dir.empty()) {
        throw CLI::ValidationError(name, "needs --checkpoint-dir (where the checkpoints go)");
      }
    }
  }
};
const auto basics = register_component<Basics>(0);

#ifndef KAT_ENABLE_MPI
// --tensor-parallel needs several ranks: in a build without MPI it is known but refused.
class NoTensorParallel : public Component {
public:
  void add_flags(Run &r) override {
    add_integer(r.app, "--tensor-parallel", t_, 1, 1 << 16,
                "vit: ranks per tensor-parallel replica (needs a build with -DKAT_ENABLE_MPI=ON)");
  }
  void check(Run &) override {
    if (t_ != 1) {
      throw CLI::ValidationError("--tensor-parallel", "needs MPI, and this kat_train was built "
                                                      "without it (-DKAT_ENABLE_MPI=OFF)");
    }
  }

private:
  int t_ = 1;
};
const auto no_tensor_parallel = register_component<NoTensorParallel>(50);
#endif

// Parses the command line and runs every component's checks; the batch is checked last, when
// the components have said how many ranks train.
void parse(Run &run) {
  run.app.allow_extras(); // --kokkos-* go on to Kokkos
  run.app.parse(run.argc, run.argv);
  for (const auto &extra : run.app.remaining()) {
    if (extra.rfind("--kokkos-", 0) != 0) {
      throw CLI::ExtrasError({extra});
    }
  }
  for (const auto &f : run.flags) {
    if (!f.value.empty()) {
      run.config.set(f.name, f.value);
    }
  }
  for (auto &c : run.parts) {
    c->check(run);
  }
  const int training_ranks = (run.world->size() - run.curvature_ranks) / run.tensor_parallel;
  if (training_ranks > 1 && run.batch_size % training_ranks != 0) {
    throw CLI::ValidationError("--batch-size", "is the global batch and must be divisible by " +
                                                   std::to_string(training_ranks) +
                                                   " training ranks");
  }
}

void load_data(Run &run) {
  const auto t0 = std::chrono::steady_clock::now();
  run.train_set = kat::data::load_fashion_mnist(run.data_dir, kat::data::Split::train);
  run.test_set = kat::data::load_fashion_mnist(run.data_dir, kat::data::Split::test);
  if (run.train_subset > 0) {
    run.train_set = run.train_set->take(std::min(run.train_subset, run.train_set->size()));
  }
  run.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto &group = *run.group;
  run.local_batch = static_cast<std::size_t>(run.batch_size / group.size());
  run.train_loader = std::make_unique<kat::data::DataLoader<Scalar, Mem>>(
      *run.train_set, run.local_batch, true, run.seed);
  run.test_loader =
      std::make_unique<kat::data::DataLoader<Scalar, Mem>>(*run.test_set, 1000, false, 0);
  run.sampler.emplace(run.train_set->size(), group.rank(), group.size(), run.seed);
}

// The start-up lines: the run, the model, the optimizer, then what each component adds.
void describe(Run &run, const Space &space) {
  std::printf("KAT %s on %s (concurrency %d); data %s (%zu train, %zu test, loaded in %.2f s)\n",
              run.model_name.c_str(), Space::name(), space.concurrency(), run.data_dir.c_str(),
              run.train_set->size(), run.test_set->size(), run.load_seconds);
#ifdef KAT_ENABLE_MPI
  if (!run.threads.empty()) {
    std::printf("%s\n", run.threads.c_str());
  }
#endif
  const Setup &s = *run.setup;
  std::printf("%s\noptimizer %s%s, lr %g, batch %d, %d epochs, seed %llu\n",
              run.model->summary().c_str(), s.transforms.empty() ? "" : "K-FAC + ",
              s.description.empty() ? s.optimizer->name().c_str() : s.description.c_str(),
              s.optimizer->lr(), run.batch_size, run.epochs,
              static_cast<unsigned long long>(run.seed));
  for (const auto &t : s.transforms) {
    std::printf("%s\n", t->summary().c_str());
  }
  for (auto &c : run.parts) {
    c->describe(run);
  }
}

// Flushes stdout. @throws kat::IOError if this or an earlier write to it failed (a full disk,
// >/dev/full): a run whose report was lost must not end as a success.
void check_stdout() {
  const std::string error = kat_examples::stdout_error();
  if (!error.empty()) {
    throw kat::IOError("writing standard output: " + error);
  }
}

// The --kokkos-* flags given, space-separated.
std::string kokkos_flags(const Run &run) {
  std::string flags;
  for (const auto &f : run.app.remaining()) {
    flags += (flags.empty() ? "" : " ") + f;
  }
  return flags;
}

// Everything after parsing, on a running Kokkos: returns the exit code.
int train(Run &run, const Space &space) {
  load_data(run);
  for (auto &c : run.parts) {
    c->prepare(run);
  }
  run.model.emplace(run.new_model(space));
  for (auto &c : run.parts) {
    c->model_ready(run, space);
  }
  for (auto &c : run.parts) {
    if (c->serve(run, space)) {
      check_stdout();
      return 0;
    }
  }
  for (auto &c : run.parts) {
    c->make_optimizer(run);
  }
  run.trainer = std::make_unique<Trainer>(*run.model, *run.setup->optimizer, *run.train_loader);
  run.trainer->set_lr(run.setup->lr);
  run.trainer->set_test_loader(run.test_loader.get());
  run.identity = {{"model", run.model_id},
                  {"optimizer", run.optimizer_name},
                  {"seed", std::to_string(run.seed)},
                  {"batch_size", std::to_string(run.batch_size)},
                  {"ranks", std::to_string(run.group->size())}};
  for (auto &c : run.parts) {
    c->attach(run, space);
  }
  run.trainer->set_identity(run.identity);
  if (run.root) {
    describe(run, space);
  }
  for (auto &c : run.parts) {
    c->start(run);
  }
  check_stdout();
  run.trainer->fit(space, run.epochs);
  check_stdout();
  return 0;
}

} // namespace
} // namespace kat_train

int main(int argc, char **argv) {
  using namespace kat_train;
#ifdef KAT_ENABLE_MPI
  kat::distributed::MPIEnvironment mpi(argc, argv);
  auto comm = kat::distributed::Communicator::world();
  kat::distributed::MPIProcessGroup world(comm);
#else
  kat::train::ProcessGroup world;
#endif
  Run run(argc, argv);
  run.world = run.group = &world;
  run.root = world.rank() == 0; // only rank 0 prints and writes --metrics
  try {
    for (auto &c : run.parts) {
      c->add_flags(run);
    }
    parse(run);
#ifdef KAT_ENABLE_MPI
    run.comm = run.train_comm = &comm;
    run.threads = kat::distributed::apply_thread_budget(argc, argv, comm);
#endif
    for (auto &c : run.parts) {
      c->setup_processes(run);
    }
#ifdef KAT_ENABLE_MPI
    run.communicators.push_back(run.train_comm);
    if (run.train_comm != &comm) {
      run.train_group = std::make_unique<kat::distributed::MPIProcessGroup>(*run.train_comm);
      run.group = run.train_group.get();
    }
#endif
    std::optional<Kokkos::ScopeGuard> kokkos;
    try {
      kokkos.emplace(argc, argv);
    } catch (const std::exception &e) { // e.g. std::stoi's bare "stoi" on --kokkos-threads=abc
      throw kat::ValueError(std::string("Kokkos cannot read its flags (") + kokkos_flags(run) +
                            "): " + e.what());
    }
    struct Release { // before Kokkos finalizes, also when something throws
      Run &run;
      ~Release() { run.release(); }
    } release{run};
    return train(run, Space());
  } catch (const CLI::ParseError &e) { // thrown by parse() on every rank alike
    // --help and the like exit 0; a usage error exits 2 (CLI11's own codes are 101 to 127).
    const int code = run.root ? run.app.exit(e) : e.get_exit_code();
    const std::string lost = code == 0 ? kat_examples::stdout_error() : ""; // --help, full disk
    if (!lost.empty()) {
      std::fprintf(stderr, "kat_train: error: writing standard output: %s\n", lost.c_str());
      return 1;
    }
    return code == 0 ? 0 : 2;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "kat_train: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kat_train: error: an exception of unknown type\n");
  }
#ifdef KAT_ENABLE_MPI
  if (world.size() > 1) { // the other ranks may be waiting in a collective
    std::fprintf(stderr, "kat_train: rank %d of %d aborts\n", world.rank(), world.size());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#endif
  return 1;
}
