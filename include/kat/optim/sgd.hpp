#pragma once
/// @file
/// @brief Stochastic gradient descent with momentum, dampening, Nesterov momentum and L2 weight
/// decay, exactly as torch.optim.SGD.

#include "kat/core/error.hpp"
#include "kat/core/math.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/optim/optimizer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace kat {
namespace optim {

namespace detail {

/// The fused SGD update of SGD::step, element i. A named functor, not a KOKKOS_LAMBDA: nvcc's
/// wrapper of an extended lambda in a header is merged across translation units while its
/// function pointers are not, which crashed SGD::step on the host (docs/backends.md).
template <class Vector> struct SGDStep {
  using Scalar = typename Vector::non_const_value_type;
  Vector p, g, buf;
  Scalar lr, weight_decay, one_minus_dampening, momentum, min_normal;
  bool use_weight_decay, use_momentum, nesterov, first;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    Scalar d = g(i);
    // PyTorch skips the term when weight_decay == 0, which matters for non-finite p.
    if (use_weight_decay) {
      d += weight_decay * p(i);
    }
    if (use_momentum) {
      // PyTorch clones d into the buffer on the first step, with no dampening.
      Scalar b = first ? d : momentum * buf(i) + one_minus_dampening * d;
      b = math::fabs(b) < min_normal ? Scalar(0) : b; // subnormal: 0 (see the class comment)
      buf(i) = b;
      d = nesterov ? d + momentum * b : b;
    }
    p(i) -= lr * d;
  }
};

} // namespace detail

/// SGD with optional momentum (Polyak heavy ball in PyTorch's formulation), dampening,
/// Nesterov momentum (Sutskever et al. 2013, "On the importance of initialization and momentum
/// in deep learning", Eq. 3-4, in the reformulation used by PyTorch) and L2 weight decay.
///
/// Per element, with gradient g and parameter p, one step() is (torch.optim.SGD):
///
///     d = g + weight_decay * p
///     if momentum != 0:
///         buf = d                                          (first step)
///         buf = momentum * buf + (1 - dampening) * d       (later steps)
///         d   = nesterov ? d + momentum * buf : buf
///     p -= lr * d
///
/// Note that PyTorch's momentum scales the gradient by lr after accumulation (unlike the
/// Sutskever formulation, which accumulates lr * g); the two coincide for a constant lr.
///
/// A momentum buffer entry below the smallest normal number (std::numeric_limits<Scalar>::min())
/// is stored as 0, as Adam's moments are. A gradient that is exactly 0 from some step on (a
/// dead ReLU unit) makes buf decay by `momentum` per step into the subnormal range, where
/// every operation takes a microcode assist on x86 cores, and then stay at the smallest
/// subnormal (0.9 times it rounds back to it): in kat_train's CNN (momentum 0.9, bf16) the SGD
/// step took 19 % of a 3-epoch run (2 % with subnormals flushed), epoch 3 24.2 s against
/// epoch 1's 14.5 s
/// (docs/benchmarks.md, "Subnormal numbers"). The update such an entry would have made is
/// at most lr * min() (about lr * 1.2e-38 in float), below the resolution of any normal
/// parameter it is subtracted from.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class SGD : public Optimizer<Scalar, MemorySpace> {
  using Base = Optimizer<Scalar, MemorySpace>;

