#pragma once
/// @file
/// @brief LAPACK specializations of kat::symmetric_eigen (xSYEVD) and kat::cholesky_inverse
/// (xPOTRF + xPOTRI) for views in Kokkos::HostSpace, the memory space of the Serial and
/// OpenMP backends.
///
/// The Fortran symbols are declared here rather than taken from a LAPACKE header (Debian's
/// liblapack-dev ships none, and LAPACKE is not needed for four routines). The declarations
/// match reference LAPACK's own `lapack.h` with LAPACK_FORTRAN_STRLEN_END: 32-bit integers
/// (LP64) and the hidden length of every CHARACTER argument appended as `size_t`. gfortran
/// has passed those lengths since version 8 and its callers can rely on them being present
/// (omitting them is undefined behaviour that has crashed R and others), so every call passes
/// 1 for each one-character argument; libraries that do not read them ignore them.

#include "kat/core/detail/linalg_portable.hpp"
#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" {
void ssyevd_(const char *jobz, const char *uplo, const int *n, float *a, const int *lda, float *w,
             float *work, const int *lwork, int *iwork, const int *liwork, int *info,
             std::size_t jobz_len, std::size_t uplo_len);
void dsyevd_(const char *jobz, const char *uplo, const int *n, double *a, const int *lda, double *w,
             double *work, const int *lwork, int *iwork, const int *liwork, int *info,
             std::size_t jobz_len, std::size_t uplo_len);
void spotrf_(const char *uplo, const int *n, float *a, const int *lda, int *info,
             std::size_t uplo_len);
void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info,
             std::size_t uplo_len);
void spotri_(const char *uplo, const int *n, float *a, const int *lda, int *info,
             std::size_t uplo_len);
void dpotri_(const char *uplo, const int *n, double *a, const int *lda, int *info,
             std::size_t uplo_len);
}

namespace kat::linalg::detail {
namespace lapack {

// Overloads on the scalar type; JOBZ = 'V' (eigenvectors) and UPLO = 'L' throughout.
inline void syevd(int n, float *a, int lda, float *w, float *work, int lwork, int *iwork,
                  int liwork, int &info) {
  ssyevd_("V", "L", &n, a, &lda, w, work, &lwork, iwork, &liwork, &info, 1, 1);
}
inline void syevd(int n, double *a, int lda, double *w, double *work, int lwork, int *iwork,
                  int liwork, int &info) {
  dsyevd_("V", "L", &n, a, &lda, w, work, &lwork, iwork, &liwork, &info, 1, 1);
}
inline void potrf(int n, float *a, int lda, int &info) { spotrf_("L", &n, a, &lda, &info, 1); }
inline void potrf(int n, double *a, int lda, int &info) { dpotrf_("L", &n, a, &lda, &info, 1); }
inline void potri(int n, float *a, int lda, int &info) { spotri_("L", &n, a, &lda, &info, 1); }
inline void potri(int n, double *a, int lda, int &info) { dpotri_("L", &n, a, &lda, &info, 1); }

/// info < 0 means KAT passed an invalid argument: a bug, not a property of the matrix.
inline void check_argument_error(const std::string &who, int info) {
  if (info < 0) {
    throw Error(kat::detail::concat(who, ": argument ", -info,
                                    " is invalid (a bug in KAT; please report it)"));
  }
}

} // namespace lapack

/// xSYEVD (divide and conquer; eigenvalues ascending, orthonormal eigenvectors) on host memory.
template <> struct SymmetricEigen<Kokkos::HostSpace> {
  static constexpr bool is_vendor = true;
  template <class Scalar> static std::string routine() {
    return std::string("LAPACK ") + blas_prefix<Scalar>() + "syevd";
  }
  template <class ExecSpace, class AView, class WView>
  static void run(const ExecSpace &space, const AView &A, const WView &w) {
    using Scalar = typename AView::non_const_value_type;
    const std::string who = "kat::symmetric_eigen (" + routine<Scalar>() + ")";
    const std::int64_t n64 = static_cast<std::int64_t>(A.extent(0));
    const int n = checked_int(who.c_str(), "n", n64);
    // Minimum sizes for JOBZ = 'V' (LAPACK documentation), also guarding against a query
    // answer rounded down when a large LWORK is returned through a float.
    const int min_lwork = checked_int(who.c_str(), "lwork", 1 + 6 * n64 + 2 * n64 * n64);
    const int min_liwork = 3 + 5 * n;
    space.fence(); // LAPACK reads A on this thread: earlier kernels on `space` must be done
    Scalar work_query = 0;
    int iwork_query = 0, info = 0;
    lapack::syevd(n, A.data(), n, w.data(), &work_query, -1, &iwork_query, -1, info);
    lapack::check_argument_error(who, info);
    const int lwork =
        std::max(min_lwork, checked_int(who.c_str(), "lwork",
                                        static_cast<std::int64_t>(std::ceil(double(work_query)))));
    const int liwork = std::max(min_liwork, iwork_query);
    std::vector<Scalar> work(static_cast<std::size_t>(lwork));
    std::vector<int> iwork(static_cast<std::size_t>(liwork));
    lapack::syevd(n, A.data(), n, w.data(), work.data(), lwork, iwork.data(), liwork, info);
    lapack::check_argument_error(who, info);
    if (info > 0) {
      throw NumericalError(kat::detail::concat(
          who, ": the eigen solver failed to converge (info = ", info,
          ": the divide-and-conquer step failed on the submatrix in rows and columns ",
          info / (n + 1), " to ", info % (n + 1), ")"));
    }
  }
};

/// xPOTRF + xPOTRI on host memory; the lower triangle of the inverse is copied to the upper.
template <> struct CholeskyInverse<Kokkos::HostSpace> {
  static constexpr bool is_vendor = true;
  template <class Scalar> static std::string routine() {
    return std::string("LAPACK ") + blas_prefix<Scalar>() + "potrf/" + blas_prefix<Scalar>() +
           "potri";
  }
  template <class ExecSpace, class AView> static void run(const ExecSpace &space, const AView &A) {
    using Scalar = typename AView::non_const_value_type;
    const char *p = blas_prefix<Scalar>();
    const int n =
        checked_int("kat::cholesky_inverse (LAPACK)", "n", static_cast<std::int64_t>(A.extent(0)));
    space.fence();
    int info = 0;
    lapack::potrf(n, A.data(), n, info);
    const std::string who_f = kat::detail::concat("kat::cholesky_inverse (LAPACK ", p, "potrf)");
    lapack::check_argument_error(who_f, info);
    if (info > 0) {
      throw NumericalError(
          kat::detail::concat(who_f, ": A is not positive definite: the leading minor of order ",
                              info, " is not positive"));
    }
    lapack::potri(n, A.data(), n, info);
    const std::string who_i = kat::detail::concat("kat::cholesky_inverse (LAPACK ", p, "potri)");
    lapack::check_argument_error(who_i, info);
    if (info > 0) {
      throw NumericalError(kat::detail::concat(who_i, ": A is singular: diagonal entry ", info,
                                               " of its Cholesky factor is zero"));
    }
    symmetrize_lower(space, A);
  }
};

} // namespace kat::linalg::detail
