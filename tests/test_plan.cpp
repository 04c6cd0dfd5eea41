// Tests of kat::plan (host only): the graph builder, folding, the alpha-beta formulas and the
// memory count against hand computations, the Megatron-shaped MLP's plan and its collectives,
// the folded / unfolded / flat dynamic programs against exhaustive enumeration, the memory
// budget, the JSON round trip and the errors.
#include <catch2/catch.hpp>

#include "kat/core/error.hpp"
#include "kat/plan/cost_model.hpp"
#include "kat/plan/folding.hpp"
#include "kat/plan/gpt.hpp"
#include "kat/plan/graph.hpp"
#include "kat/plan/megatron.hpp"
#include "kat/plan/plan.hpp"
#include "kat/plan/plan_io.hpp"
#include "kat/plan/search.hpp"

#include "kat/plan/strategy.hpp"
#include <cstdint>
#include <limits>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace test_plan {

namespace {

using namespace kat::plan;
using Catch::Contains;

// A cluster with round numbers: one node of 8, alpha 10 µs, 10 GB/s, 1 TFLOP/s.
ClusterModel test_cluster() {
  ClusterModel c;
  c.name = "test";
  c.intra = {1e-5, 1e-10};
  c.inter = {1e-4, 1e-9};
  c.ranks_per_node = 8;
  c.flop_rate = 1e12;
  c.memory_bytes = 0;
  return c;
}

CostModel model(int data, int tensor, ClusterModel cluster = test_cluster()) {
  CostModel cm;
  cm.cluster = std::move(cluster);
  cm.mesh = {data, tensor};
  cm.optimizer = OptimizerMemory::adam();
  return cm;
}

// Megatron's MLP: x [b, p, h] -> Dense h -> 4h -> GELU -> Dense 4h -> h.
Graph mlp_graph(std::int64_t b, std::int64_t p, std::int64_t h, std::int64_t dtype = 4) {
  Graph g(dtype, "mlp");
  const TensorId x = g.add_input("x", {b, p, h});
  TensorId y = g.add("Dense", "fc1", {x}, {b, p, 4 * h}, {{4 * h, h}, {4 * h}},
                     {{"in", h}, {"out", 4 * h}, {"bias", 1}, {"positions", p}});
  y = g.add("GELU", "gelu", {y}, {b, p, 4 * h});
  g.add("Dense", "fc2", {y}, {b, p, h}, {{h, 4 * h}, {h}},
        {{"in", 4 * h}, {"out", h}, {"bias", 1}, {"positions", p}});
  return g;
}

// One GPT block (pre-norm attention and MLP) in scope blocks.<i>, reading x.
TensorId add_block(Graph &g, TensorId x, int i, std::int64_t heads, bool causal = true) {
  const Shape s = g.tensor(x).shape;
  const std::int64_t b = s[0], p = s[1], h = s[2];
  const auto dense = [&](const char *name, TensorId in, std::int64_t n_in, std::int64_t n_out) {
    return g.add("Dense", name, {in}, {b, p, n_out}, {{n_out, n_in}, {n_out}},
                 {{"in", n_in}, {"out", n_out}, {"bias", 1}, {"positions", p}});
  };
  g.push_scope("blocks");
  g.push_scope(std::to_string(i));
  TensorId y = g.add("LayerNorm", "ln1", {x}, s, {{h}, {h}}, {{"features", h}});
  y = dense("qkv", y, h, 3 * h);
  y = g.add("Attention", "attn", {y}, s, {},
            {{"heads", heads}, {"head_dim", h / heads}, {"positions", p}, {"causal", causal}});
  y = dense("proj", y, h, h);
  x = g.add("Add", "add1", {x, y}, s);
  y = g.add("LayerNorm", "ln2", {x}, s, {{h}, {h}}, {{"features", h}});
  y = dense("fc1", y, h, 4 * h);
  y = g.add("GELU", "gelu", {y}, {b, p, 4 * h});
  y = dense("fc2", y, 4 * h, h);
  x = g.add("Add", "add2", {x, y}, s);
  g.pop_scope();
  g.pop_scope();
  return x;
}

// A LayerNorm on an input x [b, p, h], then n identical blocks. (A block reading the graph
// input directly would differ from the others: a graph input needs no gradient.)
Graph blocks_graph(int n, std::int64_t b, std::int64_t p, std::int64_t h, std::int64_t heads,
                   std::int64_t dtype = 2) {
  Graph g(dtype, "blocks");
  TensorId x = g.add_input("x", {b, p, h});
  x = g.add("LayerNorm", "ln0", {x}, {b, p, h}, {{h}, {h}}, {{"features", h}});
  for (int i = 0; i < n; ++i) {
    x = add_block(g, x, i, heads);
  }
  return g;
}

bool close(double a, double b, double rel = 1e-9) {
  return std::abs(a - b) <= rel * std::max(std::abs(a), std::abs(b));
}

std::vector<Collective> tensor_collectives(const Plan &p) {
  std::vector<Collective> c;
  for (const auto &k : p.collectives) {
    if (k.group == Group::tensor) {
      c.push_back(k);
    }
  }
  return c;
}

} // namespace

TEST_CASE("plan graph builder records scopes shapes and parameters", "[plan]") {
  Graph g(2, "toy");
  const TensorId x = g.add_input("x", {4, 8, 16});
  g.push_scope("blocks");
  g.push_scope("0");
  CHECK(g.scope() == "blocks.0");
  const TensorId y = g.add("Dense", "fc", {x}, {4, 8, 32}, {{32, 16}, {32}},
                           {{"in", 16}, {"out", 32}, {"bias", 1}, {"positions", 8}});
  g.pop_scope();
  const TensorId z = g.add("GELU", "", {y}, {4, 8, 32});
  g.pop_scope();
  const auto &fc = g.op(g.find("blocks.0.fc"));
  CHECK(fc.scope == "blocks.0");
  CHECK(fc.type == "Dense");
  CHECK(fc.output == y);
  REQUIRE(fc.parameters.size() == 2);
  CHECK(g.tensor(fc.parameters[0]).parameter);
  CHECK(g.tensor(fc.parameters[0]).shape == Shape{32, 16});
  CHECK(g.tensor(fc.parameters[0]).owner == 0);
  CHECK(g.tensor(y).producer == 0);
  CHECK(g.tensor(x).producer == -1);
  CHECK(g.op(1).name == "blocks.GELU1"); // generated: type + operator index
  CHECK(g.tensor(z).shape == Shape{4, 8, 32});
  CHECK(g.parameter_count() == 32 * 16 + 32);
  const auto consumers = g.consumers();
  CHECK(consumers[static_cast<std::size_t>(x)] == std::vector<std::size_t>{0});
  CHECK(consumers[static_cast<std::size_t>(z)].empty());
  CHECK(numel({4, 8, 32}) == 1024);
  CHECK(shape_string({4, 8}) == "[4, 8]");
}

