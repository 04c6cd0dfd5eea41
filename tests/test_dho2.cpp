// kat::distributed::DHO2 and its parts (docs/algorithms.md section 4): parameter_shard's slices;
// sharded_lanczos equals kat::lanczos on the gathered operator for n not divisible by P, with
// the analytic bytes; sharded_operator is the mean of the ranks' products and turns one rank's
// failure into an error on every rank; sharded_curvature_operator is the Hessian of the loss on
// the concatenation of the ranks' batches; DHO2's steps equal FOSI's on one process, with the
// analytic bytes, its state per rank is its slice, and its curvature memory is 1/P of FOSI's.
// The "[mpi]" cases run under mpiexec at 1, 2, 3 and 4 ranks (ctest mpi_ranks_*); at 3, n is
// not divisible by P either.
#include "test_helpers.hpp"

#include <kat/core/error.hpp>
#include <kat/distributed/fosi/parameter_shard.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>

namespace test_dho2 {

using namespace kat;
using kat::test::MessageContains;

TEST_CASE("parameter_shard: contiguous padded slices that cover the vector", "[dho2]") {
  for (const std::size_t n : {std::size_t(23), std::size_t(24), std::size_t(1000003)}) {
    for (int ranks = 1; ranks <= 5; ++ranks) {
      INFO("n " << n << ", " << ranks << " ranks");
      const std::size_t padded = (n + std::size_t(ranks) - 1) / std::size_t(ranks);
      std::size_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const auto s = distributed::parameter_shard(n, r, ranks);
        CHECK(s.n == n);
        CHECK(s.padded == padded);
        CHECK(s.offset == next);
        CHECK(s.size >= 1);
        CHECK(s.size == (r + 1 < ranks ? padded : n - next));
        next += s.size;
      }
      CHECK(next == n);
    }
  }
  CHECK_THROWS_MATCHES(distributed::parameter_shard(10, 0, 0), ValueError,
                       MessageContains("ranks must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(distributed::parameter_shard(10, 4, 4), ValueError,
                       MessageContains("rank must be in [0, 4), got 4"));
  // ⌈9/4⌉ = 3: ranks 0-2 take all nine entries.
  CHECK_THROWS_MATCHES(distributed::parameter_shard(9, 0, 4), ValueError,
                       MessageContains("leave rank 3 of 4 without entries"));
  CHECK_THROWS_MATCHES(distributed::parameter_shard(0, 0, 1), ValueError, MessageContains("n = 0"));
}

} // namespace test_dho2

#ifdef KAT_ENABLE_MPI

#include "dist_kfac_helpers.hpp"

#include <kat/core/blas.hpp>
#include <kat/core/lanczos.hpp>
#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/fosi/dho2.hpp>
#include <kat/distributed/fosi/dho2_overlap.hpp>
#include <kat/distributed/fosi/sharded_lanczos.hpp>
#include <kat/distributed/fosi/sharded_operator.hpp>
#include <kat/nn/hessian_vector_product.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/adam.hpp>
#include <kat/optim/fosi.hpp>
#include <kat/optim/sgd.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

