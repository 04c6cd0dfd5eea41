#pragma once
/// @file
/// @brief kat::plan::search: TAP's tensor-parallel plan search (Shi et al., arXiv 2302.00247,
/// Sec. 4): a dynamic program over activation layouts, run once per unique block of the folded
/// graph (a table of costs by boundary layouts) and chained over the block instances; the
/// unfolded and flat variants for timing, and exhaustive enumeration for checking
/// (docs/tensor_parallel.md).

#include "kat/core/error.hpp"
#include "kat/plan/cost_model.hpp"
#include "kat/plan/folding.hpp"
#include "kat/plan/graph.hpp"
#include "kat/plan/plan.hpp"
#include "kat/plan/strategy.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kat::plan {

/// How search() visits the graph.
enum class SearchMethod {
  folded,   ///< one table per unique block, chained over the instances (TAP)
  unfolded, ///< one table per block instance, no reuse (for timing against folded)
  flat      ///< the same dynamic program over every operator, no blocks
};

/// "folded", "unfolded", "flat".
inline const char *to_string(SearchMethod m) {
  return m == SearchMethod::folded ? "folded" : m == SearchMethod::unfolded ? "unfolded" : "flat";
}

/// The method named `name`. @throws ValueError for another name
inline SearchMethod search_method_from_string(const std::string &name) {
  for (const auto m : {SearchMethod::folded, SearchMethod::unfolded, SearchMethod::flat}) {
    if (name == to_string(m)) {
      return m;
    }
  }
  throw ValueError(kat::detail::concat("kat::plan::search_method_from_string: unknown method '",
                                       name, "'; known: folded, unfolded, flat"));
}

/// Options of search().
struct SearchOptions {
  SearchMethod method = SearchMethod::folded; ///< folded (default), unfolded or flat
  int fold_depth = 0;                         ///< scope depth of the blocks (0: chosen by fold())
  double memory_budget = 0;                   ///< bytes per device (0: unlimited)
  int max_passes = 64;                        ///< dynamic programs at most, under a memory budget
  /// Strategies the search must not use, for an executor that lacks them: a strategy name for
  /// every operator type ("batch": no data parallelism inside the tensor group) or
  /// "Type:name" for one type ("SoftmaxCrossEntropy:vocab").
  std::vector<std::string> disabled;
  /// When set, only the strategies it accepts for an operator (an executor's abilities, e.g.
  /// megatron_executor_allows in megatron.hpp); applied after `disabled`.
  std::function<bool(const Operator &, const std::string &)> allowed;
};

namespace detail {

constexpr double infinity = std::numeric_limits<double>::infinity();
constexpr std::size_t no_use = static_cast<std::size_t>(-1);

// A partial plan's cost: the objective the program minimizes, time·w_t + memory·w_m, and both
// parts.
struct Cost {
  double objective = 0;
  double time = 0;
  double memory = 0;
};

struct Weights {
  double time = 1;
  double memory = 0;
};

// Strictly better: smaller objective (relative tolerance 1e-12, so summation order does not
// decide), then less memory, then less time.
inline bool better(const Cost &a, const Cost &b) {
  const auto less = [](double x, double y) {
    return x < y - 1e-12 * std::max(std::abs(x), std::abs(y));
  };
  if (less(a.objective, b.objective)) {
    return true;
  }
  if (less(b.objective, a.objective)) {
    return false;
  }
  if (less(a.memory, b.memory)) {
    return true;
  }
  if (less(b.memory, a.memory)) {
    return false;
  }
  return less(a.time, b.time);
}

// Per operator its feasible strategies, per tensor its conversion and graph-output costs;
// computed on first use, so the folded search prices only the operators it visits.
class Tables {
public:
  Tables(const Graph &g, const CostModel &cm, const std::vector<std::string> &disabled = {},
         std::function<bool(const Operator &, const std::string &)> allowed = {})
      : g_(g), cm_(cm), disabled_(disabled), allowed_(std::move(allowed)),
        options_(g.operators().size()), convert_(g.tensors().size()), sink_(g.tensors().size()),
        last_use_(last_uses(g)) {}

