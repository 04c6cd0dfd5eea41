#!/usr/bin/env bash
# kat_train's checkpoints end to end: a run resumed from any checkpoint, or after being killed
# with SIGKILL at a random moment (during a checkpoint write included), ends with the same
# bytes (parameters, optimizer state, data position, counters) as a run never stopped, and its
# --metrics file holds the same rows. With sgd and no extra flags, also the run identity: another
# run's directory is refused, a changed option is refused by name, --epochs may change, pruning
# and --resume latest go by the step stored in the files whatever their names.
#
#   resume_test.sh KAT_TRAIN DATA_DIR OPTIMIZER [kat_train flags...]
#   KAT_RESUME_MODEL=cnn  the model (default mlp)
set -euo pipefail
train=$1 data=$2 optimizer=$3
shift 3
work=$(mktemp -d /tmp/kat-resume-XXXXXX)
trap 'rm -rf "$work"' EXIT
# A small data set: the first 640 training and 1000 test images (fashion_subset.sh says why).
. "$(dirname "$0")/../trainer/fashion_subset.sh"
fashion_subset "$data" "$work/data" 640 1000 || exit 1
data=$work/data
# 10 steps per epoch, 4 epochs; a cosine schedule with warm-up, so the step counter matters.
args=(--data-dir "$data" --model "${KAT_RESUME_MODEL:-mlp}" --optimizer "$optimizer" --train-subset 640
      --batch-size 64 --epochs 4 --schedule cosine --warmup-steps 5 --seed 7 --progress never "$@")
final=checkpoint-000000000040.kat

fail() { echo "FAIL: $*" >&2; exit 1; }
same() { cmp -s "$1" "$2" || fail "$3: $1 and $2 differ"; }
# The state of a checkpoint: its entries, between the metadata (u64 length at byte 24, after
# a 36-byte header; a CRC-32 after it) and the 20-byte footer. A resumed run with another
# --checkpoint-every records that in its metadata, so only the state is the same.
state_of() {
  local m size
  m=$(od -An -tu8 -j24 -N8 "$1" | tr -d ' ')
  size=$(stat -c %s "$1")
  tail -c +$((36 + m + 4 + 1)) "$1" | head -c $((size - 36 - m - 4 - 20))
}
same_state() { cmp -s <(state_of "$1") <(state_of "$2") || fail "$3: the states differ"; }
# Metrics rows without the timing columns: wall_seconds, samples_per_second and any extra column
# that measures time (sparse training's mask_update_s, ...), found by their header.
rows() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) keep[i] = ($i !~ /second|_s$/) }
    { line = ""; for (i = 1; i <= NF; ++i) if (keep[i]) line = line (line == "" ? "" : ",") $i
      print line }' "$1"
}
same_rows() {
  [ "$(rows "$1")" = "$(rows "$2")" ] || fail "$3: metrics differ: $(diff <(rows "$1") <(rows "$2"))"
}

echo "== straight run, a checkpoint every 2 steps, all kept"
t0=$(date +%s%N)
"$train" "${args[@]}" --checkpoint-dir "$work/a" --checkpoint-every 2 --keep-checkpoints 100 \
  --metrics "$work/a.csv" > "$work/a.log"
echo "$(ls "$work/a" | grep -c kat) checkpoints in $((($(date +%s%N) - t0) / 1000000)) ms"
[ -f "$work/a/$final" ] || fail "no final checkpoint $final"

echo "== resumed inside epoch 2 (step 12), after epoch 2 (step 20), inside epoch 4 (step 38)"
for step in 000000000012 000000000020 000000000038; do
  rm -rf "$work/b"
  # The metrics of a run that went on to the end: the resumed run keeps the rows of the epochs
  # before the checkpoint's and writes the others again.
  cp "$work/a.csv" "$work/b.csv"
  "$train" "${args[@]}" --checkpoint-dir "$work/b" --checkpoint-every 3 \
    --resume "$work/a/checkpoint-$step.kat" --metrics "$work/b.csv" > "$work/b.log"
  grep -q "resumed from .*checkpoint-$step.kat" "$work/b.log" || fail "did not resume from $step"
  grep -q "resume: --checkpoint-every changed from 2 to 3" "$work/b.log" ||
    fail "the changed --checkpoint-every is not printed: $(cat "$work/b.log")"
  same_state "$work/a/$final" "$work/b/$final" "resumed from step $step"
  same_rows "$work/a.csv" "$work/b.csv" "resumed from step $step"
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
    --metrics "$work/c.csv" "${resume[@]}" > "$work/c.log" 2>&1 &
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
  --metrics "$work/c.csv" --resume latest > "$work/c.log"
same_state "$work/a/$final" "$work/c/$final" "after $kills kills"
# Every resume appended to the metrics, dropping what the killed run wrote after its checkpoint.
same_rows "$work/a.csv" "$work/c.csv" "after $kills kills"
[ "$(grep -c '^epoch,' "$work/c.csv")" = 1 ] || fail "a second header: $(cat "$work/c.csv")"
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
model=${KAT_RESUME_MODEL:-mlp}
other=$([ "$model" = cnn ] && echo mlp || echo cnn)
others=("${args[@]}")
others[3]=$other # args[2] is --model
[ "${others[2]}" = --model ] || fail "resume_test.sh: args changed; --model is not args[2]"
if "$train" "${others[@]}" --resume "$work/a/$final" > "$work/e.log" 2>&1; then
  fail "a checkpoint of another model was accepted"
