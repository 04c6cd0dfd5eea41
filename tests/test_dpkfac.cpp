// kat::distributed::DPKFAC (docs/algorithms.md section 2, DP-KFAC): P ranks equal one process in
// which layer l's factors come from its owner's shard and the gradient is the whole batch's; the
// round-robin and balanced assignments give each layer exactly one owner; the P broadcasts
// send the analytic volume; a rank that owns k < L layers holds less K-FAC state; one rank
// equals plain K-FAC exactly. The "[mpi]" cases run under mpiexec at 1, 2, 3 and 4 ranks (ctest
// mpi_ranks_*) and hold for any rank count that divides the batch of 24.
#ifdef KAT_ENABLE_MPI

#include "dist_kfac_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/distributed/kfac/dkfac.hpp>
#include <kat/distributed/kfac/dpkfac.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/precond/kfac.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace test_dpkfac {

using namespace kat;
using namespace kat::precond;
using namespace kat::test;
using namespace kat::test::dist_kfac;
using kat::distributed::Communicator;

namespace {

using DPKFACd = dist::DPKFAC<KFACd>;
using DKFACd = dist::DKFAC<KFACd>;

// The Dense layers of build_mlp: their indices in the model, out and in+1.
const std::vector<std::size_t> kDense{1, 3, 5};
const std::vector<std::size_t> kOut{12, 8, 4}, kCols{7, 13, 9};

const std::vector<dist::LayerAssignment> kAssignments{dist::LayerAssignment::round_robin,
                                                      dist::LayerAssignment::balanced};

enum class Strategy { none, dkfac, dpkfac };

struct Run {
  std::vector<double> parameters;
  dist::DPKFACStats stats;
  dist::CollectiveCounter counted;    // the broadcast counter of DP-KFAC's own communicator
  std::size_t analytic = 0;           // DPKFAC::bytes_per_step
  precond::KFACStrategyReport report; // KFAC::strategy_report() after the last step
  std::size_t state_bytes = 0;        // KFAC::state_bytes after the last step
  std::size_t owned = 0;              // layers this rank owns
  std::vector<int> owners;
};

// kSteps steps of K-FAC + SGD on rows [first, first + count) of each global batch, data
// parallel over `comm`, with the chosen strategy on a duplicate of it.
Run run_steps(Communicator &comm, Strategy strategy, dist::LayerAssignment assignment,
              const Config &c, std::size_t first, std::size_t count) {
  Replica replica(&comm, c, first, count);
  KFACd &kfac = replica.kfac;
  Communicator kcomm = comm.dup();
  std::unique_ptr<DPKFACd> dpkfac;
  std::unique_ptr<DKFACd> dkfac;
  if (strategy == Strategy::dpkfac) {
    dist::DPKFACOptions options;
    options.assignment = assignment;
    dpkfac = std::make_unique<DPKFACd>(kcomm, kfac, options);
  } else if (strategy == Strategy::dkfac) {
    dkfac = std::make_unique<DKFACd>(kcomm, kfac);
  }
  for (int s = 0; s < kSteps; ++s) {
    replica.precondition(s);
    replica.update();
  }
  Run run;
  run.parameters = replica.parameters();
  run.state_bytes = kfac.state_bytes();
  if (dpkfac) {
    run.stats = dpkfac->stats();
    run.counted = kcomm.stats().broadcast;
    run.analytic = dpkfac->bytes_per_step();
    run.owned = dpkfac->owned_layers();
    run.owners = dpkfac->owners();
    run.report = kfac.strategy_report();
    for (std::size_t i = 0; i < kfac.size(); ++i) {
      CHECK(kfac.owned(i) == (run.owners[i] == comm.rank()));
    }
  }
  return run;
}

// The reference, in one process: `ranks` slice models (slice r: rows [r B/P, (r+1) B/P))
// give the a and g of each layer from its owner's slice, a whole-batch model gives the
// gradient (the mean over the batch, which DataParallel's average of equal slices is), and
// plain K-FAC with those views preconditions it.
std::vector<double> reference(const Config &c, const std::vector<int> &owners, int ranks) {
  const Space space;
  const std::size_t local = kBatch / std::size_t(ranks);
  Model whole(FeatureShape{1, 2, 3});
  build_mlp(whole, 11);
  std::vector<std::unique_ptr<Model>> slices;
  for (int r = 0; r < ranks; ++r) {
    slices.push_back(std::make_unique<Model>(FeatureShape{1, 2, 3}));
    build_mlp(*slices.back(), 11);
  }
  KFACd kfac(kfac_options(c));
  for (std::size_t l = 0; l < kDense.size(); ++l) {
    auto *w = &whole.layer(kDense[l]);
    auto *s = &slices[std::size_t(owners[l])]->layer(kDense[l]);
    REQUIRE(kfac.register_layer(
        std::to_string(l),
        [w, s]() {
          auto r = s->curvature();
          r.weight_gradient = w->curvature().weight_gradient;
          r.weight = w->curvature().weight;
          return r;
        },
        [s](bool on) { s->record_curvature(on); }, "Dense"));
  }
  optim::SGD<double, Mem> opt(whole.parameter_count(), sgd_options());
  nn::SoftmaxCrossEntropy<double, Mem> loss;
  // One output gradient per slice: a layer's g may be a view of the gradient it was given.
  Matrix<double, Mem> d_whole("d_whole", kBatch, 4);
  std::vector<Matrix<double, Mem>> d_slice;
  for (int r = 0; r < ranks; ++r)
    d_slice.emplace_back("d_slice", local, 4);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < ranks; ++r) {
      Model &m = *slices[std::size_t(r)];
      Kokkos::deep_copy(m.parameters(), whole.parameters());
      const Batch b = batch_rows(step, std::size_t(r) * local, local);
      const auto &d = d_slice[std::size_t(r)];
      loss.forward_backward(space, m.forward(space, b.x), b.y, d);
      m.backward(space, d, Model::Gradients::overwrite);
    }
    const Batch all = batch_rows(step, 0, kBatch);
    loss.forward_backward(space, whole.forward(space, all.x), all.y, d_whole);
    whole.backward(space, d_whole, Model::Gradients::overwrite);
    kfac.step(space);
    opt.step(space, whole.parameters(), whole.gradients());
  }
  const auto p = to_host(whole.parameters());
  return std::vector<double>(p.data(), p.data() + p.size());
}

