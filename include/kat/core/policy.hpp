#pragma once
/// @file
/// @brief Execution policies shaped for KAT's column-major matrices.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat {

/// An MDRangePolicy over (rows, cols) of a LayoutLeft matrix, iterating the row index
/// fastest so consecutive work items touch consecutive memory.
template <class ExecSpace>
Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, Kokkos::Iterate::Left, Kokkos::Iterate::Left>>
matrix_policy(const ExecSpace &space, std::size_t rows, std::size_t cols) {
  using policy =
      Kokkos::MDRangePolicy<ExecSpace,
                            Kokkos::Rank<2, Kokkos::Iterate::Left, Kokkos::Iterate::Left>>;
  using index = typename policy::index_type;
  return policy(space, {index(0), index(0)}, {static_cast<index>(rows), static_cast<index>(cols)});
}

namespace detail {

/// Runs F on the indices [c·chunk, min((c + 1)·chunk, count)) of work item c, from a local copy
/// of F: its pointers are then locals a store through them cannot alias, and GCC vectorizes
/// the loop (with a run-time overlap check). Called once per index, F reads its pointers
/// through `this`, which any store of the kernel might change, and the loop stays scalar.
template <class F> struct ElementChunks {
  F f;
  std::size_t count;
  std::size_t chunk;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    const F local = f;
    const std::size_t begin = c * chunk;
    const std::size_t end = count - begin < chunk ? count : begin + chunk;
    for (std::size_t i = begin; i < end; ++i) {
      local(i);
    }
  }
};

} // namespace detail

/// Indices per work item of parallel_for_elements: 2048 on a host (a vectorized loop each), 1
/// on a GPU (consecutive threads on consecutive indices).
template <class ExecSpace> constexpr std::size_t element_chunk() {
  return Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible ? 2048 : 1;
}

/// Kokkos::parallel_for(label, RangePolicy(space, 0, count), f) for an element-wise kernel
/// f(i) over contiguous data: on a host, work items of element_chunk() consecutive indices, each
/// a loop GCC vectorizes (detail::ElementChunks); on a GPU, a thread per index.
template <class ExecSpace, class F>
void parallel_for_elements(const char *label, const ExecSpace &space, std::size_t count,
                           const F &f) {
  constexpr std::size_t chunk = element_chunk<ExecSpace>();
  if constexpr (chunk == 1) {
    Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, count), f);
  } else {
    Kokkos::parallel_for(label,
                         Kokkos::RangePolicy<ExecSpace>(space, 0, (count + chunk - 1) / chunk),
                         detail::ElementChunks<F>{f, count, chunk});
  }
}

} // namespace kat
