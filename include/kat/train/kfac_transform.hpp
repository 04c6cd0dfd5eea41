#pragma once
/// @file
/// @brief K-FAC (with any KFACStrategy) as the GradientTransform of a training step.

#include "kat/precond/kfac.hpp"
#include "kat/train/gradient_transform.hpp"
#include "kat/train/registry.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::train {

/// Adapts a kat::precond::KFAC to the GradientTransform role: transform() is
/// KFAC::step(space, grads), which preconditions the layers' weight gradients in the `grads`
/// it is given (found at the places register_model() recorded in the model's flat gradient
/// vector; `grads` need not be that vector), with whatever strategy the KFAC holds (local, or a
/// distributed one from kat::distributed, which must then live as long as this object: pass
/// it as `strategy` to have this object keep it). Its state is the KFAC's state_dict() (the
/// factors with their current decompositions), saved under "kfac.".
///
/// @tparam KFACType a kat::precond::KFAC instantiation
template <class KFACType>
class KFACTransform
    : public GradientTransform<typename KFACType::scalar_type, typename KFACType::memory_space> {
public:
  /// The GradientTransform this implements.
  using base_type =
      GradientTransform<typename KFACType::scalar_type, typename KFACType::memory_space>;
  using typename base_type::execution_space;
  using typename base_type::vector_type;

  /// @param kfac     with its layers registered (KFAC::register_model or register_layer)
  /// @param strategy kept alive with this object (a distributed strategy installed in `kfac`)
  explicit KFACTransform(std::shared_ptr<KFACType> kfac,
                         std::shared_ptr<precond::KFACStrategy<KFACType>> strategy = nullptr)
      : kfac_(std::move(kfac)), strategy_(std::move(strategy)) {}

  std::string name() const override { return "kfac"; }
  /// The preconditioner.
  KFACType &kfac() const { return *kfac_; }

  /// KFAC::step(space, grads): preconditions the registered layers' weight gradients in
  /// `grads` (laid out like the gradients() of the model given to KFAC::register_model), in
  /// place; the other entries of `grads` are left as they are.
  /// @throws ShapeError if `grads` is not as long as that model's gradient vector; ValueError
  ///   if a layer was registered with register_layer() outside it; and as KFAC::step().
  void transform(const execution_space &space, const vector_type &params,
                 const vector_type &grads) override {
    (void)params;
    kfac_->step(space, grads);
  }

  /// "K-FAC on <n> layers (<method> path; factors <precision>, decompositions <precision>):
  /// <hyperparameters at the current step>", and with a distributed strategy a second line
  /// with its name and analytic bytes per factor update, decomposition update and step.
  std::string summary() const override {
    const auto precision = [](std::size_t bytes) { return bytes == 4 ? "float" : "double"; };
    const auto v = kfac_->values(kfac_->steps());
    std::string s = kat::detail::concat(
        "K-FAC on ", kfac_->size(), " layers (",
        kfac_->options().compute_method == precond::ComputeMethod::eigen ? "eigen" : "inverse",
        " path; factors ", precision(sizeof(typename KFACType::factor_scalar_type)),
        ", decompositions ", precision(sizeof(typename KFACType::inverse_matrix_type::value_type)),
        "): factor_update_steps ", v.factor_update_steps, ", inv_update_steps ", v.inv_update_steps,
        ", damping ", v.damping, ", factor_decay ", v.factor_decay, ", kl_clip ", v.kl_clip);
    const precond::KFACStrategyReport r = kfac_->strategy().report();
    if (r.name != "local") {
      s += kat::detail::concat("\n", r.name, ": ", r.bytes_per_factor_update,
                               " bytes per factor update, ", r.bytes_per_decomposition_update,
                               " per decomposition update, ", r.bytes_per_step, " per step");
    }
    return s;
  }

  /// Bytes the strategy communicated so far, K-FAC's state plus the strategy's workspace, and
  /// whether the next step updates the Kronecker factors.
  TransformStats stats() const override {
    const precond::KFACStrategyReport r = kfac_->strategy().report();
    TransformStats s;
    s.bytes = r.total().bytes;
    s.state_bytes = kfac_->state_bytes() + r.workspace_bytes;
    const std::int64_t step = kfac_->steps();
    s.next_updates_curvature = step % kfac_->values(step).factor_update_steps == 0;
    return s;
  }

  StateDict state_dict() const override { return kfac_->state_dict(); }
  void load_state_dict(const StateDict &state) override { kfac_->load_state_dict(state); }

private:
  std::shared_ptr<KFACType> kfac_;
  std::shared_ptr<precond::KFACStrategy<KFACType>> strategy_;
};

