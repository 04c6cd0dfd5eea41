#!/usr/bin/env bash
# Every failure of kat_train ends as "kat_train: error: ..." (exit 1) or as a usage error
# (exit 2), never as an abort: whatever threw, Kokkos included, and whichever phase it was in.
#
#   errors_test.sh KAT_TRAIN DATA_DIR
set -uo pipefail
train=$1 data=$2
work=$(mktemp -d /tmp/kat-errors-XXXXXX)
trap 'rm -rf "$work"' EXIT
# A small data set: the first 256 training and 500 test images (fashion_subset.sh says why).
. "$(dirname "$0")/fashion_subset.sh"
fashion_subset "$data" "$work/data" 256 500 || exit 1
data=$work/data
base=(--data-dir "$data" --train-subset 256 --batch-size 64 --epochs 1 --progress never)
failed=0

# expect CODE TEXT ARGS...: kat_train ARGS exits with CODE and prints TEXT on stderr.
expect() {
  local code=$1 text=$2
  shift 2
  local to=${stdout_to:-$work/out}
  "$train" "$@" >"$to" 2>"$work/err"
  local rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" "$work/err"; then
    echo "FAIL: kat_train $* ${stdout_to:+>$stdout_to }exited $rc (expected $code) with:" >&2
    tail -n 5 "$work/err" >&2
    failed=1
  else
    echo "ok: exit $rc: $(grep -F -- "$text" "$work/err" | head -n 1)"
  fi
}

# A std::exception from Kokkos's own argument parsing, after the flags were accepted: the
# flag named, not only the standard library's "stoi".
expect 1 "kat_train: error: Kokkos cannot read its flags (--kokkos-threads=abc)" "${base[@]}" \
  --kokkos-threads=abc
# A directory as the checkpoint to resume from: the stream fails to read it.
mkdir "$work/dir"
expect 1 "kat_train: error:" "${base[@]}" --resume "$work/dir"
# A kat::Error from the data loader: no data set there.
expect 1 "kat_train: error:" --data-dir "$work/dir" --epochs 1
# Usage errors: exit 2, the flag named.
expect 2 "--vit-depth" "${base[@]}" --model mlp --vit-depth 2
expect 2 "--conv-backend: applies to the models with convolutions (--model cnn or resnet), not \
--model vit" "${base[@]}" --model vit --conv-backend im2col
expect 2 "--damping" "${base[@]}" --optimizer sgd --damping 0.1
expect 2 "--resume latest" "${base[@]}" --resume latest
expect 2 "--precision: fp16 not in {fp32,bf16}" "${base[@]}" --precision fp16
expect 2 "--denormals: ftz not in {flush,keep}" "${base[@]}" --denormals ftz
# Negative and out-of-range integers are refused, never wrapped to huge unsigned numbers.
expect 2 "--seed: must be an integer in [0, 9223372036854775807], got -1" "${base[@]}" --seed -1
expect 2 "--vit-mlp: must be an integer in [0, 1048576], got 3000000000" "${base[@]}" --model vit \
  --vit-mlp 3000000000
expect 2 "Could not convert: --epochs = abc" --data-dir "$data" --epochs abc
expect 2 "--l: must be an integer >= 0, got '-1'" "${base[@]}" --optimizer fosi-momentum --l -1

# writes and flags (issue 33)
# expect_full CODE TEXT ARGS...: as expect, with stdout on /dev/full (every write fails).
expect_full() { stdout_to=/dev/full expect "$@"; }
# A metrics file that takes no byte (a link to /dev/full): an error naming it, not an empty
# file and exit 0.
ln -s /dev/full "$work/full.csv"
expect 1 "writing '$work/full.csv': No space left on device" "${base[@]}" --metrics \
  "$work/full.csv"
ln -s /dev/full "$work/full.jsonl" # no header: the first epoch's line fails
expect 1 "writing '$work/full.jsonl': No space left on device" "${base[@]}" --metrics \
  "$work/full.jsonl"
# The report on stdout lost: exit 1, the reason on stderr.
expect_full 1 "kat_train: error: writing standard output: No space left on device" "${base[@]}"
expect_full 1 "kat_train: error: writing standard output: No space left on device" --help
# Flags that need another.
expect 2 "--checkpoint-every: needs --checkpoint-dir" "${base[@]}" --checkpoint-every 5
expect 2 "--keep-checkpoints: needs --checkpoint-dir" "${base[@]}" --keep-checkpoints 2
"$train" --help >"$work/help" # a file, not a pipe: grep -q would end kat_train with SIGPIPE
if grep -qF "needs a build with -DKAT_ENABLE_MPI=ON" "$work/help"; then
  expect 2 "--tensor-parallel: needs MPI, and this kat_train was built without it" \
    "${base[@]}" --model vit --tensor-parallel 2
