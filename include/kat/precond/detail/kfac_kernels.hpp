#pragma once
/// @file
/// @brief Internal: the element-wise kernels of kat::precond::KFAC, as free functions launching
/// named functors (a device lambda may not live in a private member function under nvcc).

#include "kat/core/math.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/random.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace kat::detail {

// The kernels below are named functors, not extended device lambdas: nvcc's wrapper of an
// extended lambda in a header is merged across translation units while its function pointers are
// not (issue 31, docs/backends.md).

/// Entry (i, j) of elementwise_dot(): s += p(i, j)·grad(i, j) in double.
template <class PView, class GradView> struct KFACElementwiseDot {
  PView p;
  GradView grad;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j,
                                         double &s) const {
    s += static_cast<double>(p(i, j)) * static_cast<double>(grad(i, j));
  }
};

/// Σ_ij p(i, j)·grad(i, j) in double (p and grad: out x cols). Blocks the host: only for
/// error messages (the step itself uses the fused segment_dot()).
template <class ExecSpace, class PView, class GradView>
double elementwise_dot(const ExecSpace &space, const PView &p, const GradView &grad) {
  double sum = 0;
  Kokkos::parallel_reduce("kat::precond::KFAC::vg_sum",
                          matrix_policy(space, p.extent(0), p.extent(1)),
                          KFACElementwiseDot<PView, GradView>{p, grad}, sum);
  return sum;
}

/// One preconditioned layer as the fused kernels see it: its preconditioned gradient P
/// (n = out·cols entries, contiguous, column-major) and its weight gradient ∇ (out x cols,
/// column-major with leading dimension `ld` >= out), cut into chunks of `fused_chunk` entries
/// numbered from `chunk` on in the fused index space.
template <class PScalar, class GScalar> struct PGSegment {
  const PScalar *p = nullptr;
  GScalar *g = nullptr;
  std::size_t out = 0, ld = 0, n = 0, chunk = 0;

  friend bool operator==(const PGSegment &x, const PGSegment &y) {
    return x.p == y.p && x.g == y.g && x.out == y.out && x.ld == y.ld && x.n == y.n &&
           x.chunk == y.chunk;
  }
};

/// Entries per work item of the fused kernels: on host spaces a thread runs down a long
/// contiguous stretch (no index arithmetic per entry, vectorizable); on devices one entry per
/// thread, so neighbouring threads touch neighbouring entries.
template <class ExecSpace>
constexpr std::size_t fused_chunk =
    Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible ? 2048 : 1;

/// The segment holding chunk c: the last one whose first chunk is <= c (segments in order,
/// the first starting at chunk 0; count >= 1).
template <class SegmentView>
KOKKOS_INLINE_FUNCTION std::size_t find_segment(const SegmentView &segments, std::size_t count,
                                                std::size_t c) {
  std::size_t lo = 0, hi = count; // segments(lo).chunk <= c < segments(hi).chunk (hi: end)
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (segments(mid).chunk <= c) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/// Calls f(k, gk) for the entries k of P that chunk c of `seg` covers, with gk the offset of
/// the matching entry of ∇ (k itself when ∇ is contiguous).
template <std::size_t Chunk, class Segment, class F>
KOKKOS_INLINE_FUNCTION void for_chunk(const Segment &seg, std::size_t c, const F &f) {
  const std::size_t begin = (c - seg.chunk) * Chunk;
  const std::size_t end = begin + Chunk < seg.n ? begin + Chunk : seg.n;
  if (seg.ld == seg.out) {
    for (std::size_t k = begin; k < end; ++k) {
      f(k, k);
    }
    return;
  }
  std::size_t i = begin % seg.out, j = begin / seg.out;
  for (std::size_t k = begin; k < end; ++k) {
    f(k, i + j * seg.ld);
    if (++i == seg.out) {
      i = 0;
      ++j;
    }
  }
}

/// Chunk c of segment_dot(): s += Σ P(k)·∇(gk) over the entries of chunk c, in double.
template <std::size_t Chunk, class SegmentView> struct KFACSegmentDot {
  SegmentView segments;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c, double &s) const {
    const auto seg = segments(find_segment(segments, count, c));
    double local = 0;
    for_chunk<Chunk>(seg, c, [&](std::size_t k, std::size_t gk) {
      local += static_cast<double>(seg.p[k]) * static_cast<double>(seg.g[gk]);
    });
    s += local;
  }
};

