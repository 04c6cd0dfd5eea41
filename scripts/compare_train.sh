#!/usr/bin/env bash
# Same-run comparison of two kat_train builds: runs them alternately, ROUNDS times each, with
# the same flags, and prints every run's per-epoch wall time and final test accuracy, then the
# median epoch time per build (epoch 1 excluded: it pays the first-touch allocations).
#   scripts/compare_train.sh OLD_KAT_TRAIN NEW_KAT_TRAIN [kat_train flags...]
#   ROUNDS=3 (default)
# Build a commit's kat_train with:
#   git worktree add /tmp/old COMMIT && cmake -S /tmp/old -B /tmp/old/build \
#     -DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_EXAMPLES=ON && cmake --build /tmp/old/build --target kat_train
set -euo pipefail
old=$1 new=$2
shift 2
rounds=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    "$bin" --progress never --metrics "$tmp/$which-$r.csv" "$@" >/dev/null
    awk -F, -v w="$which" -v r="$r" 'NR > 1 { t = t sprintf(" %.3f", $2); acc = $6 }
      END { printf "%s run %d: epoch seconds%s; test accuracy %.2f%%\n", w, r, t, 100 * acc }' \
      "$tmp/$which-$r.csv"
  done
done
for which in old new; do
  awk -F, 'FNR > 2 { print $2 }' "$tmp/$which"-*.csv | sort -n |
    awk -v w="$which" '{ v[NR] = $1 } END { printf "%s: median epoch %.3f s over %d epochs\n", w, v[int((NR + 1) / 2)], NR }'
done