fi
grep -q "run [0-9a-f]* was started with other options: --model was $model, this run has $other" \
  "$work/e.log" || fail "unclear error: $(cat "$work/e.log")"

echo "== files that are not checkpoints are refused before they are read"
expect_error() { # expect_error TEXT ARGS...: kat_train ARGS fails with TEXT
  local text=$1
  shift
  if "$train" "$@" > "$work/f.log" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$text" "$work/f.log" || fail "unclear error for $*: $(cat "$work/f.log")"
}
expect_error '"/dev/zero"): not a regular file' "${args[@]}" --resume /dev/zero
expect_error "not a regular file (it is a directory)" "${args[@]}" --resume "$work/a"
head -c 3000000 /dev/zero | tr '\0' 'x' > "$work/garbage.kat"
expect_error "not a KAT checkpoint" "${args[@]}" --resume "$work/garbage.kat"

if [ "$optimizer" != sgd ] || [ $# -gt 0 ]; then
  echo "OK ($kills kills)"
  exit 0
fi
# The run identity, once (with sgd): epochs of 10 steps, a checkpoint every 2; each call
# below gives --train-subset, --epochs and --lr itself.
one=(--data-dir "$data" --model mlp --optimizer sgd --batch-size 64 --schedule cosine
     --warmup-steps 5 --seed 7 --progress never --checkpoint-every 2)
run_id() { sed -n 's/^run \([0-9a-f]*\).*/\1/p' "$1"; }

echo "== a new run refuses a directory holding another run's checkpoints"
"$train" "${one[@]}" --train-subset 640 --epochs 1 --lr 0.05 --checkpoint-dir "$work/p" \
  --keep-checkpoints 100 --metrics "$work/p.jsonl" > "$work/p.log"
first=$(run_id "$work/p.log")
[ -n "$first" ] || fail "no run id printed: $(cat "$work/p.log")"
files=$(ls "$work/p")
expect_error "--checkpoint-dir $work/p holds 5 checkpoint(s) of another run (run $first" \
  "${one[@]}" --train-subset 640 --epochs 1 --lr 0.05 --checkpoint-dir "$work/p"
grep -q -- "--overwrite-checkpoints to delete them" "$work/f.log" || fail "no way out named"
[ "$(ls "$work/p")" = "$files" ] || fail "the refused run changed $work/p: $(ls "$work/p")"

echo "== a changed option is refused by name, with both values"
expect_error "run $first was started with other options: --lr was 0.05, this run has 0.1" \
  "${one[@]}" --train-subset 640 --epochs 1 --lr 0.1 --checkpoint-dir "$work/p" --resume latest
expect_error "--train-subset was 640, this run has 320" \
  "${one[@]}" --train-subset 320 --epochs 1 --lr 0.05 --checkpoint-dir "$work/p" --resume latest

echo "== names that lie: --resume latest and pruning go by the step stored in the files"
# The checkpoint of step 2 takes a name beyond every other: by name it would be the latest.
mv "$work/p/checkpoint-000000000002.kat" "$work/p/checkpoint-000000099999.kat"
"$train" "${one[@]}" --train-subset 640 --epochs 2 --lr 0.05 --checkpoint-dir "$work/p" \
  --resume latest --keep-checkpoints 2 --metrics "$work/p.jsonl" > "$work/q.log"
grep -q "resumed from $work/p/checkpoint-000000000010.kat: step 10, epoch 2" "$work/q.log" ||
  fail "not resumed from the newest stored step: $(cat "$work/q.log")"
grep -q "^run $first (resumed)" "$work/q.log" || fail "the run id changed: $(cat "$work/q.log")"
grep -q "resume: --epochs changed from 1 to 2" "$work/q.log" ||
  fail "the changed --epochs is not printed: $(cat "$work/q.log")"
[ "$(ls "$work/p")" = "$(printf 'checkpoint-000000000018.kat\ncheckpoint-000000000020.kat')" ] ||
  fail "pruned by name, not by stored step: $(ls "$work/p")"
# JSON lines appended: epoch 1's line of the first run, epoch 2's of the resumed one.
[ "$(cut -d, -f1 "$work/p.jsonl" | tr '\n' ' ')" = '{"epoch": 1 {"epoch": 2 ' ] ||
  fail "metrics not appended: $(cat "$work/p.jsonl")"

echo "== --overwrite-checkpoints deletes the other run's checkpoints"
"$train" "${one[@]}" --train-subset 640 --epochs 1 --lr 0.05 --checkpoint-dir "$work/p" \
  --overwrite-checkpoints > "$work/r.log"
second=$(run_id "$work/r.log")
grep -q "deleted 2 checkpoint(s) of other runs" "$work/r.log" || fail "$(cat "$work/r.log")"
[ "$second" != "$first" ] || fail "a new run has the old run id $first"
for f in "$work/p"/*.kat; do
  grep -aq "run=$second$" "$f" || fail "$f is not run $second's"
done
echo "OK ($kills kills)"
