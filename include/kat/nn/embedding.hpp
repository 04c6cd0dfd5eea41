#pragma once
/// @file
/// @brief Token embedding: a lookup table of learned vectors indexed by token id.

#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/embedding_kernels.hpp"
#include "kat/nn/detail/normal.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace kat::nn {

namespace detail {

/// The number of invalid ids among the `tokens` values at `ids` (a reduction over the tokens
/// only, N·T values, against the N·T·D the gather writes).
template <class ExecSpace, class Scalar>
std::size_t embedding_count_invalid(const ExecSpace &space, const Scalar *ids, std::size_t tokens,
                                    std::size_t count) {
  std::size_t bad = 0;
  Kokkos::parallel_reduce("kat::nn::Embedding::count_invalid_ids",
                          Kokkos::RangePolicy<ExecSpace>(space, 0, tokens),
                          EmbeddingCountInvalid<Scalar>{ids, count}, bad);
  return bad;
}

/// out(r, d) = table(id_r, d) for the R = `tokens` ids and the D columns of the V x D
/// column-major `table` (out: R x D, column-major, contiguous), ids already validated. The
/// token index runs fastest, so writes are contiguous (coalesced on a GPU) and only the reads
/// of the table jump. One thread per token looping over d wrote with a stride of 4·R bytes,
/// twelve times slower for 2048 tokens of width 768; with a large vocabulary both orders are bound
/// by the reads of E(id, d), V·4 bytes apart for one id (docs/benchmarks.md, "Kernel design
/// choices, measured").
template <class ExecSpace, class Scalar>
void embedding_gather(const ExecSpace &space, const char *label, const Scalar *ids,
                      std::size_t tokens, const Scalar *table, std::size_t count, std::size_t dim,
                      Scalar *out) {
  Kokkos::parallel_for(label, matrix_policy(space, tokens, dim),
                       EmbeddingGather<Scalar>{out, tokens, table, ids, count});
}

/// The smallest token index r whose id is invalid (`tokens` if none).
template <class ExecSpace, class Scalar>
std::size_t embedding_first_invalid(const ExecSpace &space, const Scalar *ids, std::size_t tokens,
                                    std::size_t count) {
  std::size_t first = tokens;
  Kokkos::parallel_reduce(
      "kat::nn::Embedding::first_invalid_id", Kokkos::RangePolicy<ExecSpace>(space, 0, tokens),
      EmbeddingFirstInvalid<Scalar>{ids, count}, Kokkos::Min<std::size_t>(first));
  return first;
}

/// table(id_r, d) += in(r, d) for every token r and column d, with atomics since equal ids
/// add into the same row (ids already validated by the forward).
template <class ExecSpace, class Scalar>
void embedding_scatter_add(const ExecSpace &space, const char *label, const Scalar *ids,
                           std::size_t tokens, const Scalar *in, std::size_t count, std::size_t dim,
                           Scalar *table) {
  Kokkos::parallel_for(label, matrix_policy(space, tokens, dim),
                       EmbeddingScatterAdd<Scalar>{ids, table, count, in, tokens});
}

} // namespace detail

