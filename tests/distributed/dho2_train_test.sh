#!/usr/bin/env bash
# kat_train with DHO2 on 2 ranks against FOSI on one process: the same global batches, the same
# curvature batch (each rank differentiating its half), so every epoch's train loss, test loss
# and test accuracy agree up to the rounding of the reductions; each rank's curvature memory is
# half of one process's, and the bytes per step are the analytic count; and the flag's errors.
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
      --num-iters-to-approx-eigs 8 --profile)

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

# column NAME FILE: the value of NAME in epoch 2.
column() {
  awk -F, -v name="$1" 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == name) c = i; next }
    NR == 3 { print $c }' "$2"
}
# The MLP's n = 269322 parameters in 2 slices of 134661; k = 3, m = 4k = 12, float: curvature
# 8 (n_r (k + 1) + n_r (m + 1 + k)) = 160 n_r bytes per rank, so exactly half of one process's.
fosi_bytes=$(column fosi_curvature_bytes "$work/fosi.csv")
dho2_bytes=$(column fosi_curvature_bytes "$work/dho2.csv")
[ "$fosi_bytes" = 43091520 ] || fail "FOSI's curvature: expected 43091520 bytes, got $fosi_bytes"
[ "$dho2_bytes" = 21545760 ] || fail "DHO2's curvature per rank: expected 21545760, got $dho2_bytes"
# Epoch 2 (32 steps, refreshes at steps 36, 44, 52, 60): every step gathers 134661 floats and
# all-reduces 2 x 3 doubles; each refresh's Lanczos reduces 8 (m² + m) + 8k = 1272 bytes, and
# each of its 12 products gathers 134661 floats, agrees on 4 bytes and reduce-scatters 2 x
# 134661 floats: (32 x 538692 + 4 x (1272 + 12 x 1615936)) / 32 = 2962755 bytes per step.
per_step=$(column fosi_bytes_per_step "$work/dho2.csv")
[ "$per_step" = 2962755.0 ] || fail "DHO2's bytes per step: expected 2962755.0, got $per_step"
[ "$(column fosi_bytes_per_step "$work/fosi.csv")" = 0.0 ] || fail "FOSI alone communicated"

echo "== fosi-* on 2 ranks without --dist-strategy dho2 is refused"
if "$mpiexec" -n 2 "$@" "$train" "${args[@]}" > "$work/refused.log" 2>&1; then
  fail "fosi-momentum ran on 2 ranks without --dist-strategy"
fi
grep -q "needs --dist-strategy dho2" "$work/refused.log" ||
  fail "unclear error: $(cat "$work/refused.log")"
echo OK
