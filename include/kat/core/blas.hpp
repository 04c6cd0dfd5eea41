#pragma once
/// @file
/// @brief KAT's entry point for dense matrix-matrix and matrix-vector products, over Kokkos
/// Kernels, with float products on the host through oneDNN when KAT is built with it.

#include "kat/core/detail/blas_onednn.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"

#include <KokkosBlas1_scal.hpp>
#include <KokkosBlas2_gemv.hpp>
#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <type_traits>

/// 1 where Kokkos Kernels (4.1 and later) has the BLAS overloads taking an execution-space
/// instance; 3.x (and 4.0) issue every product on the default instance of the execution space.
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40100
#define KAT_KOKKOSBLAS_HAS_SPACE_ARGUMENT 1
#else
#define KAT_KOKKOSBLAS_HAS_SPACE_ARGUMENT 0
#endif

namespace kat {

namespace detail {

/// Whether `space` is the default instance of its execution space, i.e. whether work issued
/// on `ExecSpace()` is ordered with work issued on `space`. Host spaces of Kokkos 3.x and 4.0
/// (Serial, OpenMP, Threads) complete each kernel before returning, so any instance is as
/// good as the default; CUDA and HIP instances differ by their stream.
template <class ExecSpace> bool is_default_instance(const ExecSpace &space) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    return space.cuda_stream() == Kokkos::Cuda().cuda_stream();
  }
#endif
#if defined(KOKKOS_ENABLE_HIP)
#if KOKKOS_VERSION >= 40000
  using HIPSpace = Kokkos::HIP;
#else
  using HIPSpace = Kokkos::Experimental::HIP;
#endif
  if constexpr (std::is_same<ExecSpace, HIPSpace>::value) {
    return space.hip_stream() == HIPSpace().hip_stream();
  }
#endif
  (void)space;
  return true;
}

/// Runs `f` (which issues work on the default instance of ExecSpace) ordered with `space`:
/// directly when `space` is the default instance, otherwise after fencing `space` and
/// followed by a fence of the default instance.
template <class ExecSpace, class F> void on_default_instance(const ExecSpace &space, F &&f) {
  if (is_default_instance(space)) {
    f();
    return;
  }
  space.fence();
  f();
  ExecSpace().fence();
}

} // namespace detail

/// Transposition of a gemm operand.
enum class Trans : char { N = 'N', T = 'T' };

namespace detail {

/// The m, n and k of `C = alpha op(A) op(B) + beta C`.
/// @throws ShapeError, naming `who`, if the inner or outer dimensions disagree.
template <class AView, class BView, class CView>
std::array<std::size_t, 3> gemm_dimensions(const char *who, Trans trans_a, Trans trans_b,
                                           const AView &A, const BView &B, const CView &C) {
  const bool ta = trans_a == Trans::T;
  const bool tb = trans_b == Trans::T;
  const std::size_t m = ta ? A.extent(1) : A.extent(0);
  const std::size_t k = ta ? A.extent(0) : A.extent(1);
  const std::size_t kb = tb ? B.extent(1) : B.extent(0);
  const std::size_t n = tb ? B.extent(0) : B.extent(1);
  if (k != kb || C.extent(0) != m || C.extent(1) != n) {
    throw ShapeError(concat(who, ": op(A) is ", m, "x", k, ", op(B) is ", kb, "x", n, ", C is ",
                            C.extent(0), "x", C.extent(1),
                            "; expected op(A) m x k, op(B) k x n, C m x n"));
  }
  return {m, n, k};
}

} // namespace detail

