#!/usr/bin/env bash
# The main job: installs what is missing, builds the trainer (Serial Kokkos + OpenBLAS) and
# trains on Fashion-MNIST. Arguments go to kat_train (see `scripts/train.sh --help`); the
# default is the MLP with SGD (lr 0.05, momentum 0.9, batch 128) for 10 epochs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=${KAT_BUILD_DIR:-$root/build/serial}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_TESTS=OFF \
  -DKAT_ENABLE_EXAMPLES=ON >/dev/null
cmake --build "$build" --target kat_train -j "$(nproc)" >/dev/null
exec "$build/examples/kat_train" "$@"