public:
  using typename Base::execution_space;
  using typename Base::vector_type;

  /// Hyperparameters, with torch.optim.SGD's defaults except lr (PyTorch requires one).
  struct Options {
    double lr = 0.01;        ///< learning rate, >= 0
    double momentum = 0;     ///< momentum factor, >= 0; 0 disables the buffer
    double dampening = 0;    ///< in [0, 1]; scales new gradients into the buffer by 1 - it
    double weight_decay = 0; ///< L2 penalty coefficient, >= 0 (added to the gradient)
    bool nesterov = false;   ///< needs momentum > 0 and dampening == 0
  };

  /// Builds an optimizer for a flat parameter vector of length `n`. Allocates the momentum
  /// buffer ("kat::optim::SGD::momentum_buffer", length n) only when momentum != 0.
  /// @throws ValueError naming the option, its valid range and its value if: lr < 0,
  ///   momentum < 0, weight_decay < 0, dampening outside [0, 1], any of them not finite, or
  ///   nesterov with momentum == 0 or dampening != 0 (the same checks as torch.optim.SGD).
  SGD(std::size_t n, const Options &options) : Base(n, validated(options).lr), opt_(options) {
    if (opt_.momentum != 0.0) {
      buf_ = vector_type("kat::optim::SGD::momentum_buffer", n);
    }
  }

  /// SGD with default Options.
  explicit SGD(std::size_t n) : SGD(n, Options{}) {}

  std::string name() const override { return "SGD"; }

  /// One SGD update of `params` (length n) from `grads` (length n), in a single fused kernel.
  /// The options' lr is only the initial rate; the rate used is lr() (see set_lr()).
  /// @throws ShapeError if either length differs from n.
  void step(const execution_space &space, const vector_type &params,
            const vector_type &grads) override {
    kat::ScopedRegion region("kat::optim::SGD::step");
    this->begin_step(params, grads);

    detail::SGDStep<vector_type> kernel;
    kernel.p = params;
    kernel.g = grads;
    kernel.buf = buf_;
    kernel.lr = static_cast<Scalar>(this->lr_);
    kernel.weight_decay = static_cast<Scalar>(opt_.weight_decay);
    kernel.one_minus_dampening = static_cast<Scalar>(1.0 - opt_.dampening);
    kernel.momentum = static_cast<Scalar>(opt_.momentum);
    kernel.min_normal = std::numeric_limits<Scalar>::min();
    kernel.use_weight_decay = opt_.weight_decay != 0.0;
    kernel.use_momentum = opt_.momentum != 0.0;
    kernel.nesterov = opt_.nesterov;
    kernel.first = this->steps_ == 1;
    using Policy = Kokkos::RangePolicy<execution_space>;
    using Index = typename Policy::member_type;
    Kokkos::parallel_for("kat::optim::SGD::step",
                         Policy(space, Index(0), static_cast<Index>(this->size_)), kernel);
  }

  /// The options given at construction (lr there is the initial rate; see lr()).
  const Options &options() const { return opt_; }

  /// Momentum buffer (length n, empty when momentum == 0). Writable through the view so a
  /// checkpoint can restore it (together with set_steps()).
  const vector_type &momentum_buffer() const { return buf_; }

  /// The momentum buffer, when momentum != 0.
  std::vector<vector_type> state_buffers() const override {
    return buf_.extent(0) > 0 ? std::vector<vector_type>{buf_} : std::vector<vector_type>{};
  }

  /// "steps", "lr" and, with momentum, "momentum_buffer" (Scalar, [n]).
  StateDict state_dict() const override {
    StateDict s = Base::state_dict();
    if (buf_.extent(0) > 0) {
      s.set_view("momentum_buffer", buf_);
    }
    return s;
  }

  /// @throws StateError / ValueError as Optimizer::load_state_dict; the entries must include
  ///   "momentum_buffer" exactly when momentum != 0.
  void load_state_dict(const StateDict &state) override {
    const bool has_buffer = buf_.extent(0) > 0;
    const auto [steps, lr] =
        this->checked_base_state(state, has_buffer ? std::vector<std::string>{"momentum_buffer"}
                                                   : std::vector<std::string>{});
    if (has_buffer) {
      state.copy_to("momentum_buffer", buf_);
    }
    this->steps_ = steps;
    this->lr_ = lr;
  }

private:
  static const Options &validated(const Options &o) {
    const std::string who = "kat::optim::SGD";
    detail::require_lr(who, o.lr);
    detail::require_option(std::isfinite(o.momentum) && o.momentum >= 0.0, who, "momentum",
                           "finite and >= 0", o.momentum);
    detail::require_option(std::isfinite(o.dampening) && o.dampening >= 0.0 && o.dampening <= 1.0,
                           who, "dampening", "in [0, 1]", o.dampening);
    detail::require_option(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, who,
                           "weight_decay", "finite and >= 0", o.weight_decay);
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
      throw ValueError(kat::detail::concat(
          who, ": nesterov requires momentum > 0 and dampening == 0, got momentum ", o.momentum,
          " and dampening ", o.dampening));
    }
    return o;
  }

  Options opt_;
  vector_type buf_;
};

} // namespace optim
} // namespace kat
