// The Kokkos Tools-based helpers: AllocationTracker and RegionTimer.
#include "test_helpers.hpp"

#include <kat/core/allocation_tracker.hpp>
#include <kat/core/region_timer.hpp>

#include <catch2/catch.hpp>

#include <chrono>

namespace test_tools {

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

TEST_CASE("tools: region timer exclusive time and call paths", "[tools][profiling]") {
  using clock = std::chrono::steady_clock;
  auto spin = [](double seconds) {
    const auto t0 = clock::now();
    while (std::chrono::duration<double>(clock::now() - t0).count() < seconds) {
    }
  };
  RegionTimer timer;
  const auto t0 = clock::now();
  // step { factors { comm } ; precondition { comm } }, and comm on its own.
  Kokkos::Profiling::pushRegion("step");
  Kokkos::Profiling::pushRegion("factors");
  spin(0.01);
  Kokkos::Profiling::pushRegion("comm");
  spin(0.02);
  Kokkos::Profiling::popRegion();
  Kokkos::Profiling::popRegion();
  Kokkos::Profiling::pushRegion("precondition");
  Kokkos::Profiling::pushRegion("comm");
  spin(0.01);
  Kokkos::Profiling::popRegion();
  Kokkos::Profiling::popRegion();
  Kokkos::Profiling::popRegion();
  Kokkos::Profiling::pushRegion("comm");
  spin(0.005);
  Kokkos::Profiling::popRegion();
  const double wall = std::chrono::duration<double>(clock::now() - t0).count();

  CHECK(timer.seconds("comm") >= 0.035);
  CHECK(timer.self_seconds("comm") == Approx(timer.seconds("comm")));
  CHECK(timer.self_seconds("factors") >= 0.01);
  CHECK(timer.self_seconds("factors") + 0.02 <= timer.seconds("factors"));
  CHECK(timer.self_seconds("never") == 0.0);
  for (const auto &e : timer.entries()) {
    CHECK(e.self_seconds <= e.seconds);
  }

  const auto paths = timer.paths();
  using P = std::vector<std::string>;
  REQUIRE(paths.size() == 6);
  CHECK(paths[0].path == P{"comm"}); // depth first, siblings by name
  CHECK(paths[1].path == P{"step"});
  CHECK(paths[2].path == P{"step", "factors"});
  CHECK(paths[3].path == P{"step", "factors", "comm"});
  CHECK(paths[4].path == P{"step", "precondition"});
  CHECK(paths[5].path == P{"step", "precondition", "comm"});
  CHECK(paths[0].calls == 1);
  CHECK(paths[0].seconds >= 0.005);
  CHECK(paths[3].seconds >= 0.02);
  CHECK(paths[5].seconds >= 0.01);
  // Upper bounds on spun times fail on a loaded machine (a preempted thread's region grows);
  // these identities hold whatever the timing: the three "comm" paths make up the name's
  // total, and a region's exclusive time is its inclusive time minus its nested regions'.
  CHECK(paths[0].seconds + paths[3].seconds + paths[5].seconds ==
        Approx(timer.seconds("comm")).epsilon(1e-9));
  CHECK(timer.self_seconds("factors") == Approx(paths[2].seconds - paths[3].seconds).epsilon(1e-9));
  CHECK(paths[2].self_seconds == Approx(timer.self_seconds("factors")).epsilon(1e-9));
  // The exclusive times below "step" add up to its inclusive time; nothing counts twice.
  double self = 0;
  for (std::size_t i = 1; i < paths.size(); ++i)
    self += paths[i].self_seconds;
  CHECK(self == Approx(paths[1].seconds).epsilon(1e-6));
  CHECK(paths[1].seconds + paths[0].seconds <= wall);

  // reset() keeps timing an open region and forgets what was completed.
  Kokkos::Profiling::pushRegion("open");
  timer.reset();
  CHECK(timer.paths().empty());
  spin(0.005);
  Kokkos::Profiling::popRegion();
  const auto after = timer.paths();
  REQUIRE(after.size() == 1);
  CHECK(after[0].path == P{"open"});
  CHECK(after[0].seconds >= 0.005);
}

} // namespace test_tools
