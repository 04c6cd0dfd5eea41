#include "layer_check.hpp"
#include "test_helpers.hpp"

#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/residual.hpp>
#include <kat/nn/sequential.hpp>

#include <catch2/catch.hpp>

#include <memory>

namespace test_residual {

using namespace kat;
using namespace kat::test;

TEST_CASE("residual: identity shortcut adds the input", "[residual]") {
  const Space space;
  nn::Residual<double, Mem> block(FeatureShape{3});
  auto &dense = block.add<nn::Dense>(3, 3);
  REQUIRE(block.output_shape(FeatureShape{3}) == FeatureShape{3});
  auto buffer = bind_fresh<double>(block, 4);
  auto x = random_matrix<double>(5, 3, 1);
  Matrix<double, Mem> y("y", 5, 3);
  block.forward(space, x, y);
  auto xh = to_host(x), yh = to_host(y);
  auto wh = to_host(dense.weight());
  auto bh = to_host(dense.bias());
  for (int i = 0; i < 5; ++i)
    for (int o = 0; o < 3; ++o) {
      double ref = bh(o) + xh(i, o);
      for (int k = 0; k < 3; ++k)
        ref += wh(o, k) * xh(i, k);
      CHECK(yh(i, o) == Approx(ref).epsilon(1e-13));
    }
}

TEST_CASE("residual: finite-difference gradients in double", "[residual][gradcheck]") {
  SECTION("identity shortcut") {
    nn::Residual<double, Mem> block(FeatureShape{4});
    block.add<nn::Dense>(4, 6);
    block.add<nn::Tanh>();
    block.add<nn::Dense>(6, 4);
    check_layer_gradients(block, FeatureShape{4}, 3, 11);
  }
  SECTION("projection shortcut") {
    nn::Residual<double, Mem> block(FeatureShape{4});
    block.add<nn::Dense>(4, 5);
    block.add<nn::Sigmoid>();
    block.add_shortcut<nn::Dense>(4, 5, false);
    check_layer_gradients(block, FeatureShape{4}, 3, 12);
  }
  SECTION("pass-through Flatten first and last in a chain") {
    // The chains alias Flatten's input and output; as the first layer of a chain it still
    // writes the container's dx.
    nn::Residual<double, Mem> block(FeatureShape{4});
    block.add<nn::Flatten>();
    block.add<nn::Dense>(4, 4);
    block.add<nn::Tanh>();
    block.add<nn::Flatten>();
    block.add_shortcut<nn::Flatten>();
    check_layer_gradients(block, FeatureShape{4}, 3, 14);
  }
  SECTION("overwrite mode") {
    nn::Residual<double, Mem> block(FeatureShape{3});
    block.add<nn::Dense>(3, 2);
    block.add_shortcut<nn::Dense>(3, 2);
    block.accumulate_gradients(false);
    check_layer_gradients(block, FeatureShape{3}, 4, 13);
  }
}

TEST_CASE("residual: inside a Sequential with its layers reachable", "[residual][sequential]") {
  const Space space;
  nn::Sequential<double, Mem> model(FeatureShape{4});
  model.add<nn::Dense>(4, 4);
  auto block = std::make_unique<nn::Residual<double, Mem>>(FeatureShape{4});
  block->add<nn::Dense>(4, 4);
  block->add<nn::ReLU>();
  block->add<nn::Dense>(4, 4);
  auto *raw = block.get();
  model.add(std::move(block));
  model.add<nn::Dense>(4, 2);
  model.compile(space, 1);
  CHECK(model.parameter_count() == 20 + 20 + 20 + 10);
  CHECK(raw->sublayers().size() == 3);
  auto x = random_matrix<double>(6, 4, 2);
  auto r = random_matrix<double>(6, 2, 3);
  auto loss = [&] { return weighted_sum(model.forward(space, x), r); };
  loss();
  model.zero_grad(space);
  model.backward(space, r);
  CHECK(max_rel_error(model.gradients(), numeric_gradient(model.parameters(), loss)) < 1e-7);
}

TEST_CASE("residual: shape errors say what to fix", "[residual][errors]") {
  nn::Residual<float, Mem> block(FeatureShape{4});
  CHECK_THROWS_WITH(block.output_shape(FeatureShape{4}), Catch::Contains("body has no layers"));
  block.add<nn::Dense>(4, 3);
  CHECK_THROWS_WITH(block.output_shape(FeatureShape{4}), Catch::Contains("add a projection"));
  CHECK_THROWS_WITH(block.output_shape(FeatureShape{5}),
                    Catch::Contains("input shape must be (4, 1, 1), got (5, 1, 1)"));
}

} // namespace test_residual
