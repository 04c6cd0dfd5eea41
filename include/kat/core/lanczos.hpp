#pragma once
/// @file
/// @brief Extreme eigenpairs of a symmetric operator on R^n by the Lanczos algorithm with full
/// re-orthogonalization, in double: FOSI's curvature estimate (Sivan et al., "FOSI: Hybrid
/// First and Second Order Optimization", ICLR 2024, Section 3 and Appendix A; reference code
/// hsivan/fosi, `lanczos_algorithm.py`).
///
/// The operator is a callback (kat::LinearOperator), so anything that can apply a symmetric
/// matrix to a vector can be analysed: an explicit matrix, or the Hessian of a loss through
/// Hessian-vector products (kat::nn's Hessian operator, later). The n x m Krylov basis lives
/// in the operator's memory space as one column-major double matrix; only the m x m
/// tridiagonal problem (kat/core/tridiagonal.hpp) and O(m) scalars are on the host.

#include "kat/core/blas.hpp"
#include "kat/core/error.hpp"
#include "kat/core/linalg.hpp"
#include "kat/core/math.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/tridiagonal.hpp"
#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

namespace kat {

/// A symmetric linear operator A on R^n, applied as `op(space, v, out)`: it writes out = A v
/// (both of length n, double, in MemorySpace), with its kernels on `space`.
///
/// Contract: `out` does not alias `v` (the caller guarantees it, so an implementation may
/// write `out` while it still reads `v`); `out` holds zeros on entry when kat::lanczos calls
/// it, so an implementation may accumulate into it; `v` must not be modified. The operator
/// must be symmetric (vᵀ A w = wᵀ A v), which Hessians and explicit symmetric matrices are;
/// Lanczos on a non-symmetric operator returns meaningless values without an error.
template <class MemorySpace>
using LinearOperator = std::function<void(const typename MemorySpace::execution_space &space,
                                          const Kokkos::View<const double *, MemorySpace> &v,
                                          const Kokkos::View<double *, MemorySpace> &out)>;

/// What kat::lanczos computes. The names follow the FOSI paper: m Lanczos iterations, the k
/// largest and the l smallest eigenpairs.
struct LanczosOptions {
  std::size_t m = 0;      ///< iterations (order of the tridiagonal matrix), k + l <= m <= n
  std::size_t k = 1;      ///< how many of the largest eigenpairs to return
  std::size_t l = 0;      ///< how many of the smallest eigenpairs to return
  std::uint64_t seed = 0; ///< seed of the start vector (kat/core/random.hpp counters)
  /// Bytes the run may allocate in the memory space (lanczos_bytes()); 0: the memory space's
  /// size (kat::memory_space_bytes: the host's physical memory, or the GPU's memory), and
  /// only an overflow of size_t where that is unknown.
  std::size_t memory_limit = 0;
};

/// The size in bytes of the memory MemorySpace allocates from: the GPU's memory for
/// Kokkos::CudaSpace and Kokkos::HIPSpace (cudaMemGetInfo / hipMemGetInfo's total), the
/// host's physical memory for spaces the host can access (POSIX sysconf); 0 where unknown.
template <class MemorySpace> std::size_t memory_space_bytes() {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) {
      return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
    }
#endif
  } else {
    std::size_t free = 0, total = 0;
#if defined(KOKKOS_ENABLE_CUDA)
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      return total;
    }
#elif defined(KOKKOS_ENABLE_HIP)
    if (hipMemGetInfo(&free, &total) == hipSuccess) {
      return total;
    }
#endif
    (void)free;
    (void)total;
  }
  return 0;
}

/// Bytes kat::lanczos allocates in the memory space on a process that holds `n_local` entries
/// of each vector: the n_local x m basis, the residual, the n_local x (k + l) Ritz vectors and
/// the m-vector and m x (k + l) matrix of coefficients, all double. As a double, so that a
/// size beyond size_t does not wrap.
inline double lanczos_bytes(std::size_t n_local, const LanczosOptions &o) {
  const double n = static_cast<double>(n_local), m = static_cast<double>(o.m),
               kl = static_cast<double>(o.k) + static_cast<double>(o.l);
  return sizeof(double) * (n * (m + 1 + kl) + m * (1 + kl));
}

