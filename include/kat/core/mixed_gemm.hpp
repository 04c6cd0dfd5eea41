#pragma once
/// @file
/// @brief kat::MixedPrecisionGemm: kat::gemm in a chosen kat::Precision, with bf16 operands
/// and fp32 accumulation through the vendor library where one serves the space.

#include "kat/core/bfloat16.hpp"
#include "kat/core/blas.hpp"
#include "kat/core/detail/gemm_bf16_cublas.hpp"
#include "kat/core/detail/matmul_bf16_onednn.hpp"
#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/precision.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>

namespace kat {

/// Which implementation a MixedPrecisionGemm used for its last bf16 product.
enum class Bf16GemmPath {
  none,     ///< no bf16 product yet
  onednn,   ///< oneDNN's bf16 matmul (host memory, KAT_ENABLE_ONEDNN)
  cublas,   ///< cuBLAS's bf16 GEMM, cublasGemmEx (CUDA memory, KAT_ENABLE_CUBLAS)
  portable, ///< operands rounded to bf16 by a Kokkos kernel, then kat::gemm in fp32
};

namespace detail {

/// dst(i, j) from src(i, j) across bf16: rounded to a kat::bfloat16 (dst bf16), widened
/// exactly (src bf16), or rounded to bf16 and kept in the source's type (neither).
template <class Src, class Dst> struct ConvertBf16 {
  Src src;
  Dst dst;
  /// One value across bf16, as operator() converts src(i, j).
  KOKKOS_INLINE_FUNCTION static typename Dst::non_const_value_type
  convert(typename Src::non_const_value_type v) {
    if constexpr (std::is_same_v<typename Dst::non_const_value_type, bfloat16>) {
      return bfloat16::from_float(v);
    } else if constexpr (std::is_same_v<typename Src::non_const_value_type, bfloat16>) {
      return v.to_float();
    } else {
      return round_to_bf16(v);
    }
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i, std::size_t j) const {
    dst(i, j) = convert(src(i, j));
  }
};

/// [src 1] across bf16: dst(i, j) as ConvertBf16 for the `in` columns of src, 1 (exact in
/// bf16) in dst's column `in`.
template <class Src, class Dst> struct ConvertBf16OnesColumn {
  ConvertBf16<Src, Dst> rounded;
  std::size_t in;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i, std::size_t j) const {
    rounded.dst(i, j) =
        rounded.convert(j < in ? rounded.src(i, j) : typename Src::non_const_value_type(1));
  }
};

} // namespace detail

/// A matrix rounded to bf16 once, for several bf16 products of a MixedPrecisionGemm: a Dense
/// layer rounds its input x and weights W in forward and reuses them for dW = dyᵀx and
/// dx = dy W in backward, where each product rounded both operands again (half of the
/// conversions a bf16 ViT step spent more time in than in its products; docs/precision.md).
///
/// Where a vendor bf16 GEMM serves the memory space (float in host memory with KAT built with
/// KAT_ENABLE_ONEDNN: oneDNN's matmul; float in CUDA memory with KAT_ENABLE_CUBLAS:
/// cublasGemmEx) the values are stored as kat::bfloat16, which the library reads directly;
/// elsewhere as Scalar values rounded to bf16, which kat::gemm multiplies in fp32. Either way a
/// product of two operands equals MixedPrecisionGemm's product of the unrounded matrices.
///
/// The caller owns the validity: after assign(), the operand holds the source's values of
/// that moment, whatever happens to the source later.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class Bf16Operand {
public:
  /// Whether the values are stored as kat::bfloat16 (oneDNN's or cuBLAS's path) or as Scalar.
  static constexpr bool stores_bf16 =
#if defined(KAT_ENABLE_ONEDNN)
      (std::is_same_v<Scalar, float> &&
       Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) ||
