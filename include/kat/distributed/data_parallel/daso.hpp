#pragma once
/// @file
/// @brief kat::distributed::DASO: hierarchical, asynchronous and selective data parallelism
/// (Coquelin et al., J. Big Data 2022): node-local gradient averaging every step, global
/// parameter averaging across nodes every few steps, received late and merged with a staleness
/// weight. Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/data_parallel/daso.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/bfloat16.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/data_parallel/daso_schedule.hpp"
#include "kat/distributed/data_parallel/data_parallel.hpp"
#include "kat/train/gradient_sync.hpp"
#include "kat/train/registry.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kat::distributed {

/// The type of the values in DASO's blocking global averages.
enum class DASODowncast {
  none, ///< the parameters' own scalar
  bf16  ///< kat::bfloat16 (the reference's default): half the bytes of float, 8 significant bits
};

/// Settings of DASO; the same on every rank. The defaults are the reference's (Heat's DASO).
struct DASOOptions {
  /// The epoch-level schedule of the skips (DASOSchedule).
  DASOScheduleOptions schedule{};
  /// If set, these skips hold in every epoch and the schedule is not used (for experiments and
  /// tests: {1, 1, 0} without downcast is synchronous data parallelism).
  std::optional<DASOSkips> fixed_skips{};
  /// Elements per non-blocking all-reduce of a global synchronization, > 0: the flat
  /// parameter buffer goes in chunks of this many (the last one smaller), each its own
  /// MPI_Iallreduce ("sending_chunk_size", default 10^7).
  std::size_t sending_chunk_size = 10'000'000;
  /// The wire type of the blocking global averages (global_skip < 1: warm-up, cool-down);
  /// stale sends always go in the parameters' own scalar ("downcast_type", default bf16).
  DASODowncast downcast = DASODowncast::bf16;
  /// Bucket size of the node-local gradient all-reduce (DataParallelOptions::bucket_bytes).
  std::size_t bucket_bytes = std::size_t(1) << 20;
};

/// What one rank's DASO did since construction or reset_stats() (the trainer resets at every
/// epoch). "Local" is the node communicator (gradient all-reduces, parameter broadcasts),
/// "global" the cross-node communicator (parameter all-reduces).
struct DASOStats {
  std::uint64_t steps = 0;          ///< after_step() calls
  std::uint64_t local_syncs = 0;    ///< steps with the node-local gradient all-reduce
  std::uint64_t global_syncs = 0;   ///< global synchronizations started (by some group)
  std::uint64_t blocking_syncs = 0; ///< of them, completed in the step they started
  std::uint64_t sends = 0;          ///< global synchronizations this rank's group sent
  std::uint64_t stale_merges = 0;   ///< sends of this rank received late (the stale merge)
  std::uint64_t local_bytes = 0;    ///< payload bytes on the node communicator
  std::uint64_t global_bytes = 0;   ///< payload bytes on the global communicator
  /// With virtual nodes (CommunicatorOptions::ranks_per_virtual_node): payload bytes of the
  /// operations that crossed nodes (CommunicatorStats::internode of both communicators).
  std::uint64_t internode_bytes = 0;
  /// Exposed seconds (host wall clock) of node-local communication: waiting for the gradient
  /// all-reduce, the parameter broadcasts.
  double local_seconds = 0;
  /// Exposed seconds of global communication: packing and posting sends, waiting for them
  /// and merging. A send that completed behind computation costs only its posting.
  double global_seconds = 0;
  /// The group (rank within the node) that sent the last global synchronization; -1 before.
  int last_sending_group = -1;
};

namespace detail {

/// DASO's wire format for a parameter scalar: the scalar itself, or kat::bfloat16.
template <class Wire> struct DASOWire {
  template <class Scalar> KOKKOS_INLINE_FUNCTION static Wire from(Scalar x) {
    return static_cast<Wire>(x);
  }
  KOKKOS_INLINE_FUNCTION static double to(Wire x) { return static_cast<double>(x); }
};
template <> struct DASOWire<kat::bfloat16> {
  template <class Scalar> KOKKOS_INLINE_FUNCTION static kat::bfloat16 from(Scalar x) {
    return kat::bfloat16::from_float(static_cast<float>(x));
  }
  KOKKOS_INLINE_FUNCTION static double to(kat::bfloat16 x) { return x.to_float(); }
};

// The kernels of daso_pack, daso_merge and daso_mean, as named functors rather than extended
// device lambdas: nvcc's wrapper of an extended lambda in a header is merged across
// translation units while its function pointers are not (docs/backends.md).

/// wire(i) = params(i) in the wire type, counting the non-finite parameters.
template <class Params, class WireView> struct DASOPack {
  using Wire = typename WireView::non_const_value_type;
  Params params;
  WireView wire;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, std::int64_t &count) const {
    const auto x = params(i);
    wire(i) = DASOWire<Wire>::from(x);
    if (!(x - x == 0)) { // inf - inf and NaN - NaN are NaN
      ++count;
    }
  }
};

