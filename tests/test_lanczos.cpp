// Tests of kat::lanczos and kat::tridiagonal_eigen against matrices of known spectrum
// (Q diag(λ) Qᵀ with a random orthogonal Q built on the host) and LAPACK's DSTEV.
#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include "kat/core/blas.hpp"
#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/linalg.hpp"
#include "kat/core/random.hpp"
#include "kat/core/tridiagonal.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace test_lanczos {

namespace {

using kat::test::Mem;
using kat::test::MessageContains;
using kat::test::Space;

using kat::test::random_orthogonal;

/// A symmetric matrix Q diag(lambda) Qᵀ on the device, with Q kept on the host.
struct KnownSpectrum {
  std::size_t n;
  std::vector<double> lambda; // as given (column j of q is its eigenvector)
  std::vector<double> q;      // n x n column-major
  kat::Matrix<double, Mem> A;

  KnownSpectrum(std::vector<double> eigenvalues, std::uint64_t seed)
      : n(eigenvalues.size()), lambda(std::move(eigenvalues)), q(random_orthogonal(n, seed)),
        A("test_lanczos::A", n, n) {
    auto h = Kokkos::create_mirror_view(A);
    for (std::size_t c = 0; c < n; ++c) {
      for (std::size_t r = 0; r < n; ++r) {
        double s = 0;
        for (std::size_t p = 0; p < n; ++p) {
          s += q[p * n + r] * lambda[p] * q[p * n + c];
        }
        h(r, c) = s;
      }
    }
    Kokkos::deep_copy(A, h);
  }

  kat::LinearOperator<Mem> op() const {
    const kat::Matrix<double, Mem> a = A;
    return [a](const Space &space, const Kokkos::View<const double *, Mem> &v,
               const Kokkos::View<double *, Mem> &out) {
      kat::gemv(space, kat::Trans::N, 1.0, a, v, 0.0, out);
    };
  }

  /// The eigenvalues ascending and, for each, its eigenvector's column index in q.
  std::vector<std::size_t> ascending() const {
    std::vector<std::size_t> idx(n);
    for (std::size_t i = 0; i < n; ++i) {
      idx[i] = i;
    }
    std::sort(idx.begin(), idx.end(),
              [&](std::size_t a, std::size_t b) { return lambda[a] < lambda[b]; });
    return idx;
  }
};

/// n distinct eigenvalues spread over [lo, hi] with uneven gaps.
std::vector<double> spread(std::size_t n, double lo, double hi) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i) / static_cast<double>(n - 1);
    v[i] = lo + (hi - lo) * t * t;
  }
  // Shuffle so the order of eigenvectors in Q says nothing about the order of the values.
  kat::HostRng(7).shuffle(v.begin(), v.end());
  return v;
}

/// min over signs of ‖y - (±q)‖∞ for column j of `y_host` and column p of the known q.
template <class HostMatrix>
double sign_free_distance(const HostMatrix &y_host, std::size_t j, const std::vector<double> &q,
                          std::size_t p, std::size_t n) {
  double plus = 0, minus = 0;
  for (std::size_t i = 0; i < n; ++i) {
    plus = std::max(plus, std::abs(y_host(i, j) - q[p * n + i]));
    minus = std::max(minus, std::abs(y_host(i, j) + q[p * n + i]));
  }
  return std::min(plus, minus);
}

/// max |YᵀY - I| over the columns of a host matrix.
template <class HostMatrix> double orthonormality_error(const HostMatrix &y) {
  double err = 0;
  for (std::size_t a = 0; a < y.extent(1); ++a) {
    for (std::size_t b = 0; b < y.extent(1); ++b) {
      double d = 0;
      for (std::size_t i = 0; i < y.extent(0); ++i) {
        d += y(i, a) * y(i, b);
      }
      err = std::max(err, std::abs(d - (a == b ? 1.0 : 0.0)));
    }
  }
  return err;
}

kat::LanczosOptions options(std::size_t m, std::size_t k, std::size_t l, std::uint64_t seed = 1) {
  kat::LanczosOptions o;
  o.m = m;
  o.k = k;
  o.l = l;
  o.seed = seed;
  return o;
}

} // namespace

