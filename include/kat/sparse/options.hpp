#pragma once
/// @file
/// @brief Sparse training's options as registered command-line options (kat::train::Registry).

#include "kat/core/error.hpp"
#include "kat/sparse/agent.hpp"
#include "kat/sparse/density.hpp"
#include "kat/sparse/sparse_training.hpp"
#include "kat/train/registry.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kat::sparse {

/// The options of sparse training, named as kat_train's flags: "sparsity" (1 - density; 0 is
/// dense training), "sparse-init", "sparse-method", "drop-fraction", "delta-t", "t-end".
inline std::vector<train::OptionSpec> sparse_option_specs() {
  return {{"sparsity", "Fraction of masked-out weights in [0, 1) (0: dense training)", "0"},
          {"sparse-init", "Initial per-layer density", "erk", {"uniform", "erk"}},
          {"sparse-method", "Mask updates", "rigl", {"static", "set", "rigl"}},
          {"drop-fraction",
           "Fraction of active weights replaced per update, cosine-decayed [default: 0.3 for "
           "rigl, 0.5 for set]"},
          {"delta-t", "Steps between mask updates", "100"},
          {"t-end", "No mask update after this fraction of the training steps", "0.75"}};
}

/// SparseTrainingOptions from `c` (sparse_option_specs() names; missing ones take their
/// defaults), with `seed` for the masks.
/// @throws ValueError naming the option if sparsity is outside [0, 1) or an option is not a
///   number of the expected kind; SparseTraining's own checks apply on construction.
inline SparseTrainingOptions sparse_training_options(const train::Config &c, std::uint64_t seed) {
  SparseTrainingOptions o;
  const double sparsity = c.has("sparsity") ? c.number("sparsity") : 0.0;
  if (!(sparsity >= 0.0 && sparsity < 1.0)) {
    throw ValueError(kat::detail::concat("option --sparsity must be in [0, 1), got ", sparsity));
  }
  o.density = 1.0 - sparsity;
  if (c.has("sparse-init")) {
    o.init = parse_sparse_init(c.text("sparse-init"), "option --sparse-init");
  }
  if (c.has("sparse-method")) {
    o.method = parse_sparse_method(c.text("sparse-method"), "option --sparse-method");
  }
  o.drop_fraction =
      c.has("drop-fraction") ? c.number("drop-fraction") : default_drop_fraction(o.method);
  if (c.has("delta-t")) {
    o.delta_t = c.integer("delta-t");
  }
  if (c.has("t-end")) {
    o.t_end = c.number("t-end");
  }
  o.seed = seed;
  return o;
}

/// AGENT's options as kat_train's flags: "agent" (a flag: on), "agent-gamma", "agent-rho".
inline std::vector<train::OptionSpec> agent_option_specs() {
  return {{"agent", "Adaptive gradient correction (AGENT, docs/sparse.md)", "", {}, true},
          {"agent-gamma", "AGENT's gamma: weight of the correction", "0.1"},
          {"agent-rho", "AGENT's rho: moving-average rate of tau", "0.3"}};
}

/// AGENTOptions from `c` (agent_option_specs() names; missing ones take their defaults).
/// @throws ValueError naming the option if it is not a number; AGENT's own checks apply on
///   construction.
inline AGENTOptions agent_options(const train::Config &c) {
  AGENTOptions o;
  if (c.has("agent-gamma")) {
    o.gamma = c.number("agent-gamma");
  }
  if (c.has("agent-rho")) {
    o.rho = c.number("agent-rho");
  }
  return o;
}

} // namespace kat::sparse