  const Graph &graph() const { return g_; }
  const std::vector<std::size_t> &last_use() const { return last_use_; }
  bool graph_input(TensorId t) const { return g_.tensor(t).producer < 0; }
  bool graph_output(TensorId t) const {
    return !graph_input(t) && last_use_[static_cast<std::size_t>(t)] == no_use;
  }

  // The feasible strategies of operator `op` that are not disabled.
  // @throws ValueError naming the operator when none is left
  const std::vector<StrategyOption> &options(std::size_t op) {
    auto &o = options_[op];
    if (!o) {
      o.emplace();
      const std::string &type = g_.op(op).type;
      for (auto &s : strategy_options(g_, op, cm_)) {
        const bool off =
            std::any_of(disabled_.begin(), disabled_.end(),
                        [&](const auto &d) { return d == s.name || d == type + ":" + s.name; }) ||
            (allowed_ && !allowed_(g_.op(op), s.name));
        if (s.feasible && !off) {
          o->push_back(std::move(s));
        }
      }
      if (o->empty()) {
        throw ValueError(kat::detail::concat("kat::plan::search: ", type, " '", g_.op(op).name,
                                             "' has no feasible strategy that is not disabled"));
      }
    }
    return *o;
  }
  // Seconds to convert t from `from` to `to` (infinity: impossible).
  double convert(TensorId t, int from, int to) {
    auto &c = convert_[static_cast<std::size_t>(t)];
    if (!c) {
      c.emplace();
      for (int f = 0; f < layout_count; ++f) {
        for (int k = 0; k < layout_count; ++k) {
          const Conversion v =
              conversion(g_, t, static_cast<Layout>(f), static_cast<Layout>(k), cm_);
          (*c)[static_cast<std::size_t>(f)][static_cast<std::size_t>(k)] =
              v.possible ? v.seconds : infinity;
        }
      }
    }
    return (*c)[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)];
  }
  // Seconds for graph output t written in layout `from` (infinity: impossible).
  double sink(TensorId t, int from) {
    auto &c = sink_[static_cast<std::size_t>(t)];
    if (!c) {
      c.emplace();
      for (int f = 0; f < layout_count; ++f) {
        const Conversion v = output_conversion(g_, t, static_cast<Layout>(f), cm_);
        (*c)[static_cast<std::size_t>(f)] = v.possible ? v.seconds : infinity;
      }
    }
    return (*c)[static_cast<std::size_t>(from)];
  }

private:
  const Graph &g_;
  const CostModel &cm_;
  std::vector<std::string> disabled_;
  std::function<bool(const Operator &, const std::string &)> allowed_;
  std::vector<std::optional<std::vector<StrategyOption>>> options_;
  std::vector<std::optional<std::array<std::array<double, layout_count>, layout_count>>> convert_;
  std::vector<std::optional<std::array<double, layout_count>>> sink_;
  std::vector<std::size_t> last_use_;
};

// The dynamic program's state: the layouts of the live activations (produced, still to be
// read), 2 bits each, in the order of a sorted list of tensor ids.
struct Node {
  Cost cost;
  std::uint64_t prev = 0;
  int choice = -1;
};
using States = std::map<std::uint64_t, Node>;
constexpr std::size_t max_live = 32;

inline int layout_at(std::uint64_t code, std::size_t position) {
  return static_cast<int>((code >> (2 * position)) & 3u);
}

inline int position_of(const std::vector<TensorId> &sorted, TensorId t) {
  const auto it = std::lower_bound(sorted.begin(), sorted.end(), t);
  return it != sorted.end() && *it == t ? static_cast<int>(it - sorted.begin()) : -1;
}

inline void relax(States &states, std::uint64_t code, const Cost &cost, std::uint64_t prev,
                  int choice) {
  const auto it = states.find(code);
  if (it == states.end()) {
    states.emplace(code, Node{cost, prev, choice});
  } else if (better(cost, it->second.cost)) {
    it->second = Node{cost, prev, choice};
  }
}