TEST_CASE("lanczos: m = n recovers a known spectrum and its eigenvectors", "[lanczos]") {
  const std::size_t n = 40;
  const KnownSpectrum s(spread(n, -3.0, 10.0), 11);
  const auto asc = s.ascending();
  const std::size_t k = 3, l = 2;
  for (const bool portable : {false, true}) {
    INFO("portable tridiagonal solver: " << portable);
    const auto r =
        portable ? kat::lanczos<Mem>(Space(), s.op(), n, options(n, k, l), kat::linalg::Portable{})
                 : kat::lanczos<Mem>(Space(), s.op(), n, options(n, k, l));
    CHECK(r.iterations == n);
    CHECK_FALSE(r.invariant_subspace);
    CHECK(r.alpha.size() == n);
    CHECK(r.beta.size() == n - 1);
    REQUIRE(r.eigenvalues.size() == k + l);
    REQUIRE(r.eigenvectors.extent(0) == n);
    REQUIRE(r.eigenvectors.extent(1) == k + l);
    // [l smallest ascending, k largest ascending]
    const std::vector<std::size_t> expected{asc[0], asc[1], asc[n - 3], asc[n - 2], asc[n - 1]};
    const auto y = kat::test::to_host(r.eigenvectors);
    for (std::size_t j = 0; j < k + l; ++j) {
      INFO("Ritz pair " << j);
      CHECK(std::abs(r.eigenvalues[j] - s.lambda[expected[j]]) < 1e-10);
      CHECK(sign_free_distance(y, j, s.q, expected[j], n) < 1e-9);
    }
    CHECK(orthonormality_error(y) < 1e-12);
  }
}

TEST_CASE("lanczos: selection of the k largest and the l smallest", "[lanczos]") {
  const std::size_t n = 24;
  const KnownSpectrum s(spread(n, -5.0, 7.0), 3);
  const auto asc = s.ascending();
  struct Case {
    std::size_t k, l;
  };
  for (const Case c : {Case{4, 0}, Case{0, 3}, Case{2, 2}, Case{1, 0}, Case{0, 1}, Case{12, 12}}) {
    INFO("k = " << c.k << ", l = " << c.l);
    const auto r = kat::lanczos<Mem>(Space(), s.op(), n, options(n, c.k, c.l));
    REQUIRE(r.eigenvalues.size() == c.k + c.l);
    CHECK(r.k == c.k);
    CHECK(r.l == c.l);
    for (std::size_t j = 0; j < c.l; ++j) {
      CHECK(r.eigenvalues[j] == Approx(s.lambda[asc[j]]).margin(1e-10));
    }
    for (std::size_t j = 0; j < c.k; ++j) {
      CHECK(r.eigenvalues[c.l + j] == Approx(s.lambda[asc[n - c.k + j]]).margin(1e-10));
    }
  }
}

TEST_CASE("lanczos: Ritz vectors are orthonormal and the separated top converges", "[lanczos]") {
  // Three well-separated large eigenvalues over a cluster in [0, 1]: m = 30 of n = 200
  // iterations resolve the top three to far below 1e-8 and the bottom one roughly.
  const std::size_t n = 200;
  std::vector<double> lambda = spread(n, 0.0, 1.0);
  lambda[5] = 100.0;
  lambda[77] = 50.0;
  lambda[150] = 25.0;
  const KnownSpectrum s(lambda, 5);
  const auto r = kat::lanczos<Mem>(Space(), s.op(), n, options(30, 5, 3));
  CHECK(r.iterations == 30);
  REQUIRE(r.eigenvalues.size() == 8);
  const auto y = kat::test::to_host(r.eigenvectors);
  CHECK(orthonormality_error(y) < 1e-12);
  CHECK(std::abs(r.eigenvalues[7] - 100.0) < 1e-8);
  CHECK(std::abs(r.eigenvalues[6] - 50.0) < 1e-8);
  CHECK(std::abs(r.eigenvalues[5] - 25.0) < 1e-8);
  CHECK(sign_free_distance(y, 7, s.q, 5, n) < 1e-6);
  CHECK(sign_free_distance(y, 6, s.q, 77, n) < 1e-6);
  CHECK(sign_free_distance(y, 5, s.q, 150, n) < 1e-6);
  // Ritz values interlace the spectrum: all inside [min λ, max λ].
  for (const double v : r.eigenvalues) {
    CHECK(v >= -1e-12);
    CHECK(v <= 100.0 + 1e-12);
  }
  for (std::size_t j = 0; j + 1 < 3; ++j) {
    CHECK(r.eigenvalues[j] <= r.eigenvalues[j + 1]);
  }
}

TEST_CASE("lanczos: the same seed gives the same result", "[lanczos]") {
  const std::size_t n = 50;
  const KnownSpectrum s(spread(n, 1.0, 4.0), 9);
  const auto a = kat::lanczos<Mem>(Space(), s.op(), n, options(12, 2, 1, 42));
  const auto b = kat::lanczos<Mem>(Space(), s.op(), n, options(12, 2, 1, 42));
  const auto c = kat::lanczos<Mem>(Space(), s.op(), n, options(12, 2, 1, 43));
  CHECK(a.alpha == b.alpha);
  CHECK(a.beta == b.beta);
  CHECK(a.eigenvalues == b.eigenvalues);
  CHECK(a.alpha != c.alpha);
}

