#pragma once
/// @file
/// @brief kat::distributed::KAISA: distributed K-FAC in the KAISA strategy (docs/algorithms.md
/// section 2; Pauloski et al. 2021, "KAISA: An Adaptive Second-Order Optimizer Framework for Deep
/// Neural Networks", SC'21): factors averaged over the ranks as in D-KFAC, each factor's
/// decomposition computed by one rank chosen by a greedy least-loaded rule, and, by
/// grad_worker_fraction f, f·P gradient workers per layer: every rank preconditioning every
/// layer (COMM-OPT, f = 1, decompositions broadcast), one rank per layer preconditioning it
/// and broadcasting P (MEM-OPT, f = 1/P), or a grid of gradient-worker groups in between
/// (HYBRID-OPT). Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/kfac/kaisa.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/kfac/detail/decomposition_agreement.hpp"
#include "kat/distributed/kfac/detail/gradient_broadcast.hpp"
#include "kat/distributed/kfac/detail/strategy_common.hpp"
#include "kat/distributed/kfac/dkfac.hpp"
#include "kat/distributed/kfac/packed_symmetric.hpp"
#include "kat/precond/kfac.hpp"
#include "kat/precond/kfac_strategy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kat::distributed {

/// The cost of decomposing a d x d factor for KAISA's greedy assignment.
enum class AssignmentCost {
  compute, ///< d³ (the decomposition's work)
  memory   ///< d² (the decomposition's size)
};

/// Settings of KAISA; must be the same on every rank.
struct KAISAOptions {
  /// f: the fraction of the P ranks that precondition each layer. gw = f·P gradient workers
  /// per layer must be an integer that divides P (f·P compared with the nearest integer with
  /// a relative tolerance of 1e-9): f = 1 is COMM-OPT, f = 1/P MEM-OPT (at P = 1 both are 1:
  /// COMM-OPT), any other k/P with k a divisor of P HYBRID-OPT (e.g. 1/2 at P = 4).
  double grad_worker_fraction = 1.0;
  /// How layers are balanced over the ranks: by decomposition work d³ (default) or size d².
  AssignmentCost assignment_cost = AssignmentCost::compute;
  /// As DKFACOptions::symmetric_communication (the factor all-reduce sends the upper
  /// triangle only).
  bool symmetric_communication = true;
  /// MEM-OPT and HYBRID-OPT: broadcast P in the model's Scalar instead of K-FAC's
  /// InverseScalar (default true), as DPKFACOptions::model_precision_broadcast: the update is
  /// applied to a Scalar gradient anyway, and with a float model and double inverses this
  /// halves the volume. The gradient workers round their own P to Scalar as well, so every
  /// rank computes the KL clip from, and applies, the same P. No effect when the two types
  /// agree, nor in COMM-OPT (no P is broadcast).
  bool model_precision_broadcast = true;
};

/// KAISA's assignment of L layers on P ranks with gw gradient workers per layer
/// (KAISA::assign_layers()); each vector has one entry per layer, in registration order.
struct KAISAAssignment {
  /// The worker group (0 … P/gw − 1; ranks g·gw … g·gw + gw − 1) that preconditions the layer.
  std::vector<int> worker_group;
  /// The rank (global, in the layer's worker group) that decomposes the layer's A.
  std::vector<int> a_owner;
  /// The rank (global, in the layer's worker group) that decomposes the layer's G.
  std::vector<int> g_owner;
};

