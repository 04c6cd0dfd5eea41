#include "test_helpers.hpp"

#include <kat/core/linalg.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace test_linalg {

using namespace kat;
using namespace kat::test;

namespace {

constexpr bool vendor_on_mem = linalg::has_vendor<Mem>;
const std::size_t orders[] = {1, 2, 3, 17, 64};

// Relative tolerance for a backward-stable solver on a well-conditioned matrix.
template <class T> double tolerance() { return std::is_same<T, float>::value ? 1e-5 : 1e-13; }

// A = BᵀB + I with B uniform in (-1, 1): symmetric positive definite, eigenvalues in
// [1, ~4n/3 + 1], so its condition number stays below ~90 for n <= 64.
template <class T> Matrix<T, Mem> spd_matrix(std::size_t n, std::uint64_t seed) {
  auto B = to_host(random_matrix<double>(n, n, seed));
  Matrix<T, Mem> A("A", n, n);
  auto h = Kokkos::create_mirror_view(A);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      double s = i == j ? 1.0 : 0.0;
      for (std::size_t p = 0; p < n; ++p)
        s += B(p, i) * B(p, j);
      h(i, j) = static_cast<T>(s);
    }
  Kokkos::deep_copy(A, h);
  return A;
}

// BᵀB for a rank x n matrix B (rank < n: positive semi-definite with n - rank zero
// eigenvalues, like a K-FAC factor estimated from fewer samples than its dimension).
template <class T> Matrix<T, Mem> gram_matrix(std::size_t n, std::size_t rank, std::uint64_t seed) {
  auto B = to_host(random_matrix<double>(rank, n, seed));
  Matrix<T, Mem> A("A", n, n);
  auto h = Kokkos::create_mirror_view(A);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      for (std::size_t p = 0; p < rank; ++p)
        s += B(p, i) * B(p, j);
      h(i, j) = static_cast<T>(s);
    }
  Kokkos::deep_copy(A, h);
  return A;
}

// A symmetric indefinite matrix with U(-1, 1) entries.
template <class T> Matrix<T, Mem> symmetric_matrix(std::size_t n, std::uint64_t seed) {
  auto h = to_host(random_matrix<T>(n, n, seed));
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < j; ++i)
      h(i, j) = h(j, i);
  Matrix<T, Mem> A("A", n, n);
  Kokkos::deep_copy(A, h);
  return A;
}

// A device matrix with the given column-major host entries.
template <class T> Matrix<T, Mem> matrix_of(std::size_t n, const std::vector<double> &values) {
  Matrix<T, Mem> A("A", n, n);
  auto h = Kokkos::create_mirror_view(A);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i)
      h(i, j) = static_cast<T>(values[i + n * j]);
  Kokkos::deep_copy(A, h);
  return A;
}

template <class T> Matrix<T, Mem> copy_of(const Matrix<T, Mem> &A) {
  Matrix<T, Mem> c("copy", A.extent(0), A.extent(1));
  Kokkos::deep_copy(c, A);
  return c;
}

// Fills the strict upper triangle with NaN: the solvers must read only the lower one.
template <class T> void poison_upper(const Matrix<T, Mem> &A) {
  auto h = to_host(A);
  for (std::size_t j = 0; j < A.extent(1); ++j)
    for (std::size_t i = 0; i < j; ++i)
      h(i, j) = std::numeric_limits<T>::quiet_NaN();
  Kokkos::deep_copy(A, h);
}

template <class HostMatrix> double max_abs(const HostMatrix &m) {
  double r = 0;
  for (std::size_t j = 0; j < m.extent(1); ++j)
    for (std::size_t i = 0; i < m.extent(0); ++i)
      r = std::max(r, std::abs(double(m(i, j))));
  return r;
}

// Eigenvalues ascending, ‖A Q − Q diag(w)‖_max <= tol · ‖A‖ and ‖QᵀQ − I‖_max <= tol.
template <class HA, class HQ, class HW>
void check_eigen(const HA &A, const HQ &Q, const HW &w, double tol) {
  const std::size_t n = A.extent(0);
  const double scale = std::max(1.0, max_abs(A) * double(n));
  for (std::size_t k = 1; k < n; ++k)
    REQUIRE(w(k - 1) <= w(k));
  double residual = 0, orthogonality = 0;
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t i = 0; i < n; ++i) {
      double aq = 0;
      for (std::size_t j = 0; j < n; ++j)
        aq += double(A(i, j)) * Q(j, k);
      residual = std::max(residual, std::abs(aq - double(w(k)) * Q(i, k)));
    }
    for (std::size_t l = 0; l < n; ++l) {
      double qq = 0;
      for (std::size_t i = 0; i < n; ++i)
        qq += double(Q(i, k)) * Q(i, l);
      orthogonality = std::max(orthogonality, std::abs(qq - (k == l ? 1.0 : 0.0)));
    }
  }
  CHECK(residual <= tol * scale);
  CHECK(orthogonality <= tol);
}

