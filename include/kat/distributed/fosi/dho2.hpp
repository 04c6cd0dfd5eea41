#pragma once
/// @file
/// @brief kat::distributed::DHO2: distributed FOSI with sharded curvature and partial-curvature
/// updates (Gu et al., "DHO2", arXiv 2505.00982; reference code ShunxianGu/DHO2). Needs KAT
/// built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/fosi/dho2.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/fosi/dho2_overlap.hpp"
#include "kat/distributed/fosi/parameter_shard.hpp"
#include "kat/distributed/fosi/sharded_lanczos.hpp"
#include "kat/optim/fosi.hpp"
#include "kat/optim/fosi_partition.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace kat::distributed {
namespace detail {

/// FOSI's vectors split by ParameterShard over the ranks of a communicator: projections are
/// all-reduced (k + l)-vectors, Lanczos is sharded_lanczos, and the parameters are
/// re-assembled by one all-gather of the padded slices.
template <class Scalar, class MemorySpace>
class DHO2Partition : public kat::optim::FOSIPartition<Scalar, MemorySpace> {
  using Base = kat::optim::FOSIPartition<Scalar, MemorySpace>;

public:
  using typename Base::double_vector;
  using typename Base::execution_space;
  using typename Base::vector_type;

  DHO2Partition(std::shared_ptr<Communicator> comm, const ParameterShard &shard)
      : comm_(std::move(comm)), shard_(shard),
        slice_("kat::distributed::DHO2::slice", shard.padded),
        whole_("kat::distributed::DHO2::gathered", shard.padded * shard.ranks) {}

  std::size_t global_size() const override { return shard_.n; }
  std::size_t offset() const override { return shard_.offset; }
  std::size_t local_size() const override { return shard_.size; }
  std::size_t vector_length() const override { return shard_.padded; }

  void sum(const execution_space &space, const double_vector &coefficients) override {
    comm_->allreduce(space, coefficients);
  }

  LanczosResult<MemorySpace> lanczos(const execution_space &space,
                                     const LinearOperator<MemorySpace> &op,
                                     const LanczosOptions &options) override {
    return sharded_lanczos<MemorySpace>(space, *comm_, op, shard_, options);
  }

  void gather(const execution_space &space, const vector_type &params) override {
    const auto mine = std::make_pair(shard_.offset, shard_.offset + shard_.size);
    Kokkos::deep_copy(space, Kokkos::subview(slice_, std::make_pair(std::size_t(0), shard_.size)),
                      Kokkos::subview(params, mine));
    comm_->allgather(space, slice_, whole_);
    Kokkos::deep_copy(space, params,
                      Kokkos::subview(whole_, std::make_pair(std::size_t(0), shard_.n)));
  }

  Communicator &communicator() const { return *comm_; }
  const ParameterShard &shard() const { return shard_; }

private:
  std::shared_ptr<Communicator> comm_;
  ParameterShard shard_;
  vector_type slice_; // padded; the padding stays zero
  vector_type whole_; // ranks x padded
};

/// DHO2Partition on the training ranks of overlapped DHO2: estimates are started by sending
/// the curvature ranks a parameter snapshot (DHO2Estimator) and finished by receiving this
/// rank's rows of their Ritz vectors.
template <class Scalar, class MemorySpace>
class DHO2OverlapPartition : public DHO2Partition<Scalar, MemorySpace> {
  using Base = DHO2Partition<Scalar, MemorySpace>;

public:
  using typename Base::execution_space;
  using typename Base::vector_type;

  DHO2OverlapPartition(const DHO2Roles &roles, std::size_t n, const DHO2Overlap &overlap)
      : Base(std::make_shared<Communicator>(roles.group->dup()),
             parameter_shard(n, roles.group->rank(), roles.training_ranks)),
        roles_(roles), overlap_(overlap),
        snapshot_("kat::distributed::DHO2::snapshot", this->shard().size),
        command_("kat::distributed::DHO2::command", dho2_command_length),
        flag_("kat::distributed::DHO2::flag", 1) {}

