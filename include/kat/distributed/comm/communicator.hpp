#pragma once
/// @file
/// @brief kat::distributed::Communicator, the one place KAT calls MPI: collectives on Kokkos views,
/// host staging when MPI cannot read device memory, shape checks that turn mismatched
/// arguments into exceptions instead of hangs, MPI errors as exceptions, and per-collective
/// byte and call counters. Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/comm/communicator.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/distributed/comm/detail/mpi.hpp"
#include "kat/distributed/comm/emulated_link.hpp"

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace kat::distributed {

/// An MPI call returned an error. The message names the operation, the rank (in the
/// communicator and in MPI_COMM_WORLD) and MPI's error string; code() is MPI's error code.
class MPIError : public Error {
public:
  /// An error with `message` (naming the operation, the ranks and MPI's error string) and
  /// MPI's error `code`.
  MPIError(const std::string &message, int code) : Error(message), code_(code) {}
  /// MPI's error code (pass it to MPI_Error_class for the class).
  int code() const noexcept { return code_; }

private:
  int code_;
};

/// Whether collectives copy views through host memory around the MPI call.
enum class Staging {
  /// Stage only memory the host cannot access (device memory), and only when MPI cannot read
  /// it: Open MPI's MPIX_Query_cuda_support() (CUDA) or MPIX_Query_rocm_support() (HIP, Open
  /// MPI 5) decide; any other MPI is assumed to read host memory only.
  automatic,
  /// Always copy into a freshly allocated host buffer (tests, or an MPI whose GPU support is
  /// known to be broken).
  always,
  /// Hand the view's pointer to MPI as is (a GPU-aware MPI the detection does not recognise).
  never,
};

/// Reduction applied element-wise by allreduce and reduce_scatter.
enum class ReduceOp { sum, max, min };

/// Settings of a Communicator; communicators derived from it (dup, split) inherit them.
struct CommunicatorOptions {
  /// See Staging.
  Staging staging = Staging::automatic;
  /// Before each collective whose ranks must agree on the element count, all-reduce the count
  /// (and the root, and whether every rank's arguments are valid) so that mismatches throw on
  /// every rank instead of hanging or corrupting memory. Costs one MPI_Allreduce of 40 bytes
  /// per collective (counted in CommunicatorStats::shape_check). Off: arguments are only
  /// checked locally, and a rank whose local check fails throws while the others enter the
  /// collective.
  bool checked = true;
  /// 0: split_shared() groups the ranks that share memory (MPI_COMM_TYPE_SHARED). k > 0:
  /// "nodes" are blocks of k consecutive ranks (the last may be smaller), so hierarchical
  /// schemes can be tested on one machine.
  int ranks_per_virtual_node = 0;
  /// The emulated link between the virtual nodes (EmulatedLink); needs ranks_per_virtual_node
  /// > 0. The virtual node of a rank is then its MPI_COMM_WORLD rank divided by
  /// ranks_per_virtual_node, for every communicator.
  EmulatedLink internode_link{};
};

/// Calls and payload bytes of one kind of collective on one rank.
struct CollectiveCounter {
  std::uint64_t calls = 0; ///< successful calls
  std::uint64_t bytes = 0; ///< payload bytes handed to MPI

  /// Adds `other`'s calls and bytes.
  CollectiveCounter &operator+=(const CollectiveCounter &other) {
    calls += other.calls;
    bytes += other.bytes;
    return *this;
  }
};

/// What one rank passed to MPI through one Communicator since construction or reset_stats().
///
/// `bytes` is the payload this rank hands to MPI, element count x sizeof(scalar), counted once
/// per successful call:
///
/// | counter        | bytes per call on each rank                                           |
/// |----------------|-----------------------------------------------------------------------|
/// | allreduce      | n of the (in or in-out) view; average() counts here too               |
/// | iallreduce     | n of the (in or in-out) view                                          |
/// | broadcast      | n of the view, on every rank, root included                           |
/// | ibroadcast     | n of the view, on every rank, root included                           |
/// | allgather      | n of `in`, this rank's contribution (not the size() x n gathered)     |
/// | reduce_scatter | n of `in`, the whole input (size() x the block this rank receives)    |
/// | barrier        | 0                                                                     |
/// | send           | n of the view sent (isend)                                            |
/// | recv           | n of the view received into (irecv), counted when the receive is posted |
/// | shape_check    | 40 (5 int64) per checked collective; not part of total()              |
/// | staging        | bytes copied between a view and a host staging buffer, each direction |
/// | internode      | with virtual nodes: the calls above whose ranks span several nodes    |
///
/// These are buffer sizes, not wire traffic: a ring all-reduce of n bytes moves about
/// 2 (size()-1)/size() x n bytes per rank. Compare analytic volumes in the same units.
struct CommunicatorStats {
  CollectiveCounter allreduce;      ///< blocking all-reduces (and average())
  CollectiveCounter iallreduce;     ///< non-blocking all-reduces
  CollectiveCounter broadcast;      ///< blocking broadcasts
  CollectiveCounter ibroadcast;     ///< non-blocking broadcasts
  CollectiveCounter allgather;      ///< all-gathers
  CollectiveCounter reduce_scatter; ///< reduce-scatters
  CollectiveCounter barrier;        ///< barriers (0 bytes)
  /// Point-to-point messages (isend, irecv).
  CollectiveCounter send;
  CollectiveCounter recv; ///< receives (irecv), counted when posted
  /// The agreement all-reduces of CommunicatorOptions::checked.
  CollectiveCounter shape_check;
  /// Host staging copies (calls = copies, bytes = bytes copied); not part of total().
  CollectiveCounter staging;
  /// With virtual nodes (CommunicatorOptions::ranks_per_virtual_node > 0): the operations
  /// above, agreement all-reduces included, whose ranks span more than one node (messages to
  /// a peer on another node), and their bytes: the traffic over the inter-node network. A
  /// subset of the others, not part of total().
  CollectiveCounter internode;
  /// Seconds of emulated link time (EmulatedLink::seconds) of the internode operations: what
  /// they cost if nothing hid them.
  double internode_seconds = 0;

  /// Adds every counter of `other` (e.g. to total several communicators).
  CommunicatorStats &operator+=(const CommunicatorStats &other) {
    allreduce += other.allreduce;
    iallreduce += other.iallreduce;
    broadcast += other.broadcast;
    ibroadcast += other.ibroadcast;
    allgather += other.allgather;
    reduce_scatter += other.reduce_scatter;
    barrier += other.barrier;
    send += other.send;
    recv += other.recv;
    shape_check += other.shape_check;
    staging += other.staging;
    internode += other.internode;
    internode_seconds += other.internode_seconds;
    return *this;
  }

  /// Sum over the payload operations (everything but shape_check and staging).
  CollectiveCounter total() const {
    CollectiveCounter t;
    for (const auto *c : {&allreduce, &iallreduce, &broadcast, &ibroadcast, &allgather,
                          &reduce_scatter, &barrier, &send, &recv})
      t += *c;
    return t;
  }
};

/// An in-flight non-blocking operation (iallreduce, ibroadcast, isend, irecv). It holds the views
/// and any host staging buffers until the operation completes; completion (wait(), a test() that
/// returns true, or the destructor) copies staged results back into the view. The destructor
/// waits, so a request is never leaked; an error found there is printed to stderr, since a
/// destructor cannot throw: call wait() to get it as an exception.
///
/// Until completion the view must not be read (output) or written (input). The Communicator
/// may be destroyed first: MPI keeps the communicator alive until its operations complete.
/// A Request holds Kokkos views, so destroy it before Kokkos::finalize.
class Request {
public:
  /// An empty request: already complete.
  Request() = default;
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  /// Takes over `other`'s pending operation; `other` becomes an empty request.
  Request(Request &&other) noexcept
      : request_(std::exchange(other.request_, MPI_REQUEST_NULL)),
        active_(std::exchange(other.active_, false)),
        transferred_(std::exchange(other.transferred_, false)), not_before_(other.not_before_),
        name_(std::move(other.name_)), rank_text_(std::move(other.rank_text_)),
        finish_(std::exchange(other.finish_, nullptr)) {}
  /// Waits for the request held so far, then takes over `other`'s.
  /// @throws MPIError if waiting for the current request fails.
  Request &operator=(Request &&other) {
    if (this != &other) {
      wait();
      request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
      active_ = std::exchange(other.active_, false);
      transferred_ = std::exchange(other.transferred_, false);
      not_before_ = other.not_before_;
      name_ = std::move(other.name_);
      rank_text_ = std::move(other.rank_text_);
      finish_ = std::exchange(other.finish_, nullptr);
    }
    return *this;
  }
  ~Request() {
    if (!active_ || !detail::mpi_active()) {
      return;
    }
    try {
      wait();
    } catch (const std::exception &e) {
      std::fprintf(stderr, "%s (in ~Request; call wait() to receive it as an exception)\n",
                   e.what());
    }
  }

  /// Blocks until the operation is complete and its result is in the view (for work on the
  /// execution space the collective was issued on, and on host). Under an EmulatedLink, not
  /// before the link time has passed since the operation started.
  /// @throws MPIError if MPI reports an error for the operation.
  void wait() {
    if (!active_) {
      return;
    }
    active_ = false;
    const int code = transferred_ ? MPI_SUCCESS : MPI_Wait(&request_, MPI_STATUS_IGNORE);
    transferred_ = false;
    auto finish = std::exchange(finish_, nullptr);
    if (code != MPI_SUCCESS) {
      throw error(code);
    }
    std::this_thread::sleep_until(not_before_);
    if (finish) {
      finish();
    }
  }

  /// Whether the operation is complete; when it is, the result has been copied into the view.
  /// @throws MPIError if MPI reports an error for the operation.
  bool test() {
    if (!active_) {
      return true;
    }
    if (!transferred_) {
      int done = 0;
      const int code = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        active_ = false;
        finish_ = nullptr;
        throw error(code);
      }
      transferred_ = done != 0;
    }
    if (!transferred_ || std::chrono::steady_clock::now() < not_before_) {
      return false;
    }
    active_ = false;
    transferred_ = false;
    if (auto finish = std::exchange(finish_, nullptr)) {
      finish();
    }
    return true;
  }

  /// True until the operation has been completed by wait() or test().
  bool active() const noexcept { return active_; }

private:
  friend class Communicator;
  Request(MPI_Request request, std::string name, std::string rank_text,
          std::function<void()> finish, std::chrono::steady_clock::time_point not_before)
      : request_(request), active_(true), not_before_(not_before), name_(std::move(name)),
        rank_text_(std::move(rank_text)), finish_(std::move(finish)) {}

  MPIError error(int code) const {
    return MPIError(kat::detail::concat(name_, ": MPI error on ", rank_text_,
                                        " while completing: ", detail::error_string(code)),
                    code);
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  bool active_ = false;
  bool transferred_ = false; // MPI completed it; the emulated link time may not have passed
  std::chrono::steady_clock::time_point not_before_{};
  std::string name_;
  std::string rank_text_;
  std::function<void()> finish_;
};

/// An MPI communicator with collectives on Kokkos views.
///
/// **Views.** Every collective takes rank-1 views (any layout, contiguous) or rank-2
/// `LayoutLeft` contiguous views (kat::Matrix) of `float`, `double`, `std::int32_t` or
/// `std::int64_t`, in any memory space; a rank-2 view is treated as its size() elements in
/// memory order. Counts must fit MPI's `int`.
///
/// **Execution space.** Each collective takes first the execution-space instance that produced
/// the input and will consume the output. It is fenced before MPI reads the data; staging
/// copies run on it. Blocking collectives return with the result in the view (average()'s
/// final scaling is a kernel enqueued on the space).
///
/// **Errors.** The communicator uses MPI_ERRORS_RETURN (set on every communicator it wraps or
/// creates); any failing MPI call throws MPIError on the ranks where it failed. Arguments are
/// checked before MPI is called; with CommunicatorOptions::checked (the default) the ranks
/// agree on element counts and roots first, so a mismatch throws ShapeError (counts, view
/// extents, contiguity) or ValueError (roots) on every rank rather than hanging.
///
/// **Ownership.** Communicators made by dup() and the splits free their MPI_Comm in the
/// destructor; world() and borrow() never free theirs. Movable, not copyable. Not thread-safe.
/// MPI must be initialized before a Communicator is made and finalized after the last one
/// is destroyed.
class Communicator {
  using Clock = std::chrono::steady_clock;

public:
  /// Colour for split() that leaves the calling rank out: it gets a null communicator.
  static constexpr int undefined_color = MPI_UNDEFINED;

  /// MPI_COMM_WORLD (not freed on destruction).
  /// @throws Error if MPI is not initialized; ValueError for invalid options.
  static Communicator world(const CommunicatorOptions &options = {}) {
    return borrow(MPI_COMM_WORLD, options);
  }

  /// Wraps a communicator the caller owns and keeps alive (not freed on destruction). Its
  /// error handler is set to MPI_ERRORS_RETURN.
  /// @throws Error if MPI is not initialized; ValueError for MPI_COMM_NULL or invalid options.
  static Communicator borrow(MPI_Comm comm, const CommunicatorOptions &options = {}) {
    if (!detail::mpi_active()) {
      throw Error("kat::distributed::Communicator: MPI is not initialized (call MPI_Init before "
                  "making a Communicator, MPI_Finalize after destroying the last one)");
    }
    if (comm == MPI_COMM_NULL) {
      throw ValueError("kat::distributed::Communicator::borrow: comm must not be MPI_COMM_NULL");
    }
    validate(options);
    return Communicator(comm, false, options);
  }

  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;
  /// Takes over `other`'s handle, options and counters; `other` becomes null.
  Communicator(Communicator &&other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        owned_(std::exchange(other.owned_, false)), rank_(std::exchange(other.rank_, -1)),
        size_(std::exchange(other.size_, 0)), world_rank_(other.world_rank_),
        options_(other.options_), device_aware_(other.device_aware_), stats_(other.stats_),
        world_ranks_(std::move(other.world_ranks_)),
        spans_nodes_(std::exchange(other.spans_nodes_, false)) {}
  /// Releases this communicator's handle, then takes over `other`'s; `other` becomes null.
  Communicator &operator=(Communicator &&other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(other.owned_, false);
      rank_ = std::exchange(other.rank_, -1);
      size_ = std::exchange(other.size_, 0);
      world_rank_ = other.world_rank_;
      options_ = other.options_;
      device_aware_ = other.device_aware_;
      stats_ = other.stats_;
      world_ranks_ = std::move(other.world_ranks_);
      spans_nodes_ = std::exchange(other.spans_nodes_, false);
    }
    return *this;
  }
  ~Communicator() { release(); }

  /// This process's rank in the communicator, 0 <= rank() < size(); -1 when null.
  int rank() const noexcept { return rank_; }
  /// Number of ranks; 0 when null.
  int size() const noexcept { return size_; }
  /// The wrapped MPI handle (MPI_COMM_NULL when null), for code that calls MPI itself.
  MPI_Comm native() const noexcept { return comm_; }
  /// True for a moved-from communicator or one from split(undefined_color, ...).
  bool is_null() const noexcept { return comm_ == MPI_COMM_NULL; }
  /// Whether the destructor frees the MPI handle (dup and splits: yes; world, borrow: no).
  bool owns_handle() const noexcept { return owned_; }

  /// The options it was made with (derived communicators inherit them).
  const CommunicatorOptions &options() const noexcept { return options_; }
  /// How views in device memory reach MPI (see Staging).
  Staging staging() const noexcept { return options_.staging; }
  /// Sets staging() for the following operations.
  void set_staging(Staging staging) noexcept { options_.staging = staging; }
  /// Whether every collective first checks that all ranks pass the same shape (an agreement
  /// all-reduce; CommunicatorOptions::checked).
  bool checked() const noexcept { return options_.checked; }
  /// Must be the same on all ranks (it decides whether they run the agreement all-reduce).
  void set_checked(bool checked) noexcept { options_.checked = checked; }
  /// Ranks per virtual node (CommunicatorOptions::ranks_per_virtual_node; 0: none).
  int ranks_per_virtual_node() const noexcept { return options_.ranks_per_virtual_node; }
  /// @throws ValueError if k < 0, or k = 0 with an active internode_link().
  void set_ranks_per_virtual_node(int k) {
    CommunicatorOptions o = options_;
    o.ranks_per_virtual_node = k;
    validate(o);
    options_ = o;
    find_nodes();
  }
  /// The emulated inter-node link (CommunicatorOptions::internode_link).
  const EmulatedLink &internode_link() const noexcept { return options_.internode_link; }
  /// Must be the same on all ranks for the delays to agree (each rank delays its own calls).
  /// @throws ValueError for a negative or non-finite latency or bandwidth, or an active link
  ///   without ranks_per_virtual_node() > 0.
  void set_internode_link(const EmulatedLink &link) {
    CommunicatorOptions o = options_;
    o.internode_link = link;
    validate(o);
    options_ = o;
  }
  /// With virtual nodes: whether this communicator's ranks lie on more than one (so its
  /// collectives cross the inter-node link). False without virtual nodes.
  bool spans_nodes() const noexcept { return spans_nodes_; }
  /// Whether a view in MemorySpace would be staged through host memory under the current
  /// staging policy.
  template <class MemorySpace> bool stages() const noexcept {
    switch (options_.staging) {
    case Staging::never:
      return false;
    case Staging::always:
      return true;
    case Staging::automatic:
      break;
    }
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
      return false;
    } else {
      return !device_aware_;
    }
  }

  /// Counters since construction or the last reset_stats(); see CommunicatorStats for what a
  /// byte is. Local to this rank and this Communicator (derived communicators count their own).
  CommunicatorStats stats() const noexcept { return stats_; }
  /// Sets every counter of stats() to 0.
  void reset_stats() noexcept { stats_ = CommunicatorStats{}; }

  // --- derived communicators (collective over this communicator; they inherit options) ----

  /// A new communicator with the same group (MPI_Comm_dup), freed on destruction.
  /// @throws MPIError
  Communicator dup() const {
    require_valid("dup");
    MPI_Comm comm = MPI_COMM_NULL;
    check("dup", MPI_Comm_dup(comm_, &comm));
    return Communicator(comm, true, options_);
  }

  /// Ranks with the same `color` form a communicator, ordered by `key` then by rank
  /// (MPI_Comm_split). A rank passing undefined_color gets a null communicator.
  /// @throws ValueError if color is negative and not undefined_color; MPIError.
  Communicator split(int color, int key) const {
    require_valid("split");
    if (color < 0 && color != undefined_color) {
      throw ValueError(kat::detail::concat(
          "kat::distributed::Communicator::split: color must be >= 0 or undefined_color, got ",
          color, " on ", rank_text()));
    }
    MPI_Comm comm = MPI_COMM_NULL;
    check("split", MPI_Comm_split(comm_, color, key, &comm));
    return Communicator(comm, true, options_);
  }

  /// The ranks of this communicator on this rank's node, in rank order: those sharing memory
  /// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED), or with ranks_per_virtual_node() = k > 0
  /// the block of ranks [k floor(rank/k), k floor(rank/k) + k).
  /// @throws MPIError
  Communicator split_shared() const {
    require_valid("split_shared");
    if (options_.ranks_per_virtual_node > 0) {
      return split(rank_ / options_.ranks_per_virtual_node, rank_);
    }
    MPI_Comm comm = MPI_COMM_NULL;
    check("split_shared",
          MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &comm));
    return Communicator(comm, true, options_);
  }

  /// One rank per node: the ranks whose rank within their node (split_shared()) equals this
  /// rank's, in rank order. With ranks_per_virtual_node() = k: ranks congruent modulo k.
  /// @throws MPIError
  Communicator split_cross_node() const {
    require_valid("split_cross_node");
    const int local = options_.ranks_per_virtual_node > 0 ? rank_ % options_.ranks_per_virtual_node
                                                          : split_shared().rank();
    return split(local, rank_);
  }

  // --- blocking collectives --------------------------------------------------------------

  /// In place: `inout` becomes the element-wise reduction over ranks (MPI_Allreduce with
  /// MPI_IN_PLACE). Every rank passes the same element count n.
  /// @throws ShapeError if counts differ across ranks or a view is not contiguous; MPIError.
  template <class ExecSpace, class View>
  void allreduce(const ExecSpace &space, const View &inout, ReduceOp op = ReduceOp::sum) {
    static_check<ExecSpace, View, true>();
    ScopedRegion region("kat::distributed::allreduce");
    allreduce_in_place("allreduce", space, inout, op);
  }

  /// Out of place: out = reduction over ranks of `in`. `in` and `out` have the same number of
  /// elements n on a rank (any mix of the accepted shapes) and must not overlap, unless they
  /// are the same memory (then this is the in-place form).
  /// @throws ShapeError if out.size() != in.size(), counts differ across ranks, or a view is
  /// not contiguous; MPIError.
  template <class ExecSpace, class InView, class OutView,
            std::enable_if_t<Kokkos::is_view<OutView>::value, int> = 0>
  void allreduce(const ExecSpace &space, const InView &in, const OutView &out,
                 ReduceOp op = ReduceOp::sum) {
    static_check_pair<ExecSpace, InView, OutView>();
    ScopedRegion region("kat::distributed::allreduce");
    allreduce_out_of_place("allreduce", space, in, out, op);
  }

  /// In place: `inout` becomes the element-wise mean over ranks (sum all-reduce, then a
  /// kernel on `space` multiplies by 1/size()). Counted as one allreduce.
  /// @throws as allreduce.
  template <class ExecSpace, class View> void average(const ExecSpace &space, const View &inout) {
    static_check<ExecSpace, View, true>();
    static_assert(std::is_floating_point_v<typename View::non_const_value_type>,
                  "kat::distributed::Communicator::average: needs a floating-point view");
    ScopedRegion region("kat::distributed::average");
    allreduce_in_place("average", space, inout, ReduceOp::sum);
    scale_by_size(space, inout);
  }

  /// Out of place: out = mean over ranks of `in`; shapes as the out-of-place allreduce.
  template <class ExecSpace, class InView, class OutView>
  void average(const ExecSpace &space, const InView &in, const OutView &out) {
    static_check_pair<ExecSpace, InView, OutView>();
    static_assert(std::is_floating_point_v<typename OutView::non_const_value_type>,
                  "kat::distributed::Communicator::average: needs floating-point views");
    ScopedRegion region("kat::distributed::average");
    allreduce_out_of_place("average", space, in, out, ReduceOp::sum);
    scale_by_size(space, out);
  }

  /// Every rank's `view` becomes the root's (MPI_Bcast). Same element count and root on every
  /// rank; 0 <= root < size().
  /// @throws ShapeError if counts differ, ValueError if roots differ across ranks; MPIError
  /// (e.g. MPI_ERR_ROOT for a root out of range).
  template <class ExecSpace, class View>
  void broadcast(const ExecSpace &space, const View &view, int root) {
    static_check<ExecSpace, View, true>();
    ScopedRegion region("kat::distributed::broadcast");
    using T = typename View::non_const_value_type;
    const char *op = "broadcast";
    agree(op, view.size(), root, view_error(op, "view", view));
    const bool is_root = rank_ == root;
    run_in_place(op, space, view, is_root, !is_root, stats_.broadcast, [&](T *data) {
      return MPI_Bcast(data, count(view), detail::mpi_datatype<T>(), root, comm_);
    });
  }

  /// Gathers every rank's n-element `in` into `out` (size() x n elements) on every rank, rank
  /// r's block at elements [r n, (r+1) n) (for an n x size() LayoutLeft matrix: column r).
  /// Every rank passes the same n; `in` and `out` must not overlap.
  /// @throws ShapeError if out.size() != size() * in.size(), counts differ, or a view is not
  /// contiguous; MPIError.
  template <class ExecSpace, class InView, class OutView>
  void allgather(const ExecSpace &space, const InView &in, const OutView &out) {
    static_check_pair<ExecSpace, InView, OutView>();
    ScopedRegion region("kat::distributed::allgather");
    using T = typename OutView::non_const_value_type;
    const char *op = "allgather";
    agree(op, in.size(), 0, blocks_error(op, in, out, true));
    run_pair(op, space, in, out, stats_.allgather, [&](const T *source, T *target) {
      const MPI_Datatype type = detail::mpi_datatype<T>();
      return MPI_Allgather(source, count(in), type, target, count(in), type, comm_);
    });
  }

  /// Equal-block reduce-scatter (MPI_Reduce_scatter_block): `in` has size() x m elements on
  /// every rank, and rank r's m-element `out` becomes the reduction over ranks of
  /// in[r m, (r+1) m). `in` and `out` must not overlap.
  /// @throws ShapeError if in.size() != size() * out.size(), counts differ across ranks, or a
  /// view is not contiguous; MPIError.
  template <class ExecSpace, class InView, class OutView>
  void reduce_scatter(const ExecSpace &space, const InView &in, const OutView &out,
                      ReduceOp op = ReduceOp::sum) {
    static_check_pair<ExecSpace, InView, OutView>();
    ScopedRegion region("kat::distributed::reduce_scatter");
    using T = typename OutView::non_const_value_type;
    const char *what = "reduce_scatter";
    agree(what, in.size(), 0, blocks_error(what, in, out, false));
    run_pair(what, space, in, out, stats_.reduce_scatter, [&](const T *source, T *target) {
      return MPI_Reduce_scatter_block(source, target, count(out), detail::mpi_datatype<T>(),
                                      mpi_op<T>(what, op), comm_);
    });
  }

  /// Blocks until every rank has called it (MPI_Barrier).
  /// @throws MPIError
  void barrier() {
    require_valid("barrier");
    const auto t0 = Clock::now();
    check("barrier", MPI_Barrier(comm_));
    add(stats_.barrier, 0);
    cross_link(0, t0);
  }

  // --- non-blocking collectives ----------------------------------------------------------

  /// Non-blocking in-place allreduce (MPI_Iallreduce); the result is in `inout` once the
  /// returned Request completes. Argument checks (and the agreement all-reduce) are blocking.
  /// @throws as allreduce.
  template <class ExecSpace, class View>
  [[nodiscard]] Request iallreduce(const ExecSpace &space, const View &inout,
                                   ReduceOp op = ReduceOp::sum) {
    static_check<ExecSpace, View, true>();
    ScopedRegion region("kat::distributed::iallreduce");
    using T = typename View::non_const_value_type;
    const char *what = "iallreduce";
    agree(what, inout.size(), 0, view_error(what, "inout", inout));
    return start_in_place(
        what, space, inout, true, true, stats_.iallreduce, -1, [&](T *data, MPI_Request *request) {
          return MPI_Iallreduce(MPI_IN_PLACE, data, count(inout), detail::mpi_datatype<T>(),
                                mpi_op<T>(what, op), comm_, request);
        });
  }

  /// Non-blocking out-of-place allreduce; shapes as the blocking form (`in` and `out` must not
  /// overlap). The request keeps both views alive.
  template <class ExecSpace, class InView, class OutView,
            std::enable_if_t<Kokkos::is_view<OutView>::value, int> = 0>
  [[nodiscard]] Request iallreduce(const ExecSpace &space, const InView &in, const OutView &out,
                                   ReduceOp op = ReduceOp::sum) {
    static_check_pair<ExecSpace, InView, OutView>();
    ScopedRegion region("kat::distributed::iallreduce");
    using T = typename OutView::non_const_value_type;
    const char *what = "iallreduce";
    agree(what, in.size(), 0, pair_error(what, in, out));
    return start_pair(what, space, in, out, stats_.iallreduce,
                      [&](const T *source, T *target, MPI_Request *request) {
                        return MPI_Iallreduce(source, target, count(in), detail::mpi_datatype<T>(),
                                              mpi_op<T>(what, op), comm_, request);
                      });
  }

  /// Non-blocking broadcast (MPI_Ibcast); arguments as broadcast().
  template <class ExecSpace, class View>
  [[nodiscard]] Request ibroadcast(const ExecSpace &space, const View &view, int root) {
    static_check<ExecSpace, View, true>();
    ScopedRegion region("kat::distributed::ibroadcast");
    using T = typename View::non_const_value_type;
    const char *what = "ibroadcast";
    agree(what, view.size(), root, view_error(what, "view", view));
    const bool is_root = rank_ == root;
    return start_in_place(what, space, view, is_root, !is_root, stats_.ibroadcast, -1,
                          [&](T *data, MPI_Request *request) {
                            return MPI_Ibcast(data, count(view), detail::mpi_datatype<T>(), root,
                                              comm_, request);
                          });
  }

  // --- point-to-point ----------------------------------------------------------------

  /// Non-blocking send of `view` to rank `dest` with `tag` (MPI_Isend); the view must not be
  /// written until the request completes. Unlike the collectives, nothing is agreed across
  /// ranks: the matching irecv must name this rank, the same tag, and a view of the same
  /// scalar type with at least as many elements.
  /// @throws ValueError if dest is not a rank of the communicator or tag is negative;
  ///   ShapeError if the view is not contiguous; MPIError.
  template <class ExecSpace, class View>
  [[nodiscard]] Request isend(const ExecSpace &space, const View &view, int dest, int tag) {
    static_check<ExecSpace, View, false>();
    ScopedRegion region("kat::distributed::isend");
    return point_to_point<true>(space, view, dest, tag);
  }

  /// Non-blocking receive into `view` from rank `source` with `tag` (MPI_Irecv); the message
  /// must have exactly view.size() elements. The view must not be read until the request
  /// completes.
  /// @throws ValueError if source is not a rank of the communicator or tag is negative;
  ///   ShapeError if the view is not contiguous; MPIError (also on completion, e.g. for a
  ///   message longer than the view).
  template <class ExecSpace, class View>
  [[nodiscard]] Request irecv(const ExecSpace &space, const View &view, int source, int tag) {
    static_check<ExecSpace, View, true>();
    ScopedRegion region("kat::distributed::irecv");
    return point_to_point<false>(space, view, source, tag);
  }

