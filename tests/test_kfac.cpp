// K-FAC against independent computations (docs/algorithms.md section 1, checks a-d), plus the
// KL clip, update intervals, errors and state round trips.
#include "test_helpers.hpp"

#include <kat/nn/activation.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/residual.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/precond/kfac.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace test_kfac {

using namespace kat;
using namespace kat::precond;
using namespace kat::test;

namespace {

using HostMat = std::vector<double>; // column-major, leading dimension = rows

// Solves M x = b (n x n, column-major) by Gaussian elimination with partial pivoting.
std::vector<double> solve(HostMat m, std::vector<double> b, std::size_t n) {
  for (std::size_t k = 0; k < n; ++k) {
    std::size_t piv = k;
    for (std::size_t i = k + 1; i < n; ++i)
      if (std::fabs(m[i + n * k]) > std::fabs(m[piv + n * k]))
        piv = i;
    for (std::size_t j = 0; j < n; ++j)
      std::swap(m[k + n * j], m[piv + n * j]);
    std::swap(b[k], b[piv]);
    for (std::size_t i = k + 1; i < n; ++i) {
      const double f = m[i + n * k] / m[k + n * k];
      for (std::size_t j = k; j < n; ++j)
        m[i + n * j] -= f * m[k + n * j];
      b[i] -= f * b[k];
    }
  }
  std::vector<double> x(n);
  for (std::size_t k = n; k-- > 0;) {
    double s = b[k];
    for (std::size_t j = k + 1; j < n; ++j)
      s -= m[k + n * j] * x[j];
    x[k] = s / m[k + n * k];
  }
  return x;
}

// xᵀx * scale for a host copy of a rows x cols view.
template <class H> HostMat gram(const H &x, double scale) {
  const std::size_t r = x.extent(0), c = x.extent(1);
  HostMat f(c * c, 0.0);
  for (std::size_t i = 0; i < c; ++i)
    for (std::size_t j = 0; j < c; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < r; ++k)
        s += x(k, i) * x(k, j);
      f[i + c * j] = scale * s;
    }
  return f;
}

// The entries of a host matrix in column-major order, or of a host vector.
template <class H> HostMat flatten(const H &m) {
  if constexpr (H::rank == 1) {
    return HostMat(m.data(), m.data() + m.extent(0));
  } else {
    HostMat out(m.extent(0) * m.extent(1));
    for (std::size_t j = 0; j < m.extent(1); ++j)
      for (std::size_t i = 0; i < m.extent(0); ++i)
        out[i + m.extent(0) * j] = m(i, j);
    return out;
  }
}

// (A ⊗ G + λI)⁻¹ vec(∇), densely: the Kronecker product of the column-major vec.
std::vector<double> kron_solve(const HostMat &A, std::size_t da, const HostMat &G, std::size_t dg,
                               const HostMat &grad, double lambda) {
  const std::size_t n = da * dg;
  HostMat m(n * n);
  for (std::size_t j = 0; j < da; ++j)
    for (std::size_t i = 0; i < dg; ++i)
      for (std::size_t l = 0; l < da; ++l)
        for (std::size_t k = 0; k < dg; ++k)
          m[(i + dg * j) + n * (k + dg * l)] =
              A[j + da * l] * G[i + dg * k] + ((i == k && j == l) ? lambda : 0.0);
  return solve(m, grad, n);
}

// (F + λI)⁻¹ densely.
HostMat dense_inverse(HostMat f, std::size_t n, double lambda) {
  for (std::size_t i = 0; i < n; ++i)
    f[i + n * i] += lambda;
  HostMat inv(n * n);
  for (std::size_t j = 0; j < n; ++j) {
    std::vector<double> e(n, 0.0);
    e[j] = 1.0;
    const auto col = solve(f, e, n);
    for (std::size_t i = 0; i < n; ++i)
      inv[i + n * j] = col[i];
  }
  return inv;
}

HostMat matmul(const HostMat &a, const HostMat &b, std::size_t m, std::size_t k, std::size_t n) {
  HostMat c(m * n, 0.0);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t l = 0; l < k; ++l)
      for (std::size_t i = 0; i < m; ++i)
        c[i + m * j] += a[i + m * l] * b[l + k * j];
  return c;
}

double max_rel(const std::vector<double> &got, const std::vector<double> &want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

// A small MLP in double with curvature recorded: 5 -> 4 (tanh) -> 3.
struct SmallMLP {
  nn::Sequential<double, Mem> model{FeatureShape{5}};
  SmallMLP() {
    model.add<nn::Dense>(5, 4);
    model.add<nn::Tanh>();
    model.add<nn::Dense>(4, 3);
    model.compile(Space(), 17);
  }
  // forward + backward of a loss whose output gradient is dy (carrying 1/N like a mean).
  void run(const Matrix<double, Mem> &x, const Matrix<double, Mem> &dy) {
    model.zero_grad(Space());
    model.forward(Space(), x);
    model.backward(Space(), dy);
  }
};

typename KFAC<double, Mem>::Options exact_options(ComputeMethod method, double damping) {
  typename KFAC<double, Mem>::Options o;
  o.compute_method = method;
  o.damping = damping;
  o.kl_clip = 0.0;
  o.factor_decay = 0.5;
  return o;
}

} // namespace

TEST_CASE("kfac: one Dense layer with exact factors solves linear least squares in one step",
          "[kfac]") {
  // L = 1/(2N) Σ_n ‖W a_n − t_n‖²: Gauss-Newton curvature A ⊗ I with A = aᵀa/N. Giving K-FAC
  // output vectors g with N gᵀg = I makes G exact, so P = ∇ A⁻¹ is the Newton step.
  const std::size_t n = 12, in = 4, out = 3;
  nn::Dense<double, Mem> layer(in, out);
  auto buffer = bind_fresh<double>(layer, 5);
  layer.record_curvature(true);
  auto x = random_matrix<double>(n, in, 8);
  auto t = random_matrix<double>(n, out, 9);
  Matrix<double, Mem> y("y", n, out), dy("dy", n, out);
  layer.forward(Space(), x, y);
  {
    auto yh = to_host(y), th = to_host(t);
    auto dyh = Kokkos::create_mirror_view(dy);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t o = 0; o < out; ++o)
        dyh(i, o) = (yh(i, o) - th(i, o)) / n;
    Kokkos::deep_copy(dy, dyh);
  }
  layer.backward(Space(), dy, Matrix<double, Mem>());
  Matrix<double, Mem> g_exact("g_exact", n, out);
  {
    auto h = Kokkos::create_mirror_view(g_exact);
    Kokkos::deep_copy(h, 0.0);
    for (std::size_t o = 0; o < out; ++o)
      h(o, o) = 1.0 / std::sqrt(double(n));
    Kokkos::deep_copy(g_exact, h);
  }
  for (ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
    auto saved = to_host(buffer.gradients());
    // The inverse path damps each factor by √λ, so it needs a smaller λ for the same error.
    KFAC<double, Mem> kfac(exact_options(method, method == ComputeMethod::eigen ? 1e-12 : 1e-20));
    kfac.register_layer("dense", [&] {
      auto r = layer.curvature();
      r.g = g_exact;
      return r;
    });
    kfac.step(Space());
    // W ← W − P (SGD, lr 1), then the gradient at the new W must vanish.
    auto p = to_host(buffer.parameters());
    auto gr = to_host(buffer.gradients());
    std::vector<double> w_new(p.extent(0));
    for (std::size_t i = 0; i < p.extent(0); ++i)
      w_new[i] = p(i) - gr(i);
    // Independent: the normal equations [x 1]ᵀ[x 1] Wᵀ = [x 1]ᵀ t, solved densely.
    auto xh = to_host(x), th = to_host(t);
    const std::size_t c = in + 1;
    HostMat ata(c * c, 0.0);
    std::vector<std::vector<double>> atb(out, std::vector<double>(c, 0.0));
    for (std::size_t i = 0; i < c; ++i)
      for (std::size_t k = 0; k < n; ++k) {
        const double ai = i < in ? xh(k, i) : 1.0;
        for (std::size_t j = 0; j < c; ++j)
          ata[i + c * j] += ai * (j < in ? xh(k, j) : 1.0);
        for (std::size_t o = 0; o < out; ++o)
          atb[o][i] += ai * th(k, o);
      }
    for (std::size_t o = 0; o < out; ++o) {
      const auto w = solve(ata, atb[o], c);
      for (std::size_t j = 0; j < c; ++j)
        CHECK(w_new[o + out * j] == Approx(w[j]).margin(1e-8));
    }
    Kokkos::deep_copy(buffer.gradients(), saved);
  }
}