  DHO2OverlapPartition(const DHO2OverlapPartition &) = delete;
  DHO2OverlapPartition &operator=(const DHO2OverlapPartition &) = delete;

  /// Stops the curvature ranks (from training rank 0) after any estimate in flight has arrived.
  ~DHO2OverlapPartition() override {
    if (!mpi_active()) {
      return;
    }
    try {
      stop();
    } catch (const std::exception &e) {
      std::fprintf(stderr, "%s (in ~DHO2; call DHO2::stop_estimators() to receive it)\n", e.what());
    }
  }

  bool asynchronous() const override { return true; }
  std::int64_t staleness_bound() const override { return *overlap_.staleness_bound; }
  double estimate_seconds() const override { return seconds_; }

  LanczosResult<MemorySpace> lanczos(const execution_space &, const LinearOperator<MemorySpace> &,
                                     const LanczosOptions &) override {
    throw Error("kat::distributed::DHO2: with curvature ranks the training ranks run no Lanczos "
                "(estimates start and finish inside step())");
  }

  void start_estimate(const execution_space &space, const vector_type &params,
                      const LanczosOptions &options) override {
    const char *who = "kat::distributed::DHO2::start_estimate";
    if (stopped_) {
      throw Error(kat::detail::concat(who, ": the curvature ranks were stopped"));
    }
    if (!results_.empty()) {
      throw Error(kat::detail::concat(who, ": an estimate is already in flight"));
    }
    const Kokkos::DefaultHostExecutionSpace host;
    Communicator &bridge = *roles_.bridge;
    const int T = roles_.training_ranks;
    const int C = roles_.curvature_ranks;
    const ParameterShard &mine = this->shard();
    k_ = options.k;
    kl_ = options.k + options.l;
    if (mine.rank == 0) {
      command_(0) = dho2_estimate;
      std::memcpy(&command_(1), &options.seed, sizeof options.seed);
      command_(2) = static_cast<std::int64_t>(options.m);
      command_(3) = static_cast<std::int64_t>(options.k);
      command_(4) = static_cast<std::int64_t>(options.l);
      for (int c = 0; c < C; ++c) {
        sends_.push_back(bridge.isend(host, command_, T + c, dho2_command_tag));
      }
    }
    // A copy: params changes in this very step, while MPI may still be reading.
    Kokkos::deep_copy(
        space, snapshot_,
        Kokkos::subview(params, std::make_pair(mine.offset, mine.offset + mine.size)));
    for (int c = 0; c < C; ++c) {
      sends_.push_back(bridge.isend(space, snapshot_, T + c, dho2_params_tag));
    }
    for (int c = 0; c < C; ++c) {
      const auto rows = shared_rows(parameter_shard(mine.n, c, C), mine);
      if (rows.first == rows.second) {
        continue;
      }
      results_.push_back({rows,
                          Kokkos::View<double *, MemorySpace>("kat::distributed::DHO2::result",
                                                              dho2_result_length(kl_, rows)),
                          Request()});
      results_.back().request = bridge.irecv(space, results_.back().buffer, T + c, dho2_result_tag);
    }
  }