private:
  /// Where MPI reads or writes a view's data: the view itself, or a host staging buffer.
  template <class Pointee> struct Staged {
    Pointee *data = nullptr;
    detail::HostBuffer<std::remove_const_t<Pointee>> host;
    bool staged = false;
  };

  Communicator(MPI_Comm comm, bool owned, const CommunicatorOptions &options)
      : comm_(comm), owned_(owned && comm != MPI_COMM_NULL), options_(options),
        device_aware_(detail::mpi_reads_device_memory()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    if (comm_ == MPI_COMM_NULL) {
      return;
    }
    try {
      check("Communicator", MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
      check("Communicator", MPI_Comm_rank(comm_, &rank_));
      check("Communicator", MPI_Comm_size(comm_, &size_));
      find_nodes();
    } catch (...) {
      release();
      throw;
    }
  }

  void release() noexcept {
    if (owned_ && comm_ != MPI_COMM_NULL && detail::mpi_active()) {
      MPI_Comm_free(&comm_);
    }
    comm_ = MPI_COMM_NULL;
    owned_ = false;
  }

  static void validate(const CommunicatorOptions &options) {
    using kat::detail::concat;
    if (options.ranks_per_virtual_node < 0) {
      throw ValueError(concat("kat::distributed::Communicator: ranks_per_virtual_node "
                              "must be >= 0 (0: real nodes), got ",
                              options.ranks_per_virtual_node));
    }
    const EmulatedLink &link = options.internode_link;
    if (!(link.latency_seconds >= 0) || !std::isfinite(link.latency_seconds)) {
      throw ValueError(concat("kat::distributed::Communicator: internode_link.latency_seconds "
                              "must be finite and >= 0, got ",
                              link.latency_seconds));
    }
    if (!(link.bandwidth_bytes_per_second >= 0) ||
        !std::isfinite(link.bandwidth_bytes_per_second)) {
      throw ValueError(concat("kat::distributed::Communicator: "
                              "internode_link.bandwidth_bytes_per_second must be finite and >= 0 "
                              "(0: unlimited), got ",
                              link.bandwidth_bytes_per_second));
    }
    if (link.active() && options.ranks_per_virtual_node <= 0) {
      throw ValueError("kat::distributed::Communicator: an emulated internode_link needs virtual "
                       "nodes (ranks_per_virtual_node > 0), got ranks_per_virtual_node 0");
    }
  }

  static std::string name(const char *op) {
    return std::string("kat::distributed::Communicator::") + op;
  }

  std::string rank_text() const {
    return kat::detail::concat("rank ", rank_, " of ", size_, " (world rank ", world_rank_, ")");
  }

  void require_valid(const char *op) const {
    if (comm_ == MPI_COMM_NULL) {
      throw Error(name(op) + ": the communicator is null (moved from, or this rank passed "
                             "undefined_color to split)");
    }
  }

  /// The local checks of a point-to-point call: a valid communicator, a peer in it, a tag
  /// >= 0 and a view MPI can take.
  template <class View>
  void require_peer(const char *op, const char *arg, int peer, int tag, const View &view) const {
    require_valid(op);
    if (peer < 0 || peer >= size_) {
      throw ValueError(kat::detail::concat(name(op), ": ", arg, " must be a rank in [0, ", size_,
                                           ") on ", rank_text(), ", got ", peer));
    }
    if (tag < 0) {
      throw ValueError(
          kat::detail::concat(name(op), ": tag must be >= 0 on ", rank_text(), ", got ", tag));
    }
    if (auto error = view_error(op, "view", view); !error.empty()) {
      throw ShapeError(error);
    }
  }

  void check(const char *op, int code) const {
    if (code != MPI_SUCCESS) {
      throw MPIError(kat::detail::concat(name(op), ": MPI error on ", rank_text(), ": ",
                                         detail::error_string(code)),
                     code);
    }
  }

  static void add(CollectiveCounter &counter, std::size_t bytes) {
    ++counter.calls;
    counter.bytes += bytes;
  }

  template <class ExecSpace, class View, bool Output> static constexpr void static_check() {
    static_assert(
        Kokkos::is_execution_space<ExecSpace>::value,
        "kat::distributed: the first argument of a collective is an execution-space instance");
    static_assert(Kokkos::is_view<View>::value, "kat::distributed: collectives take Kokkos views");
    static_assert(unsigned(View::rank) == 1 ||
                      (unsigned(View::rank) == 2 &&
                       std::is_same_v<typename View::array_layout, Kokkos::LayoutLeft>),
                  "kat::distributed: collectives take rank-1 views or rank-2 LayoutLeft views");
    static_assert(
        detail::is_mpi_scalar_v<typename View::non_const_value_type>,
        "kat::distributed: collectives take float, double, std::int32_t or std::int64_t views");
    static_assert(!Output || !std::is_const_v<typename View::value_type>,
                  "kat::distributed: the output view of a collective must not be const");
  }

  /// static_check() of an input and an output view of the same scalar type.
  template <class ExecSpace, class InView, class OutView>
  static constexpr void static_check_pair() {
    static_check<ExecSpace, InView, false>();
    static_check<ExecSpace, OutView, true>();
    static_assert(std::is_same_v<typename InView::non_const_value_type,
                                 typename OutView::non_const_value_type>,
                  "kat::distributed: in and out must have the same scalar type");
  }

  /// Empty if MPI can take `v` as a buffer on this rank, else the reason.
  template <class View>
  std::string view_error(const char *op, const char *arg, const View &v) const {
    if (!v.span_is_contiguous() || v.span() != v.size()) {
      return kat::detail::concat(name(op), ": ", arg, " on ", rank_text(),
                                 " must be contiguous, got a view of ", v.size(),
                                 " elements spanning ", v.span());
    }
    if (v.size() > std::size_t(INT_MAX)) {
      return kat::detail::concat(name(op), ": ", arg, " on ", rank_text(), " has ", v.size(),
                                 " elements, more than MPI's int count allows (", INT_MAX, ")");
    }
    return {};
  }

  /// Empty if MPI can take both `in` and `out` as buffers on this rank, else the first reason.
  template <class InView, class OutView>
  std::string views_error(const char *op, const InView &in, const OutView &out) const {
    std::string error = view_error(op, "in", in);
    return error.empty() ? view_error(op, "out", out) : error;
  }

  /// views_error(), then whether the gathered view (`out` of allgather when `out_gathered`,
  /// else `in` of reduce_scatter) has size() times the other's elements.
  template <class InView, class OutView>
  std::string blocks_error(const char *op, const InView &in, const OutView &out,
                           bool out_gathered) const {
    std::string error = views_error(op, in, out);
    const std::size_t block = out_gathered ? in.size() : out.size();
    const std::size_t got = out_gathered ? out.size() : in.size();
    if (error.empty() && got != std::size_t(size_) * block) {
      error = kat::detail::concat(name(op), ": ", out_gathered ? "out" : "in", " on ", rank_text(),
                                  " must have size() * ", out_gathered ? "in" : "out",
                                  ".size() = ", size_, " * ", block, " = ",
                                  std::size_t(size_) * block, " elements, got ", got);
    }
    return error;
  }

  template <class InView, class OutView>
  std::string pair_error(const char *op, const InView &in, const OutView &out) const {
    std::string error = views_error(op, in, out);
    if (error.empty() && out.size() != in.size()) {
      error =
          kat::detail::concat(name(op), ": out on ", rank_text(),
                              " must have in.size() = ", in.size(), " elements, got ", out.size());
    }
    return error;
  }

  template <class View> static int count(const View &v) { return static_cast<int>(v.size()); }

  /// Throws on every rank if any rank's arguments are invalid (`local_error` non-empty) or the
  /// ranks disagree on `count` or `root`. With checked() off, only the local error throws.
  void agree(const char *op, std::size_t count, int root, const std::string &local_error) {
    require_valid(op);
    if (!options_.checked) {
      if (!local_error.empty()) {
        throw ShapeError(local_error);
      }
      return;
    }
    const auto n = static_cast<std::int64_t>(count);
    // One MAX all-reduce gives max and -min of both values and whether any rank is invalid.
    std::int64_t v[5] = {n, -n, local_error.empty() ? 0 : 1, root, -std::int64_t(root)};
    const auto t0 = Clock::now();
    check(op, MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_INT64_T, MPI_MAX, comm_));
    add(stats_.shape_check, sizeof v);
    cross_link(sizeof v, t0);
    if (!local_error.empty()) {
      throw ShapeError(local_error);
    }
    if (v[2] != 0) {
      throw ShapeError(kat::detail::concat(
          name(op),
          ": the arguments on another rank are invalid (that rank's error names "
          "them); those on ",
          rank_text(), " are valid"));
    }
    if (v[0] != -v[1]) {
      throw ShapeError(
          kat::detail::concat(name(op), ": element counts differ across ranks: ", rank_text(),
                              " passed ", n, ", the minimum is ", -v[1], " and the maximum ", v[0],
                              "; every rank must pass the same count"));
    }
    if (v[3] != -v[4]) {
      throw ValueError(kat::detail::concat(name(op), ": roots differ across ranks: ", rank_text(),
                                           " passed ", root, ", the minimum is ", -v[4],
                                           " and the maximum ", v[3]));
    }
  }

  template <class ExecSpace, class View>
  Staged<typename View::value_type> stage(const ExecSpace &space, const View &v, bool copy_in) {
    using T = typename View::non_const_value_type;
    Staged<typename View::value_type> s;
    if (!stages<typename View::memory_space>()) {
      s.data = v.data();
      return s;
    }
    s.host = detail::HostBuffer<T>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::distributed::staging"), v.size());
    s.data = s.host.data();
    s.staged = true;
    if (copy_in) {
      Kokkos::deep_copy(space, s.host, detail::flat(v));
      add(stats_.staging, v.size() * sizeof(T));
    }
    return s;
  }

  /// Copies a staged result back into `v` and fences, so the staging buffer can go. Static:
  /// a Request runs it, possibly after the Communicator is gone.
  template <class ExecSpace, class View, class Pointee>
  static void copy_back(const ExecSpace &space, const View &v, const Staged<Pointee> &s) {
    if (s.staged) {
      Kokkos::deep_copy(space, detail::flat(v), s.host);
      space.fence();
    }
  }
  template <class View, class Pointee>
  void count_copy_back(const View &v, const Staged<Pointee> &s) {
    if (s.staged) {
      add(stats_.staging, v.size() * sizeof(typename View::non_const_value_type));
    }
  }
  template <class ExecSpace, class View, class Pointee>
  void unstage(const ExecSpace &space, const View &v, const Staged<Pointee> &s) {
    copy_back(space, v, s);
    count_copy_back(v, s);
  }

  template <class ExecSpace, class View>
  void allreduce_in_place(const char *op, const ExecSpace &space, const View &inout,
                          ReduceOp reduce) {
    using T = typename View::non_const_value_type;
    agree(op, inout.size(), 0, view_error(op, "inout", inout));
    run_in_place(op, space, inout, true, true, stats_.allreduce, [&](T *data) {
      return MPI_Allreduce(MPI_IN_PLACE, data, count(inout), detail::mpi_datatype<T>(),
                           mpi_op<T>(op, reduce), comm_);
    });
  }

  template <class ExecSpace, class InView, class OutView>
  void allreduce_out_of_place(const char *op, const ExecSpace &space, const InView &in,
                              const OutView &out, ReduceOp reduce) {
    using T = typename OutView::non_const_value_type;
    if (static_cast<const void *>(in.data()) == static_cast<const void *>(out.data()) &&
        in.size() == out.size()) {
      allreduce_in_place(op, space, out, reduce);
      return;
    }
    agree(op, in.size(), 0, pair_error(op, in, out));
    run_pair(op, space, in, out, stats_.allreduce, [&](const T *source, T *target) {
      return MPI_Allreduce(source, target, count(in), detail::mpi_datatype<T>(),
                           mpi_op<T>(op, reduce), comm_);
    });
  }

  // --- the staged call every operation makes ----------------------------------------
  // Each operation checks its arguments (agree() or require_peer()), then goes through one of
  // run_in_place / run_pair (blocking) or start_in_place / start_pair (non-blocking): stage
  // the views, issue() the MPI call, then copy staged results back (blocking) or hand the
  // buffers to a Request that copies them back on completion (non-blocking).

  /// The steps every operation takes once its arguments are checked and its buffers staged:
  /// fences `space` (MPI reads what it produced), makes the MPI call (`call()` returns MPI's
  /// code; MPIError if it is not MPI_SUCCESS), counts `bytes` in `counter`, and returns when
  /// the emulated link lets the operation end (over_link(); `peer` < 0: over all ranks).
  template <class ExecSpace, class Call>
  Clock::time_point issue(const char *op, const ExecSpace &space, CollectiveCounter &counter,
                          std::size_t bytes, int peer, Call &&call) {
    space.fence();
    const auto t0 = Clock::now();
    check(op, call());
    add(counter, bytes);
    return over_link(bytes, t0, peer);
  }

  template <class View> static std::size_t bytes_of(const View &v) {
    return v.size() * sizeof(typename View::non_const_value_type);
  }

  /// A blocking call on one buffer: `view`, or its host copy (which gets the view's data when
  /// `copy_in`, and is copied back when `copy_out`). `call(data)` makes the MPI call on the
  /// pointer MPI works on; counts bytes_of(view) in `counter`.
  template <class ExecSpace, class View, class Call>
  void run_in_place(const char *op, const ExecSpace &space, const View &view, bool copy_in,
                    bool copy_out, CollectiveCounter &counter, Call &&call) {
    auto buffer = stage(space, view, copy_in);
    std::this_thread::sleep_until(
        issue(op, space, counter, bytes_of(view), -1, [&] { return call(buffer.data); }));
    if (copy_out) {
      unstage(space, view, buffer);
    }
  }

  /// A blocking call from `in` to `out` (each staged as needed; `out` copied back);
  /// `call(source, target)` makes the MPI call; counts bytes_of(in) in `counter`.
  template <class ExecSpace, class InView, class OutView, class Call>
  void run_pair(const char *op, const ExecSpace &space, const InView &in, const OutView &out,
                CollectiveCounter &counter, Call &&call) {
    auto source = stage(space, in, true);
    auto target = stage(space, out, false);
    std::this_thread::sleep_until(issue(op, space, counter, bytes_of(in), -1,
                                        [&] { return call(source.data, target.data); }));
    unstage(space, out, target);
  }

  /// The non-blocking run_in_place: `call(data, request)` starts the MPI operation with peer
  /// `peer` (< 0: a collective); the Request keeps `view` and the buffer alive and copies the
  /// buffer back on completion when `copy_out` (counted now, as the bytes are known now).
  template <class ExecSpace, class View, class Call>
  Request start_in_place(const char *op, const ExecSpace &space, const View &view, bool copy_in,
                         bool copy_out, CollectiveCounter &counter, int peer, Call &&call) {
    auto buffer = stage(space, view, copy_in);
    MPI_Request request = MPI_REQUEST_NULL;
    const auto not_before = issue(op, space, counter, bytes_of(view), peer,
                                  [&] { return call(buffer.data, &request); });
    if (copy_out) {
      count_copy_back(view, buffer);
    }
    return make_request(
        op, request,
        [space, view, buffer, copy_out]() {
          if (copy_out) {
            copy_back(space, view, buffer);
          }
        },
        not_before);
  }

  /// The non-blocking run_pair: `call(source, target, request)` starts the MPI operation.
  template <class ExecSpace, class InView, class OutView, class Call>
  Request start_pair(const char *op, const ExecSpace &space, const InView &in, const OutView &out,
                     CollectiveCounter &counter, Call &&call) {
    auto source = stage(space, in, true);
    auto target = stage(space, out, false);
    MPI_Request request = MPI_REQUEST_NULL;
    const auto not_before = issue(op, space, counter, bytes_of(in), -1,
                                  [&] { return call(source.data, target.data, &request); });
    count_copy_back(out, target);
    // `in` and `source` are captured only to keep MPI's input alive until completion.
    return make_request(
        op, request, [space, in, out, source, target]() { copy_back(space, out, target); },
        not_before);
  }

  /// isend (`Send`: `view` goes to `peer`) or irecv (`view` is filled from `peer`): the local
  /// checks, then start_in_place with the peer.
  template <bool Send, class ExecSpace, class View>
  Request point_to_point(const ExecSpace &space, const View &view, int peer, int tag) {
    using T = typename View::non_const_value_type;
    const char *what = Send ? "isend" : "irecv";
    require_peer(what, Send ? "dest" : "source", peer, tag, view);
    return start_in_place(what, space, view, Send, !Send, Send ? stats_.send : stats_.recv, peer,
                          [&](auto *data, MPI_Request *request) {
                            if constexpr (Send) {
                              return MPI_Isend(data, count(view), detail::mpi_datatype<T>(), peer,
                                               tag, comm_, request);
                            } else {
                              return MPI_Irecv(data, count(view), detail::mpi_datatype<T>(), peer,
                                               tag, comm_, request);
                            }
                          });
  }

  template <class ExecSpace, class View>
  void scale_by_size(const ExecSpace &space, const View &v) const {
    using T = typename View::non_const_value_type;
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,
                  "kat::distributed::Communicator::average: the execution space cannot access the "
                  "view's memory");
    detail::scale(space, detail::flat(v), T(1) / T(size_));
  }

  /// MPI's operation for `op` on T. kat::bfloat16 has sum only (detail::bfloat16_sum_op).
  /// @throws ValueError for max or min on bfloat16.
  template <class T> MPI_Op mpi_op(const char *what, ReduceOp op) const {
    if constexpr (std::is_same_v<T, kat::bfloat16>) {
      if (op != ReduceOp::sum) {
        throw ValueError(kat::detail::concat(name(what),
                                             ": kat::bfloat16 views reduce with "
                                             "ReduceOp::sum only, got ",
                                             op == ReduceOp::max ? "max" : "min", " on ",
                                             rank_text()));
      }
      return detail::bfloat16_sum_op();
    } else {
      (void)what;
      return mpi_op(op);
    }
  }

  static MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::sum:
      break;
    }
    return MPI_SUM;
  }

  template <class Finish>
  Request make_request(const char *op, MPI_Request request, Finish f,
                       Clock::time_point not_before) {
    return Request(request, name(op), rank_text(), std::function<void()>(std::move(f)), not_before);
  }

  /// The virtual node of a world rank (ranks_per_virtual_node() > 0).
  int node_of(int world_rank) const { return world_rank / options_.ranks_per_virtual_node; }

  /// With virtual nodes: the members' world ranks, and whether they lie on several nodes.
  void find_nodes() {
    world_ranks_.clear();
    spans_nodes_ = false;
    if (comm_ == MPI_COMM_NULL || options_.ranks_per_virtual_node <= 0) {
      return;
    }
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    check("Communicator", MPI_Comm_group(comm_, &group));
    check("Communicator", MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> ranks(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      ranks[static_cast<std::size_t>(r)] = r;
    }
    world_ranks_.resize(ranks.size());
    const int code =
        MPI_Group_translate_ranks(group, size_, ranks.data(), world, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    check("Communicator", code);
    const auto [lo, hi] = std::minmax_element(world_ranks_.begin(), world_ranks_.end());
    spans_nodes_ = node_of(*lo) != node_of(*hi);
  }

  /// An operation of `bytes` started at `start` over all ranks (peer < 0) or with rank `peer`:
  /// if it crosses virtual nodes, counts it as internode and returns when the emulated link
  /// lets it complete; otherwise returns `start`.
  Clock::time_point over_link(std::size_t bytes, Clock::time_point start, int peer = -1) {
    const bool crosses =
        peer < 0 ? spans_nodes_
                 : !world_ranks_.empty() && node_of(world_ranks_[static_cast<std::size_t>(peer)]) !=
                                                node_of(world_rank_);
    if (!crosses) {
      return start;
    }
    add(stats_.internode, bytes);
    const double seconds = options_.internode_link.seconds(bytes);
    stats_.internode_seconds += seconds;
    return start +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  /// The blocking form of over_link(): returns when the emulated link lets the operation end.
  void cross_link(std::size_t bytes, Clock::time_point start) {
    std::this_thread::sleep_until(over_link(bytes, start));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = -1;
  int size_ = 0;
  int world_rank_ = -1;
  CommunicatorOptions options_;
  bool device_aware_ = false;
  CommunicatorStats stats_;
  std::vector<int> world_ranks_; // with virtual nodes: each member's MPI_COMM_WORLD rank
  bool spans_nodes_ = false;     // with virtual nodes: members on more than one node
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
