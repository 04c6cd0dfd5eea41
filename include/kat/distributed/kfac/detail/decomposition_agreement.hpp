#pragma once
/// @file
/// @brief Internal: the agreement on K-FAC decomposition failures of the distributed
/// strategies that decompose each factor on one rank (KAISA, DP-KFAC).

#ifndef KAT_ENABLE_MPI
#error                                                                                             \
    "kat/distributed/kfac/detail/decomposition_agreement.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/profiling.hpp"
#include "kat/distributed/comm/communicator.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kat::distributed::detail {

/// Host memory a collective reads or writes in place.
template <class T> using HostView = Kokkos::View<T *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

/// KFAC::DecompositionAgreement over `comm` (every rank calls it on the same steps):
/// `failures.failed` and `failures.held` become their element-wise maxima over the ranks (one
/// all-reduce of 2L int32 carries both, per factor failed·2 + held: a rank whose decomposition
/// failed but kept the previous one says both); if a factor failed somewhere, the rank that
/// decomposed the first failed one
/// (`owner(layer, 'A' or 'G')`) broadcasts its message, which becomes `failures.message` on
/// every rank with " (decomposed on rank R)" appended (two broadcasts, on the failure path
/// only). The collectives are added to `counter` (calls and bytes as CommunicatorStats counts
/// them).
template <class Failures, class Owner>
void agree_on_decompositions(Communicator &comm, Failures &failures, const Owner &owner,
                             CollectiveCounter &counter) {
  ScopedRegion region("kat::distributed::agree_on_decompositions");
  const CollectiveCounter allreduce = comm.stats().allreduce, broadcast = comm.stats().broadcast;
  using Host = Kokkos::DefaultHostExecutionSpace;
  const std::size_t n = failures.failed.size();
  failures.held.resize(n, 0);
  // The maximum of failed·2 + held: a failure anywhere is a failure everywhere, and where one
  // failed, the factor counts as held if a rank whose decomposition failed kept a previous one.
  std::vector<std::int32_t> outcome(n);
  for (std::size_t k = 0; k < n; ++k) {
    outcome[k] = (failures.failed[k] != 0 ? 2 : 0) + (failures.held[k] != 0 ? 1 : 0);
  }
  comm.allreduce(Host(), HostView<std::int32_t>(outcome.data(), n), ReduceOp::max);
  for (std::size_t k = 0; k < n; ++k) {
    failures.failed[k] = outcome[k] >= 2 ? 1 : 0;
    failures.held[k] = outcome[k] % 2;
  }
  std::size_t first = failures.failed.size();
  for (std::size_t k = 0; k < failures.failed.size() && first == failures.failed.size(); ++k) {
    if (failures.failed[k] != 0) {
      first = k;
    }
  }
  if (first < failures.failed.size()) {
    const int root = owner(first / 2, first % 2 == 0 ? 'A' : 'G');
    // MPI's datatypes in Communicator are numeric: the text travels one int32 per character.
    std::int64_t length =
        comm.rank() == root ? static_cast<std::int64_t>(failures.message.size()) : 0;
    comm.broadcast(Host(), HostView<std::int64_t>(&length, 1), root);
    std::basic_string<std::int32_t> text(static_cast<std::size_t>(length), 0);
    if (comm.rank() == root) {
      for (std::size_t i = 0; i < text.size(); ++i) {
        text[i] = static_cast<unsigned char>(failures.message[i]);
      }
    }
    comm.broadcast(Host(), HostView<std::int32_t>(&text[0], text.size()), root);
    failures.message.assign(text.size(), ' ');
    for (std::size_t i = 0; i < text.size(); ++i) {
      failures.message[i] = static_cast<char>(text[i]);
    }
    failures.message += kat::detail::concat(" (decomposed on rank ", root, ")");
  }
  counter.calls += (comm.stats().allreduce.calls - allreduce.calls) +
                   (comm.stats().broadcast.calls - broadcast.calls);
  counter.bytes += (comm.stats().allreduce.bytes - allreduce.bytes) +
                   (comm.stats().broadcast.bytes - broadcast.bytes);
}

} // namespace kat::distributed::detail

#endif // KAT_ENABLE_MPI
