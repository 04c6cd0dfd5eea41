// K-FAC step cost against plain SGD on the Fashion-MNIST models (issue: an average K-FAC step
// at factor_update_steps = 10, inv_update_steps = 100 costs at most 1.5x an SGD step on the
// MLP), with the K-FAC time split into factor updates, decompositions and preconditioning.
//
// Each iteration runs a block of training steps with K-FAC + SGD and the same number of plain
// SGD steps on a twin model, alternately, so the ratio comes from one run.
#include "common.hpp"

#include <benchmark/benchmark.h>

#include <string>

namespace {

using namespace kat::bench;

struct Trainer {
  kat::nn::Sequential<float, Mem> model;
  kat::optim::SGD<float, Mem> sgd;
  kat::nn::SoftmaxCrossEntropy<float, Mem> ce;
  kat::Workspace<float, Mem> dlogits{"bench::dlogits"};

  static kat::optim::SGD<float, Mem>::Options sgd_options() {
    kat::optim::SGD<float, Mem>::Options o;
    o.lr = 0.05;
    o.momentum = 0.9;
    return o;
  }
  Trainer(const std::string &name, const kat::data::Dataset &train)
      : model(kat::nn::models::by_name<float, Mem>(name, train.shape, train.classes)),
        sgd((model.compile(Space(), 0), model.parameter_count()), sgd_options()) {}

  template <class Precondition>
  void step(const Space &space, const M &x, const kat::Vector<std::int32_t, Mem> &y,
            const Precondition &precondition) {
    const auto &logits = model.forward(space, x);
    const auto d = dlogits.matrix(x.extent(0), logits.extent(1));
    ce.forward_backward(space, logits, y, d);
    model.backward(space, d, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
    precondition();
    sgd.step(space, model.parameters(), model.gradients());
  }
};

// args: model (0 mlp, 1 cnn), compute method (0 eigen, 1 inverse), steps per block.
// Factored: KFACOptions::factored_preconditioning (P from the batch's a and g where cheaper).
template <class InverseScalar, bool Factored = false> void BM_KFACStep(benchmark::State &state) {
  const std::string name = state.range(0) == 0 ? "mlp" : "cnn";
  const auto method = state.range(1) == 0 ? kat::precond::ComputeMethod::eigen
                                          : kat::precond::ComputeMethod::inverse;
  const std::size_t block = static_cast<std::size_t>(state.range(2));
  const Space space;
  const auto train = training_data();
  kat::data::DataLoader<float, Mem> loader(train, 128, true, 0);
  Trainer with(name, train), without(name, train);
  typename kat::precond::KFAC<float, Mem, InverseScalar>::Options o;
  o.factor_update_steps = std::int64_t(10);
  o.inv_update_steps = std::int64_t(100);
  o.damping = 0.003;
  o.lr = 0.05;
  o.compute_method = method;
  o.factored_preconditioning = Factored;
  kat::precond::KFAC<float, Mem, InverseScalar> kfac(o);
  kfac.register_model(with.model);
  M x;
  kat::Vector<std::int32_t, Mem> y;
  std::size_t epoch = 0;
  auto next = [&] {
    if (!loader.next(space, x, y)) {
      loader.start_epoch(++epoch);
      loader.next(space, x, y);
    }
  };
  loader.start_epoch(0);
  // Warm-up: one full inv_update_steps cycle, so workspaces exist and the clock starts on a
  // decomposition step (each block of 100 covers exactly one).
  for (int s = 0; s < 100; ++s) {
    next();
    with.step(space, x, y, [&] { kfac.step(space); });
    without.step(space, x, y, [] {});
  }
  space.fence();
  kat::RegionTimer regions;
  double kfac_s = 0, sgd_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    for (std::size_t s = 0; s < block; ++s) {
      next();
      with.step(space, x, y, [&] { kfac.step(space); });
    }
    space.fence();
    const double this_kfac = seconds(t0);
    kfac_s += this_kfac;
    t0 = Clock::now();
    for (std::size_t s = 0; s < block; ++s) {
      next();
      without.step(space, x, y, [] {});
    }
    space.fence();
    sgd_s += seconds(t0);
    state.SetIterationTime(this_kfac);
  }
  const double steps = double(block) * double(state.iterations());
  state.counters["kfac_step_ms"] = 1e3 * kfac_s / steps;
  state.counters["sgd_step_ms"] = 1e3 * sgd_s / steps;
  state.counters["ratio"] = kfac_s / sgd_s;
  state.counters["factors_ms"] =
      1e3 * regions.seconds("kat::precond::KFAC::update_factors") / steps;
  state.counters["decompose_ms"] = 1e3 * regions.seconds("kat::precond::KFAC::decompose") / steps;
  state.counters["precondition_ms"] =
      1e3 * regions.seconds("kat::precond::KFAC::precondition") / steps;
  state.counters["check_ms"] = 1e3 * regions.seconds("kat::precond::KFAC::factored_check") / steps;
  double factored = 0;
  for (std::size_t i = 0; i < kfac.size(); ++i)
    factored += kfac.factored(i) ? 1 : 0;
  state.counters["factored_layers"] = factored;
}

// BM_KFACStep/inverse_precision:<precision> for the MLP (both paths, 5 blocks) and the CNN
// (inverse path only: its 3137 x 3137 dense-layer factor makes eigendecompositions take
// seconds; one block of 100 steps, about a minute).
template <class InverseScalar> int register_kfac_steps(const char *precision) {
  const std::string name = std::string("BM_KFACStep/inverse_precision:") + precision;
  for (const bool cnn : {false, true}) {
    auto *b = benchmark::RegisterBenchmark(name.c_str(), BM_KFACStep<InverseScalar>)
                  ->ArgNames({"model", "inverse", "steps"})
                  ->UseManualTime()
                  ->Unit(benchmark::kMillisecond);
    if (cnn) {
      b->Args({1, 1, 100})->Iterations(1);
    } else {
      b->Args({0, 0, 100})->Args({0, 1, 100})->Iterations(5);
    }
  }
  return 0;
}
[[maybe_unused]] const int registered =
    register_kfac_steps<double>("double") + register_kfac_steps<float>("float");

// BM_KFACStep/inverse_precision:<precision>/factored: the same MLP runs with
// factored_preconditioning (layers 784->256 and 256->256 factored at batch 128, the head
// direct), to compare with the lines above in the same run.
template <class InverseScalar> int register_factored_kfac_steps(const char *precision) {
  const std::string name = std::string("BM_KFACStep/inverse_precision:") + precision + "/factored";
  benchmark::RegisterBenchmark(name.c_str(), BM_KFACStep<InverseScalar, true>)
      ->ArgNames({"model", "inverse", "steps"})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Args({0, 0, 100})
      ->Args({0, 1, 100})
      ->Iterations(5);
  return 0;
}
[[maybe_unused]] const int registered_factored =
    register_factored_kfac_steps<double>("double") + register_factored_kfac_steps<float>("float");

} // namespace
