// A downstream program: one Dense layer forward through the installed headers.
#include <kat/kat.hpp>

#include <cmath>
#include <cstdio>

// kat/kat.hpp brings the installed, generated kat/version.hpp.
#ifndef KAT_VERSION
#error "kat/kat.hpp defined no KAT_VERSION: the installed kat/version.hpp was not found"
#endif
#ifdef KAT_EXPECTED_VERSION
static_assert(KAT_VERSION == KAT_EXPECTED_VERSION,
              "the installed kat/version.hpp gives another version than the package");
#endif
#ifdef KAT_EXPECTED_KOKKOS_VERSION
static_assert(KOKKOS_VERSION == KAT_EXPECTED_KOKKOS_VERSION,
              "the consumer compiles against other Kokkos headers than the package it found");
#endif

int main(int argc, char **argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Space = Kokkos::DefaultExecutionSpace;
  kat::nn::Sequential<double> model(kat::FeatureShape{3});
  model.add<kat::nn::Dense>(3, 2);
  model.compile(Space(), 1);
  Kokkos::deep_copy(model.parameters(), 1.0); // W = 1, b = 1
  kat::Matrix<double> x("x", 1, 3);
  Kokkos::deep_copy(x, 2.0);
  auto y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.forward(Space(), x));
  const bool ok = std::abs(y(0, 0) - 7.0) < 1e-12 && std::abs(y(0, 1) - 7.0) < 1e-12;
  std::printf("consumer: KAT %s, Kokkos %d on %s: y = (%g, %g) %s\n", KAT_VERSION_STRING,
              KOKKOS_VERSION, Space::name(), y(0, 0), y(0, 1), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
