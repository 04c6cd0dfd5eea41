#pragma once
/// @file
/// @brief kat::plan's per-operator parallel strategies and activation layouts, priced with the
/// alpha-beta cost model: which layouts an operator reads and writes under each strategy, what
/// it computes, communicates and keeps per device, and what converting a tensor between
/// layouts costs (TAP, Shi et al., arXiv 2302.00247, Sec. 4.2; Megatron-LM, Shoeybi et al.
/// 2019, Sec. 3; docs/tensor_parallel.md has the tables).

#include "kat/core/error.hpp"
#include "kat/plan/cost_model.hpp"
#include "kat/plan/graph.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kat::plan {

/// How an activation is spread over the T ranks of a tensor-parallel group.
enum class Layout : std::uint8_t {
  replicated = 0, ///< every rank holds all of it
  sharded = 1,    ///< split on the last (feature) extent
  partial = 2,    ///< every rank holds a full-shape partial sum; the tensor is their sum
  batch = 3       ///< split on the first (batch) extent
};
/// The number of Layout values.
constexpr int layout_count = 4;

/// "replicated", "sharded", "partial", "batch".
inline const char *to_string(Layout l) {
  switch (l) {
  case Layout::replicated:
    return "replicated";
  case Layout::sharded:
    return "sharded";
  case Layout::partial:
    return "partial";
  case Layout::batch:
    return "batch";
  }
  return "?";
}

/// The layout named `name`. @throws ValueError for another name
inline Layout layout_from_string(const std::string &name) {
  for (int l = 0; l < layout_count; ++l) {
    if (name == to_string(static_cast<Layout>(l))) {
      return static_cast<Layout>(l);
    }
  }
  throw ValueError(kat::detail::concat("kat::plan::layout_from_string: unknown layout '", name,
                                       "'; known: replicated, sharded, partial, batch"));
}

/// One collective of a plan, before pricing.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::all_reduce; ///< the collective
  Pass pass = Pass::forward;                        ///< forward or backward
  Group group = Group::tensor;                      ///< the ranks it spans
  double bytes = 0; ///< the whole tensor's bytes in one data-parallel replica
  std::string what; ///< "input gradient", "weight gradient", "partial -> replicated", ...
};

/// One strategy of one operator, priced per device for one training step (forward +
/// backward), without the layout conversions of its inputs.
struct StrategyOption {
  std::string name;                        ///< "replicated", "column", "row", "batch", "heads", ...
  std::vector<Layout> inputs;              ///< the layout each input must be in
  Layout output = Layout::replicated;      ///< the layout it writes
  bool feasible = true;                    ///< whether the strategy applies
  std::string reason;                      ///< why not, when infeasible
  double flops = 0;                        ///< per device
  double compute_seconds = 0;              ///< flops / FLOP rate
  std::vector<CollectiveCall> collectives; ///< its own collectives
  double communication_seconds = 0;        ///< of `collectives`
  MemoryBreakdown memory;                  ///< per device
  /// compute_seconds + communication_seconds.
  double seconds() const { return compute_seconds + communication_seconds; }
};

/// What a layout conversion of one tensor costs.
struct Conversion {
  bool possible = true;                    ///< whether the conversion exists
  std::string reason;                      ///< why not, when impossible
  double seconds = 0;                      ///< alpha-beta time of its collectives
  std::vector<CollectiveCall> collectives; ///< the collectives it takes
};

namespace detail {

// Elements of tensor t in one data-parallel replica (batched tensors hold B / D samples).
inline double replica_elements(const Graph &g, TensorId t, const CostModel &cm) {
  const Tensor &x = g.tensor(t);
  const double n = static_cast<double>(numel(x.shape));
  return x.batched ? n / cm.mesh.data : n;
}

inline double replica_bytes(const Graph &g, TensorId t, const CostModel &cm) {
  return replica_elements(g, t, cm) * static_cast<double>(g.dtype_bytes());
}

// Share of a tensor one rank holds in a layout.
inline double local_share(Layout l, const CostModel &cm) {
  return l == Layout::sharded || l == Layout::batch ? 1.0 / cm.mesh.tensor : 1.0;
}

// Whether tensor t can be in layout l (extents divisible by T); `reason` says why not.
inline bool layout_fits(const Graph &g, TensorId t, Layout l, const CostModel &cm,
                        std::string *reason = nullptr) {
  const int tp = cm.mesh.tensor;
  const Tensor &x = g.tensor(t);
  if (l == Layout::sharded && x.shape.back() % tp != 0) {
    if (reason) {
      *reason =
          kat::detail::concat("feature extent ", x.shape.back(), " of ", shape_string(x.shape),
                              " is not divisible by ", tp, " tensor ranks");
    }
    return false;
  }
  if (l == Layout::batch) {
    const std::int64_t local = x.shape[0] / cm.mesh.data;
    if (!x.batched || local % tp != 0) {
      if (reason) {
        *reason = x.batched ? kat::detail::concat("batch ", local,
                                                  " per replica is not "
                                                  "divisible by ",
                                                  tp, " tensor ranks")
                            : std::string("the tensor has no batch extent");
      }
      return false;
    }
  }
  return true;
}

} // namespace detail

