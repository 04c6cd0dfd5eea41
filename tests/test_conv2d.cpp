#include "layer_check.hpp"
#include "test_helpers.hpp"

#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/sequential.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

namespace test_conv2d {

using namespace kat;
using namespace kat::test;

namespace {

using Conv = nn::Conv2d<double, Mem>;

// One convolution's hyperparameters and input size.
struct Config {
  int cin, cout, h, w, kh, kw, sh, sw, ph, pw, dh, dw;
  bool bias;
  int out_h() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int out_w() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
  FeatureShape in() const { return FeatureShape{cin, h, w}; }
};

std::ostream &operator<<(std::ostream &os, const Config &c) {
  return os << "cin " << c.cin << " cout " << c.cout << " input " << c.h << "x" << c.w << " kernel "
            << c.kh << "x" << c.kw << " stride " << c.sh << "x" << c.sw << " padding " << c.ph
            << "x" << c.pw << " dilation " << c.dh << "x" << c.dw << " bias " << c.bias;
}

// Forward configurations: strides 1/2/3, paddings 0/1/2, dilations 1/2, odd and non-square
// images, kernels 1x1, 3x3, 5x5, 3x2 and 2x2 (stride > kernel leaves inputs no window
// reaches), with and without bias.
const std::vector<Config> forward_configs = {
    {2, 3, 7, 5, 3, 3, 1, 1, 0, 0, 1, 1, true},  {3, 2, 7, 5, 3, 3, 2, 2, 1, 1, 1, 1, true},
    {1, 4, 6, 7, 5, 5, 1, 1, 2, 2, 1, 1, false}, {2, 2, 9, 8, 3, 3, 1, 2, 1, 0, 2, 2, true},
    {3, 5, 5, 7, 1, 1, 1, 1, 0, 0, 1, 1, true},  {2, 3, 7, 6, 3, 2, 2, 1, 1, 2, 1, 2, false},
    {2, 2, 5, 5, 5, 5, 1, 1, 0, 0, 1, 1, true},  {1, 2, 8, 7, 2, 2, 3, 3, 0, 1, 1, 1, true},
    {2, 3, 7, 5, 3, 3, 2, 1, 2, 1, 2, 1, true}};

std::unique_ptr<Conv> make_conv(const Config &c) {
  auto layer = std::make_unique<Conv>(
      c.cin, c.cout, std::array<int, 2>{c.kh, c.kw}, std::array<int, 2>{c.sh, c.sw},
      std::array<int, 2>{c.ph, c.pw}, std::array<int, 2>{c.dh, c.dw}, c.bias);
  const FeatureShape out = layer->output_shape(c.in());
  REQUIRE(out == (FeatureShape{c.cout, c.out_h(), c.out_w()}));
  return layer;
}

// Element (n, c, h, w) of a host batch matrix with (C, H, W) features.
template <class H> double at(const H &m, int n, int c, int h, int w, int height, int width) {
  return m(n, static_cast<std::size_t>(h + height * (w + width * c)));
}

// y from the definition of a convolution, on host copies (no im2col).
std::vector<double> reference_forward(const Config &c, const Matrix<double, Mem> &x,
                                      const Conv &layer) {
  auto xh = to_host(x);
  auto wh = to_host(layer.weight());
  const int n = static_cast<int>(x.extent(0)), ho = c.out_h(), wo = c.out_w();
  std::vector<double> bias(c.cout, 0.0);
  if (c.bias) {
    auto bh = to_host(layer.bias());
    for (int o = 0; o < c.cout; ++o)
      bias[o] = bh(o);
  }
  std::vector<double> y(static_cast<std::size_t>(n) * c.cout * ho * wo);
  for (int o = 0; o < c.cout; ++o)
    for (int ow = 0; ow < wo; ++ow)
      for (int oh = 0; oh < ho; ++oh)
        for (int b = 0; b < n; ++b) {
          double s = bias[o];
          for (int ci = 0; ci < c.cin; ++ci)
            for (int i = 0; i < c.kh; ++i)
              for (int j = 0; j < c.kw; ++j) {
                const int ih = oh * c.sh - c.ph + i * c.dh, iw = ow * c.sw - c.pw + j * c.dw;
                if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w)
                  continue;
                s += wh(o, i + c.kh * (j + c.kw * ci)) * at(xh, b, ci, ih, iw, c.h, c.w);
              }
          y[b + n * (oh + ho * (ow + wo * o))] = s;
        }
  return y;
}

// The patch matrix from its definition, with a ones column when `bias`.
std::vector<double> reference_patches(const Config &c, const Matrix<double, Mem> &x) {
  auto xh = to_host(x);
  const int n = static_cast<int>(x.extent(0)), ho = c.out_h(), wo = c.out_w();
  const std::size_t rows = static_cast<std::size_t>(n) * ho * wo;
  const int k = c.cin * c.kh * c.kw;
  std::vector<double> a(rows * (k + (c.bias ? 1 : 0)), 0.0);
  for (int ow = 0; ow < wo; ++ow)
    for (int oh = 0; oh < ho; ++oh)
      for (int b = 0; b < n; ++b) {
        const std::size_t r = b + static_cast<std::size_t>(n) * (oh + ho * ow);
        for (int ci = 0; ci < c.cin; ++ci)
          for (int j = 0; j < c.kw; ++j)
            for (int i = 0; i < c.kh; ++i) {
              const int ih = oh * c.sh - c.ph + i * c.dh, iw = ow * c.sw - c.pw + j * c.dw;
              if (ih >= 0 && ih < c.h && iw >= 0 && iw < c.w)
                a[r + rows * (i + c.kh * (j + c.kw * ci))] = at(xh, b, ci, ih, iw, c.h, c.w);
            }
        if (c.bias)
          a[r + rows * k] = 1.0;
      }
  return a;
}

// max |a - b| / max(1, |b|) over two views with the same extents.
template <class A, class B> double max_diff(const A &a, const B &b) {
  auto ah = to_host(a);
  auto bh = to_host(b);
  REQUIRE(ah.span() == bh.span());
  double err = 0;
  for (std::size_t k = 0; k < ah.span(); ++k)
    err = std::max(err, std::abs(double(ah.data()[k]) - double(bh.data()[k])) /
                            std::max(1.0, std::abs(double(bh.data()[k]))));
  return err;
}

// Bytes of a patch block holding `positions` output positions of a batch of n.
std::size_t chunk_bytes_for(const Config &c, std::size_t n, std::size_t positions) {
  return positions * n * (c.cin * c.kh * c.kw + (c.bias ? 1 : 0)) * sizeof(double);
}

} // namespace

