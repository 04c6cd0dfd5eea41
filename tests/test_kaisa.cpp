// kat::dist::KAISA (ALGORITHMS.md section 2, KAISA): COMM-OPT (grad_worker_fraction 1) and
// MEM-OPT (1/P) give the same preconditioned gradients and parameters as D-KFAC; the greedy
// assignment gives every work item one rank and balances the load; one rank equals plain
// K-FAC exactly; the broadcasts send the analytic volume. The "[mpi]" cases run under mpiexec
// at 1, 2 and 4 ranks (ctest mpi_ranks_*).
#ifdef KAT_ENABLE_MPI

#include "dist_kfac_helpers.hpp"

#include <kat/dist/communicator.hpp>
#include <kat/dist/data_parallel.hpp>
#include <kat/dist/dkfac.hpp>
#include <kat/dist/kaisa.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/precond/kfac.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace kat;
using namespace kat::test;
using namespace kat::test::dist_kfac;
using kat::dist::Communicator;

namespace {

using KAISAd = dist::KAISA<KFACd>;
using DKFACd = dist::DKFAC<KFACd>;

// A of 7, 13, 9 and G of 12, 8, 4, in registration order, A before G.
const std::vector<std::size_t> kFactorDims{7, 12, 13, 8, 9, 4};

enum class Strategy { plain, dkfac, kaisa };

struct Run {
  std::vector<double> parameters;
  std::vector<std::vector<double>> gradients; // after each kfac.step: the preconditioned ones
  dist::KAISAStats stats;
  dist::CollectiveCounter broadcast, allreduce; // the counters of K-FAC's own communicator
  std::size_t per_decomposition = 0, per_step = 0, per_factor_update = 0;
  bool mem_opt = false;
};

Run train(Communicator *comm, Strategy strategy, double fraction, const Config &c,
          std::size_t first, std::size_t count,
          dist::AssignmentCost cost = dist::AssignmentCost::compute) {
  Replica replica(comm, c, first, count);
  std::optional<Communicator> kcomm;
  std::unique_ptr<DKFACd> dkfac;
  std::unique_ptr<KAISAd> kaisa;
  if (strategy != Strategy::plain) {
    REQUIRE(comm != nullptr);
    kcomm.emplace(comm->dup());
  }
  if (strategy == Strategy::dkfac) {
    dkfac = std::make_unique<DKFACd>(*kcomm, replica.kfac);
  } else if (strategy == Strategy::kaisa) {
    dist::KAISAOptions o;
    o.grad_worker_fraction = fraction;
    o.assignment_cost = cost;
    kaisa = std::make_unique<KAISAd>(*kcomm, replica.kfac, o);
  }
  Run run;
  for (int s = 0; s < kSteps; ++s) {
    replica.precondition(s);
    const auto g = to_host(replica.model.gradients());
    run.gradients.emplace_back(g.data(), g.data() + g.size());
    replica.update();
  }
  run.parameters = replica.parameters();
  if (kaisa) {
    run.stats = kaisa->stats();
    run.broadcast = kcomm->stats().broadcast;
    run.allreduce = kcomm->stats().allreduce;
    run.per_decomposition = kaisa->bytes_per_decomposition_update();
    run.per_step = kaisa->bytes_per_step();
    run.per_factor_update = kaisa->bytes_per_factor_update();
    run.mem_opt = kaisa->mode() == KAISAd::Mode::mem_opt;
  }
  return run;
}

std::vector<double> fractions(int ranks) {
  std::vector<double> f{1.0};
  if (ranks > 1)
    f.push_back(1.0 / ranks);
  return f;
}

std::uint64_t every(std::int64_t period) { return std::uint64_t((kSteps + period - 1) / period); }

} // namespace

