#pragma once
/// @file
/// @brief kat::gemm's host path for float: oneDNN's `dnnl_sgemm`, which generates its kernels
/// for the CPU it runs on (AVX2, AVX-512, AMX-capable cores alike), so the speed of KAT's host
/// products does not hinge on OpenBLAS recognizing the CPU (Debian's OpenBLAS 0.3.21 takes some
/// Sapphire Rapids machines for a "Prescott" core and runs training's small products ~3x
/// slower; see docs/backends.md). Products Aᵀ B over a long inner dimension (weight gradients)
/// run on oneDNN's matmul primitive instead where it has a `brg` kernel for them
/// (kat/core/detail/matmul_f32_onednn.hpp).
/// Double precision and views oneDNN cannot take (a first dimension with a stride) keep the
/// Kokkos Kernels path, i.e. the system BLAS.

#include "kat/core/detail/matmul_f32_onednn.hpp"
#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>

#if defined(KAT_ENABLE_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#endif

namespace kat::detail {

/// Whether kat::gemm computes `C = alpha op(A) op(B) + beta C` on `ExecSpace` through oneDNN in
/// this build: float views on an execution space whose memory the host can access, with KAT
/// built with KAT_ENABLE_ONEDNN.
template <class ExecSpace, class AView, class BView, class CView>
constexpr bool onednn_gemm_available() {
#if defined(KAT_ENABLE_ONEDNN)
  return std::is_same<typename AView::non_const_value_type, float>::value &&
         std::is_same<typename BView::non_const_value_type, float>::value &&
         std::is_same<typename CView::non_const_value_type, float>::value &&
         Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                    typename ExecSpace::memory_space>::accessible &&
         Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename CView::memory_space>::accessible;
#else
  return false;
#endif
}

/// The leading dimension BLAS expects for a rank-2 view whose first dimension is contiguous, or
/// 0 when it is not (a strided first dimension that no BLAS takes). A view with one column may
/// report any stride for its second dimension; BLAS only needs it to be at least the rows.
template <class View> std::size_t blas_leading_dimension(const View &v) {
  if (v.extent(0) > 1 && v.stride(0) != 1) {
    return 0;
  }
  const std::size_t rows = std::max<std::size_t>(1, v.extent(0));
  if (v.extent(1) <= 1) {
    return rows;
  }
  return v.stride(1) >= rows ? static_cast<std::size_t>(v.stride(1)) : 0;
}

#if defined(KAT_ENABLE_ONEDNN)
/// Column-major `C = alpha op(A) op(B) + beta C` (m x n, inner dimension k > 0; leading
/// dimensions lda, ldb, ldc) through oneDNN's row-major `dnnl_sgemm`, as the row-major
/// `C^T = op(B)^T op(A)^T`: onednn_gemm's path for all but Aᵀ B products with a long k.
/// @throws Error if oneDNN reports a failure.
inline void onednn_sgemm(char trans_a, char trans_b, std::size_t m, std::size_t n, std::size_t k,
                         float alpha, const float *A, std::size_t lda, const float *B,
                         std::size_t ldb, float beta, float *C, std::size_t ldc) {
  using dim = dnnl_dim_t;
  const dnnl_status_t status = dnnl_sgemm(trans_b, trans_a, dim(n), dim(m), dim(k), alpha, B,
                                          dim(ldb), A, dim(lda), beta, C, dim(ldc));
  if (status != dnnl_success) {
    throw Error(concat("kat::gemm: dnnl_sgemm(", trans_b, ", ", trans_a, ", n = ", n, ", m = ", m,
                       ", k = ", k, ", ldb = ", ldb, ", lda = ", lda, ", ldc = ", ldc,
                       ") returned oneDNN status ", int(status)));
  }
}
#endif

/// Column-major `C = alpha op(A) op(B) + beta C` (m x n, inner dimension k > 0) through oneDNN:
/// its matmul primitive for op(A) = Aᵀ, op(B) = B with a long k where it has a `brg` kernel
/// (onednn_f32_matmul_preferred), else its row-major `dnnl_sgemm`. A column-major matrix is the
/// row-major storage of its transpose, so the product is computed as the row-major
/// `C^T = op(B)^T op(A)^T`. oneDNN runs it on its own thread pool (Debian's build: OpenMP, the
/// runtime KAT's OpenMP backend shares) of `threads` threads (the plans' key).
/// @returns false, computing nothing, when a view's first dimension is strided or KAT is built
/// without oneDNN.
/// @throws Error if oneDNN reports a failure.
template <class AView, class BView, class CView>
bool onednn_gemm(char trans_a, char trans_b, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, const AView &A, const BView &B, float beta, const CView &C,
                 std::size_t threads) {
#if !defined(KAT_ENABLE_ONEDNN)
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)A, (void)B;
  (void)beta, (void)C, (void)threads;
  return false;
#else
  const std::size_t lda = blas_leading_dimension(A), ldb = blas_leading_dimension(B),
                    ldc = blas_leading_dimension(C);
  if (lda == 0 || ldb == 0 || ldc == 0) {
    return false;
  }
  if (onednn_f32_matmul_preferred(trans_a, trans_b, m, n, k)) {
    MatmulProblem p;
    p.trans_a = trans_a, p.trans_b = trans_b;
    p.m = m, p.n = n, p.k = k;
    p.lda = lda, p.ldb = ldb, p.ldc = ldc;
    p.alpha = alpha, p.beta = beta;
    p.threads = threads;
    OnednnF32MatmulPlan &plan = onednn_f32_matmul_plans().get(p);
    if (plan.usable()) {
      try {
        plan.run(A.data(), B.data(), C.data());
      } catch (const dnnl::error &e) {
        throw Error(concat("kat::gemm: oneDNN's f32 matmul failed for m = ", m, ", n = ", n,
                           ", k = ", k, ": ", e.what()));
      }
      return true;
    }
  }
  onednn_sgemm(trans_a, trans_b, m, n, k, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  return true;
#endif
}

} // namespace kat::detail
