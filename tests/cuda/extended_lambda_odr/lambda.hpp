#pragma once
// See run.sh.
// An extended __host__ __device__ lambda (what KOKKOS_LAMBDA is under nvcc) in a template that
// two translation units instantiate, handed to a template that copies and calls it (as
// Kokkos::parallel_for does with the functor).
template <class F> __attribute__((noinline, noipa)) float apply(const F &f) {
  F g = f;     // the wrapper's copy constructor: fp_copier
  return g(3); // its call operator: fp_caller
}
template <class T> struct Step {
  static float run(T a) {
    return apply([=] __host__ __device__(int i) { return a * T(i); }); // constructor: sets fp_*
  }
};
