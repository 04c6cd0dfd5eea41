#pragma once
/// @file
/// @brief One layer of K-FAC (kat::precond::KFACLayer): its Kronecker factors, their
/// decompositions and damping, and the preconditioning of its weight gradient, on views only.
/// kat::precond::KFAC (kfac.hpp) schedules these for every registered layer and adds what spans
/// layers: the strategy's communication, the KL clip and the one read-back per step.

#include "kat/core/blas.hpp"
#include "kat/core/curvature.hpp"
#include "kat/core/detail/convert.hpp"
#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/precond/detail/kfac_kernels.hpp"
#include "kat/precond/kfac_options.hpp"
#include "kat/precond/kronecker_factor.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kat::precond {

/// Scratch that the layers of one KFAC share (each layer uses it only while it preconditions,
/// and the layers precondition one after the other): the preconditioning's intermediate
/// product, the gradient converted to InverseScalar, and for
/// KFACOptions::factored_preconditioning a and g converted, G⁻¹gᵀ (or Q_Gᵀgᵀ), aA⁻¹ (or aQ_A)
/// and the Freivalds check's (av, |a||v|) and (∇v − gᵀav, |g|ᵀ|a||v|). Labels
/// "kat::precond::KFAC::<buffer>".
template <class InverseScalar, class MemorySpace> struct KFACScratch {
  /// The preconditioning's intermediate product.
  Workspace<InverseScalar, MemorySpace> work{"kat::precond::KFAC::work"};
  /// The gradient converted to InverseScalar.
  Workspace<InverseScalar, MemorySpace> cast{"kat::precond::KFAC::cast"};
  /// A converted (factored path).
  Workspace<InverseScalar, MemorySpace> factored_a{"kat::precond::KFAC::factored_a"};
  /// G converted (factored path).
  Workspace<InverseScalar, MemorySpace> factored_g{"kat::precond::KFAC::factored_g"};
  /// G⁻¹gᵀ or Q_Gᵀgᵀ (factored path).
  Workspace<InverseScalar, MemorySpace> factored_u{"kat::precond::KFAC::factored_u"};
  /// AA⁻¹ or aQ_A (factored path).
  Workspace<InverseScalar, MemorySpace> factored_v{"kat::precond::KFAC::factored_v"};
  /// Freivalds check: av and |a||v|.
  Workspace<double, MemorySpace> check_rows{"kat::precond::KFAC::check_rows"};
  /// Freivalds check: ∇v − gᵀav and |g|ᵀ|a||v|.
  Workspace<double, MemorySpace> check_out{"kat::precond::KFAC::check_out"};

  /// Bytes the buffers hold now (allocated on first use).
  std::size_t bytes() const {
    return (work.capacity() + cast.capacity() + factored_a.capacity() + factored_g.capacity() +
            factored_u.capacity() + factored_v.capacity()) *
               sizeof(InverseScalar) +
           (check_rows.capacity() + check_out.capacity()) * sizeof(double);
  }
};

/// One layer of K-FAC (Martens & Grosse 2015, "Optimizing Neural Networks with
/// Kronecker-factored Approximate Curvature", Sec. 3; Grosse & Martens 2016 for convolutions),
/// in the formulation of KAISA (Pauloski et al. 2021, kfac-pytorch's kfac/layers/) and of
/// docs/algorithms.md section 1. It holds the layer's factors A (cols x cols) and G (out x out)
/// with their decompositions (KroneckerFactor), the preconditioned gradient P and the state of
/// the factored form, and computes, on views only:
///
/// - the factors' batch estimates (stage_factors()): A = aᵀa / rows and G = gᵀg · N² / rows for
///   a batch-mean loss (N = samples: undoing the 1/N that g carries) or gᵀg / rows for a sum,
///   folded into running averages F ← α·F + (1 − α)·F_new with the factor decay α;
/// - the decompositions (decompose()): eigen F = Q diag(d) Qᵀ, or the damped inverses
///   (A + λ_A I)⁻¹ and (G + λ_G I)⁻¹ with λ_A = π√λ, λ_G = √λ/π (damping_split(); π = 1
///   without the π correction of Martens & Grosse 2015, Sec. 6.3);
/// - P (precondition()): on the eigen path P = Q_G [(Q_Gᵀ ∇ Q_A) ⊘ (d_G d_Aᵀ + λ)] Q_Aᵀ, exactly
///   (A ⊗ G + λI)⁻¹ vec(∇); on the inverse path P = (G + λ_G I)⁻¹ ∇ (A + λ_A I)⁻¹, from
///   (A ⊗ G)⁻¹ vec(∇) = vec(G⁻¹ ∇ A⁻¹) (Martens & Grosse 2015, Sec. 3) with damped factors.
///   With the factored form (KFACOptions::factored_preconditioning) the first half of either
///   product is computed from the batch, ∇ = gᵀa, and checked (check_factored()).
///
/// Shapes: the weight gradient ∇ = d[W b] is out x cols (cols = in + 1, the bias in the last
/// column), LayoutLeft, with any leading dimension >= out; a is rows x cols (the ones column
/// included) and g rows x out, rows a multiple of the N samples (N·H_out·W_out for Conv2d).
/// Units: the damping λ is in the units of the curvature A ⊗ G (squared gradient per sample
/// of the loss); P has the gradient's units divided by the curvature's. Everything is
/// enqueued on the execution space given; nothing here waits for the device except
/// damping_split() with the π correction (two traces) and state().
///
/// kat::precond::KFAC owns one per registered layer and adds what spans layers (strategy,
/// KL clip, failures, the status read-back); a KFACLayer may also be driven directly.
///
/// @tparam Scalar         the model's scalar (∇, a and g).
/// @tparam MemorySpace    where the layer lives.
/// @tparam InverseScalar  precision of the decompositions and of P.
/// @tparam FactorScalar   precision the factors are accumulated in.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace,
          class InverseScalar = double, class FactorScalar = Scalar>