TEST_CASE("lanczos: an invariant Krylov space stops the iteration early", "[lanczos]") {
  // Four distinct eigenvalues, each repeated: the Krylov space of any start vector has
  // dimension 4, so β_3 vanishes and Lanczos stops with exact eigenvalues.
  const std::size_t n = 30;
  std::vector<double> lambda(n);
  const double distinct[4] = {-2.0, 0.5, 3.0, 8.0};
  for (std::size_t i = 0; i < n; ++i) {
    lambda[i] = distinct[i % 4];
  }
  const KnownSpectrum s(lambda, 21);
  const auto r = kat::lanczos<Mem>(Space(), s.op(), n, options(20, 2, 1));
  CHECK(r.invariant_subspace);
  CHECK(r.iterations == 4);
  CHECK(r.alpha.size() == 4);
  CHECK(r.beta.size() == 3);
  REQUIRE(r.eigenvalues.size() == 3);
  CHECK(r.eigenvalues[0] == Approx(-2.0).margin(1e-12));
  CHECK(r.eigenvalues[1] == Approx(3.0).margin(1e-12));
  CHECK(r.eigenvalues[2] == Approx(8.0).margin(1e-12));
  CHECK(orthonormality_error(kat::test::to_host(r.eigenvectors)) < 1e-12);
  // Five pairs do not exist in a four-dimensional Krylov space.
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), s.op(), n, options(20, 3, 2)),
                       kat::NumericalError,
                       MessageContains("became invariant after 4 iterations") &&
                           MessageContains("fewer than k + l = 5"));
}

TEST_CASE("lanczos: argument errors name the argument", "[lanczos]") {
  const KnownSpectrum s(spread(6, 1.0, 2.0), 1);
  const auto op = s.op();
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), op, 0, options(0, 1, 0)), kat::ValueError,
                       MessageContains("kat::lanczos: n must be > 0, got 0"));
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), op, 6, options(3, 0, 0)), kat::ValueError,
                       MessageContains("kat::lanczos: k + l must be >= 1, got 0 (k = 0, l = 0)"));
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), op, 6, options(2, 2, 1)), kat::ValueError,
                       MessageContains("kat::lanczos: m must be >= k + l = 3, got 2"));
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), op, 6, options(7, 2, 1)), kat::ValueError,
                       MessageContains("kat::lanczos: m must be <= n = 6, got 7"));
  CHECK_THROWS_MATCHES(
      kat::lanczos<Mem>(Space(), kat::LinearOperator<Mem>(), 6, options(3, 1, 0)), kat::ValueError,
      MessageContains("kat::lanczos: op must be a callable, got an empty LinearOperator"));
}

TEST_CASE("lanczos: k + l beyond n and runs beyond the memory are refused before allocating",
          "[lanczos]") {
  const KnownSpectrum s(spread(6, 1.0, 2.0), 1);
  const auto op = s.op();
  CHECK_THROWS_MATCHES(
      kat::lanczos<Mem>(Space(), op, 6, options(8, 5, 2)), kat::ValueError,
      MessageContains("kat::lanczos: k + l must be <= n = 6 (the operator has n eigenpairs), "
                      "got 5 + 2"));
  // n = 6, m = 6, k = 1: the 6 x 6 basis, the residual, the 6 x 1 Ritz vectors, the
  // 6-vector and 6 x 1 matrix of coefficients: 8 (36 + 6 + 6 + 6 + 6) = 480 bytes.
  CHECK(kat::lanczos_bytes(6, options(6, 1, 0)) == 480.0);
  auto limited = options(6, 1, 0);
  limited.memory_limit = 479;
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), op, 6, limited), kat::ValueError,
                       MessageContains("m = 6 iterations for k = 1, l = 0 on 6 entries") &&
                           MessageContains("(480 bytes), more than the memory_limit option's") &&
                           MessageContains("(479 bytes)"));
  limited.memory_limit = 480; // exactly enough
  CHECK(kat::lanczos<Mem>(Space(), op, 6, limited).eigenvalues.size() == 1);
  // By default the limit is the memory space's size: 2^33 entries x 2^10 iterations (64 PiB)
  // exceed any machine's, 2^44 x 2^20 even size_t. The operator (of size 6) is never called.
  REQUIRE(kat::memory_space_bytes<Mem>() > 0);
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), op, std::size_t(1) << 33, options(1 << 10, 1, 0)),
                       kat::ValueError,
                       MessageContains("m = 1024 iterations for k = 1, l = 0 on 8589934592 "
                                       "entries") &&
                           MessageContains("on this machine; lower m, k or l"));
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), op, std::size_t(1) << 44, options(1 << 20, 1, 0)),
                       kat::ValueError, MessageContains("need") && MessageContains("more than"));
}

