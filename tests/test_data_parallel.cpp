// kat::distributed::DistributedSampler and kat::distributed::DataParallel. The "[mpi]" cases run
// under mpiexec at 1, 2, 3 and 4 ranks (ctest mpi_ranks_*); each holds for any rank count, and
// every rank takes the same path through the collectives (CHECK, not REQUIRE, where ranks could
// differ), so a failure is reported instead of hanging. The sampler needs no MPI, so its
// single-process cases run in every build.
#include "test_helpers.hpp"

#include <kat/data/data_loader.hpp>
#include <kat/distributed/data_parallel/distributed_sampler.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#ifdef KAT_ENABLE_MPI
#include "mpi_test_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/sgd.hpp>

#include <cmath>
#include <string>
#endif

namespace test_data_parallel {

using kat::distributed::DistributedSampler;

TEST_CASE("sampler: shards of one process are strided slices of the shared permutation",
          "[dist][sampler]") {
  const DistributedSampler s0(10, 0, 3, 42), s2(10, 2, 3, 42);
  CHECK(s0.per_rank() == 3);
  CHECK(s0.dropped() == 1);
  CHECK(s0.batches(2) == 2);
  CHECK(s0.batches(2, true) == 1);
  const auto perm = s0.permutation(5);
  CHECK(perm == s2.permutation(5));
  auto sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> all(10);
  std::iota(all.begin(), all.end(), std::size_t(0));
  CHECK(sorted == all);
  CHECK(s0.indices(5) == std::vector<std::size_t>{perm[0], perm[3], perm[6]});
  CHECK(s2.indices(5) == std::vector<std::size_t>{perm[2], perm[5], perm[8]});
  CHECK(s0.shard(5, 2) == s2.indices(5));

  const DistributedSampler plain(7, 1, 2, 42, /*shuffle=*/false);
  CHECK(plain.indices(0) == std::vector<std::size_t>{1, 3, 5});
  CHECK(plain.indices(9) == plain.indices(0));
  CHECK(DistributedSampler(3, 3, 4, 1).indices(0).empty()); // fewer samples than ranks

  CHECK_THROWS_AS(DistributedSampler(10, 0, 0, 1), kat::ValueError);
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2, 1), kat::ValueError);
  CHECK_THROWS_AS(DistributedSampler(10, -1, 2, 1), kat::ValueError);
  CHECK_THROWS_AS(s0.shard(0, 3), kat::ValueError);
  CHECK_THROWS_AS(s0.batches(0), kat::ValueError);
}

TEST_CASE("sampler: one rank reproduces the DataLoader shuffle", "[dist][sampler]") {
  kat::data::Dataset d;
  d.shape = kat::FeatureShape{1, 1, 2};
  d.classes = 2;
  for (std::size_t i = 0; i < 11; ++i) {
    d.images.push_back(static_cast<std::uint8_t>(i));
    d.images.push_back(0);
    d.labels.push_back(static_cast<std::int32_t>(i % 2));
  }
  kat::data::DataLoader<float> shuffled(d, 4, true, 99);
  kat::data::DataLoader<float> driven(d, 4, false, 0);
  const DistributedSampler sampler(d.size(), 0, 1, 99);
  for (std::size_t epoch : {0u, 3u}) {
    shuffled.start_epoch(epoch);
    driven.start_epoch(epoch, sampler.indices(epoch));
    CHECK(driven.order() == shuffled.order());
    CHECK(driven.batches() == shuffled.batches());
  }
}

#ifdef KAT_ENABLE_MPI

using namespace kat;
using namespace kat::test;
using kat::distributed::Communicator;
using kat::distributed::DataParallel;
using kat::distributed::DataParallelOptions;
using kat::distributed::GradientBucket;

namespace {

using Model = nn::Sequential<double, Mem>;
using DP = DataParallel<double, Mem>;

constexpr std::size_t kMlpParameters = 6 * 12 + 12 + 12 * 8 + 8 + 8 * 4 + 4;

std::vector<double> host_values(const Vector<double, Mem> &v) {
  auto h = to_host(v);
  return std::vector<double>(h.data(), h.data() + h.size());
}

} // namespace