/// The cost of converting tensor `t` from layout `from` (as its producer wrote it) to `to` (as
/// a consumer reads it), X its bytes in one replica, over the tensor group:
///
/// | from → to | forward | backward (of its gradient) |
/// |---|---|---|
/// | replicated → sharded or batch | slice (free) | all-gather X |
/// | sharded or batch → replicated | all-gather X | slice (free) |
/// | partial → replicated | all-reduce X | free (the gradient is replicated) |
/// | partial → sharded or batch | reduce-scatter X | all-gather X |
/// | sharded ↔ batch | all-to-all X | all-to-all X |
/// | anything else → partial | impossible | |
///
/// A graph input (data, token ids) is read in any layout but partial at no cost. A layout the
/// tensor's extents do not divide into is impossible.
inline Conversion conversion(const Graph &g, TensorId t, Layout from, Layout to,
                             const CostModel &cm) {
  Conversion c;
  if (to == Layout::partial && (from != Layout::partial || g.tensor(t).producer < 0)) {
    c.possible = false;
    c.reason = kat::detail::concat("no collective makes a partial sum of '", g.tensor(t).name,
                                   "' from ", to_string(from));
    return c;
  }
  if (!detail::layout_fits(g, t, to, cm, &c.reason)) {
    c.possible = false;
    return c;
  }
  if (from == to || g.tensor(t).producer < 0) {
    return c;
  }
  const double x = detail::replica_bytes(g, t, cm);
  const std::string what = std::string(to_string(from)) + " -> " + to_string(to);
  const auto add = [&](CollectiveKind kind, Pass pass) {
    if (cm.ranks(Group::tensor) > 1) {
      c.collectives.push_back({kind, pass, Group::tensor, x, what});
      c.seconds += cm.seconds(kind, Group::tensor, x);
    }
  };
  using L = Layout;
  using K = CollectiveKind;
  if (from == L::replicated) { // to sharded or batch
    add(K::all_gather, Pass::backward);
  } else if (from == L::partial) {
    if (to == L::replicated) {
      add(K::all_reduce, Pass::forward);
    } else {
      add(K::reduce_scatter, Pass::forward);
      add(K::all_gather, Pass::backward);
    }
  } else if (to == L::replicated) { // from sharded or batch
    add(K::all_gather, Pass::forward);
  } else { // sharded <-> batch
    add(K::all_to_all, Pass::forward);
    add(K::all_to_all, Pass::backward);
  }
  return c;
}

/// What a graph output (a tensor nobody reads, such as the loss) costs in layout `from`: it
/// must end complete for its samples, replicated or batch-split; the cheaper conversion.
inline Conversion output_conversion(const Graph &g, TensorId t, Layout from, const CostModel &cm) {
  if (from == Layout::replicated || from == Layout::batch) {
    return {};
  }
  Conversion best;
  best.possible = false;
  best.reason = "neither replicated nor batch layout is reachable";
  for (const Layout to : {Layout::replicated, Layout::batch}) {
    Conversion c = conversion(g, t, from, to, cm);
    if (c.possible && (!best.possible || c.seconds < best.seconds)) {
      best = std::move(c);
    }
  }
  return best;
}