inline void require_live_limit(const Graph &g, const std::vector<TensorId> &live, std::size_t op) {
  if (live.size() > max_live) {
    throw ValueError(kat::detail::concat("kat::plan::search: ", live.size(),
                                         " activations are live after operator '", g.op(op).name,
                                         "'; the search handles at most ", max_live));
  }
}

// One operator's transition: every state of `in` (over `before`) times every strategy, into
// `out` (over `after`). A graph output pays its final conversion here when `sink` is set
// (inside a block table the chain pays it, so that a block's last instance shares the table).
// Graph inputs are in the state too, always in layout 0: converting them is free.
inline void advance_op(Tables &tb, std::size_t i, const std::vector<TensorId> &before,
                       const std::vector<TensorId> &after, const States &in, States &out,
                       const Weights &w, bool sink) {
  const Operator &op = tb.graph().op(i);
  std::vector<int> in_pos(op.inputs.size());
  for (std::size_t k = 0; k < op.inputs.size(); ++k) {
    in_pos[k] = position_of(before, op.inputs[k]);
    if (in_pos[k] < 0) { // cannot happen: every input is live until its last reader
      throw std::logic_error("kat::plan::search: an input of '" + op.name + "' is not live");
    }
  }
  std::vector<int> source(after.size());
  for (std::size_t k = 0; k < after.size(); ++k) {
    source[k] = after[k] == op.output ? -1 : position_of(before, after[k]);
  }
  const bool output = sink && tb.graph_output(op.output);
  const auto &options = tb.options(i);
  for (const auto &[code, node] : in) {
    for (std::size_t k = 0; k < options.size(); ++k) {
      const StrategyOption &o = options[k];
      double time = o.seconds();
      for (std::size_t j = 0; j < op.inputs.size() && time < infinity; ++j) {
        const int from = layout_at(code, static_cast<std::size_t>(in_pos[j]));
        time += tb.convert(op.inputs[j], from, static_cast<int>(o.inputs[j]));
      }
      if (output && time < infinity) {
        time += tb.sink(op.output, static_cast<int>(o.output));
      }
      if (time == infinity) {
        continue;
      }
      const double memory = o.memory.total();
      const Cost c{node.cost.objective + w.time * time + w.memory * memory, node.cost.time + time,
                   node.cost.memory + memory};
      std::uint64_t next = 0;
      for (std::size_t a = 0; a < after.size(); ++a) {
        const int l = source[a] < 0 ? static_cast<int>(o.output)
                                    : layout_at(code, static_cast<std::size_t>(source[a]));
        next |= static_cast<std::uint64_t>(l) << (2 * a);
      }
      relax(out, next, c, code, static_cast<int>(k));
    }
  }
}

// The live set after operator i: `live` minus what i reads last, plus i's output if it is read
// later. `last` gives the last reader of each tensor in scope (inside a block: the block's
// own last use for its input ports).
template <class LastUse>
std::vector<TensorId> live_after(const Graph &g, std::size_t i, const std::vector<TensorId> &live,
                                 const LastUse &last) {
  std::vector<TensorId> after;
  for (const auto t : live) {
    const std::size_t use = last(t);
    if (use != no_use && use > i) {
      after.push_back(t);
    }
  }
  const TensorId out = g.op(i).output;
  const std::size_t use = last(out);
  if (use != no_use && use > i) {
    after.insert(std::lower_bound(after.begin(), after.end(), out), out);
  }
  require_live_limit(g, after, i);
  return after;
}

// A block's boundary: tensors from before it it reads (produced earlier, or graph inputs; by
// first use) and tensors it produces that are read after it or by nobody (graph outputs; by
// production).
struct Ports {
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
};

