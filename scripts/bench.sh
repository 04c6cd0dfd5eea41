#!/usr/bin/env bash
# Builds the benchmarks against the Serial and the OpenMP Kokkos and runs them, writing
# console output and JSON to build/bench-<backend>-<name>.{txt,json}.
#   KAT_BACKENDS="serial openmp"         which backends (default both)
#   KAT_BENCHES="mlp conv models linalg kfac" binaries (default all; models runs one full
#                                        epoch of each reference model, minutes)
#   extra arguments go to every benchmark binary (e.g. --benchmark_filter=Epoch)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
for backend in ${KAT_BACKENDS:-serial openmp}; do
  build=$root/build/bench-$backend
  args=(-DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_BENCHMARKS=ON -DKAT_ENABLE_TESTS=OFF
    -DKAT_ENABLE_EXAMPLES=OFF)
  env=()
  if [ "$backend" = openmp ]; then
    args+=(-DCMAKE_PREFIX_PATH="$("$root/scripts/build_kokkos.sh" openmp | tail -n 1)")
    # The programs link OpenBLAS's OpenMP variant, which shares Kokkos's thread pool
    # (docs/backends.md).
    env=(OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}" OMP_PROC_BIND=false)
  fi
  cmake -S "$root" -B "$build" "${args[@]}" >/dev/null
  cmake --build "$build" -j "$(nproc)" >/dev/null
  for bench in ${KAT_BENCHES:-mlp conv models linalg kfac}; do
    echo "== $backend: $bench"
    env "${env[@]}" "$build/bench/kat_bench_$bench" --benchmark_out="$build-$bench.json" \
      --benchmark_out_format=json "$@" | tee "$build-$bench.txt"
  done
done
