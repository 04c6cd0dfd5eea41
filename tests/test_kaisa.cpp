// kat::distributed::KAISA (docs/algorithms.md section 2, KAISA): every valid grad_worker_fraction
// k/P (COMM-OPT 1, MEM-OPT 1/P, HYBRID-OPT between) gives the same preconditioned gradients and
// parameters as D-KFAC, and only a layer's gradient workers keep its decompositions; the
// greedy assignment gives every work item one rank, and its two-level hybrid form reduces to
// the COMM-OPT and MEM-OPT rules; one rank equals plain K-FAC exactly; the broadcasts send
// the analytic volume; invalid fractions are rejected. The "[mpi]" cases run under mpiexec
// at 1, 2, 3 and 4 ranks (ctest mpi_ranks_*).
#ifdef KAT_ENABLE_MPI

#include "dist_kfac_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/distributed/kfac/dkfac.hpp>
#include <kat/distributed/kfac/kaisa.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/precond/kfac.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace test_kaisa {

using namespace kat;
using namespace kat::precond;
using namespace kat::test;
using namespace kat::test::dist_kfac;
using kat::distributed::Communicator;

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
  std::size_t per_decomposition = 0, per_step = 0, per_factor_update = 0, per_agreement = 0;
  precond::KFACStrategyReport report; // KFAC::strategy_report() after the last step
  KAISAd::Mode mode = KAISAd::Mode::comm_opt;
  std::vector<int> layer_group;         // layer_worker_group(l) for the 3 layers
  int group = 0;                        // worker_group_of(this rank)
  std::vector<bool> decomposed, worker; // per layer: holds both decompositions / preconditions
};

Run run_steps(Communicator *comm, Strategy strategy, double fraction, const Config &c,
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
    run.per_agreement = kaisa->bytes_per_agreement();
    run.report = replica.kfac.strategy_report();
    run.mode = kaisa->mode();
    run.group = kaisa->worker_group_of(comm->rank());
    const bool eigen = c.method == ComputeMethod::eigen;
    for (std::size_t l = 0; l < replica.kfac.size(); ++l) {
      run.layer_group.push_back(kaisa->layer_worker_group(l));
      run.worker.push_back(kaisa->is_gradient_worker(l, comm->rank()));
      const auto &a = replica.kfac.factor_a(l);
      const auto &g = replica.kfac.factor_g(l);
      run.decomposed.push_back(eigen ? a.has_eigen() && g.has_eigen()
                                     : a.has_inverse() && g.has_inverse());
    }
  }
  return run;
}

// Every valid grad_worker_fraction k/P (k a divisor of P), COMM-OPT (k = P) first.
std::vector<double> fractions(int ranks) {
  std::vector<double> f;
  for (int k = ranks; k >= 1; --k) {
    if (ranks % k == 0)
      f.push_back(double(k) / ranks);
  }
  return f;
}

const char *mode_name(KAISAd::Mode m) {
  return m == KAISAd::Mode::comm_opt  ? "COMM-OPT"
         : m == KAISAd::Mode::mem_opt ? "MEM-OPT"
                                      : "HYBRID-OPT";
}

// The MLP's factor dimensions by layer: A (in+1) and G (out).
const std::vector<std::size_t> kADims{7, 13, 9}, kGDims{12, 8, 4};

// The test MLP registered with a K-FAC of kConfigs[0] (a KFACd can be neither copied nor
// moved, so the two live together).
struct RegisteredMLP {
  Model model{FeatureShape{1, 2, 3}};
  KFACd kfac{kfac_options(kConfigs[0])};
  RegisteredMLP() {
    build_mlp(model, 3);
    REQUIRE(kfac.register_model(model) == 3);
  }
};

} // namespace