fi
# Registered options outside their ranges: usage errors at parsing, the range named, and
# --help prints the range.
expect 2 "--sparsity: must be a number in [0, 1), got '-0.1'" "${base[@]}" --sparsity -0.1
expect 2 "--sparsity: must be a number in [0, 1), got '1.5'" "${base[@]}" --sparsity 1.5
expect 2 "--delta-t: must be an integer >= 1, got '0'" "${base[@]}" --sparsity 0.5 --delta-t 0
# Mask-update options with static masks would do nothing: refused, not ignored.
expect 2 "--drop-fraction: applies to the mask updates of --sparse-method set or rigl, not static" \
  "${base[@]}" --sparsity 0.5 --sparse-method static --drop-fraction 0.2
expect 2 "--t-end: applies to the mask updates" "${base[@]}" --sparsity 0.5 --sparse-method static \
  --t-end 0.5
expect 2 "--damping: must be a number > 0, got '0'" "${base[@]}" --optimizer kfac --damping 0
expect 2 "--factor-decay: must be a number in [0, 1), got '1'" "${base[@]}" --optimizer kfac \
  --factor-decay 1
expect 2 "--kl-clip: must be a number >= 0, got '-1'" "${base[@]}" --optimizer kfac --kl-clip -1
expect 2 "--factor-update-steps: must be an integer >= 1, got '0'" "${base[@]}" --optimizer kfac \
  --factor-update-steps 0
expect 2 "--k: must be an integer >= 1, got '0'" "${base[@]}" --optimizer fosi-momentum --k 0
expect 2 "--alpha: must be a number >= 0, got 'x'" "${base[@]}" --optimizer fosi-momentum \
  --alpha x
for range in "Damping (Tikhonov regularization) (a number > 0)" \
  "(a number in [0, 1))" "(an integer >= 1)"; do
  if ! grep -qF -- "$range" "$work/help"; then
    echo "FAIL: kat_train --help does not print '$range'" >&2
    failed=1
  fi
done
# FOSI's curvature state beyond the machine's memory is refused with the numbers, before any
# of it is allocated (V alone would be 129 GB on the MLP's 269322 parameters).
expect 1 "k = 60000, l = 0 with m = 240000 Lanczos iterations on n = 269322 parameters" \
  "${base[@]}" --optimizer fosi-momentum --k 60000

# data input (issue 33)
printf 'x' >"$work/regular"
expect 1 "'$work/regular' is not a directory (it is a regular file)" --data-dir "$work/regular" \
  --epochs 1
mkdir "$work/fifo-data"
mkfifo "$work/fifo-data/train-labels-idx1-ubyte.gz"
expect 1 "train-labels-idx1-ubyte.gz' is not a regular file (it is a FIFO)" \
  --data-dir "$work/fifo-data" --epochs 1
mkdir "$work/swapped"
printf '\0\0\10\3\0\0\0\1\0\0\0\1\0\0\0\1\0' >"$work/swapped/train-images-idx3-ubyte"
cp "$work/swapped/train-images-idx3-ubyte" "$work/swapped/train-labels-idx1-ubyte"
expect 1 "is an images file (magic 0x00000803), expected labels (magic 0x00000801)" \
  --data-dir "$work/swapped" --epochs 1
mkdir "$work/liar"
printf '\0\0\10\1\0\0\0\1\0' >"$work/liar/train-labels-idx1-ubyte"
printf '\0\0\10\3\0\0\352\140\0\0\0\34\0\0\0\34' >"$work/liar/train-images-idx3-ubyte"
expect 1 "claims 60000 x 28 x 28 = 47040000 data bytes (47040016 bytes with its 16-byte header), the file holds 16 bytes" \
  --data-dir "$work/liar" --epochs 1
# The base optimizers' options have ranges too.
expect 2 "--lr: must be a number >= 0, got '-0.1'" "${base[@]}" --lr -0.1
expect 2 "--momentum: must be a number in [0, 1), got '1'" "${base[@]}" --momentum 1
expect 2 "--weight-decay: must be a number >= 0, got '-1'" "${base[@]}" --optimizer adam \
  --weight-decay -1
exit $failed