const char *name_of(dist::LayerAssignment a) {
  return a == dist::LayerAssignment::round_robin ? "round_robin" : "balanced";
}

std::vector<double> mlp_costs() {
  std::vector<double> costs;
  for (std::size_t l = 0; l < kOut.size(); ++l)
    costs.push_back(double(kCols[l] * kCols[l] * kCols[l] + kOut[l] * kOut[l] * kOut[l]));
  return costs;
}

} // namespace

TEST_CASE("dpkfac: P ranks equal one process with each layer's factors from its owner's shard",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const int p = comm.size();
  const std::size_t local = kBatch / std::size_t(p);
  REQUIRE(kBatch % std::size_t(p) == 0);
  INFO(rank_of(comm));
  for (const auto assignment : kAssignments) {
    INFO(name_of(assignment));
    for (const Config &c : kConfigs) {
      INFO(describe(c));
      const Run got =
          run_steps(comm, Strategy::dpkfac, assignment, c, std::size_t(comm.rank()) * local, local);
      REQUIRE(got.owners == DPKFACd::owners(mlp_costs(), p, assignment));
      const std::vector<double> want = reference(c, got.owners, p);
      CHECK(max_abs_diff(got.parameters, want) <= 1e-10);
      // The owners' shards matter: with more than one rank, factors of the whole batch
      // (D-KFAC) give other parameters.
      if (p > 1) {
        const Run whole = run_steps(comm, Strategy::dkfac, assignment, c,
                                    std::size_t(comm.rank()) * local, local);
        CHECK(max_abs_diff(whole.parameters, want) > 1e-8);
      }
    }
  }
}