/// K-FAC's hyperparameters as registry options (kat::train::Registry), named after
/// KFACOptions with dashes ("factor-update-steps"), with the defaults of the `kat_train`
/// example: the inverse path with damping 0.01 and KL clip 1e-4, tuned on the MLP
/// (docs/kfac.md), factors every 10 steps, decompositions every 100. Also
/// "factor-precision" and "inverse-precision" (float or double), which pick the KFAC
/// instantiation and are not read by kfac_options(). The numeric options carry their ranges
/// (OptionSpec::range: steps >= 1, damping > 0, factor-decay in [0, 1), kl-clip >= 0).
inline std::vector<OptionSpec> kfac_option_specs() {
  return {
      OptionSpec("factor-update-steps", "Steps between Kronecker factor updates", "10")
          .within(OptionRange::integer_at_least(1)),
      OptionSpec("inv-update-steps", "Steps between decompositions (a multiple of the above)",
                 "100")
          .within(OptionRange::integer_at_least(1)),
      OptionSpec("damping", "Damping (Tikhonov regularization)", "0.01")
          .within(OptionRange::greater_than(0)),
      OptionSpec("factor-decay", "Running-average decay of the factors", "0.95")
          .within(OptionRange::half_open(0, 1)),
      OptionSpec("kl-clip", "KL clip of the preconditioned step (0: off)", "1e-4")
          .within(OptionRange::at_least(0)),
      {"compute-method", "Decomposition", "inverse", {"eigen", "inverse"}},
      {"pi-correction", "pi-corrected damping split (inverse path)", "", {}, true},
      {"factored-preconditioning",
       "P = (G^-1 g^T)(a A^-1) from the batch where cheaper (exact; one process only)",
       "",
       {},
       true},
      {"skip-layers", "Layers left to the optimizer: comma-separated index paths or types", ""},
      {"factor-precision", "Precision of the factors", "float", {"float", "double"}},
      {"inverse-precision", "Precision of decompositions and P", "double", {"float", "double"}}};
}

/// KFACOptions from a Config holding kfac_option_specs()' options, with `lr` (the base
/// optimizer's rate schedule, for the KL clip).
/// @throws ValueError naming an option whose text is not a number, outside its range or not
///   one of its choices.
inline precond::KFACOptions kfac_options(const Config &c, Hyperparameter<double> lr) {
  for (const auto &spec : kfac_option_specs()) {
    if (c.has(spec.name)) {
      check_option_value(spec, c.text(spec.name));
    }
  }
  precond::KFACOptions k;
  k.factor_update_steps = c.integer("factor-update-steps");
  k.inv_update_steps = c.integer("inv-update-steps");
  k.damping = c.number("damping");
  k.factor_decay = c.number("factor-decay");
  k.kl_clip = c.number("kl-clip");
  k.lr = std::move(lr);
  const std::string &method = c.text("compute-method");
  if (method != "eigen" && method != "inverse") {
    throw ValueError("option --compute-method must be eigen or inverse, got '" + method + "'");
  }
  k.compute_method =
      method == "eigen" ? precond::ComputeMethod::eigen : precond::ComputeMethod::inverse;
  k.pi_correction = c.flag("pi-correction");
  k.factored_preconditioning = c.flag("factored-preconditioning");
  k.skip_layers = c.list("skip-layers");
  return k;
}

} // namespace kat::train
