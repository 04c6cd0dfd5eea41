#pragma once
/// @file
/// @brief kat::set_flush_denormals: flush-to-zero and denormals-are-zero on the host threads
/// that run KAT's kernels and the vendor libraries', so that subnormal numbers do not slow
/// training down.

#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include <cstdint>

namespace kat {

namespace detail {

#if defined(__SSE__) || defined(_M_X64)
/// MXCSR's FTZ (bit 15: subnormal results become zero) and DAZ (bit 6: subnormal operands
/// are read as zero).
constexpr unsigned mxcsr_flush_bits = 0x8040u;
#endif

/// Sets or clears subnormal flushing on the calling thread; false where this CPU family has
/// no such control in this build.
inline bool set_thread_flush_denormals(bool on) {
#if defined(__SSE__) || defined(_M_X64)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | mxcsr_flush_bits) : (csr & ~mxcsr_flush_bits));
  return true;
#elif defined(__aarch64__)
  std::uint64_t fpcr = 0;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  constexpr std::uint64_t fz = std::uint64_t(1) << 24; // FPCR.FZ: flush to zero
  fpcr = on ? (fpcr | fz) : (fpcr & ~fz);
  __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
  return true;
#else
  (void)on;
  return false;
#endif
}

/// Whether subnormal flushing is on for the calling thread (false where there is no control).
inline bool thread_flushes_denormals() {
#if defined(__SSE__) || defined(_M_X64)
  return (_mm_getcsr() & mxcsr_flush_bits) == mxcsr_flush_bits;
#elif defined(__aarch64__)
  std::uint64_t fpcr = 0;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr >> 24) & 1u;
#else
  return false;
#endif
}

} // namespace detail

/// Turns flushing of subnormal (denormal) floating-point numbers on or off for the host
/// threads that compute: the calling thread and, in a build with OpenMP, every thread of the
/// OpenMP pool, which Kokkos's OpenMP backend, oneDNN and OpenMP OpenBLAS share. On x86-64
/// it sets or clears MXCSR's flush-to-zero and denormals-are-zero bits, on AArch64 FPCR.FZ;
/// GPU kernels are not affected (their fp32 arithmetic runs at full speed on subnormals).
///
/// Why: on x86 cores an arithmetic instruction whose operand or result is subnormal (below
/// 2^-126 ≈ 1.18e-38 in fp32) takes a microcode assist of about a hundred cycles. Training
/// produces such numbers: SGD's momentum buffer of a parameter whose gradient has become
/// exactly zero (a dead ReLU unit) decays by the momentum every step, v ← 0.9 v, into the
/// subnormal range, and then stays at the smallest subnormal, 2^-149, since 0.9 · 2^-149
/// rounds back to it. In kat_train's CNN (SGD, momentum 0.9, bf16, Fashion-MNIST) the SGD step
/// took 19 % of a 3-epoch run so (2 % with flushing), epoch 3 24.2 s against epoch 1's 14.5 s
/// (docs/benchmarks.md, "Subnormal numbers"). With flushing on, such values become zero: a
/// change below 2^-126 in magnitude, far under the rounding error of any value it is added to
/// except zero and other subnormals. TensorFlow runs its kernels this way; PyTorch leaves it
/// to torch.set_flush_denormal(True).
///
/// kat::optim::SGD and kat::optim::Adam store their own state's subnormals as zero without
/// it; this covers every other kernel, KAT's and the vendor libraries'.
///
/// Call it after Kokkos::initialize, from the thread that launches the kernels; threads the
/// OpenMP runtime creates later (a larger parallel region) start with their creator's
/// setting on Linux. kat_train calls it with `--denormals flush` (its default).
///
/// @param on  true: subnormals are flushed to zero (results) and read as zero (operands);
///            false: IEEE 754 gradual underflow (the hardware's default).
/// @return false, changing nothing, where the CPU family has no such control in this build
/// (neither x86 SSE nor AArch64).
inline bool set_flush_denormals(bool on) {
  if (!detail::set_thread_flush_denormals(on)) {
    return false;
  }
#if defined(_OPENMP)
  // Every thread of the pool, the calling one (thread 0) included.
#pragma omp parallel num_threads(omp_get_max_threads())
  { detail::set_thread_flush_denormals(on); }
#endif
  return true;
}

/// Whether the calling thread flushes subnormals (see set_flush_denormals()).
inline bool flushes_denormals() { return detail::thread_flushes_denormals(); }

} // namespace kat