class KFACLayer {
public:
  using scalar_type = Scalar;       ///< the model's scalar (gradients, a and g)
  using memory_space = MemorySpace; ///< where the layer's factors live
  using execution_space = typename MemorySpace::execution_space; ///< where its kernels run
  using record_type = CurvatureRecord<Scalar, MemorySpace>;      ///< the layer's recorded a and g
  /// Factor A or G with its decompositions.
  using factor_type = KroneckerFactor<FactorScalar, MemorySpace, InverseScalar>;
  using matrix_type = Matrix<Scalar, MemorySpace>; ///< a gradient matrix in the model's scalar
  /// A matrix in the decompositions' precision.
  using inverse_matrix_type = Matrix<InverseScalar, MemorySpace>;
  /// The scratch the layers of one KFAC share.
  using scratch_type = KFACScratch<InverseScalar, MemorySpace>;
  /// The status buffer the checks write to (one double per slot).
  using status_type = Vector<double, MemorySpace>;

  /// A layer `name` with an out x cols weight gradient; nothing is allocated but P (out x
  /// cols, InverseScalar, label "kat::precond::KFAC::<name>::P"); the factors are labelled
  /// "kat::precond::KFAC::<name>::A" (cols x cols) and "...::G" (out x out).
  KFACLayer(std::string name, std::size_t out, std::size_t cols)
      : name_(std::move(name)), out_(out), cols_(cols), A_(label() + "::A", cols),
        G_(label() + "::G", out),
        p_(Kokkos::view_alloc(label() + "::P", Kokkos::WithoutInitializing), out, cols) {}

  KFACLayer(const KFACLayer &) = delete;
  KFACLayer &operator=(const KFACLayer &) = delete;

  /// The name the layer was registered under.
  const std::string &name() const { return name_; }
  /// Rows of the weight gradient (the layer's outputs; the dimension of G).
  std::size_t out() const { return out_; }
  /// Columns of the weight gradient (inputs + 1; the dimension of A).
  std::size_t cols() const { return cols_; }
  /// Factor A (activations), cols x cols.
  factor_type &factor_a() { return A_; }
  /// Factor A, read-only.
  const factor_type &factor_a() const { return A_; }
  /// Factor G (output gradients), out x out.
  factor_type &factor_g() { return G_; }
  /// Factor G, read-only.
  const factor_type &factor_g() const { return G_; }
  /// factor_a() for 'A', factor_g() for 'G'.
  factor_type &factor(char which) { return which == 'A' ? A_ : G_; }
  /// factor_a() for 'A', factor_g() for 'G', read-only.
  const factor_type &factor(char which) const { return which == 'A' ? A_ : G_; }
  /// P of the last precondition() (out x cols, InverseScalar, contiguous), before any KL scale.
  const inverse_matrix_type &preconditioned() const { return p_; }

