#pragma once
// See run.sh.
// An extended __host__ __device__ lambda (what KOKKOS_LAMBDA is under nvcc) in a template that
// two translation units instantiate, handed to a template that copies and calls it (as
// Kokkos::parallel_for does with the functor).
template <class F> __attribute__((noinline, noipa)) float apply(const F &f) {
  F g = f;     // the wrapper's copy constructor: fp_copier
  return g(3); // its call operator: fp_caller
}
#ifndef KAT_ODR_FUNCTOR
template <class T> struct Step {
  static float run(T a) {
    return apply([=] __host__ __device__(int i) { return a * T(i); }); // constructor: sets fp_*
  }
};
#else
// The cure KAT's headers use: the same kernel as a named functor type. Its members are
// ordinary inline functions, identical in every unit, and no per-unit statics are involved.
template <class T> struct Scale {
  T a;
  __host__ __device__ float operator()(int i) const { return a * T(i); }
};
template <class T> struct Step {
  static float run(T a) { return apply(Scale<T>{a}); }
};
#endif