TEST_CASE("kfac: eigen path equals the dense (A kron G + damping I) solve on a small MLP",
          "[kfac]") {
  SmallMLP net;
  auto x = random_matrix<double>(7, 5, 1);
  auto dy = random_matrix<double>(7, 3, 2, -0.2, 0.2);
  const double lambda = 0.03;
  KFAC<double, Mem> kfac(exact_options(ComputeMethod::eigen, lambda));
  REQUIRE(kfac.register_model(net.model) == 2);
  CHECK(kfac.layer_names() == std::vector<std::string>{"0", "2"});
  net.run(x, dy);
  std::vector<HostMat> a, g, grads;
  std::vector<std::size_t> rows;
  for (std::size_t l : {0u, 2u}) {
    const auto rec = net.model.layer(l).curvature();
    a.push_back(flatten(to_host(rec.a)));
    rows.push_back(rec.a.extent(0));
    const auto ah = to_host(rec.a), gh = to_host(rec.g);
    g.push_back(gram(gh, 7.0)); // G = N gᵀg (g carries 1/N)
    a.back() = gram(ah, 1.0 / 7.0);
    grads.push_back(flatten(to_host(rec.weight_gradient)));
  }
  // Layer 0's a is [x 1].
  {
    const auto ah = to_host(net.model.layer(0).curvature().a);
    const auto xh = to_host(x);
    for (std::size_t i = 0; i < 7; ++i) {
      CHECK(ah(i, 5) == 1.0);
      CHECK(ah(i, 2) == xh(i, 2));
    }
  }
  kfac.step(Space());
  const std::size_t dims[2][2] = {{6, 4}, {5, 3}}; // (in+1, out)
  for (std::size_t k = 0; k < 2; ++k) {
    const auto want = kron_solve(a[k], dims[k][0], g[k], dims[k][1], grads[k], lambda);
    const auto got = flatten(to_host(net.model.layer(k == 0 ? 0 : 2).curvature().weight_gradient));
    CHECK(max_rel(got, want) < 1e-10);
    // The factors themselves.
    CHECK(max_rel(flatten(to_host(kfac.factor_a(k).factor())), a[k]) < 1e-13);
    CHECK(max_rel(flatten(to_host(kfac.factor_g(k).factor())), g[k]) < 1e-13);
  }
}

TEST_CASE("kfac: eigen and inverse paths agree as damping goes to 0", "[kfac]") {
  // N = 40 > in+1, so A and G are nonsingular and both paths tend to G⁻¹ ∇ A⁻¹. They differ
  // by the cross terms √λ (d_A + d_G) of the inverse path's damping, so the gap shrinks
  // like √λ.
  auto x = random_matrix<double>(40, 5, 3);
  auto dy = random_matrix<double>(40, 3, 4);
  std::vector<double> gaps;
  for (double lambda : {1e-8, 1e-12, 1e-16}) {
    std::vector<HostMat> out;
    for (ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
      SmallMLP net;
      KFAC<double, Mem> kfac(exact_options(method, lambda));
      kfac.register_model(net.model);
      net.run(x, dy);
      kfac.step(Space());
      out.push_back(flatten(to_host(net.model.gradients())));
    }
    gaps.push_back(max_rel(out[0], out[1]));
  }
  CHECK(gaps[1] < gaps[0] / 30);
  CHECK(gaps[2] < gaps[1] / 30);
  CHECK(gaps[2] < 1e-5);
}

TEST_CASE("kfac: inverse path with pi correction equals its dense formula", "[kfac]") {
  SmallMLP net;
  auto x = random_matrix<double>(9, 5, 5);
  auto dy = random_matrix<double>(9, 3, 6, -0.3, 0.3);
  const double lambda = 0.01;
  auto o = exact_options(ComputeMethod::inverse, lambda);
  o.pi_correction = true;
  KFAC<double, Mem> kfac(o);
  kfac.register_model(net.model);
  net.run(x, dy);
  const auto rec = net.model.layer(2).curvature();
  const HostMat A = gram(to_host(rec.a), 1.0 / 9.0), G = gram(to_host(rec.g), 9.0);
  const HostMat grad = flatten(to_host(rec.weight_gradient));
  kfac.step(Space());
  double ta = 0, tg = 0;
  for (std::size_t i = 0; i < 5; ++i)
    ta += A[i + 5 * i];
  for (std::size_t i = 0; i < 3; ++i)
    tg += G[i + 3 * i];
  const double pi = std::sqrt((ta / 5) / (tg / 3));
  const HostMat ainv = dense_inverse(A, 5, pi * std::sqrt(lambda));
  const HostMat ginv = dense_inverse(G, 3, std::sqrt(lambda) / pi);
  const HostMat want = matmul(matmul(ginv, grad, 3, 3, 5), ainv, 3, 5, 5);
  CHECK(max_rel(flatten(to_host(rec.weight_gradient)), want) < 1e-10);
}

