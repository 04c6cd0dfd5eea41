// kat_train: trains a network on Fashion-MNIST (or MNIST) with KAT.
//
//   kat_train --model mlp --optimizer sgd --lr 0.05 --momentum 0.9 --epochs 10
//
// A thin command line over registries of components (kat::train::Registry): models,
// optimizers (an optimizer may bring gradient transforms: kfac is K-FAC + SGD), learning-rate
// schedules and, with MPI, distributed K-FAC strategies. Each registration names its options,
// which become flags; adding a method is one registration. The training itself is
// kat::train::Trainer with callbacks for the console, metrics, profiling and checkpoints.
//
// Built with -DKAT_ENABLE_MPI=ON, `mpirun -n P kat_train ...` trains data-parallel
// (kat::distributed::DataParallel): --batch-size is the global batch; see docs/distributed.md.
// Kokkos options (--kokkos-num-threads=N, ...) are passed on to Kokkos.
#include <kat/kat.hpp>

#include <CLI/CLI.hpp>
#ifdef KAT_ENABLE_MPI
#include <kat/plan/plan_io.hpp>
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Scalar = float;
using Model = kat::nn::Sequential<Scalar, Mem>;
using Trainer = kat::train::Trainer<Scalar, Mem>;
using Config = kat::train::Config;
using Opt = kat::train::OptionSpec;

// What an optimizer registration builds: the optimizer, the schedule it steps with (from the
// base rate it chose) and any gradient transforms.
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
  std::string description{}; // what the start-up line calls the optimizer, if not its name()
};

using Optimizers = kat::train::Registry<std::function<void(Setup &)>>;

// Whether --dist-strategy daso was chosen (DASO is the gradient sync; the optimizer runs on
// every rank as on one).
bool daso(const Config &c) { return c.has("dist-strategy") && c.text("dist-strategy") == "daso"; }

// The base rate: --lr, or the optimizer's default.
double base_lr(const Config &c, double fallback) { return c.has("lr") ? c.number("lr") : fallback; }

void make_sgd(Setup &s, bool nesterov = false) {
  kat::optim::SGD<Scalar, Mem>::Options o;
  o.lr = base_lr(s.config, 0.05);
  o.momentum = s.config.number("momentum");
  o.nesterov = nesterov || s.config.flag("nesterov");
  o.weight_decay = s.config.has("weight-decay") ? s.config.number("weight-decay") : 0.0;
  s.optimizer = std::make_unique<kat::optim::SGD<Scalar, Mem>>(s.parameters, o);
  s.lr = s.schedule_from(o.lr);
}

template <class AdamT> void make_adam(Setup &s, double default_decay) {
  typename AdamT::Options o;
  o.lr = base_lr(s.config, 1e-3);
  o.weight_decay = s.config.has("weight-decay") ? s.config.number("weight-decay") : default_decay;
  s.optimizer = std::make_unique<AdamT>(s.parameters, o);
  s.lr = s.schedule_from(o.lr);
}

// K-FAC in the precisions chosen, with the distributed strategy chosen, as a transform.
template <class InverseScalar, class FactorScalar> void add_kfac(Setup &s) {
  using KFAC = kat::precond::KFAC<Scalar, Mem, InverseScalar, FactorScalar>;
  auto kfac = std::make_shared<KFAC>(kat::train::kfac_options(s.config, s.lr));
  kfac->register_model(s.model);
  std::shared_ptr<kat::precond::KFACStrategy<KFAC>> strategy;
#ifdef KAT_ENABLE_MPI
  if (daso(s.config)) {
    // DASO averages gradients inside a node: K-FAC averages its factors there too (D-KFAC on
    // the node's ranks), so a node's replicas take the same preconditioned step.
    strategy = std::make_shared<kat::distributed::DKFAC<KFAC>>(*s.node_comm, *kfac);
  } else if (s.config.has("dist-strategy")) {
    strategy = kat::distributed::kfac_strategies<KFAC>()
                   .at(s.config.text("dist-strategy"))
                   .make(*s.comm, *kfac, s.config);
  }
#endif
  if (s.group.size() > 1 && !strategy) {
    throw kat::ValueError(kat::detail::concat("--optimizer kfac on ", s.group.size(),
                                              " ranks needs --dist-strategy"));
  }
  s.transforms.push_back(std::make_shared<kat::train::KFACTransform<KFAC>>(kfac, strategy));
}

void make_kfac(Setup &s) {
  make_sgd(s);
  const bool inverse_double = s.config.text("inverse-precision") == "double";
  const bool factor_double = s.config.text("factor-precision") == "double";
  inverse_double ? (factor_double ? add_kfac<double, double>(s) : add_kfac<double, float>(s))
                 : (factor_double ? add_kfac<float, double>(s) : add_kfac<float, float>(s));
}

// Whether FOSI runs distributed as DHO2 (--dist-strategy dho2); then the base optimizer is
// built for this rank's slice of the parameters. With --dist-strategy daso every rank runs
// FOSI whole.
bool prepare_fosi(Setup &s) {
  const bool dho2 = s.config.has("dist-strategy") && s.config.text("dist-strategy") == "dho2";
  if (s.group.size() > 1 && !dho2 && !daso(s.config)) {
    throw kat::ValueError(kat::detail::concat("--optimizer fosi-* on ", s.group.size(),
                                              " ranks needs --dist-strategy dho2 (distributed "
                                              "FOSI, docs/distributed.md)"));
  }
#ifdef KAT_ENABLE_MPI
  if (dho2) {
    s.parameters =
        kat::distributed::parameter_shard(s.model.parameter_count(), s.group.rank(), s.group.size())
            .size;
  }
#endif
  return dho2;
}

// FOSI's curvature batch, the first batch of `batch` samples of the training set shuffled with
// `seed`, fixed for the run: part `part` of `parts` equal row blocks of it (copied, so the
// loader's buffers can move on).
std::pair<kat::Matrix<Scalar, Mem>, kat::Vector<std::int32_t, Mem>>
curvature_batch(const kat::data::Dataset &train_set, std::size_t batch, std::uint64_t seed,
                std::size_t part, std::size_t parts) {
  const Space space;
  kat::data::DataLoader<Scalar, Mem> loader(train_set, batch, true, seed);
  loader.start_epoch(0);
  kat::Matrix<Scalar, Mem> xb;
  kat::Vector<std::int32_t, Mem> yb;
  loader.next(space, xb, yb);
  const std::size_t rows = xb.extent(0) / parts;
  const auto mine = std::make_pair(rows * part, rows * (part + 1));
  kat::Matrix<Scalar, Mem> x("kat_train::fosi_batch_x", rows, xb.extent(1));
  kat::Vector<std::int32_t, Mem> y("kat_train::fosi_batch_y", rows);
  Kokkos::deep_copy(space, x, Kokkos::subview(xb, mine, Kokkos::ALL));
  Kokkos::deep_copy(space, y, Kokkos::subview(yb, mine));
  space.fence();
  return {x, y};
}

