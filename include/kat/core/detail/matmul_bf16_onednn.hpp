#pragma once
/// @file
/// @brief kat::MixedPrecisionGemm's host path: oneDNN's matmul primitive with bf16 operands
/// and an f32 destination (f32 accumulation). oneDNN picks the kernel for the CPU it runs on:
/// AMX tiles (Sapphire Rapids), AVX512-BF16 (Cooper Lake, Zen 4) or an emulation on other
/// AVX-512 cores; Plan::implementation() says which.

#include "kat/core/detail/onednn_base.hpp"
#include "kat/core/dnn.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"

#include <cstddef>
#include <string>

namespace kat::detail {

/// Fewest rows of C per block of a split product.
constexpr std::size_t onednn_min_rows_per_batch = 256;

/// Into how many equal blocks of rows OnednnBf16MatmulPlan splits C (and op(A)) for problem
/// `p`, given the implementation oneDNN chose for the whole product: p.threads blocks for a
/// tall product of bf16 operands (m a multiple of p.threads, at least
/// onednn_min_rows_per_batch rows a block and at least 4 n), else 1.
///
/// Why: oneDNN 2.6 runs such products (a Dense layer's forward and dx with N·P rows, as in a
/// ViT: 2048 x 64 -> 192) on its `brg` kernels about as fast on two threads as on one
/// (docs/benchmarks.md, "oneDNN's bf16 products on two threads"); described as a batch of
/// blocks of rows (op(B) shared), it runs them on `gemm:jit`, 1.3 to 1.5 times faster on two
/// threads of AMD Zen 5. An implementation on AMX tiles is kept whole: not measured.
inline std::size_t onednn_row_batches(const MatmulProblem &p, const std::string &whole_impl) {
  const std::size_t t = p.threads;
  if (!p.bf16_operands || t < 2 || p.m % t != 0 || p.m / t < onednn_min_rows_per_batch ||
      p.m < 4 * p.n || whole_impl.find("amx") != std::string::npos) {
    return 1;
  }
  return t;
}

#if defined(KAT_ENABLE_ONEDNN)

/// oneDNN's matmul for one MatmulProblem: the two f32 operands are converted (reordered) to
/// bf16 in the layouts the primitive chose, or, with bf16_operands, bf16 operands are read in
/// their own column-major layouts; the product is accumulated in f32 and written to C with
/// alpha as the output scale and beta as a sum post-op.
class OnednnBf16MatmulPlan {
public:
  /// @throws dnnl::error when oneDNN has no bf16 matmul for this CPU (the caller falls back).
  explicit OnednnBf16MatmulPlan(const MatmulProblem &p) : problem_(p), stream_(onednn_engine()) {
    using namespace dnnl;
    using dim = memory::dim;
    const engine &eng = onednn_engine();
    const dim m = dim(p.m), n = dim(p.n), k = dim(p.k);
    // The operands in KAT's memory are f32, or bf16 already with bf16_operands.
    const OnednnMatmulDescs descs =
        onednn_matmul_descs(p, p.bf16_operands ? memory::data_type::bf16 : memory::data_type::f32);
    src_ = descs.src, wei_ = descs.wei, dst_ = descs.dst;
    const primitive_attr attr = onednn_matmul_attr(p.alpha, p.beta);
    if (p.bf16_operands) {
      // Read in place: AMX's brgemm kernels take plain layouts of either order.
      pd_ = matmul::primitive_desc(matmul::desc(src_, wei_, dst_), attr, eng);
      split_rows(p, attr);
      matmul_ = matmul(pd_);
      implementation_ = pd_.impl_info_str();
      return;
    }
    // The bf16 copy of op(B)^T keeps the f32 operand's order (a plain conversion, no
    // transposition) when oneDNN takes it so; otherwise oneDNN's choice.
    const bool src_cols = p.trans_b != 'T';
    const memory::desc src_same({n, k}, memory::data_type::bf16,
                                src_cols ? memory::format_tag::ba : memory::format_tag::ab);
    const memory::desc src_any({n, k}, memory::data_type::bf16, memory::format_tag::any);
    const memory::desc wei_any({k, m}, memory::data_type::bf16, memory::format_tag::any);
    pd_ = matmul::primitive_desc(matmul::desc(src_same, wei_any, dst_), attr, eng);
    if (std::string(pd_.impl_info_str()).rfind("ref", 0) == 0) {
      pd_ = matmul::primitive_desc(matmul::desc(src_any, wei_any, dst_), attr, eng);
    }
    matmul_ = matmul(pd_);
    src_bf16_ = memory(pd_.src_desc(), eng);
    wei_bf16_ = memory(pd_.weights_desc(), eng);
    to_src_ = reorder(reorder::primitive_desc(eng, src_, eng, pd_.src_desc()));
    to_wei_ = reorder(reorder::primitive_desc(eng, wei_, eng, pd_.weights_desc()));
    implementation_ = pd_.impl_info_str();
  }

