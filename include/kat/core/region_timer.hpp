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
/// name, nested regions included in their parents. It answers "where does a training step
/// go" without an external tool. The callbacks of a tool that is already loaded keep
/// receiving every event, and they are restored when the timer is destroyed.
///
/// Times are host wall-clock: on an asynchronous backend (CUDA, HIP) a region measures
/// launches unless its work is fenced inside it. Regions must be pushed and popped from one
/// host thread. Only one RegionTimer may exist at a time.
class RegionTimer {
public:
  using clock = std::chrono::steady_clock;

  /// Total seconds and number of calls of one region.
  struct Entry {
    std::string name;
    double seconds = 0;
    std::size_t calls = 0;
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
      out.push_back({kv.first, kv.second.first, kv.second.second});
    std::sort(out.begin(), out.end(),
              [](const Entry &a, const Entry &b) { return a.seconds > b.seconds; });
    return out;
  }

  /// Total seconds of `name` (0 if never seen).
  double seconds(const std::string &name) const {
    const auto it = state().totals.find(name);
    return it == state().totals.end() ? 0.0 : it->second.first;
  }

  /// Forgets the totals (open regions keep timing).
  void reset() { state().totals.clear(); }

private:
  struct State {
    std::atomic<bool> active{false};
    std::vector<std::pair<std::string, clock::time_point>> stack;
    std::map<std::string, std::pair<double, std::size_t>> totals;
    Kokkos::Tools::pushFunction previous_push = nullptr;
    Kokkos::Tools::popFunction previous_pop = nullptr;
  };
  static State &state() {
    static State s;
    return s;
  }
  static void on_push(const char *name) {
    state().stack.emplace_back(name, clock::now());
    if (state().previous_push) {
      state().previous_push(name);
    }
  }
  static void on_pop() {
    State &s = state();
    if (!s.stack.empty()) {
      auto &total = s.totals[s.stack.back().first];
      total.first += std::chrono::duration<double>(clock::now() - s.stack.back().second).count();
      ++total.second;
      s.stack.pop_back();
    }
    if (s.previous_pop) {
      s.previous_pop();
    }
  }

  Kokkos::Tools::Experimental::EventSet previous_;
};

} // namespace kat
