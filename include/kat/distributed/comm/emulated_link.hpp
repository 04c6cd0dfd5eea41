#pragma once
/// @file
/// @brief kat::distributed::EmulatedLink: the emulated inter-node network link of a
/// Communicator (CommunicatorOptions::internode_link). Needs no MPI.

#include <cstddef>

namespace kat::distributed {

/// An emulated network link between nodes, for measuring hierarchical schemes (DASO, KAISA,
/// DP-KFAC, DHO2 on split nodes) on one machine as if their nodes were joined by a slower
/// network. This is emulation, not a network simulator: every operation of a Communicator whose
/// ranks lie on more than one emulated node (a point-to-point message: whose peer lies on
/// another node) completes no earlier than
///
///     latency_seconds + bytes / bandwidth_bytes_per_second
///
/// after it was started, `bytes` being the payload this rank hands to MPI for it (the
/// CommunicatorStats byte of the call). A blocking operation returns no earlier; a non-blocking
/// one's Request::test() reports it incomplete until then and Request::wait() sleeps until
/// then, so computation that runs meanwhile hides the link time as it would hide a real
/// transfer. The model is one message over one link per operation: for a ring all-reduce over
/// two nodes (the DASO benchmark's case) that is the bytes each node sends, 2(N-1)/N x the
/// payload with N = 2; over more nodes it understates the volume. Contention between
/// operations is not modelled. The time the operation takes on the real transport (shared
/// memory) comes on top when it is longer.
struct EmulatedLink {
  /// α in seconds, >= 0.
  double latency_seconds = 0;
  /// β in bytes per second, >= 0; 0: unlimited (the latency alone).
  double bandwidth_bytes_per_second = 0;

  /// Whether any delay is added.
  bool active() const noexcept { return latency_seconds > 0 || bandwidth_bytes_per_second > 0; }
  /// α + bytes / β (β = 0: α).
  double seconds(std::size_t bytes) const noexcept {
    return latency_seconds +
           (bandwidth_bytes_per_second > 0 ? double(bytes) / bandwidth_bytes_per_second : 0.0);
  }
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat
