#pragma once
// kat_train's plumbing: one Run that the command line fills, and the Components that each
// method (model, optimizer, preconditioner, sparse training, distributed strategy, output)
// registers from its own file. examples/train.cpp only walks the phases below; adding a
// method is one new file in examples/train/ with one registration, and touches no shared list.
//
// Phases, each run over the components in their order (Component::order):
//   add_flags          declare the component's command-line flags
//   check              refuse bad combinations after parsing (CLI::ValidationError)
//   setup_processes    MPI: communicators and process roles, before Kokkos starts
//   prepare            with the data loaded: what the model needs (run.make_model)
//   model_ready        the model is built and compiled
//   serve              a rank that does not train (DHO2's curvature ranks) works here; true
//                      ends the run for it
//   make_optimizer     the optimizer (one component sets run.optimizer)
//   attach             transforms, gradient syncs, callbacks and metrics columns, in order
//   describe           the start-up lines (rank 0)
//   start              just before training (resume)
#include <kat/core/error.hpp>
#include <kat/core/hyperparameter.hpp>
#include <kat/data/data_loader.hpp>
#include <kat/data/dataset.hpp>
#include <kat/distributed/data_parallel/distributed_sampler.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/vit_options.hpp>
#include <kat/optim/optimizer.hpp>
#include <kat/train/callback.hpp>
#include <kat/train/gradient_transform.hpp>
#include <kat/train/process_group.hpp>
#include <kat/train/registry.hpp>
#include <kat/train/trainer.hpp>

#include <CLI/CLI.hpp>
#ifdef KAT_ENABLE_MPI
#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/fosi/dho2_overlap.hpp>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kat_train {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Scalar = float;
using Model = kat::nn::Sequential<Scalar, Mem>;
using Trainer = kat::train::Trainer<Scalar, Mem>;
using Config = kat::train::Config;
using Opt = kat::train::OptionSpec;

/// A registered option as a flag: its text (the default until given), the flag, and the
/// registry ("optimizer", "schedule", a component's name) that declared it first.
struct Flag {
  std::string name, value;
  CLI::Option *option = nullptr;
  std::string owner;
  /// Whether the flag was given on the command line.
  bool given() const { return option != nullptr && option->count() > 0; }
};

/// What an optimizer registration builds: the optimizer, the schedule it steps with (from the
/// base rate it chose), gradient transforms, callbacks and their metrics columns.
struct Setup {
  const Config &config;
  Model &model;
  std::function<kat::Hyperparameter<double>(double base_lr)> schedule_from;
  kat::train::ProcessGroup &group;
#ifdef KAT_ENABLE_MPI
  kat::distributed::Communicator *comm = nullptr;      // for distributed K-FAC; null on one rank
  kat::distributed::Communicator *node_comm = nullptr; // this rank's node (K-FAC with DASO)
  const kat::distributed::DHO2Roles *dho2_roles = nullptr; // DHO2 with curvature ranks
#endif
  const kat::data::Dataset &train_set; // FOSI's curvature batch comes from it
  std::size_t local_batch;
  std::uint64_t seed;
  bool profile;
  // What the optimizer is built for: the model's parameter count, or with DHO2 this rank's
  // slice of the parameters (its base optimizer's state is sharded).
  std::size_t parameters = model.parameter_count();
  std::unique_ptr<kat::optim::Optimizer<Scalar, Mem>> optimizer{};
  kat::Hyperparameter<double> lr = 0.0;
  std::vector<std::shared_ptr<kat::train::GradientTransform<Scalar, Mem>>> transforms{};
  std::vector<std::shared_ptr<kat::train::Callback<Scalar, Mem>>> callbacks{};
  std::vector<std::string> columns{}; // the callbacks' metrics columns
  std::string description{}; // what the start-up line calls the optimizer, if not its name()
};

/// The optimizers, each registered from its own file (OptimizerRegistration).
using Optimizers = kat::train::Registry<std::function<void(Setup &)>>;
Optimizers &optimizers();

/// Registers an optimizer from a file's static initialization. `order` sorts the entries
/// (the registry lists them, and --help shows them, in that order, whatever the link order).
struct OptimizerRegistration {
  OptimizerRegistration(int order, std::string name, std::string help, std::vector<Opt> options,
                        std::function<void(Setup &)> make);
};

class Component;

/// Everything one kat_train run knows; the components read and fill it.
struct Run {
  Run(int argc_, char **argv_);
  ~Run();
  Run(const Run &) = delete;
  Run &operator=(const Run &) = delete;

  int argc;
  char **argv;
  CLI::App app{"Train a network on Fashion-MNIST with KAT (Kokkos Accelerated Training).\n"
               "Kokkos flags such as --kokkos-num-threads=N are accepted as well."};
  std::deque<Flag> flags; // registered options (add_options); a deque: their CLI options
                          // keep references to the values, which push_back leaves in place
  Config config;          // their values, once parsed
  std::vector<std::unique_ptr<Component>> parts; // this run's components, in their order

  // The processes: every rank (world) and the ranks that train together (group).
  kat::train::ProcessGroup *world = nullptr;
  kat::train::ProcessGroup *group = nullptr;
  std::unique_ptr<kat::train::ProcessGroup> train_group; // group, when not the world's
#ifdef KAT_ENABLE_MPI
  kat::distributed::Communicator *comm = nullptr;        // every rank
  kat::distributed::Communicator *train_comm = nullptr;  // the training ranks (group's)
  std::optional<kat::distributed::DHO2Roles> dho2_roles; // DHO2 with curvature ranks
  std::string threads;                                   // the thread budget's line
  // Every communicator the training uses (what crosses the nodes is summed over them).
  std::vector<const kat::distributed::Communicator *> communicators;
#endif
  int curvature_ranks = 0; // ranks that do not train (DHO2's --dho2-curvature-ranks)
  int tensor_parallel = 1; // ranks per tensor-parallel replica