/// Token embedding (torch.nn.Embedding; the token embedding of GPT-style models): a table E
/// of num_embeddings learned vectors of embedding_dim features, looked up by token id.
///
/// Input: FeatureShape {1, T, 1} (or {1, H, W} with T = H·W tokens), an N x T matrix holding
/// the token ids as Scalar values, integers in [0, num_embeddings) (float holds integers
/// exactly up to 2^24, double up to 2^53). Output: {embedding_dim, T, 1} (or {D, H, W}), the
/// token layout of FeatureShape (feature index t + T·d):
///   y[n, t, :] = E[id(n, t), :].
///
/// The parameter "weight" E is a num_embeddings x embedding_dim column-major matrix (E(i, d)
/// at offset i + num_embeddings·d; PyTorch's weight is the same (V, D) matrix row-major),
/// initialized N(0, 1) as PyTorch does, drawn as a pure function of the seed.
///
/// Ids are checked, never clamped: forward first counts the invalid ids (non-integral,
/// negative, NaN or >= num_embeddings) in a reduction over the N·T ids (so forward waits for
/// its result on the host) and throws ValueError naming the count, the valid range and the
/// first invalid id; only valid ids reach the gather. Ids are not differentiable: dx = 0 (R{dx} =
/// 0) when asked for.
///
/// Backward: dE[id, :] += dy[n, t, :] for every token, scattered with atomic additions (two
/// equal ids add into the same row; their order, and so the rounding of such a sum, can vary
/// between runs on a parallel backend). In overwrite mode (accumulate_gradients(false)) dE is
/// cleared first. R-operator (Pearlmutter 1994; see Layer): R{y}[n, t, :] = V_E[id, :],
/// hv_E += the same scatter of R{dy}.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Embedding final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  /// The flat table (num_embeddings x embedding_dim).
  using vector_type = Vector<Scalar, MemorySpace>;

  /// @param num_embeddings  V, the number of token ids (rows of E), > 0
  /// @param embedding_dim   D, the features per token (columns of E), > 0
  /// @throws ValueError if either is 0.
  Embedding(std::size_t num_embeddings, std::size_t embedding_dim)
      : count_(num_embeddings), dim_(embedding_dim) {
    if (count_ == 0 || dim_ == 0) {
      throw ValueError(kat::detail::concat("kat::nn::Embedding: num_embeddings and embedding_dim "
                                           "must be > 0, got num_embeddings = ",
                                           count_, ", embedding_dim = ", dim_));
    }
  }

  std::string name() const override { return "Embedding"; }
  /// The number of rows of the table (the vocabulary).
  std::size_t num_embeddings() const { return count_; }
  /// The features of each row.
  std::size_t embedding_dim() const { return dim_; }

  /// {embedding_dim, H, W} for an input {1, H, W}.
  /// @throws ShapeError unless input.channels == 1.
  FeatureShape output_shape(const FeatureShape &input) const override {
    kat::detail::require_extent("kat::nn::Embedding", "input channels (one id per token)", 1,
                                input.channels);
    return FeatureShape{static_cast<int>(dim_), input.height, input.width};
  }

  /// num_embeddings · embedding_dim.
  std::size_t parameter_count() const override { return count_ * dim_; }
  /// "weight" E (role weight, shape {num_embeddings, embedding_dim}, column-major).
  std::vector<ParameterSpec> parameter_specs() const override {
    return {{"weight", ParameterRole::weight, {count_, dim_}, 0}};
  }

  /// Binds the table (num_embeddings() x embedding_dim() scalars).
  void bind(Scalar *params, Scalar *grads) override {
    weight_ = vector_type(params, parameter_count());
    grad_weight_ = vector_type(grads, parameter_count());
  }

  /// E ~ N(0, 1), a pure function of `seed`.
  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    require_bound("reset_parameters");
    detail::normal_(space, weight_, 0.0, 1.0, seed, 0);
  }

  /// E as a num_embeddings x embedding_dim column-major matrix, a view of the flat parameter
  /// buffer.
  matrix_type weight() const { return matrix_type(weight_.data(), count_, dim_); }
  /// dL/dE, num_embeddings x embedding_dim, a view of the flat gradient buffer.
  matrix_type weight_gradient() const { return matrix_type(grad_weight_.data(), count_, dim_); }

  /// y = E[ids] for x: N x T ids, y: N x (T·embedding_dim); both contiguous.
  /// @throws ShapeError for y's extents or a non-contiguous x or y.
  /// @throws ValueError if an id is not an integer in [0, num_embeddings) (y is then left
  ///         as it was and no backward may follow).
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::Embedding::forward");
    const char *where = "kat::nn::Embedding::forward";
    require_bound("forward");
    const std::size_t n = x.extent(0);
    const std::size_t tokens = x.extent(1);
    kat::detail::require_extent(where, "y rows", n, y.extent(0));
    kat::detail::require_extent(where, "y columns (tokens * embedding_dim)", tokens * dim_,
                                y.extent(1));
    require_contiguous(where, "x", x);
    require_contiguous(where, "y", y);
    x_ = matrix_type();
    const std::size_t rows = n * tokens;
    const std::size_t bad = detail::embedding_count_invalid(space, x.data(), rows, count_);
    if (bad != 0) {
      const std::size_t r = detail::embedding_first_invalid(space, x.data(), rows, count_);
      auto value = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                       Kokkos::subview(x, r % n, r / n));
      std::ostringstream first;
      first << std::setprecision(std::numeric_limits<Scalar>::max_digits10) << value();
      throw ValueError(kat::detail::concat(
          where, ": x holds ", bad, " token id", bad == 1 ? "" : "s",
          " that are not integers in [0, num_embeddings) = [0, ", count_,
          ") (ids are never clamped); the first is x(", r % n, ", ", r / n, ") = ", first.str()));
    }
    detail::embedding_gather(space, "kat::nn::Embedding::forward", x.data(), rows, weight_.data(),
                             count_, dim_, y.data());
    x_ = x;
  }

  /// dE (+)= the scatter of dy unless compute_parameter_gradients(false); dx = 0 unless dx
  /// has extent 0 (ids are not differentiable).
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Embedding::backward");
    const char *where = "kat::nn::Embedding::backward";
    require_forward(where);
    require_output(where, "dy", dy);
    if (this->parameter_gradients_) {
      if (!this->accumulate_) {
        Kokkos::deep_copy(space, grad_weight_, Scalar(0));
      }
      detail::embedding_scatter_add(space, "kat::nn::Embedding::backward_weight", x_.data(),
                                    x_.span(), dy.data(), count_, dim_, grad_weight_.data());
    }
    if (dx.extent(0) != 0) {
      require_input(where, "dx", dx);
      Kokkos::deep_copy(space, dx, Scalar(0));
    }
  }

  /// One "Embedding" operator {vocab, features} on the ids [B, P, 1].
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                          const std::string &name) const override {
    return graph.add("Embedding", name, {x},
                     graph_shape(graph.tensor(x).shape[0], output_shape(in)),
                     this->parameter_shapes(),
                     {{"vocab", static_cast<std::int64_t>(num_embeddings())},
                      {"features", static_cast<std::int64_t>(embedding_dim())}});
  }

  bool supports_r_operator() const override { return true; }

  /// Binds the direction's and the product's table blocks.
  void bind_direction(Scalar *v, Scalar *hv) override {
    v_weight_ = vector_type(v, parameter_count());
    hv_weight_ = vector_type(hv, parameter_count());
  }

  /// R{y} = V_E[ids]; `rx` is ignored (ids do not move along a parameter direction).
  void forward_r(const execution_space &space, const matrix_type & /*rx*/,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::Embedding::forward_r");
    const char *where = "kat::nn::Embedding::forward_r";
    require_forward(where);
    require_direction(where);
    require_output(where, "ry", ry);
    detail::embedding_gather(space, "kat::nn::Embedding::forward_r", x_.data(), x_.span(),
                             v_weight_.data(), count_, dim_, ry.data());
  }

  /// hv_E += the scatter of R{dy}; R{dx} = 0 unless rdx has extent 0.
  void backward_r(const execution_space &space, const matrix_type & /*dy*/, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::Embedding::backward_r");
    const char *where = "kat::nn::Embedding::backward_r";
    require_forward(where);
    require_direction(where);
    require_output(where, "rdy", rdy);
    detail::embedding_scatter_add(space, "kat::nn::Embedding::backward_r", x_.data(), x_.span(),
                                  rdy.data(), count_, dim_, hv_weight_.data());
    if (rdx.extent(0) != 0) {
      require_input(where, "rdx", rdx);
      Kokkos::deep_copy(space, rdx, Scalar(0));
    }
  }