TEST_CASE("plan graph builder rejects bad operators with clear messages", "[plan]") {
  Graph g;
  const TensorId x = g.add_input("x", {4, 8, 16});
  const Attributes dense{{"in", 16}, {"out", 32}, {"bias", 1}, {"positions", 8}};
  CHECK_THROWS_WITH(g.add("Dense", "a", {x + 7}, {4, 8, 32}, {{32, 16}, {32}}, dense),
                    Contains("input tensor id 7 does not exist"));
  CHECK_THROWS_AS(g.add("Dense", "a", {x + 7}, {4, 8, 32}, {{32, 16}, {32}}, dense),
                  kat::ValueError);
  CHECK_THROWS_WITH(g.add("Dense", "a", {x}, {4, 8, 32}, {{32, 16}, {32}},
                          {{"in", 12}, {"out", 32}, {"bias", 1}}),
                    Contains("input feature extent must be 12 (attribute in), got 16"));
  CHECK_THROWS_AS(g.add("Dense", "a", {x}, {4, 8, 32}, {{32, 16}, {32}},
                        {{"in", 12}, {"out", 32}, {"bias", 1}}),
                  kat::ShapeError);
  CHECK_THROWS_WITH(g.add("Dense", "a", {x}, {4, 8, 30}, {{32, 16}, {32}}, dense),
                    Contains("output shape must be [4, 8, 32], got [4, 8, 30]"));
  CHECK_THROWS_WITH(g.add("Dense", "a", {x}, {4, 8, 32}, {{16, 32}, {32}}, dense),
                    Contains("parameter 0 must be [32, 16], got [16, 32]"));
  CHECK_THROWS_WITH(g.add("Dense", "a", {x}, {4, 8, 32}, {{32, 16}}, dense),
                    Contains("takes 2 parameter(s), got 1"));
  CHECK_THROWS_WITH(g.add("Dense", "a", {x}, {4, 8, 32}, {{32, 16}, {32}}, {{"out", 32}}),
                    Contains("needs the integer attribute 'in'"));
  CHECK_THROWS_WITH(g.add("Attention", "att", {x}, {4, 8, 4}, {},
                          {{"heads", 2}, {"head_dim", 2}, {"positions", 8}, {"causal", 1}}),
                    Contains("3·heads·head_dim = 12"));
  CHECK_THROWS_WITH(g.add("Add", "add", {x}, {4, 8, 16}), Contains("takes 2 input(s), got 1"));
  CHECK_THROWS_WITH(g.add("GELU", "act", {x}, {4, 0, 16}), Contains("positive extents"));
  g.add("GELU", "act", {x}, {4, 8, 16});
  CHECK_THROWS_WITH(g.add("GELU", "act", {x}, {4, 8, 16}), Contains("'act' exists already"));
  const TensorId w = g.op(0).output;
  (void)w;
  Graph h;
  const TensorId in = h.add_input("in", {2, 3});
  h.add("Dense", "d", {h.add_input("x", {2, 3})}, {2, 5}, {{5, 3}, {5}},
        {{"in", 3}, {"out", 5}, {"bias", 1}});
  CHECK_THROWS_WITH(h.add("GELU", "p", {h.op(0).parameters[0]}, {5, 3}),
                    Contains("is a parameter"));
  (void)in;
  CHECK_THROWS_WITH(h.pop_scope(), Contains("no scope is open"));
  CHECK_THROWS_WITH(h.push_scope("a.b"), Contains("without '.'"));
  CHECK_THROWS_WITH(h.find("nope"), Contains("no operator named 'nope'"));
  CHECK_THROWS_WITH(Graph(0), Contains("dtype_bytes must be >= 1, got 0"));
}

TEST_CASE("plan alpha-beta formulas against hand computations", "[plan]") {
  const Link link{2e-6, 1e-9};
  // all-reduce: α + β·2(t−1)/t·bytes; t = 4, 1 MB: 2e-6 + 1e-9·1.5e6
  CHECK(close(collective_seconds(CollectiveKind::all_reduce, link, 4, 1e6), 2e-6 + 1.5e-3));
  // all-gather and reduce-scatter: α + β·(t−1)/t·bytes
  CHECK(close(collective_seconds(CollectiveKind::all_gather, link, 4, 1e6), 2e-6 + 0.75e-3));
  CHECK(close(collective_seconds(CollectiveKind::reduce_scatter, link, 2, 1e6), 2e-6 + 0.5e-3));
  // all-to-all: each device sends (t−1)/t of its 1/t share
  CHECK(close(collective_seconds(CollectiveKind::all_to_all, link, 4, 1.6e7),
              2e-6 + 1e-9 * 3.0 / 16.0 * 1.6e7));
  CHECK(close(collective_volume(CollectiveKind::all_reduce, 8, 800), 1400));
  // one rank: no communication at all, not even α
  for (const auto k : {CollectiveKind::all_reduce, CollectiveKind::all_gather,
                       CollectiveKind::reduce_scatter, CollectiveKind::all_to_all}) {
    CHECK(collective_seconds(k, link, 1, 1e9) == 0.0);
    CHECK(collective_volume(k, 1, 1e9) == 0.0);
  }
  CHECK_THROWS_WITH(collective_seconds(CollectiveKind::all_reduce, link, 0, 1),
                    Contains("ranks must be >= 1"));
  // Groups: a tensor group inside a node uses intra, the data group across nodes inter.
  CostModel cm = model(4, 4);
  cm.cluster.ranks_per_node = 4;
  CHECK(cm.seconds(CollectiveKind::all_reduce, Group::tensor, 1e6) ==
        collective_seconds(CollectiveKind::all_reduce, cm.cluster.intra, 4, 1e6));
  CHECK(cm.seconds(CollectiveKind::all_reduce, Group::data, 1e6) ==
        collective_seconds(CollectiveKind::all_reduce, cm.cluster.inter, 4, 1e6));
  CHECK(cm.seconds(CollectiveKind::all_reduce, Group::data_tensor, 1e6) ==
        collective_seconds(CollectiveKind::all_reduce, cm.cluster.inter, 16, 1e6));
}