  // The basic flags (examples/train.cpp).
  std::string data_dir;
  int epochs = 10, batch_size = 128;
  std::uint64_t seed = 0;
  std::size_t train_subset = 0;
  bool root = true;                   // rank 0: prints and writes --metrics
  bool profile = false;               // --profile (output.cpp)
  std::string checkpoint_dir;         // --checkpoint-dir (output.cpp)
  std::int64_t checkpoint_every = 0;  // --checkpoint-every (output.cpp)
  std::string optimizer_name = "sgd"; // --optimizer (optimizers.cpp)

  // The data.
  std::optional<kat::data::Dataset> train_set, test_set;
  double load_seconds = 0;
  std::size_t local_batch = 0;
  std::unique_ptr<kat::data::DataLoader<Scalar, Mem>> train_loader, test_loader;
  std::optional<kat::distributed::DistributedSampler> sampler;

  // The model: make_model builds one uncompiled (model.cpp; tensor parallelism wraps it),
  // configure adjusts a compiled one (the convolution backend); new_model does both.
  std::string model_name = "mlp", model_id;
  kat::nn::models::VitOptions vit; // --vit-* (model.cpp); vit_patch is --vit-patch's text
  std::string vit_patch = "7";
  std::function<Model()> make_model;
  std::function<void(Model &)> configure;
  std::optional<Model> model;
  Model new_model(const Space &space) const;

  // The training.
  std::optional<Setup> setup;
  std::unique_ptr<Trainer> trainer;
  std::vector<std::string> columns; // extra metrics columns, in the order the callbacks add them
  // What a checkpoint must match to resume this run (Trainer::set_identity); components add
  // their keys in attach.
  std::vector<std::pair<std::string, std::string>> identity;

  /// Frees everything that holds Kokkos memory (the trainer, the model, the loaders, the
  /// components' state), so that Kokkos can be finalized while the Run lives on.
  void release();

  /// The flag `name`. @throws kat::ValueError if no component declared it.
  const Flag &flag(const std::string &name) const;
  /// The flag `name`, or nullptr.
  const Flag *find_flag(const std::string &name) const;
  /// Offers `options` as flags of `app` in a group `title` (once per name; an option that
  /// several callers declare with choices accepts all of them). `owner` names who declared it.
  void add_options(const std::string &owner, const std::string &title, const std::string &help,
                   const std::vector<Opt> &options);
};

/// Adds the integer flag `name` ("--epochs") bound to `target`: the text is parsed as a signed
/// 64-bit integer, refused outside [lo, hi] (both printed by --help and in the error), and only
/// then converted to T, so "-1" never wraps to a huge unsigned number.
template <class T>
CLI::Option *add_integer(CLI::App &app, const std::string &name, T &target, std::int64_t lo,
                         std::int64_t hi, const std::string &help) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return app
      .add_option_function<std::int64_t>(
          name,
          [&target, name, lo, hi, range](const std::int64_t &v) {
            if (v < lo || v > hi) {
              throw CLI::ValidationError(name, "must be an integer in " + range + ", got " +
                                                   std::to_string(v));
            }
            target = static_cast<T>(v);
          },
          help + " (an integer in " + range + ")")
      ->default_str(std::to_string(target));
}

/// Offers every option of `registry`'s entries as flags, in a group per entry; an option that
/// several entries declare with choices (--dist-strategy) accepts all of them, and each entry
/// checks the value it gets.
template <class R> void add_registry(Run &run, const R &registry) {
  std::map<std::string, std::vector<std::string>> choices;
  for (const auto &e : registry.entries()) {
    for (const auto &o : e.options) {
      auto &all = choices[o.name];
      for (const auto &c : o.choices) {
        if (std::find(all.begin(), all.end(), c) == all.end()) {
          all.push_back(c);
        }
      }
    }
  }
  for (const auto &e : registry.entries()) {
    auto options = e.options;
    for (auto &o : options) {
      o.choices = choices[o.name];
    }
    run.add_options(registry.what(), e.name, e.help, options);
  }
}

/// Whether --dist-strategy daso was chosen (DASO is the gradient sync; the optimizer runs on
/// every rank as on one).
inline bool daso(const Config &c) {
  return c.has("dist-strategy") && c.text("dist-strategy") == "daso";
}

/// One part of kat_train: the phases (see the top of this file) it takes part in.
class Component {
public:
  virtual ~Component() = default;
  virtual void add_flags(Run &) {}
  virtual void check(Run &) {}
  virtual void setup_processes(Run &) {}
  virtual void prepare(Run &) {}
  virtual void model_ready(Run &, const Space &) {}
  virtual bool serve(Run &, const Space &) { return false; }
  virtual void make_optimizer(Run &) {}
  virtual void attach(Run &, const Space &) {}
  virtual void describe(Run &) {}
  virtual void start(Run &) {}
};

/// Registers a component from a file's static initialization: each Run makes one with
/// `make`, and `order` places it among the others (flags, checks and callbacks follow it,
/// whatever the link order).
struct ComponentRegistration {
  ComponentRegistration(int order, std::function<std::unique_ptr<Component>()> make);
};

/// Registers component type C (default-constructible) at `order`. A file names its
/// registration after its component (`const auto sparse_training = register_component<...>`):
/// unity builds (KAT_UNITY_BUILD) put several files' anonymous namespaces in one unit.
template <class C> ComponentRegistration register_component(int order) {
  return ComponentRegistration(order, [] { return std::make_unique<C>(); });
}

} // namespace kat_train