  /// Whether the layer has decompositions to precondition with (set by the caller: after
  /// decompose() and any sharing of decompositions, has_decomposition()).
  bool ready() const { return ready_; }
  /// Sets ready().
  void set_ready(bool ready) { ready_ = ready; }
  /// Whether both factors hold a decomposition of `method`.
  bool has_decomposition(ComputeMethod method) const {
    return has_decomposition('A', method) && has_decomposition('G', method);
  }
  /// Whether factor `which` ('A' or 'G') holds a decomposition of `method`.
  bool has_decomposition(char which, ComputeMethod method) const {
    const factor_type &f = factor(which);
    return method == ComputeMethod::eigen ? f.has_eigen() : f.has_inverse();
  }

  /// Whether the last precondition() used the factored form.
  bool factored() const { return factored_; }
  /// The relative difference of the last factored-form check (0 before any).
  double factored_check() const { return check_; }
  /// Whether the factored form was cheaper at the last decision (true before any): then the
  /// layer wants a and g on every step (KFAC::wants_curvature()).
  bool factored_every_step() const { return every_step_; }

  /// Bytes held now: factors, decompositions, P and the Freivalds vector.
  std::size_t bytes() const {
    return A_.bytes() + G_.bytes() + p_.span() * sizeof(InverseScalar) +
           probe_.span() * sizeof(double);
  }

  /// "kat::precond::KFAC::step: layer '<name>'", the head of this layer's step errors.
  std::string context() const { return "kat::precond::KFAC::step: layer '" + name_ + "'"; }

  /// Records where `grad` (this layer's out x cols weight gradient) lies in the flat vector
  /// `buffer` (a model's gradients()): its offset and leading dimension, so that
  /// gradient_in() finds the same matrix in another vector laid out like `buffer`.
  /// @return whether `grad` lies entirely in `buffer` (located()).
  bool locate(const Vector<Scalar, MemorySpace> &buffer, const matrix_type &grad) {
    const std::size_t ld = cols_ > 1 ? static_cast<std::size_t>(grad.stride(1)) : out_;
    const auto begin = reinterpret_cast<std::uintptr_t>(buffer.data());
    const auto at = reinterpret_cast<std::uintptr_t>(grad.data());
    offset_ = -1;
    if (begin != 0 && at >= begin && (at - begin) % sizeof(Scalar) == 0 &&
        (at - begin) / sizeof(Scalar) + ld * (cols_ - 1) + out_ <= buffer.extent(0)) {
      offset_ = static_cast<std::ptrdiff_t>((at - begin) / sizeof(Scalar));
      ld_ = ld;
    }
    return located();
  }
  /// Whether locate() found the weight gradient in its buffer.
  bool located() const { return offset_ >= 0; }
  /// The weight gradient's place (locate()) in `flat`, a vector laid out like the buffer: an
  /// out x cols LayoutLeft view with the located leading dimension. Requires located() and
  /// `flat` at least as long as the buffer.
  matrix_type gradient_in(const Vector<Scalar, MemorySpace> &flat) const {
    const matrix_type whole(flat.data() + offset_, ld_, cols_);
    return Kokkos::subview(whole, std::make_pair(std::size_t(0), out_), Kokkos::ALL);
  }

  /// Checks a record for a factor update or the factored form at step `step`.
  /// @throws ShapeError if a or g is empty, a is not rows x cols, g not rows x out, or
  ///   samples is 0 or does not divide rows.
  void check_record(const record_type &r, std::int64_t step) const {
    const std::string where = context();
    if (r.a.extent(0) == 0 || r.g.extent(0) == 0) {
      throw ShapeError(kat::detail::concat(
          where, ": a and g must be recorded on a factor-update step (step ", step, "), got a ",
          r.a.extent(0), "x", r.a.extent(1), " and g ", r.g.extent(0), "x", r.g.extent(1),
          "; turn on recording when needs_curvature() is true"));
    }
    kat::detail::require_extent(where.c_str(), "a columns", cols_,
                                static_cast<std::size_t>(r.a.extent(1)));
    kat::detail::require_extent(where.c_str(), "g columns", out_,
                                static_cast<std::size_t>(r.g.extent(1)));
    kat::detail::require_extent(where.c_str(), "g rows (= a rows)",
                                static_cast<std::size_t>(r.a.extent(0)),
                                static_cast<std::size_t>(r.g.extent(0)));
    if (r.samples == 0 || r.a.extent(0) % r.samples != 0) {
      throw ShapeError(kat::detail::concat(where, ": samples must divide the ", r.a.extent(0),
                                           " rows of a and be > 0, got ", r.samples));
    }
  }