TEST_CASE("conv2d: forward equals a nested-loop reference", "[conv2d]") {
  const std::size_t n = 3;
  for (std::size_t t = 0; t < forward_configs.size(); ++t) {
    const Config &c = forward_configs[t];
    INFO(c);
    auto layer = make_conv(c);
    auto buffer = bind_fresh<double>(*layer, 10 + t);
    auto x = random_matrix<double>(n, c.in().size(), 100 + t);
    const auto ref = reference_forward(c, x, *layer);
    Matrix<double, Mem> y("y", n, static_cast<std::size_t>(c.cout * c.out_h() * c.out_w()));
    // chunked with several chunk sizes (1 and 3 positions, default), and full (recording)
    for (const std::size_t bytes : {chunk_bytes_for(c, n, 1), chunk_bytes_for(c, n, 3),
                                    nn::Conv2d<double, Mem>::default_chunk_bytes, std::size_t(0)}) {
      for (const bool recording : {false, true}) {
        INFO("chunk bytes " << bytes << " recording " << recording);
        layer->set_chunk_bytes(bytes);
        layer->record_curvature(recording);
        Kokkos::deep_copy(y, -7.0);
        layer->forward(Space(), x, y);
        CHECK(max_rel_error(y, ref) < 1e-13);
      }
    }
  }
}

TEST_CASE("conv2d: finite-difference gradients in double", "[conv2d][gradcheck]") {
  const std::vector<Config> configs = {
      {2, 3, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, true},  // same padding
      {1, 2, 7, 5, 3, 3, 2, 2, 0, 1, 1, 1, false}, // stride 2, odd sizes, no bias
      {2, 2, 7, 6, 3, 2, 1, 2, 2, 1, 2, 1, true},  // dilation, non-square kernel
      {2, 2, 5, 5, 1, 1, 2, 1, 0, 0, 1, 1, true},  // 1x1 kernel, stride 2
      {1, 2, 8, 7, 2, 2, 3, 3, 0, 1, 1, 1, false}, // stride > kernel: gaps in dx
      {1, 2, 6, 6, 5, 5, 1, 1, 2, 2, 1, 1, true}}; // 5x5, padding 2
  for (std::size_t t = 0; t < configs.size(); ++t) {
    const Config &c = configs[t];
    INFO(c);
    auto chunked = make_conv(c);
    chunked->set_chunk_bytes(1); // one output position per chunk
    check_layer_gradients(*chunked, c.in(), 2, 40 + t);
    auto full = make_conv(c);
    full->record_curvature(true);
    check_layer_gradients(*full, c.in(), 2, 60 + t);
  }
}