TEST_CASE("plan layout conversions cost the collective they need", "[plan]") {
  Graph g = mlp_graph(4, 8, 16);
  const CostModel cm = model(1, 4);
  const TensorId t = g.op(0).output; // [4, 8, 64], 8192 bytes
  const double x = 4.0 * 8 * 64 * 4;
  const Link &l = cm.cluster.intra;
  const double ar = l.alpha + l.beta * 1.5 * x, ag = l.alpha + l.beta * 0.75 * x;
  const double a2a = l.alpha + l.beta * 3.0 / 16.0 * x;
  using L = Layout;
  struct Case {
    L from, to;
    double seconds;
    std::vector<CollectiveKind> kinds;
  };
  const std::vector<Case> cases{
      {L::replicated, L::replicated, 0, {}},
      {L::replicated, L::sharded, ag, {CollectiveKind::all_gather}},
      {L::replicated, L::batch, ag, {CollectiveKind::all_gather}},
      {L::sharded, L::replicated, ag, {CollectiveKind::all_gather}},
      {L::batch, L::replicated, ag, {CollectiveKind::all_gather}},
      {L::partial, L::replicated, ar, {CollectiveKind::all_reduce}},
      {L::partial,
       L::sharded,
       2 * ag,
       {CollectiveKind::reduce_scatter, CollectiveKind::all_gather}},
      {L::sharded, L::batch, 2 * a2a, {CollectiveKind::all_to_all, CollectiveKind::all_to_all}},
  };
  for (const auto &c : cases) {
    const Conversion v = conversion(g, t, c.from, c.to, cm);
    INFO(to_string(c.from) << " -> " << to_string(c.to));
    CHECK(v.possible);
    CHECK(close(v.seconds, c.seconds));
    REQUIRE(v.collectives.size() == c.kinds.size());
    for (std::size_t k = 0; k < c.kinds.size(); ++k) {
      CHECK(v.collectives[k].kind == c.kinds[k]);
      CHECK(v.collectives[k].bytes == x);
    }
  }
  // forward / backward: replicated -> sharded slices forward, gathers the gradient
  CHECK(conversion(g, t, L::replicated, L::sharded, cm).collectives[0].pass == Pass::backward);
  CHECK(conversion(g, t, L::partial, L::replicated, cm).collectives[0].pass == Pass::forward);
  CHECK_FALSE(conversion(g, t, L::replicated, L::partial, cm).possible);
  // a graph input is read in any layout for free
  CHECK(conversion(g, 0, L::replicated, L::sharded, cm).seconds == 0.0);
  // 4 samples do not split over 8 ranks
  CHECK_FALSE(conversion(g, t, L::replicated, L::batch, model(1, 8)).possible);
  // one tensor rank: every conversion is free
  CHECK(conversion(g, t, L::partial, L::replicated, model(1, 1)).seconds == 0.0);
}

TEST_CASE("plan Megatron MLP is column then activation then row with one all-reduce each way",
          "[plan]") {
  const std::int64_t b = 4, p = 16, h = 256;
  for (const int tp : {2, 4}) {
    for (const auto method : {SearchMethod::folded, SearchMethod::flat}) {
      INFO("T = " << tp << ", " << to_string(method));
      const Graph g = mlp_graph(b, p, h);
      const CostModel cm = model(1, tp);
      SearchOptions o;
      o.method = method;
      const Plan plan = search(g, cm, o);
      CHECK(plan.at("fc1").strategy == "column");
      CHECK(plan.at("gelu").strategy == "sharded");
      CHECK(plan.at("fc2").strategy == "row");
      CHECK(plan.at("fc1").output == Layout::sharded);
      CHECK(plan.at("fc2").output == Layout::partial);
      const auto c = tensor_collectives(plan);
      REQUIRE(c.size() == 2);
      const double activation = static_cast<double>(b * p * h * 4);
      int forward = 0, backward = 0;
      for (const auto &k : c) {
        CHECK(k.kind == CollectiveKind::all_reduce);
        CHECK(k.bytes == activation); // B·P·h·dtype, exactly
        CHECK(k.ranks == tp);
        forward += k.pass == Pass::forward;
        backward += k.pass == Pass::backward;
      }
      CHECK(forward == 1);
      CHECK(backward == 1);
      // No data parallelism: nothing else is communicated.
      CHECK(plan.collectives.size() == 2);
      const double ar = cm.seconds(CollectiveKind::all_reduce, Group::tensor, activation);
      CHECK(close(plan.predicted.communication_seconds, 2 * ar));
      const double flops = 3.0 * (2.0 * b * p * h * 4 * h) * 2 + 2.0 * 8.0 * b * p * 4 * h;
      CHECK(close(plan.predicted.compute_seconds, flops / tp / cm.cluster.flop_rate));
      CHECK(close(plan.predicted.bytes_per_device, 2 * 2.0 * (tp - 1) / tp * activation));
      // Megatron's own plan is the same, and brute force agrees.
      CHECK(megatron_strategies(g) == plan.strategies());
      const Plan brute = brute_force(g, cm);
      CHECK(brute.strategies() == plan.strategies());
      CHECK(brute.search.combinations == 4 * 3 * 4);
    }
  }
}

