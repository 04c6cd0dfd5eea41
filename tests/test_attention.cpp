// ScaledDotProductAttention against a naive host reference, closed forms (equal keys, large
// logits), finite differences (gradients and R-operator), float against double, and errors.
#include "layer_check.hpp"
#include "r_operator_check.hpp"
#include "test_helpers.hpp"

#include <kat/nn/attention.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace test_attention {

using namespace kat;
using namespace kat::test;

// The naive forward on host, straight from the definition: x is the N x 3D·P column-major
// batch matrix (feature index p + P·c), y the N x D·P output, a the probabilities in the
// layer's documented order (n + N·(h + heads·(t + P·s))).
struct Reference {
  std::vector<double> y, a;
};

Reference reference_attention(const std::vector<double> &x, std::size_t n_batch, std::size_t p,
                              std::size_t heads, std::size_t dh, bool causal) {
  const std::size_t d = heads * dh;
  auto at = [&](std::size_t n, std::size_t pos, std::size_t c) {
    return x[n + n_batch * (pos + p * c)];
  };
  Reference r;
  r.y.assign(n_batch * d * p, 0.0);
  r.a.assign(n_batch * heads * p * p, 0.0);
  for (std::size_t n = 0; n < n_batch; ++n) {
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t t = 0; t < p; ++t) {
        std::vector<double> logit(p, -INFINITY);
        const std::size_t end = causal ? t + 1 : p;
        double max = -INFINITY;
        for (std::size_t s = 0; s < end; ++s) {
          double dot = 0;
          for (std::size_t j = 0; j < dh; ++j)
            dot += at(n, t, h * dh + j) * at(n, s, d + h * dh + j);
          logit[s] = dot / std::sqrt(double(dh));
          max = std::max(max, logit[s]);
        }
        double sum = 0;
        for (std::size_t s = 0; s < end; ++s)
          sum += std::exp(logit[s] - max);
        for (std::size_t s = 0; s < end; ++s) {
          const double w = std::exp(logit[s] - max) / sum;
          r.a[n + n_batch * (h + heads * (t + p * s))] = w;
          for (std::size_t j = 0; j < dh; ++j)
            r.y[n + n_batch * (t + p * (h * dh + j))] += w * at(n, s, 2 * d + h * dh + j);
        }
      }
    }
  }
  return r;
}

// Every test runs both kernel families (they share no arithmetic code).
constexpr nn::AttentionKernel kernels[] = {nn::AttentionKernel::batch_lanes,
                                           nn::AttentionKernel::batched_gemm};

const char *kernel_name(nn::AttentionKernel k) {
  return k == nn::AttentionKernel::batched_gemm ? "batched_gemm" : "batch_lanes";
}

double max_abs_diff(const std::vector<double> &a, const std::vector<double> &b) {
  REQUIRE(a.size() == b.size());
  double err = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    err = std::max(err, std::abs(a[k] - b[k]));
  return err;
}

// The layer's output for x (and its probabilities), as host vectors.
template <class Scalar>
Reference run_forward(nn::ScaledDotProductAttention<Scalar, Mem> &layer,
                      const Matrix<Scalar, Mem> &x) {
  const std::size_t cols = x.extent(1) / 3;
  Matrix<Scalar, Mem> y("y", x.extent(0), cols);
  layer.forward(Space(), x, y);
  Space().fence();
  return Reference{host_values(y), host_values(layer.probabilities())};
}

