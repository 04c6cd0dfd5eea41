#include "test_helpers.hpp"

#include <kat/core/blas.hpp>
#include <kat/core/parameter_buffer.hpp>
#include <kat/core/random.hpp>
#include <kat/core/state.hpp>
#include <kat/core/workspace.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

// OpenBLAS's threading model (0 sequential, 1 pthreads, 2 OpenMP); null when the BLAS loaded
// is not OpenBLAS.
extern "C" int openblas_get_parallel() __attribute__((weak));

namespace test_core {

using namespace kat;
using namespace kat::test;

TEMPLATE_TEST_CASE("core: gemm equals a triple loop for every transposition", "[core][blas]", float,
                   double) {
  const std::size_t m = 7, n = 5, k = 9;
  const double tol = std::is_same<TestType, float>::value ? 1e-5 : 1e-13;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      auto A = ta == Trans::N ? random_matrix<TestType>(m, k, 1) : random_matrix<TestType>(k, m, 1);
      auto B = tb == Trans::N ? random_matrix<TestType>(k, n, 2) : random_matrix<TestType>(n, k, 2);
      auto C = random_matrix<TestType>(m, n, 3);
      auto C0 = to_host(C);
      gemm(Space(), ta, tb, TestType(0.5), A, B, TestType(2), C);
      auto Ah = to_host(A), Bh = to_host(B), Ch = to_host(C);
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
          double ref = 2 * double(C0(i, j));
          for (std::size_t p = 0; p < k; ++p) {
            const double a = ta == Trans::N ? Ah(i, p) : Ah(p, i);
            const double b = tb == Trans::N ? Bh(p, j) : Bh(j, p);
            ref += 0.5 * a * b;
          }
          REQUIRE(double(Ch(i, j)) == Approx(ref).epsilon(tol).margin(tol));
        }
    }
}

TEST_CASE("core: gemm on row ranges and strided views with long inner dimensions", "[core][blas]") {
  // Row ranges of a LayoutLeft matrix have a leading dimension above their rows; a LayoutStride
  // view with a strided first dimension takes the Kokkos Kernels path; k = 700 runs oneDNN's
  // blocked kernels on the host (float). The bound: |error| <= k eps sum |a b| for float sums.
  const std::size_t m = 33, n = 17, k = 700;
  auto Abig = random_matrix<float>(m + 5, k, 11);
  auto B = random_matrix<float>(n, k, 12);
  auto Cbig = random_matrix<float>(m + 3, n, 13);
  const auto A =
      Kokkos::subview(Abig, std::make_pair<std::size_t, std::size_t>(2, 2 + m), Kokkos::ALL());
  const auto C =
      Kokkos::subview(Cbig, std::make_pair<std::size_t, std::size_t>(1, 1 + m), Kokkos::ALL());
  const auto C0 = to_host(Cbig);
  gemm(Space(), Trans::N, Trans::T, 1.5f, A, B, -0.5f, C);
  const auto Ah = to_host(Abig), Bh = to_host(B), Ch = to_host(Cbig);
  const double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t i = 0; i < m + 3; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      if (i < 1 || i >= 1 + m) {
        REQUIRE(Ch(i, j) == C0(i, j)); // outside the row range: untouched
        continue;
      }
      double ref = -0.5 * double(C0(i, j)), mag = 0.5 * std::abs(double(C0(i, j)));
      for (std::size_t p = 0; p < k; ++p) {
        ref += 1.5 * double(Ah(i + 1, p)) * double(Bh(j, p));
        mag += 1.5 * std::abs(double(Ah(i + 1, p)) * double(Bh(j, p)));
      }
      REQUIRE(std::abs(double(Ch(i, j)) - ref) <= double(k + 2) * eps * mag);
    }
  // Every other row of A (a strided first dimension) equals the same product on a copy.
  Kokkos::View<float **, Kokkos::LayoutStride, Mem> rows(
      Abig.data(), Kokkos::LayoutStride(m / 2, 2, k, Abig.stride(1)));
  Matrix<float, Mem> copy("copy", m / 2, k), Cs("Cs", m / 2, n), Cc("Cc", m / 2, n);
  Kokkos::deep_copy(copy, rows);
  gemm(Space(), Trans::N, Trans::T, 1.0f, rows, B, 0.0f, Cs);
  gemm(Space(), Trans::N, Trans::T, 1.0f, copy, B, 0.0f, Cc);
  const auto Csh = to_host(Cs), Cch = to_host(Cc);
  for (std::size_t i = 0; i < m / 2; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double mag = 0;
      for (std::size_t p = 0; p < k; ++p) {
        mag += std::abs(double(Ah(2 * i, p)) * double(Bh(j, p)));
      }
      REQUIRE(std::abs(double(Csh(i, j)) - double(Cch(i, j))) <= 2.0 * double(k) * eps * mag);
    }
}

