#include "layer_check.hpp"
#include "test_helpers.hpp"

#include <kat/nn/activation.hpp>
#include <kat/nn/avg_pool2d.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/global_avg_pool2d.hpp>
#include <kat/nn/max_pool2d.hpp>
#include <kat/nn/models.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace test_pooling {

using namespace kat;
using namespace kat::test;

namespace {

struct Config {
  FeatureShape in;
  std::size_t batch;
  std::array<int, 2> kernel, stride, padding;
};

// Geometries covering non-overlapping, overlapping (stride < kernel), padded, rectangular
// and odd-sized (7x5) inputs, several channels and batches.
const std::vector<Config> configs = {
    {{2, 4, 6}, 3, {2, 2}, {2, 2}, {0, 0}}, {{3, 7, 5}, 2, {3, 3}, {2, 2}, {1, 1}},
    {{2, 7, 5}, 4, {3, 3}, {1, 1}, {0, 0}}, {{1, 7, 5}, 3, {2, 2}, {1, 1}, {1, 1}},
    {{3, 6, 7}, 2, {3, 2}, {2, 1}, {1, 0}}, {{2, 5, 5}, 1, {4, 4}, {3, 3}, {2, 2}},
    {{2, 7, 5}, 2, {2, 3}, {3, 2}, {0, 1}}};

// Element (n, c, h, w) of a host batch matrix in KAT's feature order.
template <class H> double at(const H &x, const FeatureShape &s, int n, int c, int h, int w) {
  return static_cast<double>(x(n, h + s.height * (w + s.width * c)));
}

int out_dim(int size, int k, int s, int p) { return (size + 2 * p - k) / s + 1; }

// Independent references written as PyTorch's CPU kernels (row-major windows, -inf start,
// `val > max || isnan(val)`), indexed through explicit (n, c, oh, ow) loops.
template <class H>
std::vector<double> reference_pool(const H &x, const Config &cfg, bool max, std::size_t batch) {
  const auto &s = cfg.in;
  const int oh_n = out_dim(s.height, cfg.kernel[0], cfg.stride[0], cfg.padding[0]);
  const int ow_n = out_dim(s.width, cfg.kernel[1], cfg.stride[1], cfg.padding[1]);
  std::vector<double> y(batch * s.channels * oh_n * ow_n);
  for (std::size_t n = 0; n < batch; ++n)
    for (int c = 0; c < s.channels; ++c)
      for (int oh = 0; oh < oh_n; ++oh)
        for (int ow = 0; ow < ow_n; ++ow) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          for (int kh = 0; kh < cfg.kernel[0]; ++kh)
            for (int kw = 0; kw < cfg.kernel[1]; ++kw) {
              const int h = oh * cfg.stride[0] - cfg.padding[0] + kh;
              const int w = ow * cfg.stride[1] - cfg.padding[1] + kw;
              if (h < 0 || h >= s.height || w < 0 || w >= s.width)
                continue; // max: -inf padding; avg: zero padding, still counted below
              const double v = at(x, s, int(n), c, h, w);
              if (v > best || std::isnan(v))
                best = v;
              sum += v;
            }
          const std::size_t col = oh + oh_n * (ow + ow_n * c);
          y[n + batch * col] = max ? best : sum / (cfg.kernel[0] * cfg.kernel[1]);
        }
  return y;
}

template <class Scalar>
Matrix<Scalar, Mem> host_to_device(const std::vector<double> &v, std::size_t n, std::size_t m) {
  Matrix<Scalar, Mem> d("x", n, m);
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t j = 0; j < m; ++j)
    for (std::size_t i = 0; i < n; ++i)
      h(i, j) = static_cast<Scalar>(v[i + n * j]);
  Kokkos::deep_copy(d, h);
  return d;
}

// A random permutation of 0..count-1, scaled to [-1, 1): no two inputs closer than 2/count,
// so a finite-difference step never changes a window's argmax.
std::vector<double> distinct_values(std::size_t count, std::uint64_t seed) {
  std::vector<double> v(count);
  for (std::size_t k = 0; k < count; ++k)
    v[k] = -1.0 + 2.0 * double(k) / double(count);
  HostRng(seed).shuffle(v.begin(), v.end());
  return v;
}

