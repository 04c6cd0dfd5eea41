#pragma once
/// @file
/// @brief The element-wise sums of Residual as named functors.

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

} // namespace detail
} // namespace nn
} // namespace kat
