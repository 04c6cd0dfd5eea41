#!/usr/bin/env bash
# Regenerates the fuzz targets' seed files, fuzz/corpus/{idx,checkpoint,plan}, with KAT's own
# writers (fuzz/make_corpus.cpp: write_idx, save_checkpoint, write_plan) and gzips a copy of
# every IDX seed (gzip -n: no name or time stamp, so the bytes depend on the content only).
# The plans hold their search's time in seconds, so they change a little on every run.
#   fuzz/make_corpus.sh [BUILD]   BUILD: the fuzz build folder (default build/fuzz)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/fuzz}
[ -f "$build/CMakeCache.txt" ] ||
  cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None >/dev/null
cmake --build "$build" --target make_corpus -j "$(nproc)" >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/idx" "$out/checkpoint" "$out/plan"
"$build/make_corpus" "$out"
for f in "$out"/idx/*.idx; do
  gzip -9 -n -c "$f" >"$f.gz"
done
for target in idx checkpoint plan; do
  rm -rf "$root/fuzz/corpus/$target"
  mkdir -p "$root/fuzz/corpus/$target"
  cp "$out/$target"/* "$root/fuzz/corpus/$target/"
  echo "fuzz/corpus/$target: $(find "$root/fuzz/corpus/$target" -type f | wc -l) files," \
    "$(cat "$root/fuzz/corpus/$target"/* | wc -c) bytes"
done