/// The stale merge of element i: params(i) = (numer params(i) + sum(i)) / denom.
template <class Params, class WireView> struct DASOMerge {
  using Wire = typename WireView::non_const_value_type;
  using Scalar = typename Params::non_const_value_type;
  Params params;
  WireView sum;
  double numer, denom;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    params(i) =
        static_cast<Scalar>((numer * double(params(i)) + DASOWire<Wire>::to(sum(i))) / denom);
  }
};

/// The blocking average of element i: params(i) = sum(i) / nodes, divided in the wire type.
template <class Params, class WireView> struct DASOMean {
  using Wire = typename WireView::non_const_value_type;
  using Scalar = typename Params::non_const_value_type;
  Params params;
  WireView sum;
  double nodes;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const Wire mean = DASOWire<Wire>::from(DASOWire<Wire>::to(sum(i)) / nodes);
    params(i) = static_cast<Scalar>(DASOWire<Wire>::to(mean));
  }
};

/// wire[i] = params[i] in the wire type for i < n, wire[n] = the number of non-finite
/// parameters (sent along, so every rank that receives the sum learns of one); returns that
/// number. Fences `space`.
template <class ExecSpace, class Params, class WireView>
std::int64_t daso_pack(const ExecSpace &space, const Params &params, const WireView &wire) {
  using Wire = typename WireView::non_const_value_type;
  const std::size_t n = params.extent(0);
  std::int64_t bad = 0;
  Kokkos::parallel_reduce("kat::distributed::DASO::pack",
                          Kokkos::RangePolicy<ExecSpace>(space, 0, n),
                          DASOPack<Params, WireView>{params, wire}, bad);
  Kokkos::deep_copy(space, Kokkos::subview(wire, n), DASOWire<Wire>::from(double(bad)));
  space.fence();
  return bad;
}

/// The status element, the last of `wire` (non-finite parameters summed over the senders).
/// Fences `space`.
template <class ExecSpace, class WireView>
double daso_status(const ExecSpace &space, const WireView &wire) {
  typename WireView::non_const_value_type status{};
  space.fence();
  Kokkos::deep_copy(status, Kokkos::subview(wire, wire.extent(0) - 1));
  return DASOWire<typename WireView::non_const_value_type>::to(status);
}

/// The stale merge: params = (numer params + sum) / denom, with `sum` the received sum over
/// nodes (numer = 2 batches_to_wait, denom = nodes + numer).
template <class ExecSpace, class Params, class WireView>
void daso_merge(const ExecSpace &space, const Params &params, const WireView &sum, double numer,
                double denom) {
  Kokkos::parallel_for("kat::distributed::DASO::merge",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, params.extent(0)),
                       DASOMerge<Params, WireView>{params, sum, numer, denom});
}

/// The blocking average: params = sum / nodes, the division done in the wire type (as the
/// reference divides its bfloat16 buffer) and converted back.
template <class ExecSpace, class Params, class WireView>
void daso_mean(const ExecSpace &space, const Params &params, const WireView &sum, double nodes) {
  Kokkos::parallel_for("kat::distributed::DASO::mean",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, params.extent(0)),
                       DASOMean<Params, WireView>{params, sum, nodes});
}

} // namespace detail