TEST_CASE("dpkfac: round-robin and balanced assignments give each layer exactly one owner",
          "[mpi][dist][kfac]") {
  using dist::LayerAssignment;
  // Round robin: layer l on rank l mod P.
  CHECK(DPKFACd::owners({1, 1, 1, 1, 1}, 2, LayerAssignment::round_robin) ==
        std::vector<int>{0, 1, 0, 1, 0});
  CHECK(DPKFACd::owners({5, 1, 9}, 4, LayerAssignment::round_robin) == std::vector<int>{0, 1, 2});
  // Balanced: contiguous, the rank whose share of the total cost holds the layer's midpoint.
  CHECK(DPKFACd::owners({1, 1, 1, 1}, 2, LayerAssignment::balanced) ==
        std::vector<int>{0, 0, 1, 1});
  CHECK(DPKFACd::owners({6, 1, 1, 1, 1}, 2, LayerAssignment::balanced) ==
        std::vector<int>{0, 1, 1, 1, 1});
  CHECK(DPKFACd::owners({1, 1, 1, 1, 1, 1}, 3, LayerAssignment::balanced) ==
        std::vector<int>{0, 0, 1, 1, 2, 2});
  CHECK(DPKFACd::owners({1, 1}, 4, LayerAssignment::balanced) == std::vector<int>{1, 3});
  CHECK(DPKFACd::owners({0, 0}, 3, LayerAssignment::balanced) == std::vector<int>{0, 0});
  // The MLP: costs 7³+12³ = 2071, 13³+8³ = 2709, 9³+4³ = 793 of 5573.
  CHECK(mlp_costs() == std::vector<double>{2071, 2709, 793});
  CHECK(DPKFACd::owners(mlp_costs(), 2, LayerAssignment::balanced) == std::vector<int>{0, 1, 1});
  CHECK(DPKFACd::owners(mlp_costs(), 4, LayerAssignment::balanced) == std::vector<int>{0, 2, 3});
  CHECK_THROWS_AS(DPKFACd::owners({1}, 0, LayerAssignment::balanced), ValueError);
  CHECK_THROWS_AS(DPKFACd::owners({-1}, 2, LayerAssignment::balanced), ValueError);

  auto comm = Communicator::world();
  INFO(rank_of(comm));
  const Space space;
  for (const auto assignment : kAssignments) {
    INFO(name_of(assignment));
    Model model(FeatureShape{1, 2, 3});
    build_mlp(model, 3);
    KFACd kfac;
    kfac.register_model(model);
    {
      dist::DPKFACOptions options;
      options.assignment = assignment;
      DPKFACd d(comm, kfac, options);
      const auto owners = d.owners();
      REQUIRE(owners.size() == 3);
      // Contiguous for balanced (non-decreasing), every owner a valid rank.
      for (std::size_t l = 0; l < owners.size(); ++l) {
        CHECK(owners[l] >= 0);
        CHECK(owners[l] < comm.size());
        if (assignment == LayerAssignment::balanced && l > 0)
          CHECK(owners[l] >= owners[l - 1]);
        if (assignment == LayerAssignment::round_robin)
          CHECK(owners[l] == int(l) % comm.size());
      }
      // Exactly one rank owns each layer.
      Vector<double, Mem> count("count", owners.size());
      auto h = Kokkos::create_mirror_view(count);
      for (std::size_t l = 0; l < owners.size(); ++l)
        h(l) = kfac.owned(l) ? 1.0 : 0.0;
      Kokkos::deep_copy(count, h);
      comm.allreduce(space, count);
      Kokkos::deep_copy(h, count);
      for (std::size_t l = 0; l < owners.size(); ++l)
        CHECK(h(l) == 1.0);
      CHECK(kfac.strategy().name() == "DP-KFAC");
      CHECK(kfac.strategy().shares_gradients());
      CHECK(kfac.strategy().agrees_on_failures());
    }
    // The destructor restores the local strategy: every layer owned again.
    CHECK(kfac.strategy().name() == "local");
    for (std::size_t l = 0; l < 3; ++l)
      CHECK(kfac.owned(l));
  }
}

