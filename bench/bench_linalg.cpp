// Benchmarks for the dense symmetric linear algebra of K-FAC: kat::symmetric_eigen and
// kat::cholesky_inverse, vendor (LAPACK on host) against the portable Kokkos implementation,
// float and double, at the Kronecker-factor sizes of the 784-256-256-10 MLP: 785 (input
// activations + bias), 257 (hidden activations + bias) and 64 (a small factor). The 10 x 10
// output-gradient factor is too small to matter.
//
// The portable Jacobi eigen solver takes 10-13 s at n = 785 on the 2-core machine, so it is
// timed up to n = 257 only; the portable Cholesky inverse is timed at every size.
//
// Each iteration restores the input matrix (untimed) and times one call, fenced.
#include "common.hpp"
#include <kat/core/linalg.hpp>
#include <kat/core/policy.hpp>
#include <kat/core/random.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <type_traits>

namespace {

using namespace kat::bench;

// A K-FAC-like factor: the damped Gram matrix BᵀB / n + 1e-3 I of an n x n matrix B with
// U(-1, 1) entries (symmetric positive definite, eigenvalues spread over about 4 decades).
template <class Scalar> kat::Matrix<Scalar, Mem> factor_matrix(std::size_t n) {
  kat::Matrix<Scalar, Mem> b("b", n, n), a("a", n, n);
  auto h = Kokkos::create_mirror_view(b);
  kat::HostRng rng(n);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i)
      h(i, j) = static_cast<Scalar>(-1.0 + 2.0 * double(rng.next() >> 11) * 0x1.0p-53);
  Kokkos::deep_copy(b, h);
  const Space space;
  kat::gemm(space, kat::Trans::T, kat::Trans::N, Scalar(1.0 / double(n)), b, b, Scalar(0), a);
  Kokkos::parallel_for(
      "bench_linalg::damp", Kokkos::RangePolicy<Space>(space, 0, n),
      KOKKOS_LAMBDA(const std::size_t i) { a(i, i) += Scalar(1e-3); });
  space.fence();
  return a;
}

template <class Impl> constexpr bool runnable() {
  return !std::is_same<Impl, kat::linalg::Vendor>::value || kat::linalg::has_vendor<Mem>;
}

// One symmetric_eigen call per iteration. Argument: n.
template <class Scalar, class Impl> void BM_SymmetricEigen(benchmark::State &state) {
  if constexpr (!runnable<Impl>()) {
    state.SkipWithError("no vendor eigen solver for this memory space");
  } else {
    const std::size_t n = static_cast<std::size_t>(state.range(0));
    const Space space;
    const auto a = factor_matrix<Scalar>(n);
    kat::Matrix<Scalar, Mem> q("q", n, n);
    kat::Vector<Scalar, Mem> w("w", n);
    for (auto _ : state) {
      Kokkos::deep_copy(space, q, a);
      space.fence();
      const auto t0 = Clock::now();
      kat::symmetric_eigen(space, q, w, Impl{});
      space.fence();
      state.SetIterationTime(seconds(t0));
    }
  }
}

// One cholesky_inverse call per iteration. Argument: n.
template <class Scalar, class Impl> void BM_CholeskyInverse(benchmark::State &state) {
  if constexpr (!runnable<Impl>()) {
    state.SkipWithError("no vendor Cholesky for this memory space");
  } else {
    const std::size_t n = static_cast<std::size_t>(state.range(0));
    const Space space;
    const auto a = factor_matrix<Scalar>(n);
    kat::Matrix<Scalar, Mem> x("x", n, n);
    for (auto _ : state) {
      Kokkos::deep_copy(space, x, a);
      space.fence();
      const auto t0 = Clock::now();
      kat::cholesky_inverse(space, x, Impl{});
      space.fence();
      state.SetIterationTime(seconds(t0));
    }
  }
}

using kat::linalg::Portable;
using kat::linalg::Vendor;

// The K-FAC factor sizes of the MLP; the portable eigen solver only up to 257.
void all_sizes(benchmark::internal::Benchmark *b) {
  b->ArgName("n")->Arg(64)->Arg(257)->Arg(785)->UseManualTime()->Unit(benchmark::kMillisecond);
}
void up_to_257(benchmark::internal::Benchmark *b) {
  b->ArgName("n")->Arg(64)->Arg(257)->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_SymmetricEigen, double, Vendor)->Apply(all_sizes);
BENCHMARK_TEMPLATE(BM_SymmetricEigen, double, Portable)->Apply(up_to_257);
BENCHMARK_TEMPLATE(BM_SymmetricEigen, float, Vendor)->Apply(all_sizes);
BENCHMARK_TEMPLATE(BM_SymmetricEigen, float, Portable)->Apply(up_to_257);
BENCHMARK_TEMPLATE(BM_CholeskyInverse, double, Vendor)->Apply(all_sizes);
BENCHMARK_TEMPLATE(BM_CholeskyInverse, double, Portable)->Apply(all_sizes);
BENCHMARK_TEMPLATE(BM_CholeskyInverse, float, Vendor)->Apply(all_sizes);
BENCHMARK_TEMPLATE(BM_CholeskyInverse, float, Portable)->Apply(all_sizes);

} // namespace
