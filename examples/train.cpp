// kat_train: trains a network on Fashion-MNIST (or MNIST) with KAT.
//
//   kat_train --model mlp --optimizer sgd --lr 0.05 --momentum 0.9 --epochs 10
//
// Kokkos options (--kokkos-num-threads=N, ...) are passed on to Kokkos; `--help` lists ours.
//
// Built with -DKAT_ENABLE_MPI=ON, `mpirun -n P kat_train ...` trains data-parallel
// (kat::distributed::DataParallel): --batch-size is the global batch, each rank takes
// --batch-size / P samples of it; see docs/distributed.md.
#include <kat/kat.hpp>

#include <CLI/CLI.hpp>
#ifdef KAT_ENABLE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Scalar = float;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string data_dir = kat::data::default_fashion_mnist_dir;
  std::string model = "mlp";
  std::string optimizer = "sgd";
  int epochs = 10;
  int batch_size = 128;
  double lr = -1; // < 0: the optimizer's default below
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = -1; // < 0: the optimizer's default
  std::string schedule = "constant";
  int warmup_steps = 0;
  int step_size = 0;
  double gamma = 0.1;
  std::uint64_t seed = 0;
  std::size_t train_subset = 0;
  std::string metrics;
  std::string progress = "auto";
  bool profile = false; // --profile: a kat::RegionTimer and per-epoch communication counters
  // --optimizer kfac: K-FAC preconditioning (kat::precond::KFAC) in front of SGD with momentum.
  std::int64_t factor_update_steps = 10;
  std::int64_t inv_update_steps = 100;
  // Tuned on the MLP (docs/benchmarks.md): the inverse path's per-factor damping √λ and a
  // tight KL clip reach 88% in 2 epochs; kfac-pytorch's defaults (eigen, 0.001, 0.001) in 5+.
  double damping = 0.01;
  double factor_decay = 0.95;
  double kl_clip = 1e-4;
  std::string compute_method = "inverse";
  bool pi_correction = false;
  bool factored_preconditioning = false;
  std::vector<std::string> skip_layers;
  std::string factor_precision = "float";
  std::string inverse_precision = "double";
  // MPI builds: how K-FAC is distributed over the ranks ("" = not; "dkfac":
  // kat::distributed::DKFAC; "dp-kfac": kat::distributed::DPKFAC, layers assigned by
  // dp_kfac_assignment; "kaisa": kat::distributed::KAISA with grad_worker_fraction k/P, k dividing
  // P).
  std::string dist_strategy;
  std::string dp_kfac_assignment = "round-robin";
  double grad_worker_fraction = 1.0;
  // Checkpoints (kat::io::CheckpointDirectory): none without a directory.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0; // steps; 0: at the end of every epoch
  std::string resume;                // "", "latest" or a checkpoint file
  std::size_t keep_checkpoints = 3;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::unique_ptr<kat::optim::Optimizer<Scalar, Mem>> build_optimizer(const Options &o,
                                                                    std::size_t n) {
  if (o.optimizer == "sgd" || o.optimizer == "kfac") {
    typename kat::optim::SGD<Scalar, Mem>::Options s;
    s.lr = o.lr;
    s.momentum = o.momentum;
    s.nesterov = o.nesterov;
    s.weight_decay = o.weight_decay;
    return std::make_unique<kat::optim::SGD<Scalar, Mem>>(n, s);
  }
  if (o.optimizer == "adam") {
    typename kat::optim::Adam<Scalar, Mem>::Options a;
    a.lr = o.lr;
    a.weight_decay = o.weight_decay;
    return std::make_unique<kat::optim::Adam<Scalar, Mem>>(n, a);
  }
  typename kat::optim::AdamW<Scalar, Mem>::Options a;
  a.lr = o.lr;
  a.weight_decay = o.weight_decay;
  return std::make_unique<kat::optim::AdamW<Scalar, Mem>>(n, a);
}

// K-FAC with the precisions chosen on the command line (and its distribution strategy), behind
// type-erased functions. Only step() runs without --profile.
struct Preconditioner {
  // One K-FAC step (collective with a distributed strategy).
  std::function<void(const Space &)> step;
  // Whether the next step() updates the Kronecker factors (a second-order update).
  std::function<bool()> updates_factors;
  // This rank's K-FAC state: KFAC::state_bytes() plus the strategy's workspace.
  std::function<std::size_t()> state_bytes;
  // Payload bytes K-FAC's own communicator has handed to MPI so far (CommunicatorStats::
  // total()); 0 without a distributed strategy.
  std::function<std::uint64_t()> comm_bytes;
  // This rank's K-FAC state (KFAC::state_dict), and restoring it.
  std::function<kat::StateDict()> state_dict;
  std::function<void(const kat::StateDict &)> load_state_dict;

  explicit operator bool() const { return static_cast<bool>(step); }
};

// The communicator distributed K-FAC runs on (MPI builds with --dist-strategy), or none.
#ifdef KAT_ENABLE_MPI
using KFACComm = kat::distributed::Communicator;
#else
struct KFACComm {};
#endif

// Called once after training on every rank (collective with a distributed strategy): prints
// the K-FAC state per rank.
using KFACReport = std::function<void()>;

#ifdef KAT_ENABLE_MPI
// Every rank's `values` (the same count on every rank), gathered: element r is rank r's
// (collective).
std::vector<std::vector<double>> gather_values(kat::distributed::Communicator &comm,
                                               const std::vector<double> &values) {
  const std::size_t n = values.size();
  kat::Vector<double, Mem> in("kat_train::values", n),
      out("kat_train::all_values", n * std::size_t(comm.size()));
  auto h_in = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < n; ++i)
    h_in(i) = values[i];
  Kokkos::deep_copy(in, h_in);
  comm.allgather(Space(), in, out);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  std::vector<std::vector<double>> all(std::size_t(comm.size()), std::vector<double>(n));
  for (std::size_t r = 0; r < all.size(); ++r)
    for (std::size_t i = 0; i < n; ++i)
      all[r][i] = h(r * n + i);
  return all;
}

// Every rank's `bytes`, gathered (collective).
std::vector<std::size_t> gather_bytes(kat::distributed::Communicator &comm, std::size_t bytes) {
  std::vector<std::size_t> all;
  for (const auto &rank : gather_values(comm, {static_cast<double>(bytes)}))
    all.push_back(static_cast<std::size_t>(rank[0]));
  return all;
}

std::string join_bytes(const std::vector<std::size_t> &bytes) {
  std::string s;
  for (std::size_t r = 0; r < bytes.size(); ++r)
    s += (r ? ", " : "") + std::to_string(bytes[r]);
  return s;
}
#endif