TEST_CASE("attention: forward matches a naive host reference", "[attention]") {
  struct Case {
    std::size_t n, heads, dh;
    int height, width;
    bool causal;
  };
  const Case cases[] = {
      {1, 1, 4, 1, 1, false}, // P = 1: A = 1, O = V
      {1, 1, 4, 1, 1, true},  {3, 1, 5, 6, 1, false}, {3, 1, 5, 6, 1, true},
      {3, 3, 2, 2, 3, false}, // W > 1: positions p = h + H·w
      {3, 3, 2, 2, 3, true},  {2, 2, 8, 4, 4, false}, {1, 3, 3, 7, 1, true},
      {37, 2, 3, 3, 1, true}, // a full block of 32 samples and a partial one
  };
  std::uint64_t seed = 10;
  for (const Case &c : cases) {
    const std::size_t d = c.heads * c.dh;
    const std::size_t p = std::size_t(c.height) * std::size_t(c.width);
    const FeatureShape in{int(3 * d), c.height, c.width};
    // Spread 2: logits of order several units, so the softmax is far from uniform.
    const auto x = random_matrix<double>(c.n, in.size(), ++seed, -2.0, 2.0);
    const auto want = reference_attention(host_values(x), c.n, p, c.heads, c.dh, c.causal);
    for (const auto kernel : kernels) {
      INFO(kernel_name(kernel) << " N " << c.n << " heads " << c.heads << " dh " << c.dh << " H "
                               << c.height << " W " << c.width << " causal " << c.causal);
      nn::ScaledDotProductAttention<double, Mem> layer(c.heads, c.dh, c.causal);
      layer.set_kernel(kernel);
      REQUIRE(layer.output_shape(in) == FeatureShape{int(d), c.height, c.width});
      const auto got = run_forward(layer, x);
      CHECK(max_abs_diff(got.y, want.y) < 1e-13);
      CHECK(max_abs_diff(got.a, want.a) < 1e-14);
      if (p == 1) {
        // One token: A = 1 and the output is the value itself.
        const auto xh = host_values(x);
        for (std::size_t k = 0; k < got.y.size(); ++k)
          CHECK(got.y[k] == Approx(xh[2 * d * c.n + k]).epsilon(1e-15));
      }
    }
  }
}

TEST_CASE("attention: equal keys give the mean of the values", "[attention]") {
  const std::size_t n = 2, heads = 2, dh = 3, p = 5, d = heads * dh;
  // Random queries and values; every position of a sample gets the same keys, so every
  // logit of a row is the same and the softmax is uniform over the allowed positions.
  auto x = random_matrix<double>(n, 3 * d * p, 3);
  auto xh = to_host(x);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = d; c < 2 * d; ++c)
      for (std::size_t pos = 1; pos < p; ++pos)
        xh(i, pos + p * c) = xh(i, 0 + p * c);
  Kokkos::deep_copy(x, xh);
  for (const auto kernel : kernels)
    for (const bool causal : {false, true}) {
      INFO(kernel_name(kernel) << " causal " << causal);
      nn::ScaledDotProductAttention<double, Mem> layer(heads, dh, causal);
      layer.set_kernel(kernel);
      const auto y = run_forward(layer, x).y;
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < d; ++c)
          for (std::size_t t = 0; t < p; ++t) {
            // non-causal: mean over all p values; causal: over values 0..t.
            const std::size_t count = causal ? t + 1 : p;
            double mean = 0;
            for (std::size_t s = 0; s < count; ++s)
              mean += xh(i, s + p * (2 * d + c));
            mean /= double(count);
            CHECK(y[i + n * (t + p * c)] == Approx(mean).epsilon(1e-14).margin(1e-15));
          }
    }
}

// Queries and keys along one direction u = (1, ..., 1): Q_t = ±(1 + t/10)·1e3·u (the sign
// alternates with t) and K_s = (s − 2)·u, so the logit Q_t·K_s/√dh is ±(1 + t/10)(s − 2)·1e3·√dh:
// thousands, whose exp overflows in both float and double unless the row maximum is subtracted.
// The largest allowed logit is then ahead of the next by at least 1e3·√dh, so A is one-hot
// and the output is the value at the argmax: s = p − 1 (causal: t) for the positive rows and
// s = 0 for the negative ones.
template <class Scalar> void check_large_logits(nn::AttentionKernel kernel, bool causal) {
  const std::size_t n = 2, heads = 2, dh = 4, p = 5, d = heads * dh;
  auto x = random_matrix<Scalar>(n, 3 * d * p, 4);
  auto xh = to_host(x);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c)
      for (std::size_t pos = 0; pos < p; ++pos) {
        const double sign = pos % 2 == 0 ? 1.0 : -1.0;
        xh(i, pos + p * c) = Scalar(sign * (1.0 + 0.1 * double(pos)) * 1e3);
        xh(i, pos + p * (d + c)) = Scalar(double(pos) - 2.0);
      }
  Kokkos::deep_copy(x, xh);
  nn::ScaledDotProductAttention<Scalar, Mem> layer(heads, dh, causal);
  layer.set_kernel(kernel);
  const auto y = run_forward(layer, x).y;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c)
      for (std::size_t t = 0; t < p; ++t) {
        const std::size_t end = causal ? t + 1 : p;
        const std::size_t argmax = t % 2 == 0 ? end - 1 : 0;
        const double got = y[i + n * (t + p * c)];
        REQUIRE(std::isfinite(got));
        CHECK(got == Approx(double(xh(i, argmax + p * (2 * d + c)))).epsilon(1e-6).margin(1e-7));
      }
}

