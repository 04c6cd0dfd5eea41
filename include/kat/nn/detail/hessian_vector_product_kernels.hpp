#pragma once
/// @file
/// @brief The kernel of the Hessian-vector product's vector conversion as a named functor.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// to(i) = from(i) converted to To's value type (convert_vector).
template <class From, class To> struct ConvertVector {
  using value = typename To::non_const_value_type;
  To to;
  From from;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    to(i) = static_cast<value>(from(i));
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