TEST_CASE("kaisa: COMM-OPT and MEM-OPT give the same preconditioned gradients as D-KFAC",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const std::size_t p = std::size_t(comm.size()), local = kBatch / p;
  REQUIRE(kBatch % p == 0);
  INFO(rank_of(comm));
  const std::size_t first = std::size_t(comm.rank()) * local;
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const Run want = train(&comm, Strategy::dkfac, 1.0, c, first, local);
    for (const double f : fractions(comm.size())) {
      for (const auto cost : {dist::AssignmentCost::compute, dist::AssignmentCost::memory}) {
        INFO("grad_worker_fraction "
             << f << " cost " << (cost == dist::AssignmentCost::compute ? "compute" : "memory"));
        const Run got = train(&comm, Strategy::kaisa, f, c, first, local, cost);
        for (int s = 0; s < kSteps; ++s) {
          INFO("step " << s);
          CHECK(max_abs_diff(got.gradients[std::size_t(s)], want.gradients[std::size_t(s)]) <=
                1e-10);
        }
        CHECK(max_abs_diff(got.parameters, want.parameters) <= 1e-10);
      }
    }
  }
}

TEST_CASE("kaisa: the greedy rule gives every work item one rank and balances the load",
          "[mpi][dist][kfac]") {
  // Items in decreasing cost, each to the least-loaded rank (ties: lower rank):
  // 8 -> r0 (8), 7 -> r1 (7), 6 -> r2 (6), 5 -> r2 (11), 4 -> r1 (11), 3 -> r0 (11).
  const std::vector<double> costs{3, 8, 5, 7, 4, 6};
  CHECK(KAISAd::assign(costs, 3) == std::vector<int>{0, 0, 2, 1, 1, 2});
  CHECK(KAISAd::assign(costs, 1) == std::vector<int>(6, 0));
  CHECK(KAISAd::assign({}, 2).empty());
  // Ties in cost keep input order: the first item of two equal ones goes first.
  CHECK(KAISAd::assign({2, 2, 2, 2}, 2) == std::vector<int>{0, 1, 0, 1});
  CHECK_THROWS_AS(KAISAd::assign(costs, 0), ValueError);
  CHECK_THROWS_AS(KAISAd::assign({1, -1}, 2), ValueError);
  // The MLP's factors by compute cost d³ on 4 ranks: 13³=2197, 12³=1728, 9³=729, 8³=512,
  // 7³=343, 4³=64 -> r0 r1 r2 r3, then 343 -> r3 (512 + 343), 64 -> r2 (729 + 64).
  std::vector<double> cubes;
  for (const std::size_t d : kFactorDims)
    cubes.push_back(KAISAd::cost(d, dist::AssignmentCost::compute));
  CHECK(KAISAd::assign(cubes, 4) == std::vector<int>{3, 1, 0, 3, 2, 2});
  CHECK(KAISAd::cost(7, dist::AssignmentCost::memory) == 49.0);
  // On the world communicator: every factor has exactly one decomposing rank.
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const double f : fractions(comm.size())) {
    KFACd kfac(kfac_options(kConfigs[0]));
    Model model(FeatureShape{1, 2, 3});
    build_mlp(model, 3);
    REQUIRE(kfac.register_model(model) == 3);
    dist::KAISAOptions o;
    o.grad_worker_fraction = f;
    KAISAd kaisa(comm, kfac, o);
    for (std::size_t l = 0; l < 3; ++l) {
      for (const char factor : {'A', 'G'}) {
        const int owner = kaisa.decomposition_owner(l, factor);
        CHECK(owner >= 0);
        CHECK(owner < comm.size());
      }
      if (kaisa.mode() == KAISAd::Mode::mem_opt) {
        CHECK(kaisa.decomposition_owner(l, 'A') == kaisa.decomposition_owner(l, 'G'));
        CHECK(kaisa.gradient_worker(l) == kaisa.decomposition_owner(l, 'A'));
      } else {
        CHECK(kaisa.gradient_worker(l) == -1);
      }
    }
  }
}

