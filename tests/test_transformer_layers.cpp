// LayerNorm, GELU, PositionEmbedding and Embedding: closed forms and host references, finite
// differences of backward and of the R-operator, gradient modes and error messages.
#include "layer_check.hpp"
#include "r_operator_check.hpp"
#include "test_helpers.hpp"

#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/embedding.hpp>
#include <kat/nn/gelu.hpp>
#include <kat/nn/layer_norm.hpp>
#include <kat/nn/position_embedding.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace test_transformer_layers {

using namespace kat;
using namespace kat::test;

namespace {

template <class V> void set_from(const V &v, const std::vector<double> &values) {
  auto h = Kokkos::create_mirror_view(v);
  REQUIRE(h.span() == values.size());
  for (std::size_t k = 0; k < values.size(); ++k)
    h.data()[k] = static_cast<typename V::non_const_value_type>(values[k]);
  Kokkos::deep_copy(v, h);
}

std::vector<double> uniform_values(std::size_t n, std::uint64_t seed, double lo, double hi) {
  HostRng rng(seed);
  std::vector<double> v(n);
  for (auto &x : v)
    x = lo + (hi - lo) * double(rng.next() >> 11) * 0x1.0p-53;
  return v;
}

// Sets γ, β of a LayerNorm away from (1, 0) on the first call only, so that finite differences
// perturb from there (the checkers call it before every forward).
std::function<void()> random_affine_once(nn::LayerNorm<double, Mem> &layer, std::uint64_t seed) {
  return [&layer, seed, first = true]() mutable {
    if (first && layer.elementwise_affine()) {
      const std::size_t C = layer.normalized_features();
      set_from(layer.gamma(), uniform_values(C, seed, 0.5, 1.5));
      set_from(layer.beta(), uniform_values(C, seed + 1, -0.5, 0.5));
    }
    first = false;
  };
}

// The naive LayerNorm of a N x (C·P) batch: for every sample n and position p, the C values
// x(n, p + P·c) normalized with their biased variance, then scaled and shifted.
template <class HostMatrix>
std::vector<double> host_layer_norm(const HostMatrix &x, std::size_t C,
                                    const std::vector<double> &gamma,
                                    const std::vector<double> &beta, double eps) {
  const std::size_t N = x.extent(0), P = x.extent(1) / C;
  std::vector<double> y(N * C * P);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t p = 0; p < P; ++p) {
      double mean = 0, var = 0;
      for (std::size_t c = 0; c < C; ++c)
        mean += double(x(n, p + P * c));
      mean /= double(C);
      for (std::size_t c = 0; c < C; ++c)
        var += (double(x(n, p + P * c)) - mean) * (double(x(n, p + P * c)) - mean);
      var /= double(C);
      for (std::size_t c = 0; c < C; ++c)
        y[n + N * (p + P * c)] =
            gamma[c] * (double(x(n, p + P * c)) - mean) / std::sqrt(var + eps) + beta[c];
    }
  return y;
}

// A layer's parameter gradient after forward(x) and backward(dy) in overwrite mode from a
// zeroed buffer (g), then after accumulating into stale values (stale + g) and overwriting
// them (g).
template <class LayerT>
void check_gradient_modes(LayerT &layer, const Matrix<double, Mem> &x, std::size_t out_cols,
                          std::uint64_t seed) {
  const Space space;
  auto buffer = bind_fresh<double>(layer, seed);
  const std::size_t np = layer.parameter_count();
  const std::size_t n = x.extent(0);
  const auto dy = random_matrix<double>(n, out_cols, seed + 1);
  Matrix<double, Mem> y("y", n, out_cols);
  auto pass = [&] {
    layer.forward(space, x, y);
    layer.backward(space, dy, Matrix<double, Mem>());
    space.fence();
    return host_values(buffer.gradients());
  };
  Kokkos::deep_copy(buffer.gradients(), 0.0);
  layer.accumulate_gradients(false);
  const auto g = pass();
  double norm = 0;
  for (double v : g)
    norm += std::abs(v);
  REQUIRE(norm > 0.1);
  const auto stale = uniform_values(np, seed + 2, -5.0, 5.0);
  set_from(buffer.gradients(), stale);
  layer.accumulate_gradients(true);
  const auto acc = pass();
  set_from(buffer.gradients(), stale);
  layer.accumulate_gradients(false);
  const auto over = pass();
  for (std::size_t k = 0; k < np; ++k) {
    CHECK(acc[k] == Approx(stale[k] + g[k]).epsilon(1e-14).margin(1e-14));
    CHECK(over[k] == g[k]);
  }
}

// An N x T matrix of token ids.
Matrix<double, Mem> ids_matrix(std::size_t n, std::size_t t, const std::vector<double> &ids) {
  REQUIRE(ids.size() == n * t);
  return matrix_of<double>(n, t, [&](std::size_t i, std::size_t j) { return ids[i + n * j]; });
}

} // namespace

