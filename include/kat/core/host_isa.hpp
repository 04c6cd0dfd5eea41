#pragma once
/// @file
/// @brief kat::HostVectorIsa: the vector instructions KAT's own host loops run with, chosen at
/// run time, and detail::host_parallel_for, the launch that honours it.
///
/// KAT's element-wise host kernels (GELU, the activations, residual sums, bf16 rounding,
/// LayerNorm's row blocks, and attention's forward and backward in float, whose register tiles
/// hold 8 samples a vector and 16 in the AVX-512 copy: kat/nn/detail/attention_kernels.hpp)
/// are loops written for the compiler to vectorize, so their speed is
/// set by the instruction set they are compiled for. A build for `-march=x86-64-v3` (AVX2 and
/// FMA, 8 floats a vector: what the project's scripts use, and what runs on every x86-64 CPU
/// since 2015) also compiles each of those loops a second time for AVX-512 (16 floats a vector:
/// AVX512F, BW, CD, DQ, VL, as `-march=x86-64-v4`) and runs that copy where the CPU has AVX-512
/// (AMD Zen 4 and later, Intel Skylake-SP and later), as oneDNN and OpenBLAS choose their
/// kernels. Both copies do the same float operations per element in the same order (FMA
/// contracted alike: both ISAs have it), so the results are bit-identical on every CPU
/// (tests/host_isa/test_host_isa.cpp); only the time differs (docs/backends.md, "The host's
/// vector instructions").
///
/// The second copy exists where the translation unit is compiled by GCC or Clang for x86-64
/// with AVX2 and FMA and without AVX-512 (with `-march=x86-64-v4` or `native` on an AVX-512
/// CPU the one copy is already AVX-512), outside CUDA and HIP compilations; elsewhere
/// host_parallel_for is Kokkos::parallel_for. Define KAT_NO_HOST_ISA_DISPATCH to leave it out.

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdlib>
#include <string>

/// 1 where kat::detail::cpu_has_avx512 can ask the CPU (GCC's or Clang's
/// __builtin_cpu_supports, host compilations for x86-64), else 0.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && !defined(__HIPCC__) &&     \
    !defined(__NVCOMPILER) && !defined(__SYCL_DEVICE_ONLY__)
#define KAT_IMPL_HOST_CPU_QUERY 1
#else
#define KAT_IMPL_HOST_CPU_QUERY 0
#endif

/// 1 where this translation unit compiles the vectorized host loops a second time for AVX-512
/// (see the file comment), else 0.
#if KAT_IMPL_HOST_CPU_QUERY && defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) &&   \
    !defined(KAT_NO_HOST_ISA_DISPATCH)
#define KAT_HOST_ISA_DISPATCH 1
/// A function compiled for AVX-512 (x86-64-v4's extensions, 512-bit vectors preferred).
#if defined(__clang__)
#define KAT_IMPL_AVX512_TARGET                                                                     \
  __attribute__((target("avx512f,avx512bw,avx512cd,avx512dq,avx512vl")))
#else
#define KAT_IMPL_AVX512_TARGET                                                                     \
  __attribute__((target("avx512f,avx512bw,avx512cd,avx512dq,avx512vl,prefer-vector-width=512")))
#endif
/// A function compiled for AVX-512 with every call in it inlined (but noinline functions').
#define KAT_IMPL_AVX512_LOOP KAT_IMPL_AVX512_TARGET __attribute__((flatten))
#else
#define KAT_HOST_ISA_DISPATCH 0
#endif

