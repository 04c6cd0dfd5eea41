#pragma once
/// @file
/// @brief kat::plan::fold: finds repeated blocks of a Graph by canonical hashing so that the
/// plan search handles each unique block once (TAP, Shi et al., arXiv 2302.00247, Sec. 4.1:
/// "graph pruning"; docs/tensor_parallel.md).

#include "kat/core/error.hpp"
#include "kat/plan/graph.hpp"

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kat::plan {

/// The operators [first, last) of a graph, contiguous in its (topological) order.
struct OpRange {
  std::size_t first = 0; ///< the first operator's index
  std::size_t last = 0;  ///< one past the last operator's index
  /// The number of operators, last - first.
  std::size_t size() const { return last - first; }
};

/// One occurrence of a block.
struct BlockInstance {
  std::string scope;      ///< the scope prefix that defines it, e.g. "blocks.3"
  OpRange ops;            ///< its operators in the graph
  std::size_t unique = 0; ///< index into Folding::unique
};

/// A class of identical blocks: same canonical form.
struct UniqueBlock {
  std::uint64_t hash = 0;             ///< 64-bit FNV-1a of `canonical`
  std::string canonical;              ///< canonical_form of its instances
  std::vector<std::size_t> instances; ///< indices into Folding::instances, in graph order
};

/// The result of fold().
struct Folding {
  int depth = 0;                        ///< scope depth of the blocks (0: no blocks)
  std::vector<BlockInstance> instances; ///< in graph order
  std::vector<UniqueBlock> unique;      ///< in order of first appearance
  std::vector<int> instance_of_op;      ///< per operator: its instance, or -1 (outside blocks)
  std::size_t loose_operators = 0;      ///< operators outside every block
};

/// 64-bit FNV-1a.
inline std::uint64_t fnv1a(const std::string &text) {
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char ch : text) {
    h = (h ^ ch) * 1099511628211ull;
  }
  return h;
}

/// Per tensor, the index of the last operator reading it (size_t(-1): none).
inline std::vector<std::size_t> last_uses(const Graph &g) {
  std::vector<std::size_t> last(g.tensors().size(), static_cast<std::size_t>(-1));
  for (std::size_t i = 0; i < g.operators().size(); ++i) {
    for (const auto t : g.op(i).inputs) {
      last[static_cast<std::size_t>(t)] = i;
    }
  }
  return last;
}

/// The canonical text of the subgraph formed by operators `ops`: per operator (in order) its
/// type, its attributes (sorted by name), its inputs, its output shape and batch flag and its
/// parameter shapes. Tensors produced inside are renumbered t0, t1, ... by production; tensors
/// from outside are ordered input ports p0, p1, ... by first use, each with its shape and
/// whether it is a graph input (which needs no gradient and is read in any layout for free,
/// so it prices the block differently); the output ports (tensors read after the range, or by
/// nobody: graph outputs) are listed in production order. Names and scopes are left out, so
/// two ranges have equal texts exactly when one maps onto the other operator by operator.
/// @throws ValueError if the range is empty or outside the graph
inline std::string canonical_form(const Graph &g, OpRange ops,
                                  const std::vector<std::size_t> &last_use) {
  if (ops.first >= ops.last || ops.last > g.operators().size()) {
    throw ValueError(kat::detail::concat("kat::plan::canonical_form: range [", ops.first, ", ",
                                         ops.last, ") is empty or outside the ",
                                         g.operators().size(), " operators"));
  }
  // Written straight into one string (this runs for every candidate block).
  std::string text, ports_text;
  text.reserve(96 * ops.size());
  const auto number = [](std::string &out, std::int64_t v) {
    char buffer[24];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, v).ptr;
    out.append(buffer, end);
  };
  const auto shape = [&](std::string &out, TensorId t) {
    out += '[';
    for (const auto e : g.tensor(t).shape) {
      number(out, e);
      out += ',';
    }
    out += ']';
  };
  std::vector<TensorId> ports;                            // by first use
  const auto internal = [&](TensorId t) -> std::int64_t { // production index, or -1
    const int p = g.tensor(t).producer;
    return p >= 0 && static_cast<std::size_t>(p) >= ops.first &&
                   static_cast<std::size_t>(p) < ops.last
               ? static_cast<std::int64_t>(static_cast<std::size_t>(p) - ops.first)
               : -1;
  };
  for (std::size_t i = ops.first; i < ops.last; ++i) {
    const Operator &op = g.op(i);
    text += op.type;
    text += " {";
    for (const auto &[key, value] : op.attributes) {
      text += key;
      text += '=';
      text += value.to_string();
      text += ';';
    }
    text += "} in(";
    for (const auto t : op.inputs) {
      const std::int64_t k = internal(t);
      if (k >= 0) {
        text += 't';
        number(text, k);
      } else {
        auto it = std::find(ports.begin(), ports.end(), t);
        if (it == ports.end()) {
          ports_text += "port p";
          number(ports_text, static_cast<std::int64_t>(ports.size()));
          ports_text += ' ';
          shape(ports_text, t);
          ports_text += g.tensor(t).producer < 0 ? " graph-input" : "";
          ports_text += g.tensor(t).batched ? " batched\n" : "\n";
          ports.push_back(t);
          it = ports.end() - 1;
        }
        text += 'p';
        number(text, static_cast<std::int64_t>(it - ports.begin()));
      }
      text += ',';
    }
    text += ") out";
    shape(text, op.output);
    text += g.tensor(op.output).batched ? "b params(" : " params(";
    for (const auto p : op.parameters) {
      shape(text, p);
      text += ',';
    }
    text += ")\n";
  }
  for (std::size_t i = ops.first; i < ops.last; ++i) {
    const std::size_t use = last_use[static_cast<std::size_t>(g.op(i).output)];
    if (use == static_cast<std::size_t>(-1) || use >= ops.last) {
      text += "output t";
      number(text, static_cast<std::int64_t>(i - ops.first));
      text += '\n';
    }
  }
  return ports_text + text;
}