TEST_CASE("data parallel: sampler shards are disjoint equal and shared by all ranks",
          "[mpi][dist][sampler]") {
  auto comm = Communicator::world();
  const int p = comm.size();
  INFO(rank_of(comm));
  const std::size_t n = 103; // not a multiple of 2 or 4: a tail is dropped
  const DistributedSampler sampler(n, comm.rank(), p, 7);
  const std::size_t m = n / std::size_t(p);
  CHECK(sampler.per_rank() == m);
  CHECK(sampler.dropped() == n - m * std::size_t(p));

  std::vector<std::size_t> previous;
  for (std::size_t epoch : {0u, 1u}) {
    const auto perm = sampler.permutation(epoch);
    const auto mine = sampler.indices(epoch);
    REQUIRE(mine.size() == m);

    // The same permutation on every rank.
    auto perm_view = vector_of<std::int64_t>(n, [&](std::size_t i) { return perm[i]; });
    Vector<std::int64_t, Mem> perms("perms", n * std::size_t(p));
    comm.allgather(Space(), perm_view, perms);
    const auto all_perms = to_host(perms);
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < n; ++i)
        CHECK(std::size_t(all_perms(std::size_t(q) * n + i)) == perm[i]);

    // Shards: equal sizes, disjoint, rank q's is perm[q + P i], union = perm[0, P m).
    auto shard_view = vector_of<std::int64_t>(m, [&](std::size_t i) { return mine[i]; });
    Vector<std::int64_t, Mem> shards("shards", m * std::size_t(p));
    comm.allgather(Space(), shard_view, shards);
    const auto all_shards = to_host(shards);
    std::set<std::size_t> seen;
    for (int q = 0; q < p; ++q) {
      for (std::size_t i = 0; i < m; ++i) {
        const auto index = std::size_t(all_shards(std::size_t(q) * m + i));
        CHECK(index == perm[std::size_t(q) + std::size_t(p) * i]);
        seen.insert(index);
      }
    }
    CHECK(seen.size() == m * std::size_t(p)); // disjoint
    CHECK(seen == std::set<std::size_t>(perm.begin(), perm.begin() + m * std::size_t(p)));
    CHECK(perm != previous); // a new permutation each epoch
    previous = perm;
  }
}

TEST_CASE("data parallel: SGD on P ranks equals single-process SGD on the whole batch",
          "[mpi][dist]") {
  auto comm = Communicator::world();
  const int p = comm.size();
  const int rank = comm.rank();
  INFO(rank_of(comm));
  const Space space;
  const std::size_t global_batch = 24, local_batch = global_batch / std::size_t(p);
  REQUIRE(global_batch % std::size_t(p) == 0);

  // Replicas start different; broadcast_parameters() makes them rank 0's, which is the
  // reference model's initialization.
  Model model(FeatureShape{1, 2, 3}), reference(FeatureShape{1, 2, 3});
  build_mlp(model, 11 + std::uint64_t(rank));
  build_mlp(reference, 11);
  DataParallelOptions options;
  options.bucket_bytes = 30 * sizeof(double); // three buckets: one per Dense layer
  DataParallel<double, Mem> dp(comm, model, options);
  REQUIRE(dp.buckets().size() == 3);
  dp.broadcast_parameters(space);
  model.set_backward_hook(dp.backward_hook(space));

  optim::SGD<double, Mem>::Options sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  optim::SGD<double, Mem> opt(model.parameter_count(), sgd), opt_ref(model.parameter_count(), sgd);
  nn::SoftmaxCrossEntropy<double, Mem> loss;
  Matrix<double, Mem> dlogits("dlogits", local_batch, 4), dlogits_ref("dref", global_batch, 4);

  const int steps = 3;
  for (int s = 0; s < steps; ++s) {
    // The global batch, generated identically on every rank.
    const auto x = to_host(random_matrix<double>(global_batch, 6, 100 + std::uint64_t(s)));
    std::vector<std::int32_t> y(global_batch);
    HostRng rng(200 + std::uint64_t(s));
    for (auto &label : y)
      label = static_cast<std::int32_t>(rng.uniform_index(4));

    Matrix<double, Mem> x_all("x_all", global_batch, 6), x_mine("x_mine", local_batch, 6);
    auto hx_all = Kokkos::create_mirror_view(x_all);
    auto hx_mine = Kokkos::create_mirror_view(x_mine);
    for (std::size_t j = 0; j < 6; ++j)
      for (std::size_t i = 0; i < global_batch; ++i)
        hx_all(i, j) = x(i, j);
    const std::size_t first = std::size_t(rank) * local_batch;
    for (std::size_t j = 0; j < 6; ++j)
      for (std::size_t i = 0; i < local_batch; ++i)
        hx_mine(i, j) = x(first + i, j);
    Kokkos::deep_copy(x_all, hx_all);
    Kokkos::deep_copy(x_mine, hx_mine);
    const auto y_all = labels_of(y);
    const auto y_mine = labels_of(std::vector<std::int32_t>(
        y.begin() + std::ptrdiff_t(first), y.begin() + std::ptrdiff_t(first + local_batch)));

    // Data parallel: mean loss over the local batch, gradients averaged over ranks.
    loss.forward_backward(space, model.forward(space, x_mine), y_mine, dlogits);
    model.backward(space, dlogits, Model::Gradients::overwrite);
    CHECK(dp.pending() == dp.buckets().size()); // the hook started every bucket
    dp.finish(space);
    CHECK(dp.pending() == 0);
    opt.step(space, model.parameters(), model.gradients());

    // The single-process reference on the whole batch.
    loss.forward_backward(space, reference.forward(space, x_all), y_all, dlogits_ref);
    reference.backward(space, dlogits_ref, Model::Gradients::overwrite);
    opt_ref.step(space, reference.parameters(), reference.gradients());
  }
  model.clear_backward_hook();

  const auto got = host_values(model.parameters());
  const auto want = host_values(reference.parameters());
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t k = 0; k < got.size(); ++k)
    worst = std::max(worst, std::abs(got[k] - want[k]));
  CHECK(worst <= 1e-12);
  double change = 0; // the steps moved the parameters, so the comparison means something
  Model initial(FeatureShape{1, 2, 3});
  build_mlp(initial, 11);
  const auto start = host_values(initial.parameters());
  for (std::size_t k = 0; k < got.size(); ++k)
    change = std::max(change, std::abs(got[k] - start[k]));
  CHECK(change > 1e-3);

  const auto stats = dp.stats();
  CHECK(stats.steps == std::uint64_t(steps));
  CHECK(stats.buckets_started_in_backward == std::uint64_t(steps) * 3);
  CHECK(stats.buckets_started_in_finish == 0);
  CHECK(stats.exposed_seconds >= stats.last_exposed_seconds);
  CHECK(stats.last_exposed_seconds >= 0);
}