/// What one rank's KAISA did since construction or reset_stats(). Bytes are as
/// CommunicatorStats counts them: per rank, per broadcast call, the payload, on the root as on
/// the receivers.
struct KAISAStats {
  /// Decomposition steps of this rank's worker group (share_decomposition() broadcast factor
  /// 'A' of the group's first layer; COMM-OPT: layer 0). 0 in MEM-OPT (nothing shared) and on a
  /// rank whose worker group has no layer.
  std::uint64_t decomposition_updates = 0;
  /// K-FAC steps whose P were broadcast (MEM-OPT and HYBRID-OPT; share_gradient() ran
  /// for layer 0).
  std::uint64_t steps = 0;
  /// COMM-OPT and HYBRID-OPT: the broadcasts of the decompositions (Q and d, or the symmetric
  /// inverse as its packed upper triangle) within this rank's worker group: per
  /// decomposition step Σ over the 2·L_g factors of the L_g layers of this rank's worker
  /// group of (d² + d) (eigen) or d(d+1)/2 (inverse) · sizeof(InverseScalar) (COMM-OPT: all
  /// 2L factors). Zero in MEM-OPT.
  CollectiveCounter decomposition_broadcast;
  /// MEM-OPT and HYBRID-OPT: the P broadcasts within this rank's receiver group, per step
  /// Σ over all L layers of out·(in+1)·sizeof(Scalar) (model_precision_broadcast) or
  /// sizeof(InverseScalar). Zero in COMM-OPT.
  CollectiveCounter gradient_broadcast;
  /// The agreement on decomposition failures (KFACStrategy::agree_on_failures), on the
  /// whole communicator: per decomposition step (and on the steps between until every
  /// decomposition is held on some rank, and once after a load) one all-reduce of 2L int32 (8L
  /// bytes), plus, when a decomposition failed, two broadcasts of the owner's message.
  CollectiveCounter decomposition_agreement;
};