template <class InverseScalar, class FactorScalar>
Preconditioner make_kfac(const Options &o, kat::nn::Sequential<Scalar, Mem> &model,
                         const kat::optim::LRSchedule &schedule, KFACComm *comm,
                         KFACReport *report) {
  using KFAC = kat::precond::KFAC<Scalar, Mem, InverseScalar, FactorScalar>;
  typename KFAC::Options k;
  k.factor_update_steps = o.factor_update_steps;
  k.inv_update_steps = o.inv_update_steps;
  k.damping = o.damping;
  k.factor_decay = o.factor_decay;
  k.kl_clip = o.kl_clip;
  k.lr = [schedule](std::int64_t step) { return schedule(step); }; // the SGD step's rate
  k.compute_method = o.compute_method == "eigen" ? kat::precond::ComputeMethod::eigen
                                                 : kat::precond::ComputeMethod::inverse;
  k.pi_correction = o.pi_correction;
  k.factored_preconditioning = o.factored_preconditioning;
  k.skip_layers = o.skip_layers;
  auto kfac = std::make_shared<KFAC>(k);
  const std::size_t layers = kfac->register_model(model);
  Preconditioner p;
  p.step = [kfac](const Space &space) { kfac->step(space); };
  p.updates_factors = [kfac]() {
    const std::int64_t step = kfac->steps();
    return step % kfac->values(step).factor_update_steps == 0; // as KFAC::step decides
  };
  p.state_bytes = [kfac]() { return kfac->state_bytes(); };
  p.comm_bytes = []() { return std::uint64_t(0); };
  p.state_dict = [kfac]() { return kfac->state_dict(); };
  p.load_state_dict = [kfac](const kat::StateDict &state) { kfac->load_state_dict(state); };
  bool root = true; // only rank 0 prints
#ifdef KAT_ENABLE_MPI
  root = comm == nullptr || comm->rank() == 0;
#endif
  if (root)
    std::printf("K-FAC on %zu layers (%s path; factors %s, decompositions %s): "
                "factor_update_steps %lld, inv_update_steps %lld, damping %g, factor_decay %g, "
                "kl_clip %g\n",
                layers, o.compute_method.c_str(), o.factor_precision.c_str(),
                o.inverse_precision.c_str(), static_cast<long long>(o.factor_update_steps),
                static_cast<long long>(o.inv_update_steps), o.damping, o.factor_decay, o.kl_clip);
#ifdef KAT_ENABLE_MPI
  if (comm != nullptr && o.dist_strategy == "dkfac") {
    // D-KFAC: the batch factor estimates are averaged over the ranks (upper triangles).
    auto dkfac = std::make_shared<kat::distributed::DKFAC<KFAC>>(*comm, *kfac);
    if (root) {
      std::printf("D-KFAC on %d ranks: every rank builds, averages (symmetric all-reduce, %zu "
                  "bytes per factor update) and decomposes every factor\n",
                  comm->size(), dkfac->bytes_per_factor_update());
    }
    p.state_bytes = [kfac, dkfac]() { return kfac->state_bytes() + dkfac->workspace_bytes(); };
    *report = [state = p.state_bytes, dkfac, comm, root]() {
      const auto bytes = gather_bytes(*comm, state());
      if (root)
        std::printf("D-KFAC: %llu factor updates, %llu bytes all-reduced (rank 0); K-FAC state "
                    "bytes per rank: %s\n",
                    static_cast<unsigned long long>(dkfac->stats().factor_updates),
                    static_cast<unsigned long long>(dkfac->stats().allreduce.bytes),
                    join_bytes(bytes).c_str());
    };
    p.step = [kfac, dkfac](const Space &space) { kfac->step(space); };
    p.comm_bytes = [comm]() { return comm->stats().total().bytes; };
    return p;
  }
  if (comm != nullptr && o.dist_strategy == "dp-kfac") {
    // DP-KFAC: each layer's factors on one rank (its local batch only); P broadcast.
    kat::distributed::DPKFACOptions d;
    d.assignment = o.dp_kfac_assignment == "balanced"
                       ? kat::distributed::LayerAssignment::balanced
                       : kat::distributed::LayerAssignment::round_robin;
    auto dpkfac = std::make_shared<kat::distributed::DPKFAC<KFAC>>(*comm, *kfac, d);
    if (root) {
      std::string owners;
      for (std::size_t i = 0; i < dpkfac->owners().size(); ++i)
        owners += (i ? " " : "") + std::to_string(dpkfac->owner(i));
      std::printf("DP-KFAC on %d ranks (%s assignment, layer owners: %s): each rank builds and "
                  "decomposes its layers' factors from its local batch; P broadcast in the model "
                  "precision, %zu bytes per step\n",
                  comm->size(), o.dp_kfac_assignment.c_str(), owners.c_str(),
                  dpkfac->bytes_per_step());
    }
    p.state_bytes = [kfac, dpkfac]() { return kfac->state_bytes() + dpkfac->workspace_bytes(); };
    *report = [state = p.state_bytes, dpkfac, comm, root]() {
      const auto bytes = gather_bytes(*comm, state());
      if (root)
        std::printf("DP-KFAC: %llu steps, %llu bytes broadcast (%llu calls); K-FAC state bytes "
                    "per rank: %s\n",
                    static_cast<unsigned long long>(dpkfac->stats().steps),
                    static_cast<unsigned long long>(dpkfac->stats().broadcast.bytes),
                    static_cast<unsigned long long>(dpkfac->stats().broadcast.calls),
                    join_bytes(bytes).c_str());
    };
    p.step = [kfac, dpkfac](const Space &space) { kfac->step(space); };
    p.comm_bytes = [comm]() { return comm->stats().total().bytes; };
    return p;
  }
  if (comm != nullptr && o.dist_strategy == "kaisa") {
    // KAISA: factors averaged as in D-KFAC; each decomposition on one rank (greedy, d^3);
    // decompositions broadcast within a layer's gradient workers, P from them to the others
    // (COMM-OPT f = 1: all ranks are workers; MEM-OPT f = 1/P: one; HYBRID-OPT in between).
    kat::distributed::KAISAOptions k;
    k.grad_worker_fraction = o.grad_worker_fraction;
    auto kaisa = std::make_shared<kat::distributed::KAISA<KFAC>>(*comm, *kfac, k);
    using Mode = typename kat::distributed::KAISA<KFAC>::Mode;
    const Mode mode = kaisa->mode();
    const char *mode_name = mode == Mode::mem_opt      ? "MEM-OPT"
                            : mode == Mode::hybrid_opt ? "HYBRID-OPT"
                                                       : "COMM-OPT";
    if (root) {
      std::printf("KAISA on %d ranks, grad_worker_fraction %g (%s): %zu bytes all-reduced per "
                  "factor update, %zu bytes broadcast per decomposition update, %zu per step\n",
                  comm->size(), o.grad_worker_fraction, mode_name, kaisa->bytes_per_factor_update(),
                  kaisa->bytes_per_decomposition_update(), kaisa->bytes_per_step());
    }
    p.state_bytes = [kfac, kaisa]() { return kfac->state_bytes() + kaisa->workspace_bytes(); };
    *report = [state = p.state_bytes, kaisa, comm, root]() {
      const auto bytes = gather_bytes(*comm, state());
      if (root)
        std::printf("KAISA: %llu bytes all-reduced, %llu decomposition and %llu gradient bytes "
                    "broadcast (rank 0); K-FAC state bytes per rank: %s\n",
                    static_cast<unsigned long long>(kaisa->dkfac().stats().allreduce.bytes),
                    static_cast<unsigned long long>(kaisa->stats().decomposition_broadcast.bytes),
                    static_cast<unsigned long long>(kaisa->stats().gradient_broadcast.bytes),
                    join_bytes(bytes).c_str());
    };
    p.step = [kfac, kaisa](const Space &space) { kfac->step(space); };
    // From KAISA's own counters: HYBRID-OPT broadcasts on sub-communicators, which `comm`
    // does not count.
    p.comm_bytes = [kaisa]() {
      return kaisa->dkfac().stats().allreduce.bytes + kaisa->stats().decomposition_broadcast.bytes +
             kaisa->stats().gradient_broadcast.bytes;
    };
    return p;
  }
#else
  (void)comm;
  (void)report;
#endif
  return p;
}