  std::optional<LanczosResult<MemorySpace>> finish_estimate(const execution_space &space,
                                                            bool wait) override {
    const char *who = "kat::distributed::DHO2";
    if (results_.empty()) {
      throw Error(kat::detail::concat(who, "::finish_estimate: no estimate is in flight"));
    }
    const Kokkos::DefaultHostExecutionSpace host;
    if (!wait) {
      if (overlap_.swap == DHO2Swap::fixed) {
        return std::nullopt;
      }
      bool ready = true;
      for (auto &r : results_) {
        ready = r.request.test() && ready;
      }
      flag_(0) = ready ? 1 : 0;
      this->communicator().allreduce(host, flag_, ReduceOp::min);
      if (flag_(0) == 0) {
        return std::nullopt;
      }
    }
    for (auto &r : results_) {
      r.request.wait();
    }
    for (auto &s : sends_) {
      s.wait();
    }
    sends_.clear();
    std::vector<std::vector<double>> headers;
    for (const auto &r : results_) {
      std::vector<double> h(dho2_header_length + kl_);
      Kokkos::deep_copy(
          space,
          Kokkos::View<double *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(h.data(), h.size()),
          Kokkos::subview(r.buffer, std::make_pair(std::size_t(0), h.size())));
      space.fence();
      headers.push_back(std::move(h));
    }
    // Every training rank learns of a failure at the same step, whichever curvature rank had it.
    flag_(0) = std::any_of(headers.begin(), headers.end(),
                           [](const std::vector<double> &h) { return h[0] != 0.0; })
                   ? 1
                   : 0;
    this->communicator().allreduce(host, flag_, ReduceOp::max);
    if (flag_(0) != 0) {
      results_.clear();
      throw Error(kat::detail::concat(
          who, ": the curvature estimate failed on the curvature ranks (ranks ",
          roles_.training_ranks, " to ", roles_.training_ranks + roles_.curvature_ranks - 1,
          " of the communicator DHO2 was built on); their error output says why"));
    }
    using Block =
        Kokkos::View<const double **, Kokkos::LayoutLeft, MemorySpace, Kokkos::MemoryUnmanaged>;
    const ParameterShard &mine = this->shard();
    LanczosResult<MemorySpace> r;
    r.k = k_;
    r.l = kl_ - k_;
    r.eigenvalues.assign(headers[0].begin() + dho2_header_length, headers[0].end());
    r.iterations = static_cast<std::size_t>(headers[0][2]);
    seconds_ = headers[0][1];
    r.eigenvectors = Kokkos::View<double **, Kokkos::LayoutLeft, MemorySpace>(
        "kat::distributed::DHO2::V", mine.padded, kl_);
    for (const auto &part : results_) {
      const Block block(part.buffer.data() + dho2_header_length + kl_,
                        part.rows.second - part.rows.first, kl_);
      Kokkos::deep_copy(space,
                        Kokkos::subview(r.eigenvectors,
                                        std::make_pair(part.rows.first - mine.offset,
                                                       part.rows.second - mine.offset),
                                        Kokkos::ALL),
                        block);
    }
    space.fence();
    results_.clear();
    return r;
  }

  /// Sends stop to the curvature ranks (from training rank 0) once the estimate in flight, if
  /// any, has arrived. Idempotent.
  void stop() {
    if (stopped_) {
      return;
    }
    stopped_ = true;
    for (auto &r : results_) {
      r.request.wait();
    }
    for (auto &s : sends_) {
      s.wait();
    }
    results_.clear();
    sends_.clear();
    if (this->shard().rank == 0) {
      const Kokkos::DefaultHostExecutionSpace host;
      command_(0) = dho2_stop;
      std::vector<Request> stops;
      for (int c = 0; c < roles_.curvature_ranks; ++c) {
        stops.push_back(
            roles_.bridge->isend(host, command_, roles_.training_ranks + c, dho2_command_tag));
      }
      for (auto &s : stops) {
        s.wait();
      }
    }
  }

  const DHO2Roles &roles() const { return roles_; }
  const DHO2Overlap &overlap() const { return overlap_; }

private:
  struct Incoming {
    std::pair<std::size_t, std::size_t> rows; // of the flat vector
    Kokkos::View<double *, MemorySpace> buffer;
    Request request;
  };

  DHO2Roles roles_;
  DHO2Overlap overlap_;
  vector_type snapshot_;
  Kokkos::View<std::int64_t *, Kokkos::HostSpace> command_;
  Kokkos::View<std::int32_t *, Kokkos::HostSpace> flag_;
  std::vector<Incoming> results_; // non-empty while an estimate is in flight
  std::vector<Request> sends_;
  std::size_t k_ = 0;
  std::size_t kl_ = 0;
  double seconds_ = 0.0;
  bool stopped_ = false;
};

} // namespace detail

