#pragma once
/// @file
/// @brief Reader and writer for IDX files, the format of MNIST and Fashion-MNIST
/// (LeCun et al., http://yann.lecun.com/exdb/mnist/), raw or gzip-compressed.
///
/// An IDX file is: two zero bytes, a type byte (0x08 = unsigned byte), a byte giving the
/// number of dimensions d, d big-endian uint32 extents, then the elements in row-major order
/// (the last dimension varies fastest). KAT reads only unsigned-byte files, the type every
/// MNIST-family image and label file uses.
///
/// No allocation is sized by the header alone: a raw file's claim is compared with the file's
/// real length before anything is allocated, and a gzip stream's output buffer grows only as
/// decompressed bytes arrive, so a lying header costs at most what the stream really holds.

#include "kat/core/error.hpp"

#include <zlib.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace kat::data {

/// An unsigned-byte IDX array: `dims` are the extents (outermost first), `data` holds
/// `product(dims)` elements in row-major order.
struct IdxArray {
  std::vector<std::size_t> dims;  ///< the extents, outermost first
  std::vector<std::uint8_t> data; ///< product(dims) bytes, row-major
};

/// The largest array read_idx accepts unless told otherwise: 2^34 bytes (16 GiB), far above
/// any MNIST-family file (Fashion-MNIST's training images are 47 040 000 bytes). A gzip file
/// can legitimately decompress to that much, so lower it (read_idx's `max_data_bytes`) where
/// that is too much memory, e.g. in a fuzzer.
inline constexpr std::uint64_t idx_max_data_bytes = std::uint64_t(1) << 34;

namespace detail {

/// The IDX type code of unsigned bytes, the only element type KAT reads.
inline constexpr std::uint8_t idx_ubyte = 0x08;
/// At most this many dimensions; MNIST-family files have 1 (labels) or 3 (images).
inline constexpr std::size_t idx_max_dims = 4;
/// write_idx refuses arrays above this many bytes, read_idx's default limit.
inline constexpr std::uint64_t idx_max_bytes = idx_max_data_bytes;

inline const char *idx_type_name(unsigned code) {
  switch (code) {
  case 0x08:
    return "unsigned byte";
  case 0x09:
    return "signed byte";
  case 0x0B:
    return "int16";
  case 0x0C:
    return "int32";
  case 0x0D:
    return "float32";
  case 0x0E:
    return "float64";
  default:
    return "unknown";
  }
}

inline std::string hex(std::uint64_t value, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(value));
  return buf;
}

/// "60000 x 28 x 28".
inline std::string dims_text(const std::vector<std::size_t> &dims) {
  std::string out;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    out += (i == 0 ? "" : " x ") + std::to_string(dims[i]);
  }
  return out;
}

/// Product of `dims`, or throws `Err` when it exceeds idx_max_bytes (checked before each
/// multiplication, so the product itself cannot overflow).
template <class Err>
std::uint64_t idx_element_count(const std::string &where, const std::vector<std::size_t> &dims) {
  std::uint64_t count = 1;
  for (std::size_t d : dims) {
    if (d != 0 && count > idx_max_bytes / d) {
      throw Err(kat::detail::concat(where, ": dimensions describe more than ", idx_max_bytes,
                                    " bytes (the largest IDX array KAT reads)"));
    }
    count *= d;
  }
  return count;
}

inline std::uint32_t load_be32(const std::uint8_t *p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}

/// What a file that is not a regular file is, for error messages.
inline const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) {
    return "a directory";
  }
  if (S_ISFIFO(mode)) {
    return "a FIFO";
  }
  if (S_ISCHR(mode)) {
    return "a character device";
  }
  if (S_ISBLK(mode)) {
    return "a block device";
  }
  if (S_ISSOCK(mode)) {
    return "a socket";
  }
  return "not a regular file";
}