TEST_CASE("lanczos: the host's memory size is the kernel's MemTotal", "[lanczos]") {
  std::ifstream meminfo("/proc/meminfo");
  if (!meminfo) {
    WARN("no /proc/meminfo on this system: nothing to compare with");
    return;
  }
  std::string key;
  std::size_t kib = 0;
  while (meminfo >> key && key != "MemTotal:") {
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  REQUIRE(meminfo >> kib);
  CHECK(kat::memory_space_bytes<Kokkos::HostSpace>() == kib * 1024);
}

TEST_CASE("lanczos: a non-finite operator result is an error", "[lanczos]") {
  const kat::LinearOperator<Mem> nan_op = [](const Space &space,
                                             const Kokkos::View<const double *, Mem> &,
                                             const Kokkos::View<double *, Mem> &out) {
    Kokkos::deep_copy(space, out, std::numeric_limits<double>::quiet_NaN());
  };
  CHECK_THROWS_MATCHES(kat::lanczos<Mem>(Space(), nan_op, 5, options(3, 1, 0)), kat::NumericalError,
                       MessageContains("the operator returned a non-finite vector at iteration 0"));
}

TEST_CASE("lanczos: the operator gets zeros in out and a unit vector in v", "[lanczos]") {
  const KnownSpectrum s(spread(10, 1.0, 3.0), 2);
  const auto inner = s.op();
  int calls = 0;
  bool zero_out = true;
  double max_norm_error = 0;
  const kat::LinearOperator<Mem> op = [&](const Space &space,
                                          const Kokkos::View<const double *, Mem> &v,
                                          const Kokkos::View<double *, Mem> &out) {
    ++calls;
    const auto o = kat::test::to_host(out);
    const auto vh = kat::test::to_host(v);
    double norm = 0;
    for (std::size_t i = 0; i < o.extent(0); ++i) {
      zero_out = zero_out && o(i) == 0.0;
      norm += vh(i) * vh(i);
    }
    max_norm_error = std::max(max_norm_error, std::abs(std::sqrt(norm) - 1.0));
    inner(space, v, out);
  };
  kat::lanczos<Mem>(Space(), op, 10, options(6, 1, 1));
  CHECK(calls == 6);
  CHECK(zero_out);
  CHECK(max_norm_error < 1e-14);
}

// ---------------------------------------------------------------------------- tridiagonal

namespace {

struct Tridiagonal {
  std::vector<double> d, e;
};

/// max over columns of ‖T z - λ z‖∞ and max |ZᵀZ - I|.
std::pair<double, double> residuals(const Tridiagonal &t, const kat::TridiagonalEigen &r) {
  const std::size_t n = t.d.size();
  double res = 0, orth = 0;
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < n; ++i) {
      double tz = t.d[i] * r.vector(i, j);
      if (i > 0) {
        tz += t.e[i - 1] * r.vector(i - 1, j);
      }
      if (i + 1 < n) {
        tz += t.e[i] * r.vector(i + 1, j);
      }
      res = std::max(res, std::abs(tz - r.values[j] * r.vector(i, j)));
    }
    for (std::size_t p = 0; p < n; ++p) {
      double dot = 0;
      for (std::size_t i = 0; i < n; ++i) {
        dot += r.vector(i, j) * r.vector(i, p);
      }
      orth = std::max(orth, std::abs(dot - (j == p ? 1.0 : 0.0)));
    }
  }
  return {res, orth};
}