/// KAISA (Pauloski et al. 2021, "KAISA: An Adaptive Second-Order Optimizer Framework for Deep
/// Neural Networks", SC'21): a kat::precond::KFACStrategy made of
///
/// - D-KFAC's factor averaging (reduce_factor() through a kat::distributed::DKFAC member, same
///   option symmetric_communication), so every rank holds the same factors;
/// - a grid of the P ranks by gw = grad_worker_fraction·P (grad_workers()): P/gw
///   **gradient-worker groups** of gw consecutive ranks (group g: ranks g·gw … g·gw + gw − 1,
///   worker_group_of()) and gw **receiver groups** (receiver group j: the ranks j, j + gw,
///   j + 2gw, …, receiver_group_of());
/// - an assignment (assign(), the same on every rank): (1) the L layers (cost
///   cost(d_A) + cost(d_G)) go to the P/gw worker groups (layer_worker_group()); (2) within
///   each group, the 2·L_g factors of its layers (A and G separately, cost cost(d), in the
///   order A then G of each layer, layers in registration order) go to the group's gw ranks;
///   decomposition_owner() gives the rank (computes_decomposition()). With
///   gw = P (COMM-OPT) step (2) assigns all 2L factors over all ranks; with gw = 1 (MEM-OPT)
///   step (1) assigns the layers over all ranks and the layer's rank decomposes both factors;
/// - COMM-OPT and HYBRID-OPT: share_decomposition()
///   broadcasts each decomposition from its owner to the other ranks of the layer's worker
///   group (a sub-communicator made by Communicator::split in the constructor; COMM-OPT: the
///   whole communicator): eigenvectors and eigenvalues as they are, an inverse (symmetric)
///   as its packed upper triangle (d(d+1)/2 entries, kat::distributed::detail::pack_upper).
///   Ranks outside the group return at once and keep no decomposition of that layer (they
///   keep its factors: the factor all-reduce needs them);
/// - MEM-OPT and HYBRID-OPT: shares_gradients(), share_gradient(). The ranks of
///   the layer's worker group precondition it (on the other ranks the layer has no
///   decomposition, so KFAC puts P = ∇ in its buffer); then, in each receiver group, the member
///   that belongs to the layer's worker group broadcasts its P over the others' buffers
///   (MEM-OPT: over the whole communicator, from the layer's single gradient worker), in the
///   model's precision by default (KAISAOptions::model_precision_broadcast).
///
/// All three give the same P as D-KFAC (each decomposer computes from the same averaged
/// factors); a layer no rank has decomposed (keep_previous_on_failure after a failed first
/// decomposition) is left to the base optimizer in all three, as the agreement tells every
/// rank. Every rank must register the same layers in the
/// same order before constructing it (the constructor is collective: it splits the communicator in
/// HYBRID-OPT) and call KFAC::step() on the same steps (the strategy's members are collective).
///
/// A decomposition that fails on its owner is agreed on by every rank before anything is
/// broadcast (agree_on_failures(): one all-reduce of 2L int32 per
/// decomposition step, KAISAStats::decomposition_agreement): without
/// keep_previous_on_failure every rank throws the same NumericalError, naming the layer, the
/// factor, the step and the owner's rank, instead of waiting in a broadcast; with it every
/// rank keeps the previous decomposition. A received decomposition becomes valid only after
/// its broadcast filled it (KroneckerFactor::receive_eigen / commit_received_eigen).
///
/// The constructor sets this object as the KFAC's strategy (KFAC::set_strategy); the destructor
/// restores the local one. Neither copyable nor movable; the Communicator and the KFAC must
/// outlive it.
///
///     kat::distributed::KAISA<kat::precond::KFAC<float, Mem>> kaisa(comm, kfac, options);
///
/// @tparam KFACType  a kat::precond::KFAC instantiation.
template <class KFACType> class KAISA : public precond::KFACStrategy<KFACType> {
public:
  using kfac_type = KFACType;                                 ///< the KFAC served
  using execution_space = typename KFACType::execution_space; ///< where the packing kernels run
  using factor_type = typename KFACType::factor_type; ///< a layer's factor with its decompositions
  /// A preconditioned gradient: out x (in+1).
  using inverse_matrix_type = typename KFACType::inverse_matrix_type;
  /// The decompositions' precision.
  using inverse_scalar_type = typename inverse_matrix_type::non_const_value_type;
  using scalar_type = typename KFACType::scalar_type;   ///< the model's scalar
  using memory_space = typename KFACType::memory_space; ///< where the factors live
  using Options = KAISAOptions;                         ///< the settings (KAISAOptions)
  using Stats = KAISAStats;                             ///< the counters (KAISAStats)
  using Assignment = KAISAAssignment;                   ///< the layers' worker groups and owners
  using factor_matrix_type = typename KFACType::factor_matrix_type; ///< a batch estimate: dim x dim
  /// What a decomposition step found on this rank.
  using Failures = precond::KFACDecompositionFailures;

  /// Which strategy grad_worker_fraction selects: gw = P (COMM-OPT), gw = 1 < P (MEM-OPT),
  /// 1 < gw < P (HYBRID-OPT).
  enum class Mode { comm_opt, mem_opt, hybrid_opt };

  /// Assigns the registered layers (collective on `comm`: in HYBRID-OPT it splits it twice,
  /// into the worker groups and then the receiver groups) and sets this object as the KFAC's
  /// strategy (replacing any strategy it had).
  /// @throws ValueError if grad_worker_fraction·P is not an integer dividing P (naming
  ///   grad_worker_fraction, P and the allowed values), or if
  ///   kfac.options().factored_preconditioning is set (from its DKFAC); MPIError from the splits.
  KAISA(Communicator &comm, KFACType &kfac, Options options = Options())
      : comm_(comm), kfac_(kfac), options_(options),
        grad_workers_(grad_workers(options.grad_worker_fraction, comm.size())),
        mode_(select_mode(options.grad_worker_fraction, comm.size())),
        dkfac_(comm, kfac, DKFACOptions{options.symmetric_communication}),
        gradients_(options.model_precision_broadcast, "kat::distributed::KAISA::narrow") {
    const int rank = comm_.rank();
    const std::size_t layers = kfac_.size();
    std::vector<std::size_t> a_dims, g_dims;
    for (std::size_t i = 0; i < layers; ++i) {
      a_dims.push_back(kfac_.factor_a(i).dim());
      g_dims.push_back(kfac_.factor_g(i).dim());
    }
    Assignment plan =
        assign_layers(a_dims, g_dims, comm_.size(), grad_workers_, options_.assignment_cost);
    layer_groups_ = std::move(plan.worker_group);
    a_owners_ = std::move(plan.a_owner);
    g_owners_ = std::move(plan.g_owner);
    for (std::size_t i = 0; i < layers; ++i) {
      if (layer_groups_[i] == worker_group_of(rank)) {
        first_group_layer_ = std::min(first_group_layer_, i);
      }
    }
    // Sub-communicators, in the same order on every rank (worker groups, then receiver
    // groups); COMM-OPT's worker group and MEM-OPT's receiver group are `comm` itself.
    if (mode_ == Mode::hybrid_opt) {
      worker_comm_.emplace(comm_.split(worker_group_of(rank), rank));
      receiver_comm_.emplace(comm_.split(receiver_group_of(rank), rank));
    }
    kfac_.set_strategy(this);
  }
  KAISA(const KAISA &) = delete;
  KAISA &operator=(const KAISA &) = delete;
  /// Restores the KFAC's local strategy (if this one is still set).
  ~KAISA() override { detail::release_strategy(kfac_, this); }

  /// "KAISA COMM-OPT", "KAISA MEM-OPT" or "KAISA HYBRID-OPT".
  std::string name() const override {
    return mode_ == Mode::comm_opt  ? "KAISA COMM-OPT"
           : mode_ == Mode::mem_opt ? "KAISA MEM-OPT"
                                    : "KAISA HYBRID-OPT";
  }
  /// true: the batch estimates are averaged as in D-KFAC.
  bool reduces_factors() const override { return true; }
  /// DKFAC::reduce_factor(). Collective.
  void reduce_factor(const execution_space &space, const factor_matrix_type &batch,
                     std::size_t layer, char factor) override {
    dkfac_.reduce_factor(space, batch, layer, factor);
  }
  /// Whether this rank is decomposition_owner(layer, factor).
  bool computes_decomposition(std::size_t layer, char factor) const override {
    return decomposition_owner(layer, factor) == comm_.rank();
  }
  /// true: decomposition failures are agreed on over the whole communicator.
  bool agrees_on_failures() const override { return true; }
  /// One all-reduce of the 2L failure flags (max), plus, when one failed, two broadcasts of
  /// the owner's message (stats().decomposition_agreement). Collective.
  void agree_on_failures(const execution_space &, Failures &failures) override {
    ++agreements_;
    detail::agree_on_decompositions(
        comm_, failures,
        [this](std::size_t layer, char factor) { return decomposition_owner(layer, factor); },
        stats_.decomposition_agreement);
  }
  /// COMM-OPT and HYBRID-OPT: broadcasts the decomposition from its owner to the other ranks
  /// of the layer's worker group (the others return at once). MEM-OPT: nothing (the owner is
  /// the layer's only gradient worker). Collective on the worker group.
  void share_decomposition(const execution_space &space, std::size_t layer, char factor,
                           factor_type &f) override {
    if (mode_ != Mode::mem_opt) {
      broadcast_decomposition(space, layer, factor, f);
    }
  }
  /// MEM-OPT and HYBRID-OPT: true (P is broadcast in each receiver group).
  bool shares_gradients() const override { return mode_ != Mode::comm_opt; }
  /// Broadcasts layer `layer`'s P, in this rank's receiver group, from the member of the
  /// layer's worker group. Collective on the receiver group.
  void share_gradient(const execution_space &space, std::size_t layer,
                      const inverse_matrix_type &p) override {
    broadcast_gradient(space, layer, p);
  }
  /// The analytic volumes (bytes_per_factor_update(), bytes_per_decomposition_update() +
  /// bytes_per_agreement(), bytes_per_step()), the counters (stats() and dkfac().stats())
  /// and workspace_bytes().
  precond::KFACStrategyReport report() const override {
    precond::KFACStrategyReport r;
    r.name = name();
    r.bytes_per_factor_update = bytes_per_factor_update();
    r.bytes_per_decomposition_update = bytes_per_decomposition_update() + bytes_per_agreement();
    r.bytes_per_step = bytes_per_step();
    r.factor_updates = dkfac_.stats().factor_updates;
    r.decomposition_updates = agreements_;
    r.steps = stats_.steps;
    const auto traffic = [](const CollectiveCounter &c) {
      return precond::KFACTraffic{c.calls, c.bytes};
    };
    r.factor_reduction = traffic(dkfac_.stats().allreduce);
    r.decomposition_sharing = traffic(stats_.decomposition_broadcast);
    r.gradient_sharing = traffic(stats_.gradient_broadcast);
    r.agreement = traffic(stats_.decomposition_agreement);
    r.workspace_bytes = workspace_bytes();
    return r;
  }
  /// Bytes of this rank's packing and staging buffers: the factor all-reduce's, the packed
  /// inverses' (inverse path) and the Scalar P's (model_precision_broadcast). Each is
  /// allocated on first use.
  std::size_t workspace_bytes() const {
    return dkfac_.workspace_bytes() + packed_.span() * sizeof(inverse_scalar_type) +
           gradients_.workspace_bytes();
  }

  /// The options given at construction.
  const Options &options() const { return options_; }
  /// COMM-OPT, MEM-OPT or HYBRID-OPT, from grad_worker_fraction and P.
  Mode mode() const { return mode_; }
  /// Counters since construction or reset_stats().
  const Stats &stats() const { return stats_; }
  /// The factor averaging (its stats() count the factor all-reduces).
  const DKFAC<KFACType> &dkfac() const { return dkfac_; }
  /// Sets the counters (and the dkfac()'s) to 0.
  void reset_stats() {
    stats_ = Stats();
    agreements_ = 0;
    dkfac_.reset_stats();
  }

  /// gw = grad_worker_fraction·P: the ranks that precondition each layer (the size of a
  /// worker group).
  int grad_workers() const { return grad_workers_; }
  /// P/gw: the number of worker groups (= the size of a receiver group).
  int worker_groups() const { return comm_.size() / grad_workers_; }
  /// The worker group of `rank`: rank / gw (its ranks: g·gw … g·gw + gw − 1).
  /// @throws ValueError unless 0 <= rank < P.
  int worker_group_of(int rank) const { return checked_rank(rank) / grad_workers_; }
  /// The receiver group of `rank`: rank mod gw (its ranks: j, j + gw, j + 2gw, …, P − gw + j).
  /// @throws ValueError unless 0 <= rank < P.
  int receiver_group_of(int rank) const { return checked_rank(rank) % grad_workers_; }
  /// The worker group that decomposes and preconditions registered layer i.
  int layer_worker_group(std::size_t layer) const { return layer_groups_.at(layer); }
  /// Whether `rank` preconditions registered layer i (it is in the layer's worker group).
  bool is_gradient_worker(std::size_t layer, int rank) const {
    return worker_group_of(rank) == layer_worker_group(layer);
  }

  /// The rank that decomposes factor 'A' or 'G' of registered layer i.
  int decomposition_owner(std::size_t layer, char factor) const {
    return factor == 'A' ? a_owners_.at(layer) : g_owners_.at(layer);
  }
  /// MEM-OPT: the rank that preconditions layer i (= the owner of both its decompositions);
  /// COMM-OPT and HYBRID-OPT: -1 (more than one; see layer_worker_group()).
  int gradient_worker(std::size_t layer) const {
    return mode_ == Mode::mem_opt ? a_owners_.at(layer) : -1;
  }

  /// d³ (compute) or d² (memory).
  static double cost(std::size_t dim, AssignmentCost c) {
    const double d = static_cast<double>(dim);
    return c == AssignmentCost::compute ? d * d * d : d * d;
  }

  /// The greedy least-loaded rule: work items in order of decreasing cost (ties: lower index
  /// first) each go to the rank with the least load so far (ties: lower rank), which then
  /// gains the item's cost. Returns the rank of each item, in the input order.
  /// @throws ValueError if ranks < 1 or a cost is negative or not finite.
  static std::vector<int> assign(const std::vector<double> &costs, int ranks) {
    if (ranks < 1) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::KAISA: the number of ranks must be >= 1, got ", ranks));
    }
    for (const double c : costs) {
      if (!(c >= 0.0 && std::isfinite(c))) {
        throw ValueError(kat::detail::concat(
            "kat::distributed::KAISA: work costs must be finite and >= 0, got ", c));
      }
    }
    std::vector<std::size_t> order(costs.size());
    std::iota(order.begin(), order.end(), std::size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return costs[x] > costs[y]; });
    std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
    std::vector<int> out(costs.size(), 0);
    for (const std::size_t item : order) {
      const auto least = std::min_element(load.begin(), load.end()) - load.begin();
      out[item] = static_cast<int>(least);
      load[static_cast<std::size_t>(least)] += costs[item];
    }
    return out;
  }

  /// KAISA's assignment (the constructor's, the same on every rank) of the layers with factor
  /// dimensions a_dims[i] (A, in+1) and g_dims[i] (G, out) on `ranks` ranks with
  /// `grad_workers` = gw per layer: (1) assign() of the layer costs cost(d_A) + cost(d_G)
  /// over the ranks/gw worker groups; (2) for each group g, assign() of the costs cost(d) of
  /// its layers' factors, in the order A_i, G_i for its layers i in increasing i, over its gw
  /// ranks (local rank k is global rank g·gw + k). gw = ranks gives COMM-OPT's assignment of
  /// the 2L factors (A_0, G_0, A_1, …) over all ranks; gw = 1 MEM-OPT's assignment of the
  /// layers over all ranks, with a_owner = g_owner.
  /// @throws ValueError if a_dims and g_dims differ in length, ranks < 1, or grad_workers is
  ///   not a divisor of ranks.
  static Assignment assign_layers(const std::vector<std::size_t> &a_dims,
                                  const std::vector<std::size_t> &g_dims, int ranks,
                                  int grad_workers, AssignmentCost c) {
    if (a_dims.size() != g_dims.size()) {
      throw ValueError(kat::detail::concat("kat::distributed::KAISA::assign_layers: a_dims and "
                                           "g_dims must have the same length, got ",
                                           a_dims.size(), " and ", g_dims.size()));
    }
    if (ranks < 1 || grad_workers < 1 || grad_workers > ranks || ranks % grad_workers != 0) {
      throw ValueError(
          kat::detail::concat("kat::distributed::KAISA::assign_layers: grad_workers must "
                              "be a divisor of ranks >= 1, got grad_workers = ",
                              grad_workers, " and ranks = ", ranks));
    }
    const std::size_t layers = a_dims.size();
    const int groups = ranks / grad_workers;
    Assignment out;
    std::vector<double> layer_costs;
    for (std::size_t i = 0; i < layers; ++i) {
      layer_costs.push_back(cost(a_dims[i], c) + cost(g_dims[i], c));
    }
    out.worker_group = assign(layer_costs, groups);
    out.a_owner.assign(layers, 0);
    out.g_owner.assign(layers, 0);
    for (int g = 0; g < groups; ++g) {
      std::vector<std::size_t> members;
      std::vector<double> costs;
      for (std::size_t i = 0; i < layers; ++i) {
        if (out.worker_group[i] == g) {
          members.push_back(i);
          costs.push_back(cost(a_dims[i], c));
          costs.push_back(cost(g_dims[i], c));
        }
      }
      const std::vector<int> local = assign(costs, grad_workers);
      for (std::size_t k = 0; k < members.size(); ++k) {
        out.a_owner[members[k]] = g * grad_workers + local[2 * k];
        out.g_owner[members[k]] = g * grad_workers + local[2 * k + 1];
      }
    }
    return out;
  }

  /// gw = f·ranks, the gradient workers per layer.
  /// @throws ValueError if ranks < 1, or unless f·ranks is within a relative 1e-9 of an
  ///   integer k that divides ranks (f = k/ranks; the message names grad_worker_fraction,
  ///   P and the allowed values).
  static int grad_workers(double f, int ranks) {
    if (ranks < 1) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::KAISA: the number of ranks must be >= 1, got ", ranks));
    }
    if (std::isfinite(f) && f > 0.0 && f <= 2.0) {
      const double x = f * ranks;
      const double k = std::round(x);
      if (k >= 1.0 && k <= ranks && std::fabs(x - k) <= 1e-9 * k &&
          ranks % static_cast<int>(k) == 0) {
        return static_cast<int>(k);
      }
    }
    std::ostringstream allowed;
    for (int k = 1; k <= ranks; ++k) {
      if (ranks % k != 0)
        continue;
      allowed << (k == 1 ? "" : ", ") << static_cast<double>(k) / ranks << " (" << k << "/" << ranks
              << (k == ranks ? ", COMM-OPT"
                  : k == 1   ? ", MEM-OPT"
                             : ", HYBRID-OPT")
              << ")";
    }
    throw ValueError(kat::detail::concat(
        "kat::distributed::KAISA: grad_worker_fraction·P must be a divisor of P on P = ", ranks,
        " ranks, so grad_worker_fraction must be one of ", allowed.str(), "; got ", f));
  }

  /// The mode of a fraction on `ranks` ranks: COMM-OPT if gw = ranks (so at ranks = 1),
  /// MEM-OPT if gw = 1 < ranks, HYBRID-OPT otherwise.
  /// @throws ValueError as grad_workers().
  static Mode select_mode(double f, int ranks) {
    const int gw = grad_workers(f, ranks);
    if (gw == ranks)
      return Mode::comm_opt;
    return gw == 1 ? Mode::mem_opt : Mode::hybrid_opt;
  }

  /// This rank's analytic decomposition broadcast payload of one decomposition step, in the
  /// units of CommunicatorStats (per rank, root included): Σ over the 2·L_g factors of the
  /// layers of this rank's worker group (COMM-OPT: all 2L factors) of (d² + d) (eigen: Q and
  /// d) or d(d+1)/2 (inverse: the packed upper triangle) · sizeof(InverseScalar). 0 in
  /// MEM-OPT (nothing is broadcast).
  std::size_t bytes_per_decomposition_update() const {
    if (mode_ == Mode::mem_opt)
      return 0;
    const bool eigen = kfac_.options().compute_method == precond::ComputeMethod::eigen;
    const int group = worker_group_of(comm_.rank());
    std::size_t entries = 0;
    for (std::size_t i = 0; i < kfac_.size(); ++i) {
      if (layer_groups_.at(i) != group)
        continue;
      for (const std::size_t d : {kfac_.factor_a(i).dim(), kfac_.factor_g(i).dim()}) {
        entries += eigen ? d * d + d : d * (d + 1) / 2;
      }
    }
    return entries * sizeof(inverse_scalar_type);
  }
  /// This rank's analytic P broadcast payload of one step (MEM-OPT and HYBRID-OPT; per rank,
  /// root included: each rank takes part in one broadcast per layer, in its receiver group):
  /// Σ over all L layers of out·(in+1) · sizeof(Scalar) (model_precision_broadcast, when
  /// Scalar and InverseScalar differ) or sizeof(InverseScalar). 0 in COMM-OPT.
  std::size_t bytes_per_step() const {
    if (mode_ == Mode::comm_opt)
      return 0;
    return gradients_.template bytes<inverse_scalar_type>(detail::gradient_entries(kfac_));
  }
  /// The agreement's all-reduce payload of one decomposition step: 2L · sizeof(std::int32_t)
  /// (KAISAStats::decomposition_agreement; no decomposition failed).
  std::size_t bytes_per_agreement() const { return detail::agreement_bytes(kfac_); }
  /// The factor all-reduce payload of one factor update (DKFAC::bytes_per_factor_update).
  std::size_t bytes_per_factor_update() const { return dkfac_.bytes_per_factor_update(); }