TEST_CASE("core: gemm's weight gradients Aᵀ B with the batch as inner dimension", "[core][blas]") {
  // dW (+)= dyᵀ x as a Dense layer forms it (k = the batch rows: 2048 for a ViT's tokens, then
  // a batch about twice as long as the layer is wide), on row ranges (leading dimensions above
  // the rows), for the beta of overwriting (0), of accumulating (1) and another (-0.5), with
  // alpha 1.5. In a float build with oneDNN both shapes run on oneDNN's matmul primitive where
  // it has a brg kernel (onednn_f32_matmul_preferred in kat/core/detail/matmul_f32_onednn.hpp),
  // else on dnnl_sgemm; either must give the product within (k + 2) eps sum |alpha a b| +
  // |beta c|.
  const auto shape =
      GENERATE(std::array<std::size_t, 3>{67, 33, 2048}, std::array<std::size_t, 3>{96, 40, 200});
  const std::size_t m = shape[0], n = shape[1], k = shape[2];
  CAPTURE(m, n, k);
  const auto dy_big = random_matrix<float>(k + 3, m, 21); // rows 1 .. k are dy
  const auto x_big = random_matrix<float>(k + 5, n, 22);  // rows 4 .. k + 3 are x
  const auto dy =
      Kokkos::subview(dy_big, std::make_pair<std::size_t, std::size_t>(1, 1 + k), Kokkos::ALL());
  const auto x =
      Kokkos::subview(x_big, std::make_pair<std::size_t, std::size_t>(4, 4 + k), Kokkos::ALL());
  const auto dyh = to_host(dy_big), xh = to_host(x_big);
  const double eps = std::numeric_limits<float>::epsilon();
#if defined(KAT_ENABLE_ONEDNN)
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  REQUIRE(detail::onednn_f32_matmul_preferred('T', 'N', m, n, k));
  const std::size_t plans_before = detail::onednn_f32_matmul_plans().created();
#endif
  for (const float beta : {0.0f, 1.0f, -0.5f}) {
    CAPTURE(beta);
    auto c_big = random_matrix<float>(m + 2, n, 23); // rows 2 .. m + 1 are C
    const auto c =
        Kokkos::subview(c_big, std::make_pair<std::size_t, std::size_t>(2, 2 + m), Kokkos::ALL());
    const auto c0 = to_host(c_big);
    gemm(Space(), Trans::T, Trans::N, 1.5f, dy, x, beta, c);
    const auto ch = to_host(c_big);
    for (std::size_t i = 0; i < m + 2; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        if (i < 2) {
          REQUIRE(ch(i, j) == c0(i, j)); // outside the row range: untouched
          continue;
        }
        double ref = double(beta) * double(c0(i, j)), mag = std::abs(ref);
        for (std::size_t p = 0; p < k; ++p) {
          const double t = 1.5 * double(dyh(p + 1, i - 2)) * double(xh(p + 4, j));
          ref += t;
          mag += std::abs(t);
        }
        REQUIRE(std::abs(double(ch(i, j)) - ref) <= double(k + 2) * eps * mag);
      }
    }
  }
#if defined(KAT_ENABLE_ONEDNN)
  // In host memory, one plan per beta: the matmul path was taken (or, without a brg kernel for
  // the product, declined).
  if (host) {
    CHECK(detail::onednn_f32_matmul_plans().created() - plans_before == 3);
  }
#endif
}