/// Every strategy of operator `i` (infeasible ones with feasible = false and the reason), in a
/// fixed order (ties in the search go to the earlier). T = tensor ranks, D = data-parallel
/// replicas; every strategy's weight gradient is all-reduced over the D replicas, over all D·T
/// ranks when the batch is split over the tensor group too:
/// - Dense: "replicated" (R → R); "column" (R → sharded; weight split on its output extent, no
///   forward communication, all-reduce of the input gradient in backward); "row" (sharded →
///   partial; weight split on its input extent, bias whole and added after the reduction);
///   "batch" (batch → batch, data parallel inside the tensor group)
/// - Attention: "replicated", "heads" (sharded → sharded, Q|K|V sharded by heads; heads % T),
///   "batch"
/// - LayerNorm, Add, Flatten, Conv2d, Pool and unknown types: "replicated" or "batch" (all
///   inputs alike)
/// - GELU, ReLU, PositionEmbedding: "replicated", "sharded", "batch" (follow their input)
/// - Embedding: "replicated", "vocab" (table split by rows → partial), "feature" (table split
///   by columns → sharded), "batch"
/// - SoftmaxCrossEntropy: "replicated", "vocab" (sharded logits, Megatron-LM's vocabulary-
///   parallel loss: 3 forward all-reduces of one float per row), "batch"
/// @throws ValueError for an operator index outside the graph
inline std::vector<StrategyOption> strategy_options(const Graph &g, std::size_t i,
                                                    const CostModel &cm) {
  if (i >= g.operators().size()) {
    throw ValueError(kat::detail::concat("kat::plan::strategy_options: operator ", i,
                                         " outside [0, ", g.operators().size(), ")"));
  }
  const Operator &op = g.op(i);
  const double tp = cm.mesh.tensor;
  const double e = static_cast<double>(g.dtype_bytes());
  const double state_bytes = cm.optimizer.state_bytes > 0 ? cm.optimizer.state_bytes : e;
  const double total_flops = (forward_flops(g, op) + backward_flops(g, op)) / cm.mesh.data;
  double params = 0;
  for (const auto p : op.parameters) {
    params += static_cast<double>(numel(g.tensor(p).shape));
  }
  const auto bytes = [&](TensorId t) { return detail::replica_bytes(g, t, cm); };
  double input_bytes = 0;
  for (const auto t : op.inputs) {
    input_bytes += bytes(t);
  }
  std::vector<StrategyOption> options;
  options.reserve(4); // `make` hands out references into it
  // name, layouts, compute divisor, parameter elements per device, weight-gradient group,
  // activation bytes kept per device.
  const auto make = [&](const char *name, std::vector<Layout> in, Layout out, double divisor,
                        double local_params, Group grad_group, double kept) -> StrategyOption & {
    StrategyOption o;
    o.name = name;
    o.inputs = std::move(in);
    o.output = out;
    for (std::size_t k = 0; k < op.inputs.size() && o.feasible; ++k) {
      std::string why;
      if (!detail::layout_fits(g, op.inputs[k], o.inputs[k], cm, &why)) {
        o.feasible = false;
        o.reason = "input " + std::to_string(k) + ": " + why;
      }
    }
    std::string why;
    if (o.feasible && g.tensor(op.output).batched &&
        !detail::layout_fits(g, op.output, out, cm, &why)) {
      o.feasible = false;
      o.reason = "output: " + why;
    }
    o.flops = total_flops / divisor;
    o.compute_seconds = o.flops / cm.cluster.flop_rate;
    o.memory.parameters = local_params * e;
    o.memory.gradients = local_params * e;
    o.memory.optimizer = local_params * cm.optimizer.states * state_bytes;
    o.memory.activations = kept;
    if (local_params > 0 && cm.ranks(grad_group) > 1) {
      o.collectives.push_back({CollectiveKind::all_reduce, Pass::backward, grad_group,
                               local_params * e, "weight gradient"});
    }
    options.push_back(std::move(o));
    return options.back();
  };
  const auto finish = [&](StrategyOption &o) {
    o.communication_seconds = 0;
    for (const auto &c : o.collectives) {
      o.communication_seconds += cm.seconds(c.kind, c.group, c.bytes);
    }
  };
  const auto all = [&](Layout l) { return std::vector<Layout>(op.inputs.size(), l); };
  using L = Layout;
  const Group data = Group::data, both = Group::data_tensor;
  const std::string &type = op.type;
  if (type == "Dense") {
    const double out = static_cast<double>(op.integer("out"));
    const double bias = op.parameters.size() > 1 ? out : 0.0;
    const double weight = params - bias;
    const double x = bytes(op.inputs[0]);
    make("replicated", {L::replicated}, L::replicated, 1, params, data, x);
    auto &column = make("column", {L::replicated}, L::sharded, tp, params / tp, data, x);
    if (cm.ranks(Group::tensor) > 1) {
      column.collectives.push_back(
          {CollectiveKind::all_reduce, Pass::backward, Group::tensor, x, "input gradient"});
    }
    make("row", {L::sharded}, L::partial, tp, weight / tp + bias, data, x / tp);
    make("batch", {L::batch}, L::batch, tp, params, both, x / tp);
  } else if (type == "Attention") {
    const double heads = static_cast<double>(op.integer("heads"));
    const double rows = detail::replica_elements(g, op.inputs[0], cm) /
                        static_cast<double>(g.tensor(op.inputs[0]).shape.back());
    const Shape &xs = g.tensor(op.inputs[0]).shape;
    const double positions = static_cast<double>(xs[xs.size() - 2]);
    const double kept = bytes(op.inputs[0]) + rows * positions * heads * e; // Q|K|V and A
    make("replicated", {L::replicated}, L::replicated, 1, 0, data, kept);
    auto &h = make("heads", {L::sharded}, L::sharded, tp, 0, data, kept / tp);
    if (h.feasible && op.integer("heads") % cm.mesh.tensor != 0) {
      h.feasible = false;
      h.reason = kat::detail::concat("heads ", op.integer("heads"),
                                     " not divisible by tensor ranks ", cm.mesh.tensor);
    }
    make("batch", {L::batch}, L::batch, tp, 0, data, kept / tp);
  } else if (type == "GELU" || type == "ReLU" || type == "PositionEmbedding") {
    // GELU keeps its input and GELU'(x) (kat::nn::GELU's training forward), ReLU its input.
    const double kept = type == "PositionEmbedding" ? 0.0
                        : type == "GELU"            ? 2.0 * input_bytes
                                                    : input_bytes;
    make("replicated", {L::replicated}, L::replicated, 1, params, data, kept);
    make("sharded", {L::sharded}, L::sharded, tp, params / tp, data, kept / tp);
    make("batch", {L::batch}, L::batch, tp, params, both, kept / tp);
  } else if (type == "Embedding") {
    const double vocab = static_cast<double>(op.integer("vocab"));
    const double kept = input_bytes; // the ids
    make("replicated", {L::replicated}, L::replicated, 1, params, data, kept);
    auto &v = make("vocab", {L::replicated}, L::partial, tp, params / tp, data, kept);
    if (v.feasible && op.integer("vocab") % cm.mesh.tensor != 0) {
      v.feasible = false;
      v.reason =
          kat::detail::concat("vocab ", vocab, " not divisible by tensor ranks ", cm.mesh.tensor);
    }
    make("feature", {L::replicated}, L::sharded, tp, params / tp, data, kept);
    make("batch", {L::batch}, L::batch, tp, params, both, kept / tp);
  } else if (type == "SoftmaxCrossEntropy") {
    const double x = bytes(op.inputs[0]);
    make("replicated", all(L::replicated), L::replicated, 1, params, data, x);
    auto &v = make("vocab", all(L::sharded), L::replicated, tp, params / tp, data, x / tp);
    const double rows = detail::replica_elements(g, op.inputs[0], cm) /
                        static_cast<double>(g.tensor(op.inputs[0]).shape.back());
    if (cm.ranks(Group::tensor) > 1) {
      for (const char *what : {"row maxima", "sums of exponentials", "target logits"}) {
        v.collectives.push_back(
            {CollectiveKind::all_reduce, Pass::forward, Group::tensor, rows * 4.0, what});
      }
    }
    make("batch", all(L::batch), L::replicated, tp, params, both, x / tp);
  } else {
    // LayerNorm (keeps its input and 2 statistics per row), Add (keeps nothing), Flatten,
    // Conv2d, Pool and unknown types (keep their inputs).
    double kept = input_bytes;
    if (type == "LayerNorm") {
      kept += 2.0 * detail::replica_elements(g, op.inputs[0], cm) /
              static_cast<double>(g.tensor(op.inputs[0]).shape.back()) * e;
    } else if (type == "Add" || type == "Flatten") {
      kept = 0;
    }
    make("replicated", all(L::replicated), L::replicated, 1, params, data, kept);
    make("batch", all(L::batch), L::batch, tp, params, both, kept / tp);
  }
  for (auto &o : options) {
    finish(o);
  }
  return options;
}

} // namespace kat::plan
