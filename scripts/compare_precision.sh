#!/usr/bin/env bash
# kat_train --precision fp32 against --precision bf16 (and, unless KAT_TORCH=0, PyTorch in fp32
# and under torch.autocast bf16: bench/compare_pytorch.py --precision), alternately in one
# invocation, for each model and seed: the same threads, batch, rate, momentum and epochs.
# Prints every run's epoch seconds and final test accuracy, then per model the median epoch
# time of each (epoch 1 excluded: first-touch allocations, oneDNN's kernel generation,
# PyTorch's set-up), the speed-ups and the mean and spread of the final accuracy over seeds.
# Also prints which bf16 kernels oneDNN chose on this CPU (ONEDNN_VERBOSE), so the table says
# whether AMX, AVX512-BF16 or an emulation did the work.
#
#   scripts/compare_precision.sh
#   KAT_MODELS="cnn resnet vit"  models (default mlp cnn resnet vit)
#   KAT_EPOCHS=3                 epochs per run (at least 2)
#   KAT_SEEDS="1 2"              seeds; one alternation of all runs per seed
#   KAT_SUBSET="resnet:12800"    training images per model (default: ResNet 12,800, others all)
#   KAT_THREADS=2                threads of both (default: nproc)
#   KAT_TORCH=0                  KAT only (the accuracy study)
#   KAT_EXTRA="--optimizer kfac" more kat_train flags (KAT only: set KAT_TORCH=0)
#   KAT_COMPARE_HOST_ISA=1       also KAT with KAT_HOST_ISA=compiled (its host loops' AVX2 copy
#                                only; runs katc-fp32, katc-bf16), alternately with the others
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
"$root/scripts/setup.sh"
torch=${KAT_TORCH:-1}
if [ "$torch" = 1 ]; then
  kat_require_torch
fi
build=$root/build/compare-pytorch
data=/usr/share/datasets/fashion-mnist
threads=${KAT_THREADS:-$(nproc)}
epochs=${KAT_EPOCHS:-3}
if ! [[ $epochs =~ ^[0-9]+$ ]] || ((epochs < 2)); then
  echo "compare_precision.sh: KAT_EPOCHS must be an integer >= 2, got '$epochs'" >&2
  exit 2