Preconditioner build_preconditioner(const Options &o, kat::nn::Sequential<Scalar, Mem> &model,
                                    const kat::optim::LRSchedule &schedule, KFACComm *comm,
                                    KFACReport *report) {
  if (o.optimizer != "kfac") {
    return {};
  }
  const bool inverse_double = o.inverse_precision == "double";
  const bool factor_double = o.factor_precision == "double";
  if (inverse_double) {
    return factor_double ? make_kfac<double, double>(o, model, schedule, comm, report)
                         : make_kfac<double, float>(o, model, schedule, comm, report);
  }
  return factor_double ? make_kfac<float, double>(o, model, schedule, comm, report)
                       : make_kfac<float, float>(o, model, schedule, comm, report);
}

kat::optim::LRSchedule build_schedule(const Options &o, std::int64_t total_steps) {
  kat::optim::LRSchedule s;
  if (o.schedule == "cosine") {
    s = kat::optim::cosine_lr(o.lr, total_steps);
  } else if (o.schedule == "step") {
    s = kat::optim::step_lr(o.lr, o.step_size, o.gamma);
  } else {
    s = kat::optim::constant_lr(o.lr);
  }
  return o.warmup_steps > 0 ? kat::optim::linear_warmup(o.warmup_steps, s) : s;
}

// --profile: where one rank's K-FAC steps spent their time, in seconds, from the exclusive
// (self) times of the call paths under kat::precond::KFAC::step. Every region's exclusive time
// lands in exactly one component, so the components add up to `total`, the inclusive time of the
// steps: communication is every region at or below a kat::distributed:: region (the strategies'
// hooks and the Communicator's collectives, wherever K-FAC calls them); the rest goes to the
// K-FAC phase it runs in (update_factors, decompose, precondition), or to `other` (the step's
// own bookkeeping).
struct KFACTimes {
  double factors = 0, comm = 0, decomposition = 0, precondition = 0, other = 0, total = 0;
};
// Through an alias: nvcc's generated host code spells the array of member pointers with
// parentheses that g++ warns about.
using KFACTimesField = double KFACTimes::*;
constexpr KFACTimesField kfac_times_fields[] = {&KFACTimes::factors,       &KFACTimes::comm,
                                                &KFACTimes::decomposition, &KFACTimes::precondition,
                                                &KFACTimes::other,         &KFACTimes::total};

KFACTimes kfac_times(const kat::RegionTimer &timer) {
  KFACTimes t;
  const auto is_comm = [](const std::string &name) {
    return name.rfind("kat::distributed::", 0) == 0;
  };
  for (const auto &e : timer.paths()) {
    const auto step = std::find(e.path.begin(), e.path.end(), "kat::precond::KFAC::step");
    if (step == e.path.end()) {
      continue;
    }
    if (step + 1 == e.path.end()) {
      t.total += e.seconds;
      t.other += e.self_seconds;
      continue;
    }
    const std::string &phase = *(step + 1);
    double &component = std::any_of(step + 1, e.path.end(), is_comm)    ? t.comm
                        : phase == "kat::precond::KFAC::update_factors" ? t.factors
                        : phase == "kat::precond::KFAC::decompose"      ? t.decomposition
                        : phase == "kat::precond::KFAC::precondition"   ? t.precondition
                                                                        : t.other;
    component += e.self_seconds;
  }
  return t;
}

// --profile: K-FAC's communication over one epoch on this rank, counted around each step.
struct StepCounters {
  std::uint64_t steps = 0;
  std::uint64_t updates = 0;      // steps that updated the factors (second-order updates)
  std::uint64_t bytes = 0;        // K-FAC communicator payload over all steps
  std::uint64_t update_bytes = 0; // ... over the second-order updates only
};

// One epoch's --profile numbers as printed and written: times in ms per step, the max (and
// mean) over the ranks; bytes per step of rank 0 (the same on every rank for all strategies).
struct Profile {
  bool kfac = false;      // --optimizer kfac
  bool kfac_comm = false; // with a distributed strategy (K-FAC communicates)
  bool gradients = false; // data parallel (gradient all-reduce)
  int ranks = 1;
  KFACTimes max_ms, mean_ms;
  double kfac_bytes_per_step = 0, kfac_bytes_per_update = 0;
  std::uint64_t updates = 0;
  double gradient_bytes_per_step = 0;
  double exposed_seconds = 0; // the max over the ranks
  double state_max = 0, state_min = 0, state_root = 0;
};

// The per-rank values gathered for a Profile: kfac_times_fields in ms per step, then the
// exposed seconds and the state bytes.
std::vector<double> profile_values(const KFACTimes &t, double steps, double exposed,
                                   double state_bytes) {
  const double ms = steps > 0 ? 1e3 / steps : 0.0;
  std::vector<double> values;
  for (const auto field : kfac_times_fields)
    values.push_back(t.*field * ms);
  values.push_back(exposed);
  values.push_back(state_bytes);
  return values;
}

Profile make_profile(const std::vector<std::vector<double>> &ranks, const StepCounters &c) {
  Profile p;
  p.ranks = static_cast<int>(ranks.size());
  const std::size_t n = std::size(kfac_times_fields);
  p.state_min = p.state_root = ranks[0][n + 1];
  for (const auto &r : ranks) {
    for (std::size_t i = 0; i < n; ++i) {
      p.max_ms.*kfac_times_fields[i] = std::max(p.max_ms.*kfac_times_fields[i], r[i]);
      p.mean_ms.*kfac_times_fields[i] += r[i] / static_cast<double>(ranks.size());
    }
    p.exposed_seconds = std::max(p.exposed_seconds, r[n]);
    p.state_max = std::max(p.state_max, r[n + 1]);
    p.state_min = std::min(p.state_min, r[n + 1]);
  }
  p.updates = c.updates;
  if (c.steps > 0)
    p.kfac_bytes_per_step = static_cast<double>(c.bytes) / static_cast<double>(c.steps);
  if (c.updates > 0)
    p.kfac_bytes_per_update = static_cast<double>(c.update_bytes) / static_cast<double>(c.updates);
  return p;
}

// The line --profile prints after each epoch line.
std::string profile_line(const Profile &p) {
  char buf[512];
  std::vector<std::string> parts;
  if (p.kfac) {
    const auto pair = [&](const char *name, double KFACTimes::*field) {
      if (p.ranks > 1) {
        std::snprintf(buf, sizeof buf, "%s %.3f | %.3f ms", name, p.max_ms.*field,
                      p.mean_ms.*field);
      } else {
        std::snprintf(buf, sizeof buf, "%s %.3f ms", name, p.max_ms.*field);
      }
      return std::string(buf);
    };
    std::string times =
        pair("factors", &KFACTimes::factors) + ", " + pair("comm", &KFACTimes::comm) + ", " +
        pair("decomposition", &KFACTimes::decomposition) + ", " +
        pair("precondition", &KFACTimes::precondition) + ", " + pair("other", &KFACTimes::other) +
        " of " + pair("K-FAC step", &KFACTimes::total);
    if (p.ranks > 1) {
      std::snprintf(buf, sizeof buf, " (per step, max | mean over %d ranks)", p.ranks);
    } else {
      std::snprintf(buf, sizeof buf, " (per step)");
    }
    parts.push_back(times + buf);
    if (p.kfac_comm) {
      std::snprintf(buf, sizeof buf,
                    "K-FAC %.0f B/step, %.0f B per second-order update (%llu "
                    "update%s)",
                    p.kfac_bytes_per_step, p.kfac_bytes_per_update,
                    static_cast<unsigned long long>(p.updates), p.updates == 1 ? "" : "s");
    } else {
      std::snprintf(buf, sizeof buf, "K-FAC %llu second-order update%s, no communication",
                    static_cast<unsigned long long>(p.updates), p.updates == 1 ? "" : "s");
    }
    parts.emplace_back(buf);
  }
  if (p.gradients) {
    std::snprintf(buf, sizeof buf, "gradients %.0f B/step, exposed %.3f s (max rank)",
                  p.gradient_bytes_per_step, p.exposed_seconds);
    parts.emplace_back(buf);
  }
  if (p.kfac) {
    if (p.ranks > 1) {
      std::snprintf(buf, sizeof buf,
                    "K-FAC state %.2f MB (max rank), %.2f MB (min), %.2f MB "
                    "(rank 0)",
                    p.state_max / 1e6, p.state_min / 1e6, p.state_root / 1e6);
    } else {
      std::snprintf(buf, sizeof buf, "K-FAC state %.2f MB", p.state_max / 1e6);
    }
    parts.emplace_back(buf);
  }
  std::string line = "profile: ";
  for (std::size_t i = 0; i < parts.size(); ++i)
    line += (i ? "; " : "") + parts[i];
  return parts.empty() ? line + "nothing to profile (no K-FAC, one rank)" : line;
}

