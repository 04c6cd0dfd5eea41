#include "layer_check.hpp"
#include "test_helpers.hpp"

#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/batch_norm.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

namespace test_batch_norm {

using namespace kat;
using namespace kat::test;

namespace {

template <class V> void set_from(const V &v, const std::vector<double> &values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t k = 0; k < values.size(); ++k)
    h(k) = static_cast<typename V::non_const_value_type>(values[k]);
  Kokkos::deep_copy(v, h);
}

// Per-channel biased mean and variance of a batch in FeatureShape order, computed on host
// in double, two-pass.
struct HostStats {
  std::vector<double> mean, var;
};

template <class HostMatrix> HostStats host_stats(const HostMatrix &xh, const FeatureShape &s) {
  const std::size_t n = xh.extent(0), hw = std::size_t(s.height) * std::size_t(s.width);
  const double count = double(n * hw);
  HostStats st{std::vector<double>(s.channels, 0.0), std::vector<double>(s.channels, 0.0)};
  for (int c = 0; c < s.channels; ++c) {
    for (std::size_t p = 0; p < hw; ++p)
      for (std::size_t i = 0; i < n; ++i)
        st.mean[c] += double(xh(i, p + hw * c));
    st.mean[c] /= count;
    for (std::size_t p = 0; p < hw; ++p)
      for (std::size_t i = 0; i < n; ++i) {
        const double d = double(xh(i, p + hw * c)) - st.mean[c];
        st.var[c] += d * d;
      }
    st.var[c] /= count;
  }
  return st;
}

// Training forward of one BatchNorm over `shape` with non-trivial γ, β, checked against the
// host formula, and the normalized output's per-channel moments.
void check_training_forward(const FeatureShape &shape, std::size_t n, std::uint64_t seed) {
  const std::size_t C = shape.channels, hw = shape.size() / C;
  nn::BatchNorm<double, Mem> layer(C, 1e-5);
  REQUIRE(layer.output_shape(shape) == shape);
  auto buffer = bind_fresh<double>(layer);
  std::vector<double> gamma(C), beta(C);
  for (std::size_t c = 0; c < C; ++c) {
    gamma[c] = 0.5 + 0.25 * double(c);
    beta[c] = -1.0 + 0.75 * double(c);
  }
  set_from(layer.gamma(), gamma);
  set_from(layer.beta(), beta);

  auto x = random_matrix<double>(n, shape.size(), seed, -2.0, 3.0);
  Matrix<double, Mem> y("y", n, shape.size());
  layer.forward(Space(), x, y);
  auto xh = to_host(x);
  auto yh = to_host(y);
  const auto st = host_stats(xh, shape);
  // x̂ = (y − β)/γ must have per-channel mean 0 and biased variance 1 (up to eps).
  auto xhat = Kokkos::create_mirror(Kokkos::HostSpace(), x);
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t p = 0; p < hw; ++p)
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t j = p + hw * c;
        const double ref = (xh(i, j) - st.mean[c]) / std::sqrt(st.var[c] + 1e-5);
        CHECK(yh(i, j) == Approx(gamma[c] * ref + beta[c]).epsilon(1e-12).margin(1e-12));
        xhat(i, j) = (yh(i, j) - beta[c]) / gamma[c];
      }
  const auto moments = host_stats(xhat, shape);
  for (std::size_t c = 0; c < C; ++c) {
    CHECK(std::abs(moments.mean[c]) < 1e-12);
    CHECK(moments.var[c] == Approx(st.var[c] / (st.var[c] + 1e-5)).epsilon(1e-12));
    CHECK(moments.var[c] == Approx(1.0).epsilon(1e-4));
  }
}

} // namespace

TEST_CASE("batchnorm: training forward matches a host reference", "[batchnorm]") {
  SECTION("BatchNorm2d C=3 4x5 N=6") { check_training_forward(FeatureShape{3, 4, 5}, 6, 11); }
  SECTION("BatchNorm1d F=7 N=5") { check_training_forward(FeatureShape{7}, 5, 12); }
}