fi
kat_env=() # set by kat_openmp_trainer
kat_openmp_trainer "$root" "$build" "$threads"
subsets=${KAT_SUBSET:-resnet:12800}
read -r -a extra <<<"${KAT_EXTRA:-}"
out=$root/build/compare-precision-runs
mkdir -p "$out"
echo "KAT $(git -C "$root" rev-parse --short HEAD), $threads threads, $(date -u +%F), CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
echo "CPU bf16 units (and AVX-512 for the host loops): $(grep -o -w 'amx_bf16\|avx512_bf16\|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
[ "$torch" = 1 ] && /usr/bin/python3 -c 'import torch; print("PyTorch", torch.__version__)'
runs=(kat-fp32 kat-bf16)
compare_isa=${KAT_COMPARE_HOST_ISA:-0}
[ "$compare_isa" = 1 ] && runs+=(katc-fp32 katc-bf16)
[ "$torch" = 1 ] && runs+=(torch-fp32 torch-bf16)
for model in ${KAT_MODELS:-mlp cnn resnet vit}; do
  subset=$(tr ' ' '\n' <<<"$subsets" | awk -F: -v m="$model" '$1 == m { print $2 }')
  subset=${subset:-0}
  common=(--model "$model" --epochs "$epochs" --batch-size 128 --lr 0.05 --momentum 0.9
    --train-subset "$subset")
  rm -f "$out/$model"-*.txt "$out/$model"-*.csv # this invocation's runs only
  echo "$model: oneDNN's bf16 kernels: $(env "${kat_env[@]}" ONEDNN_VERBOSE=1 \
    "$build/examples/kat_train" --model "$model" --epochs 1 --train-subset 256 --precision bf16 \
    --data-dir "$data" --progress never "${extra[@]}" 2>/dev/null |
    awk -F, '$1 == "onednn_verbose" && $2 == "exec" && $4 != "reorder" { print $4 ":" $5 }' |
    sort | uniq -c | sort -rn | awk '{ printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1 }')"
  for seed in ${KAT_SEEDS:-1 2}; do
    for run in "${runs[@]}"; do
      which=${run%-*} precision=${run#*-}
      if [ "$which" = kat ] || [ "$which" = katc ]; then
        isa=()
        [ "$which" = katc ] && isa=(KAT_HOST_ISA=compiled)
        env "${kat_env[@]}" "${isa[@]}" "$build/examples/kat_train" "${common[@]}" --seed "$seed" \
          --precision "$precision" --data-dir "$data" --progress never "${extra[@]}" \
          --metrics "$out/$model-$run-$seed.csv" >/dev/null
        # kat_train's CSV: epoch, wall_seconds, ..., test_accuracy (column 6).
        awk -F, 'NR > 1 { print $1 "," $2 "," $6 }' "$out/$model-$run-$seed.csv" >"$out/$model-$run-$seed.txt"
      else
        /usr/bin/python3 "$root/bench/compare_pytorch.py" "${common[@]}" --seed "$seed" \
          --precision "$precision" --data-dir "$data" --threads "$threads" |
          awk -F, 'NR > 1' >"$out/$model-$run-$seed.txt"
      fi
      awk -F, -v m="$model" -v w="$run" -v r="$seed" '{ t = t sprintf(" %.2f", $2); acc = $3 }
        END { printf "%s %s seed %d: epoch seconds%s; test accuracy %.2f%%\n", m, w, r, t, 100 * acc }' \
        "$out/$model-$run-$seed.txt"
    done
  done
  for run in "${runs[@]}"; do
    awk -F, '$1 > 1 { print $2 }' "$out/$model-$run"-*.txt | kat_median >"$out/$model-$run.median"
    # Final accuracy of each seed: mean and (sample) standard deviation.
    for f in "$out/$model-$run"-*.txt; do tail -n 1 "$f"; done |
      awk -F, '{ a[NR] = 100 * $3; s += a[NR] } END { m = s / NR; for (i = 1; i <= NR; ++i) v += (a[i] - m) ^ 2
        printf "%.2f %.2f %d\n", m, (NR > 1 ? sqrt(v / (NR - 1)) : 0), NR }' >"$out/$model-$run.accuracy"
  done
  {
    printf '%s (%s training images, %s epochs):' "$model" "$([ "$subset" = 0 ] && echo 60000 || echo "$subset")" "$epochs"
    for run in "${runs[@]}"; do
      read -r med <"$out/$model-$run.median"
      read -r mean sd n <"$out/$model-$run.accuracy"
      printf ' %s %.3f s/epoch, %.2f ± %.2f %% (%d seeds);' "$run" "$med" "$mean" "$sd" "$n"
    done
    echo
    k32=$(cat "$out/$model-kat-fp32.median") k16=$(cat "$out/$model-kat-bf16.median")
    awk -v a="$k32" -v b="$k16" 'BEGIN { printf "  KAT bf16 speed-up over KAT fp32: %.2f\n", a / b }'
    if [ "$compare_isa" = 1 ]; then
      c32=$(cat "$out/$model-katc-fp32.median") c16=$(cat "$out/$model-katc-bf16.median")
      awk -v a="$c32" -v b="$c16" -v c="$k16" 'BEGIN {
        printf "  with the AVX2 host loops only (katc): bf16 speed-up %.2f; KAT bf16 / katc bf16: %.2f\n", a / b, c / b }'
    fi
    if [ "$torch" = 1 ]; then
      t16=$(cat "$out/$model-torch-bf16.median") t32=$(cat "$out/$model-torch-fp32.median")
      awk -v a="$k16" -v b="$t16" -v c="$k32" -v d="$t32" 'BEGIN {
        printf "  KAT bf16 / PyTorch autocast bf16: %.2f; KAT fp32 / PyTorch fp32: %.2f\n", a / b, c / d }'
    fi
    read -r m32 _ <"$out/$model-kat-fp32.accuracy"
    read -r m16 _ <"$out/$model-kat-bf16.accuracy"
    awk -v a="$m16" -v b="$m32" 'BEGIN { printf "  accuracy bf16 - fp32 (means): %+.2f points\n", a - b }'
  }
done
