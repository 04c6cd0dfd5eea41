#pragma once
/// @file
/// @brief The LAPACK solver of kat::tridiagonal_eigen: DSTEV (implicit QL/QR with the
/// eigenvectors, reference LAPACK's DSTEQR underneath).
///
/// The Fortran symbol is declared as kat/core/detail/linalg_lapack.hpp declares its routines:
/// 32-bit integers (LP64) and the hidden length of the CHARACTER argument appended as
/// `size_t` (LAPACK_FORTRAN_STRLEN_END), passed as 1.

#include "kat/core/detail/linalg_common.hpp"
#include "kat/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" {
void dstev_(const char *jobz, const int *n, double *d, double *e, double *z, const int *ldz,
            double *work, int *info, std::size_t jobz_len);
}

namespace kat::linalg::detail {

/// DSTEV with JOBZ = 'V' on host arrays.
struct LapackTridiagonalEigen {
  static std::string routine() { return "LAPACK dstev"; }
  /// `d` (n) becomes the ascending eigenvalues, `z` the n x n column-major eigenvectors; `e`
  /// (n - 1) is destroyed.
  /// @throws ValueError if n exceeds LAPACK's 32-bit integers; NumericalError if DSTEV does
  ///   not converge; Error if it reports an invalid argument (a bug in KAT).
  static void run(std::vector<double> &d, std::vector<double> &e, std::vector<double> &z) {
    const std::string who = "kat::tridiagonal_eigen (" + routine() + ")";
    const int n = checked_int(who.c_str(), "n", static_cast<std::int64_t>(d.size()));
    // E has N - 1 entries; one spare keeps e.data() valid (non-null) for N = 1.
    e.resize(std::max<std::size_t>(d.size(), 1));
    z.assign(d.size() * d.size(), 0.0);
    std::vector<double> work(std::max<std::size_t>(1, 2 * d.size()));
    const int ldz = std::max(1, n);
    int info = 0;
    dstev_("V", &n, d.data(), e.data(), z.data(), &ldz, work.data(), &info, 1);
    if (info < 0) {
      throw Error(kat::detail::concat(who, ": argument ", -info,
                                      " is invalid (a bug in KAT; please report it)"));
    }
    if (info > 0) {
      throw NumericalError(kat::detail::concat(who, ": the QL/QR iteration failed to converge (",
                                               info, " off-diagonal entries did not reach zero)"));
    }
  }
};

} // namespace kat::linalg::detail