TEST_CASE("conv2d: chunked and full paths give the same y dx and gradients", "[conv2d][paths]") {
  const std::size_t n = 4;
  const std::vector<Config> configs = {{2, 3, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1, true},
                                       {3, 2, 9, 7, 3, 2, 2, 1, 1, 0, 1, 2, false},
                                       {1, 2, 8, 7, 2, 2, 3, 3, 0, 1, 1, 1, true}};
  for (std::size_t t = 0; t < configs.size(); ++t) {
    const Config &c = configs[t];
    const std::size_t positions = static_cast<std::size_t>(c.out_h() * c.out_w());
    // 35, 25 and 9 positions: 2, 3 and 4 do not all divide them, and 1 puts every position in
    // a chunk of its own.
    for (const std::size_t per_chunk :
         {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(4), positions - 1}) {
      for (const bool accumulate : {true, false}) {
        INFO(c << " positions per chunk " << per_chunk << " accumulate " << accumulate);
        auto chunked = make_conv(c);
        auto full = make_conv(c);
        auto b1 = bind_fresh<double>(*chunked, 5);
        auto b2 = bind_fresh<double>(*full, 5);
        chunked->set_chunk_bytes(chunk_bytes_for(c, n, per_chunk));
        full->record_curvature(true);
        chunked->accumulate_gradients(accumulate);
        full->accumulate_gradients(accumulate);
        // Same non-zero starting gradients: accumulate must add to them, overwrite must not.
        auto g0 = random_matrix<double>(b1.gradients().extent(0), 1, 9);
        Kokkos::deep_copy(b1.gradients(), Kokkos::subview(g0, Kokkos::ALL(), 0));
        Kokkos::deep_copy(b2.gradients(), Kokkos::subview(g0, Kokkos::ALL(), 0));
        auto x = random_matrix<double>(n, c.in().size(), 11 + t);
        auto dy = random_matrix<double>(n, static_cast<std::size_t>(c.cout) * positions, 12 + t);
        Matrix<double, Mem> y1("y1", n, dy.extent(1)), y2("y2", n, dy.extent(1));
        Matrix<double, Mem> dx1("dx1", n, x.extent(1)), dx2("dx2", n, x.extent(1));
        Kokkos::deep_copy(dx1, 3.0); // stale values must be overwritten
        Kokkos::deep_copy(dx2, -3.0);
        // Two steps, so accumulate adds twice and overwrite keeps one.
        for (int step = 0; step < 2; ++step) {
          chunked->forward(Space(), x, y1);
          chunked->backward(Space(), dy, dx1);
          full->forward(Space(), x, y2);
          full->backward(Space(), dy, dx2);
        }
        CHECK(max_diff(y1, y2) < 1e-13);
        CHECK(max_diff(dx1, dx2) < 1e-13);
        CHECK(max_diff(b1.gradients(), b2.gradients()) < 1e-13);
        // and the two steps did what the mode says: compare with one overwrite step
        auto single = make_conv(c);
        auto b3 = bind_fresh<double>(*single, 5);
        single->accumulate_gradients(false);
        single->forward(Space(), x, y2);
        single->backward(Space(), dy, Matrix<double, Mem>());
        auto once = to_host(b3.gradients());
        auto start = to_host(g0);
        auto got = to_host(b1.gradients());
        double err = 0;
        for (std::size_t k = 0; k < once.extent(0); ++k) {
          const double expect = accumulate ? start(k, 0) + 2 * once(k) : once(k);
          err = std::max(err, std::abs(got(k) - expect));
        }
        CHECK(err < 1e-12);
      }
    }
  }
}

