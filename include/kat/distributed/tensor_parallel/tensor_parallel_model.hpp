#pragma once
/// @file
/// @brief Tensor-parallel transformers: the 2-D process mesh, Megatron-style encoder blocks and
/// ViT, and sharding a single-rank model's parameters onto them.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error                                                                                             \
    "kat/distributed/tensor_parallel/tensor_parallel_model.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#endif

#include "kat/core/error.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/tensor_parallel/tensor_parallel_dense.hpp"
#include "kat/nn/attention.hpp"
#include "kat/nn/gelu.hpp"
#include "kat/nn/layer_norm.hpp"
#include "kat/nn/models.hpp"
#include "kat/nn/residual.hpp"
#include "kat/nn/sequential.hpp"
#include "kat/nn/transformer.hpp"
#include "kat/plan/plan.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace kat::distributed {

/// A D x T process mesh: `world`'s P = D·T ranks as D data-parallel replicas of a T-rank
/// tensor-parallel group. Consecutive ranks form a tensor-parallel group (world rank
/// = d·T + t), so on a cluster the tensor-parallel traffic stays within a node when T divides
/// the ranks per node (Megatron-LM's order).
class TensorParallelMesh {
public:
  /// Collective over `world`.
  /// @throws ValueError unless tensor_parallel >= 1 divides world.size().
  TensorParallelMesh(const Communicator &world, int tensor_parallel)
      : tensor_(split(world, tensor_parallel, true)), data_(split(world, tensor_parallel, false)) {}

  /// The ranks of this rank's tensor-parallel group (size T), ordered by t.
  Communicator &tensor() { return tensor_; }
  /// The ranks holding the same shards (size D), ordered by d: the data-parallel group.
  Communicator &data() { return data_; }
  /// t, this rank's index in its tensor-parallel group.
  int tensor_rank() const { return tensor_.rank(); }
  /// T, the ranks of a tensor-parallel group.
  int tensor_size() const { return tensor_.size(); }
  /// d, this rank's index in its data-parallel group.
  int data_rank() const { return data_.rank(); }
  /// D, the data-parallel replicas.
  int data_size() const { return data_.size(); }

private:
  static Communicator split(const Communicator &world, int t, bool tensor) {
    if (t < 1 || world.size() % t != 0) {
      throw ValueError(kat::detail::concat("kat::distributed::TensorParallelMesh: "
                                           "tensor_parallel must be >= 1 and divide the ",
                                           world.size(), " ranks, got ", t));
    }
    const int d = world.rank() / t, r = world.rank() % t;
    return tensor ? world.split(d, r) : world.split(r, d);
  }

  Communicator tensor_, data_;
};

/// Which halves of a TransformerEncoderBlock run tensor-parallel (Megatron-LM, sec. 3): the
/// attention (Q|K|V column-parallel by heads, output projection row-parallel) and the MLP (W₁
/// column-parallel, W₂ row-parallel). Each split costs one all-reduce of the block's N x D·P
/// activation in forward (after the row-parallel layer) and one in backward (the column-parallel
/// layer's input gradient); an unsplit half is replicated on every rank of the group.
struct TensorParallelSplit {
  bool attention = true; ///< split the attention half
  bool mlp = true;       ///< split the MLP half
};

/// A TransformerEncoderBlock whose attention and MLP are split over `comm` as `split` says.
/// @throws ValueError unless comm.size() divides the heads (attention) and options.mlp_hidden
///   (MLP), or as TransformerEncoderBlock.
template <class Scalar, class MemorySpace>
std::unique_ptr<nn::TransformerEncoderBlock<Scalar, MemorySpace>>
tensor_parallel_block(FeatureShape input, nn::TransformerBlockOptions options,
                      TensorParallelSplit split, Communicator &comm) {
  using block_type = nn::TransformerEncoderBlock<Scalar, MemorySpace>;
  using residual = nn::Residual<Scalar, MemorySpace>;
  const auto o = block_type::checked(input, options);
  const std::size_t d = static_cast<std::size_t>(input.channels);
  const std::size_t t = static_cast<std::size_t>(comm.size());
  const auto pp = nn::DenseInput::per_position;
  std::unique_ptr<residual> attention, mlp;
  if (split.attention) {
    if (o.heads % t != 0) {
      throw ValueError(kat::detail::concat("kat::distributed::tensor_parallel_block: the ", t,
                                           " tensor-parallel ranks must divide the heads, got ",
                                           o.heads, " heads"));
    }
    attention = std::make_unique<residual>(input);
    attention->template add<nn::LayerNorm>(d, o.layer_norm_eps);
    attention->template add<ColumnParallelDense>(d, 3 * d, true, pp, comm, 3);
    attention->template add<nn::ScaledDotProductAttention>(o.heads / t, d / o.heads, o.causal);
    attention->template add<RowParallelDense>(d, d, true, pp, comm);
  } else {
    attention = block_type::make_attention(input, o);
  }
  if (split.mlp) {
    mlp = std::make_unique<residual>(input);
    mlp->template add<nn::LayerNorm>(d, o.layer_norm_eps);
    mlp->template add<ColumnParallelDense>(d, o.mlp_hidden, true, pp, comm);
    mlp->template add<nn::GELU>();
    mlp->template add<RowParallelDense>(o.mlp_hidden, d, true, pp, comm);
  } else {
    mlp = block_type::make_mlp(input, o);
  }
  return std::make_unique<block_type>(input, o, std::move(attention), std::move(mlp));
}

