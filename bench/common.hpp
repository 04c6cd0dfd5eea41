#pragma once
// Shared by KAT's benchmarks: types, timing, filled matrices and the training data.
#include <kat/kat.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace kat::bench {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Clock = std::chrono::steady_clock;
using M = kat::Matrix<float, Mem>;

inline double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// An n x m matrix of U(-bound, bound) entries.
inline M filled(std::size_t n, std::size_t m, std::uint64_t seed, double bound = 1.0) {
  M a("a", n, m);
  kat::Vector<float, Mem> flat(a.data(), n * m);
  kat::nn::uniform_(Space(), flat, -bound, bound, seed, 0);
  return a;
}

// Seconds `f()` takes, fenced on `space` so the work it launched is done.
template <class F> double fenced_seconds(const Space &space, const F &f) {
  const auto t0 = Clock::now();
  f();
  space.fence();
  return seconds(t0);
}

// Times `steps` alternately, in order, in every iteration (each fenced), so their ratios come
// from one run on a noisy machine; the first step's time is the iteration time (benchmarks
// registered with UseManualTime). Returns each step's mean seconds per iteration.
template <class... Steps>
std::array<double, sizeof...(Steps)> time_alternately(benchmark::State &state,
                                                      const Steps &...steps) {
  const Space space;
  std::array<double, sizeof...(Steps)> total{};
  for (auto _ : state) {
    const std::array<double, sizeof...(Steps)> s{fenced_seconds(space, steps)...}; // in order
    for (std::size_t i = 0; i < s.size(); ++i) {
      total[i] += s[i];
    }
    state.SetIterationTime(s[0]);
  }
  for (double &t : total) {
    t /= double(state.iterations());
  }
  return total;
}

// Times `layer_step` and `gemm_step` alternately (time_alternately). The layer's time is the
// iteration time; the counters are both throughputs for `flop_per_iteration` and
// fraction_of_gemm = GEMM time / layer time.
template <class LayerStep, class GemmStep>
void time_against_gemms(benchmark::State &state, double flop_per_iteration,
                        const LayerStep &layer_step, const GemmStep &gemm_step) {
  const auto [layer_s, gemm_s] = time_alternately(state, layer_step, gemm_step);
  state.counters["layer_GFLOPs"] = flop_per_iteration / layer_s * 1e-9;
  state.counters["gemm_GFLOPs"] = flop_per_iteration / gemm_s * 1e-9;
  state.counters["fraction_of_gemm"] = gemm_s / layer_s;
}

// The Fashion-MNIST training split, or random data of the same shape when the data set is
// not installed (timing does not depend on pixel values).
inline kat::data::Dataset training_data() {
  if (std::filesystem::exists(std::string(KAT_BENCH_DATA_DIR) + "/train-images-idx3-ubyte.gz")) {
    return kat::data::load_fashion_mnist(KAT_BENCH_DATA_DIR, kat::data::Split::train);
  }
  kat::data::Dataset d;
  d.shape = kat::FeatureShape{1, 28, 28};
  d.classes = 10;
  d.images.resize(60000 * 784);
  d.labels.resize(60000);
  kat::HostRng rng(1);
  for (auto &p : d.images)
    p = static_cast<std::uint8_t>(rng.next());
  for (auto &l : d.labels)
    l = static_cast<std::int32_t>(rng.uniform_index(10));
  return d;
}

} // namespace kat::bench