// FOSI (docs/fosi.md) around the base optimizer `base` already in s.optimizer: the curvature
// is the loss's Hessian on one fixed batch, the first global batch of the training set
// shuffled with the run's seed (copied, so the loader's buffers can move on). With DHO2 each
// rank differentiates its own rows of that batch and keeps its slice of the curvature.
void make_fosi(Setup &s, kat::optim::FOSIMomentum momentum, bool dho2) {
  // With DASO every rank differentiates the whole batch, so a node's replicas (equal
  // parameters) get equal estimates.
  const auto ranks = daso(s.config) ? std::size_t(1) : static_cast<std::size_t>(s.group.size());
  const auto [x, y] =
      curvature_batch(s.train_set, s.local_batch * static_cast<std::size_t>(s.group.size()), s.seed,
                      ranks == 1 ? 0 : static_cast<std::size_t>(s.group.rank()), ranks);
  const kat::Vector<const std::int32_t, Mem> labels = y;
  const kat::nn::SoftmaxCrossEntropy<Scalar, Mem> loss;
  kat::optim::FOSI<Scalar, Mem>::Options o;
  o.momentum = momentum;
  o.k = static_cast<std::size_t>(s.config.integer("k"));
  o.l = static_cast<std::size_t>(s.config.integer("l"));
  o.alpha = s.config.number("alpha");
  o.num_iters_to_approx_eigs = s.config.integer("num-iters-to-approx-eigs");
  o.warmup_w = s.config.has("warmup-w") ? s.config.integer("warmup-w") : o.num_iters_to_approx_eigs;
  if (s.config.has("learning-rate-clip")) {
    o.learning_rate_clip = s.config.number("learning-rate-clip");
  }
  if (momentum != kat::optim::FOSIMomentum::adam) {
    o.beta = s.config.number("momentum");
  }
  o.seed = s.seed;
  const std::size_t n = s.model.parameter_count();
  std::unique_ptr<kat::optim::FOSI<Scalar, Mem>> fosi;
  std::function<std::uint64_t()> communicated;
  std::string method = "FOSI-";
#ifdef KAT_ENABLE_MPI
  if (dho2 && s.dho2_roles) {
    // The curvature ranks (serve_dho2_curvature) estimate; these ranks only train.
    kat::distributed::DHO2Overlap overlap;
    if (s.config.has("dho2-staleness-bound")) {
      overlap.staleness_bound = s.config.integer("dho2-staleness-bound");
    }
    overlap.swap = s.config.text("dho2-swap") == "fixed" ? kat::distributed::DHO2Swap::fixed
                                                         : kat::distributed::DHO2Swap::eager;
    auto dho2_optimizer = std::make_unique<kat::distributed::DHO2<Scalar, Mem>>(
        *s.dho2_roles, n, std::move(s.optimizer), o, overlap);
    method = kat::detail::concat(
        "DHO2 (", s.group.size(), " training ranks, shards of ", dho2_optimizer->shard().padded,
        " parameters; ", s.dho2_roles->curvature_ranks,
        " curvature ranks, staleness <= ", *dho2_optimizer->overlap()->staleness_bound, ", ",
        overlap.swap == kat::distributed::DHO2Swap::fixed ? "fixed" : "eager", " swap), FOSI-");
    fosi = std::move(dho2_optimizer);
    const auto *sharded = static_cast<const kat::distributed::DHO2<Scalar, Mem> *>(fosi.get());
    communicated = [sharded] { return static_cast<std::uint64_t>(sharded->stats().total().bytes); };
  } else if (dho2) {
    const auto shard = kat::distributed::parameter_shard(n, s.group.rank(), s.group.size());
    fosi = std::make_unique<kat::distributed::DHO2<Scalar, Mem>>(
        *s.comm, n, std::move(s.optimizer),
        kat::distributed::sharded_curvature_operator(*s.comm, shard, s.model, loss, x, labels), o);
    method = kat::detail::concat("DHO2 (", s.group.size(), " shards of ", shard.padded,
                                 " parameters), FOSI-");
    // DHO2's own communicator and the operator's (s.comm, which FOSI uses for nothing else).
    const auto *sharded = static_cast<const kat::distributed::DHO2<Scalar, Mem> *>(fosi.get());
    const kat::distributed::Communicator *op_comm = s.comm;
    communicated = [sharded, op_comm] {
      return static_cast<std::uint64_t>(sharded->stats().total().bytes +
                                        op_comm->stats().total().bytes);
    };
  }
#else
  (void)dho2; // false: --dist-strategy exists only in MPI builds
#endif
  if (!fosi) {
    fosi = std::make_unique<kat::optim::FOSI<Scalar, Mem>>(
        n, std::move(s.optimizer), kat::nn::curvature_operator(s.model, loss, x, labels), o);
  }
  s.description = kat::detail::concat(method, kat::optim::to_string(momentum), " (k ", o.k, ", l ",
                                      o.l, ", alpha ", o.alpha, ", T ", o.num_iters_to_approx_eigs,
                                      ", W ", o.warmup_w, ") + ", fosi->base_optimizer().name());
  s.callbacks.push_back(
      std::make_shared<kat::train::FOSIReport<Scalar, Mem>>(*fosi, s.profile, communicated));
  s.optimizer = std::move(fosi);
}

#ifdef KAT_ENABLE_MPI
// With --ranks-per-node: what this epoch sent between the nodes, from every communicator the
// training uses (CommunicatorStats::internode): the bytes summed over the training ranks
// (internode_bytes) and the emulated link time per rank (internode_s, their mean), as metrics
// and a note on the epoch line.
class InternodeReport : public kat::train::Callback<Scalar, Mem> {
public:
  explicit InternodeReport(std::vector<const kat::distributed::Communicator *> comms)
      : comms_(std::move(comms)) {}
  std::string name() const override { return "internode"; }
  void on_epoch_begin(Trainer &) override { start_ = totals(); }
  void on_epoch_end(Trainer &trainer, kat::train::EpochSummary &summary) override {
    const auto now = totals();
    std::vector<double> v{now[0] - start_[0], now[1] - start_[1]};
    trainer.process_group().sum(v);
    const double seconds = v[1] / trainer.process_group().size();
    summary.metrics.push_back({"internode_bytes", v[0], 0});
    summary.metrics.push_back({"internode_s", seconds, 3});
    char note[64];
    std::snprintf(note, sizeof note, "  inter-node %.1f MB", v[0] / 1e6);
    summary.note += note;
  }

private:
  std::vector<double> totals() const {
    std::vector<double> t{0, 0};
    for (const auto *c : comms_) {
      t[0] += static_cast<double>(c->stats().internode.bytes);
      t[1] += c->stats().internode_seconds;
    }
    return t;
  }
  std::vector<const kat::distributed::Communicator *> comms_;
  std::vector<double> start_{0, 0};
};
#endif

