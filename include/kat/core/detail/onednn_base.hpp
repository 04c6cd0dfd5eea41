#pragma once
/// @file
/// @brief Internal: what KAT's oneDNN plans share (kat/core/dnn.hpp's convolutions, pooling
/// and batch normalization, kat::gemm's and kat::MixedPrecisionGemm's matmuls): the process's
/// CPU engine, the per-owner cache of plans, and the description of one column-major product.

#include <cstddef>
#include <memory>
#include <vector>

#if defined(KAT_ENABLE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kat::detail {

/// One column-major product `C = alpha op(A) op(B) + beta C` (m x n, inner dimension k) with
/// its operands' leading dimensions: what a matmul plan is built for.
struct MatmulProblem {
  char trans_a = 'N', trans_b = 'N';
  std::size_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1, beta = 0;
  /// A and B are bf16 already (kat::Bf16Operand), read as they are; else f32 (which the bf16
  /// plan converts to bf16 and the f32 plan reads as they are).
  bool bf16_operands = false;
  /// The threads oneDNN runs on (the host execution space's concurrency): how many blocks of
  /// C's rows a tall product may be split into (see onednn_row_batches).
  std::size_t threads = 1;

  bool operator==(const MatmulProblem &o) const {
    return trans_a == o.trans_a && trans_b == o.trans_b && m == o.m && n == o.n && k == o.k &&
           lda == o.lda && ldb == o.ldb && ldc == o.ldc && alpha == o.alpha && beta == o.beta &&
           bf16_operands == o.bf16_operands && threads == o.threads;
  }
};

/// The plans of one owner (a layer, a product), one per problem seen, the oldest dropped beyond
/// `capacity` (a data set's smaller last batch, evaluation batches).
template <class Problem, class Plan, std::size_t Capacity = 4> class OnednnPlanCache {
public:
  static constexpr std::size_t capacity = Capacity;

  /// The plan for `p`, created on first use.
  Plan &get(const Problem &p) {
    for (auto &existing : plans_) {
      if (existing->problem() == p) {
        return *existing;
      }
    }
    if (plans_.size() == capacity) {
      plans_.erase(plans_.begin());
    }
    plans_.push_back(std::make_unique<Plan>(p));
    ++created_;
    return *plans_.back();
  }
  std::size_t created() const { return created_; }

private:
  std::vector<std::unique_ptr<Plan>> plans_;
  std::size_t created_ = 0;
};

#if defined(KAT_ENABLE_ONEDNN)

/// The process's oneDNN CPU engine (created on first use).
inline const dnnl::engine &onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// The strides (x, y) of op(X)^T for a column-major X with leading dimension ld: element
/// (x, y) is op(X)(y, x), i.e. X(y, x) at y + x ld ('N') or X(x, y) at x + y ld ('T'). A
/// column-major C = op(A) op(B) is the row-major C^T = op(B)^T op(A)^T, which is how KAT's
/// matmul plans describe a product to oneDNN.
inline dnnl::memory::dims onednn_transposed_strides(char trans, std::size_t ld) {
  using dim = dnnl::memory::dim;
  return trans == 'T' ? dnnl::memory::dims{1, dim(ld)} : dnnl::memory::dims{dim(ld), 1};
}

/// The memory descriptors of problem `p` as KAT's matmul plans give it to oneDNN, whose fast
/// kernels write a row-major destination: KAT's column-major C is the row-major storage of
/// C^T, so the primitive computes C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m), the operands
/// of type `operands` read in place, C^T in f32 (element (j, i) at i + j ldc).
struct OnednnMatmulDescs {
  dnnl::memory::desc src, wei, dst; ///< op(B)^T, op(A)^T, C^T
};
inline OnednnMatmulDescs onednn_matmul_descs(const MatmulProblem &p,
                                             dnnl::memory::data_type operands) {
  using dnnl::memory;
  using dim = memory::dim;
  const dim m = dim(p.m), n = dim(p.n), k = dim(p.k);
  return {memory::desc({n, k}, operands, onednn_transposed_strides(p.trans_b, p.ldb)),
          memory::desc({k, m}, operands, onednn_transposed_strides(p.trans_a, p.lda)),
          memory::desc({n, m}, memory::data_type::f32, memory::dims{dim(p.ldc), 1})};
}

/// The attributes of a matmul plan for `C = alpha op(A) op(B) + beta C`: alpha as the output
/// scale, beta as a sum post-op (none for alpha = 1, beta = 0).
inline dnnl::primitive_attr onednn_matmul_attr(float alpha, float beta) {
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) {
    attr.set_output_scales(0, {alpha});
  }
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  return attr;
}

#endif // KAT_ENABLE_ONEDNN

} // namespace kat::detail