std::vector<Tridiagonal> tridiagonal_cases() {
  std::vector<Tridiagonal> cases;
  kat::HostRng rng(99);
  const auto uniform = [&] {
    return 2.0 * static_cast<double>(rng.next() >> 11) * 0x1.0p-53 - 1.0;
  };
  for (const std::size_t n : {1, 2, 3, 7, 50, 200}) {
    Tridiagonal t;
    for (std::size_t i = 0; i < n; ++i) {
      t.d.push_back(uniform());
      if (i + 1 < n) {
        t.e.push_back(uniform());
      }
    }
    cases.push_back(t);
  }
  // Wilkinson's W21+: pairs of nearly equal eigenvalues.
  Tridiagonal w;
  for (int i = 0; i < 21; ++i) {
    w.d.push_back(std::abs(10.0 - i));
    if (i < 20) {
      w.e.push_back(1.0);
    }
  }
  cases.push_back(w);
  // Already split into blocks (zero off-diagonals), repeated diagonal entries.
  cases.push_back({{2.0, 2.0, 2.0, 1.0, 1.0, 3.0}, {0.0, 1.0, 0.0, 0.0, 0.5}});
  // Graded: entries over 12 orders of magnitude.
  Tridiagonal g;
  for (int i = 0; i < 13; ++i) {
    g.d.push_back(std::pow(10.0, -i));
    if (i < 12) {
      g.e.push_back(0.3 * std::pow(10.0, -i - 0.5));
    }
  }
  cases.push_back(g);
  // The zero matrix and a multiple of the identity.
  cases.push_back({std::vector<double>(5, 0.0), std::vector<double>(4, 0.0)});
  cases.push_back({std::vector<double>(4, -1.5), std::vector<double>(3, 0.0)});
  // Lanczos-like: constant diagonal and off-diagonal (the 1-D Laplacian).
  cases.push_back({std::vector<double>(30, 2.0), std::vector<double>(29, -1.0)});
  return cases;
}

} // namespace

TEST_CASE("tridiagonal: the portable solver equals LAPACK dstev", "[lanczos][tridiagonal]") {
  int index = 0;
  for (const auto &t : tridiagonal_cases()) {
    INFO("case " << index++ << " of order " << t.d.size());
    const auto lapack = kat::tridiagonal_eigen(t.d, t.e);
    const auto portable = kat::tridiagonal_eigen(t.d, t.e, kat::linalg::Portable{});
    const auto vendor = kat::tridiagonal_eigen(t.d, t.e, kat::linalg::Vendor{});
    const std::size_t n = t.d.size();
    REQUIRE(portable.values.size() == n);
    REQUIRE(lapack.values.size() == n);
    CHECK(vendor.values == lapack.values);
    double scale = 0;
    for (std::size_t i = 0; i < n; ++i) {
      scale = std::max(scale, std::abs(t.d[i]) + (i > 0 ? std::abs(t.e[i - 1]) : 0.0) +
                                  (i + 1 < n ? std::abs(t.e[i]) : 0.0));
    }
    const double tol = 1e-13 * std::max(scale, 1.0) * std::sqrt(static_cast<double>(n));
    for (std::size_t j = 0; j < n; ++j) {
      CHECK(std::abs(portable.values[j] - lapack.values[j]) <= tol);
      if (j > 0) {
        CHECK(portable.values[j - 1] <= portable.values[j]);
      }
    }
    const auto [res, orth] = residuals(t, portable);
    CHECK(res <= tol);
    CHECK(orth <= 1e-13 * std::sqrt(static_cast<double>(n)));
    // Eigenvectors of well-separated eigenvalues agree up to sign.
    for (std::size_t j = 0; j < n; ++j) {
      const double gap = std::min(j > 0 ? lapack.values[j] - lapack.values[j - 1] : INFINITY,
                                  j + 1 < n ? lapack.values[j + 1] - lapack.values[j] : INFINITY);
      if (gap < 1e-3 * std::max(scale, 1.0)) {
        continue;
      }
      double plus = 0, minus = 0;
      for (std::size_t i = 0; i < n; ++i) {
        plus = std::max(plus, std::abs(portable.vector(i, j) - lapack.vector(i, j)));
        minus = std::max(minus, std::abs(portable.vector(i, j) + lapack.vector(i, j)));
      }
      CHECK(std::min(plus, minus) < 1e-9);
    }
  }
}

TEST_CASE("tridiagonal: input errors", "[lanczos][tridiagonal]") {
  CHECK(kat::tridiagonal_eigen({}, {}).values.empty());
  CHECK(kat::tridiagonal_eigen({}, {}, kat::linalg::Portable{}).values.empty());
  CHECK_THROWS_MATCHES(
      kat::tridiagonal_eigen({1.0, 2.0, 3.0}, {1.0}), kat::ShapeError,
      MessageContains("off_diagonal.size() (diagonal.size() - 1) must be 2, got 1"));
  CHECK_THROWS_MATCHES(kat::tridiagonal_eigen({1.0, NAN}, {1.0}, kat::linalg::Portable{}),
                       kat::NumericalError, MessageContains("diagonal[1] is not finite"));
  CHECK_THROWS_MATCHES(kat::tridiagonal_eigen({1.0, 2.0}, {INFINITY}), kat::NumericalError,
                       MessageContains("off_diagonal[0] is not finite"));
}

} // namespace test_lanczos