TEST_CASE("kfac: Conv2d factors equal an explicit patch-loop reference", "[kfac][conv2d]") {
  // C_in 2 -> C_out 3, kernel 3x2, stride (2, 1), padding (1, 0), dilation (1, 2); 5x6 input.
  nn::Conv2d<double, Mem> conv(2, 3, {3, 2}, {2, 1}, {1, 0}, {1, 2});
  const FeatureShape in{2, 5, 6};
  const FeatureShape outs = conv.output_shape(in);
  auto buffer = bind_fresh<double>(conv, 3);
  conv.record_curvature(true);
  const std::size_t n = 3, H = outs.height, W = outs.width;
  auto x = random_matrix<double>(n, in.size(), 7);
  auto dy = random_matrix<double>(n, outs.size(), 8);
  Matrix<double, Mem> y("y", n, outs.size()), dx("dx", n, in.size());
  conv.forward(Space(), x, y);
  conv.backward(Space(), dy, dx);
  KFAC<double, Mem> kfac(exact_options(ComputeMethod::eigen, 0.1));
  kfac.register_layer("conv", [&] { return conv.curvature(); });
  kfac.step(Space());

  const auto xh = to_host(x), dyh = to_host(dy);
  const std::size_t K = 2 * 3 * 2, cols = K + 1, rows = n * H * W;
  HostMat A(cols * cols, 0.0), G(9, 0.0);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t oh = 0; oh < H; ++oh)
      for (std::size_t ow = 0; ow < W; ++ow) {
        std::vector<double> patch(cols, 0.0);
        for (int ci = 0; ci < 2; ++ci)
          for (int j = 0; j < 2; ++j)
            for (int i = 0; i < 3; ++i) {
              const int ih = int(oh) * 2 - 1 + i * 1, iw = int(ow) * 1 - 0 + j * 2;
              const std::size_t k = i + 3 * (j + 2 * ci);
              if (ih >= 0 && ih < 5 && iw >= 0 && iw < 6)
                patch[k] = xh(b, ih + 5 * (iw + 6 * ci));
            }
        patch[K] = 1.0;
        std::vector<double> gv(3);
        for (int c = 0; c < 3; ++c)
          gv[c] = dyh(b, oh + H * (ow + W * c));
        for (std::size_t i = 0; i < cols; ++i)
          for (std::size_t j = 0; j < cols; ++j)
            A[i + cols * j] += patch[i] * patch[j] / rows;
        // G = gᵀg / rows after undoing the 1/N: (N g)ᵀ(N g) / rows.
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j)
            G[i + 3 * j] += double(n * n) * gv[i] * gv[j] / rows;
      }
  CHECK(max_rel(flatten(to_host(kfac.factor_a(0).factor())), A) < 1e-13);
  CHECK(max_rel(flatten(to_host(kfac.factor_g(0).factor())), G) < 1e-13);
}

TEST_CASE("kfac: running averages follow factor_decay and the update intervals", "[kfac]") {
  SmallMLP net;
  auto o = exact_options(ComputeMethod::eigen, 0.01);
  o.factor_decay = 0.75;
  o.factor_update_steps = std::int64_t(2);
  o.inv_update_steps = std::int64_t(4);
  KFAC<double, Mem> kfac(o);
  kfac.register_model(net.model);
  std::vector<HostMat> estimates;
  for (int s = 0; s < 5; ++s) {
    CHECK(kfac.needs_curvature() == (s % 2 == 0));
    CHECK(net.model.layer(0).recording_curvature() == (s % 2 == 0));
    auto x = random_matrix<double>(6, 5, 100 + s);
    auto dy = random_matrix<double>(6, 3, 200 + s);
    net.run(x, dy);
    if (s % 2 == 0)
      estimates.push_back(gram(to_host(net.model.layer(0).curvature().a), 1.0 / 6));
    kfac.step(Space());
  }
  CHECK(kfac.factor_a(0).updates() == 3); // steps 0, 2, 4
  HostMat want = estimates[0];
  for (std::size_t e = 1; e < estimates.size(); ++e)
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = 0.75 * want[i] + 0.25 * estimates[e][i];
  CHECK(max_rel(flatten(to_host(kfac.factor_a(0).factor())), want) < 1e-13);
}

namespace {
// A strategy that hands every batch estimate to `reduce` (and is otherwise local).
template <class K> struct ReducingStrategy : KFACStrategy<K> {
  std::function<void(const typename K::execution_space &, const typename K::factor_matrix_type &,
                     std::size_t, char)>
      reduce;
  std::string name() const override { return "reducing"; }
  bool reduces_factors() const override { return true; }
  void reduce_factor(const typename K::execution_space &space,
                     const typename K::factor_matrix_type &batch, std::size_t layer,
                     char factor) override {
    reduce(space, batch, layer, factor);
  }
};
} // namespace

TEST_CASE("kfac: a strategy's reduce_factor sees every batch estimate and may modify it",
          "[kfac]") {
  // Two runs on the same data, factor_decay 0.5, factors every 2 steps: one plain, one whose
  // strategy checks the estimate and doubles it; its factors are twice the plain ones.
  SmallMLP plain_net, hooked_net;
  auto o = exact_options(ComputeMethod::eigen, 0.01);
  o.factor_update_steps = std::int64_t(2);
  o.inv_update_steps = std::int64_t(2);
  KFAC<double, Mem> plain(o), hooked(o);
  plain.register_model(plain_net.model);
  hooked.register_model(hooked_net.model);
  CHECK(hooked.strategy().name() == "local");
  CHECK(hooked.strategy_report().total().bytes == 0);
  CHECK(hooked.strategy_report().workspace_bytes == 0);
  std::vector<std::pair<std::size_t, char>> calls;
  std::vector<std::size_t> dims;
  HostMat first_a, first_want; // layer 0's A estimate of the first step: hook, reference
  ReducingStrategy<KFAC<double, Mem>> doubling;
  doubling.reduce = [&](const Space &space, const Matrix<double, Mem> &batch, std::size_t layer,
                        char factor) {
    calls.emplace_back(layer, factor);
    dims.push_back(batch.extent(0));
    REQUIRE(batch.extent(0) == batch.extent(1));
    if (calls.size() == 1)
      first_a = flatten(to_host(batch));
    Kokkos::parallel_for(
        "double", matrix_policy(space, batch.extent(0), batch.extent(1)),
        KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) { batch(i, j) *= 2.0; });
  };
  hooked.set_strategy(&doubling);
  CHECK(&hooked.strategy() == &doubling);
  CHECK(hooked.strategy_report().name == "reducing");
  std::size_t bytes_at_3 = 0;
  for (int s = 0; s < 6; ++s) {
    auto x = random_matrix<double>(6, 5, 500 + s);
    auto dy = random_matrix<double>(6, 3, 600 + s);
    plain_net.run(x, dy);
    hooked_net.run(x, dy);
    if (s == 0)
      first_want = gram(to_host(plain_net.model.layer(0).curvature().a), 1.0 / 6);
    plain.step(Space());
    hooked.step(Space());
    if (s == 3)
      bytes_at_3 = hooked.state_bytes();
  }
  // Called on steps 0, 2, 4 only, for each layer A then G, with the factor's dimensions.
  const std::vector<std::pair<std::size_t, char>> round{{0, 'A'}, {0, 'G'}, {1, 'A'}, {1, 'G'}};
  REQUIRE(calls.size() == 12);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    CHECK(calls[k] == round[k % 4]);
    CHECK(dims[k] == std::vector<std::size_t>{6, 4, 5, 3}[k % 4]);
  }
  // The estimate is scale · aᵀa (= aᵀa / 6) before symmetrization.
  CHECK(max_rel(first_a, first_want) < 1e-14);
  for (std::size_t l = 0; l < 2; ++l) {
    for (const bool is_a : {true, false}) {
      const auto &fp = is_a ? plain.factor_a(l) : plain.factor_g(l);
      const auto &fh = is_a ? hooked.factor_a(l) : hooked.factor_g(l);
      HostMat want = flatten(to_host(fp.factor()));
      for (auto &v : want)
        v *= 2.0;
      CHECK(max_rel(flatten(to_host(fh.factor())), want) < 1e-14);
    }
  }
  // state_bytes: at least every factor and its batch buffer, Q and its second buffer and the
  // eigenvalues; constant once every buffer is in use.
  std::size_t floor = 0;
  for (const std::size_t d : {6u, 4u, 5u, 3u})
    floor += (2 * d * d + 2 * d * d + 2 * d) * sizeof(double);
  CHECK(hooked.state_bytes() >= floor);
  CHECK(hooked.state_bytes() == bytes_at_3);
  CHECK(plain.state_bytes() == hooked.state_bytes());
  hooked.set_strategy(nullptr);
  CHECK(hooked.strategy().name() == "local");
}

