// Benchmarks for Conv2d: a forward + backward of the Fashion-MNIST CNN's two convolutions
// (batch 128) against the GEMMs alone with the same shapes, on the im2col path, chunked
// (default without oneDNN) and full (recording curvature); then oneDNN against im2col on
// every convolution shape of the CNN and ResNet-14, batch normalization in oneDNN's
// blocked layout against KAT's kernels in its own, and the CNN's poolings in channels last
// (KAT's kernels on the transposed batch) against KAT's layout and against oneDNN's pooling.
//
// Ratios are measured inside one benchmark, interleaving the two timings each iteration,
// because the machines are shared and noisy.
#include "common.hpp"
#include <kat/core/bfloat16.hpp>
#include <kat/core/blas.hpp>
#include <kat/core/parameter_buffer.hpp>
#include <kat/core/views.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/init.hpp>
#include <kat/nn/max_pool2d.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace {

using namespace kat::bench;

// Whether this build has no oneDNN for float on the host, the benchmark then skipped with a
// message saying so.
bool skipped_without_dnn(benchmark::State &state) {
  if (kat::dnn_available<Space, float>()) {
    return false;
  }
  state.SkipWithError("no oneDNN in this build (KAT_ENABLE_ONEDNN)");
  return true;
}

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
  layer.set_backend(kat::nn::Conv2dBackend::im2col);
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

// Every convolution shape of the reference models (batch 128, 28x28 inputs): the CNN's two
// 5x5 layers and ResNet-14's 3x3 and 1x1 layers.
struct ModelConv {
  const char *name;
  int in_channels, out_channels, size, kernel, stride, padding;
  bool bias, needs_dx;
};
constexpr ModelConv model_convs[] = {
    {"cnn conv1 1-32 5x5 28", 1, 32, 28, 5, 1, 2, true, false},
    {"cnn conv2 32-64 5x5 14", 32, 64, 14, 5, 1, 2, true, true},
    {"resnet stem 1-16 3x3 28", 1, 16, 28, 3, 1, 1, false, false},
    {"resnet 16-16 3x3 28", 16, 16, 28, 3, 1, 1, false, true},
    {"resnet 16-32 3x3 s2 28", 16, 32, 28, 3, 2, 1, false, true},
    {"resnet 16-32 1x1 s2 28", 16, 32, 28, 1, 2, 0, false, true},
    {"resnet 32-32 3x3 14", 32, 32, 14, 3, 1, 1, false, true},
    {"resnet 32-64 3x3 s2 14", 32, 64, 14, 3, 2, 1, false, true},
    {"resnet 64-64 3x3 7", 64, 64, 7, 3, 1, 1, false, true},
};

// One Conv2d with its own parameters, input and output.
struct BenchConv {
  kat::nn::Conv2d<float, Mem> layer;
  kat::ParameterBuffer<float, Mem> buffer;
  M x, y, dy, dx;
  BenchConv(const ModelConv &c, std::size_t n, kat::nn::Conv2dBackend backend,
            kat::ActivationLayout layout)
      : layer(c.in_channels, c.out_channels, c.kernel, c.stride, c.padding, 1, c.bias) {
    const kat::FeatureShape out = layer.output_shape({c.in_channels, c.size, c.size});
    buffer.reserve("conv", layer.parameter_count());
    buffer.allocate();
    layer.bind(buffer.parameters().data(), buffer.gradients().data());
    layer.reset_parameters(Space(), 1);
    layer.set_backend(backend);
    layer.accumulate_gradients(false);
    // x and dx in `layout` where the channels allow it, y and dy too.
    const auto in_layout = c.in_channels % 16 == 0 ? layout : kat::ActivationLayout::features;
    const auto out_layout = c.out_channels % 16 == 0 ? layout : kat::ActivationLayout::features;
    layer.set_layouts(in_layout, out_layout);
    const std::size_t in_size = static_cast<std::size_t>(c.in_channels) * c.size * c.size;
    x = filled(n, in_size, 4);
    dy = filled(n, out.size(), 5);
    y = M("y", n, out.size());
    dx = M("dx", c.needs_dx ? n : 0, in_size);
  }
  void step() {
    layer.forward(Space(), x, y);
    layer.backward(Space(), dy, dx);
  }
};