/// Ritz pairs from kat::lanczos.
template <class MemorySpace> struct LanczosResult {
  /// The k + l Ritz values, host: the l smallest ascending, then the k largest ascending
  /// (FOSI's order: eigenvalues[l + k - 1] is the largest, eigenvalues[l] the smallest of
  /// the k largest).
  std::vector<double> eigenvalues;
  /// n x (k + l) column-major, in MemorySpace: column j is the unit Ritz vector of
  /// eigenvalues[j]; the columns are orthonormal. This is Vᵀ for the paper's V, whose rows
  /// are the eigenvectors.
  Kokkos::View<double **, Kokkos::LayoutLeft, MemorySpace> eigenvectors;
  std::size_t k = 0; ///< as requested
  std::size_t l = 0; ///< as requested
  /// Lanczos iterations run: m, or fewer when the Krylov space became invariant.
  std::size_t iterations = 0;
  /// True when an iteration's residual vanished (β below the breakdown tolerance) before m
  /// iterations: the Krylov space of the start vector is an invariant subspace of A, and the
  /// Ritz pairs are eigenpairs of A to working precision.
  bool invariant_subspace = false;
  std::vector<double> alpha; ///< diagonal of the tridiagonal matrix T (length iterations)
  std::vector<double> beta;  ///< off-diagonal of T (length iterations - 1)
};

namespace detail {

/// Stream of kat::counter_uniform used for Lanczos start vectors ("Lanczos" in ASCII).
inline constexpr std::uint64_t lanczos_stream = 0x4c616e637a6f73ull;

// The kernels below are named functors rather than extended device lambdas: nvcc's wrapper of
// an extended lambda in a header is merged across translation units while its function
// pointers are not (docs/backends.md).

/// The terms x(i) * y(i) of lanczos_dot, summed in double.
template <class XView, class YView> struct LanczosDot {
  XView x;
  YView y;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, double &s) const {
    s += x(i) * y(i);
  }
};

/// y(i) = s * x(i) (lanczos_scale).
template <class XView, class YView> struct LanczosScale {
  XView x;
  double s;
  YView y;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const { y(i) = s * x(i); }
};

/// v(i) = U(-1, 1) from kat::counter_uniform(seed, lanczos_stream, first + i) for i < count,
/// 0 beyond (lanczos_start_vector).
template <class VView> struct LanczosStartVector {
  VView v;
  std::uint64_t seed;
  std::uint64_t first;
  std::int64_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    v(i) = i < count ? 2.0 * kat::counter_uniform(seed, lanczos_stream,
                                                  first + static_cast<std::uint64_t>(i)) -
                           1.0
                     : 0.0;
  }
};

/// A range policy over [0, n) with 64-bit indices.
template <class ExecSpace>
Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>
lanczos_policy(const ExecSpace &space, std::size_t n) {
  return Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
      space, 0, static_cast<std::int64_t>(n));
}

/// x · y, one deterministic reduction on `space` (the result is on the host, so it fences).
template <class ExecSpace, class XView, class YView>
double lanczos_dot(const ExecSpace &space, const XView &x, const YView &y) {
  double sum = 0;
  Kokkos::parallel_reduce("kat::lanczos::dot", lanczos_policy(space, x.extent(0)),
                          LanczosDot<XView, YView>{x, y}, sum);
  return sum;
}

/// y = s * x.
template <class ExecSpace, class XView, class YView>
void lanczos_scale(const ExecSpace &space, const XView &x, double s, const YView &y) {
  Kokkos::parallel_for("kat::lanczos::scale", lanczos_policy(space, x.extent(0)),
                       LanczosScale<XView, YView>{x, s, y});
}

/// v(i) = U(-1, 1) from kat::counter_uniform(seed, lanczos_stream, offset + i) for i < valid,
/// 0 beyond: the same vector on every backend and thread count, and a slice of it on a process
/// that holds entries [offset, offset + valid) of a distributed vector.
template <class ExecSpace, class VView>
void lanczos_start_vector(const ExecSpace &space, const VView &v, std::uint64_t seed,
                          std::size_t offset = 0, std::size_t valid = ~std::size_t(0)) {
  const auto first = static_cast<std::uint64_t>(offset);
  const auto count = static_cast<std::int64_t>(std::min(valid, v.extent(0)));
  LanczosStartVector<VView> kernel;
  kernel.v = v;
  kernel.seed = seed;
  kernel.first = first;
  kernel.count = count;
  Kokkos::parallel_for("kat::lanczos::start_vector", lanczos_policy(space, v.extent(0)), kernel);
}

