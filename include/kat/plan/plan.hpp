#pragma once
/// @file
/// @brief kat::plan::Plan and evaluate(): a tensor-parallel plan (a strategy per operator)
/// priced with the alpha-beta cost model: per operator its strategy and layouts, per
/// collective its kind, bytes and pass, the predicted step time, bytes per device and memory
/// per device (TAP, Shi et al., arXiv 2302.00247; docs/tensor_parallel.md).

#include "kat/core/error.hpp"
#include "kat/plan/cost_model.hpp"
#include "kat/plan/graph.hpp"
#include "kat/plan/strategy.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kat::plan {

/// One operator's part of a plan.
struct OpPlan {
  std::string name;                   ///< the operator's name in the graph
  std::string type;                   ///< the operator's type
  std::string strategy;               ///< one of strategy_options' names
  std::vector<Layout> inputs;         ///< the layout it reads each input in
  Layout output = Layout::replicated; ///< the layout it writes its output in
  /// For a "column" Dense (or "feature" Embedding) feeding a "heads" Attention: 3, its output
  /// extent is Q|K|V, each split over the ranks by heads (rank r holds, of each third, rows
  /// [r·n/(3T), (r+1)·n/(3T)) within it); otherwise 1, one contiguous split.
  int shard_groups = 1;
  double compute_seconds = 0;       ///< forward + backward, per device
  double communication_seconds = 0; ///< its own collectives and its inputs' conversions
  MemoryBreakdown memory;           ///< per device
};

/// One collective of a plan, priced.
struct Collective {
  std::string op;     ///< the operator it belongs to
  std::string tensor; ///< the tensor converted ("" for the operator's own collectives)
  CollectiveKind kind = CollectiveKind::all_reduce; ///< the collective
  Pass pass = Pass::forward;                        ///< forward or backward
  Group group = Group::tensor;                      ///< the ranks it spans
  int ranks = 1;                                    ///< how many ranks that group has
  double bytes = 0;   ///< the whole tensor in one replica (the formula's `bytes`)
  double volume = 0;  ///< bytes each device sends
  double seconds = 0; ///< alpha-beta time
  std::string what;   ///< why it happens ("weight gradient", "partial -> replicated", ...)
};

/// The cost model's prediction for one training step, per device.
struct Prediction {
  double step_seconds = 0;          ///< compute + communication (no overlap assumed)
  double compute_seconds = 0;       ///< the operators' compute time (s)
  double communication_seconds = 0; ///< the collectives' time (s)
  double bytes_per_device = 0;      ///< sum of the collectives' volumes
  MemoryBreakdown memory;           ///< bytes per device, by what they hold
  double memory_budget = 0;         ///< bytes (0: unlimited)
  bool feasible = true;             ///< memory.total() <= memory_budget
};

/// How a plan was found.
struct SearchInfo {
  std::string method = "evaluated"; ///< "folded", "unfolded", "flat", "brute-force", "megatron"
  double seconds = 0;               ///< wall time of the search
  int fold_depth = 0;               ///< scope depth of the folded blocks
  std::size_t unique_blocks = 0;    ///< distinct blocks searched
  std::size_t block_instances = 0;  ///< occurrences of those blocks
  std::size_t loose_operators = 0;  ///< operators outside every block
  int passes = 0;                   ///< dynamic programs run (more than 1 under a memory budget)
  double lambda = 0;                ///< the memory price (s per byte) of the returned plan
  double dp_step_seconds = 0;       ///< the step time the dynamic program summed (checks evaluate)
  double combinations = 0;          ///< brute force: plans enumerated
};

/// A plan: what the executor reads (plan_io.hpp writes and reads it as JSON).
struct Plan {
  std::string model;                   ///< the graph's name
  Mesh mesh;                           ///< the rank grid it is for
  std::string cluster;                 ///< the cluster preset's name
  std::int64_t dtype_bytes = 4;        ///< bytes per element
  OptimizerMemory optimizer;           ///< optimizer state per parameter element
  std::vector<OpPlan> operators;       ///< in graph order
  std::vector<Collective> collectives; ///< every collective, priced
  Prediction predicted;                ///< the step's predicted cost
  SearchInfo search;                   ///< how the plan was found

  /// The entry of operator `name`. @throws ValueError if there is none
  const OpPlan &at(const std::string &name) const {
    for (const auto &o : operators) {
      if (o.name == name) {
        return o;
      }
    }
    throw ValueError(kat::detail::concat("kat::plan::Plan::at: no operator named '", name, "'"));
  }
  /// The strategy names in graph order (evaluate's input).
  std::vector<std::string> strategies() const {
    std::vector<std::string> s;
    for (const auto &o : operators) {
      s.push_back(o.strategy);
    }
    return s;
  }
};

namespace detail {

// Global batch divisible by the replicas for every batched tensor.
inline void require_batch_divisible(const Graph &g, const CostModel &cm, const char *who) {
  for (const auto &t : g.tensors()) {
    if (t.batched && !t.parameter && t.shape[0] % cm.mesh.data != 0) {
      throw ValueError(kat::detail::concat(who, ": the global batch ", t.shape[0], " of '", t.name,
                                           "' is not divisible by ", cm.mesh.data,
                                           " data-parallel replicas"));
    }
  }
}

// The column Dense feeding each heads-split Attention gets shard_groups 3 (see OpPlan).
inline void mark_shard_groups(const Graph &g, std::vector<OpPlan> &ops) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].type != "Attention" || ops[i].strategy != "heads") {
      continue;
    }
    TensorId t = g.op(i).inputs[0];
    while (g.tensor(t).producer >= 0) {
      const auto p = static_cast<std::size_t>(g.tensor(t).producer);
      const OpPlan &q = ops[p];
      if ((q.type == "GELU" || q.type == "ReLU" || q.type == "PositionEmbedding") &&
          q.strategy == "sharded") {
        t = g.op(p).inputs[0];
        continue;
      }
      if ((q.type == "Dense" && q.strategy == "column") ||
          (q.type == "Embedding" && q.strategy == "feature")) {
        ops[p].shard_groups = 3;
      }
      break;
    }
  }
}

} // namespace detail