#ifdef KAT_ENABLE_MPI
// With --tensor-parallel: the bytes this rank's tensor-parallel layers hand to MPI in the
// training steps (evaluation excluded), per step of a full local batch (the bytes are
// proportional to the rows, so a shorter last batch does not skew it), and what the plan
// predicted (--plan).
class TensorParallelReport : public kat::train::Callback<Scalar, Mem> {
public:
  TensorParallelReport(const kat::distributed::Communicator &comm, double predicted,
                       std::size_t local_batch)
      : comm_(comm), predicted_(predicted), batch_(static_cast<double>(local_batch)) {}
  std::string name() const override { return "tensor_parallel"; }
  void on_epoch_begin(Trainer &) override { bytes_ = seen_ = 0; }
  void on_step_begin(Trainer &) override { start_ = total(); }
  void on_step_end(Trainer &trainer) override {
    bytes_ += total() - start_;
    seen_ = static_cast<double>(trainer.position().seen); // this epoch's samples so far
  }
  void on_epoch_end(Trainer &, kat::train::EpochSummary &summary) override {
    const double per_step = seen_ > 0 ? bytes_ / seen_ * batch_ : 0;
    summary.metrics.push_back({"tp_bytes_per_step", per_step, 0});
    char note[96];
    if (predicted_ > 0) {
      std::snprintf(note, sizeof note, "  tensor-parallel %.3f MB/step (plan: %.3f)",
                    per_step / 1e6, predicted_ / 1e6);
    } else {
      std::snprintf(note, sizeof note, "  tensor-parallel %.3f MB/step", per_step / 1e6);
    }
    summary.note += note;
  }

private:
  double total() const {
    const auto s = comm_.stats();
    return static_cast<double>(s.allreduce.bytes + s.iallreduce.bytes);
  }
  const kat::distributed::Communicator &comm_;
  double predicted_, batch_;
  double bytes_ = 0, start_ = 0, seen_ = 0;
};
#endif

// A registered option as a flag: its text (the default until given) and the flag.
struct Flag {
  std::string name, value;
  CLI::Option *option = nullptr;
};

#ifdef KAT_ENABLE_MPI
// A curvature rank of DHO2 with --dho2-curvature-ranks: serves the training ranks' estimates
// until they finish. The curvature batch is FOSI's (make_fosi: the first global batch of the
// training set shuffled with the run's seed), each curvature rank differentiating its rows.
void serve_dho2_curvature(const kat::distributed::DHO2Roles &roles, Model &model,
                          const kat::data::Dataset &train_set, std::size_t batch_size,
                          std::uint64_t seed) {
  const Space space;
  const auto C = static_cast<std::size_t>(roles.curvature_ranks);
  const auto c = static_cast<std::size_t>(roles.group->rank());
  const auto [x, y] = curvature_batch(train_set, batch_size, seed, c, C);
  const std::size_t rows = x.extent(0);
  const kat::Vector<const std::int32_t, Mem> labels = y;
  const kat::nn::SoftmaxCrossEntropy<Scalar, Mem> loss;
  const std::size_t n = model.parameter_count();
  const auto shard =
      kat::distributed::parameter_shard(n, roles.group->rank(), roles.curvature_ranks);
  kat::distributed::DHO2Estimator<Scalar, Mem> estimator(
      roles, n, model.parameters(),
      kat::distributed::sharded_curvature_operator(*roles.group, shard, model, loss, x, labels));
  const std::int64_t served = estimator.serve(space);
  if (c == 0) {
    std::printf("DHO2 curvature ranks: %lld estimates of %zu rows each, Lanczos %.3f s per "
                "estimate\n",
                static_cast<long long>(served), rows * C,
                served > 0 ? estimator.lanczos_seconds() / double(served) : 0.0);
    std::fflush(stdout);
  }
}
#endif

// --dho2-curvature-ranks C (0 without the flag), checked against the run's other flags.
int dho2_curvature_ranks(const std::vector<Flag> &flags, int ranks, int batch_size,
                         const std::string &checkpoint_dir) {
  const auto find = [&flags](const std::string &name) -> const Flag * {
    const auto f =
        std::find_if(flags.begin(), flags.end(), [&name](const Flag &g) { return g.name == name; });
    return f == flags.end() ? nullptr : &*f;
  };
  const Flag *c = find("dho2-curvature-ranks");
  if (c == nullptr) {
    return 0;
  }
  char *end = nullptr;
  const long C = std::strtol(c->value.c_str(), &end, 10);
  if (end == c->value.c_str() || *end != '\0' || C < 0) {
    throw CLI::ValidationError("--dho2-curvature-ranks",
                               "must be an integer >= 0, got " + c->value);
  }
  if (C == 0) {
    for (const char *name : {"dho2-staleness-bound", "dho2-swap"}) {
      if (find(name)->option->count() > 0) {
        throw CLI::ValidationError(std::string("--") + name, "needs --dho2-curvature-ranks > 0");
      }
    }
    return 0;
  }
  if (const Flag *bound = find("dho2-staleness-bound"); bound->option->count() > 0) {
    const long S = std::strtol(bound->value.c_str(), &end, 10);
    if (end == bound->value.c_str() || *end != '\0' || S < 0) {
      throw CLI::ValidationError("--dho2-staleness-bound",
                                 "must be an integer >= 0 (steps), got " + bound->value);
    }
  }
  if (find("dist-strategy")->option->count() == 0 || find("dist-strategy")->value != "dho2") {
    throw CLI::ValidationError("--dho2-curvature-ranks", "needs --dist-strategy dho2");
  }
  if (C >= ranks) {
    throw CLI::ValidationError("--dho2-curvature-ranks",
                               "must leave at least one training rank: at most " +
                                   std::to_string(ranks - 1) + " of " + std::to_string(ranks) +
                                   " ranks, got " + c->value);
  }
  if (!checkpoint_dir.empty()) {
    throw CLI::ValidationError("--checkpoint-dir", "is not supported with --dho2-curvature-ranks "
                                                   "(an estimate in flight is not part of the "
                                                   "optimizer's state)");
  }
  if (batch_size % C != 0) {
    throw CLI::ValidationError("--batch-size", "must be divisible by the " + c->value +
                                                   " curvature ranks, which share its first "
                                                   "batch as the curvature batch");
  }
  return static_cast<int>(C);
}

