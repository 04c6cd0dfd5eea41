#pragma once
/// @file
/// @brief An in-memory labelled image data set, and loaders for MNIST-family IDX files.

#include "kat/core/error.hpp"
#include "kat/core/views.hpp"
#include "kat/data/idx.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace kat::data {

/// Labelled samples of unsigned-byte features, held on the host.
struct Dataset {
  /// Sample-major pixels: sample i's `features()` bytes are at [i*features(), (i+1)*features()),
  /// in FeatureShape's order `h + height * (w + width * c)`, so a batch viewed as a
  /// LayoutLeft (N, H, W, C) view shows every image upright (h = row, w = column).
  std::vector<std::uint8_t> images;
  /// One class index in [0, classes) per sample.
  std::vector<std::int32_t> labels;
  /// Per-sample shape; (1, 28, 28) for MNIST and Fashion-MNIST.
  FeatureShape shape;
  /// Number of classes.
  int classes = 0;

  /// Number of samples.
  std::size_t size() const { return labels.size(); }
  /// Bytes per sample, `shape.size()`.
  std::size_t features() const { return shape.size(); }

  /// The first `n` samples, copied.
  /// @throws ValueError if `n > size()`.
  Dataset take(std::size_t n) const {
    if (n > size()) {
      throw ValueError(
          kat::detail::concat("Dataset::take: n must be at most size() = ", size(), ", got ", n));
    }
    Dataset out;
    out.images.assign(images.begin(), images.begin() + static_cast<std::ptrdiff_t>(n * features()));
    out.labels.assign(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(n));
    out.shape = shape;
    out.classes = classes;
    return out;
  }
};

/// Builds a Dataset from an IDX image array and an IDX label array.
///
/// The arrays are taken by value so that callers who pass temporaries (as
/// load_fashion_mnist does) move the pixel buffer instead of copying it.
///
/// IDX images are row-major (pixel (r, c) at byte `r * cols + c`); each sample is transposed
/// into FeatureShape's column-major order (pixel (r, c) at feature `r + rows * c`), so image
/// layers see the picture with h = row and w = column.
///
/// @param images rank 3, (n, rows, cols).
/// @param labels rank 1, (n), each value < `classes`.
/// @param classes number of classes, > 0.
/// @throws ValueError if `classes <= 0`.
/// @throws ShapeError if `images` is not rank 3, `labels` is not rank 1, their sample counts
///   differ, or an image extent exceeds `int`.
/// @throws FormatError if a label is `>= classes` (naming its index and value).
inline Dataset make_dataset(IdxArray images, IdxArray labels, int classes) {
  using kat::detail::concat;
  if (classes <= 0) {
    throw ValueError(concat("make_dataset: classes must be > 0, got ", classes));
  }
  if (images.dims.size() != 3) {
    throw ShapeError(concat("make_dataset: images must be rank 3 (n, rows, cols), got rank ",
                            images.dims.size()));
  }
  if (labels.dims.size() != 1) {
    throw ShapeError(
        concat("make_dataset: labels must be rank 1 (n), got rank ", labels.dims.size()));
  }
  const std::size_t n = images.dims[0];
  if (labels.dims[0] != n) {
    throw ShapeError(concat("make_dataset: images and labels must have the same number of "
                            "samples, got ",
                            n, " images and ", labels.dims[0], " labels"));
  }
  constexpr auto int_max = static_cast<std::size_t>(std::numeric_limits<int>::max());
  if (images.dims[1] > int_max || images.dims[2] > int_max) {
    throw ShapeError(concat("make_dataset: image extents must fit in int, got ", images.dims[1],
                            " x ", images.dims[2]));
  }
  const FeatureShape shape{1, static_cast<int>(images.dims[1]), static_cast<int>(images.dims[2])};
  if (images.data.size() != n * shape.size() || labels.data.size() != n) {
    throw ShapeError(concat("make_dataset: IdxArray data size disagrees with its dims (",
                            images.data.size(), " image bytes for ", n, " x ", shape.size(), ", ",
                            labels.data.size(), " label bytes for ", n, ")"));
  }

  Dataset out;
  out.labels.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int label = labels.data[i];
    if (label >= classes) {
      throw FormatError(
          concat("make_dataset: label ", i, " is ", label, ", must be < classes = ", classes));
    }
    out.labels[i] = label;
  }
  // Transposed in place, one sample at a time, so the pixel buffer is moved, not copied.
  const std::size_t rows = images.dims[1];
  const std::size_t cols = images.dims[2];
  std::vector<std::uint8_t> sample(shape.size());
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t *pixels = images.data.data() + i * shape.size();
    std::copy(pixels, pixels + shape.size(), sample.begin());
    for (std::size_t c = 0; c < cols; ++c) {
      for (std::size_t r = 0; r < rows; ++r) {
        pixels[r + rows * c] = sample[r * cols + c];
      }
    }
  }
  out.images = std::move(images.data);
  out.shape = shape;
  out.classes = classes;
  return out;
}

/// Which half of a data set to load.
enum class Split { train, test };

/// Where the Debian package dataset-fashion-mnist installs Fashion-MNIST (60000 training and
/// 10000 test samples, gzip-compressed IDX).
inline constexpr const char *default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

