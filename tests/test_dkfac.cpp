// kat::distributed::DKFAC (docs/algorithms.md section 2, D-KFAC): P ranks with B/P samples each
// equal one process on the concatenated batch of B; symmetric (upper-triangle) and full
// communication agree and send the analytic volume; one rank equals plain K-FAC exactly. The
// "[mpi]" cases run under mpiexec at 1, 2, 3 and 4 ranks (ctest mpi_ranks_*) and hold for any rank
// count that divides the batch of 24.
#ifdef KAT_ENABLE_MPI

#include "dist_kfac_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/distributed/kfac/dkfac.hpp>
#include <kat/distributed/kfac/dpkfac.hpp>
#include <kat/distributed/kfac/kaisa.hpp>
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
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace test_dkfac {

using namespace kat;
using namespace kat::precond;
using namespace kat::test;
using namespace kat::test::dist_kfac;
using kat::distributed::Communicator;

namespace {

using DKFACd = dist::DKFAC<KFACd>;

// A of 7, 13, 9 and G of 12, 8, 4, in registration order, A before G.
const std::vector<std::size_t> kFactorDims{7, 12, 13, 8, 9, 4};

struct Run {
  std::vector<double> parameters;
  std::vector<std::vector<double>> factors; // after each step: every A and G, concatenated
  dist::DKFACStats stats;
  dist::CollectiveCounter counted;    // the allreduce counter of D-KFAC's own communicator
  std::size_t analytic = 0;           // DKFAC::bytes_per_factor_update
  precond::KFACStrategyReport report; // KFAC::strategy_report() after the last step
};

// kSteps steps of K-FAC + SGD on rows [first, first + count) of each global batch. With
// `comm`: data parallel over it (gradients averaged), and with `dkfac` the D-KFAC hook on a
// duplicate of it (so its counters hold the factor all-reduces only).
Run run_steps(Communicator *comm, bool dkfac, bool symmetric, const Config &c, std::size_t first,
              std::size_t count) {
  Replica replica(comm, c, first, count);
  std::optional<Communicator> kcomm;
  std::unique_ptr<DKFACd> hook;
  if (dkfac) {
    REQUIRE(comm != nullptr);
    kcomm.emplace(comm->dup());
    dist::DKFACOptions options;
    options.symmetric_communication = symmetric;
    hook = std::make_unique<DKFACd>(*kcomm, replica.kfac, options);
  }
  Run run;
  for (int s = 0; s < kSteps; ++s) {
    replica.precondition(s);
    replica.update();
    std::vector<double> factors;
    for (const auto &layer : replica.kfac.state().layers) {
      factors.insert(factors.end(), layer.A.begin(), layer.A.end());
      factors.insert(factors.end(), layer.G.begin(), layer.G.end());
    }
    run.factors.push_back(std::move(factors));
  }
  run.parameters = replica.parameters();
  if (hook) {
    run.stats = hook->stats();
    run.counted = kcomm->stats().allreduce;
    run.analytic = hook->bytes_per_factor_update();
    run.report = replica.kfac.strategy_report();
  }
  return run;
}

double max_abs(const std::vector<double> &a) {
  double m = 0;
  for (double v : a)
    m = std::max(m, std::abs(v));
  return m;
}

std::uint64_t factor_updates(const Config &c) {
  return std::uint64_t((kSteps + c.factor_every - 1) / c.factor_every);
}

} // namespace

TEST_CASE("dkfac: P ranks with B/P samples each equal one process on the concatenated batch",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const std::size_t p = std::size_t(comm.size()), local = kBatch / p;
  REQUIRE(kBatch % p == 0);
  INFO(rank_of(comm));
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const Run got = run_steps(&comm, true, true, c, std::size_t(comm.rank()) * local, local);
    const Run want = run_steps(nullptr, false, false, c, 0, kBatch);
    // The averaged factors (G with its N²/rows scale from each rank's local mean loss) equal
    // the concatenated batch's after every step.
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s);
      CHECK(max_abs_diff(got.factors[std::size_t(s)], want.factors[std::size_t(s)]) <=
            1e-13 * max_abs(want.factors[std::size_t(s)]));
    }
    CHECK(max_abs_diff(got.parameters, want.parameters) <= 1e-10);
    // Without the hook, ranks with different local factors do not reproduce the reference
    // (so the comparison above tests the averaging).
    if (p > 1) {
      const Run local_only =
          run_steps(&comm, false, true, c, std::size_t(comm.rank()) * local, local);
      CHECK(max_abs_diff(local_only.factors[0], want.factors[0]) > 1e-6);
    }
  }
}