  const MatmulProblem &problem() const { return problem_; }

  /// The blocks of C's rows the product runs as (onednn_row_batches): 1, or a batch of that
  /// many products sharing op(B).
  std::size_t row_batches() const { return row_batches_; }

  /// The kernel oneDNN chose, e.g. "brg:avx512_core_amx" (AMX tiles) or
  /// "brg:avx512_core_bf16".
  const std::string &implementation() const { return implementation_; }

  /// C from A and B: f32 operands converted here, or bf16 operands (bf16_operands) read as
  /// they are.
  void run(const void *a, const void *b, float *c) {
    using namespace dnnl;
    const engine &eng = onednn_engine();
    memory b_mem(src_, eng, const_cast<void *>(b));
    memory a_mem(wei_, eng, const_cast<void *>(a));
    memory c_mem(dst_, eng, c);
    memory src = b_mem, wei = a_mem;
    if (!problem_.bf16_operands) {
      ScopedRegion region("kat::gemm_bf16::convert");
      to_src_.execute(stream_, b_mem, src_bf16_);
      to_wei_.execute(stream_, a_mem, wei_bf16_);
      src = src_bf16_;
      wei = wei_bf16_;
    }
    ScopedRegion region("kat::gemm_bf16::matmul");
    matmul_.execute(stream_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, c_mem}});
    stream_.wait();
  }

private:
  /// Where onednn_row_batches(p) > 1: describes the product as a batch of that many blocks of
  /// C's rows sharing op(B) (the same memory, 3-D descriptors: C^T (n x m) as b x n x m/b,
  /// op(A)^T (k x m) as b x k x m/b, op(B)^T broadcast) and keeps it when oneDNN has a kernel
  /// for it other than its reference one.
  void split_rows(const MatmulProblem &p, const dnnl::primitive_attr &attr) {
    using namespace dnnl;
    using dim = memory::dim;
    const std::size_t b = onednn_row_batches(p, pd_.impl_info_str());
    if (b == 1) {
      return;
    }
    const dim rows = dim(p.m / b), n = dim(p.n), k = dim(p.k);
    // A block of C's rows is a block of `rows` columns of op(A)^T.
    const memory::dims sa = onednn_transposed_strides(p.trans_a, p.lda),
                       sb = onednn_transposed_strides(p.trans_b, p.ldb);
    const auto bf16 = memory::data_type::bf16;
    const memory::desc src({1, n, k}, bf16, memory::dims{n * k, sb[0], sb[1]});
    const memory::desc wei({dim(b), k, rows}, bf16, memory::dims{rows * sa[1], sa[0], sa[1]});
    const memory::desc dst({dim(b), n, rows}, memory::data_type::f32,
                           memory::dims{rows, dim(p.ldc), 1});
    matmul::primitive_desc split;
    try {
      split = matmul::primitive_desc(matmul::desc(src, wei, dst), attr, onednn_engine());
    } catch (const dnnl::error &) {
      return; // no kernel for the batch: the whole product stays
    }
    if (std::string(split.impl_info_str()).rfind("ref", 0) == 0) {
      return;
    }
    pd_ = split;
    src_ = src, wei_ = wei, dst_ = dst;
    row_batches_ = b;
  }

  MatmulProblem problem_;
  dnnl::stream stream_;
  // op(B)^T, op(A)^T, C^T in KAT's memory (the operands in bf16 for bf16_operands)
  dnnl::memory::desc src_, wei_, dst_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul matmul_;
  dnnl::memory src_bf16_, wei_bf16_;
  dnnl::reorder to_src_, to_wei_;
  std::string implementation_; // pd_'s, read once
  std::size_t row_batches_ = 1;
};

#endif

} // namespace kat::detail
