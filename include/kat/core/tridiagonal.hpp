#pragma once
/// @file
/// @brief Eigenpairs of a real symmetric tridiagonal matrix held on the host: the small
/// eigenproblem at the end of the Lanczos algorithm (kat/core/lanczos.hpp).
///
/// The matrix is m x m with m the number of Lanczos iterations (tens to a few hundred), and its
/// entries are host scalars already (each comes back from a reduction), so there is no device
/// solver: the dispatch chooses between LAPACK's DSTEV (the default, `kat::linalg::Vendor{}`)
/// and a portable implicit symmetric QR solver (`kat::linalg::Portable{}`), as
/// kat/core/linalg.hpp does for dense matrices. Both work in double.

#include "kat/core/detail/tridiagonal_lapack.hpp"
#include "kat/core/detail/tridiagonal_portable.hpp"
#include "kat/core/error.hpp"
#include "kat/core/linalg.hpp"
#include "kat/core/profiling.hpp"

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace kat {

/// Eigenvalues and eigenvectors of an n x n symmetric tridiagonal matrix T = Z diag(values) Zᵀ.
struct TridiagonalEigen {
  std::vector<double> values;  ///< the n eigenvalues, ascending
  std::vector<double> vectors; ///< Z, n x n column-major: column j is the unit eigenvector of
                               ///< values[j] (entries vectors[j * n] to vectors[j * n + n - 1])
  std::size_t n = 0;           ///< the order

  /// Z(i, j): entry i of the eigenvector of values[j].
  double vector(std::size_t i, std::size_t j) const { return vectors[j * n + i]; }
};

namespace linalg::detail {

/// Validation and profiling region around Impl::run.
template <class Impl>
TridiagonalEigen tridiagonal_eigen_with(const std::vector<double> &diagonal,
                                        const std::vector<double> &off_diagonal) {
  const std::string who = "kat::tridiagonal_eigen (" + Impl::routine() + ")";
  const std::size_t n = diagonal.size();
  kat::detail::require_extent(who.c_str(), "off_diagonal.size() (diagonal.size() - 1)",
                              n == 0 ? std::size_t(0) : n - 1, off_diagonal.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(diagonal[i])) {
      throw NumericalError(
          kat::detail::concat(who, ": diagonal[", i, "] is not finite, got ", diagonal[i]));
    }
  }
  for (std::size_t i = 0; i < off_diagonal.size(); ++i) {
    if (!std::isfinite(off_diagonal[i])) {
      throw NumericalError(
          kat::detail::concat(who, ": off_diagonal[", i, "] is not finite, got ", off_diagonal[i]));
    }
  }
  TridiagonalEigen result;
  result.n = n;
  if (n == 0) {
    return result;
  }
  ScopedRegion region("kat::tridiagonal_eigen");
  result.values = diagonal;
  std::vector<double> e = off_diagonal;
  Impl::run(result.values, e, result.vectors);
  return result;
}

} // namespace linalg::detail

/// Eigendecomposition T = Z diag(values) Zᵀ of the symmetric tridiagonal matrix with diagonal
/// `diagonal` (length n) and sub-/super-diagonal `off_diagonal` (length n - 1; T(i, i+1) =
/// T(i+1, i) = off_diagonal[i]), with LAPACK's DSTEV on the host.
///
/// Eigenvectors are determined up to sign (and, for repeated eigenvalues, up to a rotation
/// within their eigenspace), so the LAPACK and portable paths may differ in those.
/// n == 0 returns an empty result.
///
/// @throws ShapeError if off_diagonal.size() != n - 1 (0 for n == 0).
/// @throws NumericalError if an entry is NaN or Inf, or if the solver does not converge.
/// @throws ValueError if n does not fit LAPACK's 32-bit integers (use kat::linalg::Portable).
inline TridiagonalEigen tridiagonal_eigen(const std::vector<double> &diagonal,
                                          const std::vector<double> &off_diagonal) {
  return linalg::detail::tridiagonal_eigen_with<linalg::detail::LapackTridiagonalEigen>(
      diagonal, off_diagonal);
}

/// tridiagonal_eigen with LAPACK's DSTEV (the default).
inline TridiagonalEigen tridiagonal_eigen(const std::vector<double> &diagonal,
                                          const std::vector<double> &off_diagonal, linalg::Vendor) {
  return tridiagonal_eigen(diagonal, off_diagonal);
}

/// tridiagonal_eigen with the portable implicit symmetric QR algorithm with Wilkinson shifts
/// (Golub & Van Loan, Matrix Computations, 4th ed., Algorithms 8.3.2-8.3.3), written for KAT:
/// O(n²) per sweep with the eigenvector updates, typically two sweeps per eigenvalue.
inline TridiagonalEigen tridiagonal_eigen(const std::vector<double> &diagonal,
                                          const std::vector<double> &off_diagonal,
                                          linalg::Portable) {
  return linalg::detail::tridiagonal_eigen_with<linalg::detail::PortableTridiagonalEigen>(
      diagonal, off_diagonal);
}

} // namespace kat