namespace test_dho2 {

using kat::distributed::Communicator;
using kat::test::Mem;
using kat::test::Space;
using kat::test::dist_kfac::Model;

namespace {

template <class T> using Vec = Vector<T, Mem>;

std::vector<double> host_values(std::size_t n, std::uint64_t seed) {
  HostRng rng(seed);
  std::vector<double> v(n);
  for (auto &x : v) {
    x = 2.0 * static_cast<double>(rng.next() >> 11) * 0x1.0p-53 - 1.0;
  }
  return v;
}

template <class T> Vec<T> device_vector(const std::vector<double> &x) {
  return test::vector_of<T>(x.size(), [&x](std::size_t i) { return x[i]; });
}

template <class V> std::vector<double> host_vector(const V &v) {
  const auto h = test::to_host(v);
  std::vector<double> x(h.extent(0));
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<double>(h(i));
  }
  return x;
}

/// A symmetric n x n matrix with distinct eigenvalues in [-2, 10], the same on every rank.
Matrix<double, Mem> symmetric_matrix(std::size_t n) {
  const auto q = test::random_orthogonal(n, 17);
  Matrix<double, Mem> a("test_dho2::A", n, n);
  auto h = Kokkos::create_mirror_view(a);
  for (std::size_t c = 0; c < n; ++c) {
    for (std::size_t r = 0; r < n; ++r) {
      double s = 0;
      for (std::size_t p = 0; p < n; ++p) {
        const double t = static_cast<double>(p) / static_cast<double>(n - 1);
        s += q[p * n + r] * (-2.0 + 12.0 * t * t * t) * q[p * n + c];
      }
      h(r, c) = s;
    }
  }
  Kokkos::deep_copy(a, h);
  return a;
}

/// y = A v as a whole-vector product (every rank's A_r = A, so the sharded mean is A).
distributed::LocalProduct<double, Mem> matrix_product(const Matrix<double, Mem> &a) {
  return [a](const Space &space, const Vec<double> &v, const Vec<double> &out) {
    kat::gemv(space, Trans::N, 1.0, a, v, 0.0, out);
  };
}

LinearOperator<Mem> matrix_operator(const Matrix<double, Mem> &a) {
  return [a](const Space &space, const Kokkos::View<const double *, Mem> &v,
             const Kokkos::View<double *, Mem> &out) {
    kat::gemv(space, Trans::N, 1.0, a, v, 0.0, out);
  };
}

/// out(i) = factor (i + 1) v(i): rank r's product in the sharded_operator test.
void scaled_diagonal(const Space &space, double factor, const Vec<double> &v,
                     const Vec<double> &out) {
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Space>(space, 0, v.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { out(i) = factor * double(i + 1) * v(i); });
}

/// Global batches of 12 samples (divisible by 1, 2, 3 and 4 ranks) for build_mlp's 6 inputs and
/// 4 classes, the same on every rank; a rank takes rows [first, first + count).
constexpr std::size_t kBatch = 12;
struct Batch {
  Matrix<double, Mem> x;
  Vec<std::int32_t> y;
};
Batch batch_rows(std::uint64_t seed, std::size_t first, std::size_t count) {
  const auto values = host_values(kBatch * 6, 500 + seed);
  HostRng rng(600 + seed);
  std::vector<std::int32_t> labels(kBatch);
  for (auto &label : labels) {
    label = static_cast<std::int32_t>(rng.uniform_index(4));
  }
  Batch b{Matrix<double, Mem>("x", count, 6), Vec<std::int32_t>("y", count)};
  auto hx = Kokkos::create_mirror_view(b.x);
  auto hy = Kokkos::create_mirror_view(b.y);
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < 6; ++j) {
      hx(i, j) = values[(first + i) * 6 + j];
    }
    hy(i) = labels[first + i];
  }
  Kokkos::deep_copy(b.x, hx);
  Kokkos::deep_copy(b.y, hy);
  return b;
}

/// Rows [shard.offset, shard.offset + shard.size) of a whole vector, padded to shard.padded.
Vec<double> slice_of(const std::vector<double> &whole, const distributed::ParameterShard &s) {
  std::vector<double> part(s.padded, 0.0);
  std::copy(whole.begin() + std::ptrdiff_t(s.offset),
            whole.begin() + std::ptrdiff_t(s.offset + s.size), part.begin());
  return device_vector<double>(part);
}

} // namespace