// COMM-OPT, HYBRID-OPT (where P has one) and MEM-OPT.
TEST_CASE("kaisa: every grad_worker_fraction gives the same preconditioned gradients as D-KFAC",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const std::size_t p = std::size_t(comm.size()), local = kBatch / p;
  REQUIRE(kBatch % p == 0);
  INFO(rank_of(comm));
  const std::size_t first = std::size_t(comm.rank()) * local;
  // COMM-OPT always; MEM-OPT from 2 ranks; HYBRID-OPT where P has a proper divisor > 1 (4).
  CHECK(fractions(comm.size()).size() == (comm.size() == 4 ? 3u : comm.size() == 1 ? 1u : 2u));
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const Run want = run_steps(&comm, Strategy::dkfac, 1.0, c, first, local);
    for (const double f : fractions(comm.size())) {
      for (const auto cost : {dist::AssignmentCost::compute, dist::AssignmentCost::memory}) {
        INFO("grad_worker_fraction "
             << f << " cost " << (cost == dist::AssignmentCost::compute ? "compute" : "memory"));
        const Run got = run_steps(&comm, Strategy::kaisa, f, c, first, local, cost);
        for (int s = 0; s < kSteps; ++s) {
          INFO("step " << s);
          CHECK(max_abs_diff(got.gradients[std::size_t(s)], want.gradients[std::size_t(s)]) <=
                1e-10);
        }
        CHECK(max_abs_diff(got.parameters, want.parameters) <= 1e-10);
        // Only the layer's gradient workers hold its decompositions (COMM-OPT: every rank).
        CHECK(got.decomposed == got.worker);
        if (got.mode == KAISAd::Mode::comm_opt) {
          CHECK(got.worker == std::vector<bool>(3, true));
        }
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
  // (The two-level rule of assign_layers() is checked in the next test cases.)
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const double f : fractions(comm.size())) {
    RegisteredMLP m;
    KFACd &kfac = m.kfac;
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
      // Both decomposers of a layer belong to its worker group.
      const int group = kaisa.layer_worker_group(l);
      CHECK(kaisa.worker_group_of(kaisa.decomposition_owner(l, 'A')) == group);
      CHECK(kaisa.worker_group_of(kaisa.decomposition_owner(l, 'G')) == group);
    }
  }
}

