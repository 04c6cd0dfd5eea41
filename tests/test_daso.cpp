// DASO (kat/distributed/data_parallel/daso.hpp) and what it is built from: its schedule and plateau
// detector (daso_schedule.hpp, no MPI), kat::bfloat16, and the Communicator's emulated inter-node
// link. The "[mpi]" cases run at 1, 2, 3 and 4 ranks (ctest mpi_ranks_*); each rank takes the same
// path through the collectives (CHECK, not REQUIRE, where ranks could differ).
#include "test_helpers.hpp"

#include <kat/core/bfloat16.hpp>
#include <kat/distributed/comm/emulated_link.hpp>
#include <kat/distributed/data_parallel/daso_schedule.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#ifdef KAT_ENABLE_MPI
#include "mpi_test_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/data_parallel/daso.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/sgd.hpp>

#include <chrono>
#include <thread>
#endif

namespace test_daso {

using namespace kat;
using namespace kat::test;
using dist::DASOSchedule;
using dist::DASOScheduleOptions;
using dist::DASOSkips;

TEST_CASE("bfloat16 rounds to nearest even and keeps NaN and infinity", "[daso][bf16]") {
  const auto bits = [](float f) { return bfloat16::from_float(f).bits; };
  CHECK(bits(1.0f) == 0x3f80);
  CHECK(bits(-2.5f) == 0xc020);
  CHECK(bits(0.0f) == 0x0000);
  CHECK(bits(-0.0f) == 0x8000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  CHECK(bits(1.0f + 0x1.0p-8f) == 0x3f80);
  // 1 + 3 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(bits(1.0f + 0x3.0p-8f) == 0x3f82);
  // Just above halfway rounds up.
  CHECK(bits(1.0f + 0x1.0p-8f + 0x1.0p-20f) == 0x3f81);
  CHECK(bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  // float's largest value lies beyond the halfway point to 2^128: infinity.
  CHECK(bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(std::isnan(bfloat16::from_float(std::nanf("")).to_float()));
  CHECK(std::isnan(bfloat16::from_float(-std::nanf("")).to_float()));
  // Every bfloat16 converts to float and back unchanged; a float within half a step of it
  // rounds to it.
  for (std::uint32_t b = 0; b < 0x10000; b += 7) {
    bfloat16 h;
    h.bits = static_cast<std::uint16_t>(b);
    const float f = h.to_float();
    if (std::isnan(f)) {
      continue;
    }
    INFO("bits " << b);
    CHECK(bfloat16::from_float(f).bits == h.bits);
  }
  HostRng rng(5);
  for (int i = 0; i < 1000; ++i) {
    const float x = static_cast<float>((rng.next() >> 11) * 0x1.0p-53 * 200.0 - 100.0);
    const float r = bfloat16::from_float(x).to_float();
    CHECK(std::abs(r - x) <= std::abs(x) * 0x1.0p-8f);
  }
}

TEST_CASE("emulated inter-node link costs latency plus bytes over bandwidth", "[daso][link]") {
  const dist::EmulatedLink link{1e-5, 1e9};
  CHECK(link.active());
  CHECK(link.seconds(0) == 1e-5);
  CHECK(link.seconds(1'000'000) == Approx(1e-5 + 1e-3).epsilon(1e-12));
  const dist::EmulatedLink latency_only{2e-3, 0};
  CHECK(latency_only.seconds(1u << 30) == 2e-3);
  CHECK_FALSE(dist::EmulatedLink{}.active());
  CHECK(dist::EmulatedLink{}.seconds(123456) == 0);
}

TEST_CASE("daso schedule follows warm-up plateaus halving reset and cool-down for a given loss "
          "sequence",
          "[daso][schedule]") {
  DASOSchedule s(DASOScheduleOptions{}, 20);
  CHECK(s.skips() == DASOSkips{0, 0, 0}); // the first warm-up epoch is blocking
  // Epoch e's mean loss, and the skips of epoch e + 1 derived by hand from the rules
  // (warm-up 4, cool-down 4 of 20 epochs; plateau: patience 2, relative threshold 0.05).
  struct Row {
    double loss;
    DASOSkips next;
  };
  const std::vector<Row> rows{
      {2.0, {0, 0, 0}},  // 1: warm-up
      {1.5, {0, 0, 0}},  // 2
      {1.2, {0, 0, 0}},  // 3
      {1.0, {4, 1, 1}},  // 4: end of warm-up; best 1.0
      {0.99, {4, 1, 1}}, // 5: not below 0.95: 1 bad epoch
      {0.98, {4, 1, 1}}, // 6: 2 bad
      {0.97, {2, 1, 1}}, // 7: 3 bad > patience: plateau, skips / 2, wait - 1, floors 1
      {0.96, {2, 1, 1}}, // 8
      {0.96, {2, 1, 1}}, // 9
      {0.96, {1, 1, 1}}, // 10: plateau: 2 / 2 = 1; local 1 / 2 = 0 -> 1; wait 0 -> 1
      {0.96, {1, 1, 1}}, // 11
      {0.96, {1, 1, 1}}, // 12
      {0.96, {8, 2, 2}}, // 13: plateau at global_skip 1: reset to (8, 8 / 4, 8 / 4)
      {0.80, {8, 2, 2}}, // 14: below 0.95: improves, best 0.80
      {0.79, {8, 2, 2}}, // 15: not below 0.76: 1 bad epoch
      {0.70, {0, 0, 0}}, // 16 >= 20 - 4: cool-down
      {0.60, {0, 0, 0}}, // 17
      {0.50, {0, 0, 0}}, // 18
      {0.40, {0, 0, 0}}, // 19
  };
  for (std::size_t e = 0; e < rows.size(); ++e) {
    INFO("after epoch " << e + 1);
    const DASOSkips next = s.epoch_end(std::int64_t(e + 1), rows[e].loss);
    CHECK(next == rows[e].next);
    CHECK(s.skips() == rows[e].next);
    if (e + 1 == 15) {
      CHECK(s.detector().best() == 0.80);
      CHECK(s.detector().bad_epochs() == 1);
    }
  }

  // No warm-up: the first epoch already has after_warmup's skips; a plateau from (8, 2, 2)
  // halves to (4, 1, 1). A copy restored from a state continues identically.
  DASOScheduleOptions o;
  o.warmup_epochs = 0;
  o.cooldown_epochs = 0;
  o.after_warmup = {8, 2, 2};
  DASOSchedule t(o, 10);
  CHECK(t.skips() == DASOSkips{8, 2, 2});
  CHECK(t.epoch_end(1, 1.0) == DASOSkips{8, 2, 2});
  CHECK(t.epoch_end(2, 1.0) == DASOSkips{8, 2, 2});
  DASOSchedule u(o, 10);
  u.load_state_dict(t.state_dict());
  for (std::int64_t e = 3; e <= 5; ++e) {
    INFO("epoch " << e);
    CHECK(u.epoch_end(e, 1.0) == t.epoch_end(e, 1.0));
  }
  CHECK(t.skips() == DASOSkips{4, 1, 1}); // the plateau came after epoch 4
}

TEST_CASE("plateau detector uses the relative threshold on either sign of the best value",
          "[daso][schedule]") {
  dist::PlateauDetector d(0.1, 0);
  CHECK_FALSE(d.test(-1.0)); // improves on +infinity
  CHECK(d.test(-1.05));      // not below -1.1: with patience 0 one bad epoch is a plateau
  CHECK_FALSE(d.test(-1.2)); // below -1.1
  CHECK(d.best() == -1.2);
  CHECK_THROWS_WITH(d.test(std::nan("")), Catch::Contains("must be finite"));
  CHECK_THROWS_WITH(dist::PlateauDetector(1.0, 2), Catch::Contains("threshold must be in [0, 1)"));
  CHECK_THROWS_WITH(dist::PlateauDetector(0.05, -1), Catch::Contains("patience must be >= 0"));
}

TEST_CASE("daso schedule rejects out-of-range options naming them", "[daso][schedule]") {
  const auto with = [](auto change) {
    DASOScheduleOptions o;
    change(o);
    return o;
  };
  CHECK_THROWS_WITH(DASOSchedule(with([](auto &o) { o.warmup_epochs = -1; }), 10),
                    Catch::Contains("warmup_epochs must be >= 0, got -1"));
  CHECK_THROWS_WITH(DASOSchedule(with([](auto &o) { o.after_warmup.global_skip = 0; }), 10),
                    Catch::Contains("after_warmup.global_skip must be >= 1, got 0"));
  CHECK_THROWS_WITH(DASOSchedule(with([](auto &o) { o.skip_reduction_factor = 0; }), 10),
                    Catch::Contains("skip_reduction_factor must be >= 1, got 0"));
  CHECK_THROWS_WITH(DASOSchedule(with([](auto &o) { o.stability_level = 1.5; }), 10),
                    Catch::Contains("stability_level must be in [0, 1), got 1.5"));
  CHECK_THROWS_WITH(DASOSchedule(DASOScheduleOptions{}, 0),
                    Catch::Contains("epochs must be >= 1, got 0"));
}

#ifdef KAT_ENABLE_MPI

using dist::Communicator;
using dist::DASO;
using dist::DASOOptions;
using dist::ParameterRange;

// A duplicate of MPI_COMM_WORLD whose nodes are blocks of g ranks.
Communicator with_nodes_of(int g) {
  auto c = Communicator::world().dup();
  c.set_ranks_per_virtual_node(g);
  return c;
}

// The node sizes g that divide the rank count.
std::vector<int> node_sizes(int p) {
  std::vector<int> out;
  for (int g : {1, 2, 4}) {
    if (g <= p && p % g == 0) {
      out.push_back(g);
    }
  }
  return out;
}

template <class Scalar> std::vector<double> host_values_of(const Vector<Scalar, Mem> &v) {
  const auto h = to_host(v);
  std::vector<double> out(h.extent(0));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = h(i);
  }
  return out;
}

// One DASO step without a model: the hook for every layer, the node-local average, an SGD
// step, the global logic.
template <class Opt>
void daso_step(DASO<float, Mem> &daso, Opt &opt, const Vector<float, Mem> &theta,
               const Vector<float, Mem> &grad, std::size_t layers) {
  const Space space;
  for (std::size_t l = layers; l-- > 0;) {
    daso.on_gradients_ready(space, l);
  }
  daso.before_step(space);
  opt.step(space, theta, grad);
  daso.after_step(space);
}

TEST_CASE("daso with global_skip 1 and batches_to_wait 0 and no downcast equals synchronous "
          "data-parallel SGD bit for bit",
          "[mpi][daso]") {
  auto world = Communicator::world();
  const int p = world.size(), rank = world.rank();
  INFO(rank_of(world));
  const Space space;
  const std::size_t n = 37, steps = 5;
  const std::vector<ParameterRange> layers{{0, 20}, {20, 17}};
  // Dyadic parameters and gradients (multiples of 2^-6, small), lr 2^-3, 1 / P and 1 / G
  // powers of two: every sum, mean and step is exact in float, so averaging parameters over
  // nodes after a node-averaged step and averaging gradients over all ranks agree exactly,
  // whatever the node size.
  for (int g : node_sizes(p)) {
    INFO("nodes of " << g << " ranks");
    auto comm = with_nodes_of(g);
    const auto start = [](std::size_t i) { return (int(i % 7) - 3) * 0.25; };
    auto theta = vector_of<float>(n, start), theta_dp = vector_of<float>(n, start);
    Vector<float, Mem> grad("grad", n), grad_dp("grad_dp", n);
    DASOOptions o;
    o.fixed_skips = DASOSkips{1, 1, 0};
    o.downcast = dist::DASODowncast::none;
    o.bucket_bytes = 16 * sizeof(float);
    DASO<float, Mem> daso(comm, theta, grad, layers, o);
    CHECK(daso.ranks_per_node() == g);
    CHECK(daso.nodes() == p / g);
    dist::DataParallel<float, Mem> dp(world, theta_dp, grad_dp, layers);
    optim::SGD<float, Mem>::Options sgd;
    sgd.lr = 0.125;
    sgd.momentum = 0;
    optim::SGD<float, Mem> opt(n, sgd), opt_dp(n, sgd);
    daso.begin_epoch(space, 1, 1, steps, 0);
    for (std::size_t s = 0; s < steps; ++s) {
      const auto g_of = [&](std::size_t i) {
        return (int((std::size_t(rank) * 5 + s * 3 + i) % 9) - 4) * 0.0625;
      };
      Kokkos::deep_copy(grad, vector_of<float>(n, g_of));
      Kokkos::deep_copy(grad_dp, vector_of<float>(n, g_of));
      daso_step(daso, opt, theta, grad, layers.size());
      dp.finish(space);
      opt_dp.step(space, theta_dp, grad_dp);
    }
    daso.end_epoch(space);
    const auto got = host_values_of(theta), want = host_values_of(theta_dp);
    CHECK(got == want);
    CHECK(got != host_values_of(vector_of<float>(n, start))); // the steps moved them
    const auto stats = daso.stats();
    CHECK(stats.steps == steps);
    CHECK(stats.global_syncs == steps);
    CHECK(stats.blocking_syncs == steps);
    CHECK(stats.local_syncs == steps);
    CHECK(stats.stale_merges == 0);
  }
}

TEST_CASE("daso on one node equals data parallel on an MLP bit for bit and across nodes to "
          "rounding",
          "[mpi][daso]") {
  auto world = Communicator::world();
  const int p = world.size(), rank = world.rank();
  INFO(rank_of(world));
  const Space space;
  const std::size_t local_batch = 4, steps = 3;
  for (int g : node_sizes(p)) {
    INFO("nodes of " << g << " ranks");
    auto comm = with_nodes_of(g);
    nn::Sequential<double, Mem> model(FeatureShape{1, 2, 3}), ref(FeatureShape{1, 2, 3});
    build_mlp(model, 11);
    build_mlp(ref, 11);
    DASOOptions o;
    o.fixed_skips = DASOSkips{1, 1, 0};
    o.downcast = dist::DASODowncast::none;
    DASO<double, Mem> daso(comm, model, o);
    dist::DataParallel<double, Mem> dp(world, ref);
    model.set_backward_hook(daso.backward_hook(space));
    ref.set_backward_hook(dp.backward_hook(space));
    optim::SGD<double, Mem>::Options sgd;
    sgd.lr = 0.1;
    sgd.momentum = 0.9;
    optim::SGD<double, Mem> opt(model.parameter_count(), sgd), opt_ref(ref.parameter_count(), sgd);
    nn::SoftmaxCrossEntropy<double, Mem> loss;
    Matrix<double, Mem> dlogits("dlogits", local_batch, 4);
    daso.begin_epoch(space, 1, 1, steps, 0);
    for (std::size_t s = 0; s < steps; ++s) {
      const auto x = random_matrix<double>(local_batch, 6, 300 + 10 * s + std::uint64_t(rank));
      std::vector<std::int32_t> y(local_batch);
      for (std::size_t i = 0; i < local_batch; ++i) {
        y[i] = std::int32_t((i + s + std::size_t(rank)) % 4);
      }
      const auto labels = labels_of(y);
      loss.forward_backward(space, model.forward(space, x), labels, dlogits);
      model.backward(space, dlogits, nn::Sequential<double, Mem>::Gradients::overwrite);
      daso.before_step(space);
      opt.step(space, model.parameters(), model.gradients());
      daso.after_step(space);
      loss.forward_backward(space, ref.forward(space, x), labels, dlogits);
      ref.backward(space, dlogits, nn::Sequential<double, Mem>::Gradients::overwrite);
      dp.finish(space);
      opt_ref.step(space, ref.parameters(), ref.gradients());
    }
    daso.end_epoch(space);
    model.clear_backward_hook();
    ref.clear_backward_hook();
    const auto got = host_values_of(model.parameters()), want = host_values_of(ref.parameters());
    if (g == p) {
      CHECK(got == want); // one node: the global average is over one rank
    } else {
      double worst = 0;
      for (std::size_t k = 0; k < got.size(); ++k) {
        worst = std::max(worst, std::abs(got[k] - want[k]));
      }
      CHECK(worst <= 1e-13);
    }
    CHECK(same_on_every_rank(
        world, std::to_string(std::hash<std::string>()(std::string(
                   reinterpret_cast<const char *>(got.data()), got.size() * sizeof(double))))));
  }
}

// Runs `steps` steps of DASO with fixed skips on hand-set parameters, without an optimizer:
// before step s every rank sets θ_i = value(rank, s, i). Returns θ after step `check_after`
// (and runs the epoch to its end).
struct MergeRun {
  std::vector<double> after;
  std::uint64_t global_iallreduces = 0;
  std::uint64_t sends = 0;
};

template <class Value>
MergeRun merge_run(Communicator &comm, DASOSkips skips, std::size_t chunk, std::size_t steps,
                   std::size_t check_after, Value value) {
  const Space space;
  const std::size_t n = 10;
  Vector<float, Mem> theta("theta", n), grad("grad", n);
  DASOOptions o;
  o.fixed_skips = skips;
  o.sending_chunk_size = chunk;
  DASO<float, Mem> daso(comm, theta, grad, {{0, n}}, o);
  daso.begin_epoch(space, 1, 1, steps, 0);
  MergeRun out;
  for (std::size_t s = 0; s < steps; ++s) {
    Kokkos::deep_copy(theta,
                      vector_of<float>(n, [&](std::size_t i) { return value(comm.rank(), s, i); }));
    daso.after_step(space);
    if (s == check_after) {
      out.after = host_values_of(theta);
    }
  }
  daso.end_epoch(space);
  out.global_iallreduces = daso.global_communicator().stats().iallreduce.calls;
  out.sends = daso.stats().sends;
  return out;
}

TEST_CASE("daso merges a stale send as (2S theta_local + sum of sent) / (N + 2S) and chunking "
          "does not change it",
          "[mpi][daso]") {
  auto world = Communicator::world();
  const int p = world.size();
  INFO(rank_of(world));
  // θ at a send: rank + 1 + i/2; θ trained meanwhile: 10 (rank + 1) + i.
  const auto value = [](int rank, std::size_t s, std::size_t i) {
    return s == 0 ? rank + 1 + 0.5 * double(i) : 10.0 * (rank + 1) + double(i);
  };
  for (int g : node_sizes(p)) {
    for (const auto skips : {DASOSkips{2, 1, 1}, DASOSkips{4, 1, 2}}) {
      const std::int64_t wait = skips.batches_to_wait;
      INFO("nodes of " << g << " ranks, batches_to_wait " << wait);
      auto comm = with_nodes_of(g);
      const int nodes = p / g, node = comm.rank() / g;
      // Group 0 (node-local rank 0) sends at step 0 and merges at step S; its node then takes
      // its result.
      const MergeRun whole = merge_run(comm, skips, 1000, 4, std::size_t(wait), value);
      const MergeRun chunked = merge_run(comm, skips, 3, 4, std::size_t(wait), value);
      std::vector<double> want(10);
      for (std::size_t i = 0; i < want.size(); ++i) {
        double sent = 0;
        for (int m = 0; m < nodes; ++m) {
          sent += value(m * g, 0, i);
        }
        const double local = value(node * g, std::size_t(wait), i);
        want[i] = (2.0 * double(wait) * local + sent) / double(nodes + 2 * wait);
      }
      REQUIRE(whole.after.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        CHECK(whole.after[i] == Approx(want[i]).epsilon(1e-6));
      }
      CHECK(chunked.after == whole.after); // bit for bit
      // Each send is one all-reduce of n + 1 = 11 elements, or ceil(11 / 3) = 4 chunks.
      CHECK(whole.global_iallreduces == whole.sends);
      CHECK(chunked.global_iallreduces == 4 * chunked.sends);
      CHECK(chunked.sends == whole.sends);
      if (comm.rank() % g == 0) {
        CHECK(whole.sends > 0); // group 0 sent (at step 0)
      }
    }
  }
}

TEST_CASE("daso sending groups cycle through the node-local ranks", "[mpi][daso]") {
  auto world = Communicator::world();
  const int p = world.size();
  INFO(rank_of(world));
  const Space space;
  for (int g : node_sizes(p)) {
    INFO("nodes of " << g << " ranks");
    auto comm = with_nodes_of(g);
    const std::size_t n = 5, steps = 2 * std::size_t(g) + 1;
    Vector<float, Mem> theta("theta", n), grad("grad", n);
    DASOOptions o;
    o.fixed_skips = DASOSkips{1, 1, 0};
    DASO<float, Mem> daso(comm, theta, grad, {{0, n}}, o);
    CHECK(daso.group() == comm.rank() % g);
    daso.begin_epoch(space, 1, 1, steps, 0);
    std::uint64_t mine = 0;
    for (std::size_t s = 0; s < steps; ++s) {
      daso.after_step(space);
      CHECK(daso.stats().last_sending_group == int(s % std::size_t(g)));
      mine += (s % std::size_t(g)) == std::size_t(daso.group()) ? 1 : 0;
    }
    daso.end_epoch(space);
    CHECK(daso.stats().sends == mine);
  }
}

TEST_CASE("daso throws on every rank when a send holds a non-finite parameter", "[mpi][daso]") {
  auto world = Communicator::world();
  INFO(rank_of(world));
  const Space space;
  for (const std::int64_t wait : {0, 1}) {
    INFO("batches_to_wait " << wait);
    auto comm = with_nodes_of(1);
    const std::size_t n = 6;
    Vector<float, Mem> theta = vector_of<float>(n, [](std::size_t i) { return double(i); });
    Vector<float, Mem> grad("grad", n);
    DASOOptions o;
    o.fixed_skips = DASOSkips{1, 1, wait};
    DASO<float, Mem> daso(comm, theta, grad, {{0, n}}, o);
    daso.begin_epoch(space, 1, 1, 4, 0);
    if (world.rank() == 0) {
      Kokkos::deep_copy(Kokkos::subview(theta, 3), std::numeric_limits<float>::quiet_NaN());
    }
    if (wait == 1) {
      daso.after_step(space); // sent now, merged at the next step
      Kokkos::deep_copy(theta, 1.0f);
    }
    CHECK_THROWS_WITH(daso.after_step(space), Catch::Contains("1 non-finite parameter values"));
  }
}

TEST_CASE("emulated link delays operations that cross virtual nodes and counts their bytes",
          "[mpi][daso][link]") {
  auto world = Communicator::world();
  const int p = world.size();
  INFO(rank_of(world));
  const Space space;
  using Clock = std::chrono::steady_clock;
  CHECK_THROWS_WITH(world.dup().set_internode_link({1e-3, 0}),
                    Catch::Contains("needs virtual nodes"));
  auto comm = with_nodes_of(1); // every rank a node
  CHECK_THROWS_WITH(comm.set_internode_link({-1.0, 0}),
                    Catch::Contains("latency_seconds must be finite and >= 0, got -1"));
  comm.set_internode_link({0.02, 1e6}); // 20 ms + 1 us per byte
  Vector<float, Mem> v = vector_of<float>(2500, [](std::size_t i) { return double(i); });
  const auto t0 = Clock::now();
  comm.allreduce(space, v); // 10,000 bytes: 30 ms, and 20.04 ms for the agreement all-reduce
  const double blocking = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto s = comm.stats();
  CHECK(comm.spans_nodes() == (p > 1));
  if (p > 1) {
    CHECK(blocking >= 0.05);
    CHECK(s.internode.calls == 2);
    CHECK(s.internode.bytes == 10000 + 40);
    CHECK(s.internode_seconds == Approx(0.02 + 40e-6 + 0.02 + 0.01).epsilon(1e-9));
    // A non-blocking one is incomplete until its link time has passed.
    comm.set_checked(false);
    // (Lower bounds only: a busy machine can stretch a wait, never shorten it.)
    const auto t1 = Clock::now();
    auto r = comm.iallreduce(space, v);
    const bool done_at_once = r.test();
    if (std::chrono::duration<double>(Clock::now() - t1).count() < 0.03) {
      CHECK_FALSE(done_at_once); // unless this rank was descheduled for the whole link time
    }
    r.wait();
    CHECK(std::chrono::duration<double>(Clock::now() - t1).count() >= 0.03);
  } else {
    CHECK(s.internode.calls == 0);
  }
  // Inside a node nothing is delayed or counted.
  auto node = with_nodes_of(p);
  node.set_internode_link({0.5, 1.0});
  node.allreduce(space, v);
  CHECK(node.stats().internode.calls == 0);
  CHECK(node.stats().internode_seconds == 0.0);
  CHECK_FALSE(node.spans_nodes());
}

TEST_CASE("daso overlaps its global sends with the steps under an emulated link",
          "[mpi][daso][link]") {
  // What overlap means, checked by events rather than by the clock (a busy machine stretches
  // any duration): with batches_to_wait = 1 every global send is still in flight when
  // after_step() returns, so the next step's computation runs while it crosses the link, and it
  // is merged one step later (but the epoch's last); with 0 each send completes inside the step
  // that started it.
  auto world = Communicator::world();
  const int p = world.size();
  INFO(rank_of(world));
  if (p < 2) {
    return; // one rank is one node: nothing crosses the link
  }
  const Space space;
  const std::size_t n = 25'000 - 1, steps = 6;
  struct Run {
    std::vector<std::size_t> in_flight; // pending() after each after_step()
    distributed::DASOStats stats;
  };
  const auto run = [&](std::int64_t wait) {
    auto comm = with_nodes_of(1);                                // every rank a node
    comm.set_internode_link({1e-3, 4.0 * double(n + 1) / 5e-3}); // 1 ms + 5 ms per send
    Vector<float, Mem> theta("theta", n), grad("grad", n);
    DASOOptions o;
    o.fixed_skips = DASOSkips{1, 1, wait};
    DASO<float, Mem> daso(comm, theta, grad, {{0, n}}, o);
    daso.begin_epoch(space, 1, 1, steps, 0);
    Run r;
    for (std::size_t s = 0; s < steps; ++s) {
      daso.after_step(space);
      r.in_flight.push_back(daso.pending());
    }
    daso.end_epoch(space);
    CHECK(daso.pending() == 0);
    r.stats = daso.stats();
    return r;
  };
  const Run blocking = run(0), overlapped = run(1);
  CHECK(blocking.stats.global_syncs == steps);
  CHECK(blocking.stats.blocking_syncs == steps);
  CHECK(blocking.in_flight == std::vector<std::size_t>(steps, 0));
  // The epoch's last step synchronizes blocking (nothing may stay in flight past the epoch).
  std::vector<std::size_t> in_flight(steps, 1);
  in_flight.back() = 0;
  CHECK(overlapped.stats.global_syncs == steps);
  CHECK(overlapped.stats.blocking_syncs == 1);
  CHECK(overlapped.in_flight == in_flight);
  // Both crossed the emulated link with the same bytes: only the timing of the merge differs.
  CHECK(overlapped.stats.internode_bytes == blocking.stats.internode_bytes);
  CHECK(blocking.stats.internode_bytes > 0);
}

TEST_CASE("daso needs nodes of equal size", "[mpi][daso]") {
  auto world = Communicator::world();
  if (world.size() != 4) {
    return;
  }
  auto comm = with_nodes_of(3); // nodes of 3 and 1 ranks
  Vector<float, Mem> theta("theta", 4), grad("grad", 4);
  CHECK_THROWS_WITH((DASO<float, Mem>(comm, theta, grad, {{0, 4}})),
                    Catch::Contains("node sizes range over [1, 3]"));
}

#endif // KAT_ENABLE_MPI

} // namespace test_daso
