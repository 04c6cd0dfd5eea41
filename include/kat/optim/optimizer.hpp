#pragma once
/// @file
/// @brief Abstract first-order optimizer acting on one flat parameter vector and its gradient.

#include "kat/core/error.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kat {
namespace optim {
namespace detail {

/// Throws ValueError "<who>: <option> must be <expected>, got <value>" unless `ok`.
inline void require_option(bool ok, const std::string &who, const char *option,
                           const char *expected, double value) {
  if (!ok) {
    throw ValueError(
        kat::detail::concat(who, ": ", option, " must be ", expected, ", got ", value));
  }
}

/// Validates a learning rate: finite and >= 0 (a zero rate is a legal "frozen" step).
inline void require_lr(const std::string &who, double lr) {
  require_option(std::isfinite(lr) && lr >= 0.0, who, "lr", "finite and >= 0", lr);
}

} // namespace detail

/// Base of KAT's element-wise optimizers. An optimizer is bound at construction to a flat
/// parameter vector of a fixed length n (typically `ParameterBuffer::parameters()`), owns its
/// state (moment buffers) in `MemorySpace`, and updates the parameters in place from the
/// gradients. The learning rate is a host-side double that a schedule may change between
/// steps (see lr_schedule.hpp); it is cast to `Scalar` inside the kernels.
///
/// Semantics of every subclass follow PyTorch's torch.optim definitions exactly, so results
/// can be compared with a PyTorch run of the same model.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace> class Optimizer {
public:
  using scalar_type = Scalar;       ///< the parameters' and gradients' element type
  using memory_space = MemorySpace; ///< where the parameters and the optimizer's state live
  using execution_space = typename MemorySpace::execution_space; ///< where the update kernels run
  using vector_type =
      kat::Vector<Scalar, MemorySpace>; ///< a flat n-vector of parameters, gradients or state

  virtual ~Optimizer() = default;

  /// Human-readable name used in error messages and logs ("SGD", "Adam", ...).
  virtual std::string name() const = 0;

  /// One update of `params` (flat, length n) from `grads` (same length), enqueued on `space`.
  /// Increments steps() after the shapes are checked.
  /// @throws ShapeError if either length differs from the size given at construction.
  virtual void step(const execution_space &space, const vector_type &params,
                    const vector_type &grads) = 0;

  /// Current learning rate (units of the parameters per unit of gradient).
  double lr() const { return lr_; }

  /// Sets the learning rate used by the following step() calls.
  /// @throws ValueError if lr < 0 or not finite.
  void set_lr(double lr) {
    detail::require_lr("kat::optim::" + name() + "::set_lr", lr);
    lr_ = lr;
  }

  /// Number of step() calls so far (PyTorch's per-parameter `step` state).
  std::int64_t steps() const { return steps_; }

  /// Sets the step counter, for restoring a checkpoint together with the state buffers; the
  /// counter decides Adam's bias correction and SGD's first-step momentum initialization.
  /// @throws ValueError if steps < 0.
  void set_steps(std::int64_t steps) {
    detail::require_option(steps >= 0, "kat::optim::" + name() + "::set_steps", "steps", ">= 0",
                           static_cast<double>(steps));
    steps_ = steps;
  }

  /// Length n of the parameter vector this optimizer was built for.
  std::size_t size() const { return size_; }

  /// The per-parameter state vectors (each of length size(), entry i belonging to parameter
  /// i): SGD's momentum buffer, Adam's two moments. Components that constrain parameters
  /// keep these consistent with them: a sparse mask (kat/sparse) zeroes the state of masked
  /// weights. Empty for a stateless optimizer. The views alias the optimizer's own buffers.
  virtual std::vector<vector_type> state_buffers() const { return {}; }

  /// The optimizer's state (kat/core/state.hpp): "steps" (int64), "lr" (float64) and the
  /// subclass's buffers (host copies; fences).
  virtual StateDict state_dict() const {
    StateDict s;
    s.set("steps", steps_);
    s.set("lr", lr_);
    return s;
  }

  /// Restores what state_dict() saved, after checking every entry, so a failed load changes
  /// nothing. The options given at construction are not part of the state.
  /// @throws StateError naming the first entry that is missing, unexpected or of another
  ///   dtype or shape; ValueError if "steps" < 0 or "lr" is not a valid rate.
  virtual void load_state_dict(const StateDict &state) {
    const auto [steps, lr] = checked_base_state(state, {});
    steps_ = steps;
    lr_ = lr;
  }

protected:
  /// `lr` must already be validated by the subclass (which knows its own name for messages).
  Optimizer(std::size_t n, double lr) : lr_(lr), size_(n) {}
  /// Copyable by subclasses only (no slicing through the base).
  Optimizer(const Optimizer &) = default;
  /// Assignable by subclasses only.
  Optimizer &operator=(const Optimizer &) = default;

  /// Checks that `state` holds exactly "steps", "lr" and `buffers` (each a Scalar vector of
  /// length size()) and returns the valid steps and lr; changes nothing.
  std::pair<std::int64_t, double>
  checked_base_state(const StateDict &state, const std::vector<std::string> &buffers) const {
    const std::string where = "kat::optim::" + name() + "::load_state_dict";
    std::vector<std::string> names{"steps", "lr"};
    names.insert(names.end(), buffers.begin(), buffers.end());
    state.require_names(where, names);
    for (const auto &b : buffers) {
      state.checked<Scalar>(b, {static_cast<std::uint64_t>(size_)});
    }
    const auto steps = state.get<std::int64_t>("steps");
    const auto lr = state.get<double>("lr");
    detail::require_option(steps >= 0, where, "steps", ">= 0", static_cast<double>(steps));
    detail::require_lr(where, lr);
    return {steps, lr};
  }

  /// Checks both lengths against size() and counts the step; every subclass calls it first.
  void begin_step(const vector_type &params, const vector_type &grads) {
    const std::string where = "kat::optim::" + name() + "::step";
    kat::detail::require_extent(where.c_str(), "params.extent(0)", size_,
                                static_cast<std::size_t>(params.extent(0)));
    kat::detail::require_extent(where.c_str(), "grads.extent(0)", size_,
                                static_cast<std::size_t>(grads.extent(0)));
    ++steps_;
  }

  double lr_;        ///< the learning rate, validated by set_lr() or the subclass's constructor
  std::size_t size_; ///< n, the parameter vector's length
  std::int64_t steps_ = 0; ///< step() calls so far
};

} // namespace optim
} // namespace kat