#if defined(KAT_ENABLE_ONEDNN)
TEST_CASE("core: which float products gemm runs on oneDNN's matmul primitive", "[core][blas]") {
  // Aᵀ B alone, with k >= 8 max(m, n), or k >= 2 max(m, n) with both sides >= 16 and m n k >=
  // 2^17 (the shapes where it was faster than dnnl_sgemm, matmul_f32_onednn.hpp).
  using detail::onednn_f32_matmul_preferred;
  CHECK(onednn_f32_matmul_preferred('T', 'N', 192, 64, 2048));       // the ViT's QKV weights
  CHECK(onednn_f32_matmul_preferred('T', 'N', 10, 64, 512));         // a classifier, k = 8 max
  CHECK_FALSE(onednn_f32_matmul_preferred('T', 'N', 10, 256, 1024)); // k = 4 max, a side of 10
  CHECK(onednn_f32_matmul_preferred('T', 'N', 64, 16, 128));         // 2 max, 16 wide, m n k = 2^17
  CHECK_FALSE(onednn_f32_matmul_preferred('T', 'N', 64, 15, 128));   // 15 wide
  CHECK_FALSE(onednn_f32_matmul_preferred('T', 'N', 32, 32, 64));    // m n k = 2^16
  CHECK(onednn_f32_matmul_preferred('T', 'N', 512, 512, 1024));
  CHECK_FALSE(onednn_f32_matmul_preferred('T', 'N', 512, 512, 1023)); // below 2 max
  CHECK_FALSE(onednn_f32_matmul_preferred('T', 'N', 256, 784, 128));  // the MLP's, batch 128
  CHECK_FALSE(onednn_f32_matmul_preferred('N', 'N', 64, 64, 4096));
  CHECK_FALSE(onednn_f32_matmul_preferred('N', 'T', 64, 64, 4096));
  CHECK_FALSE(onednn_f32_matmul_preferred('T', 'T', 64, 64, 4096));
}
#endif

TEST_CASE("core: the BLAS shares the OpenMP runtime of Kokkos and oneDNN", "[core][blas]") {
  // A pthread OpenBLAS beside Kokkos's or oneDNN's OpenMP threads would start a second pool on
  // the same cores; cmake/KATOpenMPBLAS.cmake links the OpenMP one then (KAT_OPENMP_BLAS).
#if defined(KAT_OPENMP_BLAS)
  REQUIRE(openblas_get_parallel != nullptr);
  CHECK(openblas_get_parallel() == 2);
  // Every BLAS and LAPACK library mapped lies beside the OpenBLAS that does the work. With
  // Debian's GCC linking --as-needed, a program that called neither itself dropped them, and
  // Kokkos Kernels' libblas.so.3 came from the default (pthread) build's directory.
  std::ifstream maps("/proc/self/maps");
  if (maps) {
    std::vector<std::string> dirs; // of every libblas and liblapack mapped
    std::string line, openblas_dir;
    while (std::getline(maps, line)) {
      const auto first = line.find('/'), last = line.rfind('/');
      if (first == std::string::npos) {
        continue;
      }
      const std::string dir = line.substr(first, last - first), file = line.substr(last + 1);
      if (file.rfind("libopenblas", 0) == 0) {
        openblas_dir = dir;
      } else if (file.rfind("libblas.so", 0) == 0 || file.rfind("liblapack.so", 0) == 0) {
        dirs.push_back(dir);
      }
    }
    REQUIRE(!openblas_dir.empty());
    for (const std::string &dir : dirs) {
      CHECK(dir == openblas_dir);
    }
  }
#elif defined(KOKKOS_ENABLE_OPENMP)
  FAIL("an OpenMP Kokkos without the OpenMP OpenBLAS (cmake/KATOpenMPBLAS.cmake)");
#else
  SUCCEED("nothing in this build threads with OpenMP");
#endif
}

TEST_CASE("core: gemm shape errors and the k = 0 case", "[core][blas]") {
  Matrix<double, Mem> A("A", 3, 4), B("B", 5, 2), C("C", 3, 2);
  CHECK_THROWS_WITH(gemm(Space(), Trans::N, Trans::N, 1.0, A, B, 0.0, C),
                    Catch::Contains("op(A) is 3x4, op(B) is 5x2"));
  Matrix<double, Mem> A0("A0", 3, 0), B0("B0", 0, 2);
  Kokkos::deep_copy(C, 4.0);
  gemm(Space(), Trans::N, Trans::N, 1.0, A0, B0, 0.5, C);
  CHECK(to_host(C)(2, 1) == 2.0);
}

