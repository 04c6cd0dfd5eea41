#pragma once
/// @file
/// @brief The element-wise sums of Residual as named functors.

#include "kat/core/bfloat16.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// c[i] = max(0, a[i] + b[i]) (elementwise_add with relu).
template <class Value> struct ResidualAddRelu {
  const Value *ap;
  const Value *bp;
  Value *cp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const Value v = ap[i] + bp[i];
    cp[i] = v > Value(0) ? v : Value(0);
  }
};

/// c[i] = a[i] + b[i] (elementwise_add).
template <class Value> struct ResidualAdd {
  const Value *ap;
  const Value *bp;
  Value *cp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const { cp[i] = ap[i] + bp[i]; }
};

/// c[i] = a[i] + b[i] on bf16 values (a layout that stores bf16), or
/// max(0, a[i] + b[i]) with Relu: the sum of the two bf16 values in fp32, rounded once to bf16.
template <bool Relu> struct ResidualAddBf16 {
  const bfloat16 *ap;
  const bfloat16 *bp;
  bfloat16 *cp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const float v = ap[i].to_float() + bp[i].to_float();
    cp[i] = bfloat16::from_float(Relu ? (v > 0.0f ? v : 0.0f) : v);
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
