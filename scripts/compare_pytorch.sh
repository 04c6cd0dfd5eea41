#!/usr/bin/env bash
# KAT against PyTorch on CPU, in one invocation: for each model, kat_train (OpenMP backend,
# OpenMP OpenBLAS) and the same model in PyTorch (bench/compare_pytorch.py, Debian's
# python3-torch, run by /usr/bin/python3), alternately, ROUNDS times each, with the same threads, batch, rate and
# epochs. Prints every run's training seconds per epoch and final test accuracy, then per model
# the median epoch time of each (epoch 1 excluded: it pays first-touch allocations and
# PyTorch's one-time set-up) and the ratio KAT / PyTorch.
#
#   scripts/compare_pytorch.sh
#   KAT_MODELS="mlp cnn resnet"   models (default these three; vit adds the Vision Transformer)
#   KAT_EPOCHS=3                  epochs per run (at least 2)
#   KAT_SUBSET="resnet:12800"     training images per model (default: ResNet 12,800, others all)
#   KAT_THREADS=2                 threads of both (default: nproc)
#   ROUNDS=2                      alternations
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
"$root/scripts/setup.sh"
kat_require_torch
build=$root/build/compare-pytorch
data=/usr/share/datasets/fashion-mnist
threads=${KAT_THREADS:-$(nproc)}
kat_env=() # set by kat_openmp_trainer
kat_openmp_trainer "$root" "$build" "$threads"
epochs=${KAT_EPOCHS:-3}
rounds=${ROUNDS:-2}
subsets=${KAT_SUBSET:-resnet:12800}
out=$root/build/compare-pytorch-runs
mkdir -p "$out"
echo "KAT $(git -C "$root" rev-parse --short HEAD), $(/usr/bin/python3 -c 'import torch; print("PyTorch", torch.__version__)'), $threads threads, $(date -u +%F)"
for model in ${KAT_MODELS:-mlp cnn resnet}; do
  subset=$(tr ' ' '\n' <<<"$subsets" | awk -F: -v m="$model" '$1 == m { print $2 }')
  subset=${subset:-0}
  common=(--model "$model" --epochs "$epochs" --batch-size 128 --lr 0.05 --train-subset "$subset")
  rm -f "$out/$model"-kat-*.txt "$out/$model"-torch-*.txt # this invocation's runs only
  for r in $(seq "$rounds"); do
    env "${kat_env[@]}" "$build/examples/kat_train" "${common[@]}" --momentum 0.9 --seed "$r" \
      --data-dir "$data" --progress never --metrics "$out/$model-kat-$r.csv" >/dev/null
    # kat_train's CSV: epoch, wall_seconds, ..., test_accuracy (column 6).
    awk -F, 'NR > 1 { print $1 "," $2 "," $6 }' "$out/$model-kat-$r.csv" >"$out/$model-kat-$r.txt"
    /usr/bin/python3 "$root/bench/compare_pytorch.py" "${common[@]}" --momentum 0.9 --seed "$r" \
      --data-dir "$data" --threads "$threads" | awk -F, 'NR > 1' >"$out/$model-torch-$r.txt"
    for which in kat torch; do
      awk -F, -v m="$model" -v w="$which" -v r="$r" '{ t = t sprintf(" %.2f", $2); acc = $3 }
        END { printf "%s %s run %d: epoch seconds%s; test accuracy %.2f%%\n", m, w, r, t, 100 * acc }' \
        "$out/$model-$which-$r.txt"
    done
  done
  for which in kat torch; do
    awk -F, '$1 > 1 { print $2 }' "$out/$model-$which"-*.txt | kat_median >"$out/$model-$which.median"
  done
  awk -v m="$model" -v n="$subset" 'NR == FNR { k = $1; next } { t = $1 }
    END { printf "%s (%s training images): median epoch KAT %.2f s, PyTorch %.2f s, KAT / PyTorch %.2f\n",
                 m, n == 0 ? "60000" : n, k, t, k / t }' "$out/$model-kat.median" "$out/$model-torch.median"
done