TEST_CASE("sharded_lanczos: equals kat::lanczos on the gathered operator", "[mpi][dho2]") {
  const Space space;
  auto world = Communicator::world();
  INFO(test::rank_of(world));
  for (const std::size_t n : {std::size_t(23), std::size_t(30)}) {
    INFO("n " << n);
    const auto a = symmetric_matrix(n);
    const auto shard = distributed::parameter_shard(n, world.rank(), world.size());
    LanczosOptions o;
    o.m = 12;
    o.k = 3;
    o.l = 2;
    o.seed = 9;
    const auto reference = lanczos<Mem>(space, matrix_operator(a), n, o);
    auto lanczos_comm = world.dup(); // counts sharded_lanczos's own reductions only
    auto op_comm = world.dup();
    const auto op = distributed::sharded_operator<double, Mem>(op_comm, shard, matrix_product(a));
    const auto r = distributed::sharded_lanczos<Mem>(space, lanczos_comm, op, shard, o);

    REQUIRE(r.iterations == reference.iterations);
    REQUIRE(r.eigenvalues.size() == 5);
    for (std::size_t j = 0; j < 5; ++j) {
      CHECK(r.eigenvalues[j] == Approx(reference.eigenvalues[j]).epsilon(1e-11).margin(1e-12));
    }
    REQUIRE(r.eigenvectors.extent(0) == shard.padded);
    const auto mine = test::to_host(r.eigenvectors);
    const auto all = test::to_host(reference.eigenvectors);
    double err = 0, padding = 0;
    for (std::size_t j = 0; j < 5; ++j) {
      for (std::size_t i = 0; i < shard.padded; ++i) {
        if (i < shard.size) {
          err = std::max(err, std::abs(mine(i, j) - all(shard.offset + i, j)));
        } else {
          padding = std::max(padding, std::abs(mine(i, j)));
        }
      }
    }
    CHECK(err < 1e-9);
    CHECK(padding == 0.0);
    // m iterations: 8 (m² + m) bytes of all-reduced scalars and coefficient vectors.
    const auto counted = lanczos_comm.stats();
    CHECK(counted.total().bytes == distributed::sharded_lanczos_bytes(o.m));
    CHECK(counted.allreduce.bytes == counted.total().bytes);
    // Each product: the slice gathered, the failure flag, the products reduce-scattered.
    const auto ops = op_comm.stats();
    CHECK(ops.allgather.calls == o.m);
    CHECK(ops.allgather.bytes == o.m * shard.padded * sizeof(double));
    CHECK(ops.reduce_scatter.bytes == o.m * shard.padded * shard.ranks * sizeof(double));
    CHECK(ops.allreduce.bytes == o.m * sizeof(std::int32_t));
  }
  CHECK_THROWS_MATCHES(distributed::sharded_lanczos<Mem>(
                           space, world, matrix_operator(symmetric_matrix(23)),
                           distributed::parameter_shard(23, 0, world.size() + 1), LanczosOptions{}),
                       ValueError, MessageContains("shard must be rank"));
}

TEST_CASE("sharded_operator: the mean of the ranks' products; a failing rank fails every rank",
          "[mpi][dho2]") {
  const Space space;
  auto world = Communicator::world();
  INFO(test::rank_of(world));
  const std::size_t n = 23;
  const auto shard = distributed::parameter_shard(n, world.rank(), world.size());
  const int rank = world.rank(), ranks = world.size();
  bool fail = false;
  // Rank r applies diag(r + 1, 2 (r + 1), ..., n (r + 1)): the mean is (P + 1)/2 diag(1..n).
  const auto op = distributed::sharded_operator<double, Mem>(
      world, shard, [rank, &fail](const Space &s, const Vec<double> &v, const Vec<double> &out) {
        if (fail) {
          throw NumericalError("boom on the last rank");
        }
        scaled_diagonal(s, double(rank + 1), v, out);
      });
  const auto v = host_values(n, 3);
  const auto v_slice = slice_of(v, shard);
  Vec<double> out("out", shard.padded);
  op(space, v_slice, out);
  const auto got = host_vector(out);
  double err = 0;
  for (std::size_t i = 0; i < shard.padded; ++i) {
    const std::size_t g = shard.offset + i;
    const double expected = i < shard.size ? 0.5 * (ranks + 1) * double(g + 1) * v[g] : 0.0;
    err = std::max(err, std::abs(got[i] - expected));
  }
  CHECK(err < 1e-12);

  fail = rank == ranks - 1;
  const std::string who =
      "failed on rank " + std::to_string(ranks - 1) + " of " + std::to_string(ranks);
  CHECK_THROWS_MATCHES(op(space, v_slice, out), Error, MessageContains(who));
  if (fail) {
    CHECK_THROWS_MATCHES(op(space, v_slice, out), Error, MessageContains("boom on the last rank"));
  } else {
    CHECK_THROWS_MATCHES(op(space, v_slice, out), Error,
                         MessageContains("its message is on that rank"));
  }
  // Nobody was left inside a collective: the next product works on every rank.
  fail = false;
  op(space, v_slice, out);
  CHECK(std::abs(host_vector(out)[0] - got[0]) < 1e-15);
}

