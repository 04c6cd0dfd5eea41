#!/usr/bin/env bash
# Time to a test-accuracy target: trains with each configuration through scripts/train.sh
# (Serial build) and prints the first epoch that reaches the target and the training wall time
# summed up to it (evaluation excluded).
#
#   scripts/time_to_accuracy.sh TARGET EPOCHS -- ARGS1 -- ARGS2 ...
#   scripts/time_to_accuracy.sh 0.88 10 -- --optimizer sgd --lr 0.05 \
#                                       -- --optimizer kfac --inverse-precision float
#
# Every configuration runs for EPOCHS epochs. Metrics and logs go to
# build/time_to_accuracy/run<N>.{csv,txt}.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 4 ] || [ "$3" != "--" ]; then
  echo "usage: $0 TARGET EPOCHS -- ARGS... [-- ARGS...]" >&2
  exit 2
fi
target=$1
epochs=$2
shift 3
out=$root/build/time_to_accuracy
mkdir -p "$out"

run=0
report() { # $1: metrics csv, $2: description
  awk -F, -v target="$target" -v what="$2" '
    NR > 1 { wall += $2; if (!hit && $6 >= target) { hit = 1; epoch = $1; at = wall; acc = $6 } }
    END {
      if (hit) printf "%-70s reaches %.2f%% at epoch %d after %.2f s of training (%.2f%%)\n", what, 100 * target, epoch, at, 100 * acc
      else printf "%-70s does not reach %.2f%% in %d epochs\n", what, 100 * target, NR - 1
    }' "$1"
}

results=()
while [ $# -gt 0 ]; do
  args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    args+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  run=$((run + 1))
  csv=$out/run$run.csv
  "$root/scripts/train.sh" --epochs "$epochs" --progress never --metrics "$csv" "${args[@]}" \
    >"$out/run$run.txt"
  results+=("$(report "$csv" "${args[*]}")")
done
printf '%s\n' "${results[@]}"