/// Raw bytes in memory. `total()` is known, so the header's claim is checked against it.
class IdxMemorySource {
public:
  IdxMemorySource(const std::uint8_t *data, std::size_t size) : data_(data), size_(size) {}
  std::size_t read(std::uint8_t *buf, std::size_t n) {
    const std::size_t k = std::min(n, size_ - pos_);
    if (k > 0) {
      std::memcpy(buf, data_ + pos_, k);
    }
    pos_ += k;
    return k;
  }
  std::optional<std::uint64_t> total() const { return size_; }
  const char *holder() const { return "the buffer"; }
  std::string end_note() const { return ""; }

private:
  const std::uint8_t *data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

/// Raw bytes of an open regular file (not owned). `total()` is the length fstat reported.
class IdxFileSource {
public:
  IdxFileSource(int fd, std::uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}
  /// Reads up to `n` bytes; fewer only at end of file. @throws IOError if read(2) fails.
  std::size_t read(std::uint8_t *buf, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const std::size_t want = std::min<std::size_t>(n - got, std::size_t(1) << 30);
      const ssize_t k = ::read(fd_, buf + got, want);
      if (k < 0 && errno == EINTR) {
        continue;
      }
      if (k < 0) {
        throw IOError(
            kat::detail::concat("read_idx: cannot read '", path_, "': ", std::strerror(errno)));
      }
      if (k == 0) {
        break;
      }
      got += static_cast<std::size_t>(k);
    }
    return got;
  }
  std::optional<std::uint64_t> total() const { return size_; }
  const char *holder() const { return "the file"; }
  std::string end_note() const { return ""; }

private:
  int fd_;
  std::uint64_t size_;
  std::string path_;
};

/// The decompressed bytes of a gzip stream (one or more members) read from `Inner` in
/// 128 KiB chunks. The decompressed length is unknown up front (`total()` is empty); reads
/// return fewer bytes than asked only at the end of the stream or where the compressed data
/// is cut short (then `end_note()` says so).
template <class Inner> class IdxGzipSource {
public:
  IdxGzipSource(Inner &inner, std::string where)
      : inner_(inner), where_(std::move(where)), in_(std::size_t(1) << 17) {
    // 16 + MAX_WBITS: a gzip wrapper (header, CRC-32 and length trailer), nothing else.
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) {
      throw Error(kat::detail::concat(where_, ": zlib cannot start decompressing (",
                                      zs_.msg != nullptr ? zs_.msg : "out of memory", ")"));
    }
  }
  ~IdxGzipSource() { inflateEnd(&zs_); }
  IdxGzipSource(const IdxGzipSource &) = delete;
  IdxGzipSource &operator=(const IdxGzipSource &) = delete;

  /// @throws FormatError if the compressed data is corrupt (zlib's reason in the message).
  std::size_t read(std::uint8_t *buf, std::size_t n) {
    std::size_t got = 0;
    while (got < n && state_ == State::running) {
      if (zs_.avail_in == 0 && !refill()) {
        state_ = State::cut;
        break;
      }
      const std::size_t want = std::min<std::size_t>(n - got, UINT_MAX);
      zs_.next_out = buf + got;
      zs_.avail_out = static_cast<uInt>(want);
      const int ret = inflate(&zs_, Z_NO_FLUSH);
      got += want - zs_.avail_out;
      if (ret == Z_STREAM_END) {
        // Another member may follow (as `gzip -d` accepts); anything else is refused by
        // inflate's header check on the next round.
        if (zs_.avail_in == 0 && !refill()) {
          state_ = State::ended;
        } else if (inflateReset(&zs_) != Z_OK) {
          corrupt("inflateReset failed");
        }
      } else if (ret == Z_BUF_ERROR) {
        if (zs_.avail_in != 0) {
          corrupt("no progress");
        }
      } else if (ret == Z_MEM_ERROR) {
        throw std::bad_alloc();
      } else if (ret != Z_OK) {
        corrupt(zs_.msg != nullptr ? zs_.msg : "corrupt data");
      }
    }
    return got;
  }
  std::optional<std::uint64_t> total() const { return std::nullopt; }
  const char *holder() const { return "the gzip stream"; }
  std::string end_note() const {
    return state_ == State::cut ? " (the compressed data ends before the gzip stream does)" : "";
  }

