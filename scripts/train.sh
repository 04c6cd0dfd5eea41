#!/usr/bin/env bash
# The main job: installs what is missing, builds the trainer (Serial Kokkos + OpenBLAS) and
# trains on Fashion-MNIST. Arguments go to kat_train (see `scripts/train.sh --help`); the
# default is the MLP with SGD (lr 0.05, momentum 0.9, batch 128) for 10 epochs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=${KAT_BUILD_DIR:-$root/build/serial}
# On up to 4 cores kat_train compiles in units of 6 files (KAT_UNITY_BUILD): less work in all
# (844 s of g++ -O3 for its 12 files apart, 462 s as one unit), while more cores finish
# sooner compiling the files side by side.
unity=OFF
[ "$(nproc)" -le 4 ] && unity=ON
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_TESTS=OFF \
  -DKAT_ENABLE_EXAMPLES=ON -DKAT_UNITY_BUILD=$unity >/dev/null
cmake --build "$build" --target kat_train -j "$(nproc)" >/dev/null
exec "$build/examples/kat_train" "$@"
