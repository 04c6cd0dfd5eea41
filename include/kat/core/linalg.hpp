#pragma once
/// @file
/// @brief Dense symmetric linear algebra that Kokkos Kernels 3.4 lacks and K-FAC needs: the
/// symmetric eigendecomposition and the inverse of a symmetric positive definite matrix.
///
/// Dispatch follows Kokkos Kernels' TPL pattern. Each operation has a portable implementation
/// in Kokkos kernels (kat/core/detail/linalg_portable.hpp) as the primary template of a
/// dispatch struct keyed on the views' memory space, and vendor specializations selected at
/// compile time:
///
/// | memory space            | vendor library | when                                       |
/// |-------------------------|----------------|--------------------------------------------|
/// | Kokkos::HostSpace       | LAPACK         | always (Serial, OpenMP)                    |
/// | Kokkos::CudaSpace       | cuSOLVER       | KOKKOS_ENABLE_CUDA and KAT_ENABLE_CUSOLVER |
/// | HIPSpace                | rocSOLVER      | KOKKOS_ENABLE_HIP and KAT_ENABLE_ROCSOLVER |
/// | anything else (UVM, …)  | —              | the portable implementation                |
///
/// The three-argument / two-argument calls take the vendor library where there is one and the
/// portable implementation otherwise. A trailing tag forces a choice, for tests and for users
/// who want the fallback: `kat::linalg::Portable{}` always compiles; `kat::linalg::Vendor{}`
/// is a compile-time error where `kat::linalg::has_vendor<MemorySpace>` is false.
///
/// Both operations read only the LOWER triangle of A (entries A(i, j) with i >= j, as LAPACK's
/// UPLO = 'L'); the strict upper triangle may hold anything, NaN included. Both block until the
/// result is ready: the finiteness checks reduce to the host.

