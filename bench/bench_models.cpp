// End-to-end: one SGD epoch (lr 0.05, momentum 0.9, batch 128, 60,000 Fashion-MNIST images)
// of each reference model, with its peak device memory; and where one training step's time
// goes, per profiling region, on either convolution path.
//
//   kat_bench_models --benchmark_filter=cnn
//   kat_bench_models --benchmark_filter=StepProfile
#include "common.hpp"

#include <kat/core/region_timer.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>

namespace {

using namespace kat::bench;

void BM_Epoch(benchmark::State &state, const std::string &name) {
  const Space space;
  static const auto train = training_data();
  kat::data::DataLoader<float, Mem> loader(train, 128, true, 0);
  // Counted from here: model, optimizer and workspaces, not the data set on the device.
  kat::AllocationTracker tracker;
  auto model = kat::nn::models::by_name<float, Mem>(name, train.shape, train.classes);
  model.compile(space, 0);
  kat::optim::SGD<float, Mem>::Options o;
  o.lr = 0.05;
  o.momentum = 0.9;
  kat::optim::SGD<float, Mem> sgd(model.parameter_count(), o);
  kat::nn::SoftmaxCrossEntropy<float, Mem> ce;
  kat::Workspace<float, Mem> dlogits_ws;
  kat::Matrix<float, Mem> x;
  kat::Vector<std::int32_t, Mem> y;
  std::size_t epoch = 0;
  double seconds = 0;
  std::uint64_t steady_allocations = 0;
  std::int64_t first_step_peak = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    loader.start_epoch(epoch++);
    std::size_t step = 0;
    while (loader.next(space, x, y)) {
      if (step++ == 1) {
        // From the second step on, count allocations (there should be none); keep the first
        // step's peak, which includes any transient workspace.
        first_step_peak = std::max(first_step_peak, tracker.peak_bytes());
        tracker.reset();
      }
      const auto &logits = model.forward(space, x);
      const auto dlogits = dlogits_ws.matrix(x.extent(0), logits.extent(1));
      ce.forward_backward(space, logits, y, dlogits);
      model.backward(space, dlogits, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
      sgd.step(space, model.parameters(), model.gradients());
    }
    space.fence();
    steady_allocations += tracker.allocations();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds += s;
    state.SetIterationTime(s);
  }
  state.counters["epoch_s"] = seconds / state.iterations();
  state.counters["samples_per_s"] = double(train.size()) * state.iterations() / seconds;
  const auto peak = std::max(first_step_peak, tracker.peak_bytes());
  state.counters["peak_MiB"] = double(peak) / (1024.0 * 1024.0);
  state.counters["parameters"] = double(model.parameter_count());
  state.counters["steady_allocations"] = double(steady_allocations);
}

BENCHMARK_CAPTURE(BM_Epoch, mlp, std::string("mlp"))
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_Epoch, cnn, std::string("cnn"))
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_Epoch, resnet, std::string("resnet"))
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_Epoch, vit, std::string("vit"))
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

// One forward + backward of a batch of 128 (random inputs and output gradients) of a model
// in training, under kat::RegionTimer: the step's time and the exclusive time of every
// profiling region above 1 % of it (oneDNN's passes and reorders, KAT's kernels, the GEMMs),
// in ms per step. Arguments: im2col 0 for Conv2dBackend::automatic (oneDNN where built with
// it), 1 for im2col everywhere; bf16 1 for Precision::bf16 (mixed precision), 0 for fp32.
void BM_StepProfile(benchmark::State &state, const std::string &name) {
  const Space space;
  const kat::FeatureShape input{1, 28, 28};
  auto model = kat::nn::models::by_name<float, Mem>(name, input, 10);
  model.set_precision(state.range(1) != 0 ? kat::Precision::bf16 : kat::Precision::fp32);
  model.compile(space, 0);
  kat::nn::set_conv2d_backend(model.layers(), state.range(0) != 0
                                                  ? kat::nn::Conv2dBackend::im2col
                                                  : kat::nn::Conv2dBackend::automatic);
  const std::size_t n = 128;
  const M x = filled(n, input.size(), 1), dy = filled(n, 10, 2);
  const auto step = [&] {
    model.forward(space, x);
    model.backward(space, dy, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
    space.fence();
  };
  for (int i = 0; i < 3; ++i) {
    step(); // plans, workspaces
  }
  kat::RegionTimer timer;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    step();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds += s;
    state.SetIterationTime(s);
  }
  const double steps = double(state.iterations());
  state.counters["step_ms"] = 1e3 * seconds / steps;
  for (const auto &e : timer.entries()) {
    if (e.self_seconds > 0.01 * seconds) {
      state.counters[e.name] = 1e3 * e.self_seconds / steps;
    }
  }
}
BENCHMARK_CAPTURE(BM_StepProfile, cnn, std::string("cnn"))
    ->ArgNames({"im2col", "bf16"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(30)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StepProfile, resnet, std::string("resnet"))
    ->ArgNames({"im2col", "bf16"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(30)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

} // namespace
BENCHMARK_CAPTURE(BM_StepProfile, vit, std::string("vit"))
    ->ArgNames({"im2col", "bf16"})
    ->ArgsProduct({{0}, {0, 1}})
    ->Iterations(30)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
