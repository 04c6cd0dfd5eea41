// Tests of kat::optim::FOSI on quadratics with Hessians of known eigendecomposition
// (Q diag(λ) Qᵀ, Q a random orthogonal matrix built on the host), against host references
// that use those exact eigenpairs and re-implement the base optimizers in double.
#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include "kat/core/allocation_tracker.hpp"
#include "kat/core/blas.hpp"
#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/random.hpp"
#include "kat/core/state.hpp"
#include "kat/optim/adam.hpp"
#include "kat/optim/fosi.hpp"
#include "kat/optim/fosi_partition.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/optim/sgd.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace test_fosi {

namespace {

using kat::optim::FOSIMomentum;
using kat::test::Mem;
using kat::test::MessageContains;
using kat::test::Space;
template <class T> using Vec = kat::Vector<T, Mem>;
template <class T> using FOSI = kat::optim::FOSI<T, Mem>;
template <class T> using SGD = kat::optim::SGD<T, Mem>;
template <class T> using Adam = kat::optim::Adam<T, Mem>;

std::vector<double> uniform_values(std::size_t n, std::uint64_t seed, double lo = -1.0,
                                   double hi = 1.0) {
  kat::HostRng rng(seed);
  std::vector<double> x(n);
  for (auto &v : x) {
    v = lo + (hi - lo) * static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
  }
  return x;
}

using kat::test::random_orthogonal;

/// H = Q diag(λ) Qᵀ on host and device, and the exact selection FOSI estimates from it.
struct Hessian {
  std::size_t n;
  std::vector<double> lambda;
  std::vector<double> q; // column j: eigenvector of lambda[j]
  std::vector<double> h; // n x n column-major
  kat::Matrix<double, Mem> device;

  Hessian(std::vector<double> eigenvalues, std::uint64_t seed)
      : n(eigenvalues.size()), lambda(std::move(eigenvalues)), q(random_orthogonal(n, seed)),
        h(n * n), device("test_fosi::H", n, n) {
    auto hd = Kokkos::create_mirror_view(device);
    for (std::size_t c = 0; c < n; ++c) {
      for (std::size_t r = 0; r < n; ++r) {
        double s = 0;
        for (std::size_t p = 0; p < n; ++p) {
          s += q[p * n + r] * lambda[p] * q[p * n + c];
        }
        h[c * n + r] = s;
        hd(r, c) = s;
      }
    }
    Kokkos::deep_copy(device, hd);
  }

  kat::LinearOperator<Mem> op() const {
    const kat::Matrix<double, Mem> a = device;
    return [a](const Space &space, const Kokkos::View<const double *, Mem> &v,
               const Kokkos::View<double *, Mem> &out) {
      kat::gemv(space, kat::Trans::N, 1.0, a, v, 0.0, out);
    };
  }

  std::vector<double> apply(const std::vector<double> &x) const {
    std::vector<double> y(n, 0.0);
    for (std::size_t c = 0; c < n; ++c) {
      for (std::size_t r = 0; r < n; ++r) {
        y[r] += h[c * n + r] * x[c];
      }
    }
    return y;
  }

  /// Q diag(1/λ) Qᵀ b.
  std::vector<double> solve(const std::vector<double> &b) const {
    std::vector<double> x(n, 0.0);
    for (std::size_t p = 0; p < n; ++p) {
      double c = 0;
      for (std::size_t i = 0; i < n; ++i) {
        c += q[p * n + i] * b[i];
      }
      for (std::size_t i = 0; i < n; ++i) {
        x[i] += q[p * n + i] * c / lambda[p];
      }
    }
    return x;
  }

  /// The exact eigenpairs FOSI keeps: the l smallest then the k largest, ascending.
  void select(std::size_t k, std::size_t l, std::vector<std::vector<double>> &vectors,
              std::vector<double> &values) const {
    std::vector<std::size_t> idx(n);
    std::iota(idx.begin(), idx.end(), std::size_t(0));
    std::sort(idx.begin(), idx.end(),
              [&](std::size_t a, std::size_t b) { return lambda[a] < lambda[b]; });
    vectors.clear();
    values.clear();
    for (std::size_t j = 0; j < l + k; ++j) {
      const std::size_t p = j < l ? idx[j] : idx[n - k + (j - l)];
      values.push_back(lambda[p]);
      vectors.emplace_back(q.begin() + static_cast<std::ptrdiff_t>(p * n),
                           q.begin() + static_cast<std::ptrdiff_t>(p * n + n));
    }
  }
};

template <class T> Vec<T> to_device(const std::vector<double> &x) {
  Vec<T> v("test_fosi::vector", x.size());
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
  auto h = kat::test::to_host(v);
  std::vector<double> x(v.extent(0));
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<double>(h(i));
  }
  return x;
}

/// Exact equality of two device vectors' host copies.
template <class T> bool bitwise_equal(const Vec<T> &a, const Vec<T> &b) {
  const auto ha = kat::test::to_host(a);
  const auto hb = kat::test::to_host(b);
  if (ha.extent(0) != hb.extent(0)) {
    return false;
  }
  for (std::size_t i = 0; i < ha.extent(0); ++i) {
    if (!(ha(i) == hb(i))) {
      return false;
    }
  }
  return true;
}

double dot(const std::vector<double> &a, const std::vector<double> &b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    s += a[i] * b[i];
  }
  return s;
}

