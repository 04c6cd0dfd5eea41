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

// The calling thread's floating-point control register and its subnormal-flushing bits:
// x86's MXCSR with FTZ (bit 15: subnormal results become zero) and DAZ (bit 6: subnormal
// operands are read as zero), AArch64's FPCR with FZ (bit 24: both).
#if defined(__SSE__) || defined(_M_X64)
constexpr bool has_flush_control = true;
using FpControl = unsigned;
constexpr FpControl fp_flush_bits = 0x8040u;
inline FpControl read_fp_control() { return _mm_getcsr(); }
inline void write_fp_control(FpControl c) { _mm_setcsr(c); }
#elif defined(__aarch64__)
constexpr bool has_flush_control = true;
using FpControl = std::uint64_t;
constexpr FpControl fp_flush_bits = FpControl(1) << 24;
inline FpControl read_fp_control() {
  FpControl c = 0;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(c));
  return c;
}
inline void write_fp_control(FpControl c) { __asm__ __volatile__("msr fpcr, %0" : : "r"(c)); }
#else
constexpr bool has_flush_control = false;
using FpControl = unsigned;
constexpr FpControl fp_flush_bits = 0;
inline FpControl read_fp_control() { return 0; }
inline void write_fp_control(FpControl) {}
#endif

/// Sets or clears subnormal flushing on the calling thread (nothing without the control).
inline void set_thread_flush_denormals(bool on) {
  const FpControl c = read_fp_control();
  write_fp_control(on ? (c | fp_flush_bits) : (c & ~fp_flush_bits));
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
  if (!detail::has_flush_control) {
    return false;
  }
  detail::set_thread_flush_denormals(on);
#if defined(_OPENMP)
  // Every thread of the pool, the calling one (thread 0) included.
#pragma omp parallel num_threads(omp_get_max_threads())
  { detail::set_thread_flush_denormals(on); }
#endif
  return true;
}

/// Whether the calling thread flushes subnormals (see set_flush_denormals()).
inline bool flushes_denormals() {
  return detail::has_flush_control &&
         (detail::read_fp_control() & detail::fp_flush_bits) == detail::fp_flush_bits;
}

} // namespace kat