/// Prices the plan that gives operator i strategy `strategies[i]`: every operator's own cost
/// (strategy_options), the conversions of its inputs from the layouts their producers wrote
/// (conversion), and each graph output's conversion to a replicated or batch layout
/// (output_conversion). The result's search.method is "evaluated".
/// @param g             the model
/// @param strategies    one strategy name per operator, in graph order
/// @param cm            the cluster, mesh and optimizer the plan is priced for
/// @param memory_budget bytes per device (0: unlimited); only sets predicted.feasible
/// @throws ValueError for a wrong number of strategies, an unknown or infeasible strategy (the
///   message names the operator and why), an impossible conversion, or a global batch not
///   divisible by the data-parallel replicas
inline Plan evaluate(const Graph &g, const std::vector<std::string> &strategies,
                     const CostModel &cm, double memory_budget = 0) {
  const char *who = "kat::plan::evaluate";
  cm.validate();
  detail::require_batch_divisible(g, cm, who);
  if (strategies.size() != g.operators().size()) {
    throw ValueError(kat::detail::concat(who, ": ", g.operators().size(),
                                         " strategies needed (one per operator), got ",
                                         strategies.size()));
  }
  Plan plan;
  plan.model = g.name();
  plan.mesh = cm.mesh;
  plan.cluster = cm.cluster.name;
  plan.dtype_bytes = g.dtype_bytes();
  plan.optimizer = cm.optimizer;
  const auto consumers = g.consumers();
  std::vector<Layout> layout(g.tensors().size(), Layout::replicated);
  Prediction &pr = plan.predicted;
  const auto record = [&](OpPlan &p, const CollectiveCall &c, const std::string &tensor) {
    Collective k;
    k.op = p.name;
    k.tensor = tensor;
    k.kind = c.kind;
    k.pass = c.pass;
    k.group = c.group;
    k.ranks = cm.ranks(c.group);
    k.bytes = c.bytes;
    k.volume = collective_volume(c.kind, k.ranks, c.bytes);
    k.seconds = cm.seconds(c.kind, c.group, c.bytes);
    k.what = c.what;
    p.communication_seconds += k.seconds;
    pr.communication_seconds += k.seconds;
    pr.bytes_per_device += k.volume;
    plan.collectives.push_back(std::move(k));
  };
  for (std::size_t i = 0; i < g.operators().size(); ++i) {
    const Operator &op = g.op(i);
    const auto options = strategy_options(g, i, cm);
    const StrategyOption *o = nullptr;
    std::string known;
    for (const auto &candidate : options) {
      known += (known.empty() ? "" : ", ") + candidate.name;
      if (candidate.name == strategies[i]) {
        o = &candidate;
      }
    }
    if (o == nullptr) {
      throw ValueError(kat::detail::concat(who, ": ", op.type, " '", op.name, "' has no strategy '",
                                           strategies[i], "'; its strategies: ", known));
    }
    if (!o->feasible) {
      throw ValueError(kat::detail::concat(who, ": strategy '", o->name, "' of ", op.type, " '",
                                           op.name, "' is not possible: ", o->reason));
    }
    OpPlan p;
    p.name = op.name;
    p.type = op.type;
    p.strategy = o->name;
    p.inputs = o->inputs;
    p.output = o->output;
    p.compute_seconds = o->compute_seconds;
    p.memory = o->memory;
    for (const auto &c : o->collectives) {
      record(p, c, "");
    }
    for (std::size_t k = 0; k < op.inputs.size(); ++k) {
      const TensorId t = op.inputs[k];
      const Layout from = layout[static_cast<std::size_t>(t)];
      const Conversion conv = conversion(g, t, from, o->inputs[k], cm);
      if (!conv.possible) {
        throw ValueError(kat::detail::concat(
            who, ": ", op.type, " '", op.name, "' (", o->name, ") reads '", g.tensor(t).name,
            "' as ", to_string(o->inputs[k]), " but it is ", to_string(from), ": ", conv.reason));
      }
      for (const auto &c : conv.collectives) {
        record(p, c, g.tensor(t).name);
      }
    }
    layout[static_cast<std::size_t>(op.output)] = o->output;
    if (consumers[static_cast<std::size_t>(op.output)].empty()) {
      const Conversion conv = output_conversion(g, op.output, o->output, cm);
      if (!conv.possible) {
        throw ValueError(
            kat::detail::concat(who, ": graph output '", op.name, "' (", o->name,
                                ") cannot end replicated or batch-split: ", conv.reason));
      }
      for (const auto &c : conv.collectives) {
        record(p, c, op.name);
      }
    }
    pr.compute_seconds += p.compute_seconds;
    pr.memory += p.memory;
    plan.operators.push_back(std::move(p));
  }
  detail::mark_shard_groups(g, plan.operators);
  pr.step_seconds = pr.compute_seconds + pr.communication_seconds;
  pr.memory_budget = memory_budget;
  pr.feasible = memory_budget <= 0 || pr.memory.total() <= memory_budget;
  return plan;
}

} // namespace kat::plan