/// kat::nn::models::vit with its blocks split over `comm`: block i as `splits[i]` (all
/// Megatron-split when `splits` is empty). Same layers, order and parameter names as the
/// single-rank model, so shard_parameters() maps one onto the other.
/// @throws ValueError if splits is neither empty nor one per block, or as tensor_parallel_block.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
nn::Sequential<Scalar, MemorySpace>
vit_tensor_parallel(FeatureShape input, int classes, const nn::models::VitOptions &o,
                    Communicator &comm, std::vector<TensorParallelSplit> splits = {}) {
  if (splits.empty()) {
    splits.assign(o.depth, TensorParallelSplit{});
  }
  if (splits.size() != o.depth) {
    throw ValueError(kat::detail::concat("kat::distributed::vit_tensor_parallel: splits must "
                                         "be empty or one per block (",
                                         o.depth, "), got ", splits.size()));
  }
  return nn::models::vit<Scalar, MemorySpace>(
      input, classes, o,
      [&](FeatureShape tokens, const nn::TransformerBlockOptions &block,
          std::size_t i) -> std::unique_ptr<nn::Layer<Scalar, MemorySpace>> {
        return tensor_parallel_block<Scalar, MemorySpace>(tokens, block, splits[i], comm);
      });
}

/// The splits a tensor-parallel plan (kat::plan::search over `whole.describe(batch)`) gives
/// the TransformerEncoderBlocks of `whole`, which the executor runs as Megatron-LM does: per
/// block, the attention's Q|K|V Dense "column", the attention "heads" and its output Dense
/// "row" (or all three "replicated"), and the MLP's first Dense "column", the activation
/// "sharded" and the second Dense "row" (or all "replicated"); every other operator
/// "replicated". The plan's mesh must be `tensor` wide.
/// @throws ValueError naming the operator for any other strategy (the executor has no
///   per-operator batch split and no other combination), a plan of another tensor width, or a
///   plan without the model's operators.
template <class Scalar, class MemorySpace>
std::vector<TensorParallelSplit>
tensor_parallel_splits(const plan::Plan &plan, const nn::Sequential<Scalar, MemorySpace> &whole,
                       int tensor) {
  const char *where = "kat::distributed::tensor_parallel_splits";
  if (plan.mesh.tensor != tensor) {
    throw ValueError(kat::detail::concat(where, ": the plan is for ", plan.mesh.tensor,
                                         " tensor-parallel ranks, the run has ", tensor));
  }
  std::vector<TensorParallelSplit> splits;
  std::vector<std::string> checked;
  // Whether the half `half` of block i is split: its three operators all split or all not.
  const auto split_half = [&](std::size_t i, const char *half, const char *middle) {
    const std::string prefix = kat::detail::concat(i, '.', half, ".body.");
    const std::string names[3] = {prefix + "1", prefix + "2", prefix + "3"};
    const std::string got[3] = {plan.at(names[0]).strategy, plan.at(names[1]).strategy,
                                plan.at(names[2]).strategy};
    checked.insert(checked.end(), names, names + 3);
    if (got[0] == "column" && got[1] == middle && got[2] == "row") {
      return true;
    }
    if (got[0] == "replicated" && got[1] == "replicated" && got[2] == "replicated") {
      return false;
    }
    throw ValueError(kat::detail::concat(where, ": operators ", names[0], ", ", names[1], ", ",
                                         names[2], " have strategies ", got[0], ", ", got[1], ", ",
                                         got[2], "; the executor runs column, ", middle,
                                         ", row or replicated x 3"));
  };
  for (std::size_t i = 0; i < whole.layers().size(); ++i) {
    if (dynamic_cast<const nn::TransformerEncoderBlock<Scalar, MemorySpace> *>(
            whole.layers()[i].get()) != nullptr) {
      TensorParallelSplit s;
      s.attention = split_half(i, "attention", "heads");
      s.mlp = split_half(i, "mlp", "sharded");
      splits.push_back(s);
    }
  }
  for (const auto &op : plan.operators) {
    if (op.strategy != "replicated" &&
        std::find(checked.begin(), checked.end(), op.name) == checked.end()) {
      throw ValueError(kat::detail::concat(where, ": operator ", op.name, " (", op.type,
                                           ") has strategy ", op.strategy,
                                           "; the executor replicates every operator outside the "
                                           "blocks' attention and MLP"));
    }
  }
  return splits;
}