#include "kat/core/detail/linalg_common.hpp"
#include "kat/core/detail/linalg_cusolver.hpp"
#include "kat/core/detail/linalg_lapack.hpp"
#include "kat/core/detail/linalg_portable.hpp"
#include "kat/core/detail/linalg_rocsolver.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace kat {
namespace linalg {

/// Tag selecting the portable implementation: Kokkos kernels on the execution space
/// instance, for every backend.
struct Portable {};

/// Tag selecting the vendor library for the views' memory space (LAPACK, cuSOLVER,
/// rocSOLVER); a compile-time error where none is compiled in.
struct Vendor {};

/// Whether a vendor implementation of both operations is compiled in for MemorySpace.
template <class MemorySpace>
inline constexpr bool has_vendor = detail::SymmetricEigen<MemorySpace>::is_vendor
    &&detail::CholeskyInverse<MemorySpace>::is_vendor;

namespace detail {

/// Compile-time requirements shared by both operations on the matrix A.
template <class ExecSpace, class AView> void check_matrix_type() {
  static_assert(Kokkos::is_view<AView>::value, "kat::linalg: A must be a Kokkos::View");
  static_assert(AView::rank == 2, "kat::linalg: A must be a rank-2 view");
  using Scalar = typename AView::non_const_value_type;
  static_assert(std::is_same<typename AView::value_type, Scalar>::value,
                "kat::linalg: A is overwritten, so it must not be a view of const");
  static_assert(std::is_same<Scalar, float>::value || std::is_same<Scalar, double>::value,
                "kat::linalg: the scalar type must be float or double");
  static_assert(std::is_same<typename AView::array_layout, Kokkos::LayoutLeft>::value,
                "kat::linalg: A must be LayoutLeft (column-major, as the solvers take it)");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename AView::memory_space>::accessible,
                "kat::linalg: the execution space cannot access the memory space of A");
}

/// Throws ShapeError unless A is square and contiguous.
template <class AView> void check_square_contiguous(const std::string &who, const AView &A) {
  if (A.extent(0) != A.extent(1)) {
    throw ShapeError(kat::detail::concat(who, ": A must be square (n x n), got ", A.extent(0), "x",
                                         A.extent(1)));
  }
  if (!A.span_is_contiguous()) {
    throw ShapeError(kat::detail::concat(
        who, ": A must be a contiguous LayoutLeft view (leading dimension ", A.extent(0),
        "), got one with column stride ", A.stride(1), " (a subview?); copy it first"));
  }
}

/// Throws NumericalError naming the first non-finite entry of A's lower triangle.
template <class ExecSpace, class AView>
void check_finite_input(const ExecSpace &space, const std::string &who, const AView &A) {
  const std::int64_t k = first_nonfinite(space, A, true);
  if (k >= 0) {
    const std::int64_t n = static_cast<std::int64_t>(A.extent(0));
    throw NumericalError(kat::detail::concat(who, ": A(", k % n, ", ", k / n,
                                             ") is not finite (NaN or Inf); the input must be "
                                             "finite in the lower triangle, which is read"));
  }
}

/// Validation, finiteness checks and profiling region around Impl::run.
template <class Impl, class ExecSpace, class AView, class WView>
void symmetric_eigen_with(const ExecSpace &space, const AView &A, const WView &w) {
  check_matrix_type<ExecSpace, AView>();
  static_assert(Kokkos::is_view<WView>::value && WView::rank == 1,
                "kat::symmetric_eigen: w must be a rank-1 Kokkos::View");
  using Scalar = typename AView::non_const_value_type;
  static_assert(std::is_same<typename WView::value_type, Scalar>::value,
                "kat::symmetric_eigen: w must be a non-const view of A's scalar type");
  static_assert(std::is_same<typename WView::memory_space, typename AView::memory_space>::value,
                "kat::symmetric_eigen: A and w must live in the same memory space");
  const std::string who = "kat::symmetric_eigen (" + Impl::template routine<Scalar>() + ")";
  check_square_contiguous(who, A);
  kat::detail::require_extent(who.c_str(), "w.extent(0) (the order of A)", A.extent(0),
                              w.extent(0));
  if (!w.span_is_contiguous()) {
    throw ShapeError(kat::detail::concat(who, ": w must be contiguous, got stride ", w.stride(0)));
  }
  if (A.extent(0) == 0) {
    return;
  }
  ScopedRegion region("kat::symmetric_eigen");
  check_finite_input(space, who, A);
  Impl::run(space, A, w);
  if (const std::int64_t k = first_nonfinite(space, w, false); k >= 0) {
    throw NumericalError(kat::detail::concat(who, ": produced a non-finite eigenvalue w(", k, ")"));
  }
  if (const std::int64_t k = first_nonfinite(space, A, false); k >= 0) {
    const std::int64_t n = static_cast<std::int64_t>(A.extent(0));
    throw NumericalError(kat::detail::concat(who, ": produced a non-finite eigenvector entry A(",
                                             k % n, ", ", k / n, ")"));
  }
}

/// Validation, finiteness checks and profiling region around Impl::run.
template <class Impl, class ExecSpace, class AView>
void cholesky_inverse_with(const ExecSpace &space, const AView &A) {
  check_matrix_type<ExecSpace, AView>();
  using Scalar = typename AView::non_const_value_type;
  const std::string who = "kat::cholesky_inverse (" + Impl::template routine<Scalar>() + ")";
  check_square_contiguous(who, A);
  if (A.extent(0) == 0) {
    return;
  }
  ScopedRegion region("kat::cholesky_inverse");
  check_finite_input(space, who, A);
  Impl::run(space, A);
  if (const std::int64_t k = first_nonfinite(space, A, false); k >= 0) {
    const std::int64_t n = static_cast<std::int64_t>(A.extent(0));
    throw NumericalError(kat::detail::concat(who, ": the inverse has a non-finite entry A(", k % n,
                                             ", ", k / n,
                                             "): A is numerically singular in this precision"));
  }
}

template <class MemorySpace> void require_vendor() {
  static_assert(has_vendor<MemorySpace>,
                "kat::linalg::Vendor: no vendor solver is compiled in for this memory space "
                "(LAPACK serves Kokkos::HostSpace; configure with KAT_ENABLE_CUSOLVER or "
                "KAT_ENABLE_ROCSOLVER for CUDA or HIP memory); use kat::linalg::Portable");
}

} // namespace detail
} // namespace linalg