TEST_CASE("batchnorm: float statistics stay accurate far from zero", "[batchnorm]") {
  // Values 1000 ± 1: a one-pass Σx² − Mμ² in float would lose every digit of the variance.
  // 16 x 8 x 8 values a channel: one reduction segment; 16 x 32 x 27 = 13,824: four
  // segments (the last of 1,536), whose moments combine around their own means.
  const int h = GENERATE(8, 32);
  const int w = h == 8 ? 8 : 27;
  const FeatureShape shape{2, h, w};
  const std::size_t n = 16;
  nn::BatchNorm2d<float, Mem> layer(2);
  auto buffer = bind_fresh<float>(layer);
  auto x = random_matrix<float>(n, shape.size(), 5, 999.0, 1001.0);
  Matrix<float, Mem> y("y", n, shape.size());
  layer.forward(Space(), x, y);
  const auto st = host_stats(to_host(y), shape);
  for (int c = 0; c < 2; ++c) {
    CHECK(std::abs(st.mean[c]) < 1e-3);
    CHECK(st.var[c] == Approx(1.0).epsilon(1e-3));
  }
}

TEST_CASE("batchnorm: running statistics follow the PyTorch update", "[batchnorm]") {
  const FeatureShape shape{3, 2, 3};
  const std::size_t n = 4, C = 3, M = n * 6;
  const double momentum = 0.3;
  nn::BatchNorm2d<double, Mem> layer(C, 1e-5, momentum);
  auto buffer = bind_fresh<double>(layer);
  Matrix<double, Mem> y("y", n, shape.size());
  std::vector<double> rm(C, 0.0), rv(C, 1.0);
  for (int step = 0; step < 2; ++step) {
    auto x = random_matrix<double>(n, shape.size(), 40 + step, -1.0 + step, 2.0 + 3 * step);
    layer.forward(Space(), x, y);
    const auto st = host_stats(to_host(x), shape);
    for (std::size_t c = 0; c < C; ++c) {
      rm[c] = (1 - momentum) * rm[c] + momentum * st.mean[c];
      rv[c] = (1 - momentum) * rv[c] + momentum * st.var[c] * double(M) / double(M - 1);
    }
  }
  CHECK(layer.num_batches_tracked() == 2);
  auto rmh = to_host(layer.running_mean());
  auto rvh = to_host(layer.running_var());
  for (std::size_t c = 0; c < C; ++c) {
    CHECK(rmh(c) == Approx(rm[c]).epsilon(1e-13));
    CHECK(rvh(c) == Approx(rv[c]).epsilon(1e-13));
  }

  SECTION("evaluation leaves them unchanged") {
    layer.train(false);
    layer.forward(Space(), random_matrix<double>(n, shape.size(), 9), y);
    auto rmh2 = to_host(layer.running_mean());
    auto rvh2 = to_host(layer.running_var());
    for (std::size_t c = 0; c < C; ++c) {
      CHECK(rmh2(c) == rmh(c));
      CHECK(rvh2(c) == rvh(c));
    }
    CHECK(layer.num_batches_tracked() == 2);
  }
  SECTION("reset_parameters resets them") {
    layer.reset_parameters(Space(), 0);
    auto rmh2 = to_host(layer.running_mean());
    auto rvh2 = to_host(layer.running_var());
    for (std::size_t c = 0; c < C; ++c) {
      CHECK(rmh2(c) == 0.0);
      CHECK(rvh2(c) == 1.0);
    }
    CHECK(layer.num_batches_tracked() == 0);
  }
}

TEST_CASE("batchnorm: evaluation uses the running statistics", "[batchnorm]") {
  const FeatureShape shape{2, 3, 1};
  const std::size_t n = 5, C = 2, hw = 3;
  nn::BatchNorm2d<double, Mem> layer(C);
  auto buffer = bind_fresh<double>(layer);
  const std::vector<double> gamma{1.5, -0.5}, beta{0.25, 2.0}, rm{0.3, -1.2}, rv{2.0, 0.5};
  set_from(layer.gamma(), gamma);
  set_from(layer.beta(), beta);
  set_from(layer.running_mean(), rm);
  set_from(layer.running_var(), rv);
  auto x = random_matrix<double>(n, shape.size(), 77);
  Matrix<double, Mem> y_eval("y_eval", n, shape.size()), y_train("y_train", n, shape.size());
  layer.train(false);
  layer.forward(Space(), x, y_eval);
  layer.train(true);
  layer.forward(Space(), x, y_train);
  auto xh = to_host(x);
  auto eh = to_host(y_eval);
  auto th = to_host(y_train);
  double max_diff = 0;
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t p = 0; p < hw; ++p)
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t j = p + hw * c;
        const double ref = gamma[c] * (xh(i, j) - rm[c]) / std::sqrt(rv[c] + 1e-5) + beta[c];
        CHECK(eh(i, j) == Approx(ref).epsilon(1e-14).margin(1e-14));
        max_diff = std::max(max_diff, std::abs(eh(i, j) - th(i, j)));
      }
  CHECK(max_diff > 0.1);
}

