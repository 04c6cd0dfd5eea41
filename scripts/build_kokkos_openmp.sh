#!/usr/bin/env bash
# Builds Kokkos and Kokkos Kernels 3.4.1 with the OpenMP backend from Debian's `trilinos`
# source package into a local prefix, so the test suite can run on a threaded backend too
# (the Debian binary packages are Serial only).
#
# The prefix is cached: a second run with the same source version does nothing.
#   KAT_DEPS_DIR   where sources, build trees and the prefix live (default ~/.cache/kat)
# Prints the install prefix on its last line.
set -euo pipefail

deps=${KAT_DEPS_DIR:-$HOME/.cache/kat}
prefix=$deps/kokkos-openmp
stamp=$prefix/.kat-complete
jobs=${KAT_JOBS:-$(nproc)}

if [ -f "$stamp" ]; then
  echo "$prefix"
  exit 0
fi

mkdir -p "$deps"
work=$(mktemp -d "$deps/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A private apt configuration with deb-src entries derived from the machine's own sources,
# so the system's apt setup is left untouched and no host name is written anywhere.
apt_dir=$work/apt
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial"
shopt -s nullglob
for f in /etc/apt/sources.list.d/*.sources; do
  sed -E 's/^Types:.*$/Types: deb-src/' "$f" >"$apt_dir/sources.list.d/$(basename "$f")"
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  sed -nE 's/^[[:space:]]*deb[[:space:]]+/deb-src /p' "$f" >"$apt_dir/sources.list.d/$(basename "$f").list"
done
shopt -u nullglob
apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
  -o "Dir::State::Lists=$apt_dir/lists" -o APT::Sandbox::User=root -qq)
echo "build_kokkos_openmp: fetching the trilinos source package" >&2
apt-get "${apt_opts[@]}" update
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only trilinos >/dev/null)

tarball=$(ls "$work"/trilinos_*.orig.tar.* | head -n 1)
echo "build_kokkos_openmp: extracting packages/kokkos{,-kernels} from $(basename "$tarball")" >&2
mkdir -p "$work/src"
tar -xf "$tarball" -C "$work/src" --strip-components=1 --wildcards \
  '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'

common=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++ -DCMAKE_CXX_STANDARD=17
  -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=ON)

echo "build_kokkos_openmp: building Kokkos (OpenMP + Serial) into $prefix" >&2
cmake -S "$work/src/packages/kokkos" -B "$work/kokkos" "${common[@]}" \
  -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON >"$work/kokkos.log" 2>&1 ||
  { cat "$work/kokkos.log"; exit 1; }
cmake --build "$work/kokkos" -j "$jobs" >>"$work/kokkos.log" 2>&1 || { tail -50 "$work/kokkos.log"; exit 1; }
cmake --install "$work/kokkos" >>"$work/kokkos.log" 2>&1

echo "build_kokkos_openmp: building Kokkos Kernels (BLAS + LAPACK TPLs, no ETI)" >&2
cmake -S "$work/src/packages/kokkos-kernels" -B "$work/kk" "${common[@]}" \
  -DKokkos_ROOT="$prefix" -DKokkosKernels_ENABLE_TPL_BLAS=ON -DKokkosKernels_ENABLE_TPL_LAPACK=ON \
  -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
  -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF \
  -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF \
  -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_LAYOUTLEFT=OFF \
  >"$work/kk.log" 2>&1 || { cat "$work/kk.log"; exit 1; }
cmake --build "$work/kk" -j "$jobs" >>"$work/kk.log" 2>&1 || { tail -50 "$work/kk.log"; exit 1; }
cmake --install "$work/kk" >>"$work/kk.log" 2>&1

touch "$stamp"
echo "$prefix"