TEST_CASE("data parallel: buckets cover the gradient buffer once at layer boundaries in "
          "reverse order",
          "[mpi][dist]") {
  auto comm = Communicator::world();
  INFO(rank_of(comm));
  Model model(FeatureShape{1, 2, 3});
  build_mlp(model, 1);
  const auto layers = dist::parameter_ranges(model.buffer().blocks());
  REQUIRE(layers.size() == 6);
  const std::size_t n = model.parameter_count();
  REQUIRE(n == kMlpParameters);

  // Layer sizes 0, 84, 0, 104, 0, 36 (elements): the buckets each bucket_bytes gives.
  const std::vector<std::pair<std::size_t, std::size_t>> cases{
      {1, 3}, {30 * 8, 3}, {50 * 8, 2}, {100 * 8, 2}, {200 * 8, 1}, {std::size_t(1) << 20, 1}};
  for (const auto &[bytes, expected] : cases) {
    INFO("bucket_bytes " << bytes);
    DataParallelOptions options;
    options.bucket_bytes = bytes;
    DataParallel<double, Mem> dp(comm, model, options);
    const auto &buckets = dp.buckets();
    REQUIRE(!buckets.empty());
    CHECK(buckets.front().last_layer == layers.size() - 1);
    CHECK(buckets.back().first_layer == 0);
    CHECK(buckets.back().offset == 0);
    std::size_t end = n, total = 0;
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      const GradientBucket &b = buckets[k];
      INFO("bucket " << k);
      CHECK(b.first_layer <= b.last_layer);
      if (k > 0) {
        CHECK(b.last_layer + 1 == buckets[k - 1].first_layer); // reverse layer order
      }
      CHECK(b.offset == layers[b.first_layer].offset); // starts at a layer boundary
      CHECK(b.offset + b.size == end);                 // contiguous, no gap or overlap
      std::size_t sum = 0;
      for (std::size_t l = b.first_layer; l <= b.last_layer; ++l)
        sum += layers[l].size;
      CHECK(b.size == sum);
      CHECK(b.size > 0);
      if (k + 1 < buckets.size()) {
        // Full, and closed by the layer that filled it.
        CHECK(b.size * sizeof(double) >= bytes);
        CHECK((b.size - layers[b.first_layer].size) * sizeof(double) < bytes);
      }
      end = b.offset;
      total += b.size;
    }
    CHECK(total == n);
    CHECK(buckets.size() == expected);
  }

  // Errors (every rank throws the same, before or at the agreement all-reduce).
  const auto params = model.parameters();
  const auto grads = model.gradients();
  DataParallelOptions zero;
  zero.bucket_bytes = 0;
  CHECK_THROWS_AS(DP(comm, model, zero), ValueError);
  Vector<double, Mem> shorter(grads.data(), n - 1);
  CHECK_THROWS_AS(DP(comm, shorter, shorter, layers), ShapeError);
  CHECK_THROWS_AS(DP(comm, params, shorter, layers), ShapeError);
  auto gap = layers;
  gap[3].offset += 1;
  CHECK_THROWS_AS(DP(comm, params, grads, gap), ValueError);
  if (comm.size() > 1) {
    DataParallelOptions differ;
    differ.bucket_bytes = comm.rank() == 0 ? 1 : std::size_t(1) << 20;
    CHECK_THROWS_AS(DP(comm, model, differ), ShapeError);
  }
}