TEST_CASE("dpkfac: the P broadcasts send the analytic volume", "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const std::size_t local = kBatch / std::size_t(comm.size());
  INFO(rank_of(comm));
  std::size_t entries = 0; // Σ out·(in+1)
  for (std::size_t l = 0; l < kOut.size(); ++l)
    entries += kOut[l] * kCols[l];
  REQUIRE(entries == 224);
  for (const auto assignment : kAssignments) {
    INFO(name_of(assignment));
    for (const Config &c : kConfigs) {
      INFO(describe(c));
      const Run run =
          run_steps(comm, Strategy::dpkfac, assignment, c, std::size_t(comm.rank()) * local, local);
      CHECK(run.analytic == entries * sizeof(double));
      CHECK(run.stats.steps == std::uint64_t(kSteps));
      CHECK(run.counted.calls == std::uint64_t(kSteps) * 3);
      CHECK(run.counted.bytes == std::uint64_t(kSteps) * entries * sizeof(double));
      CHECK(run.stats.broadcast.calls == run.counted.calls);
      CHECK(run.stats.broadcast.bytes == run.counted.bytes);
      // The agreement on decomposition failures: one all-reduce of 2L int32 per decomposition.
      CHECK(run.stats.decomposition_agreement.calls == every(c.inv_every));
      CHECK(run.stats.decomposition_agreement.bytes ==
            every(c.inv_every) * 2 * kOut.size() * sizeof(std::int32_t));
      // The strategy's report: the same counters, analytic volumes that match them.
      const precond::KFACStrategyReport &r = run.report;
      CHECK(r.name == "DP-KFAC");
      CHECK(r.bytes_per_factor_update == 0);
      CHECK(r.bytes_per_step == run.analytic);
      CHECK(r.bytes_per_decomposition_update == 2 * kOut.size() * sizeof(std::int32_t));
      CHECK(r.steps == std::uint64_t(kSteps));
      CHECK(r.decomposition_updates == every(c.inv_every));
      CHECK(r.gradient_sharing.bytes == run.counted.bytes);
      CHECK(r.agreement.calls == every(c.inv_every));
      CHECK(r.total().bytes == r.steps * r.bytes_per_step +
                                   r.decomposition_updates * r.bytes_per_decomposition_update);
      CHECK(r.workspace_bytes == 0); // double model, double P: nothing to stage
    }
  }
}

TEST_CASE("dpkfac: a rank that owns k of L layers holds less K-FAC state than D-KFAC",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const std::size_t local = kBatch / std::size_t(comm.size());
  INFO(rank_of(comm));
  for (const auto assignment : kAssignments) {
    INFO(name_of(assignment));
    for (const Config &c : kConfigs) {
      INFO(describe(c));
      const std::size_t first = std::size_t(comm.rank()) * local;
      const Run dp = run_steps(comm, Strategy::dpkfac, assignment, c, first, local);
      const Run d = run_steps(comm, Strategy::dkfac, assignment, c, first, local);
      const Run plain = run_steps(comm, Strategy::none, assignment, c, first, local);
      CHECK(d.state_bytes == plain.state_bytes);
      if (dp.owned < 3) {
        CHECK(dp.state_bytes < d.state_bytes);
      } else {
        CHECK(dp.state_bytes == d.state_bytes);
      }
      if (dp.owned == 0) {
        // Only the P buffers: Σ out·(in+1) doubles.
        CHECK(dp.state_bytes == 224 * sizeof(double));
      }
    }
  }
}

TEST_CASE("dpkfac: on one rank DP-KFAC equals plain K-FAC exactly", "[mpi][dist][kfac]") {
  auto world = Communicator::world();
  INFO(rank_of(world));
  Communicator single = world.split(world.rank(), 0); // every rank on its own
  REQUIRE(single.size() == 1);
  const std::size_t local = kBatch / std::size_t(world.size());
  const std::size_t first = std::size_t(world.rank()) * local;
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const Run plain =
        run_steps(single, Strategy::none, dist::LayerAssignment::round_robin, c, first, local);
    for (const auto assignment : kAssignments) {
      INFO(name_of(assignment));
      const Run d = run_steps(single, Strategy::dpkfac, assignment, c, first, local);
      CHECK(d.parameters == plain.parameters);
      CHECK(d.owned == 3);
      CHECK(d.state_bytes == plain.state_bytes);
    }
  }
}

