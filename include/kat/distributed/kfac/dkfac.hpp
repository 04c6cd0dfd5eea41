#pragma once
/// @file
/// @brief kat::distributed::DKFAC: distributed K-FAC in the D-KFAC strategy (docs/algorithms.md
/// section 2): every rank builds every factor from its local batch, the batch estimates are
/// averaged over the ranks, and every rank decomposes every factor and preconditions every layer.
/// Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/kfac/dkfac.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/kfac/detail/factored_guard.hpp"
#include "kat/distributed/kfac/packed_symmetric.hpp"
#include "kat/precond/kfac_strategy.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kat::distributed {

/// Settings of DKFAC; must be the same on every rank.
struct DKFACOptions {
  /// true (default, "symmetry aware" as in KAISA): each batch estimate is symmetrized and only
  /// its upper triangle, d(d+1)/2 entries packed into a contiguous buffer, is all-reduced and
  /// then unpacked into both triangles. false: the whole d x d matrix is all-reduced (and
  /// symmetrized by K-FAC afterwards). Both give the same factors up to rounding (the same
  /// bits whenever the batch estimate is exactly symmetric, as xᵀx from BLAS is); the
  /// symmetric form sends about half the bytes.
  bool symmetric_communication = true;
};

/// What one rank's DKFAC did since construction or reset_stats().
struct DKFACStats {
  /// Factor updates (K-FAC steps that updated factors and so called reduce_factor()).
  std::uint64_t factor_updates = 0;
  /// Batch estimates averaged (2 per layer per factor update).
  std::uint64_t factors = 0;
  /// The factor all-reduces: calls and payload bytes, taken from the Communicator's allreduce
  /// counter around each one (see CommunicatorStats: element count x sizeof(FactorScalar) per
  /// call). Per factor update: Σ_layers (d_A(d_A+1)/2 + d_G(d_G+1)/2) · sizeof(FactorScalar)
  /// with symmetric_communication, Σ_layers (d_A² + d_G²) · sizeof(FactorScalar) without.
  CollectiveCounter allreduce;
};