namespace kat {

/// Which copy of KAT's vectorized host loops runs (see the file comment).
enum class HostVectorIsa {
  compiled, ///< the instructions the code was compiled for (`-march`; x86-64-v3: AVX2, FMA)
  avx512,   ///< AVX-512 (F, BW, CD, DQ, VL), where the CPU has it and the build carries the copy
};

/// "compiled" or "avx512".
inline const char *host_vector_isa_name(HostVectorIsa isa) {
  return isa == HostVectorIsa::avx512 ? "avx512" : "compiled";
}

namespace detail {

/// Whether the CPU (and the operating system, which must save the AVX-512 registers) can run
/// AVX-512 F, BW, CD, DQ and VL instructions: the x86-64-v4 level.
inline bool cpu_has_avx512() {
#if KAT_IMPL_HOST_CPU_QUERY
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

/// The process's choice: KAT_HOST_ISA from the environment where set ("compiled" or
/// "avx512"), else avx512 where the CPU has it. Read once, at the first host launch.
/// @throws ValueError if KAT_HOST_ISA is another value, or "avx512" on a CPU without it.
inline HostVectorIsa initial_host_vector_isa() {
  const bool avx512 = cpu_has_avx512();
  const char *env = std::getenv("KAT_HOST_ISA");
  if (env == nullptr || *env == '\0') {
    return avx512 ? HostVectorIsa::avx512 : HostVectorIsa::compiled;
  }
  const std::string value(env);
  if (value == "compiled") {
    return HostVectorIsa::compiled;
  }
  if (value != "avx512") {
    throw ValueError(concat("KAT_HOST_ISA must be 'compiled' or 'avx512', got '", value, "'"));
  }
  if (!avx512) {
    throw ValueError("KAT_HOST_ISA: 'avx512' requested, but this CPU lacks AVX-512 (F, BW, CD, "
                     "DQ and VL)");
  }
  return HostVectorIsa::avx512;
}

/// The one state behind host_vector_isa() and set_host_vector_isa().
inline HostVectorIsa &host_vector_isa_state() {
  static HostVectorIsa isa = initial_host_vector_isa();
  return isa;
}

} // namespace detail

/// The copy of the vectorized host loops launches use from now on: avx512 where the CPU has
/// AVX-512 (unless KAT_HOST_ISA says otherwise), else compiled. Translation units without the
/// AVX-512 copy (see the file comment) run their compiled loops whatever this says.
/// @throws ValueError on the first call, if KAT_HOST_ISA holds a value it cannot honour.
inline HostVectorIsa host_vector_isa() { return detail::host_vector_isa_state(); }

/// Chooses the copy of the vectorized host loops for later launches (for comparing them; both
/// give the same bits). Not to be called while a kernel runs.
/// @throws ValueError if `isa` is avx512 and the CPU lacks AVX-512.
inline void set_host_vector_isa(HostVectorIsa isa) {
  if (isa == HostVectorIsa::avx512 && !detail::cpu_has_avx512()) {
    throw ValueError("kat::set_host_vector_isa: isa must be 'compiled' on this CPU (no "
                     "AVX-512 F, BW, CD, DQ and VL), got 'avx512'");
  }
  detail::host_vector_isa_state() = isa;
}

namespace detail {

#if KAT_HOST_ISA_DISPATCH
/// f(i), compiled for AVX-512: `flatten` inlines f's whole body (the vectorizable loop of a
/// work item) into this function of the wider target, where it is vectorized again.
template <class F> struct Avx512Loop {
  F f;
  KAT_IMPL_AVX512_LOOP void operator()(const std::size_t i) const { f(i); }
};
#endif

/// Kokkos::parallel_for(label, RangePolicy(space, 0, count), f) for work items that are
/// vectorizable host loops (f(i) for i in [0, count)): on a host space, with the copy of f
/// compiled for host_vector_isa() (see the file comment).
template <class ExecSpace, class F>
void host_parallel_for(const char *label, const ExecSpace &space, std::size_t count, const F &f) {
#if KAT_HOST_ISA_DISPATCH
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    if (host_vector_isa() == HostVectorIsa::avx512) {
      Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, count),
                           Avx512Loop<F>{f});
      return;
    }
  }
#endif
  Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, count), f);
}

} // namespace detail

} // namespace kat
