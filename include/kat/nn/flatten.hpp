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

  /// R-operator (see Layer): R{y} = R{x}, R{dx} = R{dy}. Containers pass R{x} and R{dy}
  /// through as they do x and dy; called directly, these copy (rx of extent 0: ry = 0).
  bool supports_r_operator() const override { return true; }
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::Flatten::forward_r");
    if (rx.extent(0) == 0) {
      Kokkos::deep_copy(space, ry, Scalar(0));
      return;
    }
    Kokkos::deep_copy(space, ry, rx);
  }
  void backward_r(const execution_space &space, const matrix_type & /*dy*/, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::Flatten::backward_r");
    if (rdx.extent(0) != 0) {
      Kokkos::deep_copy(space, rdx, rdy);
    }
  }
};

} // namespace kat::nn
