// kat::sparse::AGENT (adaptive gradient correction, Lei et al., arXiv 2301.03573) against
// independent host computations on a closed-form model: batch b has the loss
//
//     L_b(θ) = ½ Σ_i a_bi (θ_i − t_bi)² + c_b,   ∇L_b(θ)_i = a_bi (θ_i − t_bi),
//
// evaluated in double on the host from a host copy of the parameters. The "[mpi]" case runs
// under mpiexec at 1, 2, 3 and 4 ranks (ctest mpi_ranks_*); every rank takes the same path through
// the collectives (CHECK, not REQUIRE, where ranks could differ).
#include "test_helpers.hpp"

#include <kat/core/error.hpp>
#include <kat/core/state.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/sparse/agent.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef KAT_ENABLE_MPI
#include "mpi_test_helpers.hpp"

#include <kat/distributed/comm/process_group.hpp>
#endif

namespace test_agent {

using namespace kat;
using namespace kat::test;
using kat::sparse::AGENT;
using kat::sparse::AGENTOptions;

namespace {

// The quadratic batches above, with unequal sample counts so that weighting matters.
struct Quadratic {
  std::size_t n = 0;
  std::vector<std::size_t> samples;
  std::vector<std::vector<double>> a, t;
  std::vector<double> c;

  Quadratic(std::size_t params, std::vector<std::size_t> counts, std::uint64_t seed)
      : n(params), samples(std::move(counts)) {
    HostRng rng(seed);
    const auto uniform = [&rng](double lo, double hi) {
      return lo + (hi - lo) * double(rng.next() >> 11) * 0x1.0p-53;
    };
    for (std::size_t b = 0; b < samples.size(); ++b) {
      a.emplace_back();
      t.emplace_back();
      for (std::size_t i = 0; i < n; ++i) {
        a[b].push_back(uniform(0.5, 2.0));
        t[b].push_back(uniform(-1.0, 1.0));
      }
      c.push_back(uniform(0.0, 1.0));
    }
  }

  std::size_t batches() const { return samples.size(); }

  double loss(std::size_t b, const std::vector<double> &theta) const {
    double l = c[b];
    for (std::size_t i = 0; i < n; ++i)
      l += 0.5 * a[b][i] * (theta[i] - t[b][i]) * (theta[i] - t[b][i]);
    return l;
  }

  std::vector<double> grad(std::size_t b, const std::vector<double> &theta) const {
    std::vector<double> g(n);
    for (std::size_t i = 0; i < n; ++i)
      g[i] = a[b][i] * (theta[i] - t[b][i]);
    return g;
  }

