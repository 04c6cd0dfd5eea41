#pragma once
/// @file
/// @brief Flatten: (C, H, W) features to one vector of C·H·W.

#include "kat/core/activation_layout.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/flatten_kernels.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace kat::nn {

/// Reinterprets (C, H, W) sample features as a flat vector in KAT's feature order
/// h + H (w + W c) (see FeatureShape).
///
/// From KAT's layout, y = x: Sequential and Residual pass the input through without calling
/// forward() or backward() (passes_through()); called directly, they copy. From one of
/// oneDNN's layouts (channels16, channels_last, and in Precision::bf16 channels16_bf16 or
/// channels_last_bf16; see kat::ActivationLayout), forward() gathers x into KAT's order
/// (bf16 values widened exactly) and backward() scatters dy back into the input's layout
/// (rounded to bf16, nearest even, in a layout that stores bf16): a network computing in
/// those layouts (convolutions, pooling) then hands its last activation to the dense layers
/// without a layer of its own converting it. Both are permutations, exact in fp32.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Flatten final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  std::string name() const override { return "Flatten"; }
  /// (C, H, W) -> (C·H·W); records (C, H, W) for the layouts other than KAT's.
  FeatureShape output_shape(const FeatureShape &input) const override {
    input_ = input;
    return FeatureShape{static_cast<int>(input.size())};
  }
  /// y = x exactly when the input is in KAT's layout (the output always is).
  bool passes_through() const override { return this->in_layout_ == ActivationLayout::features; }

  /// Output in KAT's layout; input in it, or in any layout that a batch of the input's
  /// channels fits in the layer's precision (kat::layout_fits).
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    return out == ActivationLayout::features &&
           (in == ActivationLayout::features ||
            layout_fits(in, static_cast<long long>(input_.channels), this->precision_));
  }

  /// y (N x C·H·W, KAT's order) = x (N x C·H·W in the input layout).
  /// @throws ShapeError if x or y do not have the input's C·H·W columns or their rows differ.
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::Flatten::forward");
    check("forward", "x", x, "y", y);
    this->require_layouts_supported("kat::nn::Flatten::forward");
    permute<false>(space, y, x);
  }
  /// dx (in the input layout) = dy (KAT's order); an empty dx skips the work.
  /// @throws ShapeError if dy or dx do not have the input's C·H·W columns or their rows differ.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Flatten::backward");
    if (dx.extent(0) == 0) {
      return;
    }
    check("backward", "dy", dy, "dx", dx);
    permute<true>(space, dy, dx);
  }

  /// R-operator (see Layer): R{y} = R{x}, R{dx} = R{dy}, in the layouts of forward() and
  /// backward(). Containers pass R{x} and R{dy} through as they do x and dy; called directly,
  /// these copy (rx of extent 0: ry = 0).
  bool supports_r_operator() const override { return true; }
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::Flatten::forward_r");
    if (rx.extent(0) == 0) {
      Kokkos::deep_copy(space, ry, Scalar(0));
      return;
    }
    check("forward_r", "rx", rx, "ry", ry);
    permute<false>(space, ry, rx);
  }
  void backward_r(const execution_space &space, const matrix_type & /*dy*/, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::Flatten::backward_r");
    if (rdx.extent(0) == 0) {
      return;
    }
    check("backward_r", "rdy", rdy, "rdx", rdx);
    permute<true>(space, rdy, rdx);
  }

private:
  /// Without ToLayout `features` (KAT's order) = `other` (in the input layout), with it the
  /// transpose; a copy in KAT's layout.
  template <bool ToLayout>
  void permute(const execution_space &space, const matrix_type &features,
               const matrix_type &other) const {
    if (this->in_layout_ == ActivationLayout::features) {
      if constexpr (ToLayout) {
        Kokkos::deep_copy(space, other, features);
      } else {
        Kokkos::deep_copy(space, features, other);
      }
      return;
    }
    detail::flatten_permute<ToLayout>(space, features, other.data(), this->in_layout_,
                                      input_.channels, input_.height, input_.width);
  }

  /// Outside KAT's layout the input shape must be known and both matrices must hold it.
  void check(const char *pass, const char *a_name, const matrix_type &a, const char *b_name,
             const matrix_type &b) const {
    const std::string where = kat::detail::concat("kat::nn::Flatten::", pass);
    kat::detail::require_extent(where.c_str(), (std::string(b_name) + " rows").c_str(), a.extent(0),
                                b.extent(0));
    kat::detail::require_extent(where.c_str(), (std::string(b_name) + " columns").c_str(),
                                a.extent(1), b.extent(1));
    if (this->in_layout_ != ActivationLayout::features) {
      kat::detail::require_extent(where.c_str(), (std::string(a_name) + " columns").c_str(),
                                  input_.size(), a.extent(1));
    }
  }

  mutable FeatureShape input_{}; // the shape output_shape() last saw
};

} // namespace kat::nn