double max_abs_diff(const std::vector<double> &a, const std::vector<double> &b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

template <class T>
typename SGD<T>::Options sgd_options(double lr, double momentum, bool nesterov,
                                     double weight_decay) {
  typename SGD<T>::Options o;
  o.lr = lr;
  o.momentum = momentum;
  o.nesterov = nesterov;
  o.weight_decay = weight_decay;
  return o;
}

template <class T> typename Adam<T>::Options adam_options(double lr, double weight_decay) {
  typename Adam<T>::Options o;
  o.lr = lr;
  o.weight_decay = weight_decay;
  return o;
}

template <class T>
typename FOSI<T>::Options fosi_options(std::size_t k, std::size_t l, std::size_t m, std::int64_t w,
                                       std::int64_t t, double alpha) {
  typename FOSI<T>::Options o;
  o.k = k;
  o.l = l;
  o.lanczos_iterations = m;
  o.warmup_w = w;
  o.num_iters_to_approx_eigs = t;
  o.alpha = alpha;
  return o;
}

/// torch.optim.SGD in double, one scalar at a time (as test_optim's reference).
struct SGDReference {
  double lr, momentum, weight_decay;
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
        buf[i] = has_buf ? momentum * buf[i] + d : d;
        update = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * update;
    }
    has_buf = true;
  }
};

/// Kingma & Ba Algorithm 1 with explicit bias-corrected moments and L2 weight decay.
struct AdamReference {
  double lr = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::vector<double> m, v;
  int t = 0;

