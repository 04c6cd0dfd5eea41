#pragma once
/// @file
/// @brief K-FAC's settings and what it records: kat::precond::ComputeMethod, LossReduction,
/// KFACOptions (hyperparameters, named as in kfac-pytorch), KFACValues (their values at one
/// step) and KFACState (a host copy of the factors, KFAC::state()).

#include "kat/core/error.hpp"
#include "kat/core/hyperparameter.hpp"
#include "kat/core/state.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace kat::precond {

/// How K-FAC turns the factors into a preconditioner (docs/algorithms.md section 1).
enum class ComputeMethod {
  eigen,  ///< eigendecompositions; damping added to the Kronecker product of eigenvalues
  inverse ///< Cholesky inverses of the factors with Tikhonov damping split between them
};

/// How the loss reduces over the batch; decides the scale of G.
enum class LossReduction {
  mean, ///< the loss is a batch mean, so backpropagated g carries a 1/N (KAT's losses)
  sum   ///< the loss is a batch sum
};

/// Hyperparameters, named as in kfac-pytorch; each may be a constant or a function of the
/// step (kat::Hyperparameter). Defaults are kfac-pytorch's.
struct KFACOptions {
  /// Steps between factor updates, >= 1.
  Hyperparameter<std::int64_t> factor_update_steps = std::int64_t(1);
  /// Steps between decompositions, >= 1; should be a multiple of factor_update_steps
  /// (a warning is logged otherwise).
  Hyperparameter<std::int64_t> inv_update_steps = std::int64_t(1);
  /// Damping λ > 0 (Tikhonov regularization of the curvature).
  Hyperparameter<double> damping = 0.001;
  /// Running-average decay α of the factors, in [0, 1).
  Hyperparameter<double> factor_decay = 0.95;
  /// KL clip κ >= 0 (trust region on the preconditioned step); 0 disables it.
  Hyperparameter<double> kl_clip = 0.001;
  /// The base optimizer's learning rate as seen by the KL clip, >= 0.
  Hyperparameter<double> lr = 0.1;
  /// Eigendecompositions (default) or Cholesky inverses.
  ComputeMethod compute_method = ComputeMethod::eigen;
  /// π-corrected damping split (inverse path only).
  bool pi_correction = false;
  /// Layers to leave to the base optimizer, by registered name or by type ("Conv2d"),
  /// case-insensitive.
  std::vector<std::string> skip_layers;
  /// Whether the loss is a batch mean (default) or sum: decides G's scale.
  LossReduction loss_reduction = LossReduction::mean;
  /// false (default): a factor or decomposition with NaN/Inf, or a failed decomposition,
  /// throws NumericalError naming the layer and factor. true: the previous factor or
  /// decomposition is kept and a warning is written to `log`.
  bool keep_previous_on_failure = false;
  /// Where warnings go (never null).
  std::ostream *log = &std::cerr;
  /// Computes P from the layer's recorded batch instead of from ∇ where that costs fewer
  /// flops (default false). For a layer whose weight gradient is exactly the batch product
  /// ∇ = gᵀa of the recorded a (rows x (in+1)) and g (rows x out), the inverse path's
  /// P = G⁻¹ ∇ A⁻¹ (Martens & Grosse 2015: (A ⊗ G)⁻¹ vec(∇) = vec(G⁻¹ ∇ A⁻¹), here with the
  /// damped factors) equals (G⁻¹gᵀ)(aA⁻¹) = G⁻¹(gᵀa)A⁻¹ by associativity, and the eigen
  /// path's Q_Gᵀ ∇ Q_A equals (Q_Gᵀgᵀ)(aQ_A). With out x cols = out x (in+1) the first half costs
  /// 2·out·cols·(out + cols) flops directly and 2·rows·(out² + cols² + out·cols) factored;
  /// each step, each layer takes the cheaper form (KFAC::factored_flops(), direct_flops()):
  /// Dense layers with a batch smaller than their dimensions gain, Conv2d (rows = N·H·W) and
  /// narrow layers stay direct. This needs a and g on every step, not only on factor-update
  /// steps: K-FAC asks the layers to record them (wants_curvature()).
  ///
  /// It is exact only when ∇ is the recorded batch's gᵀa: not with gradients accumulated over
  /// several batches, averaged over data-parallel ranks (kat::distributed strategies must not use
  /// it), clipped, weight-decayed or otherwise modified before KFAC::step. Each step checks
  /// this for every factored layer (Freivalds' test with a fixed random vector v:
  /// ‖∇v − gᵀ(av)‖₂ <= (rows·ε + 2(rows + cols)·ε_double)·‖|g|ᵀ(|a||v|)‖₂, ε the machine
  /// epsilon of the model's Scalar, a bound no rounding of ∇ = gᵀa can exceed) and throws
  /// ValueError otherwise (docs/kfac.md, "Factored preconditioning").
  bool factored_preconditioning = false;
};

