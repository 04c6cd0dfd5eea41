// The float exp, normal CDF and density of kat::math::detail (include/kat/core/detail/
// float_math.hpp; GELU's and attention's kernels in float) against libm in double, evaluated
// on the device: relative error bounds over the whole float range where the results are normal
// numbers, the special values (±inf, NaN, underflow, overflow), and the combined normal_cdf_pdf
// against the separate functions bit for bit.
#include "test_helpers.hpp"

#include <kat/core/detail/float_math.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace test_gelu_math {

using namespace kat;
using namespace kat::test;

/// out(i, 0..4) = exp_float, normal_cdf, normal_pdf and normal_cdf_pdf's two results at x(i).
struct Evaluate {
  Kokkos::View<const float *, Mem> x;
  Kokkos::View<float **, Kokkos::LayoutLeft, Mem> out;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    namespace m = kat::math::detail;
    out(i, 0) = m::exp_float(x(i));
    out(i, 1) = m::normal_cdf(x(i));
    out(i, 2) = m::normal_pdf(x(i));
    float c = 0, p = 0;
    m::normal_cdf_pdf(x(i), c, p);
    out(i, 3) = c;
    out(i, 4) = p;
  }
};

std::vector<std::vector<float>> evaluate(const std::vector<float> &points) {
  Kokkos::View<float *, Mem> x("x", points.size());
  auto xh = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < points.size(); ++i) {
    xh(i) = points[i];
  }
  Kokkos::deep_copy(x, xh);
  Kokkos::View<float **, Kokkos::LayoutLeft, Mem> out("out", points.size(), 5);
  Kokkos::parallel_for("test_gelu_math::evaluate", Kokkos::RangePolicy<Space>(0, points.size()),
                       Evaluate{x, out});
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  std::vector<std::vector<float>> r(5, std::vector<float>(points.size()));
  for (std::size_t j = 0; j < 5; ++j) {
    for (std::size_t i = 0; i < points.size(); ++i) {
      r[j][i] = oh(i, j);
    }
  }
  return r;
}

constexpr double float_min = std::numeric_limits<float>::min();

TEST_CASE("exp_float: within 2 ulp of exp over float's normal range", "[gelu_math]") {
  std::vector<float> points;
  for (double a = -87.3; a < 88.72; a += 1.7e-3) {
    points.push_back(static_cast<float>(a));
  }
  const auto r = evaluate(points);
  double worst = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double ref = std::exp(static_cast<double>(points[i]));
    worst = std::max(worst, std::abs(r[0][i] - ref) / ref);
  }
  CHECK(worst <= 2 * 0x1.0p-24 * 2); // 2 ulp: an ulp is at most 2^-23 relative
  INFO("max relative error " << worst);
  CHECK(worst > 0); // the comparison ran on real values
}

TEST_CASE("exp_float: special values", "[gelu_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto r = evaluate({0.0f, -inf, inf, nan, -104.0f, -1e30f, 88.8f, 1e30f, -100.0f});
  CHECK(r[0][0] == 1.0f);
  CHECK(r[0][1] == 0.0f);
  CHECK(r[0][2] == inf);
  CHECK(std::isnan(r[0][3]));
  CHECK(r[0][4] == 0.0f);
  CHECK(r[0][5] == 0.0f);
  CHECK(r[0][6] == inf);
  CHECK(r[0][7] == inf);
  // e^-100 = 3.7e-44 is subnormal: formed (2^n in two factors), to its spacing 1.4e-45.
  CHECK(std::abs(r[0][8] - std::exp(-100.0)) <= 1.5e-45);
  CHECK(r[0][8] > 0.0f);
}

TEST_CASE("normal_cdf and normal_pdf: within 1e-6 relative of erfc and exp in double",
          "[gelu_math]") {
  std::vector<float> points;
  for (double x = -12.8; x <= 12.8; x += 3.3e-4) {
    points.push_back(static_cast<float>(x));
  }
  const auto r = evaluate(points);
  double worst_cdf = 0, worst_pdf = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double x = points[i];
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    INFO("x = " << x);
    REQUIRE(cdf > float_min);
    REQUIRE(pdf > float_min);
    worst_cdf = std::max(worst_cdf, std::abs(r[1][i] - cdf) / cdf);
    worst_pdf = std::max(worst_pdf, std::abs(r[2][i] - pdf) / pdf);
    // normal_cdf_pdf gives the same numbers as the separate functions.
    CHECK(r[3][i] == r[1][i]);
    CHECK(r[4][i] == r[2][i]);
  }
  INFO("max relative error: cdf " << worst_cdf << ", pdf " << worst_pdf);
  CHECK(worst_cdf <= 1e-6);
  CHECK(worst_pdf <= 1e-6);
  CHECK(worst_cdf > 0);
}

TEST_CASE("normal_cdf and normal_pdf: tails and infinities and NaN", "[gelu_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto r = evaluate({-inf, inf, nan, -0.0f, 0.0f, -20.0f, 20.0f, 1e30f, -1e30f, -13.5f});
  CHECK(r[1][0] == 0.0f);
  CHECK(r[1][1] == 1.0f);
  CHECK(std::isnan(r[1][2]));
  CHECK(std::isnan(r[2][2]));
  CHECK(std::isnan(r[3][2]));
  CHECK(std::isnan(r[4][2]));
  CHECK(r[1][3] == 0.5f);
  CHECK(r[1][4] == 0.5f);
  CHECK(r[2][4] == Approx(0.3989422804014327).epsilon(1e-7));
  CHECK(r[1][5] == 0.0f); // Φ(−20) = 2.8e-89 underflows
  CHECK(r[1][6] == 1.0f);
  CHECK(r[1][7] == 1.0f);
  CHECK(r[1][8] == 0.0f);
  CHECK(r[2][0] == 0.0f);
  CHECK(r[2][1] == 0.0f);
  CHECK(r[2][7] == 0.0f);
  // Φ(−13.5) = 7.6e-42, subnormal: formed, not flushed (its spacing is 1.4e-45).
  CHECK(std::abs(r[1][9] - 0.5 * std::erfc(13.5 / std::sqrt(2.0))) < 2e-44);
  CHECK(r[1][9] > 0.0f);
}

} // namespace test_gelu_math
