#pragma once
/// @file
/// @brief Megatron-style column- and row-parallel Dense layers over a tensor-parallel group.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error                                                                                             \
    "kat/distributed/tensor_parallel/tensor_parallel_dense.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#endif

#include "kat/core/error.hpp"
#include "kat/core/precision.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/nn/dense.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace kat::distributed {

namespace detail {

/// The global output rows (or input columns) rank `rank` of `ranks` owns when a dimension of
/// `extent` made of `groups` equal consecutive groups (Q|K|V: 3) is split group by group: in
/// each group g the rank owns the consecutive rows [g·e + rank·e/T, g·e + (rank+1)·e/T) with
/// e = extent/groups, T = ranks, listed group after group (the local order).
/// @throws ValueError unless groups·ranks divides extent.
inline std::vector<std::size_t> shard_indices(const char *where, std::size_t extent,
                                              std::size_t groups, int rank, int ranks) {
  if (groups == 0 || ranks <= 0 || rank < 0 || rank >= ranks ||
      extent % (groups * static_cast<std::size_t>(ranks)) != 0) {
    throw ValueError(kat::detail::concat(where, ": the split dimension (", extent,
                                         ") must be a multiple of groups (", groups,
                                         ") x tensor-parallel ranks (", ranks, ")"));
  }
  const std::size_t e = extent / groups, part = e / static_cast<std::size_t>(ranks);
  std::vector<std::size_t> idx;
  idx.reserve(groups * part);
  for (std::size_t g = 0; g < groups; ++g) {
    for (std::size_t k = 0; k < part; ++k) {
      idx.push_back(g * e + static_cast<std::size_t>(rank) * part + k);
    }
  }
  return idx;
}

/// What column- and row-parallel Dense share: the local kat::nn::Dense that holds this rank's
/// shard, the tensor-parallel communicator, and passing the layer's modes (gradient
/// accumulation, parameter gradients, curvature recording, training, precision) on to the local
/// layer.
template <class Scalar, class MemorySpace>
class ShardedDense : public nn::Layer<Scalar, MemorySpace> {
  using base = nn::Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;

  const nn::Dense<Scalar, MemorySpace> &local() const { return local_; }
  FeatureShape output_shape(const FeatureShape &input) const override {
    return local_.output_shape(input);
  }
  bool supports_curvature() const override { return true; }
  nn::CurvatureRecord<Scalar, MemorySpace> curvature() const override { return local_.curvature(); }
  void train(bool on) override {
    base::train(on);
    local_.train(on);
  }
  /// Sets the precision of the shard's products (the local Dense's) with the layer's.
  void set_precision(Precision p) override {
    base::set_precision(p);
    local_.set_precision(p);
  }

protected:
  ShardedDense(Communicator &comm, std::size_t in, std::size_t out, bool bias, nn::DenseInput input)
      : comm_(&comm), local_(in, out, bias, input) {}

  void sync_modes() {
    local_.accumulate_gradients(this->accumulate_);
    local_.compute_parameter_gradients(this->parameter_gradients_);
    local_.record_curvature(this->recording_);
  }

  Communicator *comm_;
  nn::Dense<Scalar, MemorySpace> local_;
};

} // namespace detail

