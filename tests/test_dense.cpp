#include "layer_check.hpp"
#include "r_operator_check.hpp"
#include "test_helpers.hpp"

#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/dense.hpp>

#include <catch2/catch.hpp>

#include <cmath>

namespace test_dense {

using namespace kat;
using namespace kat::test;

TEST_CASE("dense: forward equals a nested-loop reference", "[dense]") {
  nn::Dense<double, Mem> layer(5, 3);
  auto buffer = bind_fresh<double>(layer, 7);
  auto x = random_matrix<double>(4, 5, 11);
  Matrix<double, Mem> y("y", 4, 3);
  layer.forward(Space(), x, y);
  auto xh = to_host(x);
  auto yh = to_host(y);
  auto wh = to_host(layer.weight());
  auto bh = to_host(layer.bias());
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 3; ++o) {
      double ref = bh(o);
      for (int k = 0; k < 5; ++k)
        ref += xh(i, k) * wh(o, k);
      CHECK(yh(i, o) == Approx(ref).epsilon(1e-13));
    }
}

TEST_CASE("dense: finite-difference gradients in double", "[dense][gradcheck]") {
  SECTION("with bias") {
    nn::Dense<double, Mem> layer(6, 4);
    check_layer_gradients(layer, FeatureShape{6}, 5, 21);
  }
  SECTION("without bias") {
    nn::Dense<double, Mem> layer(3, 7, false);
    check_layer_gradients(layer, FeatureShape{3}, 2, 22);
  }
  SECTION("while recording curvature (single fused GEMM path)") {
    nn::Dense<double, Mem> layer(4, 3);
    layer.record_curvature(true);
    check_layer_gradients(layer, FeatureShape{4}, 6, 23);
  }
  SECTION("batch of one") {
    nn::Dense<double, Mem> layer(2, 2);
    check_layer_gradients(layer, FeatureShape{2}, 1, 24);
  }
}

TEST_CASE("dense: records a = x with a ones column and g = dL/dy for K-FAC", "[dense][curvature]") {
  nn::Dense<double, Mem> layer(3, 2);
  auto buffer = bind_fresh<double>(layer, 3);
  layer.record_curvature(true);
  auto x = random_matrix<double>(4, 3, 5);
  auto dy = random_matrix<double>(4, 2, 6);
  Matrix<double, Mem> y("y", 4, 2);
  layer.forward(Space(), x, y);
  layer.backward(Space(), dy, Matrix<double, Mem>());
  const auto rec = layer.curvature();
  REQUIRE(rec.a.extent(0) == 4);
  REQUIRE(rec.a.extent(1) == 4);
  auto ah = to_host(rec.a);
  auto xh = to_host(x);
  for (int i = 0; i < 4; ++i) {
    for (int k = 0; k < 3; ++k)
      CHECK(ah(i, k) == xh(i, k));
    CHECK(ah(i, 3) == 1.0);
  }
  auto gh = to_host(rec.g);
  auto dyh = to_host(dy);
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 2; ++o)
      CHECK(gh(i, o) == dyh(i, o));
  // [W b] and its gradient are the flat buffer's memory, in that order.
  CHECK(rec.weight.data() == buffer.parameters().data());
  CHECK(rec.weight.extent(1) == 4);
  CHECK(rec.weight_gradient.data() == buffer.gradients().data());
}

TEST_CASE("dense: PyTorch-default initialization", "[dense][init]") {
  const std::size_t in = 400, out = 300;
  nn::Dense<float, Mem> layer(in, out);
  auto buffer = bind_fresh<float>(layer, 99);
  auto w = to_host(buffer.parameters());
  // U(-b, b): mean 0, variance b^2/3; 120,300 draws put both well inside these bounds.
  check_uniform(buffer.parameters(), 1.0 / std::sqrt(double(in)), 0.01, 0.02);

  SECTION("same seed, same parameters; different seed, different parameters") {
    nn::Dense<float, Mem> again(in, out), other(in, out);
    auto b2 = bind_fresh<float>(again, 99);
    auto b3 = bind_fresh<float>(other, 100);
    auto w2 = to_host(b2.parameters());
    auto w3 = to_host(b3.parameters());
    std::size_t same = 0;
    for (std::size_t k = 0; k < w.extent(0); ++k) {
      REQUIRE(w2(k) == w(k));
      same += w3(k) == w(k);
    }
    CHECK(same < 10);
  }
}