namespace {
// A strategy that builds the factors of the layers `built` says and computes the
// decompositions `computed` says (and is otherwise local).
template <class K> struct PartialStrategy : KFACStrategy<K> {
  std::function<bool(std::size_t)> built;
  std::function<bool(std::size_t, char)> computed;
  bool builds_factors(std::size_t layer) const override { return built(layer); }
  bool computes_decomposition(std::size_t layer, char factor) const override {
    return computed(layer, factor);
  }
};
} // namespace

TEST_CASE("kfac: a strategy decides which factors are built and decomposed here", "[kfac]") {
  // Without shared gradients, a layer whose factors are not built here, or that lacks a
  // decomposition, is left to the base optimizer; the others are preconditioned as always
  // (no KL clip, so layers do not interact).
  const auto x = random_matrix<double>(6, 5, 41);
  const auto dy = random_matrix<double>(6, 3, 42);
  SmallMLP plain_net;
  KFAC<double, Mem> plain(exact_options(ComputeMethod::eigen, 0.01));
  plain.register_model(plain_net.model);
  plain_net.run(x, dy);
  const HostMat raw1 = flatten(to_host(plain_net.model.layer(2).curvature().weight_gradient));
  plain.step(Space());
  const HostMat want0 = flatten(to_host(plain_net.model.layer(0).curvature().weight_gradient));
  for (const bool build_second : {false, true}) {
    INFO((build_second ? "layer 1 built, its G not decomposed" : "layer 1 not built"));
    SmallMLP net;
    KFAC<double, Mem> kfac(exact_options(ComputeMethod::eigen, 0.01));
    kfac.register_model(net.model);
    PartialStrategy<KFAC<double, Mem>> partial;
    partial.built = [&](std::size_t layer) { return layer == 0 || build_second; };
    partial.computed = [](std::size_t layer, char factor) { return layer == 0 || factor == 'A'; };
    kfac.set_strategy(&partial);
    CHECK(kfac.owned(0));
    CHECK(kfac.owned(1) == build_second);
    CHECK(kfac.wants_curvature(1) == build_second);
    net.run(x, dy);
    kfac.step(Space());
    CHECK(flatten(to_host(net.model.layer(0).curvature().weight_gradient)) == want0);
    CHECK(flatten(to_host(net.model.layer(2).curvature().weight_gradient)) == raw1);
    CHECK(kfac.factor_g(1).updates() == (build_second ? 1u : 0u));
    CHECK(kfac.factor_a(1).has_eigen() == build_second);
    CHECK(!kfac.factor_g(1).has_eigen());
    CHECK(kfac.state_bytes() < plain.state_bytes());
    CHECK(kfac.strategy_report().total().bytes == 0);
  }
}

TEST_CASE("kfac: the KL clip scale matches its formula", "[kfac]") {
  auto x = random_matrix<double>(8, 5, 11);
  auto dy = random_matrix<double>(8, 3, 12);
  // Unclipped P first.
  SmallMLP ref;
  KFAC<double, Mem> plain(exact_options(ComputeMethod::eigen, 0.05));
  plain.register_model(ref.model);
  ref.run(x, dy);
  const HostMat grad = flatten(to_host(ref.model.gradients()));
  plain.step(Space());
  const HostMat p = flatten(to_host(ref.model.gradients()));
  double vg = 0;
  for (std::size_t i = 0; i < p.size(); ++i)
    vg += p[i] * grad[i];
  CHECK(plain.vg_sum() == Approx(vg).epsilon(1e-12));
  CHECK(plain.kl_scale() == 1.0);
  const double lr = 0.3;
  for (double kappa : {vg * lr * lr / 4.0, vg * lr * lr * 2.0}) {
    SmallMLP net;
    auto o = exact_options(ComputeMethod::eigen, 0.05);
    o.kl_clip = kappa;
    o.lr = lr;
    KFAC<double, Mem> kfac(o);
    kfac.register_model(net.model);
    net.run(x, dy);
    kfac.step(Space());
    const double nu = std::min(1.0, std::sqrt(kappa / std::fabs(vg * lr * lr)));
    CHECK(kfac.kl_scale() == Approx(nu).epsilon(1e-12));
    const HostMat got = flatten(to_host(net.model.gradients()));
    // Only the weight matrices are preconditioned; every entry of the flat buffer belongs to
    // one here (Tanh has no parameters).
    for (std::size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == Approx(nu * p[i]).epsilon(1e-12));
  }
}

TEST_CASE("kfac: float model with double decompositions matches the double model", "[kfac]") {
  auto xd = random_matrix<double>(10, 5, 21);
  auto dyd = random_matrix<double>(10, 3, 22, -0.1, 0.1);
  Matrix<float, Mem> xf("xf", 10, 5), dyf("dyf", 10, 3);
  auto xh = to_host(xd), dyh = to_host(dyd);
  auto xfh = Kokkos::create_mirror_view(xf);
  auto dyfh = Kokkos::create_mirror_view(dyf);
  for (std::size_t i = 0; i < 10; ++i) {
    for (std::size_t j = 0; j < 5; ++j)
      xfh(i, j) = static_cast<float>(xh(i, j));
    for (std::size_t j = 0; j < 3; ++j)
      dyfh(i, j) = static_cast<float>(dyh(i, j));
  }
  Kokkos::deep_copy(xf, xfh);
  Kokkos::deep_copy(dyf, dyfh);
  SmallMLP dnet;
  KFAC<double, Mem> dk(exact_options(ComputeMethod::eigen, 0.01));
  dk.register_model(dnet.model);
  dnet.run(xd, dyd);
  dk.step(Space());

  nn::Sequential<float, Mem> fmodel{FeatureShape{5}};
  fmodel.add<nn::Dense>(5, 4);
  fmodel.add<nn::Tanh>();
  fmodel.add<nn::Dense>(4, 3);
  fmodel.compile(Space(), 17);
  KFAC<float, Mem>::Options o;
  o.damping = 0.01;
  o.kl_clip = 0.0;
  KFAC<float, Mem> fk(o); // InverseScalar = double by default
  fk.register_model(fmodel);
  fmodel.zero_grad(Space());
  fmodel.forward(Space(), xf);
  fmodel.backward(Space(), dyf);
  fk.step(Space());
  const auto want = flatten(to_host(dnet.model.gradients()));
  const auto as_double = [](const auto &v) {
    const auto h = to_host(v);
    return std::vector<double>(h.data(), h.data() + h.extent(0));
  };
  CHECK(max_rel(as_double(fmodel.gradients()), want) < 1e-4);

  // Factors accumulated in double from the float model's a and g (the converting path).
  KFAC<float, Mem, double, double> fdk(o);
  fdk.register_model(fmodel); // recording is still on from fk
  fmodel.zero_grad(Space());
  fmodel.forward(Space(), xf);
  fmodel.backward(Space(), dyf);
  fdk.step(Space());
  CHECK(max_rel(flatten(to_host(fdk.factor_a(0).factor())),
                flatten(to_host(dk.factor_a(0).factor()))) < 1e-6);
  CHECK(max_rel(as_double(fmodel.gradients()), want) < 1e-4);
}

