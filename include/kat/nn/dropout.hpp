#pragma once
/// @file
/// @brief Inverted dropout with a seeded, backend-independent mask.

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/dropout_kernels.hpp"
#include "kat/nn/detail/element_product.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace kat::nn {

namespace detail {

/// out = s ⊙ in element-wise over the spans of equally shaped contiguous matrices (Dropout's
/// backward and R-operator).
template <class ExecSpace, class MatrixView>
void dropout_apply_mask(const ExecSpace &space, const char *label, const MatrixView &s,
                        const MatrixView &in, const MatrixView &out) {
  element_product(space, label, in.span(), s.data(), in.data(), out.data());
}

} // namespace detail

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
  /// The probability of zeroing an element, in [0, 1).
  double p() const { return p_; }

  /// Index of the next training mask. Saving it and restoring it with set_mask_counter()
  /// resumes the exact mask sequence (checkpoints; finite-difference checks).
  std::uint64_t mask_counter() const { return calls_; }
  /// Sets the index of the next training mask (see mask_counter()).
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
    Kokkos::parallel_for("kat::nn::Dropout::forward",
                         Kokkos::RangePolicy<execution_space>(space, 0, x.span()),
                         detail::DropoutForward<Scalar>{seed, call, p, keep_scale, sp, yp, xp});
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
    detail::dropout_apply_mask(space, "kat::nn::Dropout::backward", scale_view_, dy, dx);
  }

  /// R-operator (see Layer). The layer has no parameters and, for the mask of the last
  /// forward (all ones in evaluation), is linear: R{y} = s ⊙ R{x} and R{dx} = s ⊙ R{dy}, with
  /// s the mask's scale (0 or 1/(1-p)). The mask is the one forward() drew, not a new one.
  bool supports_r_operator() const override { return true; }

  /// ry = s ⊙ rx (rx of extent 0: ry = 0), s the last forward's mask.
  /// @throws ShapeError if rx or ry differ from the last training forward's extents.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::Dropout::forward_r");
    if (rx.extent(0) == 0) {
      Kokkos::deep_copy(space, ry, Scalar(0));
      return;
    }
    if (!masked_) {
      Kokkos::deep_copy(space, ry, rx);
      return;
    }
    require_mask_shape("forward_r", "rx", rx);
    require_mask_shape("forward_r", "ry", ry);
    detail::dropout_apply_mask(space, "kat::nn::Dropout::forward_r", scale_view_, rx, ry);
  }

  /// rdx = s ⊙ rdy (skipped when rdx is empty); dy is not needed.
  /// @throws ShapeError if rdy or rdx differ from the last training forward's extents.
  void backward_r(const execution_space &space, const matrix_type & /*dy*/, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::Dropout::backward_r");
    if (rdx.extent(0) == 0) {
      return;
    }
    if (!masked_) {
      Kokkos::deep_copy(space, rdx, rdy);
      return;
    }
    require_mask_shape("backward_r", "rdy", rdy);
    require_mask_shape("backward_r", "rdx", rdx);
    detail::dropout_apply_mask(space, "kat::nn::Dropout::backward_r", scale_view_, rdy, rdx);
  }

private:
  void require_mask_shape(const char *what, const char *name, const matrix_type &m) const {
    const std::string where = kat::detail::concat("kat::nn::Dropout::", what);
    kat::detail::require_extent(where.c_str(), kat::detail::concat(name, " rows").c_str(),
                                scale_view_.extent(0), m.extent(0));
    kat::detail::require_extent(where.c_str(), kat::detail::concat(name, " columns").c_str(),
                                scale_view_.extent(1), m.extent(1));
  }

  double p_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
  bool masked_ = false;
  Workspace<Scalar, MemorySpace> scale_;
  matrix_type scale_view_;
};

} // namespace kat::nn