TEST_CASE("sharded_curvature_operator: the Hessian of the loss on the ranks' batches together",
          "[mpi][dho2]") {
  const Space space;
  auto world = Communicator::world();
  INFO(test::rank_of(world));
  REQUIRE(kBatch % std::size_t(world.size()) == 0);
  const std::size_t rows = kBatch / std::size_t(world.size());
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  Model model{FeatureShape{1, 2, 3}};
  test::build_mlp(model, 11);
  const std::size_t n = model.parameter_count();
  const auto shard = distributed::parameter_shard(n, world.rank(), world.size());
  const auto mine = batch_rows(0, rows * std::size_t(world.rank()), rows);
  const auto whole = batch_rows(0, 0, kBatch);
  const auto v = host_values(n, 21);
  for (const auto kind : {nn::CurvatureProduct::hessian, nn::CurvatureProduct::gauss_newton}) {
    // The whole batch's product on one process.
    Vec<double> hv("hv", n);
    nn::CurvatureVectorProduct<double, Mem, nn::SoftmaxCrossEntropy<double, Mem>> product(kind);
    product.apply(space, model, loss, whole.x, whole.y, device_vector<double>(v), hv);
    const auto expected = host_vector(hv);

    const auto op =
        distributed::sharded_curvature_operator(world, shard, model, loss, mine.x, mine.y, kind);
    Vec<double> out("out", shard.padded);
    op(space, slice_of(v, shard), out);
    const auto got = host_vector(out);
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < shard.size; ++i) {
      err = std::max(err, std::abs(got[i] - expected[shard.offset + i]));
      scale = std::max(scale, std::abs(expected[shard.offset + i]));
    }
    CHECK(scale > 0.0);
    CHECK(err <= 1e-13 * std::max(1.0, scale));
  }
}

namespace {

using FOSId = optim::FOSI<double, Mem>;
using DHO2d = distributed::DHO2<double, Mem>;

FOSId::Options fosi_options() {
  FOSId::Options o;
  o.k = 2;
  o.l = 1;
  o.lanczos_iterations = 8;
  o.warmup_w = 2;
  o.num_iters_to_approx_eigs = 2;
  o.alpha = 0.5;
  o.seed = 4;
  return o;
}

std::unique_ptr<optim::Optimizer<double, Mem>> make_base(bool adam, std::size_t n) {
  if (adam) {
    optim::Adam<double, Mem>::Options o;
    o.lr = 0.01;
    return std::make_unique<optim::Adam<double, Mem>>(n, o);
  }
  optim::SGD<double, Mem>::Options o;
  o.lr = 0.05;
  o.momentum = 0.9;
  return std::make_unique<optim::SGD<double, Mem>>(n, o);
}

/// DHO2's parameters equal FOSI's to 1e-11 and, once both have an estimate, so do the
/// eigenvalues and c (to 1e-10 relative).
void check_as_fosi(const Model &model, const Model &reference, const DHO2d &dho2,
                   const FOSId &fosi) {
  const auto p = host_vector(model.parameters());
  const auto q = host_vector(reference.parameters());
  REQUIRE(p.size() == q.size());
  double err = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    err = std::max(err, std::abs(p[i] - q[i]));
  }
  CHECK(err < 1e-11);
  REQUIRE(dho2.has_estimate() == fosi.has_estimate());
  if (dho2.has_estimate()) {
    for (std::size_t j = 0; j < 3; ++j) {
      CHECK(dho2.eigenvalues()[j] == Approx(fosi.eigenvalues()[j]).epsilon(1e-10));
    }
    CHECK(dho2.scaling() == Approx(fosi.scaling()).epsilon(1e-10));
  }
}