  /// @throws ShapeError unless `grad` is out x cols.
  void check_gradient(const matrix_type &grad) const {
    if (grad.extent(0) != out_ || grad.extent(1) != cols_) {
      throw ShapeError(kat::detail::concat(context(), ": weight_gradient must be ", out_, "x",
                                           cols_, " as registered, got ", grad.extent(0), "x",
                                           grad.extent(1)));
    }
  }

  /// Stages both factors' updates from record `r` (KroneckerFactor::stage_update, A then G):
  /// A_new = aᵀa / rows, G_new = gᵀg · N² / rows (`reduction` mean) or gᵀg / rows (sum),
  /// averaged with `decay`; the non-finite counts go to `bad_a` and `bad_g` (rank-0 views),
  /// and `hook_a` / `hook_g` see the batch estimates (KroneckerFactor::update's hook).
  /// Nothing is committed. @throws ShapeError as check_record().
  template <class CountView, class HookA = NoBatchHook, class HookG = NoBatchHook>
  void stage_factors(const execution_space &space, const record_type &r, LossReduction reduction,
                     double decay, std::int64_t step, const CountView &bad_a,
                     const CountView &bad_g, const HookA &hook_a = HookA(),
                     const HookG &hook_g = HookG()) {
    check_record(r, step);
    const double rows = static_cast<double>(r.a.extent(0));
    const double n = static_cast<double>(r.samples);
    const double g_scale = reduction == LossReduction::mean ? n * n / rows : 1.0 / rows;
    A_.stage_update(space, r.a, 1.0 / rows, decay, bad_a, hook_a);
    G_.stage_update(space, r.g, g_scale, decay, bad_g, hook_g);
  }

  /// Drops both factors' staged updates (KroneckerFactor::discard_update()).
  void discard_staged() {
    A_.discard_update();
    G_.discard_update();
  }

  /// The first factor ('A', then 'G') with a staged update whose count of non-finite entries
  /// (`bad_a`, `bad_g`, read back from stage_factors()' views) is not 0; 0 if none.
  char staged_failure(double bad_a, double bad_g) const {
    return A_.has_staged_update() && bad_a != 0   ? 'A'
           : G_.has_staged_update() && bad_g != 0 ? 'G'
                                                  : char(0);
  }
  /// Commits each staged update whose count is 0 and discards the others.
  /// @return factor_failure() of each discarded one.
  std::vector<std::string> resolve_staged(double bad_a, double bad_g, std::int64_t step) {
    std::vector<std::string> failures;
    for (const char which : {'A', 'G'}) {
      factor_type &f = factor(which);
      if (!f.has_staged_update()) {
        continue;
      }
      if ((which == 'A' ? bad_a : bad_g) == 0) {
        f.commit_update();
        continue;
      }
      f.discard_update();
      failures.push_back(factor_failure(which, step));
    }
    return failures;
  }

  /// The fused KL-clip kernels' view of P and `grad` (kat::detail::PGSegment; chunk 0).
  kat::detail::PGSegment<InverseScalar, Scalar> segment(const matrix_type &grad) const {
    kat::detail::PGSegment<InverseScalar, Scalar> seg;
    seg.p = p_.data();
    seg.g = grad.data();
    seg.out = out_;
    seg.ld = cols_ > 1 ? static_cast<std::size_t>(grad.stride(1)) : out_;
    seg.n = out_ * cols_;
    return seg;
  }

  /// What went wrong with a non-finite staged update of factor `which` at `step`.
  std::string factor_failure(char which, std::int64_t step) const {
    return kat::detail::concat("layer '", name_, "' factor ", which, " at step ", step, ": ",
                               which == 'A' ? "the batch estimate aᵀa/rows has a NaN or an infinity"
                                            : "the batch estimate of gᵀg has a NaN or an infinity");
  }

  /// The inverse path's damping split {λ_A, λ_G} = {π√λ, √λ/π} for damping λ, with
  /// π = sqrt((tr A / dim A) / (tr G / dim G)) when `pi_correction` (Martens & Grosse 2015,
  /// Sec. 6.3; π = 1 if a trace is 0 or not finite), π = 1 otherwise. The traces wait for
  /// the device.
  std::pair<double, double> damping_split(const execution_space &space, double damping,
                                          bool pi_correction) const {
    double pi = 1.0;
    if (pi_correction) {
      const double ta = A_.mean_eigenvalue(space), tg = G_.mean_eigenvalue(space);
      if (ta > 0.0 && tg > 0.0 && std::isfinite(ta) && std::isfinite(tg)) {
        pi = std::sqrt(ta / tg);
      }
    }
    const double root = std::sqrt(damping);
    return {pi * root, root / pi};
  }

