#!/usr/bin/env bash
# The root cause of the host segfaults in nvcc builds (docs/backends.md): nvcc's wrapper of an
# extended __host__ __device__ lambda (KOKKOS_LAMBDA) keeps the lambda's copy, call and delete
# functions in per-translation-unit statics ((anonymous namespace)::__nv_hdl_helper<Tag,...>::
# fp_copier, fp_caller, fp_deleter), but the wrapper's own members (__nv_hdl_wrapper_t<...,
# Tag, ...>: constructor, copy constructor, call operator, destructor) are ordinary weak
# symbols that the linker merges across translation units. When two translation units
# instantiate the same template holding the lambda, the constructor that sets one unit's
# statics and the copy or call that reads another's can both survive the merge: a call through
# a null pointer. Which copies survive depends on link order and on what each unit inlined.
#
# Here a.cpp (at -O0) and b.cpp (at -O2, which inlines the constructor into use_b) both
# instantiate Step<float>::run; main calls use_b first. Linked as a.o b.o, apply<> comes from
# a.o and reads a.o's never-set fp_copier: SIGSEGV. Linked as b.o a.o it runs. No GPU needed:
# everything here runs on the host.
#   tests/cuda/extended_lambda_odr/run.sh [NVCC]     (default: nvcc on PATH)
set -uo pipefail
nvcc=${1:-nvcc}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
flags=(-x cu -std=c++17 --extended-lambda)
"$nvcc" "${flags[@]}" -O0 -c "$here/a.cpp" -o a.o &&
  "$nvcc" "${flags[@]}" -Xcompiler -O2 -c "$here/b.cpp" -o b.o &&
  "$nvcc" -x cu -c "$here/main.cpp" -o main.o || exit 1
"$nvcc" a.o b.o main.o -o ab && "$nvcc" b.o a.o main.o -o ba || exit 1
./ba >/dev/null; ba=$?
./ab >/dev/null 2>&1; ab=$?
echo "linked b.o a.o: exit $ba; linked a.o b.o: exit $ab"
if [ "$ba" -eq 0 ] && [ "$ab" -ne 0 ]; then
  echo "reproduced: the outcome depends on the link order"
else
  echo "not reproduced with $("$nvcc" --version | tail -n 1)"
fi