TEST_CASE("dpkfac: P in the model precision halves the bytes and every rank applies the same P",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  // The owner (rank 0) builds the factors from its own a and g; the others' must not matter.
  const FloatRun plain = float_layer(0, ComputeMethod::eigen, [](KFACf &) { return nullptr; });
  for (const bool narrow : {true, false}) {
    INFO("model_precision_broadcast " << narrow);
    const FloatRun run =
        float_layer(std::size_t(comm.rank()), ComputeMethod::eigen, [&](KFACf &kfac) {
          dist::DPKFACOptions d;
          d.model_precision_broadcast = narrow;
          return std::make_unique<dist::DPKFAC<KFACf>>(comm, kfac, d);
        });
    CHECK(run.report.bytes_per_step == 12 * (narrow ? sizeof(float) : sizeof(double)));
    CHECK(run.report.gradient_sharing.bytes == 3 * run.report.bytes_per_step);
    check_same_p_everywhere(comm, run, plain, narrow); // rank 0's P everywhere
  }
}

TEST_CASE("dpkfac: a decomposition failing on its owner makes every rank throw the same error",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  for (const ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
    for (const bool keep_previous : {false, true}) {
      INFO((method == ComputeMethod::eigen ? "eigen" : "inverse")
           << (keep_previous ? ", keep_previous_on_failure" : ""));
      FaultyRun<DPKFACd> run(method, keep_previous,
                             [&](KFACd &kfac) { return std::make_unique<DPKFACd>(comm, kfac); });
      run.first_step(comm.rank());
      const int owner = run.strategy->owner(1);
      run.poison(owner, comm.rank(), 'A'); // only the owner has factors of layer 1
      const auto before = run.decomposition(1, 'A');
      const std::string message = run.failing_step(comm.rank());
      INFO(message);
      CHECK(run.decomposition(1, 'A') == before);
      if (keep_previous) {
        CHECK(message.empty());
        CHECK(run.kfac->steps() == 2);
        if (comm.rank() == owner) {
          CHECK_THAT(run.log.str(), Catch::Contains("layer '3' factor A at step 1") &&
                                        Catch::Contains("keeping the previous decomposition"));
        }
      } else {
        CHECK_THAT(message, Catch::Contains("layer '3' factor A at step 1") &&
                                Catch::Contains("decomposed on rank " + std::to_string(owner)));
        CHECK(same_on_every_rank(comm, message));
        CHECK(run.kfac->steps() == 1);
        CHECK(values_of(run.model.gradients()) == run.backward_gradients); // nothing applied
      }
    }
  }
}

TEST_CASE("dpkfac: a layer its owner never decomposed is left to the base optimizer on every "
          "rank",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  const auto make = [&](KFACd &kfac) { return std::make_unique<DPKFACd>(comm, kfac); };
  // A checkpoint of step 1 whose layer-1 A is poisoned on its owner (the only rank with its
  // factors): load_state decomposes, that first decomposition fails, and with
  // keep_previous_on_failure there is no decomposition of layer 1 anywhere.
  FaultyRun<DPKFACd> source(ComputeMethod::eigen, true, make);
  source.first_step(comm.rank());
  KFACState state = source.kfac->state();
  const int owner = source.strategy->owner(1);
  if (comm.rank() == owner) {
    std::fill(state.layers[1].A.begin(), state.layers[1].A.end(),
              std::numeric_limits<double>::quiet_NaN());
  }
  FaultyRun<DPKFACd> run(ComputeMethod::eigen, true, make);
  run.kfac->load_state(run.space, state);
  CHECK(run.decomposition(1, 'A').empty());
  // The same rows on every rank, as DataParallel's average makes the gradient before K-FAC.
  // Without the agreement's word that layer 1 has no decomposition, its owner would broadcast
  // P = ∇ and the KL clip's ν would scale it with the others (as it scales layer 0's).
  run.forward_backward(1, 0);
  const auto before = values_of(run.model.layer(3).curvature().weight_gradient);
  const auto before_0 = values_of(run.model.layer(1).curvature().weight_gradient);
  run.kfac->step(run.space);
  const auto after = values_of(run.model.layer(3).curvature().weight_gradient);
  CHECK(after == before);
  CHECK(same_on_every_rank(comm, values_of(run.model.gradients())));
  CHECK(values_of(run.model.layer(1).curvature().weight_gradient) != before_0); // preconditioned
}

TEST_CASE("dpkfac: a run continued from state_dict steps as the run it was taken from",
          "[mpi][dist][kfac][state]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  check_state_dict_continues(
      comm, [](Communicator &c, KFACd &kfac) { return std::make_unique<DPKFACd>(c, kfac); });
}

} // namespace test_dpkfac

#endif // KAT_ENABLE_MPI
