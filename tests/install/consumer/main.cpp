// A downstream program: one Dense layer forward through the installed headers.
#include <kat/kat.hpp>

#include <cmath>
#include <cstdio>

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
  std::printf("consumer: y = (%g, %g) %s\n", y(0, 0), y(0, 1), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