/// Values of the hyperparameters at one step (what state() records).
struct KFACValues {
  std::int64_t factor_update_steps; ///< steps between factor updates
  std::int64_t inv_update_steps;    ///< steps between decompositions
  double damping;                   ///< damping λ
  double factor_decay;              ///< running-average decay α of the factors
  double kl_clip;                   ///< KL clip κ (0: off)
  double lr;                        ///< the learning rate the KL clip sees
};

/// Host copy of what a checkpoint needs: the step counter, the hyperparameter values at
/// that step and every factor (column-major, double). Decompositions are not stored; they
/// are recomputed by load_state().
struct KFACState {
  /// One registered layer's factors.
  struct Layer {
    std::string name;          ///< the name the layer was registered under
    std::size_t a_dim = 0;     ///< dimension of A: the weight gradient's columns (inputs + 1)
    std::size_t g_dim = 0;     ///< dimension of G: the weight gradient's rows (outputs)
    std::size_t a_updates = 0; ///< updates A has had (0: no data yet)
    std::size_t g_updates = 0; ///< updates G has had (0: no data yet)
    std::vector<double> A;     ///< A, a_dim x a_dim, column-major
    std::vector<double> G;     ///< G, g_dim x g_dim, column-major
  };
  std::int64_t steps = 0;    ///< KFAC::step() calls so far
  KFACValues values{};       ///< the hyperparameters' values at that step
  std::vector<Layer> layers; ///< the registered layers, in registration order
};

} // namespace kat::precond

namespace kat::detail {

/// " at step <step>", or nothing for step < 0 (a constant checked at construction).
inline std::string kfac_at_step(std::int64_t step) {
  return step < 0 ? std::string() : kat::detail::concat(" at step ", step);
}
/// @throws ValueError naming `what` unless v >= 1.
inline void kfac_check_steps(const char *what, std::int64_t v, std::int64_t step) {
  if (v < 1) {
    throw ValueError(kat::detail::concat("kat::precond::KFAC: ", what, " must be >= 1, got ", v,
                                         kfac_at_step(step)));
  }
}
/// @throws ValueError unless the damping is finite and > 0.
inline void kfac_check_damping(double v, std::int64_t step) {
  if (!(std::isfinite(v) && v > 0.0)) {
    throw ValueError(kat::detail::concat("kat::precond::KFAC: damping must be finite and > 0, got ",
                                         v, kfac_at_step(step)));
  }
}
/// @throws ValueError unless the factor decay is in [0, 1).
inline void kfac_check_decay(double v, std::int64_t step) {
  if (!(std::isfinite(v) && v >= 0.0 && v < 1.0)) {
    throw ValueError(kat::detail::concat("kat::precond::KFAC: factor_decay must be in [0, 1), got ",
                                         v, kfac_at_step(step)));
  }
}
/// @throws ValueError naming `what` unless v is finite and >= 0.
inline void kfac_check_nonnegative(const char *what, double v, std::int64_t step) {
  if (!(std::isfinite(v) && v >= 0.0)) {
    throw ValueError(kat::detail::concat("kat::precond::KFAC: ", what,
                                         " must be finite and >= 0, got ", v, kfac_at_step(step)));
  }
}
/// @throws ValueError naming the first value of `v` out of range (at `step`).
inline void kfac_check_values(const kat::precond::KFACValues &v, std::int64_t step) {
  kfac_check_steps("factor_update_steps", v.factor_update_steps, step);
  kfac_check_steps("inv_update_steps", v.inv_update_steps, step);
  kfac_check_damping(v.damping, step);
  kfac_check_decay(v.factor_decay, step);
  kfac_check_nonnegative("kl_clip", v.kl_clip, step);
  kfac_check_nonnegative("lr", v.lr, step);
}
/// Checks the options a KFAC is built with: a null log, pi_correction with the eigen method
/// and every constant hyperparameter (callables are checked when evaluated, kfac_values()).
/// @throws ValueError naming the option, its valid range and its value.
inline void kfac_check_options(const kat::precond::KFACOptions &o) {
  if (o.log == nullptr) {
    throw ValueError("kat::precond::KFAC: log must not be null");
  }
  if (o.pi_correction && o.compute_method == kat::precond::ComputeMethod::eigen) {
    throw ValueError("kat::precond::KFAC: pi_correction needs compute_method inverse, got eigen "
                     "(the eigen path damps the Kronecker product exactly)");
  }
  if (o.factor_update_steps.is_constant())
    kfac_check_steps("factor_update_steps", o.factor_update_steps.value(), -1);
  if (o.inv_update_steps.is_constant())
    kfac_check_steps("inv_update_steps", o.inv_update_steps.value(), -1);
  if (o.damping.is_constant())
    kfac_check_damping(o.damping.value(), -1);
  if (o.factor_decay.is_constant())
    kfac_check_decay(o.factor_decay.value(), -1);
  if (o.kl_clip.is_constant())
    kfac_check_nonnegative("kl_clip", o.kl_clip.value(), -1);
  if (o.lr.is_constant())
    kfac_check_nonnegative("lr", o.lr.value(), -1);
}
/// The constant hyperparameters of `o` take `v`'s values (callables stay as they are).
inline void kfac_restore_constants(kat::precond::KFACOptions &o,
                                   const kat::precond::KFACValues &v) {
  const auto restore = [](auto &option, auto value) {
    if (option.is_constant()) {
      option = value;
    }
  };
  restore(o.factor_update_steps, v.factor_update_steps);
  restore(o.inv_update_steps, v.inv_update_steps);
  restore(o.damping, v.damping);
  restore(o.factor_decay, v.factor_decay);
  restore(o.kl_clip, v.kl_clip);
  restore(o.lr, v.lr);
}
/// Whether `o.skip_layers` names `name` (case-insensitive).
inline bool kfac_skips(const kat::precond::KFACOptions &o, const std::string &name) {
  const auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  };
  const std::string n = lower(name);
  for (const auto &s : o.skip_layers) {
    if (lower(s) == n)
      return true;
  }
  return false;
}
/// The hyperparameters of `o` evaluated at `step`, each checked as it is evaluated (so a
/// callable's error names the first bad one).
inline kat::precond::KFACValues kfac_values(const kat::precond::KFACOptions &o, std::int64_t step) {
  kat::precond::KFACValues v;
  v.factor_update_steps = o.factor_update_steps(step);
  kfac_check_steps("factor_update_steps", v.factor_update_steps, step);
  v.inv_update_steps = o.inv_update_steps(step);
  kfac_check_steps("inv_update_steps", v.inv_update_steps, step);
  v.damping = o.damping(step);
  kfac_check_damping(v.damping, step);
  v.factor_decay = o.factor_decay(step);
  kfac_check_decay(v.factor_decay, step);
  v.kl_clip = o.kl_clip(step);
  kfac_check_nonnegative("kl_clip", v.kl_clip, step);
  v.lr = o.lr(step);
  kfac_check_nonnegative("lr", v.lr, step);
  return v;
}

