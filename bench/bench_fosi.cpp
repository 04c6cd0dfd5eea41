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

// A FOSI step between refreshes (the two n x k products on each side of the base step) and
// one refresh (Lanczos, m = 4k Hessian-vector products), against a plain SGD step with
// momentum and a whole SGD training step (forward, backward, step) on a twin model.
// args: model (0 mlp, 1 cnn), k.
void BM_FOSIStep(benchmark::State &state) {
  const std::string name = state.range(0) == 0 ? "mlp" : "cnn";
  const auto k = static_cast<std::size_t>(state.range(1));
  const Space space;
  const auto train = training_data();
  kat::data::DataLoader<float, Mem> loader(train, 128, true, 0);
  auto model = kat::nn::models::by_name<float, Mem>(name, train.shape, train.classes);
  model.compile(space, 0);
  auto twin = kat::nn::models::by_name<float, Mem>(name, train.shape, train.classes);
  twin.compile(space, 0);
  const std::size_t n = model.parameter_count();
  const kat::nn::SoftmaxCrossEntropy<float, Mem> ce;
  kat::Workspace<float, Mem> dlogits("bench::dlogits");
  M x;
  kat::Vector<std::int32_t, Mem> y;
  loader.start_epoch(0);
  loader.next(space, x, y);
  M xc("xc", x.extent(0), x.extent(1));
  kat::Vector<std::int32_t, Mem> yc("yc", y.extent(0));
  Kokkos::deep_copy(xc, x);
  Kokkos::deep_copy(yc, y);
  const kat::Vector<const std::int32_t, Mem> labels = yc;
  kat::optim::SGD<float, Mem>::Options so;
  so.lr = 0.05;
  so.momentum = 0.9;
  kat::optim::FOSI<float, Mem>::Options fo;
  fo.k = k;
  fo.warmup_w = 1;
  fo.num_iters_to_approx_eigs = 1000000; // one refresh, on the first step
  kat::optim::FOSI<float, Mem> fosi(n, std::make_unique<kat::optim::SGD<float, Mem>>(n, so),
                                    kat::nn::curvature_operator(model, ce, xc, labels), fo);
  kat::optim::SGD<float, Mem> sgd(n, so);
  auto gradient = [&](kat::nn::Sequential<float, Mem> &m) {
    const auto &logits = m.forward(space, x);
    const auto d = dlogits.matrix(x.extent(0), logits.extent(1));
    ce.forward_backward(space, logits, y, d);
    m.backward(space, d, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
  };
  gradient(model);
  auto t0 = Clock::now();
  fosi.step(space, model.parameters(), model.gradients()); // the refresh
  space.fence();
  const double refresh_step_s = seconds(t0);
  const double lanczos_s = fosi.last_lanczos_seconds();
  gradient(twin);
  sgd.step(space, twin.parameters(), twin.gradients());
  double fosi_s = 0, sgd_s = 0, train_s = 0;
  for (auto _ : state) {
    gradient(model);
    space.fence();
    t0 = Clock::now();
    fosi.step(space, model.parameters(), model.gradients());
    space.fence();
    const double this_fosi_s = seconds(t0);
    fosi_s += this_fosi_s;
    space.fence();
    const auto t_train = Clock::now();
    gradient(twin);
    space.fence();
    t0 = Clock::now();
    sgd.step(space, twin.parameters(), twin.gradients());
    space.fence();
    sgd_s += seconds(t0);
    train_s += seconds(t_train);
    state.SetIterationTime(this_fosi_s);
  }
  const double it = double(state.iterations());
  state.counters["fosi_step_ms"] = fosi_s / it * 1e3;
  state.counters["sgd_step_ms"] = sgd_s / it * 1e3;
  state.counters["overhead_ms"] = (fosi_s - sgd_s) / it * 1e3;
  state.counters["sgd_train_step_ms"] = train_s / it * 1e3; // forward, backward, SGD step
  state.counters["refresh_s"] = refresh_step_s;
  state.counters["lanczos_s"] = lanczos_s;
  state.counters["hvps"] = double(fosi.last_lanczos_iterations());
}

} // namespace

BENCHMARK(BM_FOSIStep)
    ->ArgNames({"model", "k"})
    ->Args({0, 10})
    ->Args({1, 10})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_CurvatureProduct)
    ->ArgNames({"model", "gauss_newton"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