private:
  void require_bound(const char *what) const {
    if (weight_.extent(0) == 0) {
      throw Error(
          kat::detail::concat("kat::nn::Embedding::", what, ": no parameters bound (bind)"));
    }
  }
  void require_direction(const char *where) const {
    if (v_weight_.extent(0) == 0) {
      throw Error(kat::detail::concat(where, ": no direction bound (bind_direction)"));
    }
  }
  void require_forward(const char *where) const {
    if (x_.extent(0) == 0) {
      throw Error(kat::detail::concat(where, ": no successful forward() before it"));
    }
  }
  static void require_contiguous(const char *where, const char *what, const matrix_type &m) {
    if (!m.span_is_contiguous()) {
      throw ShapeError(kat::detail::concat(where, ": ", what, " must be contiguous, got strides ",
                                           m.stride(0), ", ", m.stride(1), " for ", m.extent(0),
                                           "x", m.extent(1)));
    }
  }
  // N x T·D like the last forward's y, contiguous.
  void require_output(const char *where, const char *what, const matrix_type &m) const {
    if (m.extent(0) != x_.extent(0) || m.extent(1) != x_.extent(1) * dim_) {
      throw ShapeError(kat::detail::concat(where, ": ", what, " must be ", x_.extent(0), "x",
                                           x_.extent(1) * dim_, ", got ", m.extent(0), "x",
                                           m.extent(1)));
    }
    require_contiguous(where, what, m);
  }
  // N x T like the last forward's x.
  void require_input(const char *where, const char *what, const matrix_type &m) const {
    if (m.extent(0) != x_.extent(0) || m.extent(1) != x_.extent(1)) {
      throw ShapeError(kat::detail::concat(where, ": ", what, " must be ", x_.extent(0), "x",
                                           x_.extent(1), ", got ", m.extent(0), "x", m.extent(1)));
    }
  }

  std::size_t count_, dim_;
  matrix_type x_;
  vector_type weight_, grad_weight_, v_weight_, hv_weight_;
};

} // namespace kat::nn