  void step(std::vector<double> &p, const std::vector<double> &g) {
    if (t == 0) {
      m.assign(p.size(), 0.0);
      v.assign(p.size(), 0.0);
    }
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] + weight_decay * p[i];
      m[i] = beta1 * m[i] + (1.0 - beta1) * gi;
      v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi;
      const double m_hat = m[i] / (1.0 - std::pow(beta1, t));
      const double v_hat = v[i] / (1.0 - std::pow(beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

/// Σ_j v_j (v_jᵀ x) for the rows v_j.
std::vector<double> project(const std::vector<std::vector<double>> &v,
                            const std::vector<double> &x) {
  std::vector<double> y(x.size(), 0.0);
  for (const auto &vj : v) {
    const double c = dot(vj, x);
    for (std::size_t i = 0; i < x.size(); ++i) {
      y[i] += c * vj[i];
    }
  }
  return y;
}

} // namespace

TEST_CASE("fosi: one step after the refresh lands on the minimizer of a quadratic",
          "[fosi][optim]") {
  // f(θ) = ½ θᵀHθ - bᵀθ with k = n: V spans R^n, g2 = 0, u⊥ = 0 and, with no momentum from
  // before the first estimate, d = a H⁻¹ g for the variant's factor a on g1; α = 1/a makes
  // the refresh step θ - H⁻¹(Hθ - b) = H⁻¹ b, whatever the base optimizer did before.
  const std::size_t n = 8;
  const Hessian H({0.5, 13.0, 2.0, 20.0, 1.0, 5.0, 3.0, 8.0}, 17);
  const std::vector<double> b = uniform_values(n, 3);
  const std::vector<double> minimizer = H.solve(b);
  const double beta = 0.9;
  struct Case {
    FOSIMomentum variant;
    double a;
  };
  for (const Case c : {Case{FOSIMomentum::heavy_ball, 1.0}, Case{FOSIMomentum::nesterov, 1 + beta},
                       Case{FOSIMomentum::adam, 1 - beta}}) {
    INFO("variant " << kat::optim::to_string(c.variant));
    std::unique_ptr<kat::optim::Optimizer<double, Mem>> base;
    if (c.variant == FOSIMomentum::adam) {
      base = std::make_unique<Adam<double>>(n, adam_options<double>(0.01, 0.0));
    } else {
      base = std::make_unique<SGD<double>>(
          n, sgd_options<double>(0.01, 0.9, c.variant == FOSIMomentum::nesterov, 0.0));
    }
    auto o = fosi_options<double>(n, 0, n, 3, 100, 1.0 / c.a);
    o.beta = beta;
    FOSI<double> fosi(n, std::move(base), H.op(), o);
    CHECK(fosi.options().momentum == c.variant); // inferred from the base optimizer
    std::vector<double> theta = uniform_values(n, 4, -2.0, 2.0);
    const auto p = to_device<double>(theta);
    const auto g = to_device<double>(std::vector<double>(n, 0.0));
    for (int s = 0; s < 3; ++s) {
      std::vector<double> grad = H.apply(theta);
      for (std::size_t i = 0; i < n; ++i) {
        grad[i] -= b[i];
      }
      assign(g, grad);
      fosi.step(Space(), p, g);
      theta = to_host(p);
      CHECK(fosi.refresh_count() == (s == 2 ? 1 : 0));
      if (s < 2) {
        CHECK(max_abs_diff(theta, minimizer) > 1e-3);
      }
    }
    CHECK(max_abs_diff(theta, minimizer) < 1e-10);
  }
}

TEST_CASE("fosi: before the first estimate it is the base optimizer bit for bit", "[fosi][optim]") {
  const std::size_t n = 64;
  const Hessian H(uniform_values(n, 8, 0.5, 4.0), 2);
  for (const bool use_adam : {false, true}) {
    INFO((use_adam ? "Adam" : "SGD heavy ball"));
    const auto make = [&]() -> std::unique_ptr<kat::optim::Optimizer<float, Mem>> {
      if (use_adam) {
        return std::make_unique<Adam<float>>(n, adam_options<float>(0.01, 0.01));
      }
      return std::make_unique<SGD<float>>(n, sgd_options<float>(0.05, 0.9, false, 0.01));
    };
    FOSI<float> fosi(n, make(), H.op(), fosi_options<float>(2, 0, 8, 6, 10, 0.1));
    const auto reference = make();
    const std::vector<double> theta0 = uniform_values(n, 5);
    const auto p_fosi = to_device<float>(theta0);
    const auto p_ref = to_device<float>(theta0);
    const auto g = to_device<float>(std::vector<double>(n, 0.0));
    kat::optim::Optimizer<float, Mem> &as_optimizer = fosi;
    for (int s = 0; s < 5; ++s) {
      assign(g, uniform_values(n, 100 + s));
      if (s == 3) {
        // A schedule sets the rate through the Optimizer interface (set_lr is not virtual).
        as_optimizer.set_lr(0.02);
        reference->set_lr(0.02);
      }
      fosi.step(Space(), p_fosi, g);
      reference->step(Space(), p_ref, g);
      CHECK(bitwise_equal(p_fosi, p_ref));
      CHECK(fosi.steps() == s + 1);
      CHECK(fosi.base_optimizer().steps() == s + 1);
    }
    CHECK_FALSE(fosi.has_estimate());
    CHECK(fosi.base_optimizer().lr() == 0.02);
    const auto a = fosi.state_buffers();
    const auto r = reference->state_buffers();
    REQUIRE(a.size() == r.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(bitwise_equal(a[i], r[i]));
    }
    // The sixth step (count 5 = W - 1) refreshes and leaves the base optimizer's path.
    assign(g, uniform_values(n, 200));
    fosi.step(Space(), p_fosi, g);
    reference->step(Space(), p_ref, g);
    CHECK(fosi.has_estimate());
    CHECK_FALSE(bitwise_equal(p_fosi, p_ref));
  }
}

TEST_CASE("fosi: the complement step is orthogonal to the eigenvectors", "[fosi][optim]") {
  // With α = 0 the update is c u⊥, so V Δθ = 0; with α > 0 the subspace part of Δθ is the
  // Newton step alone: V_j Δθ = -α (V_j m) / |λ_j|.
  const std::size_t n = 30;
  const Hessian H(uniform_values(n, 12, -1.0, 6.0), 4);
  for (const double alpha : {0.0, 0.5}) {
    INFO("alpha " << alpha);
    auto o = fosi_options<double>(4, 1, 20, 1, 2, alpha);
    FOSI<double> fosi(n,
                      std::make_unique<SGD<double>>(n, sgd_options<double>(0.05, 0.9, false, 0.01)),
                      H.op(), o);
    const auto p = to_device<double>(uniform_values(n, 6));
    const auto g = to_device<double>(std::vector<double>(n, 0.0));
    for (int s = 0; s < 5; ++s) {
      const std::vector<double> before = to_host(p);
      assign(g, uniform_values(n, 300 + s));
      fosi.step(Space(), p, g);
      std::vector<double> delta = to_host(p);
      for (std::size_t i = 0; i < n; ++i) {
        delta[i] -= before[i];
      }
      const double norm = std::sqrt(dot(delta, delta));
      REQUIRE(norm > 1e-6);
      const auto V = kat::test::to_host(fosi.eigenvectors());
      const std::vector<double> m = to_host(fosi.subspace_momentum());
      for (std::size_t j = 0; j < V.extent(1); ++j) {
        double vd = 0, vm = 0;
        for (std::size_t i = 0; i < n; ++i) {
          vd += V(i, j) * delta[i];
          vm += V(i, j) * m[i];
        }
        const double expected = -alpha * vm / std::abs(fosi.eigenvalues()[j]);
        CHECK(std::abs(vd - expected) < 1e-12 * std::max(1.0, norm));
      }
    }
  }
}

/// The whole vector as one process's partition, with an offset and global size to test the
/// checks: sum and gather have nothing to do, and lanczos is kat::lanczos.
struct WholePartition : kat::optim::FOSIPartition<double, Mem> {
  std::size_t n, first, count;
  WholePartition(std::size_t global, std::size_t offset, std::size_t local)
      : n(global), first(offset), count(local) {}
  std::size_t global_size() const override { return n; }
  std::size_t offset() const override { return first; }
  std::size_t local_size() const override { return count; }
  std::size_t vector_length() const override { return count; }
  void sum(const Space &, const Vec<double> &) override {}
  kat::LanczosResult<Mem> lanczos(const Space &space, const kat::LinearOperator<Mem> &op,
                                  const kat::LanczosOptions &options) override {
    return kat::lanczos<Mem>(space, op, n, options);
  }
  void gather(const Space &, const Vec<double> &) override {}
};

TEST_CASE("fosi: a partition's slice is checked and one slice of everything is plain FOSI",
          "[fosi][optim]") {
  const std::size_t n = 20;
  const Hessian H(uniform_values(n, 31, 0.5, 9.0), 8);
  const auto base = [](std::size_t size) {
    return std::make_unique<SGD<double>>(size, sgd_options<double>(0.05, 0.9, false, 0.0));
  };
  const auto o = fosi_options<double>(3, 1, 12, 2, 2, 0.3);
  FOSI<double> plain(n, base(n), H.op(), o);
  FOSI<double> partitioned(n, base(n), H.op(), o, std::make_shared<WholePartition>(n, 0, n));
  CHECK(partitioned.local_size() == n);
  CHECK(partitioned.curvature_bytes() == plain.curvature_bytes());
  const auto p = to_device<double>(uniform_values(n, 2));
  const auto q = to_device<double>(uniform_values(n, 2));
  const auto g = to_device<double>(std::vector<double>(n, 0.0));
  for (int s = 0; s < 4; ++s) {
    assign(g, uniform_values(n, 40 + s));
    plain.step(Space(), p, g);
    partitioned.step(Space(), q, g);
    CHECK(bitwise_equal(p, q));
  }
  CHECK(partitioned.refresh_count() == 2);

  CHECK_THROWS_MATCHES(
      FOSI<double>(n, base(n), H.op(), o, std::make_shared<WholePartition>(n + 1, 0, n)),
      kat::ShapeError,
      MessageContains("partition->global_size() (the parameter count n) must be 20"));
  CHECK_THROWS_MATCHES(
      FOSI<double>(n, base(5), H.op(), o, std::make_shared<WholePartition>(n, 16, 5)),
      kat::ShapeError, MessageContains("non-empty part of [0, n = 20), got [16, 21)"));
  CHECK_THROWS_MATCHES(
      FOSI<double>(n, base(1), H.op(), o, std::make_shared<WholePartition>(n, 3, 0)),
      kat::ShapeError, MessageContains("got [3, 3)"));
  CHECK_THROWS_MATCHES(
      FOSI<double>(n, base(n), H.op(), o, std::make_shared<WholePartition>(n, 5, 10)),
      kat::ShapeError, MessageContains("local_size()) must be 10, got 20"));
}

TEST_CASE("fosi: the refresh schedule", "[fosi][optim]") {
  const std::size_t n = 12;
  const Hessian H(uniform_values(n, 21, 1.0, 3.0), 6);
  const std::size_t m = 8;
  auto o = fosi_options<float>(2, 0, m, 3, 2, 0.1);
  // The operator counts its calls and records the parameters at the first call of each
  // refresh: they must be those before the refreshing step's update.
  const auto p = to_device<float>(uniform_values(n, 7));
  auto calls = std::make_shared<std::size_t>(0);
  auto seen = std::make_shared<std::vector<std::vector<double>>>();
  const auto inner = H.op();
  const kat::LinearOperator<Mem> op = [=](const Space &space,
                                          const Kokkos::View<const double *, Mem> &v,
                                          const Kokkos::View<double *, Mem> &out) {
    if ((*calls)++ % m == 0) {
      seen->push_back(to_host(p));
    }
    inner(space, v, out);
  };
  FOSI<float> fosi(n, std::make_unique<SGD<float>>(n, sgd_options<float>(0.05, 0.9, false, 0.0)),
                   op, o);
  CHECK_FALSE(fosi.refresh_due(0));
  CHECK_FALSE(fosi.refresh_due(1));
  CHECK(fosi.refresh_due(2));
  CHECK_FALSE(fosi.refresh_due(3));
  CHECK(fosi.refresh_due(4));
  CHECK(fosi.refresh_due(6));
  CHECK_FALSE(fosi.refresh_due(7));
  const auto g = to_device<float>(std::vector<double>(n, 0.0));
  const std::vector<std::int64_t> expected{0, 0, 1, 1, 2, 2, 3, 3, 4};
  std::vector<std::vector<double>> before_refresh;
  for (std::size_t s = 0; s < expected.size(); ++s) {
    INFO("step " << s + 1);
    assign(g, uniform_values(n, 40 + s));
    if (fosi.refresh_due(fosi.steps())) {
      before_refresh.push_back(to_host(p));
    }
    fosi.step(Space(), p, g);
    CHECK(fosi.refresh_count() == expected[s]);
    CHECK(fosi.steps() == static_cast<std::int64_t>(s + 1));
  }
  CHECK(*calls == 4 * m);
  CHECK(fosi.last_lanczos_iterations() == m);
  CHECK(fosi.last_lanczos_seconds() > 0.0);
  REQUIRE(seen->size() == 4);
  CHECK(*seen == before_refresh);

  // W = 1: the very first step refreshes.
  FOSI<float> first(n, std::make_unique<SGD<float>>(n, sgd_options<float>(0.05, 0.0, false, 0.0)),
                    H.op(), fosi_options<float>(2, 0, m, 1, 100, 0.1));
  CHECK(first.refresh_due(0));
  first.step(Space(), p, g);
  CHECK(first.refresh_count() == 1);
  CHECK_FALSE(first.refresh_due(1));
  CHECK(first.refresh_due(100));
}

TEST_CASE("fosi: the complement scale c and its clipping", "[fosi][optim]") {
  // SGD without momentum and α = 0: Δθ = c u⊥ = -c lr (g - Vᵀ V g), with V the exact
  // eigenvectors (m = n makes Lanczos exact).
  const std::size_t n = 6;
  struct Case {
    std::vector<double> spectrum;
    std::size_t k, l;
    double clip; // 0: the default
    bool adam;
    double c, lambda_max;
  };
  const std::vector<Case> cases{
      {{1.0, 1.5, 2.0, 3.0, 4.0, 40.0}, 2, 0, 0.0, false, 3.0, 40.0},     // 10 clipped to 3
      {{1.0, 1.5, 2.0, 3.0, 20.0, 40.0}, 2, 0, 0.0, false, 2.0, 40.0},    // 2
      {{1.0, 1.5, 2.0, 3.0, 4.0, 40.0}, 2, 0, 5.0, false, 5.0, 40.0},     // 10 clipped to 5
      {{1.0, 1.5, 2.0, 3.0, 4.0, 40.0}, 2, 1, 50.0, false, 10.0, 40.0},   // λ_k is λ[l]
      {{1.0, 1.5, 2.0, 3.0, 4.0, 40.0}, 2, 0, 1.0, false, 1.0, 40.0},     // clip 1
      {{1.0, 1.5, 2.0, 3.0, 4.0, 40.0}, 2, 0, 0.0, true, 1.0, 40.0},      // Adam: clip 1
      {{-30.0, 1.0, 2.0, 3.0, 5.0, 10.0}, 2, 1, 0.0, false, 2.0, 10.0},   // |λ|
      {{3.0, 1.0, 2.0, 1.5, 4.0, 3.5}, 2, 0, 0.0, false, 4.0 / 3.5, 4.0}, // no clipping
  };
  int index = 0;
  for (const auto &c : cases) {
    INFO("case " << index++);
    const Hessian H(c.spectrum, 31);
    auto o = fosi_options<double>(c.k, c.l, n, 1, 100, 0.0);
    if (c.clip > 0) {
      o.learning_rate_clip = c.clip;
    }
    std::unique_ptr<kat::optim::Optimizer<double, Mem>> base;
    if (c.adam) {
      base = std::make_unique<Adam<double>>(n, adam_options<double>(0.1, 0.0));
    } else {
      base = std::make_unique<SGD<double>>(n, sgd_options<double>(0.1, 0.0, false, 0.0));
    }
    FOSI<double> fosi(n, std::move(base), H.op(), o);
    CHECK(fosi.scaling() == 1.0);
    CHECK(fosi.lambda_max() == 0.0);
    const std::vector<double> theta = uniform_values(n, 8);
    const std::vector<double> grad = uniform_values(n, 9);
    const auto p = to_device<double>(theta);
    fosi.step(Space(), p, to_device<double>(grad));
    CHECK(fosi.scaling() == Approx(c.c).epsilon(1e-12));
    CHECK(fosi.lambda_max() == Approx(c.lambda_max).epsilon(1e-12));
    if (!c.adam) {
      std::vector<std::vector<double>> V;
      std::vector<double> values;
      H.select(c.k, c.l, V, values);
      const std::vector<double> g1 = project(V, grad);
      std::vector<double> expected = theta;
      for (std::size_t i = 0; i < n; ++i) {
        expected[i] -= c.c * 0.1 * (grad[i] - g1[i]);
      }
      CHECK(max_abs_diff(to_host(p), expected) < 1e-13);
    }
  }
}

TEST_CASE("fosi: the three momentum variants against a host reference", "[fosi][optim]") {
  // 8 steps with W = 2, T = 3 (refreshes before steps 2, 5 and 8). The curvature operator
  // is H_a at the first refresh and H_b afterwards, so V changes while the momentum carries
  // over; gradients are those of ½ θᵀH_aθ - bᵀθ.
  const std::size_t n = 12, k = 3, l = 1;
  const Hessian Ha(uniform_values(n, 51, -2.0, 9.0), 52);
  const Hessian Hb(uniform_values(n, 53, 0.5, 5.0), 54);
  const std::vector<double> b = uniform_values(n, 55);
  const double beta = 0.8, alpha = 0.3;
  for (const FOSIMomentum variant :
       {FOSIMomentum::heavy_ball, FOSIMomentum::nesterov, FOSIMomentum::adam}) {
    INFO("variant " << kat::optim::to_string(variant));
    const bool adam = variant == FOSIMomentum::adam;
    const bool nesterov = variant == FOSIMomentum::nesterov;
    std::unique_ptr<kat::optim::Optimizer<double, Mem>> base;
    if (adam) {
      base = std::make_unique<Adam<double>>(n, adam_options<double>(0.01, 0.01));
    } else {
      base = std::make_unique<SGD<double>>(n, sgd_options<double>(0.05, 0.9, nesterov, 0.01));
    }
    auto calls = std::make_shared<std::size_t>(0);
    const auto op_a = Ha.op();
    const auto op_b = Hb.op();
    const kat::LinearOperator<Mem> op = [=](const Space &space,
                                            const Kokkos::View<const double *, Mem> &v,
                                            const Kokkos::View<double *, Mem> &out) {
      ((*calls)++ < n ? op_a : op_b)(space, v, out);
    };
    auto o = fosi_options<double>(k, l, n, 2, 3, alpha);
    o.beta = beta;
    o.momentum = variant;
    FOSI<double> fosi(n, std::move(base), op, o);
    const double clip = adam ? 1.0 : 3.0;
    CHECK(*fosi.options().learning_rate_clip == clip);

    // The host reference.
    SGDReference sgd{0.05, 0.9, 0.01, nesterov, {}};
    AdamReference adam_ref;
    adam_ref.lr = 0.01;
    adam_ref.weight_decay = 0.01;
    const auto base_step = [&](std::vector<double> &p, const std::vector<double> &g) {
      adam ? adam_ref.step(p, g) : sgd.step(p, g);
    };
    const double a = adam ? 1 - beta : nesterov ? 1 + beta : 1.0;
    const double bm = nesterov ? beta * beta : beta;
    std::vector<double> theta = uniform_values(n, 56);
    std::vector<double> mom(n, 0.0), values;
    std::vector<std::vector<double>> V;
    double c = 1.0;
    int refreshes = 0;

    const auto p = to_device<double>(theta);
    const auto g = to_device<double>(std::vector<double>(n, 0.0));
    for (std::int64_t count = 0; count < 8; ++count) {
      INFO("step " << count + 1);
      std::vector<double> grad = Ha.apply(theta);
      for (std::size_t i = 0; i < n; ++i) {
        grad[i] -= b[i];
      }
      if (count + 1 >= 2 && (count + 1 - 2) % 3 == 0) {
        (refreshes++ == 0 ? Ha : Hb).select(k, l, V, values);
        c = std::min(std::max(std::abs(values.back()) / std::abs(values[l]), 1.0), clip);
      }
      if (refreshes == 0) {
        base_step(theta, grad);
      } else {
        const std::vector<double> g1 = project(V, grad);
        std::vector<double> g2(n);
        for (std::size_t i = 0; i < n; ++i) {
          g2[i] = grad[i] - g1[i];
          mom[i] = a * g1[i] + bm * mom[i];
        }
        std::vector<double> d(n, 0.0);
        for (std::size_t j = 0; j < V.size(); ++j) {
          const double coef = dot(V[j], mom) / std::abs(values[j]);
          for (std::size_t i = 0; i < n; ++i) {
            d[i] += coef * V[j][i];
          }
        }
        std::vector<double> scratch = theta;
        base_step(scratch, g2);
        std::vector<double> u(n);
        for (std::size_t i = 0; i < n; ++i) {
          u[i] = scratch[i] - theta[i];
        }
        const std::vector<double> u_in = project(V, u);
        for (std::size_t i = 0; i < n; ++i) {
          theta[i] += c * (u[i] - u_in[i]) - alpha * d[i];
        }
      }
      assign(g, grad);
      fosi.step(Space(), p, g);
      CHECK(fosi.refresh_count() == refreshes);
      CHECK(fosi.scaling() == Approx(c).epsilon(1e-12));
      CHECK(max_abs_diff(to_host(p), theta) < 1e-11);
      CHECK(max_abs_diff(to_host(fosi.subspace_momentum()), mom) < 1e-11);
      if (refreshes > 0) { // V m, kept by the steps, against V m formed from the reference m
        // (with FOSI's own eigenvectors: their signs and order are its choice)
        const auto Vd =
            Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), fosi.eigenvectors());
        std::vector<double> vm(Vd.extent(1), 0.0);
        for (std::size_t j = 0; j < vm.size(); ++j) {
          for (std::size_t i = 0; i < n; ++i) {
            vm[j] += Vd(i, j) * mom[i];
          }
        }
        CHECK(max_abs_diff(to_host(fosi.subspace_momentum_coefficients()), vm) < 1e-11);
      }
    }
  }
}