TEST_CASE("kaisa: the hybrid two-level assignment worked by hand", "[mpi][dist][kfac]") {
  // P = 4, gw = 2 (f = 1/2): worker groups {0, 1} and {2, 3}; memory cost d².
  // Layers (d_A, d_G): L0 (5, 3), L1 (4, 4), L2 (6, 1), L3 (2, 3); layer costs 34, 32, 37, 13.
  // (1) Layers to the 2 groups, decreasing cost: L2 37 -> g0 (37), L0 34 -> g1 (34),
  //     L1 32 -> g1 (66), L3 13 -> g0 (50).
  // (2) g0 = ranks 0, 1, items A2 36, G2 1, A3 4, G3 9: A2 -> r0 (36), G3 -> r1 (9),
  //     A3 -> r1 (13), G2 -> r1 (14).
  //     g1 = ranks 2, 3, items A0 25, G0 9, A1 16, G1 16 (A1 before G1: equal cost, input
  //     order): A0 -> r2 (25), A1 -> r3 (16), G1 -> r3 (32), G0 -> r2 (34).
  const std::vector<std::size_t> a{5, 4, 6, 2}, g{3, 4, 1, 3};
  const auto memory = dist::AssignmentCost::memory;
  const KAISAd::Assignment h = KAISAd::assign_layers(a, g, 4, 2, memory);
  CHECK(h.worker_group == std::vector<int>{1, 1, 0, 0});
  CHECK(h.a_owner == std::vector<int>{2, 3, 0, 1});
  CHECK(h.g_owner == std::vector<int>{2, 3, 1, 1});
  // The same layers with gw = 4 (one group) and gw = 1 (four groups of one rank).
  // gw = 4: factors A0 25, G0 9, A1 16, G1 16, A2 36, G2 1, A3 4, G3 9 on 4 ranks:
  // A2 -> r0 (36), A0 -> r1 (25), A1 -> r2 (16), G1 -> r3 (16), G0 -> r2 (25, tie with r3),
  // G3 -> r3 (25), A3 -> r1 (29, tie with r2 and r3), G2 -> r2 (26).
  const KAISAd::Assignment comm_opt = KAISAd::assign_layers(a, g, 4, 4, memory);
  CHECK(comm_opt.worker_group == std::vector<int>(4, 0));
  CHECK(comm_opt.a_owner == std::vector<int>{1, 2, 0, 1});
  CHECK(comm_opt.g_owner == std::vector<int>{2, 3, 2, 3});
  // gw = 1: layers 34, 32, 37, 13: L2 -> r0, L0 -> r1, L1 -> r2, L3 -> r3.
  const KAISAd::Assignment mem_opt = KAISAd::assign_layers(a, g, 4, 1, memory);
  CHECK(mem_opt.worker_group == std::vector<int>{1, 2, 0, 3});
  CHECK(mem_opt.a_owner == std::vector<int>{1, 2, 0, 3});
  CHECK(mem_opt.g_owner == mem_opt.a_owner);
  CHECK_THROWS_AS(KAISAd::assign_layers(a, g, 4, 3, memory), ValueError);
  CHECK_THROWS_AS(KAISAd::assign_layers(a, g, 4, 0, memory), ValueError);
  CHECK_THROWS_AS(KAISAd::assign_layers(a, {3}, 4, 2, memory), ValueError);

  // On the world communicator with the MLP: the constructor's owners are assign_layers'.
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const double f : fractions(comm.size())) {
    INFO("grad_worker_fraction " << f);
    RegisteredMLP m;
    KFACd &kfac = m.kfac;
    dist::KAISAOptions o;
    o.grad_worker_fraction = f;
    KAISAd kaisa(comm, kfac, o);
    const int gw = kaisa.grad_workers();
    CHECK(gw * kaisa.worker_groups() == comm.size());
    const KAISAd::Assignment want =
        KAISAd::assign_layers(kADims, kGDims, comm.size(), gw, dist::AssignmentCost::compute);
    for (std::size_t l = 0; l < 3; ++l) {
      CHECK(kaisa.layer_worker_group(l) == want.worker_group[l]);
      CHECK(kaisa.decomposition_owner(l, 'A') == want.a_owner[l]);
      CHECK(kaisa.decomposition_owner(l, 'G') == want.g_owner[l]);
      for (int r = 0; r < comm.size(); ++r) {
        CHECK(kaisa.is_gradient_worker(l, r) == (r / gw == want.worker_group[l]));
      }
    }
    // The grid: worker group of consecutive ranks, receiver group of ranks congruent mod gw.
    for (int r = 0; r < comm.size(); ++r) {
      CHECK(kaisa.worker_group_of(r) == r / gw);
      CHECK(kaisa.receiver_group_of(r) == r % gw);
    }
    CHECK_THROWS_AS(kaisa.worker_group_of(comm.size()), ValueError);
    CHECK_THROWS_AS(kaisa.receiver_group_of(-1), ValueError);
  }
}

TEST_CASE("kaisa: f = 1 and f = 1/P reproduce the COMM-OPT and MEM-OPT assignments",
          "[mpi][dist][kfac]") {
  // The single-level rules: COMM-OPT assigns the 2L factors (A_0, G_0, A_1, ...) over all
  // ranks, MEM-OPT the L layers (cost of A plus cost of G) over all ranks.
  for (const auto c : {dist::AssignmentCost::compute, dist::AssignmentCost::memory}) {
    std::vector<double> factor_costs, layer_costs;
    for (std::size_t l = 0; l < 3; ++l) {
      factor_costs.push_back(KAISAd::cost(kADims[l], c));
      factor_costs.push_back(KAISAd::cost(kGDims[l], c));
      layer_costs.push_back(KAISAd::cost(kADims[l], c) + KAISAd::cost(kGDims[l], c));
    }
    for (const int p : {1, 2, 3, 4, 6, 8}) {
      INFO("P = " << p);
      const auto factors = KAISAd::assign(factor_costs, p);
      const auto comm_opt = KAISAd::assign_layers(kADims, kGDims, p, p, c);
      const auto mem_opt = KAISAd::assign_layers(kADims, kGDims, p, 1, c);
      for (std::size_t l = 0; l < 3; ++l) {
        CHECK(comm_opt.a_owner[l] == factors[2 * l]);
        CHECK(comm_opt.g_owner[l] == factors[2 * l + 1]);
        CHECK(comm_opt.worker_group[l] == 0);
      }
      CHECK(mem_opt.a_owner == KAISAd::assign(layer_costs, p));
      CHECK(mem_opt.g_owner == mem_opt.a_owner);
      CHECK(mem_opt.worker_group == mem_opt.a_owner);
    }
  }
  // The values the single-level code gave on 4 ranks, compute cost: COMM-OPT as the greedy
  // test above ({3, 1, 0, 3, 2, 2} for A0 G0 A1 G1 A2 G2); MEM-OPT layer costs
  // 343 + 1728 = 2071, 2197 + 512 = 2709, 729 + 64 = 793 -> L1 r0, L0 r1, L2 r2.
  const auto compute = dist::AssignmentCost::compute;
  const auto comm_opt = KAISAd::assign_layers(kADims, kGDims, 4, 4, compute);
  CHECK(comm_opt.a_owner == std::vector<int>{3, 0, 2});
  CHECK(comm_opt.g_owner == std::vector<int>{1, 3, 2});
  CHECK(KAISAd::assign_layers(kADims, kGDims, 4, 1, compute).a_owner == std::vector<int>{1, 0, 2});
  // On 2 ranks MEM-OPT: L1 r0 (2709), L0 r1 (2071), L2 r1 (2864).
  CHECK(KAISAd::assign_layers(kADims, kGDims, 2, 1, compute).a_owner == std::vector<int>{1, 0, 1});
}

