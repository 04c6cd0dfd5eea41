#pragma once
/// @file
/// @brief kat::distributed::MPIProcessGroup: the MPI ranks of a Communicator as the
/// kat::train::ProcessGroup a Trainer and its callbacks agree over. Needs KAT built with
/// `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/comm/process_group.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/distributed/comm/communicator.hpp"
#include "kat/train/process_group.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace kat::distributed {

/// The ranks of `comm` as a kat::train::ProcessGroup: sums, minima and gathers are blocking
/// collectives on host memory, counted in the Communicator's statistics like any other.
/// @throws MPIError from every collective member.
class MPIProcessGroup : public train::ProcessGroup {
public:
  /// @param comm the ranks training together; must outlive this object
  explicit MPIProcessGroup(Communicator &comm) : comm_(&comm) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }

  void sum(std::vector<double> &values) const override {
    if (values.empty()) {
      return;
    }
    Kokkos::View<double *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> v(values.data(),
                                                                         values.size());
    comm_->allreduce(Kokkos::DefaultHostExecutionSpace(), v, ReduceOp::sum);
  }

  std::int64_t min(std::int64_t value) const override {
    Kokkos::View<std::int64_t *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> v(&value, 1);
    comm_->allreduce(Kokkos::DefaultHostExecutionSpace(), v, ReduceOp::min);
    return value;
  }

  std::vector<std::vector<double>> gather(const std::vector<double> &values) const override {
    const std::size_t n = values.size();
    const auto ranks = static_cast<std::size_t>(comm_->size());
    std::vector<double> in(values), out(n * ranks);
    if (n > 0) {
      comm_->allgather(
          Kokkos::DefaultHostExecutionSpace(),
          Kokkos::View<const double *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(in.data(), n),
          Kokkos::View<double *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(out.data(),
                                                                             out.size()));
    }
    std::vector<std::vector<double>> all(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      all[r].assign(out.begin() + static_cast<std::ptrdiff_t>(r * n),
                    out.begin() + static_cast<std::ptrdiff_t>((r + 1) * n));
    }
    return all;
  }

  void barrier() const override { comm_->barrier(); }

private:
  Communicator *comm_;
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
