#pragma once
/// @file
/// @brief Internal: out = a ⊙ b over contiguous spans, as a named functor (a layer's backward
/// from a factor its forward kept: Dropout's mask scale, GELU's derivative).

#include "kat/core/policy.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat {
namespace nn {
namespace detail {

// A named functor, not an extended lambda: nvcc's wrapper of an extended lambda in a header is
// merged across translation units while its function pointers are not, which crashed kernels on
// the host (docs/backends.md).

/// out[i] = a[i] · b[i] (element_product).
template <class Scalar> struct ElementProduct {
  const Scalar *a;
  const Scalar *b;
  Scalar *out;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const { out[i] = a[i] * b[i]; }
};

/// out[i] = a[i] · b[i] for i < count (out may alias a or b).
template <class ExecSpace, class Scalar>
void element_product(const ExecSpace &space, const char *label, std::size_t count, const Scalar *a,
                     const Scalar *b, Scalar *out) {
  parallel_for_elements(label, space, count, ElementProduct<Scalar>{a, b, out});
}

} // namespace detail
} // namespace nn
} // namespace kat