/// The whole batch of step s's gradient at the model's parameters.
void whole_batch_gradient(const Space &space, Model &model, int s) {
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto b = batch_rows(std::uint64_t(s), 0, kBatch);
  Matrix<double, Mem> dlogits("dlogits", kBatch, 4);
  loss.forward_backward(space, model.forward(space, b.x), b.y, dlogits);
  model.backward(space, dlogits, Model::Gradients::overwrite);
}

} // namespace

TEST_CASE("dho2: synchronous steps equal FOSI's on one process", "[mpi][dho2]") {
  const Space space;
  auto world = Communicator::world();
  INFO(test::rank_of(world));
  const std::size_t rows = kBatch / std::size_t(world.size());
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  for (const bool adam : {false, true}) {
    INFO((adam ? "Adam" : "SGD with momentum") << " base");
    // The reference, on every rank alike: FOSI on the curvature batch as a whole.
    Model reference{FeatureShape{1, 2, 3}};
    test::build_mlp(reference, 11);
    const std::size_t n = reference.parameter_count();
    const auto curvature_batch = batch_rows(99, 0, kBatch);
    FOSId fosi(n, make_base(adam, n),
               nn::curvature_operator(reference, loss, curvature_batch.x, curvature_batch.y),
               fosi_options());
    // DHO2: each rank's curvature batch is its part of the same batch.
    Model model{FeatureShape{1, 2, 3}};
    test::build_mlp(model, 11);
    const auto shard = distributed::parameter_shard(n, world.rank(), world.size());
    const auto mine = batch_rows(99, rows * std::size_t(world.rank()), rows);
    auto op_comm = world.dup();
    DHO2d dho2(world, n, make_base(adam, shard.size),
               distributed::sharded_curvature_operator(op_comm, shard, model, loss, mine.x, mine.y),
               fosi_options());
    CHECK(dho2.name() == "DHO2");
    CHECK(dho2.local_size() == shard.size);
    CHECK(dho2.offset() == shard.offset);

    std::size_t expected_bytes = 0;
    for (int s = 0; s < 5; ++s) {
      INFO("step " << s);
      if (dho2.refresh_due(s)) {
        expected_bytes += dho2.refresh_bytes();
      }
      whole_batch_gradient(space, reference, s);
      whole_batch_gradient(space, model, s);
      fosi.step(space, reference.parameters(), reference.gradients());
      dho2.step(space, model.parameters(), model.gradients());
      expected_bytes += dho2.step_bytes(dho2.has_estimate());
      REQUIRE(dho2.refresh_count() == fosi.refresh_count());
      check_as_fosi(model, reference, dho2, fosi);
    }
    CHECK(dho2.refresh_count() == 2); // steps 1 and 3
    CHECK(dho2.stats().total().bytes == expected_bytes);

    // The state is the rank's slice; the curvature memory 1/P of one process's.
    const StateDict state = dho2.state_dict();
    CHECK(state.at("momentum").shape == std::vector<std::uint64_t>{shard.size});
    CHECK(state.at("eigenvectors").shape == std::vector<std::uint64_t>{shard.size, 3});
    const std::string moment = adam ? "base.exp_avg" : "base.momentum_buffer";
    CHECK(state.at(moment).shape == std::vector<std::uint64_t>{shard.size});
    const double ratio =
        double(dho2.curvature_bytes()) * double(world.size()) / double(fosi.curvature_bytes());
    CHECK(ratio == Approx(1.0).margin(0.1));
  }
}

