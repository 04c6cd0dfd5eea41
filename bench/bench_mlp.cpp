// Benchmarks for the foundation: the Dense layer against the GEMMs it calls, and one SGD
// epoch of the Fashion-MNIST MLP (784-256-256-10, batch 128) against the GEMM-only floor.
//
// Ratios are measured inside one benchmark, interleaving the two timings each iteration,
// because the machines are shared and noisy.
#include "common.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <filesystem>
#include <vector>

namespace {

using namespace kat::bench;

// The three GEMMs of one Dense forward + backward (dx included): y = x Wᵀ, dW += dyᵀ x,
// dx = dy W.
struct DenseGemms {
  M x, w, y, dy, dw, dx;
  DenseGemms(std::size_t n, std::size_t in, std::size_t out)
      : x(filled(n, in, 1)), w(filled(out, in, 2)), y("y", n, out), dy(filled(n, out, 3)),
        dw("dw", out, in), dx("dx", n, in) {}
  void run(const Space &s) const {
    kat::gemm(s, kat::Trans::N, kat::Trans::T, 1.f, x, w, 0.f, y);
    kat::gemm(s, kat::Trans::T, kat::Trans::N, 1.f, dy, x, 1.f, dw);
    kat::gemm(s, kat::Trans::N, kat::Trans::N, 1.f, dy, w, 0.f, dx);
  }
};

// Dense forward+backward (bias, dx) vs the same three GEMMs, timed alternately.
void BM_DenseForwardBackward(benchmark::State &state) {
  const std::size_t n = state.range(0), in = state.range(1), out = state.range(2);
  const Space space;
  kat::ParameterBuffer<float, Mem> buffer;
  kat::nn::Dense<float, Mem> layer(in, out);
  buffer.reserve("dense", layer.parameter_count());
  buffer.allocate();
  layer.bind(buffer.parameters().data(), buffer.gradients().data());
  layer.reset_parameters(space, 1);
  const M x = filled(n, in, 4), dy = filled(n, out, 5);
  M y("y", n, out), dx("dx", n, in);
  const DenseGemms gemms(n, in, out);
  time_against_gemms(
      state, 3.0 * 2.0 * double(n) * double(in) * double(out),
      [&] {
        layer.forward(space, x, y);
        layer.backward(space, dy, dx);
      },
      [&] { gemms.run(space); });
}
BENCHMARK(BM_DenseForwardBackward)
    ->ArgNames({"batch", "in", "out"})
    ->Args({128, 784, 256})
    ->Args({128, 256, 256})
    ->Args({128, 256, 10})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// One SGD epoch of the MLP (lr 0.05, momentum 0.9, batch 128, 60,000 images), as kat_train
// runs it, against a floor: exactly the GEMM calls an epoch makes and nothing else.
void BM_MLPEpochSGD(benchmark::State &state) {
  const Space space;
  const auto train = training_data();
  kat::data::DataLoader<float, Mem> loader(train, 128, true, 0);
  auto model = kat::nn::models::mlp<float, Mem>(train.shape, train.classes);
  model.compile(space, 0);
  kat::optim::SGD<float, Mem>::Options o;
  o.lr = 0.05;
  o.momentum = 0.9;
  kat::optim::SGD<float, Mem> sgd(model.parameter_count(), o);
  kat::nn::SoftmaxCrossEntropy<float, Mem> ce;
  kat::Workspace<float, Mem> dlogits_ws;
  M x;
  kat::Vector<std::int32_t, Mem> y;

  const DenseGemms l1(128, 784, 256), l2(128, 256, 256), l3(128, 256, 10);
  auto gemm_epoch = [&] {
    for (std::size_t b = 0; b < loader.batches(); ++b) {
      l1.run(space); // the first layer's dx GEMM is one more than an epoch needs:
      l2.run(space); // the floor is slightly pessimistic, never optimistic
      l3.run(space);
    }
    space.fence();
  };
  std::size_t epoch = 0;
  double epoch_s = 0, gemm_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    loader.start_epoch(epoch++);
    while (loader.next(space, x, y)) {
      const auto &logits = model.forward(space, x);
      const auto dlogits = dlogits_ws.matrix(x.extent(0), 10);
      ce.forward_backward(space, logits, y, dlogits);
      model.backward(space, dlogits, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
      sgd.step(space, model.parameters(), model.gradients());
    }
    space.fence();
    const double this_epoch_s = seconds(t0);
    epoch_s += this_epoch_s;
    t0 = Clock::now();
    gemm_epoch();
    gemm_s += seconds(t0);
    state.SetIterationTime(this_epoch_s);
  }
  state.counters["epoch_s"] = epoch_s / state.iterations();
  state.counters["gemm_only_s"] = gemm_s / state.iterations();
  state.counters["gemm_share"] = gemm_s / epoch_s;
  state.counters["samples_per_s"] = double(train.size()) * state.iterations() / epoch_s;
}
BENCHMARK(BM_MLPEpochSGD)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

} // namespace