TEST_CASE("batchnorm: finite-difference gradients in double", "[batchnorm][gradcheck]") {
  // Start γ, β away from 1, 0 (set on the first forward only, so the finite differences
  // perturb from there) so dx's dependence on γ is exercised.
  auto perturb_affine = [](nn::BatchNorm<double, Mem> &layer) {
    return [&layer, done = false]() mutable {
      if (!done && layer.affine()) {
        std::vector<double> g(layer.channels()), b(layer.channels());
        for (std::size_t c = 0; c < g.size(); ++c) {
          g[c] = 0.7 + 0.3 * double(c);
          b[c] = 0.1 - 0.2 * double(c);
        }
        set_from(layer.gamma(), g);
        set_from(layer.beta(), b);
      }
      done = true;
    };
  };
  SECTION("training BatchNorm2d with affine") {
    nn::BatchNorm2d<double, Mem> layer(3);
    check_layer_gradients(layer, FeatureShape{3, 2, 2}, 3, 31, perturb_affine(layer));
  }
  SECTION("training BatchNorm2d without affine") {
    nn::BatchNorm2d<double, Mem> layer(2, 1e-5, 0.1, false);
    check_layer_gradients(layer, FeatureShape{2, 3, 2}, 2, 32);
  }
  SECTION("training BatchNorm1d with affine") {
    nn::BatchNorm1d<double, Mem> layer(4);
    check_layer_gradients(layer, FeatureShape{4}, 5, 33, perturb_affine(layer));
  }
  SECTION("training BatchNorm1d without affine") {
    nn::BatchNorm1d<double, Mem> layer(3, 1e-3, 0.5, false);
    check_layer_gradients(layer, FeatureShape{3}, 4, 34);
  }
  SECTION("training with two values per channel") {
    nn::BatchNorm1d<double, Mem> layer(2);
    check_layer_gradients(layer, FeatureShape{2}, 2, 35, perturb_affine(layer));
  }
  SECTION("evaluation with fixed running statistics") {
    for (bool affine : {true, false}) {
      nn::BatchNorm2d<double, Mem> layer(3, 1e-5, 0.1, affine);
      layer.train(false);
      auto set_stats = [&layer, first = perturb_affine(layer)]() mutable {
        first();
        set_from(layer.running_mean(), {0.2, -0.4, 1.0});
        set_from(layer.running_var(), {0.5, 1.5, 3.0});
      };
      check_layer_gradients(layer, FeatureShape{3, 2, 1}, 3, 36, set_stats);
    }
  }
}

TEST_CASE("batchnorm: overwrite and accumulate gradient modes", "[batchnorm]") {
  const FeatureShape shape{2, 2, 2};
  const std::size_t n = 3, C = 2;
  auto x = random_matrix<double>(n, shape.size(), 51);
  auto dy = random_matrix<double>(n, shape.size(), 52);
  Matrix<double, Mem> y("y", n, shape.size());
  for (bool training : {true, false}) {
    INFO("training = " << training);
    nn::BatchNorm2d<double, Mem> layer(C);
    auto buffer = bind_fresh<double>(layer);
    set_from(layer.gamma(), {1.3, 0.6});
    layer.train(training);
    // Reference gradient g from a zeroed buffer.
    Kokkos::deep_copy(buffer.gradients(), 0.0);
    layer.forward(Space(), x, y);
    layer.backward(Space(), dy, Matrix<double, Mem>());
    auto g = to_host(buffer.gradients());
    double norm = 0;
    for (std::size_t k = 0; k < g.extent(0); ++k)
      norm += std::abs(g(k));
    REQUIRE(norm > 0.1);

    const std::vector<double> stale{5.0, -3.0, 7.0, 0.5};
    set_from(buffer.gradients(), stale);
    layer.accumulate_gradients(true);
    layer.forward(Space(), x, y);
    layer.backward(Space(), dy, Matrix<double, Mem>());
    auto acc = to_host(buffer.gradients());
    for (std::size_t k = 0; k < 2 * C; ++k)
      CHECK(acc(k) == Approx(stale[k] + g(k)).epsilon(1e-14));

    set_from(buffer.gradients(), stale);
    layer.accumulate_gradients(false);
    layer.forward(Space(), x, y);
    layer.backward(Space(), dy, Matrix<double, Mem>());
    auto over = to_host(buffer.gradients());
    for (std::size_t k = 0; k < 2 * C; ++k)
      CHECK(over(k) == Approx(g(k)).epsilon(1e-14));
  }
}

