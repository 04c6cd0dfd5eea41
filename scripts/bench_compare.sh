#!/usr/bin/env bash
# Same-run comparison of two commits: builds the benchmarks of BASE and of HEAD (default: the
# checked-out HEAD) in git worktrees under build/compare/, then runs them alternately, BASE
# then HEAD, KAT_ROUNDS times, so both see the same machine state, and prints for every
# benchmark the minimum and the median time of each commit and the ratios HEAD / BASE. On a
# shared machine the minimum is the least disturbed run; report it next to the median.
#
#   scripts/bench_compare.sh BASE [HEAD] [benchmark arguments...]
#   KAT_BACKENDS="serial openmp"   backends (default both)
#   KAT_BENCHES="mlp"              benchmark binaries (default mlp; see scripts/bench.sh)
#   KAT_ROUNDS=3                   alternations (default 3)
# Example: KAT_BENCHES=kfac scripts/bench_compare.sh ce1ad16 HEAD \
#            --benchmark_filter='BM_KFACStep/inverse_precision:float/model:0'
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 1 ] || { echo "usage: scripts/bench_compare.sh BASE [HEAD] [benchmark arguments...]" >&2; exit 2; }
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
base=$(git rev-parse --short "$1")
shift
head=$(git rev-parse --short HEAD)
if [ $# -ge 1 ] && git rev-parse --verify -q "$1^{commit}" >/dev/null; then
  head=$(git rev-parse --short "$1")
  shift
fi
"$root/scripts/setup.sh"
rounds=${KAT_ROUNDS:-3}
out=$root/build/compare
mkdir -p "$out"

# A worktree per commit (reused), its benchmarks built per backend.
build() { # build COMMIT BACKEND -> prints the build directory
  kat_commit_build "$root" "$out" "$1" "$2" "" -DKAT_ENABLE_BENCHMARKS=ON -DKAT_ENABLE_TESTS=OFF \
    -DKAT_ENABLE_EXAMPLES=OFF
}

for backend in ${KAT_BACKENDS:-serial openmp}; do
  env=()
  if [ "$backend" = openmp ]; then
    # OpenBLAS's OpenMP variant shares Kokkos's thread pool; see docs/backends.md.
    env=(LD_LIBRARY_PATH="$("$root/scripts/openmp_blas_dir.sh")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}" OMP_PROC_BIND=false)
  fi
  dir_base=$(build "$base" "$backend")
  dir_head=$(build "$head" "$backend")
  results=$out/$base-$head-$backend.csv
  : >"$results"
  for bench in ${KAT_BENCHES:-mlp}; do
    for round in $(seq "$rounds"); do
      for side in base head; do
        dir=$dir_base commit=$base
        [ "$side" = head ] && dir=$dir_head commit=$head
        echo "== $backend $bench round $round: $commit" >&2
        # CSV: name,iterations,real_time,cpu_time,time_unit,...; the name may hold commas.
        env "${env[@]}" "$dir/bench/kat_bench_$bench" --benchmark_format=csv "$@" 2>/dev/null |
          awk -F'"' -v side="$side" '/^"/ { split($3, f, ","); print side "\t" $2 "\t" f[3] "\t" f[5] }' \
            >>"$results"
      done
    done
  done
  echo "== $backend: $rounds alternating rounds; minimum (the least disturbed run) and median"
  printf '%-64s %11s %11s %11s %11s %7s %7s\n' benchmark "min $base" "min $head" \
    "med $base" "med $head" "min" "med"
  cut -f2 "$results" | awk '!seen[$0]++' | while IFS= read -r name; do
    # stat SIDE: the minimum and the median of SIDE's times for this benchmark
    stat() {
      awk -F'\t' -v s="$1" -v n="$name" '$1 == s && $2 == n { print $3 }' "$results" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print v[1], (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
    }
    read -r bmin bmed <<<"$(stat base)"
    read -r hmin hmed <<<"$(stat head)"
    unit=$(awk -F'\t' -v n="$name" '$2 == n { print $4; exit }' "$results")
    printf '%-64s %9.4g%-2s %9.4g%-2s %9.4g%-2s %9.4g%-2s %7.3f %7.3f\n' "${name:0:64}" \
      "$bmin" "$unit" "$hmin" "$unit" "$bmed" "$unit" "$hmed" "$unit" \
      "$(awk -v b="$bmin" -v h="$hmin" 'BEGIN { print (b > 0 ? h / b : 0) }')" \
      "$(awk -v b="$bmed" -v h="$hmed" 'BEGIN { print (b > 0 ? h / b : 0) }')"
  done
done
