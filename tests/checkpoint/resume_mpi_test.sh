#!/usr/bin/env bash
# kat_train's checkpoints with distributed K-FAC and DHO2 on 2 ranks: for every strategy, a run
# resumed from a checkpoint inside an epoch ends with the same bytes on every rank as a run
# never stopped; a different rank count is refused with a clear error.
#
#   resume_mpi_test.sh KAT_TRAIN DATA_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
train=$1 data=$2 mpiexec=$3
shift 3
launch=("$mpiexec" -n 2 "$@")
work=$(mktemp -d /tmp/kat-resume-mpi-XXXXXX)
trap 'rm -rf "$work"' EXIT
# A small data set: the first 640 training and 1000 test images (fashion_subset.sh says why).
. "$(dirname "$0")/../trainer/fashion_subset.sh"
fashion_subset "$data" "$work/data" 640 1000 || exit 1
data=$work/data
base=(--data-dir "$data" --model mlp --train-subset 640 --batch-size 64
      --schedule cosine --warmup-steps 5 --seed 7 --progress never)
kfac=(--optimizer kfac --factor-update-steps 2 --inv-update-steps 6)
# DHO2: curvature refreshes on steps 4, 10, 16, ..., between checkpoints.
dho2=(--optimizer fosi-momentum --k 3 --warmup-w 4 --num-iters-to-approx-eigs 6)
fail() { echo "FAIL: $*" >&2; exit 1; }

for strategy in dkfac dp-kfac kaisa dho2; do
  if [ "$strategy" = dho2 ]; then
    args=("${base[@]}" "${dho2[@]}" --epochs 3)
  else
    args=("${base[@]}" "${kfac[@]}" --epochs 3)
  fi
  echo "== $strategy: straight run, a checkpoint every 2 steps"
  "${launch[@]}" "$train" "${args[@]}" --dist-strategy "$strategy" --checkpoint-dir "$work/a" \
    --checkpoint-every 2 --keep-checkpoints 100 > "$work/a.log"
  echo "== $strategy: resumed from step 14 (inside epoch 2, between second-order updates)"
  rm -rf "$work/b" && mkdir -p "$work/b"
  cp "$work"/a/checkpoint-000000000014.rank*-of-2.kat "$work/b/"
  # The same --keep-checkpoints: the files' metadata record it, and the files are compared whole.
  "${launch[@]}" "$train" "${args[@]}" --dist-strategy "$strategy" --checkpoint-dir "$work/b" \
    --checkpoint-every 2 --keep-checkpoints 100 --resume latest > "$work/b.log"
  grep -q "resumed from .*checkpoint-000000000014.rank0-of-2.kat" "$work/b.log" ||
    fail "$strategy did not resume from step 14: $(cat "$work/b.log")"
  for rank in 0 1; do
    f=checkpoint-000000000030.rank$rank-of-2.kat
    cmp -s "$work/a/$f" "$work/b/$f" || fail "$strategy: rank $rank's final state differs"
  done
  rm -rf "$work/a" "$work/b"
done

echo "== one rank cannot resume a 2-rank run"
args=("${base[@]}" "${kfac[@]}" --epochs 3)
mkdir -p "$work/c"
"${launch[@]}" "$train" "${base[@]}" "${kfac[@]}" --epochs 1 --dist-strategy kaisa \
  --checkpoint-dir "$work/c" > /dev/null
if "$train" "${args[@]}" --checkpoint-dir "$work/c" --resume latest > "$work/c.log" 2>&1; then
  fail "a 2-rank checkpoint was resumed on one rank"
fi
grep -q "no checkpoint for 1 rank(s).*holds checkpoints of 2 rank(s)" "$work/c.log" ||
  fail "unclear error: $(cat "$work/c.log")"
echo OK