TEST_CASE("attention: large logits stay finite and select the argmax value", "[attention]") {
  for (const auto kernel : kernels)
    for (const bool causal : {false, true}) {
      INFO(kernel_name(kernel) << " causal " << causal);
      check_large_logits<double>(kernel, causal);
      check_large_logits<float>(kernel, causal);
    }
}

// The layers of the finite-difference checks: (heads, head_dim, causal, input shape, batch).
struct CheckCase {
  std::size_t heads, dh;
  bool causal;
  FeatureShape in;
  std::size_t n;
};
constexpr CheckCase check_cases[] = {
    {2, 3, false, {18, 2, 2}, 2}, // two heads, 2 x 2 positions
    {3, 2, true, {18, 3, 2}, 3},  // causal, three heads, 3 x 2 positions
    {1, 4, false, {12, 1, 1}, 3}, // one head, one position
};

TEST_CASE("attention: finite-difference gradients in double", "[attention][gradcheck]") {
  std::uint64_t seed = 20;
  for (const auto kernel : kernels)
    for (const CheckCase &c : check_cases) {
      INFO(kernel_name(kernel) << " heads " << c.heads << " dh " << c.dh << " causal " << c.causal
                               << " input " << c.in);
      nn::ScaledDotProductAttention<double, Mem> layer(c.heads, c.dh, c.causal);
      layer.set_kernel(kernel);
      check_layer_gradients(layer, c.in, c.n, ++seed);
    }
}

TEST_CASE("attention: R-operator matches finite differences", "[attention][hessian]") {
  std::uint64_t seed = 30;
  for (const auto kernel : kernels)
    for (const CheckCase &c : check_cases) {
      INFO(kernel_name(kernel) << " heads " << c.heads << " dh " << c.dh << " causal " << c.causal
                               << " input " << c.in);
      nn::ScaledDotProductAttention<double, Mem> layer(c.heads, c.dh, c.causal);
      layer.set_kernel(kernel);
      check_layer_r_operator(layer, c.in, c.n, ++seed);
    }
}

// forward, forward_r (rx of extent 0: R{x} = 0), backward and backward_r, in that order:
// {y, A, dx, R{y}, R{dx}} as host vectors.
std::vector<std::vector<double>> run_passes(nn::ScaledDotProductAttention<double, Mem> &layer,
                                            const Matrix<double, Mem> &x,
                                            const Matrix<double, Mem> &rx,
                                            const Matrix<double, Mem> &dy,
                                            const Matrix<double, Mem> &rdy) {
  const std::size_t n = x.extent(0), cols = x.extent(1);
  Matrix<double, Mem> y("y", n, cols / 3), dx("dx", n, cols);
  Matrix<double, Mem> ry("ry", n, cols / 3), rdx("rdx", n, cols);
  layer.forward(Space(), x, y);
  layer.forward_r(Space(), rx, ry);
  layer.backward(Space(), dy, dx);
  layer.backward_r(Space(), dy, rdy, rdx);
  Space().fence();
  return {host_values(y), host_values(layer.probabilities()), host_values(dx), host_values(ry),
          host_values(rdx)};
}

