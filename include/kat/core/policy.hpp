#pragma once
/// @file
/// @brief Execution policies shaped for KAT's column-major matrices.

#include "kat/core/host_isa.hpp"

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

/// Runs F(i, j) on rows [r·chunk, min((r + 1)·chunk, rows)) of column j for work item
/// j·row_chunks + r, from a local copy of F (as ElementChunks): a contiguous, vectorizable loop
/// down a column of a LayoutLeft matrix.
template <class F> struct MatrixColumnChunks {
  F f;
  std::size_t rows;
  std::size_t chunk;
  std::size_t row_chunks;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t item) const {
    const F local = f;
    const std::size_t j = item / row_chunks;
    const std::size_t begin = (item % row_chunks) * chunk;
    const std::size_t end = rows - begin < chunk ? rows : begin + chunk;
    for (std::size_t i = begin; i < end; ++i) {
      local(i, j);
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
    detail::host_parallel_for(label, space, (count + chunk - 1) / chunk,
                              detail::ElementChunks<F>{f, count, chunk});
  }
}

/// Kokkos::parallel_for(label, matrix_policy(space, rows, cols), f) for a kernel f(i, j) over
/// the elements of LayoutLeft matrices: on a host, work items of up to element_chunk() rows of
/// one column, each a contiguous loop from a local copy of f, which GCC can vectorize
/// (detail::MatrixColumnChunks); on a GPU, matrix_policy.
template <class ExecSpace, class F>
void parallel_for_matrix(const char *label, const ExecSpace &space, std::size_t rows,
                         std::size_t cols, const F &f) {
  constexpr std::size_t chunk = element_chunk<ExecSpace>();
  if constexpr (chunk == 1) {
    Kokkos::parallel_for(label, matrix_policy(space, rows, cols), f);
  } else {
    const std::size_t row_chunks = (rows + chunk - 1) / chunk;
    detail::host_parallel_for(label, space, cols * row_chunks,
                              detail::MatrixColumnChunks<F>{f, rows, chunk, row_chunks});
  }
}

} // namespace kat
