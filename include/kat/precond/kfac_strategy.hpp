#pragma once
/// @file
/// @brief kat::precond::KFACStrategy: what a K-FAC strategy decides for one process (which
/// factors it builds and decomposes, what it reduces, shares and agrees on with the others)
/// and what that costs (KFACStrategyReport). The local strategy (KFACLocalStrategy) is
/// KFAC's default; the distributed ones are kat::distributed::DKFAC, KAISA and DPKFAC
/// (docs/distributed.md).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kat::precond {

/// What one decomposition step found on this process (KFACStrategy::agree_on_failures()).
struct KFACDecompositionFailures {
  /// failed[2i] and failed[2i + 1]: 1 if this process's decomposition of factor A or G of
  /// registered layer i failed at this step, 0 otherwise (2 entries per registered layer).
  std::vector<std::int32_t> failed;
  /// held[2i] and held[2i + 1]: 1 if this process computes the decomposition of factor A or
  /// G of registered layer i (KFACStrategy::computes_decomposition) and holds one after this
  /// step's decompositions (a failed one keeps the previous, if any), 0 otherwise (the layout
  /// of `failed`).
  std::vector<std::int32_t> held;
  /// The error of the first failed factor (in that order), without the "kat::precond::KFAC: "
  /// prefix; empty if none failed.
  std::string message;
};

/// Calls and payload bytes of one kind of collective, as kat::distributed::CommunicatorStats
/// counts them (per rank, per call, the payload handed to MPI, on a broadcast's root as on
/// its receivers).
struct KFACTraffic {
  std::uint64_t calls = 0; ///< collective calls
  std::uint64_t bytes = 0; ///< payload bytes handed to MPI
};

/// What a K-FAC strategy communicates and stores on this process (KFACStrategy::report()):
/// analytic volumes per event and counters since the strategy was built (or its
/// reset_stats()). All zero for the local strategy.
struct KFACStrategyReport {
  /// The strategy's name() ("local", "D-KFAC", "KAISA COMM-OPT", "DP-KFAC", ...).
  std::string name;
  /// Analytic bytes of one factor update (the batch estimates' reduction).
  std::size_t bytes_per_factor_update = 0;
  /// Analytic bytes of one decomposition step without failures: decompositions shared plus
  /// the agreement on failures.
  std::size_t bytes_per_decomposition_update = 0;
  /// Analytic bytes of one step's preconditioned-gradient sharing.
  std::size_t bytes_per_step = 0;
  /// Factor updates whose estimates were reduced.
  std::uint64_t factor_updates = 0;
  /// Decomposition steps on which the strategy communicated (shared or agreed).
  std::uint64_t decomposition_updates = 0;
  /// Steps whose preconditioned gradients were shared.
  std::uint64_t steps = 0;
  /// Counted traffic of the factor reduction (the batch estimates).
  KFACTraffic factor_reduction;
  /// Counted traffic of sharing decompositions.
  KFACTraffic decomposition_sharing;
  /// Counted traffic of sharing preconditioned gradients.
  KFACTraffic gradient_sharing;
  /// Counted traffic of the agreement on decomposition failures.
  KFACTraffic agreement;
  /// Bytes of the strategy's own buffers (packing and staging), on top of KFAC::state_bytes().
  std::size_t workspace_bytes = 0;

  /// The four counters together.
  KFACTraffic total() const {
    KFACTraffic t;
    for (const KFACTraffic *c :
         {&factor_reduction, &decomposition_sharing, &gradient_sharing, &agreement}) {
      t.calls += c->calls;
      t.bytes += c->bytes;
    }
    return t;
  }
};

