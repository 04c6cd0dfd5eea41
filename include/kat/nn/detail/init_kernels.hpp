#pragma once
/// @file
/// @brief The kernel of uniform_ as a named functor.

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

/// v(i) = low + width · counter_uniform(seed, stream, i), as View's value type (uniform_).
template <class View> struct UniformFill {
  // Not named value_type, which Kokkos reads as a reduction's.
  using Value = typename View::non_const_value_type;
  View v;
  double low;
  double width;
  std::uint64_t seed;
  std::uint64_t stream;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    v(i) = static_cast<Value>(low + width * counter_uniform(seed, stream, i));
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
