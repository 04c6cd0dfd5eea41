#pragma once
/// @file
/// @brief The portable solver of kat::tridiagonal_eigen: the implicit symmetric QR algorithm
/// with Wilkinson shifts on the host (Golub & Van Loan, Matrix Computations, 4th ed.,
/// Algorithms 8.3.2 and 8.3.3).
///
/// Each sweep chases the bulge that one shifted Givens rotation creates at the top of an
/// unreduced block down to its bottom, accumulating the rotations into the eigenvector
/// matrix; off-diagonal entries that fall below eps * (|d_i| + |d_{i+1}|) are set to zero,
/// which splits the matrix into independent blocks. The Wilkinson shift (the eigenvalue of
/// the trailing 2 x 2 block closer to its last diagonal entry) makes the last off-diagonal
/// entry converge cubically in practice and globally (Wilkinson 1968), so a bound of 30
/// sweeps per eigenvalue is never reached for finite input.

#include "kat/core/error.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace kat::linalg::detail {

/// Eigenvalues (ascending, into `d`) and orthonormal eigenvectors (column-major n x n, into
/// `z`, column j belonging to d[j]) of the symmetric tridiagonal matrix with diagonal `d`
/// (length n) and off-diagonal `e` (length n - 1, destroyed).
/// @throws NumericalError if 30 n sweeps do not split the matrix completely.
inline void portable_tridiagonal_eigen(std::vector<double> &d, std::vector<double> &e,
                                       std::vector<double> &z) {
  const std::size_t n = d.size();
  z.assign(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    z[i * n + i] = 1.0;
  }
  if (n <= 1) {
    return;
  }
  const double eps = std::numeric_limits<double>::epsilon();
  // Z <- Z P^T for the rotation P = [c s; -s c] acting on coordinates (p, p + 1).
  const auto rotate_columns = [&](std::size_t p, double c, double s) {
    double *a = &z[p * n];
    double *b = &z[(p + 1) * n];
    for (std::size_t i = 0; i < n; ++i) {
      const double x = a[i];
      const double y = b[i];
      a[i] = c * x + s * y;
      b[i] = -s * x + c * y;
    }
  };

  std::size_t hi = n - 1; // the active block is [lo, hi]; rows below hi have converged
  std::size_t sweeps = 0;
  const std::size_t max_sweeps = 30 * n;
  while (hi > 0) {
    for (std::size_t i = 0; i < hi; ++i) {
      if (std::abs(e[i]) <= eps * (std::abs(d[i]) + std::abs(d[i + 1]))) {
        e[i] = 0.0;
      }
    }
    if (e[hi - 1] == 0.0) {
      --hi;
      continue;
    }
    std::size_t lo = hi - 1;
    while (lo > 0 && e[lo - 1] != 0.0) {
      --lo;
    }
    if (++sweeps > max_sweeps) {
      throw NumericalError(kat::detail::concat(
          "kat::tridiagonal_eigen (portable implicit QR): no convergence after ", max_sweeps,
          " sweeps (rows ", lo, " to ", hi, " are still coupled)"));
    }
    // Wilkinson shift from the trailing 2 x 2 block of [lo, hi]; hypot avoids overflow and
    // the sign choice avoids cancellation in the denominator (never 0: e[hi - 1] != 0).
    const double delta = 0.5 * (d[hi - 1] - d[hi]);
    const double b = e[hi - 1];
    const double denominator = delta + std::copysign(std::hypot(delta, b), delta);
    const double mu = d[hi] - b * b / denominator;
    // The first rotation is that of the shifted first column (d[lo] - mu, e[lo]); each
    // later one annihilates the bulge z below the off-diagonal entry x = e[p - 1].
    double x = d[lo] - mu;
    double bulge = e[lo];
    for (std::size_t p = lo; p < hi; ++p) {
      const double r = std::hypot(x, bulge);
      const double c = r == 0.0 ? 1.0 : x / r;
      const double s = r == 0.0 ? 0.0 : bulge / r;
      if (p > lo) {
        e[p - 1] = r;
      }
      // [d_p f; f d_{p+1}] <- P [d_p f; f d_{p+1}] P^T.
      const double dp = d[p];
      const double dq = d[p + 1];
      const double f = e[p];
      d[p] = c * c * dp + 2.0 * c * s * f + s * s * dq;
      d[p + 1] = s * s * dp - 2.0 * c * s * f + c * c * dq;
      e[p] = (c * c - s * s) * f + c * s * (dq - dp);
      if (p + 1 < hi) {
        // Row p + 2's coupling (0, e[p + 1]) rotates into the new bulge and off-diagonal.
        const double h = e[p + 1];
        bulge = s * h;
        e[p + 1] = c * h;
      }
      x = e[p];
      rotate_columns(p, c, s);
    }
  }

  // Ascending order; selection sort keeps the column swaps at n.
  for (std::size_t i = 0; i + 1 < n; ++i) {
    std::size_t smallest = i;
    for (std::size_t j = i + 1; j < n; ++j) {
      if (d[j] < d[smallest]) {
        smallest = j;
      }
    }
    if (smallest != i) {
      std::swap(d[i], d[smallest]);
      for (std::size_t r = 0; r < n; ++r) {
        std::swap(z[i * n + r], z[smallest * n + r]);
      }
    }
  }
}

/// The portable implementation of kat::tridiagonal_eigen, in the interface every
/// implementation offers: `routine()` (named in error messages) and `run(d, e, z)`.
struct PortableTridiagonalEigen {
  static std::string routine() { return "portable implicit QR"; }
  static void run(std::vector<double> &d, std::vector<double> &e, std::vector<double> &z) {
    portable_tridiagonal_eigen(d, e, z);
  }
};

} // namespace kat::linalg::detail