TEST_CASE("plan chained Megatron MLPs all-reduce once each way per block", "[plan]") {
  // A LayerNorm, then N MLP blocks in scopes mlp.<i>: the last block's row-parallel output is
  // a graph output, whose all-reduce the chain (not the block's table) pays.
  const std::int64_t b = 4, p = 16, h = 256;
  for (const int n : {1, 3}) {
    Graph g(4, "mlps");
    TensorId x = g.add_input("x", {b, p, h});
    x = g.add("LayerNorm", "ln0", {x}, {b, p, h}, {{h}, {h}}, {{"features", h}});
    for (int i = 0; i < n; ++i) {
      g.push_scope("mlp");
      g.push_scope(std::to_string(i));
      x = g.add("Dense", "fc1", {x}, {b, p, 4 * h}, {{4 * h, h}, {4 * h}},
                {{"in", h}, {"out", 4 * h}, {"bias", 1}, {"positions", p}});
      x = g.add("GELU", "gelu", {x}, {b, p, 4 * h});
      x = g.add("Dense", "fc2", {x}, {b, p, h}, {{h, 4 * h}, {h}},
                {{"in", 4 * h}, {"out", h}, {"bias", 1}, {"positions", p}});
      g.pop_scope();
      g.pop_scope();
    }
    const CostModel cm = model(1, 2);
    const Plan folded = search(g, cm);
    CHECK(folded.search.unique_blocks == 1);
    CHECK(folded.search.block_instances == static_cast<std::size_t>(n));
    const auto c = tensor_collectives(folded);
    CHECK(c.size() == static_cast<std::size_t>(2 * n));
    for (const auto &k : c) {
      CHECK(k.kind == CollectiveKind::all_reduce);
      CHECK(k.bytes == static_cast<double>(b * p * h * 4));
    }
    const Plan brute = brute_force(g, cm);
    CHECK(close(folded.predicted.step_seconds, brute.predicted.step_seconds));
    CHECK(close(folded.search.dp_step_seconds, brute.predicted.step_seconds));
    CHECK(folded.strategies() == brute.strategies());
  }
}

TEST_CASE("plan folded search on N identical blocks equals brute force on one block", "[plan]") {
  struct Setting {
    const char *what;
    std::int64_t batch, positions, hidden, heads;
    int tensor;
    double beta; // s/byte; alpha 10 µs, 1 TFLOP/s
    double combinations;
    std::vector<std::string> expected; // the block's optimum (the regime)
  };
  const std::vector<std::string> megatron{"replicated", "column", "heads",   "row", "replicated",
                                          "replicated", "column", "sharded", "row", "replicated"};
  const std::vector<Setting> settings{
      // batch 2 does not split over 4 ranks: 3^4 Dense · 1 LN · 2 Attention · 1 Add · 2 GELU
      {"Megatron regime", 2, 64, 512, 8, 4, 1e-10, 324, megatron},
      // 4^4 Dense · 2^2 LN · 3 Attention · 2^2 Add · 3 GELU
      {"Megatron regime, batch splittable", 8, 64, 256, 8, 2, 3e-10, 36864, megatron},
      {"data-parallel regime", 32, 128, 128, 4, 2, 1e-10, 36864,
       std::vector<std::string>(10, "batch")},
      {"slow link: only the MLP split",
       4,
       128,
       256,
       8,
       2,
       1e-9,
       36864,
       {"replicated", "replicated", "replicated", "replicated", "replicated", "replicated",
        "column", "sharded", "row", "replicated"}},
  };
  for (const auto &s : settings) {
    ClusterModel cluster = test_cluster();
    cluster.intra.beta = s.beta;
    const CostModel cm = model(1, s.tensor, cluster);
    const Graph one = blocks_graph(1, s.batch, s.positions, s.hidden, s.heads);
    const Plan brute = brute_force(one, cm);
    INFO(s.what);
    const double ln0 = s.combinations < 1000 ? 1 : 2; // the front LayerNorm: replicated, batch
    CHECK(brute.search.combinations == ln0 * s.combinations);
    const std::vector<OpPlan> block(brute.operators.begin() + 1, brute.operators.end());
    std::vector<std::string> strategies;
    double block_seconds = 0;
    for (const auto &o : block) {
      strategies.push_back(o.strategy);
      block_seconds += o.compute_seconds + o.communication_seconds;
    }
    CHECK(strategies == s.expected);
    for (const int n : {1, 3, 8}) {
      INFO("N = " << n);
      const Graph g = blocks_graph(n, s.batch, s.positions, s.hidden, s.heads);
      const Folding f = fold(g);
      REQUIRE(f.unique.size() == 1);
      REQUIRE(f.instances.size() == static_cast<std::size_t>(n));
      const Plan folded = search(g, cm);
      CHECK(folded.search.unique_blocks == 1);
      CHECK(folded.search.block_instances == static_cast<std::size_t>(n));
      CHECK(folded.operators[0].strategy == brute.operators[0].strategy);
      // every instance: the brute-force block's strategies, compute and communication
      for (int i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < block.size(); ++k) {
          const OpPlan &o = folded.operators[1 + i * block.size() + k];
          CHECK(o.strategy == block[k].strategy);
          CHECK(close(o.compute_seconds, block[k].compute_seconds));
          CHECK(close(o.communication_seconds, block[k].communication_seconds));
        }
      }
      const double front =
          brute.operators[0].compute_seconds + brute.operators[0].communication_seconds;
      CHECK(close(folded.predicted.step_seconds, front + n * block_seconds));
      CHECK(close(folded.search.dp_step_seconds, folded.predicted.step_seconds));
      SearchOptions unfolded;
      unfolded.method = SearchMethod::unfolded;
      CHECK(search(g, cm, unfolded).strategies() == folded.strategies());
      SearchOptions flat;
      flat.method = SearchMethod::flat;
      CHECK(close(search(g, cm, flat).predicted.step_seconds, folded.predicted.step_seconds));
    }
  }
}

TEST_CASE("plan disabled strategies are never chosen", "[plan]") {
  // The data-parallel regime: without batch splits inside the tensor group the block must
  // fall back on the tensor-parallel strategies; brute force with the same filter agrees.
  const Graph g = blocks_graph(2, 32, 128, 128, 4);
  const CostModel cm = model(1, 2);
  CHECK(search(g, cm).at("blocks.0.fc1").strategy == "batch");
  SearchOptions o;
  o.disabled = {"batch", "Dense:row"};
  const Plan p = search(g, cm, o);
  for (const auto &op : p.operators) {
    CHECK(op.strategy != "batch");
    CHECK_FALSE((op.type == "Dense" && op.strategy == "row"));
  }
  const Graph one = blocks_graph(1, 32, 128, 128, 4);
  const Plan brute = brute_force(one, cm, 0, 1e8, o.disabled);
  CHECK(brute.search.combinations == 16 * 2 * 2); // 2^4 Dense, 2 Attention, 2 GELU, 1 others
  CHECK(close(search(one, cm, o).predicted.step_seconds, brute.predicted.step_seconds));
  o.disabled = {"replicated", "batch"};
  CHECK_THROWS_WITH(search(g, cm, o), Contains("has no feasible strategy that is not disabled"));
}