private:
  enum class State { running, ended, cut };

  bool refill() {
    const std::size_t k = inner_.read(in_.data(), in_.size());
    zs_.next_in = in_.data();
    zs_.avail_in = static_cast<uInt>(k);
    return k > 0;
  }
  [[noreturn]] void corrupt(const char *why) {
    throw FormatError(kat::detail::concat(where_, ": corrupt gzip data after ", zs_.total_out,
                                          " decompressed bytes of this member (zlib: ", why, ")"));
  }

  Inner &inner_;
  std::string where_;
  std::vector<std::uint8_t> in_;
  z_stream zs_{};
  State state_ = State::running;
};

/// Parses one IDX array from `src` (see IdxMemorySource, IdxFileSource, IdxGzipSource).
/// `where` starts every message ("read_idx: 'path'").
template <class Source>
IdxArray parse_idx(Source &src, const std::string &where, std::uint64_t max_data_bytes) {
  using kat::detail::concat;
  const auto truncated = [&](const char *what, std::uint64_t expected, std::uint64_t got) {
    return FormatError(concat(where, " is truncated: expected ", expected, " ", what, ", got ", got,
                              src.end_note()));
  };

  std::uint8_t magic[4];
  if (const std::size_t got = src.read(magic, 4); got != 4) {
    throw truncated("header bytes", 4, got);
  }
  if (magic[0] != 0 || magic[1] != 0) {
    throw FormatError(concat(where, ": bad magic number: expected 0x0000TTDD, got ",
                             hex(load_be32(magic), 8), " (not an IDX file)"));
  }
  if (magic[2] != idx_ubyte) {
    throw FormatError(concat(where, ": unsupported element type ", hex(magic[2], 2), " (",
                             idx_type_name(magic[2]), "); only unsigned byte (0x08) is supported"));
  }
  const std::size_t rank = magic[3];
  if (rank == 0 || rank > idx_max_dims) {
    throw FormatError(concat(where, ": number of dimensions (byte 3 of the magic number ",
                             hex(load_be32(magic), 8), ") must be 1 to ", idx_max_dims, ", got ",
                             rank));
  }
  std::uint8_t dim_bytes[4 * idx_max_dims];
  if (const std::size_t got = src.read(dim_bytes, 4 * rank); got != 4 * rank) {
    throw truncated("dimension bytes", 4 * rank, got);
  }
  IdxArray out;
  out.dims.resize(rank);
  std::uint64_t count = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < rank; ++i) {
    const std::uint32_t d = load_be32(dim_bytes + 4 * i);
    if (d == 0) {
      throw FormatError(concat(where, ": dimension ", i, " is 0"));
    }
    out.dims[i] = d;
    overflow = overflow || count > std::numeric_limits<std::uint64_t>::max() / d;
    count = overflow ? count : count * d;
  }
  const std::string dims = dims_text(out.dims);
  if (overflow) {
    throw FormatError(
        concat(where, ": the header's dimensions ", dims, " multiply to more than 2^64 - 1 bytes"));
  }
  const std::uint64_t header_bytes = 4 + 4 * rank;
  const std::string claim = concat("the header claims ", dims, " = ", count, " data bytes");
  // Raw data: the claim must match the real length, checked before anything is allocated.
  if (const std::optional<std::uint64_t> total = src.total()) {
    const std::uint64_t avail = *total >= header_bytes ? *total - header_bytes : 0;
    const bool fits = avail >= count;
    if (!fits || avail > count) {
      throw FormatError(concat(where, fits ? ": trailing data: " : " is truncated: ", claim, " (",
                               header_bytes + count, " bytes with its ", header_bytes,
                               "-byte header), ", src.holder(), " holds ", *total, " bytes"));
    }
  }
  const std::uint64_t limit = std::min<std::uint64_t>(max_data_bytes, SIZE_MAX);
  if (count > limit) {
    throw FormatError(concat(where, ": ", claim, ", more than the limit of ", limit,
                             " bytes (read_idx's max_data_bytes; default "
                             "kat::data::idx_max_data_bytes = 2^34)"));
  }

  std::size_t got = 0;
  if (src.total()) {
    out.data.resize(static_cast<std::size_t>(count));
    got = src.read(out.data.data(), out.data.size());
  } else {
    // Grow only as data arrives: at most twice what the stream delivered, plus 1 MiB.
    constexpr std::size_t first_chunk = std::size_t(1) << 20;
    while (got < count) {
      if (got == out.data.size()) {
        out.data.resize(static_cast<std::size_t>(
            std::min<std::uint64_t>(count, std::max(first_chunk, 2 * out.data.size()))));
      }
      const std::size_t k = src.read(out.data.data() + got, out.data.size() - got);
      got += k;
      if (k == 0) {
        break;
      }
    }
  }
  if (got != count) {
    throw FormatError(concat(where, " is truncated: ", claim, ", ", src.holder(), " holds ", got,
                             " after the ", header_bytes, "-byte header", src.end_note()));
  }
  // Reading past the data also makes zlib verify the gzip trailer (CRC and length), so a
  // .gz cut inside its last 8 bytes is caught here rather than passing silently.
  std::uint8_t extra = 0;
  if (src.read(&extra, 1) > 0) {
    throw FormatError(
        concat(where, ": trailing data after the ", count, " data bytes the header describes"));
  }
  if (const std::string note = src.end_note(); !note.empty()) {
    throw FormatError(
        concat(where, " is truncated after the ", count, " data bytes the header describes", note));
  }
  return out;
}

