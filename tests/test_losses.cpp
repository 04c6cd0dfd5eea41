#include "test_helpers.hpp"

#include <kat/nn/metrics.hpp>
#include <kat/nn/mse_loss.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

namespace test_losses {

using namespace kat;
using namespace kat::test;

namespace {
// log-softmax written directly (log of a ratio, no max shift) as an independent reference.
double reference_ce(const Matrix<double, Mem> &z, const std::vector<std::int32_t> &y) {
  auto zh = to_host(z);
  double total = 0;
  for (std::size_t i = 0; i < z.extent(0); ++i) {
    double denom = 0;
    for (std::size_t c = 0; c < z.extent(1); ++c)
      denom += std::exp(zh(i, c));
    total += -std::log(std::exp(zh(i, y[i])) / denom);
  }
  return total / double(z.extent(0));
}
} // namespace

TEST_CASE("softmax cross-entropy: value and finite-difference gradient", "[loss][gradcheck]") {
  nn::SoftmaxCrossEntropy<double, Mem> ce;
  auto z = random_matrix<double>(6, 4, 1, -3, 3);
  const std::vector<std::int32_t> y = {0, 3, 1, 1, 2, 0};
  auto labels = labels_of(y);
  Matrix<double, Mem> grad("grad", 6, 4);
  const double loss = ce.forward_backward(Space(), z, labels, grad);
  CHECK(loss == Approx(reference_ce(z, y)).epsilon(1e-13));
  CHECK(ce.forward(Space(), z, labels) == loss);
  const auto num = numeric_gradient(z, [&] { return ce.forward(Space(), z, labels); });
  CHECK(max_rel_error(grad, num) < 1e-8);
  // Each row of the gradient sums to 0 (softmax sums to 1).
  auto gh = to_host(grad);
  for (int i = 0; i < 6; ++i) {
    double s = 0;
    for (int c = 0; c < 4; ++c)
      s += gh(i, c);
    CHECK(std::abs(s) < 1e-15);
  }
}

TEST_CASE("softmax cross-entropy: exact special cases and stability", "[loss]") {
  nn::SoftmaxCrossEntropy<float, Mem> ce;
  SECTION("equal logits give log(C)") {
    Matrix<float, Mem> z("z", 3, 10);
    Kokkos::deep_copy(z, 1e4f); // huge but equal: needs the max shift to stay finite
    CHECK(ce.forward(Space(), z, labels_of({0, 5, 9})) == Approx(std::log(10.0)).epsilon(1e-6));
  }
  SECTION("a dominant correct logit gives ~0, a dominant wrong one gives the gap") {
    Matrix<float, Mem> z("z", 1, 3);
    auto zh = Kokkos::create_mirror_view(z);
    zh(0, 0) = 500.f;
    zh(0, 1) = 0.f;
    zh(0, 2) = 0.f;
    Kokkos::deep_copy(z, zh);
    CHECK(ce.forward(Space(), z, labels_of({0})) == Approx(0.0).margin(1e-6));
    CHECK(ce.forward(Space(), z, labels_of({2})) == Approx(500.0).epsilon(1e-6));
  }
}

TEST_CASE("softmax cross-entropy: bad labels and non-finite logits", "[loss][errors]") {
  nn::SoftmaxCrossEntropy<float, Mem> ce;
  Matrix<float, Mem> z("z", 3, 4);
  CHECK_THROWS_WITH(ce.forward(Space(), z, labels_of({0, 4, 1})),
                    Catch::Contains("labels(1) must be in [0, 4), got 4"));
  CHECK_THROWS_WITH(ce.forward(Space(), z, labels_of({0, 1, -2})),
                    Catch::Contains("labels(2) must be in [0, 4), got -2"));
  CHECK_THROWS_AS(ce.forward(Space(), z, labels_of({0, 1})), ShapeError);
  auto zh = Kokkos::create_mirror_view(z);
  Kokkos::deep_copy(zh, 0.f);
  zh(1, 2) = std::numeric_limits<float>::quiet_NaN();
  Kokkos::deep_copy(z, zh);
  CHECK_THROWS_AS(ce.forward(Space(), z, labels_of({0, 1, 2})), NumericalError);
}

TEST_CASE("mse: value and finite-difference gradient", "[loss][gradcheck]") {
  nn::MSELoss<double, Mem> mse;
  auto y = random_matrix<double>(5, 3, 4);
  auto t = random_matrix<double>(5, 3, 5);
  Matrix<double, Mem> grad("grad", 5, 3);
  const double loss = mse.forward_backward(Space(), y, t, grad);
  auto yh = to_host(y);
  auto th = to_host(t);
  double ref = 0;
  for (int j = 0; j < 3; ++j)
    for (int i = 0; i < 5; ++i)
      ref += (yh(i, j) - th(i, j)) * (yh(i, j) - th(i, j));
  CHECK(loss == Approx(ref / 15).epsilon(1e-14));
  const auto num = numeric_gradient(y, [&] { return mse.forward(Space(), y, t); });
  CHECK(max_rel_error(grad, num) < 1e-8);
  CHECK_THROWS_AS(mse.forward(Space(), y, Matrix<double, Mem>("t", 5, 2)), ShapeError);
}

TEST_CASE("metrics: count_correct uses argmax with lowest-index ties", "[metrics]") {
  Matrix<float, Mem> z("z", 3, 3);
  auto zh = Kokkos::create_mirror_view(z);
  const float v[3][3] = {{0, 2, 1}, {5, 5, 0}, {-1, -2, -3}};
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 3; ++c)
      zh(i, c) = v[i][c];
  Kokkos::deep_copy(z, zh);
  CHECK(nn::count_correct(Space(), z, Vector<const std::int32_t, Mem>(labels_of({1, 0, 0}))) == 3);
  CHECK(nn::count_correct(Space(), z, Vector<const std::int32_t, Mem>(labels_of({1, 1, 2}))) == 1);
}

} // namespace test_losses