/// One reduction over all segments: out() = Σ_segments Σ_ij P(i, j)·∇(i, j) in double,
/// written to the rank-0 view `out` without blocking the host. `chunks` is the number of
/// chunks of all segments together.
template <class ExecSpace, class SegmentView, class OutView>
void segment_dot(const ExecSpace &space, const SegmentView &segments, std::size_t chunks,
                 const OutView &out) {
  constexpr std::size_t chunk = fused_chunk<ExecSpace>;
  const std::size_t count = segments.extent(0);
  Kokkos::parallel_reduce("kat::precond::KFAC::vg_sum",
                          Kokkos::RangePolicy<ExecSpace>(space, 0, chunks),
                          KFACSegmentDot<chunk, SegmentView>{segments, count}, out);
}

/// Chunk c of segment_apply(): ∇(gk) = ν·P(k) over the entries of chunk c, unless ν is NaN.
template <std::size_t Chunk, class SegmentView, class ScaleView> struct KFACSegmentApply {
  using Segment = typename SegmentView::non_const_value_type;
  using PScalar = std::remove_cv_t<std::remove_pointer_t<decltype(Segment::p)>>;
  using GScalar = std::remove_pointer_t<decltype(Segment::g)>;
  ScaleView scale;
  SegmentView segments;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
    const double nu = scale();
    if (nu != nu) {
      return;
    }
    const PScalar factor = static_cast<PScalar>(nu);
    const auto seg = segments(find_segment(segments, count, c));
    for_chunk<Chunk>(seg, c, [&](std::size_t k, std::size_t gk) {
      seg.g[gk] = static_cast<GScalar>(factor * seg.p[k]);
    });
  }
};

/// ∇ = ν·P over all segments, with ν = scale() (a rank-0 view on the device) converted to
/// P's scalar first; nothing is written when ν is NaN (the step failed and must leave the
/// gradients as they are).
template <class ExecSpace, class SegmentView, class ScaleView>
void segment_apply(const ExecSpace &space, const SegmentView &segments, std::size_t chunks,
                   const ScaleView &scale) {
  constexpr std::size_t chunk = fused_chunk<ExecSpace>;
  const std::size_t count = segments.extent(0);
  Kokkos::parallel_for("kat::precond::KFAC::apply",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, chunks),
                       KFACSegmentApply<chunk, SegmentView, ScaleView>{scale, segments, count});
}

/// The single work item of kl_scale(): status(scale_slot) = ν from status(vg_slot) and the
/// failure slots.
template <class StatusView> struct KFACKLScale {
  std::size_t fail_begin, fail_end;
  StatusView status;
  std::size_t vg_slot;
  double nan;
  double kl_clip, lr;
  std::size_t scale_slot;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t) const {
    double failures = 0;
    for (std::size_t k = fail_begin; k < fail_end; ++k) {
      failures += status(k);
    }
    const double vg = status(vg_slot);
    double nu = 1.0;
    if (failures != 0 || !kat::math::isfinite(vg)) {
      nu = nan;
    } else if (kl_clip > 0.0 && vg != 0.0 && lr > 0.0) {
      const double r = kat::math::sqrt(kl_clip / kat::math::fabs(vg * lr * lr));
      nu = r < 1.0 ? r : 1.0;
    }
    status(scale_slot) = nu;
  }
};