  // Σ_b s_b ∇L_b(θ) / Σ_b s_b over all batches.
  std::vector<double> full_gradient(const std::vector<double> &theta) const {
    std::vector<double> mu(n, 0.0);
    double total = 0;
    for (std::size_t b = 0; b < batches(); ++b) {
      const auto g = grad(b, theta);
      for (std::size_t i = 0; i < n; ++i)
        mu[i] += double(samples[b]) * g[i];
      total += double(samples[b]);
    }
    for (auto &v : mu)
      v /= total;
    return mu;
  }
};

template <class Scalar> using Vec = Vector<Scalar, Mem>;

template <class View> std::vector<double> host_values(const View &v) {
  auto h = to_host(v);
  std::vector<double> out(h.extent(0));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = double(h(i));
  return out;
}

template <class Scalar> Vec<Scalar> device_vector(const std::vector<double> &values) {
  return vector_of<Scalar>(values.size(), [&](std::size_t i) { return values[i]; });
}

// The parameters as the device holds them (rounded to Scalar), back in double.
template <class Scalar> std::vector<double> rounded(const std::vector<double> &values) {
  std::vector<double> out;
  for (const double v : values)
    out.push_back(double(static_cast<Scalar>(v)));
  return out;
}

template <class View> bool same_bytes(const View &x, const View &y) {
  auto hx = to_host(x);
  auto hy = to_host(y);
  return hx.extent(0) == hy.extent(0) &&
         std::memcmp(hx.data(), hy.data(), hx.extent(0) * sizeof(*hx.data())) == 0;
}

std::vector<double> point(std::size_t n, double shift) {
  std::vector<double> theta(n);
  for (std::size_t i = 0; i < n; ++i)
    theta[i] = shift + 0.25 * std::sin(double(i + 1) * (1.0 + shift));
  return theta;
}

// Evaluates batch b of q: the loss at `params` (by `loss_at`, default q.loss), and q's gradient
// into `grads` when it is not empty. Counts its calls in `*calls` when given.
template <class Scalar>
typename AGENT<Scalar, Mem>::Evaluator
evaluator(const Quadratic &q, std::size_t b, int *calls = nullptr,
          std::function<double(std::size_t, const std::vector<double> &)> loss_at = {}) {
  return [&q, b, calls, loss_at](const Vec<Scalar> &params, const Vec<Scalar> &grads) {
    if (calls)
      ++*calls;
    const auto theta = host_values(params);
    if (grads.extent(0) != 0) {
      const auto g = q.grad(b, theta);
      auto h = Kokkos::create_mirror_view(grads);
      for (std::size_t i = 0; i < g.size(); ++i)
        h(i) = static_cast<Scalar>(g[i]);
      Kokkos::deep_copy(grads, h);
    }
    return loss_at ? loss_at(b, theta) : q.loss(b, theta);
  };
}

// A BatchLoop over the batches `which` of q.
template <class Scalar>
typename AGENT<Scalar, Mem>::BatchLoop
batches_of(const Quadratic &q, std::vector<std::size_t> which,
           std::function<double(std::size_t, const std::vector<double> &)> loss_at = {}) {
  return [&q, which, loss_at](const typename AGENT<Scalar, Mem>::BatchVisitor &visit) {
    for (const std::size_t b : which)
      visit(evaluator<Scalar>(q, b, nullptr, loss_at), q.samples[b]);
  };
}

std::vector<std::size_t> all_batches(const Quadratic &q) {
  std::vector<std::size_t> which(q.batches());
  for (std::size_t b = 0; b < which.size(); ++b)
    which[b] = b;
  return which;
}

// Sample covariance over sample variance (ddof = 1), the textbook two-pass way.
double cov_over_var(const std::vector<double> &y, const std::vector<double> &x) {
  const double m = double(x.size());
  double mx = 0, my = 0;
  for (std::size_t k = 0; k < x.size(); ++k) {
    mx += x[k] / m;
    my += y[k] / m;
  }
  double cov = 0, var = 0;
  for (std::size_t k = 0; k < x.size(); ++k) {
    cov += (x[k] - mx) * (y[k] - my) / (m - 1);
    var += (x[k] - mx) * (x[k] - mx) / (m - 1);
  }
  return cov / var;
}

template <class Scalar> double tolerance() { return sizeof(Scalar) == 4 ? 2e-6 : 1e-13; }

} // namespace

TEMPLATE_TEST_CASE("agent: gamma times tau 0 gives the plain gradient bit for bit", "[agent]",
                   float, double) {
  using Scalar = TestType;
  const Space space;
  const Quadratic q(9, {3, 5, 2, 4}, 11);
  for (const AGENTOptions o : {AGENTOptions{0.0, 0.3, 0.1}, AGENTOptions{0.5, 0.0, 0.0}}) {
    INFO("gamma " << o.gamma << " tau0 " << o.tau0);
    AGENT<Scalar, Mem> agent(q.n, o);
    typename optim::SGD<Scalar, Mem>::Options so;
    so.lr = 0.1;
    so.momentum = 0.9;
    optim::SGD<Scalar, Mem> with(q.n, so), without(q.n, so);
    const auto p_with = device_vector<Scalar>(point(q.n, 0.3));
    const auto p_without = device_vector<Scalar>(point(q.n, 0.3));
    Vec<Scalar> g_with("g_with", q.n), g_without("g_without", q.n);
    int calls = 0;
    for (int epoch = 0; epoch < 3; ++epoch) {
      agent.refresh(space, p_with, batches_of<Scalar>(q, all_batches(q)));
      for (std::size_t b = 0; b < q.batches(); ++b) {
        evaluator<Scalar>(q, b)(p_with, g_with);
        evaluator<Scalar>(q, b)(p_without, g_without);
        agent.set_batch_evaluator(evaluator<Scalar>(q, b, &calls));
        agent.transform(space, p_with, g_with);
        CHECK(same_bytes(g_with, g_without));
        with.step(space, p_with, g_with);
        without.step(space, p_without, g_without);
      }
    }
    CHECK(calls == 0); // the snapshot's gradient is never evaluated
    CHECK(agent.refreshes() == 3);
    CHECK(same_bytes(p_with, p_without));
  }
}

TEMPLATE_TEST_CASE("agent: at the snapshot the sample-weighted mean corrected gradient is the "
                   "full gradient",
                   "[agent]", float, double) {
  using Scalar = TestType;
  const Space space;
  const Quadratic q(8, {3, 5, 2, 4, 7, 1}, 12);
  AGENT<Scalar, Mem> agent(q.n, {1.0, 0.6, 0.5});
  for (const double shift : {0.2, -0.4, 0.7}) {
    const auto theta = rounded<Scalar>(point(q.n, shift));
    const auto params = device_vector<Scalar>(theta);
    agent.refresh(space, params, batches_of<Scalar>(q, all_batches(q)));
    INFO("refresh " << agent.refreshes() << " tau " << agent.tau());
    CHECK(same_bytes(agent.snapshot(), params));
    // μ̃ against the host's weighted mean, and the weights against the counts.
    const auto mu = host_values(agent.full_gradient());
    const auto expected_mu = q.full_gradient(theta);
    for (std::size_t i = 0; i < q.n; ++i)
      CHECK(mu[i] == Approx(expected_mu[i]).epsilon(tolerance<Scalar>()).margin(1e-12));
    CHECK(agent.last_refresh().batches == q.batches());
    CHECK(agent.last_refresh().samples == 22);

    std::vector<double> mean(q.n, 0.0);
    Vec<Scalar> g("g", q.n);
    for (std::size_t b = 0; b < q.batches(); ++b) {
      evaluator<Scalar>(q, b)(params, g);
      agent.set_batch_evaluator(evaluator<Scalar>(q, b));
      agent.transform(space, params, g);
      const auto corrected = host_values(g);
      for (std::size_t i = 0; i < q.n; ++i)
        mean[i] += double(q.samples[b]) * corrected[i] / 22.0;
    }
    for (std::size_t i = 0; i < q.n; ++i)
      CHECK(mean[i] == Approx(mu[i]).epsilon(4 * tolerance<Scalar>()).margin(1e-12));
  }
  CHECK(agent.tau() != 0.5); // the later refreshes did estimate tau
}

TEMPLATE_TEST_CASE("agent: losses linear in the old snapshot's losses give tau_new equal to the "
                   "slope",
                   "[agent]", float, double) {
  using Scalar = TestType;
  const Space space;
  const Quadratic q(5, {4, 4, 4, 4, 4, 3, 6}, 13);
  const double rho = 0.3, tau0 = 0.1;
  AGENT<Scalar, Mem> agent(q.n, {0.1, rho, tau0});

  // Points θ_k; the loss of batch b at θ_k is u_b at θ_0 and slope_k u_b(θ_{k-1}) + shift_k.
  const std::vector<std::vector<double>> thetas{rounded<Scalar>(point(q.n, 0.1)),
                                                rounded<Scalar>(point(q.n, 0.5)),
                                                rounded<Scalar>(point(q.n, -0.3))};
  const std::vector<double> slopes{0.0, -1.7, 2.5}, shifts{0.0, 0.4, -3.0};
  std::vector<double> u0;
  for (std::size_t b = 0; b < q.batches(); ++b)
    u0.push_back(1.0 + std::cos(3.0 * double(b)) + 0.1 * double(b * b));
  const auto loss_at_point = [&](std::size_t b, std::size_t k) {
    double l = u0[b];
    for (std::size_t j = 1; j <= k; ++j)
      l = slopes[j] * l + shifts[j];
    return l;
  };
  int at_old = 0, at_new = 0, unknown = 0;
  std::size_t current = 0;
  const auto loss_at = [&](std::size_t b, const std::vector<double> &theta) {
    for (std::size_t k = 0; k < thetas.size(); ++k) {
      if (theta == thetas[k]) {
        (k == current ? at_new : at_old) += 1;
        return loss_at_point(b, k);
      }
    }
    ++unknown;
    return 0.0;
  };

  double tau = tau0;
  for (current = 0; current < thetas.size(); ++current) {
    at_old = at_new = 0;
    const auto params = device_vector<Scalar>(thetas[current]);
    // The loss at the old snapshot must be asked for without a gradient.
    bool forward_only_at_old = true;
    agent.refresh(space, params, [&](const typename AGENT<Scalar, Mem>::BatchVisitor &visit) {
      for (std::size_t b = 0; b < q.batches(); ++b) {
        const auto inner = evaluator<Scalar>(q, b, nullptr, loss_at);
        visit(
            [&, inner](const Vec<Scalar> &p, const Vec<Scalar> &g) {
              if (current > 0 && host_values(p) == thetas[current - 1])
                forward_only_at_old = forward_only_at_old && g.extent(0) == 0;
              return inner(p, g);
            },
            q.samples[b]);
      }
    });
    INFO("refresh " << current + 1);
    CHECK(unknown == 0);
    CHECK(at_new == int(q.batches()));
    CHECK(at_old == (current == 0 ? 0 : int(q.batches())));
    CHECK(forward_only_at_old);
    if (current == 0) {
      CHECK_FALSE(agent.last_refresh().tau_updated);
      CHECK(std::isnan(agent.last_refresh().tau_estimate));
    } else {
      CHECK(agent.last_refresh().tau_updated);
      CHECK(agent.last_refresh().tau_estimate == Approx(slopes[current]).epsilon(1e-12));
      tau = (1 - rho) * tau + rho * slopes[current];
    }
    CHECK(agent.tau() == Approx(tau).epsilon(1e-12));
  }
}

TEST_CASE("agent: tau_new is the sample covariance over the sample variance and is skipped "
          "without spread",
          "[agent]") {
  const Space space;
  const Quadratic q(4, {2, 3, 4, 5, 6}, 14);
  const auto theta0 = point(q.n, 0.0), theta1 = point(q.n, 0.8);
  // Unrelated pairs, so Cov / Var is no exact slope.
  const std::vector<double> x{1.0, 3.5, 2.25, 0.5, 4.0}, y{0.3, 2.0, 2.9, -1.0, 1.5};
  const auto loss_at = [&](std::size_t b, const std::vector<double> &theta) {
    return theta == theta0 ? x[b] : y[b];
  };
  AGENT<double, Mem> agent(q.n, {0.1, 0.25, -0.5});
  agent.refresh(space, device_vector<double>(theta0), batches_of<double>(q, {0, 1, 2, 3, 4}));
  CHECK(agent.tau() == -0.5);
  agent.refresh(space, device_vector<double>(theta1),
                batches_of<double>(q, {0, 1, 2, 3, 4}, loss_at));
  const double expected = cov_over_var(y, x);
  CHECK(agent.last_refresh().tau_estimate == Approx(expected).epsilon(1e-13));
  CHECK(agent.tau() == Approx(0.75 * -0.5 + 0.25 * expected).epsilon(1e-13));

  SECTION("one batch keeps tau") {
    AGENT<double, Mem> one(q.n);
    one.refresh(space, device_vector<double>(theta0), batches_of<double>(q, {2}));
    one.refresh(space, device_vector<double>(theta1), batches_of<double>(q, {2}, loss_at));
    CHECK_FALSE(one.last_refresh().tau_updated);
    CHECK(one.tau() == 0.1);
    CHECK(one.refreshes() == 2);
  }
  SECTION("equal losses at the old snapshot keep tau") {
    AGENT<double, Mem> flat(q.n);
    const auto constant = [&](std::size_t b, const std::vector<double> &theta) {
      return theta == theta0 ? 2.0 : y[b];
    };
    flat.refresh(space, device_vector<double>(theta0), batches_of<double>(q, {0, 1, 2, 3, 4}));
    flat.refresh(space, device_vector<double>(theta1),
                 batches_of<double>(q, {0, 1, 2, 3, 4}, constant));
    CHECK_FALSE(flat.last_refresh().tau_updated);
    CHECK(flat.tau() == 0.1);
  }
}

TEMPLATE_TEST_CASE("agent: the corrected gradient equals the host formula", "[agent]", float,
                   double) {
  using Scalar = TestType;
  const Space space;
  const Quadratic q(10, {3, 5, 2, 4, 6}, 15);
  const double gamma = 0.7, rho = 0.4, tau0 = 0.2;
  AGENT<Scalar, Mem> agent(q.n, {gamma, rho, tau0});
  const auto theta0 = rounded<Scalar>(point(q.n, 0.1));
  const auto theta1 = rounded<Scalar>(point(q.n, -0.6));
  const auto theta2 = rounded<Scalar>(point(q.n, 0.45));
  const auto check_step = [&](const std::vector<double> &snapshot, double tau) {
    const auto mu = q.full_gradient(snapshot);
    for (std::size_t b = 0; b < q.batches(); ++b) {
      INFO("batch " << b);
      const auto g = q.grad(b, theta2);
      const auto g_snapshot = q.grad(b, snapshot);
      auto grads = device_vector<Scalar>(g);
      int calls = 0;
      agent.set_batch_evaluator(evaluator<Scalar>(q, b, &calls));
      agent.transform(space, device_vector<Scalar>(theta2), grads);
      CHECK(calls == 1);
      const auto corrected = host_values(grads);
      for (std::size_t i = 0; i < q.n; ++i) {
        const double expected = g[i] + gamma * tau * (mu[i] - g_snapshot[i]);
        CHECK(corrected[i] ==
              Approx(expected).epsilon(4 * tolerance<Scalar>()).margin(1e-6 * tolerance<Scalar>()));
      }
    }
  };
  agent.refresh(space, device_vector<Scalar>(theta0), batches_of<Scalar>(q, all_batches(q)));
  check_step(theta0, tau0);

  agent.refresh(space, device_vector<Scalar>(theta1), batches_of<Scalar>(q, all_batches(q)));
  std::vector<double> x, y;
  for (std::size_t b = 0; b < q.batches(); ++b) {
    x.push_back(q.loss(b, theta0));
    y.push_back(q.loss(b, theta1));
  }
  const double tau = (1 - rho) * tau0 + rho * cov_over_var(y, x);
  CHECK(agent.tau() == Approx(tau).epsilon(1e-12));
  check_step(theta1, tau);
  CHECK_THAT(agent.summary(), Catch::Contains("gamma 0.7") && Catch::Contains("rho 0.4"));
  CHECK(agent.name() == "agent");
  CHECK(agent.stats().state_bytes == 3 * q.n * sizeof(Scalar));
  CHECK(agent.stats().bytes == 0);
}

TEMPLATE_TEST_CASE("agent: state round trip continues bit-identically and bad state is refused",
                   "[agent]", float, double) {
  using Scalar = TestType;
  using Other = std::conditional_t<std::is_same<Scalar, float>::value, double, float>;
  const Space space;
  const Quadratic q(6, {3, 4, 5, 2}, 16);
  const AGENTOptions o{0.3, 0.5, 0.2};
  AGENT<Scalar, Mem> a(q.n, o);
  a.refresh(space, device_vector<Scalar>(point(q.n, 0.1)), batches_of<Scalar>(q, all_batches(q)));
  a.refresh(space, device_vector<Scalar>(point(q.n, 0.9)), batches_of<Scalar>(q, all_batches(q)));
  const StateDict state = a.state_dict();
  CHECK(state.size() == 4);
  CHECK(state.get<double>("tau") == a.tau());
  CHECK(state.get<std::int64_t>("refreshes") == 2);

  AGENT<Scalar, Mem> b(q.n, o);
  b.load_state_dict(state);
  CHECK(b.tau() == a.tau());
  CHECK(b.refreshes() == 2);
  CHECK(same_bytes(b.snapshot(), a.snapshot()));
  CHECK(same_bytes(b.full_gradient(), a.full_gradient()));
  // The same step, then the same next refresh and step.
  for (const double shift : {0.4, -0.2}) {
    const auto params = device_vector<Scalar>(point(q.n, shift));
    auto ga = device_vector<Scalar>(q.grad(1, point(q.n, shift)));
    auto gb = device_vector<Scalar>(q.grad(1, point(q.n, shift)));
    a.set_batch_evaluator(evaluator<Scalar>(q, 1));
    b.set_batch_evaluator(evaluator<Scalar>(q, 1));
    a.transform(space, params, ga);
    b.transform(space, params, gb);
    CHECK(same_bytes(ga, gb));
    a.refresh(space, params, batches_of<Scalar>(q, all_batches(q)));
    b.refresh(space, params, batches_of<Scalar>(q, all_batches(q)));
    CHECK(b.tau() == a.tau());
    CHECK(same_bytes(b.full_gradient(), a.full_gradient()));
  }

  // Each bad dictionary is refused and leaves the loaded state as it was.
  const auto with = [&](const std::string &skip, const std::function<void(StateDict &)> &add) {
    StateDict d;
    for (const auto &[name, entry] : state.entries())
      if (name != skip)
        d.insert(name, entry);
    add(d);
    return d;
  };
  const auto n = static_cast<std::uint64_t>(q.n);
  struct Bad {
    const char *what;
    StateDict dict;
    bool value_error;
  };
  const std::vector<Bad> bad{
      {"missing tau", with("tau", [](StateDict &) {}), false},
      {"unexpected entry", with("", [](StateDict &d) { d.set("bogus", 1.0); }), false},
      {"snapshot of length n + 1",
       with("snapshot",
            [&](StateDict &d) { d.set("snapshot", std::vector<Scalar>(q.n + 1, Scalar(1))); }),
       false},
      {"full gradient of the other precision",
       with("full_gradient",
            [&](StateDict &d) { d.set("full_gradient", std::vector<Other>(q.n, Other(1)), {n}); }),
       false},
      {"refreshes as float64", with("refreshes", [](StateDict &d) { d.set("refreshes", 1.0); }),
       false},
      {"negative refreshes",
       with("refreshes", [](StateDict &d) { d.set("refreshes", std::int64_t(-1)); }), true},
      {"tau NaN",
       with("tau", [](StateDict &d) { d.set("tau", std::numeric_limits<double>::quiet_NaN()); }),
       true},
  };
  AGENT<Scalar, Mem> c(q.n, o);
  c.load_state_dict(state);
  const auto snapshot = to_host(c.snapshot());
  const auto full_gradient = to_host(c.full_gradient());
  for (const auto &x : bad) {
    INFO(x.what);
    if (x.value_error)
      CHECK_THROWS_AS(c.load_state_dict(x.dict), ValueError);
    else
      CHECK_THROWS_AS(c.load_state_dict(x.dict), StateError);
    CHECK(c.tau() == state.get<double>("tau"));
    CHECK(c.refreshes() == 2);
    CHECK(std::memcmp(to_host(c.snapshot()).data(), snapshot.data(), q.n * sizeof(Scalar)) == 0);
    CHECK(std::memcmp(to_host(c.full_gradient()).data(), full_gradient.data(),
                      q.n * sizeof(Scalar)) == 0);
  }
}

TEST_CASE("agent: bad options and calls out of order are refused", "[agent]") {
  const Space space;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const auto refused = [](const AGENTOptions &o, const char *message) {
    CHECK_THROWS_MATCHES((AGENT<double, Mem>(4, o)), ValueError, MessageContains(message));
  };
  refused({-0.1, 0.3, 0.1}, "gamma must be finite and >= 0, got -0.1");
  refused({nan, 0.3, 0.1}, "gamma must be finite and >= 0, got nan");
  refused({inf, 0.3, 0.1}, "gamma");
  refused({0.1, -0.01, 0.1}, "rho must be in [0, 1], got -0.01");
  refused({0.1, 1.5, 0.1}, "rho must be in [0, 1], got 1.5");
  refused({0.1, nan, 0.1}, "rho");
  refused({0.1, 0.3, inf}, "tau0 must be finite, got inf");
  CHECK_NOTHROW((AGENT<double, Mem>(4, AGENTOptions{0.0, 1.0, -3.0})));
  const AGENT<double, Mem> defaults(4);
  CHECK(defaults.options().gamma == 0.1);
  CHECK(defaults.options().rho == 0.3);
  CHECK(defaults.tau() == 0.1);

  const Quadratic q(4, {2, 3, 1}, 17);
  AGENT<double, Mem> agent(q.n);
  const auto params = device_vector<double>(point(q.n, 0.2));
  auto grads = device_vector<double>(q.grad(0, point(q.n, 0.2)));
  agent.set_batch_evaluator(evaluator<double>(q, 0));
  CHECK_THROWS_MATCHES(agent.transform(space, params, grads), Error,
                       MessageContains("kat::sparse::AGENT::transform: call refresh() first"));

  // Refused refreshes leave AGENT unchanged (still without a snapshot), on every process alike.
  using Visitor = AGENT<double, Mem>::BatchVisitor;
  CHECK_THROWS_MATCHES(agent.refresh(space, params, [](const Visitor &) {}), ValueError,
                       MessageContains("at least one batch, got 0"));
  CHECK_THROWS_MATCHES(agent.refresh(space, params,
                                     [&](const Visitor &visit) {
                                       visit(evaluator<double>(q, 0), 2);
                                       visit(evaluator<double>(q, 1), 0);
                                     }),
                       ValueError, MessageContains("1 batches with 0 samples"));
  CHECK_THROWS_MATCHES(
      agent.refresh(space, params, [&](const Visitor &visit) { visit(nullptr, 2); }), ValueError,
      MessageContains("1 without an evaluator"));
  CHECK_THROWS_MATCHES(agent.refresh(space, params,
                                     [&](const Visitor &visit) {
                                       visit(
                                           [](const Vec<double> &, const Vec<double> &g) {
                                             Kokkos::deep_copy(g, std::nan(""));
                                             return 1.0;
                                           },
                                           2);
                                     }),
                       NumericalError, MessageContains("full gradient must be finite"));
  CHECK_THROWS_AS(
      agent.refresh(space, Vec<double>("short", q.n - 1), batches_of<double>(q, all_batches(q))),
      ShapeError);
  CHECK(agent.refreshes() == 0);
  CHECK_THROWS_AS(agent.transform(space, params, grads), Error);

  agent.refresh(space, params, batches_of<double>(q, all_batches(q)));
  CHECK_THROWS_AS(agent.transform(space, params, Vec<double>("long", q.n + 1)), ShapeError);
  CHECK_THROWS_AS(agent.transform(space, Vec<double>("short", 1), grads), ShapeError);
  agent.set_batch_evaluator(nullptr);
  CHECK_THROWS_MATCHES(agent.transform(space, params, grads), Error,
                       MessageContains("call set_batch_evaluator() first"));
  agent.set_batch_evaluator(evaluator<double>(q, 0));
  CHECK_NOTHROW(agent.transform(space, params, grads));
}

#ifdef KAT_ENABLE_MPI

TEST_CASE("agent: full gradient and tau over the processes' shards equal one process over all "
          "batches",
          "[agent][mpi]") {
  auto comm = distributed::Communicator::world();
  INFO(rank_of(comm));
  const distributed::MPIProcessGroup group(comm);
  const std::size_t p = std::size_t(comm.size()), rank = std::size_t(comm.rank());
  const Space space;
  // 9 batches: shards of unequal length at 2 and 4 ranks.
  const Quadratic q(12, {3, 5, 2, 4, 7, 1, 6, 3, 2}, 18);
  std::vector<std::size_t> mine;
  for (std::size_t b = rank; b < q.batches(); b += p)
    mine.push_back(b);
  AGENT<double, Mem> shared(q.n, {0.2, 0.3, 0.1}), alone(q.n, {0.2, 0.3, 0.1});
  for (const double shift : {0.1, 0.6, -0.35, 0.2}) {
    INFO("shift " << shift);
    const auto params = device_vector<double>(point(q.n, shift));
    shared.refresh(space, params, batches_of<double>(q, mine), group);
    alone.refresh(space, params, batches_of<double>(q, all_batches(q)));
    CHECK(shared.last_refresh().batches == q.batches());
    CHECK(shared.last_refresh().samples == alone.last_refresh().samples);
    CHECK(shared.last_refresh().tau_updated == alone.last_refresh().tau_updated);
    CHECK(shared.tau() == Approx(alone.tau()).epsilon(1e-12));
    CHECK(same_bytes(shared.snapshot(), alone.snapshot()));
    CHECK(max_rel_error(shared.full_gradient(), host_values(alone.full_gradient())) < 1e-14);
  }
  CHECK(shared.refreshes() == 4);
  CHECK((shared.stats().bytes > 0) == (p > 1));
  CHECK(same_on_every_rank(comm, std::to_string(shared.tau())));

  // A bad batch on rank 0 only is refused on every rank, after the all-reduce (no hang).
  using Visitor = AGENT<double, Mem>::BatchVisitor;
  const auto params = device_vector<double>(point(q.n, 0.0));
  CHECK_THROWS_MATCHES(shared.refresh(
                           space, params,
                           [&](const Visitor &visit) {
                             for (const std::size_t b : mine)
                               visit(evaluator<double>(q, b),
                                     rank == 0 && b == 0 ? 0 : q.samples[b]);
                           },
                           group),
                       ValueError, MessageContains("1 batches with 0 samples"));
  CHECK(shared.refreshes() == 4);
}

#endif // KAT_ENABLE_MPI

} // namespace test_agent
