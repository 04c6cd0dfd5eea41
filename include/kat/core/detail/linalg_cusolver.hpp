#pragma once
/// @file
/// @brief cuSOLVER specializations of kat::symmetric_eigen (cusolverDn<t>syevd) and
/// kat::cholesky_inverse (cusolverDn<t>potrf + cusolverDn<t>potri) for views in
/// Kokkos::CudaSpace. Compiled only with KOKKOS_ENABLE_CUDA and KAT_ENABLE_CUSOLVER (the CMake
/// option of that name defines it and links CUDA::cusolver); otherwise CudaSpace views use
/// the portable implementation.

#include "kat/core/detail/linalg_portable.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(KAT_ENABLE_CUSOLVER)

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <cusolverDn.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace kat::linalg::detail {
namespace cusolver {

inline void check(cusolverStatus_t status, const std::string &who, const char *call) {
  if (status != CUSOLVER_STATUS_SUCCESS) {
    throw Error(kat::detail::concat(who, ": ", call, " returned cusolverStatus_t ",
                                    static_cast<int>(status)));
  }
}

/// This host thread's cuSOLVER handle, bound to `stream`.
///
/// cusolverDnCreate allocates device resources and costs far more than a K-FAC-sized solve, so
/// the handle is created once per host thread (thread_local: a handle must not be used by two
/// threads at once, and each call rebinds its stream). It is deliberately never destroyed: a
/// static destructor would run after Kokkos::finalize and the CUDA context teardown, where
/// cusolverDnDestroy is undefined; the process exit reclaims it.
inline cusolverDnHandle_t handle(cudaStream_t stream, const std::string &who) {
  static thread_local cusolverDnHandle_t h = [&who] {
    cusolverDnHandle_t created = nullptr;
    check(cusolverDnCreate(&created), who, "cusolverDnCreate");
    return created;
  }();
  check(cusolverDnSetStream(h, stream), who, "cusolverDnSetStream");
  return h;
}

// Overloads on the scalar type; eigenvectors wanted, lower triangle stored.
inline cusolverStatus_t syevd_buffer_size(cusolverDnHandle_t h, int n, const float *a, int lda,
                                          const float *w, int *lwork) {
  return cusolverDnSsyevd_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, a, lda,
                                     w, lwork);
}
inline cusolverStatus_t syevd_buffer_size(cusolverDnHandle_t h, int n, const double *a, int lda,
                                          const double *w, int *lwork) {
  return cusolverDnDsyevd_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, a, lda,
                                     w, lwork);
}
inline cusolverStatus_t syevd(cusolverDnHandle_t h, int n, float *a, int lda, float *w, float *work,
                              int lwork, int *info) {
  return cusolverDnSsyevd(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, a, lda, w, work,
                          lwork, info);
}
inline cusolverStatus_t syevd(cusolverDnHandle_t h, int n, double *a, int lda, double *w,
                              double *work, int lwork, int *info) {
  return cusolverDnDsyevd(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n, a, lda, w, work,
                          lwork, info);
}
inline cusolverStatus_t potrf_buffer_size(cusolverDnHandle_t h, int n, float *a, int lda,
                                          int *lwork) {
  return cusolverDnSpotrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, lwork);
}
inline cusolverStatus_t potrf_buffer_size(cusolverDnHandle_t h, int n, double *a, int lda,
                                          int *lwork) {
  return cusolverDnDpotrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, lwork);
}
inline cusolverStatus_t potrf(cusolverDnHandle_t h, int n, float *a, int lda, float *work,
                              int lwork, int *info) {
  return cusolverDnSpotrf(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, work, lwork, info);
}
inline cusolverStatus_t potrf(cusolverDnHandle_t h, int n, double *a, int lda, double *work,
                              int lwork, int *info) {
  return cusolverDnDpotrf(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, work, lwork, info);
}
inline cusolverStatus_t potri_buffer_size(cusolverDnHandle_t h, int n, float *a, int lda,
                                          int *lwork) {
  return cusolverDnSpotri_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, lwork);
}
inline cusolverStatus_t potri_buffer_size(cusolverDnHandle_t h, int n, double *a, int lda,
                                          int *lwork) {
  return cusolverDnDpotri_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, lwork);
}
inline cusolverStatus_t potri(cusolverDnHandle_t h, int n, float *a, int lda, float *work,
                              int lwork, int *info) {
  return cusolverDnSpotri(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, work, lwork, info);
}
inline cusolverStatus_t potri(cusolverDnHandle_t h, int n, double *a, int lda, double *work,
                              int lwork, int *info) {
  return cusolverDnDpotri(h, CUBLAS_FILL_MODE_LOWER, n, a, lda, work, lwork, info);
}

template <class ExecSpace> void require_cuda_space() {
  static_assert(std::is_same<ExecSpace, Kokkos::Cuda>::value,
                "kat::linalg (cuSOLVER): views in Kokkos::CudaSpace need a Kokkos::Cuda "
                "execution space instance, whose stream the solver runs on");
}

} // namespace cusolver