#endif
      detail::cublas_bf16_memory<Scalar, MemorySpace>();
  /// The element type of the stored matrix.
  using storage_type = std::conditional_t<stores_bf16, bfloat16, Scalar>;
  /// The stored matrix: column-major, rows() x cols(), contiguous.
  using matrix_type =
      Kokkos::View<storage_type **, Kokkos::LayoutLeft, MemorySpace, Kokkos::MemoryUnmanaged>;

  /// Rounds `src` (rows x cols, any rank-2 view of Scalar in MemorySpace) into the operand, on
  /// `space`. Storage grows to the largest matrix assigned and is then reused.
  template <class ExecSpace, class View> void assign(const ExecSpace &space, const View &src) {
    const std::size_t rows = src.extent(0), cols = src.extent(1);
    resize(rows, cols);
    parallel_for_matrix("kat::Bf16Operand::assign", space, rows, cols,
                        detail::ConvertBf16<View, matrix_type>{src, matrix_});
  }

  /// Rounds [src 1] into the operand: `src` (rows x cols) and a column of ones after it, a
  /// rows x (cols + 1) matrix; a product with [W b] then adds a Dense layer's bias itself.
  /// `leading_columns()` is src rounded, the same values assign(src) stores.
  template <class ExecSpace, class View>
  void assign_with_ones_column(const ExecSpace &space, const View &src) {
    const std::size_t rows = src.extent(0), cols = src.extent(1);
    resize(rows, cols + 1);
    parallel_for_matrix("kat::Bf16Operand::assign_with_ones_column", space, rows, cols + 1,
                        detail::ConvertBf16OnesColumn<View, matrix_type>{{src, matrix_}, cols});
  }

  /// The first `cols` columns of matrix() (a contiguous block of the column-major storage):
  /// the rounded src of assign_with_ones_column(), or the weights W of an assigned [W b].
  /// @throws ShapeError if cols exceeds matrix()'s columns.
  matrix_type leading_columns(std::size_t cols) const {
    if (cols > matrix_.extent(1)) {
      throw ShapeError(detail::concat("kat::Bf16Operand::leading_columns: cols must be <= ",
                                      matrix_.extent(1), ", got ", cols));
    }
    return matrix_type(matrix_.data(), matrix_.extent(0), cols);
  }

  /// Makes matrix() a rows x cols matrix without writing it, for a kernel that writes the
  /// rounded values itself (Conv2d's im2col writes its patches so); storage as in assign().
  /// Scalar storage must receive values already rounded to bf16 (kat::round_to_bf16).
  const matrix_type &resize(std::size_t rows, std::size_t cols) {
    if (buffer_.extent(0) < rows * cols) {
      buffer_ = Kokkos::View<storage_type *, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::Bf16Operand"), rows * cols);
    }
    matrix_ = matrix_type(buffer_.data(), rows, cols);
    return matrix_;
  }

  /// The rounded matrix of the last assign() or resize() (0 x 0 before one).
  const matrix_type &matrix() const { return matrix_; }

private:
  Kokkos::View<storage_type *, MemorySpace> buffer_;
  matrix_type matrix_;
};