// The --profile metrics columns: name, value and decimals. K-FAC times in ms per step and the
// exposed gradient communication are the max over the ranks, bytes per step rank 0's.
struct ProfileColumn {
  const char *name;
  double value;
  int decimals;
};
std::vector<ProfileColumn> profile_columns(const Profile &p) {
  return {{"factor_ms", p.max_ms.factors, 6},
          {"comm_ms", p.max_ms.comm, 6},
          {"decomposition_ms", p.max_ms.decomposition, 6},
          {"precondition_ms", p.max_ms.precondition, 6},
          {"kfac_bytes_per_step", p.kfac_bytes_per_step, 1},
          {"kfac_bytes_per_second_order_update", p.kfac_bytes_per_update, 1},
          {"second_order_updates", static_cast<double>(p.updates), 0},
          {"gradient_bytes_per_step", p.gradient_bytes_per_step, 1},
          {"exposed_comm_seconds", p.exposed_seconds, 6},
          {"kfac_state_bytes_max", p.state_max, 0},
          {"kfac_state_bytes_min", p.state_min, 0},
          {"other_ms", p.max_ms.other, 6},
          {"kfac_step_ms", p.max_ms.total, 6}};
}

// One line per epoch, as CSV (header first) or JSON lines, chosen by the file extension; with
// `profile`, the profile_columns after the others.
class MetricsWriter {
public:
  MetricsWriter(const std::string &path, bool profile) : profile_(profile) {
    if (path.empty()) {
      return;
    }
    const auto ends_with = [&](const std::string &suffix) {
      return path.size() >= suffix.size() &&
             path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".csv")) {
      csv_ = true;
    } else if (!ends_with(".jsonl") && !ends_with(".json")) {
      throw kat::ValueError("--metrics: the file name must end in .csv or .jsonl, got '" + path +
                            "'");
    }
    out_.open(path, std::ios::trunc);
    if (!out_) {
      throw kat::IOError("--metrics: cannot open '" + path + "' for writing");
    }
    if (csv_) {
      out_ << "epoch,wall_seconds,samples_per_second,train_loss,test_loss,test_accuracy,lr";
      if (profile_) {
        for (const auto &column : profile_columns(Profile()))
          out_ << ',' << column.name;
      }
      out_ << '\n';
      out_.flush();
    }
  }

  // `profile` is required when constructed with profile = true.
  void write(int epoch, double wall, double rate, double train_loss, double test_loss,
             double accuracy, double lr, const Profile *profile = nullptr) {
    if (!out_.is_open()) {
      return;
    }
    char line[320];
    if (csv_) {
      std::snprintf(line, sizeof line, "%d,%.6f,%.1f,%.6f,%.6f,%.6f,%.6g", epoch, wall, rate,
                    train_loss, test_loss, accuracy, lr);
    } else {
      std::snprintf(line, sizeof line,
                    "{\"epoch\": %d, \"wall_seconds\": %.6f, \"samples_per_second\": %.1f, "
                    "\"train_loss\": %.6f, \"test_loss\": %.6f, \"test_accuracy\": %.6f, "
                    "\"lr\": %.6g",
                    epoch, wall, rate, train_loss, test_loss, accuracy, lr);
    }
    std::string text = line;
    if (profile_ && profile != nullptr) {
      for (const auto &c : profile_columns(*profile)) {
        if (csv_) {
          std::snprintf(line, sizeof line, ",%.*f", c.decimals, c.value);
        } else {
          std::snprintf(line, sizeof line, ", \"%s\": %.*f", c.name, c.decimals, c.value);
        }
        text += line;
      }
    }
    text += csv_ ? "\n" : "}\n";
    out_ << text; // whole lines only, flushed each epoch: an interrupted run leaves no half line
    out_.flush();
  }

private:
  std::ofstream out_;
  bool csv_ = false;
  bool profile_ = false;
};

// A live bar on a terminal; silence otherwise (the per-epoch line is printed either way).
class Progress {
public:
  Progress(bool live, int epoch, int epochs, std::size_t batches)
      : live_(live), epoch_(epoch), epochs_(epochs), batches_(batches) {}

  void update(std::size_t done, double loss, double rate) {
    if (!live_ || (seconds_since(last_) < 0.1 && done != batches_)) {
      return;
    }
    last_ = Clock::now();
    const int width = 30;
    const int filled = static_cast<int>(width * done / std::max<std::size_t>(batches_, 1));
    std::fprintf(stdout, "\repoch %d/%d [%s%s] %zu/%zu loss %.4f %.0f samples/s", epoch_, epochs_,
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
                 batches_, loss, rate);
    std::fflush(stdout);
  }
  void finish() {
    if (live_) {
      std::fprintf(stdout, "\r\033[K");
    }
  }

private:
  bool live_;
  int epoch_, epochs_;
  std::size_t batches_;
  Clock::time_point last_ = Clock::now() - std::chrono::seconds(1);
};

// Sums over the test samples evaluated (all of them, or this rank's shard).
struct Evaluation {
  double loss_sum = 0;
  std::size_t correct = 0;
  std::size_t samples = 0;
  double loss() const { return loss_sum / static_cast<double>(samples); }
  double accuracy() const { return static_cast<double>(correct) / static_cast<double>(samples); }
};

// The whole test set, or with `shard` only the samples it names.
Evaluation evaluate(const Space &space, kat::nn::Sequential<Scalar, Mem> &model,
                    kat::data::DataLoader<Scalar, Mem> &loader,
                    const std::vector<std::size_t> *shard = nullptr) {
  kat::nn::SoftmaxCrossEntropy<Scalar, Mem> ce;
  model.eval();
  if (shard != nullptr) {
    loader.start_epoch(0, *shard);
  } else {
    loader.start_epoch(0);
  }
  kat::Matrix<Scalar, Mem> x;
  kat::Vector<std::int32_t, Mem> y;
  Evaluation e;
  while (loader.next(space, x, y)) {
    const auto &logits = model.forward(space, x);
    e.loss_sum += ce.forward(space, logits, y) * static_cast<double>(x.extent(0));
    e.correct += kat::nn::count_correct(space, logits, kat::Vector<const std::int32_t, Mem>(y));
  }
  model.train();
  e.samples = loader.epoch_size();
  return e;
}

// This process's place among the MPI ranks: rank 0 of 1 without MPI or under one rank.
struct Ranks {
  int rank = 0;
  int size = 1;
  std::string threads; // how the threads per rank were chosen (printed by rank 0), or empty
};

