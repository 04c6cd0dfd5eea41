# Sourced by KAT's scripts: Debian packages and timed, logged stages.

# Empty when running as root, else "sudo".
kat_sudo=""
[ "$(id -u)" -eq 0 ] || kat_sudo="sudo"

# kat_missing PACKAGE...: prints the packages that are not installed, one a line.
kat_missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

# kat_apt_install [apt-get option...] -- PACKAGE...: updates the package lists and installs the
# packages without recommends, non-interactively, waiting for another apt-get's lock instead of
# failing on it. The options (e.g. a private apt configuration) go to both apt-get calls.
kat_apt_install() {
  local opts=(-o DPkg::Lock::Timeout=600)
  while [ "$1" != -- ]; do
    opts+=("$1")
    shift
  done
  shift
  $kat_sudo env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" update -qq
  $kat_sudo env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -qq \
    --no-install-recommends "$@" >/dev/null
}

# kat_stage NAME LOG COMMAND...: runs COMMAND with its output in LOG and prints the time it
# took, adding "NAME Ns" to the array kat_stage_times. On failure prints the first compiler or
# CMake error with its context and the end of LOG, and exits 1.
kat_stage_times=()
kat_stage() {
  local name=$1 log=$2 start=$SECONDS first
  shift 2
  mkdir -p "$(dirname "$log")"
  echo "== $name"
  # In the background: a function run as an `if` condition would ignore set -e inside it.
  "$@" >"$log" 2>&1 &
  if ! wait $!; then
    echo "== $name FAILED after $((SECONDS - start)) s; log: $log" >&2
    first=$(grep -n -m 1 -E 'error:|Error [0-9]+|CMake Error' "$log" | cut -d: -f1 || true)
    if [ -n "$first" ]; then
      echo "--- first error (line $first of the log)" >&2
      sed -n "$((first > 5 ? first - 5 : 1)),$((first + 40))p" "$log" >&2
    fi
    echo "--- end of the log" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  echo "   $name: $((SECONDS - start)) s"
  kat_stage_times+=("$name $((SECONDS - start)) s")
}

# The stage times so far, "a 1 s, b 2 s".
kat_stage_summary() {
  local s
  s=$(printf '%s, ' "${kat_stage_times[@]}")
  echo "${s%, }"
}