// ---------------------------------------------------------------------------------------------
// LayerNorm

TEST_CASE("layer norm: each position normalized to mean 0 and variance 1", "[layernorm]") {
  const FeatureShape shape{6, 3, 2};
  const std::size_t n = 3, C = 6, P = 6;
  nn::LayerNorm<double, Mem> layer(C);
  REQUIRE(layer.output_shape(shape) == shape);
  auto buffer = bind_fresh<double>(layer); // γ = 1, β = 0
  const auto x = random_matrix<double>(n, shape.size(), 11, -4.0, 7.0);
  Matrix<double, Mem> y("y", n, shape.size());
  layer.forward(Space(), x, y);
  auto xh = to_host(x);
  auto yh = to_host(y);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t p = 0; p < P; ++p) {
      double mx = 0, vx = 0, my = 0, vy = 0;
      for (std::size_t c = 0; c < C; ++c) {
        mx += xh(i, p + P * c) / C;
        my += yh(i, p + P * c) / C;
      }
      for (std::size_t c = 0; c < C; ++c) {
        vx += (xh(i, p + P * c) - mx) * (xh(i, p + P * c) - mx) / C;
        vy += (yh(i, p + P * c) - my) * (yh(i, p + P * c) - my) / C;
      }
      CHECK(std::abs(my) < 1e-13);
      CHECK(vy == Approx(vx / (vx + 1e-5)).epsilon(1e-12));
      CHECK(vy == Approx(1.0).epsilon(1e-4));
    }
}

TEST_CASE("layer norm: equals a naive double loop with random gamma and beta", "[layernorm]") {
  // 18, 3 and 75 rows: on a host, one partial block of 32 rows, and two full blocks and a
  // partial one.
  for (const FeatureShape shape :
       {FeatureShape{6, 3, 2}, FeatureShape{5, 1, 1}, FeatureShape{7, 5, 3}}) {
    INFO("shape " << shape);
    const std::size_t n = shape.channels == 7 ? 5 : 3, C = shape.channels;
    nn::LayerNorm<double, Mem> layer(C, 1e-3);
    auto buffer = bind_fresh<double>(layer);
    const auto gamma = uniform_values(C, 21, -1.5, 1.5), beta = uniform_values(C, 22, -1, 1);
    set_from(layer.gamma(), gamma);
    set_from(layer.beta(), beta);
    const auto x = random_matrix<double>(n, shape.size(), 23, -3.0, 2.0);
    Matrix<double, Mem> y("y", n, shape.size());
    layer.forward(Space(), x, y);
    const auto ref = host_layer_norm(to_host(x), C, gamma, beta, 1e-3);
    CHECK(scaled_error(host_values(y), ref) < 1e-14);
  }
  SECTION("without elementwise affine") {
    const FeatureShape shape{4, 2, 3};
    nn::LayerNorm<double, Mem> layer(4, 1e-5, false);
    CHECK(layer.parameter_count() == 0);
    CHECK(layer.parameter_specs().empty());
    const auto x = random_matrix<double>(2, shape.size(), 24);
    Matrix<double, Mem> y("y", 2, shape.size());
    layer.forward(Space(), x, y);
    const auto ref = host_layer_norm(to_host(x), 4, std::vector<double>(4, 1.0),
                                     std::vector<double>(4, 0.0), 1e-5);
    CHECK(scaled_error(host_values(y), ref) < 1e-14);
  }
}

TEST_CASE("layer norm: the team-per-row kernels of GPUs equal the layer", "[layernorm]") {
  // On a host the layer runs the blocked kernels; here the team-per-row ones (what a GPU runs)
  // are called directly on the same rows and compared.
  const Space space;
  const FeatureShape shape{7, 5, 3};
  const std::size_t n = 5, cols = shape.size(), rows = n * 15;
  nn::LayerNorm<double, Mem> layer(7, 1e-3);
  auto buffer = bind_fresh<double>(layer);
  random_affine_once(layer, 65)();
  const auto x = random_matrix<double>(n, cols, 66, -2.0, 3.0);
  const auto dy = random_matrix<double>(n, cols, 67);
  Matrix<double, Mem> y("y", n, cols), dx("dx", n, cols), y2("y2", n, cols), dx2("dx2", n, cols);
  layer.forward(space, x, y);
  layer.backward(space, dy, dx);
  Vector<double, Mem> stats("stats", 2 * rows);
  const nn::detail::LayerNormRows<double> d{
      x.data(),           rows, 7, layer.gamma().data(), layer.beta().data(), stats.data(),
      stats.data() + rows};
  nn::detail::layer_norm_forward_teams<double>(space, d, 1e-3, y2.data());
  nn::detail::layer_norm_backward_input_teams<double>(space, d, dy.data(), dx2.data());
  CHECK(max_diff_over_scale(y2, y) < 1e-14);
  CHECK(max_diff_over_scale(dx2, dx) < 1e-14);
}

