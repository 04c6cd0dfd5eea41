// Catch2 runner: MPI (when built in), then Kokkos, then the tests; finalized in reverse.
//
// ctest runs every test case that is not tagged "[mpi]" as its own process, two at a time,
// with the extra argument --kat-without-mpi (tests/CMakeLists.txt): those processes skip
// MPI_Init. Open MPI singletons started at the same moment race to create the same session
// directory ("mkdir ... File exists", orte_init fails), which failed unrelated tests at random.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <Kokkos_Core.hpp>

#include <cstring>

#ifdef KAT_ENABLE_MPI
#include <mpi.h>
#endif

namespace {
/// Removes `flag` from argv (it is not a Catch option) and says whether it was there.
bool take_flag(int &argc, char **argv, const char *flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) {
      for (int j = i; j < argc; ++j) {
        argv[j] = argv[j + 1]; // argv[argc] is the terminating null pointer
      }
      --argc;
      return true;
    }
  }
  return false;
}
} // namespace

int main(int argc, char **argv) {
  const bool mpi = !take_flag(argc, argv, "--kat-without-mpi");
#ifdef KAT_ENABLE_MPI
  if (mpi) {
    MPI_Init(&argc, &argv);
  }
#else
  (void)mpi;
#endif
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    result = Catch::Session().run(argc, argv);
  }
#ifdef KAT_ENABLE_MPI
  if (mpi) {
    MPI_Finalize();
  }
#endif
  return result;
}