inline Ports block_ports(const Tables &tb, OpRange r) {
  const Graph &g = tb.graph();
  Ports p;
  for (std::size_t i = r.first; i < r.last; ++i) {
    for (const auto t : g.op(i).inputs) {
      const int producer = g.tensor(t).producer;
      if ((producer < 0 || static_cast<std::size_t>(producer) < r.first) &&
          std::find(p.inputs.begin(), p.inputs.end(), t) == p.inputs.end()) {
        p.inputs.push_back(t);
      }
    }
  }
  for (std::size_t i = r.first; i < r.last; ++i) {
    const TensorId t = g.op(i).output;
    const std::size_t use = tb.last_use()[static_cast<std::size_t>(t)];
    if (use == no_use || use >= r.last) {
      p.outputs.push_back(t);
    }
  }
  return p;
}

// cost(in layouts, out layouts) of one block: rows[in code] lists, per reachable out code, the
// best cost and the strategy (option index) of each of the block's operators. Codes put port
// k's layout at bits 2k, ports in Ports order.
struct TableEntry {
  std::uint64_t out_code = 0;
  Cost cost;
  std::vector<int> choice;
};
struct BlockTable {
  std::vector<std::vector<TableEntry>> rows;
};
constexpr std::size_t max_block_ports = 6;

inline BlockTable block_table(Tables &tb, OpRange r, const Ports &ports, const Weights &w) {
  const Graph &g = tb.graph();
  std::map<TensorId, std::size_t> inside_last; // input ports: last reader inside the block
  for (std::size_t i = r.first; i < r.last; ++i) {
    for (const auto t : g.op(i).inputs) {
      if (std::find(ports.inputs.begin(), ports.inputs.end(), t) != ports.inputs.end()) {
        inside_last[t] = i;
      }
    }
  }
  const auto last = [&](TensorId t) {
    const auto it = inside_last.find(t);
    if (it != inside_last.end()) {
      return it->second;
    }
    const std::size_t use = tb.last_use()[static_cast<std::size_t>(t)];
    return use == no_use ? r.last : use; // graph outputs stay live to the block's end
  };
  std::vector<TensorId> start = ports.inputs;
  std::sort(start.begin(), start.end());
  // The live sets before each operator do not depend on the layouts: compute them once.
  std::vector<std::vector<TensorId>> live{start};
  for (std::size_t i = r.first; i < r.last; ++i) {
    live.push_back(live_after(g, i, live.back(), last));
  }
  const std::size_t k = ports.inputs.size();
  BlockTable table;
  table.rows.resize(std::size_t(1) << (2 * k));
  std::vector<States> history(r.size() + 1);
  for (std::uint64_t in_code = 0; in_code < table.rows.size(); ++in_code) {
    std::uint64_t code = 0;
    for (std::size_t p = 0; p < k; ++p) {
      const int l = layout_at(in_code, p);
      code |= static_cast<std::uint64_t>(l)
              << (2 * static_cast<std::size_t>(position_of(start, ports.inputs[p])));
    }
    history[0].clear();
    history[0].emplace(code, Node{});
    for (std::size_t j = 0; j < r.size(); ++j) {
      history[j + 1].clear();
      advance_op(tb, r.first + j, live[j], live[j + 1], history[j], history[j + 1], w, false);
    }
    for (const auto &[out_code, node] : history[r.size()]) {
      TableEntry e;
      e.out_code = out_code; // outputs sorted by id = production order
      e.cost = node.cost;
      e.choice.resize(r.size());
      std::uint64_t c = out_code;
      for (std::size_t j = r.size(); j-- > 0;) {
        const Node &n = history[j + 1].at(c);
        e.choice[j] = n.choice;
        c = n.prev;
      }
      table.rows[in_code].push_back(std::move(e));
    }
  }
  return table;
}

// One step of the chain: an operator, or a block instance using table `table`.
struct Step {
  OpRange ops;
  int table = -1; // -1: a single operator
  Ports ports;
  std::size_t representative = 0; // first operator of the instance whose table it uses
};

struct Chain {
  std::vector<Step> steps;
  std::vector<OpRange> table_ranges; // the range each table is computed on
  std::vector<Ports> table_ports;
  std::size_t unique_blocks = 0, block_instances = 0, loose = 0;
  int depth = 0;
};

