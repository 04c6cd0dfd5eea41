#pragma once
/// @file
/// @brief KAT's entry point for dense matrix products, over Kokkos Kernels.

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"

#include <KokkosBlas1_scal.hpp>
#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

namespace kat {

/// Transposition of a gemm operand.
enum class Trans : char { N = 'N', T = 'T' };

/// `C = alpha * op(A) * op(B) + beta * C` through `KokkosBlas::gemm` (which calls the vendor
/// BLAS — OpenBLAS on host, cuBLAS/rocBLAS when Kokkos Kernels is built with them).
///
/// @param space  execution space instance. Kokkos Kernels 3.4 has no instance overload, so
///               the product is issued on the default instance of `ExecSpace`; callers that
///               use other instances must order the work themselves.
/// @param A,B,C  rank-2 LayoutLeft views; op(A) is m x k, op(B) is k x n, C is m x n.
/// @throws ShapeError if the inner or outer dimensions disagree.
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace & /*space*/, Trans trans_a, Trans trans_b,
          typename CView::const_value_type alpha, const AView &A, const BView &B,
          typename CView::const_value_type beta, const CView &C) {
  static_assert(Kokkos::is_view<AView>::value && Kokkos::is_view<BView>::value &&
                    Kokkos::is_view<CView>::value,
                "kat::gemm: A, B and C must be Kokkos views");
  static_assert(AView::rank == 2 && BView::rank == 2 && CView::rank == 2,
                "kat::gemm: A, B and C must be rank 2");
  const bool ta = trans_a == Trans::T;
  const bool tb = trans_b == Trans::T;
  const auto m = ta ? A.extent(1) : A.extent(0);
  const auto k = ta ? A.extent(0) : A.extent(1);
  const auto kb = tb ? B.extent(1) : B.extent(0);
  const auto n = tb ? B.extent(0) : B.extent(1);
  if (k != kb || C.extent(0) != m || C.extent(1) != n) {
    throw ShapeError(detail::concat("kat::gemm: op(A) is ", m, "x", k, ", op(B) is ", kb, "x", n,
                                    ", C is ", C.extent(0), "x", C.extent(1),
                                    "; expected op(A) m x k, op(B) k x n, C m x n"));
  }
  if (m == 0 || n == 0) {
    return;
  }
  const char ta_s[2] = {static_cast<char>(trans_a), '\0'};
  const char tb_s[2] = {static_cast<char>(trans_b), '\0'};
  if (k == 0) {
    // BLAS leaves C untouched for k == 0 only when beta == 1; scale explicitly.
    KokkosBlas::scal(C, beta, C);
    return;
  }
  KokkosBlas::gemm(ta_s, tb_s, alpha, A, B, beta, C);
}

} // namespace kat