TEST_CASE("dense: bad arguments name the argument and values", "[dense][errors]") {
  CHECK_THROWS_WITH((nn::Dense<float, Mem>(0, 3)), Catch::Contains("in_features = 0"));
  nn::Dense<float, Mem> layer(4, 2);
  CHECK_THROWS_AS(layer.output_shape(FeatureShape{5}), ShapeError);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{5}), Catch::Contains("must be 4, got 5"));
  auto buffer = bind_fresh<float>(layer, 1);
  Matrix<float, Mem> x("x", 3, 5), y("y", 3, 2);
  CHECK_THROWS_AS(layer.forward(Space(), x, y), ShapeError);
}

TEST_CASE("dense: per position applies the same weights to every position of every sample",
          "[dense][per_position]") {
  // {in = 3, H = 2, W = 3}: six positions; feature index h + H (w + W c) (kat::FeatureShape).
  const FeatureShape in{3, 2, 3};
  const int n = 4, positions = 6, out = 5;
  nn::Dense<double, Mem> layer(3, out, true, nn::DenseInput::per_position);
  CHECK(layer.output_shape(in) == FeatureShape{out, 2, 3});
  auto buffer = bind_fresh<double>(layer, 17);
  auto x = random_matrix<double>(n, in.size(), 18);
  Matrix<double, Mem> y("y", n, out * positions);
  layer.forward(Space(), x, y);
  auto xh = to_host(x);
  auto yh = to_host(y);
  auto wh = to_host(layer.weight());
  auto bh = to_host(layer.bias());
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < positions; ++p)
      for (int o = 0; o < out; ++o) {
        double ref = bh(o);
        for (int c = 0; c < 3; ++c)
          ref += wh(o, c) * xh(i, p + positions * c);
        CHECK(yh(i, p + positions * o) == Approx(ref).epsilon(1e-13));
      }
}

TEST_CASE("dense: per position gradients and R-operator equal finite differences",
          "[dense][per_position][gradcheck]") {
  SECTION("with bias") {
    nn::Dense<double, Mem> layer(4, 3, true, nn::DenseInput::per_position);
    check_layer_gradients(layer, FeatureShape{4, 3, 2}, 3, 31);
    check_layer_r_operator(layer, FeatureShape{4, 3, 2}, 3, 32);
  }
  SECTION("without bias while recording curvature") {
    nn::Dense<double, Mem> layer(2, 5, false, nn::DenseInput::per_position);
    layer.record_curvature(true);
    check_layer_gradients(layer, FeatureShape{2, 5, 1}, 2, 33);
  }
}

TEST_CASE("dense: per position records N times P rows and N samples for K-FAC",
          "[dense][per_position][curvature]") {
  nn::Dense<double, Mem> layer(3, 2, true, nn::DenseInput::per_position);
  auto buffer = bind_fresh<double>(layer, 3);
  layer.record_curvature(true);
  const int n = 2, positions = 4;
  auto x = random_matrix<double>(n, 3 * positions, 5);
  auto dy = random_matrix<double>(n, 2 * positions, 6);
  Matrix<double, Mem> y("y", n, 2 * positions);
  layer.forward(Space(), x, y);
  layer.backward(Space(), dy, Matrix<double, Mem>());
  const auto rec = layer.curvature();
  CHECK(rec.samples == std::size_t(n));
  REQUIRE(rec.a.extent(0) == std::size_t(n * positions));
  REQUIRE(rec.g.extent(0) == std::size_t(n * positions));
  auto ah = to_host(rec.a);
  auto xh = to_host(x);
  auto gh = to_host(rec.g);
  auto dyh = to_host(dy);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < positions; ++p) {
      for (int c = 0; c < 3; ++c)
        CHECK(ah(i + n * p, c) == xh(i, p + positions * c));
      CHECK(ah(i + n * p, 3) == 1.0);
      for (int o = 0; o < 2; ++o)
        CHECK(gh(i + n * p, o) == dyh(i, p + positions * o));
    }
}

TEST_CASE("dense: per position refuses inputs whose channels are not in_features",
          "[dense][per_position][errors]") {
  nn::Dense<double, Mem> layer(3, 2, true, nn::DenseInput::per_position);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{4, 2, 2}), Catch::Contains("input channels") &&
                                                                   Catch::Contains("3") &&
                                                                   Catch::Contains("4"));
  auto buffer = bind_fresh<double>(layer, 3);
  Matrix<double, Mem> x("x", 2, 7), y("y", 2, 4);
  CHECK_THROWS_WITH(layer.forward(Space(), x, y),
                    Catch::Contains("x columns must be a positive multiple of 3") &&
                        Catch::Contains("got 7"));
}

} // namespace test_dense
