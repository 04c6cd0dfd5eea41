#!/usr/bin/env bash
# Prints the directory of Debian's OpenMP build of OpenBLAS (libblas.so.3 and
# libopenblas.so.0), for LD_LIBRARY_PATH when running the OpenMP backend.
set -euo pipefail
dir=/usr/lib/$(gcc -print-multiarch)/openblas-openmp
if [ ! -f "$dir/libopenblas.so.0" ]; then
  echo "openmp_blas_dir.sh: $dir/libopenblas.so.0 not found; run scripts/setup.sh" >&2
  exit 1
fi
echo "$dir"
