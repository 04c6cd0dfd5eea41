#pragma once
/// @file
/// @brief kat::distributed::MPIEnvironment: MPI initialized for the lifetime of an object.
/// Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/comm/mpi_environment.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include <mpi.h>

namespace kat::distributed {

/// Initializes MPI (MPI_Init_thread with MPI_THREAD_FUNNELED: only the thread that made this
/// object calls MPI, which is how KAT uses it) and finalizes it when destroyed, unless it is
/// already finalized. Declare it before the Kokkos::ScopeGuard so MPI starts before Kokkos
/// and ends after it, as GPU-aware MPI needs.
class MPIEnvironment {
public:
  /// Initializes MPI with `argc` and `argv` (main()'s), which MPI may modify.
  MPIEnvironment(int &argc, char **&argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  MPIEnvironment(const MPIEnvironment &) = delete;
  MPIEnvironment &operator=(const MPIEnvironment &) = delete;
  ~MPIEnvironment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) {
      MPI_Finalize();
    }
  }
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
