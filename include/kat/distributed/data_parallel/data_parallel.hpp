#pragma once
/// @file
/// @brief kat::distributed::DataParallel: synchronous data-parallel training on a flat gradient
/// buffer: a parameter broadcast, and gradient averaging by bucketed non-blocking all-reduces
/// that start while backward is still running. Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error                                                                                             \
    "kat/distributed/data_parallel/data_parallel.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/train/gradient_sync.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kat::distributed {

/// One layer's parameters in a flat buffer: elements [offset, offset + size).
struct ParameterRange {
  std::size_t offset = 0; ///< the layer's first element
  std::size_t size = 0;   ///< the layer's element count
};

/// The ranges of a list of blocks with `offset` and `size` members, such as
/// kat::ParameterBuffer::blocks() (for a kat::nn::Sequential, block i is layer i).
template <class Blocks> std::vector<ParameterRange> parameter_ranges(const Blocks &blocks) {
  std::vector<ParameterRange> out;
  out.reserve(blocks.size());
  for (const auto &b : blocks) {
    out.push_back(
        ParameterRange{static_cast<std::size_t>(b.offset), static_cast<std::size_t>(b.size)});
  }
  return out;
}

/// A contiguous range of the flat gradient buffer that is all-reduced as one message: the
/// gradients of layers first_layer ... last_layer (inclusive), elements [offset, offset +
/// size).
struct GradientBucket {
  std::size_t first_layer = 0; ///< the first layer whose gradients it holds
  std::size_t last_layer = 0;  ///< the last one (inclusive)
  std::size_t offset = 0;      ///< the bucket's first element in the flat buffer
  std::size_t size = 0;        ///< its element count
};

/// Settings of DataParallel; must be the same on every rank.
struct DataParallelOptions {
  /// Target bucket size in bytes, > 0: layers are added to a bucket, from the last layer
  /// towards the first, until it holds at least this many bytes of gradients. A layer is
  /// never split, so a bucket can be larger (one big layer), and the last one smaller.
  /// Default 1 MiB. Larger buckets mean fewer messages (less latency) but a later start.
  std::size_t bucket_bytes = std::size_t(1) << 20;
};

/// What one rank's DataParallel did since construction or reset_stats().
struct DataParallelStats {
  /// finish() calls (training steps).
  std::uint64_t steps = 0;
  /// Buckets whose all-reduce the backward hook started, overlapping the rest of backward.
  std::uint64_t buckets_started_in_backward = 0;
  /// Buckets whose all-reduce finish() had to start (no hook installed, or a hook that did
  /// not see the bucket's layers).
  std::uint64_t buckets_started_in_finish = 0;
  /// The gradient all-reduces: calls and payload bytes, taken from the Communicator's
  /// iallreduce counter (see CommunicatorStats: per step, the gradient length x sizeof(Scalar)).
  CollectiveCounter allreduce;
  /// broadcast_parameters(): calls and payload bytes (the Communicator's broadcast counter).
  CollectiveCounter broadcast;
  /// Exposed communication time in seconds (host wall clock): the time finish() spends from
  /// its start until the last gradient all-reduce has completed, summed over steps. It is the
  /// communication backward did not hide; it also includes starting the buckets finish()
  /// starts and, for those, the fence that waits for the execution space's pending kernels.
  double exposed_seconds = 0;
  /// exposed_seconds of the last finish().
  double last_exposed_seconds = 0;
};

/// Per-rank training totals that reduce_metrics() sums over ranks.
struct Metrics {
  /// Σ over samples of the per-sample loss (a batch's mean loss times its size).
  double loss_sum = 0;
  /// Correctly classified samples.
  std::int64_t correct = 0;
  /// Samples.
  std::int64_t samples = 0;

  /// loss_sum / samples (0 without samples).
  double mean_loss() const { return samples > 0 ? loss_sum / double(samples) : 0.0; }
  /// correct / samples (0 without samples).
  double accuracy() const { return samples > 0 ? double(correct) / double(samples) : 0.0; }
};

