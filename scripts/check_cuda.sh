#!/usr/bin/env bash
# Compile-and-link check of KAT for CUDA: builds every public header, test, example and
# benchmark with nvcc (Debian's CUDA 11.8 toolkit) against Kokkos 3.4.1 built with the CUDA
# backend (sm_80; compile only: scripts/gpu_tests.sh builds and runs on Hopper) and Kokkos
# Kernels with cuBLAS, with MPI and
# cuSOLVER enabled. Needs no GPU and runs no kernel: the tests are built, not discovered or run.
#
# Stages, each timed (output in build/check-cuda-<stage>.log):
#   install   scripts/setup.sh, then nvidia-cuda-toolkit and g++-11 (nvcc 11.8 refuses g++ 12)
#             from the contrib/non-free components of the machine's own Debian sources,
#             through a private apt configuration (the system's apt setup is not changed)
#   odr       tests/cuda/extended_lambda_odr/run.sh: nvcc's extended-lambda wrapper crashes or not
#             by link order, a named functor in both orders (host only, why `lambdas` below holds)
#   kokkos    scripts/build_kokkos.sh cuda (cached in $KAT_DEPS_DIR, default ~/.cache/kat)
#   configure KAT in build/check-cuda with that Kokkos's nvcc_wrapper, MPI and cuSOLVER
#   headers   every public header compiled with nvcc (device code included), 40 to a
#             translation unit; each header on its own is g++'s check (scripts/test.sh)
#   build     every test source, example and benchmark, compiled and linked
#   objects   every object compiled (headers, tests, examples, benchmarks) holds sm_80 PTX
#   lambdas   no object holds nvcc's wrapper of an extended lambda defined in a header of KAT
#             or Kokkos (see header_lambdas below)
#   KAT_JOBS   parallel build jobs (default: nproc)
#   KAT_GPU_CHECK_BUILD  what the build stage builds: some of "tests examples benchmarks"
#              (default all three; CI builds the examples and benchmarks,
#              see .ci/run)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
kat_gpu_check_parts >/dev/null || exit 2

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
logs=$root/build/check-cuda

