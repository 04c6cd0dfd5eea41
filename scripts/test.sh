#!/usr/bin/env bash
# Installs what is missing, then builds and runs the whole test suite, with MPI (Open MPI), in
# these configurations:
#   openmp    Kokkos 3.4.1 with the OpenMP backend, built from Debian's trilinos source
#             package (cached; see scripts/build_kokkos.sh), -O2
#   sanitize  Debian's Kokkos 3.4.1 (Serial backend), -O0, with AddressSanitizer and
#             UndefinedBehaviorSanitizer; any report fails the test that caused it
#   serial    the Serial backend without sanitizers, -O3, with the benchmarks (not run by
#             default: the sanitize configuration runs the same suite on the same backend, and
#             scripts/check_cuda.sh and check_hip.sh compile and link the benchmarks)
# and prints how long each stage took.
#   KAT_BACKENDS="openmp sanitize"   which configurations to test (default these two)
#   KAT_TEST_FAST=1   builds kat_tests only (no examples, benchmarks or header check) and runs
#                     its single-process cases and the MPI cases at 1 and 2 ranks (CI's
#                     bare Debian system runs KAT_BACKENDS=sanitize instead, and the host
#                     KAT_BACKENDS=openmp: see .ci/run)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
jobs=$(nproc)
backends=${KAT_BACKENDS:-openmp sanitize}

stage_start=$SECONDS
stage() { # prints the time the previous stage took, then names the next one
  echo "== $1 (previous stage: $((SECONDS - stage_start)) s)"
  stage_start=$SECONDS
}