TEST_CASE("layer norm: float rows far from zero keep their accuracy", "[layernorm]") {
  // Features 1000 + U(-1, 1): Σx² − Cμ² in float would lose all digits; the two-pass variance
  // in double keeps x̂ at float precision.
  const FeatureShape shape{16, 2, 2};
  const std::size_t n = 4;
  nn::LayerNorm<float, Mem> layer(16);
  auto buffer = bind_fresh<float>(layer);
  const auto xd = random_matrix<double>(n, shape.size(), 31, 999.0, 1001.0);
  Matrix<float, Mem> x("x", n, shape.size()), y("y", n, shape.size());
  auto xfh = Kokkos::create_mirror_view(x);
  auto xdh = to_host(xd);
  for (std::size_t j = 0; j < shape.size(); ++j)
    for (std::size_t i = 0; i < n; ++i)
      xfh(i, j) = float(xdh(i, j));
  Kokkos::deep_copy(x, xfh);
  layer.forward(Space(), x, y);
  const auto ref =
      host_layer_norm(xfh, 16, std::vector<double>(16, 1.0), std::vector<double>(16, 0.0), 1e-5);
  // x − μ is exact in float here (Sterbenz), so the error is that of μ and 1/σ in float.
  CHECK(scaled_error(host_values(y), ref) < 2e-4);
}

TEST_CASE("layer norm: finite-difference gradients in double", "[layernorm][gradcheck]") {
  SECTION("affine with random gamma and beta, P > 1") {
    nn::LayerNorm<double, Mem> layer(6);
    check_layer_gradients(layer, FeatureShape{6, 3, 2}, 3, 41, random_affine_once(layer, 42));
  }
  SECTION("affine on flat features") {
    nn::LayerNorm<double, Mem> layer(5, 1e-2);
    check_layer_gradients(layer, FeatureShape{5}, 4, 43, random_affine_once(layer, 44));
  }
  SECTION("without affine") {
    nn::LayerNorm<double, Mem> layer(4, 1e-5, false);
    check_layer_gradients(layer, FeatureShape{4, 2, 3}, 3, 45);
  }
  SECTION("75 rows: several blocks of rows") {
    nn::LayerNorm<double, Mem> layer(3);
    check_layer_gradients(layer, FeatureShape{3, 5, 3}, 5, 46, random_affine_once(layer, 47));
  }
}

TEST_CASE("layer norm: the R-operator equals finite differences", "[layernorm][hvp]") {
  SECTION("affine with random gamma and beta") {
    nn::LayerNorm<double, Mem> layer(6);
    check_layer_r_operator(layer, FeatureShape{6, 3, 2}, 3, 51, random_affine_once(layer, 52));
  }
  SECTION("without affine") {
    nn::LayerNorm<double, Mem> layer(4, 1e-3, false);
    check_layer_r_operator(layer, FeatureShape{4, 2, 3}, 3, 53);
  }
  SECTION("75 rows: several blocks of rows") {
    nn::LayerNorm<double, Mem> layer(7);
    check_layer_r_operator(layer, FeatureShape{7, 5, 3}, 5, 59, random_affine_once(layer, 60));
  }
  SECTION("an empty rx is R{x} = 0") {
    const Space space;
    const FeatureShape shape{6, 3, 2};
    const std::size_t n = 3;
    nn::LayerNorm<double, Mem> layer(6);
    auto buffer = bind_fresh<double>(layer);
    random_affine_once(layer, 54)();
    const auto x = random_matrix<double>(n, shape.size(), 55);
    const auto dy = random_matrix<double>(n, shape.size(), 56);
    const auto rdy = random_matrix<double>(n, shape.size(), 57);
    const auto v = random_matrix<double>(layer.parameter_count(), 1, 58);
    Vector<double, Mem> hv("hv", layer.parameter_count());
    layer.bind_direction(v.data(), hv.data());
    auto run = [&](const Matrix<double, Mem> &rx) {
      Kokkos::deep_copy(hv, 0.0);
      Matrix<double, Mem> y("y", n, shape.size()), ry("ry", n, shape.size());
      Matrix<double, Mem> dx("dx", n, shape.size()), rdx("rdx", n, shape.size());
      layer.forward(space, x, y);
      layer.forward_r(space, rx, ry);
      layer.backward(space, dy, dx);
      layer.backward_r(space, dy, rdy, rdx);
      return std::vector<std::vector<double>>{host_values(ry), host_values(rdx), host_values(hv)};
    };
    const auto empty = run(Matrix<double, Mem>());
    const auto zero = run(Matrix<double, Mem>("zero", n, shape.size()));
    for (int k = 0; k < 3; ++k)
      CHECK(scaled_error(empty[k], zero[k]) < 1e-15);
  }
}

TEST_CASE("layer norm: overwrite and accumulate gradient modes", "[layernorm]") {
  nn::LayerNorm<double, Mem> layer(6);
  const auto x = random_matrix<double>(3, 36, 61);
  check_gradient_modes(layer, x, 36, 62);
}