TEST_CASE("kfac: invalid hyperparameters throw at construction and name themselves",
          "[kfac][errors]") {
  using K = KFAC<double, Mem>;
  auto make = [](auto edit) {
    K::Options o;
    edit(o);
    K k(o);
  };
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.damping = 0.0; }),
                      Catch::Contains("damping must be finite and > 0, got 0"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.damping = std::nan(""); }),
                      Catch::Contains("damping"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.factor_decay = 1.0; }),
                      Catch::Contains("factor_decay must be in [0, 1), got 1"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.factor_update_steps = std::int64_t(0); }),
                      Catch::Contains("factor_update_steps must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.inv_update_steps = std::int64_t(-3); }),
                      Catch::Contains("inv_update_steps must be >= 1, got -3"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.kl_clip = -1.0; }),
                      Catch::Contains("kl_clip must be finite and >= 0, got -1"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.lr = -0.1; }), Catch::Contains("lr"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.pi_correction = true; }),
                      Catch::Contains("pi_correction needs compute_method inverse"));
  REQUIRE_THROWS_WITH(make([](K::Options &o) { o.log = nullptr; }), Catch::Contains("log"));

  // A multiple warning, not an error.
  std::ostringstream log;
  K::Options o;
  o.factor_update_steps = std::int64_t(3);
  o.inv_update_steps = std::int64_t(10);
  o.log = &log;
  K k(o);
  CHECK_THAT(log.str(), Catch::Contains("inv_update_steps (10) is not a multiple of "
                                        "factor_update_steps (3)"));

  // A callable is checked where it is evaluated, naming the step.
  SmallMLP net;
  K::Options c = exact_options(ComputeMethod::eigen, 0.01);
  c.damping = [](std::int64_t step) { return step < 1 ? 0.01 : -1.0; };
  K kc(c);
  kc.register_model(net.model);
  auto x = random_matrix<double>(4, 5, 1);
  auto dy = random_matrix<double>(4, 3, 2);
  net.run(x, dy);
  kc.step(Space());
  net.run(x, dy);
  REQUIRE_THROWS_WITH(kc.step(Space()),
                      Catch::Contains("damping must be finite and > 0, got -1 at step 1"));
}

TEST_CASE("kfac: non-finite curvature is never applied", "[kfac][errors]") {
  const std::size_t n = 6;
  nn::Dense<double, Mem> layer(3, 2);
  auto buffer = bind_fresh<double>(layer, 1);
  layer.record_curvature(true);
  auto x = random_matrix<double>(n, 3, 2);
  auto dy = random_matrix<double>(n, 2, 3);
  Matrix<double, Mem> y("y", n, 2);
  layer.forward(Space(), x, y);
  layer.backward(Space(), dy, Matrix<double, Mem>());
  // A copy of a with a NaN: the gradient stays finite, the factor A does not.
  Matrix<double, Mem> bad_a("bad_a", n, 4);
  Kokkos::deep_copy(bad_a, layer.curvature().a);
  Kokkos::deep_copy(Kokkos::subview(bad_a, 2, 1), std::nan(""));
  bool use_bad = true;
  auto views = [&] {
    auto r = layer.curvature();
    if (use_bad)
      r.a = bad_a;
    return r;
  };
  SECTION("by default: a NumericalError naming the layer and the factor") {
    KFAC<double, Mem> kfac(exact_options(ComputeMethod::eigen, 0.01));
    kfac.register_layer("head", views);
    REQUIRE_THROWS_AS(kfac.step(Space()), NumericalError);
    REQUIRE_THROWS_WITH(kfac.step(Space()), Catch::Contains("layer 'head' factor A"));
  }
  SECTION("keep_previous_on_failure: warn, keep the factor, never precondition with NaN") {
    std::ostringstream log;
    auto o = exact_options(ComputeMethod::eigen, 0.01);
    o.inv_update_steps = std::int64_t(100);
    o.keep_previous_on_failure = true;
    o.log = &log;
    KFAC<double, Mem> kfac(o);
    kfac.register_layer("head", views);
    const auto before = flatten(to_host(layer.curvature().weight_gradient));
    kfac.step(Space()); // no factor yet: the gradient passes through unchanged
    CHECK_THAT(log.str(), Catch::Contains("layer 'head' factor A at step 0"));
    CHECK(flatten(to_host(layer.curvature().weight_gradient)) == before);
    CHECK(kfac.factor_a(0).updates() == 0);
    // A good step builds factors and, although step 1 is not a decomposition step here,
    // preconditions at once; a later bad one keeps the factors.
    use_bad = false;
    const auto grad1 = flatten(to_host(layer.curvature().weight_gradient));
    kfac.step(Space());
    CHECK(flatten(to_host(layer.curvature().weight_gradient)) != grad1);
    const auto a1 = flatten(to_host(kfac.factor_a(0).factor()));
    use_bad = true;
    kfac.step(Space());
    CHECK(flatten(to_host(kfac.factor_a(0).factor())) == a1);
    for (double v : flatten(to_host(layer.curvature().weight_gradient)))
      CHECK(std::isfinite(v));
  }
  SECTION("a non-finite gradient is reported, not passed on") {
    use_bad = false;
    KFAC<double, Mem> kfac(exact_options(ComputeMethod::eigen, 0.01));
    kfac.register_layer("head", views);
    Kokkos::deep_copy(Kokkos::subview(layer.curvature().weight_gradient, 0, 0),
                      std::numeric_limits<double>::infinity());
    REQUIRE_THROWS_WITH(kfac.step(Space()), Catch::Contains("layer 'head'"));
  }
  SECTION("missing a and g on a factor-update step") {
    nn::Dense<double, Mem> other(3, 2);
    auto b2 = bind_fresh<double>(other, 4);
    KFAC<double, Mem> kfac(exact_options(ComputeMethod::eigen, 0.01));
    kfac.register_layer("plain", [&] { return other.curvature(); });
    REQUIRE_THROWS_WITH(kfac.step(Space()),
                        Catch::Contains("a and g must be recorded on a factor-update step"));
  }
}

TEST_CASE("kfac: skip_layers and registration errors", "[kfac][errors]") {
  SmallMLP net;
  KFAC<double, Mem>::Options o;
  o.skip_layers = {"2"};
  KFAC<double, Mem> kfac(o);
  CHECK(kfac.register_model(net.model) == 1);
  CHECK(kfac.layer_names() == std::vector<std::string>{"0"});
  KFAC<double, Mem>::Options by_type;
  by_type.skip_layers = {"dense"};
  KFAC<double, Mem> none(by_type);
  CHECK(none.register_model(net.model) == 0);
  REQUIRE_THROWS_WITH(kfac.register_layer("0", [&] { return net.model.layer(0).curvature(); }),
                      Catch::Contains("'0' is already registered"));
  REQUIRE_THROWS_WITH(kfac.register_layer("x", {}), Catch::Contains("views of layer 'x'"));
}

