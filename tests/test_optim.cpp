// Tests of kat::optim against hand-worked numbers and independent host re-implementations in
// double (Adam's in the paper's m-hat / v-hat form rather than PyTorch's folded one).
#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include "kat/core/error.hpp"
#include "kat/core/views.hpp"
#include "kat/optim/adam.hpp"
#include "kat/optim/lr_schedule.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/optim/sgd.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace test_optim {

namespace {

using kat::DefaultMemorySpace;
using kat::test::MessageContains;
using ExecSpace = DefaultMemorySpace::execution_space;
template <class T> using Vec = kat::Vector<T, DefaultMemorySpace>;

template <class T> Vec<T> to_device(const std::vector<double> &x) {
  Vec<T> v("test_optim::vector", x.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) {
    h(i) = static_cast<T>(x[i]);
  }
  Kokkos::deep_copy(v, h);
  return v;
}

template <class T> void assign(const Vec<T> &v, const std::vector<double> &x) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) {
    h(i) = static_cast<T>(x[i]);
  }
  Kokkos::deep_copy(v, h);
}

template <class T> std::vector<double> to_host(const Vec<T> &v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  std::vector<double> x(v.extent(0));
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<double>(h(i));
  }
  return x;
}

/// Values representable in T, so the double reference starts from the same numbers.
template <class T>
std::vector<double> random_values(std::size_t n, unsigned seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> x(n);
  for (auto &xi : x) {
    xi = static_cast<double>(static_cast<T>(dist(gen)));
  }
  return x;
}

template <class T> double tol() { return std::is_same<T, float>::value ? 2e-6 : 1e-13; }

template <class T>
void require_close(const std::vector<double> &actual, const std::vector<double> &expected,
                   double scale = 1.0) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i);
    REQUIRE(actual[i] == Approx(expected[i]).epsilon(4 * tol<T>()).margin(4 * tol<T>() * scale));
  }
}

/// torch.optim.SGD, one scalar at a time.
struct SGDReference {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  std::vector<double> buf;
  bool has_buf = false;

  void step(std::vector<double> &p, const std::vector<double> &g) {
    if (!has_buf) {
      buf.assign(p.size(), 0.0);
    }
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double d = g[i] + weight_decay * p[i];
      double update = d;
      if (momentum != 0.0) {
        buf[i] = has_buf ? momentum * buf[i] + (1.0 - dampening) * d : d;
        update = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] = p[i] - lr * update;
    }
    has_buf = true;
  }
};

/// Kingma & Ba Algorithm 1 with explicit bias-corrected moments, PyTorch's eps placement and
/// either L2 or decoupled (Loshchilov & Hutter Algorithm 2) weight decay.
struct AdamReference {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  std::vector<double> m, v;
  int t = 0;

