#pragma once
/// @file
/// @brief kat::plan's alpha-beta cost model: collective times, compute times from FLOP counts,
/// the device mesh, cluster presets and the optimizer's memory (TAP, Shi et al., arXiv
/// 2302.00247, Sec. 4.3; the alpha-beta model of Hockney 1994 with the ring-collective volumes
/// of Thakur, Rabenseifner & Gropp 2005; docs/tensor_parallel.md).

#include "kat/core/error.hpp"
#include "kat/plan/graph.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kat::plan {

/// The collectives a plan uses.
enum class CollectiveKind { all_reduce, all_gather, reduce_scatter, all_to_all };

/// "all_reduce", "all_gather", "reduce_scatter", "all_to_all".
inline const char *to_string(CollectiveKind k) {
  switch (k) {
  case CollectiveKind::all_reduce:
    return "all_reduce";
  case CollectiveKind::all_gather:
    return "all_gather";
  case CollectiveKind::reduce_scatter:
    return "reduce_scatter";
  case CollectiveKind::all_to_all:
    return "all_to_all";
  }
  return "?";
}

/// Which pass of the training step a collective belongs to.
enum class Pass { forward, backward };
/// "forward" or "backward".
inline const char *to_string(Pass p) { return p == Pass::forward ? "forward" : "backward"; }

/// Which ranks a collective spans: the T ranks of a tensor-parallel group, the D ranks holding
/// the same shard in different data-parallel replicas, or all D·T ranks (for an operator
/// whose batch is split over the tensor group as well).
enum class Group { tensor, data, data_tensor };
/// "tensor", "data" or "data_tensor".
inline const char *to_string(Group g) {
  return g == Group::tensor ? "tensor" : g == Group::data ? "data" : "data_tensor";
}

/// One link class of the alpha-beta model: a message of n bytes costs alpha + beta·n.
struct Link {
  double alpha = 0; ///< latency per collective (s)
  double beta = 0;  ///< inverse bandwidth (s per byte)
};

/// Bytes one device sends in a collective over `ranks` ranks on a tensor of `bytes` bytes (the
/// whole tensor: the all-gather's result, the reduce-scatter's input, the all-reduce's
/// buffer): all-reduce 2(t−1)/t·bytes, all-gather and reduce-scatter (t−1)/t·bytes,
/// all-to-all (t−1)/t²·bytes (each device exchanges its 1/t share). 0 for one rank.
inline double collective_volume(CollectiveKind kind, int ranks, double bytes) {
  if (ranks <= 1) {
    return 0.0;
  }
  const double t = ranks;
  switch (kind) {
  case CollectiveKind::all_reduce:
    return 2.0 * (t - 1.0) / t * bytes;
  case CollectiveKind::all_gather:
  case CollectiveKind::reduce_scatter:
    return (t - 1.0) / t * bytes;
  case CollectiveKind::all_to_all:
    return (t - 1.0) / (t * t) * bytes;
  }
  return 0.0;
}

/// Time of one collective: alpha + beta·collective_volume (TAP's formulas: all-reduce
/// α + β·2(t−1)/t·bytes, all-gather and reduce-scatter α + β·(t−1)/t·bytes); exactly 0 for one
/// rank (no communication at all).
/// @throws ValueError for ranks < 1 or bytes < 0
inline double collective_seconds(CollectiveKind kind, const Link &link, int ranks, double bytes) {
  if (ranks < 1 || bytes < 0) {
    throw ValueError(kat::detail::concat("kat::plan::collective_seconds: ranks must be >= 1 and "
                                         "bytes >= 0, got ranks ",
                                         ranks, ", bytes ", bytes));
  }
  if (ranks == 1) {
    return 0.0;
  }
  return link.alpha + link.beta * collective_volume(kind, ranks, bytes);
}

/// A machine: devices per node, the links inside and across nodes, FLOP rate and memory per
/// device. A collective whose group spans more than one node is priced at the `inter` link.
struct ClusterModel {
  std::string name;        ///< the preset's name ("gpu-cluster", "mpi-local")
  std::string description; ///< where the figures come from
  Link intra;              ///< between devices of one node
  Link inter;              ///< between nodes
  int ranks_per_node = 1;  ///< devices per node
  double flop_rate = 1e12; ///< FLOP/s per device, achieved on the model's GEMMs
  double memory_bytes = 0; ///< memory per device (the default budget; 0: unlimited)
};

/// This development machine (2-core VM, Open MPI 4.1 over shared memory): alpha 0.72 µs and
/// beta 1.79e-10 s/B (5.6 GB/s), the medians of three runs of scripts/measure_alpha_beta.sh on
/// 2 ranks (docs/benchmarks.md has the date and the per-size table); FLOP rate 60 GFLOP/s per
/// rank, half the float GEMM rate of OpenBLAS on both cores (about 120 GFLOP/s,
/// ARCHITECTURE.md); memory 24 GiB shared by the ranks.
inline ClusterModel mpi_local_cluster() {
  ClusterModel c;
  c.name = "mpi-local";
  c.description = "2-core development VM, Open MPI over shared memory: alpha 0.72 us, "
                  "5.6 GB/s (measured), 60 GFLOP/s per rank, 24 GiB";
  c.intra = {0.72e-6, 1.79e-10};
  c.inter = c.intra;
  c.ranks_per_node = 1 << 20; // one node
  c.flop_rate = 60e9;
  c.memory_bytes = 24.0 * (1ull << 30);
  return c;
}