/// Column-parallel Dense (Shoeybi et al., "Megatron-LM", 2019, sec. 3, fig. 3a): the weight
/// W (out x in) and bias are split along the output dimension over the T ranks of a
/// tensor-parallel group; each rank computes its out/T output features from the whole
/// (replicated) input. Megatron's operator f: identity in forward, all-reduce (sum) of the
/// input gradient in backward.
///
/// Backward computes the local input gradient first, starts its all-reduce (non-blocking,
/// counted in the Communicator's `iallreduce`), computes the weight gradient while it is in
/// flight, then waits: the all-reduce overlaps the weight-gradient GEMM.
///
/// `groups` splits each of `groups` consecutive equal parts of the output separately: with 3
/// for a Q|K|V projection, rank r owns the same heads' queries, keys and values, in that order
/// (kat::nn::ScaledDotProductAttention's layout with heads/T heads).
///
/// Parameters: as the local kat::nn::Dense(in, out/T) ([W_r b_r]). K-FAC sees that Dense's
/// record (its rows of G and the whole A). No R-operator.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class ColumnParallelDense final : public detail::ShardedDense<Scalar, MemorySpace> {
  using base = detail::ShardedDense<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @param in_features   the global input features (every rank reads all of them)
  /// @param out_features  the global output features, split over the ranks
  /// @param bias          whether the layer has a bias (each rank its rows of it)
  /// @param input         DenseInput::flattened or DenseInput::per_position, as for Dense
  /// @param comm          the tensor-parallel group (T = comm.size()); must outlive the layer
  /// @param groups        equal consecutive groups of the outputs split group by group
  ///                      (Q|K|V: 3)
  /// @throws ValueError unless groups·T divides out_features.
  ColumnParallelDense(std::size_t in_features, std::size_t out_features, bool bias,
                      nn::DenseInput input, Communicator &comm, std::size_t groups = 1)
      : base(comm, in_features, checked_rows(out_features, groups, comm).size(), bias, input),
        in_(in_features), out_(out_features), rows_(checked_rows(out_features, groups, comm)) {}

  std::string name() const override { return "ColumnParallelDense"; }
  /// The global input features.
  std::size_t in_features() const { return in_; }
  /// The global output features (all ranks' rows).
  std::size_t out_features() const { return out_; }
  /// The global output rows this rank owns, in local order.
  const std::vector<std::size_t> &rows() const { return rows_; }
  std::size_t parameter_count() const override { return local_.parameter_count(); }
  std::vector<nn::ParameterSpec> parameter_specs() const override {
    return local_.parameter_specs();
  }
  /// Binds the local Dense's [W_r b_r] (its rows of W and b).
  void bind(Scalar *params, Scalar *grads) override { local_.bind(params, grads); }
  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    local_.reset_parameters(space, seed);
  }

  /// This rank's block of a whole layer's block: `full` holds [W b] of Dense(in, out) (W
  /// column-major out x in, then b), as kat::nn::Dense lays it out; the result is laid out
  /// as this layer's parameters.
  /// @throws ShapeError if full has the wrong size.
  std::vector<Scalar> shard(const std::vector<Scalar> &full) const {
    const bool bias = local_.has_bias();
    kat::detail::require_extent("kat::distributed::ColumnParallelDense::shard", "full size",
                                out_ * (in_ + (bias ? 1 : 0)), full.size());
    const std::size_t lo = rows_.size();
    std::vector<Scalar> local(lo * (in_ + (bias ? 1 : 0)));
    for (std::size_t c = 0; c < in_ + (bias ? 1 : 0); ++c) {
      for (std::size_t r = 0; r < lo; ++r) {
        local[r + lo * c] = full[rows_[r] + out_ * c];
      }
    }
    return local;
  }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::distributed::ColumnParallelDense::forward");
    sync_modes();
    local_.forward(space, x, y);
  }

  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::distributed::ColumnParallelDense::backward");
    sync_modes();
    if (dx.extent(0) == 0) {
      local_.backward(space, dy, dx);
      return;
    }
    // dx_r = dy_r W_r, then the sum over ranks in flight while dW_r = dy_rᵀ x runs (from dy_r
    // as the first product rounded it, in bf16).
    local_.backward_input(space, dy, dx);
    Request sum = comm_->iallreduce(space, dx);
    local_.backward_parameters(space, dy);
    sum.wait();
  }

private:
  // Validated before the local Dense is built, so a bad split is reported as such.
  static std::vector<std::size_t> checked_rows(std::size_t out, std::size_t groups,
                                               const Communicator &comm) {
    return detail::shard_indices("kat::distributed::ColumnParallelDense: out_features", out, groups,
                                 comm.rank(), comm.size());
  }

  using base::comm_;
  using base::local_;
  using base::sync_modes;
  std::size_t in_, out_;
  std::vector<std::size_t> rows_;
};