/// D-KFAC: a kat::precond::KFACStrategy that replaces each layer's batch estimate F_new by its
/// mean over the ranks of `comm` (reduce_factor()) before K-FAC folds it into the running
/// average; everything else is local. With DataParallel averaging the gradients before K-FAC runs,
/// every rank then holds the same factors, decompositions and preconditioned gradients, and
/// P ranks with B/P samples each compute what one process computes on the concatenated batch
/// of B samples (for A = aᵀa/rows exactly; for G of a batch-mean loss, G_r = N_r² g_rᵀg_r /
/// rows_r averaged over ranks equals the concatenated G when every rank has the same number
/// of samples, which DistributedSampler guarantees).
///
///     kat::precond::KFAC<float, Mem> kfac(options);
///     kfac.register_model(model);
///     kat::distributed::DKFAC<kat::precond::KFAC<float, Mem>> dkfac(comm, kfac); // kfac's
///     strategy
///     ... forward, backward, dp.finish(space); kfac.step(space); sgd.step(...);
///
/// Every rank must register the same layers (same dimensions, same order) and call
/// KFAC::step() on the same steps: reduce_factor() is collective. The constructor sets this
/// object as the KFAC's strategy (KFAC::set_strategy), the destructor restores the local one.
/// Neither copyable nor movable (the KFAC refers to this object); the Communicator and the KFAC
/// must outlive it.
///
/// Source: the baseline distributed K-FAC of KAISA (Pauloski et al., SC'20, SC'21) and of DP-KFAC
/// ("Scalable K-FAC Training for Deep Neural Networks With Distributed Preconditioning", IEEE
/// TCC 2022); docs/algorithms.md section 2.
///
/// @tparam KFACType  a kat::precond::KFAC instantiation.
template <class KFACType> class DKFAC : public precond::KFACStrategy<KFACType> {
public:
  using kfac_type = KFACType;                                 ///< the KFAC served
  using execution_space = typename KFACType::execution_space; ///< where the packing kernels run
  using memory_space = typename KFACType::memory_space;       ///< where the factors live
  using factor_scalar_type = typename KFACType::factor_scalar_type; ///< the factors' precision
  using factor_matrix_type = typename KFACType::factor_matrix_type; ///< a batch estimate: dim x dim
  using Options = DKFACOptions;                                     ///< the settings (DKFACOptions)
  using Stats = DKFACStats;                                         ///< the counters (DKFACStats)

  /// Sets this object as the strategy of `kfac` (replacing any strategy it had).
  /// @throws ValueError if kfac.options().factored_preconditioning is set.
  DKFAC(Communicator &comm, KFACType &kfac, Options options = Options())
      : comm_(comm), kfac_(kfac), options_(options) {
    detail::reject_factored(kfac_, "DKFAC");
    kfac_.set_strategy(this);
  }
  DKFAC(const DKFAC &) = delete;
  DKFAC &operator=(const DKFAC &) = delete;
  /// Restores the KFAC's local strategy (if this one is still set).
  ~DKFAC() override {
    if (&kfac_.strategy() == this) {
      kfac_.set_strategy(nullptr);
    }
  }

  /// "D-KFAC".
  std::string name() const override { return "D-KFAC"; }
  /// true: every batch estimate is averaged over the ranks.
  bool reduces_factors() const override { return true; }
  /// Replaces `batch` (dim x dim) by its mean over the ranks: its symmetrized upper triangle
  /// packed and all-reduced (symmetric_communication), or the whole matrix. Collective.
  /// @throws MPIError from the all-reduce.
  void reduce_factor(const execution_space &space, const factor_matrix_type &batch,
                     std::size_t layer, char factor) override {
    average(space, batch, layer, factor);
  }
  /// bytes_per_factor_update(), the all-reduce counters (stats()) and workspace_bytes().
  precond::KFACStrategyReport report() const override {
    precond::KFACStrategyReport r;
    r.name = name();
    r.bytes_per_factor_update = bytes_per_factor_update();
    r.factor_updates = stats_.factor_updates;
    r.factor_reduction = {stats_.allreduce.calls, stats_.allreduce.bytes};
    r.workspace_bytes = workspace_bytes();
    return r;
  }

  /// The options given at construction.
  const Options &options() const { return options_; }
  /// Counters since construction or reset_stats().
  const Stats &stats() const { return stats_; }
  /// Sets the counters to 0.
  void reset_stats() { stats_ = Stats(); }

  /// The analytic all-reduce payload of one factor update, in the units of
  /// CommunicatorStats (bytes this rank hands to MPI): Σ over the registered layers of
  /// d(d+1)/2 (symmetric) or d² (full) entries of A and G, times sizeof(FactorScalar).
  static std::size_t bytes_per_factor_update(const KFACType &kfac, bool symmetric) {
    std::size_t entries = 0;
    for (std::size_t i = 0; i < kfac.size(); ++i) {
      for (const std::size_t d : {kfac.factor_a(i).dim(), kfac.factor_g(i).dim()}) {
        entries += symmetric ? d * (d + 1) / 2 : d * d;
      }
    }
    return entries * sizeof(factor_scalar_type);
  }
  /// bytes_per_factor_update of this KFAC with this object's option.
  std::size_t bytes_per_factor_update() const {
    return bytes_per_factor_update(kfac_, options_.symmetric_communication);
  }

  /// Bytes of the packing buffer (symmetric_communication), for per-rank memory accounting.
  std::size_t workspace_bytes() const { return packed_.span() * sizeof(factor_scalar_type); }

private:
  void average(const execution_space &space, const factor_matrix_type &batch, std::size_t layer,
               char factor) {
    ScopedRegion region("kat::distributed::DKFAC::average");
    if (layer == 0 && factor == 'A') {
      ++stats_.factor_updates;
    }
    ++stats_.factors;
    const CollectiveCounter before = comm_.stats().allreduce;
    if (!options_.symmetric_communication) {
      comm_.average(space, batch);
    } else {
      average_upper(space, batch);
    }
    const CollectiveCounter after = comm_.stats().allreduce;
    stats_.allreduce.calls += after.calls - before.calls;
    stats_.allreduce.bytes += after.bytes - before.bytes;
  }

  /// Packs (b(i, j) + b(j, i)) / 2 for i <= j column by column (entry j(j+1)/2 + i), averages
  /// the packed buffer, and writes each mean back to (i, j) and (j, i).
  void average_upper(const execution_space &space, const factor_matrix_type &batch) {
    const std::size_t d = batch.extent(0);
    const std::size_t n = d * (d + 1) / 2;
    if (packed_.extent(0) < n) {
      packed_ = Vector<factor_scalar_type, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::distributed::DKFAC::packed"), n);
    }
    const auto packed = Kokkos::subview(packed_, Kokkos::make_pair(std::size_t(0), n));
    detail::pack_upper(space, batch, packed);
    comm_.average(space, packed);
    detail::unpack_upper(space, packed, batch);
  }

  Communicator &comm_;
  KFACType &kfac_;
  Options options_;
  Stats stats_;
  Vector<factor_scalar_type, memory_space> packed_;
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