// ‖A X − I‖_max <= tol · cond-ish bound, and X exactly symmetric.
template <class HA, class HX> void check_inverse(const HA &A, const HX &X, double tol) {
  const std::size_t n = A.extent(0);
  double err = 0;
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(X(i, j) == X(j, i));
      double s = 0;
      for (std::size_t p = 0; p < n; ++p)
        s += double(A(i, p)) * X(p, j);
      err = std::max(err, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  CHECK(err <= tol * double(n) * max_abs(A) * max_abs(X));
}

// Runs symmetric_eigen on a copy of A through `tag` and checks it; returns the eigenvalues.
template <class T, class... Tag>
std::vector<double> eigen_checked(const Matrix<T, Mem> &A, Tag... tag) {
  const std::size_t n = A.extent(0);
  auto Q = copy_of(A);
  Vector<T, Mem> w("w", n);
  symmetric_eigen(Space(), Q, w, tag...);
  auto Ah = to_host(A);
  auto Qh = to_host(Q);
  auto wh = to_host(w);
  check_eigen(Ah, Qh, wh, tolerance<T>());
  return std::vector<double>(wh.data(), wh.data() + n);
}

template <class T, class... Tag>
Matrix<T, Mem> inverse_checked(const Matrix<T, Mem> &A, Tag... tag) {
  auto X = copy_of(A);
  cholesky_inverse(Space(), X, tag...);
  check_inverse(to_host(A), to_host(X), tolerance<T>());
  return X;
}

} // namespace

TEMPLATE_TEST_CASE("linalg: symmetric_eigen vendor and portable agree on random SPD matrices",
                   "[linalg]", float, double) {
  for (std::size_t n : orders) {
    INFO("n = " << n);
    const auto A = spd_matrix<TestType>(n, 10 + n);
    const auto portable = eigen_checked(A, linalg::Portable{});
    const auto automatic = eigen_checked(A);
    const double scale = std::abs(portable.back());
    for (std::size_t k = 0; k < n; ++k)
      CHECK(std::abs(automatic[k] - portable[k]) <= tolerance<TestType>() * scale);
    if constexpr (vendor_on_mem) {
      const auto vendor = eigen_checked(A, linalg::Vendor{});
      for (std::size_t k = 0; k < n; ++k)
        CHECK(std::abs(vendor[k] - portable[k]) <= tolerance<TestType>() * scale);
    }
  }
}

TEMPLATE_TEST_CASE("linalg: symmetric_eigen of rank-deficient and indefinite matrices", "[linalg]",
                   float, double) {
  for (const auto &A : {gram_matrix<TestType>(40, 5, 31), symmetric_matrix<TestType>(33, 32)}) {
    const std::size_t n = A.extent(0);
    INFO("n = " << n);
    const auto portable = eigen_checked(A, linalg::Portable{});
    const auto automatic = eigen_checked(A);
    const double scale = std::max(std::abs(portable.front()), std::abs(portable.back()));
    for (std::size_t k = 0; k < n; ++k)
      CHECK(std::abs(automatic[k] - portable[k]) <= tolerance<TestType>() * scale);
  }
}

TEMPLATE_TEST_CASE("linalg: cholesky_inverse vendor and portable agree and invert SPD matrices",
                   "[linalg]", float, double) {
  for (std::size_t n : orders) {
    INFO("n = " << n);
    const auto A = spd_matrix<TestType>(n, 20 + n);
    const auto portable = to_host(inverse_checked(A, linalg::Portable{}));
    const auto automatic = to_host(inverse_checked(A));
    const double scale = max_abs(portable);
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < n; ++i)
        CHECK(std::abs(double(automatic(i, j)) - portable(i, j)) <=
              tolerance<TestType>() * double(n) * scale);
    if constexpr (vendor_on_mem) {
      const auto vendor = to_host(inverse_checked(A, linalg::Vendor{}));
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < n; ++i)
          CHECK(std::abs(double(vendor(i, j)) - portable(i, j)) <=
                tolerance<TestType>() * double(n) * scale);
    }
  }
}