private:
  int checked_rank(int rank) const {
    if (rank < 0 || rank >= comm_.size()) {
      throw ValueError(kat::detail::concat("kat::distributed::KAISA: rank must be in [0, ",
                                           comm_.size(), "), got ", rank));
    }
    return rank;
  }

  /// The worker group's communicator (COMM-OPT: the whole one).
  Communicator &worker_comm() { return worker_comm_ ? *worker_comm_ : comm_; }
  /// The receiver group's communicator (MEM-OPT: the whole one).
  Communicator &receiver_comm() { return receiver_comm_ ? *receiver_comm_ : comm_; }

  /// Called on every rank for every factor KFAC decomposed successfully (all ranks own all
  /// layers); only the ranks of the layer's worker group take part. The root's rank in the
  /// worker group's communicator (split with key = rank) is its global rank minus g·gw. The
  /// owner sends its decomposition (an inverse as its packed upper triangle); the others
  /// receive it into the factor's second buffers, which become current only once the
  /// broadcast has filled them.
  void broadcast_decomposition(const execution_space &space, std::size_t layer, char factor,
                               factor_type &f) {
    const int group = layer_groups_.at(layer);
    if (group != worker_group_of(comm_.rank())) {
      return; // not a gradient worker of this layer: keeps no decomposition of it
    }
    ScopedRegion region("kat::distributed::KAISA::broadcast_decomposition");
    if (layer == first_group_layer_ && factor == 'A') {
      ++stats_.decomposition_updates;
    }
    const int owner = decomposition_owner(layer, factor);
    const int root = owner - group * grad_workers_;
    const bool sends = owner == comm_.rank();
    Communicator &c = worker_comm();
    detail::count_broadcasts(c, stats_.decomposition_broadcast, [&] {
      if (kfac_.options().compute_method == precond::ComputeMethod::eigen) {
        const auto buffers =
            sends ? std::make_pair(f.eigenvectors(), f.eigenvalues()) : f.receive_eigen();
        c.broadcast(space, buffers.first, root);
        c.broadcast(space, buffers.second, root);
        if (!sends) {
          f.commit_received_eigen();
        }
      } else {
        // (F + λI)⁻¹ is symmetric (kat::cholesky_inverse mirrors one triangle), so the packed
        // triangle restores it exactly.
        const std::size_t d = f.dim(), n = d * (d + 1) / 2;
        if (packed_.extent(0) < n) {
          packed_ = Vector<inverse_scalar_type, memory_space>(
              Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::distributed::KAISA::packed"),
              n);
        }
        const auto packed = Kokkos::subview(packed_, Kokkos::make_pair(std::size_t(0), n));
        if (sends) {
          detail::pack_upper(space, f.inverse(), packed);
        }
        c.broadcast(space, packed, root);
        if (!sends) {
          detail::unpack_upper(space, packed, f.receive_inverse());
          f.commit_received_inverse();
        }
      }
    });
  }

  /// Called on every rank for every layer in registration order. In the receiver
  /// communicator (split with key = rank) the member of worker group g has rank g, so the
  /// root is the layer's worker group. In Scalar with model_precision_broadcast (the root's P
  /// rounded too).
  void broadcast_gradient(const execution_space &space, std::size_t layer,
                          const inverse_matrix_type &p) {
    ScopedRegion region("kat::distributed::KAISA::broadcast_gradient");
    if (layer == 0) {
      ++stats_.steps;
    }
    Communicator &c = receiver_comm();
    detail::count_broadcasts(c, stats_.gradient_broadcast,
                             [&] { gradients_.broadcast(space, c, p, layer_groups_.at(layer)); });
  }

  Communicator &comm_;
  KFACType &kfac_;
  Options options_;
  int grad_workers_;
  Mode mode_;
  DKFAC<KFACType> dkfac_;
  std::optional<Communicator> worker_comm_, receiver_comm_;
  std::vector<int> layer_groups_, a_owners_, g_owners_;
  std::size_t first_group_layer_ = static_cast<std::size_t>(-1);
  Vector<inverse_scalar_type, memory_space> packed_; // an inverse's upper triangle
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
