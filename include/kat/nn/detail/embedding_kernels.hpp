#pragma once
/// @file
/// @brief The kernels of Embedding (id validation, gather, scatter-add) as named functors.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {
namespace nn {
namespace detail {

/// Whether `v` is a token id of a table of `count` rows: an integer in [0, count). NaN fails
/// the first comparison; the range is checked before the conversion, which is undefined for
/// values outside the integer's range.
template <class Scalar>
KOKKOS_INLINE_FUNCTION bool embedding_id_valid(Scalar v, std::size_t count) {
  return v >= Scalar(0) && v < static_cast<Scalar>(count) &&
         static_cast<Scalar>(static_cast<std::int64_t>(v)) == v;
}

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// sum += 1 if the id of token r is invalid (embedding_count_invalid).
template <class Scalar> struct EmbeddingCountInvalid {
  const Scalar *ids;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t r, std::size_t &sum) const {
    sum += embedding_id_valid(ids[r], count) ? 0 : 1;
  }
};

/// out(r, d) = table(id_r, d), both column-major (embedding_gather).
template <class Scalar> struct EmbeddingGather {
  Scalar *out;
  std::size_t tokens;
  const Scalar *table;
  const Scalar *ids;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t r, const std::size_t d) const {
    out[r + tokens * d] = table[static_cast<std::size_t>(ids[r]) + count * d];
  }
};

/// m = min(m, r) where the id of token r is invalid (with a Kokkos::Min reducer).
template <class Scalar> struct EmbeddingFirstInvalid {
  const Scalar *ids;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t r, std::size_t &m) const {
    if (!embedding_id_valid(ids[r], count) && r < m) {
      m = r;
    }
  }
};

/// table(id_r, d) += in(r, d), atomically (embedding_scatter_add).
template <class Scalar> struct EmbeddingScatterAdd {
  const Scalar *ids;
  Scalar *table;
  std::size_t count;
  const Scalar *in;
  std::size_t tokens;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t r, const std::size_t d) const {
    const std::size_t id = static_cast<std::size_t>(ids[r]);
    Kokkos::atomic_add(&table[id + count * d], in[r + tokens * d]);
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