// The closed-form cases, on every path, with NaN in the strict upper triangle.
template <class T, class... Tag> void check_closed_forms(Tag... tag) {
  const double tol = tolerance<T>();
  {
    // [[2, 1], [1, 2]]: eigenvalues 1 and 3, eigenvectors (1, -1)/√2 and (1, 1)/√2.
    auto A = matrix_of<T>(2, {2, 1, 1, 2});
    poison_upper(A);
    Vector<T, Mem> w("w", 2);
    symmetric_eigen(Space(), A, w, tag...);
    auto Q = to_host(A);
    auto wh = to_host(w);
    CHECK(wh(0) == Approx(1).epsilon(tol));
    CHECK(wh(1) == Approx(3).epsilon(tol));
    const double r = 1 / std::sqrt(2.0);
    CHECK(std::abs(Q(0, 0)) == Approx(r).epsilon(tol));
    CHECK(Q(1, 0) == Approx(-Q(0, 0)).epsilon(tol));
    CHECK(std::abs(Q(0, 1)) == Approx(r).epsilon(tol));
    CHECK(Q(1, 1) == Approx(Q(0, 1)).epsilon(tol));
  }
  {
    // diag(3, -1, 2): eigenvalues sorted to (-1, 2, 3), eigenvectors ±e1, ±e2, ±e0.
    auto A = matrix_of<T>(3, {3, 0, 0, 0, -1, 0, 0, 0, 2});
    poison_upper(A);
    Vector<T, Mem> w("w", 3);
    symmetric_eigen(Space(), A, w, tag...);
    auto Q = to_host(A);
    auto wh = to_host(w);
    CHECK(wh(0) == Approx(-1).epsilon(tol));
    CHECK(wh(1) == Approx(2).epsilon(tol));
    CHECK(wh(2) == Approx(3).epsilon(tol));
    const std::size_t from[] = {1, 2, 0};
    for (std::size_t k = 0; k < 3; ++k)
      for (std::size_t i = 0; i < 3; ++i)
        CHECK(std::abs(Q(i, k)) == Approx(i == from[k] ? 1 : 0).margin(tol));
  }
  {
    // The zero matrix: eigenvalues 0, eigenvectors still orthonormal.
    Matrix<T, Mem> A("A", 4, 4);
    Vector<T, Mem> w("w", 4);
    symmetric_eigen(Space(), A, w, tag...);
    auto Q = to_host(A);
    auto wh = to_host(w);
    Matrix<T, Kokkos::HostSpace> zero("zero", 4, 4);
    check_eigen(zero, Q, wh, tol);
    for (std::size_t k = 0; k < 4; ++k)
      CHECK(wh(k) == Approx(0).margin(tol));
  }
  {
    // [[4, 2], [2, 3]]⁻¹ = [[3, -2], [-2, 4]] / 8.
    auto A = matrix_of<T>(2, {4, 2, 2, 3});
    poison_upper(A);
    cholesky_inverse(Space(), A, tag...);
    auto X = to_host(A);
    CHECK(X(0, 0) == Approx(3.0 / 8).epsilon(tol));
    CHECK(X(1, 0) == Approx(-2.0 / 8).epsilon(tol));
    CHECK(X(0, 1) == X(1, 0));
    CHECK(X(1, 1) == Approx(4.0 / 8).epsilon(tol));
  }
}

TEMPLATE_TEST_CASE("linalg: closed-form cases read only the lower triangle", "[linalg]", float,
                   double) {
  SECTION("portable") { check_closed_forms<TestType>(linalg::Portable{}); }
  SECTION("default") { check_closed_forms<TestType>(); }
  if constexpr (vendor_on_mem) {
    SECTION("vendor") { check_closed_forms<TestType>(linalg::Vendor{}); }
  }
}

TEST_CASE("linalg: shape errors name the argument and the extents", "[linalg]") {
  Matrix<double, Mem> rect("rect", 3, 4);
  Vector<double, Mem> w3("w3", 3), w2("w2", 2);
  CHECK_THROWS_AS(symmetric_eigen(Space(), rect, w3), ShapeError);
  CHECK_THROWS_WITH(symmetric_eigen(Space(), rect, w3, linalg::Portable{}),
                    Catch::Contains("A must be square") && Catch::Contains("got 3x4"));
  CHECK_THROWS_WITH(cholesky_inverse(Space(), rect),
                    Catch::Contains("kat::cholesky_inverse") && Catch::Contains("got 3x4"));
  CHECK_THROWS_AS(cholesky_inverse(Space(), rect, linalg::Portable{}), ShapeError);

  Matrix<double, Mem> A("A", 3, 3);
  CHECK_THROWS_AS(symmetric_eigen(Space(), A, w2), ShapeError);
  CHECK_THROWS_WITH(symmetric_eigen(Space(), A, w2, linalg::Portable{}),
                    Catch::Contains("w.extent(0) (the order of A) must be 3, got 2"));

  // A padded LayoutLeft subview has no leading dimension equal to its extent.
  Matrix<double, Mem> big("big", 5, 5);
  auto sub = Kokkos::subview(big, Kokkos::make_pair(0, 3), Kokkos::make_pair(0, 3));
  CHECK_THROWS_WITH(symmetric_eigen(Space(), sub, w3),
                    Catch::Contains("contiguous") && Catch::Contains("column stride 5"));
  CHECK_THROWS_AS(cholesky_inverse(Space(), sub), ShapeError);

  // n == 0 is a no-op.
  Matrix<double, Mem> empty("empty", 0, 0);
  Vector<double, Mem> w0("w0", 0);
  CHECK_NOTHROW(symmetric_eigen(Space(), empty, w0));
  CHECK_NOTHROW(cholesky_inverse(Space(), empty));
  CHECK_NOTHROW(symmetric_eigen(Space(), empty, w0, linalg::Portable{}));
  CHECK_NOTHROW(cholesky_inverse(Space(), empty, linalg::Portable{}));
}

