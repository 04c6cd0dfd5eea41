// Benchmarks for kat::plan (host only, no Kokkos work): the tensor-parallel plan search on
// GPT-style graphs of 12 to 96 blocks, folded (one table per unique block, TAP) against
// unfolded (one table per block instance) and flat (the program over every operator), with
// and without a memory budget; folding, building the graph, and exhaustive enumeration of one
// block. The folded-against-unfolded ratio is this code's own; the TAP paper's 20-160x is
// against Alpa, another framework.
//
// The model: hidden 4096, 32 heads, 2048 positions, global batch 8, 16-bit elements, Adam; the
// gpu-cluster cost model at T = 8 (memory budget 80 GiB where the third argument is 1).
#include <kat/plan/cost_model.hpp>
#include <kat/plan/folding.hpp>
#include <kat/plan/gpt.hpp>
#include <kat/plan/search.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

namespace {

using namespace kat::plan;

GptConfig config(std::int64_t blocks) {
  GptConfig c;
  c.layers = blocks;
  c.hidden = 4096;
  c.heads = 32;
  c.seq_len = 2048;
  c.batch = 8;
  c.dtype_bytes = 2;
  return c;
}

CostModel cost_model() {
  CostModel cm;
  cm.cluster = gpu_cluster();
  cm.mesh = {1, 8};
  cm.optimizer = OptimizerMemory::adam();
  return cm;
}

// Arguments: blocks, method (0 folded, 1 unfolded, 2 flat), budget (0: unlimited, 1: 80 GiB).
// Times search_strategies (the search without pricing the final plan).
void BM_PlanSearch(benchmark::State &state) {
  const Graph g = gpt_graph(config(state.range(0)));
  const CostModel cm = cost_model();
  SearchOptions o;
  o.method = static_cast<SearchMethod>(state.range(1));
  o.memory_budget = state.range(2) ? cm.cluster.memory_bytes : 0;
  SearchInfo info;
  for (auto _ : state) {
    benchmark::DoNotOptimize(search_strategies(g, cm, o, &info));
  }
  state.SetLabel(to_string(o.method));
  state.counters["operators"] = static_cast<double>(g.operators().size());
  state.counters["unique_blocks"] = static_cast<double>(info.unique_blocks);
  state.counters["passes"] = info.passes;
}
BENCHMARK(BM_PlanSearch)
    ->ArgsProduct({{12, 24, 48, 96}, {0, 1, 2}, {0, 1}})
    ->ArgNames({"blocks", "method", "budget"})
    ->Unit(benchmark::kMicrosecond);

// search() end to end: the folded search plus evaluate() of the plan found (every operator
// priced, every collective listed).
void BM_PlanSearchAndEvaluate(benchmark::State &state) {
  const Graph g = gpt_graph(config(state.range(0)));
  const CostModel cm = cost_model();
  for (auto _ : state) {
    benchmark::DoNotOptimize(search(g, cm));
  }
}
BENCHMARK(BM_PlanSearchAndEvaluate)
    ->Arg(12)
    ->Arg(96)
    ->ArgName("blocks")
    ->Unit(benchmark::kMicrosecond);

// fold(): canonical forms of every candidate at every scope depth.
void BM_PlanFold(benchmark::State &state) {
  const Graph g = gpt_graph(config(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(fold(g));
  }
}
BENCHMARK(BM_PlanFold)->Arg(12)->Arg(96)->ArgName("blocks")->Unit(benchmark::kMicrosecond);

// Building the 175B-sized graph (96 blocks of hidden 12288): shapes only.
void BM_PlanBuildGraph(benchmark::State &state) {
  const GptConfig c = gpt_preset("gpt3-175b");
  for (auto _ : state) {
    benchmark::DoNotOptimize(gpt_graph(c));
  }
}
BENCHMARK(BM_PlanBuildGraph)->Unit(benchmark::kMicrosecond);

// Exhaustive enumeration of one block (a LayerNorm in front, as in tests/test_plan.cpp):
// 2 · 4^4 · 2^2 · 3 · 2^2 · 3 = 73,728 plans. Twelve blocks would be 36,864^12 ≈ 6e54.
void BM_PlanBruteForceBlock(benchmark::State &state) {
  const GptConfig c = config(1);
  Graph g(c.dtype_bytes, "one block");
  const std::int64_t b = c.batch, p = c.seq_len, h = c.hidden, f = c.ffn();
  TensorId x = g.add_input("x", {b, p, h});
  x = g.add("LayerNorm", "ln0", {x}, {b, p, h}, {{h}, {h}}, {{"features", h}});
  const auto dense = [&](const char *name, TensorId in, std::int64_t n_in, std::int64_t n_out) {
    return g.add("Dense", name, {in}, {b, p, n_out}, {{n_out, n_in}, {n_out}},
                 {{"in", n_in}, {"out", n_out}, {"bias", 1}, {"positions", p}});
  };
  g.push_scope("block");
  TensorId y = g.add("LayerNorm", "ln1", {x}, {b, p, h}, {{h}, {h}}, {{"features", h}});
  y = dense("qkv", y, h, 3 * h);
  y = g.add("Attention", "attn", {y}, {b, p, h}, {},
            {{"heads", c.heads}, {"head_dim", h / c.heads}, {"positions", p}, {"causal", 1}});
  y = dense("proj", y, h, h);
  x = g.add("Add", "add1", {x, y}, {b, p, h});
  y = g.add("LayerNorm", "ln2", {x}, {b, p, h}, {{h}, {h}}, {{"features", h}});
  y = dense("fc1", y, h, f);
  y = g.add("GELU", "gelu", {y}, {b, p, f});
  y = dense("fc2", y, f, h);
  g.add("Add", "add2", {x, y}, {b, p, h});
  const CostModel cm = cost_model();
  double combinations = 0;
  for (auto _ : state) {
    const Plan plan = brute_force(g, cm);
    combinations = plan.search.combinations;
    benchmark::DoNotOptimize(plan);
  }
  state.counters["combinations"] = combinations;
}
BENCHMARK(BM_PlanBruteForceBlock)->Unit(benchmark::kMillisecond);

} // namespace
