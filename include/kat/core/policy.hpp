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

} // namespace kat