TEST_CASE("kaisa: invalid grad_worker_fraction values are rejected", "[mpi][dist][kfac]") {
  CHECK(KAISAd::select_mode(1.0, 4) == KAISAd::Mode::comm_opt);
  CHECK(KAISAd::select_mode(0.25, 4) == KAISAd::Mode::mem_opt);
  CHECK(KAISAd::select_mode(0.5, 4) == KAISAd::Mode::hybrid_opt);
  CHECK(KAISAd::select_mode(1.0, 1) == KAISAd::Mode::comm_opt);
  CHECK(KAISAd::select_mode(1.0 / 3.0, 6) == KAISAd::Mode::hybrid_opt);
  CHECK(KAISAd::grad_workers(1.0 / 3.0, 6) == 2);
  CHECK(KAISAd::grad_workers(0.5, 6) == 3);
  CHECK(KAISAd::grad_workers(0.5, 4) == 2);
  CHECK(KAISAd::grad_workers(1.0, 4) == 4);
  // f·P not an integer, not a divisor of P, or f out of (0, 1].
  CHECK_THROWS_WITH(KAISAd::select_mode(0.3, 4),
                    Catch::Contains("grad_worker_fraction") && Catch::Contains("P = 4") &&
                        Catch::Contains("0.25 (1/4, MEM-OPT), 0.5 (2/4, HYBRID-OPT), 1 (4/4, "
                                        "COMM-OPT)") &&
                        Catch::Contains("got 0.3"));
  CHECK_THROWS_AS(KAISAd::select_mode(0.75, 4), ValueError); // 3 does not divide 4
  CHECK_THROWS_AS(KAISAd::select_mode(0.0, 4), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(-0.25, 4), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(1.25, 4), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(2.0, 2), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(std::nan(""), 4), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(INFINITY, 4), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(0.5, 0), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(0.5, 1), ValueError);
  CHECK_THROWS_AS(KAISAd::select_mode(0.5 + 1e-6, 4), ValueError);
  CHECK(KAISAd::select_mode(0.5 * (1 + 1e-12), 4) == KAISAd::Mode::hybrid_opt);
  // The constructor rejects them on every rank before any communication.
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const double f : {0.3, 0.75, 0.0, 1.5, std::nan("")}) {
    INFO("grad_worker_fraction " << f);
    RegisteredMLP m;
    KFACd &kfac = m.kfac;
    dist::KAISAOptions o;
    o.grad_worker_fraction = f;
    CHECK_THROWS_WITH(KAISAd(comm, kfac, o), Catch::Contains("grad_worker_fraction"));
    CHECK(kfac.strategy().name() == "local");
  }
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
    const Run plain = run_steps(&single, Strategy::plain, 1.0, c, first, local);
    const Run k = run_steps(&single, Strategy::kaisa, 1.0, c, first, local);
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
      const Run r =
          run_steps(&comm, Strategy::kaisa, f, c, std::size_t(comm.rank()) * local, local);
      INFO(mode_name(r.mode));
      const std::uint64_t decompositions = every(c.inv_every);
      // Factors: as D-KFAC, the upper triangles, one all-reduce per factor per update; the
      // agreement on decomposition failures: one all-reduce of 2L int32 per decomposition step.
      CHECK(r.per_factor_update == upper * sizeof(double));
      CHECK(r.per_agreement == 2 * 3 * sizeof(std::int32_t));
      CHECK(r.stats.decomposition_agreement.calls == decompositions);
      CHECK(r.stats.decomposition_agreement.bytes == decompositions * r.per_agreement);
      CHECK(r.allreduce.bytes ==
            every(c.factor_every) * upper * sizeof(double) + decompositions * r.per_agreement);
      // The strategy's report: the same counters, analytic volumes that match them.
      const precond::KFACStrategyReport &rep = r.report;
      CHECK(rep.name == std::string("KAISA ") + mode_name(r.mode));
      CHECK(rep.bytes_per_factor_update == r.per_factor_update);
      CHECK(rep.bytes_per_decomposition_update == r.per_decomposition + r.per_agreement);
      CHECK(rep.bytes_per_step == r.per_step);
      CHECK(rep.factor_updates == every(c.factor_every));
      CHECK(rep.decomposition_updates == decompositions);
      CHECK(rep.factor_reduction.bytes == every(c.factor_every) * r.per_factor_update);
      CHECK(rep.decomposition_sharing.bytes == r.stats.decomposition_broadcast.bytes);
      CHECK(rep.gradient_sharing.bytes == r.stats.gradient_broadcast.bytes);
      CHECK(rep.agreement.bytes == r.stats.decomposition_agreement.bytes);
      CHECK(rep.total().bytes ==
            rep.factor_updates * rep.bytes_per_factor_update +
                rep.decomposition_updates * rep.bytes_per_decomposition_update +
                (r.mode == KAISAd::Mode::comm_opt ? 0 : kSteps) * rep.bytes_per_step);
      if (r.mode == KAISAd::Mode::hybrid_opt) {
        // Decompositions: each rank takes part in the broadcasts of the factors of its worker
        // group's layers; P: one broadcast per layer in each receiver group. Both on
        // sub-communicators, none on K-FAC's own one.
        std::size_t group_entries = 0, group_factors = 0;
        for (std::size_t l = 0; l < 3; ++l) {
          if (r.layer_group[l] != r.group)
            continue;
          for (const std::size_t d : {kADims[l], kGDims[l]}) {
            // Eigen: Q and d; inverse: the symmetric inverse's packed upper triangle.
            group_entries += eigen ? d * d + d : d * (d + 1) / 2;
            ++group_factors;
          }
        }
        REQUIRE(group_factors > 0); // 3 layers on 2 groups: each group has one
        CHECK(r.per_decomposition == group_entries * sizeof(double));
        CHECK(r.per_step == gradient_entries * sizeof(double));
        CHECK(r.stats.decomposition_updates == decompositions);
        CHECK(r.stats.steps == std::uint64_t(kSteps));
        CHECK(r.stats.decomposition_broadcast.calls ==
              decompositions * group_factors * (eigen ? 2 : 1));
        CHECK(r.stats.decomposition_broadcast.bytes == decompositions * r.per_decomposition);
        CHECK(r.stats.gradient_broadcast.calls == std::uint64_t(kSteps) * 3);
        CHECK(r.stats.gradient_broadcast.bytes == std::uint64_t(kSteps) * r.per_step);
        CHECK(r.broadcast.calls == 0);
      } else if (r.mode == KAISAd::Mode::comm_opt) {
        // Eigen: every Q and d; inverse: every symmetric inverse's packed upper triangle.
        const std::size_t entries = eigen ? squares + dims : upper;
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

TEST_CASE("kaisa: the destructor restores the local strategy", "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const double f : fractions(comm.size())) {
    INFO("grad_worker_fraction " << f);
    KFACd kfac;
    {
      dist::KAISAOptions o;
      o.grad_worker_fraction = f;
      KAISAd k(comm, kfac, o);
      CHECK(&kfac.strategy() == &k);
      CHECK(kfac.strategy().name() == std::string("KAISA ") + mode_name(k.mode()));
      CHECK(k.reduces_factors());
      CHECK(k.agrees_on_failures());
      // P is broadcast unless COMM-OPT.
      CHECK(k.shares_gradients() == (k.mode() != KAISAd::Mode::comm_opt));
    }
    CHECK(kfac.strategy().name() == "local");
  }
}