TEST_CASE("layer norm: workspaces do not grow in a steady loop", "[layernorm]") {
  nn::LayerNorm<float, Mem> layer(8);
  auto buffer = bind_fresh<float>(layer);
  const auto x = random_matrix<float>(4, 8 * 9, 71);
  Matrix<float, Mem> y("y", 4, 72), dx("dx", 4, 72);
  layer.forward(Space(), x, y);
  layer.backward(Space(), y, dx);
  const std::size_t after_first = layer.workspace_allocations();
  CHECK(after_first == 1);
  for (int k = 0; k < 3; ++k) {
    layer.forward(Space(), x, y);
    layer.backward(Space(), y, dx);
  }
  CHECK(layer.workspace_allocations() == after_first);
}

TEST_CASE("layer norm: bad arguments name the argument and values", "[layernorm][errors]") {
  CHECK_THROWS_AS((nn::LayerNorm<float, Mem>(0)), ValueError);
  CHECK_THROWS_WITH((nn::LayerNorm<float, Mem>(0)), Catch::Contains("normalized_features = 0"));
  CHECK_THROWS_WITH((nn::LayerNorm<float, Mem>(4, 0.0)), Catch::Contains("eps = 0"));
  CHECK_THROWS_AS((nn::LayerNorm<float, Mem>(4, std::nan(""))), ValueError);
  nn::LayerNorm<float, Mem> layer(4);
  auto buffer = bind_fresh<float>(layer);
  CHECK_THROWS_AS(layer.output_shape(FeatureShape{3, 2, 2}), ShapeError);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{3, 2, 2}),
                    Catch::Contains("input channels (normalized_features) must be 4, got 3"));
  Matrix<float, Mem> x6("x", 2, 6), y6("y", 2, 6), x8("x", 2, 8), y9("y", 2, 9);
  CHECK_THROWS_WITH(layer.forward(Space(), x6, y6),
                    Catch::Contains("LayerNorm::forward: x columns must be a positive multiple "
                                    "of normalized_features = 4, got 6"));
  CHECK_THROWS_WITH(layer.forward(Space(), x8, y9), Catch::Contains("y must be 2x8, got 2x9"));
  layer.forward(Space(), x8, Matrix<float, Mem>("y", 2, 8));
  CHECK_THROWS_WITH(layer.backward(Space(), Matrix<float, Mem>("dy", 3, 8), Matrix<float, Mem>()),
                    Catch::Contains("LayerNorm::backward: dy must be 2x8, got 3x8"));
  // Two rows of a 4-row matrix: LayoutLeft with a column stride of 4.
  Matrix<float, Mem> rows("rows", 4, 8);
  const Matrix<float, Mem> part = Kokkos::subview(rows, std::make_pair(0, 2), Kokkos::ALL());
  REQUIRE(!part.span_is_contiguous());
  CHECK_THROWS_WITH(layer.forward(Space(), part, y6),
                    Catch::Contains("LayerNorm::forward: x must be contiguous"));
}

// ---------------------------------------------------------------------------------------------
// GELU

