#!/usr/bin/env bash
# kat_train with DASO on 2 ranks: on one node with global_skip 1, batches_to_wait 0 and no
# downcast it trains exactly as synchronous data parallelism; on two (virtual) nodes the
# schedule goes from a blocking warm-up epoch to (4, 1, 1), and the global bytes per epoch are
# the analytic count; under an emulated link the inter-node bytes and link time are reported;
# and the flags' errors.
#
#   daso_train_test.sh KAT_TRAIN DATA_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
train=$1 data=$2 mpiexec=$3
shift 3
work=$(mktemp -d /tmp/kat-daso-XXXXXX)
trap 'rm -rf "$work"' EXIT
# A small data set: the first 2048 training and 1000 test images (fashion_subset.sh says why).
. "$(dirname "$0")/../trainer/fashion_subset.sh"
fashion_subset "$data" "$work/data" 2048 1000 || exit 1
data=$work/data
fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--data-dir "$data" --model mlp --train-subset 2048 --batch-size 64 --seed 3
        --progress never --lr 0.05)
args=("${common[@]}" --epochs 2)
# column NAME FILE EPOCH: the value of NAME in that epoch.
column() {
  awk -F, -v name="$1" -v epoch="$3" '
    NR == 1 { for (i = 1; i <= NF; ++i) if ($i == name) c = i; next }
    $1 == epoch { print $c }' "$2"
}

echo "== data parallel and DASO (1,1,0, no downcast) on one node of 2 ranks"
"$mpiexec" -n 2 "$@" "$train" "${args[@]}" --metrics "$work/dp.csv" > "$work/dp.log"
"$mpiexec" -n 2 "$@" "$train" "${args[@]}" --dist-strategy daso --ranks-per-node 2 \
  --daso-fixed-skips 1,1,0 --daso-downcast none --metrics "$work/one.csv" > "$work/one.log"
grep -q "DASO on 2 ranks: 1 node x 2 ranks; fixed global_skip 1" "$work/one.log" ||
  fail "no DASO line: $(cat "$work/one.log")"
# Train loss, test loss, test accuracy (columns 4-6) to the last digit.
[ "$(cut -d, -f4-6 "$work/dp.csv")" = "$(cut -d, -f4-6 "$work/one.csv")" ] ||
  fail "DASO on one node differs from data parallel: $(paste -d' ' "$work/dp.csv" "$work/one.csv")"

echo "== DASO on 2 nodes of 1 rank: a blocking warm-up epoch, then (4, 1, 1)"
"$mpiexec" -n 2 "$@" "$train" "${args[@]}" --dist-strategy daso --ranks-per-node 1 \
  --daso-warmup-epochs 1 --daso-cooldown-epochs 0 --profile --metrics "$work/two.csv" \
  > "$work/two.log"
grep -q "daso blocking, local" "$work/two.log" || fail "no blocking epoch: $(cat "$work/two.log")"
grep -q "daso skips 4/1/1, local" "$work/two.log" || fail "no (4,1,1) epoch: $(cat "$work/two.log")"
[ "$(column daso_global_skip "$work/two.csv" 1)" = 0 ] || fail "epoch 1's global_skip is not 0"
[ "$(column daso_global_skip "$work/two.csv" 2)" = 4 ] || fail "epoch 2's global_skip is not 4"
[ "$(column daso_batches_to_wait "$work/two.csv" 2)" = 1 ] || fail "epoch 2's wait is not 1"
# The MLP's n = 269322 parameters and a status element; 32 steps per epoch. Epoch 1 sends at
# every step in bf16: 32 x 269323 x 2 = 17236672 bytes per rank. Epoch 2 sends at steps 0, 4,
# ..., 28 and the last, in float: 9 x 269323 x 4 = 9695628.
[ "$(column daso_global_bytes "$work/two.csv" 1)" = 17236672 ] ||
  fail "epoch 1's global bytes: expected 17236672, got $(column daso_global_bytes "$work/two.csv" 1)"
[ "$(column daso_global_bytes "$work/two.csv" 2)" = 9695628 ] ||
  fail "epoch 2's global bytes: expected 9695628, got $(column daso_global_bytes "$work/two.csv" 2)"

echo "== the same under an emulated link of 100 us and 100 MB/s"
"$mpiexec" -n 2 "$@" "$train" "${args[@]}" --dist-strategy daso --ranks-per-node 1 \
  --daso-warmup-epochs 1 --daso-cooldown-epochs 0 --emulate-internode-latency 1e-4 \
  --emulate-internode-bandwidth 1e8 --metrics "$work/link.csv" > "$work/link.log"
grep -q "inter-node [0-9.]* MB" "$work/link.log" || fail "no inter-node note: $(cat "$work/link.log")"
# Epoch 2's sends alone: 2 ranks x 9695628 bytes over the link, 9 x (1e-4 + 1077292 / 1e8) s.
awk -v b="$(column internode_bytes "$work/link.csv" 2)" -v s="$(column internode_s "$work/link.csv" 2)" \
  'BEGIN { exit !(b >= 19391256 && s >= 0.0978) }' ||
  fail "epoch 2's inter-node bytes or link time too small: $(cat "$work/link.csv")"
# Both runs train the same steps: the link only delays.
[ "$(cut -d, -f4-6 "$work/two.csv")" = "$(cut -d, -f4-6 "$work/link.csv")" ] ||
  fail "the emulated link changed the training"

echo "== K-FAC and FOSI under DASO (every optimizer runs on it)"
for opt in "kfac" "fosi-momentum --k 3 --warmup-w 5 --num-iters-to-approx-eigs 8"; do
  # shellcheck disable=SC2086 # the optimizer's flags are words
  "$mpiexec" -n 2 "$@" "$train" "${common[@]}" --epochs 1 --optimizer $opt --dist-strategy daso \
    --ranks-per-node 1 --daso-fixed-skips 2,1,1 > "$work/opt.log" 2>&1 ||
    fail "--optimizer $opt with DASO failed: $(cat "$work/opt.log")"
  grep -q "daso skips 2/1/1" "$work/opt.log" || fail "no DASO epoch with $opt: $(cat "$work/opt.log")"
done

echo "== flag errors"
expect_error() { # expect_error TEXT ARGS...: the run fails and prints TEXT
  local text=$1
  shift
  if "$mpiexec" -n 2 "$@" > "$work/err.log" 2>&1; then
    fail "succeeded: $*"
  fi
  grep -q -- "$text" "$work/err.log" || fail "expected '$text' from $*: $(cat "$work/err.log")"
}
expect_error "needs --dist-strategy daso" "$@" "$train" "${args[@]}" --daso-patience 3
expect_error "needs --ranks-per-node G > 0" "$@" "$train" "${args[@]}" \
  --emulate-internode-latency 1e-5
expect_error "must be 0 with --dist-strategy daso" "$@" "$train" "${args[@]}" \
  --dist-strategy daso --checkpoint-dir "$work/ck" --checkpoint-every 5
expect_error "daso-fixed-skips must be global_skip,local_skip,batches_to_wait" "$@" "$train" \
  "${args[@]}" --dist-strategy daso --daso-fixed-skips 2,0,1
echo "OK"
