#!/usr/bin/env bash
# The ViT (kat_train --model vit, Adam 1e-3, batch 128) on this machine: one rank, and split
# over T = 2 and 4 tensor-parallel ranks (Megatron's plan, and at T = 2 the plan kat_plan --vit
# searched for the mpi-local cost model), and a 2 x 2 mesh (2 data-parallel replicas of T = 2).
# Prints per run the epoch time, samples per second, test accuracy, and the bytes the
# tensor-parallel layers handed to MPI per training step next to the plan's prediction.
#
#   scripts/bench_tensor_parallel.sh
#   KAT_TP_EPOCHS=1        epochs per run (default 1)
#   KAT_TP_SUBSET=0        training images (0: all 60,000)
#
# OpenMP backend (scripts/build_kokkos.sh openmp) with MPI; ranks use one thread each (the
# single-rank run both cores). CSVs and logs in build/bench-tp-runs/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
prefix=$("$root/scripts/build_kokkos.sh" openmp | tail -n 1)
build=$root/build/bench-tp
out=$root/build/bench-tp-runs
mkdir -p "$build" "$out"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_TESTS=OFF \
  -DKAT_ENABLE_EXAMPLES=ON -DKAT_ENABLE_MPI=ON -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build" --target kat_train kat_plan -j "$(nproc)" >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_PROC_BIND=false
epochs=${KAT_TP_EPOCHS:-1}
common=(--model vit --optimizer adam --lr 1e-3 --epochs "$epochs" --progress never
  --train-subset "${KAT_TP_SUBSET:-0}")
echo "KAT $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores"

OMP_NUM_THREADS=1 "$build/examples/kat_plan" --vit 4x64 --tp 2 --cluster mpi-local \
  --out "$out/vit-tp2.json" >"$out/plan-tp2.txt"
grep -E '^(search|  step time|  communicated|block)' "$out/plan-tp2.txt"

# run NAME RANKS ARGS...
run() {
  local name=$1 ranks=$2
  shift 2
  if [ "$ranks" -eq 1 ]; then
    OMP_NUM_THREADS=$(nproc) OPENBLAS_NUM_THREADS=$(nproc) "$build/examples/kat_train" \
      "${common[@]}" --metrics "$out/$name.csv" "$@" >"$out/$name.txt" 2>&1
  else
    mpiexec --oversubscribe -n "$ranks" -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
      -x LD_LIBRARY_PATH "$build/examples/kat_train" "${common[@]}" --metrics "$out/$name.csv" \
      "$@" >"$out/$name.txt" 2>&1
  fi || { cat "$out/$name.txt" >&2; exit 1; }
  grep -E '^epoch' "$out/$name.txt" | tail -n 1 | sed "s/^/$name: /"
}
run single 1
run tp2 2 --tensor-parallel 2
run tp2-plan 2 --tensor-parallel 2 --plan "$out/vit-tp2.json"
run tp4 4 --tensor-parallel 4
run dp2-tp2 4 --tensor-parallel 2