/// A DGX A100-like cluster (assumptions, not measurements): 8 GPUs per node; inside a node
/// NVLink 3 through NVSwitch, alpha 10 µs, 230 GB/s bus bandwidth (beta = 1/230e9 s/B; what
/// NCCL's all_reduce_perf reaches on 8 A100 SXM4); across nodes one 200 Gb/s HDR InfiniBand
/// adapter per GPU (25 GB/s, DGX A100 datasheet), alpha 20 µs and 20 GB/s achieved; 150 TFLOP/s
/// per GPU, 48% of the A100's 312 TFLOP/s 16-bit peak, as Megatron-LM achieves on GPT models
/// (Narayanan et al., SC 2021: 138–163 TFLOP/s); 80 GiB per GPU.
inline ClusterModel gpu_cluster() {
  ClusterModel c;
  c.name = "gpu-cluster";
  c.description = "DGX A100-like (assumed): 8 GPUs/node, NVLink 230 GB/s alpha 10 us, "
                  "InfiniBand 20 GB/s per GPU alpha 20 us, 150 TFLOP/s, 80 GiB";
  c.intra = {10e-6, 1.0 / 230e9};
  c.inter = {20e-6, 1.0 / 20e9};
  c.ranks_per_node = 8;
  c.flop_rate = 150e12;
  c.memory_bytes = 80.0 * (1ull << 30);
  return c;
}

/// "mpi-local", "gpu-cluster".
inline std::vector<std::string> cluster_preset_names() { return {"mpi-local", "gpu-cluster"}; }

/// The preset named `name`. @throws ValueError for an unknown name, listing the known ones
inline ClusterModel cluster_preset(const std::string &name) {
  if (name == "mpi-local") {
    return mpi_local_cluster();
  }
  if (name == "gpu-cluster") {
    return gpu_cluster();
  }
  throw ValueError(kat::detail::concat("kat::plan::cluster_preset: unknown cluster '", name,
                                       "'; known: mpi-local, gpu-cluster"));
}

/// D data-parallel replicas of T tensor-parallel ranks; rank = replica·T + tensor rank, so a
/// tensor group is T consecutive ranks (inside a node when T <= ranks_per_node).
struct Mesh {
  int data = 1;   ///< D, the data-parallel replicas
  int tensor = 1; ///< T, the tensor-parallel ranks of a replica
  /// D·T, all ranks.
  int ranks() const { return data * tensor; }
};

/// Optimizer state per parameter element: `states` values of `state_bytes` bytes each
/// (0: the graph's element size). Adam keeps 2 moments, SGD with momentum 1, plain SGD 0; Adam
/// in mixed precision keeps a float master copy and 2 float moments: 3 of 4 bytes (ZeRO,
/// Rajbhandari et al. 2020, Sec. 3.1: 16 bytes per parameter with the 16-bit copies).
struct OptimizerMemory {
  double states = 2;      ///< values kept per parameter element
  double state_bytes = 0; ///< bytes per value (0: the graph's element size)

  /// Adam or AdamW: 2 moments.
  static OptimizerMemory adam() { return {2, 0}; }
  /// SGD with momentum: 1 buffer.
  static OptimizerMemory momentum() { return {1, 0}; }
  /// Plain SGD: no state.
  static OptimizerMemory sgd() { return {0, 0}; }
  /// Adam in mixed precision: a float master copy and 2 float moments.
  static OptimizerMemory adam_mixed() { return {3, 4}; }
};

/// Bytes per device, by what they hold.
struct MemoryBreakdown {
  double parameters = 0;  ///< the parameters held
  double gradients = 0;   ///< their gradients
  double optimizer = 0;   ///< the optimizer state (OptimizerMemory)
  double activations = 0; ///< kept from forward for backward
  /// All four together.
  double total() const { return parameters + gradients + optimizer + activations; }
  /// Adds `o` field by field.
  MemoryBreakdown &operator+=(const MemoryBreakdown &o) {
    parameters += o.parameters;
    gradients += o.gradients;
    optimizer += o.optimizer;
    activations += o.activations;
    return *this;
  }
};

/// Everything the search prices a plan with.
struct CostModel {
  ClusterModel cluster = gpu_cluster(); ///< the machine
  Mesh mesh;                            ///< the data x tensor rank grid
  OptimizerMemory optimizer;            ///< optimizer state per parameter element