// Where a training run stands between two steps: the counters a checkpoint's "trainer.*"
// entries hold besides the model's, the optimizer's and the loader's state. A checkpoint at
// the end of an epoch is saved as batch 0 of the next one.
struct Position {
  std::int64_t step = 0;  // optimizer steps so far (the schedule's index)
  std::int64_t epoch = 1; // the epoch in progress, 1-based
  std::int64_t batch = 0; // batches of it done
  double loss_sum = 0;    // this epoch's summed training loss so far (this rank's)
  std::uint64_t seen = 0; // this epoch's samples so far (this rank's)
};

// What a checkpoint records of the run's configuration, checked on --resume: a checkpoint of
// another model, optimizer, seed, batch or rank count cannot continue this run.
std::vector<std::pair<std::string, std::string>> run_identity(const Options &o,
                                                              const Ranks &ranks) {
  return {{"model", o.model},
          {"optimizer", o.optimizer},
          {"seed", std::to_string(o.seed)},
          {"batch_size", std::to_string(o.batch_size)},
          {"ranks", std::to_string(ranks.size)}};
}

kat::StateDict trainer_state(const Options &o, const Ranks &ranks, const Position &p) {
  kat::StateDict s;
  s.set("step", p.step);
  s.set("epoch", p.epoch);
  s.set("batch", p.batch);
  s.set("loss_sum", p.loss_sum);
  s.set("seen", p.seen);
  for (const auto &[key, value] : run_identity(o, ranks)) {
    s.set_text(key, value);
  }
  return s;
}

// Checks "trainer.*" of a checkpoint against this run and returns its position.
Position load_trainer_state(const kat::StateDict &s, const Options &o, const Ranks &ranks,
                            const std::string &path) {
  std::vector<std::string> names{"step", "epoch", "batch", "loss_sum", "seen"};
  for (const auto &[key, value] : run_identity(o, ranks)) {
    names.push_back(key);
    const std::string saved = s.text(key);
    if (saved != value) {
      throw kat::ValueError(kat::detail::concat("--resume ", path,
                                                ": the checkpoint was written with ", key, " ",
                                                saved, ", this run has ", key, " ", value));
    }
  }
  s.require_names("--resume " + path, names);
  Position p;
  p.step = s.get<std::int64_t>("step");
  p.epoch = s.get<std::int64_t>("epoch");
  p.batch = s.get<std::int64_t>("batch");
  p.loss_sum = s.get<double>("loss_sum");
  p.seen = s.get<std::uint64_t>("seen");
  if (p.step < 0 || p.epoch < 1 || p.batch < 0) {
    throw kat::ValueError(kat::detail::concat("--resume ", path, ": step ", p.step, ", epoch ",
                                              p.epoch, ", batch ", p.batch, " are not a position"));
  }
  return p;
}

