#pragma once
/// @file
/// @brief FOSI, the hybrid first/second-order optimizer of Sivan et al., "FOSI: Hybrid First
/// and Second Order Optimization", ICLR 2024 (reference code hsivan/fosi,
/// `fosi/jax_optim/fosi_optimizer.py`), wrapping any KAT first-order optimizer.

#include "kat/core/blas.hpp"
#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/optim/adam.hpp"
#include "kat/optim/fosi_partition.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/optim/sgd.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kat {
namespace optim {

namespace detail {

// The kernels of FOSI::step, as named functors rather than extended device lambdas: nvcc's
// wrapper of an extended lambda in a header is merged across translation units while its
// function pointers are not (docs/backends.md). DoubleVector holds double, Vector Scalar.

/// w(i) = g(i) in double.
template <class DoubleVector, class Vector> struct FOSIGradientToDouble {
  DoubleVector w;
  Vector g;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    w(i) = static_cast<double>(g(i));
  }
};

/// g2(i) = w(i) - g1(i) rounded to Scalar and mom(i) <- a_g1 g1(i) + b_m mom(i), g1 = w2.
template <class DoubleVector, class Vector> struct FOSISplitGradient {
  using Scalar = typename Vector::non_const_value_type;
  DoubleVector w, w2, mom;
  Vector g2;
  double a_g1, b_m;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const double g1 = w2(i);
    g2(i) = static_cast<Scalar>(w(i) - g1);
    mom(i) = a_g1 * g1 + b_m * mom(i);
  }
};

/// mk(j) <- a_g1 coef(j) + b_m mk(j): the momentum's subspace coefficients.
template <class DoubleVector> struct FOSISubspaceMomentum {
  DoubleVector coef, mk;
  double a_g1, b_m;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    mk(j) = a_g1 * coef(j) + b_m * mk(j);
  }
};

/// w(i) = scratch(i) - p(i) in double: the base optimizer's step u.
template <class DoubleVector, class Vector> struct FOSIBaseUpdate {
  DoubleVector w;
  Vector scratch, p;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    w(i) = static_cast<double>(scratch(i)) - static_cast<double>(p(i));
  }
};

/// coef(j) <- c coef(j) + alpha inv_abs(j) mk(j).
template <class DoubleVector> struct FOSISubspaceCoefficients {
  DoubleVector coef, inv_abs, mk;
  double c, alpha;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    coef(j) = c * coef(j) + alpha * inv_abs(j) * mk(j);
  }
};

/// p(i) = p(i) + c w(i) - w2(i), in double and rounded once to Scalar.
template <class DoubleVector, class Vector> struct FOSIApply {
  using Scalar = typename Vector::non_const_value_type;
  Vector p;
  DoubleVector w, w2;
  double c;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    p(i) = static_cast<Scalar>(static_cast<double>(p(i)) + c * w(i) - w2(i));
  }
};

} // namespace detail

/// How FOSI accumulates the subspace part g1 of the gradient into its momentum m (the
/// reference code's `momentum_func`, chosen to match the base optimizer).
enum class FOSIMomentum {
  heavy_ball, ///< m <- g1 + beta m (`fosi_momentum`; beta = 0 gives `fosi_sgd`)
  nesterov,   ///< m <- (1 + beta) g1 + beta² m (`fosi_nesterov`)
  adam,       ///< m <- (1 - beta) g1 + beta m (`fosi_adam`)
};

/// "heavy_ball", "nesterov" or "adam".
inline const char *to_string(FOSIMomentum m) {
  switch (m) {
  case FOSIMomentum::heavy_ball:
    return "heavy_ball";
  case FOSIMomentum::nesterov:
    return "nesterov";
  case FOSIMomentum::adam:
    return "adam";
  }
  return "unknown";
}

/// How late FOSI's curvature estimates were when it estimates asynchronously (a
/// FOSIPartition with asynchronous(), kat::distributed::DHO2 with curvature ranks). The
/// staleness of an estimate is the number of steps between the step that started it (whose
/// parameters it describes) and the first step that uses it: 0 is synchronous.
struct FOSIStaleness {
  /// Estimates installed asynchronously.
  std::int64_t estimates = 0;
  /// Sum of their staleness in steps (mean: total_steps / estimates).
  std::int64_t total_steps = 0;
  /// The largest staleness in steps.
  std::int64_t max_steps = 0;
  /// The staleness of the last estimate installed, in steps.
  std::int64_t last_steps = 0;
  /// Wall seconds of their Lanczos runs, measured where they ran.
  double estimation_seconds = 0.0;
  /// Wall seconds this process spent blocked waiting for an estimate (at the staleness bound,
  /// or when the next refresh was due): estimation_seconds - waited_seconds of the estimation
  /// was hidden behind training.
  double waited_seconds = 0.0;
};