template <class L> L make(const Config &cfg) { return L(cfg.kernel, cfg.stride, cfg.padding); }

} // namespace

TEST_CASE("pool: max forward matches a nested-loop reference", "[pool][max]") {
  for (std::size_t k = 0; k < configs.size(); ++k) {
    const Config &cfg = configs[k];
    INFO("config " << k);
    auto layer = make<nn::MaxPool2d<float, Mem>>(cfg);
    const FeatureShape out = layer.output_shape(cfg.in);
    CHECK(out == FeatureShape{cfg.in.channels,
                              out_dim(cfg.in.height, cfg.kernel[0], cfg.stride[0], cfg.padding[0]),
                              out_dim(cfg.in.width, cfg.kernel[1], cfg.stride[1], cfg.padding[1])});
    auto x = random_matrix<float>(cfg.batch, cfg.in.size(), 100 + k);
    Matrix<float, Mem> y("y", cfg.batch, out.size());
    layer.forward(Space(), x, y);
    const auto ref = reference_pool(to_host(x), cfg, true, cfg.batch);
    auto yh = to_host(y);
    for (std::size_t j = 0; j < out.size(); ++j)
      for (std::size_t i = 0; i < cfg.batch; ++i)
        REQUIRE(double(yh(i, j)) == ref[i + cfg.batch * j]); // max is exact
  }
}

TEST_CASE("pool: avg forward matches a nested-loop reference", "[pool][avg]") {
  for (std::size_t k = 0; k < configs.size(); ++k) {
    const Config &cfg = configs[k];
    INFO("config " << k);
    auto layer = make<nn::AvgPool2d<double, Mem>>(cfg);
    const FeatureShape out = layer.output_shape(cfg.in);
    auto x = random_matrix<double>(cfg.batch, cfg.in.size(), 200 + k);
    Matrix<double, Mem> y("y", cfg.batch, out.size());
    layer.forward(Space(), x, y);
    const auto ref = reference_pool(to_host(x), cfg, false, cfg.batch);
    auto yh = to_host(y);
    for (std::size_t j = 0; j < out.size(); ++j)
      for (std::size_t i = 0; i < cfg.batch; ++i)
        REQUIRE(yh(i, j) == Approx(ref[i + cfg.batch * j]).epsilon(1e-14).margin(1e-15));
  }
}

TEST_CASE("pool: global avg forward is the per-channel mean", "[pool][global]") {
  const FeatureShape in{3, 7, 5};
  const std::size_t n = 4;
  nn::GlobalAvgPool2d<double, Mem> layer;
  CHECK(layer.output_shape(in) == FeatureShape{3, 1, 1});
  auto x = random_matrix<double>(n, in.size(), 300);
  Matrix<double, Mem> y("y", n, 3);
  layer.forward(Space(), x, y);
  auto xh = to_host(x);
  auto yh = to_host(y);
  for (std::size_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c) {
      double sum = 0;
      for (int h = 0; h < 7; ++h)
        for (int w = 0; w < 5; ++w)
          sum += at(xh, in, int(i), c, h, w);
      CHECK(yh(i, c) == Approx(sum / 35).epsilon(1e-14));
    }
}

TEST_CASE("pool: finite-difference gradients in double", "[pool][gradcheck]") {
  SECTION("avg") {
    for (std::size_t k = 0; k < configs.size(); ++k) {
      INFO("config " << k);
      auto layer = make<nn::AvgPool2d<double, Mem>>(configs[k]);
      check_layer_gradients(layer, configs[k].in, configs[k].batch, 400 + k);
    }
  }
  SECTION("global avg") {
    nn::GlobalAvgPool2d<double, Mem> layer;
    check_layer_gradients(layer, FeatureShape{3, 7, 5}, 3, 410);
    check_layer_gradients(layer, FeatureShape{2, 1, 1}, 2, 411);
  }
  SECTION("max, distinct inputs") {
    for (std::size_t k = 0; k < configs.size(); ++k) {
      const Config &cfg = configs[k];
      INFO("config " << k);
      auto layer = make<nn::MaxPool2d<double, Mem>>(cfg);
      const FeatureShape out = layer.output_shape(cfg.in);
      auto x = host_to_device<double>(distinct_values(cfg.batch * cfg.in.size(), 500 + k),
                                      cfg.batch, cfg.in.size());
      auto r = random_matrix<double>(cfg.batch, out.size(), 510 + k);
      Matrix<double, Mem> y("y", cfg.batch, out.size()), dx("dx", cfg.batch, cfg.in.size());
      auto loss = [&] {
        layer.forward(Space(), x, y);
        Space().fence();
        return weighted_sum(y, r);
      };
      loss();
      layer.backward(Space(), r, dx);
      CHECK(max_rel_error(dx, numeric_gradient(x, loss)) < 1e-7);
    }
  }
}