TEST_CASE("kaisa: unsupported grad_worker_fraction values are rejected", "[mpi][dist][kfac]") {
  CHECK(KAISAd::select_mode(1.0, 4) == KAISAd::Mode::comm_opt);
  CHECK(KAISAd::select_mode(0.25, 4) == KAISAd::Mode::mem_opt);
  CHECK(KAISAd::select_mode(1.0, 1) == KAISAd::Mode::comm_opt);
  CHECK_THROWS_WITH(KAISAd::select_mode(0.5, 4),
                    Catch::Contains("grad_worker_fraction") && Catch::Contains("HYBRID"));
  CHECK_THROWS_AS(KAISAd::select_mode(0.0, 4), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(2.0, 2), ValueError);
}

TEST_CASE("kaisa: on one rank KAISA equals plain K-FAC exactly", "[mpi][dist][kfac]") {
  auto world = Communicator::world();
  INFO(rank_of(world));
  Communicator single = world.split(world.rank(), 0);
  REQUIRE(single.size() == 1);
  const std::size_t local = kBatch / std::size_t(world.size());
  const std::size_t first = std::size_t(world.rank()) * local;
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const Run plain = train(&single, Strategy::plain, 1.0, c, first, local);
    const Run k = train(&single, Strategy::kaisa, 1.0, c, first, local);
    CHECK(k.gradients == plain.gradients);
    CHECK(k.parameters == plain.parameters);
  }
}

TEST_CASE("kaisa: counted bytes equal the analytic volume", "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const std::size_t p = std::size_t(comm.size()), local = kBatch / p;
  INFO(rank_of(comm));
  std::size_t squares = 0, dims = 0, upper = 0;
  for (const std::size_t d : kFactorDims) {
    squares += d * d;
    dims += d;
    upper += d * (d + 1) / 2;
  }
  REQUIRE(squares == 523);
  REQUIRE(dims == 53);
  const std::size_t gradient_entries = 12 * 7 + 8 * 13 + 4 * 9; // Σ out·(in+1) = 224
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const bool eigen = c.method == ComputeMethod::eigen;
    for (const double f : fractions(comm.size())) {
      INFO("grad_worker_fraction " << f);
      const Run r = train(&comm, Strategy::kaisa, f, c, std::size_t(comm.rank()) * local, local);
      const std::uint64_t decompositions = every(c.inv_every);
      // Factors: as D-KFAC, the upper triangles, one all-reduce per factor per update.
      CHECK(r.per_factor_update == upper * sizeof(double));
      CHECK(r.allreduce.bytes == every(c.factor_every) * upper * sizeof(double));
      if (!r.mem_opt) {
        const std::size_t entries = squares + (eigen ? dims : 0);
        CHECK(r.per_decomposition == entries * sizeof(double));
        CHECK(r.per_step == 0);
        CHECK(r.stats.decomposition_updates == decompositions);
        CHECK(r.broadcast.calls == decompositions * (eigen ? 12 : 6));
        CHECK(r.broadcast.bytes == decompositions * entries * sizeof(double));
        CHECK(r.stats.decomposition_broadcast.bytes == r.broadcast.bytes);
        CHECK(r.stats.gradient_broadcast.bytes == 0);
      } else {
        CHECK(r.per_decomposition == 0);
        CHECK(r.per_step == gradient_entries * sizeof(double));
        CHECK(r.stats.steps == std::uint64_t(kSteps));
        CHECK(r.broadcast.calls == std::uint64_t(kSteps) * 3);
        CHECK(r.broadcast.bytes == std::uint64_t(kSteps) * gradient_entries * sizeof(double));
        CHECK(r.stats.gradient_broadcast.bytes == r.broadcast.bytes);
        CHECK(r.stats.decomposition_broadcast.bytes == 0);
      }
    }
  }
}

TEST_CASE("kaisa: the destructor removes the hooks", "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  KFACd kfac;
  {
    KAISAd k(comm, kfac);
    CHECK(static_cast<bool>(kfac.factor_hook()));
    CHECK(static_cast<bool>(kfac.decomposition_hook()));
  }
  CHECK(!kfac.factor_hook());
  CHECK(!kfac.decomposition_hook());
  CHECK(!kfac.precondition_hook());
}

#endif // KAT_ENABLE_MPI