  /// Decomposes the factors computed here (`a`: A, `g`: G), A then G: their eigendecompositions
  /// (`method` eigen), or their inverses damped by damping_split(`damping`, `pi_correction`)
  /// (inverse; the split is computed whether or not a factor is computed here). A failed
  /// decomposition keeps the previous one (KroneckerFactor).
  /// @return the failure of A and of G, "layer '<name>' factor <A|G> at step <step>: the
  ///   decomposition failed: <error>", or empty (decomposed, or not computed here); with
  ///   `stop_at_failure` nothing more is decomposed after a failure.
  std::array<std::string, 2> decompose(const execution_space &space, ComputeMethod method,
                                       double damping, bool pi_correction, bool a, bool g,
                                       std::int64_t step, bool stop_at_failure) {
    std::pair<double, double> split{0.0, 0.0};
    if (method == ComputeMethod::inverse) {
      split = damping_split(space, damping, pi_correction);
    }
    std::array<std::string, 2> failed;
    for (const char which : {'A', 'G'}) {
      if (!(which == 'A' ? a : g)) {
        continue;
      }
      try {
        if (method == ComputeMethod::eigen) {
          factor(which).compute_eigen(space);
        } else {
          factor(which).compute_inverse(space, which == 'A' ? split.first : split.second);
        }
      } catch (const NumericalError &e) {
        failed[which == 'A' ? 0 : 1] =
            kat::detail::concat("layer '", name_, "' factor ", which, " at step ", step,
                                ": the decomposition failed: ", e.what());
        if (stop_at_failure) {
          break;
        }
      }
    }
    return failed;
  }

  /// The largest relative difference the factored-form check accepts for a batch of `rows`
  /// rows and `cols` columns of a: rows·ε(Scalar) + 2(rows + cols)·ε(double).
  static double factored_tolerance(std::size_t rows, std::size_t cols) {
    return static_cast<double>(rows) * static_cast<double>(std::numeric_limits<Scalar>::epsilon()) +
           2.0 * static_cast<double>(rows + cols) * std::numeric_limits<double>::epsilon();
  }
  /// Flops of the first half of the direct preconditioning of an out x cols gradient,
  /// G⁻¹∇ then (·)A⁻¹ (inverse path) or Q_Gᵀ∇ then (·)Q_A (eigen path): 2·out·cols·(out + cols).
  static double direct_flops(std::size_t out, std::size_t cols) {
    const double o = static_cast<double>(out), c = static_cast<double>(cols);
    return 2.0 * o * c * (o + c);
  }
  /// Flops of the same product in factored form from a batch of `rows` rows: G⁻¹gᵀ, aA⁻¹ and
  /// their product, 2·rows·(out² + cols² + out·cols). The factored form is used when this is
  /// strictly below direct_flops().
  static double factored_flops(std::size_t out, std::size_t cols, std::size_t rows) {
    const double o = static_cast<double>(out), c = static_cast<double>(cols);
    return 2.0 * static_cast<double>(rows) * (o * o + c * c + o * c);
  }

  /// Decides this step's form: factored if `allowed` (the option is on and a and g of this
  /// step's batch were asked for), `r` holds a and g, and factored_flops() for its rows is
  /// below direct_flops() (remembered: factored_every_step()); direct otherwise.
  /// @return factored(). @throws ShapeError as check_record() when a or g is given.
  bool choose_form(const record_type &r, bool allowed, std::int64_t step) {
    factored_ = false;
    if (!allowed || (r.a.extent(0) == 0 && r.g.extent(0) == 0)) {
      return false; // not asked for, or not supplied this step: direct
    }
    check_record(r, step);
    every_step_ = factored_flops(out_, cols_, r.a.extent(0)) < direct_flops(out_, cols_);
    factored_ = every_step_;
    return factored_;
  }
  /// Marks the layer as not preconditioned in factored form (not preconditioned this step).
  void clear_form() { factored_ = false; }