TEST_CASE("kfac: state and load_state continue a run exactly", "[kfac]") {
  auto o = exact_options(ComputeMethod::eigen, 0.02);
  o.factor_decay = 0.9;
  o.factor_update_steps = std::int64_t(2);
  o.inv_update_steps = std::int64_t(2);
  SmallMLP a, b;
  KFAC<double, Mem> ka(o), kb(exact_options(ComputeMethod::eigen, 0.5));
  ka.register_model(a.model);
  kb.register_model(b.model);
  for (int s = 0; s < 3; ++s) {
    a.run(random_matrix<double>(6, 5, 30 + s), random_matrix<double>(6, 3, 40 + s));
    ka.step(Space());
  }
  const auto st = ka.state();
  CHECK(st.steps == 3);
  CHECK(st.values.damping == 0.02);
  REQUIRE(st.layers.size() == 2);
  CHECK(st.layers[0].a_dim == 6);
  kb.load_state(Space(), st);
  CHECK(kb.steps() == 3);
  CHECK(kb.options().damping(0) == 0.02); // constants come back with the state
  // Step 3 is not a decomposition step: both must precondition with decompositions of the
  // same factors (kb recomputed them on load), and step 4 updates both the same way.
  auto x = random_matrix<double>(6, 5, 50), dy = random_matrix<double>(6, 3, 51);
  for (int s = 3; s < 5; ++s) {
    a.run(x, dy);
    b.run(x, dy);
    ka.step(Space());
    kb.step(Space());
    CHECK(max_rel(flatten(to_host(b.model.gradients())), flatten(to_host(a.model.gradients()))) <
          1e-12);
  }
  auto bad = st;
  bad.layers[1].name = "9";
  REQUIRE_THROWS_WITH(kb.load_state(Space(), bad), Catch::Contains("layer 1 must be '2', got '9'"));
  bad = st;
  bad.layers[0].A.pop_back();
  REQUIRE_THROWS_AS(kb.load_state(Space(), bad), ShapeError);
}

TEST_CASE("kfac: state_dict holds the decompositions so a run continues bit for bit",
          "[kfac][state]") {
  for (const ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
    INFO((method == ComputeMethod::eigen ? "eigen" : "inverse"));
    auto o = exact_options(method, 0.02);
    o.factor_decay = 0.9;
    o.factor_update_steps = std::int64_t(1);
    o.inv_update_steps = std::int64_t(3);
    SmallMLP a, b;
    KFAC<double, Mem> ka(o), kb(exact_options(method, 0.5));
    ka.register_model(a.model);
    kb.register_model(b.model);
    for (int s = 0; s < 4; ++s) {
      a.run(random_matrix<double>(6, 5, 30 + s), random_matrix<double>(6, 3, 40 + s));
      ka.step(Space());
    }
    // After step 4 the factors are newer than the step-3 decompositions: recomputing those
    // from the factors (as load_state does) would precondition differently.
    const StateDict st = ka.state_dict();
    CHECK(st.get<std::int64_t>("steps") == 4);
    CHECK(st.text("layers.1.name") == "2");
    CHECK(st.get<std::uint64_t>("layers.0.A.updates") == 4);
    CHECK(st.contains(method == ComputeMethod::eigen ? "layers.0.G.eigenvectors"
                                                     : "layers.0.G.inverse"));
    StateDict missing;
    for (const auto &[name, e] : st.entries())
      if (name != "layers.1.G.factor")
        missing.insert(name, e);
    CHECK_THROWS_WITH(kb.load_state_dict(missing),
                      Catch::Contains("layer '2'") && Catch::Contains("'factor' is missing"));
    CHECK(kb.steps() == 0); // nothing changed
    kb.load_state_dict(st);
    CHECK(kb.steps() == 4);
    CHECK(kb.options().damping(0) == 0.02);
    for (int s = 4; s < 8; ++s) { // through the next decomposition step (6)
      const auto x = random_matrix<double>(6, 5, 50 + s), dy = random_matrix<double>(6, 3, 60 + s);
      a.run(x, dy);
      b.run(x, dy);
      ka.step(Space());
      kb.step(Space());
      const auto ga = flatten(to_host(a.model.gradients()));
      const auto gb = flatten(to_host(b.model.gradients()));
      CHECK(ga == gb);
    }
    const StateDict after_a = ka.state_dict(), after_b = kb.state_dict();
    for (const auto &[name, e] : after_a.entries()) {
      INFO(name);
      CHECK(after_b.at(name).bytes == e.bytes);
    }
  }
}

TEST_CASE("kfac: containers are walked and BatchNorm is left to the base optimizer",
          "[kfac][residual]") {
  // conv -> BN -> ReLU -> Residual(conv, BN | shortcut conv 1x1) -> flatten -> dense
  const FeatureShape in{1, 4, 4};
  nn::Sequential<double, Mem> model(in);
  model.add<nn::Conv2d>(1, 2, 3, 1, 1);
  model.add<nn::BatchNorm2d>(2);
  model.add<nn::ReLU>();
  auto block = std::make_unique<nn::Residual<double, Mem>>(FeatureShape{2, 4, 4});
  block->add<nn::Conv2d>(2, 3, 3, 2, 1);
  block->add<nn::BatchNorm2d>(3);
  block->add_shortcut<nn::Conv2d>(2, 3, 1, 2, 0, 1, false);
  model.add(std::move(block));
  model.add<nn::Flatten>();
  model.add<nn::Dense>(12, 2);
  model.compile(Space(), 3);
  KFAC<double, Mem> kfac(exact_options(ComputeMethod::eigen, 0.1));
  REQUIRE(kfac.register_model(model) == 4);
  CHECK(kfac.layer_names() == std::vector<std::string>{"0", "3.0", "3.2", "5"});
  CHECK(kfac.factor_a(2).dim() == 2); // the 1x1 shortcut has no bias: C_in · 1 · 1
  CHECK(kfac.factor_a(1).dim() == 2 * 9 + 1);
  auto x = random_matrix<double>(3, in.size(), 4);
  auto dy = random_matrix<double>(3, 2, 5);
  model.zero_grad(Space());
  model.forward(Space(), x);
  model.backward(Space(), dy);
  // BatchNorm's (gamma, beta) gradients sit between the conv blocks in the flat buffer.
  const auto before = flatten(to_host(model.gradients()));
  const auto &bn = model.layer(1);
  const auto conv0 = model.layer(0).curvature().weight_gradient;
  const std::size_t bn_begin = conv0.extent(0) * conv0.extent(1);
  kfac.step(Space());
  const auto after = flatten(to_host(model.gradients()));
  for (std::size_t i = bn_begin; i < bn_begin + bn.parameter_count(); ++i)
    CHECK(after[i] == before[i]);
  CHECK(after[0] != before[0]); // the first conv's gradient was preconditioned
  for (double v : after)
    CHECK(std::isfinite(v));
}

// ---- factored preconditioning (Options::factored_preconditioning) ----

