#pragma once
/// @file
/// @brief kat::distributed::DPKFAC: distributed K-FAC in the DP-KFAC strategy (docs/algorithms.md
/// section 2): each layer's factors are built, from its own local batch only, and decomposed
/// by one rank, which preconditions the layer's gradient and broadcasts P; the other ranks
/// keep no factors for that layer. Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/kfac/dpkfac.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/kfac/detail/decomposition_agreement.hpp"
#include "kat/distributed/kfac/detail/factored_guard.hpp"
#include "kat/distributed/kfac/detail/gradient_broadcast.hpp"
#include "kat/distributed/kfac/detail/strategy_common.hpp"
#include "kat/precond/kfac_strategy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kat::distributed {

/// How DPKFAC assigns layers to ranks.
enum class LayerAssignment {
  /// Layer l (registration order) goes to rank l mod P.
  round_robin,
  /// Contiguous blocks balanced by cost c_l = d_A³ + d_G³ (the decompositions' work): with
  /// C = Σ c_l and S_l = Σ_{k<l} c_k, layer l goes to rank min(P − 1, ⌊P (S_l + c_l/2) / C⌋),
  /// the rank whose share [r C/P, (r+1) C/P) holds the layer's cost midpoint.
  balanced
};

/// Settings of DPKFAC; must be the same on every rank.
struct DPKFACOptions {
  /// How layers are assigned to ranks (round robin or balanced by cost).
  LayerAssignment assignment = LayerAssignment::round_robin;
  /// Broadcast P in the model's Scalar instead of K-FAC's InverseScalar (default true). The
  /// update is applied to a Scalar gradient anyway, and with a float model and double
  /// inverses this halves the volume. The owner rounds its P to Scalar as well, so every rank
  /// computes the KL clip from, and applies, the same P. No effect when the two types agree.
  bool model_precision_broadcast = true;
};

/// What one rank's DPKFAC did since construction or reset_stats().
struct DPKFACStats {
  /// K-FAC steps whose P were broadcast (share_gradient() ran for layer 0: each broadcasts
  /// the P of every layer with a decomposition somewhere once).
  std::uint64_t steps = 0;
  /// The P broadcasts: calls and payload bytes, taken from the Communicator's broadcast
  /// counter around each one (element count x the size of the broadcast scalar per call, on
  /// every rank, root included). Per step: L calls and DPKFAC::bytes_per_step() bytes (less
  /// while a layer has no decomposition on any rank: it is not broadcast).
  CollectiveCounter broadcast;
  /// The agreement on decomposition failures (KFACStrategy::agree_on_failures), per
  /// decomposition step (and on the steps between until every decomposition is held on some rank,
  /// and once after a load) one all-reduce of 2L int32 (8L bytes), plus, when a decomposition
  /// failed, two broadcasts of the owner's message.
  CollectiveCounter decomposition_agreement;
};

