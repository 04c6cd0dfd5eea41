// Benchmarks for ScaledDotProductAttention: a forward + backward at the ViT-on-Fashion-MNIST
// sizes (batch 128, D = 64 in 4 heads of 16, P = 16 tokens as 4 x 4 patches or P = 28 as the
// image's rows), causal and not, in float. Counters: tokens (N·P) per second and GFLOP/s of
// the six P x P x dh products of a forward + backward per (sample, head), 12·N·heads·P²·dh
// flops (the softmax and its derivative are not counted; causal counts the full products,
// which the kernels compute before masking).
#include "common.hpp"
#include <kat/nn/attention.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>

namespace {

using namespace kat::bench;

// Arguments: positions as H, W; causal (0/1). The layer's default kernels (batch lanes on
// the host) are the timed iterations; the batched-GEMM kernels run alternately in the same
// iterations, so batched_gemm_time_ratio (their time / the default's) comes from one run.
void BM_AttentionForwardBackward(benchmark::State &state) {
  const std::size_t n = 128, heads = 4, head_dim = 16, d = heads * head_dim;
  const int height = static_cast<int>(state.range(0)), width = static_cast<int>(state.range(1));
  const bool causal = state.range(2) != 0;
  const std::size_t p = static_cast<std::size_t>(height) * static_cast<std::size_t>(width);
  const Space space;
  kat::nn::ScaledDotProductAttention<float, Mem> layer(heads, head_dim, causal);
  kat::nn::ScaledDotProductAttention<float, Mem> gemm_layer(heads, head_dim, causal);
  gemm_layer.set_kernel(kat::nn::AttentionKernel::batched_gemm);
  const kat::FeatureShape out = layer.output_shape({static_cast<int>(3 * d), height, width});
  const M x = filled(n, 3 * d * p, 1), dy = filled(n, out.size(), 2);
  M y("y", n, out.size()), dx("dx", n, 3 * d * p);
  const auto step_layer = [&] {
    layer.forward(space, x, y);
    layer.backward(space, dy, dx);
  };
  const auto step_gemm = [&] {
    gemm_layer.forward(space, x, y);
    gemm_layer.backward(space, dy, dx);
  };
  step_layer(), step_gemm(); // warm-up: workspaces
  const auto [layer_s, gemm_s] = time_alternately(state, step_layer, step_gemm);
  const double flop = 12.0 * double(n * heads) * double(p * p) * double(head_dim);
  state.counters["tokens_per_s"] = double(n * p) / layer_s;
  state.counters["GFLOPs"] = flop / layer_s * 1e-9;
  state.counters["batched_gemm_GFLOPs"] = flop / gemm_s * 1e-9;
  state.counters["batched_gemm_time_ratio"] = gemm_s / layer_s;
}
BENCHMARK(BM_AttentionForwardBackward)
    ->ArgNames({"H", "W", "causal"})
    ->Args({4, 4, 0})
    ->Args({28, 1, 0})
    ->Args({4, 4, 1})
    ->Args({28, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

} // namespace