/// The sums over all ranks of `local`, returned on every rank: one blocking all-reduce of
/// three doubles (24 bytes in CommunicatorStats::allreduce) on host memory. Counts are exact
/// up to 2^53. Collective: every rank of `comm` must call it.
/// @throws MPIError
inline Metrics reduce_metrics(Communicator &comm, const Metrics &local) {
  Kokkos::View<double[3], Kokkos::HostSpace> v("kat::distributed::reduce_metrics");
  v(0) = local.loss_sum;
  v(1) = static_cast<double>(local.correct);
  v(2) = static_cast<double>(local.samples);
  comm.allreduce(Kokkos::DefaultHostExecutionSpace(), v);
  Metrics out;
  out.loss_sum = v(0);
  out.correct = static_cast<std::int64_t>(v(1));
  out.samples = static_cast<std::int64_t>(v(2));
  return out;
}

/// Synchronous data parallelism over the flat parameter and gradient buffers of a model
/// (KAT's one-flat-buffer convention): every rank holds a full replica, computes gradients on
/// its own shard of the global batch, and the gradients are averaged over ranks before the
/// optimizer steps, so every replica takes the same step. With the loss a mean over the local
/// batch of B/P samples, the average over ranks is the gradient of the mean over the global
/// batch of B samples: P ranks compute what one process computes on the concatenated batch.
///
/// **Buckets.** The gradient buffer is cut into buckets (GradientBucket) of about
/// DataParallelOptions::bucket_bytes, at layer boundaries, starting from the last layer:
/// bucket 0 holds the last layers (the highest offsets), the last bucket the first layers.
/// Together they cover the buffer exactly once. Backward produces gradients from the last
/// layer to the first, so bucket k is complete as soon as backward has finished its
/// first_layer.
///
/// **Overlap.** backward_hook() returns a callback for kat::nn::Sequential::set_backward_hook
/// (or any backward that reports each finished layer index in decreasing order). After layer i
/// it starts a non-blocking all-reduce (Communicator::iallreduce) of every bucket whose
/// first_layer is >= i, and polls the buckets in flight so that MPI progresses them while
/// backward computes the earlier layers. finish() starts whatever is left, waits for all, and
/// scales the gradients by 1/P. Without the hook, finish() does all of it (no overlap, same
/// result).
///
/// @code
///   auto comm = kat::distributed::Communicator::world();
///   kat::distributed::DataParallel<float> dp(comm, model);   // buckets of model.buffer().blocks()
///   dp.broadcast_parameters(space);                  // replicas start equal
///   model.set_backward_hook(dp.backward_hook(space));
///   for each local batch (x, y):
///     logits = model.forward(space, x);
///     loss.forward_backward(space, logits, y, dlogits); // mean over the local batch
///     model.backward(space, dlogits, Gradients::overwrite); // all-reduces start here
///     dp.finish(space);                                  // gradients = mean over ranks
///     optimizer.step(space, model.parameters(), model.gradients());
///   model.clear_backward_hook();                         // before dp goes away
/// @endcode
///
/// **Rules.** Every rank makes the same calls in the same order (the same bucket layout,
/// the hook on all ranks or on none, one backward per finish()). The gradient buffer must not
/// be touched between the first bucket's start and finish(). For gradient accumulation over
/// several backward passes, install the hook only for the last one. A DataParallel must
/// outlive the hook installed from it, and the Communicator the DataParallel. Since the layout is
/// agreed once at construction, the bucket all-reduces skip the Communicator's per-call
/// agreement all-reduce (CommunicatorOptions::checked), which would otherwise synchronize the
/// ranks at every bucket.
///
/// Optimizer state is not communicated: it stays identical on all ranks because parameters
/// and averaged gradients are. Call broadcast_parameters() before training (or after loading a
/// checkpoint on one rank).
///
/// @tparam Scalar      float or double
/// @tparam MemorySpace where the buffers live (device memory is staged through the host by
///                     the Communicator when MPI cannot read it)
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class DataParallel : public train::GradientSync<Scalar, MemorySpace> {
public:
  using execution_space =
      typename MemorySpace::execution_space;       ///< where the averaging kernels run
  using vector_type = Vector<Scalar, MemorySpace>; ///< the flat parameter or gradient buffer
  /// The callback type of kat::nn::Sequential::set_backward_hook: the finished layer's index.
  using BackwardHook = std::function<void(std::size_t)>;

  /// @param comm        the ranks that train together; must outlive this object
  /// @param parameters  the flat parameter vector (length n), broadcast by
  ///                    broadcast_parameters()
  /// @param gradients   the flat gradient vector (length n), averaged by finish()
  /// @param layers      per layer, in layer order, its range of the flat buffers; the ranges
  ///                    must be consecutive (layer i starts where layer i - 1 ends, layer 0 at
  ///                    0; sizes may be 0) and cover [0, n). The layer index is what the
  ///                    backward hook receives.
  /// @param options     bucket size; the same on every rank
  ///
  /// Collective: one blocking all-reduce of 6 int64 (48 bytes, counted in the Communicator's
  /// allreduce counter) checks that every rank has the same n, layer count and bucket layout.
  /// @throws ValueError if options.bucket_bytes == 0 or a layer's offset is not where the
  ///   previous layer ends (naming the layer, the expected and the actual offset).
  /// @throws ShapeError if parameters and gradients differ in length, if the gradient length
  ///   differs from the sum of the layer (and so bucket) sizes, or (on every rank) if the
  ///   ranks disagree on the length, the layer count or the bucket layout.
  /// @throws MPIError
  DataParallel(Communicator &comm, vector_type parameters, vector_type gradients,
               std::vector<ParameterRange> layers, DataParallelOptions options = {})
      : comm_(&comm), params_(std::move(parameters)), grads_(std::move(gradients)),
        layers_(std::move(layers)), options_(options) {
    using kat::detail::concat;
    if (options_.bucket_bytes == 0) {
      throw ValueError("kat::distributed::DataParallel: options.bucket_bytes must be > 0, got 0");
    }
    if (params_.extent(0) != grads_.extent(0)) {
      throw ShapeError(
          concat("kat::distributed::DataParallel: parameters and gradients must have the "
                 "same length, got ",
                 params_.extent(0), " and ", grads_.extent(0)));
    }
    std::size_t end = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i].offset != end) {
        throw ValueError(concat("kat::distributed::DataParallel: layer ", i, "'s offset must be ",
                                end,
                                " (layers are consecutive ranges of the flat buffer, in "
                                "order), got ",
                                layers_[i].offset));
      }
      end += layers_[i].size;
    }
    if (end != grads_.extent(0)) {
      throw ShapeError(concat("kat::distributed::DataParallel: the gradient vector must have the "
                              "layers' total size ",
                              end, " (the sum of the bucket sizes), got ", grads_.extent(0)));
    }
    buckets_ = make_buckets(layers_, options_.bucket_bytes / sizeof(Scalar) +
                                         (options_.bucket_bytes % sizeof(Scalar) != 0));
    agree_on_layout();
    requests_.reserve(buckets_.size());
  }

  /// Takes the flat buffers and layer blocks of a model with parameters(), gradients() and
  /// buffer().blocks() (kat::nn::Sequential after compile(): block i is layer i).
  /// Errors as the main constructor.
  template <class Model, std::enable_if_t<!Kokkos::is_view<Model>::value, int> = 0>
  DataParallel(Communicator &comm, const Model &model, DataParallelOptions options = {})
      : DataParallel(comm, model.parameters(), model.gradients(),
                     parameter_ranges(model.buffer().blocks()), options) {}

  // The backward hook refers to this object.
  DataParallel(const DataParallel &) = delete;
  DataParallel &operator=(const DataParallel &) = delete;
  DataParallel(DataParallel &&) = delete;
  DataParallel &operator=(DataParallel &&) = delete;
  /// Waits for all-reduces still in flight (see Request's destructor).
  ~DataParallel() = default;

  /// The buckets in the order their all-reduces start (reverse layer order).
  const std::vector<GradientBucket> &buckets() const { return buckets_; }
  /// The layer ranges given at construction.
  const std::vector<ParameterRange> &layers() const { return layers_; }
  /// The options given at construction.
  const DataParallelOptions &options() const { return options_; }
  /// The communicator the gradients are averaged over.
  Communicator &communicator() const { return *comm_; }
  /// The flat parameter buffer given at construction.
  const vector_type &parameters() const { return params_; }
  /// The flat gradient buffer given at construction.
  const vector_type &gradients() const { return grads_; }
  /// Buckets started and not yet completed by finish().
  std::size_t pending() const { return requests_.size(); }

  /// Counters since construction or reset_stats().
  DataParallelStats stats() const { return stats_; }
  void reset_stats() override { stats_ = DataParallelStats{}; }

  /// kat::train::GradientSync: "data_parallel".
  std::string name() const override { return "data_parallel"; }
  /// kat::train::GradientSync: "data parallel on P ranks: B gradient bucket(s) of at most N
  /// bytes".
  std::string summary() const override {
    return kat::detail::concat("data parallel on ", comm_->size(), " ranks: ", buckets_.size(),
                               " gradient bucket", buckets_.size() == 1 ? "" : "s", " of at most ",
                               options_.bucket_bytes, " bytes");
  }
  /// kat::train::GradientSync: layer_done(space, layer).
  void on_gradients_ready(const execution_space &space, std::size_t layer) override {
    layer_done(space, layer);
  }
  /// kat::train::GradientSync: finish(space).
  void before_step(const execution_space &space) override { finish(space); }
  /// kat::train::GradientSync: the steps, all-reduced bytes and exposed seconds of stats().
  train::SyncStats sync_stats() const override {
    return {stats_.steps, stats_.allreduce.bytes, stats_.exposed_seconds};
  }

  /// Every rank's parameters become rank `root`'s (one blocking broadcast of n scalars).
  /// Collective. @throws ValueError if roots differ across ranks; MPIError (e.g. root out of
  /// range); Error if gradient all-reduces are in flight.
  void broadcast_parameters(const execution_space &space, int root = 0) {
    ScopedRegion region("kat::distributed::DataParallel::broadcast_parameters");
    if (!requests_.empty()) {
      throw Error(
          "kat::distributed::DataParallel::broadcast_parameters: gradient all-reduces are in "
          "flight; call finish() first");
    }
    const CollectiveCounter before = comm_->stats().broadcast;
    comm_->broadcast(space, params_, root);
    const CollectiveCounter after = comm_->stats().broadcast;
    stats_.broadcast.calls += after.calls - before.calls;
    stats_.broadcast.bytes += after.bytes - before.bytes;
  }

  /// The callback to install with kat::nn::Sequential::set_backward_hook: after layer i it
  /// starts the all-reduce of every bucket whose first_layer is >= i (on `space`, which must be
  /// the space backward runs on: it is fenced before MPI reads a bucket), then polls the
  /// buckets in flight. It refers to this object, which must outlive its installation.
  /// The callback throws ValueError for a layer index >= layers().size(), Error if it sees a
  /// layer index that does not decrease (a second backward before finish()), and MPIError.
  BackwardHook backward_hook(const execution_space &space) {
    return [this, space](std::size_t layer) { layer_done(space, layer); };
  }

  /// What the hook does: layer `layer`'s gradients (and those of every later layer) are
  /// complete once the work enqueued on `space` is done. Errors as the hook.
  void layer_done(const execution_space &space, std::size_t layer) {
    using kat::detail::concat;
    if (layer >= layers_.size()) {
      throw ValueError(concat("kat::distributed::DataParallel: the backward hook got layer ", layer,
                              ", but there are ", layers_.size(), " layers"));
    }
    if (in_backward_ && layer >= last_layer_) {
      throw Error(concat("kat::distributed::DataParallel: the backward hook got layer ", layer,
                         " after layer ", last_layer_,
                         ": a second backward before finish() (for gradient accumulation, "
                         "install the hook for the last backward only)"));
    }
    in_backward_ = true;
    last_layer_ = layer;
    while (next_ < buckets_.size() && buckets_[next_].first_layer >= layer) {
      start(space, next_++);
      ++stats_.buckets_started_in_backward;
    }
    // Open MPI progresses non-blocking collectives only inside MPI calls.
    for (auto &request : requests_) {
      if (request.active()) {
        request.test();
      }
    }
  }

  /// Completes the gradient averaging of this step: starts the all-reduces no hook has
  /// started, waits for all of them, and scales the gradient vector by 1/P on `space` (a
  /// kernel: fence before reading it on the host). Afterwards the gradients are the mean over
  /// ranks and the next step may begin. Collective. Records the exposed communication time
  /// (DataParallelStats::exposed_seconds).
  /// @throws MPIError (the remaining requests are completed or abandoned first, and the
  ///   object is ready for a new step).
  void finish(const execution_space &space) {
    ScopedRegion region("kat::distributed::DataParallel::finish");
    const auto t0 = std::chrono::steady_clock::now();
    try {
      while (next_ < buckets_.size()) {
        start(space, next_++);
        ++stats_.buckets_started_in_finish;
      }
      for (auto &request : requests_) {
        request.wait();
      }
    } catch (...) {
      reset_step();
      throw;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    reset_step();
    if (comm_->size() > 1) {
      detail::scale(space, detail::flat(grads_), Scalar(1) / static_cast<Scalar>(comm_->size()));
    }
    ++stats_.steps;
    stats_.last_exposed_seconds = seconds;
    stats_.exposed_seconds += seconds;
  }

  /// reduce_metrics(communicator(), local).
  Metrics reduce_metrics(const Metrics &local) const { return dist::reduce_metrics(*comm_, local); }

private:
  /// Buckets of at least `capacity` elements (except the last), in reverse layer order;
  /// parameter-free layers join a neighbouring bucket, and a model without parameters has no
  /// buckets.
  static std::vector<GradientBucket> make_buckets(const std::vector<ParameterRange> &layers,
                                                  std::size_t capacity) {
    std::vector<GradientBucket> out;
    GradientBucket open;
    bool is_open = false;
    for (std::size_t i = layers.size(); i-- > 0;) {
      if (!is_open) {
        open = GradientBucket{i, i, layers[i].offset + layers[i].size, 0};
        is_open = true;
      }
      open.first_layer = i;
      open.offset = layers[i].offset;
      open.size += layers[i].size;
      if (open.size >= capacity) {
        out.push_back(open);
        is_open = false;
      }
    }
    if (is_open) {
      if (open.size > 0) {
        out.push_back(open);
      } else if (!out.empty()) {
        out.back().first_layer = open.first_layer; // leading parameter-free layers
      }
    }
    return out;
  }

  /// Throws ShapeError on every rank unless all agree on n, the layer count and the buckets.
  void agree_on_layout() {
    std::uint64_t h = 0x6b61742d6470ull;
    for (const auto &b : buckets_) {
      h = kat::splitmix64(h ^ b.first_layer);
      h = kat::splitmix64(h ^ b.offset);
      h = kat::splitmix64(h ^ b.size);
    }
    const auto hash = static_cast<std::int64_t>(h >> 2); // non-negative, so -hash is too
    const auto n = static_cast<std::int64_t>(grads_.extent(0));
    const auto l = static_cast<std::int64_t>(layers_.size());
    Kokkos::View<std::int64_t[6], Kokkos::HostSpace> v("kat::distributed::DataParallel::layout");
    v(0) = n;
    v(1) = -n;
    v(2) = l;
    v(3) = -l;
    v(4) = hash;
    v(5) = -hash;
    comm_->allreduce(Kokkos::DefaultHostExecutionSpace(), v, ReduceOp::max);
    if (v(0) != -v(1) || v(2) != -v(3) || v(4) != -v(5)) {
      throw ShapeError(kat::detail::concat(
          "kat::distributed::DataParallel: the ranks disagree on the gradient layout: rank ",
          comm_->rank(), " of ", comm_->size(), " has ", n, " gradients in ", l, " layers and ",
          buckets_.size(), " buckets; over all ranks the gradient length ranges over [", -v(1),
          ", ", v(0), "] and the layer count over [", -v(3), ", ", v(2),
          "]; every rank must pass the same model and options"));
    }
  }

  void start(const execution_space &space, std::size_t k) {
    const GradientBucket &b = buckets_[k];
    const auto range = std::make_pair(b.offset, b.offset + b.size);
    const CollectiveCounter before = comm_->stats().iallreduce;
    // The layout was agreed at construction; a per-bucket agreement all-reduce would make
    // every bucket a synchronization point.
    const bool checked = comm_->checked();
    comm_->set_checked(false);
    try {
      requests_.push_back(comm_->iallreduce(space, Kokkos::subview(grads_, range)));
    } catch (...) {
      comm_->set_checked(checked);
      throw;
    }
    comm_->set_checked(checked);
    const CollectiveCounter after = comm_->stats().iallreduce;
    stats_.allreduce.calls += after.calls - before.calls;
    stats_.allreduce.bytes += after.bytes - before.bytes;
  }

  void reset_step() {
    requests_.clear(); // a request still active waits in its destructor
    next_ = 0;
    in_backward_ = false;
    last_layer_ = 0;
  }

  Communicator *comm_;
  vector_type params_;
  vector_type grads_;
  std::vector<ParameterRange> layers_;
  DataParallelOptions options_;
  std::vector<GradientBucket> buckets_;
  std::vector<Request> requests_;
  std::size_t next_ = 0; // the next bucket to start
  bool in_backward_ = false;
  std::size_t last_layer_ = 0;
  DataParallelStats stats_;
};

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