  /// Freivalds' check that the weight gradient of `r` is its batch's gᵀa, with a fixed random
  /// v (cols, uniform in [-1, 1), drawn once from stream `stream` of `seed`): in double,
  /// ‖∇v − gᵀ(av)‖₂ <= τ ‖|g|ᵀ(|a||v|)‖₂ with τ = factored_tolerance(rows, cols). Any
  /// summation order of ∇ = gᵀa in Scalar errs by at most γ_rows (|g|ᵀ|a|) entry-wise
  /// (γ_n = nu/(1 − nu) <= n·ε for unit roundoff u = ε/2, Higham, "Accuracy and Stability of
  /// Numerical Algorithms", sec. 3.5), so a gradient that is gᵀa never fails; the second term
  /// covers the check's own double rounding. Cost O(out·cols + rows·(cols + out)). Enqueued
  /// on `space`: the two squared norms go to status(check_slot) and status(check_slot + 1),
  /// the verdict (0 passed, 1 failed) to status(verdict_slot); check_verdict() reads them.
  void check_factored(const execution_space &space, const record_type &r, scratch_type &scratch,
                      const status_type &status, std::size_t check_slot, std::size_t verdict_slot,
                      std::uint64_t seed, std::uint64_t stream) {
    ScopedRegion region("kat::precond::KFAC::factored_check");
    const std::size_t rows = r.a.extent(0);
    if (probe_.extent(0) != cols_) {
      probe_ = Vector<double, MemorySpace>(
          Kokkos::view_alloc(label() + "::probe", Kokkos::WithoutInitializing), cols_);
      kat::detail::fill_probe(space, probe_, seed, stream);
    }
    kat::detail::freivalds_check(space, r.a, r.g, r.weight_gradient, probe_,
                                 scratch.check_rows.matrix(rows, 2),
                                 scratch.check_out.matrix(out_, 2), status, check_slot,
                                 verdict_slot, factored_tolerance(rows, cols_));
    check_rows_ = rows;
  }

  /// The outcome of check_factored() from the status read back to the host (`status`), at
  /// `step`; records factored_check().
  /// @throws NumericalError if the check is not finite, ValueError if it failed.
  template <class HostStatus>
  void check_verdict(const HostStatus &status, std::size_t check_slot, std::size_t verdict_slot,
                     std::int64_t step) {
    const double diff = std::sqrt(status(check_slot));
    const double bound = std::sqrt(status(check_slot + 1));
    if (!std::isfinite(diff) || !std::isfinite(bound)) {
      throw NumericalError(kat::detail::concat(
          context(), ": factored_preconditioning: the check ‖∇v − gᵀ(av)‖ is not finite at step ",
          step, " (are the gradient, a and g finite?)"));
    }
    const double tol = factored_tolerance(check_rows_, cols_);
    check_ = bound > 0 ? diff / bound : (diff > 0 ? std::numeric_limits<double>::infinity() : 0);
    if (status(verdict_slot) != 0) {
      throw ValueError(kat::detail::concat(
          context(), ": factored_preconditioning at step ", step,
          ": the weight gradient is not the recorded batch's gᵀa: ‖∇v − gᵀ(av)‖₂ / "
          "‖|g|ᵀ(|a||v|)‖₂ = ",
          check_, ", allowed ", tol,
          " (rounding of gᵀa in the model's precision). The option requires the gradient to be "
          "exactly gᵀa of the batch recorded in a and g: no accumulation over several "
          "batches or backward passes, no data-parallel averaging, no clipping, weight decay "
          "or other change before KFAC::step; turn factored_preconditioning off otherwise"));
    }
  }

  /// P of gradient `grad` (out x cols) into preconditioned(), with the decompositions of
  /// `method` (the eigen path damps with `damping`; the inverse path's damping is in its
  /// inverses), in factored form from `r`'s a and g when factored(). Enqueued on `space`.
  void precondition(const execution_space &space, const record_type &r, const matrix_type &grad,
                    ComputeMethod method, double damping, scratch_type &scratch) {
    if (method == ComputeMethod::eigen) {
      precondition_eigen(space, r, grad, damping, scratch);
    } else {
      precondition_inverse(space, r, grad, scratch);
    }
  }

  /// P = ∇ converted to InverseScalar (a layer preconditioned elsewhere, before the strategy
  /// shares its P).
  void copy_gradient(const execution_space &space, const matrix_type &grad) {
    kat::detail::convert(space, grad, p_);
  }

  /// @throws NumericalError (naming the layer and `step`) if Σ P ⊙ `grad` is not finite;
  ///   a blocking reduction, for reporting a step that already failed.
  void check_finite(const execution_space &space, const matrix_type &grad,
                    std::int64_t step) const {
    if (!std::isfinite(kat::detail::elementwise_dot(space, p_, grad))) {
      throw NumericalError(
          kat::detail::concat(context(), ": the preconditioned gradient is not finite at step ",
                              step, " (is the gradient finite?)"));
    }
  }

