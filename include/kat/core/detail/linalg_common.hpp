#pragma once
/// @file
/// @brief Internals shared by every implementation of kat::symmetric_eigen and
/// kat::cholesky_inverse: finiteness scans, symmetrization, device-scalar read-back, and the
/// checks that vendor libraries' 32-bit integer interfaces can take the problem.

#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/policy.hpp"

#include <Kokkos_Core.hpp>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace kat::linalg::detail {

/// Name prefix of a vendor routine for Scalar: "s" for float, "d" for double.
template <class Scalar> constexpr const char *blas_prefix() {
  return std::is_same<Scalar, float>::value ? "s" : "d";
}

// The kernels below are named functors rather than extended device lambdas: nvcc's wrapper of
// an extended lambda in a header is merged across translation units while its function
// pointers are not (docs/backends.md).

/// The smallest flat index k whose entry is not finite (only lower-triangle entries of the
/// column-major rows x ... matrix when lower_only), as a Kokkos::Min reduction.
template <class FlatView> struct FirstNonfinite {
  FlatView flat;
  std::int64_t rows;
  bool lower_only;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t k, std::int64_t &m) const {
    if (lower_only && k % rows < k / rows) {
      return;
    }
    if (!kat::math::isfinite(flat(k)) && k < m) {
      m = k;
    }
  }
};

/// a(j, i) = a(i, j) for i > j.
template <class AView> struct SymmetrizeLower {
  AView a;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, const std::int64_t j) const {
    if (i > j) {
      a(j, i) = a(i, j);
    }
  }
};

/// The value of the rank-0 view v, as a one-element reduction.
template <class View> struct ReadScalar {
  using Value = typename View::non_const_value_type;
  View v;

  KOKKOS_INLINE_FUNCTION void operator()(const int, Value &r) const { r = v(); }
};

/// Linear column-major index of the first non-finite entry of `view` (rank 1 or 2), looking
/// only at the lower triangle (i >= j) of a rank-2 view when `lower_only`; -1 if all are
/// finite. Runs as one reduction on `space`; only the index comes back to the host.
template <class ExecSpace, class View>
std::int64_t first_nonfinite(const ExecSpace &space, const View &view, bool lower_only) {
  using value_type = typename View::non_const_value_type;
  const std::int64_t rows = static_cast<std::int64_t>(view.extent(0));
  const std::int64_t total = static_cast<std::int64_t>(view.size());
  if (total == 0) {
    return -1;
  }
  // A contiguous view seen as a flat vector, so rank 1 and rank 2 share one kernel.
  using FlatView = Kokkos::View<const value_type *, Kokkos::LayoutLeft, typename View::memory_space,
                                Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const FlatView flat(view.data(), static_cast<std::size_t>(total));
  constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  std::int64_t first = none;
  Kokkos::parallel_reduce(
      "kat::linalg::first_nonfinite",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, total),
      FirstNonfinite<FlatView>{flat, rows, lower_only}, Kokkos::Min<std::int64_t>(first));
  return first == none ? -1 : first;
}

/// Copies the strict lower triangle of the square matrix A onto its upper triangle.
template <class ExecSpace, class AView>
void symmetrize_lower(const ExecSpace &space, const AView &A) {
  const AView a = A;
  Kokkos::parallel_for("kat::linalg::symmetrize_lower",
                       kat::matrix_policy(space, A.extent(0), A.extent(1)),
                       SymmetrizeLower<AView>{a});
}

/// The value of a rank-0 view on the host, through a one-element reduction on `space` (never
/// a host dereference of device memory), so it is ordered after the work queued on `space`.
template <class ExecSpace, class View>
typename View::non_const_value_type read_scalar(const ExecSpace &space, const View &v) {
  using value_type = typename View::non_const_value_type;
  value_type result{};
  Kokkos::parallel_reduce("kat::linalg::read_scalar", Kokkos::RangePolicy<ExecSpace>(space, 0, 1),
                          ReadScalar<View>{v}, Kokkos::Max<value_type>(result));
  return result;
}

/// `value` as the 32-bit integer vendor libraries take; ValueError when it does not fit.
inline int checked_int(const char *where, const char *what, std::int64_t value) {
  if (value < 0 || value > INT_MAX) {
    throw ValueError(kat::detail::concat(where, ": ", what, " = ", value,
                                         " does not fit the 32-bit integer of the vendor "
                                         "solver interface; use kat::linalg::Portable"));
  }
  return static_cast<int>(value);
}

} // namespace kat::linalg::detail