  /// Ranks of a group. @throws nothing
  int ranks(Group g) const {
    return g == Group::tensor ? mesh.tensor : g == Group::data ? mesh.data : mesh.ranks();
  }
  /// The link a group's collectives use: `inter` when it spans nodes.
  const Link &link(Group g) const {
    const int node = cluster.ranks_per_node;
    const bool spans =
        g == Group::tensor ? mesh.tensor > node : ranks(g) > 1 && mesh.ranks() > node;
    return spans ? cluster.inter : cluster.intra;
  }
  /// Alpha-beta seconds of one collective of `kind` over `bytes` (the whole tensor in one
  /// replica) on group `g`'s ranks and link.
  double seconds(CollectiveKind kind, Group g, double bytes) const {
    return collective_seconds(kind, link(g), ranks(g), bytes);
  }
  /// @throws ValueError naming the field for a mesh extent < 1, a FLOP rate <= 0, negative
  ///   alpha, beta or memory, or ranks_per_node < 1
  void validate() const {
    const char *who = "kat::plan::CostModel";
    if (mesh.data < 1 || mesh.tensor < 1) {
      throw ValueError(kat::detail::concat(who, ": mesh extents must be >= 1, got data ", mesh.data,
                                           ", tensor ", mesh.tensor));
    }
    if (!(cluster.flop_rate > 0)) {
      throw ValueError(
          kat::detail::concat(who, ": cluster.flop_rate must be > 0, got ", cluster.flop_rate));
    }
    if (cluster.intra.alpha < 0 || cluster.intra.beta < 0 || cluster.inter.alpha < 0 ||
        cluster.inter.beta < 0 || cluster.memory_bytes < 0) {
      throw ValueError(kat::detail::concat(who, ": alpha, beta and memory must be >= 0"));
    }
    if (cluster.ranks_per_node < 1) {
      throw ValueError(kat::detail::concat(who, ": cluster.ranks_per_node must be >= 1, got ",
                                           cluster.ranks_per_node));
    }
    if (optimizer.states < 0 || optimizer.state_bytes < 0) {
      throw ValueError(kat::detail::concat(who, ": optimizer states and bytes must be >= 0"));
    }
  }
};

/// Forward FLOPs of one operator on the whole global batch:
/// - Dense: 2·N·in·out, N = rows (the input's elements / in); the bias is not counted
/// - Attention: 4·B·P²·heads·head_dim (QKᵀ and A·V; causal masking not subtracted, softmax not
///   counted)
/// - Conv2d: 2·(output elements)·(weight elements / output channels)
/// - LayerNorm and GELU: 8 per element; ReLU, Add, PositionEmbedding, Pool: 1 per element;
///   SoftmaxCrossEntropy: 5 per logit; Embedding and Flatten: 0; other types: the attribute
///   "flops" when given, else 1 per output element
inline double forward_flops(const Graph &g, const Operator &op) {
  const auto elements = [&](TensorId t) { return static_cast<double>(numel(g.tensor(t).shape)); };
  const double out = elements(op.output);
  const std::string &type = op.type;
  if (type == "Dense") {
    const double in = static_cast<double>(op.integer("in"));
    const double rows = elements(op.inputs[0]) / in;
    return 2.0 * rows * in * static_cast<double>(op.integer("out"));
  }
  if (type == "Attention") {
    const Shape &x = g.tensor(op.inputs[0]).shape;
    const double positions = static_cast<double>(x[x.size() - 2]);
    const double rows = static_cast<double>(numel(x)) / static_cast<double>(x.back());
    const double d = static_cast<double>(op.integer("heads") * op.integer("head_dim"));
    return 4.0 * rows * positions * d;
  }
  if (type == "Conv2d" && !op.parameters.empty()) {
    const Shape &w = g.tensor(op.parameters[0]).shape;
    return 2.0 * out * static_cast<double>(numel(w)) / static_cast<double>(w[0]);
  }
  if (type == "LayerNorm" || type == "GELU") {
    return 8.0 * out;
  }
  if (type == "ReLU" || type == "Add" || type == "PositionEmbedding" || type == "Pool") {
    return out;
  }
  if (type == "SoftmaxCrossEntropy") {
    return 5.0 * elements(op.inputs[0]);
  }
  if (type == "Embedding" || type == "Flatten") {
    return 0.0;
  }
  const auto it = op.attributes.find("flops");
  return it != op.attributes.end() ? it->second.real() : out;
}

/// Backward FLOPs: 2× forward for Dense, Conv2d and Attention (input and weight gradients;
/// dV, dA, dQ, dK); the forward count for the others; an Embedding's scatter of its output
/// gradient, 1 per output element.
inline double backward_flops(const Graph &g, const Operator &op) {
  if (op.type == "Dense" || op.type == "Conv2d" || op.type == "Attention") {
    return 2.0 * forward_flops(g, op);
  }
  if (op.type == "Embedding") {
    return static_cast<double>(numel(g.tensor(op.output).shape));
  }
  return forward_flops(g, op);
}

} // namespace kat::plan