/// cusolverDn<t>syevd on CUDA memory, on the stream of the Kokkos::Cuda instance.
template <> struct SymmetricEigen<Kokkos::CudaSpace> {
  static constexpr bool is_vendor = true;
  template <class Scalar> static std::string routine() {
    return std::string("cuSOLVER cusolverDn") + (std::is_same<Scalar, float>::value ? "S" : "D") +
           "syevd";
  }
  template <class ExecSpace, class AView, class WView>
  static void run(const ExecSpace &space, const AView &A, const WView &w) {
    cusolver::require_cuda_space<ExecSpace>();
    using Scalar = typename AView::non_const_value_type;
    const std::string who = "kat::symmetric_eigen (" + routine<Scalar>() + ")";
    const int n = checked_int(who.c_str(), "n", static_cast<std::int64_t>(A.extent(0)));
    const cusolverDnHandle_t h = cusolver::handle(space.cuda_stream(), who);
    int lwork = 0;
    cusolver::check(cusolver::syevd_buffer_size(h, n, A.data(), n, w.data(), &lwork), who,
                    "bufferSize");
    const Kokkos::View<Scalar *, Kokkos::CudaSpace> work(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::symmetric_eigen::cusolver_work"),
        static_cast<std::size_t>(std::max(lwork, 1)));
    const Kokkos::View<int, Kokkos::CudaSpace> info("kat::symmetric_eigen::cusolver_info");
    space.fence(); // the zero-initialization of `info` ran on the default instance
    cusolver::check(cusolver::syevd(h, n, A.data(), n, w.data(), work.data(), lwork, info.data()),
                    who, "syevd");
    const int status = read_scalar(space, info);
    if (status < 0) {
      throw Error(kat::detail::concat(who, ": argument ", -status,
                                      " is invalid (a bug in KAT; please report it)"));
    }
    if (status > 0) {
      throw NumericalError(kat::detail::concat(
          who, ": the eigen solver failed to converge (devInfo = ", status, ": ", status,
          " off-diagonal elements of the intermediate tridiagonal form did not converge)"));
    }
  }
};

/// cusolverDn<t>potrf + cusolverDn<t>potri on CUDA memory; lower triangle copied to upper.
template <> struct CholeskyInverse<Kokkos::CudaSpace> {
  static constexpr bool is_vendor = true;
  template <class Scalar> static std::string routine() {
    const char *t = std::is_same<Scalar, float>::value ? "S" : "D";
    return std::string("cuSOLVER cusolverDn") + t + "potrf/cusolverDn" + t + "potri";
  }
  template <class ExecSpace, class AView> static void run(const ExecSpace &space, const AView &A) {
    cusolver::require_cuda_space<ExecSpace>();
    using Scalar = typename AView::non_const_value_type;
    const char *t = std::is_same<Scalar, float>::value ? "S" : "D";
    const std::string who_f =
        kat::detail::concat("kat::cholesky_inverse (cuSOLVER cusolverDn", t, "potrf)");
    const std::string who_i =
        kat::detail::concat("kat::cholesky_inverse (cuSOLVER cusolverDn", t, "potri)");
    const int n = checked_int(who_f.c_str(), "n", static_cast<std::int64_t>(A.extent(0)));
    const cusolverDnHandle_t h = cusolver::handle(space.cuda_stream(), who_f);
    int lwork_f = 0, lwork_i = 0;
    cusolver::check(cusolver::potrf_buffer_size(h, n, A.data(), n, &lwork_f), who_f, "bufferSize");
    cusolver::check(cusolver::potri_buffer_size(h, n, A.data(), n, &lwork_i), who_i, "bufferSize");
    const int lwork = std::max({lwork_f, lwork_i, 1});
    const Kokkos::View<Scalar *, Kokkos::CudaSpace> work(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::cholesky_inverse::cusolver_work"),
        static_cast<std::size_t>(lwork));
    const Kokkos::View<int, Kokkos::CudaSpace> info("kat::cholesky_inverse::cusolver_info");
    space.fence(); // the zero-initialization of `info` ran on the default instance

    cusolver::check(cusolver::potrf(h, n, A.data(), n, work.data(), lwork, info.data()), who_f,
                    "potrf");
    int status = read_scalar(space, info);
    if (status < 0) {
      throw Error(kat::detail::concat(who_f, ": argument ", -status,
                                      " is invalid (a bug in KAT; please report it)"));
    }
    if (status > 0) {
      throw NumericalError(
          kat::detail::concat(who_f, ": A is not positive definite: the leading minor of order ",
                              status, " is not positive"));
    }
    cusolver::check(cusolver::potri(h, n, A.data(), n, work.data(), lwork, info.data()), who_i,
                    "potri");
    status = read_scalar(space, info);
    if (status < 0) {
      throw Error(kat::detail::concat(who_i, ": argument ", -status,
                                      " is invalid (a bug in KAT; please report it)"));
    }
    if (status > 0) {
      throw NumericalError(kat::detail::concat(who_i, ": A is singular: diagonal entry ", status,
                                               " of its Cholesky factor is zero"));
    }
    symmetrize_lower(space, A);
  }
};

} // namespace kat::linalg::detail

#endif // KOKKOS_ENABLE_CUDA && KAT_ENABLE_CUSOLVER