TEST_CASE("core: parameter buffer blocks view one flat memory", "[core][buffer]") {
  ParameterBuffer<float, Mem> buf;
  CHECK(buf.reserve("w", 6) == 0);
  CHECK(buf.reserve("b", 3) == 1);
  CHECK_THROWS_WITH(buf.parameter_matrix(0, 2, 3), Catch::Contains("before allocate()"));
  buf.allocate();
  CHECK(buf.size() == 9);
  auto w = buf.parameter_matrix(0, 2, 3);
  auto b = buf.parameter_vector(1);
  Kokkos::deep_copy(w, 1.f);
  Kokkos::deep_copy(b, 2.f);
  auto flat = to_host(buf.parameters());
  for (int k = 0; k < 6; ++k)
    CHECK(flat(k) == 1.f);
  for (int k = 6; k < 9; ++k)
    CHECK(flat(k) == 2.f);
  CHECK(buf.gradient_vector(1).data() == buf.gradients().data() + 6);
  CHECK_THROWS_WITH(buf.parameter_matrix(0, 3, 3), Catch::Contains("must be 6, got 9"));
  CHECK_THROWS_AS(buf.parameter_vector(2), ValueError);
  CHECK_THROWS_AS(buf.reserve("late", 1), Error);
}

TEST_CASE("core: workspace reuses memory for any shape that fits", "[core][workspace]") {
  Workspace<float, Mem> ws;
  auto a = ws.matrix(8, 4);
  auto b = ws.matrix(3, 4);
  CHECK(a.data() == b.data());
  CHECK(b.extent(0) == 3);
  CHECK(b.stride(1) == 3); // contiguous LayoutLeft, ready for BLAS
  CHECK(ws.allocations() == 1);
  ws.matrix(9, 4);
  CHECK(ws.allocations() == 2);
}

TEST_CASE("core: counter-based random numbers", "[core][random]") {
  // Fixed by the SplitMix64 definition: the published first output for state 0.
  CHECK(splitmix64(0) == 0xE220A8397B1DCDAFull);
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = counter_uniform(42, 7, i);
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
  }
  CHECK(std::abs(sum / n - 0.5) < 5 * std::sqrt(1.0 / 12 / n));
  CHECK(counter_uniform(42, 7, 3) == counter_uniform(42, 7, 3));
  CHECK(counter_uniform(42, 7, 3) != counter_uniform(42, 8, 3));
  CHECK(counter_uniform(42, 7, 3) != counter_uniform(43, 7, 3));
}

TEST_CASE("core: host shuffle is a seeded permutation", "[core][random]") {
  std::vector<int> a(1000), b(1000), c(1000);
  std::iota(a.begin(), a.end(), 0);
  b = a;
  c = a;
  HostRng(1).shuffle(a.begin(), a.end());
  HostRng(1).shuffle(b.begin(), b.end());
  HostRng(2).shuffle(c.begin(), c.end());
  CHECK(a == b);
  CHECK(a != c);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i)
    REQUIRE(sorted[i] == i);
  // uniform_index stays in range and hits every value of a small range.
  HostRng rng(3);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i)
    ++hits[rng.uniform_index(7)];
  for (int h : hits)
    CHECK(h > 800);
}

TEST_CASE("StateDict refuses a shape whose element count does not fit in 64 bits", "[core]") {
  // Found by fuzz/fuzz_checkpoint.cpp: a float32 entry of shape [2^63, 2] and 0 bytes, whose
  // wrapped product (0) matched its byte count, was accepted.
  StateDict s;
  StateEntry wraps{DType::float32, {std::uint64_t(1) << 63, 2}, {}};
  CHECK_THROWS_AS(s.insert("w", wraps), StateError);
  CHECK_THROWS_WITH(s.insert("w", wraps), Catch::Contains("has more than 2^64 elements"));
  // 2^62 float32 elements fit as a count but not as a byte count.
  StateEntry bytes_wrap{DType::float32, {std::uint64_t(1) << 62}, {}};
  CHECK(bytes_wrap.count() == std::uint64_t(1) << 62);
  CHECK_THROWS_AS(s.insert("b", bytes_wrap), StateError);
  CHECK_THROWS_WITH(s.insert("b", bytes_wrap), Catch::Contains("has more than 2^64 bytes"));
  // A zero extent anywhere is zero elements, whatever the others are.
  StateEntry empty{DType::float64, {std::uint64_t(1) << 63, 0, 4}, {}};
  CHECK(empty.count() == 0);
  s.insert("e", empty);
  CHECK(s.size() == 1);
}

} // namespace test_core