/// DASO, Distributed Asynchronous and Selective Optimization (Coquelin, Debus, Götz, von der
/// Lehr, Kahn, Siggel, Streit: "Accelerating neural network training with distributed
/// asynchronous and selective optimization (DASO)", J. Big Data 9:14, 2022; reference code:
/// the DASO class of the Heat library), a kat::train::GradientSync for data-parallel training
/// across nodes whose network is much slower than the links inside a node.
///
/// **Groups.** The P ranks form N nodes of G ranks (Communicator::split_shared(): ranks that
/// share memory, or blocks of CommunicatorOptions::ranks_per_virtual_node ranks to emulate
/// nodes on one machine); every node must have the same G. Rank g of each node belongs to
/// global group g (Communicator::split_cross_node()): G communicators of N ranks, one per node.
///
/// **A step** (the skips (B, L, S) = (global_skip, local_skip, batches_to_wait) of the epoch,
/// from DASOSchedule or DASOOptions::fixed_skips; b the step's index in the epoch, its last
/// step b_last):
///
/// 1. Backward, then the node-local gradient all-reduce (the mean over the node's G ranks,
///    bucketed and overlapped with backward as DataParallel does). With L > 1 it is skipped on
///    some steps, as the reference's local skipping: it runs for steps whose position r = b mod
///    B in the cycle has r <= S or r mod L = 0 (and always with L = 1).
/// 2. The optimizer steps (any: SGD, Adam, K-FAC without a distributed strategy, FOSI).
/// 3. after_step(): if b mod B = 0 (B < 1: every step) or b = b_last, a global
///    synchronization: the ranks of group k (k cycling 0, 1, ..., G-1 over the syncs) start a
///    non-blocking all-reduce (MPI_Iallreduce, in chunks of sending_chunk_size elements) of
///    their flat parameter vector over the N nodes. It is received S steps later (S clipped at
///    the send so that it lands by b_last; with S >= B at the next sync, after that sync's
///    send), where group k's ranks merge it with the parameters they have trained meanwhile,
///
///        θ ← (2S·θ_local + Σ_nodes θ_sent) / (N + 2S)              (stale merge, S >= 1)
///
///    and broadcast the result to their node. With S = 0 or at b_last the send is received at
///    once, θ ← Σ_nodes θ_sent / N (with DASODowncast::bf16 in the blocking phases, B < 1,
///    sent and averaged in bfloat16), then broadcast to the node. So every epoch ends with all
///    replicas equal.
///
/// Where this differs from the reference code: the reference's step() tests "the step before
/// the next sync" before "S steps after the send", so with S = B - 1 (the schedule's (2, 1, 1))
/// it receives at the next sync instead, and it re-clips S at every step, receiving near the
/// epoch's end only at its last step; here a send is always received S steps after it (as the
/// paper and the reference's docstring describe). The reference supports nodes of one GPU
/// only with the G = 1 group missing; here G = 1 is one global group of all ranks.
///
/// With (B, L, S) = (1, 1, 0) and no downcast every step is a blocking average of the nodes'
/// parameters after a node-averaged gradient step: for SGD, synchronous data parallelism (the
/// same arithmetic up to rounding; bit for bit on one node or on values whose sums are exact).
///
/// **Errors in flight.** A non-finite parameter in a send is carried along with it (one status
/// element per send) and throws Error on every rank when the send completes, before anything
/// is merged, so no rank continues with NaNs and none waits for a rank that stopped.
///
/// **Use.** With the Trainer: set_gradient_sync(daso) (it calls every hook). In a loop of
/// one's own: install backward_hook() (or call on_gradients_ready per layer), then per step
/// before_step() after backward, the optimizer, after_step(); per epoch begin_epoch() before
/// the first step, end_epoch() after the last, epoch_end(loss) with the epoch's mean loss over
/// all ranks. Every rank makes the same calls. broadcast_parameters() before training.
///
/// @tparam Scalar      float or double
/// @tparam MemorySpace where the parameter and gradient buffers live
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class DASO : public train::GradientSync<Scalar, MemorySpace> {
public:
  using execution_space =
      typename MemorySpace::execution_space;       ///< where the averaging kernels run
  using vector_type = Vector<Scalar, MemorySpace>; ///< the flat parameter or gradient buffer

  /// @param comm        the ranks that train together; must outlive this object. Its
  ///                    split_shared() defines the nodes.
  /// @param parameters  the flat parameter vector (length n)
  /// @param gradients   the flat gradient vector (length n)
  /// @param layers      per layer its range of the flat buffers (as DataParallel's)
  /// @param options     the same on every rank
  ///
  /// Collective over `comm` (splits it twice, agrees on the node size and the layout).
  /// @throws ValueError if sending_chunk_size or bucket_bytes is 0, if a schedule option is
  ///   out of range, if fixed_skips has global_skip >= 1 with local_skip < 1 or a negative
  ///   batches_to_wait, or (on every rank) if the nodes have different numbers of ranks,
  ///   naming the smallest and largest; ShapeError and MPIError as DataParallel's constructor.
  DASO(Communicator &comm, vector_type parameters, vector_type gradients,
       std::vector<ParameterRange> layers, DASOOptions options = {})
      : comm_(&comm), params_(std::move(parameters)), grads_(std::move(gradients)),
        options_(std::move(options)), node_(comm.split_shared()), global_(comm.split_cross_node()),
        schedule_(options_.schedule, 1) {
    using kat::detail::concat;
    if (options_.sending_chunk_size == 0) {
      throw ValueError("kat::distributed::DASO: options.sending_chunk_size must be > 0, got 0");
    }
    if (options_.bucket_bytes == 0) {
      throw ValueError("kat::distributed::DASO: options.bucket_bytes must be > 0, got 0");
    }
    if (const auto &f = options_.fixed_skips;
        f && !f->blocking() && (f->local_skip < 1 || f->batches_to_wait < 0)) {
      throw ValueError(concat("kat::distributed::DASO: options.fixed_skips with global_skip ",
                              f->global_skip,
                              " >= 1 needs local_skip >= 1 and batches_to_wait "
                              ">= 0, got local_skip ",
                              f->local_skip, " and batches_to_wait ", f->batches_to_wait));
    }
    // Every node the same size: max of (G, -G) over all ranks.
    Kokkos::View<std::int64_t[2], Kokkos::HostSpace> g("kat::distributed::DASO::node_size");
    g(0) = node_.size();
    g(1) = -node_.size();
    comm.allreduce(Kokkos::DefaultHostExecutionSpace(), g, ReduceOp::max);
    if (g(0) != -g(1)) {
      throw ValueError(concat("kat::distributed::DASO: every node must have the same number of "
                              "ranks; node sizes range over [",
                              -g(1), ", ", g(0), "] (rank ", comm.rank(), " of ", comm.size(),
                              " is on a node of ", node_.size(), ")"));
    }
    DataParallelOptions dp;
    dp.bucket_bytes = options_.bucket_bytes;
    local_ = std::make_unique<DataParallel<Scalar, MemorySpace>>(node_, params_, grads_,
                                                                 std::move(layers), dp);
    node_buffer_ = vector_type(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::distributed::DASO::node_buffer"),
        params_.extent(0) + 1);
    // DASO's own communicators carry only its sends and node broadcasts, whose length the
    // ranks agreed on above: no agreement all-reduce per call (it would make every chunk and
    // broadcast a synchronization point).
    node_.set_checked(false);
    global_.set_checked(false);
    reset_stats(); // the set-up's agreement all-reduces are not training traffic
  }

  /// Takes the flat buffers and layer blocks of a model with parameters(), gradients() and
  /// buffer().blocks() (kat::nn::Sequential after compile()). Errors as the main constructor.
  template <class Model, std::enable_if_t<!Kokkos::is_view<Model>::value, int> = 0>
  DASO(Communicator &comm, const Model &model, DASOOptions options = {})
      : DASO(comm, model.parameters(), model.gradients(), parameter_ranges(model.buffer().blocks()),
             std::move(options)) {}

  DASO(const DASO &) = delete;
  DASO &operator=(const DASO &) = delete;
  ~DASO() override = default;

  /// G, the ranks of a node.
  int ranks_per_node() const noexcept { return node_.size(); }
  /// N, the nodes.
  int nodes() const noexcept { return global_.size(); }
  /// This rank's rank within its node, which is its global group.
  int group() const noexcept { return node_.rank(); }
  /// The node communicator (gradient all-reduces, broadcasts) and this rank's global one;
  /// both unchecked (CommunicatorOptions::checked off).
  Communicator &node_communicator() noexcept { return node_; }
  /// This rank's global communicator (the ranks with the same node-local rank, one per node).
  Communicator &global_communicator() noexcept { return global_; }
  /// The options given at construction.
  const DASOOptions &options() const noexcept { return options_; }
  /// The schedule (its skips are those of the epoch in progress unless fixed_skips is set).
  const DASOSchedule &schedule() const noexcept { return schedule_; }
  /// The skips of the epoch in progress (between epochs: of the next one).
  DASOSkips skips() const noexcept {
    return options_.fixed_skips ? *options_.fixed_skips : schedule_.skips();
  }
  /// Global synchronizations sent by this rank and not yet received.
  std::size_t pending() const noexcept { return pending_.size(); }
  /// Counters since construction or reset_stats(), with the communicators' traffic.
  DASOStats stats() const { return with_comm_stats(stats_); }

  /// kat::train::GradientSync: "daso".
  std::string name() const override { return "daso"; }
  /// "DASO on P ranks: N nodes x G ranks, ...".
  std::string summary() const override {
    const auto &o = options_.schedule;
    const DASOSkips k = skips();
    std::string schedule =
        options_.fixed_skips
            ? kat::detail::concat("fixed global_skip ", k.global_skip, ", local_skip ",
                                  k.local_skip, ", batches_to_wait ", k.batches_to_wait)
            : kat::detail::concat(o.warmup_epochs, " warm-up and ", o.cooldown_epochs,
                                  " cool-down epochs blocking, then (", o.after_warmup.global_skip,
                                  ", ", o.after_warmup.local_skip, ", ",
                                  o.after_warmup.batches_to_wait, "), max_global_skips ",
                                  o.max_global_skips, ", plateau ", o.stability_level, " over ",
                                  o.patience, " epochs");
    return kat::detail::concat("DASO on ", comm_->size(), " ranks: ", nodes(), " node",
                               nodes() == 1 ? "" : "s", " x ", ranks_per_node(), " rank",
                               ranks_per_node() == 1 ? "" : "s", "; ", schedule, "; chunks of ",
                               options_.sending_chunk_size, " elements, blocking averages in ",
                               options_.downcast == DASODowncast::bf16 ? "bf16" : "full precision");
  }

  /// Every rank's parameters become rank `root`'s of the whole communicator (blocking).
  /// @throws Error while global synchronizations are in flight; MPIError.
  void broadcast_parameters(const execution_space &space, int root = 0) {
    if (!pending_.empty()) {
      throw Error("kat::distributed::DASO::broadcast_parameters: global synchronizations are in "
                  "flight; call end_epoch() first");
    }
    comm_->broadcast(space, params_, root);
  }

  /// The callback for kat::nn::Sequential::set_backward_hook (on_gradients_ready).
  typename DataParallel<Scalar, MemorySpace>::BackwardHook
  backward_hook(const execution_space &space) {
    return [this, space](std::size_t layer) { on_gradients_ready(space, layer); };
  }

  /// kat::train::GradientSync: starts the node-local all-reduce of the buckets layer `layer`
  /// completes (on a step that synchronizes locally) and lets MPI progress the sends in flight.
  void on_gradients_ready(const execution_space &space, std::size_t layer) override {
    if (local_sync_) {
      local_->layer_done(space, layer);
    }
    progress();
  }

  /// kat::train::GradientSync: completes the node-local gradient average of this step (if it
  /// synchronizes locally).
  void before_step(const execution_space &space) override {
    ScopedRegion region("kat::distributed::DASO::before_step");
    if (local_sync_) {
      const auto t0 = Clock::now();
      local_->finish(space);
      stats_.local_seconds += seconds_since(t0);
      ++stats_.local_syncs;
    }
    progress();
  }

  /// kat::train::GradientSync: the global synchronization logic of the step (see the class).
  /// @throws Error if a completed send carried non-finite parameters, or before
  ///   begin_epoch(); MPIError.
  void after_step(const execution_space &space) override {
    ScopedRegion region("kat::distributed::DASO::after_step");
    if (steps_ == 0) {
      throw Error("kat::distributed::DASO::after_step: no epoch in progress; call begin_epoch() "
                  "with the epoch's step count first");
    }
    ++stats_.steps;
    const std::int64_t b = batch_;
    const std::int64_t last = static_cast<std::int64_t>(steps_) - 1;
    const DASOSkips k = skips();
    const std::int64_t gs = k.global_skip, ls = k.local_skip, wait = k.batches_to_wait;
    const std::int64_t gmod = gs > 0 ? b % gs : 0;
    const std::int64_t btw = wait + b <= last ? wait : last - b;
    if (b == last || gmod == 0) {
      global_sync(space, btw);
      return;
    }
    const std::int64_t next = b + 1;
    ++batch_;
    if (awaiting_ && gmod == stale_wait_) { // the send of this cycle's first step
      receive_stale(space);
      broadcast_in_node(space, previous_);
    }
    // The local-sync switch for the next step: the reference's DDP require_backward_grad_sync
    // logic in its step().
    if (next % gs == 0) {
      local_sync_ = true;
      return;
    }
    if (gmod < btw) {
      if (next == last) {
        local_sync_ = true;
      }
      return;
    }
    if (gmod == btw && ls > 1) {
      local_sync_ = false;
    }
    if (ls == 1 && next != last) {
      local_sync_ = true;
      return;
    }
    if (ls > 0 && b % ls == 0) {
      local_sync_ = false;
    } else if (ls > 0 && next % ls == 0) {
      local_sync_ = true;
    }
    if (next == last) {
      local_sync_ = true;
    }
  }

  /// kat::train::GradientSync: epoch `epoch` of `epochs` with `steps` steps starts at step
  /// `first`. Takes the schedule's skips (the schedule learns the run's length here).
  /// @throws ValueError if steps == 0 or first >= steps; Error while sends are in flight.
  void begin_epoch(const execution_space &space, std::int64_t epoch, std::int64_t epochs,
                   std::size_t steps, std::size_t first) override {
    (void)space;
    (void)epoch;
    using kat::detail::concat;
    if (steps == 0 || first >= steps) {
      throw ValueError(concat("kat::distributed::DASO::begin_epoch: needs steps >= 1 and first < "
                              "steps, got steps ",
                              steps, " and first ", first));
    }
    if (!pending_.empty()) {
      throw Error("kat::distributed::DASO::begin_epoch: sends of the last epoch are in flight; "
                  "call end_epoch() first");
    }
    schedule_.set_epochs(epochs);
    steps_ = steps;
    batch_ = static_cast<std::int64_t>(first);
    send_group_ = 0;
    previous_ = -1;
    awaiting_ = false;
  }

  /// kat::train::GradientSync: the epoch's last step is done; its after_step() completed every
  /// send, so this only checks that nothing is left. @throws Error if a step is missing.
  void end_epoch(const execution_space &space) override {
    (void)space;
    if (!pending_.empty() || batch_ != 0) {
      throw Error(kat::detail::concat(
          "kat::distributed::DASO::end_epoch: the epoch ended after step ", batch_, " of ", steps_,
          " with ", pending_.size(),
          " sends in flight; every rank must run all the steps given to begin_epoch()"));
    }
    steps_ = 0;
  }

  /// The schedule's update after epoch `epoch` with its mean training loss over all ranks:
  /// returns the next epoch's skips (unchanged with fixed_skips).
  DASOSkips epoch_end(std::int64_t epoch, double loss) {
    if (!options_.fixed_skips) {
      schedule_.epoch_end(epoch, loss);
    }
    return skips();
  }

  /// kat::train::GradientSync: epoch_end(summary.epoch, summary.train_loss); adds the metrics
  /// daso_global_skip, daso_local_skip, daso_batches_to_wait (of the epoch that ended),
  /// daso_local_bytes, daso_global_bytes, daso_internode_bytes, daso_local_s, daso_global_s
  /// (this rank's) and a note with the skips.
  void on_epoch_end(train::EpochSummary &summary) override {
    const DASOSkips ended = skips();
    const DASOStats s = stats();
    epoch_end(summary.epoch, summary.train_loss);
    summary.metrics.push_back({"daso_global_skip", double(ended.global_skip), 0});
    summary.metrics.push_back({"daso_local_skip", double(ended.local_skip), 0});
    summary.metrics.push_back({"daso_batches_to_wait", double(ended.batches_to_wait), 0});
    summary.metrics.push_back({"daso_local_bytes", double(s.local_bytes), 0});
    summary.metrics.push_back({"daso_global_bytes", double(s.global_bytes), 0});
    summary.metrics.push_back({"daso_internode_bytes", double(s.internode_bytes), 0});
    summary.metrics.push_back({"daso_local_s", s.local_seconds, 3});
    summary.metrics.push_back({"daso_global_s", s.global_seconds, 3});
    char times[96];
    std::snprintf(times, sizeof times, ", local %.3f s, global %.3f s", s.local_seconds,
                  s.global_seconds);
    summary.note +=
        "  daso " +
        (ended.blocking() ? std::string("blocking")
                          : kat::detail::concat("skips ", ended.global_skip, "/", ended.local_skip,
                                                "/", ended.batches_to_wait)) +
        times;
  }

  /// kat::train::GradientSync: the steps, payload bytes (local + global) and exposed seconds.
  train::SyncStats sync_stats() const override {
    const DASOStats s = stats();
    return {s.steps, s.local_bytes + s.global_bytes, s.local_seconds + s.global_seconds};
  }
  /// Starts stats() anew; the communicators' own counters keep counting.
  void reset_stats() override {
    stats_ = DASOStats{};
    local_base_ = node_.stats();
    global_base_ = global_.stats();
    local_->reset_stats();
  }

  /// The schedule's state and the local-sync switch: DASO's state between epochs, when
  /// nothing is in flight (every epoch ends with a blocking average).
  /// @throws Error inside an epoch (between begin_epoch() and end_epoch()).
  StateDict state_dict() const override {
    if (steps_ != 0) {
      throw Error("kat::distributed::DASO::state_dict: an epoch is in progress, and its global "
                  "synchronizations are in flight on some ranks; DASO's state is saved between "
                  "epochs (checkpoint at epoch ends)");
    }
    StateDict s;
    s.merge("schedule", schedule_.state_dict());
    s.set("local_sync", std::int64_t(local_sync_ ? 1 : 0));
    return s;
  }
  void load_state_dict(const StateDict &state) override {
    state.require_names("kat::distributed::DASO::load_state_dict", {"schedule.", "local_sync"});
    schedule_.load_state_dict(state.sub("schedule"));
    local_sync_ = state.get<std::int64_t>("local_sync") != 0;
  }

  /// reduce_metrics() over all ranks.
  Metrics reduce_metrics(const Metrics &local) const { return dist::reduce_metrics(*comm_, local); }

private:
  using Clock = std::chrono::steady_clock;
  using wire_vector = Kokkos::View<Scalar *, MemorySpace>;
  using bf16_vector = Kokkos::View<kat::bfloat16 *, MemorySpace>;

  /// One global synchronization sent by this rank's group.
  struct Send {
    std::int64_t batches_to_wait = 0; // the staleness it was sent with (the merge weight)
    bool bf16 = false;
    wire_vector full; // n + 1: the parameters and the non-finite count
    bf16_vector half; // the same in bfloat16
    std::vector<Request> requests;
    std::size_t step = 0; // the epoch's step it was sent at
  };

  static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  void progress() {
    for (auto &send : pending_) {
      for (auto &r : send.requests) {
        if (r.active()) {
          r.test();
        }
      }
    }
  }

  /// The reference's _global_sync: group send_group_ sends; with S != 0 the previous send is
  /// received; with S == 0 or at the last step the new one is received at once.
  void global_sync(const execution_space &space, std::int64_t btw) {
    const std::int64_t last = static_cast<std::int64_t>(steps_) - 1;
    const int k = send_group_;
    ++stats_.global_syncs;
    stats_.last_sending_group = k;
    if (group() == k) {
      send(space, btw);
    }
    const std::int64_t wait = skips().batches_to_wait;
    if (wait != 0) {
      // A send not received yet (batches_to_wait >= global_skip) is received now; the
      // previous group's node broadcast is repeated either way, as in the reference.
      if (awaiting_) {
        receive_stale(space);
      }
      broadcast_in_node(space, previous_);
    }
    const int groups = ranks_per_node();
    if (batch_ == last || wait == 0) {
      ++stats_.blocking_syncs;
      if (group() == k) {
        receive_now(space);
      }
      broadcast_in_node(space, k);
      previous_ = -1;
      awaiting_ = false;
      if (batch_ == last) {
        send_group_ = 0;
        batch_ = 0;
      } else {
        ++batch_;
        send_group_ = (send_group_ + 1) % groups;
      }
    } else {
      ++batch_;
      previous_ = send_group_;
      awaiting_ = true;
      stale_wait_ = btw;
      send_group_ = (send_group_ + 1) % groups;
    }
  }

  /// Packs the parameters (bf16 in the blocking phases with DASODowncast::bf16) and starts the
  /// chunked all-reduce over the nodes.
  void send(const execution_space &space, std::int64_t btw) {
    const auto t0 = Clock::now();
    Send s;
    s.batches_to_wait = btw;
    s.bf16 = skips().blocking() && options_.downcast == DASODowncast::bf16;
    s.step = static_cast<std::size_t>(batch_);
    const std::size_t n = params_.extent(0);
    if (s.bf16) {
      s.half = take(spare_half_, "kat::distributed::DASO::send_bf16", n + 1);
      detail::daso_pack(space, params_, s.half);
    } else {
      s.full = take(spare_full_, "kat::distributed::DASO::send", n + 1);
      detail::daso_pack(space, params_, s.full);
    }
    const std::size_t chunk = options_.sending_chunk_size;
    for (std::size_t begin = 0; begin < n + 1; begin += chunk) {
      const auto range = std::make_pair(begin, std::min(n + 1, begin + chunk));
      if (s.bf16) {
        s.requests.push_back(global_.iallreduce(space, Kokkos::subview(s.half, range)));
      } else {
        s.requests.push_back(global_.iallreduce(space, Kokkos::subview(s.full, range)));
      }
    }
    ++stats_.sends;
    pending_.push_back(std::move(s));
    stats_.global_seconds += seconds_since(t0);
  }

  /// Waits for the oldest send and returns it; throws Error on every receiving rank if it
  /// carried non-finite parameters.
  Send complete_oldest(const execution_space &space) {
    Send s = std::move(pending_.front());
    pending_.pop_front();
    for (auto &r : s.requests) {
      r.wait();
    }
    const double bad =
        s.bf16 ? detail::daso_status(space, s.half) : detail::daso_status(space, s.full);
    if (bad != 0) {
      status_ = bad;
    }
    return s;
  }

  /// The reference's _gs_rcv_update_params: the previous group's ranks merge its send.
  void receive_stale(const execution_space &space) {
    awaiting_ = false;
    if (previous_ < 0 || group() != previous_) {
      return;
    }
    const auto t0 = Clock::now();
    Send s = complete_oldest(space);
    if (status_ == 0) {
      const double numer = s.batches_to_wait > 0 ? 2.0 * double(s.batches_to_wait) : 1.0;
      const double denom = double(nodes()) + numer;
      if (s.bf16) {
        detail::daso_merge(space, params_, s.half, numer, denom);
      } else {
        detail::daso_merge(space, params_, s.full, numer, denom);
      }
      ++stats_.stale_merges;
    }
    give_back(std::move(s));
    stats_.global_seconds += seconds_since(t0);
  }

  /// The reference's _gs_rcv_update_params_last_batch: the plain mean of the send just made.
  void receive_now(const execution_space &space) {
    const auto t0 = Clock::now();
    Send s = complete_oldest(space);
    if (status_ == 0) {
      if (s.bf16) {
        detail::daso_mean(space, params_, s.half, double(nodes()));
      } else {
        detail::daso_mean(space, params_, s.full, double(nodes()));
      }
    }
    give_back(std::move(s));
    stats_.global_seconds += seconds_since(t0);
  }

  /// Node-local rank `root` broadcasts its parameters, with the status of what it received
  /// (non-finite values in a send), to its node; throws on every rank of the node if that
  /// status is not 0. root < 0: nothing.
  void broadcast_in_node(const execution_space &space, int root) {
    if (root < 0) {
      return;
    }
    const auto t0 = Clock::now();
    const std::size_t n = params_.extent(0);
    const auto head = Kokkos::subview(node_buffer_, std::make_pair(std::size_t(0), n));
    if (group() == root) {
      Kokkos::deep_copy(space, head, params_);
      Kokkos::deep_copy(space, Kokkos::subview(node_buffer_, n), static_cast<Scalar>(status_));
    }
    node_.broadcast(space, node_buffer_, root);
    const double status = detail::daso_status(space, node_buffer_);
    stats_.local_seconds += seconds_since(t0);
    status_ = 0;
    if (status != 0) {
      pending_.clear();
      throw Error(kat::detail::concat(
          "kat::distributed::DASO: a global synchronization sent at step ", batch_,
          " of the epoch held ", status,
          " non-finite parameter values (summed over the sending ranks of group ", root,
          "); training diverged (lower the learning rate) and nothing was merged"));
    }
    if (group() != root) {
      Kokkos::deep_copy(space, params_, head);
    }
  }

  template <class V> V take(std::vector<V> &spare, const char *label, std::size_t n) {
    if (!spare.empty()) {
      V v = spare.back();
      spare.pop_back();
      return v;
    }
    return V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
  }
  void give_back(Send &&s) {
    if (s.half.extent(0) > 0) {
      spare_half_.push_back(s.half);
    }
    if (s.full.extent(0) > 0) {
      spare_full_.push_back(s.full);
    }
  }

  DASOStats with_comm_stats(DASOStats s) const {
    const CommunicatorStats local = node_.stats(), global = global_.stats();
    s.local_bytes = local.total().bytes - local_base_.total().bytes;
    s.global_bytes = global.total().bytes - global_base_.total().bytes;
    s.internode_bytes = local.internode.bytes - local_base_.internode.bytes +
                        global.internode.bytes - global_base_.internode.bytes;
    return s;
  }

  Communicator *comm_;
  vector_type params_;
  vector_type grads_;
  DASOOptions options_;
  Communicator node_;
  Communicator global_;
  DASOSchedule schedule_;
  std::unique_ptr<DataParallel<Scalar, MemorySpace>> local_;
  vector_type node_buffer_;
  std::size_t steps_ = 0;       // the epoch's steps (0: no epoch in progress)
  std::int64_t batch_ = 0;      // the next step's index in the epoch
  int send_group_ = 0;          // the group of the next global synchronization
  int previous_ = -1;           // the group of the last stale send (-1: none this cycle)
  bool awaiting_ = false;       // whether that send is still to be received
  std::int64_t stale_wait_ = 0; // its batches_to_wait, clipped to the epoch's end
  bool local_sync_ = true;      // whether the coming step all-reduces gradients in the node
  double status_ = 0;           // non-finite values in the last completed send (this rank's)
  std::deque<Send> pending_;
  std::vector<wire_vector> spare_full_;
  std::vector<bf16_vector> spare_half_;
  DASOStats stats_;
  CommunicatorStats local_base_; // the communicators' counters at reset_stats()
  CommunicatorStats global_base_;
};

