// A ReLU fused into the layer before it (BatchNorm's normalization pass, Residual's addition)
// against the same network with the ReLU kept apart: an identity Dropout(0) between the two
// stops the fusion (and keeps KAT's layout around it). In double on KAT's kernels, and in
// float on oneDNN's blocked path where this build has it.
#include "test_helpers.hpp"

#include <kat/core/dnn.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/dropout.hpp>
#include <kat/nn/global_avg_pool2d.hpp>
#include <kat/nn/residual.hpp>
#include <kat/nn/sequential.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <memory>

namespace test_fusion {

using namespace kat;
using namespace kat::test;

namespace {

// conv3x3 16-16, BN, ReLU, [conv3x3, BN] + identity, ReLU, global average pool, dense 16-3;
// with `barrier`, a Dropout(0) before each ReLU.
template <class Scalar> nn::Sequential<Scalar, Mem> network(bool barrier) {
  const FeatureShape in{16, 6, 5};
  nn::Sequential<Scalar, Mem> model(in);
  model.template add<nn::Conv2d>(16, 16, 3, 1, 1, 1, false);
  model.template add<nn::BatchNorm2d>(16);
  if (barrier) {
    model.template add<nn::Dropout>(0.0);
  }
  model.template add<nn::ReLU>();
  auto block = std::make_unique<nn::Residual<Scalar, Mem>>(model.output_shape());
  block->template add<nn::Conv2d>(16, 16, 3, 1, 1, 1, false);
  block->template add<nn::BatchNorm2d>(16);
  model.add(std::move(block));
  if (barrier) {
    model.template add<nn::Dropout>(0.0);
  }
  model.template add<nn::ReLU>();
  model.template add<nn::GlobalAvgPool2d>();
  model.template add<nn::Dense>(16, 3);
  return model;
}

template <class Scalar> void check_fused_against_apart(double tolerance) {
  auto fused = network<Scalar>(false);
  auto apart = network<Scalar>(true);
  fused.compile(Space(), 4);
  apart.compile(Space(), 4);
  Kokkos::deep_copy(apart.parameters(), fused.parameters());
  const std::size_t n = 6;
  auto x = random_matrix<Scalar>(n, fused.input_shape().size(), 2);
  auto dy = random_matrix<Scalar>(n, 3, 3);
  for (int step = 0; step < 2; ++step) { // the second step on cached plans and workspaces
    const auto &y1 = fused.forward(Space(), x);
    const auto &y2 = apart.forward(Space(), x);
    CHECK(max_diff_over_scale(y1, y2) < tolerance);
    fused.zero_grad(Space());
    apart.zero_grad(Space());
    fused.backward(Space(), dy);
    apart.backward(Space(), dy);
    CHECK(max_diff_over_scale(fused.gradients(), apart.gradients()) < tolerance);
  }
  CHECK(fused.layer(1).input_layout() == (dnn_available<Space, Scalar>()
                                              ? kat::detail::dnn_f32_layout()
                                              : ActivationLayout::features));
  CHECK(apart.layer(1).input_layout() == ActivationLayout::features);
  CHECK(fused.layer(1).fuses_relu()); // BatchNorm
  CHECK(fused.layer(3).fuses_relu()); // Residual
  CHECK_FALSE(apart.layer(1).fuses_relu());
  CHECK_FALSE(apart.layer(4).fuses_relu());
  // The block's own BatchNorm is followed by nothing inside the block.
  CHECK_FALSE(fused.layer(3).sublayers()[1]->fuses_relu());
  auto *bn1 = dynamic_cast<nn::BatchNorm<Scalar, Mem> *>(&fused.layer(1));
  auto *bn2 = dynamic_cast<nn::BatchNorm<Scalar, Mem> *>(&apart.layer(1));
  REQUIRE(bn1 != nullptr);
  REQUIRE(bn2 != nullptr);
  CHECK(max_diff_over_scale(bn1->running_mean(), bn2->running_mean()) < tolerance);
  CHECK(max_diff_over_scale(bn1->running_var(), bn2->running_var()) < tolerance);
  // Evaluation fuses nothing (the R-operator runs there) and still agrees.
  fused.eval();
  apart.eval();
  const auto &e1 = fused.forward(Space(), x);
  const auto &e2 = apart.forward(Space(), x);
  CHECK(max_diff_over_scale(e1, e2) < tolerance);
  CHECK_FALSE(fused.layer(1).fuses_relu());
  CHECK_FALSE(fused.layer(3).fuses_relu());
}

// conv3x3 16-16 with bias, ReLU, conv3x3 16-16, global average pool, dense 16-3; with
// `barrier`, a Dropout(0) before the ReLU.
template <class Scalar> nn::Sequential<Scalar, Mem> conv_relu_network(bool barrier) {
  nn::Sequential<Scalar, Mem> model(FeatureShape{16, 6, 5});
  model.template add<nn::Conv2d>(16, 16, 3, 1, 1);
  if (barrier) {
    model.template add<nn::Dropout>(0.0);
  }
  model.template add<nn::ReLU>();
  model.template add<nn::Conv2d>(16, 16, 3, 1, 1);
  model.template add<nn::GlobalAvgPool2d>();
  model.template add<nn::Dense>(16, 3);
  return model;
}

} // namespace

TEST_CASE("fusion: ReLU fused into a oneDNN convolution equals the ReLU apart", "[fusion][dnn]") {
  auto fused = conv_relu_network<float>(false);
  auto apart = conv_relu_network<float>(true);
  fused.compile(Space(), 6);
  apart.compile(Space(), 6);
  Kokkos::deep_copy(apart.parameters(), fused.parameters());
  auto x = random_matrix<float>(4, fused.input_shape().size(), 7);
  auto dy = random_matrix<float>(4, 3, 8);
  for (int step = 0; step < 2; ++step) {
    const auto &y1 = fused.forward(Space(), x);
    const auto &y2 = apart.forward(Space(), x);
    CHECK(max_diff_over_scale(y1, y2) < 1e-5);
    fused.zero_grad(Space());
    apart.zero_grad(Space());
    fused.backward(Space(), dy);
    apart.backward(Space(), dy);
    CHECK(max_diff_over_scale(fused.gradients(), apart.gradients()) < 1e-5);
  }
  // oneDNN's eltwise post-op where this build has oneDNN; im2col (no fusion) elsewhere.
  CHECK(fused.layer(0).fuses_relu() == dnn_available<Space, float>());
  CHECK_FALSE(apart.layer(0).fuses_relu());
  // The R passes refuse a forward that fused, and a forward after binding a direction does
  // not fuse.
  if (dnn_available<Space, float>()) {
    CHECK_THROWS_WITH(fused.forward_r(Space()), Catch::Contains("applied the following ReLU"));
    fused.forward(Space(), x);
    CHECK_FALSE(fused.layer(0).fuses_relu());
  }
  // In double, im2col: nothing to fuse into.
  auto in_double = conv_relu_network<double>(false);
  in_double.compile(Space(), 6);
  in_double.forward(Space(), random_matrix<double>(2, in_double.input_shape().size(), 9));
  CHECK_FALSE(in_double.layer(0).fuses_relu());
}

TEST_CASE("fusion: ReLU fused into BatchNorm and Residual equals the ReLU apart in double",
          "[fusion]") {
  check_fused_against_apart<double>(1e-12);
}

TEST_CASE("fusion: ReLU fused into BatchNorm and Residual equals the ReLU apart in float",
          "[fusion][dnn]") {
  // With oneDNN the fused network runs in its blocked layout (oneDNN's batch normalization
  // with fuse_norm_relu) and the other in KAT's (its own kernels).
  check_fused_against_apart<float>(1e-4);
}

TEST_CASE("fusion: a layer refuses a ReLU it cannot fuse", "[fusion][errors]") {
  nn::Dense<float, Mem> dense(3, 2);
  CHECK_THROWS_MATCHES(dense.fuse_relu(true), ValueError,
                       Catch::Message("kat::nn::Dense::fuse_relu: the layer cannot apply a "
                                      "following ReLU in its current mode"));
  nn::BatchNorm<float, Mem> bn(4);
  bn.train(false);
  CHECK_THROWS_AS(bn.fuse_relu(true), ValueError);
  bn.train(true);
  bn.fuse_relu(true);
  CHECK(bn.fuses_relu());
}

} // namespace test_fusion