/// FOSI (Sivan et al., ICLR 2024, Algorithm 1): a base first-order optimizer works in the
/// complement of the Hessian's extreme eigenspace while a Newton step, with momentum, works
/// inside it.
///
/// Every T steps (after W warm-up steps) FOSI estimates the k largest and l smallest
/// eigenpairs (λ, V) of the loss Hessian with kat::lanczos on the curvature operator given at
/// construction (the Hessian of the loss on one fixed batch at the current parameters; the
/// operator reads the parameters itself). V (k + l rows, orthonormal) is stored as its
/// transpose, an n x (k + l) column-major double matrix. With gradient g (ALGORITHMS.md §3):
///
///     g1 = Vᵀ(V g),  g2 = g - g1                     (subspace part, complement part)
///     m  <- a g1 + b m                               (momentum; FOSIMomentum gives a, b)
///     d  = Vᵀ(diag(1/|λ|) V m)                        (Newton direction in the subspace)
///     u  = base optimizer's step from g2               (lr and sign included)
///     u⊥ = u - Vᵀ(V u)
///     θ <- θ + c u⊥ - α d,   c = clip(|λ_max| / |λ_k|, 1, learning_rate_clip)
///
/// where λ_max is the largest kept eigenvalue and λ_k the smallest of the k largest. The
/// momentum m (an n-vector) is never reset, so after a refresh its old directions are
/// projected onto the new V. Before the first estimate FOSI calls the base optimizer's step()
/// with the gradient itself: it is then exactly (bit for bit) the base optimizer.
///
/// The base optimizer computes u on a scratch copy of the parameters (u = scratch - θ after
/// base.step(scratch, g2)), so its state advances exactly once per step and its weight decay,
/// if any, sees the true parameters; the decay term is projected like the rest of u (the
/// reference code adds no decay of its own). The basis, projections and momentum are double;
/// params and grads are Scalar, and the new parameters are θ + Δθ rounded once to Scalar.
///
/// Cost per step after the first refresh: four passes over V (V g, Vᵀ(V g), V u and the
/// update) besides the base step. V m is not a fifth: since V Vᵀ = I (orthonormal rows),
/// V g1 = V g, so V m is kept as a (k + l)-vector updated like m and recomputed from m at each
/// refresh. Four is the least with an opaque base optimizer: u needs g2 whole, and the update
/// needs V u.
///
/// Refresh schedule: with `count` = steps() on entry of step() (the number of completed
/// steps, i.e. the 0-based index of this step), step() first refreshes when
/// `count + 1 >= W` and `(count + 1 - W) % T == 0` (the reference code's condition on its
/// `state.count`), then updates with the new estimate. So W = T = 100 refreshes on the 100th,
/// 200th, ... call and the first 99 calls are the base optimizer's; W = 1 refreshes before the
/// very first update.
///
/// Learning rate: lr() is the base optimizer's rate. set_lr() sets both; a rate set through
/// a reference to Optimizer (whose set_lr is not virtual, as the Trainer's schedules call it)
/// is handed to the base optimizer at the start of the next step().
///
/// Memory in MemorySpace beyond the base optimizer: V (n (k + l) doubles), the momentum and
/// two work vectors (3 n doubles), a scratch parameter copy and the complement gradient
/// (2 n Scalars), and during a refresh Lanczos's n x m basis.
///
/// Partitioned (a FOSIPartition given at construction; kat::distributed::DHO2): each process
/// keeps and updates only its slice [offset(), offset() + local_size()) of every n-vector
/// above (n becomes local_size() in the memory figures), the base optimizer is built for that
/// slice (its state sharded too), the two projections V g and V u are completed by
/// FOSIPartition::sum, the refresh runs FOSIPartition::lanczos on the curvature operator
/// (whose vectors are then the partition's slices), and each step ends with
/// FOSIPartition::gather, so every process's params holds the whole updated vector. The
/// arithmetic per entry is the unpartitioned one. An asynchronous partition
/// (FOSIPartition::asynchronous(), DHO2 with curvature ranks) estimates elsewhere: a due
/// refresh starts an estimate from the step's parameters and FOSI keeps the previous one (or
/// the base optimizer) until the partition delivers it, at most staleness_bound() steps later;
/// staleness() reports how late each was.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class FOSI : public Optimizer<Scalar, MemorySpace> {
  using Base = Optimizer<Scalar, MemorySpace>;

