#pragma once
/// @file
/// @brief kat::dist::KAISA: distributed K-FAC in the KAISA strategy (ALGORITHMS.md section 2):
/// factors averaged over the ranks as in D-KFAC, each factor's decomposition computed by one
/// rank chosen by a greedy least-loaded rule, and, by grad_worker_fraction, either every rank
/// preconditioning every layer (COMM-OPT, decompositions broadcast) or one gradient worker
/// per layer preconditioning it and broadcasting P (MEM-OPT). Needs KAT built with
/// `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/dist/kaisa.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/dist/communicator.hpp"
#include "kat/dist/dkfac.hpp"
#include "kat/precond/kfac.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace kat::dist {

/// The cost of decomposing a d x d factor for KAISA's greedy assignment.
enum class AssignmentCost {
  compute, ///< d³ (the decomposition's work)
  memory   ///< d² (the decomposition's size)
};

/// Settings of KAISA; must be the same on every rank.
struct KAISAOptions {
  /// f: the fraction of the ranks that precondition each layer. Supported: 1 (COMM-OPT) and
  /// 1/P (MEM-OPT), compared with a relative tolerance of 1e-9; at P = 1 both are 1.
  /// HYBRID-OPT (1/P < f < 1) is not yet supported and is rejected.
  double grad_worker_fraction = 1.0;
  AssignmentCost assignment_cost = AssignmentCost::compute;
  /// As DKFACOptions::symmetric_communication (the factor all-reduce sends the upper
  /// triangle only).
  bool symmetric_communication = true;
};

/// What one rank's KAISA did since construction or reset_stats().
struct KAISAStats {
  /// Decomposition steps (the hook ran for layer 0), and decompositions broadcast.
  std::uint64_t decomposition_updates = 0;
  /// K-FAC steps whose P were broadcast (MEM-OPT).
  std::uint64_t steps = 0;
  /// COMM-OPT: the broadcasts of the decompositions (Q and d, or the inverse), from the
  /// Communicator's broadcast counter: per decomposition step Σ_factors (d² + d) (eigen) or
  /// d² (inverse) · sizeof(InverseScalar). Zero in MEM-OPT.
  CollectiveCounter decomposition_broadcast;
  /// MEM-OPT: the P broadcasts, per step Σ_layers out·(in+1)·sizeof(InverseScalar). Zero in
  /// COMM-OPT.
  CollectiveCounter gradient_broadcast;
};