namespace {

// The injected-failure run (dist_kfac_helpers.hpp) with KAISA at `fraction`.
struct Faulty : FaultyRun<KAISAd> {
  Faulty(Communicator &comm, double fraction, ComputeMethod method, bool keep_previous)
      : FaultyRun<KAISAd>(method, keep_previous, [&](KFACd &kfac) {
          dist::KAISAOptions k;
          k.grad_worker_fraction = fraction;
          return std::make_unique<KAISAd>(comm, kfac, k);
        }) {}
  KAISAd &kaisa() { return *strategy; }
  std::vector<double> decomposition(char which) const {
    return FaultyRun<KAISAd>::decomposition(1, which);
  }
};

} // namespace

TEST_CASE("kaisa: a decomposition failing on its owner makes every rank throw the same error",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
    for (const double f : fractions(comm.size())) {
      INFO("grad_worker_fraction " << f
                                   << (method == ComputeMethod::eigen ? " eigen" : " inverse"));
      Faulty run(comm, f, method, false);
      run.first_step(comm.rank());
      // Only the rank that decomposes layer 1's G holds a poisoned factor.
      const int owner = run.kaisa().decomposition_owner(1, 'G');
      run.poison(owner, comm.rank(), 'G');
      const auto before = run.decomposition('G');
      const auto gradients = values_of(run.model.gradients());
      const std::string message = run.failing_step(comm.rank());
      INFO(message);
      CHECK_THAT(message, Catch::Contains("layer '3' factor G at step 1") &&
                              Catch::Contains("the decomposition failed") &&
                              Catch::Contains("decomposed on rank " + std::to_string(owner)));
      CHECK(same_on_every_rank(comm, message));
      // Nothing changed: the step counter, the decomposition, the gradients.
      CHECK(run.kfac->steps() == 1);
      CHECK(run.decomposition('G') == before);
      CHECK(values_of(run.model.gradients()) == run.backward_gradients);
      CHECK(run.backward_gradients != gradients);
    }
  }
}

