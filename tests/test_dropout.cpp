#include "layer_check.hpp"
#include "test_helpers.hpp"

#include <kat/nn/dropout.hpp>

#include <catch2/catch.hpp>

#include <cmath>

namespace test_dropout {

using namespace kat;
using namespace kat::test;

TEST_CASE("dropout: finite-difference gradients with the mask held fixed", "[dropout][gradcheck]") {
  nn::Dropout<double, Mem> layer(0.3, 17);
  // Every evaluation replays mask 0, so the loss is a smooth function of x.
  check_layer_gradients(layer, FeatureShape{8}, 6, 9, [&] { layer.set_mask_counter(0); });
}

TEST_CASE("dropout: drops about p and scales survivors by exactly 1/(1-p)", "[dropout]") {
  const double p = 0.25;
  nn::Dropout<double, Mem> layer(p, 5);
  const std::size_t n = 200, f = 100;
  Matrix<double, Mem> x("x", n, f), y("y", n, f);
  Kokkos::deep_copy(x, 2.0);
  layer.forward(Space(), x, y);
  auto yh = to_host(y);
  std::size_t zeros = 0;
  for (std::size_t j = 0; j < f; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      if (yh(i, j) == 0.0) {
        ++zeros;
      } else {
        REQUIRE(yh(i, j) == 2.0 / (1.0 - p));
      }
    }
  // Binomial(20000, 0.25): standard deviation ~61; 5 sigma.
  CHECK(std::abs(double(zeros) - p * n * f) < 5 * std::sqrt(n * f * p * (1 - p)));

  SECTION("a new mask each call, reproducible from the seed") {
    Matrix<double, Mem> y2("y2", n, f);
    layer.forward(Space(), x, y2);
    auto y2h = to_host(y2);
    nn::Dropout<double, Mem> twin(p, 5);
    Matrix<double, Mem> t("t", n, f);
    twin.forward(Space(), x, t);
    auto th = to_host(t);
    std::size_t differ = 0;
    for (std::size_t j = 0; j < f; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(th(i, j) == yh(i, j));
        differ += y2h(i, j) != yh(i, j);
      }
    CHECK(differ > 1000);
  }
}

TEST_CASE("dropout: identity in evaluation mode and at p = 0", "[dropout]") {
  auto x = random_matrix<double>(7, 5, 3);
  Matrix<double, Mem> y("y", 7, 5), dx("dx", 7, 5);
  nn::Dropout<double, Mem> layer(0.9, 1);
  layer.train(false);
  layer.forward(Space(), x, y);
  layer.backward(Space(), x, dx);
  auto xh = to_host(x);
  auto yh = to_host(y);
  auto dxh = to_host(dx);
  for (std::size_t j = 0; j < 5; ++j)
    for (std::size_t i = 0; i < 7; ++i) {
      CHECK(yh(i, j) == xh(i, j));
      CHECK(dxh(i, j) == xh(i, j));
    }
  nn::Dropout<double, Mem> zero(0.0, 1);
  zero.forward(Space(), x, y);
  yh = to_host(y);
  CHECK(yh(3, 2) == xh(3, 2));
}

TEST_CASE("dropout: p outside 0 <= p < 1 is rejected", "[dropout][errors]") {
  CHECK_THROWS_WITH((nn::Dropout<float, Mem>(1.0)), Catch::Contains("p must be in [0, 1), got 1"));
  CHECK_THROWS_AS((nn::Dropout<float, Mem>(-0.1)), ValueError);
  CHECK_THROWS_AS((nn::Dropout<float, Mem>(std::nan(""))), ValueError);
}

} // namespace test_dropout