TEST_CASE("dho2: the base optimizer must be built for the rank's slice", "[mpi][dho2]") {
  auto world = Communicator::world();
  Model model{FeatureShape{1, 2, 3}};
  test::build_mlp(model, 11);
  const std::size_t n = model.parameter_count();
  const auto shard = distributed::parameter_shard(n, world.rank(), world.size());
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto b = batch_rows(0, 0, 2);
  const auto op = distributed::sharded_curvature_operator(world, shard, model, loss, b.x, b.y);
  const std::size_t wrong = shard.size + 1;
  CHECK_THROWS_MATCHES(DHO2d(world, n, make_base(false, wrong), op, fosi_options()), ShapeError,
                       MessageContains("local_size()) must be " + std::to_string(shard.size) +
                                       ", got " + std::to_string(wrong)));
}

namespace {

/// The curvature ranks' side of an overlapped test: serve with their share of the curvature
/// batch (the same 12 rows as the reference's, split over the curvature ranks). `slow` sleeps
/// in each product, `fail` makes curvature rank 0's products throw.
std::int64_t serve_curvature(const distributed::DHO2Roles &roles, std::size_t n, bool slow = false,
                             bool fail = false) {
  const Space space;
  Model model{FeatureShape{1, 2, 3}};
  test::build_mlp(model, 11);
  const std::size_t rows = kBatch / std::size_t(roles.curvature_ranks);
  const int c = roles.group->rank();
  const auto shard = distributed::parameter_shard(n, c, roles.curvature_ranks);
  const auto mine = batch_rows(99, rows * std::size_t(c), rows);
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  auto product = std::make_shared<nn::CurvatureVectorProduct<double, Mem, decltype(loss)>>(
      nn::CurvatureProduct::hessian);
  Model *m = &model;
  const auto op = distributed::sharded_operator<double, Mem>(
      *roles.group, shard, [=](const Space &s, const Vec<double> &v, const Vec<double> &out) {
        if (fail && c == 0) {
          throw ValueError("test_dho2: curvature rank 0's product fails on purpose");
        }
        if (slow) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        product->apply(s, *m, loss, mine.x, mine.y, v, out);
      });
  distributed::DHO2Estimator<double, Mem> estimator(roles, n, model.parameters(), op);
  CHECK(estimator.shard().size == shard.size);
  return estimator.serve(space);
}

} // namespace