/// DHO2 (Gu et al., arXiv 2505.00982): FOSI (kat::optim::FOSI, ALGORITHMS.md §3) on P ranks
/// with its curvature sharded, so curvature memory and work per rank fall as 1/P.
///
/// Rank r owns the contiguous slice parameter_shard(n, r, P) of the flat parameter vector
/// (padded to ⌈n/P⌉) and keeps only that slice of everything FOSI keeps per parameter:
///
/// - the Lanczos basis and the Ritz vectors (sharded_lanczos: dot products and
///   re-orthogonalization coefficients are all-reduced, the tridiagonal problem is solved on
///   every rank);
/// - V, the subspace momentum and the base optimizer's state (the base optimizer is built for
///   the slice, `shard().size` entries: ZeRO-1-style sharding of its moments).
///
/// A step (every rank has the whole averaged gradient g, as after data-parallel averaging):
/// V g = Σ_r V_r g_r is one all-reduce of a (k + l)-vector, the rank computes the Newton and
/// complement updates of its slice (the base step on its slice of g2), V u is a second
/// (k + l) all-reduce, and the updated slices are all-gathered into every rank's parameters.
/// Per step and rank that is 16 (k + l) + ⌈n/P⌉ sizeof(Scalar) bytes (step_bytes()), against
/// the n-entry gradient all-reduce of the data parallelism around it.
///
/// The curvature operator maps this rank's slice (length shard().padded) to its slice of
/// H v; sharded_curvature_operator builds the Hessian of the mean loss over every rank's own
/// curvature batch. The reference code instead computes every product redundantly from rank
/// 0's broadcast batch, rebuilds vectors with full-length all-reduces and reassembles the
/// whole k x n eigenvectors on every rank (ALGORITHMS.md §4).
///
/// With equal inputs (parameters, averaged gradients, and an operator equal to FOSI's), a
/// DHO2 step equals FOSI's on one process up to the rounding of the reductions. On one rank
/// it is FOSI with two no-op all-reduces and a copy. With the first constructor every rank
/// takes part in each refresh (synchronous estimation); with the overlapped one
/// (dho2_roles, DHO2Estimator) dedicated curvature ranks estimate on parameter snapshots while
/// these ranks train, and estimates arrive at most DHO2Overlap::staleness_bound steps late.
///
/// DHO2 communicates on a duplicate of the communicator it is given (its own counters:
/// stats()). Construction and every step() and refresh() are collective. The state
/// (state_dict()) is this rank's slice: save and load one per rank.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class DHO2 : public kat::optim::FOSI<Scalar, MemorySpace> {
  using FOSI = kat::optim::FOSI<Scalar, MemorySpace>;
  using Partition = detail::DHO2Partition<Scalar, MemorySpace>;

