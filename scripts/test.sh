#!/usr/bin/env bash
# Installs what is missing, then builds and runs the whole test suite twice, with MPI (Open
# MPI), against Debian's Kokkos 3.4.1 (Serial backend) and against Kokkos 3.4.1 built with the
# OpenMP backend from Debian's trilinos source package (cached; see
# scripts/build_kokkos.sh).
#   KAT_BACKENDS="serial openmp"   which backends to test (default both)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
jobs=$(nproc)
backends=${KAT_BACKENDS:-serial openmp}

for backend in $backends; do
  build=$root/build/test-$backend
  # MPI on for both backends: ctest then also runs the "[mpi]" tests under mpiexec at 1, 2
  # and 4 ranks (tests mpi_ranks_*, one OpenMP thread per rank; see tests/CMakeLists.txt).
  args=(-DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_TESTS=ON -DKAT_ENABLE_EXAMPLES=ON
    -DKAT_ENABLE_MPI=ON)
  # The Serial build also compiles the benchmarks (not run here), so they cannot rot.
  if [ "$backend" = serial ]; then
    args+=(-DKAT_ENABLE_BENCHMARKS=ON)
  fi
  case $backend in
    serial) ;;
    openmp)
      prefix=$("$root/scripts/build_kokkos.sh" openmp | tail -n 1)
      args+=(-DCMAKE_PREFIX_PATH="$prefix")
      # OpenBLAS's OpenMP variant shares Kokkos's thread pool (the default pthread variant
      # would fight it for the cores); see docs/backends.md.
      export LD_LIBRARY_PATH="$(scripts/openmp_blas_dir.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      export OMP_NUM_THREADS=2 OMP_PROC_BIND=false
      ;;
    *) echo "test.sh: unknown backend '$backend' (serial | openmp)" >&2; exit 2 ;;
  esac
  echo "== $backend: configure and build"
  mkdir -p "$build"
  cmake -S "$root" -B "$build" "${args[@]}" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
  cmake --build "$build" -j "$jobs"
  echo "== $backend: test"
  (cd "$build" && ctest --output-on-failure -j "$jobs")
done
