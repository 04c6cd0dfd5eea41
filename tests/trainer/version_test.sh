#!/usr/bin/env bash
# kat_train --version exits 0 and names the version CMakeLists.txt declares, then the Kokkos
# it was built with.
#   tests/trainer/version_test.sh KAT_TRAIN VERSION
set -euo pipefail
train=${1:?usage: version_test.sh KAT_TRAIN VERSION}
version=${2:?usage: version_test.sh KAT_TRAIN VERSION}
rc=0
out=$("$train" --version 2>&1) || rc=$?
echo "$out"
if [ "$rc" -ne 0 ]; then
  echo "version_test.sh: kat_train --version exited $rc, expected 0" >&2
  exit 1
fi
first=$(sed -n 1p <<<"$out")
if [ "$first" != "kat_train (KAT) $version" ]; then
  echo "version_test.sh: first line is '$first', expected 'kat_train (KAT) $version'" >&2
  exit 1
fi
if ! sed -n 2p <<<"$out" | grep -qE '^Kokkos [0-9]+\.[0-9]+\.[0-9]+, [A-Za-z]+ backend'; then
  echo "version_test.sh: second line is '$(sed -n 2p <<<"$out")', expected" \
    "'Kokkos X.Y.Z, <backend> backend...'" >&2
  exit 1
fi
echo "version_test.sh: ok"
