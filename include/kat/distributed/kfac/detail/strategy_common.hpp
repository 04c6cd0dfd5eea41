#pragma once
/// @file
/// @brief Internal: what the strategies that broadcast from owners (DP-KFAC, KAISA) share:
/// counting their broadcasts, the sizes of P and of the failure agreement, and giving the
/// KFAC back its local strategy.

#ifndef KAT_ENABLE_MPI
#error                                                                                             \
    "kat/distributed/kfac/detail/strategy_common.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/distributed/comm/communicator.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>

namespace kat::distributed::detail {

/// Runs `f()` and adds to `counter` the calls and bytes it added to `comm`'s broadcast counter
/// (CommunicatorStats::broadcast), so a strategy counts its own broadcasts apart from others
/// on the same communicator.
template <class F> void count_broadcasts(Communicator &comm, CollectiveCounter &counter, F &&f) {
  const CollectiveCounter before = comm.stats().broadcast;
  std::forward<F>(f)();
  const CollectiveCounter after = comm.stats().broadcast;
  counter.calls += after.calls - before.calls;
  counter.bytes += after.bytes - before.bytes;
}

/// Σ over the registered layers of d_A · d_G = (in+1) · out: the entries of every layer's
/// preconditioned gradient P, what one step broadcasts when every P is shared.
template <class KFACType> std::size_t gradient_entries(const KFACType &kfac) {
  std::size_t entries = 0;
  for (std::size_t i = 0; i < kfac.size(); ++i) {
    entries += kfac.factor_a(i).dim() * kfac.factor_g(i).dim();
  }
  return entries;
}

/// The failure agreement's all-reduce payload of one decomposition step
/// (agree_on_decompositions, no decomposition failed): 2L · sizeof(std::int32_t).
template <class KFACType> std::size_t agreement_bytes(const KFACType &kfac) {
  return 2 * kfac.size() * sizeof(std::int32_t);
}

/// Gives `kfac` back its local strategy if `strategy` is still the one set (a destructor's
/// step: KFAC::set_strategy(nullptr) makes every layer owned again).
template <class KFACType, class Strategy>
void release_strategy(KFACType &kfac, const Strategy *strategy) {
  if (&kfac.strategy() == strategy) {
    kfac.set_strategy(nullptr);
  }
}

} // namespace kat::distributed::detail

#endif // KAT_ENABLE_MPI
