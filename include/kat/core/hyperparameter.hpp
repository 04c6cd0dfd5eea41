#pragma once
/// @file
/// @brief A hyperparameter that is either a constant or a function of the step.

#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

namespace kat {

/// A value of type T that may change with the optimizer step, as kfac-pytorch's callable
/// hyperparameters do (damping or learning-rate schedules). Converts implicitly from a T (a
/// constant) and from any callable `T(std::int64_t step)`, so options can be written either
/// way:
///
///     options.damping = 0.003;
///     options.damping = [](std::int64_t step) { return step < 100 ? 0.03 : 0.003; };
///
/// Validation of the values is the owner's job: constants are checked where they are given,
/// callables each time they are evaluated.
template <class T> class Hyperparameter {
public:
  using value_type = T; ///< the value's type

  /// A constant.
  Hyperparameter(T value) : value_(value) {} // NOLINT: implicit by design

  /// A function of the step (0-based count of completed steps).
  template <class F,
            class = std::enable_if_t<!std::is_convertible<F, T>::value &&
                                     std::is_convertible<std::invoke_result_t<F &, std::int64_t>,
                                                         T>::value>>
  Hyperparameter(F function) // NOLINT: implicit by design
      : function_(
            [f = std::move(function)](std::int64_t step) { return static_cast<T>(f(step)); }) {}

  /// The value at `step`.
  T operator()(std::int64_t step) const { return function_ ? function_(step) : value_; }

  /// Whether this is a constant (then value() is it; checkpoints store and restore it).
  bool is_constant() const { return !function_; }

  /// The constant's value (the default-constructed T for a callable).
  T value() const { return value_; }

private:
  T value_{};
  std::function<T(std::int64_t)> function_;
};

} // namespace kat