/// The reductions of a Lanczos run on one process: the vectors are whole, so the local sums
/// are the sums. kat::distributed::sharded_lanczos supplies one that all-reduces them.
struct LocalLanczosReduction {
  std::size_t n = 0; ///< the operator's dimension, which is also the vectors' length
  std::size_t global_size() const { return n; }
  std::size_t offset() const { return 0; }
  std::size_t valid_size() const { return n; }
  double sum(double local) const { return local; }
  template <class ExecSpace, class View> void sum(const ExecSpace &, const View &) const {}
};

/// Throws ValueError "kat::lanczos: <what> must be <expected>, got <actual>" unless `ok`.
inline void require_lanczos(bool ok, const char *what, const std::string &expected,
                            const std::string &actual) {
  if (!ok) {
    throw ValueError(concat("kat::lanczos: ", what, " must be ", expected, ", got ", actual));
  }
}

/// `bytes` as "645.4 GB (645424000000 bytes)".
inline std::string describe_bytes(double bytes) {
  char b[96];
  std::snprintf(b, sizeof b, "%.3g GB (%.0f bytes)", bytes / 1e9, bytes);
  return b;
}

/// Throws ValueError "<who>: <what> need <bytes>, more than <limit>; <advice>" when `bytes`
/// exceeds `limit` (0: memory_space_bytes<MemorySpace>(), unchecked if unknown) or size_t.
template <class MemorySpace>
void require_memory(const std::string &who, const std::string &what, double bytes,
                    std::size_t limit, const std::string &advice) {
  const bool given = limit != 0;
  if (!given) {
    limit = memory_space_bytes<MemorySpace>();
  }
  const double max = static_cast<double>(std::numeric_limits<std::size_t>::max());
  if (bytes >= max || (limit != 0 && bytes > static_cast<double>(limit))) {
    const std::string of = limit == 0 ? "size_t's range"
                           : given    ? "the memory_limit option's " + describe_bytes(double(limit))
                                      : concat("the ", describe_bytes(double(limit)), " of ",
                                               MemorySpace::name(), " on this machine");
    throw ValueError(
        concat(who, ": ", what, " need ", describe_bytes(bytes), ", more than ", of, "; ", advice));
  }
}

/// Checks n and the options (see kat::lanczos).
inline void check_lanczos_arguments(std::size_t n, const LanczosOptions &o, bool has_operator) {
  require_lanczos(has_operator, "op", "a callable", "an empty LinearOperator");
  require_lanczos(n > 0, "n", "> 0", std::to_string(n));
  require_lanczos(o.k + o.l >= 1, "k + l", ">= 1",
                  concat(o.k + o.l, " (k = ", o.k, ", l = ", o.l, ")"));
  require_lanczos(o.k <= n && o.l <= n && o.k + o.l <= n, "k + l",
                  concat("<= n = ", n, " (the operator has n eigenpairs)"),
                  concat(o.k, " + ", o.l));
  require_lanczos(o.m >= o.k + o.l, "m", concat(">= k + l = ", o.k + o.l), std::to_string(o.m));
  require_lanczos(o.m <= n, "m", concat("<= n = ", n), std::to_string(o.m));
}

