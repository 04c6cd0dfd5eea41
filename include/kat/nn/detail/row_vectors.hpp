#pragma once
/// @file
/// @brief Kernels between a matrix's rows and one vector (biases, position embeddings): add or
/// fill the vector into every row, sum the rows; and the per-position view of a token batch.

#include "kat/core/detail/unrolled_sum.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat::nn::detail {

// The kernels as named functors, not extended lambdas: nvcc's wrapper of an extended lambda in a
// header is merged across translation units while its function pointers are not, which crashed
// kernels on the host (docs/backends.md).

/// y(i, j) = x(i, j) + e(j) (add_row_vector).
template <class M, class V> struct AddRowVector {
  M y;
  M x;
  V e;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    y(i, j) = x(i, j) + e(j);
  }
};

/// y(i, j) = e(j) (fill_rows).
template <class V, class M> struct FillRows {
  M y;
  V e;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    y(i, j) = e(j);
  }
};

/// v(j) = (v(j) +) Σ_i m(i, j) by one thread (column_sums): in kat::detail::unrolled_sum's
/// partial sums when Unrolled (a host), else the rows added in order (a GPU, up to 32 rows).
template <class M, class V, bool Unrolled> struct ColumnSum {
  using value = typename V::non_const_value_type;
  std::size_t rows;
  M m;
  V v;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t j) const {
    value sum = 0;
    if constexpr (Unrolled) {
      sum = kat::detail::unrolled_sum<value>(rows, [&](std::size_t i) { return m(i, j); });
    } else {
      for (std::size_t i = 0; i < rows; ++i) {
        sum += m(i, j);
      }
    }
    v(j) = accumulate ? v(j) + sum : sum;
  }
};

/// v(j) = (v(j) +) Σ_i m(i, j) by a team for column j (column_sums on a GPU beyond 32 rows).
template <class ExecSpace, class M, class V> struct ColumnSumTeam {
  using value = typename V::non_const_value_type;
  std::size_t rows;
  M m;
  V v;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void
  operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type &team) const {
    const std::size_t j = team.league_rank();
    value sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, rows), [&](const std::size_t i, value &s) { s += m(i, j); },
        sum);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { v(j) = accumulate ? v(j) + sum : sum; });
  }
};

/// y(i, j) = x(i, j) + e(j) for an N x F matrix and F values e.
template <class ExecSpace, class M, class V>
void add_row_vector(const ExecSpace &space, const char *label, const M &x, const V &e, const M &y) {
  Kokkos::parallel_for(label, matrix_policy(space, x.extent(0), x.extent(1)),
                       AddRowVector<M, V>{y, x, e});
}

/// y(i, j) = e(j) for every row i of y.
template <class ExecSpace, class V, class M>
void fill_rows(const ExecSpace &space, const char *label, const V &e, const M &y) {
  Kokkos::parallel_for(label, matrix_policy(space, y.extent(0), y.extent(1)), FillRows<V, M>{y, e});
}

/// v(j) = Σ_i m(i, j) (`accumulate` false) or v(j) += Σ_i m(i, j) (true), in a fixed order
/// of additions for a given backend. A thread per column on a host (unrolled partial sums); on
/// a GPU a thread per column (adding its rows in order) for up to 32 rows, and a team per
/// column beyond, with as many threads as rows rounded up to 64, at most 256. The batch is often
/// small (N = 8 rows of 196608 columns for a GPT-sized E_pos), where teams of Kokkos::AUTO's size
/// left most threads idle and a thread per column was ten times faster on an H100
/// (docs/benchmarks.md, "Kernel design choices, measured").
template <class ExecSpace, class M, class V>
void column_sums(const ExecSpace &space, const char *label, const M &m, const V &v,
                 bool accumulate) {
  const std::size_t rows = m.extent(0);
  constexpr bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  if (host || rows <= 32) {
    Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, m.extent(1)),
                         ColumnSum<M, V, host>{rows, m, v, accumulate});
    return;
  }
  using team_policy = Kokkos::TeamPolicy<ExecSpace>;
  const int team_size = rows <= 64 ? 64 : rows <= 128 ? 128 : 256;
  Kokkos::parallel_for(label, team_policy(space, m.extent(1), team_size),
                       ColumnSumTeam<ExecSpace, M, V>{rows, m, v, accumulate});
}

/// The N x cols·P batch matrix m as the (N·P) x cols matrix of its per-position rows (the same
/// memory; m contiguous and cols dividing its columns, which the caller checks).
template <class Scalar, class MemorySpace>
Matrix<Scalar, MemorySpace> position_rows(const Matrix<Scalar, MemorySpace> &m, std::size_t cols) {
  return Matrix<Scalar, MemorySpace>(m.data(), m.extent(0) * (m.extent(1) / cols), cols);
}

} // namespace kat::nn::detail