TEST_CASE("dho2 overlap: curvature ranks estimate; a fixed staleness S equals FOSI refreshed S "
          "steps late on the snapshot",
          "[mpi][dho2]") {
  auto world = Communicator::world();
  INFO(test::rank_of(world));
  if (world.size() < 2) {
    return; // needs a training and a curvature rank
  }
  const Space space;
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  for (int C = 1; C < world.size(); ++C) {
    for (const std::int64_t S : {std::int64_t(0), std::int64_t(1)}) {
      INFO(C << " curvature ranks, staleness bound " << S);
      const auto roles = distributed::dho2_roles(world, C);
      CHECK(roles.training_ranks == world.size() - C);
      CHECK(roles.curvature == (world.rank() >= world.size() - C));
      Model probe{FeatureShape{1, 2, 3}};
      test::build_mlp(probe, 11);
      const std::size_t n = probe.parameter_count();
      auto o = fosi_options();
      o.num_iters_to_approx_eigs = 3; // refreshes due at steps 1, 4, 7
      if (roles.curvature) {
        CHECK(serve_curvature(roles, n) == 3);
        continue;
      }
      // The reference: FOSI refreshing S steps late (W + S) on a snapshot model that holds the
      // parameters of the step the overlapped refresh was due at.
      Model reference{FeatureShape{1, 2, 3}}, snapshot{FeatureShape{1, 2, 3}};
      test::build_mlp(reference, 11);
      test::build_mlp(snapshot, 11);
      const auto curvature_batch = batch_rows(99, 0, kBatch);
      auto late = o;
      late.warmup_w = o.warmup_w + S;
      FOSId fosi(n, make_base(false, n),
                 nn::curvature_operator(snapshot, loss, curvature_batch.x, curvature_batch.y),
                 late);

      Model model{FeatureShape{1, 2, 3}};
      test::build_mlp(model, 11);
      const auto shard = distributed::parameter_shard(n, roles.group->rank(), roles.training_ranks);
      distributed::DHO2Overlap overlap;
      overlap.staleness_bound = S;
      overlap.swap = distributed::DHO2Swap::fixed;
      DHO2d dho2(roles, n, make_base(false, shard.size), o, overlap);
      CHECK(dho2.overlapped());
      CHECK(dho2.local_size() == shard.size);
      std::size_t expected_bytes = 0;
      for (int s = 0; s < 9; ++s) {
        INFO("step " << s);
        if (dho2.refresh_due(s)) {
          Kokkos::deep_copy(snapshot.parameters(), reference.parameters());
        }
        whole_batch_gradient(space, reference, s);
        whole_batch_gradient(space, model, s);
        fosi.step(space, reference.parameters(), reference.gradients());
        const auto installed = dho2.staleness().estimates;
        dho2.step(space, model.parameters(), model.gradients());
        if (dho2.staleness().estimates > installed) {
          expected_bytes += dho2.estimate_bytes();
        }
        expected_bytes += dho2.step_bytes(dho2.has_estimate());
        REQUIRE(dho2.refresh_count() == fosi.refresh_count());
        CHECK(dho2.estimate_pending() == (S > 0 && (s == 1 || s == 4 || s == 7)));
        check_as_fosi(model, reference, dho2, fosi);
      }
      // Every estimate came exactly S steps after its snapshot; bytes as counted by hand.
      CHECK(dho2.refresh_count() == 3);
      CHECK(dho2.staleness().estimates == 3);
      CHECK(dho2.staleness().max_steps == S);
      CHECK(dho2.staleness().total_steps == 3 * S);
      CHECK(dho2.staleness().estimation_seconds > 0.0);
      CHECK(dho2.stats().total().bytes == expected_bytes);
      CHECK(dho2.curvature_bytes() == sizeof(double) * (shard.size * (3 + 1) + shard.padded * 3));
      CHECK_THROWS_MATCHES(dho2.refresh(space), Error, MessageContains("asynchronously"));
      if (S > 0) { // an estimate in flight is not part of the state: no save then
        whole_batch_gradient(space, model, 9);
        dho2.step(space, model.parameters(), model.gradients()); // step 9: no refresh
        CHECK_FALSE(dho2.estimate_pending());
        CHECK_NOTHROW(dho2.state_dict());
      }
    }
  }
}

TEST_CASE("dho2 overlap: eager swaps never exceed the staleness bound", "[mpi][dho2]") {
  auto world = Communicator::world();
  INFO(test::rank_of(world));
  if (world.size() < 2) {
    return;
  }
  const Space space;
  const auto roles = distributed::dho2_roles(world, 1);
  Model model{FeatureShape{1, 2, 3}};
  test::build_mlp(model, 11);
  const std::size_t n = model.parameter_count();
  auto o = fosi_options();
  o.num_iters_to_approx_eigs = 6; // refreshes at steps 1, 7, 13
  if (roles.curvature) {
    CHECK(serve_curvature(roles, n, /*slow=*/true) == 3);
    return;
  }
  const auto shard = distributed::parameter_shard(n, roles.group->rank(), roles.training_ranks);
  distributed::DHO2Overlap overlap;
  overlap.staleness_bound = 2; // a slow estimate (about 8 x 20 ms) arrives after 2 fast steps
  DHO2d dho2(roles, n, make_base(false, shard.size), o, overlap);
  for (int s = 0; s < 18; ++s) {
    whole_batch_gradient(space, model, s);
    dho2.step(space, model.parameters(), model.gradients());
    const auto &st = dho2.staleness();
    REQUIRE(st.max_steps <= 2);
    if (dho2.estimate_pending()) {
      CHECK((s - 1) % 6 < 2); // started at 1, 7 or 13, in at 3, 9 or 15 at the latest
    }
  }
  CHECK(dho2.staleness().estimates == 3);
  CHECK(dho2.staleness().estimation_seconds > 0.0);
}

