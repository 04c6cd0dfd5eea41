#!/usr/bin/env bash
# Builds KAT's Catch2 test suite (kat_tests) and the trainer (kat_train) against a CUDA Kokkos
# and RUNS them on an NVIDIA GPU of compute capability 9.0 (H100, H200), unlike
# scripts/check_cuda.sh, which only compiles and links for CUDA.
#
#   scripts/gpu_tests.sh prepare [DIR]   on a Debian 12 machine that has run scripts/setup.sh
#                                        and scripts/build_kokkos.sh (its cached sources): fills
#                                        DIR (default build/gpu) with what the GPU machine lacks
#   scripts/gpu_tests.sh build [DIR]     info, Kokkos, Kokkos Kernels, configure and build KAT
#   scripts/gpu_tests.sh test [DIR]      run kat_tests, then kat_train (needs the GPU)
#   scripts/gpu_tests.sh compare [DIR]   KAT against PyTorch on the GPU (run_compare below), with
#                                        the binaries built here or carried
#   scripts/gpu_tests.sh [all] [DIR]     build, then test (and compare, with KAT_COMPARE_RESERVE)
#
# DIR (or KAT_GPU_DIR) holds, after `prepare` (about 40 MB; 53 MB with the prebuilt binaries):
#   kokkos-src.tar.gz  packages/kokkos and packages/kokkos-kernels 3.4.1 from Debian's
#                      trilinos source package ($KAT_DEPS_DIR/src-*, see build_kokkos.sh),
#                      without their tests and examples
#   kat-src.tar.gz     KAT at the checkout's last commit (git archive HEAD; kat-src.commit
#                      names it), built instead of the working tree with KAT_GPU_SOURCE=snapshot
#   deps/              Catch2 2.x and nlohmann/json (headers and CMake packages), CLI11 and
#                      zlib headers, libz,
#                      reference LAPACK and BLAS with libgfortran and libquadmath (Debian 12;
#                      the libraries gzipped, unpacked by the run)
#   data/fashion-mnist the Fashion-MNIST IDX files of dataset-fashion-mnist (kat_train and the
#                      "[training]" tests read them)
#   prebuilt/          with KAT_GPU_PREBUILT only: kat_tests and kat_train built elsewhere, run
#                      only if the build on the GPU machine fails or overruns
#
# Kokkos 3.4.1 is patched in the extracted copy (kokkos_patch below; docs/backends.md lists
# each patch and its reason), because:
#  - it knows no architecture newer than Ampere, and Cuda::initialize aborts when the compute
#    capability the kernels were compiled for has another major number than the device's
#    (core/src/Cuda/Kokkos_Cuda_Instance.cpp: `compiled_major != cudaProp.major`). An sm_80
#    build does not run on compute capability 9.0, also not through the driver's JIT of its
#    compute_80 PTX (whose __CUDA_ARCH__ stays 800): seen on an H200, 2026-11-26, "running
#    kernels compiled for compute capability 8.0 on device with compute capability 9.0 is not
#    supported by CUDA!", with and without CUDA_FORCE_PTX_JIT=1. So the copy gains the option
#    Kokkos 4.0 introduced, Kokkos_ARCH_HOPPER90 (sm_90, KOKKOS_ARCH_HOPPER and
#    KOKKOS_ARCH_HOPPER90 in KokkosCore_config.h), with which the compiled-major check compares
#    9 with 9; nvcc_wrapper's default architecture (sm_35, which CUDA 12 dropped; CMake's
#    compiler checks name none) becomes sm_90. KAT's objects get -arch=sm_90 through
#    Kokkos::kokkos's interface compile options (the build stage counts them and lists their
#    machine code);
#  - nvcc 13 rejects Kokkos_Cuda_Half.hpp's implicit half_t -> __half conversions and its
#    __half2double; CUDA 13's cudaMemPrefetchAsync takes a cudaMemLocation; the occupancy
#    deduction throws on compute capability 9.0; and the installed KokkosConfig.cmake copies
#    CMake 4's CUDA:: targets wrongly (see kokkos_patch). Kokkos Kernels is not patched: its
#    cuSPARSE TPL, which CUDA 12 broke and KAT does not use, is turned off.
#
# Through the device tool of this workplace (one call; the machine keeps build/gpu-build only
# while it stays warm):
#   KAT_GPU_PREBUILT=build/gpu-build/kat scripts/gpu_tests.sh prepare   # here (the variable:
#                                                  # optional, after a build here)
#   run(command="KAT_GPU_BUDGET=560 KAT_GPU_SOURCE=snapshot bash scripts/gpu_tests.sh all build/gpu",
#       carry=["build/gpu"], timeout_s=600)
# On an H200 machine (16 cores; nvcc 13.0, g++ 13.3, CMake 4.4.3, ninja 1.13; 2026-11-26):
# Kokkos and Kokkos Kernels 33 s, configure 10 s, kat_train 122 s (32 jobs; train/sparse.cpp
# alone 122 s), kat_tests more than the 179 s that were left (its longest units 105-132 s);
# the 345 test cases 12 s, the 20 one-epoch kat_train runs 72 s. Then, on the same warm machine,
# `scripts/gpu_tests.sh compare build/gpu` (KAT against PyTorch, six model/optimizer pairs) 137 s.
# The logs (at most 8 files) go to $OUT, else to WORK/logs; the last lines printed are the summary.
#
#   KAT_GPU_WORK    build folder (default build/gpu-build): Kokkos, Kokkos Kernels, KAT
#   KAT_GPU_BUDGET  seconds the whole run may take (default 0: no limit); the tests and the
#                   trainer get what the build leaves
#   KAT_JOBS        parallel compile jobs (default: nproc)
#   KAT_UNITY_BUILD ON or OFF (default OFF: one translation unit per test file)
#   KAT_GPU_SOURCE  KAT's sources: a directory (default: this checkout) or `snapshot`, the commit
#                   that `prepare` archived (DIR/kat-src.tar.gz, DIR/kat-src.commit)
#   KAT_BUILD_JOBS  parallel jobs for KAT's build (default: 2 x nproc, at most 32: the long
#                   test files then start at once instead of after the short ones; each nvcc
#                   takes up to 2.7 GB)
#   KAT_GPU_CMAKE_ARGS  more arguments to KAT's cmake configuration (split at blanks)
#   KAT_GPU_PREBUILT (prepare) a KAT build folder whose kat_tests and kat_train go along as the
#                   fallback (DIR/prebuilt), used only if the build here fails or overruns
#   KAT_GPU_BUILD_RESERVE  with KAT_GPU_BUDGET: seconds kept for the tests when the build of
#                   KAT starts (default 200); the build is stopped there
#   KAT_GPU_TESTS   Catch2 test spec of the cases to run (default ~[mpi]: all but the MPI ones)
#   KAT_GPU_TRAIN   0: `test` runs kat_tests only, not the one-epoch kat_train runs (default 1)
#   KAT_COMPARE     model:optimizer pairs to compare (default: mlp:sgd cnn:sgd mlp:kfac cnn:kfac
#                   resnet:sgd vit:adam), each with an optional :bf16 (kat_train --precision bf16
#                   against PyTorch's torch.autocast bf16; e.g. cnn:sgd:bf16);
#                   KAT_COMPARE_ROUNDS alternations (default 1);
#                   KAT_COMPARE_RESERVE (all) seconds kept for it from the tests and the trainer;
#                   KAT_PYTHON the Python with PyTorch (default python3); KAT_COMPARE_DEVICE
#                   PyTorch's device (default cuda; cpu for a dry run of the script)
#   CUDA_HOME       CUDA toolkit (default: where nvcc is, else /usr/local/cuda)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
action=${1:-all}
dir=${2:-${KAT_GPU_DIR:-$root/build/gpu}}
case $dir in /*) ;; *) dir=$root/$dir ;; esac
work=${KAT_GPU_WORK:-$root/build/gpu-build}
out=${OUT:-$work/logs}
jobs=${KAT_JOBS:-$(nproc)}
build_jobs=${KAT_BUILD_JOBS:-$((2 * $(nproc) > 32 ? 32 : 2 * $(nproc)))}
budget=${KAT_GPU_BUDGET:-0}
start_time=$SECONDS
summary=()

note() { echo "$*"; summary+=("$*"); }
left() { # seconds left of KAT_GPU_BUDGET (a large number without one)
  if [ "$budget" -gt 0 ]; then echo $((budget - (SECONDS - start_time))); else echo 100000; fi
}
# stage NAME LOG COMMAND...: COMMAND's output appended to LOG, its time printed; on failure
# prints the first error and sets status=1. Call it as a plain command (not after || or &&,
# where bash would ignore set -e inside COMMAND).
status=0
stage() {
  local name=$1 log=$2 t=$SECONDS rc=0 first
  shift 2
  echo "== $name ($(date -u +%T))" | tee -a "$log"
  # In the background, so that set -e holds inside COMMAND while a failure is caught here.
  "$@" >>"$log" 2>&1 &
  wait $! || rc=$?
  if [ "$rc" -ne 0 ]; then
    status=1
    note "$name: FAILED (exit $rc) after $((SECONDS - t)) s; log $(basename "$log")"
    echo "--- first error in $log:"
    first=$(grep -n -m 1 -E 'error:|error [0-9]|CMake Error|nvcc fatal' "$log" | cut -d: -f1 || true)
    [ -z "$first" ] || sed -n "$((first > 5 ? first - 5 : 1)),$((first + 25))p" "$log"
    echo "--- end of $log:"
    tail -n 25 "$log"
    return 0
  fi
  note "$name: $((SECONDS - t)) s"
}

# ---------------------------------------------------------------------------------------------
prepare() {
  local deps_dir=${KAT_DEPS_DIR:-$HOME/.cache/kat} src multi=/usr/lib/x86_64-linux-gnu
  src=$(ls -d "$deps_dir"/src-*/ 2>/dev/null | head -n 1)
  if [ -z "$src" ] || [ ! -d "$src/packages/kokkos" ]; then
    echo "gpu_tests.sh: no Kokkos sources in $deps_dir/src-*; run scripts/build_kokkos.sh openmp" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir/deps/include" "$dir/deps/lib/cmake" "$dir/data"
  # The sources, without their tests, examples and documentation (not built here).
  tar -C "$src" -czf "$dir/kokkos-src.tar.gz" \
    --exclude='packages/kokkos-kernels/perf_test' --exclude='packages/kokkos-kernels/unit_test' \
    --exclude='packages/kokkos-kernels/example' \
    --exclude='packages/kokkos/benchmarks' --exclude='*/doc' packages/kokkos packages/kokkos-kernels
  cp -a /usr/include/catch2 /usr/include/CLI /usr/include/zlib.h /usr/include/zconf.h \
    "$dir/deps/include/"
  cp -a /usr/lib/cmake/Catch2 "$dir/deps/lib/cmake/"
  # nlohmann/json (kat_plan's and kat_train --plan's JSON, test_plan.cpp), header-only.
  cp -a /usr/include/nlohmann "$dir/deps/include/"
  mkdir -p "$dir/deps/share/cmake"
  cp -a /usr/share/cmake/nlohmann_json "$dir/deps/share/cmake/"
  # Catch2's CMake package names this library (and CMake checks that it exists); KAT does not
  # link it, so an empty archive stands in for its 1.7 MB.
  printf '!<arch>\n' >"$dir/deps/lib/libCatch2WithMain.a"
  # Reference LAPACK and BLAS (not OpenBLAS: 36 MB), compressed (the carry is limited to
  # 64 MiB); unpacked, and their links made, on the GPU machine.
  cp -L "$multi/lapack/liblapack.so.3" "$multi/blas/libblas.so.3" "$multi/libgfortran.so.5" \
    "$multi/libquadmath.so.0" "$multi/libz.so.1" "$dir/deps/lib/"
  gzip -9 "$dir"/deps/lib/*.so.*
  cp -a /usr/share/datasets/fashion-mnist "$dir/data/"
  # KAT itself at the checkout's last commit, for KAT_GPU_SOURCE=snapshot: the sources that were
  # compiled here, whatever the working tree holds when the GPU machine gets its copy.
  git -C "$root" archive --format=tar HEAD include tests examples cmake CMakeLists.txt |
    gzip -9 >"$dir/kat-src.tar.gz"
  git -C "$root" log -1 --format='%H %cd %s' --date=iso >"$dir/kat-src.commit"
  # Optionally kat_tests and kat_train built elsewhere with the same toolkit (KAT_GPU_PREBUILT:
  # a KAT build folder of this script, built from the snapshot's commit): run on the GPU
  # machine only if its own build fails or overruns.
  if [ -n "${KAT_GPU_PREBUILT:-}" ]; then
    mkdir -p "$dir/prebuilt"
    gzip -c "$KAT_GPU_PREBUILT/tests/kat_tests" >"$dir/prebuilt/kat_tests.gz"
    gzip -c "$KAT_GPU_PREBUILT/examples/kat_train" >"$dir/prebuilt/kat_train.gz"
    # Libraries they link that the GPU machine's image lacks: oneDNN (where the build found
    # it) and its OpenCL loader, by soname, unpacked into deps/lib there.
    ldd "$KAT_GPU_PREBUILT/tests/kat_tests" | awk '/libdnnl|libOpenCL/ {print $1, $3}' |
      while read -r soname path; do
        gzip -9 -c "$path" >"$dir/deps/lib/$soname.gz"
      done
    sed -n 's/^KAT_TEST_DATA_DIR:PATH=//p' "$KAT_GPU_PREBUILT/CMakeCache.txt" \
      >"$dir/prebuilt/test-data-dir"
    echo "built in $KAT_GPU_PREBUILT on $(hostname) with $(nvcc --version | grep -o 'release [0-9.]*')," \
      "$(date -u -r "$KAT_GPU_PREBUILT/tests/kat_tests" '+%F %T UTC'), sources of" \
      "$(cat "$dir/kat-src.commit")" >"$dir/prebuilt/info"
  fi
  du -sh "$dir"/*
  du -sh "$dir"
}

# ---------------------------------------------------------------------------------------------
# Source changes Kokkos 3.4.1 needs here, applied to the extracted copy.
kokkos_patch() {
  local k=$1/packages/kokkos
  # nvcc_wrapper's architecture for commands that name none (CMake's compiler checks):
  # sm_35, which CUDA 12 dropped.
  sed -i 's/^default_arch="sm_35"$/default_arch="sm_90"/' "$k/bin/nvcc_wrapper"
  grep -q '^default_arch="sm_90"$' "$k/bin/nvcc_wrapper"
  # nvcc 13 (CUDA 13) and compute capability 9.0; the CUDA 13 changes are guarded so that older
  # toolkits compile what they did:
  python3 - "$k" <<'EOF'
import sys
k = sys.argv[1]
def patch(path, old, new, count=1):
    f = f"{k}/{path}"
    text = open(f).read()
    if text.count(old) != count:
        sys.exit(f"kokkos_patch: {path}: expected {count} of {old!r}, found {text.count(old)}")
    open(f, "w").write(text.replace(old, new))
# 0. Kokkos_ARCH_HOPPER90 as Kokkos 4 has it: the option, its sm_90 flag, the general
#    KOKKOS_ARCH_HOPPER, and both macros in KokkosCore_config.h.
patch("cmake/kokkos_arch.cmake",
      """KOKKOS_ARCH_OPTION(AMPERE86        GPU  "NVIDIA Ampere generation CC 8.6")""",
      """KOKKOS_ARCH_OPTION(AMPERE86        GPU  "NVIDIA Ampere generation CC 8.6")
KOKKOS_ARCH_OPTION(HOPPER90        GPU  "NVIDIA Hopper generation CC 9.0")""")
patch("cmake/kokkos_arch.cmake", "CHECK_CUDA_ARCH(AMPERE86  sm_86)",
      "CHECK_CUDA_ARCH(AMPERE86  sm_86)\nCHECK_CUDA_ARCH(HOPPER90  sm_90)")
patch("cmake/kokkos_arch.cmake", """  IF (KOKKOS_ARCH_AMPERE80 OR KOKKOS_ARCH_AMPERE86)
    SET(KOKKOS_ARCH_AMPERE ON)
  ENDIF()""", """  IF (KOKKOS_ARCH_AMPERE80 OR KOKKOS_ARCH_AMPERE86)
    SET(KOKKOS_ARCH_AMPERE ON)
  ENDIF()

  IF (KOKKOS_ARCH_HOPPER90)
    SET(KOKKOS_ARCH_HOPPER ON)
  ENDIF()""")
patch("cmake/KokkosCore_config.h.in", "#cmakedefine KOKKOS_ARCH_AMPERE86",
      "#cmakedefine KOKKOS_ARCH_AMPERE86\n#cmakedefine KOKKOS_ARCH_HOPPER\n#cmakedefine KOKKOS_ARCH_HOPPER90")
# 1. cuda_fp16.h: half_t converts to __half only explicitly, and the front end now checks the
#    non-dependent calls in cast_from_half's templates; __half2double does not exist.
for fn in ["float", "short_rz", "ushort_rz", "int_rz", "uint_rz", "ll_rz", "ull_rz"]:
    patch("core/src/Cuda/Kokkos_Cuda_Half.hpp", f"return __half2{fn}(val);",
          f"return __half2{fn}(__half(val));")
patch("core/src/Cuda/Kokkos_Cuda_Half.hpp", "return __half2double(val);",
      "return static_cast<double>(__half2float(__half(val)));")
# 2. The block-size deduction for a desired occupancy knows compute capabilities up to 8.6 and
#    throws "Unknown device" on others; Hopper's smallest shared-memory carveout is Ampere's
#    (8 KB).
patch("core/src/Cuda/Kokkos_Cuda_BlockSize_Deduction.hpp",
      """      case 86: return 8;""", """      case 86:
      case 90: return 8;""")
# 3. The installed KokkosConfig.cmake copies the CUDA:: targets of FindCUDAToolkit by value, one
#    property at a time, with lists joined by newlines; CMake 4's targets (two include
#    directories, CUDA::cudart linking CUDA::cudart_static_deps) then break every consumer
#    ("Imported target Kokkos::kokkos includes non-existent path", "CUDA::cudart_static_deps
#    ... target was not found"). The consumer's own FindCUDAToolkit defines them first, so the
#    copies (each under IF(NOT TARGET ...)) are skipped.
patch("cmake/KokkosConfig.cmake.in", "@KOKKOS_TPL_EXPORTS@", """IF(CMAKE_VERSION VERSION_GREATER_EQUAL "3.17.0" AND NOT TARGET CUDA::cudart)
  FIND_PACKAGE(CUDAToolkit QUIET)
ENDIF()
@KOKKOS_TPL_EXPORTS@""")
# 4. CUDA 13's cudaMemPrefetchAsync takes a cudaMemLocation and flags.
patch("core/src/Cuda/Kokkos_CudaSpace.cpp",
      """    CUDA_SAFE_CALL(cudaMemPrefetchAsync(ptr, bytes, space.cuda_device(),
                                        space.cuda_stream()));""",
      """#if CUDA_VERSION >= 13000
    cudaMemLocation location{};
    location.type = cudaMemLocationTypeDevice;
    location.id   = space.cuda_device();
    CUDA_SAFE_CALL(cudaMemPrefetchAsync(ptr, bytes, location, 0u,
                                        space.cuda_stream()));
#else
    CUDA_SAFE_CALL(cudaMemPrefetchAsync(ptr, bytes, space.cuda_device(),
                                        space.cuda_stream()));
#endif""")
EOF
}

info() {
  set +e
  uname -a
  ls -l /usr/bin/cmake* /usr/local/bin/cmake* 2>&1 | head -n 3
  grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release
  echo "nproc: $(nproc)"
  command -v nvcc g++ cmake ninja python3
  nvcc --version
  g++ --version | head -n 1
  cmake --version | head -n 1
  ninja --version
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv
  for lib in "$cuda_home"/lib64/lib{cublas,cusolver,cudart}.so*; do
    [ -e "$lib" ] && printf '%s ' "$(basename "$lib")"
  done
  echo
  ldconfig -p | grep -E 'liblapack|libblas|libgfortran|libz\.so|libquadmath' | head
  df -h "$root" | tail -n 1
  true
}

build_kokkos() {
  local s=$work/src
  rm -rf "$s" "$work/kokkos" "$work/kk" "$work/prefix"
  mkdir -p "$s"
  tar -C "$s" -xzf "$dir/kokkos-src.tar.gz"
  kokkos_patch "$s"
  local common=(-G "$generator" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17
    -DCMAKE_INSTALL_PREFIX="$work/prefix" -DKokkos_ENABLE_SERIAL=ON
    -DCMAKE_CXX_COMPILER="$s/packages/kokkos/bin/nvcc_wrapper"
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5) # CMake 4 (pip's) with older projects; unused otherwise
  cmake -S "$s/packages/kokkos" -B "$work/kokkos" "${common[@]}" -DKokkos_ENABLE_CUDA=ON \
    -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ARCH_HOPPER90=ON
  grep -q '^#define KOKKOS_ARCH_HOPPER90$' "$work/kokkos/KokkosCore_config.h" ||
    { echo "Kokkos does not define KOKKOS_ARCH_HOPPER90"; return 1; }
  grep -rq -e '-arch=sm_90' "$work/kokkos" --include=build.ninja --include=flags.make ||
    { echo "Kokkos is not configured for sm_90"; return 1; }
  cmake --build "$work/kokkos" -j "$jobs"
  cmake --install "$work/kokkos" >/dev/null
  # Kokkos Kernels: no explicit instantiation (as scripts/build_kokkos.sh), cuBLAS.
  cmake -S "$s/packages/kokkos-kernels" -B "$work/kk" "${common[@]}" -DKokkos_ROOT="$work/prefix" \
    -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
    -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF \
    -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF \
    -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_LAYOUTLEFT=OFF \
    -DKokkosKernels_ENABLE_TPL_CUBLAS="$cublas" -DCUBLAS_ROOT="$cuda_home" \
    -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF \
    -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF
  cmake --build "$work/kk" -j "$jobs"
  cmake --install "$work/kk" >/dev/null
}

configure_kat() {
  local d=$dir/deps
  local src=$root
  if [ "${KAT_GPU_SOURCE:-}" = snapshot ]; then
    src=$work/kat-src
    rm -rf "$src"
    mkdir -p "$src"
    tar -C "$src" -xzf "$dir/kat-src.tar.gz"
    echo "KAT sources: the snapshot of $(cat "$dir/kat-src.commit")"
  elif [ -n "${KAT_GPU_SOURCE:-}" ]; then
    src=$KAT_GPU_SOURCE
  fi
  echo "KAT sources: $src"
  rm -rf "$work/kat"
  cmake -S "$src" -B "$work/kat" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$work/prefix/bin/nvcc_wrapper" \
    -DCMAKE_PREFIX_PATH="$work/prefix;$d" -DCMAKE_LIBRARY_PATH="$d/lib" \
    -DCMAKE_INCLUDE_PATH="$d/include" -DCUDAToolkit_ROOT="$cuda_home" \
    -DZLIB_ROOT="$d" -DBLA_VENDOR=Generic \
    -DKAT_ENABLE_TESTS=ON -DKAT_ENABLE_EXAMPLES=ON -DKAT_ENABLE_MPI=OFF \
    -DKAT_ENABLE_CUSOLVER="$cusolver" -DKAT_ENABLE_CUBLAS="$cublas" -DKAT_DISCOVER_TESTS=OFF \
    -DKAT_ENABLE_ONEDNN=OFF -DKAT_OPENMP_BLAS_DIR= \
    -DKAT_UNITY_BUILD="${KAT_UNITY_BUILD:-OFF}" -DKAT_TEST_DATA_DIR="$dir/data/fashion-mnist" \
    ${KAT_GPU_CMAKE_ARGS:-}
  grep -E '^(LAPACK_|BLAS_|ZLIB_LIB|CUDAToolkit_|Catch2_DIR|CLI11)' "$work/kat/CMakeCache.txt" || true
}

build_kat() {
  # test_sparse.cpp, test_hessian_vector.cpp and test_sparse_dense.cpp are the longest units
  # (about 115 s of one core each with nvcc 13.0 -O3 for sm_90; the whole build about 1050 s).
  local limit
  limit=$(($(left) - ${KAT_GPU_BUILD_RESERVE:-200}))
  [ "$limit" -gt 30 ] || limit=30
  echo "building with $build_jobs jobs, for at most $limit s"
  # kat_train first, then kat_tests, each timed on its own (their limits: 90 s and 180 s on a
  # 16-core machine); the slowest translation units from Ninja's log.
  local t0=$SECONDS t1
  timeout -k 10 "$limit" cmake --build "$work/kat" -j "$build_jobs" --target kat_train
  t1=$SECONDS
  echo "build time: kat_train $((t1 - t0)) s"
  timeout -k 10 "$((limit - (t1 - t0)))" cmake --build "$work/kat" -j "$build_jobs" --target kat_tests
  echo "build time: kat_tests $((SECONDS - t1)) s"
  if [ -f "$work/kat/.ninja_log" ]; then
    echo "slowest units (s):"
    awk 'NR > 1 { printf "%8.1f %s\n", ($2 - $1) / 1000, $4 }' "$work/kat/.ninja_log" |
      sort -rn | head -n 8
  fi
  # Every object compiled with -arch=sm_90 (Kokkos::kokkos's interface options), and the
  # machine code the objects hold (the toolkit's own cuobjdump: an older one cannot read
  # CUDA 13 objects).
  echo "objects: $(find "$work/kat" -name '*.o' | wc -l);" \
    "compile commands with -arch=sm_90: $(grep -c -e '-arch=sm_90' "$work/kat/build.ninja" "$work/kat/compile_commands.json" 2>/dev/null | tr '\n' ' ')"
  local dump=$cuda_home/bin/cuobjdump
  [ -x "$dump" ] || dump=$(command -v cuobjdump || true)
  if [ -n "$dump" ]; then
    echo "device code per object ($dump, $("$dump" --version | grep -o 'release [0-9.]*' || true)):"
    find "$work/kat" -name '*.o' | while read -r o; do
      { "$dump" --list-elf "$o" 2>&1 | grep -o -E 'sm_[0-9a-z]+|fatal.*' | sort -u | tr '\n' ' '; } || true
      echo
    done | sort | uniq -c
    echo "kat_tests: $({ "$dump" --list-elf "$work/kat/tests/kat_tests" 2>&1 |
      grep -o -E 'sm_[0-9a-z]+|fatal.*' | sort | uniq -c | tr '\n' ' '; } || true)"
  else
    echo "no cuobjdump: device code not listed"
  fi
}

# ---------------------------------------------------------------------------------------------
# kat_tests in one process (one CUDA context for all test cases, not one per case as ctest
# would). A case that crashes the process (Kokkos::abort, a signal) or hangs past the budget
# is recorded, and the run resumes with the cases after it. --durations prints one line per
# finished case, which is how the finished ones are told apart.
run_tests() {
  local bin=$tests_bin names=$work/test-names.txt remaining=$work/remaining.txt
  local log=$out/tests.log attempt=0 rc t budget_now
  : >"$log"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | tee -a "$log" || true
  rc=0
  "$bin" --kat-without-mpi --list-test-names-only "${KAT_GPU_TESTS:-~[mpi]}" >"$work/list.log" \
    2>&1 </dev/null || rc=$?
  grep -v -E '^(Kokkos::|\s|$)' "$work/list.log" >"$names" || true
  echo "$(wc -l <"$names") test cases (${KAT_GPU_TESTS:-~[mpi]}); listing exit $rc" | tee -a "$log"
  # Catch2 exits with the number of cases listed (at most 255); anything else is a crash.
  local n
  n=$(wc -l <"$names")
  if [ ! -s "$names" ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne $((n > 255 ? 255 : n)) ]; }; then
    echo "no test cases listed; kat_tests --list-test-names-only printed:"
    head -n 40 "$work/list.log" | tee -a "$log"
    return 1
  fi
  cp "$names" "$remaining"
  : >"$work/crashed.txt"
  while [ -s "$remaining" ] && [ $attempt -lt 12 ]; do
    attempt=$((attempt + 1))
    budget_now=$(($(left) - ${KAT_TRAIN_RESERVE:-45} - compare_reserve))
    if [ "$budget_now" -lt 15 ]; then
      echo "no time left for the remaining $(wc -l <"$remaining") cases" | tee -a "$log"
      break
    fi
    echo "=== run $attempt: $(wc -l <"$remaining") cases, up to $budget_now s" | tee -a "$log"
    t=$SECONDS
    rc=0
    stdbuf -oL -eL timeout -k 5 "$budget_now" "$bin" --kat-without-mpi -r console \
      --durations yes -f "$remaining" >"$work/run.log" 2>&1 </dev/null || rc=$?
    cat "$work/run.log" >>"$log"
    echo "=== run $attempt: exit $rc after $((SECONDS - t)) s" | tee -a "$log"
    # The cases that finished have their duration line. A run that ended by itself (Catch2's
    # summary, no signal) ran them all. A crash (Catch2 reports SIGSEGV, SIGABRT, SIGTERM as
    # "a fatal error condition" of the case, prints its summary and re-raises the signal)
    # leaves the cases after it unrun; a case killed without a report (SIGKILL after the
    # timeout) is the first unfinished one. The run resumes with the unrun ones.
    python3 - "$remaining" "$work/run.log" "$work/crashed.txt" "$rc" <<'EOF' | tee -a "$log"
import re, sys
remaining = [l.rstrip("\n") for l in open(sys.argv[1]) if l.strip()]
lines = open(sys.argv[2], errors="replace").read().split("\n")
rc = int(sys.argv[4])
done = set()
for line in lines:
    m = re.match(r"^\d+\.\d+ s: (.*)$", line)
    if m:
        done.add(m.group(1))
left = [n for n in remaining if n not in done]
summary = any(l.startswith(("All tests passed", "test cases:")) for l in lines)
culprit, msg = None, ""
for i, line in enumerate(lines):
    if line.startswith("due to a fatal error condition"):
        # the case's header: a dashed line, its name and sections, a dashed line
        dashes = [j for j in range(i) if lines[j] == "-" * 79]
        if len(dashes) >= 2:
            culprit = lines[dashes[-2] + 1]
        msg = lines[i + 1].strip() if i + 1 < len(lines) else ""
if culprit is None and left and summary and rc < 124:
    # Catch2 ended by itself: what is left matched no case
    print(f"=== {len(left)} listed cases were not run: {left[:5]}")
    left = []
elif left or culprit is not None:
    if culprit is None:
        culprit, msg, left = left[0], "no report (killed)", left[1:]
    with open(sys.argv[3], "a") as f:
        f.write(f"{culprit}\t(exit {rc}: {msg})\n")
    print(f"=== the process died in: {culprit} (exit {rc}: {msg}); {len(left)} cases left")
with open(sys.argv[1], "w") as f:
    f.writelines(n + "\n" for n in left)
EOF
  done
  python3 - "$names" "$log" "$work/crashed.txt" "$work/failed.txt" <<'EOF' | tee "$out/tests-summary.txt"
import re, sys
names = [l.rstrip("\n") for l in open(sys.argv[1]) if l.strip()]
nameset = set(names)
lines = open(sys.argv[2], errors="replace").read().split("\n")
crashed = [l.rstrip("\n").split("\t") for l in open(sys.argv[3]) if l.strip()]
dur, failed, warned = {}, {}, {}
dash = "-" * 79
i = 0
while i < len(lines):
    m = re.match(r"^(\d+\.\d+) s: (.*)$", lines[i])
    if m and m.group(2) in nameset:
        dur[m.group(2)] = float(m.group(1))
    if lines[i] == dash and i + 1 < len(lines) and lines[i + 1] in nameset:
        case = lines[i + 1]
        j = i + 2
        while j < len(lines) and lines[j] != dash:
            j += 1
        k = j + 1
        msg = [l.strip() for l in lines[i + 2:j]]  # the sections
        msg = ["in section: " + " / ".join(msg)] if msg else []
        while k < len(lines) and lines[k] != dash and not re.match(r"^\d+\.\d+ s: ", lines[k]) \
                and not lines[k].startswith("===="):
            if lines[k].strip(".") != "":
                msg.append(lines[k])
            k += 1
        text = "\n".join(msg)
        if "FAILED" in text:
            failed.setdefault(case, []).append("\n".join(l for l in msg if l.strip())[:1500])
        elif "warning:" in text:
            warned.setdefault(case, []).append(" ".join(l.strip() for l in msg if l.strip())[:300])
        i = k
        continue
    i += 1
crashed_names = [c[0] for c in crashed]
finished = [n for n in names if n in dur]
killed = [n for n in crashed_names if n not in dur]
not_run = [n for n in names if n not in dur and n not in crashed_names]
passed = [n for n in finished if n not in failed]
print(f"kat_tests: {len(names)} test cases listed; {len(finished)} finished: {len(passed)} passed, "
      f"{len([n for n in finished if n in failed])} failed ({len(crashed_names) - len(killed)} of "
      f"them by a signal that ended the process); {len(killed)} killed without a report; "
      f"{len(not_run)} not run; {sum(dur.values()):.1f} s in the finished cases")
for n, msgs in failed.items():
    print(f"FAILED: {n}")
    for m in msgs[:3]:
        print("    " + m.replace("\n", "\n    "))
for c in crashed:
    print(f"PROCESS DIED IN: {c[0]} {c[1] if len(c) > 1 else ''}")
for n in not_run[:20]:
    print(f"NOT RUN: {n}")
for n, msgs in warned.items():
    print(f"WARNING in {n}: {msgs[0]}")
print("slowest cases:")
for n, d in sorted(dur.items(), key=lambda x: -x[1])[:12]:
    print(f"  {d:8.2f} s  {n}")
for line in lines:
    if line.startswith("test cases:") or line.startswith("assertions:") or line.startswith("All tests passed"):
        print("catch2: " + line)
with open(sys.argv[4], "w") as f:
    f.writelines(n + "\n" for n in dict.fromkeys(list(failed) + crashed_names))
EOF
  # Each failed or crashed case again in a process of its own (as ctest runs them), to tell
  # a failure of the case from one that an earlier case in the same process caused.
  local name n=0
  while IFS= read -r name && [ $n -lt 20 ]; do
    n=$((n + 1))
    budget_now=$(($(left) - ${KAT_TRAIN_RESERVE:-45} - compare_reserve))
    if [ "$budget_now" -lt 10 ]; then
      echo "isolated rerun: no time left for: $name" | tee -a "$out/tests-summary.txt"
      continue
    fi
    [ "$budget_now" -lt 120 ] || budget_now=120
    printf '%s\n' "$name" >"$work/one.txt"
    echo "=== isolated rerun of: $name" >>"$log"
    rc=0
    stdbuf -oL -eL timeout -k 5 "$budget_now" "$bin" --kat-without-mpi -r console \
      --durations yes -f "$work/one.txt" >>"$log" 2>&1 </dev/null || rc=$?
    echo "isolated rerun: exit $rc ($([ $rc -eq 0 ] && echo passed || echo FAILED)): $name" |
      tee -a "$out/tests-summary.txt"
  done <"$work/failed.txt"
}

run_train() {
  # Every model with SGD, Adam, K-FAC, FOSI and RigL at 90 % sparsity, one epoch each (ResNet-14
  # on 10,000 images); a run gets at most 60 s, and what the time left does not cover is listed
  # as not run.
  local bin=$train_bin data=$dir/data/fashion-mnist t model optimizer
  local log=$out/train.log
  : >"$log"
  for model in mlp cnn "resnet --train-subset 10000" vit; do
    for optimizer in sgd "adam --lr 1e-3" kfac fosi-momentum "sgd --sparsity 0.9"; do
      t=$(($(left) - 5 - compare_reserve))
      if [ "$t" -le 10 ]; then
        echo "=== not run: kat_train --model $model --optimizer $optimizer" | tee -a "$log"
        continue
      fi
      [ "$t" -lt 60 ] || t=60
      echo "=== kat_train --model $model --optimizer $optimizer (up to $t s)" | tee -a "$log"
      # shellcheck disable=SC2086
      timeout -k 5 "$t" "$bin" --data-dir "$data" --progress never --epochs 1 --model $model \
        --optimizer $optimizer >>"$log" 2>&1 &&
        echo "=== exit 0" | tee -a "$log" || echo "=== exit $?" | tee -a "$log"
      grep -E '^epoch' "$log" | tail -n 1 || true
    done
  done
}

run_compare() {
  # KAT against PyTorch on this GPU in one invocation: for each model and optimizer, kat_train
  # and bench/compare_pytorch.py --device cuda (the machine's own PyTorch, strict FP32, data on
  # the GPU) alternately, KAT_COMPARE_ROUNDS times, two epochs each, batch 128. The epoch-2
  # training seconds (epoch 1 pays cuDNN's autotuning and both sides' first allocations) and
  # the test accuracy of each run go to compare.log, the table to compare-summary.txt.
  # K-FAC: KAISA's schedule and hyperparameters (factors every 10 steps, eigendecompositions
  # every 100, damping 0.003, KL clip 0.001, float32 decompositions) on both sides.
  local data=$dir/data/fashion-mnist log=$out/compare.log py=${KAT_PYTHON:-python3}
  local rounds=${KAT_COMPARE_ROUNDS:-1} spec model opt precision label r t csv which
  local sgd=(--optimizer sgd --lr 0.05 --momentum 0.9) kat=() torch=()
  local kfac=(--lr 0.05 --momentum 0.9 --factor-update-steps 10 --inv-update-steps 100
    --damping 0.003 --factor-decay 0.95 --kl-clip 0.001)
  : >"$log"
  rm -f "$work/compare-summary.txt"
  "$py" -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda,
    torch.cuda.get_device_name() if torch.cuda.is_available() else "(no CUDA device)")' 2>&1 |
    tee -a "$log"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 |
    tee -a "$log" || true
  for spec in ${KAT_COMPARE:-mlp:sgd cnn:sgd mlp:kfac cnn:kfac resnet:sgd vit:adam}; do
    IFS=: read -r model opt precision <<<"$spec"
    precision=${precision:-fp32}
    label=$opt
    [ "$precision" = fp32 ] || label=$opt/$precision
    case $opt in
      sgd) kat=("${sgd[@]}") torch=("${sgd[@]}") ;;
      adam) kat=(--optimizer adam --lr 1e-3) torch=(--optimizer adam --lr 1e-3) ;;
      kfac)
        kat=(--optimizer kfac "${kfac[@]}" --compute-method eigen --inverse-precision float)
        torch=(--optimizer kfac "${kfac[@]}")
        ;;
      *) echo "compare: unknown optimizer in $spec" | tee -a "$log"; return 1 ;;
    esac
    kat+=(--precision "$precision")
    torch+=(--precision "$precision")
    for r in $(seq "$rounds"); do
      for which in kat torch; do
        t=$(($(left) - 5))
        if [ "$t" -le 20 ]; then
          echo "$model $label $which run $r: not run (time)" | tee -a "$log"
          continue
        fi
        [ "$t" -lt 150 ] || t=150
        csv=$work/compare-$model-$opt-$precision-$which-$r.csv
        rm -f "$csv" "$csv.tmp"
        if [ $which = kat ]; then
          timeout -k 5 "$t" "$train_bin" --data-dir "$data" --progress never --model "$model" \
            --epochs 2 --batch-size 128 --seed "$r" "${kat[@]}" --metrics "$csv" \
            >>"$log" 2>&1 || echo "$model $label kat run $r: exit $?" | tee -a "$log"
        else
          timeout -k 5 "$t" "$py" "$root/bench/compare_pytorch.py" --data-dir "$data" \
            --device "${KAT_COMPARE_DEVICE:-cuda}" --model "$model" --epochs 2 --batch-size 128 --seed "$r" \
            "${torch[@]}" >"$csv.tmp" 2>>"$log" && mv "$csv.tmp" "$csv" ||
            echo "$model $label torch run $r: exit $?" | tee -a "$log"
        fi
        # kat_train's CSV: epoch, wall_seconds, ..., test_accuracy (column 6);
        # compare_pytorch.py's: epoch, train_seconds, test_accuracy.
        [ ! -f "$csv" ] || awk -F, -v w="$which" -v name="$model $label $which run $r" '
          NR == 1 { next } { t = t sprintf(" %.3f", $2); acc = (w == "kat") ? $6 : $3 }
          END { printf "%s: epoch seconds%s; test accuracy %.2f%%\n", name, t, 100 * acc }' \
          "$csv" | tee -a "$log"
      done
    done
  done
  # Per model and optimizer, the median epoch-2 time of each and their ratio.
  python3 - "$log" <<'EOF' | tee "$work/compare-summary.txt"
import math, re, statistics, sys
runs = {}
pattern = r"^(\S+) (\S+) (kat|torch) run \d+: epoch seconds ([\d. ]+); test accuracy ([\d.]+)%"
for line in open(sys.argv[1]):
    m = re.match(pattern, line)
    if m:
        t = [float(v) for v in m.group(4).split()]
        runs.setdefault((m.group(1), m.group(2)), {}).setdefault(m.group(3), []).append(
            (t[1] if len(t) > 1 else math.nan, float(m.group(5))))
print(f"{'model':8} {'optimizer':9} {'KAT epoch 2':>12} {'PyTorch':>9} {'KAT/PyTorch':>12}"
      f" {'KAT acc':>8} {'PyTorch acc':>11}")
for (model, opt), r in runs.items():
    k = statistics.median(v[0] for v in r.get("kat", [(math.nan, math.nan)]))
    p = statistics.median(v[0] for v in r.get("torch", [(math.nan, math.nan)]))
    ka = r.get("kat", [(math.nan, math.nan)])[-1][1]
    pa = r.get("torch", [(math.nan, math.nan)])[-1][1]
    print(f"{model:8} {opt:9} {k:11.3f}s {p:8.3f}s {k / p:12.2f} {ka:7.2f}% {pa:10.2f}%")
EOF
}

# ---------------------------------------------------------------------------------------------
if [ "$action" = prepare ]; then
  prepare
  exit 0
fi
case $action in all | build | test | compare) ;; *)
  echo "usage: scripts/gpu_tests.sh [prepare|build|test|compare|all] [DIR]" >&2; exit 2 ;;
esac
[ -f "$dir/kokkos-src.tar.gz" ] || { echo "gpu_tests.sh: $dir is not prepared (prepare)" >&2; exit 1; }
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
export CUDA_HOME=$cuda_home
# cuBLAS for Kokkos Kernels and cuSOLVER for KAT where the toolkit has them.
has_lib() { ls "$cuda_home"/lib64/lib"$1".so* "$cuda_home"/targets/*/lib/lib"$1".so* >/dev/null 2>&1; }
cublas=OFF cusolver=OFF
if has_lib cublas; then cublas=ON; fi
if has_lib cusolver; then cusolver=ON; fi
export LD_LIBRARY_PATH=$dir/deps/lib:$cuda_home/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# CUDA 13's nvcc takes the default g++; nvcc_wrapper links with it too.
export NVCC_WRAPPER_DEFAULT_COMPILER=${NVCC_WRAPPER_DEFAULT_COMPILER:-g++}
generator="Unix Makefiles"
if command -v ninja >/dev/null; then generator=Ninja; fi
mkdir -p "$work" "$out"
# The carried libraries, unpacked, with their development links (links do not travel).
for f in "$dir"/deps/lib/*.so.*.gz; do
  [ ! -f "$f" ] || gunzip -f "$f"
done
ln -sf liblapack.so.3 "$dir/deps/lib/liblapack.so"
ln -sf libblas.so.3 "$dir/deps/lib/libblas.so"
ln -sf libz.so.1 "$dir/deps/lib/libz.so"
# Seconds the tests and the trainer runs leave for the comparison with PyTorch (all).
compare_reserve=0
if [ "$action" = all ] && [ "$budget" -gt 0 ]; then compare_reserve=${KAT_COMPARE_RESERVE:-0}; fi
if [ "$action" = all ] || [ "$action" = build ]; then
  stage info "$out/info.log" info
  grep -E 'release|^g\+\+|^cmake version|Driver Version|NVIDIA H|^name' "$out/info.log" | head -n 8
  note "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), cuBLAS $cublas, cuSOLVER $cusolver, $generator, $jobs jobs"
  if [ -f "$work/prefix/.kat-gpu-complete" ]; then
    note "kokkos: reused $work/prefix"
  else
    stage kokkos "$out/kokkos.log" build_kokkos
    if [ $status -eq 0 ]; then touch "$work/prefix/.kat-gpu-complete"; fi
  fi
  if [ $status -eq 0 ]; then stage configure "$out/kat-build.log" configure_kat; fi
  if [ $status -eq 0 ]; then stage build "$out/kat-build.log" build_kat; fi
  grep -E '^(build time:|objects:|kat_tests:| +[0-9]+ sm_| +[0-9.]+ (tests|examples)/)' "$out/kat-build.log" 2>/dev/null || true
fi
tests_bin=$work/kat/tests/kat_tests
train_bin=$work/kat/examples/kat_train
if [ "$action" != build ] && { [ $status -ne 0 ] || [ ! -x "$tests_bin" ]; } &&
  [ -f "$dir/prebuilt/kat_tests.gz" ]; then
  # The fallback: the binaries built elsewhere (see prepare), with their data folder linked.
  mkdir -p "$work/prebuilt"
  gunzip -c "$dir/prebuilt/kat_tests.gz" >"$work/prebuilt/kat_tests"
  gunzip -c "$dir/prebuilt/kat_train.gz" >"$work/prebuilt/kat_train"
  chmod +x "$work/prebuilt/kat_tests" "$work/prebuilt/kat_train"
  tests_bin=$work/prebuilt/kat_tests
  train_bin=$work/prebuilt/kat_train
  data_dir=$(cat "$dir/prebuilt/test-data-dir")
  if [ ! -e "$data_dir" ]; then
    mkdir -p "$(dirname "$data_dir")"
    ln -s "$dir/data/fashion-mnist" "$data_dir"
  fi
  note "USING THE PREBUILT BINARIES: $(cat "$dir/prebuilt/info")"
  status=0
fi
if { [ "$action" = all ] || [ "$action" = test ]; } && [ $status -eq 0 ]; then
  stage tests "$out/tests-run.log" run_tests
  if [ "${KAT_GPU_TRAIN:-1}" != 0 ]; then stage train "$out/tests-run.log" run_train; fi
fi
if { [ "$action" = all ] && [ "$compare_reserve" -gt 0 ]; } || [ "$action" = compare ]; then
  [ -x "$train_bin" ] || train_bin=$work/prebuilt/kat_train
  stage compare "$out/tests-run.log" run_compare
fi
echo "===== summary ($((SECONDS - start_time)) s in all)"
printf '%s\n' "${summary[@]}"
if [ -f "$out/tests-summary.txt" ]; then head -n 60 "$out/tests-summary.txt"; fi
grep -E '^(=== kat_train|=== not run|epoch|=== exit)' "$out/train.log" 2>/dev/null || true
if [ "$action" = all ] || [ "$action" = compare ] && [ -f "$work/compare-summary.txt" ]; then cat "$work/compare-summary.txt"; fi
exit $status
