#pragma once
/// @file
/// @brief Internal: the element-wise kernels of kat::KFAC, as free functions (a device lambda
/// may not live in a private member function under nvcc).

#include "kat/core/policy.hpp"
#include "kat/core/random.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kat::detail {

/// grad(i, j) = scale·p(i, j), converted to grad's scalar type (p and grad: out x cols).
template <class ExecSpace, class PView, class GradView, class PScalar>
void scale_into(const ExecSpace &space, const PView &p, PScalar scale, const GradView &grad) {
  using value = typename GradView::non_const_value_type;
  Kokkos::parallel_for(
      "kat::KFAC::apply", matrix_policy(space, grad.extent(0), grad.extent(1)),
      KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) {
        grad(i, j) = static_cast<value>(scale * p(i, j));
      });
}

/// Σ_ij p(i, j)·grad(i, j) in double (p and grad: out x cols).
template <class ExecSpace, class PView, class GradView>
double elementwise_dot(const ExecSpace &space, const PView &p, const GradView &grad) {
  double sum = 0;
  Kokkos::parallel_reduce(
      "kat::KFAC::vg_sum", matrix_policy(space, p.extent(0), p.extent(1)),
      KOKKOS_LAMBDA(const std::size_t i, const std::size_t j, double &s) {
        s += static_cast<double>(p(i, j)) * static_cast<double>(grad(i, j));
      },
      sum);
  return sum;
}

/// The eigen path's damping: p(i, j) /= dg(i)·da(j) + lambda (p: out x cols).
template <class ExecSpace, class PView, class DView, class PScalar>
void eigen_scale(const ExecSpace &space, const PView &p, const DView &dg, const DView &da,
                 PScalar lambda) {
  Kokkos::parallel_for(
      "kat::KFAC::eigen_scale", matrix_policy(space, p.extent(0), p.extent(1)),
      KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) {
        p(i, j) /= dg(i) * da(j) + lambda;
      });
}

/// v(j) = 2·counter_uniform(seed, stream, j) − 1, uniform in [-1, 1).
template <class ExecSpace, class VView>
void fill_probe(const ExecSpace &space, const VView &v, std::uint64_t seed, std::uint64_t stream) {
  Kokkos::parallel_for(
      "kat::KFAC::probe", Kokkos::RangePolicy<ExecSpace>(space, 0, v.extent(0)),
      KOKKOS_LAMBDA(const std::size_t j) { v(j) = 2.0 * counter_uniform(seed, stream, j) - 1.0; });
}

/// The two squared norms of KFAC's Freivalds check (kat::KFAC::check_factored).
struct FreivaldsSums {
  double diff = 0;  ///< ‖∇v − gᵀ(av)‖₂²
  double bound = 0; ///< ‖|g|ᵀ(|a||v|)‖₂²
};

/// The sums of the Freivalds check that grad (out x cols) is gᵀa for a (rows x cols) and
/// g (rows x out), with the probe v (cols), in double. av (rows x 2) receives (a v, |a||v|)
/// and dk (out x 2) (∇v − gᵀ(av), |g|ᵀ(|a||v|)). a and grad must have contiguous columns.
template <class ExecSpace, class XView, class VView, class WorkView>
FreivaldsSums freivalds_sums(const ExecSpace &space, const XView &a, const XView &g,
                             const XView &grad, const VView &v, const WorkView &av,
                             const WorkView &dk) {
  using Scalar = typename XView::non_const_value_type;
  const std::size_t rows = a.extent(0), cols = a.extent(1), out = grad.extent(0);
  // Each work item handles kChunk consecutive rows of a (and of ∇) on host spaces, so one
  // thread runs down contiguous column segments into local sums, and one row on devices,
  // so neighbouring threads read neighbouring entries of a column.
  constexpr bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  constexpr std::size_t kChunk = host ? 64 : 1;
  Kokkos::parallel_for(
      "kat::KFAC::check_av", Kokkos::RangePolicy<ExecSpace>(space, 0, (rows + kChunk - 1) / kChunk),
      KOKKOS_LAMBDA(const std::size_t c) {
        const std::size_t begin = c * kChunk;
        const std::size_t n = begin + kChunk < rows ? kChunk : rows - begin;
        double s[kChunk], t[kChunk];
        for (std::size_t i = 0; i < n; ++i) {
          s[i] = 0;
          t[i] = 0;
        }
        for (std::size_t j = 0; j < cols; ++j) {
          const double vj = v(j), abs_vj = vj < 0 ? -vj : vj;
          const Scalar *col = &a(begin, j);
          for (std::size_t i = 0; i < n; ++i) {
            const double x = static_cast<double>(col[i]);
            s[i] += x * vj;
            t[i] += (x < 0 ? -x : x) * abs_vj;
          }
        }
        for (std::size_t i = 0; i < n; ++i) {
          av(begin + i, 0) = s[i]; // (a v)_i
          av(begin + i, 1) = t[i]; // (|a||v|)_i
        }
      });
  Kokkos::parallel_for(
      "kat::KFAC::check_gv", Kokkos::RangePolicy<ExecSpace>(space, 0, (out + kChunk - 1) / kChunk),
      KOKKOS_LAMBDA(const std::size_t c) {
        const std::size_t begin = c * kChunk;
        const std::size_t n = begin + kChunk < out ? kChunk : out - begin;
        double d[kChunk];
        for (std::size_t k = 0; k < n; ++k) {
          d[k] = 0;
        }
        for (std::size_t j = 0; j < cols; ++j) {
          const double vj = v(j);
          const Scalar *col = &grad(begin, j);
          for (std::size_t k = 0; k < n; ++k) {
            d[k] += static_cast<double>(col[k]) * vj;
          }
        }
        for (std::size_t k = 0; k < n; ++k) {
          double e = 0, b = 0;
          for (std::size_t i = 0; i < rows; ++i) {
            const double gi = static_cast<double>(g(i, begin + k));
            e += gi * av(i, 0);
            b += (gi < 0 ? -gi : gi) * av(i, 1);
          }
          dk(begin + k, 0) = d[k] - e; // (∇v − gᵀ(av))_k
          dk(begin + k, 1) = b;        // (|g|ᵀ(|a||v|))_k
        }
      });
  FreivaldsSums sums;
  Kokkos::parallel_reduce(
      "kat::KFAC::check_diff", Kokkos::RangePolicy<ExecSpace>(space, 0, out),
      KOKKOS_LAMBDA(const std::size_t k, double &s) { s += dk(k, 0) * dk(k, 0); }, sums.diff);
  Kokkos::parallel_reduce(
      "kat::KFAC::check_bound", Kokkos::RangePolicy<ExecSpace>(space, 0, out),
      KOKKOS_LAMBDA(const std::size_t k, double &s) { s += dk(k, 1) * dk(k, 1); }, sums.bound);
  return sums;
}

} // namespace kat::detail
