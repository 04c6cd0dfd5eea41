#pragma once
/// @file
/// @brief Flatten: (C, H, W) features to one vector of C·H·W.

#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <string>

namespace kat::nn {

/// Reinterprets (C, H, W) sample features as a flat vector. KAT's batch matrices already
/// store features in that order, so y = x: Sequential and Residual pass the input through
/// without calling forward() or backward() (passes_through()); called directly, they copy.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Flatten final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  std::string name() const override { return "Flatten"; }
  FeatureShape output_shape(const FeatureShape &input) const override {
    return FeatureShape{static_cast<int>(input.size())};
  }
  bool passes_through() const override { return true; }
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::Flatten::forward");
    Kokkos::deep_copy(space, y, x);
  }
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Flatten::backward");
    if (dx.extent(0) != 0) {
      Kokkos::deep_copy(space, dx, dy);
    }
  }
};

} // namespace kat::nn
