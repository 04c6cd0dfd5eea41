#pragma once
/// @file
/// @brief The portable implementations of kat::symmetric_eigen and kat::cholesky_inverse,
/// entirely in Kokkos kernels on the caller's execution space instance (Serial, OpenMP, CUDA,
/// HIP alike), and the primary dispatch templates that select them. Vendor headers
/// (linalg_lapack.hpp, linalg_cusolver.hpp, linalg_rocsolver.hpp) specialize the dispatch
/// templates per memory space, in the style of Kokkos Kernels' TPL specializations.
///
/// Validation (shapes, finite input and output) is done by the public functions in
/// kat/core/linalg.hpp; the functions here assume a square, finite, contiguous LayoutLeft A
/// with n >= 1.

#include "kat/core/detail/linalg_common.hpp"
#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/policy.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace kat::linalg::detail {

// ---------------------------------------------------------------------------------------
// Parallel cyclic Jacobi (Golub & Van Loan, Matrix Computations, 4th ed., §8.5).

/// Sweeps the portable eigen solver makes before giving up. Cyclic Jacobi converges
/// quadratically once the off-diagonal part is small; the matrices K-FAC meets (n <= ~1000)
/// need 6 to 12 sweeps.
constexpr int jacobi_max_sweeps = 50;

/// Convergence threshold: stop when off(A) <= tol · ||A||_F, off(A) being the Frobenius norm
/// of the off-diagonal part, with tol = eps · sqrt(n). Every eigenvalue is then within
/// off(A) of a diagonal entry (Weyl), an error of the order of the backward error of a
/// Householder-based solver (p(n) · eps · ||A||). Convergence is quadratic until off(A) nears
/// the rounding level and slows to linear there (seen in float on rank-deficient factors), so
/// a threshold at eps alone could cost several sweeps for no accuracy.
template <class Scalar> double jacobi_tolerance(std::int64_t n) {
  return static_cast<double>(std::numeric_limits<Scalar>::epsilon()) *
         std::sqrt(static_cast<double>(n > 1 ? n : 1));
}

/// The k-th pair (p, q) of round r of the round-robin ("chess tournament") ordering of
/// m (even) indices (the parallel ordering of Golub & Van Loan §8.5): index m - 1 stays fixed
/// and the others rotate, so the m - 1 rounds of m / 2 disjoint pairs cover every pair once.
KOKKOS_INLINE_FUNCTION void round_robin_pair(int m, int r, int k, int &p, int &q) {
  if (k == 0) {
    p = m - 1;
    q = r;
  } else {
    p = (r + k) % (m - 1);
    q = (r - k + (m - 1)) % (m - 1);
  }
}

/// (x, y) <- (c x - s y, s x + c y) for the rotation with sine s and τ = s / (1 + c), written
/// as corrections to x and y (Rutishauser's form): near convergence s is tiny and the entries
/// change by little, so the rounding of c does not accumulate over the thousands of rotations
/// each entry sees (it costs 2-3 digits of orthogonality in the plain form).
template <class Scalar>
KOKKOS_INLINE_FUNCTION void jacobi_rotate(Scalar &x, Scalar &y, Scalar s, Scalar tau) {
  if (s == Scalar(0)) {
    return; // a skipped rotation: no arithmetic on possibly tiny (subnormal) entries
  }
  const Scalar x0 = x;
  x = x0 - s * (y + tau * x0);
  y = y + s * (x0 - tau * y);
}

// ---------------------------------------------------------------------------------------
// The kernels below, as named functors rather than extended device lambdas: nvcc's wrapper
// of an extended lambda in a header is merged across translation units while its function pointers
// are not (docs/backends.md).

/// Sum of squares, in double, of the strictly-lower entries of the m x m matrix M, entry k
/// of the column-major flattening (jacobi_lower_off_squares).
template <class MView> struct JacobiLowerOffSquares {
  MView M;
  std::int64_t m;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t k, double &s) const {
    const std::int64_t i = k % m, j = k / m;
    if (i > j) {
      const double v = static_cast<double>(M(i, j));
      s += v * v;
    }
  }
};

/// M = A from its lower triangle, zero-padded from n x n to M's extents.
template <class Work, class AView> struct JacobiInitM {
  using Scalar = typename AView::non_const_value_type;
  Work M;
  AView a;
  int n;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, const std::int64_t j) const {
    M(i, j) = (i < n && j < n) ? (i >= j ? a(i, j) : a(j, i)) : Scalar(0);
  }
};