/// The Lanczos iterations and Ritz extraction, with the tridiagonal solver Impl, on vectors of
/// length `n_local` of which this process holds entries [offset, offset + valid) of the
/// operator's R^global_size (Reduction says which, and sums dot products and coefficient
/// vectors over the processes that hold the rest; LocalLanczosReduction: one process).
template <class Impl, class MemorySpace, class Reduction>
LanczosResult<MemorySpace> lanczos_with(const typename MemorySpace::execution_space &space,
                                        const LinearOperator<MemorySpace> &op, std::size_t n_local,
                                        const LanczosOptions &options, const Reduction &reduction) {
  using Basis = Kokkos::View<double **, Kokkos::LayoutLeft, MemorySpace>;
  using Vec = Kokkos::View<double *, MemorySpace>;
  const std::size_t n = reduction.global_size();
  check_lanczos_arguments(n, options, static_cast<bool>(op));
  require_memory<MemorySpace>(
      "kat::lanczos",
      concat("m = ", options.m, " iterations for k = ", options.k, ", l = ", options.l, " on ",
             n_local, " entries of each vector (n x (m + 1 + k + l) doubles)"),
      lanczos_bytes(n_local, options), options.memory_limit, "lower m, k or l");
  ScopedRegion region("kat::lanczos");
  const std::size_t m = options.m;
  const std::size_t kl = options.k + options.l;
  const auto dot = [&](const auto &x, const auto &y) {
    return reduction.sum(lanczos_dot(space, x, y));
  };

  Basis Q("kat::lanczos::basis", n_local, m);
  Vec w("kat::lanczos::w", n_local);
  Vec h("kat::lanczos::coefficients", m);
  {
    const auto q0 = Kokkos::subview(Q, Kokkos::ALL, 0);
    lanczos_start_vector(space, q0, options.seed, reduction.offset(), reduction.valid_size());
    // A U(-1, 1) vector of length n >= 1 is 0 with probability 0; its norm is about sqrt(n/3).
    const double norm = std::sqrt(dot(q0, q0));
    if (!(norm > 0.0)) {
      throw NumericalError(concat("kat::lanczos: the start vector from seed ", options.seed,
                                  " is zero; use another seed"));
    }
    lanczos_scale(space, q0, 1.0 / norm, q0);
  }

  LanczosResult<MemorySpace> result;
  result.k = options.k;
  result.l = options.l;
  const double eps = std::numeric_limits<double>::epsilon();
  // A running estimate of ‖T‖ (row sums of |T| so far) scales the breakdown test: after two
  // Gram-Schmidt passes the residual of a vector already in span(Q) is a few rounding errors
  // of ‖A q‖, i.e. O(sqrt(n) eps ‖A‖).
  double norm_estimate = 0.0;
  const double breakdown_factor = 10.0 * std::sqrt(static_cast<double>(n)) * eps;
  std::size_t j = 0;
  for (;; ++j) {
    const auto qj = Kokkos::subview(Q, Kokkos::ALL, j);
    Kokkos::deep_copy(space, w, 0.0);
    op(space, qj, w);
    const double alpha = dot(qj, w);
    if (!std::isfinite(alpha)) {
      throw NumericalError(concat("kat::lanczos: the operator returned a non-finite vector at "
                                  "iteration ",
                                  j, " (qᵀ A q = ", alpha, ")"));
    }
    result.alpha.push_back(alpha);
    norm_estimate = std::max(norm_estimate, std::abs(alpha) + (j > 0 ? result.beta[j - 1] : 0.0));
    if (j + 1 == m) {
      break;
    }
    // Full re-orthogonalization: classical Gram-Schmidt against q_0 .. q_j, twice ("twice is
    // enough", Giraud et al. 2005). The first pass also removes α q_j and β q_{j-1}, the
    // three-term recurrence's own terms.
    const auto Qj = Kokkos::subview(Q, Kokkos::ALL, std::make_pair(std::size_t(0), j + 1));
    const auto hj = Kokkos::subview(h, std::make_pair(std::size_t(0), j + 1));
    for (int pass = 0; pass < 2; ++pass) {
      kat::gemv(space, Trans::T, 1.0, Qj, w, 0.0, hj);
      reduction.sum(space, hj);
      kat::gemv(space, Trans::N, -1.0, Qj, hj, 1.0, w);
    }
    const double beta = std::sqrt(dot(w, w));
    if (!std::isfinite(beta)) {
      throw NumericalError(concat("kat::lanczos: the operator returned a non-finite vector at "
                                  "iteration ",
                                  j, " (‖r‖ = ", beta, ")"));
    }
    if (beta <= breakdown_factor * norm_estimate) {
      result.invariant_subspace = true;
      break;
    }
    result.beta.push_back(beta);
    lanczos_scale(space, w, 1.0 / beta, Kokkos::subview(Q, Kokkos::ALL, j + 1));
  }
  const std::size_t it = j + 1;
  result.iterations = it;
  if (it < kl) {
    throw NumericalError(
        concat("kat::lanczos: the Krylov space of the start vector became invariant after ", it,
               " iterations, so only ", it, " Ritz pairs exist, fewer than k + l = ", kl,
               " (the operator has at most ", it,
               " distinct eigenvalues seen from this start vector); ask for fewer pairs"));
  }

  const TridiagonalEigen t =
      linalg::detail::tridiagonal_eigen_with<Impl>(result.alpha, result.beta);
  // Selected eigenvectors of T, it x (k + l): the l smallest, then the k largest.
  Basis S("kat::lanczos::ritz_coefficients", it, kl);
  auto S_host = Kokkos::create_mirror_view(S);
  result.eigenvalues.resize(kl);
  for (std::size_t c = 0; c < kl; ++c) {
    const std::size_t src = c < options.l ? c : it - options.k + (c - options.l);
    result.eigenvalues[c] = t.values[src];
    for (std::size_t r = 0; r < it; ++r) {
      S_host(r, c) = t.vector(r, src);
    }
  }
  Kokkos::deep_copy(S, S_host);
  result.eigenvectors = Basis("kat::lanczos::ritz_vectors", n_local, kl);
  const auto Qi = Kokkos::subview(Q, Kokkos::ALL, std::make_pair(std::size_t(0), it));
  kat::gemm(space, Trans::N, Trans::N, 1.0, Qi, S, 0.0, result.eigenvectors);
  space.fence();
  return result;
}

} // namespace detail

