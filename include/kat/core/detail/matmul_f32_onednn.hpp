#pragma once
/// @file
/// @brief Internal: kat::gemm's host path for the float products `C = alpha Aᵀ B + beta C`
/// whose inner dimension is long (weight gradients dW = dyᵀ x and K-FAC's factors xᵀx over
/// a batch at least twice as long as the layer is wide): oneDNN's matmul primitive, which ran
/// them 1.0 to 4.7 times as fast as `dnnl_sgemm` on AMD Zen 5 (docs/benchmarks.md, "The float
/// weight gradients on oneDNN's matmul").

#include "kat/core/detail/onednn_base.hpp"

#include <cstddef>
#include <string>

namespace kat::detail {

/// Whether kat::gemm computes a float product `C = alpha op(A) op(B) + beta C` (m x n, inner
/// dimension k) with oneDNN's matmul primitive (where it has a `brg` kernel for it) instead of
/// `dnnl_sgemm`: for op(A) = Aᵀ and op(B) = B, weight gradients over a batch longer than the
/// layer is wide, when
/// - k is at least 8 max(m, n), or
/// - k is at least 2 max(m, n), both m and n are at least 16 and m n k at least 2^17.
///
/// oneDNN 2.6's `dnnl_sgemm` runs such products at 45 to 260 GFLOP/s on AMD Zen 5 (192 x 64
/// from 2048 rows: 137 GFLOP/s). The matmul primitive, both on their own operands and in
/// alternating order, on 2 threads there:
/// - k >= 8 max(m, n): 1.05 to 2.8 times as fast in every shape measured;
/// - 2 max(m, n) <= k < 8 max(m, n), m, n >= 16: 1.03 to 4.7 (512 x 64 from 2048 rows: 3.0),
///   1.0 on 1024 x 1024, and 0.77 to 0.89 on 32 x 32 from 64 rows (0.4 µs), which the size
///   bound leaves out; 1.0 to 1.34 on 1 thread;
/// - with a side of 10 (a classifier's weights) there: 0.78 to 1.27, so those take it only from
///   k = 8 max(m, n);
/// - k < 2 max(m, n): 0.61 to 2.1 (an MLP's weight gradient, 256 x 784 from 128 rows: 0.88;
///   1024 x 1024 x 1024: 0.94).
///
/// For N N and N T it was no faster in general, so those stay on `dnnl_sgemm`
/// (docs/benchmarks.md, "The float weight gradients on oneDNN's matmul" and "Weight gradients
/// over a batch two to eight times the layer's width").
constexpr bool onednn_f32_matmul_preferred(char trans_a, char trans_b, std::size_t m, std::size_t n,
                                           std::size_t k) {
  if (trans_a != 'T' || trans_b != 'N') {
    return false;
  }
  const std::size_t widest = m > n ? m : n, narrowest = m > n ? n : m;
  return k >= 8 * widest || (k >= 2 * widest && narrowest >= 16 &&
                             double(m) * double(n) * double(k) >= double(1 << 17));
}

#if defined(KAT_ENABLE_ONEDNN)

/// oneDNN's f32 matmul for one MatmulProblem (bf16_operands false): A and B read in place in
/// their column-major layouts, alpha as the output scale and beta as a sum post-op, so C^T is
/// written as row-major n x m (KAT's column-major C). usable() is false, and run() must not be
/// called, where oneDNN has no such matmul or only one other than its `brg` kernels (on CPUs
/// without AVX-512 it would run the same GEMM as `dnnl_sgemm`, behind a primitive).
class OnednnF32MatmulPlan {
public:
  explicit OnednnF32MatmulPlan(const MatmulProblem &p) : problem_(p), stream_(onednn_engine()) {
    using namespace dnnl;
    const OnednnMatmulDescs descs = onednn_matmul_descs(p, memory::data_type::f32);
    src_ = descs.src, wei_ = descs.wei, dst_ = descs.dst;
    try {
      const matmul::primitive_desc pd(matmul::desc(src_, wei_, dst_),
                                      onednn_matmul_attr(p.alpha, p.beta), onednn_engine());
      if (std::string(pd.impl_info_str()).rfind("brg", 0) == 0) {
        matmul_ = matmul(pd);
        usable_ = true;
      }
    } catch (const dnnl::error &) {
      // no f32 matmul for this problem: not usable, dnnl_sgemm computes it
    }
  }

  const MatmulProblem &problem() const { return problem_; }

  /// Whether oneDNN computes the problem with one of its `brg` kernels (run() may be called).
  bool usable() const { return usable_; }

  /// C from A and B (the problem's column-major matrices).
  /// @throws dnnl::error if oneDNN fails to run the product.
  void run(const float *a, const float *b, float *c) {
    using namespace dnnl;
    const engine &eng = onednn_engine();
    memory src(src_, eng, const_cast<float *>(b)), wei(wei_, eng, const_cast<float *>(a));
    memory dst(dst_, eng, c);
    matmul_.execute(stream_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream_.wait();
  }

private:
  MatmulProblem problem_;
  dnnl::stream stream_;
  dnnl::memory::desc src_, wei_, dst_; // op(B)^T, op(A)^T, C^T
  dnnl::matmul matmul_;
  bool usable_ = false;
};

/// The calling thread's f32 matmul plans. One cache per thread: oneDNN's default (library)
/// scratchpad lets a primitive run only on the thread that created it.
inline OnednnPlanCache<MatmulProblem, OnednnF32MatmulPlan, 64> &onednn_f32_matmul_plans() {
  thread_local OnednnPlanCache<MatmulProblem, OnednnF32MatmulPlan, 64> plans;
  return plans;
}

#endif // KAT_ENABLE_ONEDNN

} // namespace kat::detail
