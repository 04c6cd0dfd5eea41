#pragma once
/// @file
/// @brief Adam (with optional L2 or decoupled weight decay) and AdamW, exactly as
/// torch.optim.Adam / torch.optim.AdamW without amsgrad.

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

/// The fused Adam update of Adam::step, element i. A named functor rather than an extended
/// device lambda: nvcc's wrapper of an extended lambda in a header is merged across
/// translation units while its function pointers are not (docs/backends.md).
template <class Vector, class Index> struct AdamStep {
  using Scalar = typename Vector::non_const_value_type;
  Vector p, g, m, v;
  Scalar step_size, inv_sqrt_bc2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, min_normal;
  bool decoupled, use_weight_decay;
  Scalar weight_decay, decay_factor;

  KOKKOS_INLINE_FUNCTION void operator()(const Index i) const {
    Scalar pi = p(i);
    Scalar gi = g(i);
    // PyTorch skips both forms when weight_decay == 0, which matters for non-finite p.
    if (use_weight_decay) {
      if (decoupled) {
        pi *= decay_factor;
      } else {
        gi += weight_decay * pi;
      }
    }
    Scalar mi = beta1 * m(i) + one_minus_beta1 * gi;
    Scalar vi = beta2 * v(i) + one_minus_beta2 * gi * gi;
    // Subnormal moments are stored as 0 (see the class comment). One test on |m|: a
    // test on the sign first would be a branch mispredicted half the time.
    mi = math::fabs(mi) < min_normal ? Scalar(0) : mi;
    vi = vi < min_normal ? Scalar(0) : vi;
    m(i) = mi;
    v(i) = vi;
    p(i) = pi - step_size * mi / (math::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
};

} // namespace detail

/// Adam (Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", Algorithm 1), with
/// the bias corrections folded into the step size and the denominator as PyTorch does, and
/// either L2 weight decay (added to the gradient) or decoupled weight decay (Loshchilov &
/// Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2, i.e. AdamW).
///
/// Per element, with gradient g, parameter p and t = steps() after the increment
/// (torch.optim.Adam with amsgrad = false, maximize = false):
///
///     if decoupled_weight_decay: p *= 1 - lr * weight_decay
///     else:                      g += weight_decay * p
///     m = beta1 * m + (1 - beta1) * g
///     v = beta2 * v + (1 - beta2) * g^2
///     p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
///
/// The bias corrections are computed on the host in double. eps is added after the bias
/// correction of sqrt(v) (PyTorch's placement, the paper's "epsilon hat" differs by that
/// factor). A consequence used in the tests: the first step moves every parameter by
/// lr * g / (|g| + eps), i.e. lr * sign(g) up to eps.
///
/// Moments that fall below the smallest normal number (std::numeric_limits<Scalar>::min())
/// are stored as 0. A gradient that is exactly 0 from some step on (a dead ReLU unit) makes
/// m decay by beta1 per step into the subnormal range, where every operation takes a
/// microcode assist: on the Fashion-MNIST MLP about 9% of m became subnormal after two
/// epochs and an epoch took 2.4x as long. The update such a moment would have made is at
/// most (lr / (1 - beta1^t)) * min() / eps (about lr * 1e-30 in float), far below the
/// resolution of any parameter it is added to.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class Adam : public Optimizer<Scalar, MemorySpace> {
  using Base = Optimizer<Scalar, MemorySpace>;

public:
  using typename Base::execution_space;
  using typename Base::vector_type;

  /// Hyperparameters, with torch.optim.Adam's defaults.
  struct Options {
    double lr = 1e-3;                    ///< learning rate, >= 0
    double beta1 = 0.9;                  ///< first-moment decay, in [0, 1)
    double beta2 = 0.999;                ///< second-moment decay, in [0, 1)
    double eps = 1e-8;                   ///< denominator guard, > 0 (units of the gradient)
    double weight_decay = 0;             ///< >= 0
    bool decoupled_weight_decay = false; ///< true: AdamW's decay; false: L2 on the gradient
  };

  /// Builds an optimizer for a flat parameter vector of length `n` and allocates the zeroed
  /// moments "kat::optim::Adam::exp_avg" and "kat::optim::Adam::exp_avg_sq" (length n each).
  /// @throws ValueError naming the option, its valid range and its value if: lr < 0, beta1 or
  ///   beta2 outside [0, 1), eps <= 0, weight_decay < 0, or any of them not finite.
  Adam(std::size_t n, const Options &options) : Adam(n, options, "Adam") {}

  /// Adam with default Options.
  explicit Adam(std::size_t n) : Adam(n, Options{}) {}

  /// "Adam".
  std::string name() const override { return "Adam"; }

  /// One Adam update of `params` (length n) from `grads` (length n), in a single fused
  /// kernel; `grads` is not modified. The rate used is lr() (see set_lr()).
  /// @throws ShapeError if either length differs from n.
  void step(const execution_space &space, const vector_type &params,
            const vector_type &grads) override {
    kat::ScopedRegion region("kat::optim::" + name() + "::step");
    this->begin_step(params, grads);

    const double t = static_cast<double>(this->steps_);
    const double bias_correction1 = 1.0 - std::pow(opt_.beta1, t);
    const double bias_correction2 = 1.0 - std::pow(opt_.beta2, t);

    using Policy = Kokkos::RangePolicy<execution_space>;
    using Index = typename Policy::member_type;
    detail::AdamStep<vector_type, Index> kernel;
    kernel.p = params;
    kernel.g = grads;
    kernel.m = m_;
    kernel.v = v_;
    kernel.step_size = static_cast<Scalar>(this->lr_ / bias_correction1);
    kernel.inv_sqrt_bc2 = static_cast<Scalar>(1.0 / std::sqrt(bias_correction2));
    kernel.beta1 = static_cast<Scalar>(opt_.beta1);
    kernel.one_minus_beta1 = static_cast<Scalar>(1.0 - opt_.beta1);
    kernel.beta2 = static_cast<Scalar>(opt_.beta2);
    kernel.one_minus_beta2 = static_cast<Scalar>(1.0 - opt_.beta2);
    kernel.eps = static_cast<Scalar>(opt_.eps);
    kernel.min_normal = std::numeric_limits<Scalar>::min();
    kernel.decoupled = opt_.decoupled_weight_decay;
    kernel.use_weight_decay = opt_.weight_decay != 0.0;
    kernel.weight_decay = static_cast<Scalar>(opt_.weight_decay);
    kernel.decay_factor = static_cast<Scalar>(1.0 - this->lr_ * opt_.weight_decay);
    Kokkos::parallel_for("kat::optim::Adam::step",
                         Policy(space, Index(0), static_cast<Index>(this->size_)), kernel);
  }

  /// The options given at construction (lr there is the initial rate; see lr()).
  const Options &options() const { return opt_; }

  /// First moment m (PyTorch's `exp_avg`), length n. Writable through the view so a
  /// checkpoint can restore it (together with set_steps()).
  const vector_type &exp_avg() const { return m_; }

  /// Second moment v (PyTorch's `exp_avg_sq`), length n, in squared gradient units.
  const vector_type &exp_avg_sq() const { return v_; }

  /// exp_avg and exp_avg_sq.
  std::vector<vector_type> state_buffers() const override { return {m_, v_}; }

  /// "steps", "lr", "exp_avg" and "exp_avg_sq" (Scalar, [n] each).
  StateDict state_dict() const override {
    StateDict s = Base::state_dict();
    s.set_view("exp_avg", m_);
    s.set_view("exp_avg_sq", v_);
    return s;
  }

  /// @throws StateError / ValueError as Optimizer::load_state_dict.
  void load_state_dict(const StateDict &state) override {
    const auto [steps, lr] = this->checked_base_state(state, {"exp_avg", "exp_avg_sq"});
    state.copy_to("exp_avg", m_);
    state.copy_to("exp_avg_sq", v_);
    this->steps_ = steps;
    this->lr_ = lr;
  }

protected:
  /// `who` names the optimizer in validation messages and view labels.
  Adam(std::size_t n, const Options &options, const std::string &who)
      : Base(n, validated(options, "kat::optim::" + who).lr), opt_(options),
        m_("kat::optim::" + who + "::exp_avg", n), v_("kat::optim::" + who + "::exp_avg_sq", n) {}

private:
  static const Options &validated(const Options &o, const std::string &who) {
    detail::require_lr(who, o.lr);
    detail::require_option(std::isfinite(o.beta1) && o.beta1 >= 0.0 && o.beta1 < 1.0, who, "beta1",
                           "in [0, 1)", o.beta1);
    detail::require_option(std::isfinite(o.beta2) && o.beta2 >= 0.0 && o.beta2 < 1.0, who, "beta2",
                           "in [0, 1)", o.beta2);
    detail::require_option(std::isfinite(o.eps) && o.eps > 0.0, who, "eps", "finite and > 0",
                           o.eps);
    detail::require_option(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, who,
                           "weight_decay", "finite and >= 0", o.weight_decay);
    return o;
  }

  Options opt_;
  vector_type m_;
  vector_type v_;
};

/// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2):
/// Adam whose weight decay shrinks the parameters directly by lr * weight_decay per step
/// instead of entering the moments, exactly as torch.optim.AdamW (amsgrad = false). Its
/// Options default to weight_decay = 0.01 (PyTorch's AdamW default) and decoupled decay.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class AdamW : public Adam<Scalar, MemorySpace> {
  using Base = Adam<Scalar, MemorySpace>;

public:
  /// Adam's options with AdamW's defaults; decoupled_weight_decay must stay true (use Adam
  /// for L2 decay) so that an optimizer named AdamW always is one.
  struct Options : Base::Options {
    Options() {
      this->weight_decay = 0.01;
      this->decoupled_weight_decay = true;
    }
  };

  /// Builds an AdamW optimizer for a flat parameter vector of length `n`; moments are labelled
  /// "kat::optim::AdamW::exp_avg" / "kat::optim::AdamW::exp_avg_sq".
  /// @throws ValueError as Adam, and if decoupled_weight_decay is false.
  AdamW(std::size_t n, const Options &options) : Base(n, checked(options), "AdamW") {}

  /// AdamW with default Options.
  explicit AdamW(std::size_t n) : AdamW(n, Options{}) {}

  std::string name() const override { return "AdamW"; }

private:
  static const Options &checked(const Options &o) {
    if (!o.decoupled_weight_decay) {
      throw ValueError("kat::optim::AdamW: decoupled_weight_decay must be true (use "
                       "kat::optim::Adam for L2 weight decay), got false");
    }
    return o;
  }
};

} // namespace optim
} // namespace kat