/// Eigendecomposition A = Q diag(w) Qᵀ of a real symmetric matrix.
///
/// @param space  execution space instance the work runs on (the vendor solvers use its
///               stream on CUDA/HIP; LAPACK fences it and runs on the calling thread).
/// @param A  n x n LayoutLeft contiguous view of float or double. Only the lower triangle
///           (i >= j) is read. Overwritten by the orthonormal eigenvectors: column k of A is
///           the eigenvector of w(k).
/// @param w  contiguous rank-1 view of length n in A's memory space; receives the eigenvalues
///           in ascending order.
///
/// Without a tag: LAPACK ssyevd/dsyevd (divide and conquer) on host memory,
/// cusolverDnSsyevd/Dsyevd on CUDA memory, rocsolver_ssyevd/dsyevd on HIP memory, where
/// compiled in; otherwise the portable parallel cyclic Jacobi solver (Golub & Van Loan,
/// Matrix Computations, 4th ed., §8.5). Jacobi is used there because each rotation touches
/// only two rows and columns, so it maps onto plain data-parallel kernels; the parallel
/// (round-robin, "chess tournament") ordering described in §8.5 is used instead of the
/// cyclic-by-row one because it groups the n(n-1)/2 rotations of a sweep into n-1 rounds of
/// n/2 disjoint, commuting rotations, each round a few parallel kernels, where cyclic-by-row
/// would need n(n-1)/2 dependent steps. It stops when the off-diagonal Frobenius norm falls
/// below eps·sqrt(n)·‖A‖_F, and gives up after 50 sweeps (K-FAC-sized factors need 7 to
/// 11). Eigenvectors are determined up to sign (and, for repeated eigenvalues, up to a
/// rotation within their eigenspace), so the two paths may differ in those.
///
/// n == 0 does nothing.
///
/// @throws ShapeError if A is not square or not contiguous, or w.extent(0) != n.
/// @throws NumericalError if the lower triangle of A holds a NaN or Inf (checked on the device
///   before the solver runs), if the solver fails to converge, or if its output is not finite.
///   A and w are then unspecified.
/// @throws ValueError if the vendor path gets a problem too large for its 32-bit integers
///   (xSYEVD's workspace exceeds them from n ≈ 32,000).
/// @throws Error if the vendor library reports an internal failure (handle creation, status).
template <class ExecSpace, class AView, class WView>
void symmetric_eigen(const ExecSpace &space, const AView &A, const WView &w) {
  linalg::detail::symmetric_eigen_with<
      linalg::detail::SymmetricEigen<typename AView::memory_space>>(space, A, w);
}

/// symmetric_eigen with the portable Kokkos implementation (parallel cyclic Jacobi),
/// whatever the memory space.
template <class ExecSpace, class AView, class WView>
void symmetric_eigen(const ExecSpace &space, const AView &A, const WView &w, linalg::Portable) {
  linalg::detail::symmetric_eigen_with<linalg::detail::PortableSymmetricEigen>(space, A, w);
}

/// symmetric_eigen with the vendor solver of the memory space (LAPACK xSYEVD, cuSOLVER
/// cusolverDn<t>syevd, rocSOLVER rocsolver_<t>syevd); does not compile where there is none.
template <class ExecSpace, class AView, class WView>
void symmetric_eigen(const ExecSpace &space, const AView &A, const WView &w, linalg::Vendor) {
  linalg::detail::require_vendor<typename AView::memory_space>();
  linalg::detail::symmetric_eigen_with<
      linalg::detail::SymmetricEigen<typename AView::memory_space>>(space, A, w);
}

/// Inverse of a symmetric positive definite matrix through its Cholesky factorization
/// A = L Lᵀ.
///
/// @param space  execution space instance the work runs on.
/// @param A  n x n LayoutLeft contiguous view of float or double, symmetric positive
///           definite. Only the lower triangle (i >= j) is read. Overwritten by the FULL
///           symmetric A⁻¹ (both triangles, exactly symmetric).
///
/// Without a tag: LAPACK spotrf+spotri / dpotrf+dpotri on host memory, cusolverDn<t>potrf +
/// cusolverDn<t>potri on CUDA memory, rocsolver_<t>potrf + rocsolver_<t>potri on HIP memory,
/// where compiled in; otherwise the portable path: right-looking (outer-product) Cholesky
/// (Golub & Van Loan §4.2), triangular inverse X = L⁻¹, and A⁻¹ = Xᵀ X, all in Kokkos kernels.
///
/// n == 0 does nothing.
///
/// @throws ShapeError if A is not square or not contiguous.
/// @throws NumericalError if the lower triangle of A holds a NaN or Inf (checked before the
///   factorization), if A is not positive definite (the message gives the order of the first
///   leading minor that is not), or if the inverse is not finite. A is then unspecified.
/// @throws ValueError if the vendor path gets n beyond its 32-bit integers.
/// @throws Error if the vendor library reports an internal failure (handle creation, status).
template <class ExecSpace, class AView>
void cholesky_inverse(const ExecSpace &space, const AView &A) {
  linalg::detail::cholesky_inverse_with<
      linalg::detail::CholeskyInverse<typename AView::memory_space>>(space, A);
}

/// cholesky_inverse with the portable Kokkos implementation, whatever the memory space.
template <class ExecSpace, class AView>
void cholesky_inverse(const ExecSpace &space, const AView &A, linalg::Portable) {
  linalg::detail::cholesky_inverse_with<linalg::detail::PortableCholeskyInverse>(space, A);
}

/// cholesky_inverse with the vendor solver of the memory space (LAPACK xPOTRF + xPOTRI,
/// cuSOLVER, rocSOLVER); does not compile where there is none.
template <class ExecSpace, class AView>
void cholesky_inverse(const ExecSpace &space, const AView &A, linalg::Vendor) {
  linalg::detail::require_vendor<typename AView::memory_space>();
  linalg::detail::cholesky_inverse_with<
      linalg::detail::CholeskyInverse<typename AView::memory_space>>(space, A);
}

} // namespace kat