/// Closes a file descriptor when it goes out of scope.
struct FdGuard {
  int fd;
  ~FdGuard() { ::close(fd); }
};

inline bool is_gzip(const std::uint8_t *p, std::size_t n) {
  return n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

} // namespace detail

/// Parses an unsigned-byte IDX array held in memory, raw or gzip-compressed (detected from the
/// first two bytes, 0x1f 0x8b). This is what read_idx(path) does once the file is open, and
/// the entry point for fuzzing: it never reads outside `[data, data + size)`, never allocates
/// more than `size` bytes for raw input, and for gzip input never more than about twice what
/// the stream really decompresses to (plus 1 MiB), whatever the header claims.
///
/// Signature: `IdxArray read_idx(const std::uint8_t *data, std::size_t size,
/// std::string_view name, std::uint64_t max_data_bytes = idx_max_data_bytes)`.
///
/// @param data the bytes; may be null when `size` is 0.
/// @param size number of bytes at `data`.
/// @param name what to call the input in messages (e.g. a file name).
/// @param max_data_bytes refuse arrays whose header claims more data bytes than this.
/// @return the array; `dims` has 1 to 4 nonzero extents and `data` their product in bytes.
/// @throws FormatError if the magic number's leading bytes are not zero, the type byte is not
///   0x08 (unsigned byte; the message names the byte and its type), the number of dimensions
///   is 0 or above 4, an extent is 0, the extents' product overflows 64 bits or exceeds
///   `max_data_bytes`, the input ends early ("truncated": the message gives the bytes the
///   header claims and the bytes there are), bytes follow the data ("trailing data"), or the
///   gzip data is corrupt or cut short. Every message names `name`.
inline IdxArray read_idx(const std::uint8_t *data, std::size_t size, std::string_view name,
                         std::uint64_t max_data_bytes = idx_max_data_bytes) {
  const std::string where = kat::detail::concat("read_idx: '", name, "'");
  detail::IdxMemorySource raw(data, size);
  if (detail::is_gzip(data, size)) {
    detail::IdxGzipSource<detail::IdxMemorySource> gz(raw, where);
    return detail::parse_idx(gz, where, max_data_bytes);
  }
  return detail::parse_idx(raw, where, max_data_bytes);
}