TEST_CASE("kaisa: with keep_previous_on_failure every rank keeps the previous decomposition",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
    for (const double f : fractions(comm.size())) {
      INFO("grad_worker_fraction " << f
                                   << (method == ComputeMethod::eigen ? " eigen" : " inverse"));
      Faulty run(comm, f, method, true);
      run.first_step(comm.rank());
      const int owner = run.kaisa().decomposition_owner(1, 'A');
      run.poison(owner, comm.rank(), 'A');
      const auto a = run.decomposition('A'), g = run.decomposition('G');
      CHECK(run.failing_step(comm.rank()).empty());
      CHECK(run.kfac->steps() == 2);
      // Every gradient worker of layer 1 still holds the step-0 decomposition of A (the owner
      // kept it, the others received nothing) and one of G.
      CHECK(run.decomposition('A') == a);
      if (run.kaisa().is_gradient_worker(1, comm.rank())) {
        CHECK(!a.empty());
        CHECK(!g.empty());
      }
      CHECK_THAT(run.log.str(), Catch::Contains("layer '3' factor A at step 1") &&
                                    Catch::Contains("keeping the previous decomposition"));
      for (const double v : values_of(run.model.gradients())) {
        CHECK(std::isfinite(v));
      }
    }
  }
}

TEST_CASE("kaisa: a first decomposition that fails is never marked valid on any rank",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  // A generator, not a loop: Catch enters each SECTION once per run of the test case, so in a
  // loop the sections below would see only the first fraction.
  const std::vector<double> all_fractions = fractions(comm.size());
  const double f = GENERATE_COPY(from_range(all_fractions));
  INFO("grad_worker_fraction " << f);
  // A checkpoint of step 1 whose layer-1 A is poisoned on its owner only (as a corrupted
  // shard would be): load_state decomposes, and that first decomposition fails.
  Faulty source(comm, f, ComputeMethod::eigen, true);
  source.first_step(comm.rank());
  KFACState state = source.kfac->state();
  const int owner = source.kaisa().decomposition_owner(1, 'A');
  if (comm.rank() == owner) {
    std::fill(state.layers[1].A.begin(), state.layers[1].A.end(),
              std::numeric_limits<double>::quiet_NaN());
  }
  SECTION("keep_previous_on_failure: no rank holds a decomposition of that factor") {
    Faulty run(comm, f, ComputeMethod::eigen, true);
    run.kfac->load_state(run.space, state);
    CHECK(!run.kfac->factor_a(1).has_eigen());
    // The other decompositions are where the mode puts them: with the gradient workers of
    // their layer (MEM-OPT: one rank a layer).
    if (run.kaisa().is_gradient_worker(1, comm.rank())) {
      CHECK(run.kfac->factor_g(1).has_eigen());
    }
    if (run.kaisa().is_gradient_worker(0, comm.rank())) {
      CHECK(run.kfac->factor_a(0).has_eigen());
    }
    // The same rows on every rank, as DataParallel's average makes the gradient before K-FAC
    // (in MEM-OPT and HYBRID-OPT a receiver's P is its gradient worker's): every rank then
    // applies the same update.
    run.forward_backward(1, 0);
    const auto before = values_of(run.model.layer(3).curvature().weight_gradient);
    run.kfac->step(run.space);
    const auto after = values_of(run.model.layer(3).curvature().weight_gradient);
    CHECK(same_on_every_rank(comm, after));
    // Layer 1 is left to the base optimizer in every mode: its gradient is unchanged (the
    // agreement told every rank that no worker holds its decomposition of A, so MEM-OPT and
    // HYBRID-OPT neither broadcast its P = ∇ nor count it in the KL clip).
    CHECK(after == before);
  }
  SECTION("by default: every rank throws the same error from load_state") {
    Faulty run(comm, f, ComputeMethod::eigen, false);
    std::string message;
    try {
      run.kfac->load_state(run.space, state);
    } catch (const NumericalError &e) {
      message = e.what();
    }
    INFO(message);
    CHECK_THAT(message, Catch::Contains("layer '3' factor A") &&
                            Catch::Contains("decomposed on rank " + std::to_string(owner)));
    CHECK(same_on_every_rank(comm, message));
  }
}

