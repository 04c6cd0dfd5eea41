#pragma once
/// @file
/// @brief Counts Kokkos allocations and peak memory through the Kokkos Tools interface.

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdint>

namespace kat {

/// While an AllocationTracker exists, every Kokkos View allocation and deallocation, in every
/// memory space, is counted through the Kokkos Tools allocate/deallocate callbacks. It is
/// the hook for "no allocation in the steady-state training step" and for peak-memory
/// figures. Callbacks of a tool that is already loaded (KOKKOS_TOOLS_LIBS) keep receiving
/// every event, and they are restored when the tracker is destroyed.
///
/// Byte counts cover memory allocated while the tracker is active; freeing older memory
/// lowers live_bytes() below zero by that amount. Only one tracker may exist at a time.
///
/// @code
/// kat::AllocationTracker tracker;   // after Kokkos::initialize
/// train_one_step();
/// tracker.reset();
/// train_one_step();
/// assert(tracker.allocations() == 0);
/// @endcode
class AllocationTracker {
public:
  /// @throws Error if Kokkos is not initialized or another tracker is active.
  AllocationTracker() {
    if (!Kokkos::is_initialized()) {
      throw Error("kat::AllocationTracker: Kokkos must be initialized first");
    }
    if (state().active.exchange(true)) {
      throw Error("kat::AllocationTracker: another tracker is already active");
    }
    previous_ = Kokkos::Tools::Experimental::get_callbacks();
    state().previous_allocate = previous_.allocate_data;
    state().previous_deallocate = previous_.deallocate_data;
    reset_counts(0);
    Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_deallocate);
  }

  ~AllocationTracker() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(previous_.allocate_data);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(previous_.deallocate_data);
    state().active = false;
  }

  AllocationTracker(const AllocationTracker &) = delete;
  AllocationTracker &operator=(const AllocationTracker &) = delete;

  /// Number of allocations since construction or the last reset().
  std::uint64_t allocations() const { return state().allocations; }
  /// Number of deallocations since construction or the last reset().
  std::uint64_t deallocations() const { return state().deallocations; }
  /// Bytes allocated and not yet freed since construction.
  std::int64_t live_bytes() const { return state().live; }
  /// Largest live_bytes() since construction or the last reset().
  std::int64_t peak_bytes() const { return state().peak; }

  /// Zeroes the counters and sets the peak to the current live bytes.
  void reset() { reset_counts(state().live); }

private:
  struct State {
    std::atomic<bool> active{false};
    std::atomic<std::uint64_t> allocations{0}, deallocations{0};
    std::atomic<std::int64_t> live{0}, peak{0};
    Kokkos::Tools::allocateDataFunction previous_allocate = nullptr;
    Kokkos::Tools::deallocateDataFunction previous_deallocate = nullptr;
  };
  static State &state() {
    static State s;
    return s;
  }
  static void reset_counts(std::int64_t live) {
    state().allocations = 0;
    state().deallocations = 0;
    state().live = live;
    state().peak = live;
  }
  static void on_allocate(const Kokkos::Tools::SpaceHandle handle, const char *label,
                          const void *ptr, const std::uint64_t size) {
    State &s = state();
    ++s.allocations;
    const std::int64_t live = s.live += static_cast<std::int64_t>(size);
    std::int64_t peak = s.peak;
    while (live > peak && !s.peak.compare_exchange_weak(peak, live)) {
    }
    if (s.previous_allocate) {
      s.previous_allocate(handle, label, ptr, size);
    }
  }
  static void on_deallocate(const Kokkos::Tools::SpaceHandle handle, const char *label,
                            const void *ptr, const std::uint64_t size) {
    State &s = state();
    ++s.deallocations;
    s.live -= static_cast<std::int64_t>(size);
    if (s.previous_deallocate) {
      s.previous_deallocate(handle, label, ptr, size);
    }
  }

  Kokkos::Tools::Experimental::EventSet previous_;
};

} // namespace kat
