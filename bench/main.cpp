// Google Benchmark runner for KAT: initializes Kokkos first and records the backend.
#include <Kokkos_Core.hpp>
#include <benchmark/benchmark.h>

#include <string>

int main(int argc, char **argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  using Space = Kokkos::DefaultExecutionSpace;
  benchmark::AddCustomContext("kokkos_execution_space", Space::name());
  benchmark::AddCustomContext("kokkos_concurrency", std::to_string(Space().concurrency()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
