#include "test_helpers.hpp"

#include <kat/core/allocation_tracker.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/dropout.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/residual.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <catch2/catch.hpp>

namespace test_sequential {

using namespace kat;
using namespace kat::test;

TEST_CASE("sequential: whole-model gradient equals finite differences", "[sequential][gradcheck]") {
  const Space space;
  nn::Sequential<double, Mem> model(FeatureShape{1, 2, 3});
  model.add<nn::Flatten>();
  model.add<nn::Dense>(6, 5);
  model.add<nn::Tanh>();
  model.add<nn::Dense>(5, 4);
  model.add<nn::Sigmoid>();
  model.add<nn::Dense>(4, 3);
  model.compile(space, 3);
  REQUIRE(model.parameter_count() == 5 * 7 + 4 * 6 + 3 * 5);

  auto x = random_matrix<double>(4, 6, 8);
  auto labels = labels_of({2, 0, 1, 2});
  nn::SoftmaxCrossEntropy<double, Mem> ce;
  Matrix<double, Mem> dlogits("dlogits", 4, 3);
  auto loss = [&] { return ce.forward(space, model.forward(space, x), labels); };

  model.zero_grad(space);
  ce.forward_backward(space, model.forward(space, x), labels, dlogits);
  model.backward(space, dlogits);
  const auto num = numeric_gradient(model.parameters(), loss);
  CHECK(max_rel_error(model.gradients(), num) < 1e-7);

  SECTION("backward accumulates; zero_grad resets") {
    ce.forward_backward(space, model.forward(space, x), labels, dlogits);
    model.backward(space, dlogits);
    auto g2 = to_host(model.gradients());
    for (std::size_t k = 0; k < num.size(); ++k)
      REQUIRE(g2(k) == Approx(2 * num[k]).margin(1e-7));
    model.zero_grad(space);
    auto g0 = to_host(model.gradients());
    for (std::size_t k = 0; k < num.size(); ++k)
      REQUIRE(g0(k) == 0.0);
  }
}

TEST_CASE("sequential: no allocation once the largest batch has been seen", "[sequential]") {
  const Space space;
  nn::Sequential<float, Mem> model(FeatureShape{10});
  model.add<nn::Dense>(10, 8);
  model.add<nn::ReLU>();
  model.add<nn::Dropout>(0.5, 1);
  model.add<nn::Dense>(8, 3);
  model.compile(space, 1);
  auto step = [&](std::size_t n) {
    auto x = random_matrix<float>(n, 10, n);
    Matrix<float, Mem> dy("dy", n, 3);
    model.forward(space, x);
    model.backward(space, dy);
  };
  step(32);
  const auto after_first = model.workspace_allocations();
  CHECK(after_first > 0);
  for (int i = 0; i < 3; ++i)
    step(32);
  step(7); // a last, partial batch reuses the same memory
  step(32);
  CHECK(model.workspace_allocations() == after_first);
}

TEST_CASE("sequential: train/eval reach every layer", "[sequential]") {
  nn::Sequential<float, Mem> model(FeatureShape{4});
  auto &drop = model.add<nn::Dropout>(0.5, 1);
  model.compile(Space(), 0);
  model.eval();
  CHECK_FALSE(drop.training());
  model.train();
  CHECK(drop.training());
}

TEST_CASE("sequential: errors name the layer and the shapes", "[sequential][errors]") {
  nn::Sequential<float, Mem> model(FeatureShape{1, 28, 28});
  model.add<nn::Flatten>();
  CHECK_THROWS_WITH(model.add<nn::Dense>(100, 10),
                    Catch::Contains("layer 1 (Dense) cannot take input shape (784, 1, 1)"));
  Matrix<float, Mem> x("x", 2, 784);
  CHECK_THROWS_WITH(model.forward(Space(), x), Catch::Contains("call compile() first"));
  model.add<nn::Dense>(784, 10);
  model.compile(Space(), 0);
  CHECK_THROWS_AS(model.compile(Space(), 0), Error);
  CHECK_THROWS_AS(model.add<nn::ReLU>(), Error);
  Matrix<float, Mem> bad("bad", 2, 783);
  CHECK_THROWS_WITH(model.forward(Space(), bad), Catch::Contains("x columns must be 784, got 783"));
  CHECK(model.summary().find("total 7850 parameters") != std::string::npos);
}

TEST_CASE("sequential: a steady-state training step allocates nothing", "[sequential][memory]") {
  // Counted through the Kokkos Tools allocation callbacks: layers, loss, optimizer, all.
  const Space space;
  nn::Sequential<float, Mem> model(FeatureShape{12});
  model.add<nn::Dense>(12, 16);
  model.add<nn::ReLU>();
  model.add<nn::Dropout>(0.2, 3);
  model.add<nn::Dense>(16, 4);
  model.compile(space, 1);
  nn::SoftmaxCrossEntropy<float, Mem> ce;
  Matrix<float, Mem> dlogits_buf("dlogits", 32, 4);
  auto x_full = random_matrix<float>(32, 12, 1);
  auto labels = labels_of(std::vector<std::int32_t>(32, 1));
  auto step = [&](std::size_t n) {
    Matrix<float, Mem> x(x_full.data(), n, 12);
    Matrix<float, Mem> dlogits(dlogits_buf.data(), n, 4);
    Vector<std::int32_t, Mem> y(labels.data(), n);
    ce.forward_backward(space, model.forward(space, x), y, dlogits);
    model.backward(space, dlogits, nn::Sequential<float, Mem>::Gradients::overwrite);
  };
  AllocationTracker tracker;
  step(32);
  CHECK(tracker.allocations() > 0); // the first step sizes the workspaces
  tracker.reset();
  for (int i = 0; i < 3; ++i)
    step(32);
  step(9); // a partial last batch
  step(32);
  space.fence();
  CHECK(tracker.allocations() == 0);
  CHECK(tracker.deallocations() == 0);
}

TEST_CASE("sequential: Flatten passes its input through without a copy", "[sequential][flatten]") {
  const Space space;
  nn::Sequential<double, Mem> with(FeatureShape{1, 2, 3}), without(FeatureShape{6});
  with.add<nn::Flatten>();
  with.add<nn::Dense>(6, 5);
  with.add<nn::Flatten>();
  with.add<nn::Tanh>();
  with.add<nn::Dense>(5, 3);
  with.add<nn::Flatten>();
  without.add<nn::Dense>(6, 5);
  without.add<nn::Tanh>();
  without.add<nn::Dense>(5, 3);
  with.compile(space, 3);
  without.compile(space, 3);
  REQUIRE(with.parameter_count() == without.parameter_count());
  Kokkos::deep_copy(without.parameters(), with.parameters());
  auto x = random_matrix<double>(4, 6, 9);
  const auto y_a = to_host(with.forward(space, x)), y_b = to_host(without.forward(space, x));
  auto dy = random_matrix<double>(4, 3, 10);
  with.backward(space, dy, nn::Sequential<double, Mem>::Gradients::overwrite);
  without.backward(space, dy, nn::Sequential<double, Mem>::Gradients::overwrite);
  for (std::size_t j = 0; j < 3; ++j)
    for (std::size_t i = 0; i < 4; ++i)
      REQUIRE(y_a(i, j) == y_b(i, j));
  const auto g_a = to_host(with.gradients()), g_b = to_host(without.gradients());
  for (std::size_t k = 0; k < g_a.extent(0); ++k)
    REQUIRE(g_a(k) == g_b(k));
}

TEST_CASE("sequential: the backward hook sees every layer in reverse order", "[sequential][hook]") {
  const Space space;
  nn::Sequential<double, Mem> model(FeatureShape{1, 2, 3});
  model.add<nn::Flatten>();
  model.add<nn::Dense>(6, 5);
  model.add<nn::Tanh>();
  model.add<nn::Dense>(5, 3);
  model.compile(space, 4);
  auto x = random_matrix<double>(4, 6, 1);
  auto dy = random_matrix<double>(4, 3, 2);

  model.forward(space, x);
  model.backward(space, dy, nn::Sequential<double, Mem>::Gradients::overwrite);
  const auto reference = to_host(model.gradients());

  CHECK_FALSE(model.has_backward_hook());
  std::vector<std::size_t> calls;
  const auto &blocks = model.buffer().blocks();
  REQUIRE(blocks.size() == 4);
  model.set_backward_hook([&](std::size_t layer) {
    calls.push_back(layer);
    space.fence();
    // The block of a layer whose hook has run is final.
    const auto g = to_host(model.gradients());
    for (std::size_t k = blocks[layer].offset; k < blocks[layer].offset + blocks[layer].size; ++k)
      REQUIRE(g(k) == reference(k));
  });
  CHECK(model.has_backward_hook());
  model.zero_grad(space);
  model.forward(space, x);
  model.backward(space, dy);
  CHECK(calls == std::vector<std::size_t>{3, 2, 1, 0});

  model.clear_backward_hook();
  CHECK_FALSE(model.has_backward_hook());
  calls.clear();
  model.forward(space, x);
  model.backward(space, dy);
  CHECK(calls.empty());
}

TEST_CASE("sequential: parameter specs name every tensor where the layers' views are",
          "[sequential][specs]") {
  using namespace kat::nn;
  Sequential<float, Mem> m(FeatureShape{2, 4, 4});
  auto &conv = m.add<Conv2d>(2, 3, 3, 1, 1);
  m.add<BatchNorm>(3);
  auto block = std::make_unique<Residual<float, Mem>>(FeatureShape{3, 4, 4});
  auto &inner = block->add<Conv2d>(3, 3, 1, 1, 0, 1, /*bias=*/false);
  block->add<ReLU>();
  m.add(std::move(block));
  m.add<Flatten>();
  auto &head = m.add<Dense>(48, 5);
  m.compile(Space(), 1);

  const auto specs = m.parameter_specs();
  std::vector<std::string> names;
  for (const auto &s : specs)
    names.push_back(s.name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                          "2.body.0.weight", "4.weight", "4.bias"});
  // Contiguous, in order, covering the flat buffer exactly.
  std::size_t next = 0;
  for (const auto &s : specs) {
    INFO(s.name);
    CHECK(s.offset == next);
    next += s.size();
  }
  CHECK(next == m.parameter_count());
  // Each spec's offset and shape are those of the view the layer computes with.
  const float *base = m.parameters().data();
  const auto at = [&](std::size_t k) { return base + specs[k].offset; };
  CHECK(at(0) == conv.weight().data());
  CHECK(specs[0].shape == std::vector<std::size_t>{3, 18});
  CHECK(at(1) == conv.bias().data());
  CHECK(specs[2].role == ParameterRole::weight);
  CHECK(specs[3].role == ParameterRole::bias);
  CHECK(at(4) == inner.weight().data());
  CHECK(specs[4].shape == std::vector<std::size_t>{3, 3});
  CHECK(at(5) == head.weight().data());
  CHECK(specs[5].shape == std::vector<std::size_t>{5, 48});
  CHECK(at(6) == head.bias().data());
  CHECK(specs[6].role == ParameterRole::bias);
}

} // namespace test_sequential