TEST_CASE("plan dynamic programs equal brute force for every boundary layout", "[plan]") {
  // A Dense in front of the block lets its input arrive in any layout (the optima below use
  // replicated, partial and batch); a GELU after it lets its output leave in any layout.
  for (const int tp : {2, 4}) {
    for (const std::int64_t batch : {2, 32}) {
      for (const Link link : {Link{1e-5, 1e-10}, Link{1e-5, 1e-9}, Link{1e-6, 3e-11}}) {
        INFO("T = " << tp << ", batch " << batch << ", alpha " << link.alpha << ", beta "
                    << link.beta);
        Graph g(2, "boundary");
        const std::int64_t p = 64, h = 256;
        TensorId x = g.add_input("x", {batch, p, h});
        x = g.add("Dense", "in", {x}, {batch, p, h}, {{h, h}, {h}},
                  {{"in", h}, {"out", h}, {"bias", 1}, {"positions", p}});
        x = add_block(g, x, 0, 4);
        g.add("GELU", "out", {x}, {batch, p, h});
        ClusterModel cluster = test_cluster();
        cluster.intra = link;
        const CostModel cm = model(1, tp, cluster);
        const Plan brute = brute_force(g, cm);
        for (const auto method :
             {SearchMethod::folded, SearchMethod::unfolded, SearchMethod::flat}) {
          SearchOptions o;
          o.method = method;
          const Plan p2 = search(g, cm, o);
          CHECK(close(p2.predicted.step_seconds, brute.predicted.step_seconds));
          CHECK(close(p2.search.dp_step_seconds, p2.predicted.step_seconds));
        }
      }
    }
  }
}

TEST_CASE("plan folding finds one unique GPT block and keeps different shapes apart", "[plan]") {
  for (const int n : {1, 3, 8}) {
    GptConfig c;
    c.layers = n;
    c.hidden = 64;
    c.heads = 4;
    c.seq_len = 16;
    c.vocab = 128;
    c.batch = 2;
    const Graph g = gpt_graph(c);
    const Folding f = fold(g);
    CHECK(f.depth == (n == 1 ? 1 : 2)); // N = 1: nothing repeats, the smallest depth
    REQUIRE(f.unique.size() == 1);
    CHECK(f.unique[0].instances.size() == static_cast<std::size_t>(n));
    CHECK(f.instances.size() == static_cast<std::size_t>(n));
    CHECK(f.loose_operators == 5); // embed, pos_embed, ln_f, lm_head, loss
    CHECK(f.instances.back().ops.size() == 10);
    CHECK(f.unique[0].hash == fnv1a(f.unique[0].canonical));
  }
  // Two blocks of hidden 64, a Dense to 128, two blocks of hidden 128.
  Graph g(4, "two widths");
  TensorId x = g.add_input("x", {2, 8, 64});
  x = g.add("LayerNorm", "ln0", {x}, {2, 8, 64}, {{64}, {64}}, {{"features", 64}});
  x = add_block(g, x, 0, 4);
  x = add_block(g, x, 1, 4);
  x = g.add("Dense", "widen", {x}, {2, 8, 128}, {{128, 64}, {128}},
            {{"in", 64}, {"out", 128}, {"bias", 1}, {"positions", 8}});
  x = add_block(g, x, 2, 4);
  add_block(g, x, 3, 4);
  const Folding f = fold(g);
  REQUIRE(f.unique.size() == 2);
  CHECK(f.unique[0].instances == std::vector<std::size_t>{0, 1});
  CHECK(f.unique[1].instances == std::vector<std::size_t>{2, 3});
  CHECK(f.loose_operators == 2);
  CHECK(f.unique[0].hash != f.unique[1].hash);
  // Names are left out of the canonical form, attributes are not.
  Graph a(4), b(4), c(4);
  add_block(a, a.add_input("x", {2, 8, 64}), 0, 4);
  add_block(b, b.add_input("input", {2, 8, 64}), 7, 4);
  add_block(c, c.add_input("x", {2, 8, 64}), 0, 4, false);
  CHECK(canonical_form(a, {0, 10}) == canonical_form(b, {0, 10}));
  CHECK(canonical_form(a, {0, 10}) != canonical_form(c, {0, 10}));
  // A chosen depth: 3 has no operators in this graph's scopes.
  CHECK(fold(g, 3).instances.empty());
  // Depth 1: "blocks" forms two runs with "widen" between them, so it is no block.
  CHECK(fold(g, 1).instances.empty());
  CHECK_THROWS_WITH(fold(g, -1), Contains("depth must be >= 0"));
}