public:
  using typename Base::execution_space;
  using typename Base::vector_type;
  using base_type =
      Optimizer<Scalar, MemorySpace>; ///< the wrapped first-order optimizer's interface
  using operator_type =
      kat::LinearOperator<MemorySpace>; ///< the curvature operator (Hessian-vector products)
  using partition_type =
      FOSIPartition<Scalar, MemorySpace>; ///< the slicing of the n-vectors across processes
  /// n x (k + l) column-major double matrix: the paper's Vᵀ.
  using basis_type = Kokkos::View<double **, Kokkos::LayoutLeft, MemorySpace>;
  using double_vector =
      kat::Vector<double, MemorySpace>; ///< a double n-vector (momentum, work vectors)

  /// Hyperparameters, named and defaulted as the reference code (hsivan/fosi, `fosi_momentum`
  /// / `fosi_nesterov` / `fosi_adam`); the paper's experiments use k = 10 and W = T = 800.
  struct Options {
    /// Number of largest eigenpairs, >= 1 (code default 5; the paper's experiments use 10).
    std::size_t k = 5;
    /// Number of smallest eigenpairs, >= 0 (code and paper: 0).
    std::size_t l = 0;
    /// Newton step size α in the subspace, finite and >= 0 (code 0.1; the paper states
    /// 0.01). Dimensionless: d already carries 1/|λ|.
    double alpha = 0.1;
    /// T: steps between curvature refreshes, >= 1 (code 100).
    std::int64_t num_iters_to_approx_eigs = 100;
    /// W: the first refresh happens on the W-th step, >= 1 (code: T, i.e. 100).
    std::int64_t warmup_w = 100;
    /// Upper bound of the complement step scale c, finite and >= 1. Unset: 3 for heavy_ball and
    /// nesterov, 1 for adam (the code's `fosi_adam` fixes 1: Adam's step must not be scaled).
    std::optional<double> learning_rate_clip;
    /// Momentum factor beta of the subspace momentum, in [0, 1) (code `decay` = 0.9).
    double beta = 0.9;
    /// Subspace momentum variant. Unset: from the base optimizer: nesterov for an SGD with
    /// nesterov, adam for Adam and AdamW, heavy_ball otherwise.
    std::optional<FOSIMomentum> momentum;
    /// Lanczos iterations m, k + l <= m <= n; 0 means 4 (k + l) (the code's choice).
    std::size_t lanczos_iterations = 0;
    /// Seed of the Lanczos start vectors; refresh r uses counter_bits(seed, stream, r).
    std::uint64_t seed = 0;
    /// Bytes FOSI may hold in MemorySpace at once (memory_bytes(): its state, work vectors
    /// and a refresh's Lanczos run); 0: the memory space's size (kat::memory_space_bytes, the
    /// host's physical memory or the GPU's memory). Checked at construction, before any of it
    /// is allocated.
    std::size_t memory_limit = 0;
  };

  /// Bytes FOSI holds in MemorySpace at most, beyond the base optimizer, on a process that
  /// holds `local_n` entries of each n-vector and runs Lanczos on vectors of length
  /// `lanczos_n` (both n without a partition): V (local_n x (k + l) doubles), the momentum and
  /// two work vectors (3 local_n doubles), the scratch copy and complement gradient (2 local_n
  /// Scalars), three (k + l)-vectors, and during a refresh kat::lanczos_bytes(lanczos_n, m).
  /// As a double, so that a size beyond size_t does not wrap.
  static double memory_bytes(std::size_t local_n, std::size_t lanczos_n, std::size_t k,
                             std::size_t l, std::size_t m) {
    const double n = static_cast<double>(local_n);
    const double kl = static_cast<double>(k) + static_cast<double>(l);
    LanczosOptions lo;
    lo.m = m;
    lo.k = k;
    lo.l = l;
    return sizeof(double) * (n * (kl + 3) + 3 * kl) + sizeof(Scalar) * 2 * n +
           kat::lanczos_bytes(lanczos_n, lo);
  }

  /// Builds FOSI for a flat parameter vector of length n around `base` (whose size() must be
  /// n, or the partition's local_size(); FOSI takes ownership and its lr() is FOSI's rate) and
  /// `curvature`, the operator whose extreme eigenpairs are estimated (see
  /// kat::LinearOperator). Allocates V, the momentum and the work vectors (labels
  /// "kat::optim::FOSI::...").
  /// @param n          the parameter vector's length
  /// @param base       the first-order optimizer (SGD, Adam, ...) that steps in the complement
  /// @param curvature  the operator v -> H v whose extreme eigenpairs FOSI estimates
  /// @param options    the hyperparameters (see Options)
  /// @param partition  null: one process holds everything; else the slices (see the class
  ///   comment), shared with the caller.
  /// @throws ValueError naming the option, its valid range and its value if base or
  ///   curvature is empty, k < 1, alpha < 0, T < 1, W < 1, learning_rate_clip < 1, beta
  ///   outside [0, 1), a real option is not finite, k + l > n, or m is outside [k + l, n];
  ///   naming the bytes asked, k, l, m, n and the limit if memory_bytes() exceeds
  ///   Options::memory_limit (by default the memory space's size).
  /// @throws ShapeError if base->size() is not the (local) size, or the partition's global
  ///   size is not n or its slice is empty or outside [0, n).
  FOSI(std::size_t n, std::unique_ptr<base_type> base, operator_type curvature,
       const Options &options, std::shared_ptr<partition_type> partition = nullptr)
      : Base(n, checked_base(local_size_of(n, partition.get()), partition != nullptr, base)),
        partition_(std::move(partition)), offset_(partition_ ? partition_->offset() : 0),
        local_n_(local_size_of(n, partition_.get())), base_(std::move(base)),
        curvature_(checked_curvature(std::move(curvature))),
        opt_(resolved(n, local_n_, partition_ ? partition_->vector_length() : n, *base_, options)),
        V_("kat::optim::FOSI::eigenvectors", local_n_, opt_.k + opt_.l),
        momentum_("kat::optim::FOSI::momentum", local_n_),
        work_("kat::optim::FOSI::work", local_n_), work2_("kat::optim::FOSI::work2", local_n_),
        scratch_("kat::optim::FOSI::scratch", local_n_),
        g2_("kat::optim::FOSI::complement_gradient", local_n_),
        coefficients_("kat::optim::FOSI::coefficients", opt_.k + opt_.l),
        momentum_coefficients_("kat::optim::FOSI::momentum_coefficients", opt_.k + opt_.l),
        inv_abs_lambda_("kat::optim::FOSI::inv_abs_eigenvalues", opt_.k + opt_.l),
        lambda_(opt_.k + opt_.l, 0.0) {}

  /// "FOSI".
  std::string name() const override { return "FOSI"; }

  /// One FOSI update of `params` (length n) from `grads` (length n; not modified): a
  /// refresh first if the schedule says so (see the class comment), then the update.
  /// Before the first refresh this is exactly base_optimizer().step(space, params, grads).
  /// @throws ShapeError if either length differs from n.
  /// @throws NumericalError (from the refresh) if the curvature operator returns non-finite
  ///   values or an eigenvalue estimate is 0; nothing is changed then, steps() included.
  void step(const execution_space &space, const vector_type &params,
            const vector_type &grads) override {
    kat::ScopedRegion region("kat::optim::FOSI::step");
    const std::string where = "kat::optim::FOSI::step";
    kat::detail::require_extent(where.c_str(), "params.extent(0)", this->size_,
                                static_cast<std::size_t>(params.extent(0)));
    kat::detail::require_extent(where.c_str(), "grads.extent(0)", this->size_,
                                static_cast<std::size_t>(grads.extent(0)));
    if (partition_ && partition_->asynchronous()) {
      estimate_asynchronously(space, params);
    } else if (refresh_due(this->steps_)) {
      refresh(space);
    }
    this->begin_step(params, grads);
    base_->set_lr(this->lr_);
    if (refreshes_ == 0) {
      base_->step(space, slice(params), slice(grads));
      gather(space, params);
      return;
    }

    // Plain locals, copied into the kernels' functors.
    const basis_type V = V_;
    const double_vector w = work_;
    const double_vector w2 = work2_;
    const double_vector mom = momentum_;
    const vector_type scratch = scratch_;
    const vector_type g2 = g2_;
    const vector_type p = slice(params);
    const vector_type g = slice(grads);
    const double_vector coef = coefficients_;
    const double_vector mk = momentum_coefficients_;
    const double_vector inv_abs = inv_abs_lambda_;
    const double c = scaling_;
    const double alpha = opt_.alpha;
    const double beta = opt_.beta;
    double a_g1 = 1.0, b_m = beta;
    if (*opt_.momentum == FOSIMomentum::nesterov) {
      a_g1 = 1.0 + beta;
      b_m = beta * beta;
    } else if (*opt_.momentum == FOSIMomentum::adam) {
      a_g1 = 1.0 - beta;
    }
    using Policy = Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>;
    const Policy all(space, 0, static_cast<std::int64_t>(local_n_));
    const Policy subspace(space, 0, static_cast<std::int64_t>(V.extent(1)));

    // With profiling, the projections (everything but the base step) are timed, fenced.
    using clock = std::chrono::steady_clock;
    const bool timed = profile_;
    clock::time_point t0;
    if (timed) {
      space.fence();
      t0 = clock::now();
    }

    // g1 = Vᵀ(V g) into w2, g2 = g - g1 (rounded to Scalar for the base optimizer),
    // m <- a g1 + b m, and V m <- a V g + b V m (V Vᵀ = I, so V g1 = V g: no pass over V).
    Kokkos::parallel_for("kat::optim::FOSI::gradient_to_double", all,
                         detail::FOSIGradientToDouble<double_vector, vector_type>{w, g});
    kat::gemv(space, Trans::T, 1.0, V, w, 0.0, coef);
    sum_over_partition(space, coef);
    kat::gemv(space, Trans::N, 1.0, V, coef, 0.0, w2);
    Kokkos::parallel_for(
        "kat::optim::FOSI::split_gradient", all,
        detail::FOSISplitGradient<double_vector, vector_type>{w, w2, mom, g2, a_g1, b_m});
    Kokkos::parallel_for("kat::optim::FOSI::subspace_momentum", subspace,
                         detail::FOSISubspaceMomentum<double_vector>{coef, mk, a_g1, b_m});

    // u = the base optimizer's step from g2, taken on a copy of the parameters.
    Kokkos::deep_copy(space, scratch, p);
    clock::time_point t1, t2;
    if (timed) {
      space.fence();
      t1 = clock::now();
    }
    base_->step(space, scratch, g2);
    if (timed) {
      space.fence();
      t2 = clock::now();
    }
    Kokkos::parallel_for("kat::optim::FOSI::base_update", all,
                         detail::FOSIBaseUpdate<double_vector, vector_type>{w, scratch, p});

    // Δθ = c u⊥ - α d = c u - V (c V u + α diag(1/|λ|) V m).
    kat::gemv(space, Trans::T, 1.0, V, w, 0.0, coef);
    sum_over_partition(space, coef);
    Kokkos::parallel_for(
        "kat::optim::FOSI::subspace_coefficients", subspace,
        detail::FOSISubspaceCoefficients<double_vector>{coef, inv_abs, mk, c, alpha});
    kat::gemv(space, Trans::N, 1.0, V, coef, 0.0, w2);
    Kokkos::parallel_for("kat::optim::FOSI::apply", all,
                         detail::FOSIApply<double_vector, vector_type>{p, w, w2, c});
    gather(space, params);
    if (timed) {
      space.fence();
      projection_seconds_ += std::chrono::duration<double>(t1 - t0).count() +
                             std::chrono::duration<double>(clock::now() - t2).count();
      ++projected_steps_;
    }
  }

  /// Profiling: when on, every step after the first refresh fences around its projections
  /// (everything but the base optimizer's step: the split of g, the subspace momentum and
  /// Newton direction, the projection of u and the update) and adds their wall time to
  /// projection_seconds(). Off by default (no fences).
  void set_profile(bool on) { profile_ = on; }
  /// Wall seconds of the timed projections so far (see set_profile); not part of the state.
  double projection_seconds() const { return projection_seconds_; }
  /// Number of steps whose projections were timed.
  std::int64_t projected_steps() const { return projected_steps_; }

  /// Whether step() refreshes the estimate when steps() == count on entry:
  /// `count + 1 >= W && (count + 1 - W) % T == 0`.
  bool refresh_due(std::int64_t count) const {
    const std::int64_t t = count + 1 - opt_.warmup_w;
    return t >= 0 && t % opt_.num_iters_to_approx_eigs == 0;
  }

  /// Estimates (λ, V) now with kat::lanczos (partitioned: FOSIPartition::lanczos) on the
  /// curvature operator (at whatever parameters it reads) and recomputes c; step() calls it on
  /// schedule, a caller may call it at other times (on every process when partitioned). Refresh r
  /// (0-based, refresh_count() before the call) starts Lanczos from seed kat::counter_bits(seed,
  /// stream, r). Fences.
  /// @throws NumericalError if the operator returns non-finite values or an eigenvalue
  ///   estimate is 0 (its inverse is the Newton step); the previous estimate is kept then.
  /// @throws Error with an asynchronous partition (its estimates run inside step()).
  void refresh(const execution_space &space) {
    kat::ScopedRegion region("kat::optim::FOSI::refresh");
    if (partition_ && partition_->asynchronous()) {
      throw Error("kat::optim::FOSI::refresh: the partition estimates asynchronously; its "
                  "refreshes start and finish inside step()");
    }
    const LanczosOptions lo = lanczos_options();
    const auto start = std::chrono::steady_clock::now();
    const LanczosResult<MemorySpace> r =
        partition_ ? partition_->lanczos(space, curvature_, lo)
                   : kat::lanczos<MemorySpace>(space, curvature_, this->size_, lo);
    const auto stop = std::chrono::steady_clock::now();
    install(space, r);
    last_lanczos_seconds_ = std::chrono::duration<double>(stop - start).count();
  }

  /// Sets the learning rate of FOSI and of the base optimizer.
  /// @throws ValueError if lr < 0 or not finite.
  void set_lr(double lr) {
    Base::set_lr(lr);
    base_->set_lr(lr);
  }

  /// The options with the defaults resolved (learning_rate_clip, momentum and
  /// lanczos_iterations are set).
  const Options &options() const { return opt_; }

  /// The wrapped first-order optimizer.
  const base_type &base_optimizer() const { return *base_; }
  /// The wrapped first-order optimizer, mutable (its options, its state).
  base_type &base_optimizer() { return *base_; }

  /// Whether an estimate exists (refresh_count() > 0); until then FOSI is the base optimizer.
  bool has_estimate() const { return refreshes_ > 0; }

  /// Number of refreshes so far.
  std::int64_t refresh_count() const { return refreshes_; }

  /// Wall-clock seconds of the last refresh's Lanczos run (operator applications included;
  /// Lanczos ends with reductions to the host, so device work is inside it); 0 before the
  /// first. Not part of the state.
  double last_lanczos_seconds() const { return last_lanczos_seconds_; }

  /// Lanczos iterations of the last refresh (m, or fewer on an invariant subspace); 0 before.
  std::size_t last_lanczos_iterations() const { return last_lanczos_iterations_; }

  /// With an asynchronous partition: whether an estimate is in flight (started, not yet
  /// installed), and how late the installed ones were (zeros otherwise).
  bool estimate_pending() const { return pending_; }
  /// How late the asynchronously installed estimates were (all zero when synchronous).
  const FOSIStaleness &staleness() const { return staleness_; }

  /// The largest kept eigenvalue of the current estimate, λ_max (the last of eigenvalues());
  /// 0 before the first refresh.
  double lambda_max() const { return lambda_.back(); }

  /// The complement step scale c = clip(|λ_max| / |λ_k|, 1, learning_rate_clip); 1 before the
  /// first refresh.
  double scaling() const { return scaling_; }

  /// The current eigenvalue estimates (host, k + l): the l smallest ascending, then the k
  /// largest ascending; zeros before the first refresh.
  const std::vector<double> &eigenvalues() const { return lambda_; }

  /// The current eigenvectors, n x (k + l) column-major (the paper's Vᵀ; column j belongs to
  /// eigenvalues()[j]); zeros before the first refresh. Partitioned: this process's rows
  /// (local_size() x (k + l)).
  const basis_type &eigenvectors() const { return V_; }

  /// The subspace momentum m (length n, or local_size() when partitioned; double).
  const double_vector &subspace_momentum() const { return momentum_; }

  /// V m (length k + l, double), which step() keeps instead of recomputing it from m.
  const double_vector &subspace_momentum_coefficients() const { return momentum_coefficients_; }

  /// Bytes of curvature state in MemorySpace on this process: the eigenvectors V
  /// (local_size() x (k + l) doubles) and the subspace momentum (local_size() doubles), plus
  /// what a refresh allocates while it runs, Lanczos's basis, residual and Ritz vectors
  /// (L x (m + 1 + k + l) doubles, L = n, or the partition's vector_length()). The base
  /// optimizer's state and the step's work vectors are not included.
  virtual std::size_t curvature_bytes() const {
    const std::size_t kl = opt_.k + opt_.l;
    const std::size_t L = partition_ ? partition_->vector_length() : this->size_;
    return sizeof(double) * (local_n_ * (kl + 1) + L * (opt_.lanczos_iterations + 1 + kl));
  }

  /// The partition given at construction (null: none).
  const std::shared_ptr<partition_type> &partition() const { return partition_; }
  /// First index of this process's slice of the flat vector (0 without a partition).
  std::size_t offset() const { return offset_; }
  /// Length of this process's slice (n without a partition): the length of the momentum, the
  /// rows of eigenvectors() and the base optimizer's size().
  std::size_t local_size() const { return local_n_; }

  /// The base optimizer's per-parameter buffers (what a sparse mask keeps consistent).
  /// FOSI's own momentum lies in the span of past eigenvectors and is not among them.
  std::vector<vector_type> state_buffers() const override { return base_->state_buffers(); }

  /// "steps" (int64), "lr" (float64), "base.<entry>" (the base optimizer's state_dict()),
  /// "momentum" (float64 [n]), "momentum_coefficients" (V m, float64 [k + l]), "eigenvectors"
  /// (float64 [n, k + l]), "eigenvalues" (float64 [k + l]) and "refreshes" (int64): with the
  /// same options and operator, a FOSI loaded from it continues bit for bit as the one saved.
  /// Partitioned, n is local_size(): each process saves and loads its own slice.
  /// @throws StateError while an asynchronous estimate is in flight (estimate_pending()): its
  ///   result is not part of the state, so a save now could not be resumed exactly.
  StateDict state_dict() const override {
    if (pending_) {
      throw StateError(kat::detail::concat(
          "kat::optim::FOSI::state_dict: a curvature estimate started at step ", estimate_step_,
          " is in flight (asynchronous partition); save when estimate_pending() is false"));
    }
    StateDict s = Base::state_dict();
    s.merge("base", base_->state_dict());
    s.set_view("momentum", momentum_);
    s.set_view("momentum_coefficients", momentum_coefficients_);
    s.set_view("eigenvectors", V_);
    s.set("eigenvalues", lambda_);
    s.set("refreshes", refreshes_);
    return s;
  }

  /// Restores what state_dict() saved, after checking every entry, so a failed load changes
  /// nothing.
  /// @throws StateError naming the first entry that is missing, unexpected or of another
  ///   dtype or shape (the base optimizer's entries included); ValueError if "steps" or
  ///   "refreshes" is < 0, "lr" is not a valid rate, or, with refreshes > 0, an eigenvalue is
  ///   0 or not finite.
  void load_state_dict(const StateDict &state) override {
    const std::string where = "kat::optim::FOSI::load_state_dict";
    state.require_names(where, {"steps", "lr", "momentum", "momentum_coefficients", "eigenvectors",
                                "eigenvalues", "refreshes", "base."});
    const auto n = static_cast<std::uint64_t>(local_n_);
    const auto kl = static_cast<std::uint64_t>(lambda_.size());
    state.checked<double>("momentum", {n});
    state.checked<double>("momentum_coefficients", {kl});
    state.checked<double>("eigenvectors", {n, kl});
    const std::vector<double> lambda = state.get_vector<double>("eigenvalues", {kl});
    const auto refreshes = state.get<std::int64_t>("refreshes");
    const auto steps = state.get<std::int64_t>("steps");
    const auto lr = state.get<double>("lr");
    detail::require_option(steps >= 0, where, "steps", ">= 0", static_cast<double>(steps));
    detail::require_option(refreshes >= 0, where, "refreshes", ">= 0",
                           static_cast<double>(refreshes));
    detail::require_lr(where, lr);
    if (refreshes > 0) {
      check_eigenvalues(where, lambda, true);
    }
    base_->load_state_dict(state.sub("base")); // checks its own entries first
    state.copy_to("momentum", momentum_);
    state.copy_to("momentum_coefficients", momentum_coefficients_);
    state.copy_to("eigenvectors", V_);
    if (refreshes > 0) {
      set_eigenvalues(lambda);
    } else {
      lambda_.assign(lambda.size(), 0.0);
      scaling_ = 1.0;
    }
    refreshes_ = refreshes;
    this->steps_ = steps;
    this->lr_ = lr;
  }

  /// Stream of kat::counter_bits that derives each refresh's Lanczos seed ("FOSI").
  static constexpr std::uint64_t fosi_stream = 0x464f5349ull;