TEST_CASE("gelu: equals x/2 (1 + erf(x/sqrt 2)) from std::erf", "[gelu]") {
  const std::vector<double> points{0.0,  -0.0, 1e-8, -1e-8, 0.5,   -0.5, 1.0,   -1.0, 2.5,
                                   -2.5, 5.0,  -5.0, 10.0,  -10.0, 40.0, -40.0, 1e10, -1e10};
  const std::size_t n = points.size();
  const auto x = matrix_of<double>(n, 1, [&](std::size_t i, std::size_t) { return points[i]; });
  // In training the forward keeps GELU'(x) for backward; in evaluation backward computes it
  // from x: both must give the derivative.
  const bool training = GENERATE(true, false);
  INFO("training " << training);
  Matrix<double, Mem> y("y", n, 1), dx("dx", n, 1);
  nn::GELU<double, Mem> layer;
  layer.train(training);
  layer.forward(Space(), x, y);
  const auto ones = matrix_of<double>(n, 1, [](std::size_t, std::size_t) { return 1.0; });
  layer.backward(Space(), ones, dx);
  CHECK(layer.workspace_allocations() == (training ? 1u : 0u));
  layer.forward(Space(), x, y);
  CHECK(layer.workspace_allocations() == (training ? 1u : 0u));
  const auto yh = host_values(y), dxh = host_values(dx);
  for (std::size_t i = 0; i < n; ++i) {
    const double t = points[i];
    INFO("x = " << t);
    const double ref = 0.5 * t * (1.0 + std::erf(t / std::sqrt(2.0)));
    // The formula as written cancels for x << 0 (1 + erf → 0), to an absolute error of about
    // |x|·1e-16; the layer computes Φ as erfc(−x/√2)/2, which keeps the relative accuracy.
    CHECK(yh[i] == Approx(ref).epsilon(1e-15).margin(1e-15 * std::abs(t)));
    const double tail = 0.5 * t * std::erfc(-t / std::sqrt(2.0));
    CHECK(yh[i] == Approx(tail).epsilon(1e-13).margin(1e-300));
    const double pdf = std::exp(-0.5 * t * t) / std::sqrt(2.0 * M_PI);
    const double dref = 0.5 * (1.0 + std::erf(t / std::sqrt(2.0))) + t * pdf;
    CHECK(dxh[i] == Approx(dref).epsilon(1e-15).margin(1e-15));
  }
  CHECK(yh[0] == 0.0);
  CHECK(yh[13] < -7e-23); // −10·Φ(−10) = −7.6e-23, where 1 + erf(−10/√2) is 0 in double
  CHECK(yh[14] == 40.0);  // Φ = 1 exactly
  CHECK(yh[15] == 0.0);   // Φ underflows, no NaN
  CHECK(dxh[17] == 0.0);
  CHECK(dxh[16] == 1.0);

  SECTION("float") {
    const auto xd = matrix_of<float>(n, 1, [&](std::size_t i, std::size_t) { return points[i]; });
    const auto onesf = matrix_of<float>(n, 1, [](std::size_t, std::size_t) { return 1.0f; });
    Matrix<float, Mem> yf("yf", n, 1), dxf("dxf", n, 1);
    nn::GELU<float, Mem> lf;
    lf.train(training);
    lf.forward(Space(), xd, yf);
    lf.backward(Space(), onesf, dxf);
    const auto yfh = host_values(yf), dxfh = host_values(dxf);
    for (std::size_t i = 0; i < n; ++i) {
      const double t = double(float(points[i]));
      const double ref = 0.5 * t * std::erfc(-t / std::sqrt(2.0));
      const double dref =
          0.5 * std::erfc(-t / std::sqrt(2.0)) + t * std::exp(-0.5 * t * t) / std::sqrt(2.0 * M_PI);
      INFO("x = " << t);
      CHECK(yfh[i] == Approx(ref).epsilon(1e-6).margin(1e-37));
      CHECK(dxfh[i] == Approx(dref).epsilon(1e-6).margin(1e-6)); // Φ + x φ cancels near x = −0.75
    }
  }
}

TEST_CASE("gelu: second derivative stays finite for huge inputs", "[gelu][hvp]") {
  const Space space;
  const std::vector<double> points{1e10, -1e10, 1e200, -1e200};
  const auto x = matrix_of<double>(4, 1, [&](std::size_t i, std::size_t) { return points[i]; });
  const auto ones = matrix_of<double>(4, 1, [](std::size_t, std::size_t) { return 1.0; });
  Matrix<double, Mem> y("y", 4, 1), ry("ry", 4, 1), dx("dx", 4, 1), rdx("rdx", 4, 1);
  nn::GELU<double, Mem> layer;
  layer.forward(space, x, y);
  layer.forward_r(space, ones, ry);
  layer.backward(space, ones, dx);
  layer.backward_r(space, ones, ones, rdx);
  // y' = 1 or 0 and y'' = 0 out there: R{dx} = y' R{dy}.
  CHECK(host_values(rdx) == std::vector<double>{1.0, 0.0, 1.0, 0.0});
  CHECK(host_values(ry) == std::vector<double>{1.0, 0.0, 1.0, 0.0});
}

TEST_CASE("gelu: finite differences of backward and of the R-operator", "[gelu][gradcheck][hvp]") {
  nn::GELU<double, Mem> layer;
  CHECK(layer.output_shape(FeatureShape{6, 3, 2}) == FeatureShape{6, 3, 2});
  CHECK(layer.parameter_count() == 0);
  check_layer_gradients(layer, FeatureShape{6, 3, 2}, 3, 81);
  check_layer_r_operator(layer, FeatureShape{6, 3, 2}, 3, 82);
}

TEST_CASE("gelu: mismatched buffers are rejected", "[gelu][errors]") {
  nn::GELU<float, Mem> layer;
  Matrix<float, Mem> x("x", 2, 3), y("y", 2, 4);
  CHECK_THROWS_AS(layer.forward(Space(), x, y), ShapeError);
  CHECK_THROWS_WITH(layer.forward(Space(), x, y),
                    Catch::Contains("GELU::forward: y must be 2x3, got 2x4"));
  Matrix<float, Mem> y3("y", 2, 3);
  layer.forward(Space(), x, y3);
  CHECK_THROWS_WITH(layer.backward(Space(), y, y),
                    Catch::Contains("GELU::backward: dy must be 2x3, got 2x4"));
}

// ---------------------------------------------------------------------------------------------
// PositionEmbedding