# kat_openmp_trainer ROOT BUILD THREADS: builds kat_train (Release, OpenMP Kokkos from
# scripts/build_kokkos.sh, no tests) in BUILD and sets the array kat_env to the environment
# that runs it on THREADS threads (it links the OpenMP OpenBLAS itself; docs/backends.md).
# The host code is compiled for KAT_HOST_ARCH (GCC's -march): x86-64-v3 (AVX2, FMA) on x86-64
# by default, which every machine of this project has (AMD EPYC and Intel Sapphire Rapids
# alike), so the build does not depend on which; "native" or "" (the generic x86-64, SSE2
# only: the element-wise kernels run at a third of the speed) as asked. docs/install.md.
kat_openmp_trainer() {
  local root=$1 build=$2 threads=$3 prefix arch flags=""
  prefix=$("$root/scripts/build_kokkos.sh" openmp | tail -n 1)
  arch=${KAT_HOST_ARCH-$([ "$(uname -m)" = x86_64 ] && echo x86-64-v3)}
  [ -z "$arch" ] || flags="-march=$arch"
  echo "kat_train: host code compiled with CXXFLAGS '$flags' (KAT_HOST_ARCH)" >&2
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_TESTS=OFF \
    -DKAT_ENABLE_EXAMPLES=ON -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  cmake --build "$build" --target kat_train -j "$(nproc)" >/dev/null
  kat_env=(OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" OMP_PROC_BIND=false)
}

# kat_require_torch: installs Debian's python3-torch (PyTorch, CPU build) when it is missing, for
# the scripts that compare kat_train with PyTorch (run by /usr/bin/python3).
kat_require_torch() {
  if [ -n "$(kat_missing python3-torch)" ]; then
    echo "installing python3-torch (PyTorch, Debian's CPU build)"
    kat_apt_install -- python3-torch
  fi
}

# kat_median: the median of the numbers on standard input, one a line (the lower middle one for
# an even count); prints nothing for no input.
kat_median() {
  sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}

# kat_commit_build ROOT OUT COMMIT BACKEND TARGET [CMAKE_ARG...]: builds TARGET (all when empty)
# of COMMIT in a git worktree of ROOT (OUT/src-COMMIT, reused) for BACKEND (serial: Debian's
# Kokkos; openmp: scripts/build_kokkos.sh openmp's), Release, in OUT/COMMIT-BACKEND, and prints
# that directory. For same-run comparisons of two commits.
kat_commit_build() {
  local root=$1 out=$2 commit=$3 backend=$4 target=$5 tree dir args
  shift 5
  tree=$out/src-$commit dir=$out/$commit-$backend
  [ -d "$tree" ] || git -C "$root" worktree add -q --detach "$tree" "$commit" >&2
  args=(-DCMAKE_BUILD_TYPE=Release "$@")
  if [ "$backend" = openmp ]; then
    args+=(-DCMAKE_PREFIX_PATH="$("$root/scripts/build_kokkos.sh" openmp | tail -n 1)")
  fi
  cmake -S "$tree" -B "$dir" "${args[@]}" >/dev/null
  cmake --build "$dir" ${target:+--target "$target"} -j "$(nproc)" >/dev/null
  echo "$dir"
}

# What the GPU compile checks (check_cuda.sh, check_hip.sh) build besides every public header:
# KAT_GPU_CHECK_BUILD, some of "tests examples benchmarks" (default all three). CI names less
# (.ci/run), since each part is a full build of its own on 2 cores.
kat_gpu_check_parts() {
  local parts=${KAT_GPU_CHECK_BUILD-tests examples benchmarks} p
  for p in $parts; do
    case $p in
      tests | examples | benchmarks) ;;
      *)
        echo "KAT_GPU_CHECK_BUILD may name tests, examples and benchmarks, got '$p'" >&2
        return 2
        ;;
    esac
  done
  echo "$parts"
}

# The CMake options for those parts (the tests' directory also holds the header check, so
# KAT_ENABLE_TESTS stays on and the test program is left out of the build instead).
kat_gpu_check_cmake_args() {
  local parts examples=OFF benchmarks=OFF
  parts=" $(kat_gpu_check_parts) " || return 2
  [[ $parts != *" examples "* ]] || examples=ON
  [[ $parts != *" benchmarks "* ]] || benchmarks=ON
  echo "-DKAT_ENABLE_TESTS=ON -DKAT_ENABLE_EXAMPLES=$examples -DKAT_ENABLE_BENCHMARKS=$benchmarks"
}

# Builds those parts in DIR with JOBS jobs.
kat_gpu_check_build() { # kat_gpu_check_build DIR JOBS
  local dir=$1 jobs=$2 parts targets
  parts=" $(kat_gpu_check_parts) " || return 2
  if [[ $parts == *" tests "* ]]; then
    cmake --build "$dir" -j "$jobs"
    return
  fi
  # Every program but the tests: the examples and benchmarks that configure enabled. With
  # Makefiles, make builds each folder's programs side by side (cmake --build given several
  # targets builds one after the other, so a program of one file leaves a core idle). Only the
  # folders the parts name: a build directory reused with fewer parts keeps the Makefile of a
  # folder configure no longer generates, and make there finds no rule.
  if [ -f "$dir/examples/Makefile" ] || [ -f "$dir/bench/Makefile" ]; then
    local part sub
    for part in examples:examples benchmarks:bench; do # part:folder
      sub=${part#*:}
      if [[ $parts == *" ${part%:*} "* ]] && [ -f "$dir/$sub/Makefile" ]; then
        make -C "$dir/$sub" -j "$jobs" all
      fi
    done
    return
  fi
  mapfile -t targets < <(cmake --build "$dir" --target help | sed -n 's/^\.\.\. //p' |
    grep -E '^kat_' | grep -vxE 'kat_(tests|header_check)')
  if ((${#targets[@]})); then
    cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  else
    echo "nothing to build besides the headers (KAT_GPU_CHECK_BUILD='${parts// /}')"
  fi
}