TEST_CASE("conv2d: backward rebuilds patches forward did not leave", "[conv2d][paths]") {
  // Backward reuses the last chunk forward() built; a chunk size changed in between, or a
  // second backward, must not reuse a stale block.
  const Config c{2, 3, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1, true};
  const std::size_t n = 3, positions = 35;
  auto x = random_matrix<double>(n, c.in().size(), 1);
  auto dy = random_matrix<double>(n, c.cout * positions, 2);
  Matrix<double, Mem> y("y", n, dy.extent(1));
  auto full = make_conv(c);
  auto b0 = bind_fresh<double>(*full, 8);
  full->record_curvature(true);
  Matrix<double, Mem> dx0("dx0", n, x.extent(1));
  full->forward(Space(), x, y);
  full->backward(Space(), dy, dx0);
  full->backward(Space(), dy, dx0);
  for (const bool change_chunk : {true, false}) {
    INFO("change the chunk size between forward and backward " << change_chunk);
    auto chunked = make_conv(c);
    auto b1 = bind_fresh<double>(*chunked, 8);
    Matrix<double, Mem> dx1("dx1", n, x.extent(1));
    // 6 positions per chunk: the last is 30-34; then 4 per chunk: the last is 32-34, in the
    // same (large enough) workspace.
    chunked->set_chunk_bytes(chunk_bytes_for(c, n, 6));
    chunked->forward(Space(), x, y);
    if (change_chunk) {
      chunked->set_chunk_bytes(chunk_bytes_for(c, n, 4));
    }
    chunked->backward(Space(), dy, dx1);
    chunked->backward(Space(), dy, dx1); // the workspace now holds the first chunk
    CHECK(max_diff(dx1, dx0) < 1e-13);
    CHECK(max_diff(b1.gradients(), b0.gradients()) < 1e-13);
  }
}

TEST_CASE("conv2d: curvature records the patch matrix and dL/dY", "[conv2d][curvature]") {
  for (const bool bias : {true, false}) {
    const Config c{2, 3, 7, 5, 3, 2, 2, 1, 1, 1, 1, 2, bias};
    INFO(c);
    const std::size_t n = 3;
    auto layer = make_conv(c);
    auto buffer = bind_fresh<double>(*layer, 4);
    layer->record_curvature(true);
    auto x = random_matrix<double>(n, c.in().size(), 5);
    const std::size_t rows = n * c.out_h() * c.out_w();
    auto dy = random_matrix<double>(n, c.cout * c.out_h() * c.out_w(), 6);
    Matrix<double, Mem> y("y", n, dy.extent(1));
    layer->forward(Space(), x, y);
    layer->backward(Space(), dy, Matrix<double, Mem>());
    const auto rec = layer->curvature();
    const std::size_t k = c.cin * c.kh * c.kw;
    REQUIRE(rec.a.extent(0) == rows);
    REQUIRE(rec.a.extent(1) == k + (bias ? 1 : 0));
    CHECK(max_rel_error(rec.a, reference_patches(c, x)) == 0.0);
    // g is dy seen as the (N·H_out·W_out) x C_out matrix Y, without a copy
    REQUIRE(rec.g.extent(0) == rows);
    REQUIRE(rec.g.extent(1) == std::size_t(c.cout));
    CHECK(rec.g.data() == dy.data());
    auto gh = to_host(rec.g);
    auto dyh = to_host(dy);
    for (std::size_t o = 0; o < std::size_t(c.cout); ++o)
      for (std::size_t r = 0; r < rows; ++r)
        REQUIRE(gh(r, o) == dyh.data()[r + rows * o]);
    // [W b] and its gradient are the flat buffer's memory, in that order
    CHECK(rec.weight.data() == buffer.parameters().data());
    CHECK(rec.weight.extent(0) == std::size_t(c.cout));
    CHECK(rec.weight.extent(1) == k + (bias ? 1 : 0));
    CHECK(rec.weight_gradient.data() == buffer.gradients().data());
    CHECK(layer->weight().data() == buffer.parameters().data());
    CHECK(layer->weight().extent(1) == k);
    CHECK(layer->weight_gradient().data() == buffer.gradients().data());
    if (bias) {
      CHECK(layer->bias().data() == buffer.parameters().data() + c.cout * k);
      CHECK(layer->bias_gradient().data() == buffer.gradients().data() + c.cout * k);
    } else {
      CHECK(layer->bias().extent(0) == 0);
    }
    // d[W b] = gᵀ a
    auto ah = to_host(rec.a);
    auto dwh = to_host(rec.weight_gradient);
    double err = 0;
    for (std::size_t o = 0; o < std::size_t(c.cout); ++o)
      for (std::size_t col = 0; col < rec.a.extent(1); ++col) {
        double s = 0;
        for (std::size_t r = 0; r < rows; ++r)
          s += gh(r, o) * ah(r, col);
        err = std::max(err, std::abs(s - dwh(o, col)));
      }
    CHECK(err < 1e-12);
  }
  SECTION("nothing is recorded on the chunked path") {
    const Config c{1, 2, 5, 5, 3, 3, 1, 1, 0, 0, 1, 1, true};
    auto layer = make_conv(c);
    auto buffer = bind_fresh<double>(*layer, 4);
    auto x = random_matrix<double>(2, c.in().size(), 5);
    Matrix<double, Mem> y("y", 2, 2 * 9);
    layer->forward(Space(), x, y);
    layer->backward(Space(), y, Matrix<double, Mem>());
    CHECK(layer->curvature().a.extent(0) == 0);
    CHECK(layer->curvature().g.extent(0) == 0);
  }
}