/// `C = alpha * op(A) * op(B) + beta * C` through `KokkosBlas::gemm` (which calls the vendor
/// BLAS — OpenBLAS on host, cuBLAS/rocBLAS when Kokkos Kernels is built with them), or, for
/// float views in host memory in a build with KAT_ENABLE_ONEDNN, through oneDNN's `dnnl_sgemm`,
/// or its matmul primitive for Aᵀ B with a long inner dimension (kernels generated for the CPU at
/// hand; see kat/core/detail/blas_onednn.hpp). Views whose first dimension is strided take the
/// Kokkos Kernels path.
///
/// @param space  execution space instance the product runs on. With Kokkos Kernels >= 4.1 it is
///               passed to `KokkosBlas::gemm` (cuBLAS/rocBLAS then use its stream). Older
///               versions have no instance overload and issue the product on the default
///               instance of `ExecSpace`: when `space` is another instance (another CUDA or
///               HIP stream), KAT fences `space` before the product and the default instance
///               after it, so the product is still ordered with `space`'s work; with the
///               default instance (and on every host backend) nothing is added.
/// @param trans_a, trans_b  whether op(A), op(B) is the matrix (Trans::N) or its transpose (T)
/// @param alpha, beta  the scalars of the formula; beta = 0 overwrites C
/// @param A,B,C  rank-2 LayoutLeft views; op(A) is m x k, op(B) is k x n, C is m x n.
/// @throws ShapeError if the inner or outer dimensions disagree.
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace &space, Trans trans_a, Trans trans_b,
          typename CView::const_value_type alpha, const AView &A, const BView &B,
          typename CView::const_value_type beta, const CView &C) {
  static_assert(Kokkos::is_view<AView>::value && Kokkos::is_view<BView>::value &&
                    Kokkos::is_view<CView>::value,
                "kat::gemm: A, B and C must be Kokkos views");
  static_assert(AView::rank == 2 && BView::rank == 2 && CView::rank == 2,
                "kat::gemm: A, B and C must be rank 2");
  // Plain names, not a structured binding: C++17 lambdas cannot capture those.
  const std::array<std::size_t, 3> mnk =
      detail::gemm_dimensions("kat::gemm", trans_a, trans_b, A, B, C);
  const std::size_t m = mnk[0], n = mnk[1], k = mnk[2];
  if (m == 0 || n == 0) {
    return;
  }
  if constexpr (detail::onednn_gemm_available<ExecSpace, AView, BView, CView>()) {
    if (k > 0) {
      space.fence(); // oneDNN's threads must see what kernels on `space` wrote
      if (detail::onednn_gemm(static_cast<char>(trans_a), static_cast<char>(trans_b), m, n, k,
                              alpha, A, B, beta, C,
                              static_cast<std::size_t>(space.concurrency()))) {
        return;
      }
    }
  }
  const char ta_s[2] = {static_cast<char>(trans_a), '\0'};
  const char tb_s[2] = {static_cast<char>(trans_b), '\0'};
  // BLAS leaves C untouched for k == 0 only when beta == 1, so C is scaled explicitly then.
#if KAT_KOKKOSBLAS_HAS_SPACE_ARGUMENT
  if (k == 0) {
    KokkosBlas::scal(space, C, beta, C);
  } else {
    KokkosBlas::gemm(space, ta_s, tb_s, alpha, A, B, beta, C);
  }
#else
  detail::on_default_instance(space, [&] {
    if (k == 0) {
      KokkosBlas::scal(C, beta, C);
    } else {
      KokkosBlas::gemm(ta_s, tb_s, alpha, A, B, beta, C);
    }
  });
#endif
}

/// `y = alpha * op(A) * x + beta * y` through `KokkosBlas::gemv` (the vendor BLAS xGEMV on host,
/// cuBLAS/rocBLAS when Kokkos Kernels is built with them).
///
/// @param space  execution space instance the product runs on, with the same ordering rules as
///               gemm() (passed through with Kokkos Kernels >= 4.1, fenced around otherwise).
/// @param A  rank-2 LayoutLeft view; op(A) is m x k. A column range of a larger LayoutLeft
///           matrix (a subview with leading dimension > rows) is fine.
/// @param trans_a  whether op(A) is A (Trans::N) or its transpose (Trans::T)
/// @param alpha, beta  the scalars of the formula; beta = 0 overwrites y
/// @param x  rank-1 view of length k.
/// @param y  rank-1 view of length m; may not alias x.
/// @throws ShapeError if the lengths do not match op(A).
template <class ExecSpace, class AView, class XView, class YView>
void gemv(const ExecSpace &space, Trans trans_a, typename YView::const_value_type alpha,
          const AView &A, const XView &x, typename YView::const_value_type beta, const YView &y) {
  static_assert(Kokkos::is_view<AView>::value && Kokkos::is_view<XView>::value &&
                    Kokkos::is_view<YView>::value,
                "kat::gemv: A, x and y must be Kokkos views");
  static_assert(AView::rank == 2 && XView::rank == 1 && YView::rank == 1,
                "kat::gemv: A must be rank 2, x and y rank 1");
  const bool ta = trans_a == Trans::T;
  const auto m = ta ? A.extent(1) : A.extent(0);
  const auto k = ta ? A.extent(0) : A.extent(1);
  if (x.extent(0) != k || y.extent(0) != m) {
    throw ShapeError(detail::concat("kat::gemv: op(A) is ", m, "x", k, ", x has length ",
                                    x.extent(0), ", y has length ", y.extent(0),
                                    "; expected op(A) m x k, x of length k, y of length m"));
  }
  if (m == 0) {
    return;
  }
  const char ta_s[2] = {static_cast<char>(trans_a), '\0'};
  // BLAS leaves y untouched for k == 0 only when beta == 1, so y is scaled explicitly then.
#if KAT_KOKKOSBLAS_HAS_SPACE_ARGUMENT
  if (k == 0) {
    KokkosBlas::scal(space, y, beta, y);
  } else {
    KokkosBlas::gemv(space, ta_s, alpha, A, x, beta, y);
  }
#else
  detail::on_default_instance(space, [&] {
    if (k == 0) {
      KokkosBlas::scal(y, beta, y);
    } else {
      KokkosBlas::gemv(ta_s, alpha, A, x, beta, y);
    }
  });
#endif
}

} // namespace kat
