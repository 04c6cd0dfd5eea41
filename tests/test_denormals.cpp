// kat::set_flush_denormals: subnormal results and operands become zero on the calling thread
// and on the threads of the host execution space, and gradual underflow comes back when it is
// turned off.
#include <kat/core/denormals.hpp>

#include <Kokkos_Core.hpp>
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace test_denormals {

// Restores IEEE gradual underflow when a test ends, so no other test runs with flushing on.
struct Restore {
  ~Restore() { kat::set_flush_denormals(false); }
};

// a * b of two normal floats whose product, 1e-40, is subnormal; volatile so the compiler
// does not fold it with its own (IEEE) arithmetic.
float subnormal_product() {
  volatile float a = 1e-30f, b = 1e-10f;
  return a * b;
}

// Every host thread's a * b into out(i): a chunk of iterations per thread of the pool.
struct Products {
  Kokkos::View<float *, Kokkos::HostSpace> a, out;
  void operator()(std::size_t i) const { out(i) = a(i) * 1e-10f; }
};

// Whether x's bits are +0. Its bits, not x == 0: with denormals-are-zero on, the calling
// thread's comparison reads a subnormal as zero.
bool zero_bits(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits == 0;
}

// How many products zero_products() computes: 4,096 per host thread.
std::size_t product_count() {
  return 4096 * std::size_t(Kokkos::DefaultHostExecutionSpace().concurrency());
}

// The product on every host thread: the number of results that are zero.
std::size_t zero_products() {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const std::size_t n = product_count();
  Kokkos::View<float *, Kokkos::HostSpace> a("a", n), out("out", n);
  Kokkos::deep_copy(a, 1e-30f);
  Kokkos::parallel_for(Kokkos::RangePolicy<Host>(0, n), Products{a, out});
  Kokkos::fence();
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < n; ++i) {
    zeros += zero_bits(out(i));
  }
  return zeros;
}

TEST_CASE("set_flush_denormals flushes subnormal results and operands and turns back off",
          "[denormals]") {
  Restore restore;
  REQUIRE(kat::set_flush_denormals(false)); // x86-64 and AArch64 have the control
  CHECK_FALSE(kat::flushes_denormals());
  const float kept = subnormal_product();
  CHECK(kept > 0.0f);
  CHECK(kept < FLT_MIN);
  CHECK(std::fpclassify(kept) == FP_SUBNORMAL);
  CHECK(zero_products() == 0);

  REQUIRE(kat::set_flush_denormals(true));
  CHECK(kat::flushes_denormals());
  CHECK(zero_bits(subnormal_product())); // a subnormal result
  // A subnormal operand is read as zero: its product with 1e10, about 1e-30, is normal.
  volatile float operand = kept, big = 1e10f;
  CHECK(zero_bits(operand * big));
  // Normal numbers are untouched: FLT_MIN is the smallest normal float.
  volatile float smallest = FLT_MIN, two = 2.0f;
  CHECK(smallest * two == 2.0f * FLT_MIN);
  CHECK(zero_products() == product_count()); // on every thread of the pool

  REQUIRE(kat::set_flush_denormals(false));
  CHECK_FALSE(kat::flushes_denormals());
  CHECK(subnormal_product() == kept);
  CHECK(operand * big > 1e-31f);
  CHECK(zero_products() == 0);
}

} // namespace test_denormals
