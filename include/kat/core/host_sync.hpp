#pragma once
/// @file
/// @brief Host synchronization: KAT's counted fence, and a tracker that counts the deep
/// copies, fences and reductions a piece of code issues (through the Kokkos Tools callbacks).

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdint>

namespace kat {

namespace detail {

/// Number of host fences KAT issued through detail::fence() since the program started.
inline std::atomic<std::uint64_t> &kat_fence_count() {
  static std::atomic<std::uint64_t> count{0};
  return count;
}

/// Blocks the host until the work enqueued on `space` has finished. Every fence KAT's own
/// code issues goes through here, so HostSyncTracker counts it whatever the Kokkos version
/// (Kokkos 3.4 reports no fences to Kokkos Tools).
template <class ExecSpace> void fence(const ExecSpace &space) {
  ++kat_fence_count();
  space.fence();
}

} // namespace detail

/// While a HostSyncTracker exists, it counts what makes the host wait for the device or move
/// data between them, so a test can pin what one training step costs in synchronization:
///
/// - deep_copies(): every `Kokkos::deep_copy` (view to view, value to view, view to value),
///   through the Kokkos Tools deep-copy callback;
/// - reductions(): every `Kokkos::parallel_reduce` (one into a host scalar blocks the host;
///   KAT's per-step code reduces into device views), through the parallel-reduce callback;
/// - kat_fences(): the fences KAT's own code issued (detail::fence());
/// - tool_fences(): the fences Kokkos reports to Kokkos Tools (Kokkos 3.5 and later; none
///   with Kokkos 3.4), KAT's included.
///
/// Callbacks of a tool already loaded (KOKKOS_TOOLS_LIBS) keep receiving every event, and are
/// restored when the tracker is destroyed. Only one tracker may exist at a time.
///
/// @code
/// kat::HostSyncTracker syncs;      // after Kokkos::initialize
/// train_one_step();
/// std::printf("%llu deep copies\n", (unsigned long long)syncs.deep_copies());
/// @endcode
class HostSyncTracker {
public:
  /// @throws Error if Kokkos is not initialized or another tracker is active.
  HostSyncTracker() {
    if (!Kokkos::is_initialized()) {
      throw Error("kat::HostSyncTracker: Kokkos must be initialized first");
    }
    if (state().active.exchange(true)) {
      throw Error("kat::HostSyncTracker: another tracker is already active");
    }
    previous_ = Kokkos::Tools::Experimental::get_callbacks();
    state().previous_deep_copy = previous_.begin_deep_copy;
    state().previous_fence = previous_.begin_fence;
    state().previous_reduce = previous_.begin_parallel_reduce;
    reset();
    Kokkos::Tools::Experimental::set_begin_deep_copy_callback(&on_deep_copy);
    Kokkos::Tools::Experimental::set_begin_fence_callback(&on_fence);
    Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(&on_reduce);
  }

  ~HostSyncTracker() {
    Kokkos::Tools::Experimental::set_begin_deep_copy_callback(previous_.begin_deep_copy);
    Kokkos::Tools::Experimental::set_begin_fence_callback(previous_.begin_fence);
    Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(
        previous_.begin_parallel_reduce);
    state().active = false;
  }

  HostSyncTracker(const HostSyncTracker &) = delete;
  HostSyncTracker &operator=(const HostSyncTracker &) = delete;

  /// Kokkos::deep_copy calls since construction or the last reset().
  std::uint64_t deep_copies() const { return state().deep_copies; }
  /// Kokkos::parallel_reduce launches since construction or the last reset().
  std::uint64_t reductions() const { return state().reductions; }
  /// Fences issued by KAT (detail::fence()) since construction or the last reset().
  std::uint64_t kat_fences() const { return detail::kat_fence_count() - kat_fence_base_; }
  /// Fences reported to Kokkos Tools since construction or the last reset() (0 with Kokkos
  /// 3.4, which reports none).
  std::uint64_t tool_fences() const { return state().fences; }

  /// Zeroes the counters.
  void reset() {
    state().deep_copies = 0;
    state().reductions = 0;
    state().fences = 0;
    kat_fence_base_ = detail::kat_fence_count();
  }

private:
  struct State {
    std::atomic<bool> active{false};
    std::atomic<std::uint64_t> deep_copies{0}, reductions{0}, fences{0};
    Kokkos::Tools::beginDeepCopyFunction previous_deep_copy = nullptr;
    Kokkos::Tools::beginFenceFunction previous_fence = nullptr;
    Kokkos::Tools::beginFunction previous_reduce = nullptr;
  };
  static State &state() {
    static State s;
    return s;
  }
  static void on_deep_copy(Kokkos::Tools::SpaceHandle dst_handle, const char *dst_name,
                           const void *dst_ptr, Kokkos::Tools::SpaceHandle src_handle,
                           const char *src_name, const void *src_ptr, std::uint64_t size) {
    ++state().deep_copies;
    if (state().previous_deep_copy) {
      state().previous_deep_copy(dst_handle, dst_name, dst_ptr, src_handle, src_name, src_ptr,
                                 size);
    }
  }
  static void on_fence(const char *name, std::uint32_t device, std::uint64_t *handle) {
    ++state().fences;
    if (state().previous_fence) {
      state().previous_fence(name, device, handle);
    }
  }
  static void on_reduce(const char *name, std::uint32_t device, std::uint64_t *handle) {
    ++state().reductions;
    if (state().previous_reduce) {
      state().previous_reduce(name, device, handle);
    }
  }

  Kokkos::Tools::Experimental::EventSet previous_;
  std::uint64_t kat_fence_base_ = 0;
};

} // namespace kat