// oneDNN against im2col + GEMM on one model convolution, forward + backward, timed
// alternately. Arguments: the shape (index into model_convs), and the layout of the DNN
// layer's activations (0: KAT's features, reordered around every oneDNN call; 1: the one
// Conv2d's fp32 DNN path computes in on this CPU, as between two layers that compute through
// oneDNN: channels16 with AVX-512, channels_last below it). The iteration time is
// oneDNN's; counters: both times, im2col / oneDNN, and the share of oneDNN's time spent
// reordering.
void BM_Conv2dBackends(benchmark::State &state) {
  const ModelConv &c = model_convs[state.range(0)];
  if (skipped_without_dnn(state)) {
    return;
  }
  const auto layout =
      state.range(1) != 0 ? kat::detail::dnn_f32_layout() : kat::ActivationLayout::features;
  state.SetLabel(state.range(1) != 0 ? std::string(c.name) + " " + kat::to_string(layout)
                                     : std::string(c.name));
  const std::size_t n = 128;
  BenchConv dnn(c, n, kat::nn::Conv2dBackend::dnn, layout);
  BenchConv im2col(c, n, kat::nn::Conv2dBackend::im2col, kat::ActivationLayout::features);
  dnn.step(); // plans, workspaces, BLAS buffers
  im2col.step();
  const double reorder_before = dnn.layer.dnn_reorder_stats().seconds;
  const auto [dnn_s, im2col_s] = time_alternately(
      state, [&] { dnn.step(); }, [&] { im2col.step(); });
  const double iterations = double(state.iterations());
  const kat::FeatureShape out = dnn.layer.output_shape({c.in_channels, c.size, c.size});
  const double flop = (c.needs_dx ? 3.0 : 2.0) * 2.0 * double(n) * out.height * out.width *
                      c.out_channels * double(dnn.layer.patch_size());
  state.counters["dnn_ms"] = 1e3 * dnn_s;
  state.counters["im2col_ms"] = 1e3 * im2col_s;
  state.counters["speedup"] = im2col_s / dnn_s;
  state.counters["dnn_GFLOPs"] = flop / dnn_s * 1e-9;
  state.counters["reorder_share"] =
      (dnn.layer.dnn_reorder_stats().seconds - reorder_before) / (dnn_s * iterations);
}
BENCHMARK(BM_Conv2dBackends)
    ->ArgNames({"shape", "dnn_layout"})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// BatchNorm2d forward + backward in training (batch 128) on ResNet-14's activation shapes:
