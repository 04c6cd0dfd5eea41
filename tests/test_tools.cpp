// The Kokkos Tools-based helpers: AllocationTracker and RegionTimer.
#include "test_helpers.hpp"

#include <kat/core/allocation_tracker.hpp>
#include <kat/core/region_timer.hpp>

#include <catch2/catch.hpp>

#include <chrono>

using namespace kat;
using namespace kat::test;

TEST_CASE("tools: allocation tracker counts views and bytes", "[tools][memory]") {
  AllocationTracker tracker;
  CHECK_THROWS_WITH(AllocationTracker(), Catch::Contains("already active"));
  {
    Kokkos::View<double *, Mem> a("a", 1000);
    Kokkos::View<float **, Mem> b("b", 10, 20);
    CHECK(tracker.allocations() == 2);
    CHECK(tracker.live_bytes() == 1000 * 8 + 200 * 4);
    auto c = a; // a copy of a view is not an allocation
    CHECK(tracker.allocations() == 2);
  }
  CHECK(tracker.deallocations() == 2);
  CHECK(tracker.live_bytes() == 0);
  CHECK(tracker.peak_bytes() == 8800);
  tracker.reset();
  CHECK(tracker.allocations() == 0);
  CHECK(tracker.peak_bytes() == 0);
  // Unmanaged views wrap memory without allocating.
  std::vector<float> host(50);
  Kokkos::View<float *, Kokkos::HostSpace> wrap(host.data(), host.size());
  CHECK(tracker.allocations() == 0);
}

TEST_CASE("tools: region timer adds up nested regions", "[tools][profiling]") {
  using clock = std::chrono::steady_clock;
  auto spin = [](double seconds) {
    const auto t0 = clock::now();
    while (std::chrono::duration<double>(clock::now() - t0).count() < seconds) {
    }
  };
  RegionTimer timer;
  CHECK_THROWS_WITH(RegionTimer(), Catch::Contains("already active"));
  const auto t0 = clock::now();
  for (int i = 0; i < 2; ++i) {
    Kokkos::Profiling::pushRegion("outer");
    spin(0.01);
    Kokkos::Profiling::pushRegion("inner");
    spin(0.02);
    Kokkos::Profiling::popRegion();
    Kokkos::Profiling::popRegion();
  }
  const double wall = std::chrono::duration<double>(clock::now() - t0).count();
  CHECK(timer.seconds("inner") >= 0.04);
  CHECK(timer.seconds("outer") >= 0.06);
  CHECK(timer.seconds("outer") >= timer.seconds("inner"));
  CHECK(timer.seconds("outer") <= wall);
  const auto entries = timer.entries();
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].name == "outer"); // longest first
  CHECK(entries[0].calls == 2);
  CHECK(timer.seconds("never") == 0.0);
  timer.reset();
  CHECK(timer.entries().empty());
}