TEST_CASE("position embedding: adds exactly E to every sample", "[posembed]") {
  const FeatureShape shape{4, 3, 2};
  const std::size_t n = 3, C = 4, P = 6;
  nn::PositionEmbedding<double, Mem> layer(C, P);
  REQUIRE(layer.output_shape(shape) == shape);
  CHECK(layer.parameter_count() == P * C);
  const auto specs = layer.parameter_specs();
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].name == "weight");
  CHECK(specs[0].shape == std::vector<std::size_t>{P, C});
  auto buffer = bind_fresh<double>(layer, 7);
  const auto x = random_matrix<double>(n, shape.size(), 91);
  Matrix<double, Mem> y("y", n, shape.size());
  layer.forward(Space(), x, y);
  auto xh = to_host(x);
  auto yh = to_host(y);
  auto eh = to_host(layer.weight());
  REQUIRE(eh.extent(0) == P);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t p = 0; p < P; ++p)
      for (std::size_t c = 0; c < C; ++c)
        CHECK(yh(i, p + P * c) == xh(i, p + P * c) + eh(p, c));
}

TEST_CASE(
    "position embedding: initial values are normal with deviation 0.02 and a function of the seed",
    "[posembed]") {
  nn::PositionEmbedding<double, Mem> layer(40, 50);
  auto buffer = bind_fresh<double>(layer, 3);
  const auto a = host_values(buffer.parameters());
  double sum = 0, sq = 0;
  for (double v : a) {
    sum += v;
    sq += v * v;
  }
  const double n = double(a.size());
  CHECK(std::abs(sum / n) < 3 * 0.02 / std::sqrt(n));
  CHECK(std::sqrt(sq / n) == Approx(0.02).epsilon(0.05));
  layer.reset_parameters(Space(), 3);
  CHECK(host_values(buffer.parameters()) == a);
  layer.reset_parameters(Space(), 4);
  CHECK(host_values(buffer.parameters()) != a);
}

TEST_CASE("position embedding: finite differences of backward and of the R-operator",
          "[posembed][gradcheck][hvp]") {
  nn::PositionEmbedding<double, Mem> layer(6, 6);
  check_layer_gradients(layer, FeatureShape{6, 3, 2}, 3, 101);
  check_layer_r_operator(layer, FeatureShape{6, 3, 2}, 3, 102);
  nn::PositionEmbedding<double, Mem> flat(5, 1);
  check_layer_r_operator(flat, FeatureShape{5}, 4, 103);
}

TEST_CASE("position embedding: dE is the sum of dy over the batch", "[posembed]") {
  // 3 and 40 samples: on a GPU, a thread and a team per column.
  for (const std::size_t n : {std::size_t(3), std::size_t(40)}) {
    INFO("n = " << n);
    nn::PositionEmbedding<double, Mem> layer(3, 4);
    auto buffer = bind_fresh<double>(layer);
    layer.accumulate_gradients(false);
    const auto x = random_matrix<double>(n, 12, 115);
    const auto dy = random_matrix<double>(n, 12, 116);
    Matrix<double, Mem> y("y", n, 12), dx("dx", n, 12);
    layer.forward(Space(), x, y);
    layer.backward(Space(), dy, dx);
    auto dyh = to_host(dy);
    std::vector<double> ref(12, 0.0);
    for (std::size_t j = 0; j < 12; ++j)
      for (std::size_t i = 0; i < n; ++i)
        ref[j] += dyh(i, j);
    CHECK(max_rel_error(buffer.gradients(), ref) < 1e-14);
    CHECK(host_values(dx) == host_values(dy));
  }
}

TEST_CASE("position embedding: overwrite and accumulate gradient modes", "[posembed]") {
  nn::PositionEmbedding<double, Mem> layer(4, 6);
  const auto x = random_matrix<double>(3, 24, 111);
  check_gradient_modes(layer, x, 24, 112);
}

TEST_CASE("position embedding: wrong shapes name the argument and values", "[posembed][errors]") {
  CHECK_THROWS_WITH((nn::PositionEmbedding<float, Mem>(0, 4)), Catch::Contains("features = 0"));
  nn::PositionEmbedding<float, Mem> layer(4, 6);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{4, 2, 2}),
                    Catch::Contains("input height * width (positions) must be 6, got 4"));
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{3, 3, 2}),
                    Catch::Contains("input channels (features) must be 4, got 3"));
  auto buffer = bind_fresh<float>(layer);
  Matrix<float, Mem> x("x", 2, 20), y("y", 2, 24);
  CHECK_THROWS_AS(layer.forward(Space(), x, y), ShapeError);
  CHECK_THROWS_WITH(layer.forward(Space(), x, y),
                    Catch::Contains("x columns (positions * features) must be 24, got 20"));
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST_CASE("embedding: equals a host gather of the table", "[embedding]") {
  const std::size_t V = 7, D = 3, n = 2, T = 4;
  nn::Embedding<double, Mem> layer(V, D);
  CHECK(layer.output_shape(FeatureShape{1, 4, 1}) == FeatureShape{3, 4, 1});
  const auto specs = layer.parameter_specs();
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].shape == std::vector<std::size_t>{V, D});
  auto buffer = bind_fresh<double>(layer, 5);
  const std::vector<double> ids{0, 6, 3, 3, 1, 0, 5, 2}; // (n, t) at n + 2 t
  const auto x = ids_matrix(n, T, ids);
  Matrix<double, Mem> y("y", n, T * D);
  layer.forward(Space(), x, y);
  auto yh = to_host(y);
  auto eh = to_host(layer.weight());
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t d = 0; d < D; ++d)
        CHECK(yh(i, t + T * d) == eh(std::size_t(ids[i + n * t]), d));
}

