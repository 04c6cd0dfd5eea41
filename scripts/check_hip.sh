#!/usr/bin/env bash
# Compile-and-link check of KAT's HIP (AMD GPU) backend with Debian's own ROCm (hipcc, ROCm
# 5.2): no GPU is needed, and none is used. It proves that every public header, test, example
# and benchmark compiles for the device and links, so the HIP half of the portability promise
# cannot rot on machines without an AMD GPU.
#
#   1. install  scripts/setup.sh, then Debian's hipcc and libamdhip64-dev (if missing)
#   2. kokkos   Kokkos + Kokkos Kernels 3.4.1, HIP backend, gfx908, Kokkos's own objects also
#               for gfx90a (scripts/build_kokkos.sh hip; cached in ~/.cache/kat). Kokkos 3.4.1
#               has no gfx90a architecture; see docs/backends.md, "HIP (compile check)".
#   then for each architecture in KAT_HIP_ARCHS, in build/check-hip-<arch>:
#   3. headers  every public header compiled to an object (host and device code), 40 to a
#               translation unit (each on its own is g++'s check in scripts/test.sh), -Werror
#   4. build    every test source, example and benchmark, compiled and linked; tests are not
#               discovered (Catch2 would run the binary, which needs a GPU)
#   5. objects  every object linked into the programs holds a code object for the architecture
#
# Debian packages neither rocBLAS nor rocSOLVER, so KAT uses its portable linear algebra
# (KAT_ENABLE_ROCSOLVER=OFF) and Kokkos Kernels its native GEMM.
#   KAT_HIP_ARCHS  the architectures to check, gfx90a (MI200, the default) and/or gfx908
#                  (MI100, Kokkos 3.4.1's own); each costs a full build (~8 min on 2 cores)
#   KAT_JOBS       parallel compile jobs (default: nproc)
#   KAT_GPU_CHECK_BUILD  what the build stage builds: some of "tests examples benchmarks"
#                  (default all three; CI builds the examples and benchmarks,
#                  see .ci/run)
# Exits non-zero, showing the compiler's error, when a stage fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
kat_gpu_check_parts >/dev/null || exit 2
jobs=${KAT_JOBS:-$(nproc)}
export KAT_JOBS=$jobs
archs=${KAT_HIP_ARCHS:-gfx90a}
for arch in $archs; do
  case $arch in
    gfx908 | gfx90a) ;;
    *) echo "check_hip.sh: KAT_HIP_ARCHS may name gfx908 and gfx90a, got '$arch'" >&2; exit 2 ;;
  esac
done
# hipcc asks rocm_agent_enumerator for the GPU when a command names no architecture (links,
# CMake's compiler checks); with no GPU that prints a Python traceback. Name one instead.
export HCC_AMDGPU_TARGET=gfx908