TEST_CASE("dkfac: G averaged over ranks equals N squared gTg over rows of the whole batch",
          "[mpi][dist][kfac]") {
  // The G scaling checked on its own, without K-FAC: each rank's g carries 1/(B/P).
  auto comm = Communicator::world();
  const std::size_t p = std::size_t(comm.size()), local = kBatch / p;
  INFO(rank_of(comm));
  const Space space;
  Model model(FeatureShape{1, 2, 3}), whole(FeatureShape{1, 2, 3});
  build_mlp(model, 5);
  build_mlp(whole, 5);
  nn::SoftmaxCrossEntropy<double, Mem> loss;
  const Batch mine = batch_rows(0, std::size_t(comm.rank()) * local, local);
  const Batch all = batch_rows(0, 0, kBatch);
  Matrix<double, Mem> d_mine("d_mine", local, 4), d_all("d_all", kBatch, 4);
  loss.forward_backward(space, model.forward(space, mine.x), mine.y, d_mine);
  loss.forward_backward(space, whole.forward(space, all.x), all.y, d_all);
  // g of the last layer is dlogits; G_r = N_r² g_rᵀg_r / rows_r with rows_r = N_r.
  const auto gram = [](const Matrix<double, Mem> &g, double scale) {
    const auto h = to_host(g);
    Matrix<double, Mem> out("gram", 4, 4);
    auto ho = Kokkos::create_mirror_view(out);
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 4; ++j) {
        double s = 0;
        for (std::size_t k = 0; k < h.extent(0); ++k)
          s += h(k, i) * h(k, j);
        ho(i, j) = scale * s;
      }
    Kokkos::deep_copy(out, ho);
    return out;
  };
  const double n_r = double(local), n = double(kBatch);
  const auto g_local = gram(d_mine, n_r * n_r / n_r);
  comm.average(space, g_local);
  const auto g_whole = gram(d_all, n * n / n);
  const auto a = to_host(g_local), b = to_host(g_whole);
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 4; ++j) {
      worst = std::max(worst, std::abs(a(i, j) - b(i, j)));
      scale = std::max(scale, std::abs(b(i, j)));
    }
  CHECK(scale > 1e-3);
  CHECK(worst <= 1e-14 * scale);
}