TEST_CASE("embedding: initial values are standard normal and a function of the seed",
          "[embedding]") {
  nn::Embedding<double, Mem> layer(100, 30);
  auto buffer = bind_fresh<double>(layer, 9);
  const auto a = host_values(buffer.parameters());
  double sum = 0, sq = 0, sq4 = 0;
  for (double v : a) {
    sum += v;
    sq += v * v;
    sq4 += v * v * v * v;
  }
  const double n = double(a.size());
  CHECK(std::abs(sum / n) < 4 / std::sqrt(n));
  CHECK(sq / n == Approx(1.0).epsilon(0.08));
  CHECK(sq4 / n == Approx(3.0).epsilon(0.25)); // the normal's kurtosis, not a uniform's 1.8
  layer.reset_parameters(Space(), 9);
  CHECK(host_values(buffer.parameters()) == a);
}

TEST_CASE("embedding: equal ids accumulate both gradients and dx is zero", "[embedding]") {
  const Space space;
  const std::size_t V = 5, D = 2, n = 2, T = 3;
  nn::Embedding<double, Mem> layer(V, D);
  auto buffer = bind_fresh<double>(layer);
  const std::vector<double> ids{4, 1, 1, 4, 0, 1}; // id 1 three times, 4 twice, 2 and 3 unused
  const auto x = ids_matrix(n, T, ids);
  const auto dy = random_matrix<double>(n, T * D, 121);
  Matrix<double, Mem> y("y", n, T * D);
  const auto dx = random_matrix<double>(n, T, 122); // overwritten with zeros
  layer.accumulate_gradients(false);
  layer.forward(space, x, y);
  layer.backward(space, dy, dx);
  auto dyh = to_host(dy);
  std::vector<double> ref(V * D, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t d = 0; d < D; ++d)
        ref[std::size_t(ids[i + n * t]) + V * d] += dyh(i, t + T * d);
  const auto g = host_values(buffer.gradients());
  for (std::size_t k = 0; k < V * D; ++k)
    CHECK(g[k] == Approx(ref[k]).epsilon(1e-15).margin(1e-15));
  CHECK(g[2] == 0.0);
  CHECK(g[1] == Approx(dyh(1, 0) + dyh(0, 1) + dyh(1, 2)).epsilon(1e-15));
  CHECK(host_values(dx) == std::vector<double>(n * T, 0.0));
}

TEST_CASE("embedding: finite-difference parameter gradients in double", "[embedding][gradcheck]") {
  const Space space;
  const std::size_t V = 4, D = 3, n = 3, T = 2;
  nn::Embedding<double, Mem> layer(V, D);
  auto buffer = bind_fresh<double>(layer, 11);
  const auto x = ids_matrix(n, T, {2, 0, 2, 3, 2, 0});
  const auto r = random_matrix<double>(n, T * D, 131);
  Matrix<double, Mem> y("y", n, T * D);
  auto loss = [&] {
    layer.forward(space, x, y);
    space.fence();
    return weighted_sum(y, r);
  };
  loss();
  layer.backward(space, r, Matrix<double, Mem>());
  CHECK(max_rel_error(buffer.gradients(), numeric_gradient(buffer.parameters(), loss)) < 1e-8);
}