// KAT's kernels on its features layout against oneDNN's on channels16, channels_last,
// channels_last_bf16 or channels16_bf16, alternately. Arguments: channels (16 at 28x28, 32 at
// 14x14, 64 at 7x7), 1 to fuse a following ReLU into both, and oneDNN's layout (1: channels16,
// the fp32 mode's; 2: channels_last, fp32 values next to pooling in bf16; 3:
// channels_last_bf16, the bf16 mode's between convolutions on CPUs with AMX; 4:
// channels16_bf16, the same on CPUs with AVX512-BF16 alone). Iteration time: oneDNN's.
void BM_BatchNormLayouts(benchmark::State &state) {
  if (skipped_without_dnn(state)) {
    return;
  }
  const int channels = static_cast<int>(state.range(0));
  const int size = 28 * 16 / channels;
  const std::size_t n = 128, cols = static_cast<std::size_t>(channels) * size * size;
  struct Bn {
    kat::nn::BatchNorm<float, Mem> layer;
    kat::ParameterBuffer<float, Mem> buffer;
    explicit Bn(int c) : layer(static_cast<std::size_t>(c)) {
      buffer.reserve("bn", layer.parameter_count());
      buffer.allocate();
      layer.bind(buffer.parameters().data(), buffer.gradients().data());
      layer.reset_parameters(Space(), 1);
    }
  } kat_bn(channels), dnn_bn(channels);
  using L = kat::ActivationLayout;
  const L layout = state.range(2) == 4   ? L::channels16_bf16
                   : state.range(2) == 3 ? L::channels_last_bf16
                   : state.range(2) == 2 ? L::channels_last
                                         : L::channels16;
  state.SetLabel(kat::to_string(layout));
  if (!kat::detail::dnn_reads_layout(layout)) {
    state.SkipWithError("oneDNN has no kernel for this layout on this CPU (below AVX-512)");
    return;
  }
  if (kat::layout_stores_bf16(layout)) {
    dnn_bn.layer.set_precision(kat::Precision::bf16);
  }
  dnn_bn.layer.set_layouts(layout, layout);
  if (state.range(1) != 0) { // a following ReLU applied by the layer (Layer::fuse_relu)
    kat_bn.layer.fuse_relu(true);
    dnn_bn.layer.fuse_relu(true);
  }
  const M x = filled(n, cols, 6), dy = filled(n, cols, 7);
  // The same values as bf16 (the first half of each buffer) for the bf16-storage layouts.
  const auto as_bf16 = [&](const M &m) {
    M out("bf16", n, cols);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
    auto o = Kokkos::create_mirror_view(out);
    auto *b = reinterpret_cast<kat::bfloat16 *>(o.data());
    for (std::size_t i = 0; i < h.span(); ++i) {
      b[i] = kat::bfloat16::from_float(h.data()[i]);
    }
    Kokkos::deep_copy(out, o);
    return out;
  };
  const M x16 = as_bf16(x), dy16 = as_bf16(dy);
  M y("y", n, cols), dx("dx", n, cols);
  const auto run = [&](Bn &bn) {
    const bool bf16 = kat::layout_stores_bf16(bn.layer.input_layout());
    bn.layer.forward(Space(), bf16 ? x16 : x, y);
    bn.layer.backward(Space(), bf16 ? dy16 : dy, dx);
  };
  const auto run_dnn = [&] { run(dnn_bn); };
  const auto run_kat = [&] { run(kat_bn); };
  run_kat(), run_dnn(); // warm-up: workspaces, oneDNN's plans
  const auto [dnn_s, kat_s] = time_alternately(state, run_dnn, run_kat);
  state.counters["dnn_ms"] = 1e3 * dnn_s;
  state.counters["kat_ms"] = 1e3 * kat_s;
  state.counters["speedup"] = kat_s / dnn_s;
}
BENCHMARK(BM_BatchNormLayouts)
    ->ArgNames({"channels", "relu", "layout"})
    ->ArgsProduct({{16, 32, 64}, {0, 1}, {1, 2, 3, 4}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The CNN's 2x2 max poolings (batch 128: 32 channels at 28x28, 64 at 14x14), training forward
// + backward, three ways alternately: MaxPool2d in channels_last (KAT's kernels on the batch
// seen transposed, the channels in the vector lanes: what the fp32 DNN path runs where
// oneDNN's convolutions compute channels last, below AVX-512), MaxPool2d in KAT's features
// layout, and oneDNN's pooling on the same channels_last batch (kat::Pool2dDnn, with its
// workspace: what the layer ran before). Iteration time: KAT's channels_last. The floor: one
// read of x and dy, one write of y and dx, and the argmax (int32) written and read once.
// The body is a template, so that kat::Pool2dDnn is instantiated only where oneDNN serves S
// (in builds without it, CUDA's and HIP's, it is declared, not defined).
template <class S> void pool_layouts(benchmark::State &state) {
  if constexpr (kat::dnn_available<S, float>()) {
    const int channels = static_cast<int>(state.range(0));
    const int size = 28 * 32 / channels;
    const std::size_t n = 128;
    const kat::FeatureShape in{channels, size, size};
    kat::nn::MaxPool2d<float, Mem> last(2), features(2);
    const kat::FeatureShape out = last.output_shape(in);
    features.output_shape(in);
    last.set_layouts(kat::ActivationLayout::channels_last, kat::ActivationLayout::channels_last);
    const M x = filled(n, in.size(), 8), dy = filled(n, out.size(), 9);
    M y("y", n, out.size()), dx("dx", n, in.size());
    kat::Pool2dDnn<S, float> dnn;
    const kat::Pool2dProblem problem{
        n, channels, size, size, size / 2, size / 2, 2,
        2, 2,        2,    0,    0,        true,     kat::ActivationLayout::channels_last};
    const auto run_last = [&] {
      last.forward(S(), x, y);
      last.backward(S(), dy, dx);
    };
    const auto run_features = [&] {
      features.forward(S(), x, y);
      features.backward(S(), dy, dx);
    };
    const auto run_dnn = [&] {
      dnn.forward(S(), problem, x.data(), y.data());
      dnn.backward(S(), problem, dy.data(), dx.data());
    };
    run_last(), run_features(), run_dnn(); // warm-up: workspaces, oneDNN's plans
    const auto [last_s, features_s, dnn_s] =
        time_alternately(state, run_last, run_features, run_dnn);
    state.counters["channels_last_ms"] = 1e3 * last_s;
    state.counters["features_ms"] = 1e3 * features_s;
    state.counters["onednn_ms"] = 1e3 * dnn_s;
    state.counters["floor_MB"] =
        1e-6 * double(n) * double(2 * in.size() + 2 * out.size() * 2) * sizeof(float);
  }
}

void BM_PoolLayouts(benchmark::State &state) {
  if (skipped_without_dnn(state)) {
    return;
  }
  pool_layouts<Space>(state);
}
BENCHMARK(BM_PoolLayouts)
    ->ArgNames({"channels"})
    ->Args({32})
    ->Args({64})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

} // namespace