TEST_CASE("batchnorm: backward follows the mode of the last forward", "[batchnorm]") {
  const FeatureShape shape{2};
  const std::size_t n = 4;
  nn::BatchNorm1d<double, Mem> layer(2);
  auto buffer = bind_fresh<double>(layer);
  auto x = random_matrix<double>(n, 2, 61);
  auto dy = random_matrix<double>(n, 2, 62);
  Matrix<double, Mem> y("y", n, 2), dx_train("dx_train", n, 2), dx_after("dx_after", n, 2);
  layer.forward(Space(), x, y);
  layer.backward(Space(), dy, dx_train);
  layer.forward(Space(), x, y);
  layer.train(false); // switched between forward and backward: still a training backward
  layer.backward(Space(), dy, dx_after);
  auto a = to_host(dx_train);
  auto b = to_host(dx_after);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < 2; ++j)
      CHECK(b(i, j) == a(i, j));
  // The training dx sums to zero per channel (the mean is subtracted).
  for (std::size_t j = 0; j < 2; ++j) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i)
      s += a(i, j);
    CHECK(std::abs(s) < 1e-13);
  }
  (void)shape;
}

TEST_CASE("batchnorm: workspaces do not grow in a steady loop", "[batchnorm]") {
  nn::BatchNorm2d<float, Mem> layer(4);
  auto buffer = bind_fresh<float>(layer);
  Matrix<float, Mem> y("y", 8, 4 * 9), dx("dx", 8, 4 * 9);
  auto x = random_matrix<float>(8, 4 * 9, 71);
  layer.forward(Space(), x, y);
  layer.backward(Space(), y, dx);
  const std::size_t after_first = layer.workspace_allocations();
  CHECK(after_first == 3); // statistics, coefficients, the segments' partial sums
  for (int k = 0; k < 3; ++k) {
    layer.forward(Space(), x, y);
    layer.backward(Space(), y, dx);
  }
  CHECK(layer.workspace_allocations() == after_first);
}

TEST_CASE("batchnorm: bad arguments name the argument and values", "[batchnorm][errors]") {
  CHECK_THROWS_AS((nn::BatchNorm<float, Mem>(0)), ValueError);
  CHECK_THROWS_WITH((nn::BatchNorm<float, Mem>(0)), Catch::Contains("channels = 0"));
  CHECK_THROWS_WITH((nn::BatchNorm<float, Mem>(3, 0.0)), Catch::Contains("eps = 0"));
  CHECK_THROWS_WITH((nn::BatchNorm<float, Mem>(3, -1.0)), Catch::Contains("eps = -1"));
  CHECK_THROWS_AS((nn::BatchNorm<float, Mem>(3, std::nan(""))), ValueError);
  CHECK_THROWS_AS((nn::BatchNorm<float, Mem>(3, HUGE_VAL)), ValueError);
  CHECK_THROWS_WITH((nn::BatchNorm<float, Mem>(3, 1e-5, 1.5)),
                    Catch::Contains("momentum must be in [0, 1], got momentum = 1.5"));
  CHECK_THROWS_AS((nn::BatchNorm<float, Mem>(3, 1e-5, -0.1)), ValueError);
  CHECK_THROWS_AS((nn::BatchNorm<float, Mem>(3, 1e-5, std::nan(""))), ValueError);
  CHECK_NOTHROW(nn::BatchNorm<float, Mem>(3, 1e-5, 0.0));
  CHECK_NOTHROW(nn::BatchNorm<float, Mem>(3, 1e-5, 1.0));

  nn::BatchNorm2d<float, Mem> layer(3);
  CHECK_THROWS_AS(layer.output_shape(FeatureShape{4, 2, 2}), ShapeError);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{4, 2, 2}),
                    Catch::Contains("input channels must be 3, got 4"));
  Matrix<float, Mem> y("y", 2, 6);
  CHECK_THROWS_AS(layer.forward(Space(), Matrix<float, Mem>("x", 2, 6), y), Error);
  auto buffer = bind_fresh<float>(layer);
  Matrix<float, Mem> x7("x7", 2, 7), y7("y7", 2, 7);
  CHECK_THROWS_WITH(layer.forward(Space(), x7, y7),
                    Catch::Contains("positive multiple of channels = 3, got 7"));
  CHECK_THROWS_AS(layer.forward(Space(), Matrix<float, Mem>("x", 3, 6), y), ShapeError);

  SECTION("one value per channel in training") {
    nn::BatchNorm1d<float, Mem> bn(3);
    auto b = bind_fresh<float>(bn);
    auto x = random_matrix<float>(1, 3, 81);
    Matrix<float, Mem> y1("y1", 1, 3);
    CHECK_THROWS_AS(bn.forward(Space(), x, y1), ValueError);
    CHECK_THROWS_WITH(bn.forward(Space(), x, y1),
                      Catch::Contains("Expected more than 1 value per channel when training"));
    CHECK(bn.num_batches_tracked() == 0);
    bn.train(false);
    CHECK_NOTHROW(bn.forward(Space(), x, y1));
    // A single image with H·W > 1 has enough values.
    nn::BatchNorm2d<float, Mem> bn2(3);
    auto b2 = bind_fresh<float>(bn2);
    Matrix<float, Mem> x2("x2", 1, 12), y2("y2", 1, 12);
    CHECK_NOTHROW(bn2.forward(Space(), x2, y2));
  }
  SECTION("backward before forward") {
    Matrix<float, Mem> dy("dy", 2, 6);
    CHECK_THROWS_WITH(layer.backward(Space(), dy, Matrix<float, Mem>()),
                      Catch::Contains("before forward"));
  }
}

