#pragma once
/// @file
/// @brief The kernels of Dense (the [x 1] copy, the weight mask) as named functors.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// a(i, j) = x(i, j) for j < in, 1 beyond (copy_with_ones_column).
template <class XView, class AView> struct CopyWithOnesColumn {
  using value = typename AView::non_const_value_type;
  AView a;
  std::size_t in;
  XView x;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    a(i, j) = j < in ? x(i, j) : value(1);
  }
};

/// dW[k] += mask[k] ? g[k] : 0, g loaded unconditionally (apply_weight_mask, accumulating).
template <class Value> struct MaskedGradientAdd {
  const Value *gp;
  Value *dp;
  const std::uint8_t *m;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t k) const {
    const Value gk = gp[k];
    dp[k] += m[k] != 0 ? gk : Value(0);
  }
};

/// dW[k] = mask[k] ? g[k] : 0, g loaded unconditionally (apply_weight_mask, overwriting).
template <class Value> struct MaskedGradientAssign {
  const Value *gp;
  Value *dp;
  const std::uint8_t *m;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t k) const {
    const Value gk = gp[k];
    dp[k] = m[k] != 0 ? gk : Value(0);
  }
};

/// sum += 1 where the mask m is nonzero (count_active).
template <class Mask> struct CountActive {
  Mask m;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t k, std::size_t &sum) const {
    sum += m(k) != 0 ? 1 : 0;
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
