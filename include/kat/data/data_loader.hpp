#pragma once
/// @file
/// @brief Mini-batch iteration over a Dataset held in device memory, with seeded per-epoch
/// shuffles.

#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/data/dataset.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace kat::data {

namespace detail {

// DataLoader::next's kernels, as named functors rather than extended device lambdas: nvcc's
// wrapper of an extended lambda in a header is merged across translation units while its
// function pointers are not (docs/backends.md).

/// xb(i, f) = pixel f of sample order(first + i), scaled from bytes to [0, 1].
template <class Matrix, class ImageView, class IndexView> struct DataLoaderGather {
  using Scalar = typename Matrix::non_const_value_type;
  Matrix xb;
  ImageView images;
  IndexView order;
  std::size_t first;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t f) const {
    xb(i, f) = static_cast<Scalar>(images(f, order(first + i))) / static_cast<Scalar>(255);
  }
};

/// yb(i) = the label of sample order(first + i).
template <class LabelVector, class IndexView> struct DataLoaderGatherLabels {
  LabelVector yb, labels;
  IndexView order;
  std::size_t first;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    yb(i) = labels(order(first + i));
  }
};

} // namespace detail

/// Serves mini-batches of a Dataset as `batch x features` matrices scaled to [0, 1].
///
/// All pixels are copied to `MemorySpace` once, at construction, as bytes (a quarter of the
/// memory of floats); each batch is gathered and converted on the device by one kernel, so an
/// epoch moves only the sample order (8 bytes per sample) from the host.
///
/// Usage:
/// @code
///   DataLoader<float> loader(train, 128, /*shuffle=*/true, seed);
///   for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
///     loader.start_epoch(epoch);
///     while (loader.next(space, x, y)) { ... }
///   }
/// @endcode
///
/// @tparam Scalar element type of the batch matrices.
/// @tparam MemorySpace where the data and the batches live.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace> class DataLoader {
public:
  using execution_space =
      typename MemorySpace::execution_space; ///< the execution space of MemorySpace, where batches
                                             ///< are gathered
  using memory_space = MemorySpace;          ///< where the data set and the batches live
  using scalar_type = Scalar;                ///< the element type of the batch matrices
  using matrix_type =
      kat::Matrix<Scalar, MemorySpace>; ///< a batch of samples: batch x features, column-major
  using label_vector =
      kat::Vector<std::int32_t, MemorySpace>; ///< a batch's labels, one class index per sample

  /// Copies `data` to `MemorySpace` and prepares epoch 0 (start_epoch(0) is called here, so a
  /// single-epoch user may call next() directly).
  ///
  /// @param data samples to serve; may be empty (then there are no batches).
  /// @param batch_size samples per batch, > 0; may exceed `data.size()`.
  /// @param shuffle whether each epoch visits the samples in a seeded random order.
  /// @param seed shuffle seed; the order of epoch e depends only on (seed, e).
  /// @param drop_last whether to skip a final batch smaller than `batch_size`.
  /// @throws ValueError if `batch_size == 0`.
  /// @throws ShapeError if `data.images.size() != data.size() * data.features()`.
  DataLoader(const Dataset &data, std::size_t batch_size, bool shuffle, std::uint64_t seed,
             bool drop_last = false)
      : batch_size_(batch_size), shuffle_(shuffle), drop_last_(drop_last), seed_(seed),
        shape_(data.shape), size_(data.size()), host_labels_(data.labels) {
    using kat::detail::concat;
    if (batch_size == 0) {
      throw ValueError("DataLoader: batch_size must be > 0, got 0");
    }
    const std::size_t features = data.features();
    if (data.images.size() != size_ * features) {
      throw ShapeError(concat("DataLoader: data.images must hold size() * features() = ", size_,
                              " * ", features, " bytes, got ", data.images.size()));
    }
    images_ = ImageView("kat::data::DataLoader::images", features, size_);
    labels_ = label_vector("kat::data::DataLoader::labels", size_);
    order_ = IndexView("kat::data::DataLoader::order", size_);
    order_host_ = Kokkos::create_mirror_view(order_);
    // A batch never holds more than the whole data set, so a huge batch_size (full-batch
    // training) allocates only what it can use.
    const std::size_t rows = std::min(batch_size_, size_);
    x_ = matrix_type("kat::data::DataLoader::x", rows, features);
    y_ = label_vector("kat::data::DataLoader::y", rows);

    // Sample-major bytes are exactly a LayoutLeft (features, n) array, so the host vectors are
    // wrapped, not repacked.
    Kokkos::View<const std::uint8_t **, Kokkos::LayoutLeft, Kokkos::HostSpace,
                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>
        host_images(data.images.data(), features, size_);
    Kokkos::View<const std::int32_t *, Kokkos::LayoutLeft, Kokkos::HostSpace,
                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>
        host_labels(data.labels.data(), size_);
    Kokkos::deep_copy(images_, host_images);
    Kokkos::deep_copy(labels_, host_labels);
    start_epoch(0);
  }

  /// Batches in the current epoch: ceil(epoch_size() / batch_size), or floor with drop_last.
  std::size_t batches() const {
    const std::size_t n = epoch_size();
    return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  }
  /// Number of samples in the data set.
  std::size_t size() const { return size_; }
  /// Samples the current epoch serves: size(), or the length of the order given to
  /// start_epoch(epoch, order).
  std::size_t epoch_size() const { return host_order_.size(); }
  /// Samples per full batch, as given to the constructor.
  std::size_t batch_size() const { return batch_size_; }
  /// Per-sample shape.
  FeatureShape shape() const { return shape_; }
  /// Features per sample, `shape().size()`.
  std::size_t features() const { return shape_.size(); }
  /// All labels, on the host, in data set order (for evaluation code).
  const std::vector<std::int32_t> &host_labels() const { return host_labels_; }
  /// The current epoch's sample order, on the host: batch k holds samples
  /// order()[k*batch_size, ...). Its length is epoch_size().
  const std::vector<std::size_t> &order() const { return host_order_; }
  /// The epoch last passed to start_epoch.
  std::size_t epoch() const { return epoch_; }
  /// Samples served so far this epoch.
  std::size_t position() const { return cursor_; }

  /// The loader's place in its data (kat/core/state.hpp): "epoch" and "position" (uint64)
  /// and the epoch's "order" (uint64, [epoch_size()]), so a resumed run serves the rest of
  /// the epoch exactly, whichever sampler chose the order.
  StateDict state_dict() const {
    StateDict s;
    s.set("epoch", static_cast<std::uint64_t>(epoch_));
    s.set("position", static_cast<std::uint64_t>(cursor_));
    s.set("order", std::vector<std::uint64_t>(host_order_.begin(), host_order_.end()));
    return s;
  }

  /// Restores what state_dict() saved (of a loader over a data set of the same size).
  /// @throws StateError naming the entry that is missing, unexpected or of another dtype or
  ///   shape; ValueError if an index in "order" is >= size() or "position" exceeds the
  ///   order's length. The loader is unchanged on failure.
  void load_state_dict(const StateDict &state) {
    const char *where = "kat::data::DataLoader::load_state_dict";
    state.require_names(where, {"epoch", "position", "order"});
    const auto epoch = state.get<std::uint64_t>("epoch");
    const auto position = state.get<std::uint64_t>("position");
    const auto &shape = state.shape_of<std::uint64_t>("order");
    if (shape.size() != 1) {
      throw StateError(kat::detail::concat(where, ": state entry 'order' must have rank 1, got ",
                                           kat::detail::shape_string(shape)));
    }
    const auto order = state.get_vector<std::uint64_t>("order", shape);
    if (position > order.size()) {
      throw ValueError(kat::detail::concat(where, ": position must be <= the order's length ",
                                           order.size(), ", got ", position));
    }
    start_epoch(static_cast<std::size_t>(epoch),
                std::vector<std::size_t>(order.begin(), order.end()));
    cursor_ = static_cast<std::size_t>(position);
  }

  /// Starts epoch `epoch`: rewinds to the first batch and, with shuffling, sets the order to a
  /// Fisher-Yates permutation drawn from `HostRng(seed ^ splitmix64(epoch))`. The permutation
  /// is a pure function of (seed, epoch), independent of earlier epochs and of the standard
  /// library, so a resumed run reproduces the order of an uninterrupted one.
  /// Waits (Kokkos::fence) for gathers still reading the previous order.
  void start_epoch(std::size_t epoch) {
    epoch_ = epoch;
    cursor_ = 0;
    host_order_.resize(size_);
    std::iota(host_order_.begin(), host_order_.end(), std::size_t(0));
    if (shuffle_) {
      kat::HostRng rng(seed_ ^ kat::splitmix64(static_cast<std::uint64_t>(epoch)));
      rng.shuffle(host_order_.begin(), host_order_.end());
    }
    upload_order();
  }

  /// Starts epoch `epoch` serving exactly the samples `order` names, in that order, instead of
  /// the loader's own (shuffled or sequential) order: batch k holds samples
  /// order[k*batch_size, ...), and the epoch has order.size() samples (see epoch_size(),
  /// batches()). Indices may repeat and need not cover the data set. This is how a sampler
  /// the loader knows nothing about (kat::distributed::DistributedSampler gives each rank its
  /// shard) drives it; the `shuffle` and `seed` given to the constructor are not used for this
  /// epoch.
  ///
  /// Waits (Kokkos::fence) for gathers still reading the previous order. Allocates only if
  /// `order` is longer than any order before (the batch buffers grow if the batch does: the
  /// x and y of earlier next() calls then stop being updated).
  /// @throws ValueError if an index is >= size(), naming its position and value; the loader
  ///   is then unchanged.
  void start_epoch(std::size_t epoch, std::vector<std::size_t> order) {
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (order[k] >= size_) {
        throw ValueError(kat::detail::concat("DataLoader::start_epoch: order[", k, "] = ", order[k],
                                             " must be < size() = ", size_));
      }
    }
    epoch_ = epoch;
    cursor_ = 0;
    host_order_ = std::move(order);
    upload_order();
  }

  /// Gathers the next batch of the epoch.
  ///
  /// Sets `x` to a `b x features()` LayoutLeft matrix with x(i, f) = pixel f of sample
  /// order()[k + i] divided by 255 (so in [0, 1]), and `y` to the b labels, where k is the
  /// number of samples already served this epoch and b is batch_size() or, for the last
  /// batch, the remainder. The work is enqueued on `space`; no memory is allocated.
  ///
  /// `x` and `y` become views of buffers the loader owns: they are overwritten by the next
  /// call (and must not be written by the caller if the batch is reused), and for a short
  /// last batch they are unmanaged, valid only while the loader lives.
  ///
  /// @return false, leaving `x` and `y` untouched, once the epoch is exhausted (or, with
  ///   drop_last, when only a short batch remains).
  bool next(const execution_space &space, matrix_type &x, label_vector &y) {
    kat::ScopedRegion region("kat::data::DataLoader::next");
    const std::size_t n = host_order_.size();
    if (cursor_ >= n) {
      return false;
    }
    const std::size_t b = std::min(batch_size_, n - cursor_);
    if (drop_last_ && b < batch_size_) {
      return false;
    }
    const std::size_t features = shape_.size();
    if (b == x_.extent(0)) {
      x = x_;
      y = y_;
    } else {
      x = matrix_type(x_.data(), b, features);
      y = label_vector(y_.data(), b);
    }

    const ImageView images = images_;
    const label_vector labels = labels_;
    const IndexView order = order_;
    const matrix_type xb = x;
    const label_vector yb = y;
    const std::size_t first = cursor_;
    // Sample index fastest: writes to the LayoutLeft batch are contiguous, and the b source
    // rows being read (b x 64-byte lines) stay in L1 while f sweeps across them. No integer
    // division per pixel, unlike a flattened 1-D range.
    Kokkos::parallel_for(
        "kat::data::DataLoader::gather", kat::matrix_policy(space, b, features),
        detail::DataLoaderGather<matrix_type, ImageView, IndexView>{xb, images, order, first});
    Kokkos::parallel_for(
        "kat::data::DataLoader::gather_labels", Kokkos::RangePolicy<execution_space>(space, 0, b),
        detail::DataLoaderGatherLabels<label_vector, IndexView>{yb, labels, order, first});
    cursor_ += b;
    return true;
  }

