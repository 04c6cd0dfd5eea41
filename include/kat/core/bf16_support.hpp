#pragma once
/// @file
/// @brief kat::bf16_support: what computes the bf16 products of Precision::bf16 in this build
/// on this machine, so that a program can say so (kat_train prints it).

#include "kat/core/detail/gemm_bf16_cublas.hpp"
#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <string>

#if defined(KAT_ENABLE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kat {

/// What computes the bf16 products of a float model in Precision::bf16 (docs/precision.md).
struct Bf16Support {
  /// Whether hardware made for bf16 computes them: a CPU's AMX tiles or AVX512-BF16
  /// instructions (through oneDNN), or a GPU's tensor cores (through cuBLAS). False where
  /// oneDNN emulates bf16 on a CPU without such units, or where the portable path rounds the
  /// operands and multiplies in fp32: bf16 then gives fp32's speed at best, and oneDNN's
  /// emulation is several times slower than fp32 (docs/benchmarks.md).
  bool native = false;
  /// The units and the library, for a user, e.g. "AMX tiles (oneDNN)".
  std::string description;
};

/// What computes bf16 products of float views in MemorySpace: CUDA memory in a build with
/// KAT_ENABLE_CUBLAS, the tensor cores; host memory in a build with KAT_ENABLE_ONEDNN, the
/// best bf16 unit oneDNN finds on this CPU (dnnl::get_effective_cpu_isa(), which the
/// environment variable ONEDNN_MAX_CPU_ISA may lower); elsewhere the portable path.
template <class MemorySpace = DefaultMemorySpace> Bf16Support bf16_support() {
  if constexpr (detail::cublas_bf16_memory<float, MemorySpace>()) {
    return {true, "tensor cores (cuBLAS cublasGemmEx: bf16 operands, fp32 accumulation)"};
  } else if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
#if defined(KAT_ENABLE_ONEDNN)
    // oneDNN's ISA values are nested bit sets: AMX includes AVX512-BF16's bits.
    const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
    const auto has = [isa](dnnl::cpu_isa wanted) {
      const int bits = static_cast<int>(wanted);
      return (isa & bits) == bits;
    };
    if (has(dnnl::cpu_isa::avx512_core_amx)) {
      return {true, "AMX tiles (oneDNN)"};
    }
    if (has(dnnl::cpu_isa::avx512_core_bf16)) {
      return {true, "AVX512-BF16 instructions (oneDNN)"};
    }
    if (has(dnnl::cpu_isa::avx512_core)) {
      return {false, "no bf16 unit on this CPU (neither AMX nor AVX512-BF16 for oneDNN): oneDNN "
                     "emulates bf16 with AVX-512, several times slower than fp32"};
    }
    // oneDNN 2.x has no bf16 kernel below AVX-512: each layer falls back to the portable path.
    return {false, "no bf16 unit on this CPU (no AVX-512, where oneDNN 2.x has no bf16 "
                   "kernels): the operands are rounded to bf16 and multiplied in fp32, no faster "
                   "than fp32"};
#else
    return {false, "no bf16 library in this build (KAT without oneDNN): the operands are "
                   "rounded to bf16 and multiplied in fp32, no faster than fp32"};
#endif
  } else {
    return {false, "no bf16 library for this memory space in this build: the operands are "
                   "rounded to bf16 and multiplied in fp32, no faster than fp32"};
  }
}

} // namespace kat