int run(const Options &o, const Ranks &ranks) {
  const Space space;
  const bool root = ranks.rank == 0;    // only rank 0 prints and writes --metrics
  const bool parallel = ranks.size > 1; // data parallel over the ranks
  const std::size_t local_batch = static_cast<std::size_t>(o.batch_size / ranks.size);
  MetricsWriter metrics(root ? o.metrics : std::string(), o.profile); // fails before the data
  const auto load_t0 = Clock::now();
  auto train_set = kat::data::load_fashion_mnist(o.data_dir, kat::data::Split::train);
  const auto test_set = kat::data::load_fashion_mnist(o.data_dir, kat::data::Split::test);
  if (o.train_subset > 0) {
    train_set = train_set.take(std::min(o.train_subset, train_set.size()));
  }
  kat::data::DataLoader<Scalar, Mem> train_loader(train_set, local_batch, true, o.seed);
  kat::data::DataLoader<Scalar, Mem> test_loader(test_set, 1000, false, 0);
  // With P > 1 ranks every rank holds the whole data set and trains on its shard of one
  // shared permutation per epoch (same seed everywhere), and evaluates the test samples
  // rank, rank + P, ... (all 10000 over the ranks, counts summed by reduce_metrics).
  const kat::distributed::DistributedSampler sampler(train_set.size(), ranks.rank, ranks.size,
                                                     o.seed);
  std::vector<std::size_t> test_shard;
  for (std::size_t i = static_cast<std::size_t>(ranks.rank); parallel && i < test_set.size();
       i += static_cast<std::size_t>(ranks.size)) {
    test_shard.push_back(i);
  }

  auto model = kat::nn::models::by_name<Scalar, Mem>(o.model, train_set.shape, train_set.classes);
  model.compile(space, o.seed);
#ifdef KAT_ENABLE_MPI
  // The Communicator outlives the DataParallel, which outlives the hook it installs.
  auto comm = kat::distributed::Communicator::world();
  std::unique_ptr<kat::distributed::DataParallel<Scalar, Mem>> dp;
  if (parallel) {
    dp = std::make_unique<kat::distributed::DataParallel<Scalar, Mem>>(comm, model);
    dp->broadcast_parameters(space); // equal seeds give equal models; make sure of it
    model.set_backward_hook(dp->backward_hook(space));
  }
#endif
  auto optimizer = build_optimizer(o, model.parameter_count());
  const std::int64_t steps_per_epoch =
      static_cast<std::int64_t>(parallel ? sampler.batches(local_batch) : train_loader.batches());
  const auto schedule = build_schedule(o, steps_per_epoch * o.epochs);
#ifdef KAT_ENABLE_MPI
  // The hook is collective: D-KFAC all-reduces on its own communicator (own counters).
  std::unique_ptr<kat::distributed::Communicator> kfac_comm;
  if (!o.dist_strategy.empty()) {
    kfac_comm = std::make_unique<kat::distributed::Communicator>(comm.dup());
  }
  KFACComm *kfac_comm_ptr = kfac_comm.get();
#else
  KFACComm *kfac_comm_ptr = nullptr;
#endif
  KFACReport kfac_report;
  const Preconditioner precondition =
      build_preconditioner(o, model, schedule, kfac_comm_ptr, &kfac_report);
  const bool live =
      root && (o.progress == "always" || (o.progress == "auto" && isatty(fileno(stdout))));

  if (root) {
    std::printf("KAT %s on %s (concurrency %d); data %s (%zu train, %zu test, loaded in %.2f s)\n",
                o.model.c_str(), Space::name(), Space().concurrency(), o.data_dir.c_str(),
                train_set.size(), test_set.size(), seconds_since(load_t0));
    if (!ranks.threads.empty()) {
      std::printf("%s\n", ranks.threads.c_str());
    }
    std::printf("%s\n", model.summary().c_str());
    std::printf("optimizer %s%s, lr %g, batch %d, %d epochs, seed %llu\n",
                precondition ? "K-FAC + " : "", optimizer->name().c_str(), o.lr, o.batch_size,
                o.epochs, static_cast<unsigned long long>(o.seed));
#ifdef KAT_ENABLE_MPI
    if (parallel) {
      std::printf("data parallel on %d ranks: global batch %d (%zu per rank), %zu samples per "
                  "rank and epoch, %zu gradient bucket%s\n",
                  ranks.size, o.batch_size, local_batch, sampler.per_rank(), dp->buckets().size(),
                  dp->buckets().size() == 1 ? "" : "s");
    }
#endif
  }

  // --checkpoint-dir / --resume: one file per rank and checkpoint (kat/io/checkpoint.hpp).
  std::optional<kat::io::CheckpointDirectory> checkpoints;
  if (!o.checkpoint_dir.empty()) {
    checkpoints.emplace(o.checkpoint_dir, o.keep_checkpoints, ranks.rank, ranks.size);
  }
  // The minimum of `value` over the ranks (collective with MPI).
  const auto min_over_ranks = [&](std::int64_t value) {
#ifdef KAT_ENABLE_MPI
    if (parallel) {
      Kokkos::View<std::int64_t *, Kokkos::HostSpace> v("kat_train::min", 1);
      v(0) = value;
      comm.allreduce(Kokkos::DefaultHostExecutionSpace(), v, kat::distributed::ReduceOp::min);
      return v(0);
    }
#endif
    return value;
  };
  Position position;
  if (!o.resume.empty()) {
    std::string path = o.resume;
    if (o.resume == "latest") {
      // The newest step every rank has (a rank killed while saving may lack the newest).
      const std::int64_t latest = min_over_ranks(checkpoints->latest().value_or(-1));
      if (latest < 0) {
        std::string held;
        for (const int r : checkpoints->rank_counts()) {
          held += (held.empty() ? "" : ", ") + std::to_string(r);
        }
        throw kat::ValueError(kat::detail::concat(
            "--resume latest: no checkpoint for ", ranks.size, " rank(s) in every rank's view of ",
            o.checkpoint_dir,
            held.empty() ? std::string() : " (it holds checkpoints of " + held + " rank(s))"));
      }
      path = checkpoints->path(latest);
    }
    const kat::StateDict state = kat::io::load_checkpoint(path);
    std::vector<std::string> parts{"model.", "optimizer.", "loader.", "trainer."};
    if (precondition) {
      parts.push_back("kfac.");
    }
    state.require_names("--resume " + path, parts);
    position = load_trainer_state(state.sub("trainer"), o, ranks, path);
    model.load_state_dict(state.sub("model"));
    optimizer->load_state_dict(state.sub("optimizer"));
    train_loader.load_state_dict(state.sub("loader"));
    if (precondition) {
      precondition.load_state_dict(state.sub("kfac"));
    }
    if (root) {
      std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", path.c_str(),
                  static_cast<long long>(position.step), static_cast<long long>(position.epoch),
                  static_cast<long long>(position.batch));
    }
  }
  const auto save_checkpoint = [&](const Position &p) {
    kat::StateDict state;
    state.merge("model", model.state_dict());
    state.merge("optimizer", optimizer->state_dict());
    state.merge("loader", train_loader.state_dict());
    if (precondition) {
      state.merge("kfac", precondition.state_dict());
    }
    state.merge("trainer", trainer_state(o, ranks, p));
    checkpoints->save(p.step, state, !parallel);
#ifdef KAT_ENABLE_MPI
    if (parallel) { // delete old files once every rank holds the new step
      comm.barrier();
      checkpoints->prune();
    }
#endif
  };

  kat::nn::SoftmaxCrossEntropy<Scalar, Mem> ce;
  kat::Workspace<Scalar, Mem> dlogits_ws("kat_train::dlogits");
  kat::Matrix<Scalar, Mem> x;
  kat::Vector<std::int32_t, Mem> y;
  std::int64_t step = position.step;
  // --profile only: region times (reset each epoch) and K-FAC's bytes counted around each step.
  std::optional<kat::RegionTimer> timer;
  if (o.profile) {
    timer.emplace();
  }
  for (int epoch = static_cast<int>(position.epoch); epoch <= o.epochs; ++epoch) {
    Progress progress(live, epoch, o.epochs, static_cast<std::size_t>(steps_per_epoch));
    // A run resumed inside this epoch continues the restored loader's order and position.
    const bool resumed = epoch == position.epoch && position.batch > 0;
    if (!resumed) {
#ifdef KAT_ENABLE_MPI
      if (parallel) {
        train_loader.start_epoch(static_cast<std::size_t>(epoch - 1),
                                 sampler.indices(static_cast<std::size_t>(epoch - 1)));
      } else
#endif
        train_loader.start_epoch(static_cast<std::size_t>(epoch - 1));
    }
#ifdef KAT_ENABLE_MPI
    if (parallel) {
      dp->reset_stats();
      comm.barrier(); // the epoch's wall time starts together on all ranks
    }
#endif
    StepCounters counters;
    if (timer) {
      timer->reset();
    }
    double loss_sum = resumed ? position.loss_sum : 0.0;
    std::size_t seen = resumed ? static_cast<std::size_t>(position.seen) : 0;
    std::size_t batch = resumed ? static_cast<std::size_t>(position.batch) : 0;
    const std::size_t seen_at_start = seen; // for the rates of a resumed epoch
    const auto t0 = Clock::now();
    while (train_loader.next(space, x, y)) {
      const std::size_t n = x.extent(0);
      const auto &logits = model.forward(space, x);
      const auto dlogits = dlogits_ws.matrix(n, logits.extent(1));
      loss_sum += ce.forward_backward(space, logits, y, dlogits) * static_cast<double>(n);
      model.backward(space, dlogits, kat::nn::Sequential<Scalar, Mem>::Gradients::overwrite);
#ifdef KAT_ENABLE_MPI
      if (dp) {
        dp->finish(space); // gradients = mean over the ranks = gradient of the global batch
      }
#endif
      if (precondition && !timer) {
        precondition.step(space);
      } else if (precondition) {
        const bool update = precondition.updates_factors();
        const std::uint64_t before = precondition.comm_bytes();
        precondition.step(space);
        const std::uint64_t bytes = precondition.comm_bytes() - before;
        ++counters.steps;
        counters.bytes += bytes;
        if (update) {
          ++counters.updates;
          counters.update_bytes += bytes;
        }
      }
      optimizer->set_lr(schedule(step++));
      optimizer->step(space, model.parameters(), model.gradients());
      seen += n;
      progress.update(++batch, loss_sum / seen,
                      (seen - seen_at_start) * ranks.size / seconds_since(t0));
      if (checkpoints && o.checkpoint_every > 0 && step % o.checkpoint_every == 0 &&
          batch < static_cast<std::size_t>(steps_per_epoch)) {
        save_checkpoint({step, epoch, static_cast<std::int64_t>(batch), loss_sum, seen});
      }
    }
    space.fence();
    const double wall = seconds_since(t0);
    progress.finish();
    auto test = evaluate(space, model, test_loader, parallel ? &test_shard : nullptr);
    double exposed = 0; // communication seconds backward did not hide (rank 0's)
#ifdef KAT_ENABLE_MPI
    if (parallel) {
      exposed = dp->stats().exposed_seconds;
      kat::distributed::Metrics train_local, test_local;
      train_local.loss_sum = loss_sum;
      train_local.samples = static_cast<std::int64_t>(seen);
      test_local.loss_sum = test.loss_sum;
      test_local.correct = static_cast<std::int64_t>(test.correct);
      test_local.samples = static_cast<std::int64_t>(test.samples);
      const auto train_all = dp->reduce_metrics(train_local);
      const auto test_all = dp->reduce_metrics(test_local);
      loss_sum = train_all.loss_sum;
      seen = static_cast<std::size_t>(train_all.samples);
      test.loss_sum = test_all.loss_sum;
      test.correct = static_cast<std::size_t>(test_all.correct);
      test.samples = static_cast<std::size_t>(test_all.samples);
    }
#endif
    std::optional<Profile> profile;
    if (timer) { // on every rank: the gather is collective
      const std::vector<double> local =
          profile_values(kfac_times(*timer), static_cast<double>(batch), exposed,
                         precondition ? static_cast<double>(precondition.state_bytes()) : 0.0);
      std::vector<std::vector<double>> all{local};
#ifdef KAT_ENABLE_MPI
      if (parallel) {
        all = gather_values(comm, local);
      }
#endif
      profile = make_profile(all, counters);
      profile->kfac = static_cast<bool>(precondition);
      profile->kfac_comm = precondition && !o.dist_strategy.empty();
      profile->gradients = parallel;
#ifdef KAT_ENABLE_MPI
      if (dp && dp->stats().steps > 0) {
        profile->gradient_bytes_per_step = static_cast<double>(dp->stats().allreduce.bytes) /
                                           static_cast<double>(dp->stats().steps);
      }
#endif
    }
    const double train_loss = loss_sum / static_cast<double>(seen);
    const double rate = static_cast<double>(seen - seen_at_start) / wall;
    if (root) {
      std::printf("epoch %2d  %.3f s  %8.0f samples/s  train loss %.4f  test loss %.4f  "
                  "test accuracy %.2f%%",
                  epoch, wall, rate, train_loss, test.loss(), 100 * test.accuracy());
      if (parallel) {
        std::printf("  exposed communication %.3f s", exposed);
      }
      std::printf("\n");
      if (profile) {
        std::printf("%s\n", profile_line(*profile).c_str());
      }
      std::fflush(stdout);
    }
    metrics.write(epoch, wall, rate, train_loss, test.loss(), test.accuracy(), optimizer->lr(),
                  profile ? &*profile : nullptr);
    // At the end of every epoch by default; with --checkpoint-every when a step that was due
    // ended the epoch; always after the last one.
    if (checkpoints &&
        (o.checkpoint_every == 0 || step % o.checkpoint_every == 0 || epoch == o.epochs)) {
      save_checkpoint({step, epoch + 1, 0, 0.0, 0});
    }
  }
  if (kfac_report) {
    kfac_report(); // collective with a distributed strategy
  }