TEST_CASE("plan memory per device against a hand count", "[plan]") {
  // x [8, 4, 16] -> Dense 16 -> 32 (bias) -> output, float, Adam (2 states).
  Graph g(4, "dense");
  const TensorId x = g.add_input("x", {8, 4, 16});
  g.add("Dense", "d", {x}, {8, 4, 32}, {{32, 16}, {32}},
        {{"in", 16}, {"out", 32}, {"bias", 1}, {"positions", 4}});
  const double weight = 32 * 16, bias = 32, input = 8 * 4 * 16;
  struct Case {
    const char *strategy;
    int data, tensor;
    double local_params, kept;
  };
  const std::vector<Case> cases{
      {"replicated", 1, 2, weight + bias, input},
      {"column", 1, 2, (weight + bias) / 2, input},
      {"row", 1, 2, weight / 2 + bias, input / 2},
      {"batch", 1, 2, weight + bias, input / 2},
      {"column", 2, 4, (weight + bias) / 4, input / 2}, // 2 replicas: 4 samples each
  };
  for (const auto &c : cases) {
    INFO(c.strategy << " at D = " << c.data << ", T = " << c.tensor);
    const Plan p = evaluate(g, {c.strategy}, model(c.data, c.tensor));
    const MemoryBreakdown &m = p.predicted.memory;
    CHECK(m.parameters == c.local_params * 4);
    CHECK(m.gradients == c.local_params * 4);
    CHECK(m.optimizer == c.local_params * 2 * 4);
    CHECK(m.activations == c.kept * 4);
    CHECK(m.total() == c.local_params * 16 + c.kept * 4);
  }
  // Mixed precision Adam: 2 + 2 + 3·4 = 16 bytes per parameter in 16-bit.
  Graph h(2, "dense16");
  h.add("Dense", "d", {h.add_input("x", {8, 4, 16})}, {8, 4, 32}, {{32, 16}, {32}},
        {{"in", 16}, {"out", 32}, {"bias", 1}, {"positions", 4}});
  CostModel cm = model(1, 1);
  cm.optimizer = OptimizerMemory::adam_mixed();
  const Plan mixed = evaluate(h, {"replicated"}, cm);
  CHECK(mixed.predicted.memory.parameters + mixed.predicted.memory.gradients +
            mixed.predicted.memory.optimizer ==
        (weight + bias) * 16);
  // Attention keeps Q|K|V and the B·heads·P² probabilities; heads split divides both.
  Graph a(2, "attention");
  a.add("Attention", "att", {a.add_input("qkv", {2, 8, 3 * 4 * 4})}, {2, 8, 16}, {},
        {{"heads", 4}, {"head_dim", 4}, {"positions", 8}, {"causal", 1}});
  const double qkv = 2 * 8 * 48, probabilities = 2 * 4 * 8 * 8;
  CHECK(evaluate(a, {"replicated"}, model(1, 2)).predicted.memory.activations ==
        (qkv + probabilities) * 2);
  CHECK(evaluate(a, {"heads"}, model(1, 2)).predicted.memory.activations ==
        (qkv + probabilities) * 2 / 2);
  // GELU keeps its input and its derivative, ReLU its input; sharding divides both.
  for (const char *type : {"GELU", "ReLU"}) {
    Graph e(2, "elementwise");
    e.add(type, "act", {e.add_input("x", {2, 8, 16})}, {2, 8, 16});
    const double kept = (std::string(type) == "GELU" ? 2 : 1) * 2 * 8 * 16 * 2.0;
    INFO(type);
    CHECK(evaluate(e, {"replicated"}, model(1, 2)).predicted.memory.activations == kept);
    CHECK(evaluate(e, {"sharded"}, model(1, 2)).predicted.memory.activations == kept / 2);
  }
  // The weight gradient is all-reduced over the data-parallel replicas, over D·T for batch.
  const Plan dp = evaluate(g, {"column"}, model(2, 2));
  const Plan batch = evaluate(g, {"batch"}, model(2, 2));
  bool data_ar = false, both_ar = false;
  for (const auto &c : dp.collectives) {
    data_ar = data_ar || (c.group == Group::data && c.bytes == (weight + bias) / 2 * 4 &&
                          c.pass == Pass::backward && c.ranks == 2);
  }
  for (const auto &c : batch.collectives) {
    both_ar = both_ar ||
              (c.group == Group::data_tensor && c.bytes == (weight + bias) * 4 && c.ranks == 4);
  }
  CHECK(data_ar);
  CHECK(both_ar);
}

TEST_CASE("plan Megatron plan on a GPT graph", "[plan]") {
  GptConfig c;
  c.layers = 3;
  c.hidden = 128;
  c.heads = 8;
  c.seq_len = 32;
  c.vocab = 256;
  c.batch = 4;
  const Graph g = gpt_graph(c);
  const CostModel cm = model(1, 4);
  const Plan m = megatron_plan(g, cm);
  CHECK(m.search.method == "megatron");
  for (int i = 0; i < 3; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    CHECK(m.at(b + "qkv").strategy == "column");
    CHECK(m.at(b + "qkv").shard_groups == 3);
    CHECK(m.at(b + "attn").strategy == "heads");
    CHECK(m.at(b + "proj").strategy == "row");
    CHECK(m.at(b + "proj").shard_groups == 1);
    CHECK(m.at(b + "fc1").strategy == "column");
    CHECK(m.at(b + "fc1").shard_groups == 1);
    CHECK(m.at(b + "gelu").strategy == "sharded");
    CHECK(m.at(b + "fc2").strategy == "row");
    CHECK(m.at(b + "ln1").strategy == "replicated");
    CHECK(m.at(b + "add2").strategy == "replicated");
  }
  CHECK(m.at("lm_head").strategy == "replicated");
  CHECK(m.at("embed").strategy == "replicated");
  // Per block two forward all-reduces (after proj and fc2) and two backward (qkv's and fc1's
  // input gradients) of B·P·h·dtype bytes.
  int forward = 0, backward = 0;
  for (const auto &k : tensor_collectives(m)) {
    CHECK(k.kind == CollectiveKind::all_reduce);
    CHECK(k.bytes == 4.0 * 32 * 128 * 2);
    forward += k.pass == Pass::forward;
    backward += k.pass == Pass::backward;
  }
  CHECK(forward == 6);
  CHECK(backward == 6);
  // The search does at least as well under the same model.
  const Plan s = search(g, cm);
  CHECK(s.predicted.step_seconds <= m.predicted.step_seconds * (1 + 1e-12));
  // Heads not divisible by T: the Megatron plan is not possible.
  CHECK_THROWS_WITH(megatron_plan(g, model(1, 16)),
                    Contains("heads 8 not divisible by tensor ranks 16"));
}