/// Computes `C = alpha op(A) op(B) + beta C` as kat::gemm does, in a chosen Precision.
///
/// With Precision::fp32 it is kat::gemm. With Precision::bf16 both operands are rounded to
/// bfloat16 (round to nearest even) and the products are summed in fp32, as a bf16 matrix unit
/// does (Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training", 2019, sec. 3):
/// - float views in host memory, KAT built with KAT_ENABLE_ONEDNN: oneDNN's matmul with bf16
///   operands and an f32 destination (AMX or AVX512-BF16 kernels where the CPU has them;
///   implementation() names the one chosen). Where oneDNN has no bf16 matmul for the CPU,
///   the portable path below, chosen once and reported by onednn_unavailable_reason().
/// - float views on Kokkos::Cuda, KAT built with KAT_ENABLE_CUBLAS: the operands rounded to
///   bf16 storage by a Kokkos kernel on the same stream, then cuBLAS's cublasGemmEx with bf16
///   operands, an fp32 result and CUBLAS_COMPUTE_32F (tensor cores).
/// - everywhere else (HIP, builds without either library, double): the operands are rounded
///   to bf16 into fp32 scratch matrices by a Kokkos kernel and multiplied by kat::gemm, which
///   gives the same rounding of the operands and an fp32 accumulation.
///
/// Error bound of one entry (bf16's unit roundoff u = 2^-8 per rounded operand): with fp32
/// accumulation over k terms, |C_bf16 - C_fp32| <= (2u + u^2 + k eps_fp32) sum_l |a_il||b_lj|,
/// i.e. about 2^-7 of the sum of absolute products for the k of training.
///
/// One object per call site that keeps its scratch and plans: a layer owns one. Not
/// thread-safe; calls from one host thread.
///
/// @tparam Scalar       the views' value type (float; double for the gradient checks).
/// @tparam MemorySpace  where A, B and C live.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class MixedPrecisionGemm {
public:
  /// See the class comment. A, B and C are rank-2 views with value type Scalar in
  /// MemorySpace; their first dimension contiguous for the oneDNN path (others take the
  /// portable one).
  /// @throws ShapeError if op(A) is not m x k, op(B) k x n and C m x n.
  /// @throws Error if oneDNN or cuBLAS reports a failure while running a product.
  template <class ExecSpace, class AView, class BView, class CView>
  void operator()(const ExecSpace &space, Precision precision, Trans trans_a, Trans trans_b,
                  Scalar alpha, const AView &A, const BView &B, Scalar beta, const CView &C) {
    if (precision == Precision::fp32) {
      gemm(space, trans_a, trans_b, alpha, A, B, beta, C);
      return;
    }
    const std::array<std::size_t, 3> mnk =
        detail::gemm_dimensions("kat::MixedPrecisionGemm", trans_a, trans_b, A, B, C);
    const std::size_t m = mnk[0], n = mnk[1], k = mnk[2];
    if (m == 0 || n == 0 || k == 0) {
      gemm(space, trans_a, trans_b, alpha, A, B, beta, C); // nothing to round
      return;
    }
    if constexpr (detail::onednn_gemm_available<ExecSpace, AView, BView, CView>()) {
      if (run_onednn(space, trans_a, trans_b, m, n, k, alpha, A, B, beta, C)) {
        return;
      }
    }
    if constexpr (detail::cublas_bf16_available<ExecSpace, Scalar, MemorySpace>()) {
      if (detail::blas_leading_dimension(C) != 0) {
        a_op_.assign(space, A);
        b_op_.assign(space, B);
        if (run_cublas(space, trans_a, trans_b, m, n, k, alpha, a_op_.matrix(), b_op_.matrix(),
                       beta, C)) {
          return;
        }
      }
    }
    ScopedRegion region("kat::gemm_bf16::portable");
    const auto a = convert("kat::gemm_bf16::round", space, A, a_);
    const auto b = convert("kat::gemm_bf16::round", space, B, b_);
    gemm(space, trans_a, trans_b, alpha, a, b, beta, C);
    path_ = Bf16GemmPath::portable;
  }

  /// `C = alpha op(A) op(B) + beta C` in bf16 from operands rounded already (Bf16Operand):
  /// the same numbers as the product of the unrounded matrices above, without rounding them
  /// again. oneDNN's matmul and cuBLAS's GEMM read bf16 storage directly (or, where oneDNN
  /// has no bf16 matmul for the CPU or C has no leading dimension, the operands are widened to
  /// Scalar, exactly, for kat::gemm); Scalar storage goes to kat::gemm as it is.
  /// @throws ShapeError if op(A) is not m x k, op(B) k x n and C m x n.
  /// @throws Error if oneDNN or cuBLAS reports a failure while running the product.
  template <class ExecSpace, class CView>
  void operator()(const ExecSpace &space, Trans trans_a, Trans trans_b, Scalar alpha,
                  const Bf16Operand<Scalar, MemorySpace> &A,
                  const Bf16Operand<Scalar, MemorySpace> &B, Scalar beta, const CView &C) {
    (*this)(space, trans_a, trans_b, alpha, A.matrix(), B.matrix(), beta, C);
  }

  /// The same product from rounded matrices in a Bf16Operand's storage: an operand's
  /// matrix(), or a block of leading columns of one (the weights without their bias column).
  template <class ExecSpace, class CView>
  void operator()(const ExecSpace &space, Trans trans_a, Trans trans_b, Scalar alpha,
                  const typename Bf16Operand<Scalar, MemorySpace>::matrix_type &a,
                  const typename Bf16Operand<Scalar, MemorySpace>::matrix_type &b, Scalar beta,
                  const CView &C) {
    const std::array<std::size_t, 3> mnk =
        detail::gemm_dimensions("kat::MixedPrecisionGemm", trans_a, trans_b, a, b, C);
    const std::size_t m = mnk[0], n = mnk[1], k = mnk[2];
    if constexpr (Bf16Operand<Scalar, MemorySpace>::stores_bf16) {
      if constexpr (detail::cublas_bf16_available<ExecSpace, Scalar, MemorySpace>()) {
        if (m != 0 && n != 0 && k != 0 &&
            run_cublas(space, trans_a, trans_b, m, n, k, alpha, a, b, beta, C)) {
          return;
        }
      } else if (m != 0 && n != 0 && k != 0 &&
                 run_onednn(space, trans_a, trans_b, m, n, k, alpha, a, b, beta, C, true)) {
        return;
      }
      ScopedRegion region("kat::gemm_bf16::portable");
      gemm(space, trans_a, trans_b, alpha, convert("kat::gemm_bf16::widen", space, a, a_),
           convert("kat::gemm_bf16::widen", space, b, b_), beta, C);
    } else {
      gemm(space, trans_a, trans_b, alpha, a, b, beta, C);
    }
    path_ = Bf16GemmPath::portable;
  }

  /// The path of the last bf16 product.
  Bf16GemmPath last_path() const { return path_; }

  /// The vendor kernel of the last bf16 product on a vendor path: oneDNN's implementation
  /// (e.g. "brg:avx512_core_amx") or cuBLAS's routine; empty before one.
  const std::string &implementation() const { return implementation_; }

  /// Why oneDNN's bf16 matmul could not be used on this CPU (its error), empty if it could.
  const std::string &onednn_unavailable_reason() const { return onednn_unavailable_; }

