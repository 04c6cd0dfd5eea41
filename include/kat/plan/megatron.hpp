#pragma once
/// @file
/// @brief kat::plan::megatron_plan: Megatron-LM's expert tensor-parallel plan (Shoeybi et al.,
/// "Megatron-LM", arXiv 1909.08053, Sec. 3, Fig. 3) for any Graph, priced with the same cost
/// model as the searched plan, for comparison.

#include "kat/plan/cost_model.hpp"
#include "kat/plan/graph.hpp"
#include "kat/plan/plan.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace kat::plan {

/// Megatron-LM's assignment, by pattern: a Dense feeding an Attention is "column" (QKV) and the
/// Attention "heads"; a Dense reading an Attention's output is "row" (the output projection);
/// Dense → GELU/ReLU → Dense (the MLP) is "column" → "sharded" → "row" (fc1, fc2); every other
/// operator "replicated" (this includes the embeddings and the LM head, which Megatron-LM
/// itself splits over the vocabulary).
inline std::vector<std::string> megatron_strategies(const Graph &g) {
  const auto consumers = g.consumers();
  const auto &ops = g.operators();
  std::vector<std::string> s(ops.size(), "replicated");
  const auto readers = [&](std::size_t i) {
    return consumers[static_cast<std::size_t>(ops[i].output)];
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].type == "Attention") {
      s[i] = "heads";
      const int p = g.tensor(ops[i].inputs[0]).producer;
      if (p >= 0 && ops[static_cast<std::size_t>(p)].type == "Dense") {
        s[static_cast<std::size_t>(p)] = "column";
      }
      for (const auto c : readers(i)) {
        if (ops[c].type == "Dense") {
          s[c] = "row";
        }
      }
    }
    if (ops[i].type != "Dense" || readers(i).size() != 1) {
      continue;
    }
    const std::size_t act = readers(i)[0];
    if ((ops[act].type != "GELU" && ops[act].type != "ReLU") || readers(act).size() != 1) {
      continue;
    }
    const std::size_t second = readers(act)[0];
    if (ops[second].type == "Dense") {
      s[i] = "column";
      s[act] = "sharded";
      s[second] = "row";
    }
  }
  return s;
}

/// evaluate(g, megatron_strategies(g), cm, memory_budget), marked search.method "megatron".
/// @throws ValueError from evaluate, e.g. when the heads are not divisible by T
inline Plan megatron_plan(const Graph &g, const CostModel &cm, double memory_budget = 0) {
  Plan p = evaluate(g, megatron_strategies(g), cm, memory_budget);
  p.search.method = "megatron";
  return p;
}

/// Whether KAT's Megatron-style executor
/// (kat/distributed/tensor_parallel/tensor_parallel_model.hpp, for models described by
/// kat::nn::Sequential::describe) can run operator `op` with `strategy`: inside the attention and
/// MLP bodies of a TransformerEncoderBlock (scopes ending in
/// ".attention.body" and ".mlp.body") a Dense "replicated", "column" or "row", the attention
/// "replicated" or "heads", GELU and ReLU "replicated" or "sharded"; every other operator
/// "replicated" (no batch split inside the tensor-parallel group: that is the mesh's data
/// dimension). Pass it as SearchOptions::allowed to search only plans the executor runs.
inline bool megatron_executor_allows(const Operator &op, const std::string &strategy) {
  const auto ends_with = [&](const char *tail) {
    const std::string t(tail);
    return op.scope.size() >= t.size() &&
           op.scope.compare(op.scope.size() - t.size(), t.size(), t) == 0;
  };
  if (strategy == "replicated") {
    return true;
  }
  if (!ends_with(".attention.body") && !ends_with(".mlp.body")) {
    return false;
  }
  if (op.type == "Dense") {
    return strategy == "column" || strategy == "row";
  }
  if (op.type == "Attention") {
    return strategy == "heads";
  }
  return (op.type == "GELU" || op.type == "ReLU") && strategy == "sharded";
}

} // namespace kat::plan