TEST_CASE("dho2 overlap: a failing curvature rank fails every rank without a hang", "[mpi][dho2]") {
  auto world = Communicator::world();
  INFO(test::rank_of(world));
  if (world.size() < 2) {
    return;
  }
  const Space space;
  const int C = world.size() > 2 ? 2 : 1;
  const auto roles = distributed::dho2_roles(world, C);
  Model model{FeatureShape{1, 2, 3}};
  test::build_mlp(model, 11);
  const std::size_t n = model.parameter_count();
  if (roles.curvature) {
    CHECK_THROWS_MATCHES(serve_curvature(roles, n, false, /*fail=*/true), Error,
                         MessageContains("estimate 0 failed on curvature rank"));
    return;
  }
  const auto shard = distributed::parameter_shard(n, roles.group->rank(), roles.training_ranks);
  distributed::DHO2Overlap overlap;
  overlap.staleness_bound = 1;
  {
    DHO2d dho2(roles, n, make_base(false, shard.size), fosi_options(), overlap);
    whole_batch_gradient(space, model, 0);
    dho2.step(space, model.parameters(), model.gradients()); // base step
    dho2.step(space, model.parameters(), model.gradients()); // step 1 starts the estimate
    CHECK_THROWS_MATCHES(dho2.step(space, model.parameters(), model.gradients()), Error,
                         MessageContains("failed on the curvature ranks"));
  } // the destructor stops the curvature ranks, which then throw
}

TEST_CASE("dho2 overlap: roles and options are checked", "[mpi][dho2]") {
  auto world = Communicator::world();
  const int P = world.size();
  CHECK_THROWS_MATCHES(distributed::dho2_roles(world, 0), ValueError,
                       MessageContains("curvature_ranks must be in [1, P - 1]"));
  CHECK_THROWS_MATCHES(distributed::dho2_roles(world, P), ValueError,
                       MessageContains("got " + std::to_string(P)));
  if (P < 2) {
    return;
  }
  const auto roles = distributed::dho2_roles(world, 1);
  Model model{FeatureShape{1, 2, 3}};
  test::build_mlp(model, 11);
  const std::size_t n = model.parameter_count();
  const std::size_t local =
      roles.curvature ? 1 : distributed::parameter_shard(n, world.rank(), P - 1).size;
  distributed::DHO2Overlap negative;
  negative.staleness_bound = -1;
  if (roles.curvature) {
    CHECK_THROWS_MATCHES(DHO2d(roles, n, make_base(false, local), fosi_options(), {}), ValueError,
                         MessageContains("must be a training rank's"));
  } else {
    CHECK_THROWS_MATCHES(DHO2d(roles, n, make_base(false, local), fosi_options(), negative),
                         ValueError, MessageContains("staleness_bound must be >= 0, got -1"));
    const LinearOperator<Mem> none;
    CHECK_THROWS_MATCHES(
        (distributed::DHO2Estimator<double, Mem>(roles, n, model.parameters(), none)), ValueError,
        MessageContains("must be a curvature rank's"));
  }
  // The default bound is T; destroying the training ranks' DHO2 stops the curvature ranks.
  if (roles.curvature) {
    CHECK(serve_curvature(roles, n) == 0);
  } else {
    DHO2d dho2(roles, n, make_base(false, local), fosi_options(), {});
    CHECK(*dho2.overlap()->staleness_bound == fosi_options().num_iters_to_approx_eigs);
    CHECK(dho2.roles()->curvature_ranks == 1);
  }
}

} // namespace test_dho2

#endif
