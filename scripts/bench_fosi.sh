#!/usr/bin/env bash
# FOSI against its base optimizers with kat_train, one CSV per run in build/bench-fosi-runs/:
#
#   scripts/bench_fosi.sh sweep   each optimizer at each learning rate of its sweep, seed 0:
#                                 final accuracy, to pick the best rate
#   scripts/bench_fosi.sh seeds   each optimizer at its rate over seeds 0 1 2: epochs and
#                                 wall time to KAT_FOSI_TARGET, and the final accuracy. The
#                                 rate is KAT_FOSI_LR_<optimizer>, else the sweep's best
#                                 final accuracy (the lower rate on a tie), whose seed-0 run
#                                 is then reported, not repeated
#
#   KAT_FOSI_BACKEND=serial serial (Debian's Kokkos) or openmp (scripts/build_kokkos.sh openmp,
#                           one process of nproc threads, OpenBLAS's OpenMP build)
#   KAT_FOSI_SEEDS="0 1 2"  the seeds of `seeds`
#   KAT_FOSI_MODEL=mlp      mlp or cnn
#   KAT_FOSI_EPOCHS=10      epochs of every run
#   KAT_FOSI_TARGET=0.88    the test accuracy "epochs to target" counts to (0.91 for the CNN)
#   KAT_FOSI_SUBSET=0       --train-subset (0: the whole training set)
#   KAT_FOSI_FLAGS=""       more kat_train flags for the FOSI runs (e.g. "--k 10")
# Optimizers: momentum (sgd), fosi-momentum, adam, fosi-adam; K-FAC (kfac) with
# KAT_FOSI_KFAC=1. KAT_FOSI_OPTIMIZERS="kfac" (a list) runs only those.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
part=${1:-}
case $part in sweep | seeds) ;; *)
  echo "usage: $0 sweep|seeds" >&2
  exit 2
  ;;
esac
optimizers="sgd fosi-momentum adam fosi-adam"
[ "${KAT_FOSI_KFAC:-0}" = 1 ] && optimizers="$optimizers kfac"
optimizers=${KAT_FOSI_OPTIMIZERS:-$optimizers}
for optimizer in $optimizers; do
  case $optimizer in sgd | fosi-momentum | adam | fosi-adam | kfac) ;; *)
    echo "KAT_FOSI_OPTIMIZERS: unknown optimizer '$optimizer' (sgd fosi-momentum adam fosi-adam kfac)" >&2
    exit 2
    ;;
  esac
done
backend=${KAT_FOSI_BACKEND:-serial}
"$root/scripts/setup.sh"
config=(-DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_EXAMPLES=ON)
case $backend in
  serial) build=$root/build/bench-fosi ;;
  openmp)
    build=$root/build/bench-fosi-openmp
    config+=(-DCMAKE_PREFIX_PATH="$("$root/scripts/build_kokkos.sh" openmp | tail -n 1)")
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
    ;;
  *)
    echo "KAT_FOSI_BACKEND: serial or openmp, got '$backend'" >&2
    exit 2
    ;;
esac
out=$root/build/bench-fosi-runs
mkdir -p "$build" "$out"
cmake -S "$root" -B "$build" "${config[@]}" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target kat_train -j "$(nproc)" >/dev/null
train=$build/examples/kat_train
model=${KAT_FOSI_MODEL:-mlp}
epochs=${KAT_FOSI_EPOCHS:-10}
target=${KAT_FOSI_TARGET:-0.88}
subset=${KAT_FOSI_SUBSET:-0}
read -r -a fosi_flags <<<"${KAT_FOSI_FLAGS:-}"
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores," \
  "$backend backend, $model, $epochs epochs, target $target"

# The learning rates swept per optimizer (SGD-based around 0.05, Adam-based around 1e-3).
rates() {
  case $1 in
    sgd | fosi-momentum | kfac) echo "0.02 0.05 0.1" ;;
    adam | fosi-adam) echo "0.0005 0.001 0.002" ;;
  esac
}

# run NAME OPTIMIZER LR SEED: one kat_train run, then its report.
run() {
  local name=$1 optimizer=$2 lr=$3 seed=$4
  local flags=(--model "$model" --optimizer "$optimizer" --lr "$lr" --seed "$seed"
    --epochs "$epochs" --train-subset "$subset" --progress never --metrics "$out/$name.csv")
  case $optimizer in fosi-*) flags+=("${fosi_flags[@]}") ;; esac
  "$train" "${flags[@]}" >"$out/$name.log"
  report "$name"
}

# report NAME: the final accuracy, the epoch and the summed training wall time at which the
# target was first reached, and the accuracies.
report() {
  awk -F, -v n="$1" -v t="$target" '
    NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
    { acc = acc sprintf(" %.2f", 100 * $col["test_accuracy"]); wall += $col["wall_seconds"]
      last = $col["test_accuracy"]
      if (!hit && last >= t) { hit = $col["epoch"]; hit_wall = wall } }
    END { printf "%-40s final %.2f%%  to target: %s  train %.1f s  accuracy per epoch:%s\n",
          n, 100 * last, hit ? sprintf("epoch %d, %.1f s", hit, hit_wall) : "not reached",
          wall, acc }' "$out/$1.csv"
}

# Runs are named after everything that changes their result but the FOSI flags.
prefix=$model-$backend-e$epochs-n$subset
if [ "$part" = sweep ]; then
  for optimizer in $optimizers; do
    for lr in $(rates "$optimizer"); do
      run "$prefix-$optimizer-lr$lr-s0" "$optimizer" "$lr" 0
    done
  done
  exit 0
fi

# best_rate OPTIMIZER: the swept rate with the highest final test accuracy at seed 0.
best_rate() {
  local lr csv best="" best_acc=-1 acc
  for lr in $(rates "$1"); do
    csv=$out/$prefix-$1-lr$lr-s0.csv
    [ -f "$csv" ] || { echo "no sweep run $csv: run '$0 sweep' or set the rate" >&2; return 1; }
    acc=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
                   { a = $col["test_accuracy"] } END { print a }' "$csv")
    if awk -v a="$acc" -v b="$best_acc" 'BEGIN { exit !(a > b) }'; then
      best=$lr best_acc=$acc
    fi
  done
  echo "$best"
}

for optimizer in $optimizers; do
  var=KAT_FOSI_LR_${optimizer//-/_}
  lr=${!var:-}
  from_sweep=0
  [ -n "$lr" ] || { lr=$(best_rate "$optimizer") && from_sweep=1; } || exit 2
  echo "$optimizer: lr $lr$( ((from_sweep)) && echo " (the sweep's best; its seed-0 run is reused)")"
  for seed in ${KAT_FOSI_SEEDS:-0 1 2}; do
    if ((from_sweep)) && [ "$seed" = 0 ]; then
      report "$prefix-$optimizer-lr$lr-s0"
    else
      run "$prefix-$optimizer-lr$lr-s$seed" "$optimizer" "$lr" "$seed"
    fi
  done
done
