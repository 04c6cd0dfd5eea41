#!/usr/bin/env bash
# Measures this machine's MPI alpha (s) and beta (s/byte) for kat::plan's cost model
# (include/kat/plan/cost_model.hpp, the mpi-local cluster; docs/tensor_parallel.md):
# builds bench/mpi_alpha_beta.cpp with mpicxx and runs it on RANKS ranks (default 2).
#
#   scripts/measure_alpha_beta.sh            # 2 ranks
#   RANKS=4 scripts/measure_alpha_beta.sh    # 4 ranks (oversubscribed on 2 cores)
#
# Prints the per-size medians, the fitted all-reduce model and its prediction for all-gather
# and reduce-scatter, then alpha_s, beta_s_per_byte and bandwidth_GB_per_s.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ranks=${RANKS:-2}
out=$root/build/alpha-beta
mkdir -p "$out"
mpicxx -O2 -std=c++17 -o "$out/kat_mpi_alpha_beta" "$root/bench/mpi_alpha_beta.cpp"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np "$ranks" "$out/kat_mpi_alpha_beta" "$@"