namespace detail {

/// The layers holding parameters directly (no sublayers), in the flat buffer's order.
template <class Scalar, class MemorySpace>
void collect_leaves(nn::Layer<Scalar, MemorySpace> *layer,
                    std::vector<nn::Layer<Scalar, MemorySpace> *> &out) {
  const auto subs = layer->sublayers();
  if (subs.empty()) {
    out.push_back(layer);
    return;
  }
  for (auto *s : subs) {
    collect_leaves(s, out);
  }
}

template <class Scalar, class MemorySpace>
std::vector<nn::Layer<Scalar, MemorySpace> *>
leaves(const nn::Sequential<Scalar, MemorySpace> &model) {
  std::vector<nn::Layer<Scalar, MemorySpace> *> out;
  for (const auto &l : model.layers()) {
    collect_leaves(l.get(), out);
  }
  return out;
}

} // namespace detail

/// This rank's share of a flat vector of the single-rank model `whole` (its parameters, its
/// gradients: anything laid out as whole.parameters()), laid out as `split`'s flat buffer: the
/// blocks of column- and row-parallel layers sliced (ColumnParallelDense::shard,
/// RowParallelDense::shard), every other block copied. `split` must have whole's layers in the
/// same order (vit_tensor_parallel of the same options as models::vit).
/// @throws ShapeError if the layers do not correspond (naming the first that differs) or
///   `flat` is not whole's size.
template <class Scalar, class MemorySpace>
std::vector<Scalar> shard_parameters(const std::vector<Scalar> &flat,
                                     const nn::Sequential<Scalar, MemorySpace> &whole,
                                     const nn::Sequential<Scalar, MemorySpace> &split) {
  const char *where = "kat::distributed::shard_parameters";
  kat::detail::require_extent(where, "flat size", whole.parameter_count(), flat.size());
  const auto a = detail::leaves(whole), b = detail::leaves(split);
  if (a.size() != b.size()) {
    throw ShapeError(kat::detail::concat(where, ": the models have ", a.size(), " and ", b.size(),
                                         " parameter-holding layers"));
  }
  std::vector<Scalar> out;
  out.reserve(split.parameter_count());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::size_t n = a[i]->parameter_count();
    const std::vector<Scalar> block(flat.begin() + static_cast<std::ptrdiff_t>(offset),
                                    flat.begin() + static_cast<std::ptrdiff_t>(offset + n));
    offset += n;
    const auto *column = dynamic_cast<const ColumnParallelDense<Scalar, MemorySpace> *>(b[i]);
    const auto *row = dynamic_cast<const RowParallelDense<Scalar, MemorySpace> *>(b[i]);
    const bool matches = column != nullptr || row != nullptr
                             ? a[i]->name() == "Dense"
                             : a[i]->name() == b[i]->name() && n == b[i]->parameter_count();
    if (!matches) {
      throw ShapeError(kat::detail::concat(
          where, ": layer ", i, " (", b[i]->name(), ", ", b[i]->parameter_count(),
          " parameters) does not correspond to ", a[i]->name(), " (", n, " parameters)"));
    }
    const std::vector<Scalar> local = column != nullptr ? column->shard(block)
                                      : row != nullptr  ? row->shard(block)
                                                        : block;
    out.insert(out.end(), local.begin(), local.end());
  }
  return out;
}

/// Copies this rank's shard of `whole`'s parameters into `split`'s (both compiled): the
/// tensor-parallel model then computes what `whole` computes.
/// @throws as shard_parameters.
template <class Scalar, class MemorySpace>
void copy_sharded_parameters(const typename MemorySpace::execution_space &space,
                             const nn::Sequential<Scalar, MemorySpace> &whole,
                             nn::Sequential<Scalar, MemorySpace> &split) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole.parameters());
  const std::vector<Scalar> flat(host.data(), host.data() + host.extent(0));
  const auto local = shard_parameters(flat, whole, split);
  const Kokkos::View<const Scalar *, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      src(local.data(), local.size());
  Kokkos::deep_copy(space, split.parameters(), src);
  space.fence();
}

} // namespace kat::distributed
