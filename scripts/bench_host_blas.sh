#!/usr/bin/env bash
# Does host speed hinge on OpenBLAS recognizing the CPU? Builds kat_train at BASE and at HEAD
# (git worktrees under build/host-blas/), Serial and OpenMP, and runs, alternately in one
# invocation, one epoch-2 measurement per configuration with OPENBLAS_CORETYPE unset (what
# every user runs) and set to each of KAT_CORETYPES (Prescott: the core Debian's OpenBLAS
# 0.3.21 picks on some Sapphire Rapids; SkylakeX: the right one there), for the MLP with SGD,
# the CNN with SGD and the MLP with K-FAC, plus PyTorch (Debian's python3-torch) on the MLP
# under the same settings. The OpenMP binaries run with nothing but OMP_PROC_BIND=false set: no
# LD_LIBRARY_PATH, so the BLAS they link by default is the one measured.
# Prints each run's epoch-2 seconds, then the median per configuration.
#
#   scripts/bench_host_blas.sh BASE [HEAD]
#   KAT_ROUNDS=3            alternations (default 3)
#   KAT_CORETYPES="Prescott SkylakeX"
#   KAT_WORKLOADS="mlp-sgd cnn-sgd mlp-kfac torch-mlp"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 1 ] || { echo "usage: scripts/bench_host_blas.sh BASE [HEAD]" >&2; exit 2; }
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
"$root/scripts/setup.sh"
base=$(git rev-parse --short "$1")
head=$(git rev-parse --short "${2:-HEAD}")
rounds=${KAT_ROUNDS:-3}
coretypes=(unset ${KAT_CORETYPES:-Prescott SkylakeX})
workloads=${KAT_WORKLOADS:-mlp-sgd cnn-sgd mlp-kfac torch-mlp}
if [[ " $workloads " == *" torch-mlp "* ]]; then
  kat_require_torch
fi
out=$root/build/host-blas
mkdir -p "$out"
data=/usr/share/datasets/fashion-mnist

for commit in "$base" "$head"; do
  for backend in serial openmp; do
    kat_commit_build "$root" "$out" "$commit" "$backend" kat_train -DKAT_ENABLE_TESTS=OFF \
      -DKAT_ENABLE_EXAMPLES=ON >/dev/null
  done
done

echo "KAT $base vs $head, $(date -u +%F), $(nproc) threads"
"$root/scripts/cpu_report.sh"
results=$out/results.txt
: >"$results"
epoch2() { awk -F, 'NR == 3 { print $2 }' "$1"; }
for r in $(seq "$rounds"); do
  for w in $workloads; do
    case $w in
      mlp-sgd) flags=(--model mlp) ;;
      cnn-sgd) flags=(--model cnn --train-subset 12800) ;;
      mlp-kfac) flags=(--model mlp --optimizer kfac) ;;
      torch-mlp) flags=() ;;
      *) echo "unknown workload $w" >&2; exit 2 ;;
    esac
    for ct in "${coretypes[@]}"; do
      cte=()
      [ "$ct" = unset ] || cte=(OPENBLAS_CORETYPE="$ct")
      if [ "$w" = torch-mlp ]; then
        s=$(env "${cte[@]}" /usr/bin/python3 "$root/bench/compare_pytorch.py" --data-dir "$data" \
          --model mlp --epochs 2 --threads "$(nproc)" | awk -F, 'NR == 3 { print $2 }')
        echo "$w torch $ct $s" | tee -a "$results"
        continue
      fi
      for commit in "$base" "$head"; do
        for backend in serial openmp; do
          env OMP_PROC_BIND=false "${cte[@]}" "$out/$commit-$backend/examples/kat_train" \
            "${flags[@]}" --epochs 2 --data-dir "$data" --progress never \
            --metrics "$out/run.csv" >/dev/null
          echo "$w $commit-$backend $ct $(epoch2 "$out/run.csv")" | tee -a "$results"
        done
      done
    done
  done
done
echo "== median epoch-2 seconds"
awk '{ k = $1 " " $2 " " $3; v[k] = v[k] " " $4 } END { for (k in v) print k, v[k] }' "$results" |
  sort | while read -r w c ct rest; do
    printf '%-10s %-16s %-9s %s\n' "$w" "$c" "$ct" "$(tr ' ' '\n' <<<"$rest" | kat_median)"
  done