install_hip() {
  "$root/scripts/setup.sh"
  local missing
  mapfile -t missing < <(kat_missing hipcc libamdhip64-dev)
  if ((${#missing[@]})); then
    echo "installing ${missing[*]}"
    kat_apt_install -- "${missing[@]}"
  fi
}

# Nothing built here runs, so it compiles unoptimized: the tests' unity unit 4 (six files)
# took 185 s at -O0 against 296 s at -O1 (2026-11-25). Kokkos 4.x crashes ROCm 5.2's gfx90a
# backend at -O0 ("Cannot select: intrinsic %llvm.amdgcn.permlanex16"); Kokkos 3.4.1 does not.
# Without oneDNN (KAT_ENABLE_ONEDNN=OFF): the CUDA check and the host builds compile KAT with
# it, so this one compiles the branches for builds that lack it.
# KAT_UNITY_BUILD: batches of test files and of kat_train's (sizes and timings: scripts/test.sh).
configure() { # configure DIR FLAGS [extra cmake arguments]
  local dir=$1 flags=$2
  shift 2
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O0${flags:+ $flags}" \
    -DCMAKE_CXX_COMPILER=hipcc \
    -DCMAKE_PREFIX_PATH="$prefix" $(kat_gpu_check_cmake_args) \
    -DKAT_ENABLE_MPI=ON -DKAT_ENABLE_ROCSOLVER=OFF \
    -DKAT_DISCOVER_TESTS=OFF -DKAT_HEADER_CHECK_SYNTAX_ONLY=OFF -DKAT_UNITY_BUILD=ON \
    -DKAT_HEADER_CHECK_BATCH_SIZE=40 -DKAT_ENABLE_ONEDNN=OFF "$@"
}

# The GPU targets of OBJECT's offload bundle (its .hip_fatbin section), one a line.
bundle_targets() { # bundle_targets OBJECT SCRATCH_FILE
  objcopy --dump-section .hip_fatbin="$2" "$1" 2>/dev/null || return 0
  clang-offload-bundler-15 --list --type=o --input="$2" 2>/dev/null | grep amdgcn || true
}

# Every object linked into the programs of build DIR holds an ARCH code object: each of KAT's
# objects, and each object with device code in the Kokkos libraries. (roc-obj-ls, which
# reads linked programs, misses code objects in bundles with more than one GPU target.)
code_objects() { # code_objects DIR ARCH
  local dir=$1 arch=$2 tmp o lib targets n=0 k=0
  tmp=$dir/code-objects
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for o in $(find "$dir/tests" "$dir/examples" "$dir/bench" -name '*.o' 2>/dev/null | sort); do
    # kat_mpi_alpha_beta times MPI collectives on host buffers: no Kokkos, no device code.
    case $o in */kat_mpi_alpha_beta.dir/*) continue ;; esac
    if ! bundle_targets "$o" "$tmp/fatbin" | grep -qx "hipv4-amdgcn-amd-amdhsa--$arch"; then
      echo "error: $o has no $arch code object" >&2
      return 1
    fi
    n=$((n + 1))
  done
  for lib in "$prefix"/lib*/libkokkos*.a; do
    mkdir "$tmp/lib"
    (cd "$tmp/lib" && ar x "$lib")
    for o in "$tmp"/lib/*.o; do
      targets=$(bundle_targets "$o" "$tmp/fatbin")
      [ -n "$targets" ] || continue
      if ! grep -qx "hipv4-amdgcn-amd-amdhsa--$arch" <<<"$targets"; then
        echo "error: $(basename "$lib"): $(basename "$o") has no $arch code object" >&2
        return 1
      fi
      k=$((k + 1))
    done
    rm -rf "${tmp:?}/lib"
  done
  rm -rf "$tmp"
  [ "$n" -gt 0 ] || { echo "error: no objects in $dir" >&2; return 1; }
  echo "$arch code objects in all $n of KAT's objects in $dir and in the $k Kokkos objects" \
    "with device code"
}

# Configures build/check-hip-ARCH for ARCH. Kokkos 3.4.1 cannot be configured for gfx90a (no
# Kokkos_ARCH_VEGA90A), so its exported target names gfx908; for any other ARCH clang's
# --no-offload-arch drops that for KAT's sources. (CMAKE_CXX_FLAGS reach the link command too,
# where clang calls them unused.)
configure_arch() { # configure_arch ARCH
  local arch=$1
  if [ "$arch" = gfx908 ]; then
    configure "$root/build/check-hip-$arch" ""
  else
    configure "$root/build/check-hip-$arch" "--offload-arch=$arch --no-offload-arch=gfx908" \
      -DCMAKE_EXE_LINKER_FLAGS=-Wno-unused-command-line-argument
  fi
}

logs=$root/build/check-hip
kat_stage install "$logs-install.log" install_hip
hipcc --version 2>/dev/null | sed -n 1,2p # HIP and clang versions
kat_stage kokkos "$logs-kokkos.log" "$root/scripts/build_kokkos.sh" hip
prefix=$(tail -n 1 "$logs-kokkos.log")
for arch in $archs; do
  dir=$root/build/check-hip-$arch
  kat_stage "configure-$arch" "$logs-configure-$arch.log" configure_arch "$arch"
  kat_stage "headers-$arch" "$logs-headers-$arch.log" \
    cmake --build "$dir" --target kat_header_check -j "$jobs"
  kat_stage "build-$arch" "$logs-build-$arch.log" kat_gpu_check_build "$dir" "$jobs"
  kat_stage "objects-$arch" "$logs-objects-$arch.log" code_objects "$dir" "$arch"
done

echo "check_hip.sh: OK: headers + $(kat_gpu_check_parts) compiled and linked for" \
  "${archs// / and } ($(kat_stage_summary))"