TEST_CASE("fosi: state round trip continues bit for bit", "[fosi][optim]") {
  const std::size_t n = 40;
  const Hessian H(uniform_values(n, 61, 0.2, 7.0), 62);
  for (const bool use_adam : {false, true}) {
    INFO((use_adam ? "Adam" : "SGD nesterov"));
    const auto make = [&]() -> std::unique_ptr<kat::optim::Optimizer<float, Mem>> {
      if (use_adam) {
        return std::make_unique<Adam<float>>(n, adam_options<float>(0.01, 0.01));
      }
      return std::make_unique<SGD<float>>(n, sgd_options<float>(0.05, 0.9, true, 0.01));
    };
    auto o = fosi_options<float>(3, 1, 12, 2, 3, 0.2);
    o.seed = 77;
    FOSI<float> a(n, make(), H.op(), o);
    const auto pa = to_device<float>(uniform_values(n, 63));
    const auto g = to_device<float>(std::vector<double>(n, 0.0));
    for (int s = 0; s < 5; ++s) {
      assign(g, uniform_values(n, 400 + s));
      a.step(Space(), pa, g);
    }
    REQUIRE(a.refresh_count() == 2);
    const kat::StateDict saved = a.state_dict();
    CHECK(saved.contains("base.steps"));
    CHECK(saved.contains("momentum"));
    CHECK(saved.contains("momentum_coefficients"));
    CHECK(saved.contains("eigenvectors"));
    CHECK(saved.get<std::int64_t>("refreshes") == 2);

    FOSI<float> b(n, make(), H.op(), o);
    b.load_state_dict(saved);
    CHECK(b.steps() == 5);
    CHECK(b.refresh_count() == 2);
    CHECK(b.scaling() == a.scaling());
    CHECK(b.eigenvalues() == a.eigenvalues());
    const auto pb = to_device<float>(to_host(pa));
    for (int s = 5; s < 11; ++s) { // refreshes at steps 8 and 11
      assign(g, uniform_values(n, 400 + s));
      a.step(Space(), pa, g);
      b.step(Space(), pb, g);
      CHECK(bitwise_equal(pa, pb));
    }
    CHECK(a.refresh_count() == 4);
    CHECK(b.refresh_count() == 4);
    const auto sa = a.state_dict();
    const auto sb = b.state_dict();
    REQUIRE(sa.size() == sb.size());
    for (const auto &[name, entry] : sa.entries()) {
      INFO("entry " << name);
      CHECK(entry.bytes == sb.at(name).bytes);
    }
  }
}