  /// `x` as an InverseScalar matrix, converted into `ws`: the view itself when the types agree.
  static inverse_matrix_type to_inverse(const execution_space &space, const matrix_type &x,
                                        Workspace<InverseScalar, MemorySpace> &ws) {
    if constexpr (std::is_same<Scalar, InverseScalar>::value) {
      (void)space;
      (void)ws;
      return x;
    } else {
      const inverse_matrix_type c = ws.matrix(x.extent(0), x.extent(1));
      kat::detail::convert(space, x, c);
      return c;
    }
  }

  /// The factor state of the host copy KFAC::state() records.
  KFACState::Layer state() const {
    KFACState::Layer out;
    out.name = name_;
    out.a_dim = A_.dim();
    out.g_dim = G_.dim();
    out.a_updates = A_.updates();
    out.g_updates = G_.updates();
    out.A = factor_host_vector(A_);
    out.G = factor_host_vector(G_);
    return out;
  }
  /// @throws ShapeError (naming `where`) unless `in` is a state() of this layer.
  void check_state(const char *where, const KFACState::Layer &in) const {
    kat::detail::require_extent(where, "A dimension", A_.dim(), in.a_dim);
    kat::detail::require_extent(where, "G dimension", G_.dim(), in.g_dim);
    kat::detail::require_extent(where, "A entries", in.a_dim * in.a_dim, in.A.size());
    kat::detail::require_extent(where, "G entries", in.g_dim * in.g_dim, in.G.size());
  }
  /// Assigns the factors of a checked state() (those updated at least once).
  void load_state(const execution_space &space, const KFACState::Layer &in) {
    if (in.a_updates > 0)
      A_.assign(space, host_matrix<FactorScalar>(in.A, in.a_dim));
    if (in.g_updates > 0)
      G_.assign(space, host_matrix<FactorScalar>(in.G, in.g_dim));
  }

  /// Adds the layer's entries under `head` to `s`: "<head>.name" (text), "<head>.ready" (uint8)
  /// and the factors' states "<head>.A.*", "<head>.G.*" (KroneckerFactor::state_dict()).
  void save_state_dict(StateDict &s, const std::string &head) const {
    s.set_text(head + ".name", name_);
    s.set(head + ".ready", static_cast<std::uint8_t>(ready_ ? 1 : 0));
    s.merge(head + ".A", A_.state_dict());
    s.merge(head + ".G", G_.state_dict());
  }
  /// Appends the entry names (and prefixes) save_state_dict() writes under `head` to `names`.
  static void state_dict_names(std::vector<std::string> &names, const std::string &head) {
    names.insert(names.end(), {head + ".name", head + ".ready", head + ".A.", head + ".G."});
  }
  /// Checks the entries of `state` under `head` against this layer (registered as layer
  /// `index`) without changing anything.
  /// @throws StateError naming `where` and the first entry that differs.
  void check_state_dict(const StateDict &state, const std::string &head, const std::string &where,
                        std::size_t index) const {
    const std::string name = state.text(head + ".name");
    if (name != name_) {
      throw StateError(kat::detail::concat(where, ": layer ", index, " must be '", name_,
                                           "', the state has '", name, "'"));
    }
    state.checked<std::uint8_t>(head + ".ready", {});
    try {
      A_.check_state_dict(state.sub(head + ".A"));
      G_.check_state_dict(state.sub(head + ".G"));
    } catch (const StateError &e) {
      throw StateError(kat::detail::concat(where, ": layer '", name_, "': ", e.what()));
    }
  }
  /// Restores the entries under `head` (checked by check_state_dict()).
  void load_state_dict(const StateDict &state, const std::string &head) {
    A_.load_state_dict(state.sub(head + ".A"));
    G_.load_state_dict(state.sub(head + ".G"));
    ready_ = state.get<std::uint8_t>(head + ".ready") != 0;
  }

private:
  std::string label() const { return "kat::precond::KFAC::" + name_; }

  /// op(left) gᵀ a right into P (out x cols), from `r`'s a and g: G⁻¹(gᵀa)A⁻¹ with
  /// left = G⁻¹, right = A⁻¹ (inverse path), or Q_Gᵀ(gᵀa)Q_A with left = Q_G transposed,
  /// right = Q_A (eigen path).
  void factored_product(const execution_space &space, const record_type &r,
                        const inverse_matrix_type &left, Trans left_trans,
                        const inverse_matrix_type &right, scratch_type &scratch) {
    const inverse_matrix_type a = to_inverse(space, r.a, scratch.factored_a);
    const inverse_matrix_type g = to_inverse(space, r.g, scratch.factored_g);
    const std::size_t rows = a.extent(0);
    const inverse_matrix_type u = scratch.factored_u.matrix(out_, rows);
    const inverse_matrix_type v = scratch.factored_v.matrix(rows, cols_);
    const InverseScalar one(1), zero(0);
    gemm(space, left_trans, Trans::T, one, left, g, zero, u); // op(L) gᵀ, out x rows
    gemm(space, Trans::N, Trans::N, one, a, right, zero, v);  // a R, rows x cols
    gemm(space, Trans::N, Trans::N, one, u, v, zero, p_);
  }