#ifdef KAT_ENABLE_MPI
  model.clear_backward_hook(); // before dp goes away
#endif
  return 0;
}

#ifdef KAT_ENABLE_MPI
} // namespace
// OpenBLAS's run-time thread count; null when the BLAS is not OpenBLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
namespace {

// Threads per rank on several ranks: unless the user chose (OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS, KOKKOS_NUM_THREADS or a --kokkos-threads / --kokkos-num-threads flag),
// give Kokkos's host pool and OpenBLAS each rank's share of its node, so that the ranks do not
// oversubscribe the cores (kat::distributed::thread_budget: one thread per rank once ranks >=
// cores). Before Kokkos is initialized; collective. Returns the line rank 0 prints.
std::string choose_threads(int argc, char **argv, int ranks) {
  if (ranks < 2) {
    return {};
  }
  const kat::distributed::ThreadBudget b = kat::distributed::thread_budget(
      kat::distributed::Communicator::world()); // collective: every rank
  const char *chosen = nullptr;
  for (const char *var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "KOKKOS_NUM_THREADS"}) {
    if (chosen == nullptr && std::getenv(var) != nullptr) {
      chosen = var;
    }
  }
  for (int i = 1; chosen == nullptr && i < argc; ++i) {
    const std::string arg = argv[i];
    for (const char *flag : {"--kokkos-threads", "--kokkos-num-threads", "--threads"}) {
      if (arg.rfind(flag, 0) == 0) {
        chosen = flag;
      }
    }
  }
  if (chosen != nullptr) {
    return kat::detail::concat("threads per rank: as set by ", chosen, " (", b.local_ranks,
                               " ranks on this node, ", b.node_cpus, " CPUs)");
  }
  const std::string t = std::to_string(b.threads);
  setenv("KOKKOS_NUM_THREADS", t.c_str(), 1); // read by Kokkos::initialize (3.x and 4.x)
  if (openblas_set_num_threads != nullptr) {
    openblas_set_num_threads(b.threads);
  }
  return kat::detail::concat("threads per rank: ", b.threads, " (", b.local_ranks,
                             " ranks on this node, ", b.node_cpus, " CPUs, ", b.affinity_cpus,
                             " usable by this rank; set OMP_NUM_THREADS to choose)");
}
#endif

#ifdef KAT_ENABLE_MPI
// MPI_Init_thread before Kokkos, MPI_Finalize after Kokkos has finalized: declared before the
// Kokkos::ScopeGuard, so destroyed after it. Only the thread that called it calls MPI.
struct MPIGuard {
  MPIGuard(int &argc, char **&argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  MPIGuard(const MPIGuard &) = delete;
  MPIGuard &operator=(const MPIGuard &) = delete;
  ~MPIGuard() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) {
      MPI_Finalize();
    }
  }
};
#endif

} // namespace