TEST_CASE("attention: an empty R{x} is a zero R{x}", "[attention][hessian]") {
  const std::size_t n = 2, cols = 18 * 4;
  const auto x = random_matrix<double>(n, cols, 41);
  const auto dy = random_matrix<double>(n, cols / 3, 42);
  const auto rdy = random_matrix<double>(n, cols / 3, 43);
  for (const auto kernel : kernels) {
    INFO(kernel_name(kernel));
    nn::ScaledDotProductAttention<double, Mem> layer(2, 3, true);
    layer.set_kernel(kernel);
    const Matrix<double, Mem> zero("zero", n, cols);
    const auto with_zero = run_passes(layer, x, zero, dy, rdy);
    const auto with_empty = run_passes(layer, x, Matrix<double, Mem>(), dy, rdy);
    CHECK(with_empty[3] == with_zero[3]);
    CHECK(with_empty[4] == with_zero[4]);
    // R{dx} = the backward of R{dy} alone: not zero.
    CHECK(max_abs_diff(with_empty[4], std::vector<double>(n * cols, 0.0)) > 1e-3);
  }
}

// The gradient and R-operator checks run batches of 2 or 3 samples: on a host every block of
// samples is then partial. 37 samples make a full block of 32 (the kernels with a
// compile-time lane count) and a partial one; the two kernel families share no arithmetic.
TEST_CASE("attention: every pass agrees between the kernels on full and partial blocks",
          "[attention][hessian]") {
  const std::size_t n = 37, heads = 2, dh = 3, d = heads * dh;
  const std::size_t cols = 3 * d * 6; // 3 x 2 positions
  const auto x = random_matrix<double>(n, cols, 61, -2.0, 2.0);
  const auto rx = random_matrix<double>(n, cols, 62);
  const auto dy = random_matrix<double>(n, cols / 3, 63);
  const auto rdy = random_matrix<double>(n, cols / 3, 64);
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    std::vector<std::vector<double>> got[2];
    for (int k = 0; k < 2; ++k) {
      nn::ScaledDotProductAttention<double, Mem> layer(heads, dh, causal);
      layer.set_kernel(kernels[k]);
      got[k] = run_passes(layer, x, rx, dy, rdy);
    }
    const char *names[] = {"y", "A", "dx", "R{y}", "R{dx}"};
    for (std::size_t i = 0; i < 5; ++i) {
      INFO(names[i]);
      CHECK(max_abs_diff(got[0][i], got[1][i]) < 1e-12);
      CHECK(max_abs_diff(got[0][i], std::vector<double>(got[0][i].size(), 0.0)) > 1e-2);
    }
  }
}

TEST_CASE("attention: float agrees with double", "[attention]") {
  // 37 samples: on a host a full block of 32 (four chunks of 8 samples, each a vector of the
  // packed kernels) and a partial one of 5 (a chunk padded with zeros).
  const std::size_t n = 37, heads = 2, dh = 8, d = heads * dh;
  const int height = 4, width = 4;
  const std::size_t cols = 3 * d * std::size_t(height * width);
  for (const auto kernel : kernels)
    for (const bool causal : {false, true}) {
      INFO(kernel_name(kernel) << " causal " << causal);
      const auto xd = random_matrix<double>(n, cols, 51);
      const auto dyd = random_matrix<double>(n, cols / 3, 52);
      const auto xf = random_matrix<float>(n, cols, 51);
      const auto dyf = random_matrix<float>(n, cols / 3, 52);
      nn::ScaledDotProductAttention<double, Mem> ld(heads, dh, causal);
      nn::ScaledDotProductAttention<float, Mem> lf(heads, dh, causal);
      ld.set_kernel(kernel);
      lf.set_kernel(kernel);
      Matrix<double, Mem> yd("yd", n, cols / 3), dxd("dxd", n, cols);
      Matrix<float, Mem> yf("yf", n, cols / 3), dxf("dxf", n, cols);
      ld.forward(Space(), xd, yd);
      ld.backward(Space(), dyd, dxd);
      lf.forward(Space(), xf, yf);
      lf.backward(Space(), dyf, dxf);
      Space().fence();
      // The same uniform draws rounded to float; the difference is float's rounding.
      CHECK(max_diff_over_scale(yf, yd) < 1e-5);
      CHECK(max_diff_over_scale(dxf, dxd) < 1e-5);
      CHECK(max_diff_over_scale(yf, yd) > 0); // not comparing a copy with itself
    }
}

