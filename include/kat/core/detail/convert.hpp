#pragma once
/// @file
/// @brief Element-wise copy between matrices of different scalar types.

#include "kat/core/policy.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat::detail {

/// dst(i, j) = src(i, j) converted to dst's scalar type (convert). A named functor rather than
/// an extended device lambda: nvcc's wrapper of an extended lambda in a header is merged across
/// translation units while its function pointers are not (docs/backends.md).
template <class Src, class Dst> struct ConvertMatrix {
  using value = typename Dst::non_const_value_type;
  Src src;
  Dst dst;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    dst(i, j) = static_cast<value>(src(i, j));
  }
};

/// dst(i, j) = src(i, j) converted to dst's scalar type, on `space`; both rank 2, same extents,
/// reachable from `space`. (Kokkos::deep_copy needs equal value types.)
template <class ExecSpace, class Src, class Dst>
void convert(const ExecSpace &space, const Src &src, const Dst &dst) {
  Kokkos::parallel_for("kat::convert", matrix_policy(space, src.extent(0), src.extent(1)),
                       ConvertMatrix<Src, Dst>{src, dst});
}

} // namespace kat::detail