/// DP-KFAC: a kat::precond::KFACStrategy that gives each of a KFAC's layers to one rank
/// (builds_factors(), by `assignment`) and broadcasts each layer's preconditioned gradient P
/// from its owner (share_gradient()). The owner of layer l records a and g
/// of its own local batch, builds A and G from them alone (no factor communication), decomposes
/// them and computes P from the gradient that DataParallel has already averaged; every other
/// rank records nothing for l, allocates no factor or decomposition for it and receives P.
/// K-FAC then computes ν of the KL clip from Σ over all layers of P ⊙ ∇ on every rank (the
/// same P and averaged ∇ everywhere), so every rank applies the same update.
///
///     kat::precond::KFAC<float, Mem> kfac(options);
///     kfac.register_model(model);
///     kat::distributed::DPKFAC<kat::precond::KFAC<float, Mem>> dpkfac(comm, kfac); // kfac's
///     strategy
///     ... forward, backward, dp.finish(space); kfac.step(space); sgd.step(...);
///
/// Register every layer before constructing it (the assignment is computed from the
/// registered layers), on every rank the same layers in the same order, and call
/// KFAC::step() on the same steps: share_gradient() is collective. A decomposition that fails
/// on a layer's owner is agreed on by every rank before any P is broadcast
/// (agree_on_failures()): without keep_previous_on_failure every rank throws the same
/// NumericalError (naming the layer, the factor, the step and the owner's rank); with it the
/// owner keeps the previous decomposition. The constructor sets this object as the KFAC's
/// strategy (KFAC::set_strategy); the destructor restores the local one, which makes every
/// layer owned again. Neither copyable nor movable; the Communicator and the KFAC must outlive
/// it.
///
/// Source: "Scalable K-FAC Training for Deep Neural Networks With Distributed Preconditioning"
/// (IEEE TCC 2022; reference code lzhangbv/kfac_pytorch), docs/algorithms.md section 2.
///
/// @tparam KFACType  a kat::precond::KFAC instantiation.
template <class KFACType> class DPKFAC : public precond::KFACStrategy<KFACType> {
public:
  using kfac_type = KFACType;                                 ///< the KFAC served
  using execution_space = typename KFACType::execution_space; ///< where the packing kernels run
  /// A preconditioned gradient: out x (in+1).
  using inverse_matrix_type = typename KFACType::inverse_matrix_type;
  /// The decompositions' precision.
  using inverse_scalar_type = typename inverse_matrix_type::non_const_value_type;
  using scalar_type = typename KFACType::scalar_type;   ///< the model's scalar
  using memory_space = typename KFACType::memory_space; ///< where the factors live
  using Options = DPKFACOptions;                        ///< the settings (DPKFACOptions)
  using Stats = DPKFACStats;                            ///< the counters (DPKFACStats)
  /// What a decomposition step found on this rank.
  using Failures = precond::KFACDecompositionFailures;

  /// Assigns the layers of `kfac` to the ranks of `comm` and sets this object as its strategy
  /// (replacing any strategy it had).
  /// @throws ValueError if kfac.options().factored_preconditioning is set.
  DPKFAC(Communicator &comm, KFACType &kfac, Options options = Options())
      : comm_(comm), kfac_(kfac), options_(options),
        owners_(owners(layer_costs(kfac), comm.size(), options.assignment)),
        gradients_(options.model_precision_broadcast, "kat::distributed::DPKFAC::narrow") {
    detail::reject_factored(kfac_, "DPKFAC");
    kfac_.set_strategy(this);
  }
  DPKFAC(const DPKFAC &) = delete;
  DPKFAC &operator=(const DPKFAC &) = delete;
  /// Restores the KFAC's local strategy (if this one is still set).
  ~DPKFAC() override { detail::release_strategy(kfac_, this); }

  /// "DP-KFAC".
  std::string name() const override { return "DP-KFAC"; }
  /// Whether this rank owns registered layer i (owner(i) == this rank).
  bool builds_factors(std::size_t layer) const override {
    return layer < owners_.size() && owners_[layer] == comm_.rank();
  }
  /// true: decomposition failures are agreed on over the communicator.
  bool agrees_on_failures() const override { return true; }
  /// One all-reduce of the 2L failure flags (max), plus, when one failed, two broadcasts of
  /// the owner's message (stats().decomposition_agreement). Collective.
  void agree_on_failures(const execution_space &, Failures &failures) override {
    ++agreements_;
    detail::agree_on_decompositions(
        comm_, failures, [this](std::size_t layer, char) { return owners_.at(layer); },
        stats_.decomposition_agreement);
  }
  /// true: P is broadcast from each layer's owner.
  bool shares_gradients() const override { return true; }
  /// Broadcasts layer `layer`'s P from its owner (in Scalar with model_precision_broadcast,
  /// the owner's P rounded too). Collective. @throws MPIError from the broadcast.
  void share_gradient(const execution_space &space, std::size_t layer,
                      const inverse_matrix_type &p) override {
    broadcast(space, layer, p);
  }
  /// bytes_per_step(), bytes_per_agreement() per decomposition step, the counters (stats())
  /// and workspace_bytes().
  precond::KFACStrategyReport report() const override {
    precond::KFACStrategyReport r;
    r.name = name();
    r.bytes_per_decomposition_update = bytes_per_agreement();
    r.bytes_per_step = bytes_per_step();
    r.decomposition_updates = agreements_;
    r.steps = stats_.steps;
    r.gradient_sharing = {stats_.broadcast.calls, stats_.broadcast.bytes};
    r.agreement = {stats_.decomposition_agreement.calls, stats_.decomposition_agreement.bytes};
    r.workspace_bytes = workspace_bytes();
    return r;
  }

  /// The options given at construction.
  const Options &options() const { return options_; }
  /// Counters since construction or reset_stats().
  const Stats &stats() const { return stats_; }
  /// Sets the counters to 0.
  void reset_stats() {
    stats_ = Stats();
    agreements_ = 0;
  }

  /// The agreement's all-reduce payload of one decomposition step: 2L · sizeof(std::int32_t)
  /// (DPKFACStats::decomposition_agreement; no decomposition failed).
  std::size_t bytes_per_agreement() const { return detail::agreement_bytes(kfac_); }

  /// The owning rank of each registered layer.
  const std::vector<int> &owners() const { return owners_; }
  /// The owning rank of registered layer i.
  int owner(std::size_t i) const { return owners_.at(i); }
  /// Number of layers this rank owns.
  std::size_t owned_layers() const {
    std::size_t n = 0;
    for (const int o : owners_)
      n += o == comm_.rank() ? 1 : 0;
    return n;
  }

  /// Cost of each registered layer for the balanced assignment: d_A³ + d_G³.
  static std::vector<double> layer_costs(const KFACType &kfac) {
    std::vector<double> costs;
    for (std::size_t i = 0; i < kfac.size(); ++i) {
      const double a = static_cast<double>(kfac.factor_a(i).dim());
      const double g = static_cast<double>(kfac.factor_g(i).dim());
      costs.push_back(a * a * a + g * g * g);
    }
    return costs;
  }

  /// The owner of each layer given the layers' costs (LayerAssignment documents the rules).
  /// @throws ValueError if ranks < 1 or a cost is negative or not finite.
  static std::vector<int> owners(const std::vector<double> &costs, int ranks,
                                 LayerAssignment assignment) {
    if (ranks < 1) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::DPKFAC: the number of ranks must be >= 1, got ", ranks));
    }
    std::vector<int> out(costs.size(), 0);
    double total = 0;
    for (const double c : costs) {
      if (!(c >= 0.0 && std::isfinite(c))) {
        throw ValueError(kat::detail::concat(
            "kat::distributed::DPKFAC: layer costs must be finite and >= 0, got ", c));
      }
      total += c;
    }
    double before = 0;
    for (std::size_t l = 0; l < costs.size(); ++l) {
      if (assignment == LayerAssignment::round_robin) {
        out[l] = static_cast<int>(l % static_cast<std::size_t>(ranks));
      } else {
        const double mid = total > 0.0 ? (before + 0.5 * costs[l]) / total : 0.0;
        const auto r = static_cast<long long>(std::floor(mid * ranks));
        out[l] = static_cast<int>(std::min<long long>(ranks - 1, std::max<long long>(0, r)));
      }
      before += costs[l];
    }
    return out;
  }

  /// The analytic broadcast payload of one step, in the units of CommunicatorStats:
  /// Σ over the registered layers of out·(in+1), times sizeof(Scalar) with
  /// model_precision_broadcast, sizeof(InverseScalar) without.
  static std::size_t bytes_per_step(const KFACType &kfac, const Options &options = Options()) {
    return detail::gradient_entries(kfac) *
           (options.model_precision_broadcast ? sizeof(scalar_type) : sizeof(inverse_scalar_type));
  }
  /// bytes_per_step of this KFAC and options.
  std::size_t bytes_per_step() const { return bytes_per_step(kfac_, options_); }
  /// Bytes of the Scalar staging buffer for model_precision_broadcast (0 until the first
  /// step, or when Scalar and InverseScalar agree).
  std::size_t workspace_bytes() const { return gradients_.workspace_bytes(); }

private:
  void broadcast(const execution_space &space, std::size_t layer, const inverse_matrix_type &p) {
    ScopedRegion region("kat::distributed::DPKFAC::broadcast");
    if (layer == 0) {
      ++stats_.steps;
    }
    const int root = owners_.at(layer);
    detail::count_broadcasts(comm_, stats_.broadcast,
                             [&] { gradients_.broadcast(space, comm_, p, root); });
  }

  Communicator &comm_;
  KFACType &kfac_;
  Options options_;
  std::vector<int> owners_;
  detail::GradientBroadcast<scalar_type, memory_space> gradients_;
  Stats stats_;
  std::uint64_t agreements_ = 0;
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