/// V = [I 0].
template <class Work> struct JacobiInitV {
  using Scalar = typename Work::non_const_value_type;
  Work V;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, const std::int64_t j) const {
    V(i, j) = i == j ? Scalar(1) : Scalar(0);
  }
};

/// Sum of squares, in double, of the diagonal of M.
template <class Work> struct JacobiDiagSquares {
  Work M;

  KOKKOS_INLINE_FUNCTION void operator()(const int i, double &sum) const {
    const double v = static_cast<double>(M(i, i));
    sum += v * v;
  }
};

/// The rotation J(p, q, θ) zeroing M(p, q) for pair k of round r: its (p, q) into `pair`
/// and t = tan θ, s = sin θ, τ = s / (1 + cos θ).
template <class Work, class Vec, class PairView> struct JacobiRotations {
  using Scalar = typename Work::non_const_value_type;
  Work M;
  Vec t, s, tau;
  PairView pair;
  int m, r;
  Scalar drop, eps;

  KOKKOS_INLINE_FUNCTION void operator()(const int k) const {
    int p, q;
    round_robin_pair(m, r, k, p, q);
    pair(k, 0) = p;
    pair(k, 1) = q;
    const Scalar app = M(p, p), aqq = M(q, q), apq = M(p, q);
    const Scalar mag = kat::math::fabs(apq);
    Scalar tn = 0, cs = 1, sn = 0; // identity: the diagonal-block update zeroes a_pq
    if (mag > drop &&
        mag > eps * kat::math::sqrt(kat::math::fabs(app)) * kat::math::sqrt(kat::math::fabs(aqq))) {
      const Scalar cot2 = (aqq - app) / (2 * apq);
      const Scalar at = kat::math::fabs(cot2);
      const Scalar root = at > Scalar(1) ? at * kat::math::sqrt(Scalar(1) + (1 / at) * (1 / at))
                                         : kat::math::sqrt(Scalar(1) + cot2 * cot2);
      tn = (cot2 < Scalar(0) ? Scalar(-1) : Scalar(1)) / (at + root);
      cs = 1 / kat::math::sqrt(1 + tn * tn);
      sn = tn * cs;
    }
    t(k) = tn;
    s(k) = sn;
    tau(k) = sn / (1 + cs);
  }
};

/// M <- Jᵀ M J on the 2x2 block of rows of pair k and columns of pair l.
template <class Work, class Vec, class PairView, class Index> struct JacobiRotateM {
  using Scalar = typename Work::non_const_value_type;
  Work M;
  Vec t, s, tau;
  PairView pair;

  KOKKOS_INLINE_FUNCTION void operator()(const Index k, const Index l) const {
    const int p = pair(k, 0), q = pair(k, 1);
    if (k == l) {
      // Diagonal block: the rotation diagonalizes it; a_pq = 0 exactly.
      const Scalar tk = t(k), apq = M(p, q);
      M(p, p) -= tk * apq;
      M(q, q) += tk * apq;
      M(p, q) = 0;
      M(q, p) = 0;
      return;
    }
    if (s(k) == Scalar(0) && s(l) == Scalar(0)) {
      return;
    }
    const int u = pair(l, 0), v = pair(l, 1);
    Scalar xpu = M(p, u), xpv = M(p, v), xqu = M(q, u), xqv = M(q, v);
    if (k > l) {
      jacobi_rotate(xpu, xpv, s(l), tau(l)); // columns: M J_l ...
      jacobi_rotate(xqu, xqv, s(l), tau(l));
      jacobi_rotate(xpu, xqu, s(k), tau(k)); // ... then rows: J_kᵀ M J_l
      jacobi_rotate(xpv, xqv, s(k), tau(k));
    } else {
      jacobi_rotate(xpu, xqu, s(k), tau(k)); // rows first
      jacobi_rotate(xpv, xqv, s(k), tau(k));
      jacobi_rotate(xpu, xpv, s(l), tau(l));
      jacobi_rotate(xqu, xqv, s(l), tau(l));
    }
    M(p, u) = xpu;
    M(p, v) = xpv;
    M(q, u) = xqu;
    M(q, v) = xqv;
  }
};