TEST_CASE("fosi: load_state_dict checks before it changes anything", "[fosi][optim]") {
  const std::size_t n = 10;
  const Hessian H(uniform_values(n, 71, 1.0, 2.0), 72);
  const auto o = fosi_options<double>(2, 0, 4, 1, 5, 0.1);
  FOSI<double> sgd_fosi(
      n, std::make_unique<SGD<double>>(n, sgd_options<double>(0.1, 0.9, false, 0.0)), H.op(), o);
  FOSI<double> adam_fosi(n, std::make_unique<Adam<double>>(n, adam_options<double>(0.1, 0.0)),
                         H.op(), o);
  const auto p = to_device<double>(uniform_values(n, 73));
  const auto g = to_device<double>(uniform_values(n, 74));
  sgd_fosi.step(Space(), p, g);
  const kat::StateDict good = sgd_fosi.state_dict();

  // Another base optimizer's entries.
  CHECK_THROWS_AS(adam_fosi.load_state_dict(good), kat::StateError);
  CHECK(adam_fosi.steps() == 0);
  CHECK_FALSE(adam_fosi.has_estimate());

  kat::StateDict missing;
  for (const auto &[name, entry] : good.entries()) {
    if (name != "eigenvalues") {
      missing.insert(name, entry);
    }
  }
  FOSI<double> fresh(n, std::make_unique<SGD<double>>(n, sgd_options<double>(0.1, 0.9, false, 0.0)),
                     H.op(), o);
  CHECK_THROWS_MATCHES(fresh.load_state_dict(missing), kat::StateError,
                       MessageContains("state entry 'eigenvalues' is missing"));

  kat::StateDict zero;
  for (const auto &[name, entry] : good.entries()) {
    if (name != "eigenvalues") {
      zero.insert(name, entry);
    }
  }
  zero.set("eigenvalues", std::vector<double>{0.0, 1.0});
  CHECK_THROWS_MATCHES(fresh.load_state_dict(zero), kat::ValueError,
                       MessageContains("eigenvalue 0 must be finite and nonzero"));
  CHECK(fresh.steps() == 0);
  CHECK_FALSE(fresh.has_estimate());
  fresh.load_state_dict(good);
  CHECK(fresh.steps() == 1);
  CHECK(fresh.has_estimate());
}

