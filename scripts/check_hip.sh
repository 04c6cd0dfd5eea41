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
#   3. headers  one translation unit per public header, compiled to an object (host and
#               device code), -Werror
#   4. build    every test source, example and benchmark, compiled and linked; tests are not
#               discovered (Catch2 would run the binary, which needs a GPU)
#   5. objects  every object linked into the programs holds a code object for the architecture
#
# Debian packages neither rocBLAS nor rocSOLVER, so KAT uses its portable linear algebra
# (KAT_ENABLE_ROCSOLVER=OFF) and Kokkos Kernels its native GEMM.
#   KAT_HIP_ARCHS  the architectures to check, gfx90a (MI200, the default) and/or gfx908
#                  (MI100, Kokkos 3.4.1's own); each costs a full build (~8 min on 2 cores)
#   KAT_JOBS       parallel compile jobs (default: nproc)
# Exits non-zero, showing the compiler's error, when a stage fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${KAT_JOBS:-$(nproc)}
export KAT_JOBS=$jobs
archs=${KAT_HIP_ARCHS:-gfx90a}
for arch in $archs; do
  case $arch in
    gfx908 | gfx90a) ;;
    *) echo "check_hip.sh: KAT_HIP_ARCHS may name gfx908 and gfx90a, got '$arch'" >&2; exit 2 ;;
  esac
done
summary=()
# hipcc asks rocm_agent_enumerator for the GPU when a command names no architecture (links,
# CMake's compiler checks); with no GPU that prints a Python traceback. Name one instead.
export HCC_AMDGPU_TARGET=gfx908

# Runs "$@" as stage $1 with its output in build/check-hip-<stage>.log; prints the time
# taken, or the first compiler error and the log's tail on failure.
stage() {
  local name=$1 log=$root/build/check-hip-$1.log start=$SECONDS
  shift
  mkdir -p "$root/build"
  echo "== $name"
  # In the background: a function run as an if condition would ignore set -e.
  "$@" >"$log" 2>&1 &
  if ! wait $!; then
    echo "check_hip.sh: stage '$name' failed after $((SECONDS - start)) s; log: $log" >&2
    local first
    first=$(grep -n -m 1 -E 'error:|Error [0-9]+|CMake Error' "$log" | cut -d: -f1 || true)
    if [ -n "$first" ]; then
      echo "--- first error (line $first of the log)" >&2
      sed -n "$((first > 5 ? first - 5 : 1)),$((first + 40))p" "$log" >&2
    fi
    echo "--- end of the log" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  echo "   $name: $((SECONDS - start)) s"
  summary+=("$name $((SECONDS - start)) s")
}

install_hip() {
  "$root/scripts/setup.sh"
  local missing=() p
  for p in hipcc libamdhip64-dev; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
      missing+=("$p")
    fi
  done
  if ((${#missing[@]})); then
    echo "installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    # Waits for another apt-get (a concurrent setup) instead of failing on its lock.
    local wait=(-o DPkg::Lock::Timeout=600)
    $sudo apt-get "${wait[@]}" update -qq
    $sudo apt-get "${wait[@]}" install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

configure() { # configure DIR [extra cmake arguments]
  local dir=$1
  shift
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=hipcc \
    -DCMAKE_PREFIX_PATH="$prefix" -DKAT_ENABLE_TESTS=ON -DKAT_ENABLE_EXAMPLES=ON \
    -DKAT_ENABLE_BENCHMARKS=ON -DKAT_ENABLE_MPI=ON -DKAT_ENABLE_ROCSOLVER=OFF \
    -DKAT_DISCOVER_TESTS=OFF -DKAT_HEADER_CHECK_SYNTAX_ONLY=OFF "$@"
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
  for o in $(find "$dir/tests" "$dir/examples" "$dir/bench" -name '*.o' | sort); do
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
    configure "$root/build/check-hip-$arch"
  else
    configure "$root/build/check-hip-$arch" \
      -DCMAKE_CXX_FLAGS="--offload-arch=$arch --no-offload-arch=gfx908" \
      -DCMAKE_EXE_LINKER_FLAGS=-Wno-unused-command-line-argument
  fi
}

stage install install_hip
hipcc --version 2>/dev/null | sed -n 1,2p # HIP and clang versions
stage kokkos "$root/scripts/build_kokkos.sh" hip
prefix=$(tail -n 1 "$root/build/check-hip-kokkos.log")
for arch in $archs; do
  stage "configure-$arch" configure_arch "$arch"
  stage "headers-$arch" cmake --build "$root/build/check-hip-$arch" --target kat_header_check -j "$jobs"
  stage "build-$arch" cmake --build "$root/build/check-hip-$arch" -j "$jobs"
  stage "objects-$arch" code_objects "$root/build/check-hip-$arch" "$arch"
done

times=$(printf '%s, ' "${summary[@]}")
echo "check_hip.sh: OK: headers, tests, examples and benchmarks compiled and linked for" \
  "${archs// / and } (${times%, })"