private:
  /// `src` into a Scalar matrix of `scratch` through detail::ConvertBf16: rounded to bf16
  /// (Scalar src) or widened exactly (bf16 src).
  template <class ExecSpace, class View>
  static Matrix<Scalar, MemorySpace> convert(const char *label, const ExecSpace &space,
                                             const View &src,
                                             Workspace<Scalar, MemorySpace> &scratch) {
    const auto dst = scratch.matrix(src.extent(0), src.extent(1));
    parallel_for_matrix(label, space, dst.extent(0), dst.extent(1),
                        detail::ConvertBf16<View, Matrix<Scalar, MemorySpace>>{src, dst});
    return dst;
  }

#if defined(KAT_ENABLE_ONEDNN)
  /// The oneDNN plan for `p`, or nullptr when oneDNN has no bf16 matmul for this CPU (the
  /// reason kept in onednn_unavailable_).
  detail::OnednnBf16MatmulPlan *onednn_plan(const detail::MatmulProblem &p) {
    if (!onednn_unavailable_.empty()) {
      return nullptr;
    }
    try {
      return &plans_.get(p);
    } catch (const dnnl::error &e) {
      onednn_unavailable_ = e.what();
      return nullptr;
    }
  }
#endif

  /// The product on cuBLAS's bf16 GEMM from bf16 matrices `a` and `b` (contiguous, column-major,
  /// on `space`'s stream after the kernels that wrote them); false where cuBLAS cannot take it
  /// (C without a leading dimension, a size beyond 32-bit integers).
  template <class ExecSpace, class OperandMatrix, class CView>
  bool run_cublas(const ExecSpace &space, Trans trans_a, Trans trans_b, std::size_t m,
                  std::size_t n, std::size_t k, Scalar alpha, const OperandMatrix &a,
                  const OperandMatrix &b, Scalar beta, const CView &C) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(KAT_ENABLE_CUBLAS)
    static_assert(std::is_same_v<typename OperandMatrix::non_const_value_type, bfloat16>);
    const std::size_t lda = std::max<std::size_t>(1, a.extent(0));
    const std::size_t ldb = std::max<std::size_t>(1, b.extent(0));
    const std::size_t ldc = detail::blas_leading_dimension(C);
    if (ldc == 0 || !detail::cublas::fits_int(m, n, k, lda, ldb, ldc)) {
      return false;
    }
    detail::cublas::gemm_bf16(space.cuda_stream(), static_cast<char>(trans_a),
                              static_cast<char>(trans_b), m, n, k, alpha, a.data(), lda, b.data(),
                              ldb, beta, C.data(), ldc);
    path_ = Bf16GemmPath::cublas;
    if (implementation_.empty()) {
      implementation_ = "cublasGemmEx CUDA_R_16BF CUBLAS_COMPUTE_32F";
    }
    return true;