/// The KL clip's ν (Martens & Grosse 2015; KAISA's form, docs/algorithms.md section 1) from
/// the device: with vg = status(vg_slot), status(scale_slot) = min(1, sqrt(kl_clip /
/// |vg·lr²|)) (1 when kl_clip, vg or lr is 0), or NaN when vg is not finite or the sum of
/// status(k) for k in [fail_begin, fail_end) is not 0 (a failure found on the device this
/// step). One work item; the host does not wait.
template <class ExecSpace, class StatusView>
void kl_scale(const ExecSpace &space, const StatusView &status, std::size_t vg_slot,
              std::size_t scale_slot, std::size_t fail_begin, std::size_t fail_end, double kl_clip,
              double lr) {
  // Captured from the host: std::numeric_limits is not callable in every device compiler.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Kokkos::parallel_for(
      "kat::precond::KFAC::kl_scale", Kokkos::RangePolicy<ExecSpace>(space, 0, 1),
      KFACKLScale<StatusView>{fail_begin, fail_end, status, vg_slot, nan, kl_clip, lr, scale_slot});
}

/// status(k) = 0 (clear()).
template <class StatusView> struct KFACClearStatus {
  StatusView status;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t k) const { status(k) = 0; }
};

/// status(k) = 0 for every k (the start of a step), without blocking the host.
template <class ExecSpace, class StatusView>
void clear(const ExecSpace &space, const StatusView &status) {
  Kokkos::parallel_for("kat::precond::KFAC::clear_status",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, status.extent(0)),
                       KFACClearStatus<StatusView>{status});
}

/// Entry (i, j) of eigen_scale(): p(i, j) /= dg(i)·da(j) + lambda.
template <class PView, class DView, class PScalar> struct KFACEigenScale {
  PView p;
  DView dg, da;
  PScalar lambda;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    p(i, j) /= dg(i) * da(j) + lambda;
  }
};

/// The eigen path's damping: p(i, j) /= dg(i)·da(j) + lambda (p: out x cols).
template <class ExecSpace, class PView, class DView, class PScalar>
void eigen_scale(const ExecSpace &space, const PView &p, const DView &dg, const DView &da,
                 PScalar lambda) {
  Kokkos::parallel_for("kat::precond::KFAC::eigen_scale",
                       matrix_policy(space, p.extent(0), p.extent(1)),
                       KFACEigenScale<PView, DView, PScalar>{p, dg, da, lambda});
}

/// Entry j of fill_probe(): v(j) = 2·counter_uniform(seed, stream, j) − 1.
template <class VView> struct KFACFillProbe {
  VView v;
  std::uint64_t seed, stream;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t j) const {
    v(j) = 2.0 * counter_uniform(seed, stream, j) - 1.0;
  }
};

/// v(j) = 2·counter_uniform(seed, stream, j) − 1, uniform in [-1, 1).
template <class ExecSpace, class VView>
void fill_probe(const ExecSpace &space, const VView &v, std::uint64_t seed, std::uint64_t stream) {
  Kokkos::parallel_for("kat::precond::KFAC::probe",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, v.extent(0)),
                       KFACFillProbe<VView>{v, seed, stream});
}

/// Work item c of freivalds_check()'s first kernel: av(i, 0) = (a v)_i and av(i, 1) =
/// (|a||v|)_i for the KChunk rows of a from c·KChunk on.
template <std::size_t KChunk, class XView, class VView, class WorkView> struct FreivaldsAv {
  using Scalar = typename XView::non_const_value_type;
  static constexpr std::size_t kChunk = KChunk;
  std::size_t rows, cols;
  VView v;
  XView a;
  WorkView av;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
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
  }
};

/// Work item c of freivalds_check()'s second kernel: dk(k, 0) = (∇v − gᵀ(av))_k and dk(k, 1)
/// = (|g|ᵀ(|a||v|))_k for the KChunk entries k from c·KChunk on.
template <std::size_t KChunk, class XView, class VView, class WorkView> struct FreivaldsGv {
  using Scalar = typename XView::non_const_value_type;
  static constexpr std::size_t kChunk = KChunk;
  std::size_t out, cols;
  VView v;
  XView grad;
  std::size_t rows;
  XView g;
  WorkView av, dk;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c) const {
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
  }
};