TEST_CASE("dkfac: symmetric and full communication agree and send the analytic volume",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  const std::size_t p = std::size_t(comm.size()), local = kBatch / p;
  INFO(rank_of(comm));
  std::size_t upper = 0, full = 0; // entries per factor update, from the layer shapes
  for (const std::size_t d : kFactorDims) {
    upper += d * (d + 1) / 2;
    full += d * d;
  }
  REQUIRE(upper == 288);
  REQUIRE(full == 523);
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const std::size_t first = std::size_t(comm.rank()) * local;
    const Run sym = run_steps(&comm, true, true, c, first, local);
    const Run all = run_steps(&comm, true, false, c, first, local);
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s);
      CHECK(max_abs_diff(sym.factors[std::size_t(s)], all.factors[std::size_t(s)]) <=
            1e-15 * max_abs(all.factors[std::size_t(s)]));
    }
    CHECK(max_abs_diff(sym.parameters, all.parameters) <= 1e-13);

    const std::uint64_t updates = factor_updates(c);
    CHECK(sym.stats.factor_updates == updates);
    CHECK(all.stats.factor_updates == updates);
    CHECK(sym.stats.factors == updates * 6);
    CHECK(sym.analytic == upper * sizeof(double));
    CHECK(all.analytic == full * sizeof(double));
    // Counted by the Communicator (payload bytes handed to MPI, CommunicatorStats) on every
    // rank: one average (= one allreduce) per factor.
    CHECK(sym.counted.calls == updates * 6);
    CHECK(all.counted.calls == updates * 6);
    CHECK(sym.counted.bytes == updates * upper * sizeof(double));
    CHECK(all.counted.bytes == updates * full * sizeof(double));
    CHECK(sym.stats.allreduce.bytes == sym.counted.bytes);
    CHECK(all.stats.allreduce.bytes == all.counted.bytes);
    CHECK(sym.stats.allreduce.calls == sym.counted.calls);
    // The strategy's report says the same.
    for (const Run *r : {&sym, &all}) {
      CHECK(r->report.name == "D-KFAC");
      CHECK(r->report.bytes_per_factor_update == r->analytic);
      CHECK(r->report.bytes_per_decomposition_update == 0);
      CHECK(r->report.bytes_per_step == 0);
      CHECK(r->report.factor_updates == updates);
      CHECK(r->report.factor_reduction.calls == r->counted.calls);
      CHECK(r->report.factor_reduction.bytes == r->counted.bytes);
      CHECK(r->report.total().bytes == updates * r->report.bytes_per_factor_update);
    }
    CHECK(sym.report.workspace_bytes == 13 * 14 / 2 * sizeof(double)); // the largest factor
    CHECK(all.report.workspace_bytes == 0);
  }
}

TEST_CASE("dkfac: on one rank D-KFAC equals plain K-FAC exactly", "[mpi][dist][kfac]") {
  auto world = Communicator::world();
  INFO(rank_of(world));
  Communicator single = world.split(world.rank(), 0); // every rank on its own
  REQUIRE(single.size() == 1);
  const std::size_t local = kBatch / std::size_t(world.size());
  const std::size_t first = std::size_t(world.rank()) * local;
  for (const Config &c : kConfigs) {
    INFO(describe(c));
    const Run plain = run_steps(&single, false, false, c, first, local);
    for (const bool symmetric : {true, false}) {
      INFO("symmetric_communication " << symmetric);
      const Run d = run_steps(&single, true, symmetric, c, first, local);
      CHECK(d.factors == plain.factors);
      CHECK(d.parameters == plain.parameters);
      CHECK(d.stats.factor_updates == factor_updates(c));
    }
  }
}

TEST_CASE("dkfac: the destructor restores the local strategy", "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  KFACd kfac;
  {
    DKFACd d(comm, kfac);
    CHECK(&kfac.strategy() == &d);
    CHECK(kfac.strategy().name() == "D-KFAC");
    CHECK(d.options().symmetric_communication);
  }
  CHECK(kfac.strategy().name() == "local");
}

TEST_CASE("dkfac: the strategies refuse factored preconditioning and leave the local strategy",
          "[mpi][dist][kfac]") {
  auto comm = Communicator::world();
  KFACOptions options;
  options.factored_preconditioning = true;
  KFACd kfac(options);
  Matrix<double, Mem> grad("grad", 3, 5);
  kfac.register_layer("dense", [grad] {
    KFACd::record_type r;
    r.weight_gradient = grad;
    return r;
  });
  CHECK_THROWS_WITH(DKFACd(comm, kfac), Catch::Contains("kat::distributed::DKFAC") &&
                                            Catch::Contains("factored_preconditioning"));
  CHECK_THROWS_WITH(dist::DPKFAC<KFACd>(comm, kfac), Catch::Contains("kat::distributed::DPKFAC"));
  CHECK_THROWS_AS(dist::KAISA<KFACd>(comm, kfac), ValueError);
  CHECK(kfac.strategy().name() == "local");
  CHECK(kfac.owned(0));
}

TEST_CASE("dkfac: a run continued from state_dict steps as the run it was taken from",
          "[mpi][dist][kfac][state]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  check_state_dict_continues(
      comm, [](Communicator &c, KFACd &kfac) { return std::make_unique<DKFACd>(c, kfac); });
}

} // namespace test_dkfac

#endif // KAT_ENABLE_MPI
