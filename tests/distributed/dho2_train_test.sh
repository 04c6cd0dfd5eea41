#!/usr/bin/env bash
# kat_train with DHO2 on 2 ranks against FOSI on one process: the same global batches, the same
# curvature batch (each rank differentiating its half), so every epoch's train loss, test loss
# and test accuracy agree up to the rounding of the reductions; and the flag's errors.
#
#   dho2_train_test.sh KAT_TRAIN DATA_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
train=$1 data=$2 mpiexec=$3
shift 3
work=$(mktemp -d /tmp/kat-dho2-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
args=(--data-dir "$data" --model mlp --train-subset 2048 --batch-size 64 --epochs 2 --seed 3
      --progress never --optimizer fosi-momentum --lr 0.02 --k 3 --warmup-w 5
      --num-iters-to-approx-eigs 8)

echo "== FOSI on one process"
"$train" "${args[@]}" --metrics "$work/fosi.csv" > "$work/fosi.log"
echo "== DHO2 on 2 ranks"
"$mpiexec" -n 2 "$@" "$train" "${args[@]}" --dist-strategy dho2 --metrics "$work/dho2.csv" \
  > "$work/dho2.log"
grep -q "DHO2 (2 shards of" "$work/dho2.log" || fail "no DHO2 line: $(cat "$work/dho2.log")"
# Columns 4-6: train_loss, test_loss, test_accuracy; refreshes at steps 5, 13, ... in both.
paste -d, "$work/fosi.csv" "$work/dho2.csv" | awk -F, -v cols="$(head -n 1 "$work/fosi.csv" |
  awk -F, '{ print NF }')" '
  NR == 1 { next }
  { for (c = 4; c <= 6; ++c) {
      a = $c; b = $(c + cols); d = a - b; if (d < 0) d = -d
      if (d > 1e-3 * (a < 0 ? -a : a) + 1e-6) {
        printf "epoch %d column %d: FOSI %s, DHO2 %s\n", $1, c, a, b; bad = 1 } } }
  END { exit bad }' || fail "DHO2 on 2 ranks differs from FOSI on one"
[ "$(wc -l < "$work/dho2.csv")" -eq 3 ] || fail "expected 2 epochs: $(cat "$work/dho2.csv")"

echo "== fosi-* on 2 ranks without --dist-strategy dho2 is refused"
if "$mpiexec" -n 2 "$@" "$train" "${args[@]}" > "$work/refused.log" 2>&1; then
  fail "fosi-momentum ran on 2 ranks without --dist-strategy"
fi
grep -q "needs --dist-strategy dho2" "$work/refused.log" ||
  fail "unclear error: $(cat "$work/refused.log")"
echo OK
