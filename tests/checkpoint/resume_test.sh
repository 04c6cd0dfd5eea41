#!/usr/bin/env bash
# kat_train's checkpoints end to end: a run resumed from any checkpoint, or after being killed
# with SIGKILL at a random moment (during a checkpoint write included), ends with the same
# bytes (parameters, optimizer state, data position, counters) as a run never stopped.
#
#   resume_test.sh KAT_TRAIN DATA_DIR OPTIMIZER [kat_train flags...]
set -euo pipefail
train=$1 data=$2 optimizer=$3
shift 3
work=$(mktemp -d /tmp/kat-resume-XXXXXX)
trap 'rm -rf "$work"' EXIT
# 10 steps per epoch, 4 epochs; a cosine schedule with warm-up, so the step counter matters.
args=(--data-dir "$data" --model mlp --optimizer "$optimizer" --train-subset 640
      --batch-size 64 --epochs 4 --schedule cosine --warmup-steps 5 --seed 7 --progress never "$@")
final=checkpoint-000000000040.kat

fail() { echo "FAIL: $*" >&2; exit 1; }
same() { cmp -s "$1" "$2" || fail "$3: $1 and $2 differ"; }

echo "== straight run, a checkpoint every 2 steps, all kept"
t0=$(date +%s%N)
"$train" "${args[@]}" --checkpoint-dir "$work/a" --checkpoint-every 2 --keep-checkpoints 100 \
  > "$work/a.log"
echo "$(ls "$work/a" | grep -c kat) checkpoints in $((($(date +%s%N) - t0) / 1000000)) ms"
[ -f "$work/a/$final" ] || fail "no final checkpoint $final"

echo "== resumed inside epoch 2 (step 12), after epoch 2 (step 20), inside epoch 4 (step 38)"
for step in 000000000012 000000000020 000000000038; do
  rm -rf "$work/b"
  "$train" "${args[@]}" --checkpoint-dir "$work/b" --checkpoint-every 3 \
    --resume "$work/a/checkpoint-$step.kat" > "$work/b.log"
  grep -q "resumed from .*checkpoint-$step.kat" "$work/b.log" || fail "did not resume from $step"
  same "$work/a/$final" "$work/b/$final" "resumed from step $step"
  # The epochs it ran print the same losses and accuracy as the straight run's.
  last=$(grep '^epoch  4' "$work/b.log" | sed 's/.*train loss/train loss/')
  [ "$last" = "$(grep '^epoch  4' "$work/a.log" | sed 's/.*train loss/train loss/')" ] ||
    fail "epoch 4 differs after resuming from $step: $last"
done

echo "== killed with SIGKILL at random moments, resumed from the latest checkpoint each time"
kills=0
RANDOM=2026
newest() { ls "$work/c"/checkpoint-*.kat 2> /dev/null | tail -n 1 || true; }
for attempt in 1 2 3 4 5 6 7 8; do
  before=$(newest)
  resume=()
  if [ -n "$before" ]; then resume=(--resume latest); fi
  "$train" "${args[@]}" --checkpoint-dir "$work/c" --checkpoint-every 1 --keep-checkpoints 2 \
    "${resume[@]}" > "$work/c.log" 2>&1 &
  pid=$!
  # Once it has saved a checkpoint of its own, at a random moment of the next 0-250 ms
  # (about one to five steps here, checkpoint writes included).
  while [ "$(newest)" = "$before" ] && kill -0 "$pid" 2> /dev/null; do sleep 0.01; done
  sleep "$(awk -v ms=$((RANDOM % 250)) 'BEGIN { printf "%.3f", ms / 1000 }')"
  if kill -KILL "$pid" 2> /dev/null; then
    kills=$((kills + 1))
  fi
  { wait "$pid" || true; } 2> /dev/null
  [ -f "$work/c/$final" ] && break
done
# Temporary files a killed writer left are not checkpoints; the newest complete one loads.
"$train" "${args[@]}" --checkpoint-dir "$work/c" --checkpoint-every 1 --keep-checkpoints 2 \
  --resume latest > "$work/c.log"
same "$work/a/$final" "$work/c/$final" "after $kills kills"
[ "$(ls "$work/c" | grep -c '\.tmp-' || true)" = 0 ] || fail "temporary files left: $(ls "$work/c")"

echo "== a corrupt newest checkpoint is an error naming it, not a silent restart"
newest=$(ls "$work/c"/checkpoint-*.kat | tail -1)
# The middle of the file is inside the model's parameters.
printf 'X' | dd of="$newest" bs=1 seek=$(($(stat -c %s "$newest") / 2)) conv=notrunc status=none
if "$train" "${args[@]}" --checkpoint-dir "$work/c" --resume latest > "$work/d.log" 2>&1; then
  fail "a corrupt checkpoint was accepted"
fi
grep -q "$(basename "$newest").*CRC-32" "$work/d.log" || fail "unclear error: $(cat "$work/d.log")"
echo "== another model is refused"
if "$train" "${args[@]/mlp/cnn}" --resume "$work/a/$final" > "$work/e.log" 2>&1; then
  fail "a checkpoint of another model was accepted"
fi
grep -q "written with model mlp, this run has model cnn" "$work/e.log" ||
  fail "unclear error: $(cat "$work/e.log")"
echo "OK ($kills kills)"
