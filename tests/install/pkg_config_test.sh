#!/usr/bin/env bash
# Installs KAT from a build tree into a scratch prefix, then compiles the install test's
# consumer (tests/install/consumer/main.cpp) without CMake, with the build's C++ compiler and
# nothing but what `pkg-config --cflags --libs kat` prints, runs it, and checks what it says.
#
#   pkg_config_test.sh SOURCE_DIR BINARY_DIR WORK_DIR CXX KAT_VERSION KOKKOS_VERSION
#     KAT_VERSION     the version CMakeLists.txt declares (0.2.0)
#     KOKKOS_VERSION  the Kokkos the build found (3.4.01), or "": the consumer checks its headers
set -euo pipefail
if [ $# -ne 6 ]; then
  echo "usage: pkg_config_test.sh SOURCE_DIR BINARY_DIR WORK_DIR CXX KAT_VERSION KOKKOS_VERSION" >&2
  exit 2
fi
src=$1 bin=$2 work=$3 cxx=$4 version=$5 kokkos=$6
command -v pkg-config >/dev/null ||
  { echo "pkg_config_test.sh: pkg-config is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
number() { # number X.Y.Z -> X * 10000 + Y * 100 + Z (Kokkos writes 3.4.01: base 10)
  [[ $1 =~ ^([0-9]+)\.([0-9]+)\.([0-9]+) ]] ||
    { echo "pkg_config_test.sh: '$1' is not a version X.Y.Z" >&2; return 1; }
  echo $((10#${BASH_REMATCH[1]} * 10000 + 10#${BASH_REMATCH[2]} * 100 + 10#${BASH_REMATCH[3]}))
}
kat_number=$(number "$version")
# The Kokkos headers' version is checked when the build knew the package's version.
kokkos_define=()
[ -z "$kokkos" ] || kokkos_define=(-DKAT_EXPECTED_KOKKOS_VERSION="$(number "$kokkos")")

rm -rf "$work"
mkdir -p "$work"
cmake --install "$bin" --prefix "$work/prefix" >"$work/install.log"
mapfile -t pcs < <(find "$work/prefix" -name kat.pc)
if [ "${#pcs[@]}" -ne 1 ] || [[ ${pcs[0]} != "$work"/prefix/lib*/pkgconfig/kat.pc ]]; then
  echo "pkg_config_test.sh: expected one kat.pc in $work/prefix/lib*/pkgconfig, found: ${pcs[*]:-none}" >&2
  exit 1
fi
export PKG_CONFIG_PATH=$(dirname "${pcs[0]}")
echo "kat.pc: ${pcs[0]}"
found=$(pkg-config --modversion kat)
if [ "$found" != "$version" ]; then
  echo "pkg_config_test.sh: pkg-config --modversion kat says '$found', expected '$version'" >&2
  exit 1
fi
cflags=$(pkg-config --cflags kat)
libs=$(pkg-config --libs kat)
echo "pkg-config --cflags kat: $cflags"
echo "pkg-config --libs kat: $libs"
# KAT's headers must come from the prefix, not from the source or build tree (which hold the
# prefix here, so each -I is resolved and compared).
prefix=$(realpath "$work/prefix")
for word in $cflags; do
  [[ $word == -I* ]] || continue
  dir=$(realpath -m "${word#-I}")
  [[ $dir == "$prefix"/* ]] && continue
  for tree in "$(realpath "$src")" "$(realpath "$bin")"; do
    if [[ $dir == "$tree" || $dir == "$tree"/* ]]; then
      echo "pkg_config_test.sh: --cflags names $dir, in $tree, not in the installed prefix" >&2
      exit 1
    fi
  done
done
# shellcheck disable=SC2086 # pkg-config's words, split as a user's shell splits them
"$cxx" -std=c++17 -O2 -DKAT_EXPECTED_VERSION="$kat_number" "${kokkos_define[@]}" $cflags "$src/tests/install/consumer/main.cpp" \
  -o "$work/kat_pc_consumer" $libs
out=$(env -u LD_LIBRARY_PATH "$work/kat_pc_consumer")
echo "$out"
if ! grep -qF "consumer: KAT $version, " <<<"$out" || ! grep -q " ok$" <<<"$out"; then
  echo "pkg_config_test.sh: the consumer did not report KAT $version and a correct result" >&2
  exit 1
fi
echo "pkg_config_test.sh: ok: $(basename "$cxx") with pkg-config's flags built and ran the consumer"
