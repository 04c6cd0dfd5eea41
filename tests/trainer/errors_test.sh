#!/usr/bin/env bash
# Every failure of kat_train ends as "kat_train: error: ..." (exit 1) or as a usage error
# (exit 2), never as an abort: whatever threw, Kokkos included, and whichever phase it was in.
#
#   errors_test.sh KAT_TRAIN DATA_DIR
set -uo pipefail
train=$1 data=$2
work=$(mktemp -d /tmp/kat-errors-XXXXXX)
trap 'rm -rf "$work"' EXIT
base=(--data-dir "$data" --train-subset 256 --batch-size 64 --epochs 1 --progress never)
failed=0

# expect CODE TEXT ARGS...: kat_train ARGS exits with CODE and prints TEXT on stderr.
expect() {
  local code=$1 text=$2
  shift 2
  "$train" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" "$work/err"; then
    echo "FAIL: kat_train $* exited $rc (expected $code) with:" >&2
    tail -n 5 "$work/err" >&2
    failed=1
  else
    echo "ok: exit $rc: $(grep -F -- "$text" "$work/err" | head -n 1)"
  fi
}

# A std::exception from Kokkos's own argument parsing, after the flags were accepted.
expect 1 "kat_train: error:" "${base[@]}" --kokkos-threads=abc
# A directory as the checkpoint to resume from: the stream fails to read it.
mkdir "$work/dir"
expect 1 "kat_train: error:" "${base[@]}" --resume "$work/dir"
# A kat::Error from the data loader: no data set there.
expect 1 "kat_train: error:" --data-dir "$work/dir" --epochs 1
# Usage errors: exit 2, the flag named.
expect 2 "--vit-depth" "${base[@]}" --model mlp --vit-depth 2
expect 2 "--damping" "${base[@]}" --optimizer sgd --damping 0.1
expect 2 "--resume latest" "${base[@]}" --resume latest
# Negative and out-of-range integers are refused, never wrapped to huge unsigned numbers.
expect 2 "--seed: must be an integer in [0, 9223372036854775807], got -1" "${base[@]}" --seed -1
expect 2 "--vit-mlp: must be an integer in [0, 1048576], got 3000000000" "${base[@]}" --model vit \
  --vit-mlp 3000000000
expect 2 "Could not convert: --epochs = abc" --data-dir "$data" --epochs abc
expect 1 "option --l must be an integer >= 0, got -1" "${base[@]}" --optimizer fosi-momentum \
  --l -1
exit $failed
