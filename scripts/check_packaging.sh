#!/usr/bin/env bash
# Checks what HPC sites install KAT with, in about two minutes on 2 cores:
#   recipe   the Spack recipe (spack/packages/kat/package.py) compiles as Python, and without
#            Spack its versions, variants, dependencies and cmake_args() agree with
#            CMakeLists.txt (tests/packaging/check_spack_recipe.py)
#   presets  CMakePresets.json names only options KAT has (tests/packaging/check_presets.py),
#            `cmake --list-presets` reads it, and the serial preset configures, with the
#            preset's values in the cache, kat/version.hpp and kat.pc generated; so do the
#            openmp, cuda-sm80 and hip-gfx90a presets where scripts/build_kokkos.sh,
#            check_cuda.sh and check_hip.sh left their Kokkos and compilers, else the script
#            says which it skipped; for CUDA and HIP, the install test's consumer is compiled
#            and linked with nothing but the installed kat.pc's flags (not run: no GPU here);
#            about 40 s each
# The pkg-config file itself is tested by ctest (install_and_pkg_config, scripts/test.sh).
#   KAT_DEPS_DIR  where scripts/build_kokkos.sh keeps its prefixes (default ~/.cache/kat)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=lib/common.sh
. "$root/scripts/lib/common.sh"
"$root/scripts/setup.sh"
mapfile -t missing < <(kat_missing python3)
if ((${#missing[@]})); then
  echo "check_packaging: installing ${missing[*]}"
  kat_apt_install -- "${missing[@]}"
fi
deps=${KAT_DEPS_DIR:-$HOME/.cache/kat}
mkdir -p "$root/build"
work=$(mktemp -d "$root/build/check-packaging.XXXXXX")
trap 'rm -rf "$work"' EXIT
logs=$root/build/check-packaging
version=$(sed -n 's/^project(KAT VERSION \([0-9.]*\) .*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "check_packaging.sh: no project(KAT VERSION ...) in CMakeLists.txt" >&2; exit 1; }

recipe() {
  python3 -c 'import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)' \
    spack/packages/kat/package.py "$work/package.pyc"
  echo "py_compile: spack/packages/kat/package.py compiles"
  python3 tests/packaging/check_spack_recipe.py
}

# expect_cache BUILD NAME VALUE: the configured cache holds NAME=VALUE.
expect_cache() {
  local got
  got=$(sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt")
  if [ "$got" != "$3" ]; then
    echo "check_packaging.sh: $1: $2 is '$got' in the cache, expected '$3'" >&2
    return 1
  fi
}

# configure_preset NAME [cmake arguments]: configures the preset into a scratch folder and checks
# what it generated.
configure_preset() {
  local name=$1 dir=$work/$1
  shift
  cmake --preset "$name" -B "$dir" "$@"
  expect_cache "$dir" KAT_ENABLE_MPI ON
  expect_cache "$dir" KAT_UNITY_BUILD ON
  expect_cache "$dir" CMAKE_BUILD_TYPE Release
  grep -qx "#define KAT_VERSION_STRING \"$version\"" "$dir/include/kat/version.hpp" ||
    { echo "check_packaging.sh: $dir/include/kat/version.hpp lacks version $version" >&2; return 1; }
  grep -qx "Version: $version" "$dir/kat.pc" ||
    { echo "check_packaging.sh: $dir/kat.pc lacks 'Version: $version'" >&2; return 1; }
  echo "preset $name: configured; kat.pc says: $(grep '^Cflags:' "$dir/kat.pc")"
}

# link_consumer NAME CXX [compiler flags]: installs the configured preset NAME and compiles,
# then links, the install test's consumer with CXX and nothing but the installed kat.pc's flags
# (in two steps: hipcc compiles every input of a command that names a .cpp as HIP, archives
# too). The program is not run: it needs the GPU.
link_consumer() {
  local name=$1 cxx=$2 dir=$work/$1
  shift 2
  cmake --install "$dir" --prefix "$dir-prefix" >/dev/null
  local pc=("$dir-prefix"/lib*/pkgconfig)
  # shellcheck disable=SC2046 # pkg-config's words, split as a user's shell splits them
  "$cxx" -std=c++17 -O1 "$@" $(PKG_CONFIG_PATH=${pc[0]} pkg-config --cflags kat) \
    -c tests/install/consumer/main.cpp -o "$dir/consumer.o"
  # shellcheck disable=SC2046
  "$cxx" "$@" "$dir/consumer.o" -o "$dir/consumer" $(PKG_CONFIG_PATH=${pc[0]} pkg-config --libs kat)
  echo "preset $name: the consumer compiled and linked with $(basename "$cxx") and kat.pc's flags"
}

presets() {
  python3 tests/packaging/check_presets.py
  cmake --list-presets=all
  local n
  n=$(cmake --list-presets=configure | grep -c '^  "')
  [ "$n" -eq 5 ] || { echo "check_packaging.sh: cmake lists $n configure presets, expected 5" >&2; return 1; }
  configure_preset serial
  if [ -f "$deps/kokkos-openmp/.kat-complete" ]; then
    configure_preset openmp -DCMAKE_PREFIX_PATH="$deps/kokkos-openmp"
    expect_cache "$work/openmp" Kokkos_DIR "$deps/kokkos-openmp/lib/cmake/Kokkos"
  else
    echo "preset openmp: not configured: no Kokkos in $deps/kokkos-openmp (scripts/build_kokkos.sh openmp)"
  fi
  # The GPU presets where scripts/check_cuda.sh and check_hip.sh left their toolchains and
  # Kokkos (about 20 s each: the compilers' checks).
  if [ -f "$deps/kokkos-cuda/.kat-complete" ] && [ -x /usr/bin/nvcc ] && command -v g++-11 >/dev/null; then
    configure_preset cuda-sm80 -DCMAKE_PREFIX_PATH="$deps/kokkos-cuda" \
      -DCMAKE_CXX_COMPILER="$deps/kokkos-cuda/bin/nvcc_wrapper"
    grep -q -- '-arch=sm_80' "$work/cuda-sm80/kat.pc" ||
      { echo "check_packaging.sh: the cuda-sm80 preset's kat.pc lacks -arch=sm_80" >&2; return 1; }
    PATH=/usr/bin:$PATH NVCC_WRAPPER_DEFAULT_COMPILER=g++-11 \
      link_consumer cuda-sm80 "$deps/kokkos-cuda/bin/nvcc_wrapper"
  else
    echo "preset cuda-sm80: not configured: no CUDA Kokkos in $deps/kokkos-cuda or no Debian nvcc (scripts/check_cuda.sh)"
  fi
  if [ -f "$deps/kokkos-hip/.kat-complete" ] && command -v hipcc >/dev/null; then
    configure_preset hip-gfx90a -DCMAKE_PREFIX_PATH="$deps/kokkos-hip"
    HCC_AMDGPU_TARGET=gfx908 link_consumer hip-gfx90a hipcc --offload-arch=gfx90a --no-offload-arch=gfx908
  else
    echo "preset hip-gfx90a: not configured: no HIP Kokkos in $deps/kokkos-hip or no hipcc (scripts/check_hip.sh)"
  fi
}

kat_stage recipe "$logs-recipe.log" recipe
tail -n 1 "$logs-recipe.log" | sed 's/^/   /'
kat_stage presets "$logs-presets.log" presets
grep '^preset ' "$logs-presets.log" | cut -c1-160 | sed 's/^/   /'
echo "check_packaging.sh: OK: Spack recipe and CMake presets of KAT $version ($(kat_stage_summary))"