/// DASO's options as command-line flags (kat_train's, with --dist-strategy daso): the
/// DASOOptions and DASOScheduleOptions fields with the reference's names and defaults.
inline std::vector<train::OptionSpec> daso_option_specs() {
  return {
      {"daso-warmup-epochs", "DASO: blocking epochs at the start", "4"},
      {"daso-cooldown-epochs", "DASO: blocking epochs at the end", "4"},
      {"daso-max-global-skips", "DASO: global_skip after a plateau at global_skip 1", "8"},
      {"daso-skip-reduction-factor",
       "DASO: global_skip and local_skip are divided by it on a plateau", "2"},
      {"daso-local-skip-factor",
       "DASO: local_skip and batches_to_wait after a reset are max-global-skips over it", "4"},
      {"daso-stability-level", "DASO: the plateau detector's relative threshold", "0.05"},
      {"daso-patience", "DASO: epochs without improvement before a plateau", "2"},
      {"daso-sending-chunk-size", "DASO: elements per non-blocking all-reduce of a global sync",
       "10000000"},
      {"daso-downcast", "DASO: the blocking averages' wire type", "bf16", {"bf16", "none"}},
      {"daso-fixed-skips",
       "DASO: global_skip,local_skip,batches_to_wait held every epoch instead of the schedule "
       "(1,1,0: synchronous)"},
  };
}