// The registered optimizers and their options (each option a flag of the same name).
Optimizers optimizers() {
  Optimizers r("optimizer");
  const Opt lr{"lr", "Learning rate [default: 0.05 for sgd and kfac, 0.001 for adam/adamw]"};
  const Opt wd{"weight-decay",
               "L2 penalty (sgd, adam) or decoupled decay (adamw) [default: 0, adamw 0.01]"};
  const std::vector<Opt> sgd{lr,
                             {"momentum", "SGD momentum", "0.9"},
                             {"nesterov", "Nesterov momentum (sgd)", "", {}, true},
                             wd};
  // Data parallelism (the default on several ranks) or DASO; K-FAC and FOSI add their own.
  std::vector<Opt> plain_sgd = sgd, adam{lr, wd};
#ifdef KAT_ENABLE_MPI
  const Opt daso{"dist-strategy",
                 "Distributed strategy on several ranks: daso (docs/distributed.md) instead of "
                 "synchronous data parallelism",
                 "",
                 {"daso"}};
  plain_sgd.push_back(daso);
  adam.push_back(daso);
#endif
  r.add("sgd", "SGD with momentum (PyTorch's torch.optim.SGD)", plain_sgd,
        [](Setup &s) { make_sgd(s); });
  r.add("adam", "Adam (Kingma & Ba 2015)", adam,
        [](Setup &s) { make_adam<kat::optim::Adam<Scalar, Mem>>(s, 0.0); });
  r.add("adamw", "AdamW (Loshchilov & Hutter 2019)", adam,
        [](Setup &s) { make_adam<kat::optim::AdamW<Scalar, Mem>>(s, 0.01); });
  std::vector<Opt> kfac = sgd;
  for (const auto &o : kat::train::kfac_option_specs()) {
    kfac.push_back(o);
  }
#ifdef KAT_ENABLE_MPI
  const auto strategies = kat::distributed::kfac_strategies<kat::precond::KFAC<Scalar, Mem>>();
  auto kfac_choices = strategies.names();
  kfac_choices.push_back("daso");
  kfac.push_back({"dist-strategy",
                  "Distributed strategy on several ranks: K-FAC's for kfac, dho2 for fosi-*, "
                  "daso for any (K-FAC then averages its factors inside each node)",
                  "", kfac_choices});
  for (const auto &e : strategies.entries()) {
    kfac.insert(kfac.end(), e.options.begin(), e.options.end());
  }
#endif
  r.add("kfac", "K-FAC preconditioning + SGD (docs/kfac.md)", kfac, make_kfac);
  // FOSI (Sivan et al., ICLR 2024; docs/fosi.md): the reference code's option names.
  const std::vector<Opt> fosi_options{
      {"k", "FOSI: largest Hessian eigenpairs estimated", "5"},
      {"l", "FOSI: smallest Hessian eigenpairs estimated", "0"},
      {"alpha", "FOSI: Newton step size in the subspace", "0.1"},
      {"num-iters-to-approx-eigs", "FOSI: steps T between curvature refreshes", "100"},
      {"warmup-w", "FOSI: step W of the first refresh [default: T]"},
      {"learning-rate-clip", "FOSI: upper bound of the complement scale c [default: 3, adam 1]"},
#ifdef KAT_ENABLE_MPI
      {"dist-strategy",
       "Distributed FOSI on several ranks: dho2, or daso (docs/distributed.md)",
       "",
       {"dho2", "daso"}},
      {"dho2-curvature-ranks",
       "DHO2: ranks that only estimate curvature, overlapped with training (0: synchronous)", "0"},
      {"dho2-staleness-bound",
       "DHO2: most steps an estimate may arrive after its snapshot [default: T]"},
      {"dho2-swap",
       "DHO2: swap an estimate in when every training rank has it, or exactly at the bound",
       "eager",
       {"eager", "fixed"}},
#endif
  };
  std::vector<Opt> fosi_sgd = sgd;
  fosi_sgd.erase(std::remove_if(fosi_sgd.begin(), fosi_sgd.end(),
                                [](const Opt &o) { return o.name == "nesterov"; }),
                 fosi_sgd.end());
  fosi_sgd.insert(fosi_sgd.end(), fosi_options.begin(), fosi_options.end());
  std::vector<Opt> fosi_adam{lr, wd};
  fosi_adam.insert(fosi_adam.end(), fosi_options.begin(), fosi_options.end());
  r.add("fosi-momentum", "FOSI around SGD with heavy-ball momentum (docs/fosi.md)", fosi_sgd,
        [](Setup &s) {
          const bool dho2 = prepare_fosi(s);
          make_sgd(s);
          make_fosi(s, kat::optim::FOSIMomentum::heavy_ball, dho2);
        });
  r.add("fosi-nesterov", "FOSI around SGD with Nesterov momentum (docs/fosi.md)", fosi_sgd,
        [](Setup &s) {
          const bool dho2 = prepare_fosi(s);
          make_sgd(s, /*nesterov=*/true);
          make_fosi(s, kat::optim::FOSIMomentum::nesterov, dho2);
        });
  r.add("fosi-adam", "FOSI around Adam (docs/fosi.md)", fosi_adam, [](Setup &s) {
    const bool dho2 = prepare_fosi(s);
    make_adam<kat::optim::Adam<Scalar, Mem>>(s, 0.0);
    make_fosi(s, kat::optim::FOSIMomentum::adam, dho2);
  });
  return r;
}

// Every option of `registry`'s entries as a flag of `app` (once per name), in a group per entry.
// An option that several entries declare with choices (--dist-strategy) accepts all of them;
// each entry checks the value it gets.
template <class R> void add_flags(CLI::App &app, const R &registry, std::vector<Flag> &flags) {
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
    auto *group = app.add_option_group(e.name, e.help);
    for (const auto &o : e.options) {
      if (std::any_of(flags.begin(), flags.end(),
                      [&](const Flag &f) { return f.name == o.name; })) {
        continue;
      }
      flags.push_back({o.name, o.default_value});
      std::string &value = flags.back().value;
      if (o.is_flag) {
        flags.back().option = group->add_flag_callback(
            "--" + o.name, [&value] { value = "true"; }, o.help);
        continue;
      }
      auto *opt = group->add_option("--" + o.name, value, o.help);
      flags.back().option = opt;
      if (!o.choices.empty()) {
        opt->check(CLI::IsMember(choices[o.name]));
      }
      if (!o.default_value.empty()) {
        opt->capture_default_str();
      }
    }
  }
}

} // namespace