TEST_CASE("batchnorm: several blocks per channel match the host formulas", "[batchnorm]") {
  // M = 9 * 30 * 17 = 4590: more than one element-wise block and not a multiple of 8.
  const FeatureShape shape{3, 30, 17};
  const std::size_t n = 9, C = 3, hw = 510, M = n * hw;
  nn::BatchNorm2d<double, Mem> layer(C);
  auto buffer = bind_fresh<double>(layer);
  const std::vector<double> gamma{0.8, 1.7, -0.4}, beta{0.1, -0.3, 2.0};
  set_from(layer.gamma(), gamma);
  set_from(layer.beta(), beta);
  layer.accumulate_gradients(false);
  auto x = random_matrix<double>(n, shape.size(), 91, -1.0, 4.0);
  auto dy = random_matrix<double>(n, shape.size(), 92);
  Matrix<double, Mem> y("y", n, shape.size()), dx("dx", n, shape.size());
  layer.forward(Space(), x, y);
  layer.backward(Space(), dy, dx);
  auto xh = to_host(x);
  auto yh = to_host(y);
  auto dyh = to_host(dy);
  auto dxh = to_host(dx);
  auto gh = to_host(buffer.gradients());
  const auto st = host_stats(xh, shape);
  for (std::size_t c = 0; c < C; ++c) {
    const double inv_std = 1.0 / std::sqrt(st.var[c] + 1e-5);
    double dbeta = 0, dgamma = 0;
    for (std::size_t j = hw * c; j < hw * (c + 1); ++j)
      for (std::size_t i = 0; i < n; ++i) {
        dbeta += dyh(i, j);
        dgamma += dyh(i, j) * (xh(i, j) - st.mean[c]) * inv_std;
      }
    CHECK(gh(c) == Approx(dgamma).epsilon(1e-11));
    CHECK(gh(C + c) == Approx(dbeta).epsilon(1e-11));
    double max_y = 0, max_dx = 0;
    for (std::size_t j = hw * c; j < hw * (c + 1); ++j)
      for (std::size_t i = 0; i < n; ++i) {
        const double xhat = (xh(i, j) - st.mean[c]) * inv_std;
        max_y = std::max(max_y, std::abs(yh(i, j) - (gamma[c] * xhat + beta[c])));
        const double ref =
            gamma[c] * inv_std / double(M) * (double(M) * dyh(i, j) - dbeta - xhat * dgamma);
        max_dx = std::max(max_dx, std::abs(dxh(i, j) - ref));
      }
    CHECK(max_y < 1e-12);
    CHECK(max_dx < 1e-12);
  }
}

} // namespace test_batch_norm