TEST_CASE("pool: max ties go to the first maximum in row-major window order", "[pool][max]") {
  // One 2x2 window holding 5 at (h, w) = (0, 1) and (1, 0). Row-major scan (PyTorch) meets
  // (0, 1) first; KAT's memory order (h fastest) would meet (1, 0) first.
  const FeatureShape in{1, 2, 2};
  nn::MaxPool2d<double, Mem> layer(2);
  REQUIRE(layer.output_shape(in) == FeatureShape{1, 1, 1});
  std::vector<double> v(4);
  v[0 + 2 * 0] = 1; // (0, 0)
  v[1 + 2 * 0] = 5; // (1, 0)
  v[0 + 2 * 1] = 5; // (0, 1)
  v[1 + 2 * 1] = 2; // (1, 1)
  auto x = host_to_device<double>(v, 1, 4);
  Matrix<double, Mem> y("y", 1, 1), dx("dx", 1, 4);
  layer.forward(Space(), x, y);
  auto dy = host_to_device<double>({3.0}, 1, 1);
  layer.backward(Space(), dy, dx);
  CHECK(to_host(y)(0, 0) == 5);
  auto dxh = to_host(dx);
  CHECK(dxh(0, 0 + 2 * 1) == 3); // (0, 1) takes the gradient
  CHECK(dxh(0, 1 + 2 * 0) == 0);
  CHECK(dxh(0, 0) == 0);
  CHECK(dxh(0, 3) == 0);

  SECTION("all equal: every window picks its top-left element") {
    const FeatureShape s{1, 3, 3};
    nn::MaxPool2d<double, Mem> overlap(2, 1);
    REQUIRE(overlap.output_shape(s) == FeatureShape{1, 2, 2});
    auto ones = host_to_device<double>(std::vector<double>(9, 1.0), 1, 9);
    Matrix<double, Mem> y4("y", 1, 4), dx9("dx", 1, 9);
    overlap.forward(Space(), ones, y4);
    overlap.backward(Space(), host_to_device<double>({1, 10, 100, 1000}, 1, 4), dx9);
    auto g = to_host(dx9);
    // outputs (oh, ow) at column oh + 2 ow pick input (oh, ow), column oh + 3 ow
    CHECK(g(0, 0) == 1);
    CHECK(g(0, 1) == 10);
    CHECK(g(0, 3) == 100);
    CHECK(g(0, 4) == 1000);
    CHECK(g(0, 2) + g(0, 5) + g(0, 6) + g(0, 7) + g(0, 8) == 0);
  }
}