int main(int argc, char **argv) {
  Ranks ranks;
#ifdef KAT_ENABLE_MPI
  MPIGuard mpi(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &ranks.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks.size);
#endif
  Options o;
  CLI::App app{"Train a network on Fashion-MNIST with KAT (Kokkos Accelerated Training).\n"
               "Kokkos flags such as --kokkos-num-threads=N are accepted as well."};
  app.add_option("--data-dir", o.data_dir,
                 "Directory with the IDX files (train-images-idx3-ubyte[.gz], ...)")
      ->capture_default_str();
  app.add_option("--model", o.model,
                 "Network: mlp (784-256-256-10, ReLU) | cnn (two 5x5 convolutions, max "
                 "pooling, dense 3136-256-10) | resnet (ResNet-14: three stages of two basic "
                 "blocks, batch norm, global average pooling)")
      ->check(CLI::IsMember({"mlp", "cnn", "resnet"}))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer,
                 "sgd | adam | adamw | kfac (K-FAC preconditioning + SGD with --momentum)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "kfac"}))
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "Passes over the training set")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size,
                 "Samples per step (with MPI: the global batch over all ranks, divisible by "
                 "their number)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", o.lr,
                 "Learning rate [default: 0.05 for sgd and kfac, 0.001 for adam/adamw]")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_flag("--nesterov", o.nesterov, "Nesterov momentum (sgd)");
  app.add_option("--weight-decay", o.weight_decay,
                 "L2 penalty (sgd, adam) or decoupled decay (adamw) [default: 0, adamw 0.01]")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--schedule", o.schedule,
                 "Learning-rate schedule per step: constant | cosine | "
                 "step")
      ->check(CLI::IsMember({"constant", "cosine", "step"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "Linear warm-up steps before the schedule")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--step-size", o.step_size, "Steps between decays (--schedule step)")
      ->check(CLI::PositiveNumber);
  app.add_option("--gamma", o.gamma, "Decay factor (--schedule step)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed for initialization and shuffling")->capture_default_str();
  app.add_option("--train-subset", o.train_subset,
                 "Train on the first N training images only (0: all)")
      ->capture_default_str();
  app.add_option("--metrics", o.metrics,
                 "Write per-epoch metrics to FILE (.csv or .jsonl): epoch, wall_seconds, "
                 "samples_per_second, train_loss, test_loss, test_accuracy, lr (and with "
                 "--profile its numbers)");
  app.add_flag("--profile", o.profile,
               "After each epoch line, print (and with --metrics write) a profile: the K-FAC "
               "step's time per step split into factor construction, communication, "
               "decomposition, preconditioning and other (exclusive kat::RegionTimer times; max "
               "and mean over the ranks), K-FAC's communicated bytes per step and per "
               "second-order update, the gradient all-reduce's bytes per step and exposed time, "
               "and the K-FAC state bytes per rank; see docs/distributed.md");
  app.add_option("--progress", o.progress,
                 "Live progress bar: auto (on a terminal) | always | "
                 "never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  auto *ckpt = app.add_option_group("Checkpoints", "Saving and resuming (docs/checkpoints.md)");
  ckpt->add_option("--checkpoint-dir", o.checkpoint_dir,
                   "Save checkpoints in DIR (created if missing): the model, the optimizer, the "
                   "data order and position, and the step counters, one file per rank");
  ckpt->add_option("--checkpoint-every", o.checkpoint_every,
                   "Save every N optimizer steps and after the last epoch (0: after every epoch)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  ckpt->add_option("--resume", o.resume,
                   "Continue from a checkpoint: latest (the newest in --checkpoint-dir) or FILE; "
                   "the result is bit-identical to a run that was never stopped");
  ckpt->add_option("--keep-checkpoints", o.keep_checkpoints,
                   "How many of the newest checkpoints to keep")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto *kfac = app.add_option_group("K-FAC", "Options of --optimizer kfac (kat::precond::KFAC)");
  kfac->add_option("--factor-update-steps", o.factor_update_steps,
                   "Steps between Kronecker factor updates")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kfac->add_option("--inv-update-steps", o.inv_update_steps,
                   "Steps between decompositions (a multiple of --factor-update-steps)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kfac->add_option("--damping", o.damping, "Damping (Tikhonov regularization), > 0")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kfac->add_option("--factor-decay", o.factor_decay, "Running-average decay of the factors")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  kfac->add_option("--kl-clip", o.kl_clip, "KL clip of the preconditioned step (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  kfac->add_option("--compute-method", o.compute_method, "eigen | inverse")
      ->check(CLI::IsMember({"eigen", "inverse"}))
      ->capture_default_str();
  kfac->add_flag("--pi-correction", o.pi_correction,
                 "pi-corrected damping split (--compute-method inverse)");
  kfac->add_flag("--factored-preconditioning", o.factored_preconditioning,
                 "P = (G^-1 g^T)(a A^-1) from the batch where cheaper than G^-1 grad A^-1 "
                 "(exact; one process only, see docs/kfac.md)");
  kfac->add_option("--skip-layers", o.skip_layers,
                   "Layers left to SGD, by index path (\"0\", \"3.1\") or type (\"Conv2d\")");
  kfac->add_option("--factor-precision", o.factor_precision, "float | double")
      ->check(CLI::IsMember({"float", "double"}))
      ->capture_default_str();
  kfac->add_option("--inverse-precision", o.inverse_precision,
                   "Precision of decompositions and preconditioning: float | double")
      ->check(CLI::IsMember({"float", "double"}))
      ->capture_default_str();
#ifdef KAT_ENABLE_MPI
  kfac->add_option("--dist-strategy", o.dist_strategy,
                   "Distributed K-FAC over the MPI ranks (needed with more than one rank): "
                   "dkfac (every rank builds every factor; batch factors averaged over the "
                   "ranks; every rank decomposes and preconditions every layer) | dp-kfac "
                   "(each layer's factors built from one rank's local batch and decomposed "
                   "there; its preconditioned gradient broadcast) | kaisa (factors averaged; "
                   "each decomposition on one rank; see --grad-worker-fraction)")
      ->check(CLI::IsMember({"dkfac", "dp-kfac", "kaisa"}));
  kfac->add_option("--grad-worker-fraction", o.grad_worker_fraction,
                   "With --dist-strategy kaisa on P ranks, k/P with k dividing P: the share of "
                   "ranks that precondition each layer. 1 (COMM-OPT, decompositions broadcast, "
                   "every rank preconditions) | 1/P (MEM-OPT, one rank preconditions each layer "
                   "and broadcasts P) | in between (HYBRID-OPT, groups of k gradient workers)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  kfac->add_option("--dp-kfac-assignment", o.dp_kfac_assignment,
                   "Layers to ranks with --dist-strategy dp-kfac: round-robin (layer l on rank "
                   "l mod P) | balanced (contiguous blocks balanced by d_A^3 + d_G^3)")
      ->check(CLI::IsMember({"round-robin", "balanced"}))
      ->capture_default_str();
#endif
  // Our flags are parsed before Kokkos sees the command line, so --help is ours (Kokkos's is
  // --kokkos-help); --kokkos-* flags pass through to Kokkos::initialize below.
  app.allow_extras();
  try {
    app.parse(argc, argv);
    for (const auto &extra : app.remaining()) {
      if (extra.rfind("--kokkos-", 0) != 0) {
        throw CLI::ExtrasError({extra});
      }
    }
    if (o.resume == "latest" && o.checkpoint_dir.empty()) {
      throw CLI::ValidationError("--resume latest", "needs --checkpoint-dir");
    }
    if (!o.resume.empty() && o.resume != "latest" && ranks.size > 1) {
      throw CLI::ValidationError("--resume", "takes latest with more than one rank (each rank "
                                             "reads its own file), got " +
                                                 o.resume);
    }
    if (o.schedule == "step" && o.step_size == 0) {
      throw CLI::ValidationError("--step-size", "is required with --schedule step");
    }
#ifdef KAT_ENABLE_MPI
    if (ranks.size > 1 && o.batch_size % ranks.size != 0) {
      throw CLI::ValidationError("--batch-size",
                                 "is the global batch and must be divisible by the " +
                                     std::to_string(ranks.size) + " ranks, got " +
                                     std::to_string(o.batch_size));
    }
    if (ranks.size > 1 && o.optimizer == "kfac" && o.dist_strategy.empty()) {
      throw CLI::ValidationError("--optimizer kfac with more than one rank needs "
                                 "--dist-strategy (dkfac, dp-kfac or kaisa)");
    }
    if (o.dist_strategy == "kaisa") {
      try {
        kat::distributed::KAISA<kat::precond::KFAC<float>>::select_mode(o.grad_worker_fraction,
                                                                        ranks.size);
      } catch (const kat::ValueError &e) {
        throw CLI::ValidationError("--grad-worker-fraction", e.what());
      }
    }
    if (ranks.size > 1 && o.factored_preconditioning) {
      throw CLI::ValidationError("--factored-preconditioning",
                                 "needs the local batch's gradient, but on " +
                                     std::to_string(ranks.size) +
                                     " ranks the gradients are averaged; use one process");
    }
    if (!o.dist_strategy.empty() && o.optimizer != "kfac") {
      throw CLI::ValidationError("--dist-strategy",
                                 "needs --optimizer kfac, got --optimizer " + o.optimizer);
    }
#endif
  } catch (const CLI::ParseError &e) {
    return ranks.rank == 0 ? app.exit(e) : e.get_exit_code(); // every rank reaches it
  }
#ifdef KAT_ENABLE_MPI
  ranks.threads = choose_threads(argc, argv, ranks.size);
#endif
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (o.lr < 0) {
    o.lr = o.optimizer == "sgd" || o.optimizer == "kfac" ? 0.05 : 1e-3;
  }
  if (o.weight_decay < 0) {
    o.weight_decay = o.optimizer == "adamw" ? 0.01 : 0.0;
  }
  try {
    return run(o, ranks);
  } catch (const kat::Error &e) {
    std::fprintf(stderr, "kat_train: error: %s\n", e.what());
#ifdef KAT_ENABLE_MPI
    if (ranks.size > 1) { // the other ranks may be waiting in a collective
      std::fprintf(stderr, "kat_train: rank %d of %d aborts\n", ranks.rank, ranks.size);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    return 1;
  }
}