TEST_CASE("data parallel: finish averages gradients and counts the analytic volume",
          "[mpi][dist]") {
  auto comm = Communicator::world();
  const int p = comm.size();
  const int rank = comm.rank();
  INFO(rank_of(comm));
  const Space space;
  Model model(FeatureShape{1, 2, 3});
  build_mlp(model, 1);
  const std::size_t n = model.parameter_count();
  DataParallelOptions options;
  options.bucket_bytes = 64 * sizeof(double);
  DataParallel<double, Mem> dp(comm, model, options);
  const std::size_t buckets = dp.buckets().size();

  for (int step = 0; step < 2; ++step) {
    // Gradient i on rank r is r + i + step: the mean is (P - 1) / 2 + i + step, exactly.
    auto g = vector_of<double>(n, [&](std::size_t i) { return rank + double(i) + step; });
    Kokkos::deep_copy(model.gradients(), g);
    comm.reset_stats();
    dp.reset_stats();
    dp.finish(space); // no hook: finish starts every bucket
    space.fence();
    const auto avg = host_values(model.gradients());
    for (std::size_t i = 0; i < n; ++i)
      CHECK(avg[i] == (p - 1) / 2.0 + double(i) + step);

    const auto cs = comm.stats();
    CHECK(cs.iallreduce.bytes == n * sizeof(double)); // the analytic volume, once per step
    CHECK(cs.iallreduce.calls == buckets);
    CHECK(cs.shape_check.calls == 0); // no per-bucket agreement all-reduce
    CHECK(comm.checked());            // and the communicator's setting is restored
    const auto stats = dp.stats();
    CHECK(stats.allreduce.bytes == n * sizeof(double));
    CHECK(stats.allreduce.calls == buckets);
    CHECK(stats.buckets_started_in_finish == buckets);
    CHECK(stats.buckets_started_in_backward == 0);
    CHECK(stats.steps == 1);
    CHECK(stats.exposed_seconds == stats.last_exposed_seconds);
  }

  // Metrics: sums over ranks, on every rank.
  dist::Metrics local;
  local.loss_sum = 0.5 * (rank + 1);
  local.correct = rank;
  local.samples = 10;
  const auto total = dp.reduce_metrics(local);
  CHECK(total.loss_sum == 0.25 * p * (p + 1));
  CHECK(total.correct == std::int64_t(p) * (p - 1) / 2);
  CHECK(total.samples == 10 * std::int64_t(p));
  CHECK(total.mean_loss() == Approx(0.025 * (p + 1)));
  CHECK(dist::Metrics{}.accuracy() == 0);

  // A second backward before finish() is refused; finish() then completes the first.
  auto x = random_matrix<double>(2, 6, 5);
  auto dy = random_matrix<double>(2, 4, 6);
  model.set_backward_hook(dp.backward_hook(space));
  model.forward(space, x);
  model.backward(space, dy, Model::Gradients::overwrite);
  CHECK(dp.pending() == buckets);
  // (What the hook of a second backward would see after the last layer; called directly so
  // that no kernel writes the gradients under the all-reduces in flight.)
  CHECK_THROWS_AS(dp.layer_done(space, 5), Error);
  dp.finish(space);
  CHECK(dp.pending() == 0);
  model.backward(space, dy, Model::Gradients::overwrite); // accepted after finish()
  dp.finish(space);
  CHECK_THROWS_AS(dp.layer_done(space, 6), ValueError);
  model.clear_backward_hook();
}

TEST_CASE("data parallel: broadcast_parameters makes differently initialized replicas equal",
          "[mpi][dist]") {
  auto comm = Communicator::world();
  const int p = comm.size();
  INFO(rank_of(comm));
  const Space space;
  for (int root : {0, p - 1}) {
    Model model(FeatureShape{1, 2, 3}), expected(FeatureShape{1, 2, 3});
    build_mlp(model, 500 + std::uint64_t(comm.rank()));
    build_mlp(expected, 500 + std::uint64_t(root));
    DataParallel<double, Mem> dp(comm, model);
    dp.broadcast_parameters(space, root);
    CHECK(host_values(model.parameters()) == host_values(expected.parameters()));
    CHECK(dp.stats().broadcast.calls == 1);
    CHECK(dp.stats().broadcast.bytes == model.parameter_count() * sizeof(double));
  }
}

#endif // KAT_ENABLE_MPI

} // namespace test_data_parallel