TEST_CASE("conv2d: PyTorch-default initialization", "[conv2d][init]") {
  nn::Conv2d<float, Mem> layer(16, 32, 5);
  layer.output_shape(FeatureShape{16, 8, 8});
  auto buffer = bind_fresh<float>(layer, 99);
  const double bound = 1.0 / std::sqrt(16.0 * 25.0);
  REQUIRE(buffer.parameters().extent(0) == 32 * 401);
  check_uniform(buffer.parameters(), bound, 0.02, 0.05);
}

TEST_CASE("conv2d: constructors and Sequential::add", "[conv2d]") {
  static_assert(std::is_constructible<Conv, int, int, int, int, int>::value, "square ints");
  static_assert(std::is_constructible<Conv, int, int, std::array<int, 2>>::value, "pairs");
  Conv square(1, 32, 5, 1, 2);
  CHECK(square.kernel() == std::array<int, 2>{5, 5});
  CHECK(square.padding() == std::array<int, 2>{2, 2});
  CHECK(square.stride() == std::array<int, 2>{1, 1});
  CHECK(square.dilation() == std::array<int, 2>{1, 1});
  CHECK(square.has_bias());
  Conv pairs(2, 4, {3, 2}, {2, 1}, {1, 0}, {1, 2}, false);
  CHECK(pairs.kernel() == std::array<int, 2>{3, 2});
  CHECK(pairs.dilation() == std::array<int, 2>{1, 2});
  CHECK_FALSE(pairs.has_bias());
  CHECK(pairs.parameter_count() == 4 * 12);

  nn::Sequential<float, Mem> model(FeatureShape{1, 28, 28});
  model.add<nn::Conv2d>(1, 32, 5, 1, 2);
  auto &conv2 = model.add<nn::Conv2d>(32, 64, std::array<int, 2>{5, 5}, std::array<int, 2>{2, 2});
  CHECK(model.output_shape() == (FeatureShape{64, 12, 12}));
  CHECK(conv2.parameter_count() == 64 * (32 * 25 + 1));
}