TEST_CASE("pool: max padding never wins and NaN propagates", "[pool][max]") {
  const Config cfg{{2, 7, 5}, 2, {3, 3}, {2, 2}, {1, 1}};
  auto layer = make<nn::MaxPool2d<float, Mem>>(cfg);
  const FeatureShape out = layer.output_shape(cfg.in);
  auto x = random_matrix<float>(cfg.batch, cfg.in.size(), 600, -3.0, -1.0);
  Matrix<float, Mem> y("y", cfg.batch, out.size());
  layer.forward(Space(), x, y);
  const auto ref = reference_pool(to_host(x), cfg, true, cfg.batch);
  auto yh = to_host(y);
  for (std::size_t j = 0; j < out.size(); ++j)
    for (std::size_t i = 0; i < cfg.batch; ++i) {
      REQUIRE(yh(i, j) < -0.5f);
      REQUIRE(double(yh(i, j)) == ref[i + cfg.batch * j]);
    }

  SECTION("NaN") {
    // 1 x 4 x 4, 2x2 windows: a NaN at (h, w) = (1, 2) poisons output (0, 1) only.
    const FeatureShape s{1, 4, 4};
    nn::MaxPool2d<float, Mem> pool(2);
    REQUIRE(pool.output_shape(s) == FeatureShape{1, 2, 2});
    std::vector<double> v(16);
    for (int k = 0; k < 16; ++k)
      v[k] = k;
    v[1 + 4 * 2] = std::numeric_limits<double>::quiet_NaN();
    auto xn = host_to_device<float>(v, 1, 16);
    Matrix<float, Mem> yn("y", 1, 4), dxn("dx", 1, 16);
    pool.forward(Space(), xn, yn);
    pool.backward(Space(), host_to_device<float>({1, 1, 1, 1}, 1, 4), dxn);
    auto r = to_host(yn);
    CHECK(r(0, 0) == 5);
    CHECK(std::isnan(r(0, 0 + 2 * 1)));
    CHECK(r(0, 1) == 7);
    CHECK(r(0, 3) == 15);
    CHECK(to_host(dxn)(0, 1 + 4 * 2) == 1); // the gradient goes to the NaN
  }
}

TEST_CASE("pool: invalid hyperparameters throw ValueError", "[pool][errors]") {
  using Max = nn::MaxPool2d<float, Mem>;
  using Avg = nn::AvgPool2d<float, Mem>;
  CHECK_THROWS_AS(Max(0), ValueError);
  CHECK_THROWS_WITH(Max(0), Catch::Contains("kernel must be >= 1") && Catch::Contains("(0, 0)"));
  CHECK_THROWS_WITH(Avg(2, -1), Catch::Contains("stride must be >= 1 in both dimensions, got "
                                                "(-1, -1)"));
  CHECK_THROWS_WITH(Max({2, 2}, {2, 0}), Catch::Contains("stride must be >= 1"));
  CHECK_THROWS_WITH(Avg(3, 1, -1), Catch::Contains("padding must be >= 0"));
  CHECK_THROWS_AS(Max(3, 1, 2), ValueError);
  CHECK_THROWS_WITH(Max(3, 1, 2), Catch::Contains("kat::nn::MaxPool2d: padding must be at most "
                                                  "half the kernel, (1, 1) for kernel (3, 3), "
                                                  "got (2, 2)"));
  CHECK_THROWS_WITH(Avg({4, 2}, {1, 1}, {2, 2}), Catch::Contains("AvgPool2d: padding must be at "
                                                                 "most half the kernel, (2, 1)"));
  CHECK_NOTHROW(Max({4, 2}, {1, 1}, {2, 1}));
  // stride 0 in the square form is PyTorch's stride = kernel
  CHECK(Max(3).stride() == std::array<int, 2>{3, 3});
  CHECK(Avg(3, 2, 1).padding() == std::array<int, 2>{1, 1});
  CHECK(Max({3, 2}, {2, 1}).kernel() == std::array<int, 2>{3, 2});
}