/// canonical_form with the last uses computed here.
inline std::string canonical_form(const Graph &g, OpRange ops) {
  return canonical_form(g, ops, last_uses(g));
}

namespace detail {

// The first `depth` parts of a dotted scope, or "" if it has fewer.
inline std::string scope_prefix(const std::string &scope, int depth) {
  if (depth <= 0 || scope.empty()) {
    return "";
  }
  std::size_t end = 0;
  for (int d = 0; d < depth; ++d) {
    if (end == std::string::npos) {
      return "";
    }
    end = scope.find('.', d == 0 ? 0 : end + 1);
  }
  return scope.substr(0, end);
}

inline int scope_depth(const std::string &scope) {
  return scope.empty() ? 0 : 1 + static_cast<int>(std::count(scope.begin(), scope.end(), '.'));
}

// A candidate block: a maximal run of consecutive operators sharing a scope prefix of the
// depth, and a cheap signature (operator count, types, output shapes) that equal canonical
// forms share. A prefix that occurs in two separate runs gives no candidate.
struct Candidate {
  std::string prefix;
  OpRange ops;
  std::uint64_t signature = 0;
};

inline std::vector<Candidate> candidates_at(const Graph &g, int depth) {
  const std::size_t n = g.operators().size();
  std::vector<Candidate> runs;
  std::map<std::string, int> runs_of_prefix;
  for (std::size_t i = 0; i < n;) {
    const std::string prefix = scope_prefix(g.op(i).scope, depth);
    std::size_t j = i + 1;
    while (j < n && scope_prefix(g.op(j).scope, depth) == prefix) {
      ++j;
    }
    if (!prefix.empty()) {
      std::uint64_t h = 14695981039346656037ull;
      const auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
      mix(j - i);
      for (std::size_t k = i; k < j; ++k) {
        for (const unsigned char ch : g.op(k).type) {
          mix(ch);
        }
        for (const auto e : g.tensor(g.op(k).output).shape) {
          mix(static_cast<std::uint64_t>(e));
        }
      }
      runs.push_back({prefix, {i, j}, h});
      ++runs_of_prefix[prefix];
    }
    i = j;
  }
  std::vector<Candidate> candidates;
  for (auto &c : runs) {
    if (runs_of_prefix[c.prefix] == 1) {
      candidates.push_back(std::move(c));
    }
  }
  return candidates;
}

// Canonical forms, computed once per operator range.
class CanonicalCache {
public:
  CanonicalCache(const Graph &g, const std::vector<std::size_t> &last_use)
      : g_(g), last_use_(last_use) {}
  const std::string &operator()(OpRange r) {
    auto it = texts_.find({r.first, r.last});
    if (it == texts_.end()) {
      it = texts_.emplace(std::make_pair(r.first, r.last), canonical_form(g_, r, last_use_)).first;
    }
    return it->second;
  }

private:
  const Graph &g_;
  const std::vector<std::size_t> &last_use_;
  std::map<std::pair<std::size_t, std::size_t>, std::string> texts_;
};

// Operators covered by candidates whose canonical form occurs at least twice; canonical forms
// are computed only for candidates whose signature occurs at least twice.
inline std::size_t covered(const std::vector<Candidate> &candidates, CanonicalCache &canonical) {
  std::map<std::uint64_t, int> signatures;
  for (const auto &c : candidates) {
    ++signatures[c.signature];
  }
  std::map<std::string, std::pair<int, std::size_t>> texts; // count, operators
  for (const auto &c : candidates) {
    if (signatures[c.signature] >= 2) {
      auto &t = texts[canonical(c.ops)];
      ++t.first;
      t.second += c.ops.size();
    }
  }
  std::size_t n = 0;
  for (const auto &[text, t] : texts) {
    n += t.first >= 2 ? t.second : 0;
  }
  return n;
}

// The folding at one depth: candidates grouped by canonical form.
inline Folding fold_at(const Graph &g, int depth, const std::vector<Candidate> &candidates,
                       CanonicalCache &canonical) {
  Folding f;
  f.depth = depth;
  f.instance_of_op.assign(g.operators().size(), -1);
  std::map<std::string, std::size_t> unique_of_text;
  for (const auto &c : candidates) {
    const std::string &text = canonical(c.ops);
    auto it = unique_of_text.find(text);
    if (it == unique_of_text.end()) {
      it = unique_of_text.emplace(text, f.unique.size()).first;
      UniqueBlock u;
      u.hash = fnv1a(text);
      u.canonical = text;
      f.unique.push_back(std::move(u));
    }
    BlockInstance b;
    b.scope = c.prefix;
    b.ops = c.ops;
    b.unique = it->second;
    f.unique[b.unique].instances.push_back(f.instances.size());
    for (std::size_t i = c.ops.first; i < c.ops.last; ++i) {
      f.instance_of_op[i] = static_cast<int>(f.instances.size());
    }
    f.instances.push_back(std::move(b));
  }
  f.loose_operators =
      static_cast<std::size_t>(std::count(f.instance_of_op.begin(), f.instance_of_op.end(), -1));
  return f;
}

} // namespace detail

