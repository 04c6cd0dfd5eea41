// FOSI's building blocks against plain training steps on the Fashion-MNIST models (issue: an
// exact Hessian-vector product costs at most 2.5x a forward+backward at batch 128).
//
// Each iteration times a forward+backward (loss and gradient) and a curvature-vector product
// on the same batch, alternately, so the ratio comes from one run.
#include "common.hpp"

#include <benchmark/benchmark.h>

#include <string>

namespace {

using namespace kat::bench;

// args: model (0 mlp, 1 cnn), product (0 Hessian, 1 Gauss-Newton).
void BM_CurvatureProduct(benchmark::State &state) {
  const std::string name = state.range(0) == 0 ? "mlp" : "cnn";
  const auto kind = state.range(1) == 0 ? kat::nn::CurvatureProduct::hessian
                                        : kat::nn::CurvatureProduct::gauss_newton;
  const Space space;
  const auto train = training_data();
  kat::data::DataLoader<float, Mem> loader(train, 128, true, 0);
  auto model = kat::nn::models::by_name<float, Mem>(name, train.shape, train.classes);
  model.compile(space, 0);
  const kat::nn::SoftmaxCrossEntropy<float, Mem> ce;
  kat::Workspace<float, Mem> dlogits("bench::dlogits");
  kat::nn::CurvatureVectorProduct<float, Mem, kat::nn::SoftmaxCrossEntropy<float, Mem>> product(
      kind);
  const std::size_t n = model.parameter_count();
  kat::Vector<float, Mem> v("v", n), hv("hv", n);
  kat::nn::uniform_(space, v, -1.0, 1.0, 7, 0);
  M x;
  kat::Vector<std::int32_t, Mem> y;
  loader.start_epoch(0);
  loader.next(space, x, y);
  auto forward_backward = [&] {
    const auto &logits = model.forward(space, x);
    const auto d = dlogits.matrix(x.extent(0), logits.extent(1));
    ce.forward_backward(space, logits, y, d);
    model.backward(space, d, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
  };
  // Warm-up: workspaces exist before the clock starts.
  forward_backward();
  product.apply(space, model, ce, x, y, v, hv);
  space.fence();
  double fb_s = 0, product_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    forward_backward();
    space.fence();
    fb_s += seconds(t0);
    t0 = Clock::now();
    product.apply(space, model, ce, x, y, v, hv);
    space.fence();
    const double this_product_s = seconds(t0);
    product_s += this_product_s;
    state.SetIterationTime(this_product_s);
  }
  state.counters["forward_backward_ms"] = fb_s / double(state.iterations()) * 1e3;
  state.counters["product_ms"] = product_s / double(state.iterations()) * 1e3;
  state.counters["ratio"] = product_s / fb_s;
}

} // namespace

BENCHMARK(BM_CurvatureProduct)
    ->ArgNames({"model", "gauss_newton"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