inline Chain make_chain(Tables &tb, SearchMethod method, int fold_depth) {
  const Graph &g = tb.graph();
  Chain chain;
  const std::size_t n = g.operators().size();
  Folding f;
  if (method != SearchMethod::flat) {
    f = fold(g, fold_depth);
    chain.depth = f.depth;
  }
  std::vector<int> table_of_unique(f.unique.size(), -1);
  for (std::size_t i = 0; i < n;) {
    const int inst = f.instance_of_op.empty() ? -1 : f.instance_of_op[i];
    if (inst < 0) {
      chain.steps.push_back({{i, i + 1}, -1, {}, i});
      ++chain.loose;
      ++i;
      continue;
    }
    const BlockInstance &b = f.instances[static_cast<std::size_t>(inst)];
    Ports ports = block_ports(tb, b.ops);
    if (ports.inputs.size() > max_block_ports) { // too many boundary layouts: op by op
      for (std::size_t j = b.ops.first; j < b.ops.last; ++j) {
        chain.steps.push_back({{j, j + 1}, -1, {}, j});
        ++chain.loose;
      }
      i = b.ops.last;
      continue;
    }
    Step s;
    s.ops = b.ops;
    s.ports = ports;
    int &shared = table_of_unique[b.unique];
    if (method == SearchMethod::folded && shared >= 0) {
      s.table = shared;
    } else {
      s.table = static_cast<int>(chain.table_ranges.size());
      chain.table_ranges.push_back(b.ops);
      chain.table_ports.push_back(ports);
      if (shared < 0) {
        shared = s.table;
        ++chain.unique_blocks;
      }
    }
    s.representative = chain.table_ranges[static_cast<std::size_t>(s.table)].first;
    chain.steps.push_back(std::move(s));
    ++chain.block_instances;
    i = b.ops.last;
  }
  return chain;
}

// The best plan for one weighting: strategy names per operator and its cost.
struct RunResult {
  std::vector<std::string> strategies;
  Cost cost;
};

