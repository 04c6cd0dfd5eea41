// Catch2 runner: MPI (when built in), then Kokkos, then the tests; finalized in reverse.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <Kokkos_Core.hpp>

#ifdef KAT_ENABLE_MPI
#include <mpi.h>
#endif

int main(int argc, char **argv) {
#ifdef KAT_ENABLE_MPI
  MPI_Init(&argc, &argv);
#endif
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    result = Catch::Session().run(argc, argv);
  }
#ifdef KAT_ENABLE_MPI
  MPI_Finalize();
#endif
  return result;
}