/// Row-parallel Dense (Megatron-LM, sec. 3, fig. 3a): W (out x in) is split along the input
/// dimension; each rank multiplies its in/T input features (the output of a column-parallel
/// layer, or of a parameter-free layer after one) by its columns of W, giving a partial sum of
/// the output. Megatron's operator g: all-reduce (sum) of the output in forward, identity in
/// backward. The bias is replicated and added once, after the reduction: in fp32 in either
/// precision (a bf16 kat::nn::Dense rounds its bias into the product; docs/precision.md).
///
/// Parameters: W_r (out x in/T, column-major), then b (out, the same on every rank). K-FAC
/// sees the local product without a bias column (the bias keeps its plain gradient). No
/// R-operator.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class RowParallelDense final : public detail::ShardedDense<Scalar, MemorySpace> {
  using base = detail::ShardedDense<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @param in_features   the global input features, split over the ranks
  /// @param out_features  the global output features (every rank computes a partial sum of all)
  /// @param bias          whether the layer has a bias (replicated, added after the reduction)
  /// @param input         DenseInput::flattened or DenseInput::per_position, as for Dense
  /// @param comm          the tensor-parallel group (T = comm.size()); must outlive the layer
  /// @throws ValueError unless T divides in_features.
  RowParallelDense(std::size_t in_features, std::size_t out_features, bool bias,
                   nn::DenseInput input, Communicator &comm)
      : base(comm, checked_columns(in_features, comm).size(), out_features, false, input),
        in_(in_features), out_(out_features), bias_(bias),
        cols_(checked_columns(in_features, comm)) {}

  std::string name() const override { return "RowParallelDense"; }
  /// The global input features (all ranks' columns).
  std::size_t in_features() const { return in_; }
  /// The global output features.
  std::size_t out_features() const { return out_; }
  /// The global input columns this rank owns, in local order.
  const std::vector<std::size_t> &columns() const { return cols_; }
  std::size_t parameter_count() const override {
    return local_.parameter_count() + (bias_ ? out_ : 0);
  }
  std::vector<nn::ParameterSpec> parameter_specs() const override {
    auto specs = local_.parameter_specs();
    if (bias_) {
      specs.push_back({"bias", nn::ParameterRole::bias, {out_}, local_.parameter_count()});
    }
    return specs;
  }
  /// Binds W_r (out x in/T, column-major), then b (out) with a bias.
  void bind(Scalar *params, Scalar *grads) override {
    local_.bind(params, grads);
    if (bias_) {
      bias_view_ = Vector<Scalar, MemorySpace>(params + local_.parameter_count(), out_);
      grad_bias_ = Vector<Scalar, MemorySpace>(grads + local_.parameter_count(), out_);
    }
  }
  /// The local weights as Dense(in/T, out) initializes them, and b = 0 (load shards of a
  /// whole layer with shard() for a model that matches the single-rank one).
  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    local_.reset_parameters(space, seed);
    if (bias_) {
      Kokkos::deep_copy(space, bias_view_, Scalar(0));
    }
  }

  /// This rank's block of a whole Dense(in, out) block [W b] (layout as
  /// ColumnParallelDense::shard): its columns of W, then b.
  /// @throws ShapeError if full has the wrong size.
  std::vector<Scalar> shard(const std::vector<Scalar> &full) const {
    kat::detail::require_extent("kat::distributed::RowParallelDense::shard", "full size",
                                out_ * (in_ + (bias_ ? 1 : 0)), full.size());
    std::vector<Scalar> local;
    local.reserve(parameter_count());
    for (const std::size_t c : cols_) {
      local.insert(local.end(), full.begin() + static_cast<std::ptrdiff_t>(out_ * c),
                   full.begin() + static_cast<std::ptrdiff_t>(out_ * (c + 1)));
    }
    if (bias_) {
      local.insert(local.end(), full.begin() + static_cast<std::ptrdiff_t>(out_ * in_), full.end());
    }
    return local;
  }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::distributed::RowParallelDense::forward");
    sync_modes();
    local_.forward(space, x, y);
    comm_->allreduce(space, y);
    if (bias_) {
      const auto rows = nn::detail::position_rows(y, out_);
      nn::detail::add_row_vector(space, "kat::distributed::RowParallelDense::bias", rows,
                                 bias_view_, rows);
    }
  }

  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::distributed::RowParallelDense::backward");
    sync_modes();
    if (bias_ && this->parameter_gradients_) {
      nn::detail::column_sums(space, "kat::distributed::RowParallelDense::bias_gradient",
                              nn::detail::position_rows(dy, out_), grad_bias_, this->accumulate_);
    }
    local_.backward(space, dy, dx);
  }

private:
  static std::vector<std::size_t> checked_columns(std::size_t in, const Communicator &comm) {
    return detail::shard_indices("kat::distributed::RowParallelDense: in_features", in, 1,
                                 comm.rank(), comm.size());
  }

  using base::comm_;
  using base::local_;
  using base::sync_modes;
  std::size_t in_, out_;
  bool bias_;
  std::vector<std::size_t> cols_;
  Vector<Scalar, MemorySpace> bias_view_, grad_bias_;
};

} // namespace kat::distributed
