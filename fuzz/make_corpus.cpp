// make_corpus OUT: writes the fuzz targets' seed files with KAT's own writers into
// OUT/idx, OUT/checkpoint and OUT/plan (fuzz/make_corpus.sh runs it, gzips the IDX seeds and
// copies the result to fuzz/corpus). Every seed is a valid file, so the fuzzers start from
// inputs the parsers accept and mutate towards the edges.
#include "kat/data/idx.hpp"
#include "kat/io/checkpoint.hpp"
#include "kat/plan/gpt.hpp"
#include "kat/plan/plan.hpp"
#include "kat/plan/plan_io.hpp"
#include "kat/plan/search.hpp"

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace kat::plan;

// An MNIST-style pair: 3 images of 4 x 5 pixels and their 3 labels; a 2-D and a 4-D array.
void write_idx_seeds(const std::string &dir) {
  std::vector<std::uint8_t> pixels(3 * 4 * 5);
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    pixels[i] = static_cast<std::uint8_t>(i * 37 % 256);
  }
  kat::data::write_idx(dir + "/images-3x4x5.idx", {3, 4, 5}, pixels.data());
  const std::uint8_t labels[3] = {7, 2, 9};
  kat::data::write_idx(dir + "/labels-3.idx", {3}, labels);
  kat::data::write_idx(dir + "/matrix-6x10.idx", {6, 10}, pixels.data());
  kat::data::write_idx(dir + "/tensor-1x2x3x2.idx", {1, 2, 3, 2}, pixels.data());
}

// What a trainer checkpoints, in miniature: every dtype, a scalar, a vector, a matrix, a
// rank-3 array, text; and an empty checkpoint.
void write_checkpoint_seeds(const std::string &dir) {
  kat::StateDict s;
  s.set("model.fc1.weight", std::vector<float>{0.5f, -1.0f, 2.0f, 0.25f, 3.0f, -0.125f}, {3, 2});
  s.set("model.fc1.bias", std::vector<float>{0.0f, 1.0f, -1.0f});
  s.set("optimizer.step", std::int64_t{42});
  s.set("optimizer.lr", 0.01);
  s.set("sampler.order", std::vector<std::int32_t>{2, 0, 1, 3});
  s.set("sampler.seed", std::uint64_t{12345});
  s.set("kfac.A", std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1}, {2, 2, 3});
  s.set_text("run.method", "sgd");
  kat::io::save_checkpoint(dir + "/trainer.kat", s);
  kat::StateDict one;
  one.set("mask", std::vector<std::uint8_t>{1, 0, 1, 1}, {2, 2});
  kat::io::save_checkpoint(dir + "/mask.kat", one);
  kat::io::save_checkpoint(dir + "/empty.kat", kat::StateDict{});
}

// `p` as JSON without indentation (half the bytes of write_plan's), checked.
void write_compact(const Plan &p, const std::string &path) {
  std::ofstream out(path);
  out << plan_to_json(p).dump() << '\n';
  out.close();
  if (!out) {
    throw kat::IOError("make_corpus: cannot write '" + path + "'");
  }
}

// Plans as kat_plan writes them: a one-block GPT searched on a 2 x 2 mesh, the same on
// 1 x 4 with a memory budget nothing fits (infeasible: lambda is null), both without
// indentation to keep the seeds small, and an MLP's plan as write_plan writes it.
void write_plan_seeds(const std::string &dir) {
  GptConfig c;
  c.layers = 1;
  c.hidden = 16;
  c.heads = 2;
  c.seq_len = 4;
  c.vocab = 32;
  c.batch = 2;
  const Graph g = gpt_graph(c);
  CostModel cm;
  cm.cluster = cluster_preset("mpi-local");
  cm.mesh = {2, 2};
  cm.optimizer = OptimizerMemory::adam();
  write_compact(search(g, cm), dir + "/gpt-2x2.json");
  cm.mesh = {1, 4};
  SearchOptions tight;
  tight.memory_budget = 1;
  write_compact(search(g, cm, tight), dir + "/gpt-1x4-infeasible.json");

  Graph mlp(4, "mlp");
  const TensorId x = mlp.add_input("x", {2, 2, 4});
  TensorId y = mlp.add("Dense", "fc1", {x}, {2, 2, 16}, {{16, 4}, {16}},
                       {{"in", 4}, {"out", 16}, {"bias", 1}, {"positions", 2}});
  y = mlp.add("GELU", "gelu", {y}, {2, 2, 16});
  mlp.add("Dense", "fc2", {y}, {2, 2, 4}, {{4, 16}, {4}},
          {{"in", 16}, {"out", 4}, {"bias", 1}, {"positions", 2}});
  cm.mesh = {1, 2};
  write_plan(evaluate(mlp, {"column", "replicated", "row"}, cm), dir + "/mlp-1x2.json");
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus OUT (writes OUT/idx, OUT/checkpoint, OUT/plan)\n");
    return 2;
  }
  const std::string out = argv[1];
  try {
    write_idx_seeds(out + "/idx");
    write_checkpoint_seeds(out + "/checkpoint");
    write_plan_seeds(out + "/plan");
  } catch (const std::exception &e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
