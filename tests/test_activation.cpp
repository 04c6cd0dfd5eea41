#include "layer_check.hpp"
#include "test_helpers.hpp"

#include <kat/nn/activation.hpp>
#include <kat/nn/flatten.hpp>

#include <catch2/catch.hpp>

#include <cmath>

namespace test_activation {

using namespace kat;
using namespace kat::test;

namespace {
// Shifts every |x| away from 0 so ReLU's kink is never inside a finite-difference step.
void avoid_zero(const Matrix<double, Mem> &x) {
  auto h = to_host(x);
  for (std::size_t j = 0; j < x.extent(1); ++j)
    for (std::size_t i = 0; i < x.extent(0); ++i)
      h(i, j) += h(i, j) >= 0 ? 0.05 : -0.05;
  Kokkos::deep_copy(x, h);
}

template <class L> std::vector<double> apply(const std::vector<double> &in) {
  L layer;
  Matrix<double, Mem> x("x", in.size(), 1), y("y", in.size(), 1);
  auto xh = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < in.size(); ++i)
    xh(i, 0) = in[i];
  Kokkos::deep_copy(x, xh);
  layer.forward(Space(), x, y);
  auto yh = to_host(y);
  std::vector<double> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    out[i] = yh(i, 0);
  return out;
}
} // namespace

TEST_CASE("activation: finite-difference gradients in double", "[activation][gradcheck]") {
  SECTION("ReLU") {
    nn::ReLU<double, Mem> layer;
    const Space space;
    auto x = random_matrix<double>(5, 7, 1);
    avoid_zero(x);
    auto r = random_matrix<double>(5, 7, 2);
    Matrix<double, Mem> y("y", 5, 7), dx("dx", 5, 7);
    auto loss = [&] {
      layer.forward(space, x, y);
      return weighted_sum(y, r);
    };
    loss();
    layer.backward(space, r, dx);
    CHECK(max_rel_error(dx, numeric_gradient(x, loss)) < 1e-7);
  }
  SECTION("Tanh") {
    nn::Tanh<double, Mem> layer;
    check_layer_gradients(layer, FeatureShape{3, 2, 2}, 4, 3);
  }
  SECTION("Sigmoid") {
    nn::Sigmoid<double, Mem> layer;
    check_layer_gradients(layer, FeatureShape{9}, 3, 4);
  }
}

TEST_CASE("activation: exact values", "[activation]") {
  const auto relu = apply<nn::ReLU<double, Mem>>({-2.0, -0.0, 0.0, 3.5});
  CHECK(relu == std::vector<double>{0.0, 0.0, 0.0, 3.5});
  const auto sig = apply<nn::Sigmoid<double, Mem>>({0.0, -1000.0, 1000.0, std::log(3.0)});
  CHECK(sig[0] == 0.5);
  CHECK(sig[1] == 0.0); // no overflow, no NaN
  CHECK(sig[2] == 1.0);
  CHECK(sig[3] == Approx(0.75).epsilon(1e-15));
  const auto th = apply<nn::Tanh<double, Mem>>({0.0, 0.5});
  CHECK(th[0] == 0.0);
  CHECK(th[1] == Approx(std::tanh(0.5)).epsilon(1e-15));
}

TEST_CASE("activation: shape-preserving; mismatched buffers are rejected", "[activation][errors]") {
  nn::ReLU<float, Mem> relu;
  CHECK(relu.output_shape(FeatureShape{3, 4, 5}) == FeatureShape{3, 4, 5});
  Matrix<float, Mem> x("x", 2, 3), y("y", 2, 4);
  CHECK_THROWS_WITH(relu.forward(Space(), x, y), Catch::Contains("y must be 2x3, got 2x4"));
}

TEST_CASE("flatten: keeps data and flattens the shape", "[flatten][gradcheck]") {
  nn::Flatten<double, Mem> layer;
  CHECK(layer.output_shape(FeatureShape{2, 3, 4}) == FeatureShape{24});
  check_layer_gradients(layer, FeatureShape{2, 3, 4}, 3, 5);
}

} // namespace test_activation