/// The decisions K-FAC leaves to a strategy, asked by kat::precond::KFAC::step() on every
/// process in the same order (docs/kfac.md, "Strategies"):
///
///     for each factor update, each layer this process builds_factors() for, A then G:
///         batch estimate F_new; reduce_factor(F_new) if reduces_factors(); fold into F
///     on a decomposition step: decompose the factors with computes_decomposition();
///         agree_on_failures() if agrees_on_failures(); for each decomposed layer, A then G
///         (not failed): share_decomposition()
///     precondition: P of each layer with factors and decompositions here;
///         shares_gradients(): share_gradient(P) for every layer, every layer is applied
///
/// A KFAC holds one strategy (KFAC::set_strategy(); the distributed strategies install
/// themselves in their constructor and restore the local one in their destructor). The
/// members that communicate are collective: every process must register the same layers and
/// step together. The base class is the local strategy: every answer is "this process does
/// everything, alone", and nothing costs anything.
///
/// @tparam KFACType  a kat::precond::KFAC instantiation.
template <class KFACType> class KFACStrategy {
public:
  using kfac_type = KFACType; ///< the KFAC this strategy serves
  /// Where its kernels and collectives run.
  using execution_space = typename KFACType::execution_space;
  /// A batch estimate: dim x dim, FactorScalar, both triangles filled.
  using factor_matrix_type = typename KFACType::factor_matrix_type;
  /// A layer's factor A or G with its decompositions (kat::precond::KroneckerFactor).
  using factor_type = typename KFACType::factor_type;
  /// A preconditioned gradient: out x (in+1), InverseScalar, LayoutLeft, contiguous.
  using inverse_matrix_type = typename KFACType::inverse_matrix_type;
  using Failures = KFACDecompositionFailures; ///< what one decomposition step found on this process
  using Report = KFACStrategyReport;          ///< what the strategy communicates and stores

  KFACStrategy() = default;
  KFACStrategy(const KFACStrategy &) = delete;
  KFACStrategy &operator=(const KFACStrategy &) = delete;
  virtual ~KFACStrategy() = default;

  /// A short name for reports ("local").
  virtual std::string name() const { return "local"; }

  /// Whether this process builds (records a and g for, accumulates, decomposes) the factors
  /// of registered layer `layer` (DP-KFAC: only the layer's owner). A layer not built here
  /// allocates no factor memory; it is preconditioned here only if shares_gradients().
  /// Asked when the layer is registered and when the strategy is set.
  virtual bool builds_factors(std::size_t layer) const {
    (void)layer;
    return true;
  }

  /// Whether reduce_factor() is called; false (the default) keeps factor updates free of
  /// any extra pass.
  virtual bool reduces_factors() const { return false; }
  /// Replaces layer `layer`'s batch estimate of factor `factor` ('A' or 'G'), in place, after
  /// it is computed and before K-FAC symmetrizes it, folds it into the running average and
  /// checks it (D-KFAC: its mean over the ranks). Enqueue on `space` or fence; keep no
  /// reference to `batch`. An exception leaves the factor unchanged.
  virtual void reduce_factor(const execution_space &space, const factor_matrix_type &batch,
                             std::size_t layer, char factor) {
    (void)space;
    (void)batch;
    (void)layer;
    (void)factor;
  }

  /// Whether this process computes the decomposition of factor `factor` ('A' or 'G') of a
  /// layer it builds (KAISA: one rank per factor). A factor not computed here gets its
  /// decomposition through share_decomposition(), or none. Asked on every decomposition.
  virtual bool computes_decomposition(std::size_t layer, char factor) const {
    (void)layer;
    (void)factor;
    return true;
  }

  /// Whether agree_on_failures() is called. With an agreement, every process takes part on
  /// every inv_update_steps step (and in KFAC::load_state()) even with nothing to decompose,
  /// and on the steps between until the last agreement found every factor's decomposition
  /// held somewhere (after a failed first decomposition; once after KFAC::load_state_dict()
  /// or set_strategy()); a failure throws only after it.
  virtual bool agrees_on_failures() const { return false; }
  /// Replaces `failures.failed` and `failures.held` by their element-wise maxima over the
  /// processes and `failures.message` by the first failed factor's message as its process
  /// wrote it; then every process throws the same NumericalError (or, with
  /// keep_previous_on_failure, keeps the previous decompositions of the failed factors). From
  /// `held`, every process knows which factors have a decomposition somewhere.
  virtual void agree_on_failures(const execution_space &space, Failures &failures) {
    (void)space;
    (void)failures;
  }

  /// Called, after the agreement, for each decomposed layer in registration order, 'A' then
  /// 'G', except a failed factor; may fill `f`'s decomposition from another process through
  /// KroneckerFactor::receive_eigen() / receive_inverse() and their commits (KAISA).
  virtual void share_decomposition(const execution_space &space, std::size_t layer, char factor,
                                   factor_type &f) {
    (void)space;
    (void)layer;
    (void)factor;
    (void)f;
  }

  /// Whether share_gradient() is called. Then P is computed for each layer built here with
  /// decompositions (P = ∇ for one without), share_gradient() is called for every registered
  /// layer, and every layer counts as preconditioned (KL clip over all of them). With
  /// agrees_on_failures(), a layer whose decomposition of A or G no process held at the last
  /// agreement is left to the base optimizer on every process instead (no share_gradient()
  /// for it), as a layer without decompositions is without sharing.
  virtual bool shares_gradients() const { return false; }
  /// Leaves layer `layer`'s preconditioned gradient in `p` (DP-KFAC, KAISA MEM-OPT and
  /// HYBRID-OPT: broadcast from a process that computed it). `p` holds this process's P for a
  /// layer it preconditioned, unspecified values otherwise.
  virtual void share_gradient(const execution_space &space, std::size_t layer,
                              const inverse_matrix_type &p) {
    (void)space;
    (void)layer;
    (void)p;
  }

  /// What this strategy communicates and stores on this process (zero for the local one).
  virtual Report report() const {
    Report r;
    r.name = name();
    return r;
  }
};

/// The local (single-process) strategy: KFAC's default; builds, decomposes and preconditions
/// every layer alone and communicates nothing.
template <class KFACType> class KFACLocalStrategy final : public KFACStrategy<KFACType> {};

} // namespace kat::precond
