// kat::distributed::thread_budget: the rule on exact cases, and the collective on the ranks ctest
// starts (all on one node). Compiles to nothing without KAT_ENABLE_MPI.
#ifdef KAT_ENABLE_MPI

#include <kat/distributed/comm/thread_budget.hpp>

#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <thread>

namespace test_thread_budget {

using kat::distributed::Communicator;
using kat::distributed::threads_per_rank;

TEST_CASE("thread_budget: unbound ranks share the node and bound ranks use their CPUs",
          "[dist][threads]") {
  // Unbound (affinity = the whole node): floor(cpus / ranks), at least 1.
  CHECK(threads_per_rank(2, 2, 1) == 2);
  CHECK(threads_per_rank(2, 2, 2) == 1);
  CHECK(threads_per_rank(2, 2, 4) == 1); // more ranks than cores: one each
  CHECK(threads_per_rank(64, 64, 4) == 16);
  CHECK(threads_per_rank(64, 64, 6) == 10);
  // Bound by the launcher (e.g. srun --cpus-per-task=8, mpirun --map-by slot:PE=8).
  CHECK(threads_per_rank(64, 8, 4) == 8);
  CHECK(threads_per_rank(64, 1, 64) == 1);
  // Invalid arguments name themselves.
  CHECK_THROWS_AS(threads_per_rank(0, 1, 1), kat::ValueError);
  CHECK_THROWS_AS(threads_per_rank(2, 0, 1), kat::ValueError);
  CHECK_THROWS_WITH(threads_per_rank(2, 2, 0), Catch::Contains("local_ranks"));
}

TEST_CASE("thread_budget: the ranks of one node never ask for more threads than CPUs",
          "[mpi][dist][threads]") {
  Communicator world = Communicator::world();
  const auto b = kat::distributed::thread_budget(world);
  // ctest starts every rank on this machine: one node.
  CHECK(b.local_ranks == world.size());
  CHECK(b.node_cpus == std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  CHECK(b.affinity_cpus >= 1);
  CHECK(b.affinity_cpus <= b.node_cpus);
  CHECK(b.threads >= 1);
  if (b.affinity_cpus == b.node_cpus) {
    // Unbound: the node's CPUs are shared out, one thread per rank at least.
    CHECK(b.threads * b.local_ranks <= std::max(b.node_cpus, b.local_ranks));
  } else {
    CHECK(b.threads == b.affinity_cpus);
  }
  // Every rank of a node computes the same share when none is bound.
  int mine = b.threads, low = 0, high = 0;
  MPI_Allreduce(&mine, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &high, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (b.affinity_cpus == b.node_cpus) {
    CHECK(low == high);
  }
}

} // namespace test_thread_budget

#endif // KAT_ENABLE_MPI