/// Entry k of the sum of squares of column Column of dk (freivalds_check()'s check_diff for
/// column 0, check_bound for column 1): s += dk(k, Column)².
template <class WorkView, int Column> struct FreivaldsColumnSquares {
  WorkView dk;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t k, double &s) const {
    s += dk(k, Column) * dk(k, Column);
  }
};

/// The single work item of freivalds_check()'s verdict: status(verdict) = 0 if
/// sqrt(status(slot)) <= tol·sqrt(status(slot + 1)), 1 otherwise.
template <class StatusView> struct FreivaldsVerdict {
  StatusView status;
  std::size_t slot;
  double tol;
  std::size_t verdict;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t) const {
    const double diff = kat::math::sqrt(status(slot)), bound = kat::math::sqrt(status(slot + 1));
    status(verdict) = diff <= tol * bound ? 0.0 : 1.0;
  }
};

/// The Freivalds check that grad (out x cols) is gᵀa for a (rows x cols) and g (rows x out),
/// with the probe v (cols), in double (kat::precond::KFAC::check_factored), without blocking the
/// host: status(slot) = ‖∇v − gᵀ(av)‖₂², status(slot + 1) = ‖|g|ᵀ(|a||v|)‖₂², and status(verdict)
/// = 0 if ‖∇v − gᵀ(av)‖₂ <= tol·‖|g|ᵀ(|a||v|)‖₂, 1 otherwise (also when either is not finite).
/// av (rows x 2) receives (a v, |a||v|) and dk (out x 2) (∇v − gᵀ(av), |g|ᵀ(|a||v|)). a and
/// grad must have contiguous columns.
template <class ExecSpace, class XView, class VView, class WorkView, class StatusView>
void freivalds_check(const ExecSpace &space, const XView &a, const XView &g, const XView &grad,
                     const VView &v, const WorkView &av, const WorkView &dk,
                     const StatusView &status, std::size_t slot, std::size_t verdict, double tol) {
  const std::size_t rows = a.extent(0), cols = a.extent(1), out = grad.extent(0);
  // Each work item handles kChunk consecutive rows of a (and of ∇) on host spaces, so one
  // thread runs down contiguous column segments into local sums, and one row on devices,
  // so neighbouring threads read neighbouring entries of a column.
  constexpr bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  constexpr std::size_t kChunk = host ? 64 : 1;
  Kokkos::parallel_for("kat::precond::KFAC::check_av",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, (rows + kChunk - 1) / kChunk),
                       FreivaldsAv<kChunk, XView, VView, WorkView>{rows, cols, v, a, av});
  Kokkos::parallel_for(
      "kat::precond::KFAC::check_gv",
      Kokkos::RangePolicy<ExecSpace>(space, 0, (out + kChunk - 1) / kChunk),
      FreivaldsGv<kChunk, XView, VView, WorkView>{out, cols, v, grad, rows, g, av, dk});
  Kokkos::parallel_reduce("kat::precond::KFAC::check_diff",
                          Kokkos::RangePolicy<ExecSpace>(space, 0, out),
                          FreivaldsColumnSquares<WorkView, 0>{dk}, Kokkos::subview(status, slot));
  Kokkos::parallel_reduce(
      "kat::precond::KFAC::check_bound", Kokkos::RangePolicy<ExecSpace>(space, 0, out),
      FreivaldsColumnSquares<WorkView, 1>{dk}, Kokkos::subview(status, slot + 1));
  Kokkos::parallel_for("kat::precond::KFAC::check_verdict",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, 1),
                       FreivaldsVerdict<StatusView>{status, slot, tol, verdict});
}

} // namespace kat::detail
