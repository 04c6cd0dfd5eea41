#!/usr/bin/env bash
# Builds KAT's fuzz targets (fuzz/, docs/fuzzing.md) with clang's libFuzzer under
# AddressSanitizer + UndefinedBehaviorSanitizer against Debian's Serial Kokkos, runs each for a
# bounded time from its seeds (fuzz/corpus/<target>), and prints per target the executions,
# executions per second, the corpus it ended with, and the crashes. Exits 1 if any target
# found a crash, a leak, undefined behaviour, an input that ran over 10 s or a broken property
# (a "finding:" line); the input is saved under build/fuzz/artifacts/<target>/.
#   KAT_FUZZ_SECONDS=60             seconds per target
#   KAT_FUZZ_TARGETS="idx checkpoint plan"   which targets
#   KAT_JOBS=N                      targets run at once (default: nproc)
#   KAT_FUZZ_CORPUS=DIR             keep each target's corpus in DIR/<target> across runs
#                                   (default: build/fuzz/corpus, emptied every run)
# Reproduce a saved input: build/fuzz/fuzz_<target> FILE (runs it once, prints the report).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
"$root/scripts/setup.sh"
# clang and its compiler runtime (libFuzzer and the sanitizers' libraries), which clang-14's
# libclang-common-14-dev only recommends: --no-install-recommends would leave it out.
mapfile -t missing < <(kat_missing clang libclang-rt-14-dev)
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  kat_apt_install -- "${missing[@]}"
fi

seconds=${KAT_FUZZ_SECONDS:-60}
targets=${KAT_FUZZ_TARGETS:-idx checkpoint plan}
[[ $seconds =~ ^[1-9][0-9]*$ ]] ||
  { echo "fuzz.sh: KAT_FUZZ_SECONDS must be a positive whole number, got '$seconds'" >&2; exit 2; }
build=$root/build/fuzz
# The largest input each target tries: a few times its largest seed (IDX and checkpoint
# seeds are under 600 bytes, the plans under 8 KB).
declare -A max_len=([idx]=4096 [checkpoint]=4096 [plan]=16384)
for t in $targets; do
  [ -n "${max_len[$t]:-}" ] ||
    { echo "fuzz.sh: unknown target '$t' (idx | checkpoint | plan)" >&2; exit 2; }
done

kat_stage "fuzz: configure" "$build/configure.log" \
  cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None
build_targets=()
for t in $targets; do build_targets+=("fuzz_$t"); done
kat_stage "fuzz: build ${build_targets[*]}" "$build/build.log" \
  cmake --build "$build" -j "$(nproc)" --target "${build_targets[@]}"

# Leaks are findings too (libFuzzer's -detect_leaks, on by default); undefined behaviour
# aborts (the targets are built with -fno-sanitize-recover=all).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One target per core at a time (libFuzzer runs a target in one process on one core): with
# two cores the three targets take 120 s instead of 180 s, each still fuzzed for its full time.
jobs=${KAT_JOBS:-$(nproc)}
# corpus_of TARGET: the folder its new inputs go to.
corpus_of() { echo "${KAT_FUZZ_CORPUS:-$build/corpus}/$1"; }
# fuzz_one TARGET: runs it; its exit status goes to build/fuzz/fuzz_TARGET.rc.
fuzz_one() {
  local t=$1 corpus artifacts rc=0
  corpus=$(corpus_of "$t")
  # Kept across runs only in KAT_FUZZ_CORPUS.
  [ -n "${KAT_FUZZ_CORPUS:-}" ] || rm -rf "$corpus"
  artifacts=$build/artifacts/$t
  rm -rf "$artifacts"
  mkdir -p "$corpus" "$artifacts"
  # New inputs go to the first folder; the seeds in the second are only read.
  "$build/fuzz_$t" -max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "$corpus" "$root/fuzz/corpus/$t" >"$build/fuzz_$t.log" 2>&1 || rc=$?
  echo "$rc" >"$build/fuzz_$t.rc"
}
start=$SECONDS
running=0
for t in $targets; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  echo "== fuzz: $t for $seconds s (max_len ${max_len[$t]}; log: $build/fuzz_$t.log)"
  rm -f "$build/fuzz_$t.rc"
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
echo "   all targets: $((SECONDS - start)) s on $jobs cores"

failed=()
rows=()
for t in $targets; do
  corpus=$(corpus_of "$t")
  artifacts=$build/artifacts/$t
  log=$build/fuzz_$t.log
  rc=$(cat "$build/fuzz_$t.rc" 2>/dev/null || echo "no exit status")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  # libFuzzer's last status line, "#N DONE cov: C ft: F corp: FILES/BYTES ...".
  status=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[bKM]*\).*/\1/p' <<<"$status")
  counts=$(grep -E "^fuzz_$t: accepted" "$log" | tail -n 1 | sed "s/^fuzz_$t: //" || true)
  crashes=$(find "$artifacts" -type f | wc -l)
  echo "   $t: ${runs:-?} executions, ${rate:-?} exec/s, corpus" \
    "${corp:-?} (files/bytes; $(find "$corpus" -type f | wc -l) new files saved), coverage" \
    "${cov:-?} edges, ${counts:-no counts}, crashes $crashes"
  rows+=("$(printf '%-11s %10s %8s %14s %6s %8s' "$t" "${runs:-?}" "${rate:-?}" "${corp:-?}" \
    "${cov:-?}" "$crashes")")
  if [ "$rc" != 0 ] || [ "$crashes" -ne 0 ]; then
    failed+=("$t")
    echo "== fuzz: $t FAILED (exit $rc); the report:" >&2
    grep -E -A 30 'ERROR: |runtime error|finding: |==[0-9]+== ?ERROR|Test unit written' "$log" |
      head -n 60 >&2 || tail -n 40 "$log" >&2
    find "$artifacts" -type f -exec echo "   input saved: {}" \; >&2
  fi
done
printf '%-11s %10s %8s %14s %6s %8s\n' target executions exec/s corpus cov crashes
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
  echo "fuzz.sh: findings in ${failed[*]} (reproduce: build/fuzz/fuzz_<target> <saved input>)" >&2
  exit 1
fi