for backend in $backends; do
  build=$root/build/test-$backend
  # MPI on for every configuration: ctest then also runs the "[mpi]" tests under mpiexec at
  # 1, 2, 3 and 4 ranks (tests mpi_ranks_*, one OpenMP thread per rank; see tests/CMakeLists.txt).
  # Unity build (KAT_UNITY_BUILD): the test files compile 24 to a translation unit (two units,
  # one per core) and kat_train's 6, so Kokkos, Catch2 and KAT are parsed and instantiated once
  # per batch; 6 files took 59 s of CPU as one unit against 126 s apart (g++ -O3), 12 sanitized
  # files 267 s against 329 s as two units of 6 (2026-11-25), and kat_train's 12 files 152 s
  # against 438 s apart at -O0, 462 s against 844 s at -O3 (2026-11-27, AMD Zen 4).
  args=(-DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_TESTS=ON -DKAT_ENABLE_EXAMPLES=ON
    -DKAT_ENABLE_MPI=ON -DKAT_UNITY_BUILD=ON)
  env=() # the configuration's environment for building (test discovery runs tests) and ctest
  skip=() # ctest -E: tests another configuration already covers
  builds=(all) # what to build: one `cmake --build --target` per entry, in this order
  case $backend in
    serial)
      args+=(-DKAT_ENABLE_BENCHMARKS=ON)
      ;;
    openmp)
      prefix=$("$root/scripts/build_kokkos.sh" openmp | tail -n 1)
      # -O2, not CMake's Release -O3: the suite checks results, not speed (the benchmarks and
      # scripts/train.sh build at -O3), and -O3 cost compile time, not test time. The whole
      # configuration from nothing, one build after the other on AMD Zen 4, 2 cores,
      # 2026-11-28: 822 s at -O2 against 1038 s at -O3 (the tests' units 516 s and 417 s of
      # g++ against 660 s and 551 s, kat_train's 400 s against 482 s); its tests then took
      # 586 s (579 s at -O3 the day before; 418 passed).
      args+=(-DCMAKE_PREFIX_PATH="$prefix" "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG")
      # OpenBLAS's OpenMP variant shares Kokkos's thread pool (the default pthread variant
      # would fight it for the cores); see docs/backends.md. ctest -j runs several test
      # processes of 2 threads each: idle threads that spin (the default wait policy) take the
      # cores from the others, and passive waiting ran the suite in 112 s instead of 387 s on
      # 2 cores. It changes how threads wait, not what they compute.
      # The OpenMP OpenBLAS comes by the programs' own run path (cmake/KATOpenMPBLAS.cmake), so
      # no LD_LIBRARY_PATH: the test "core: the BLAS shares the OpenMP runtime of Kokkos and
      # oneDNN" checks what a user's build loads.
      env=(OMP_NUM_THREADS=2 OMP_PROC_BIND=false OMP_WAIT_POLICY=passive)
      # Only what the tests run, kat_tests and kat_train (kat_test_programs), as in the
      # sanitize configuration. No test runs the three other examples (kat_kfac_raw_views,
      # kat_plan, kat_data_parallel): the serial configuration compiles them with g++, and so
      # do CI's CUDA and HIP checks with nvcc (host code: g++ 11) and hipcc (scripts/check_cuda.sh,
      # check_hip.sh). They took 222 s of g++ -O2 here (kat_plan 116 s; AMD Zen 4, 2026-11-28).
      # The tests' two units first, side by side, then kat_train's two: with both programs at
      # once (kat_test_programs), make started kat_train's units beside the tests' first one
      # and the tests' second one last, alone: 820 s against 726 s. kat_test_programs then
      # builds what remains of it (kat_host_isa_tests on x86-64).
      builds=(kat_tests kat_train kat_test_programs)
      ;;
    sanitize)
      # -O0: the instrumented build was the longest stage of CI (951 s at -O1, 2026-11-25);
      # test_dense.cpp compiles in 20 s of CPU at -O0 against 34 s at -O1 and runs 1.5x
      # longer, and unoptimized code keeps every access the sanitizers check. -g1's line
      # tables give the reports file:line (full -g took 78 s instead of 56 s for
      # test_kfac.cpp, with objects twice the size);
      # -fno-sanitize-recover makes undefined behaviour abort the test instead of printing
      # and going on. Open MPI's own allocations that live until exit are not KAT's leaks:
      # tests/sanitizer/lsan.supp names them, which needs whole stacks (fast_unwind_on_malloc=0:
      # Debian's libraries keep no frame pointers) and Open MPI's plugins kept loaded until
      # exit (else their frames have no module name). intercept_tls_get_addr=0: LSan's tracer
      # read a garbage dynamic-TLS range (one of Open MPI's plugins' TLS blocks, "DTLS 9 at
      # 0x532f-0x400006431") and crashed at exit in one rank of every 3-rank run on this
      # machine (2026-11-26; glibc 2.36 with GCC 12's sanitizer); without the interception the
      # leak check still runs (a malloc'd block dropped on purpose is still reported).
      # HWLOC_COMPONENTS=-pci: MPI_Init's topology discovery (Open MPI's hwloc) reads the PCI
      # device names through libpciaccess, which grows its buffer one realloc at a time; under
      # ASan every one of those is a fresh mapping and an unmapping, 3 s of system time in each
      # process that initializes MPI (kat_train --version: 7.0 s, 3.9 s without, 2026-11-28).
      # One node's shared-memory runs use no PCI device.
      # -fno-sanitize=null,alignment: UBSan's null and alignment checks instrument every
      # pointer dereference, reference binding and member access, which in Kokkos's and KAT's
      # template code was most of the sanitized build's time: test_sparse.cpp took 396 s of
      # g++ with them and 260 s without (-O0, ASan and the rest of UBSan; unsanitized 118 s;
      # test_dense.cpp's UBSan alone 30.5 s, 19.6 s without those two, 17.0 s unsanitized;
      # AMD Zen 4, 2026-11-28). ASan still reports a null dereference (as a SEGV on an
      # unknown address, with its stack), and the fuzz targets, which feed the parsers
      # arbitrary bytes, keep both checks (scripts/fuzz.sh).
      flags="-O0 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined"
      flags+=" -fno-sanitize=null,alignment -fno-sanitize-recover=all"
      args=(-DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$flags" -DKAT_ENABLE_TESTS=ON
        -DKAT_ENABLE_EXAMPLES=ON -DKAT_ENABLE_MPI=ON -DKAT_MPI_TEST_TIMEOUT=900 -DKAT_UNITY_BUILD=ON)
      env=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:fast_unwind_on_malloc=0:intercept_tls_get_addr=0
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
        "LSAN_OPTIONS=suppressions=$root/tests/sanitizer/lsan.supp:print_suppressions=0"
        OMPI_MCA_mca_base_component_disable_dlclose=1 HWLOC_COMPONENTS=-pci)
      # The OpenMP configuration compiles every header on its own with the same compiler.
      # kat_train's resume tests run whole training runs, several per test (SGD's took 277 s
      # and bf16 MLP's 247 s under the sanitizers on AMD Zen 4, 2026-11-27), and so do the MLP's
      # and CNN's accuracy runs (129 s and 174 s here) and kat_train's runs on 2 ranks (DHO2's
      # 191 s, DASO's 99 s, the four Slurm scripts' 200 s, each holding both cores,
      # 2026-11-28): they run in the OpenMP configuration. Under the sanitizers the code they
      # run is checked by the checkpoint tests, the checkpoint fuzz target (scripts/fuzz.sh),
      # the layers' own tests, "training: CNN and ResNet steps allocate nothing in steady
      # state", kat_train's error tests and the "[mpi]" cases at 1 to 4 ranks (DHO2, DASO, the
      # distributed K-FAC variants).
      skip=(-E 'headers_are_self_contained|trainer_resume_|training: (CNN|MLP) on a|kat_train_(dho2|daso)_2_ranks|slurm_kat_train_')
      # What the tests run, kat_tests and kat_train, side by side (one target): on the bare
      # system 995 s against 1090 s one after the other (2026-11-28, before the UBSan change).
      builds=(kat_test_programs)
      ;;
    *) echo "test.sh: unknown configuration '$backend' (serial | openmp | sanitize)" >&2; exit 2 ;;
  esac
  if [ "${KAT_TEST_FAST:-0}" = 1 ]; then
    args+=(-DKAT_ENABLE_EXAMPLES=OFF -DKAT_ENABLE_BENCHMARKS=OFF)
    builds=(kat_test_programs) # without the examples: kat_tests and kat_host_isa_tests
    skip=(-E 'headers_are_self_contained|install_and_find_package|install_and_pkg_config|mpi_ranks_(3|4)|training: CNN on a')
  fi
  stage "$backend: configure and build"
  mkdir -p "$build"
  cmake -S "$root" -B "$build" "${args[@]}" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
  for target in "${builds[@]}"; do
    env "${env[@]}" cmake --build "$build" -j "$jobs" --target "$target"
  done
  stage "$backend: test"
  (cd "$build" && env "${env[@]}" ctest --output-on-failure -j "$jobs" "${skip[@]}")
done
stage "done"