private:
  using ImageView = Kokkos::View<std::uint8_t **, Kokkos::LayoutLeft, MemorySpace>;
  using IndexView = Kokkos::View<std::size_t *, MemorySpace>;

  /// Copies host_order_ to the device, growing order_ (and the batch buffers) if needed.
  void upload_order() {
    // When MemorySpace is host memory the mirror aliases order_, which a kernel launched by
    // next() may still read.
    Kokkos::fence();
    const std::size_t n = host_order_.size();
    if (n > order_.extent(0)) {
      order_ = IndexView("kat::data::DataLoader::order", n);
      order_host_ = Kokkos::create_mirror_view(order_);
    }
    const std::size_t rows = std::min(batch_size_, n);
    if (rows > x_.extent(0)) {
      x_ = matrix_type("kat::data::DataLoader::x", rows, shape_.size());
      y_ = label_vector("kat::data::DataLoader::y", rows);
    }
    std::copy(host_order_.begin(), host_order_.end(), order_host_.data());
    const auto used = std::make_pair(std::size_t(0), n);
    Kokkos::deep_copy(Kokkos::subview(order_, used), Kokkos::subview(order_host_, used));
  }

  std::size_t batch_size_;
  bool shuffle_;
  bool drop_last_;
  std::uint64_t seed_;
  FeatureShape shape_;
  std::size_t size_;
  std::vector<std::int32_t> host_labels_;
  std::vector<std::size_t> host_order_;

  ImageView images_;                          // (features, size): each sample contiguous
  label_vector labels_;                       // (size)
  IndexView order_;                           // (size): this epoch's sample order
  typename IndexView::HostMirror order_host_; // staging for order_
  matrix_type x_;                             // (min(batch_size, size), features)
  label_vector y_;                            // (min(batch_size, size))

  std::size_t epoch_ = 0;
  std::size_t cursor_ = 0;
};

} // namespace kat::data