TEST_CASE("attention: bad arguments name the argument and values", "[attention][errors]") {
  using Layer = nn::ScaledDotProductAttention<double, Mem>;
  CHECK_THROWS_MATCHES(Layer(0, 4), ValueError, MessageContains("heads = 0"));
  CHECK_THROWS_MATCHES(Layer(2, 0), ValueError, MessageContains("head_dim = 0"));
  Layer layer(2, 8); // D = 16, input channels 48
  CHECK_THROWS_MATCHES(layer.output_shape(FeatureShape{40, 4, 4}), ShapeError,
                       MessageContains("input channels must be 3 * heads * head_dim = 48, got 40"));
  CHECK(layer.output_shape(FeatureShape{48, 4, 4}) == FeatureShape{16, 4, 4});

  Matrix<double, Mem> dy0("dy", 2, 16), dx0("dx", 2, 48);
  CHECK_THROWS_MATCHES(layer.backward(Space(), dy0, dx0), Error,
                       MessageContains("call forward() first"));

  Matrix<double, Mem> bad_x("x", 2, 40), y("y", 2, 16);
  CHECK_THROWS_MATCHES(layer.forward(Space(), bad_x, y), ShapeError,
                       MessageContains("positive multiple of 3 * heads * head_dim = 48"));
  CHECK_THROWS_MATCHES(layer.forward(Space(), bad_x, y), ShapeError, MessageContains("got 40"));

  // Rows 0..1 of a 3-row matrix: column stride 3, not contiguous.
  Matrix<double, Mem> big("big", 3, 96);
  Matrix<double, Mem> strided = Kokkos::subview(big, std::make_pair(0, 2), Kokkos::ALL());
  REQUIRE(strided.stride(1) == 3);
  Matrix<double, Mem> y2("y", 2, 32);
  CHECK_THROWS_MATCHES(layer.forward(Space(), strided, y2), ShapeError,
                       MessageContains("x must be contiguous"));

  Matrix<double, Mem> x("x", 2, 96), y_bad("y", 2, 16);
  CHECK_THROWS_MATCHES(layer.forward(Space(), x, y_bad), ShapeError,
                       MessageContains("y columns must be 32, got 16"));
  layer.forward(Space(), x, y2);
  Matrix<double, Mem> dy_bad("dy", 3, 32), dx("dx", 2, 96);
  CHECK_THROWS_MATCHES(layer.backward(Space(), dy_bad, dx), ShapeError,
                       MessageContains("dy rows must be 2, got 3"));
  Matrix<double, Mem> dy("dy", 2, 32), dx_bad("dx", 2, 48);
  CHECK_THROWS_MATCHES(layer.backward(Space(), dy, dx_bad), ShapeError,
                       MessageContains("dx columns must be 96, got 48"));
  // dx of extent 0: skipped without a check.
  CHECK_NOTHROW(layer.backward(Space(), dy, Matrix<double, Mem>()));
  CHECK_THROWS_MATCHES(layer.backward_r(Space(), dy, dy, dx), Error,
                       MessageContains("call forward_r() after forward() first"));

  // KokkosBatched's int offsets: A = N·heads·P² = 2.5e9 entries for a 1 x 150000 x.
  Layer tiny(1, 1);
  tiny.set_kernel(nn::AttentionKernel::batched_gemm);
  Matrix<double, Mem> long_x("x", 1, 150000), long_y("y", 1, 50000);
  CHECK_THROWS_MATCHES(tiny.forward(Space(), long_x, long_y), ShapeError,
                       MessageContains("got 150000 and 2500000000"));
}

} // namespace test_attention