  void step(std::vector<double> &p, const std::vector<double> &g) {
    if (t == 0) {
      m.assign(p.size(), 0.0);
      v.assign(p.size(), 0.0);
    }
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double gi = g[i];
      if (decoupled) {
        p[i] -= lr * weight_decay * p[i];
      } else {
        gi += weight_decay * p[i];
      }
      m[i] = beta1 * m[i] + (1.0 - beta1) * gi;
      v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi;
      const double m_hat = m[i] / (1.0 - std::pow(beta1, t));
      const double v_hat = v[i] / (1.0 - std::pow(beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

} // namespace

// ---------------------------------------------------------------------------------------- SGD

TEMPLATE_TEST_CASE("optim: SGD plain step", "[optim][sgd]", float, double) {
  ExecSpace space;
  auto p = to_device<TestType>({1.0, -2.0, 0.5});
  auto g = to_device<TestType>({0.5, -1.0, 2.0});
  typename kat::optim::SGD<TestType>::Options o;
  o.lr = 0.1;
  kat::optim::SGD<TestType> sgd(3, o);
  CHECK(sgd.name() == "SGD");
  CHECK(sgd.size() == 3);
  CHECK(sgd.steps() == 0);
  CHECK(sgd.momentum_buffer().extent(0) == 0);
  sgd.step(space, p, g);
  CHECK(sgd.steps() == 1);
  require_close<TestType>(to_host(p), {0.95, -1.9, 0.3});
  // The gradient is read, not modified.
  require_close<TestType>(to_host(g), {0.5, -1.0, 2.0});
}

TEMPLATE_TEST_CASE("optim: SGD momentum", "[optim][sgd]", float, double) {
  ExecSpace space;
  auto p = to_device<TestType>({1.0, -2.0});
  auto g = to_device<TestType>({0.5, 2.0});
  typename kat::optim::SGD<TestType>::Options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  kat::optim::SGD<TestType> sgd(2, o);
  REQUIRE(sgd.momentum_buffer().extent(0) == 2);
  CHECK(sgd.momentum_buffer().label() == "kat::optim::SGD::momentum_buffer");

  sgd.step(space, p, g);
  // First step: the buffer is the gradient itself, not (1 - dampening) * g nor momentum * 0 + g.
  require_close<TestType>(to_host(sgd.momentum_buffer()), {0.5, 2.0});
  require_close<TestType>(to_host(p), {0.95, -2.2});

  assign(g, {-1.0, 1.0});
  sgd.step(space, p, g);
  // buf = 0.9 * 0.5 - 1 = -0.55, p = 0.95 + 0.055; buf = 1.8 + 1 = 2.8, p = -2.2 - 0.28.
  require_close<TestType>(to_host(sgd.momentum_buffer()), {-0.55, 2.8});
  require_close<TestType>(to_host(p), {1.005, -2.48});
}

TEMPLATE_TEST_CASE("optim: SGD dampening", "[optim][sgd]", float, double) {
  ExecSpace space;
  auto p = to_device<TestType>({1.0});
  auto g = to_device<TestType>({0.5});
  typename kat::optim::SGD<TestType>::Options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.dampening = 0.5;
  kat::optim::SGD<TestType> sgd(1, o);
  sgd.step(space, p, g);
  // No dampening on the first step (PyTorch clones the gradient into the buffer).
  require_close<TestType>(to_host(sgd.momentum_buffer()), {0.5});
  require_close<TestType>(to_host(p), {0.95});
  assign(g, {-1.0});
  sgd.step(space, p, g); // buf = 0.45 - 0.5 = -0.05
  require_close<TestType>(to_host(sgd.momentum_buffer()), {-0.05});
  require_close<TestType>(to_host(p), {0.955});
  assign(g, {2.0});
  sgd.step(space, p, g); // buf = -0.045 + 1 = 0.955
  require_close<TestType>(to_host(sgd.momentum_buffer()), {0.955});
  require_close<TestType>(to_host(p), {0.8595});
}

TEMPLATE_TEST_CASE("optim: SGD nesterov", "[optim][sgd]", float, double) {
  ExecSpace space;
  auto p = to_device<TestType>({1.0});
  auto g = to_device<TestType>({0.5});
  typename kat::optim::SGD<TestType>::Options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  kat::optim::SGD<TestType> sgd(1, o);
  sgd.step(space, p, g); // buf = 0.5, d = 0.5 + 0.45
  require_close<TestType>(to_host(p), {0.905});
  assign(g, {-1.0});
  sgd.step(space, p, g); // buf = -0.55, d = -1 - 0.495
  require_close<TestType>(to_host(sgd.momentum_buffer()), {-0.55});
  require_close<TestType>(to_host(p), {1.0545});
}

TEMPLATE_TEST_CASE("optim: SGD weight decay", "[optim][sgd]", float, double) {
  ExecSpace space;
  auto p = to_device<TestType>({2.0});
  auto g = to_device<TestType>({0.5});
  typename kat::optim::SGD<TestType>::Options o;
  o.lr = 0.1;
  o.weight_decay = 0.1;
  kat::optim::SGD<TestType> sgd(1, o);
  sgd.step(space, p, g); // d = 0.5 + 0.2
  require_close<TestType>(to_host(p), {1.93});
  sgd.step(space, p, g); // d = 0.5 + 0.193
  require_close<TestType>(to_host(p), {1.8607});
}

TEMPLATE_TEST_CASE("optim: SGD all options against a host reference", "[optim][sgd]", float,
                   double) {
  ExecSpace space;
  const std::size_t n = 257;
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Case c :
       {Case{0.9, 0.0, 1e-2, true}, Case{0.8, 0.3, 5e-3, false}, Case{0.0, 0.0, 0.1, false}}) {
    INFO("momentum " << c.momentum << " dampening " << c.dampening << " nesterov " << c.nesterov);
    auto p_host = random_values<TestType>(n, 1, -1.0, 1.0);
    auto p = to_device<TestType>(p_host);
    auto g = to_device<TestType>(std::vector<double>(n, 0.0));
    typename kat::optim::SGD<TestType>::Options o;
    o.lr = 0.05;
    o.momentum = c.momentum;
    o.dampening = c.dampening;
    o.weight_decay = c.weight_decay;
    o.nesterov = c.nesterov;
    kat::optim::SGD<TestType> sgd(n, o);
    SGDReference ref{0.05, c.momentum, c.dampening, c.weight_decay, c.nesterov, {}};
    for (int s = 0; s < 5; ++s) {
      const auto g_host = random_values<TestType>(n, 100 + s, -2.0, 2.0);
      assign(g, g_host);
      if (s == 3) {
        // A schedule changes the rate between steps; both sides see it.
        sgd.set_lr(0.02);
        ref.lr = 0.02;
      }
      sgd.step(space, p, g);
      ref.step(p_host, g_host);
    }
    CHECK(sgd.steps() == 5);
    require_close<TestType>(to_host(p), p_host);
  }
}

// --------------------------------------------------------------------------------------- Adam

TEMPLATE_TEST_CASE("optim: Adam three steps", "[optim][adam]", float, double) {
  ExecSpace space;
  auto p = to_device<TestType>({1.0});
  auto g = to_device<TestType>({0.5});
  typename kat::optim::Adam<TestType>::Options o;
  o.lr = 0.1;
  kat::optim::Adam<TestType> adam(1, o);
  CHECK(adam.name() == "Adam");
  CHECK(adam.exp_avg().label() == "kat::optim::Adam::exp_avg");
  // Worked by hand in the m-hat / v-hat form: step 1 moves by lr * 0.5 / (0.5 + 1e-8).
  adam.step(space, p, g);
  require_close<TestType>(to_host(adam.exp_avg()), {0.05}, 0.05);
  require_close<TestType>(to_host(adam.exp_avg_sq()), {0.00025}, 0.00025);
  require_close<TestType>(to_host(p), {0.900000002});
  assign(g, {-1.0});
  adam.step(space, p, g); // m = -0.055, v = 0.00124975
  require_close<TestType>(to_host(adam.exp_avg()), {-0.055}, 0.05);
  require_close<TestType>(to_host(adam.exp_avg_sq()), {0.00124975}, 0.00125);
  require_close<TestType>(to_host(p), {0.9366103542405654});
  assign(g, {2.0});
  adam.step(space, p, g); // m = 0.1505, v = 0.00524850025
  require_close<TestType>(to_host(adam.exp_avg()), {0.1505}, 0.15);
  require_close<TestType>(to_host(adam.exp_avg_sq()), {0.00524850025}, 0.005);
  require_close<TestType>(to_host(p), {0.8946447927181046});
  CHECK(adam.steps() == 3);
}

TEST_CASE("optim: Adam stores subnormal moments as zero", "[optim][adam]") {
  // With g = 0, m and v only decay. Element 0 starts just above FLT_MIN, so beta1 * m drops
  // below it and must be stored as exactly 0; element 1 is ordinary and must follow the
  // formula. v = 0.999 * 1.2e-38 stays normal and is kept.
  ExecSpace space;
  const double fmin = double(std::numeric_limits<float>::min()); // 1.1755e-38
  auto p = to_device<float>({0.5, 0.5});
  auto g = to_device<float>({0.0, 0.0});
  kat::optim::Adam<float> adam(2);
  assign(adam.exp_avg(), {1.2e-38, 1e-3});
  assign(adam.exp_avg_sq(), {1.2e-38, 1e-6});
  adam.step(space, p, g);
  const auto m = to_host(adam.exp_avg());
  const auto v = to_host(adam.exp_avg_sq());
  CHECK(0.9 * 1.2e-38 < fmin);
  CHECK(m[0] == 0.0);
  CHECK(v[0] == Approx(0.999 * 1.2e-38).epsilon(1e-6));
  CHECK(m[1] == Approx(0.9e-3).epsilon(1e-6));
  const auto ph = to_host(p);
  CHECK(ph[0] == 0.5f); // a zero moment moves nothing
  // Element 1: step 1 bias corrections, lr 1e-3.
  const double expected =
      0.5 - 1e-3 / 0.1 * 0.9e-3 / (std::sqrt(0.999e-6) / std::sqrt(0.001) + 1e-8);
  CHECK(ph[1] == Approx(expected).epsilon(1e-6));
}

TEST_CASE("optim: SGD stores a subnormal momentum buffer as zero", "[optim][sgd]") {
  // With g = 0 after the first step, buf only decays by the momentum 0.5. Element 0 starts at
  // 4 FLT_MIN: 2, 1 FLT_MIN stay normal, 0.5 FLT_MIN is subnormal and must be stored as 0
  // (it would otherwise stay subnormal for ever: 0.9 times the smallest one rounds back to
  // it); element 1 is ordinary and follows the formula. lr = 1, p = 0: p sums the buffer.
  ExecSpace space;
  const double fmin = double(std::numeric_limits<float>::min()); // 1.1755e-38
  auto p = to_device<float>({0.0, 0.0});
  auto g = to_device<float>({4 * fmin, 1.0});
  typename kat::optim::SGD<float>::Options o;
  o.lr = 1.0;
  o.momentum = 0.5;
  kat::optim::SGD<float> sgd(2, o);
  sgd.step(space, p, g); // buf = g
  assign(g, {0.0, 0.0});
  sgd.step(space, p, g); // 2 FLT_MIN, 0.5
  sgd.step(space, p, g); // FLT_MIN, 0.25
  CHECK(to_host(sgd.momentum_buffer())[0] == Approx(fmin).epsilon(1e-6));
  sgd.step(space, p, g); // 0.5 FLT_MIN -> 0, 0.125
  const auto buf = to_host(sgd.momentum_buffer());
  CHECK(buf[0] == 0.0);
  CHECK(buf[1] == 0.125);
  const auto ph = to_host(p);
  CHECK(ph[0] == Approx(-7 * fmin).epsilon(1e-6)); // 4 + 2 + 1, the last step moved nothing
  CHECK(ph[1] == -1.875);
}

TEMPLATE_TEST_CASE("optim: Adam many elements against a host reference", "[optim][adam]", float,
                   double) {
  ExecSpace space;
  const std::size_t n = 300;
  auto p_host = random_values<TestType>(n, 7, -1.0, 1.0);
  auto p = to_device<TestType>(p_host);
  auto g = to_device<TestType>(std::vector<double>(n, 0.0));
  typename kat::optim::Adam<TestType>::Options o;
  o.lr = 1e-2;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  kat::optim::Adam<TestType> adam(n, o);
  AdamReference ref{1e-2, 0.8, 0.99, 1e-6, 0.0, false, {}, {}};
  for (int s = 0; s < 4; ++s) {
    const auto g_host = random_values<TestType>(n, 200 + s, -3.0, 3.0);
    assign(g, g_host);
    adam.step(space, p, g);
    ref.step(p_host, g_host);
  }
  require_close<TestType>(to_host(p), p_host);
}

TEMPLATE_TEST_CASE("optim: Adam L2 weight decay and AdamW decoupled decay differ", "[optim][adam]",
                   float, double) {
  ExecSpace space;
  const std::vector<double> p0 = {2.0, -1.0, 0.25};
  const std::vector<std::vector<double>> grads = {{0.5, 0.1, -0.3}, {-0.2, 0.4, 0.1}};
  typename kat::optim::Adam<TestType>::Options o;
  o.lr = 0.1;
  o.weight_decay = 0.1;

  auto p_l2 = to_device<TestType>(p0);
  auto p_dec = to_device<TestType>(p0);
  auto g = to_device<TestType>(grads[0]);
  kat::optim::Adam<TestType> l2(3, o);
  o.decoupled_weight_decay = true;
  kat::optim::Adam<TestType> decoupled(3, o);
  AdamReference ref_l2{0.1, 0.9, 0.999, 1e-8, 0.1, false, {}, {}};
  AdamReference ref_dec{0.1, 0.9, 0.999, 1e-8, 0.1, true, {}, {}};
  auto e_l2 = p0;
  auto e_dec = p0;
  for (const auto &gs : grads) {
    assign(g, gs);
    l2.step(space, p_l2, g);
    decoupled.step(space, p_dec, g);
    ref_l2.step(e_l2, gs);
    ref_dec.step(e_dec, gs);
  }
  require_close<TestType>(to_host(p_l2), e_l2);
  require_close<TestType>(to_host(p_dec), e_dec);
  // The decay enters the moments in one and not the other, so the results must differ by
  // far more than rounding.
  const auto a = to_host(p_l2);
  const auto b = to_host(p_dec);
  CHECK(std::abs(a[0] - b[0]) > 1e-3);
  // Decoupled: the first step is (1 - lr * wd) * p - lr * sign(g) by hand.
  AdamReference one{0.1, 0.9, 0.999, 1e-8, 0.1, true, {}, {}};
  auto q = p0;
  one.step(q, grads[0]);
  CHECK(q[0] == Approx(2.0 * 0.99 - 0.1).epsilon(1e-7));
}

TEMPLATE_TEST_CASE("optim: AdamW default options", "[optim][adam]", float, double) {
  using AdamW = kat::optim::AdamW<TestType>;
  const typename AdamW::Options o;
  CHECK(o.lr == 1e-3);
  CHECK(o.beta1 == 0.9);
  CHECK(o.beta2 == 0.999);
  CHECK(o.eps == 1e-8);
  CHECK(o.weight_decay == 0.01);
  CHECK(o.decoupled_weight_decay);

  ExecSpace space;
  const std::size_t n = 64;
  auto p_host = random_values<TestType>(n, 11, -2.0, 2.0);
  auto p = to_device<TestType>(p_host);
  auto g = to_device<TestType>(std::vector<double>(n, 0.0));
  AdamW adamw(n);
  CHECK(adamw.name() == "AdamW");
  CHECK(adamw.lr() == 1e-3);
  CHECK(adamw.exp_avg_sq().label() == "kat::optim::AdamW::exp_avg_sq");
  AdamReference ref{1e-3, 0.9, 0.999, 1e-8, 0.01, true, {}, {}};
  for (int s = 0; s < 3; ++s) {
    const auto g_host = random_values<TestType>(n, 300 + s, -1.0, 1.0);
    assign(g, g_host);
    adamw.step(space, p, g);
    ref.step(p_host, g_host);
  }
  require_close<TestType>(to_host(p), p_host);
}

TEMPLATE_TEST_CASE("optim: Adam first step moves each parameter by lr * sign(g)", "[optim][adam]",
                   float, double) {
  // m1 / (1 - b1) = g and sqrt(v1 / (1 - b2)) = |g|, so step 1 is lr * g / (|g| + eps) for
  // every beta: a known exact property of bias-corrected Adam.
  ExecSpace space;
  const std::vector<double> g_host = {1e-3, -1e-3, 0.5, -7.0, 123.0, -1e3, 2.0, -0.01};
  const std::size_t n = g_host.size();
  const auto p0 = random_values<TestType>(n, 5, -1.0, 1.0);
  for (const double beta1 : {0.9, 0.5}) {
    auto p = to_device<TestType>(p0);
    auto g = to_device<TestType>(g_host);
    typename kat::optim::Adam<TestType>::Options o;
    o.lr = 0.25; // a power of two, so lr * sign(g) is exact in float
    o.beta1 = beta1;
    o.beta2 = 0.99;
    kat::optim::Adam<TestType> adam(n, o);
    adam.step(space, p, g);
    const auto p1 = to_host(p);
    for (std::size_t i = 0; i < n; ++i) {
      INFO("g = " << g_host[i] << ", beta1 = " << beta1);
      const double moved = p0[i] - p1[i];
      const double sign = g_host[i] > 0 ? 1.0 : -1.0;
      // Rounding of p (|p| <= 1.25) plus the eps / |g| shortfall.
      const double bound = 8 * tol<TestType>() + o.lr * o.eps / std::abs(g_host[i]);
      CHECK(std::abs(moved - o.lr * sign) <= bound);
    }
  }
}

// ---------------------------------------------------------------------------------- errors

TEST_CASE("optim: SGD rejects invalid options", "[optim][sgd][errors]") {
  using SGD = kat::optim::SGD<double>;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto make = [](auto edit) {
    SGD::Options o;
    edit(o);
    return SGD(4, o);
  };
  CHECK_THROWS_MATCHES(make([](SGD::Options &o) { o.lr = -0.1; }), kat::ValueError,
                       Catch::Message("kat::optim::SGD: lr must be finite and >= 0, got -0.1"));
  CHECK_THROWS_MATCHES(make([&](SGD::Options &o) { o.lr = nan; }), kat::ValueError,
                       MessageContains("lr"));
  CHECK_THROWS_MATCHES(make([](SGD::Options &o) { o.momentum = -0.5; }), kat::ValueError,
                       MessageContains("momentum must be finite and >= 0, got -0.5"));
  CHECK_THROWS_MATCHES(make([&](SGD::Options &o) { o.momentum = inf; }), kat::ValueError,
                       MessageContains("momentum"));
  CHECK_THROWS_MATCHES(make([](SGD::Options &o) { o.dampening = 1.5; }), kat::ValueError,
                       MessageContains("dampening must be in [0, 1], got 1.5"));
  CHECK_THROWS_MATCHES(make([](SGD::Options &o) { o.dampening = -0.1; }), kat::ValueError,
                       MessageContains("dampening"));
  CHECK_THROWS_MATCHES(make([](SGD::Options &o) { o.weight_decay = -1e-4; }), kat::ValueError,
                       MessageContains("weight_decay"));
  CHECK_THROWS_MATCHES(make([](SGD::Options &o) { o.nesterov = true; }), kat::ValueError,
                       MessageContains("nesterov") && MessageContains("momentum 0"));
  CHECK_THROWS_MATCHES(make([](SGD::Options &o) {
                         o.nesterov = true;
                         o.momentum = 0.9;
                         o.dampening = 0.1;
                       }),
                       kat::ValueError,
                       MessageContains("nesterov") && MessageContains("dampening 0.1"));
  CHECK_NOTHROW(make([](SGD::Options &o) {
    o.lr = 0;
    o.momentum = 0.9;
    o.dampening = 1;
  }));

  SGD sgd(4);
  CHECK_THROWS_MATCHES(sgd.set_lr(-1.0), kat::ValueError, MessageContains("SGD::set_lr: lr"));
  CHECK_THROWS_AS(sgd.set_lr(inf), kat::ValueError);
  CHECK_THROWS_AS(sgd.set_steps(-1), kat::ValueError);
  CHECK(sgd.lr() == 0.01); // unchanged by the rejected calls
  sgd.set_lr(0.5);
  CHECK(sgd.lr() == 0.5);
}

TEST_CASE("optim: Adam and AdamW reject invalid options", "[optim][adam][errors]") {
  using Adam = kat::optim::Adam<float>;
  using AdamW = kat::optim::AdamW<float>;
  auto make = [](auto edit) {
    Adam::Options o;
    edit(o);
    return Adam(4, o);
  };
  CHECK_THROWS_MATCHES(make([](Adam::Options &o) { o.lr = -1e-3; }), kat::ValueError,
                       MessageContains("kat::optim::Adam: lr"));
  CHECK_THROWS_MATCHES(make([](Adam::Options &o) { o.beta1 = 1.0; }), kat::ValueError,
                       MessageContains("beta1 must be in [0, 1), got 1"));
  CHECK_THROWS_MATCHES(make([](Adam::Options &o) { o.beta1 = -0.1; }), kat::ValueError,
                       MessageContains("beta1"));
  CHECK_THROWS_MATCHES(make([](Adam::Options &o) { o.beta2 = 1.0; }), kat::ValueError,
                       MessageContains("beta2"));
  CHECK_THROWS_MATCHES(
      make([](Adam::Options &o) { o.beta2 = std::numeric_limits<double>::quiet_NaN(); }),
      kat::ValueError, MessageContains("beta2"));
  CHECK_THROWS_MATCHES(make([](Adam::Options &o) { o.eps = 0.0; }), kat::ValueError,
                       MessageContains("eps must be finite and > 0, got 0"));
  CHECK_THROWS_MATCHES(make([](Adam::Options &o) { o.weight_decay = -0.01; }), kat::ValueError,
                       MessageContains("weight_decay"));
  CHECK_NOTHROW(make([](Adam::Options &o) { o.beta1 = 0.0; }));

  AdamW::Options w;
  w.eps = -1.0;
  CHECK_THROWS_MATCHES(AdamW(4, w), kat::ValueError, MessageContains("kat::optim::AdamW: eps"));
  AdamW::Options l2;
  l2.decoupled_weight_decay = false;
  CHECK_THROWS_MATCHES(AdamW(4, l2), kat::ValueError, MessageContains("decoupled_weight_decay"));
  AdamW adamw(4);
  CHECK_THROWS_MATCHES(adamw.set_lr(-2.0), kat::ValueError, MessageContains("AdamW::set_lr"));
}

TEMPLATE_TEST_CASE("optim: step rejects wrong lengths", "[optim][errors]", float, double) {
  ExecSpace space;
  Vec<TestType> good("good", 5), short_("short", 4), long_("long", 6);
  kat::optim::SGD<TestType> sgd(5);
  kat::optim::Adam<TestType> adam(5);
  kat::optim::AdamW<TestType> adamw(5);
  for (kat::optim::Optimizer<TestType> *opt :
       std::vector<kat::optim::Optimizer<TestType> *>{&sgd, &adam, &adamw}) {
    INFO(opt->name());
    CHECK_THROWS_MATCHES(opt->step(space, short_, good), kat::ShapeError,
                         MessageContains("params.extent(0) must be 5, got 4"));
    CHECK_THROWS_MATCHES(opt->step(space, good, long_), kat::ShapeError,
                         MessageContains("grads.extent(0) must be 5, got 6"));
    CHECK(opt->steps() == 0); // a rejected call is not counted
    CHECK_NOTHROW(opt->step(space, good, good));
    CHECK(opt->steps() == 1);
  }
}

// ------------------------------------------------------------------------------ schedules

TEST_CASE("optim: constant and step schedules", "[optim][schedule]") {
  const auto c = kat::optim::constant_lr(0.3);
  CHECK(c(0) == 0.3);
  CHECK(c(1000000) == 0.3);

  const auto s = kat::optim::step_lr(0.1, 3, 0.5);
  CHECK(s(0) == Approx(0.1));
  CHECK(s(2) == Approx(0.1)); // last step before the first boundary
  CHECK(s(3) == Approx(0.05));
  CHECK(s(5) == Approx(0.05));
  CHECK(s(6) == Approx(0.025));
  CHECK(s(30) == Approx(0.1 / 1024));
}

TEST_CASE("optim: cosine schedule", "[optim][schedule]") {
  const auto s = kat::optim::cosine_lr(1.0, 10, 0.1);
  CHECK(s(0) == Approx(1.0));
  CHECK(s(5) == Approx(0.55));                                      // cos(pi / 2) = 0
  CHECK(s(2) == Approx(0.1 + 0.9 * (1 + 0.80901699437494745) / 2)); // cos(pi / 5)
  CHECK(s(10) == Approx(0.1));
  CHECK(s(15) == Approx(0.1)); // held at min_lr past the end
  CHECK(s(1000) == Approx(0.1));
  const auto z = kat::optim::cosine_lr(0.2, 4);
  CHECK(z(2) == Approx(0.1));
  CHECK(z(4) == Approx(0.0).margin(1e-15));
}

TEST_CASE("optim: linear warm-up", "[optim][schedule]") {
  const auto w = kat::optim::linear_warmup(4, kat::optim::constant_lr(0.2));
  CHECK(w(0) == Approx(0.05));
  CHECK(w(1) == Approx(0.1));
  CHECK(w(2) == Approx(0.15));
  CHECK(w(3) == Approx(0.2));
  CHECK(w(10) == Approx(0.2));
  // The wrapped schedule sees the same step index.
  const auto wc = kat::optim::linear_warmup(2, kat::optim::cosine_lr(1.0, 10));
  CHECK(wc(0) == Approx(0.5));
  CHECK(wc(5) == Approx(0.5));
  CHECK(wc(10) == Approx(0.0).margin(1e-15));
  const auto one = kat::optim::linear_warmup(1, kat::optim::constant_lr(0.7));
  CHECK(one(0) == Approx(0.7));

  // Driving an optimizer: the schedule's value is what the next step uses.
  kat::optim::SGD<double> sgd(1);
  sgd.set_lr(w(0));
  CHECK(sgd.lr() == Approx(0.05));
}

TEST_CASE("optim: schedules reject invalid arguments", "[optim][schedule][errors]") {
  using kat::ValueError;
  using namespace kat::optim;
  CHECK_THROWS_MATCHES(constant_lr(-1.0), ValueError, MessageContains("lr"));
  CHECK_THROWS_MATCHES(step_lr(-0.1, 3, 0.5), ValueError, MessageContains("base_lr"));
  CHECK_THROWS_MATCHES(step_lr(0.1, 0, 0.5), ValueError,
                       MessageContains("step_size must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(step_lr(0.1, 3, 0.0), ValueError, MessageContains("gamma"));
  CHECK_THROWS_MATCHES(step_lr(0.1, 3, std::numeric_limits<double>::infinity()), ValueError,
                       MessageContains("gamma"));
  CHECK_THROWS_MATCHES(cosine_lr(0.1, 0), ValueError, MessageContains("total_steps"));
  CHECK_THROWS_MATCHES(cosine_lr(0.1, 10, -0.01), ValueError, MessageContains("min_lr"));
  CHECK_THROWS_MATCHES(linear_warmup(0, constant_lr(0.1)), ValueError,
                       MessageContains("warmup_steps"));
  CHECK_THROWS_MATCHES(step_lr(0.1, 3, 0.5)(-1), ValueError, MessageContains("step"));
  CHECK_THROWS_AS(cosine_lr(0.1, 10)(-5), ValueError);
  CHECK_THROWS_AS(linear_warmup(2, constant_lr(0.1))(-1), ValueError);
}

} // namespace test_optim