template <class... Tag> void check_nonfinite_rejected(Tag... tag) {
  auto A = spd_matrix<double>(4, 3);
  auto h = to_host(A);
  h(2, 1) = std::numeric_limits<double>::quiet_NaN();
  Kokkos::deep_copy(A, h);
  Vector<double, Mem> w("w", 4);
  CHECK_THROWS_AS(symmetric_eigen(Space(), A, w, tag...), NumericalError);
  CHECK_THROWS_WITH(symmetric_eigen(Space(), A, w, tag...),
                    Catch::Contains("kat::symmetric_eigen") &&
                        Catch::Contains("A(2, 1) is not finite"));
  h(2, 1) = 0;
  h(3, 3) = std::numeric_limits<double>::infinity();
  Kokkos::deep_copy(A, h);
  CHECK_THROWS_WITH(cholesky_inverse(Space(), A, tag...),
                    Catch::Contains("kat::cholesky_inverse") &&
                        Catch::Contains("A(3, 3) is not finite"));
}

TEST_CASE("linalg: non-finite input is a NumericalError before the solver runs", "[linalg]") {
  check_nonfinite_rejected(linalg::Portable{});
  check_nonfinite_rejected();
  if constexpr (vendor_on_mem) {
    check_nonfinite_rejected(linalg::Vendor{});
  }
}

TEMPLATE_TEST_CASE("linalg: cholesky_inverse of a matrix that is not positive definite throws",
                   "[linalg]", float, double) {
  const auto indefinite = matrix_of<TestType>(2, {1, 0, 0, -1});
  CHECK_THROWS_AS(cholesky_inverse(Space(), copy_of(indefinite), linalg::Portable{}),
                  NumericalError);
  CHECK_THROWS_WITH(cholesky_inverse(Space(), copy_of(indefinite), linalg::Portable{}),
                    Catch::Contains("portable Cholesky") &&
                        Catch::Contains("not positive definite") &&
                        Catch::Contains("leading minor of order 2"));
  // Singular at the first pivot.
  const auto singular = matrix_of<TestType>(3, {0, 0, 0, 0, 1, 0, 0, 0, 1});
  CHECK_THROWS_WITH(cholesky_inverse(Space(), copy_of(singular), linalg::Portable{}),
                    Catch::Contains("leading minor of order 1"));
  if constexpr (vendor_on_mem) {
    CHECK_THROWS_AS(cholesky_inverse(Space(), copy_of(indefinite), linalg::Vendor{}),
                    NumericalError);
    CHECK_THROWS_WITH(cholesky_inverse(Space(), copy_of(indefinite), linalg::Vendor{}),
                      Catch::Contains("potrf") && Catch::Contains("not positive definite") &&
                          Catch::Contains("leading minor of order 2"));
    CHECK_THROWS_WITH(cholesky_inverse(Space(), copy_of(singular)),
                      Catch::Contains("leading minor of order 1"));
  }
}

TEST_CASE("linalg: the default path is the vendor one where it exists", "[linalg]") {
  STATIC_REQUIRE(linalg::has_vendor<Kokkos::HostSpace>);
  const auto indefinite = matrix_of<double>(2, {1, 0, 0, -1});
  CHECK_THROWS_WITH(cholesky_inverse(Space(), copy_of(indefinite)),
                    Catch::Contains(vendor_on_mem ? "potrf" : "portable Cholesky"));
}

TEST_CASE("linalg: the portable Jacobi solver reports non-convergence", "[linalg]") {
  auto A = spd_matrix<double>(17, 5);
  Vector<double, Mem> w("w", 17);
  CHECK_THROWS_WITH(linalg::detail::portable_symmetric_eigen(Space(), A, w, 1),
                    Catch::Contains("portable cyclic Jacobi") &&
                        Catch::Contains("failed to converge in 1 sweeps"));
}

} // namespace test_linalg