public:
  using typename FOSI::base_type;
  using typename FOSI::operator_type;
  using Options = typename FOSI::Options; ///< FOSI's hyperparameters

  /// DHO2 over the ranks of `comm` for a flat parameter vector of length n. `base` must be
  /// built for this rank's slice (size parameter_shard(n, comm.rank(), comm.size()).size) and
  /// `curvature` must map this rank's padded slice to its slice of the product (see
  /// sharded_operator). Options as FOSI's, the same on every rank.
  /// @throws ValueError from parameter_shard (too few parameters for the ranks) and as FOSI's
  ///   constructor (which names base->size() when it is not the slice's size).
  DHO2(Communicator &comm, std::size_t n, std::unique_ptr<base_type> base, operator_type curvature,
       const Options &options)
      : DHO2(std::make_shared<Partition>(std::make_shared<Communicator>(comm.dup()),
                                         parameter_shard(n, comm.rank(), comm.size())),
             n, std::move(base), std::move(curvature), options) {}

  /// Overlapped DHO2 on a training rank of `roles` (dho2_roles): the parameters are sharded
  /// over the roles.training_ranks training ranks (parameter_shard(n, t, T)); at each refresh
  /// step the training ranks send the curvature ranks (which run DHO2Estimator::serve) a
  /// snapshot of the parameters and keep stepping with the previous estimate (before the
  /// first: with the base optimizer) until the new one arrives, as `overlap` says
  /// (DHO2Overlap: eager or fixed swap, staleness bound S). Staleness: staleness().
  ///
  /// With S = 0 each refresh waits for its estimate, and the steps are those of synchronous
  /// DHO2 (and of FOSI on one process) up to the rounding of the reductions. Destroying the
  /// DHO2 on training rank 0 (or stop_estimators()) stops the curvature ranks.
  /// @throws ValueError if roles is a curvature rank's, or overlap.staleness_bound < 0; as the
  ///   other constructor otherwise.
  DHO2(const DHO2Roles &roles, std::size_t n, std::unique_ptr<base_type> base,
       const Options &options, const DHO2Overlap &overlap)
      : DHO2(std::make_shared<OverlapPartition>(checked(roles, overlap), n,
                                                resolved(overlap, options)),
             n, std::move(base), remote_curvature(), options) {}

  /// Destroys the optimizer; with curvature ranks, training rank 0 stops them first (waiting
  /// for an estimate in flight).
  ~DHO2() override = default;

  std::string name() const override { return "DHO2"; }

  /// This rank's slice of the parameter vector.
  const ParameterShard &shard() const { return partition_->shard(); }

  /// Whether curvature ranks estimate (the overlapped constructor).
  bool overlapped() const { return overlap_ != nullptr; }
  /// With curvature ranks: the overlap options, the staleness bound resolved; else null.
  const DHO2Overlap *overlap() const { return overlap_ ? &overlap_->overlap() : nullptr; }
  /// With curvature ranks: the roles given at construction; else null.
  const DHO2Roles *roles() const { return overlap_ ? &overlap_->roles() : nullptr; }

  /// With curvature ranks: sends them stop (training rank 0; every training rank waits for an
  /// estimate in flight first); later refreshes throw. Collective over the training ranks. The
  /// destructor does it too. No-op without curvature ranks.
  void stop_estimators() {
    if (overlap_) {
      overlap_->stop();
    }
  }

  /// What this rank passed to MPI for DHO2: its own communicator (the Lanczos reductions, the
  /// projections, the gathers) and, with curvature ranks, the messages to and from them; not
  /// what the curvature operator sends on its own.
  CommunicatorStats stats() const {
    CommunicatorStats s = partition_->communicator().stats();
    if (overlap_) {
      s += overlap_->roles().bridge->stats();
    }
    return s;
  }
  /// Sets the communicators' counters (stats()) to 0.
  void reset_stats() {
    partition_->communicator().reset_stats();
    if (overlap_) {
      overlap_->roles().bridge->reset_stats();
    }
  }

  /// With curvature ranks: the payload bytes this training rank passes to MPI per estimate,
  /// besides the steps' step_bytes(): the command (40 bytes to each curvature rank, training
  /// rank 0 only), its parameter slice to each curvature rank, the results it receives (per
  /// overlapping curvature rank 8 (3 + (k + l) + rows (k + l)) bytes: a header, the
  /// eigenvalues and its shared rows of the Ritz vectors), the 4-byte failure check and the
  /// 8 (k + l)-byte all-reduce of V m. With DHO2Swap::eager, each step an estimate is in
  /// flight adds a 4-byte all-reduce. 0 without curvature ranks.
  std::size_t estimate_bytes() const {
    if (!overlap_) {
      return 0;
    }
    const auto &roles = overlap_->roles();
    const std::size_t kl = this->options().k + this->options().l;
    const ParameterShard &mine = shard();
    std::size_t bytes = 0;
    for (int c = 0; c < roles.curvature_ranks; ++c) {
      if (mine.rank == 0) {
        bytes += sizeof(std::int64_t) * detail::dho2_command_length;
      }
      bytes += mine.size * sizeof(Scalar);
      const auto rows =
          detail::shared_rows(parameter_shard(mine.n, c, roles.curvature_ranks), mine);
      if (rows.first != rows.second) {
        bytes += sizeof(double) * detail::dho2_result_length(kl, rows);
      }
    }
    return bytes + sizeof(std::int32_t) + sizeof(double) * kl;
  }

  /// Curvature memory on this rank (see FOSI::curvature_bytes). With curvature ranks a
  /// training rank runs no Lanczos: V, the subspace momentum and, while an estimate arrives,
  /// its rows of the Ritz vectors: 8 (local (k + l + 1) + padded (k + l)) bytes.
  std::size_t curvature_bytes() const override {
    if (!overlap_) {
      return FOSI::curvature_bytes();
    }
    const std::size_t kl = this->options().k + this->options().l;
    return sizeof(double) * (shard().size * (kl + 1) + shard().padded * kl);
  }

  /// Payload bytes per rank of one step without a refresh: the all-gather of the padded slice
  /// (⌈n/P⌉ Scalars), plus with an estimate (`estimated`) the two (k + l)-double all-reduces.
  std::size_t step_bytes(bool estimated) const {
    const std::size_t gather = shard().padded * sizeof(Scalar);
    return estimated ? gather + 2 * sizeof(double) * (this->options().k + this->options().l)
                     : gather;
  }

  /// Payload bytes per rank of one refresh on DHO2's communicator: sharded_lanczos's
  /// reductions (8 (m² + m)) and the all-reduce of V m (8 (k + l)); the operator's own
  /// communication (sharded_operator: 4 + (P + 1) ⌈n/P⌉ sizeof(Scalar) per product, m
  /// products) is not included.
  std::size_t refresh_bytes() const {
    const auto &o = this->options();
    return sharded_lanczos_bytes(o.lanczos_iterations) + sizeof(double) * (o.k + o.l);
  }