TEST_CASE("plan search under a memory budget", "[plan]") {
  // The data-parallel regime above: the fastest plan replicates the weights.
  const Graph one = blocks_graph(1, 32, 128, 128, 4);
  const Graph g = blocks_graph(4, 32, 128, 128, 4);
  const CostModel cm = model(1, 2);
  const Plan fastest = search(g, cm);
  SearchOptions least;
  least.memory_budget = 1; // nothing fits: the plan of least memory, marked infeasible
  const Plan smallest = search(g, cm, least);
  CHECK_FALSE(smallest.predicted.feasible);
  CHECK(std::isinf(smallest.search.lambda));
  CHECK(smallest.predicted.memory.total() < fastest.predicted.memory.total());
  // Memory adds up per operator: the least is the sum of each operator's least.
  const auto least_memory = [&](const Graph &graph) {
    double sum = 0;
    for (std::size_t i = 0; i < graph.operators().size(); ++i) {
      double m = 1e300;
      for (const auto &o : strategy_options(graph, i, cm)) {
        m = o.feasible ? std::min(m, o.memory.total()) : m;
      }
      sum += m;
    }
    return sum;
  };
  CHECK(close(smallest.predicted.memory.total(), least_memory(g)));
  // A budget between the two: the plan fits and is no faster than the unconstrained one.
  const double budget =
      0.5 * (smallest.predicted.memory.total() + fastest.predicted.memory.total());
  SearchOptions o;
  o.memory_budget = budget;
  const Plan fit = search(g, cm, o);
  CHECK(fit.predicted.feasible);
  CHECK(fit.predicted.memory.total() <= budget);
  CHECK(fit.predicted.step_seconds >= fastest.predicted.step_seconds * (1 - 1e-12));
  CHECK(fit.predicted.step_seconds < smallest.predicted.step_seconds);
  CHECK(fit.search.passes > 2);
  // On one block against exhaustive enumeration under the same kind of budget: the
  // relaxation may miss plans off the convex hull, never beats the exact optimum, and fits.
  const double one_budget = 0.5 * (least_memory(one) + search(one, cm).predicted.memory.total());
  SearchOptions o1;
  o1.memory_budget = one_budget;
  const Plan fit1 = search(one, cm, o1);
  const Plan brute = brute_force(one, cm, one_budget);
  CHECK(brute.predicted.feasible);
  CHECK(fit1.predicted.feasible);
  CHECK(fit1.predicted.step_seconds >= brute.predicted.step_seconds * (1 - 1e-12));
  // A budget the fastest plan fits changes nothing.
  o.memory_budget = fastest.predicted.memory.total() * 2;
  CHECK(search(g, cm, o).strategies() == fastest.strategies());
}

TEST_CASE("plan evaluate agrees with the dynamic program on the GPT presets", "[plan]") {
  for (const auto &name : gpt_preset_names()) {
    GptConfig c = gpt_preset(name);
    c.layers = 2; // the same blocks, fewer of them
    const Graph g = gpt_graph(c);
    for (const int tp : {1, 2, 8}) {
      INFO(name << ", T = " << tp);
      const Plan p = search(g, model(1, tp, gpu_cluster()));
      CHECK(close(p.search.dp_step_seconds, p.predicted.step_seconds));
      CHECK(close(p.predicted.step_seconds,
                  p.predicted.compute_seconds + p.predicted.communication_seconds));
    }
  }
}

TEST_CASE("plan GPT graphs of 96 blocks at hidden 12288 build from shapes only", "[plan]") {
  const GptConfig c = gpt_preset("gpt3-175b");
  const Graph g = gpt_graph(c);
  CHECK(g.operators().size() == 96 * 10 + 5);
  CHECK(g.parameter_count() == c.parameter_count());
  CHECK(c.parameter_count() == 175222972416); // 96 (4h² + 2h·4h + 9h + 4h) + 2Vh + Ph + 2h
  const Folding f = fold(g);
  CHECK(f.unique.size() == 1);
  CHECK(f.instances.size() == 96);
  CHECK(g.op(g.find("blocks.95.qkv")).integer("out") == 3 * 12288);
}

TEST_CASE("plan JSON round trip", "[plan]") {
  GptConfig c;
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.seq_len = 8;
  c.vocab = 64;
  c.batch = 4;
  const Graph g = gpt_graph(c);
  SearchOptions o;
  o.memory_budget = 1; // infeasible: lambda is infinite, written as null
  for (const Plan &p : {search(g, model(2, 2)), search(g, model(1, 4), o)}) {
    const std::string path = "test_plan_round_trip.json";
    write_plan(p, path);
    CHECK_FALSE(std::ifstream(path + ".tmp")); // written there, then renamed
    const Plan q = read_plan(path);
    std::remove(path.c_str());
    CHECK(q.model == p.model);
    CHECK(q.mesh.data == p.mesh.data);
    CHECK(q.mesh.tensor == p.mesh.tensor);
    CHECK(q.cluster == p.cluster);
    CHECK(q.dtype_bytes == p.dtype_bytes);
    CHECK(q.optimizer.states == p.optimizer.states);
    CHECK(q.predicted.step_seconds == p.predicted.step_seconds);
    CHECK(q.predicted.bytes_per_device == p.predicted.bytes_per_device);
    CHECK(q.predicted.memory.activations == p.predicted.memory.activations);
    CHECK(q.predicted.feasible == p.predicted.feasible);
    CHECK(q.search.method == p.search.method);
    CHECK(q.search.lambda == p.search.lambda);
    CHECK(q.search.unique_blocks == p.search.unique_blocks);
    REQUIRE(q.operators.size() == p.operators.size());
    for (std::size_t i = 0; i < p.operators.size(); ++i) {
      CHECK(q.operators[i].name == p.operators[i].name);
      CHECK(q.operators[i].strategy == p.operators[i].strategy);
      CHECK(q.operators[i].inputs == p.operators[i].inputs);
      CHECK(q.operators[i].output == p.operators[i].output);
      CHECK(q.operators[i].shard_groups == p.operators[i].shard_groups);
      CHECK(q.operators[i].compute_seconds == p.operators[i].compute_seconds);
      CHECK(q.operators[i].memory.total() == p.operators[i].memory.total());
    }
    REQUIRE(q.collectives.size() == p.collectives.size());
    for (std::size_t i = 0; i < p.collectives.size(); ++i) {
      CHECK(q.collectives[i].op == p.collectives[i].op);
      CHECK(q.collectives[i].kind == p.collectives[i].kind);
      CHECK(q.collectives[i].pass == p.collectives[i].pass);
      CHECK(q.collectives[i].group == p.collectives[i].group);
      CHECK(q.collectives[i].bytes == p.collectives[i].bytes);
      CHECK(q.collectives[i].seconds == p.collectives[i].seconds);
    }
    CHECK(plan_to_json(q) == plan_to_json(p));
  }
}

