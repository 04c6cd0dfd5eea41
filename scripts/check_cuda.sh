#!/usr/bin/env bash
# Compile-and-link check of KAT for CUDA: builds every public header, test, example and
# benchmark with nvcc (Debian's CUDA 11.8 toolkit) against Kokkos 3.4.1 built with the CUDA
# backend (sm_80) and Kokkos Kernels with cuBLAS, with MPI and cuSOLVER enabled.
# Needs no GPU and runs no kernel: the tests are built, not discovered or run.
#
# Stages, each timed:
#   install   scripts/setup.sh, then nvidia-cuda-toolkit and g++-11 (nvcc 11.8 refuses g++ 12)
#             from the contrib/non-free components of the machine's own Debian sources,
#             through a private apt configuration (the system's apt setup is not changed)
#   kokkos    scripts/build_kokkos.sh cuda (cached in $KAT_DEPS_DIR, default ~/.cache/kat)
#   headers   one translation unit per public header, compiled (device code included)
#   build     every test source, example and benchmark, compiled and linked
# Builds into build/check-cuda.
#   KAT_JOBS   parallel build jobs (default: nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Debian's toolkit only: another CUDA installation on PATH or in the compiler's search
# variables would be picked up instead of (or mixed with) /usr/bin/nvcc.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset CUDA_HOME CUDA_PATH CUDA_ROOT CUDA_BIN_PATH CUDAToolkit_ROOT CUDACXX NVCC_PREPEND_FLAGS \
  NVCC_APPEND_FLAGS LIBRARY_PATH LD_LIBRARY_PATH CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH
# nvcc 11.8 refuses g++ 12. Debian's nvcc finds g++-11 through its own g++ wrapper; this makes
# Kokkos's nvcc_wrapper use g++-11 also for the steps it runs without nvcc (linking).
export NVCC_WRAPPER_DEFAULT_COMPILER=g++-11
export KAT_DEPS_DIR=${KAT_DEPS_DIR:-$HOME/.cache/kat}
export KAT_JOBS=${KAT_JOBS:-$(nproc)}
build=$root/build/check-cuda
mkdir -p "$build"

start=$(date +%s)
stage=""
stage_start=0
times=""
begin() {
  stage=$1
  stage_start=$(date +%s)
  echo "== check_cuda: $stage"
}
end() {
  local t=$(($(date +%s) - stage_start))
  times="${times:+$times, }$stage ${t}s"
  echo "== check_cuda: $stage took ${t}s"
}
apt_dir=""
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
on_exit() {
  local rc=$?
  if [ -n "$apt_dir" ]; then
    $sudo rm -rf "$apt_dir"
  fi
  if [ "$rc" -ne 0 ]; then
    echo "== check_cuda: FAILED in stage '$stage' (exit $rc; ${times:-no stage completed})" >&2
  fi
}
trap on_exit EXIT
# Runs a build step with its output in a log; on failure shows the first compiler error and
# the end of the log.
logged() {
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    local first
    first=$(grep -n -m 1 -E '(error|Error)[: ]' "$log" | cut -d: -f1 || true)
    if [ -n "$first" ]; then
      echo "-- first error in $log (line $first):" >&2
      sed -n "$((first > 10 ? first - 10 : 1)),$((first + 60))p" "$log" >&2
    fi
    echo "-- last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}

begin install
"$root/scripts/setup.sh"
toolkit=(nvidia-cuda-toolkit g++-11)
missing=()
for p in "${toolkit[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "check_cuda: installing ${missing[*]} (about 1.6 GB to download)"
  apt_dir=$(mktemp -d "$root/build/apt.XXXXXX")
  # shellcheck source=lib/private_apt.sh
  . "$root/scripts/lib/private_apt.sh"
  kat_private_apt "$apt_dir" deb "main contrib non-free"
  $sudo apt-get "${kat_apt_opts[@]}" update
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get "${kat_apt_opts[@]}" install -y \
    --no-install-recommends "${missing[@]}" >/dev/null
  $sudo rm -rf "$apt_dir"
  apt_dir=""
fi
echo "check_cuda: using $(command -v nvcc)"
nvcc --version
end install

begin kokkos
prefix=$("$root/scripts/build_kokkos.sh" cuda | tail -n 1)
echo "check_cuda: Kokkos (CUDA) in $prefix"
end kokkos

begin headers
# Compile only: without a GPU the test binary cannot run, so ctest's test discovery is off.
logged "$build/configure.log" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DCMAKE_PREFIX_PATH="$prefix" \
  -DKAT_ENABLE_TESTS=ON -DKAT_ENABLE_EXAMPLES=ON -DKAT_ENABLE_BENCHMARKS=ON \
  -DKAT_ENABLE_MPI=ON -DKAT_ENABLE_CUSOLVER=ON -DKAT_DISCOVER_TESTS=OFF
logged "$build/headers.log" cmake --build "$build" -j "$KAT_JOBS" --target kat_header_check
echo "check_cuda: $(find "$build" -path '*kat_header_check.dir*' -name '*.o' | wc -l) header" \
  "translation units compiled"
end headers

begin build
logged "$build/build.log" cmake --build "$build" -j "$KAT_JOBS"
end build

stage=""
echo "== check_cuda: OK in $(($(date +%s) - start))s ($times): headers, tests, examples and" \
  "benchmarks compile and link with nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
