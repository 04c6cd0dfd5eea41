// Benchmarks for Conv2d: a forward + backward of the Fashion-MNIST CNN's two convolutions
// (batch 128) against the GEMMs alone with the same shapes, on the chunked path (default) and
// on the full path (recording curvature).
//
// Ratios are measured inside one benchmark, interleaving the two timings each iteration,
// because the machines are shared and noisy.
#include "common.hpp"
#include <kat/core/blas.hpp>
#include <kat/core/parameter_buffer.hpp>
#include <kat/core/views.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/init.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace {

using namespace kat::bench;

// The CNN's convolutions: 5x5, padding 2, stride 1.
struct ConvShape {
  int in_channels, out_channels, size;
  bool needs_dx; // false for the first layer
};
constexpr ConvShape conv_shapes[] = {{1, 32, 28, false}, {32, 64, 14, true}};

// The GEMMs of one Conv2d forward + backward on full-size preallocated matrices, R = N·H·W
// rows, K = C_in·25 patch columns (+1 for the bias): Y = P [W b]ᵀ, d[W b] += dYᵀ P, and
// dP = dY W when dx is needed.
struct ConvGemms {
  M p, wb, y, dy, dwb, dp, w;
  bool needs_dx;
  ConvGemms(std::size_t rows, std::size_t k, std::size_t out, bool dx)
      : p(filled(rows, k + 1, 1)), wb(filled(out, k + 1, 2)), y("y", rows, out),
        dy(filled(rows, out, 3)), dwb("dwb", out, k + 1), dp("dp", dx ? rows : 0, k),
        w(wb.data(), out, k), needs_dx(dx) {}
  void run(const Space &s) const {
    kat::gemm(s, kat::Trans::N, kat::Trans::T, 1.f, p, wb, 0.f, y);
    kat::gemm(s, kat::Trans::T, kat::Trans::N, 1.f, dy, p, 1.f, dwb);
    if (needs_dx) {
      kat::gemm(s, kat::Trans::N, kat::Trans::N, 1.f, dy, w, 0.f, dp);
    }
  }
};

// Conv2d forward+backward vs its GEMMs, timed alternately. Arguments: which convolution
// (1 or 2), recording (1: full path), chunk size in KiB (chunked path only; -1: the layer's
// default).
void BM_Conv2dForwardBackward(benchmark::State &state) {
  const ConvShape shape = conv_shapes[state.range(0) - 1];
  const bool recording = state.range(1) != 0;
  const std::size_t n = 128;
  const Space space;
  kat::nn::Conv2d<float, Mem> layer(shape.in_channels, shape.out_channels, 5, 1, 2);
  const kat::FeatureShape out = layer.output_shape({shape.in_channels, shape.size, shape.size});
  kat::ParameterBuffer<float, Mem> buffer;
  buffer.reserve("conv", layer.parameter_count());
  buffer.allocate();
  layer.bind(buffer.parameters().data(), buffer.gradients().data());
  layer.reset_parameters(space, 1);
  layer.record_curvature(recording);
  if (state.range(2) >= 0) {
    layer.set_chunk_bytes(static_cast<std::size_t>(state.range(2)) << 10);
  }
  layer.accumulate_gradients(false);
  const std::size_t in_size = static_cast<std::size_t>(shape.in_channels) * shape.size * shape.size;
  const M x = filled(n, in_size, 4), dy = filled(n, out.size(), 5);
  M y("y", n, out.size()), dx("dx", shape.needs_dx ? n : 0, in_size);
  const std::size_t rows = n * shape.size * shape.size, k = layer.patch_size();
  const ConvGemms gemms(rows, k, shape.out_channels, shape.needs_dx);
  // warm-up: workspaces and BLAS buffers
  layer.forward(space, x, y);
  layer.backward(space, dy, dx);
  gemms.run(space);
  space.fence();
  const double gemm_count = shape.needs_dx ? 3.0 : 2.0;
  time_against_gemms(
      state, gemm_count * 2.0 * double(rows) * double(k + 1) * shape.out_channels,
      [&] {
        layer.forward(space, x, y);
        layer.backward(space, dy, dx);
      },
      [&] { gemms.run(space); });
}
BENCHMARK(BM_Conv2dForwardBackward)
    ->ArgNames({"conv", "recording", "chunk_KiB"})
    ->Args({1, 0, -1})
    ->Args({1, 1, -1})
    ->Args({2, 0, -1})
    ->Args({2, 1, -1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The chunk-size sweep behind Conv2d::default_chunk_bytes (chunked path only; 0 = one
// chunk for the whole batch).
BENCHMARK(BM_Conv2dForwardBackward)
    ->Name("BM_Conv2dChunkSweep")
    ->ArgNames({"conv", "recording", "chunk_KiB"})
    ->ArgsProduct({{1, 2}, {0}, {256, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 0}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

} // namespace