namespace detail {

/// What a file of type `type` is, for "is not a regular file (it is ...)".
inline const char *file_type_text(std::filesystem::file_type type) {
  using std::filesystem::file_type;
  switch (type) {
  case file_type::regular:
    return "a regular file";
  case file_type::directory:
    return "a directory";
  case file_type::fifo:
    return "a FIFO";
  case file_type::character:
    return "a character device";
  case file_type::block:
    return "a block device";
  case file_type::socket:
    return "a socket";
  case file_type::symlink:
    return "a dangling symbolic link";
  default:
    return "of an unknown type";
  }
}

/// `dir/name.gz` if it exists, else `dir/name` if it exists, else "".
/// @throws IOError if the one found is not a regular file (a directory, FIFO or device), or
///   its type cannot be determined.
inline std::string find_idx_file(const std::string &dir, const std::string &name) {
  using kat::detail::concat;
  for (const std::string &candidate : {name + ".gz", name}) {
    const std::filesystem::path p = std::filesystem::path(dir) / candidate;
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(p, ec);
    if (st.type() == std::filesystem::file_type::not_found) {
      continue;
    }
    if (st.type() == std::filesystem::file_type::none ||
        st.type() == std::filesystem::file_type::unknown) {
      throw IOError(concat("load_fashion_mnist: cannot inspect '", p.string(),
                           "': ", ec ? ec.message() : "unknown file type"));
    }
    if (st.type() != std::filesystem::file_type::regular) {
      throw IOError(concat("load_fashion_mnist: '", p.string(), "' is not a regular file (it is ",
                           file_type_text(st.type()), "); expected the IDX file ", candidate));
    }
    return p.string();
  }
  return "";
}

/// Throws FormatError unless `array` (read from `path`) has the rank of `what`: labels are
/// rank 1 (magic 0x00000801), images rank 3 (magic 0x00000803).
inline void require_idx_kind(const std::string &path, const IdxArray &array, bool labels) {
  const std::size_t rank = array.dims.size();
  const std::size_t expected = labels ? 1 : 3;
  if (rank == expected) {
    return;
  }
  const std::string found =
      rank == 1   ? "is a labels file (magic 0x00000801)"
      : rank == 3 ? "is an images file (magic 0x00000803)"
                  : kat::detail::concat("has rank ", rank, " (magic ", hex(0x800 + rank, 8), ")");
  throw FormatError(
      kat::detail::concat("load_fashion_mnist: '", path, "' ", found, ", expected ",
                          labels ? "labels (magic 0x00000801)" : "images (magic 0x00000803)"));
}

} // namespace detail

/// Loads one split of Fashion-MNIST (or MNIST: the file names are the same) from IDX files.
///
/// Looks in `dir` for `train-images-idx3-ubyte` and `train-labels-idx1-ubyte` (Split::train)
/// or `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte` (Split::test), each first with a
/// `.gz` suffix and then without.
///
/// @return 28x28 images as shape (1, 28, 28), 10 classes.
/// @throws IOError if `dir` exists but is not a directory ("is not a directory"), a file is
///   found in neither form (the message lists what was looked for and how to install the
///   data), is not a regular file (a directory, FIFO or device: "is not a regular file"), or
///   cannot be read.
/// @throws FormatError if a file is corrupt (see read_idx), or the labels file is an images
///   file or vice versa ("... is an images file (magic 0x00000803), expected labels (magic
///   0x00000801)").
/// @throws ShapeError if the two files disagree (the message names both files and both sample
///   counts).
inline Dataset load_fashion_mnist(const std::string &dir, Split split) {
  using kat::detail::concat;
  {
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(dir, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_directory(st)) {
      throw IOError(concat("load_fashion_mnist: data directory '", dir,
                           "' is not a directory (it is ", detail::file_type_text(st.type()),
                           "); pass --data-dir pointing at a directory with the IDX files"));
    }
  }
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string image_name = prefix + "-images-idx3-ubyte";
  const std::string label_name = prefix + "-labels-idx1-ubyte";
  const std::string image_path = detail::find_idx_file(dir, image_name);
  const std::string label_path = detail::find_idx_file(dir, label_name);
  if (image_path.empty() || label_path.empty()) {
    std::string missing;
    for (const auto *name : {&image_name, &label_name}) {
      if ((name == &image_name ? image_path : label_path).empty()) {
        missing += concat(missing.empty() ? "" : ", ", *name, ".gz or ", *name);
      }
    }
    std::error_code ec;
    const bool dir_exists = std::filesystem::is_directory(dir, ec);
    throw IOError(concat(
        "load_fashion_mnist: ", prefix == "train" ? "training" : "test", " split not found in '",
        dir, "'", dir_exists ? "" : " (the directory does not exist)", ": looked for ", missing,
        "; install the Debian package dataset-fashion-mnist (scripts/setup.sh "
        "does this) or pass --data-dir pointing at a directory with the IDX "
        "files"));
  }
  // Each file's kind (magic 0x801 or 0x803) is checked as soon as it is read, labels first.
  IdxArray labels = read_idx(label_path);
  detail::require_idx_kind(label_path, labels, true);
  IdxArray images = read_idx(image_path);
  detail::require_idx_kind(image_path, images, false);
  const std::string context = concat("loading '", image_path, "' and '", label_path, "': ");
  try {
    return make_dataset(std::move(images), std::move(labels), 10);
  } catch (const ShapeError &e) {
    throw ShapeError(context + e.what());
  } catch (const FormatError &e) {
    throw FormatError(context + e.what());
  }
}

} // namespace kat::data
