#pragma once
// Shared by KAT's benchmarks: types, timing, filled matrices and the training data.
#include <kat/kat.hpp>

#include <chrono>
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

// An n x m matrix of U(-1, 1) entries.
inline M filled(std::size_t n, std::size_t m, std::uint64_t seed) {
  M a("a", n, m);
  kat::Vector<float, Mem> flat(a.data(), n * m);
  kat::nn::uniform_(Space(), flat, -1.0, 1.0, seed, 0);
  return a;
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