/// KAISA (Pauloski et al. 2021): on a kat::KFAC, installs
///
/// - D-KFAC's factor averaging (a kat::dist::DKFAC member, same option symmetric_communication),
///   so every rank holds the same factors;
/// - a decomposition ownership (KFAC::set_decomposition_owned): each decomposition work item
///   goes to one rank by the greedy least-loaded rule of assign();
/// - COMM-OPT (grad_worker_fraction = 1): work items are the 2L factors (A and G of each layer
///   separately, cost d³ or d²); a decomposition hook (KFAC::set_decomposition_hook)
///   broadcasts each decomposition from its owner into every other rank's buffers, and every
///   rank preconditions every layer;
/// - MEM-OPT (grad_worker_fraction = 1/P): work items are the L layers (A and G colocated,
///   cost d_A³ + d_G³ or d_A² + d_G²), so the layer's gradient worker is the rank that
///   decomposes both of its factors; nothing is broadcast after decomposing, and a
///   precondition hook (KFAC::set_precondition_hook) broadcasts P from the gradient worker.
///   Other ranks keep no decomposition of that layer (they keep its factors: the factor
///   all-reduce needs them).
///
/// Both give the same P as D-KFAC (the decomposer computes from the same averaged factors).
/// Every rank must register the same layers in the same order before constructing it and
/// call KFAC::step() on the same steps (the hooks are collective). A decomposition failure
/// that throws on the owner (keep_previous_on_failure = false) leaves the other ranks waiting
/// in the broadcast. The destructor removes the hooks and the ownership. Neither copyable nor
/// movable; the Communicator and the KFAC must outlive it.
///
///     kat::dist::KAISA<kat::KFAC<float, Mem>> kaisa(comm, kfac, options);
///
/// @tparam KFACType  a kat::KFAC instantiation.
template <class KFACType> class KAISA {
public:
  using kfac_type = KFACType;
  using execution_space = typename KFACType::execution_space;
  using factor_type = typename KFACType::factor_type;
  using inverse_matrix_type = typename KFACType::inverse_matrix_type;
  using inverse_scalar_type = typename inverse_matrix_type::non_const_value_type;
  using Options = KAISAOptions;
  using Stats = KAISAStats;

  /// Which strategy grad_worker_fraction selects.
  enum class Mode { comm_opt, mem_opt };

  /// @throws ValueError if grad_worker_fraction is not 1 or 1/P (naming the supported values).
  KAISA(Communicator &comm, KFACType &kfac, Options options = Options())
      : comm_(comm), kfac_(kfac), options_(options),
        mode_(select_mode(options.grad_worker_fraction, comm.size())),
        dkfac_(comm, kfac, DKFACOptions{options.symmetric_communication}) {
    const std::size_t layers = kfac_.size();
    if (mode_ == Mode::comm_opt) {
      std::vector<double> costs;
      for (std::size_t i = 0; i < layers; ++i) {
        costs.push_back(cost(kfac_.factor_a(i).dim(), options_.assignment_cost));
        costs.push_back(cost(kfac_.factor_g(i).dim(), options_.assignment_cost));
      }
      const std::vector<int> owners = assign(costs, comm_.size());
      for (std::size_t i = 0; i < layers; ++i) {
        a_owners_.push_back(owners[2 * i]);
        g_owners_.push_back(owners[2 * i + 1]);
      }
    } else {
      std::vector<double> costs;
      for (std::size_t i = 0; i < layers; ++i) {
        costs.push_back(cost(kfac_.factor_a(i).dim(), options_.assignment_cost) +
                        cost(kfac_.factor_g(i).dim(), options_.assignment_cost));
      }
      a_owners_ = assign(costs, comm_.size());
      g_owners_ = a_owners_;
    }
    const int rank = comm_.rank();
    kfac_.set_decomposition_owned([this, rank](std::size_t layer, char factor) {
      return decomposition_owner(layer, factor) == rank;
    });
    if (mode_ == Mode::comm_opt) {
      kfac_.set_decomposition_hook(
          [this](const execution_space &space, std::size_t layer, char factor, factor_type &f) {
            broadcast_decomposition(space, layer, factor, f);
          });
    } else {
      kfac_.set_precondition_hook(
          [this](const execution_space &space, std::size_t layer, const inverse_matrix_type &p) {
            broadcast_gradient(space, layer, p);
          });
    }
  }
  KAISA(const KAISA &) = delete;
  KAISA &operator=(const KAISA &) = delete;
  /// Removes the hooks and the decomposition ownership (the DKFAC member removes its own).
  ~KAISA() {
    kfac_.set_decomposition_hook({});
    kfac_.set_precondition_hook({});
    kfac_.set_decomposition_owned({});
  }

  const Options &options() const { return options_; }
  Mode mode() const { return mode_; }
  const Stats &stats() const { return stats_; }
  /// The factor averaging (its stats() count the factor all-reduces).
  const DKFAC<KFACType> &dkfac() const { return dkfac_; }
  void reset_stats() {
    stats_ = Stats();
    dkfac_.reset_stats();
  }

  /// The rank that decomposes factor 'A' or 'G' of registered layer i.
  int decomposition_owner(std::size_t layer, char factor) const {
    return factor == 'A' ? a_owners_.at(layer) : g_owners_.at(layer);
  }
  /// MEM-OPT: the rank that preconditions layer i (= the owner of both its decompositions);
  /// COMM-OPT: -1 (every rank).
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
      throw ValueError(
          kat::detail::concat("kat::dist::KAISA: the number of ranks must be >= 1, got ", ranks));
    }
    for (const double c : costs) {
      if (!(c >= 0.0 && std::isfinite(c))) {
        throw ValueError(
            kat::detail::concat("kat::dist::KAISA: work costs must be finite and >= 0, got ", c));
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

  /// The mode of a fraction on `ranks` ranks.
  /// @throws ValueError unless f = 1 or f = 1/ranks.
  static Mode select_mode(double f, int ranks) {
    const auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fabs(b); };
    if (ranks >= 1 && std::isfinite(f)) {
      if (near(f, 1.0))
        return Mode::comm_opt;
      if (near(f, 1.0 / ranks))
        return Mode::mem_opt;
    }
    throw ValueError(kat::detail::concat(
        "kat::dist::KAISA: grad_worker_fraction must be 1 (COMM-OPT) or 1/P = 1/", ranks,
        " (MEM-OPT) on P = ", ranks,
        " ranks; HYBRID-OPT (1/P < grad_worker_fraction < 1) is not yet supported, got ", f));
  }

  /// COMM-OPT's analytic decomposition broadcast payload of one decomposition step, in the
  /// units of CommunicatorStats: Σ over the 2L factors of (d² + d) (eigen) or d² (inverse),
  /// times sizeof(InverseScalar). 0 in MEM-OPT.
  std::size_t bytes_per_decomposition_update() const {
    if (mode_ != Mode::comm_opt)
      return 0;
    const bool eigen = kfac_.options().compute_method == ComputeMethod::eigen;
    std::size_t entries = 0;
    for (std::size_t i = 0; i < kfac_.size(); ++i) {
      for (const std::size_t d : {kfac_.factor_a(i).dim(), kfac_.factor_g(i).dim()}) {
        entries += d * d + (eigen ? d : 0);
      }
    }
    return entries * sizeof(inverse_scalar_type);
  }
  /// MEM-OPT's analytic P broadcast payload of one step: Σ_layers out·(in+1) ·
  /// sizeof(InverseScalar). 0 in COMM-OPT.
  std::size_t bytes_per_step() const {
    if (mode_ != Mode::mem_opt)
      return 0;
    std::size_t entries = 0;
    for (std::size_t i = 0; i < kfac_.size(); ++i) {
      entries += kfac_.factor_a(i).dim() * kfac_.factor_g(i).dim();
    }
    return entries * sizeof(inverse_scalar_type);
  }
  /// The factor all-reduce payload of one factor update (DKFAC::bytes_per_factor_update).
  std::size_t bytes_per_factor_update() const { return dkfac_.bytes_per_factor_update(); }

private:
  template <class F> void counted(CollectiveCounter &counter, F &&f) {
    const CollectiveCounter before = comm_.stats().broadcast;
    f();
    const CollectiveCounter after = comm_.stats().broadcast;
    counter.calls += after.calls - before.calls;
    counter.bytes += after.bytes - before.bytes;
  }

  void broadcast_decomposition(const execution_space &space, std::size_t layer, char factor,
                               factor_type &f) {
    ScopedRegion region("kat::dist::KAISA::broadcast_decomposition");
    if (layer == 0 && factor == 'A') {
      ++stats_.decomposition_updates;
    }
    const int root = decomposition_owner(layer, factor);
    counted(stats_.decomposition_broadcast, [&] {
      if (kfac_.options().compute_method == ComputeMethod::eigen) {
        const auto buffers = f.eigen_buffers();
        comm_.broadcast(space, buffers.first, root);
        comm_.broadcast(space, buffers.second, root);
      } else {
        comm_.broadcast(space, f.inverse_buffer(), root);
      }
    });
  }

  void broadcast_gradient(const execution_space &space, std::size_t layer,
                          const inverse_matrix_type &p) {
    ScopedRegion region("kat::dist::KAISA::broadcast_gradient");
    if (layer == 0) {
      ++stats_.steps;
    }
    counted(stats_.gradient_broadcast, [&] { comm_.broadcast(space, p, a_owners_.at(layer)); });
  }

  Communicator &comm_;
  KFACType &kfac_;
  Options options_;
  Mode mode_;
  DKFAC<KFACType> dkfac_;
  std::vector<int> a_owners_, g_owners_;
  Stats stats_;
};

} // namespace kat::dist

#endif // KAT_ENABLE_MPI