/// Finds the repeated blocks of `g`. Candidate blocks are the operators of each scope at
/// `depth` (the first `depth` parts of the scope path: depth 2 takes "blocks.3" from
/// "blocks.3" and "blocks.3.mlp"), each a contiguous run of operators. With depth 0 the depth
/// is chosen: the one whose candidates that occur at least twice cover the most operators;
/// among equals the smallest depth (the largest blocks); when nothing repeats, the smallest
/// depth that has a candidate. Operators outside candidates stay loose (searched one by one).
/// @throws ValueError if depth < 0
inline Folding fold(const Graph &g, int depth = 0) {
  if (depth < 0) {
    throw ValueError(
        kat::detail::concat("kat::plan::fold: depth must be >= 0 (0: automatic), got ", depth));
  }
  const auto last_use = last_uses(g);
  detail::CanonicalCache canonical(g, last_use);
  if (depth > 0) {
    return detail::fold_at(g, depth, detail::candidates_at(g, depth), canonical);
  }
  int max_depth = 0;
  for (const auto &op : g.operators()) {
    max_depth = std::max(max_depth, detail::scope_depth(op.scope));
  }
  int best = 0;
  std::size_t best_covered = 0;
  for (int d = 1; d <= max_depth; ++d) {
    const auto candidates = detail::candidates_at(g, d);
    if (candidates.empty()) {
      continue;
    }
    const std::size_t c = detail::covered(candidates, canonical);
    if (best == 0 || c > best_covered) {
      best = d;
      best_covered = c;
    }
  }
  if (best == 0) {
    Folding none;
    none.instance_of_op.assign(g.operators().size(), -1);
    none.loose_operators = g.operators().size();
    return none;
  }
  return detail::fold_at(g, best, detail::candidates_at(g, best), canonical);
}

} // namespace kat::plan