install_cuda() {
  "$root/scripts/setup.sh"
  local missing apt_dir
  mapfile -t missing < <(kat_missing nvidia-cuda-toolkit g++-11)
  if ((${#missing[@]})); then
    echo "installing ${missing[*]} (about 1.6 GB to download)"
    apt_dir=$(mktemp -d "$root/build/apt.XXXXXX")
    # shellcheck source=lib/private_apt.sh
    . "$root/scripts/lib/private_apt.sh"
    kat_private_apt "$apt_dir" deb "main contrib non-free"
    kat_apt_install "${kat_apt_opts[@]}" -- "${missing[@]}"
    rm -rf "$apt_dir"
  fi
}

# Nothing built here runs, and optimization changes no diagnostic the check is for (front-end
# errors, device-callability, linking), so host and device code are compiled unoptimized:
# -O0 for the host compiler, -G for nvcc's device compiler (cicc), and device code as
# compute_80 PTX only (KAT_CUDA_PTX_ONLY), so ptxas, which turns PTX into sm_80 machine code
# and at -O0 takes as long as cicc on unoptimized PTX, does not run. test_sparse_dense.cpp
# took 218 s with sm_80 code (cicc at its default -O3: 154 s, ptxas -O0: 21 s); the tests'
# unity unit holding it (six files) took 142 s with -G as PTX against 277 s (nvcc 11.8,
# 2026-11-25).
# KAT_UNITY_BUILD: batches of test files and of kat_train's (sizes and timings: scripts/test.sh).
configure() {
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O0 -G" \
    -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DCMAKE_PREFIX_PATH="$prefix" \
    $(kat_gpu_check_cmake_args) \
    -DKAT_ENABLE_MPI=ON -DKAT_ENABLE_CUSOLVER=ON -DKAT_ENABLE_CUBLAS=ON -DKAT_DISCOVER_TESTS=OFF -DKAT_UNITY_BUILD=ON \
    -DKAT_HEADER_CHECK_BATCH_SIZE=40 -DKAT_CUDA_PTX_ONLY=ON
}

# Every object under the build's tests, examples and bench folders holds sm_80 PTX (except the
# host-only MPI timing tool).
code_objects() {
  local o n=0
  for o in $(find "$build/tests" "$build/examples" "$build/bench" -name '*.o' 2>/dev/null | sort); do
    # kat_mpi_alpha_beta times MPI collectives on host buffers: no Kokkos, no device code.
    case $o in */kat_mpi_alpha_beta.dir/*) continue ;; esac
    if ! cuobjdump --list-ptx "$o" 2>/dev/null | grep -q 'sm_80'; then
      echo "error: $o holds no sm_80 PTX" >&2
      return 1
    fi
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "error: no objects in $build" >&2; return 1; }
  echo "sm_80 PTX in all $n objects"
}

# nvcc wraps each extended __host__ __device__ lambda (KOKKOS_LAMBDA) in __nv_hdl_wrapper_t<...,
# __nv_dl_tag<..., &enclosing_function, N>, ...>, whose members are weak symbols the linker
# merges across translation units while the function pointers they call are per-unit statics
# (tests/cuda/extended_lambda_odr/run.sh): a lambda in a header function, instantiated in two
# units, crashes or not depending on the link order. KAT's headers therefore launch named
# functors only. A lambda in a test or example file's own function is unique to its unit.
header_lambdas() {
  local o found=0 bad
  for o in $(find "$build/tests" "$build/examples" "$build/bench" -name '*.o' 2>/dev/null | sort); do
    # The enclosing function of each wrapped lambda: the pointer after ", &" in its tag.
    bad=$(nm -C "$o" | grep -oP '__nv_hdl_wrapper_t<.*?__nv_dl_tag<.*?, &\K(kat|Kokkos\w*)::[\w:]+(<[^()]*?>)?(::\w+)?' |
      sort -u || true)
    if [ -n "$bad" ]; then
      echo "error: $o holds extended lambdas (KOKKOS_LAMBDA) of these header functions:" >&2
      echo "$bad" | sed 's/^/  /' >&2
      found=1
    fi
  done
  [ "$found" -eq 0 ] || return 1
  echo "no extended lambda of a KAT or Kokkos header function in any object"
}

mkdir -p "$build"
kat_stage install "$logs-install.log" install_cuda
echo "   nvcc: $(command -v nvcc), $(nvcc --version | tail -n 2 | head -n 1)"
kat_stage odr "$logs-odr.log" "$root/tests/cuda/extended_lambda_odr/run.sh" nvcc
tail -n 4 "$logs-odr.log" | sed 's/^/   /'
kat_stage kokkos "$logs-kokkos.log" "$root/scripts/build_kokkos.sh" cuda
prefix=$(tail -n 1 "$logs-kokkos.log")
kat_stage configure "$logs-configure.log" configure
kat_stage headers "$logs-headers.log" cmake --build "$build" -j "$KAT_JOBS" --target kat_header_check
echo "   $(find "$build/tests/header_check" -name '*.cpp' | wc -l) headers compiled in" \
  "$(find "$build" -path '*kat_header_check.dir*' -name '*.o' | wc -l) translation units"
kat_stage build "$logs-build.log" kat_gpu_check_build "$build" "$KAT_JOBS"
kat_stage objects "$logs-objects.log" code_objects
tail -n 1 "$logs-objects.log" | sed 's/^/   /'
kat_stage lambdas "$logs-lambdas.log" header_lambdas
tail -n 1 "$logs-lambdas.log" | sed 's/^/   /'
echo "check_cuda.sh: OK: headers + $(kat_gpu_check_parts) compile and link with nvcc" \
  "$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') ($(kat_stage_summary))"