TEST_CASE("kaisa: a run continued from state_dict steps as the run it was taken from",
          "[mpi][dist][kfac][state]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  const std::vector<double> all_fractions = fractions(comm.size());
  const double f = GENERATE_COPY(from_range(all_fractions));
  INFO("grad_worker_fraction " << f);
  check_state_dict_continues(comm, [f](Communicator &c, KFACd &kfac) {
    dist::KAISAOptions o;
    o.grad_worker_fraction = f;
    return std::make_unique<KAISAd>(c, kfac, o);
  });
}

TEST_CASE("kaisa: MEM-OPT broadcasts P in the model precision and every rank applies the same P",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  const double mem_opt = 1.0 / comm.size(); // COMM-OPT on one rank: no P is broadcast
  for (const ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
    INFO((method == ComputeMethod::eigen ? "eigen" : "inverse"));
    const FloatRun plain = float_layer(0, method, [](KFACf &) { return nullptr; });
    for (const bool narrow : {true, false}) {
      INFO("model_precision_broadcast " << narrow);
      const FloatRun run = float_layer(0, method, [&](KFACf &kfac) {
        dist::KAISAOptions k;
        k.grad_worker_fraction = mem_opt;
        k.model_precision_broadcast = narrow;
        return std::make_unique<dist::KAISA<KFACf>>(comm, kfac, k);
      });
      const std::size_t per_step =
          comm.size() == 1 ? 0 : 12 * (narrow ? sizeof(float) : sizeof(double));
      CHECK(run.report.bytes_per_step == per_step);
      CHECK(run.report.gradient_sharing.bytes == 3 * per_step);
      // The staging buffer: a 3 x 4 float P, only when P is narrowed.
      CHECK(run.report.workspace_bytes >= (narrow && comm.size() > 1 ? 12 * sizeof(float) : 0));
      check_same_p_everywhere(comm, run, plain, narrow); // the gradient worker's P everywhere
    }
  }
}

} // namespace test_kaisa

#endif // KAT_ENABLE_MPI
