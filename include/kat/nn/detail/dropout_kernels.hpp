#pragma once
/// @file
/// @brief The kernels of Dropout (the mask draw, the mask product) as named functors.

#include "kat/core/random.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// s[i] = 0 with probability p (from counter_uniform(seed, call, i)), keep_scale otherwise;
/// y[i] = x[i] · s[i] (Dropout::forward).
template <class Scalar> struct DropoutForward {
  std::uint64_t seed;
  std::uint64_t call;
  double p;
  Scalar keep_scale;
  Scalar *sp;
  Scalar *yp;
  const Scalar *xp;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const Scalar s = counter_uniform(seed, call, i) < p ? Scalar(0) : keep_scale;
    sp[i] = s;
    yp[i] = xp[i] * s;
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
