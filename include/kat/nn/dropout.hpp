#pragma once
/// @file
/// @brief Inverted dropout with a seeded, backend-independent mask.

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace kat::nn {

/// Dropout (Srivastava et al., JMLR 2014) in the "inverted" form PyTorch uses: in training
/// each element is zeroed with probability p and the survivors are scaled by 1/(1-p); in
/// evaluation the layer is the identity.
///
/// The mask of the k-th training forward is a pure function of (seed, k, element index), so
/// a run is reproducible on every backend and thread count.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Dropout final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @param p     drop probability, 0 <= p < 1
  /// @param seed  mask seed
  /// @throws ValueError if p is outside [0, 1).
  explicit Dropout(double p = 0.5, std::uint64_t seed = 0)
      : p_(p), seed_(seed), scale_("kat::nn::Dropout::scale") {
    if (!(p >= 0.0 && p < 1.0)) {
      throw ValueError(kat::detail::concat("kat::nn::Dropout: p must be in [0, 1), got ", p));
    }
  }

  std::string name() const override { return "Dropout"; }
  double p() const { return p_; }

  /// Index of the next training mask. Saving it and restoring it with set_mask_counter()
  /// resumes the exact mask sequence (checkpoints; finite-difference checks).
  std::uint64_t mask_counter() const { return calls_; }
  void set_mask_counter(std::uint64_t k) { calls_ = k; }

  /// "mask_counter" (uint64): the index of the next training mask.
  StateDict state_dict() const override {
    StateDict s;
    s.set("mask_counter", calls_);
    return s;
  }
  void check_state_dict(const StateDict &state) const override {
    state.require_names("kat::nn::Dropout::load_state_dict", {"mask_counter"});
    state.checked<std::uint64_t>("mask_counter", {});
  }
  void load_state_dict(const StateDict &state) override {
    check_state_dict(state);
    calls_ = state.get<std::uint64_t>("mask_counter");
  }
  FeatureShape output_shape(const FeatureShape &input) const override { return input; }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::Dropout::forward");
    masked_ = this->training_ && p_ > 0.0;
    if (!masked_) {
      Kokkos::deep_copy(space, y, x);
      return;
    }
    scale_view_ = scale_.matrix(x.extent(0), x.extent(1));
    Scalar *sp = scale_view_.data();
    const Scalar *xp = x.data();
    Scalar *yp = y.data();
    const double p = p_;
    const Scalar keep_scale = static_cast<Scalar>(1.0 / (1.0 - p_));
    const std::uint64_t seed = seed_;
    const std::uint64_t call = calls_++;
    Kokkos::parallel_for(
        "kat::nn::Dropout::forward", Kokkos::RangePolicy<execution_space>(space, 0, x.span()),
        KOKKOS_LAMBDA(const std::size_t i) {
          const Scalar s = counter_uniform(seed, call, i) < p ? Scalar(0) : keep_scale;
          sp[i] = s;
          yp[i] = xp[i] * s;
        });
  }

  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Dropout::backward");
    if (dx.extent(0) == 0) {
      return;
    }
    if (!masked_) {
      Kokkos::deep_copy(space, dx, dy);
      return;
    }
    const Scalar *sp = scale_view_.data();
    const Scalar *dyp = dy.data();
    Scalar *dxp = dx.data();
    Kokkos::parallel_for(
        "kat::nn::Dropout::backward", Kokkos::RangePolicy<execution_space>(space, 0, dy.span()),
        KOKKOS_LAMBDA(const std::size_t i) { dxp[i] = dyp[i] * sp[i]; });
  }

private:
  double p_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
  bool masked_ = false;
  Workspace<Scalar, MemorySpace> scale_;
  matrix_type scale_view_;
};

} // namespace kat::nn
