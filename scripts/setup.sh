#!/usr/bin/env bash
# Installs KAT's build, test and data dependencies from Debian packages.
# Idempotent: when everything is present it prints nothing and touches nothing.
set -euo pipefail
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

packages=(
  build-essential cmake pkg-config
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  libopenblas0-pthread libopenblas-pthread-dev liblapack-dev
  libopenblas0-openmp # shares the OpenMP runtime with Kokkos's OpenMP backend
  libopenmpi-dev openmpi-bin
  catch2 libbenchmark-dev zlib1g-dev
  dataset-fashion-mnist
  libcli11-dev # the example trainer's command line
  nlohmann-json3-dev # kat::plan's plans as JSON (kat_plan, the tests)
  libdnnl-dev  # oneDNN: Conv2d on host memory (KAT_ENABLE_ONEDNN)
  ocl-icd-opencl-dev # dnnl-config.cmake calls find_package(OpenCL REQUIRED); only a Recommends
  dpkg-dev     # apt-get source, for the OpenMP Kokkos build
  doxygen graphviz # the API reference from the headers' comments (scripts/api_docs.sh)
  python3-matplotlib # scripts/plot_metrics.py: training curves as PNG (scripts/check_plots.sh)
)

mapfile -t missing < <(kat_missing "${packages[@]}")
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  kat_apt_install -- "${missing[@]}"
fi