TEST_CASE("embedding: the R-operator gathers v and scatters R{dy}", "[embedding][hvp]") {
  // y is linear in E and does not depend on x (ids are not differentiable), so R{y} = V_E[ids]
  // and R{dE} = scatter(R{dy}), R{dx} = 0; checked as finite differences along v and R{dy}.
  const Space space;
  const std::size_t V = 4, D = 2, n = 2, T = 3;
  nn::Embedding<double, Mem> layer(V, D);
  auto buffer = bind_fresh<double>(layer, 13);
  REQUIRE(layer.supports_r_operator());
  const auto x = ids_matrix(n, T, {3, 1, 1, 0, 3, 3});
  const auto dy = random_matrix<double>(n, T * D, 141);
  const auto rdy = random_matrix<double>(n, T * D, 142);
  const auto v = random_matrix<double>(V * D, 1, 143);
  Vector<double, Mem> hv("hv", V * D);
  Kokkos::deep_copy(hv, 1.0); // backward_r adds
  layer.bind_direction(v.data(), hv.data());
  Matrix<double, Mem> y("y", n, T * D), ry("ry", n, T * D), dx("dx", n, T);
  const auto rdx = random_matrix<double>(n, T, 144);
  layer.accumulate_gradients(false);
  layer.forward(space, x, y);
  layer.forward_r(space, Matrix<double, Mem>(), ry);
  layer.backward(space, dy, dx);
  layer.backward_r(space, dy, rdy, rdx);
  const auto ry_a = host_values(ry), hv_a = host_values(hv);
  CHECK(host_values(rdx) == std::vector<double>(n * T, 0.0));

  const auto theta0 = host_values(buffer.parameters()), v0 = host_values(v), dy0 = host_values(dy),
             rdy0 = host_values(rdy);
  const double h = 1e-3;
  auto at = [&](double eps) {
    std::vector<double> th(theta0.size()), d(dy0.size());
    for (std::size_t k = 0; k < th.size(); ++k)
      th[k] = theta0[k] + eps * v0[k];
    for (std::size_t k = 0; k < d.size(); ++k)
      d[k] = dy0[k] + eps * rdy0[k];
    set_from(buffer.parameters(), th);
    Matrix<double, Mem> ye("ye", n, T * D), dye("dye", n, T * D);
    set_from(dye, d);
    layer.forward(space, x, ye);
    layer.backward(space, dye, Matrix<double, Mem>());
    return std::vector<std::vector<double>>{host_values(ye), host_values(buffer.gradients())};
  };
  const auto plus = at(h), minus = at(-h);
  for (std::size_t k = 0; k < ry_a.size(); ++k)
    CHECK(ry_a[k] == Approx((plus[0][k] - minus[0][k]) / (2 * h)).epsilon(1e-10));
  for (std::size_t k = 0; k < hv_a.size(); ++k)
    CHECK(hv_a[k] - 1.0 ==
          Approx((plus[1][k] - minus[1][k]) / (2 * h)).epsilon(1e-10).margin(1e-12));
  CHECK(hv_a[2] == 1.0); // id 2 does not occur
}

TEST_CASE("embedding: overwrite and accumulate gradient modes", "[embedding]") {
  nn::Embedding<double, Mem> layer(5, 3);
  const auto x = ids_matrix(3, 2, {0, 4, 4, 1, 2, 4});
  check_gradient_modes(layer, x, 6, 151);
}

TEST_CASE("embedding: bad ids are counted and named and never clamped", "[embedding][errors]") {
  const std::size_t V = 10, D = 2, n = 2, T = 4;
  nn::Embedding<double, Mem> layer(V, D);
  auto buffer = bind_fresh<double>(layer);
  Matrix<double, Mem> y("y", n, T * D);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto bad = ids_matrix(n, T, {3, 9, 2.5, 0, -1, 10, nan, 9});
  CHECK_THROWS_AS(layer.forward(Space(), bad, y), ValueError);
  CHECK_THROWS_WITH(layer.forward(Space(), bad, y),
                    Catch::Contains("Embedding::forward: x holds 4 token ids that are not "
                                    "integers in [0, num_embeddings) = [0, 10)") &&
                        Catch::Contains("the first is x(0, 1) = 2.5"));
  const auto one = ids_matrix(n, T, {3, 9, 2, 0, 1, 1e30, 8, 9});
  CHECK_THROWS_WITH(layer.forward(Space(), one, y),
                    Catch::Contains("x holds 1 token id that") &&
                        Catch::Contains("the first is x(1, 2) = 1e+30"));
  // No backward after a refused forward.
  CHECK_THROWS_WITH(layer.backward(Space(), y, Matrix<double, Mem>()),
                    Catch::Contains("Embedding::backward: no successful forward()"));
  nn::Embedding<float, Mem> lf(10, 2);
  auto bf = bind_fresh<float>(lf);
  Matrix<float, Mem> xf("xf", 1, 2), yf("yf", 1, 4);
  set_from(xf, {1.0, 9.5});
  CHECK_THROWS_WITH(lf.forward(Space(), xf, yf), Catch::Contains("x(0, 1) = 9.5"));
  set_from(xf, {1.0, 9.0});
  CHECK_NOTHROW(lf.forward(Space(), xf, yf));
}

TEST_CASE("embedding: wrong shapes name the argument and values", "[embedding][errors]") {
  CHECK_THROWS_WITH((nn::Embedding<float, Mem>(0, 4)), Catch::Contains("num_embeddings = 0"));
  nn::Embedding<float, Mem> layer(10, 4);
  CHECK_THROWS_AS(layer.output_shape(FeatureShape{2, 5, 1}), ShapeError);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{2, 5, 1}),
                    Catch::Contains("input channels (one id per token) must be 1, got 2"));
  auto buffer = bind_fresh<float>(layer);
  Matrix<float, Mem> x("x", 2, 5), y("y", 2, 16);
  CHECK_THROWS_WITH(layer.forward(Space(), x, y),
                    Catch::Contains("y columns (tokens * embedding_dim) must be 20, got 16"));
}

} // namespace test_transformer_layers
