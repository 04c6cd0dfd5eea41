#pragma once
// Finite-difference check of a layer's backward: L = sum(y ⊙ r) for a fixed random r, so
// dL/dy = r; dL/dx and dL/dθ from backward() must match central differences of L.
#include "test_helpers.hpp"

#include <kat/core/parameter_buffer.hpp>

#include <catch2/catch.hpp>

#include <functional>

namespace kat::test {

template <class LayerT>
void check_layer_gradients(
    LayerT &layer, FeatureShape in, std::size_t n, std::uint64_t seed,
    const std::function<void()> &before_forward = [] {}, double tol = 1e-7) {
  const Space space;
  const FeatureShape out = layer.output_shape(in);
  auto buffer = bind_fresh<double>(layer, seed);

  auto x = random_matrix<double>(n, in.size(), seed + 1);
  auto r = random_matrix<double>(n, out.size(), seed + 2);
  Matrix<double, Mem> y("y", n, out.size());
  Matrix<double, Mem> dx("dx", n, in.size());

  auto loss = [&] {
    before_forward();
    layer.forward(space, x, y);
    space.fence();
    return weighted_sum(y, r);
  };
  loss();
  layer.backward(space, r, dx);
  space.fence();

  const auto num_dx = numeric_gradient(x, loss);
  INFO(layer.name() << ": dL/dx");
  CHECK(max_rel_error(dx, num_dx) < tol);
  if (layer.parameter_count() > 0) {
    const auto num_dtheta = numeric_gradient(buffer.parameters(), loss);
    INFO(layer.name() << ": dL/dtheta");
    CHECK(max_rel_error(buffer.gradients(), num_dtheta) < tol);
  }
}

} // namespace kat::test