TEST_CASE("plan JSON reading errors name the problem", "[plan]") {
  CHECK_THROWS_AS(read_plan("/nonexistent/plan.json"), kat::IOError);
  CHECK_THROWS_WITH(write_plan(Plan{}, "/nonexistent/dir/plan.json"),
                    Contains("cannot write '/nonexistent/dir/plan.json' (creating "
                             "'/nonexistent/dir/plan.json.tmp'): No such file or directory"));
  {
    // The temporary file is a link to /dev/full: the write fails with ENOSPC, is reported with
    // the file named, and the plan already at the path stays whole.
    const std::string kept = "test_plan_full.json";
    { std::ofstream(kept) << "the previous plan\n"; }
    std::remove((kept + ".tmp").c_str());
    REQUIRE(symlink("/dev/full", (kept + ".tmp").c_str()) == 0);
    CHECK_THROWS_WITH(write_plan(Plan{}, kept), Contains("cannot write '" + kept + "' (writing '" +
                                                         kept + ".tmp'): No space left on device"));
    CHECK_FALSE(std::ifstream(kept + ".tmp")); // the link is gone with the failed file
    std::ifstream in(kept);
    std::string line;
    std::getline(in, line);
    CHECK(line == "the previous plan");
    std::remove(kept.c_str());
  }
  const std::string path = "test_plan_bad.json";
  { std::ofstream(path) << "{ not json"; }
  CHECK_THROWS_WITH(read_plan(path), Contains("is not valid JSON"));
  nlohmann::json j = plan_to_json(
      evaluate(mlp_graph(2, 2, 4), {"replicated", "replicated", "replicated"}, model(1, 1)));
  { std::ofstream(path) << j.dump(); }
  CHECK(read_plan(path).operators.size() == 3);
  std::remove(path.c_str());
  nlohmann::json bad = j;
  bad["format"] = "other";
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("\"format\" must be \"kat-plan\""));
  bad = j;
  bad["version"] = 7;
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("\"version\" must be 1, got 7"));
  bad = j;
  bad["operators"][0]["output"] = "diagonal";
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("unknown layout 'diagonal'"));
  bad = j;
  bad["operators"][0].erase("strategy");
  CHECK_THROWS_AS(plan_from_json(bad), kat::FormatError);
  bad = j;
  bad["mesh"]["tensor"] = 0;
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("mesh extents must be >= 1"));
}

TEST_CASE("plan JSON integer fields refuse floats and values outside their type", "[plan]") {
  // Found by fuzz/fuzz_plan.cpp: nlohmann's get<int>() truncates 1.5, wraps 2^32 + 1 to 1 and
  // converts 1e300 with undefined behaviour; each must be refused with the field named.
  const nlohmann::json j = plan_to_json(
      evaluate(mlp_graph(2, 2, 4), {"replicated", "replicated", "replicated"}, model(1, 1)));
  nlohmann::json bad = j;
  bad["version"] = 1e300;
  CHECK_THROWS_WITH(
      plan_from_json(bad),
      Contains("\"version\" must be an integer in [-2147483648, 2147483647], got 1e+300"));
  bad = j;
  bad["mesh"]["tensor"] = 4294967297ull;
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("\"tensor\" must be an integer in "
                                                  "[-2147483648, 2147483647], got 4294967297"));
  bad = j;
  bad["mesh"]["data"] = 1.5;
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("\"data\" must be an integer"));
  bad = j;
  bad["search"]["unique_blocks"] = -1.5;
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("\"unique_blocks\" must be an integer in [0, "
                                                  "18446744073709551615], got -1.5"));
  bad = j;
  bad["search"]["unique_blocks"] = -1;
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("got -1"));
  bad = j;
  bad["collectives"] = nlohmann::json::array();
  bad["operators"][0]["shard_groups"] = "2";
  CHECK_THROWS_WITH(plan_from_json(bad), Contains("\"shard_groups\" must be an integer"));
  // The largest values of each type still read back exactly.
  bad = j;
  bad["search"]["unique_blocks"] = std::numeric_limits<std::uint64_t>::max();
  CHECK(plan_from_json(bad).search.unique_blocks == std::numeric_limits<std::size_t>::max());
  bad["search"]["fold_depth"] = std::numeric_limits<int>::min();
  CHECK(plan_from_json(bad).search.fold_depth == std::numeric_limits<int>::min());
}

TEST_CASE("plan search and evaluate errors", "[plan]") {
  const Graph g = mlp_graph(4, 8, 16);
  CHECK_THROWS_WITH(search(g, model(3, 1)),
                    Contains("global batch 4 of 'x' is not divisible by 3 data-parallel replicas"));
  CHECK_THROWS_WITH(search(g, model(1, 0)), Contains("mesh extents must be >= 1"));
  CostModel slow = model(1, 2);
  slow.cluster.flop_rate = 0;
  CHECK_THROWS_WITH(search(g, slow), Contains("flop_rate must be > 0"));
  SearchOptions o;
  o.memory_budget = -1;
  CHECK_THROWS_WITH(search(g, model(1, 2), o), Contains("memory_budget must be >= 0"));
  CHECK_THROWS_WITH(evaluate(g, {"column"}, model(1, 2)), Contains("3 strategies needed"));
  CHECK_THROWS_WITH(evaluate(g, {"diagonal", "sharded", "row"}, model(1, 2)),
                    Contains("Dense 'fc1' has no strategy 'diagonal'; its strategies: "
                             "replicated, column, row, batch"));
  // 4 samples do not split over 8 ranks
  CHECK_THROWS_WITH(evaluate(g, {"batch", "batch", "batch"}, model(1, 8)),
                    Contains("strategy 'batch' of Dense 'fc1' is not possible: input 0: batch 4"));
  CHECK_THROWS_WITH(brute_force(blocks_graph(2, 2, 4, 8, 2), model(1, 2), 0, 1e6),
                    Contains("strategy combinations, more than max_combinations"));
  CHECK_THROWS_WITH(gpt_preset("gpt-5"), Contains("unknown preset 'gpt-5'; known: gpt3-350m"));
  GptConfig c;
  c.heads = 7;
  CHECK_THROWS_WITH(gpt_graph(c), Contains("hidden (768) must be divisible by heads (7)"));
  c = GptConfig{};
  c.layers = 0;
  CHECK_THROWS_WITH(gpt_graph(c), Contains("layers must be >= 1, got 0"));
  CHECK_THROWS_WITH(cluster_preset("cloud"), Contains("unknown cluster 'cloud'"));
  CHECK_THROWS_WITH(search_method_from_string("greedy"), Contains("unknown method 'greedy'"));
  CHECK_THROWS_WITH(layout_from_string("diagonal"), Contains("unknown layout 'diagonal'"));
}

} // namespace test_plan
