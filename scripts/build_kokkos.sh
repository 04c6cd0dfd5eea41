#!/usr/bin/env bash
# Builds Kokkos and Kokkos Kernels 3.4.1 for one backend from Debian's `trilinos` source
# package into a cached prefix, for the backends Debian's binary packages (Serial only) lack.
#
#   scripts/build_kokkos.sh openmp   OpenMP + Serial, g++; Kokkos Kernels with BLAS/LAPACK
#   scripts/build_kokkos.sh cuda     CUDA (sm_80, Ampere) + Serial, nvcc_wrapper; Kokkos
#                                    Kernels with cuBLAS. For compile checks: Kokkos 3.4.1
#                                    aborts at start on a GPU of another major compute
#                                    capability (an H200, 9.0, 2026-11-26), PTX or not;
#                                    scripts/gpu_tests.sh builds an sm_90 one to run there.
#                                    Needs nvcc (scripts/check_cuda.sh installs it).
#   scripts/build_kokkos.sh hip      HIP (gfx908 for consumers; Kokkos's own objects also
#                                    carry gfx90a code) + Serial, hipcc; Kokkos Kernels
#                                    without TPLs (Debian packages neither rocBLAS nor
#                                    rocSOLVER). Needs hipcc (scripts/check_hip.sh installs it).
#
# The extracted sources ($KAT_DEPS_DIR/src-<version>) and each prefix
# ($KAT_DEPS_DIR/kokkos-<backend>) are cached: a second run with the same source version
# prints the prefix and does nothing else.
#   KAT_DEPS_DIR   where sources, build trees and prefixes live (default ~/.cache/kat)
#   KAT_JOBS       parallel build jobs (default: nproc)
# Prints the install prefix on its last line; progress goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
backend=${1:-}
case $backend in
  openmp | cuda | hip) ;;
  *) echo "build_kokkos.sh: the backend must be openmp, cuda or hip, got '${backend}'" >&2; exit 2 ;;
esac

deps=${KAT_DEPS_DIR:-$HOME/.cache/kat}
jobs=${KAT_JOBS:-$(nproc)}
# The source package matching the installed Debian Kokkos, so every backend builds the
# same 3.4.1 sources the Serial tests use.
version=$(dpkg-query -W -f='${Version}' libtrilinos-kokkos-dev 2>/dev/null || true)
if [ -z "$version" ]; then
  echo "build_kokkos.sh: libtrilinos-kokkos-dev is not installed; run scripts/setup.sh" >&2
  exit 1
fi
src=$deps/src-${version//[:~]/_}
prefix=$deps/kokkos-$backend
stamp=$prefix/.kat-complete
# What the prefix is built from; a cached prefix with another id is rebuilt.
build_id=$version
[ "$backend" != hip ] || build_id="$version gfx908+gfx90a"
[ "$backend" != openmp ] || build_id="$version openmp-openblas"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$build_id" ]; then
  echo "$prefix"
  exit 0
fi

mkdir -p "$deps"
work=$(mktemp -d "$deps/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ ! -f "$src/.kat-complete" ]; then
  # shellcheck source=lib/private_apt.sh
  . "$root/scripts/lib/private_apt.sh"
  kat_private_apt "$work/apt" deb-src
  echo "build_kokkos.sh: fetching the trilinos source package ($version)" >&2
  apt-get "${kat_apt_opts[@]}" update
  (cd "$work" && apt-get "${kat_apt_opts[@]}" source --download-only "trilinos=$version" >/dev/null)
  tarball=$(ls "$work"/trilinos_*.orig.tar.* | head -n 1)
  echo "build_kokkos.sh: extracting packages/kokkos{,-kernels} from $(basename "$tarball")" >&2
  rm -rf "$src"
  mkdir -p "$src"
  tar -xf "$tarball" -C "$src" --strip-components=1 --wildcards \
    '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  rm -f "$work"/trilinos_*
  touch "$src/.kat-complete"
fi

common=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 -DCMAKE_INSTALL_PREFIX="$prefix"
  -DKokkos_ENABLE_SERIAL=ON)
kk=(-DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF
  -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF
  -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF
  -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_LAYOUTLEFT=OFF)
case $backend in
  openmp)
    common+=(-DCMAKE_CXX_COMPILER=g++ -DBUILD_SHARED_LIBS=ON)
    kokkos=(-DKokkos_ENABLE_OPENMP=ON)
    # The BLAS and LAPACK of Debian's OpenMP OpenBLAS (scripts/openmp_blas_dir.sh), which share
    # the OpenMP runtime with Kokkos, not the default pthread one: the exported targets then
    # name the same libraries that KAT links for OpenMP builds (cmake/KATOpenMPBLAS.cmake).
    blas_dir=$("$root/scripts/openmp_blas_dir.sh")
    kk+=(-DKokkosKernels_ENABLE_TPL_BLAS=ON -DKokkosKernels_ENABLE_TPL_LAPACK=ON
      -DBLAS_LIBRARIES=libblas.so.3 -DBLAS_LIBRARY_DIRS="$blas_dir"
      -DLAPACK_LIBRARIES=liblapack.so.3 -DLAPACK_LIBRARY_DIRS="$blas_dir")
    ;;
  cuda)
    command -v nvcc >/dev/null || { echo "build_kokkos.sh: nvcc not found on PATH" >&2; exit 1; }
    common+=(-DCMAKE_CXX_COMPILER="$src/packages/kokkos/bin/nvcc_wrapper")
    kokkos=(-DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ARCH_AMPERE80=ON)
    kk+=(-DKokkosKernels_ENABLE_TPL_CUBLAS=ON)
    ;;
  hip)
    command -v hipcc >/dev/null || { echo "build_kokkos.sh: hipcc not found on PATH" >&2; exit 1; }
    # Kokkos 3.4.1 knows only the Vega architectures (not gfx90a); see docs/backends.md.
    # Kokkos's own objects get gfx90a code too, so that programs compiled for gfx90a against
    # this prefix (scripts/check_hip.sh) have it in every code object; the exported target
    # still names gfx908 only.
    common+=(-DCMAKE_CXX_COMPILER=hipcc -DCMAKE_CXX_FLAGS=--offload-arch=gfx90a)
    kokkos=(-DKokkos_ENABLE_HIP=ON -DKokkos_ARCH_VEGA908=ON)
    ;;
esac

echo "build_kokkos.sh: building Kokkos ($backend + Serial) into $prefix" >&2
rm -rf "$prefix"
cmake -S "$src/packages/kokkos" -B "$work/kokkos" "${common[@]}" "${kokkos[@]}" \
  >"$work/kokkos.log" 2>&1 || { cat "$work/kokkos.log" >&2; exit 1; }
cmake --build "$work/kokkos" -j "$jobs" >>"$work/kokkos.log" 2>&1 ||
  { tail -50 "$work/kokkos.log" >&2; exit 1; }
cmake --install "$work/kokkos" >>"$work/kokkos.log" 2>&1

echo "build_kokkos.sh: building Kokkos Kernels ($backend, no ETI)" >&2
cmake -S "$src/packages/kokkos-kernels" -B "$work/kk" "${common[@]}" -DKokkos_ROOT="$prefix" \
  "${kk[@]}" >"$work/kk.log" 2>&1 || { cat "$work/kk.log" >&2; exit 1; }
cmake --build "$work/kk" -j "$jobs" >>"$work/kk.log" 2>&1 || { tail -50 "$work/kk.log" >&2; exit 1; }
cmake --install "$work/kk" >>"$work/kk.log" 2>&1

echo "$build_id" >"$stamp"
echo "$prefix"