namespace {

// 12 -> 10 (tanh) -> 8 (tanh) -> 2 at batch 4: with rows = 4 the first two Dense layers are
// cheaper factored (3192 < 5980 and 2184 < 3344 flops), the 8 -> 2 head is not (824 > 396).
// With `conv`: 1x6x6 -> Conv2d 3x3 (3 channels, rows = 4·16 = 64: direct) -> Flatten ->
// Dense 48 -> 5 (factored: 21368 < 26460).
template <class Scalar> struct FactoredNet {
  nn::Sequential<Scalar, Mem> model;
  std::size_t in, out;
  explicit FactoredNet(bool conv)
      : model(conv ? FeatureShape{1, 6, 6} : FeatureShape{12}), in(conv ? 36 : 12),
        out(conv ? 5 : 2) {
    if (conv) {
      model.template add<nn::Conv2d>(1, 3, 3);
      model.template add<nn::Flatten>();
      model.template add<nn::Dense>(48, 5);
    } else {
      model.template add<nn::Dense>(12, 10);
      model.template add<nn::Tanh>();
      model.template add<nn::Dense>(10, 8);
      model.template add<nn::Tanh>();
      model.template add<nn::Dense>(8, 2);
    }
    model.compile(Space(), 23);
  }
  // zero_grad, forward, backward of an output gradient carrying 1/N like a mean loss.
  void run(std::uint64_t seed, std::size_t n = 4) {
    const auto x = random_matrix<Scalar>(n, in, seed);
    const auto dy = random_matrix<Scalar>(n, out, seed + 1000, -0.5 / n, 0.5 / n);
    model.zero_grad(Space());
    model.forward(Space(), x);
    model.backward(Space(), dy);
  }
  // θ ← θ − lr·∇ (plain SGD, so both runs take the same update from their own gradients).
  void sgd(double lr) {
    const auto p = model.parameters();
    const auto g = model.gradients();
    const Scalar s = static_cast<Scalar>(lr);
    Kokkos::parallel_for(
        "sgd", Kokkos::RangePolicy<Space>(0, p.extent(0)),
        KOKKOS_LAMBDA(const std::size_t i) { p(i) -= s * g(i); });
  }
};

template <class V> std::vector<double> host_doubles(const V &v) {
  const auto h = to_host(v);
  std::vector<double> out(h.extent(0));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<double>(h(i));
  return out;
}

// Runs the same steps with the option off and on: factors every 2 steps, decompositions every
// 4, 9 steps (the last batch smaller), SGD with rate `lr` in between; compares every step's
// preconditioned gradient and the final parameters. With `sync` the factored run's
// parameters are reset to the direct run's after each step, so every step compares the two
// forms on identical a, g, ∇ and factors (without it rounding differences may grow through
// the training dynamics). Returns the largest relative gradient difference.
template <class Scalar, class InverseScalar>
double factored_vs_direct(ComputeMethod method, bool conv, double kl_clip, double tol,
                          bool sync = true, double lr = 0.1) {
  FactoredNet<Scalar> direct_net(conv), factored_net(conv);
  typename KFAC<Scalar, Mem, InverseScalar>::Options o;
  o.compute_method = method;
  // The conv net's Dense layer has a 4-row batch for 49 inputs, so A is far from full rank:
  // the direct form's own rounding of ∇ in A's null space is amplified by 1/λ, the true
  // components only by 1/(d_G d_A + λ), while the factored form has no such rounding. A
  // larger damping keeps that amplification, and so the gap, small.
  o.damping = conv ? 1.0 : 0.01;
  o.kl_clip = kl_clip;
  o.lr = 0.1;
  o.factor_decay = 0.7;
  o.factor_update_steps = std::int64_t(2);
  o.inv_update_steps = std::int64_t(4);
  KFAC<Scalar, Mem, InverseScalar> direct(o);
  o.factored_preconditioning = true;
  KFAC<Scalar, Mem, InverseScalar> factored(o);
  direct.register_model(direct_net.model);
  factored.register_model(factored_net.model);
  double worst = 0;
  INFO("Scalar bytes " << sizeof(Scalar) << ", InverseScalar bytes " << sizeof(InverseScalar)
                       << ", kl_clip " << kl_clip);
  for (int s = 0; s < 9; ++s) {
    INFO("step " << s);
    const std::size_t n = s == 8 ? 3 : 4;
    direct_net.run(300 + s, n);
    factored_net.run(300 + s, n);
    direct.step(Space());
    factored.step(Space());
    const double diff = max_rel(host_doubles(factored_net.model.gradients()),
                                host_doubles(direct_net.model.gradients()));
    CHECK(diff < tol);
    CHECK(factored.kl_scale() == Approx(direct.kl_scale()).epsilon(100 * tol));
    // The choice per layer (registration order).
    if (conv) {
      CHECK(!factored.factored(0));
      CHECK(factored.factored(1));
    } else {
      CHECK(factored.factored(0));
      CHECK(factored.factored(1));
      CHECK(!factored.factored(2));
    }
    for (std::size_t l = 0; l < direct.size(); ++l)
      CHECK(!direct.factored(l));
    direct_net.sgd(lr);
    factored_net.sgd(lr);
    if (sync)
      Kokkos::deep_copy(factored_net.model.parameters(), direct_net.model.parameters());
  }
  CHECK(max_rel(host_doubles(factored_net.model.parameters()),
                host_doubles(direct_net.model.parameters())) < tol);
  return worst;
}

} // namespace

TEST_CASE("kfac: factored preconditioning equals the direct form", "[kfac][factored]") {
  for (const ComputeMethod method : {ComputeMethod::inverse, ComputeMethod::eigen}) {
    for (const bool conv : {false, true}) {
      INFO("method " << (method == ComputeMethod::eigen ? "eigen" : "inverse") << ", conv "
                     << conv);
      factored_vs_direct<double, double>(method, conv, 0.0, 1e-12);
      factored_vs_direct<double, double>(method, conv, 1e-6, 1e-12); // KL clip active
      factored_vs_direct<float, double>(method, conv, 0.0, 1e-5);
      factored_vs_direct<float, float>(method, conv, 0.0, 1e-5);
    }
  }
}

TEST_CASE("kfac: training with factored preconditioning gives the same parameters",
          "[kfac][factored]") {
  // No parameter reset between steps: nine K-FAC + SGD steps end at the same parameters.
  for (const ComputeMethod method : {ComputeMethod::inverse, ComputeMethod::eigen}) {
    for (const bool conv : {false, true}) {
      INFO("method " << (method == ComputeMethod::eigen ? "eigen" : "inverse") << ", conv "
                     << conv);
      factored_vs_direct<double, double>(method, conv, 1e-3, 1e-10, false, 0.01);
    }
  }
}