TEST_CASE("pool: shape errors name expected and actual", "[pool][errors]") {
  nn::MaxPool2d<float, Mem> max(3);
  CHECK_THROWS_AS(max.output_shape(FeatureShape{1, 2, 5}), ShapeError);
  CHECK_THROWS_WITH(max.output_shape(FeatureShape{1, 2, 5}),
                    Catch::Contains("must be at least the kernel (3, 3)") &&
                        Catch::Contains("got (2, 5)"));
  CHECK_THROWS_WITH(max.output_shape(FeatureShape{0, 4, 4}),
                    Catch::Contains("channels, height and width must be >= 1, got (0, 4, 4)"));
  nn::AvgPool2d<float, Mem> avg(2, 2, 1); // padding 1 makes a 1x1 input poolable
  CHECK(avg.output_shape(FeatureShape{2, 1, 1}) == FeatureShape{2, 1, 1});

  Matrix<float, Mem> x("x", 2, 2 * 6 * 6), y("y", 2, 2 * 3 * 3);
  SECTION("forward before output_shape") {
    nn::MaxPool2d<float, Mem> fresh(2);
    CHECK_THROWS_WITH(fresh.forward(Space(), x, y), Catch::Contains("call output_shape(input)"));
  }
  SECTION("buffer extents") {
    nn::MaxPool2d<float, Mem> pool(2);
    pool.output_shape(FeatureShape{2, 6, 6});
    Matrix<float, Mem> bad_x("x", 2, 70), bad_y("y", 3, 18);
    CHECK_THROWS_AS(pool.forward(Space(), bad_x, y), ShapeError);
    CHECK_THROWS_WITH(pool.forward(Space(), bad_x, y),
                      Catch::Contains("MaxPool2d::forward: x columns must be 72, got 70"));
    CHECK_THROWS_WITH(pool.forward(Space(), x, bad_y), Catch::Contains("y rows must be 2, got 3"));
    CHECK_THROWS_WITH(pool.backward(Space(), y, x), Catch::Contains("call forward() first"));
    pool.forward(Space(), x, y);
    CHECK_THROWS_WITH(pool.backward(Space(), bad_y, x),
                      Catch::Contains("MaxPool2d::backward: dy rows must be 2, got 3"));
    CHECK_THROWS_WITH(pool.backward(Space(), y, bad_x),
                      Catch::Contains("dx columns must be 72, got 70"));
    CHECK_NOTHROW(pool.backward(Space(), y, Matrix<float, Mem>())); // empty dx: skipped
  }
  SECTION("global avg") {
    nn::GlobalAvgPool2d<float, Mem> pool;
    Matrix<float, Mem> y5("y", 2, 5);
    CHECK_THROWS_AS(pool.forward(Space(), x, y5), ShapeError);
    CHECK_THROWS_WITH(pool.forward(Space(), x, y5),
                      Catch::Contains("x columns must be a positive multiple of y columns "
                                      "(channels) 5, got 72"));
    Matrix<float, Mem> y2("y", 2, 2), dy3("dy", 2, 3);
    pool.forward(Space(), x, y2);
    CHECK_THROWS_WITH(pool.backward(Space(), dy3, x),
                      Catch::Contains("dy columns must be 2, got 3"));
  }
}

TEST_CASE("pool: layers chain in a Sequential model", "[pool]") {
  nn::Sequential<float, Mem> model(FeatureShape{3, 28, 28});
  model.add<nn::MaxPool2d>(2);
  model.add<nn::AvgPool2d>(3, 2, 1);
  model.add<nn::MaxPool2d>(std::array<int, 2>{2, 1}, std::array<int, 2>{1, 1});
  model.add<nn::GlobalAvgPool2d>();
  CHECK(model.output_shape() == FeatureShape{3, 1, 1});
  CHECK_THROWS_AS(model.add<nn::MaxPool2d>(2), ShapeError); // 1x1 is smaller than the kernel
}

TEST_CASE("pool: repeated calls and a smaller batch reuse the argmax workspace", "[pool]") {
  const Config cfg{{3, 7, 5}, 6, {3, 3}, {2, 2}, {1, 1}};
  auto layer = make<nn::MaxPool2d<double, Mem>>(cfg);
  const FeatureShape out = layer.output_shape(cfg.in);
  for (std::size_t n : {std::size_t(6), std::size_t(6), std::size_t(6), std::size_t(4)}) {
    auto x = host_to_device<double>(distinct_values(n * cfg.in.size(), 700 + n), n, cfg.in.size());
    Matrix<double, Mem> y("y", n, out.size()), dx("dx", n, cfg.in.size());
    auto r = random_matrix<double>(n, out.size(), 710);
    layer.forward(Space(), x, y);
    layer.backward(Space(), r, dx);
    CHECK(layer.workspace_allocations() == 1);
    const auto ref = reference_pool(to_host(x), cfg, true, n);
    auto yh = to_host(y);
    for (std::size_t j = 0; j < out.size(); ++j)
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(yh(i, j) == ref[i + n * j]);
    // each output's gradient lands on exactly one input: the sums agree
    auto dxh = to_host(dx);
    auto rh = to_host(r);
    double sum_dx = 0, sum_r = 0;
    for (std::size_t j = 0; j < cfg.in.size(); ++j)
      for (std::size_t i = 0; i < n; ++i)
        sum_dx += dxh(i, j);
    for (std::size_t j = 0; j < out.size(); ++j)
      for (std::size_t i = 0; i < n; ++i)
        sum_r += rh(i, j);
    CHECK(sum_dx == Approx(sum_r).epsilon(1e-12));
  }
}