#else
    (void)space, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a;
    (void)b, (void)beta, (void)C;
    return false;
#endif
  }

  /// The product on oneDNN's bf16 matmul, A and B f32 (converted by the plan) or, with
  /// `bf16_operands`, Bf16Operand matrices; false where oneDNN cannot take it. Sets path_ and
  /// implementation_ when it ran, as run_cublas does.
  template <class ExecSpace, class AView, class BView, class CView>
  bool run_onednn(const ExecSpace &space, Trans trans_a, Trans trans_b, std::size_t m,
                  std::size_t n, std::size_t k, Scalar alpha, const AView &A, const BView &B,
                  Scalar beta, const CView &C, bool bf16_operands = false) {
#if defined(KAT_ENABLE_ONEDNN)
    detail::MatmulProblem p;
    p.trans_a = static_cast<char>(trans_a);
    p.trans_b = static_cast<char>(trans_b);
    p.m = m, p.n = n, p.k = k;
    p.lda = detail::blas_leading_dimension(A);
    p.ldb = detail::blas_leading_dimension(B);
    p.ldc = detail::blas_leading_dimension(C);
    p.alpha = alpha, p.beta = beta;
    p.bf16_operands = bf16_operands;
    p.threads = static_cast<std::size_t>(space.concurrency());
    if (p.lda == 0 || p.ldb == 0 || p.ldc == 0) {
      return false;
    }
    detail::OnednnBf16MatmulPlan *plan = onednn_plan(p);
    if (plan == nullptr) {
      return false;
    }
    space.fence(); // oneDNN's threads must see what kernels on `space` wrote
    try {
      plan->run(A.data(), B.data(), C.data());
    } catch (const dnnl::error &e) {
      throw Error(detail::concat("kat::MixedPrecisionGemm: oneDNN's bf16 matmul failed for m = ", m,
                                 ", n = ", n, ", k = ", k, ": ", e.what()));
    }
    if (implementation_ != plan->implementation()) { // no string copy per product
      implementation_ = plan->implementation();
    }
    path_ = Bf16GemmPath::onednn;
    return true;
#else
    (void)space, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)A;
    (void)B, (void)beta, (void)C, (void)bf16_operands;
    return false;
#endif
  }

  Workspace<Scalar, MemorySpace> a_{"kat::MixedPrecisionGemm::a"}, b_{"kat::MixedPrecisionGemm::b"};
  // The operands of a product of unrounded matrices, rounded for cuBLAS.
  Bf16Operand<Scalar, MemorySpace> a_op_, b_op_;
#if defined(KAT_ENABLE_ONEDNN)
  // A Dense layer's 3 products in both operand kinds, a Conv2d's more; shapes change with the
  // evaluation batch.
  detail::OnednnPlanCache<detail::MatmulProblem, detail::OnednnBf16MatmulPlan, 24> plans_;
#endif
  Bf16GemmPath path_ = Bf16GemmPath::none;
  std::string implementation_, onednn_unavailable_;
};

} // namespace kat