/// The state entries of the step counter and the hyperparameter values (KFAC::state_dict()):
/// "steps" and "values.<name>", in the order kfac_save_values() writes them.
inline std::vector<std::string> kfac_value_names() {
  return {"steps",          "values.factor_update_steps", "values.inv_update_steps",
          "values.damping", "values.factor_decay",        "values.kl_clip",
          "values.lr"};
}
/// Adds "steps" (int64) and the values at that step ("values.factor_update_steps" and
/// "values.inv_update_steps" int64, the others float64) to `s`.
inline void kfac_save_values(StateDict &s, std::int64_t steps, const kat::precond::KFACValues &v) {
  s.set("steps", steps);
  s.set("values.factor_update_steps", v.factor_update_steps);
  s.set("values.inv_update_steps", v.inv_update_steps);
  s.set("values.damping", v.damping);
  s.set("values.factor_decay", v.factor_decay);
  s.set("values.kl_clip", v.kl_clip);
  s.set("values.lr", v.lr);
}
/// The step counter and values kfac_save_values() wrote, checked.
/// @throws StateError as StateDict::get(); ValueError (naming `where` for the counter) if
///   one is out of range.
inline std::pair<std::int64_t, kat::precond::KFACValues>
kfac_load_values(const StateDict &state, const std::string &where) {
  kat::precond::KFACValues v;
  const auto steps = state.get<std::int64_t>("steps");
  v.factor_update_steps = state.get<std::int64_t>("values.factor_update_steps");
  v.inv_update_steps = state.get<std::int64_t>("values.inv_update_steps");
  v.damping = state.get<double>("values.damping");
  v.factor_decay = state.get<double>("values.factor_decay");
  v.kl_clip = state.get<double>("values.kl_clip");
  v.lr = state.get<double>("values.lr");
  if (steps < 0) {
    throw ValueError(kat::detail::concat(where, ": steps must be >= 0, got ", steps));
  }
  kfac_check_values(v, steps);
  return {steps, v};
}

} // namespace kat::detail
