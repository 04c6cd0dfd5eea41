#!/usr/bin/env bash
# Conv2d's oneDNN path against its im2col + GEMM path in KAT's trainer (OpenMP backend,
# OpenMP OpenBLAS): for each model and seed, kat_train --conv-backend im2col and
# --conv-backend dnn alternately, the same epochs, batch, rate and data. Prints each run's
# training seconds per epoch and final test accuracy, then per model and backend the mean and
# standard deviation of the final accuracy over the seeds and the median epoch time (epoch 1
# excluded).
#
#   scripts/compare_conv_backends.sh
#   KAT_MODELS="cnn resnet"       models (default both)
#   KAT_EPOCHS=3                  epochs per run (at least 2)
#   KAT_SEEDS="1 2 3"             seeds
#   KAT_SUBSET="resnet:12800"     training images per model (default: ResNet 12,800, CNN all)
#   KAT_OPTIMIZER=sgd             any kat_train optimizer (kfac: K-FAC's recording steps use
#                                 im2col on both)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
"$root/scripts/setup.sh"
build=$root/build/compare-pytorch
data=/usr/share/datasets/fashion-mnist
threads=$(nproc)
kat_env=() # set by kat_openmp_trainer
kat_openmp_trainer "$root" "$build" "$threads"
epochs=${KAT_EPOCHS:-3}
subsets=${KAT_SUBSET:-resnet:12800}
optimizer=${KAT_OPTIMIZER:-sgd}
out=$root/build/compare-conv-backends
mkdir -p "$out"
echo "KAT $(git -C "$root" rev-parse --short HEAD), $optimizer, $threads threads, $(date -u +%F)"
for model in ${KAT_MODELS:-cnn resnet}; do
  subset=$(tr ' ' '\n' <<<"$subsets" | awk -F: -v m="$model" '$1 == m { print $2 }')
  subset=${subset:-0}
  rm -f "$out/$model-$optimizer"-*.csv
  for seed in ${KAT_SEEDS:-1 2 3}; do
    for backend in im2col dnn; do
      csv=$out/$model-$optimizer-$backend-$seed.csv
      env "${kat_env[@]}" "$build/examples/kat_train" --model "$model" --optimizer "$optimizer" \
        --epochs "$epochs" --batch-size 128 --lr 0.05 --momentum 0.9 --seed "$seed" \
        --train-subset "$subset" --conv-backend "$backend" --data-dir "$data" \
        --progress never --metrics "$csv" >/dev/null
      # kat_train's CSV: epoch, wall_seconds, ..., test_accuracy (column 6).
      awk -F, -v m="$model" -v b="$backend" -v s="$seed" 'NR > 1 { t = t sprintf(" %.2f", $2); acc = $6 }
        END { printf "%s %s seed %d: epoch seconds%s; test accuracy %.2f%%\n", m, b, s, t, 100 * acc }' "$csv"
    done
  done
  for backend in im2col dnn; do
    files=("$out/$model-$optimizer-$backend"-*.csv)
    acc=$(for f in "${files[@]}"; do awk -F, 'END { print $6 }' "$f"; done |
      awk '{ s += $1; q += $1 * $1; n++ } END { m = s / n; v = n > 1 ? (q - n * m * m) / (n - 1) : 0;
             printf "%.2f%% +- %.2f", 100 * m, 100 * sqrt(v > 0 ? v : 0) }')
    median=$(for f in "${files[@]}"; do awk -F, 'NR > 2 { print $2 }' "$f"; done | kat_median)
    median=$(printf '%.2f' "$median")
    echo "$model $backend: final test accuracy $acc (${#files[@]} seeds), median epoch $median s"
  done
done
