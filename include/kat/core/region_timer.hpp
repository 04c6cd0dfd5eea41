#pragma once
/// @file
/// @brief Wall time per Kokkos profiling region, through the Kokkos Tools interface.

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kat {

/// While a RegionTimer exists, the time between every Kokkos::Profiling::pushRegion and its
/// popRegion (KAT's ScopedRegion, and Kokkos Kernels' own regions) is added up per region
/// name, nested regions included in their parents (`seconds`), and also without them
/// (`self_seconds`: the region's exclusive time). paths() gives the same per call path
/// (region names from the outermost open region down), so the time of a region nested under
/// one parent can be told from the same region's time under another. It answers "where does
/// a training step go" without an external tool. The callbacks of a tool that is already loaded
/// keep receiving every event, and they are restored when the timer is destroyed.
///
/// Times are host wall-clock: on an asynchronous backend (CUDA, HIP) a region measures
/// launches unless its work is fenced inside it. Regions must be pushed and popped from one
/// host thread. Only one RegionTimer may exist at a time.
class RegionTimer {
public:
  using clock = std::chrono::steady_clock; ///< the host wall clock regions are timed with

  /// Total seconds and number of calls of one region.
  struct Entry {
    std::string name;        ///< the region's name
    double seconds = 0;      ///< inclusive: nested regions count in their parents
    std::size_t calls = 0;   ///< times the region was entered
    double self_seconds = 0; ///< exclusive: seconds minus the time in directly nested regions
  };

  /// The totals of one call path: `path` is the stack of region names, outermost first, the
  /// region itself last. A region pushed while the timer was not active does not appear.
  struct PathEntry {
    std::vector<std::string> path; ///< region names, outermost first
    double seconds = 0;            ///< inclusive
    double self_seconds = 0;       ///< exclusive
    std::size_t calls = 0;         ///< times the path was entered
  };

  /// @throws Error if Kokkos is not initialized or another timer is active.
  RegionTimer() {
    if (!Kokkos::is_initialized()) {
      throw Error("kat::RegionTimer: Kokkos must be initialized first");
    }
    if (state().active.exchange(true)) {
      throw Error("kat::RegionTimer: another timer is already active");
    }
    previous_ = Kokkos::Tools::Experimental::get_callbacks();
    state().previous_push = previous_.push_region;
    state().previous_pop = previous_.pop_region;
    state().stack.clear();
    state().totals.clear();
    state().nodes.assign(1, Node{});
    Kokkos::Tools::Experimental::set_push_region_callback(&on_push);
    Kokkos::Tools::Experimental::set_pop_region_callback(&on_pop);
  }

  ~RegionTimer() {
    Kokkos::Tools::Experimental::set_push_region_callback(previous_.push_region);
    Kokkos::Tools::Experimental::set_pop_region_callback(previous_.pop_region);
    state().active = false;
  }

  RegionTimer(const RegionTimer &) = delete;
  RegionTimer &operator=(const RegionTimer &) = delete;

  /// Every region seen so far, longest total first.
  std::vector<Entry> entries() const {
    std::vector<Entry> out;
    for (const auto &kv : state().totals)
      out.push_back({kv.first, kv.second.seconds, kv.second.calls, kv.second.self_seconds});
    std::sort(out.begin(), out.end(),
              [](const Entry &a, const Entry &b) { return a.seconds > b.seconds; });
    return out;
  }

  /// Total seconds of `name` (0 if never seen).
  double seconds(const std::string &name) const {
    const auto it = state().totals.find(name);
    return it == state().totals.end() ? 0.0 : it->second.seconds;
  }

  /// Total exclusive seconds of `name`: without the time in regions nested in it (0 if never
  /// seen).
  double self_seconds(const std::string &name) const {
    const auto it = state().totals.find(name);
    return it == state().totals.end() ? 0.0 : it->second.self_seconds;
  }

  /// Every call path with at least one completed call, depth first (a parent before its
  /// children, siblings by name). Over all paths at and below a path P, the self_seconds add
  /// up to P's seconds (up to the clock's resolution).
  std::vector<PathEntry> paths() const {
    std::vector<PathEntry> out;
    std::vector<std::string> path;
    collect(0, path, out);
    return out;
  }

  /// Forgets the totals (open regions keep timing).
  void reset() {
    state().totals.clear();
    for (auto &node : state().nodes)
      node.totals = Totals{};
  }

private:
  struct Totals {
    double seconds = 0, self_seconds = 0;
    std::size_t calls = 0;
  };
  // One node per call path (node 0: the empty path above the outermost regions); kept
  // across reset() so that open frames stay valid.
  struct Node {
    std::string name;
    std::map<std::string, std::size_t> children;
    Totals totals;
  };
  struct Frame {
    std::size_t node;
    clock::time_point start;
    double nested = 0; // seconds of the regions popped directly inside this one
  };
  struct State {
    std::atomic<bool> active{false};
    std::vector<Frame> stack;
    std::vector<Node> nodes;
    std::map<std::string, Totals> totals;
    Kokkos::Tools::pushFunction previous_push = nullptr;
    Kokkos::Tools::popFunction previous_pop = nullptr;
  };
  static State &state() {
    static State s;
    return s;
  }
  static void collect(std::size_t index, std::vector<std::string> &path,
                      std::vector<PathEntry> &out) {
    for (const auto &child : state().nodes[index].children) {
      const Node &node = state().nodes[child.second];
      path.push_back(node.name);
      if (node.totals.calls > 0) {
        out.push_back({path, node.totals.seconds, node.totals.self_seconds, node.totals.calls});
      }
      collect(child.second, path, out);
      path.pop_back();
    }
  }
  static void on_push(const char *name) {
    State &s = state();
    const std::size_t parent = s.stack.empty() ? 0 : s.stack.back().node;
    const auto it = s.nodes[parent].children.find(name);
    std::size_t node = 0;
    if (it != s.nodes[parent].children.end()) {
      node = it->second;
    } else {
      node = s.nodes.size();
      s.nodes[parent].children.emplace(name, node);
      s.nodes.push_back(Node{name, {}, {}});
    }
    s.stack.push_back({node, clock::now(), 0.0});
    if (s.previous_push) {
      s.previous_push(name);
    }
  }
  static void on_pop() {
    State &s = state();
    if (!s.stack.empty()) {
      const Frame frame = s.stack.back();
      s.stack.pop_back();
      const double seconds = std::chrono::duration<double>(clock::now() - frame.start).count();
      Node &node = s.nodes[frame.node];
      for (Totals *t : {&node.totals, &s.totals[node.name]}) {
        t->seconds += seconds;
        t->self_seconds += seconds - frame.nested;
        ++t->calls;
      }
      if (!s.stack.empty()) {
        s.stack.back().nested += seconds;
      }
    }
    if (s.previous_pop) {
      s.previous_pop();
    }
  }

  Kokkos::Tools::Experimental::EventSet previous_;
};

} // namespace kat
