// --optimizer fosi-momentum | fosi-nesterov | fosi-adam: FOSI around SGD or Adam (Sivan et
// al., ICLR 2024; docs/fosi.md), and, with MPI, distributed FOSI: DHO2 (--dist-strategy dho2),
// optionally with curvature ranks that only estimate (--dho2-curvature-ranks).
#include "optimizers.hpp"

#include <kat/nn/hessian_vector_product.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/fosi.hpp>
#include <kat/train/fosi_report.hpp>
#ifdef KAT_ENABLE_MPI
#include <kat/distributed/fosi/dho2.hpp>
#include <kat/distributed/fosi/parameter_shard.hpp>
#include <kat/distributed/fosi/sharded_operator.hpp>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace kat_train {
namespace {

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

// Option `name` as a count: refused when negative instead of wrapping to a huge size_t.
std::size_t count(const Config &c, const std::string &name) {
  const std::int64_t v = c.integer(name);
  if (v < 0) {
    throw kat::ValueError("option --" + name + " must be an integer >= 0, got " + c.text(name));
  }
  return static_cast<std::size_t>(v);
}

// FOSI (docs/fosi.md) around the base optimizer already in s.optimizer: the curvature is the
// loss's Hessian on one fixed batch, the first global batch of the training set shuffled with
// the run's seed. With DHO2 each rank differentiates its own rows of that batch and keeps its
// slice of the curvature.
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
  o.k = count(s.config, "k");
  o.l = count(s.config, "l");
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
    // The curvature ranks (DHO2Curvature::serve) estimate; these ranks only train.
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
  s.columns.insert(s.columns.end(), {"fosi_lambda_max", "fosi_c"});
#ifdef KAT_ENABLE_MPI
  if (s.dho2_roles) { // estimates arrive late: how late, and what their estimation cost
    s.columns.insert(s.columns.end(), {"fosi_staleness_mean", "fosi_staleness_max",
                                       "fosi_estimation_s", "fosi_waited_s"});
  }
#endif
  if (s.profile) {
    s.columns.insert(s.columns.end(), {"fosi_lanczos_s", "fosi_projection_ms",
                                       "fosi_curvature_bytes", "fosi_bytes_per_step"});
  }
  s.optimizer = std::move(fosi);
}

// FOSI's options, as the reference code names them.
std::vector<Opt> fosi_options() {
  using Range = kat::train::OptionRange;
  return {
      Opt("k", "FOSI: largest Hessian eigenpairs estimated", "5")
          .within(Range::integer_at_least(1)),
      Opt("l", "FOSI: smallest Hessian eigenpairs estimated", "0")
          .within(Range::integer_at_least(0)),
      Opt("alpha", "FOSI: Newton step size in the subspace", "0.1").within(Range::at_least(0)),
      Opt("num-iters-to-approx-eigs", "FOSI: steps T between curvature refreshes", "100")
          .within(Range::integer_at_least(1)),
      Opt("warmup-w", "FOSI: step W of the first refresh [default: T]")
          .within(Range::integer_at_least(1)),
      Opt("learning-rate-clip", "FOSI: upper bound of the complement scale c [default: 3, adam 1]")
          .within(Range::at_least(1)),
#ifdef KAT_ENABLE_MPI
      {"dist-strategy",
       "Distributed FOSI on several ranks: dho2, or daso (docs/distributed.md)",
       "",
       {"dho2", "daso"}},
      Opt("dho2-curvature-ranks",
          "DHO2: ranks that only estimate curvature, overlapped with training (0: synchronous)",
          "0")
          .within(Range::integer_at_least(0)),
      Opt("dho2-staleness-bound",
          "DHO2: most steps an estimate may arrive after its snapshot [default: T]")
          .within(Range::integer_at_least(0)),
      {"dho2-swap",
       "DHO2: swap an estimate in when every training rank has it, or exactly at the bound",
       "eager",
       {"eager", "fixed"}},
#endif
  };
}

std::vector<Opt> fosi_sgd_options() {
  std::vector<Opt> o = sgd_options();
  o.erase(std::remove_if(o.begin(), o.end(), [](const Opt &x) { return x.name == "nesterov"; }),
          o.end());
  const auto f = fosi_options();
  o.insert(o.end(), f.begin(), f.end());
  return o;
}

std::vector<Opt> fosi_adam_options() {
  std::vector<Opt> o = adam_options();
  const auto f = fosi_options();
  o.insert(o.end(), f.begin(), f.end());
  return o;
}

const OptimizerRegistration
    fosi_momentum(50, "fosi-momentum", "FOSI around SGD with heavy-ball momentum (docs/fosi.md)",
                  fosi_sgd_options(), [](Setup &s) {
                    const bool dho2 = prepare_fosi(s);
                    make_sgd(s);
                    make_fosi(s, kat::optim::FOSIMomentum::heavy_ball, dho2);
                  });
