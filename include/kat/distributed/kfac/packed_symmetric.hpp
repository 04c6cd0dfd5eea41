#pragma once
/// @file
/// @brief Packed symmetric storage of the distributed K-FAC strategies: a d x d symmetric
/// matrix as its upper triangle, d(d+1)/2 entries column by column. DKFAC all-reduces its factor
/// batch estimates and KAISA broadcasts its inverses in this form. Needs no MPI.

#include "kat/core/policy.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat::distributed {

namespace detail {

// The kernels of pack_upper and unpack_upper, as named functors rather than extended device
// lambdas: nvcc's wrapper of an extended lambda in a header is merged across translation
// units while its function pointers are not (docs/backends.md).

/// packed(j(j+1)/2 + i) = (b(i, j) + b(j, i)) / 2 for i <= j (pack_upper).
template <class MatrixView, class PackedView> struct PackUpper {
  using T = typename MatrixView::non_const_value_type;
  MatrixView b;
  PackedView packed;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    if (i <= j) {
      packed(j * (j + 1) / 2 + i) = T(0.5) * (b(i, j) + b(j, i));
    }
  }
};

/// b(i, j) = the packed entry of (min(i, j), max(i, j)) (unpack_upper).
template <class PackedView, class MatrixView> struct UnpackUpper {
  PackedView packed;
  MatrixView b;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    b(i, j) = i <= j ? packed(j * (j + 1) / 2 + i) : packed(i * (i + 1) / 2 + j);
  }
};

/// packed(j(j+1)/2 + i) = (b(i, j) + b(j, i)) / 2 for i <= j: the symmetrized upper triangle
/// of the d x d matrix b, column by column (packed: at least d(d+1)/2 entries).
template <class ExecSpace, class MatrixView, class PackedView>
void pack_upper(const ExecSpace &space, const MatrixView &b, const PackedView &packed) {
  Kokkos::parallel_for("kat::distributed::DKFAC::pack",
                       matrix_policy(space, b.extent(0), b.extent(1)),
                       PackUpper<MatrixView, PackedView>{b, packed});
}

/// The inverse of pack_upper: b(i, j) = b(j, i) = the packed entry of (min(i, j), max(i, j)).
template <class ExecSpace, class PackedView, class MatrixView>
void unpack_upper(const ExecSpace &space, const PackedView &packed, const MatrixView &b) {
  Kokkos::parallel_for("kat::distributed::DKFAC::unpack",
                       matrix_policy(space, b.extent(0), b.extent(1)),
                       UnpackUpper<PackedView, MatrixView>{packed, b});
}

} // namespace detail

} // namespace kat::distributed