/// The k largest and l smallest eigenpairs of the symmetric operator `op` on R^n, estimated
/// by m Lanczos iterations (Lanczos 1950; Golub & Van Loan, Matrix Computations, 4th ed.,
/// §10.1) in double with full re-orthogonalization: every new basis vector is orthogonalized
/// against all previous ones by classical Gram-Schmidt applied twice, as FOSI's reference code
/// does, so the basis stays orthonormal to working precision and no spurious copies of
/// converged Ritz values appear. Each iteration costs one operator application, two
/// matrix-vector products with the n x (j+1) basis through kat::gemv, and three reductions.
///
/// The start vector has entries U(-1, 1) from the counter-based generator of
/// kat/core/random.hpp under `options.seed`, so the result is the same on every backend for
/// the same seed (up to the rounding of the reductions).
///
/// Breakdown: when a residual norm β_j falls to 10 sqrt(n) eps ‖T‖ or below before m
/// iterations, the Krylov space is invariant under A (its Ritz values are eigenvalues of A);
/// the iteration stops there, `iterations` tells how many were run, and
/// `invariant_subspace` is set. If fewer than k + l Ritz pairs exist then, it throws.
///
/// The m x m tridiagonal eigenproblem goes to LAPACK's DSTEV (kat::tridiagonal_eigen); pass
/// kat::linalg::Portable{} for the portable solver.
///
/// Memory: the basis (n x m doubles) and the residual in MemorySpace, plus the result
/// (lanczos_bytes()); a run that would need more than options.memory_limit (by default the
/// memory space's size) is refused before anything is allocated.
///
/// @tparam MemorySpace where the vectors live; the call spells it out
///   (`kat::lanczos<Kokkos::HostSpace>(...)`) unless `op` already is a LinearOperator.
/// @param space  execution space instance every kernel, product and operator call runs on.
/// @param op  the operator (see kat::LinearOperator for its contract).
/// @param n  the dimension, > 0.
/// @param options  m (k + l <= m <= n), k, l (k + l >= 1) and the seed.
/// @returns the Ritz values (host) and unit Ritz vectors (n x (k + l), MemorySpace), ordered
///   [l smallest ascending, k largest ascending].
/// @throws ValueError naming the argument, its valid range and its value if op is empty,
///   n == 0, k + l == 0, k + l > n, m < k + l or m > n; naming the bytes asked, m, k, l, n
///   and the limit if the memory would exceed the limit.
/// @throws NumericalError if the operator returns a non-finite vector, or if the Krylov space
///   is invariant with fewer than k + l dimensions.
template <class MemorySpace>
LanczosResult<MemorySpace> lanczos(const typename MemorySpace::execution_space &space,
                                   const LinearOperator<MemorySpace> &op, std::size_t n,
                                   const LanczosOptions &options) {
  return detail::lanczos_with<linalg::detail::LapackTridiagonalEigen, MemorySpace>(
      space, op, n, options, detail::LocalLanczosReduction{n});
}

/// kat::lanczos with the tridiagonal eigenproblem solved by the portable implicit QR solver
/// (kat::tridiagonal_eigen with kat::linalg::Portable).
template <class MemorySpace>
LanczosResult<MemorySpace> lanczos(const typename MemorySpace::execution_space &space,
                                   const LinearOperator<MemorySpace> &op, std::size_t n,
                                   const LanczosOptions &options, linalg::Portable) {
  return detail::lanczos_with<linalg::detail::PortableTridiagonalEigen, MemorySpace>(
      space, op, n, options, detail::LocalLanczosReduction{n});
}

/// kat::lanczos with the tridiagonal eigenproblem solved by LAPACK's DSTEV (the default).
template <class MemorySpace>
LanczosResult<MemorySpace> lanczos(const typename MemorySpace::execution_space &space,
                                   const LinearOperator<MemorySpace> &op, std::size_t n,
                                   const LanczosOptions &options, linalg::Vendor) {
  return lanczos<MemorySpace>(space, op, n, options);
}

} // namespace kat