int main(int argc, char **argv) {
#ifdef KAT_ENABLE_MPI
  kat::distributed::MPIEnvironment mpi(argc, argv);
  auto comm = kat::distributed::Communicator::world();
  kat::distributed::MPIProcessGroup world_group(comm);
#else
  kat::train::ProcessGroup world_group;
#endif
  const Optimizers optimizer_registry = optimizers();
  const auto schedule_registry = kat::train::lr_schedules();
  std::string data_dir = kat::data::default_fashion_mnist_dir, model_name = "mlp",
              optimizer_name = "sgd", schedule_name = "constant", metrics, progress = "auto",
              checkpoint_dir, resume;
  int epochs = 10, batch_size = 128, warmup_steps = 0;
  std::uint64_t seed = 0;
  std::size_t train_subset = 0, keep_checkpoints = 3;
  std::int64_t checkpoint_every = 0;
  bool profile = false;
  int curvature_ranks = 0; // DHO2's --dho2-curvature-ranks
  int ranks_per_node = 0;  // virtual nodes (0: the machine's)
  double internode_latency = 0, internode_bandwidth = 0;
  CLI::App app{"Train a network on Fashion-MNIST with KAT (Kokkos Accelerated Training).\n"
               "Kokkos flags such as --kokkos-num-threads=N are accepted as well."};
  app.add_option("--data-dir", data_dir, "Directory with the IDX files (raw or .gz)")
      ->capture_default_str();
  app.add_option("--model", model_name,
                 "mlp (784-256-256-10) | cnn (two 5x5 convolutions, dense 3136-256-10) | "
                 "resnet (ResNet-14 with batch norm) | vit (Vision Transformer: --vit-* below)")
      ->check(CLI::IsMember({"mlp", "cnn", "resnet", "vit"}))
      ->capture_default_str();
  kat::nn::models::VitOptions vit;
  std::string vit_patch = "7";
  app.add_option("--vit-depth", vit.depth, "vit: transformer encoder blocks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--vit-width", vit.width, "vit: token width D")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--vit-heads", vit.heads, "vit: attention heads (must divide --vit-width)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--vit-mlp", vit.mlp_hidden, "vit: MLP hidden width (0: 2 x width)")
      ->capture_default_str();
  app.add_option("--vit-patch", vit_patch,
                 "vit: P for P x P patches (must divide 28) | rows (each image row a token)")
      ->check(CLI::IsMember({"1", "2", "4", "7", "14", "28", "rows"}))
      ->capture_default_str();
  std::string conv_backend = "auto";
  app.add_option("--conv-backend", conv_backend,
                 "auto (oneDNN on host memory where built with it, else im2col) | im2col "
                 "(im2col + GEMM everywhere) | dnn (oneDNN; an error where unavailable). "
                 "K-FAC's recording steps always use im2col")
      ->check(CLI::IsMember({"auto", "im2col", "dnn"}))
      ->capture_default_str();
  app.add_option("--optimizer", optimizer_name, "One of the registered optimizers below")
      ->check(CLI::IsMember(optimizer_registry.names()))
      ->capture_default_str();
  app.add_option("--epochs", epochs, "Passes over the training set")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", batch_size, "Samples per step (with MPI: the global batch)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--schedule", schedule_name, "Learning-rate schedule per step")
      ->check(CLI::IsMember(schedule_registry.names()))
      ->capture_default_str();
  app.add_option("--warmup-steps", warmup_steps, "Linear warm-up steps before the schedule")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--seed", seed, "Seed for initialization and shuffling")->capture_default_str();
  app.add_option("--train-subset", train_subset, "Train on the first N images only (0: all)")
      ->capture_default_str();
  app.add_option("--metrics", metrics, "Per-epoch metrics to FILE (.csv or .jsonl)");
  app.add_flag("--profile", profile,
               "Per-epoch profile: K-FAC time split, communicated bytes, state (docs/kfac.md)");
  app.add_option("--progress", progress, "Live progress bar: auto | always | never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  app.add_option("--checkpoint-dir", checkpoint_dir, "Save checkpoints in DIR, one per rank");
  app.add_option("--checkpoint-every", checkpoint_every,
                 "Save every N steps and after the last epoch (0: every epoch)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--resume", resume, "Continue from latest (in --checkpoint-dir) or FILE");
  app.add_option("--keep-checkpoints", keep_checkpoints, "How many of the newest to keep")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
#ifdef KAT_ENABLE_MPI
  int tensor_parallel = 1;
  app.add_option("--tensor-parallel", tensor_parallel,
                 "vit: split every transformer block's attention (by heads) and MLP over T "
                 "ranks, Megatron-style; the ranks form (ranks / T) data-parallel replicas "
                 "(docs/tensor_parallel.md)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::string plan_file;
  app.add_option("--plan", plan_file,
                 "with --tensor-parallel: a plan from kat_plan --vit (JSON) choosing which "
                 "blocks' attention and MLP to split")
      ->check(CLI::ExistingFile);
  app.add_option("--ranks-per-node", ranks_per_node,
                 "Treat blocks of G consecutive ranks as nodes (0: ranks sharing memory), to "
                 "run hierarchical strategies (DASO) on one machine")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--emulate-internode-latency", internode_latency,
                 "Emulated inter-node link: seconds added to every operation between the "
                 "--ranks-per-node nodes (docs/distributed.md)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--emulate-internode-bandwidth", internode_bandwidth,
                 "Emulated inter-node link: bytes per second (0: unlimited)")
      ->check(CLI::NonNegativeNumber);
#endif
  // Sparse training (kat::sparse) works with every optimizer: its options are one group.
  kat::train::Registry<int> sparse_registry("sparse training");
  sparse_registry.add("sparse", "Sparse training: masks, SET, RigL (docs/sparse.md)",
                      kat::sparse::sparse_option_specs(), 0);
  sparse_registry.add("agent", "Adaptive gradient correction, with any optimizer",
                      kat::sparse::agent_option_specs(), 0);
#ifdef KAT_ENABLE_MPI
  sparse_registry.add("daso",
                      "DASO: hierarchical asynchronous data parallelism (--dist-strategy "
                      "daso, docs/distributed.md)",
                      kat::distributed::daso_option_specs(), 0);
#endif
  std::vector<Flag> flags;
  flags.reserve(64); // add_flags keeps references into it
  add_flags(app, optimizer_registry, flags);
  add_flags(app, schedule_registry, flags);
  add_flags(app, sparse_registry, flags);
  app.allow_extras(); // --kokkos-* go on to Kokkos
  try {
    app.parse(argc, argv);
    for (const auto &extra : app.remaining()) {
      if (extra.rfind("--kokkos-", 0) != 0) {
        throw CLI::ExtrasError({extra});
      }
    }
    if (resume == "latest" && checkpoint_dir.empty()) {
      throw CLI::ValidationError("--resume latest", "needs --checkpoint-dir");
    }
    if (!resume.empty() && resume != "latest" && world_group.size() > 1) {
      throw CLI::ValidationError("--resume", "takes latest with more than one rank");
    }
    // A registered option given on the command line must be one of the chosen components'.
    const auto sparsity_flag = std::find_if(flags.begin(), flags.end(),
                                            [](const Flag &f) { return f.name == "sparsity"; });
    const bool sparse = std::strtod(sparsity_flag->value.c_str(), nullptr) > 0.0;
    const auto agent_flag =
        std::find_if(flags.begin(), flags.end(), [](const Flag &f) { return f.name == "agent"; });
    // --dist-strategy exists only in MPI builds.
    const auto strategy_flag = std::find_if(
        flags.begin(), flags.end(), [](const Flag &f) { return f.name == "dist-strategy"; });
    const bool daso_chosen = strategy_flag != flags.end() && strategy_flag->value == "daso";
    for (const auto &f : flags) {
      const auto declares = [&](const auto &entry) {
        return std::any_of(entry.options.begin(), entry.options.end(),
                           [&](const Opt &o) { return o.name == f.name; });
      };
      if (f.option->count() > 0 && declares(sparse_registry.at("sparse"))) {
        if (f.name != "sparsity" && !sparse) {
          throw CLI::ValidationError("--" + f.name, "needs --sparsity > 0");
        }
        continue;
      }
      if (f.option->count() > 0 && declares(sparse_registry.at("agent"))) {
        if (f.name != "agent" && !agent_flag->option->count()) {
          throw CLI::ValidationError("--" + f.name, "needs --agent");
        }
        continue;
      }
#ifdef KAT_ENABLE_MPI
      if (f.option->count() > 0 && declares(sparse_registry.at("daso"))) {
        if (!daso_chosen) {
          throw CLI::ValidationError("--" + f.name, "needs --dist-strategy daso");
        }
        continue;
      }
#endif
      if (f.option->count() > 0 && !declares(optimizer_registry.at(optimizer_name)) &&
          !declares(schedule_registry.at(schedule_name))) {
        throw CLI::ValidationError("--" + f.name, "is not an option of --optimizer " +
                                                      optimizer_name + " or --schedule " +
                                                      schedule_name);
      }
    }
    curvature_ranks = dho2_curvature_ranks(flags, world_group.size(), batch_size, checkpoint_dir);
    if ((internode_latency > 0 || internode_bandwidth > 0) && ranks_per_node == 0) {
      throw CLI::ValidationError("--emulate-internode-latency/bandwidth",
                                 "needs --ranks-per-node G > 0 (the emulated nodes)");
    }
    if (daso_chosen && checkpoint_every > 0) {
      throw CLI::ValidationError("--checkpoint-every",
                                 "must be 0 with --dist-strategy daso (its parameter sends are in "
                                 "flight inside an epoch; it checkpoints at epoch ends)");
    }
#ifdef KAT_ENABLE_MPI
    if (!plan_file.empty() && tensor_parallel == 1) {
      throw CLI::ValidationError("--plan", "needs --tensor-parallel T > 1");
    }
    if (tensor_parallel > 1) {
      if (model_name != "vit") {
        throw CLI::ValidationError("--tensor-parallel", "needs --model vit");
      }
      if (world_group.size() % tensor_parallel != 0) {
        throw CLI::ValidationError("--tensor-parallel", "must divide the " +
                                                            std::to_string(world_group.size()) +
                                                            " ranks");
      }
      if (vit.heads % static_cast<std::size_t>(tensor_parallel) != 0) {
        throw CLI::ValidationError("--tensor-parallel",
                                   "must divide --vit-heads (" + std::to_string(vit.heads) + ")");
      }
      for (const char *other : {"dist-strategy", "agent", "sparsity"}) {
        const auto f = std::find_if(flags.begin(), flags.end(),
                                    [&](const Flag &g) { return g.name == other; });
        if (f != flags.end() && f->option->count() > 0) {
          throw CLI::ValidationError("--tensor-parallel",
                                     std::string("cannot be combined with --") + other);
        }
      }
      if (optimizer_name == "kfac" || optimizer_name == "fosi") {
        throw CLI::ValidationError("--tensor-parallel",
                                   "runs with element-wise optimizers (sgd, adam, adamw); " +
                                       optimizer_name +
                                       "'s global quantities would differ between the shards");
      }
      if (!checkpoint_dir.empty()) {
        throw CLI::ValidationError("--tensor-parallel",
                                   "cannot checkpoint yet (each rank holds a shard)");
      }
    }
    const int training_ranks = (world_group.size() - curvature_ranks) / tensor_parallel;
#else
    const int training_ranks = world_group.size() - curvature_ranks;
#endif
    if (training_ranks > 1 && batch_size % training_ranks != 0) {
      throw CLI::ValidationError("--batch-size", "is the global batch and must be divisible by " +
                                                     std::to_string(training_ranks) +
                                                     " training ranks");
    }
  } catch (const CLI::ParseError &e) {
    return world_group.rank() == 0 ? app.exit(e) : e.get_exit_code(); // every rank reaches it
  }
  Config config;
  for (const auto &f : flags) {
    if (!f.value.empty()) {
      config.set(f.name, f.value);
    }
  }
#ifdef KAT_ENABLE_MPI
  const std::string threads = kat::distributed::apply_thread_budget(argc, argv, comm);
  // Virtual nodes and their emulated link, for every communicator derived from here on (the
  // thread budget above used the machine's real nodes).
  comm.set_ranks_per_virtual_node(ranks_per_node);
  comm.set_internode_link({internode_latency, internode_bandwidth});
  // DHO2 with curvature ranks: the last C ranks estimate curvature, the others train together.
  std::optional<kat::distributed::DHO2Roles> dho2_roles;
  if (curvature_ranks > 0) {
    dho2_roles = kat::distributed::dho2_roles(comm, curvature_ranks);
  }
  // With --tensor-parallel T: a (ranks / T) x T mesh; the data-parallel group trains together.
  std::optional<kat::distributed::TensorParallelMesh> mesh;
  if (tensor_parallel > 1) {
    mesh.emplace(comm, tensor_parallel);
    mesh->tensor().set_checked(false); // two all-reduces per block: no agreement round trips
  }
  kat::distributed::Communicator &train_comm = dho2_roles ? *dho2_roles->group
                                               : mesh     ? mesh->data()
                                                          : comm;
  kat::distributed::MPIProcessGroup group(train_comm);
#else
  kat::train::ProcessGroup &group = world_group;
#endif
  Kokkos::ScopeGuard kokkos(argc, argv);
  const bool root = world_group.rank() == 0; // only rank 0 prints and writes --metrics
  try {
    const Space space;
    const auto t0 = std::chrono::steady_clock::now();
    auto train_set = kat::data::load_fashion_mnist(data_dir, kat::data::Split::train);
    const auto test_set = kat::data::load_fashion_mnist(data_dir, kat::data::Split::test);
    if (train_subset > 0) {
      train_set = train_set.take(std::min(train_subset, train_set.size()));
    }
    const double load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::size_t local_batch = static_cast<std::size_t>(batch_size / group.size());
    kat::data::DataLoader<Scalar, Mem> train_loader(train_set, local_batch, true, seed);
    kat::data::DataLoader<Scalar, Mem> test_loader(test_set, 1000, false, 0);
    const kat::distributed::DistributedSampler sampler(train_set.size(), group.rank(), group.size(),
                                                       seed);
    if (vit_patch == "rows") {
      vit.patch = {1, train_set.shape.width};
    } else {
      vit.patch = {std::stoi(vit_patch), std::stoi(vit_patch)};
    }
#ifdef KAT_ENABLE_MPI
    // The blocks' splits: all (Megatron's plan) or as --plan says.
    // The single-rank model every rank's shards are cut from.
    std::optional<Model> whole;
    std::vector<kat::distributed::TensorParallelSplit> splits;
    double predicted_tp_bytes = 0;
    if (mesh) {
      whole.emplace(kat::nn::models::vit<Scalar, Mem>(train_set.shape, train_set.classes, vit));
    }
    if (mesh && !plan_file.empty()) {
      const auto plan = kat::plan::read_plan(plan_file);
      splits = kat::distributed::tensor_parallel_splits(plan, *whole, mesh->tensor_size());
      if (plan.mesh.data != mesh->data_size()) {
        throw kat::ValueError(
            kat::detail::concat("kat_train: --plan ", plan_file, " is for ", plan.mesh.data,
                                " data-parallel replicas, the run has ", mesh->data_size()));
      }
      for (const auto &c : plan.collectives) {
        if (c.group == kat::plan::Group::tensor) {
          predicted_tp_bytes += c.bytes;
        }
      }
    }
#endif
    const auto make_model = [&] {
#ifdef KAT_ENABLE_MPI
      if (mesh) {
        return kat::distributed::vit_tensor_parallel<Scalar, Mem>(
            train_set.shape, train_set.classes, vit, mesh->tensor(), splits);
      }
#endif
      return model_name == "vit"
                 ? kat::nn::models::vit<Scalar, Mem>(train_set.shape, train_set.classes, vit)
                 : kat::nn::models::by_name<Scalar, Mem>(model_name, train_set.shape,
                                                         train_set.classes);
    };
    auto model = make_model();
    model.compile(space, seed);
#ifdef KAT_ENABLE_MPI
    if (mesh) { // every shard cut from the same single-rank model
      whole->compile(space, seed);
      kat::distributed::copy_sharded_parameters(space, *whole, model);
      whole.reset(); // its parameters are in the shards now
    }
#endif
    const auto backend = conv_backend == "im2col" ? kat::nn::Conv2dBackend::im2col
                         : conv_backend == "dnn"  ? kat::nn::Conv2dBackend::dnn
                                                  : kat::nn::Conv2dBackend::automatic;
    kat::nn::set_conv2d_backend(model.layers(), backend);
#ifdef KAT_ENABLE_MPI
    if (dho2_roles && dho2_roles->curvature) {
      serve_dho2_curvature(*dho2_roles, model, train_set, static_cast<std::size_t>(batch_size),
                           seed);
      return 0;
    }
#endif
    const auto steps = static_cast<std::int64_t>(sampler.batches(local_batch)) * epochs;
    Setup setup{config,
                model,
                [&](double lr) {
                  auto s = schedule_registry.at(schedule_name).make(config, lr, steps);
                  return warmup_steps > 0 ? kat::optim::linear_warmup(warmup_steps, s) : s;
                },
                group,
#ifdef KAT_ENABLE_MPI
                nullptr,
                nullptr,
                nullptr,
#endif
                train_set,
                local_batch,
                seed,
                profile};
#ifdef KAT_ENABLE_MPI
    // K-FAC's strategies communicate on their own communicator (their own counters).
    auto kfac_comm = train_comm.dup();
    auto node_comm = train_comm.split_shared(); // K-FAC's with DASO
    setup.comm = &kfac_comm;
    setup.node_comm = &node_comm;
    setup.dho2_roles = dho2_roles ? &*dho2_roles : nullptr;
#endif
    optimizer_registry.at(optimizer_name).make(setup);

    Trainer trainer(model, *setup.optimizer, train_loader);
    trainer.set_lr(setup.lr);
    trainer.set_test_loader(&test_loader);
    const std::string model_id =
        model_name != "vit"
            ? model_name
            : kat::detail::concat("vit(depth ", vit.depth, ", width ", vit.width, ", heads ",
                                  vit.heads, ", mlp ", vit.mlp_hidden, ", patch ", vit_patch, ")");
    trainer.set_identity({{"model", model_id},
                          {"optimizer", optimizer_name},
                          {"seed", std::to_string(seed)},
                          {"batch_size", std::to_string(batch_size)},
                          {"ranks", std::to_string(group.size())},
                          {"sparsity", config.text("sparsity")},
                          {"agent", config.flag("agent") ? "on" : "off"}});
    // AGENT corrects the gradient before any preconditioner sees it; its probe is a second
    // network of the same architecture, and its refresh pass reads this rank's shard.
    std::shared_ptr<kat::sparse::AGENT<Scalar, Mem>> agent;
    std::unique_ptr<Model> probe;
    std::unique_ptr<kat::data::DataLoader<Scalar, Mem>> refresh_loader;
    std::shared_ptr<kat::sparse::AGENTProbe<Scalar, Mem>> agent_probe;
    if (config.flag("agent")) {
      agent = std::make_shared<kat::sparse::AGENT<Scalar, Mem>>(model.parameter_count(),
                                                                kat::sparse::agent_options(config));
      probe = std::make_unique<Model>(make_model());
      probe->compile(space, seed);
      kat::nn::set_conv2d_backend(probe->layers(), backend);
      refresh_loader =
          std::make_unique<kat::data::DataLoader<Scalar, Mem>>(train_set, local_batch, false, 0);
      std::vector<std::size_t> shard;
      kat::sparse::AGENTProbe<Scalar, Mem>::Average average;
#ifdef KAT_ENABLE_MPI
      if (group.size() > 1) {
        for (std::size_t i = static_cast<std::size_t>(group.rank()); i < train_set.size();
             i += static_cast<std::size_t>(group.size())) {
          shard.push_back(i);
        }
        // As DataParallel averages the step's gradient, on a communicator of its own.
        average = [agent_comm = std::make_shared<kat::distributed::Communicator>(train_comm.dup())](
                      const Space &s, const kat::Vector<Scalar, Mem> &g) {
          agent_comm->average(s, g);
        };
      }
#endif
      agent_probe = std::make_shared<kat::sparse::AGENTProbe<Scalar, Mem>>(
          agent, *probe, *refresh_loader, shard, average);
      trainer.add_transform(agent);
    }
    for (const auto &t : setup.transforms) {
      trainer.add_transform(t);
    }
#ifdef KAT_ENABLE_MPI
    trainer.set_process_group(
        std::shared_ptr<const kat::train::ProcessGroup>(&group, [](const auto *) {}));
    std::shared_ptr<kat::distributed::DataParallel<Scalar, Mem>> dp;
    std::shared_ptr<kat::distributed::DASO<Scalar, Mem>> daso_sync;
    // What crosses the nodes: every communicator the training uses.
    std::vector<const kat::distributed::Communicator *> comms{&train_comm, &kfac_comm, &node_comm};
    if (group.size() > 1 && daso(config)) {
      daso_sync = std::make_shared<kat::distributed::DASO<Scalar, Mem>>(
          train_comm, model, kat::distributed::daso_options(config));
      daso_sync->broadcast_parameters(space);
      trainer.set_gradient_sync(daso_sync);
      comms.push_back(&daso_sync->node_communicator());
      comms.push_back(&daso_sync->global_communicator());
    } else if (group.size() > 1) {
      dp = std::make_shared<kat::distributed::DataParallel<Scalar, Mem>>(train_comm, model);
      dp->broadcast_parameters(space); // equal seeds give equal models; make sure of it
      trainer.set_gradient_sync(dp);
    }
    if (group.size() > 1) {
      trainer.set_epoch_order([&sampler](std::size_t e) { return sampler.indices(e); });
    }
#endif
    std::vector<std::string> extra_columns;
    std::shared_ptr<kat::sparse::SparseTraining<Scalar, Mem>> sparse;
    if (config.number("sparsity") > 0) {
      sparse = std::make_shared<kat::sparse::SparseTraining<Scalar, Mem>>(
          model, kat::sparse::sparse_training_options(config, seed));
      sparse->set_profile(profile);
      sparse->attach(space, model); // Dense layers below the crossover density run sparse
      trainer.add_callback(sparse); // before the logger and writer, which print its note
      extra_columns = {"density", "mask_update_s"};
    }
    if (agent_probe) {
      trainer.add_callback(agent_probe); // after the mask's on_train_begin: θ̃ is masked
      extra_columns.push_back("agent_tau");
      extra_columns.push_back("agent_refresh_s");
    }
    for (const auto &c : setup.callbacks) {
      trainer.add_callback(c); // before the logger and writer, which print their notes
    }
    if (std::dynamic_pointer_cast<kat::train::FOSIReport<Scalar, Mem>>(
            setup.callbacks.empty() ? nullptr : setup.callbacks.front())) {
      extra_columns.push_back("fosi_lambda_max");
      extra_columns.push_back("fosi_c");
#ifdef KAT_ENABLE_MPI
      if (dho2_roles) { // estimates arrive late: how late, and what their estimation cost
        for (const char *c :
             {"fosi_staleness_mean", "fosi_staleness_max", "fosi_estimation_s", "fosi_waited_s"}) {
          extra_columns.push_back(c);
        }
      }
#endif
      if (profile) {
        extra_columns.push_back("fosi_lanczos_s");
        extra_columns.push_back("fosi_projection_ms");
        extra_columns.push_back("fosi_curvature_bytes");
        extra_columns.push_back("fosi_bytes_per_step");
      }
    }
#ifdef KAT_ENABLE_MPI
    if (daso_sync) {
      for (const char *c : {"daso_global_skip", "daso_local_skip", "daso_batches_to_wait"}) {
        extra_columns.push_back(c);
      }
      if (profile) { // DASO's local and global communication, split
        for (const char *c : {"daso_local_bytes", "daso_global_bytes", "daso_internode_bytes",
                              "daso_local_s", "daso_global_s"}) {
          extra_columns.push_back(c);
        }
      }
    }
    if (mesh) {
      trainer.add_callback(
          std::make_shared<TensorParallelReport>(mesh->tensor(), predicted_tp_bytes, local_batch));
      extra_columns.push_back("tp_bytes_per_step");
    }
    if (ranks_per_node > 0) {
      trainer.add_callback(std::make_shared<InternodeReport>(comms));
      extra_columns.push_back("internode_bytes");
      extra_columns.push_back("internode_s");
    }
#endif
    if (profile) {
      trainer.add_callback(std::make_shared<kat::train::Profiler<Scalar, Mem>>());
      for (const auto &c : kat::train::Profiler<Scalar, Mem>::columns()) {
        extra_columns.push_back(c);
      }
    }
    trainer.add_callback(std::make_shared<kat::train::ConsoleLogger<Scalar, Mem>>(
        root, progress == "always" || (progress == "auto" && isatty(fileno(stdout)))));
    trainer.add_callback(std::make_shared<kat::train::MetricsWriter<Scalar, Mem>>(
        root ? metrics : std::string(), extra_columns));
    std::shared_ptr<kat::train::Checkpointer<Scalar, Mem>> checkpointer;
    if (!checkpoint_dir.empty()) {
      checkpointer = std::make_shared<kat::train::Checkpointer<Scalar, Mem>>(
          checkpoint_dir, checkpoint_every, keep_checkpoints, group);
      trainer.add_callback(checkpointer);
    }

    if (root) {
      std::printf("KAT %s on %s (concurrency %d); data %s (%zu train, %zu test, loaded in %.2f "
                  "s)\n%s",
                  model_name.c_str(), Space::name(), space.concurrency(), data_dir.c_str(),
                  train_set.size(), test_set.size(), load_seconds,
#ifdef KAT_ENABLE_MPI
                  threads.empty() ? "" : (threads + "\n").c_str()
#else
                  ""
#endif
      );
      std::printf("%s\noptimizer %s%s, lr %g, batch %d, %d epochs, seed %llu\n",
                  model.summary().c_str(), setup.transforms.empty() ? "" : "K-FAC + ",
                  setup.description.empty() ? setup.optimizer->name().c_str()
                                            : setup.description.c_str(),
                  setup.optimizer->lr(), batch_size, epochs, static_cast<unsigned long long>(seed));
#ifdef KAT_ENABLE_MPI
      if (mesh) {
        std::size_t attention = 0, mlp = 0;
        for (const auto &sp : splits.empty()
                                  ? std::vector<kat::distributed::TensorParallelSplit>(vit.depth)
                                  : splits) {
          attention += sp.attention;
          mlp += sp.mlp;
        }
        std::printf("tensor parallel: %d ranks per replica, %d replicas; of %zu blocks, %zu "
                    "split their attention by heads and %zu their MLP (%s)\n",
                    mesh->tensor_size(), mesh->data_size(), vit.depth, attention, mlp,
                    plan_file.empty() ? "Megatron-LM's plan" : plan_file.c_str());
      }
#endif
      if (trainer.gradient_sync()) {
        std::printf("%s; global batch %d (%zu per rank), %zu samples per rank and epoch\n",
                    trainer.gradient_sync()->summary().c_str(), batch_size, local_batch,
                    sampler.per_rank());
      }
      for (const auto &t : setup.transforms) {
        std::printf("%s\n", t->summary().c_str());
      }
      if (sparse) {
        std::printf("%s\n", sparse->summary().c_str());
      }
      if (agent) {
        std::printf("%s\n", agent->summary().c_str());
      }
    }
    if (!resume.empty()) {
      const std::string path = resume == "latest" ? checkpointer->latest() : resume;
      kat::train::resume(trainer, path);
      if (root) {
        const auto &p = trainer.position();
        std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", path.c_str(),
                    static_cast<long long>(p.step), static_cast<long long>(p.epoch),
                    static_cast<long long>(p.batch));
      }
    }
    std::fflush(stdout);
    trainer.fit(space, epochs);
    return 0;
  } catch (const kat::Error &e) {
    std::fprintf(stderr, "kat_train: error: %s\n", e.what());
#ifdef KAT_ENABLE_MPI
    if (world_group.size() > 1) { // the other ranks may be waiting in a collective
      std::fprintf(stderr, "kat_train: rank %d of %d aborts\n", world_group.rank(),
                   world_group.size());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    return 1;
  }
}
