// A short end-to-end run on real data: the pieces together must learn, reproducibly.
#include "test_helpers.hpp"

#include <kat/data/data_loader.hpp>
#include <kat/data/dataset.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/metrics.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/adam.hpp>
#include <kat/optim/sgd.hpp>

#include <catch2/catch.hpp>

#include <memory>

using namespace kat;
using namespace kat::test;

namespace {

struct Result {
  double accuracy;
  std::vector<float> parameters;
};

// Trains the 784-256-256-10 MLP on the first 2,000 training images for 10 epochs and
// returns its accuracy on the full 10,000-image test split.
template <class Optimizer>
Result train_subset(const typename Optimizer::Options &options, std::uint64_t seed) {
  const Space space;
  const auto train = data::load_fashion_mnist(KAT_TEST_DATA_DIR, data::Split::train).take(2000);
  const auto test = data::load_fashion_mnist(KAT_TEST_DATA_DIR, data::Split::test);
  data::DataLoader<float, Mem> train_loader(train, 64, true, seed);
  data::DataLoader<float, Mem> test_loader(test, 1000, false, 0);

  nn::Sequential<float, Mem> model(train.shape);
  model.add<nn::Flatten>();
  model.add<nn::Dense>(784, 256);
  model.add<nn::ReLU>();
  model.add<nn::Dense>(256, 256);
  model.add<nn::ReLU>();
  model.add<nn::Dense>(256, 10);
  model.compile(space, seed);
  Optimizer opt(model.parameter_count(), options);
  nn::SoftmaxCrossEntropy<float, Mem> ce;
  Matrix<float, Mem> x, dlogits_buf("dlogits", 64, 10);
  Vector<std::int32_t, Mem> y;
  for (std::size_t epoch = 0; epoch < 10; ++epoch) {
    train_loader.start_epoch(epoch);
    while (train_loader.next(space, x, y)) {
      const auto &logits = model.forward(space, x);
      Matrix<float, Mem> dlogits(dlogits_buf.data(), x.extent(0), 10);
      ce.forward_backward(space, logits, y, dlogits);
      model.zero_grad(space);
      model.backward(space, dlogits);
      opt.step(space, model.parameters(), model.gradients());
    }
  }
  model.eval();
  std::size_t correct = 0;
  while (test_loader.next(space, x, y)) {
    correct +=
        nn::count_correct(space, model.forward(space, x), Vector<const std::int32_t, Mem>(y));
  }
  auto p = to_host(model.parameters());
  return {double(correct) / double(test.size()),
          std::vector<float>(p.data(), p.data() + p.extent(0))};
}

} // namespace

TEST_CASE("training: MLP on a 2,000-image Fashion-MNIST subset", "[training][data]") {
  SECTION("SGD with momentum reaches 75% test accuracy, bit-reproducibly") {
    optim::SGD<float, Mem>::Options o;
    o.lr = 0.02;
    o.momentum = 0.9;
    const auto a = train_subset<optim::SGD<float, Mem>>(o, 1);
    // Seeds 0-2 give 78.8-79.9%; 75% leaves room for BLAS differences between machines.
    CHECK(a.accuracy >= 0.75);
    const auto b = train_subset<optim::SGD<float, Mem>>(o, 1);
    CHECK(a.parameters == b.parameters);
  }
  SECTION("Adam reaches 77% test accuracy") {
    optim::Adam<float, Mem>::Options o; // lr 1e-3
    // Seeds 0-2 give 80.0-81.8%.
    CHECK(train_subset<optim::Adam<float, Mem>>(o, 2).accuracy >= 0.77);
  }
}
