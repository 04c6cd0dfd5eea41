#pragma once
/// @file
/// @brief The kernel of count_correct as a named functor.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {
namespace nn {
namespace detail {

// Named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a header is merged
// across translation units while its function pointers are not, which crashed kernels on the
// host (docs/backends.md).

/// sum += 1 where row i's argmax (the lowest class on ties) equals labels(i) (count_correct).
template <class LogitsView, class LabelView> struct CountCorrect {
  LogitsView logits;
  LabelView labels;
  int classes;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, std::size_t &sum) const {
    int best = 0;
    for (int c = 1; c < classes; ++c) {
      if (logits(i, c) > logits(i, best)) {
        best = c;
      }
    }
    sum += best == labels(i) ? 1 : 0;
  }
};

} // namespace detail
} // namespace nn
} // namespace kat