/// V <- V J: row i of V rotated in the columns of pair k.
template <class Work, class Vec, class PairView, class Index> struct JacobiRotateV {
  using Scalar = typename Work::non_const_value_type;
  Work V;
  Vec s, tau;
  PairView pair;

  KOKKOS_INLINE_FUNCTION void operator()(const Index i, const Index k) const {
    if (s(k) == Scalar(0)) {
      return;
    }
    const int p = pair(k, 0), q = pair(k, 1);
    Scalar vp = V(i, p), vq = V(i, q);
    jacobi_rotate(vp, vq, s(k), tau(k));
    V(i, p) = vp;
    V(i, q) = vq;
  }
};

/// rank(i) = the ascending position of the diagonal entry M(i, i) (ties broken by index).
template <class Work, class RankView> struct JacobiEigenRank {
  using Scalar = typename Work::non_const_value_type;
  Work M;
  RankView rank;
  int n;

  KOKKOS_INLINE_FUNCTION void operator()(const int i) const {
    const Scalar di = M(i, i);
    int pos = 0;
    for (int j = 0; j < n; ++j) {
      const Scalar dj = M(j, j);
      pos += (dj < di || (dj == di && j < i)) ? 1 : 0;
    }
    rank(i) = pos;
  }
};

/// Eigenvector i (column i of V) into column rank(i) of a, eigenvalue M(i, i) into ev(rank(i)).
template <class AView, class WView, class Work, class RankView> struct JacobiScatter {
  AView a;
  WView ev;
  Work M, V;
  RankView rank;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t row, const std::int64_t i) const {
    const int to = rank(i);
    a(row, to) = V(row, i);
    if (row == 0) {
      ev(to) = M(i, i);
    }
  }
};

/// L = the lower triangle of A, X = 0.
template <class Work, class AView> struct CholeskyInit {
  using Scalar = typename AView::non_const_value_type;
  Work L, X;
  AView a;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, const std::int64_t j) const {
    L(i, j) = i >= j ? a(i, j) : Scalar(0);
    X(i, j) = Scalar(0);
  }
};

/// Column j of L below the diagonal divided by sqrt(L(j, j)); a bad pivot recorded in `failed`.
template <class Work, class FlagView> struct CholeskyScaleColumn {
  using Scalar = typename Work::non_const_value_type;
  Work L;
  FlagView failed;
  int j;

  KOKKOS_INLINE_FUNCTION void operator()(const int i) const {
    // Only work item j touches the flag here (the others would race with its write);
    // after a failure the scaling runs on stale values, harmlessly, since A is rejected.
    const Scalar d = L(j, j);
    if (!(d > Scalar(0)) || !kat::math::isfinite(d)) {
      if (i == j && failed() == 0) {
        failed() = j + 1;
      }
      return;
    }
    if (i > j) {
      L(i, j) /= kat::math::sqrt(d);
    }
  }
};

/// Trailing update L(i, k) -= L(i, j) L(k, j) for j < k <= i, and L(j, j) = sqrt(L(j, j)).
template <class Work, class FlagView, class Index> struct CholeskyUpdate {
  Work L;
  FlagView failed;
  Index first;
  int j;

  KOKKOS_INLINE_FUNCTION void operator()(const Index i, const Index k) const {
    if (failed() != 0 || k > i) {
      return;
    }
    if (k == first) {
      if (i == first) {
        L(j, j) = kat::math::sqrt(L(j, j));
      }
      return;
    }
    L(i, k) -= L(i, j) * L(k, j);
  }
};

/// Row k of X = L⁻¹: X(k, col) = (δ_k,col - Σ_{col<=p<k} L(k, p) X(p, col)) / L(k, k).
template <class Work> struct CholeskyInvertRow {
  using Scalar = typename Work::non_const_value_type;
  Work L, X;
  int k;

  KOKKOS_INLINE_FUNCTION void operator()(const int col) const {
    Scalar sum = col == k ? Scalar(1) : Scalar(0);
    for (int p = col; p < k; ++p) {
      sum -= L(k, p) * X(p, col);
    }
    X(k, col) = sum / L(k, k);
  }
};

/// Entry (i, j), i >= j, of A⁻¹ = Xᵀ X, written to both triangles of a.
template <class Work, class AView> struct CholeskyProduct {
  using Scalar = typename Work::non_const_value_type;
  Work X;
  AView a;
  int n;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, const std::int64_t j) const {
    if (i < j) {
      return;
    }
    Scalar sum = 0;
    for (std::int64_t p = i; p < n; ++p) {
      sum += X(p, i) * X(p, j);
    }
    a(i, j) = sum;
    a(j, i) = sum;
  }
};