TEST_CASE("conv2d: bad arguments name the argument and values", "[conv2d][errors]") {
  using F = nn::Conv2d<float, Mem>;
  CHECK_THROWS_AS(F(0, 3, 3), ValueError);
  CHECK_THROWS_WITH(F(0, 3, 3), Catch::Contains("in_channels") && Catch::Contains("got 0"));
  CHECK_THROWS_WITH(F(2, 0, 3), Catch::Contains("out_channels") && Catch::Contains("got 0"));
  CHECK_THROWS_WITH(F(2, 3, {0, 3}),
                    Catch::Contains("kernel must be >= 1") && Catch::Contains("got (0, 3)"));
  CHECK_THROWS_WITH(F(2, 3, 3, 0),
                    Catch::Contains("stride must be >= 1") && Catch::Contains("got (0, 0)"));
  CHECK_THROWS_WITH(F(2, 3, {3, 3}, {1, 1}, {0, -1}),
                    Catch::Contains("padding must be >= 0") && Catch::Contains("got (0, -1)"));
  CHECK_THROWS_WITH(F(2, 3, 3, 1, 0, 0),
                    Catch::Contains("dilation must be >= 1") && Catch::Contains("got (0, 0)"));
  CHECK_THROWS_AS(F(2, 3, 3, 1, -1), ValueError);

  F layer(2, 3, 3);
  CHECK_THROWS_AS(layer.output_shape(FeatureShape{3, 8, 8}), ShapeError);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{3, 8, 8}),
                    Catch::Contains("input channels must be 2, got 3"));
  CHECK_THROWS_AS(layer.output_shape(FeatureShape{2, 2, 8}), ShapeError);
  CHECK_THROWS_WITH(layer.output_shape(FeatureShape{2, 2, 8}),
                    Catch::Contains("at least the dilated kernel (3, 3)") &&
                        Catch::Contains("got (2, 8)"));
  F dilated(1, 1, 3, 1, 1, 3); // span 7 > 4 + 2
  CHECK_THROWS_WITH(dilated.output_shape(FeatureShape{1, 4, 9}),
                    Catch::Contains("(7, 7)") && Catch::Contains("got (6, 11)"));
  CHECK(dilated.output_shape(FeatureShape{1, 5, 9}) == (FeatureShape{1, 1, 5}));

  auto buffer = bind_fresh<float>(layer, 1);
  Matrix<float, Mem> x("x", 4, 2 * 6 * 6), y("y", 4, 3 * 4 * 4);
  CHECK_THROWS_WITH(layer.forward(Space(), x, y), Catch::Contains("input shape is unknown"));
  CHECK_THROWS_WITH(layer.backward(Space(), y, x), Catch::Contains("call forward() first"));
  layer.output_shape(FeatureShape{2, 6, 6});
  Matrix<float, Mem> wrong("x", 4, 2 * 6 * 5);
  CHECK_THROWS_WITH(layer.forward(Space(), wrong, y),
                    Catch::Contains("x columns must be 72, got 60"));
  Matrix<float, Mem> big("big", 5, 3 * 4 * 4);
  auto rows = Kokkos::subview(big, std::make_pair(0, 4), Kokkos::ALL());
  CHECK_THROWS_WITH(layer.forward(Space(), x, rows), Catch::Contains("y must be contiguous"));
  layer.forward(Space(), x, y);
  CHECK_THROWS_WITH(layer.backward(Space(), big, x), Catch::Contains("dy rows must be 4, got 5"));
  CHECK_THROWS_WITH(layer.backward(Space(), y, wrong),
                    Catch::Contains("dx columns must be 72, got 60"));
}

TEST_CASE("conv2d: the steady state allocates nothing", "[conv2d][workspace]") {
  const Config c{3, 4, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, true};
  for (const bool recording : {false, true}) {
    INFO("recording " << recording);
    auto layer = make_conv(c);
    auto buffer = bind_fresh<double>(*layer, 3);
    layer->record_curvature(recording);
    layer->set_chunk_bytes(chunk_bytes_for(c, 8, 5)); // 5 positions of 8 samples
    auto run = [&](std::size_t n) {
      auto x = random_matrix<double>(n, c.in().size(), 1);
      Matrix<double, Mem> y("y", n, 4 * 72), dx("dx", n, x.extent(1));
      layer->forward(Space(), x, y);
      layer->backward(Space(), y, dx);
    };
    run(8);
    const std::size_t after_first = layer->workspace_allocations();
    CHECK(after_first > 0);
    run(8);
    run(3); // a smaller last batch fits more positions per chunk, in the same memory
    run(7);
    run(8);
    CHECK(layer->workspace_allocations() == after_first);
  }
}

TEST_CASE("conv2d: an empty batch", "[conv2d]") {
  const Config c{1, 2, 5, 5, 3, 3, 1, 1, 0, 0, 1, 1, true};
  auto layer = make_conv(c);
  auto buffer = bind_fresh<double>(*layer, 3);
  Kokkos::deep_copy(buffer.gradients(), 1.0);
  Matrix<double, Mem> x("x", 0, 25), y("y", 0, 18);
  layer->forward(Space(), x, y);
  layer->accumulate_gradients(false);
  layer->backward(Space(), y, x);
  auto g = to_host(buffer.gradients());
  for (std::size_t k = 0; k < g.extent(0); ++k)
    REQUIRE(g(k) == 0.0);
}

} // namespace test_conv2d
