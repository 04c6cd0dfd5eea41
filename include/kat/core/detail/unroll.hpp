#pragma once
/// @file
/// @brief Internal: KAT_IMPL_UNROLL, a request to unroll the next loop completely.

/// Placed before a loop with a small trip count known at compile time, asks the compiler to
/// unroll it completely (GCC's `#pragma GCC unroll`, Clang's and the device compilers'
/// `#pragma unroll`). A loop nest over a register tile needs it: GCC 12 kept a 2 x 4 tile of
/// accumulators in memory, a load and a store around every multiply-add, unless the loops
/// over the tile were unrolled before vectorization (docs/benchmarks.md, "Kernel design
/// choices, measured"). Empty in nvcc's host pass, whose front end passes neither form to g++
/// portably: there the loops stay loops, which is slower, not wrong.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__clang__)
#define KAT_IMPL_UNROLL _Pragma("unroll")
#elif defined(__NVCC__)
#define KAT_IMPL_UNROLL
#elif defined(__GNUC__)
#define KAT_IMPL_UNROLL _Pragma("GCC unroll 16")
#else
#define KAT_IMPL_UNROLL
#endif

/// Keeps a host function out of its callers (GCC's and Clang's `noinline` in a host pass; empty
/// in device passes, where a call costs more). GCC 12 allocated a register tile's accumulators
/// well in a function of its own and spilled them once it was inlined into the loops around it.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define KAT_IMPL_HOST_NOINLINE
#elif defined(__GNUC__)
#define KAT_IMPL_HOST_NOINLINE __attribute__((noinline))
#else
#define KAT_IMPL_HOST_NOINLINE
#endif