private:
  using OverlapPartition = detail::DHO2OverlapPartition<Scalar, MemorySpace>;

  DHO2(std::shared_ptr<Partition> partition, std::size_t n, std::unique_ptr<base_type> base,
       operator_type curvature, const Options &options)
      : FOSI(n, std::move(base), std::move(curvature), options, partition),
        partition_(std::move(partition)),
        overlap_(std::dynamic_pointer_cast<OverlapPartition>(partition_)) {}

  static const DHO2Roles &checked(const DHO2Roles &roles, const DHO2Overlap &overlap) {
    const char *who = "kat::distributed::DHO2";
    if (roles.curvature || !roles.bridge || !roles.group) {
      throw ValueError(kat::detail::concat(
          who, ": roles must be a training rank's (dho2_roles(...).curvature false); a curvature "
               "rank runs DHO2Estimator::serve instead"));
    }
    if (overlap.staleness_bound && *overlap.staleness_bound < 0) {
      throw ValueError(kat::detail::concat(who, ": overlap.staleness_bound must be >= 0, got ",
                                           *overlap.staleness_bound));
    }
    return roles;
  }

  static DHO2Overlap resolved(DHO2Overlap overlap, const Options &options) {
    if (!overlap.staleness_bound) {
      overlap.staleness_bound = options.num_iters_to_approx_eigs;
    }
    return overlap;
  }

  /// The training ranks' placeholder for the curvature operator, which lives on the curvature
  /// ranks (FOSI never applies it with an asynchronous partition).
  static operator_type remote_curvature() {
    return [](const typename FOSI::execution_space &,
              const Kokkos::View<const double *, MemorySpace> &,
              const Kokkos::View<double *, MemorySpace> &) {
      throw Error("kat::distributed::DHO2: with curvature ranks the curvature operator is "
                  "applied on the curvature ranks only");
    };
  }

  std::shared_ptr<Partition> partition_;
  std::shared_ptr<OverlapPartition> overlap_; // null without curvature ranks
};

} // namespace kat::distributed

#endif