private:
  /// The length of this process's slice: n, or the partition's after checking it against n.
  static std::size_t local_size_of(std::size_t n, const partition_type *partition) {
    if (!partition) {
      return n;
    }
    const char *who = "kat::optim::FOSI";
    kat::detail::require_extent(who, "partition->global_size() (the parameter count n)", n,
                                partition->global_size());
    const std::size_t local = partition->local_size();
    if (local == 0 || partition->offset() > n || local > n - partition->offset()) {
      throw ShapeError(kat::detail::concat(
          who,
          ": the partition's slice [offset, offset + local_size) must be a non-empty part of "
          "[0, n = ",
          n, "), got [", partition->offset(), ", ", partition->offset() + local, ")"));
    }
    return local;
  }

  static double checked_base(std::size_t n, bool partitioned,
                             const std::unique_ptr<base_type> &base) {
    if (!base) {
      throw ValueError("kat::optim::FOSI: base must be an optimizer, got nullptr");
    }
    kat::detail::require_extent("kat::optim::FOSI",
                                partitioned ? "base->size() (the partition's local_size())"
                                            : "base->size() (the parameter count n)",
                                n, base->size());
    return base->lr();
  }

  /// This process's slice of a flat n-vector (the vector itself without a partition).
  vector_type slice(const vector_type &v) const {
    if (!partition_) {
      return v;
    }
    return Kokkos::subview(v, std::make_pair(offset_, offset_ + local_n_));
  }

  /// Completes a projection onto V: the sum of every process's coefficients (no-op alone).
  void sum_over_partition(const execution_space &space, const double_vector &coefficients) {
    if (partition_) {
      partition_->sum(space, coefficients);
    }
  }

  /// Reassembles params from every process's slice (no-op alone).
  void gather(const execution_space &space, const vector_type &params) {
    if (partition_) {
      partition_->gather(space, params);
    }
  }

  static operator_type checked_curvature(operator_type curvature) {
    if (!curvature) {
      throw ValueError("kat::optim::FOSI: curvature must be a callable LinearOperator, got an "
                       "empty one");
    }
    return curvature;
  }

  /// The options with defaults resolved, after validation.
  static Options resolved(std::size_t n, std::size_t local_n, std::size_t lanczos_n,
                          const base_type &base, Options o) {
    const std::string who = "kat::optim::FOSI";
    detail::require_option(o.k >= 1, who, "k", ">= 1", static_cast<double>(o.k));
    detail::require_option(std::isfinite(o.alpha) && o.alpha >= 0.0, who, "alpha",
                           "finite and >= 0", o.alpha);
    detail::require_option(o.num_iters_to_approx_eigs >= 1, who, "num_iters_to_approx_eigs", ">= 1",
                           static_cast<double>(o.num_iters_to_approx_eigs));
    detail::require_option(o.warmup_w >= 1, who, "warmup_w", ">= 1",
                           static_cast<double>(o.warmup_w));
    detail::require_option(std::isfinite(o.beta) && o.beta >= 0.0 && o.beta < 1.0, who, "beta",
                           "in [0, 1)", o.beta);
    if (!o.momentum) {
      o.momentum = FOSIMomentum::heavy_ball;
      if (const auto *sgd = dynamic_cast<const SGD<Scalar, MemorySpace> *>(&base)) {
        if (sgd->options().nesterov) {
          o.momentum = FOSIMomentum::nesterov;
        }
      } else if (dynamic_cast<const Adam<Scalar, MemorySpace> *>(&base) != nullptr) {
        o.momentum = FOSIMomentum::adam;
      }
    }
    if (!o.learning_rate_clip) {
      o.learning_rate_clip = *o.momentum == FOSIMomentum::adam ? 1.0 : 3.0;
    }
    detail::require_option(std::isfinite(*o.learning_rate_clip) && *o.learning_rate_clip >= 1.0,
                           who, "learning_rate_clip", "finite and >= 1", *o.learning_rate_clip);
    const std::size_t kl = o.k + o.l;
    if (o.k > n || o.l > n || kl > n) {
      throw ValueError(kat::detail::concat(who, ": k + l must be <= n = ", n,
                                           " (the parameter count: the Hessian has n eigenpairs), "
                                           "got k = ",
                                           o.k, ", l = ", o.l));
    }
    const bool by_default = o.lanczos_iterations == 0;
    const std::size_t m = by_default ? 4 * kl : o.lanczos_iterations;
    if (m < kl || m > n) {
      throw ValueError(kat::detail::concat(
          who, ": lanczos_iterations (m) must be in [k + l, n] = [", kl, ", ", n, "], got ", m,
          by_default ? " (the default 4 (k + l); set lanczos_iterations or lower k and l)" : ""));
    }
    o.lanczos_iterations = m;
    kat::detail::require_memory<MemorySpace>(
        who,
        kat::detail::concat("k = ", o.k, ", l = ", o.l, " with m = ", m,
                            " Lanczos iterations on n = ", n, " parameters (", local_n,
                            " on this process; V is n x (k + l) and "
                            "Lanczos's basis n x m doubles)"),
        memory_bytes(local_n, lanczos_n, o.k, o.l, m), o.memory_limit,
        "lower k and l (or lanczos_iterations)");
    return o;
  }

  /// Throws NumericalError (at a refresh) or ValueError (at a load) unless every eigenvalue is
  /// finite and nonzero.
  static void check_eigenvalues(const std::string &where, const std::vector<double> &lambda,
                                bool loading = false) {
    for (std::size_t j = 0; j < lambda.size(); ++j) {
      if (!std::isfinite(lambda[j]) || lambda[j] == 0.0) {
        const std::string msg = kat::detail::concat(
            where, ": eigenvalue ", j, " must be finite and nonzero (FOSI steps by 1/|λ|), got ",
            lambda[j]);
        if (loading) {
          throw ValueError(msg);
        }
        throw NumericalError(msg);
      }
    }
  }

  /// λ, 1/|λ| on the device and c.
  void set_eigenvalues(const std::vector<double> &lambda) {
    lambda_ = lambda;
    auto inv = Kokkos::create_mirror_view(inv_abs_lambda_);
    for (std::size_t j = 0; j < lambda.size(); ++j) {
      inv(j) = 1.0 / std::abs(lambda[j]);
    }
    Kokkos::deep_copy(inv_abs_lambda_, inv);
    const double ratio = std::abs(lambda_.back()) / std::abs(lambda_[opt_.l]);
    scaling_ = std::min(std::max(ratio, 1.0), *opt_.learning_rate_clip);
  }

  /// The next refresh's Lanczos options; refresh r (0-based, refreshes_) is seeded with
  /// counter_bits(seed, fosi_stream, r).
  LanczosOptions lanczos_options() const {
    LanczosOptions lo;
    lo.m = opt_.lanczos_iterations;
    lo.k = opt_.k;
    lo.l = opt_.l;
    lo.seed = kat::counter_bits(opt_.seed, fosi_stream, static_cast<std::uint64_t>(refreshes_));
    return lo;
  }

  /// Makes `r` (this process's rows first) the current estimate: V, V m, λ and c. Checks the
  /// eigenvalues first, so a failure changes nothing. Fences.
  void install(const execution_space &space, const LanczosResult<MemorySpace> &r) {
    check_eigenvalues("kat::optim::FOSI::refresh", r.eigenvalues);
    Kokkos::deep_copy(
        space, V_,
        Kokkos::subview(r.eigenvectors, std::make_pair(std::size_t(0), local_n_), Kokkos::ALL));
    kat::gemv(space, kat::Trans::T, 1.0, V_, momentum_, 0.0, momentum_coefficients_);
    sum_over_partition(space, momentum_coefficients_);
    set_eigenvalues(r.eigenvalues);
    space.fence();
    ++refreshes_;
    last_lanczos_iterations_ = r.iterations;
  }

  /// The refresh schedule with an asynchronous partition: an estimate in flight is installed
  /// when the partition has it, and waited for when it is staleness_bound() steps old or the
  /// next is due; a due refresh starts the next estimate at `params` (and waits for it at
  /// once when the bound is 0).
  void estimate_asynchronously(const execution_space &space, const vector_type &params) {
    const bool due = refresh_due(this->steps_);
    const std::int64_t bound = partition_->staleness_bound();
    if (pending_) {
      finish_estimate(space, due || this->steps_ - estimate_step_ >= bound);
    }
    if (due) {
      partition_->start_estimate(space, params, lanczos_options());
      pending_ = true;
      estimate_step_ = this->steps_;
      if (bound == 0) {
        finish_estimate(space, true);
      }
    }
  }

  void finish_estimate(const execution_space &space, bool wait) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    std::optional<LanczosResult<MemorySpace>> r = partition_->finish_estimate(space, wait);
    if (wait) {
      staleness_.waited_seconds += std::chrono::duration<double>(clock::now() - start).count();
    }
    if (!r) {
      return;
    }
    pending_ = false; // a result that fails its check is dropped: the old estimate stays
    install(space, *r);
    const std::int64_t age = this->steps_ - estimate_step_;
    ++staleness_.estimates;
    staleness_.total_steps += age;
    staleness_.max_steps = std::max(staleness_.max_steps, age);
    staleness_.last_steps = age;
    last_lanczos_seconds_ = partition_->estimate_seconds();
    staleness_.estimation_seconds += last_lanczos_seconds_;
  }

  std::shared_ptr<partition_type> partition_;
  std::size_t offset_;
  std::size_t local_n_;
  std::unique_ptr<base_type> base_;
  operator_type curvature_;
  Options opt_;
  basis_type V_;
  double_vector momentum_;
  double_vector work_;
  double_vector work2_;
  vector_type scratch_;
  vector_type g2_;
  double_vector coefficients_;
  double_vector momentum_coefficients_; // V m (k + l), kept in step with m
  double_vector inv_abs_lambda_;
  std::vector<double> lambda_;
  double scaling_ = 1.0;
  std::int64_t refreshes_ = 0;
  bool profile_ = false;
  double projection_seconds_ = 0;
  std::int64_t projected_steps_ = 0;
  double last_lanczos_seconds_ = 0.0;
  std::size_t last_lanczos_iterations_ = 0;
  // Asynchronous estimation (a partition with asynchronous()).
  bool pending_ = false;
  std::int64_t estimate_step_ = 0; // steps() when the estimate in flight was started
  FOSIStaleness staleness_;
};

} // namespace optim
} // namespace kat
