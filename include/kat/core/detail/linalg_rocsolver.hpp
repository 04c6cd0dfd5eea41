#pragma once
/// @file
/// @brief rocSOLVER specializations of kat::symmetric_eigen (rocsolver_<t>syevd) and
/// kat::cholesky_inverse (rocsolver_<t>potrf + rocsolver_<t>potri) for views in HIP device
/// memory. Compiled only with KOKKOS_ENABLE_HIP and KAT_ENABLE_ROCSOLVER (the CMake option of
/// that name defines it and links roc::rocsolver and roc::rocblas); otherwise HIP views use
/// the portable implementation.

#include "kat/core/detail/linalg_portable.hpp"

#if defined(KOKKOS_ENABLE_HIP) && defined(KAT_ENABLE_ROCSOLVER)

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#if __has_include(<rocsolver/rocsolver.h>)
#include <rocsolver/rocsolver.h> // ROCm >= 5.2
#else
#include <rocsolver.h>
#endif

#include <cstdint>
#include <string>
#include <type_traits>

namespace kat::linalg::detail {
namespace rocsolver {

// HIP left Kokkos::Experimental in Kokkos 4.0.
#if KOKKOS_VERSION >= 40000
using HIPExec = Kokkos::HIP;
using HIPMem = Kokkos::HIPSpace;
#else
using HIPExec = Kokkos::Experimental::HIP;
using HIPMem = Kokkos::Experimental::HIPSpace;
#endif

inline void check(rocblas_status status, const std::string &who, const char *call) {
  if (status != rocblas_status_success) {
    throw Error(kat::detail::concat(who, ": ", call, " returned rocblas_status ",
                                    static_cast<int>(status)));
  }
}

/// This host thread's rocBLAS handle (rocSOLVER runs on rocBLAS handles), bound to `stream`.
///
/// Creating a handle allocates device memory and costs more than a K-FAC-sized solve, so it
/// is created once per host thread (thread_local: a handle must not be shared by concurrent
/// threads, and each call rebinds its stream). It is deliberately never destroyed: a static
/// destructor would run after Kokkos::finalize and the HIP runtime teardown; the process exit
/// reclaims it.
inline rocblas_handle handle(hipStream_t stream, const std::string &who) {
  static thread_local rocblas_handle h = [&who] {
    rocblas_handle created = nullptr;
    check(rocblas_create_handle(&created), who, "rocblas_create_handle");
    return created;
  }();
  check(rocblas_set_stream(h, stream), who, "rocblas_set_stream");
  return h;
}

// Overloads on the scalar type; eigenvectors wanted, lower triangle stored.
inline rocblas_status syevd(rocblas_handle h, rocblas_int n, float *a, rocblas_int lda, float *d,
                            float *e, rocblas_int *info) {
  return rocsolver_ssyevd(h, rocblas_evect_original, rocblas_fill_lower, n, a, lda, d, e, info);
}
inline rocblas_status syevd(rocblas_handle h, rocblas_int n, double *a, rocblas_int lda, double *d,
                            double *e, rocblas_int *info) {
  return rocsolver_dsyevd(h, rocblas_evect_original, rocblas_fill_lower, n, a, lda, d, e, info);
}
inline rocblas_status potrf(rocblas_handle h, rocblas_int n, float *a, rocblas_int lda,
                            rocblas_int *info) {
  return rocsolver_spotrf(h, rocblas_fill_lower, n, a, lda, info);
}
inline rocblas_status potrf(rocblas_handle h, rocblas_int n, double *a, rocblas_int lda,
                            rocblas_int *info) {
  return rocsolver_dpotrf(h, rocblas_fill_lower, n, a, lda, info);
}
inline rocblas_status potri(rocblas_handle h, rocblas_int n, float *a, rocblas_int lda,
                            rocblas_int *info) {
  return rocsolver_spotri(h, rocblas_fill_lower, n, a, lda, info);
}
inline rocblas_status potri(rocblas_handle h, rocblas_int n, double *a, rocblas_int lda,
                            rocblas_int *info) {
  return rocsolver_dpotri(h, rocblas_fill_lower, n, a, lda, info);
}

template <class ExecSpace> void require_hip_space() {
  static_assert(std::is_same<ExecSpace, HIPExec>::value,
                "kat::linalg (rocSOLVER): views in HIP device memory need a Kokkos HIP "
                "execution space instance, whose stream the solver runs on");
}

inline void check_info(rocblas_int status, const std::string &who) {
  if (status < 0) {
    throw Error(kat::detail::concat(who, ": argument ", -status,
                                    " is invalid (a bug in KAT; please report it)"));
  }
}

} // namespace rocsolver

/// rocsolver_<t>syevd on HIP memory, on the stream of the Kokkos HIP instance.
template <> struct SymmetricEigen<rocsolver::HIPMem> {
  static constexpr bool is_vendor = true;
  template <class Scalar> static std::string routine() {
    return std::string("rocSOLVER rocsolver_") + blas_prefix<Scalar>() + "syevd";
  }
  template <class ExecSpace, class AView, class WView>
  static void run(const ExecSpace &space, const AView &A, const WView &w) {
    rocsolver::require_hip_space<ExecSpace>();
    using Scalar = typename AView::non_const_value_type;
    const std::string who = "kat::symmetric_eigen (" + routine<Scalar>() + ")";
    const rocblas_int n = checked_int(who.c_str(), "n", static_cast<std::int64_t>(A.extent(0)));
    const rocblas_handle h = rocsolver::handle(space.hip_stream(), who);
    // E: the off-diagonal of the intermediate tridiagonal form (rocSOLVER's workspace).
    const Kokkos::View<Scalar *, rocsolver::HIPMem> e(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::rocsolver_e"),
        static_cast<std::size_t>(n));
    const Kokkos::View<rocblas_int, rocsolver::HIPMem> info("kat::symmetric_eigen::rocsolver_info");
    space.fence(); // the zero-initialization of `info` ran on the default instance
    rocsolver::check(rocsolver::syevd(h, n, A.data(), n, w.data(), e.data(), info.data()), who,
                     "syevd");
    const rocblas_int status = read_scalar(space, info);
    rocsolver::check_info(status, who);
    if (status > 0) {
      throw NumericalError(kat::detail::concat(
          who, ": the eigen solver failed to converge (info = ", status, ": ", status,
          " off-diagonal elements of the intermediate tridiagonal form did not converge)"));
    }
  }
};

/// rocsolver_<t>potrf + rocsolver_<t>potri on HIP memory; lower triangle copied to upper.
template <> struct CholeskyInverse<rocsolver::HIPMem> {
  static constexpr bool is_vendor = true;
  template <class Scalar> static std::string routine() {
    return std::string("rocSOLVER rocsolver_") + blas_prefix<Scalar>() + "potrf/rocsolver_" +
           blas_prefix<Scalar>() + "potri";
  }
  template <class ExecSpace, class AView> static void run(const ExecSpace &space, const AView &A) {
    rocsolver::require_hip_space<ExecSpace>();
    using Scalar = typename AView::non_const_value_type;
    const char *p = blas_prefix<Scalar>();
    const std::string who_f =
        kat::detail::concat("kat::cholesky_inverse (rocSOLVER rocsolver_", p, "potrf)");
    const std::string who_i =
        kat::detail::concat("kat::cholesky_inverse (rocSOLVER rocsolver_", p, "potri)");
    const rocblas_int n = checked_int(who_f.c_str(), "n", static_cast<std::int64_t>(A.extent(0)));
    const rocblas_handle h = rocsolver::handle(space.hip_stream(), who_f);
    const Kokkos::View<rocblas_int, rocsolver::HIPMem> info(
        "kat::cholesky_inverse::rocsolver_info");
    space.fence(); // the zero-initialization of `info` ran on the default instance

    rocsolver::check(rocsolver::potrf(h, n, A.data(), n, info.data()), who_f, "potrf");
    rocblas_int status = read_scalar(space, info);
    rocsolver::check_info(status, who_f);
    if (status > 0) {
      throw NumericalError(
          kat::detail::concat(who_f, ": A is not positive definite: the leading minor of order ",
                              status, " is not positive"));
    }
    rocsolver::check(rocsolver::potri(h, n, A.data(), n, info.data()), who_i, "potri");
    status = read_scalar(space, info);
    rocsolver::check_info(status, who_i);
    if (status > 0) {
      throw NumericalError(kat::detail::concat(who_i, ": A is singular: diagonal entry ", status,
                                               " of its Cholesky factor is zero"));
    }
    symmetrize_lower(space, A);
  }
};

} // namespace kat::linalg::detail

#endif // KOKKOS_ENABLE_HIP && KAT_ENABLE_ROCSOLVER
