#pragma once
/// @file
/// @brief kat::distributed::thread_budget: how many threads each MPI rank may start (Kokkos's
/// OpenMP pool, the BLAS's pool) so that the ranks of a node do not oversubscribe its cores. Needs
/// KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/comm/thread_budget.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/distributed/comm/communicator.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

/// OpenBLAS's run-time thread count; null when the BLAS in use is not OpenBLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
/// The OpenMP runtime's thread count for parallel regions the calling thread starts (oneDNN's
/// GEMMs and convolutions in every host build, Kokkos's OpenMP backend). A program compiled
/// without OpenMP may still load the runtime (oneDNN does): then the weak symbol finds it, and
/// is null when nothing loaded it.
#if defined(_OPENMP)
#include <omp.h>
#else
extern "C" void omp_set_num_threads(int) noexcept __attribute__((weak));
#endif

namespace kat::distributed {

/// The thread count one rank should use, and what it was derived from.
struct ThreadBudget {
  /// Logical CPUs of the node (std::thread::hardware_concurrency(), at least 1).
  int node_cpus = 1;
  /// CPUs this process may run on (its affinity mask; node_cpus where that is unknown).
  int affinity_cpus = 1;
  /// Ranks of the communicator on this node (Communicator::split_shared()).
  int local_ranks = 1;
  /// The threads this rank should use: see threads_per_rank().
  int threads = 1;
};

/// The rule of thread_budget(): a rank bound by the launcher to a subset of the node's CPUs
/// (affinity_cpus < node_cpus) uses that subset, one thread per CPU; an unbound rank takes an
/// equal share of the node, ⌊node_cpus / local_ranks⌋. Never less than 1: with more ranks than
/// CPUs every rank gets one thread (the ranks then share cores, and nothing can prevent it).
/// @throws ValueError if any argument is < 1.
inline int threads_per_rank(int node_cpus, int affinity_cpus, int local_ranks) {
  if (node_cpus < 1 || affinity_cpus < 1 || local_ranks < 1) {
    throw ValueError(kat::detail::concat("kat::distributed::threads_per_rank: node_cpus, "
                                         "affinity_cpus and local_ranks must be >= 1, got ",
                                         node_cpus, ", ", affinity_cpus, " and ", local_ranks));
  }
  if (affinity_cpus < node_cpus) {
    return affinity_cpus;
  }
  return std::max(1, node_cpus / local_ranks);
}

namespace detail {
/// CPUs in this process's affinity mask (Linux), else `fallback`.
inline int affinity_cpu_count(int fallback) {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) {
      return n;
    }
  }
#endif
  return fallback;
}
} // namespace detail

/// How many threads this rank should give Kokkos (OpenMP backend) and the BLAS, so that the
/// ranks sharing a node use its CPUs without oversubscribing them: threads_per_rank() of this
/// node's CPUs, this process's affinity and the number of ranks of `comm` on the node.
/// Collective over `comm` (one MPI_Comm_split_type). Call it before Kokkos is initialized to
/// choose Kokkos's thread count; it does not need Kokkos.
/// @throws MPIError if the split fails.
inline ThreadBudget thread_budget(const Communicator &comm) {
  ThreadBudget b;
  b.node_cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  b.affinity_cpus = std::min(b.node_cpus, detail::affinity_cpu_count(b.node_cpus));
  b.local_ranks = std::max(1, comm.split_shared().size());
  b.threads = threads_per_rank(b.node_cpus, b.affinity_cpus, b.local_ranks);
  return b;
}

/// Applies thread_budget() to this process before Kokkos is initialized, unless the user
/// chose a thread count (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, KOKKOS_NUM_THREADS, or a
/// --kokkos-threads / --kokkos-num-threads / --threads flag in argv): sets KOKKOS_NUM_THREADS
/// (read by Kokkos::initialize, 3.x and 4.x), OpenBLAS's thread count and the OpenMP runtime's
/// (which oneDNN's host kernels use). On one rank it does nothing. Collective over `comm`.
/// @returns a line that says what was chosen and why (empty on one rank), for logs.
/// @throws MPIError if the node split fails.
inline std::string apply_thread_budget(int argc, char **argv, const Communicator &comm) {
  if (comm.size() < 2) {
    return {};
  }
  const ThreadBudget b = thread_budget(comm); // collective: every rank
  const char *chosen = nullptr;
  for (const char *var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "KOKKOS_NUM_THREADS"}) {
    if (chosen == nullptr && std::getenv(var) != nullptr) {
      chosen = var;
    }
  }
  for (int i = 1; chosen == nullptr && i < argc; ++i) {
    const std::string arg = argv[i];
    for (const char *flag : {"--kokkos-threads", "--kokkos-num-threads", "--threads"}) {
      if (arg.rfind(flag, 0) == 0) {
        chosen = flag;
      }
    }
  }
  if (chosen != nullptr) {
    return kat::detail::concat("threads per rank: as set by ", chosen, " (", b.local_ranks,
                               " ranks on this node, ", b.node_cpus, " CPUs)");
  }
  const std::string t = std::to_string(b.threads);
  setenv("KOKKOS_NUM_THREADS", t.c_str(), 1);
  if (openblas_set_num_threads != nullptr) {
    openblas_set_num_threads(b.threads);
  }
#if defined(_OPENMP)
  omp_set_num_threads(b.threads);
#else
  if (omp_set_num_threads != nullptr) {
    omp_set_num_threads(b.threads);
  }
#endif
  return kat::detail::concat("threads per rank: ", b.threads, " (", b.local_ranks,
                             " ranks on this node, ", b.node_cpus, " CPUs, ", b.affinity_cpus,
                             " usable by this rank; set OMP_NUM_THREADS to choose)");
}

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