TEST_CASE("fosi: options are validated with the option named", "[fosi][optim]") {
  const std::size_t n = 10;
  const Hessian H(uniform_values(n, 81, 1.0, 2.0), 82);
  const auto sgd = [](std::size_t size) -> std::unique_ptr<kat::optim::Optimizer<float, Mem>> {
    return std::make_unique<SGD<float>>(size, sgd_options<float>(0.1, 0.9, false, 0.0));
  };
  using O = FOSI<float>::Options;
  const auto ok = fosi_options<float>(2, 0, 0, 1, 1, 0.1); // m = 4 (k + l) = 8 <= 10
  const auto with = [&](auto change) {
    O o = ok;
    change(o);
    return o;
  };
  CHECK_NOTHROW(FOSI<float>(n, sgd(n), H.op(), ok));
  CHECK(FOSI<float>(n, sgd(n), H.op(), ok).options().lanczos_iterations == 8);
  CHECK_THROWS_MATCHES(FOSI<float>(n, nullptr, H.op(), ok), kat::ValueError,
                       MessageContains("kat::optim::FOSI: base must be an optimizer, got nullptr"));
  CHECK_THROWS_MATCHES(FOSI<float>(n, sgd(9), H.op(), ok), kat::ShapeError,
                       MessageContains("base->size() (the parameter count n) must be 10, got 9"));
  CHECK_THROWS_MATCHES(FOSI<float>(n, sgd(n), kat::LinearOperator<Mem>(), ok), kat::ValueError,
                       MessageContains("curvature must be a callable LinearOperator"));
  CHECK_THROWS_MATCHES(FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.k = 0; })), kat::ValueError,
                       MessageContains("kat::optim::FOSI: k must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.alpha = -1; })),
                       kat::ValueError, MessageContains("alpha must be finite and >= 0, got -1"));
  CHECK_THROWS_MATCHES(FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.alpha = NAN; })),
                       kat::ValueError, MessageContains("alpha must be finite and >= 0"));
  CHECK_THROWS_MATCHES(
      FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.num_iters_to_approx_eigs = 0; })),
      kat::ValueError, MessageContains("num_iters_to_approx_eigs must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.warmup_w = 0; })),
                       kat::ValueError, MessageContains("warmup_w must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(
      FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.learning_rate_clip = 0.5; })),
      kat::ValueError, MessageContains("learning_rate_clip must be finite and >= 1, got 0.5"));
  CHECK_THROWS_MATCHES(FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.beta = 1.0; })),
                       kat::ValueError, MessageContains("beta must be in [0, 1), got 1"));
  CHECK_THROWS_MATCHES(
      FOSI<float>(n, sgd(n), H.op(), with([](O &o) { o.k = 5; })), kat::ValueError,
      MessageContains("lanczos_iterations (m) must be in [k + l, n] = [5, 10], got 20 "
                      "(the default 4 (k + l)"));
  CHECK_THROWS_MATCHES(
      FOSI<float>(n, sgd(n), H.op(), with([](O &o) {
                    o.l = 2;
                    o.lanczos_iterations = 3;
                  })),
      kat::ValueError,
      MessageContains("lanczos_iterations (m) must be in [k + l, n] = [4, 10], got 3"));

  CHECK_THROWS_MATCHES(
      FOSI<float>(n, sgd(n), H.op(), with([](O &o) {
                    o.k = 8;
                    o.l = 3;
                  })),
      kat::ValueError,
      MessageContains("kat::optim::FOSI: k + l must be <= n = 10 (the parameter count") &&
          MessageContains("got k = 8, l = 3"));

  FOSI<float> fosi(n, sgd(n), H.op(), ok);
  const auto v = to_device<float>(std::vector<double>(n, 0.0));
  const auto short_v = to_device<float>(std::vector<double>(n - 1, 0.0));
  CHECK_THROWS_MATCHES(fosi.step(Space(), short_v, v), kat::ShapeError,
                       MessageContains("params.extent(0) must be 10, got 9"));
  CHECK_THROWS_MATCHES(
      fosi.set_lr(-1.0), kat::ValueError,
      MessageContains("kat::optim::FOSI::set_lr: lr must be finite and >= 0, got -1"));
}