/// Sum of squares of the strictly-lower entries of M (half of off(M)²), in double so float
/// matrices with entries near 1e19 do not overflow.
template <class ExecSpace, class MView>
double jacobi_lower_off_squares(const ExecSpace &space, const MView &M) {
  const std::int64_t m = static_cast<std::int64_t>(M.extent(0));
  double sum = 0;
  Kokkos::parallel_reduce(
      "kat::symmetric_eigen::portable::off_norm",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, m * m),
      JacobiLowerOffSquares<MView>{M, m}, sum);
  return sum;
}

/// Portable symmetric eigendecomposition: parallel cyclic Jacobi with the round-robin
/// ordering, eigenvectors accumulated, then eigenpairs sorted ascending on the device.
///
/// Cyclic Jacobi (Golub & Van Loan §8.5) annihilates one off-diagonal pair (p, q) per
/// rotation. Rotations on disjoint index pairs commute, so the round-robin ordering groups the
/// n(n-1)/2 pairs of a sweep into n-1 rounds of n/2 disjoint pairs and each round is
/// three fully parallel kernels: compute the n/2 rotations, apply them two-sided to every 2x2
/// block (A <- Jᵀ A J, one block per work item, no synchronization), and accumulate V <- V J.
/// Odd n is padded with one zero row and column, whose rotations are the identity. The
/// sequential cyclic-by-row ordering would need n(n-1)/2 dependent steps per sweep; this one
/// needs n-1, each with n/2-way (rotations) and n²/4-way (updates) parallelism.
///
/// @param A  n x n, lower triangle read, overwritten by the eigenvectors (columns).
/// @param w  n, receives the eigenvalues in ascending order.
/// @param max_sweeps  sweeps before NumericalError (tests lower it to reach that error).
/// @throws NumericalError if off(A) > tol·||A||_F after max_sweeps sweeps, or non-finite
///   values appear during the sweeps.
template <class ExecSpace, class AView, class WView>
void portable_symmetric_eigen(const ExecSpace &space, const AView &A, const WView &w,
                              int max_sweeps = jacobi_max_sweeps) {
  using Scalar = typename AView::non_const_value_type;
  using Mem = typename AView::memory_space;
  using Work = Kokkos::View<Scalar **, Kokkos::LayoutLeft, Mem>;
  using Vec = Kokkos::View<Scalar *, Kokkos::LayoutLeft, Mem>;
  const char *who = "kat::symmetric_eigen (portable cyclic Jacobi)";

  const int n = static_cast<int>(A.extent(0));
  const int m = n + (n % 2); // even, for the round-robin ordering
  const int half = m / 2;
  const Work M(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::M"), m, m);
  const Work V(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::V"), n, m);
  // Per pair of a round: t = tan θ, s = sin θ and τ = tan(θ/2) = s / (1 + cos θ).
  const Vec t(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::t"), half);
  const Vec s(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::s"), half);
  const Vec tau(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::tau"), half);
  // The pairs (p, q) = (pair(k, 0), pair(k, 1)) of the current round, computed once per round.
  using PairView = Kokkos::View<int *[2], Kokkos::LayoutLeft, Mem>;
  const PairView pair(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::pair"),
                      half);
  const AView a = A;
  const WView ev = w;

  // M = A from its lower triangle, zero-padded to m x m; V = [I 0].
  Kokkos::parallel_for("kat::symmetric_eigen::portable::init_M", kat::matrix_policy(space, m, m),
                       JacobiInitM<Work, AView>{M, a, n});
  Kokkos::parallel_for("kat::symmetric_eigen::portable::init_V", kat::matrix_policy(space, n, m),
                       JacobiInitV<Work>{V});

  double diag2 = 0;
  Kokkos::parallel_reduce("kat::symmetric_eigen::portable::diag_norm",
                          Kokkos::RangePolicy<ExecSpace>(space, 0, n), JacobiDiagSquares<Work>{M},
                          diag2);
  double off2 = 2 * jacobi_lower_off_squares(space, M);
  const double fro2 = diag2 + off2; // invariant under the orthogonal rotations
  const double tol = jacobi_tolerance<Scalar>(n);
  // Off-diagonal entries below `drop` (absolute) or below eps · sqrt(|a_pp a_qq|) (relative
  // to their diagonal, the criterion of Demmel & Veselić 1992) are set to zero instead of
  // rotated. Zeroing entries of at most eps · ||A||_F / n perturbs A by at most eps · ||A||_F
  // in all, below the stopping tolerance, and the relative criterion changes no eigenvalue by
  // more than its own rounding. Without it the last sweep rotates by angles near 1e-20,
  // whose products with small entries are subnormal: 2.5x slower in float on x86.
  const Scalar eps = std::numeric_limits<Scalar>::epsilon();
  const Scalar drop = static_cast<Scalar>(static_cast<double>(eps) * std::sqrt(fro2) / n);

  using PairPolicy =
      Kokkos::MDRangePolicy<ExecSpace,
                            Kokkos::Rank<2, Kokkos::Iterate::Left, Kokkos::Iterate::Left>>;
  using index = typename PairPolicy::index_type;
  JacobiRotations<Work, Vec, PairView> rotations;
  rotations.M = M;
  rotations.t = t;
  rotations.s = s;
  rotations.tau = tau;
  rotations.pair = pair;
  rotations.m = m;
  rotations.r = 0; // set per round
  rotations.drop = drop;
  rotations.eps = eps;
  int sweep = 0;
  while (!(off2 <= tol * tol * fro2)) {
    if (!std::isfinite(off2)) {
      throw NumericalError(kat::detail::concat(
          who, ": non-finite values appeared during sweep ", sweep,
          " (the matrix is finite, so its entries are too large for the scalar type)"));
    }
    if (sweep == max_sweeps) {
      throw NumericalError(kat::detail::concat(
          who, ": the eigen solver failed to converge in ", max_sweeps,
          " sweeps: off-diagonal norm / Frobenius norm = ", std::sqrt(off2 / fro2), ", tolerance ",
          tol));
    }
    for (int r = 0; r < m - 1; ++r) {
      // The rotation J(p, q, θ) of each pair, zeroing M(p, q) (GVL Algorithm 8.5.1, whose
      // τ = cot 2θ is `cot2` here; its square is never formed when it is large, so it cannot
      // overflow).
      rotations.r = r;
      Kokkos::parallel_for("kat::symmetric_eigen::portable::rotations",
                           Kokkos::RangePolicy<ExecSpace>(space, 0, half), rotations);
      // M <- Jᵀ M J, one work item per 2x2 block: rows of pair k, columns of pair l. Block
      // (l, k) is the transpose of block (k, l); computing it with the two rotations in the
      // mirrored order (rows first instead of columns first) performs the same floating-point
      // operations on the same values, so the two stay transposes of each other (M stays
      // symmetric) although each work item writes only its own block.
      Kokkos::parallel_for("kat::symmetric_eigen::portable::rotate_M",
                           PairPolicy(space, {index(0), index(0)}, {index(half), index(half)}),
                           JacobiRotateM<Work, Vec, PairView, index>{M, t, s, tau, pair});
      // V <- V J
      Kokkos::parallel_for("kat::symmetric_eigen::portable::rotate_V",
                           PairPolicy(space, {index(0), index(0)}, {index(n), index(half)}),
                           JacobiRotateV<Work, Vec, PairView, index>{V, s, tau, pair});
    }
    ++sweep;
    off2 = 2 * jacobi_lower_off_squares(space, M);
  }

  // Sort ascending: the rank of eigenvalue i (ties broken by index) is its output position.
  using RankView = Kokkos::View<int *, Mem>;
  const RankView rank(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::rank"),
                      n);
  Kokkos::parallel_for("kat::symmetric_eigen::portable::rank",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, n),
                       JacobiEigenRank<Work, RankView>{M, rank, n});
  Kokkos::parallel_for("kat::symmetric_eigen::portable::scatter", kat::matrix_policy(space, n, n),
                       JacobiScatter<AView, WView, Work, RankView>{a, ev, M, V, rank});
}

// ---------------------------------------------------------------------------------------
// Cholesky inverse: A = L Lᵀ, X = L⁻¹, A⁻¹ = Xᵀ X.

/// Portable inverse of a symmetric positive definite matrix: a right-looking
/// column-by-column Cholesky factorization (outer-product form, Golub & Van Loan §4.2), a
/// row-by-row triangular inverse X = L⁻¹, and A⁻¹ = Xᵀ X, each step a Kokkos kernel on
/// `space`. The first non-positive (or non-finite) pivot is recorded in a device flag, the
/// trailing updates after it skip their work, and the flag is read back once at the end.
///
/// @param A  n x n SPD, lower triangle read, overwritten by the full symmetric A⁻¹.
/// @throws NumericalError naming the first leading minor that is not positive definite.
template <class ExecSpace, class AView>
void portable_cholesky_inverse(const ExecSpace &space, const AView &A) {
  using Scalar = typename AView::non_const_value_type;
  using Mem = typename AView::memory_space;
  using Work = Kokkos::View<Scalar **, Kokkos::LayoutLeft, Mem>;
  const int n = static_cast<int>(A.extent(0));
  const Work L(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::cholesky_inverse::L"), n, n);
  const Work X(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::cholesky_inverse::X"), n, n);
  using FlagView = Kokkos::View<int, Mem>;
  const FlagView failed("kat::cholesky_inverse::failed"); // 0 or pivot order
  const AView a = A;

  Kokkos::parallel_for("kat::cholesky_inverse::portable::init", kat::matrix_policy(space, n, n),
                       CholeskyInit<Work, AView>{L, X, a});

  using Policy2 =
      Kokkos::MDRangePolicy<ExecSpace,
                            Kokkos::Rank<2, Kokkos::Iterate::Left, Kokkos::Iterate::Left>>;
  using index = typename Policy2::index_type;
  for (int j = 0; j < n; ++j) {
    // Column j below the diagonal: L(i, j) /= sqrt(L(j, j)). L(j, j) itself is replaced in
    // the next kernel, which does not read it, so no work item reads what another writes.
    Kokkos::parallel_for("kat::cholesky_inverse::portable::scale_column",
                         Kokkos::RangePolicy<ExecSpace>(space, j, n),
                         CholeskyScaleColumn<Work, FlagView>{L, failed, j});
    // Trailing update L(i, k) -= L(i, j) L(k, j) for j < k <= i, and L(j, j) = sqrt(L(j, j)).
    const index first = static_cast<index>(j);
    Kokkos::parallel_for("kat::cholesky_inverse::portable::update",
                         Policy2(space, {index(j), index(j)}, {index(n), index(n)}),
                         CholeskyUpdate<Work, FlagView, index>{L, failed, first, j});
  }
  const int pivot = read_scalar(space, failed);
  if (pivot != 0) {
    throw NumericalError(kat::detail::concat(
        "kat::cholesky_inverse (portable Cholesky): A is not positive definite: the leading "
        "minor of order ",
        pivot, " is not positive (non-positive pivot in column ", pivot - 1, ")"));
  }

  // X = L⁻¹ row by row: X(k, c) = (δ_kc - Σ_{c<=p<k} L(k, p) X(p, c)) / L(k, k).
  for (int k = 0; k < n; ++k) {
    Kokkos::parallel_for("kat::cholesky_inverse::portable::invert_row",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, k + 1),
                         CholeskyInvertRow<Work>{L, X, k});
  }

  // A⁻¹ = Xᵀ X: entry (i, j), i >= j, is Σ_{p>=i} X(p, i) X(p, j); written to both triangles.
  Kokkos::parallel_for("kat::cholesky_inverse::portable::product", kat::matrix_policy(space, n, n),
                       CholeskyProduct<Work, AView>{X, a, n});
}

// ---------------------------------------------------------------------------------------
// Dispatch: the primary templates run the portable implementations; vendor headers
// specialize them for the memory spaces their library serves.

/// The portable implementation of kat::symmetric_eigen, in the interface every
/// implementation offers: `is_vendor`, `routine<Scalar>()` (named in error messages) and
/// `run(space, A, w)`.
struct PortableSymmetricEigen {
  static constexpr bool is_vendor = false;
  template <class Scalar> static std::string routine() { return "portable cyclic Jacobi"; }
  template <class ExecSpace, class AView, class WView>
  static void run(const ExecSpace &space, const AView &A, const WView &w) {
    portable_symmetric_eigen(space, A, w);
  }
};

/// The portable implementation of kat::cholesky_inverse.
struct PortableCholeskyInverse {
  static constexpr bool is_vendor = false;
  template <class Scalar> static std::string routine() { return "portable Cholesky"; }
  template <class ExecSpace, class AView> static void run(const ExecSpace &space, const AView &A) {
    portable_cholesky_inverse(space, A);
  }
};

/// kat::symmetric_eigen for views in MemorySpace. The primary template is the portable
/// implementation; vendor headers specialize it for the memory spaces their library serves.
template <class MemorySpace> struct SymmetricEigen : PortableSymmetricEigen {};

/// kat::cholesky_inverse for views in MemorySpace (primary: portable; specialized likewise).
template <class MemorySpace> struct CholeskyInverse : PortableCholeskyInverse {};

} // namespace kat::linalg::detail