const OptimizerRegistration fosi_nesterov(51, "fosi-nesterov",
                                          "FOSI around SGD with Nesterov momentum (docs/fosi.md)",
                                          fosi_sgd_options(), [](Setup &s) {
                                            const bool dho2 = prepare_fosi(s);
                                            make_sgd(s, /*nesterov=*/true);
                                            make_fosi(s, kat::optim::FOSIMomentum::nesterov, dho2);
                                          });
const OptimizerRegistration fosi_adam(52, "fosi-adam", "FOSI around Adam (docs/fosi.md)",
                                      fosi_adam_options(), [](Setup &s) {
                                        const bool dho2 = prepare_fosi(s);
                                        make_adam(s);
                                        make_fosi(s, kat::optim::FOSIMomentum::adam, dho2);
                                      });

#ifdef KAT_ENABLE_MPI
// DHO2's curvature ranks (--dho2-curvature-ranks C): the last C ranks only estimate curvature,
// the others train together.
class DHO2Curvature : public Component {
public:
  // --dho2-curvature-ranks C (0 without the flag), checked against the run's other flags.
  void check(Run &r) override {
    const Flag &c = r.flag("dho2-curvature-ranks");
    char *end = nullptr;
    const long C = std::strtol(c.value.c_str(), &end, 10);
    if (end == c.value.c_str() || *end != '\0' || C < 0) {
      throw CLI::ValidationError("--dho2-curvature-ranks",
                                 "must be an integer >= 0, got " + c.value);
    }
    if (C == 0) {
      for (const char *name : {"dho2-staleness-bound", "dho2-swap"}) {
        if (r.flag(name).given()) {
          throw CLI::ValidationError(std::string("--") + name, "needs --dho2-curvature-ranks > 0");
        }
      }
      return;
    }
    if (const Flag &bound = r.flag("dho2-staleness-bound"); bound.given()) {
      const long S = std::strtol(bound.value.c_str(), &end, 10);
      if (end == bound.value.c_str() || *end != '\0' || S < 0) {
        throw CLI::ValidationError("--dho2-staleness-bound",
                                   "must be an integer >= 0 (steps), got " + bound.value);
      }
    }
    if (!r.flag("dist-strategy").given() || r.flag("dist-strategy").value != "dho2") {
      throw CLI::ValidationError("--dho2-curvature-ranks", "needs --dist-strategy dho2");
    }
    const int ranks = r.world->size();
    if (C >= ranks) {
      throw CLI::ValidationError("--dho2-curvature-ranks",
                                 "must leave at least one training rank: at most " +
                                     std::to_string(ranks - 1) + " of " + std::to_string(ranks) +
                                     " ranks, got " + c.value);
    }
    if (!r.checkpoint_dir.empty()) {
      throw CLI::ValidationError("--checkpoint-dir", "is not supported with "
                                                     "--dho2-curvature-ranks (an estimate in "
                                                     "flight is not part of the optimizer's "
                                                     "state)");
    }
    if (r.batch_size % C != 0) {
      throw CLI::ValidationError("--batch-size", "must be divisible by the " + c.value +
                                                     " curvature ranks, which share its first "
                                                     "batch as the curvature batch");
    }
    r.curvature_ranks = static_cast<int>(C);
  }

  void setup_processes(Run &r) override {
    if (r.curvature_ranks > 0) {
      r.dho2_roles = kat::distributed::dho2_roles(*r.comm, r.curvature_ranks);
      r.train_comm = &*r.dho2_roles->group;
    }
  }

  // A curvature rank serves the training ranks' estimates until they finish. The curvature
  // batch is FOSI's (make_fosi: the first global batch of the training set shuffled with the
  // run's seed), each curvature rank differentiating its rows.
  bool serve(Run &r, const Space &space) override {
    if (!r.dho2_roles || !r.dho2_roles->curvature) {
      return false;
    }
    const auto &roles = *r.dho2_roles;
    const auto C = static_cast<std::size_t>(roles.curvature_ranks);
    const auto c = static_cast<std::size_t>(roles.group->rank());
    const auto [x, y] =
        curvature_batch(*r.train_set, static_cast<std::size_t>(r.batch_size), r.seed, c, C);
    const std::size_t rows = x.extent(0);
    const kat::Vector<const std::int32_t, Mem> labels = y;
    const kat::nn::SoftmaxCrossEntropy<Scalar, Mem> loss;
    Model &model = *r.model;
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
    return true;
  }
};
const auto dho2_curvature = register_component<DHO2Curvature>(25);
#endif

} // namespace
} // namespace kat_train