TEST_CASE("fosi: memory beyond the limit is refused before anything is allocated",
          "[fosi][optim]") {
  const std::size_t n = 200;
  const Hessian H(uniform_values(n, 91, 1.0, 2.0), 92);
  const auto sgd = [n] {
    return std::make_unique<SGD<float>>(n, sgd_options<float>(0.1, 0.9, false, 0.0));
  };
  auto o = fosi_options<float>(3, 1, 16, 1, 100, 0.1);
  // V (200 x 4), momentum and two work vectors (3 x 200), three 4-vectors: doubles; scratch and
  // complement gradient: 2 x 200 floats; Lanczos: the 200 x 16 basis, the residual, the
  // 200 x 4 Ritz vectors, the 16-vector and 16 x 4 coefficients: doubles.
  const double bytes = 8.0 * (200 * 4 + 3 * 200 + 3 * 4) + 4.0 * 2 * 200 +
                       8.0 * (200 * 16 + 200 + 200 * 4 + 16 + 16 * 4);
  CHECK(FOSI<float>::memory_bytes(n, n, 3, 1, 16) == bytes);
  o.memory_limit = static_cast<std::size_t>(bytes) - 1;
  {
    kat::AllocationTracker tracker;
    CHECK_THROWS_MATCHES(
        FOSI<float>(n, sgd(), H.op(), o), kat::ValueError,
        MessageContains("kat::optim::FOSI: k = 3, l = 1 with m = 16 Lanczos iterations on n = "
                        "200 parameters") &&
            MessageContains(kat::detail::concat("(", bytes,
                                                " bytes), more than the "
                                                "memory_limit option's")) &&
            MessageContains(kat::detail::concat("(", bytes - 1, " bytes)")));
    // Only the base optimizer's momentum buffer (200 floats) was allocated.
    CHECK(tracker.peak_bytes() <= std::int64_t(4 * n));
  }
  // With the limit at the estimate, construction and a refresh (W = 1: the first step) fit.
  o.memory_limit = static_cast<std::size_t>(bytes);
  const auto params = to_device<float>(uniform_values(n, 93));
  const auto grads = to_device<float>(uniform_values(n, 94));
  {
    // A first FOSI makes Kokkos allocate its own reduction scratch (the Serial backend's
    // "Kokkos::Serial::scratch_mem", 11 KB here; OpenMP's was there before), which Kokkos keeps:
    // not FOSI's memory, so not counted below.
    FOSI<float> warm(n, sgd(), H.op(), o);
    auto p = to_device<float>(uniform_values(n, 93));
    warm.step(Space(), p, grads);
  }
  auto base = sgd();
  kat::AllocationTracker tracker;
  FOSI<float> fosi(n, std::move(base), H.op(), o);
  fosi.step(Space(), params, grads);
  REQUIRE(fosi.has_estimate());
  INFO("peak " << tracker.peak_bytes() << " bytes, estimate " << bytes);
  CHECK(tracker.peak_bytes() <= std::int64_t(bytes));
  CHECK(tracker.peak_bytes() >= std::int64_t(8 * n * 16)); // at least Lanczos's basis
  // The default limit is the memory space's size: 60000 pairs on 269322 parameters (kat_train's
  // MLP) ask for 129 GB for V and 646 GB for Lanczos's basis of 240000 iterations.
  auto huge = fosi_options<float>(60000, 0, 0, 100, 100, 0.1);
  const std::size_t mlp = 269322;
  const double asked = FOSI<float>::memory_bytes(mlp, mlp, 60000, 0, 240000);
  CHECK(asked > 7.7e11);
  if (static_cast<double>(kat::memory_space_bytes<Mem>()) >= asked) {
    WARN("this machine's memory holds " << asked << " bytes: the default limit is not tested");
    return;
  }
  const Hessian small(uniform_values(2, 95, 1.0, 2.0), 96);
  CHECK_THROWS_MATCHES(
      FOSI<float>(mlp, std::make_unique<SGD<float>>(mlp, sgd_options<float>(0.1, 0.9, false, 0.0)),
                  small.op(), huge),
      kat::ValueError,
      MessageContains("k = 60000, l = 0 with m = 240000 Lanczos iterations on n = 269322") &&
          MessageContains("on this machine; lower k and l"));
}

