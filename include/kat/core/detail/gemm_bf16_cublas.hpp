#pragma once
/// @file
/// @brief cuBLAS's bf16 GEMM with fp32 accumulation (cublasGemmEx, CUDA_R_16BF operands,
/// CUDA_R_32F result, CUBLAS_COMPUTE_32F), for kat::MixedPrecisionGemm on CUDA memory.
/// Compiled only with KOKKOS_ENABLE_CUDA and KAT_ENABLE_CUBLAS (the CMake option of that name
/// defines it and links CUDA::cublas); elsewhere MixedPrecisionGemm takes its portable path.

#include "kat/core/bfloat16.hpp"

#include <Kokkos_Core.hpp>

#include <climits>
#include <cstddef>
#include <type_traits>

#if defined(KOKKOS_ENABLE_CUDA) && defined(KAT_ENABLE_CUBLAS)
#include "kat/core/error.hpp"

#include <cublas_v2.h>
#endif

namespace kat::detail {

/// Whether cuBLAS's bf16 GEMM serves a product issued on ExecSpace into memory MemorySpace in
/// this build: float, Kokkos::Cuda, memory the device can access, KAT built with
/// KAT_ENABLE_CUBLAS.
template <class ExecSpace, class Scalar, class MemorySpace> constexpr bool cublas_bf16_available() {
#if defined(KOKKOS_ENABLE_CUDA) && defined(KAT_ENABLE_CUBLAS)
  return std::is_same<Scalar, float>::value && std::is_same<ExecSpace, Kokkos::Cuda>::value &&
         Kokkos::SpaceAccessibility<Kokkos::Cuda, MemorySpace>::accessible;
#else
  return false;
#endif
}

/// Whether a MixedPrecisionGemm can hand bf16 storage of MemorySpace to cuBLAS.
template <class Scalar, class MemorySpace> constexpr bool cublas_bf16_memory() {
#if defined(KOKKOS_ENABLE_CUDA) && defined(KAT_ENABLE_CUBLAS)
  return cublas_bf16_available<Kokkos::Cuda, Scalar, MemorySpace>();
#else
  return false;
#endif
}

#if defined(KOKKOS_ENABLE_CUDA) && defined(KAT_ENABLE_CUBLAS)
namespace cublas {

inline void check(cublasStatus_t status, const char *call, std::size_t m, std::size_t n,
                  std::size_t k) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(concat("kat::MixedPrecisionGemm: ", call, " returned cublasStatus_t ",
                       static_cast<int>(status), " for m = ", m, ", n = ", n, ", k = ", k));
  }
}

/// This host thread's cuBLAS handle, bound to `stream`. Created once per host thread (a
/// handle must not be used by two threads at once; creating one allocates device resources)
/// and deliberately never destroyed: a static destructor would run after Kokkos::finalize and
/// the CUDA context's teardown, where cublasDestroy is undefined. The process exit reclaims it.
inline cublasHandle_t handle(cudaStream_t stream) {
  static thread_local cublasHandle_t h = [] {
    cublasHandle_t created = nullptr;
    check(cublasCreate(&created), "cublasCreate", 0, 0, 0);
    return created;
  }();
  check(cublasSetStream(h, stream), "cublasSetStream", 0, 0, 0);
  return h;
}

/// Whether every size fits the 32-bit integers of cublasGemmEx.
inline bool fits_int(std::size_t m, std::size_t n, std::size_t k, std::size_t lda, std::size_t ldb,
                     std::size_t ldc) {
  const std::size_t limit = INT_MAX;
  return m <= limit && n <= limit && k <= limit && lda <= limit && ldb <= limit && ldc <= limit;
}

/// `C = alpha op(A) op(B) + beta C` on `stream`: A and B column-major kat::bfloat16 (bit
/// patterns of CUDA_R_16BF) with leading dimensions lda and ldb, C column-major float.
/// Products summed in fp32 (CUBLAS_COMPUTE_32F) on the tensor cores.
/// @throws Error if cuBLAS reports a failure.
inline void gemm_bf16(cudaStream_t stream, char trans_a, char trans_b, std::size_t m, std::size_t n,
                      std::size_t k, float alpha, const bfloat16 *A, std::size_t lda,
                      const bfloat16 *B, std::size_t ldb, float beta, float *C, std::size_t ldc) {
  static_assert(sizeof(bfloat16) == 2, "kat::bfloat16 must be the 16 bits of CUDA_R_16BF");
  const auto op = [](char t) { return t == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; };
  check(cublasGemmEx(handle(stream), op(trans_a), op(trans_b), static_cast<int>(m),
                     static_cast<int>(n), static_cast<int>(k), &alpha, A, CUDA_R_16BF,
                     static_cast<int>(lda), B, CUDA_R_16BF, static_cast<int>(ldb), &beta, C,
                     CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (bf16 operands, fp32 accumulation)", m, n, k);
}

} // namespace cublas
#endif

} // namespace kat::detail