  void precondition_eigen(const execution_space &space, const record_type &r,
                          const matrix_type &grad, double damping, scratch_type &scratch) {
    const inverse_matrix_type w = scratch.work.matrix(out_, cols_);
    const auto &qa = A_.eigenvectors();
    const auto &qg = G_.eigenvectors();
    const auto da = A_.eigenvalues();
    const auto dg = G_.eigenvalues();
    const InverseScalar one(1), zero(0);
    if (factored_) {
      factored_product(space, r, qg, Trans::T, qa, scratch); // (Q_Gᵀ gᵀ)(a Q_A)
    } else {
      const inverse_matrix_type g = to_inverse(space, grad, scratch.cast);
      gemm(space, Trans::T, Trans::N, one, qg, g, zero, w);  // Q_Gᵀ ∇
      gemm(space, Trans::N, Trans::N, one, w, qa, zero, p_); // (Q_Gᵀ ∇) Q_A
    }
    kat::detail::eigen_scale(space, p_, dg, da, static_cast<InverseScalar>(damping));
    gemm(space, Trans::N, Trans::N, one, qg, p_, zero, w); // Q_G (·)
    gemm(space, Trans::N, Trans::T, one, w, qa, zero, p_); // (·) Q_Aᵀ
  }

  void precondition_inverse(const execution_space &space, const record_type &r,
                            const matrix_type &grad, scratch_type &scratch) {
    if (factored_) {
      factored_product(space, r, G_.inverse(), Trans::N, A_.inverse(), scratch); // (G⁻¹gᵀ)(aA⁻¹)
      return;
    }
    const inverse_matrix_type g = to_inverse(space, grad, scratch.cast);
    const inverse_matrix_type w = scratch.work.matrix(out_, cols_);
    const InverseScalar one(1), zero(0);
    gemm(space, Trans::N, Trans::N, one, G_.inverse(), g, zero, w);
    gemm(space, Trans::N, Trans::N, one, w, A_.inverse(), zero, p_);
  }

  /// A factor's entries (column-major); dim² zeros if it was never allocated.
  static std::vector<double> factor_host_vector(const factor_type &f) {
    if (f.factor().extent(0) != f.dim()) {
      return std::vector<double>(f.dim() * f.dim(), 0.0);
    }
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.factor());
    std::vector<double> out(h.extent(0) * h.extent(1));
    for (std::size_t j = 0; j < h.extent(1); ++j)
      for (std::size_t i = 0; i < h.extent(0); ++i)
        out[i + h.extent(0) * j] = static_cast<double>(h(i, j));
    return out;
  }

  template <class T>
  static Kokkos::View<T **, Kokkos::LayoutLeft, Kokkos::HostSpace>
  host_matrix(const std::vector<double> &values, std::size_t dim) {
    Kokkos::View<T **, Kokkos::LayoutLeft, Kokkos::HostSpace> h("kat::precond::KFAC::load_state",
                                                                dim, dim);
    for (std::size_t j = 0; j < dim; ++j)
      for (std::size_t i = 0; i < dim; ++i)
        h(i, j) = static_cast<T>(values[i + dim * j]);
    return h;
  }

  std::string name_;
  std::size_t out_, cols_;
  factor_type A_, G_;
  inverse_matrix_type p_;  // the last step's preconditioned gradient, before the KL scale
  bool ready_ = false;     // has a decomposition to precondition with
  bool factored_ = false;  // the last step used the factored form
  bool every_step_ = true; // factored form cheaper: record on every step
  Vector<double, MemorySpace> probe_; // Freivalds vector v (cols), on first factored use
  double check_ = 0;                  // the last check's relative difference
  std::size_t check_rows_ = 0;        // rows of a in this step's check
  std::ptrdiff_t offset_ = -1;        // of the weight gradient in a flat vector (locate())
  std::size_t ld_ = 0;                // its leading dimension there
};

} // namespace kat::precond