TEST_CASE("fosi: a failed refresh changes nothing", "[fosi][optim]") {
  const std::size_t n = 6;
  const auto p = to_device<double>(uniform_values(n, 91));
  const auto g = to_device<double>(uniform_values(n, 92));
  const auto theta = to_host(p);
  const kat::LinearOperator<Mem> zero = [](const Space &, const Kokkos::View<const double *, Mem> &,
                                           const Kokkos::View<double *, Mem> &) {};
  FOSI<double> flat(n, std::make_unique<SGD<double>>(n, sgd_options<double>(0.1, 0.0, false, 0.0)),
                    zero, fosi_options<double>(1, 0, 3, 1, 1, 0.1));
  CHECK_THROWS_MATCHES(flat.step(Space(), p, g), kat::NumericalError,
                       MessageContains("kat::optim::FOSI::refresh: eigenvalue 0 must be finite and "
                                       "nonzero"));
  const kat::LinearOperator<Mem> nan = [](const Space &space,
                                          const Kokkos::View<const double *, Mem> &,
                                          const Kokkos::View<double *, Mem> &out) {
    Kokkos::deep_copy(space, out, std::numeric_limits<double>::quiet_NaN());
  };
  FOSI<double> broken(n,
                      std::make_unique<SGD<double>>(n, sgd_options<double>(0.1, 0.0, false, 0.0)),
                      nan, fosi_options<double>(1, 0, 3, 1, 1, 0.1));
  CHECK_THROWS_AS(broken.step(Space(), p, g), kat::NumericalError);
  for (const auto *f : {&flat, &broken}) {
    CHECK(f->steps() == 0);
    CHECK(f->base_optimizer().steps() == 0);
    CHECK(f->refresh_count() == 0);
  }
  CHECK(to_host(p) == theta);
}

TEST_CASE("fosi: set_lr and state_buffers reach the base optimizer", "[fosi][optim]") {
  const std::size_t n = 5;
  const Hessian H(uniform_values(n, 95, 1.0, 2.0), 96);
  FOSI<float> fosi(n, std::make_unique<Adam<float>>(n, adam_options<float>(0.003, 0.0)), H.op(),
                   fosi_options<float>(1, 0, 2, 10, 10, 0.1));
  CHECK(fosi.name() == "FOSI");
  CHECK(fosi.lr() == Approx(0.003));
  CHECK(fosi.options().momentum == FOSIMomentum::adam);
  CHECK(*fosi.options().learning_rate_clip == 1.0);
  fosi.set_lr(0.5);
  CHECK(fosi.lr() == 0.5);
  CHECK(fosi.base_optimizer().lr() == 0.5);
  const auto buffers = fosi.state_buffers();
  const auto base_buffers = fosi.base_optimizer().state_buffers();
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0].data() == base_buffers[0].data());
  CHECK(buffers[1].data() == base_buffers[1].data());
  // An explicit variant overrides the inference, and the default clip follows it.
  auto o = fosi_options<float>(1, 0, 2, 10, 10, 0.1);
  o.momentum = FOSIMomentum::heavy_ball;
  FOSI<float> hb(n, std::make_unique<Adam<float>>(n, adam_options<float>(0.003, 0.0)), H.op(), o);
  CHECK(*hb.options().learning_rate_clip == 3.0);
  FOSI<float> nes(n, std::make_unique<SGD<float>>(n, sgd_options<float>(0.1, 0.9, true, 0.0)),
                  H.op(), fosi_options<float>(1, 0, 2, 10, 10, 0.1));
  CHECK(nes.options().momentum == FOSIMomentum::nesterov);
  CHECK(*nes.options().learning_rate_clip == 3.0);
}

} // namespace test_fosi