TEMPLATE_TEST_CASE("pool: ReLU after max pooling equals ReLU before it with gradients",
                   "[pool][max][activation]", float, double) {
  // models::cnn pools before its ReLUs (a quarter of the elements); relu(maxpool(x)) ==
  // maxpool(relu(x)) because ReLU is monotone, and the backward passes agree: where the window
  // maximum is <= 0 both orders send a zero gradient. Checked bit for bit on the CNN itself,
  // against the same network with ReLU first, with inputs whose windows are often all negative.
  using Scalar = TestType;
  const Space space;
  const FeatureShape in{1, 28, 28};
  auto reference = [&] {
    nn::Sequential<Scalar, Mem> m(in);
    m.template add<nn::Conv2d>(1, 32, 5, 1, 2);
    m.template add<nn::ReLU>();
    m.template add<nn::MaxPool2d>(2);
    m.template add<nn::Conv2d>(32, 64, 5, 1, 2);
    m.template add<nn::ReLU>();
    m.template add<nn::MaxPool2d>(2);
    m.template add<nn::Flatten>();
    m.template add<nn::Dense>(m.output_shape().size(), 256);
    m.template add<nn::ReLU>();
    m.template add<nn::Dense>(256, 10);
    return m;
  }();
  auto cnn = nn::models::cnn<Scalar, Mem>(in, 10);
  REQUIRE(cnn.parameter_count() == reference.parameter_count());
  reference.compile(space, 7);
  cnn.compile(space, 7);
  const std::size_t n = 6;
  auto x = random_matrix<Scalar>(n, in.size(), 41, -1.0, 0.5); // mostly negative
  auto labels = labels_of({3, 1, 4, 1, 5, 9});
  nn::SoftmaxCrossEntropy<Scalar, Mem> ce;
  Matrix<Scalar, Mem> d_ref("d_ref", n, 10), d_cnn("d_cnn", n, 10);
  for (int step = 0; step < 2; ++step) {
    const auto logits_ref = to_host(reference.forward(space, x));
    const auto logits_cnn = to_host(cnn.forward(space, x));
    for (std::size_t j = 0; j < 10; ++j)
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(logits_cnn(i, j) == logits_ref(i, j));
    ce.forward_backward(space, reference.forward(space, x), labels, d_ref);
    reference.backward(space, d_ref, nn::Sequential<Scalar, Mem>::Gradients::overwrite);
    ce.forward_backward(space, cnn.forward(space, x), labels, d_cnn);
    cnn.backward(space, d_cnn, nn::Sequential<Scalar, Mem>::Gradients::overwrite);
    const auto g_ref = to_host(reference.gradients());
    const auto g_cnn = to_host(cnn.gradients());
    std::size_t nonzero = 0;
    for (std::size_t k = 0; k < g_ref.extent(0); ++k) {
      REQUIRE(g_cnn(k) == g_ref(k));
      nonzero += g_ref(k) != Scalar(0);
    }
    CHECK(nonzero > g_ref.extent(0) / 4); // a real gradient, not all zeros
    // A plain SGD step on both, so the second comparison runs on other weights.
    auto p_ref = reference.parameters(), p_cnn = cnn.parameters();
    auto gr = reference.gradients(), gc = cnn.gradients();
    Kokkos::parallel_for(
        "sgd", Kokkos::RangePolicy<Space>(space, 0, p_ref.extent(0)),
        KOKKOS_LAMBDA(const std::size_t k) {
          p_ref(k) -= Scalar(0.5) * gr(k);
          p_cnn(k) -= Scalar(0.5) * gc(k);
        });
    space.fence();
  }
}

} // namespace test_pooling