inline RunResult run_chain(Tables &tb, const Chain &chain, const Weights &w) {
  const Graph &g = tb.graph();
  std::vector<BlockTable> tables;
  tables.reserve(chain.table_ranges.size());
  for (std::size_t t = 0; t < chain.table_ranges.size(); ++t) {
    tables.push_back(block_table(tb, chain.table_ranges[t], chain.table_ports[t], w));
  }
  const auto global_last = [&](TensorId t) { return tb.last_use()[static_cast<std::size_t>(t)]; };
  // Graph inputs that are read start live, in layout 0 (reading them is free in any layout).
  std::vector<TensorId> inputs;
  for (const auto &t : g.tensors()) {
    if (!t.parameter && t.producer < 0 && global_last(t.id) != no_use) {
      inputs.push_back(t.id);
    }
  }
  require_live_limit(g, inputs, 0);
  std::vector<std::vector<TensorId>> live{inputs};
  std::vector<States> history(chain.steps.size() + 1);
  history[0].emplace(0, Node{});
  for (std::size_t s = 0; s < chain.steps.size(); ++s) {
    const Step &step = chain.steps[s];
    const std::vector<TensorId> &before = live.back();
    if (step.table < 0) {
      live.push_back(live_after(g, step.ops.first, before, global_last));
      advance_op(tb, step.ops.first, live[s], live[s + 1], history[s], history[s + 1], w, true);
      continue;
    }
    std::vector<TensorId> after;
    for (const auto t : before) {
      const std::size_t use = global_last(t);
      if (use != no_use && use >= step.ops.last) {
        after.push_back(t);
      }
    }
    std::vector<std::size_t> sinks; // output ports nobody reads: graph outputs
    for (std::size_t m = 0; m < step.ports.outputs.size(); ++m) {
      const TensorId t = step.ports.outputs[m];
      if (tb.graph_output(t)) {
        sinks.push_back(m);
      } else {
        after.insert(std::lower_bound(after.begin(), after.end(), t), t);
      }
    }
    require_live_limit(g, after, step.ops.last - 1);
    live.push_back(after);
    std::vector<int> in_pos, source(after.size());
    for (const auto t : step.ports.inputs) {
      in_pos.push_back(position_of(live[s], t));
    }
    for (std::size_t a = 0; a < after.size(); ++a) {
      const auto it = std::find(step.ports.outputs.begin(), step.ports.outputs.end(), after[a]);
      source[a] = it != step.ports.outputs.end()
                      ? -1 - static_cast<int>(it - step.ports.outputs.begin())
                      : position_of(live[s], after[a]);
    }
    const BlockTable &table = tables[static_cast<std::size_t>(step.table)];
    for (const auto &[code, node] : history[s]) {
      std::uint64_t in_code = 0;
      for (std::size_t p = 0; p < in_pos.size(); ++p) {
        in_code |= static_cast<std::uint64_t>(layout_at(code, static_cast<std::size_t>(in_pos[p])))
                   << (2 * p);
      }
      const auto &row = table.rows[in_code];
      for (std::size_t e = 0; e < row.size(); ++e) {
        const TableEntry &entry = row[e];
        double sink = 0;
        for (const auto m : sinks) {
          sink += tb.sink(step.ports.outputs[m], layout_at(entry.out_code, m));
        }
        if (sink == infinity) {
          continue;
        }
        const Cost c{node.cost.objective + entry.cost.objective + w.time * sink,
                     node.cost.time + entry.cost.time + sink, node.cost.memory + entry.cost.memory};
        std::uint64_t next = 0;
        for (std::size_t a = 0; a < after.size(); ++a) {
          const int l = source[a] < 0
                            ? layout_at(entry.out_code, static_cast<std::size_t>(-1 - source[a]))
                            : layout_at(code, static_cast<std::size_t>(source[a]));
          next |= static_cast<std::uint64_t>(l) << (2 * a);
        }
        relax(history[s + 1], next, c, code, static_cast<int>(e));
      }
    }
  }
  if (history.back().empty()) {
    throw ValueError("kat::plan::search: no plan satisfies the layout constraints");
  }
  RunResult result;
  result.strategies.resize(g.operators().size());
  // Only the empty state remains after the last operator (everything has been read).
  std::uint64_t code = history.back().begin()->first;
  result.cost = history.back().begin()->second.cost;
  for (std::size_t s = chain.steps.size(); s-- > 0;) {
    const Step &step = chain.steps[s];
    const Node &n = history[s + 1].at(code);
    if (step.table < 0) {
      result.strategies[step.ops.first] =
          tb.options(step.ops.first)[static_cast<std::size_t>(n.choice)].name;
    } else {
      std::uint64_t in_code = 0;
      for (std::size_t p = 0; p < step.ports.inputs.size(); ++p) {
        in_code |=
            static_cast<std::uint64_t>(layout_at(
                n.prev, static_cast<std::size_t>(position_of(live[s], step.ports.inputs[p]))))
            << (2 * p);
      }
      const TableEntry &entry = tables[static_cast<std::size_t>(step.table)]
                                    .rows[in_code][static_cast<std::size_t>(n.choice)];
      for (std::size_t j = 0; j < step.ops.size(); ++j) {
        result.strategies[step.ops.first + j] =
            tb.options(step.representative + j)[static_cast<std::size_t>(entry.choice[j])].name;
      }
    }
    code = n.prev;
  }
  return result;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace detail

/// The search of search() without the final pricing: the strategy of each operator, in graph
/// order (search() is this followed by evaluate()). `info`, when given, receives the method,
/// the wall time, the folding, the passes, λ and the step time the program summed.
/// @throws ValueError as search()
inline std::vector<std::string> search_strategies(const Graph &g, const CostModel &cm,
                                                  const SearchOptions &options = {},
                                                  SearchInfo *info = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  cm.validate();
  detail::require_batch_divisible(g, cm, "kat::plan::search");
  if (options.memory_budget < 0 || options.max_passes < 2) {
    throw ValueError(kat::detail::concat("kat::plan::search: memory_budget must be >= 0 and "
                                         "max_passes >= 2, got ",
                                         options.memory_budget, " and ", options.max_passes));
  }
  detail::Tables tb(g, cm, options.disabled, options.allowed);
  const detail::Chain chain = detail::make_chain(tb, options.method, options.fold_depth);
  int passes = 0;
  const auto run = [&](const detail::Weights &w) {
    ++passes;
    return detail::run_chain(tb, chain, w);
  };
  const double budget = options.memory_budget;
  const auto fits = [&](const detail::RunResult &r) { return r.cost.memory <= budget; };
  const auto faster = [](const detail::RunResult &a, const detail::RunResult &b) {
    return detail::better({a.cost.time, a.cost.time, a.cost.memory},
                          {b.cost.time, b.cost.time, b.cost.memory});
  };
  detail::RunResult best = run({1, 0});
  double lambda = 0;
  if (budget > 0 && !fits(best)) {
    const detail::RunResult fastest = best;
    best = run({0, 1}); // least memory
    lambda = detail::infinity;
    if (fits(best)) {
      double lo = 0, hi = fastest.cost.time / fastest.cost.memory;
      bool found = false;
      while (!found && passes < options.max_passes) {
        detail::RunResult r = run({1, hi});
        if (fits(r)) {
          found = true;
          if (faster(r, best)) {
            best = std::move(r);
            lambda = hi;
          }
        } else {
          lo = hi;
          hi *= 8;
        }
      }
      while (found && passes < options.max_passes && (lo == 0 || hi > lo * 1.0001)) {
        const double mid = lo == 0 ? hi / 64 : std::sqrt(lo * hi);
        detail::RunResult r = run({1, mid});
        if (fits(r)) {
          hi = mid;
          if (faster(r, best)) {
            best = std::move(r);
            lambda = mid;
          }
        } else {
          lo = mid;
        }
      }
    }
  }
  if (info != nullptr) {
    info->method = to_string(options.method);
    info->seconds = detail::seconds_since(t0);
    info->fold_depth = chain.depth;
    info->unique_blocks = chain.unique_blocks;
    info->block_instances = chain.block_instances;
    info->loose_operators = chain.loose;
    info->passes = passes;
    info->lambda = lambda;
    info->dp_step_seconds = best.cost.time;
  }
  return std::move(best.strategies);
}

/// Searches the plan of least predicted step time whose memory per device fits the budget.
///
/// The state of the dynamic program is the layout of every live activation; an operator's
/// transition tries each of its strategies and pays its own cost plus the conversions of its
/// inputs (strategy.hpp). With SearchMethod::folded each unique block of fold(g) gets one table
/// cost(input-port layouts, output-port layouts) holding the best strategy of each of its
/// operators, and a chain program over the block instances and the remaining operators picks
/// the entries (TAP, Sec. 4); unfolded builds the same table for every instance, flat runs the
/// program over every operator. All three find the same optimum. Without a budget, or when the
/// fastest plan fits, one program finds it exactly. Otherwise memory is priced at λ seconds
/// per byte (Lagrangian relaxation) and λ is bisected to the smallest price whose plan fits:
/// the plan returned fits and is the fastest of the plans on the lower convex hull of
/// (memory, time); a plan off the hull can be missed. When even the plan of least memory does
/// not fit, that plan is returned with predicted.feasible = false and search.lambda = ∞.
/// search.seconds is the search's wall time without the final evaluate().
/// @throws ValueError for an invalid cost model or options, a global batch not divisible by
///   the data-parallel replicas, more than 32 activations live at once, or an operator whose
///   strategies are all disabled
inline Plan search(const Graph &g, const CostModel &cm, const SearchOptions &options = {}) {
  SearchInfo info;
  const auto strategies = search_strategies(g, cm, options, &info);
  Plan plan = evaluate(g, strategies, cm, options.memory_budget);
  plan.search = info;
  return plan;
}

/// Exhaustive enumeration for checking search(): every combination of every operator's
/// feasible strategies, priced as evaluate() prices it (partial sums shared along the
/// enumeration, nothing pruned); the fastest that fits `memory_budget` (0: unlimited), or the
/// one of least memory when none fits. Meant for one block (a GPT block has 36,864
/// combinations). `disabled` removes strategies as SearchOptions::disabled does.
/// @throws ValueError when there are more than `max_combinations` combinations, or an
///   operator has no strategy left
inline Plan brute_force(const Graph &g, const CostModel &cm, double memory_budget = 0,
                        double max_combinations = 1e8,
                        const std::vector<std::string> &disabled = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  cm.validate();
  detail::require_batch_divisible(g, cm, "kat::plan::brute_force");
  detail::Tables tb(g, cm, disabled);
  const std::size_t n = g.operators().size();
  double combinations = 1;
  for (std::size_t i = 0; i < n; ++i) {
    combinations *= static_cast<double>(tb.options(i).size());
  }
  if (combinations > max_combinations) {
    throw ValueError(kat::detail::concat("kat::plan::brute_force: ", combinations,
                                         " strategy combinations, more than max_combinations = ",
                                         max_combinations, "; enumerate one block"));
  }
  std::vector<int> layout(g.tensors().size(), 0), choice(n, 0), best_choice;
  std::vector<double> time(n + 1, 0.0), memory(n + 1, 0.0);
  double best_time = 0, best_memory = 0;
  bool best_fits = false;
  const auto consider = [&] {
    const bool fits = memory_budget <= 0 || memory[n] <= memory_budget;
    const detail::Cost c{fits ? time[n] : memory[n], time[n], memory[n]};
    const detail::Cost b{best_fits ? best_time : best_memory, best_time, best_memory};
    if (best_choice.empty() || (fits && !best_fits) ||
        (fits == best_fits && detail::better(c, b))) {
      best_choice = choice;
      best_time = time[n];
      best_memory = memory[n];
      best_fits = fits;
    }
  };
  // Depth-first over operators in graph order; producers come first, so their layouts are set.
  std::vector<std::size_t> next(n + 1, 0);
  std::size_t i = 0;
  while (true) {
    if (i == n) {
      consider();
      if (n == 0) {
        break;
      }
      --i;
      continue;
    }
    const auto &options = tb.options(i);
    if (next[i] >= options.size()) {
      next[i] = 0;
      if (i == 0) {
        break;
      }
      --i;
      continue;
    }
    const std::size_t k = next[i]++;
    const StrategyOption &o = options[k];
    const Operator &op = g.op(i);
    double t = o.seconds();
    for (std::size_t j = 0; j < op.inputs.size(); ++j) {
      const TensorId x = op.inputs[j];
      const int from = tb.graph_input(x) ? 0 : layout[static_cast<std::size_t>(x)];
      t += tb.convert(x, from, static_cast<int>(o.inputs[j]));
    }
    if (tb.graph_output(op.output)) {
      t += tb.sink(op.output, static_cast<int>(o.output));
    }
    if (t == detail::infinity) {
      continue;
    }
    layout[static_cast<std::size_t>(op.output)] = static_cast<int>(o.output);
    choice[i] = static_cast<int>(k);
    time[i + 1] = time[i] + t;
    memory[i + 1] = memory[i] + o.memory.total();
    ++i;
  }
  if (best_choice.empty()) {
    throw ValueError("kat::plan::brute_force: no combination satisfies the layout constraints");
  }
  std::vector<std::string> names(n);
  for (std::size_t j = 0; j < n; ++j) {
    names[j] = tb.options(j)[static_cast<std::size_t>(best_choice[j])].name;
  }
  Plan plan = evaluate(g, names, cm, memory_budget);
  plan.search.method = "brute-force";
  plan.search.seconds = detail::seconds_since(t0);
  plan.search.combinations = combinations;
  plan.search.dp_step_seconds = best_time;
  return plan;
}

} // namespace kat::plan