/// Reads an unsigned-byte IDX file, raw or gzip-compressed (detected from the content, not
/// the name).
///
/// A raw file's header is checked against the file's length before anything is allocated;
/// a gzip file is decompressed in chunks into a buffer that grows only as data arrives (see
/// the in-memory read_idx overload, which parses the same way).
///
/// @param path file to read.
/// @param max_data_bytes refuse arrays whose header claims more data bytes than this.
/// @return the array; `dims` has 1 to 4 nonzero extents and `data` their product in bytes.
/// @throws IOError if the file is missing or cannot be read, or is not a regular file
///   (a directory, FIFO or device: "is not a regular file (it is a FIFO)"; a FIFO is never
///   waited on).
/// @throws FormatError as the in-memory read_idx: bad magic, a type other than unsigned byte
///   (0x08), 0 or more than 4 dimensions, a zero extent, extents whose product overflows or
///   exceeds `max_data_bytes` (default 2^34), a file shorter than its header claims (the
///   message gives both lengths), trailing data, corrupt or cut gzip data. Every message
///   names `path`.
inline IdxArray read_idx(const std::string &path,
                         std::uint64_t max_data_bytes = idx_max_data_bytes) {
  using kat::detail::concat;
  const std::string where = concat("read_idx: '", path, "'");
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw IOError(concat("read_idx: cannot open '", path, "': ", std::strerror(errno)));
  }
  const detail::FdGuard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw IOError(concat("read_idx: cannot stat '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw IOError(
        concat(where, " is not a regular file (it is ", detail::file_kind(st.st_mode), ")"));
  }
  std::uint8_t head[2] = {0, 0};
  const ssize_t peeked = ::pread(fd, head, 2, 0);
  if (peeked < 0) {
    throw IOError(concat("read_idx: cannot read '", path, "': ", std::strerror(errno)));
  }
  detail::IdxFileSource raw(fd, static_cast<std::uint64_t>(st.st_size), path);
  if (detail::is_gzip(head, static_cast<std::size_t>(peeked))) {
    detail::IdxGzipSource<detail::IdxFileSource> gz(raw, where);
    return detail::parse_idx(gz, where, max_data_bytes);
  }
  return detail::parse_idx(raw, where, max_data_bytes);
}

/// Writes an uncompressed unsigned-byte IDX file, atomically: the bytes go to
/// `path + ".tmp"`, which is renamed over `path` only once complete, so a failure never leaves
/// a partial file at `path`.
///
/// @param path destination; overwritten if it exists.
/// @param dims extents, outermost first: 1 to 4 of them, each in [1, 2^32).
/// @param data `product(dims)` bytes in row-major order.
/// @throws ValueError if `dims` is empty, longer than 4, has a zero or too-large extent, or
///   describes more than 2^34 bytes, or `data` is null.
/// @throws IOError if the temporary file cannot be written or renamed.
inline void write_idx(const std::string &path, const std::vector<std::size_t> &dims,
                      const std::uint8_t *data) {
  using kat::detail::concat;
  if (dims.empty() || dims.size() > detail::idx_max_dims) {
    throw ValueError(concat("write_idx: '", path, "': number of dimensions must be 1 to ",
                            detail::idx_max_dims, ", got ", dims.size()));
  }
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0 || dims[i] > std::numeric_limits<std::uint32_t>::max()) {
      throw ValueError(
          concat("write_idx: '", path, "': dimension ", i, " must be in [1, 2^32), got ", dims[i]));
    }
  }
  const std::uint64_t count =
      detail::idx_element_count<ValueError>(concat("write_idx: '", path, "'"), dims);
  if (data == nullptr) {
    throw ValueError(concat("write_idx: '", path, "': data is null"));
  }

  std::vector<std::uint8_t> header{0, 0, detail::idx_ubyte, static_cast<std::uint8_t>(dims.size())};
  for (std::size_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      header.push_back(static_cast<std::uint8_t>(d >> shift));
    }
  }

  const std::string tmp = path + ".tmp";
  errno = 0;
  std::FILE *out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) {
    throw IOError(concat("write_idx: cannot create '", tmp, "': ", std::strerror(errno)));
  }
  const bool wrote = std::fwrite(header.data(), 1, header.size(), out) == header.size() &&
                     std::fwrite(data, 1, count, out) == count;
  const int write_errno = errno;
  // fclose flushes, so its failure (e.g. disk full) is a write failure too.
  const bool closed = std::fclose(out) == 0;
  const int close_errno = errno;
  if (!wrote || !closed) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw IOError(concat("write_idx: cannot write '", tmp,
                         "': ", std::strerror(!wrote ? write_errno : close_errno)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw IOError(concat("write_idx: cannot rename '", tmp, "' to '", path, "': ", ec.message()));
  }
}

} // namespace kat::data
