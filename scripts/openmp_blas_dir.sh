#!/usr/bin/env bash
# Prints the directory of Debian's OpenMP build of OpenBLAS (libblas.so.3 and
# libopenblas.so.0): what scripts/build_kokkos.sh links Kokkos Kernels to for the OpenMP
# backend, and LD_LIBRARY_PATH for older builds (scripts/bench_compare.sh) that did not link it.
set -euo pipefail
dir=/usr/lib/$(gcc -print-multiarch)/openblas-openmp
if [ ! -f "$dir/libopenblas.so.0" ]; then
  echo "openmp_blas_dir.sh: $dir/libopenblas.so.0 not found; run scripts/setup.sh" >&2
  exit 1
fi
echo "$dir"