/// DASOOptions from `c` (daso_option_specs() names; missing ones take their defaults).
/// @throws ValueError naming the option for a value that is not a number of the expected
///   kind or out of range, or daso-fixed-skips that is not three integers.
inline DASOOptions daso_options(const train::Config &c) {
  using kat::detail::concat;
  DASOOptions o;
  auto &s = o.schedule;
  const auto integer = [&](const char *name, std::int64_t fallback, std::int64_t min) {
    const std::int64_t v = c.has(name) ? c.integer(name) : fallback;
    if (v < min) {
      throw ValueError(concat("option --", name, " must be >= ", min, ", got ", v));
    }
    return v;
  };
  s.warmup_epochs = integer("daso-warmup-epochs", s.warmup_epochs, 0);
  s.cooldown_epochs = integer("daso-cooldown-epochs", s.cooldown_epochs, 0);
  s.max_global_skips = integer("daso-max-global-skips", s.max_global_skips, 1);
  s.skip_reduction_factor = integer("daso-skip-reduction-factor", s.skip_reduction_factor, 1);
  s.local_skip_factor = integer("daso-local-skip-factor", s.local_skip_factor, 1);
  s.patience = integer("daso-patience", s.patience, 0);
  if (c.has("daso-stability-level")) {
    s.stability_level = c.number("daso-stability-level");
    if (!(s.stability_level >= 0 && s.stability_level < 1)) {
      throw ValueError(
          concat("option --daso-stability-level must be in [0, 1), got ", s.stability_level));
    }
  }
  o.sending_chunk_size = static_cast<std::size_t>(
      integer("daso-sending-chunk-size", std::int64_t(o.sending_chunk_size), 1));
  if (c.has("daso-downcast")) {
    const std::string &d = c.text("daso-downcast");
    if (d != "bf16" && d != "none") {
      throw ValueError("option --daso-downcast must be bf16 or none, got '" + d + "'");
    }
    o.downcast = d == "bf16" ? DASODowncast::bf16 : DASODowncast::none;
  }
  if (c.has("daso-fixed-skips") && !c.text("daso-fixed-skips").empty()) {
    const auto parts = c.list("daso-fixed-skips");
    train::Config one;
    std::int64_t v[3] = {0, 0, 0};
    const bool three = parts.size() == 3;
    for (std::size_t i = 0; three && i < 3; ++i) {
      one.set("daso-fixed-skips", parts[i]);
      v[i] = one.integer("daso-fixed-skips");
    }
    if (!three || v[0] < 0 || (v[0] >= 1 && (v[1] < 1 || v[2] < 0))) {
      throw ValueError("option --daso-fixed-skips must be global_skip,local_skip,batches_to_wait "
                       "(global_skip 0 for blocking, else local_skip >= 1 and batches_to_wait "
                       ">= 0), got '" +
                       c.text("daso-fixed-skips") + "'");
    }
    o.fixed_skips = DASOSkips{v[0], v[1], v[2]};
  }
  return o;
}

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
