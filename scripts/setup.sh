#!/usr/bin/env bash
# Installs KAT's build, test and data dependencies from Debian packages.
# Idempotent: when everything is present it prints nothing and touches nothing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  libopenblas0-pthread libopenblas-pthread-dev liblapack-dev
  libopenblas0-openmp # shares the OpenMP runtime with Kokkos's OpenMP backend
  libopenmpi-dev openmpi-bin
  catch2 libbenchmark-dev zlib1g-dev
  dataset-fashion-mnist
  libcli11-dev # the example trainer's command line
  dpkg-dev     # apt-get source, for the OpenMP Kokkos build
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