TEST_CASE("kfac: factored preconditioning chooses per layer and records only where needed",
          "[kfac][factored]") {
  using K = KFAC<double, Mem>;
  CHECK(K::direct_flops(256, 785) == 2.0 * 256 * 785 * (256 + 785));
  CHECK(K::factored_flops(256, 785, 128) == 2.0 * 128 * (256.0 * 256 + 785.0 * 785 + 256.0 * 785));
  CHECK(K::factored_flops(256, 785, 128) < K::direct_flops(256, 785)); // MLP layer 1
  CHECK(K::factored_flops(256, 257, 128) < K::direct_flops(256, 257)); // MLP layer 2
  CHECK(K::factored_flops(10, 257, 128) > K::direct_flops(10, 257));   // MLP head
  CHECK(K::factored_tolerance(128, 785) ==
        Approx(128 * std::numeric_limits<double>::epsilon() +
               2 * 913 * std::numeric_limits<double>::epsilon()));
  CHECK(KFAC<float, Mem>::factored_tolerance(128, 785) > 128 * 1.19e-7);

  FactoredNet<double> net(false);
  K::Options o;
  o.factor_update_steps = std::int64_t(3);
  o.inv_update_steps = std::int64_t(3);
  o.factored_preconditioning = true;
  K kfac(o);
  kfac.register_model(net.model);
  std::size_t bytes_at_4 = 0;
  for (int s = 0; s < 8; ++s) {
    const bool factor_step = s % 3 == 0;
    CHECK(kfac.needs_curvature() == factor_step);
    // Before the first step every owned layer records; afterwards the factored ones every
    // step and the direct head only on factor-update steps.
    CHECK(net.model.layer(0).recording_curvature());
    CHECK(net.model.layer(2).recording_curvature());
    CHECK(net.model.layer(4).recording_curvature() == (s == 0 || factor_step));
    CHECK(kfac.wants_curvature(2) == net.model.layer(4).recording_curvature());
    net.run(700 + s);
    kfac.step(Space());
    CHECK(kfac.factored(0));
    CHECK(!kfac.factored(2));
    CHECK(kfac.factored_check(0) <= K::factored_tolerance(4, 13));
    if (s == 4)
      bytes_at_4 = kfac.state_bytes();
  }
  CHECK(kfac.state_bytes() == bytes_at_4); // no allocation in steady state

  // A larger batch makes the factored form dearer: rows 8 cost 6384 > 5980 for the first layer.
  net.run(800, 8);
  kfac.step(Space());
  CHECK(!kfac.factored(0));
  CHECK(!kfac.factored(1));

  // Option off: nothing changes in the recording schedule.
  FactoredNet<double> plain_net(false);
  K::Options p;
  p.factor_update_steps = std::int64_t(2);
  K plain(p);
  plain.register_model(plain_net.model);
  plain_net.run(900);
  plain.step(Space());
  CHECK(!plain.factored(0));
  CHECK(!plain_net.model.layer(0).recording_curvature());
}

TEST_CASE("kfac: factored preconditioning refuses a gradient that is not the batch's g^T a",
          "[kfac][factored][errors]") {
  const auto scale_block = [](nn::Sequential<double, Mem> &model, std::size_t layer,
                              double factor) {
    const auto g = model.layer(layer).curvature().weight_gradient;
    Kokkos::parallel_for(
        "scale", matrix_policy(Space(), g.extent(0), g.extent(1)),
        KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) { g(i, j) *= factor; });
  };
  for (const ComputeMethod method : {ComputeMethod::inverse, ComputeMethod::eigen}) {
    FactoredNet<double> net(false);
    KFAC<double, Mem>::Options o;
    o.compute_method = method;
    o.factor_update_steps = std::int64_t(2);
    o.inv_update_steps = std::int64_t(4);
    o.factored_preconditioning = true;
    KFAC<double, Mem> kfac(o);
    kfac.register_model(net.model);
    net.run(1);
    kfac.step(Space()); // factors, decompositions, a good factored step
    net.run(2);
    kfac.step(Space()); // a non-factor step: checked too
    CHECK(kfac.factored(0));

    // A gradient scaled by 1.01 (as clipping would) on a non-factor step (step 3).
    net.run(3);
    kfac.step(Space());
    net.run(4);
    scale_block(net.model, 2, 1.01);
    const auto before = host_doubles(net.model.gradients());
    REQUIRE_THROWS_AS(kfac.step(Space()), ValueError);
    try {
      kfac.step(Space());
    } catch (const ValueError &e) {
      const std::string m = e.what();
      CHECK_THAT(m, Catch::Contains("layer '2'"));
      CHECK_THAT(m, Catch::Contains("at step 3"));
      CHECK_THAT(m, Catch::Contains("allowed"));
      CHECK_THAT(m, Catch::Contains("no accumulation"));
      CHECK_THAT(m, Catch::Contains("data-parallel averaging"));
    }
    CHECK(host_doubles(net.model.gradients()) == before); // nothing applied

    // The direct head is not checked (and needs no check: P is computed from ∇ itself).
    net.run(5);
    scale_block(net.model, 4, 1.01);
    kfac.step(Space());
    CHECK(!kfac.factored(2));

    // Gradients accumulated over two backward passes (a factor-update step, step 4).
    const auto x1 = random_matrix<double>(4, 12, 11), x2 = random_matrix<double>(4, 12, 12);
    const auto dy = random_matrix<double>(4, 2, 13, -0.1, 0.1);
    net.model.zero_grad(Space());
    net.model.forward(Space(), x1);
    net.model.backward(Space(), dy);
    net.model.forward(Space(), x2);
    net.model.backward(Space(), dy);
    REQUIRE(kfac.needs_curvature());
    REQUIRE_THROWS_WITH(kfac.step(Space()), Catch::Contains("layer '0'") &&
                                                Catch::Contains("is not the recorded batch"));
  }
}

TEST_CASE("kfac: a weight gradient with a leading dimension above out is preconditioned in place",
          "[kfac]") {
  // The same Dense layer registered twice: once with its own (contiguous) gradient, once with
  // a copy held in the first rows of a taller matrix (leading dimension out + 3), as a code
  // with padded storage would register it. The fused KL-clip and apply kernels must read and
  // write the padded one at its strides and leave the padding alone.
  const std::size_t n = 5, out = 3, in = 4;
  nn::Dense<double, Mem> layer(in, out);
  auto buffer = bind_fresh<double>(layer, 7);
  layer.record_curvature(true);
  auto x = random_matrix<double>(n, in, 8);
  auto dy = random_matrix<double>(n, out, 9);
  Matrix<double, Mem> y("y", n, out);
  layer.forward(Space(), x, y);
  layer.backward(Space(), dy, Matrix<double, Mem>());
  Matrix<double, Mem> tall("tall", out + 3, in + 1);
  Kokkos::deep_copy(tall, -7.0);
  const auto padded = Kokkos::subview(tall, Kokkos::make_pair(std::size_t(0), out), Kokkos::ALL);
  static_assert(
      std::is_same<std::decay_t<decltype(padded)>::array_layout, Kokkos::LayoutLeft>::value,
      "a row range of a LayoutLeft matrix stays LayoutLeft");
  REQUIRE(padded.stride(1) == out + 3);
  Kokkos::deep_copy(padded, layer.curvature().weight_gradient);
  for (const ComputeMethod method : {ComputeMethod::eigen, ComputeMethod::inverse}) {
    auto o = exact_options(method, 0.05);
    o.kl_clip = 1e-4; // the clip acts, so ν·P with ν < 1 is what both must hold
    KFAC<double, Mem> plain(o), strided(o);
    plain.register_layer("0", [&] { return layer.curvature(); });
    strided.register_layer("0", [&] {
      auto r = layer.curvature();
      r.weight_gradient = padded;
      return r;
    });
    Kokkos::deep_copy(padded, layer.curvature().weight_gradient);
    strided.step(Space());
    plain.step(Space());
    REQUIRE(plain.kl_scale() < 1.0);
    CHECK(strided.kl_scale() == plain.kl_scale());
    CHECK(strided.vg_sum() == plain.vg_sum());
    const auto p = to_host(layer.curvature().weight_gradient);
    const auto t = to_host(tall);
    for (std::size_t j = 0; j < in + 1; ++j) {
      for (std::size_t i = 0; i < out + 3; ++i) {
        CHECK(t(i, j) == (i < out ? p(i, j) : -7.0));
      }
    }
    layer.backward(Space(), dy, Matrix<double, Mem>()); // a fresh gradient for the next method
  }
}

} // namespace test_kfac
