#pragma once
/// @file
/// @brief Checkpoint files: a StateDict and text metadata written atomically in a versioned,
/// checksummed binary format, and a directory of checkpoints that keeps one run's newest K.
///
/// Format, version 2 (every integer little-endian):
///
///     header   "KATCKPT\0" (8 bytes), u32 version = 2, u32 flags = 0, u64 entry count,
///              u64 metadata length M (at most checkpoint_max_metadata), u32 CRC-32 of the
///              32 bytes before it
///     metadata M bytes of text, one "key=value\n" line per pair (keys: 1 to 128 of
///              [A-Za-z0-9_.-], unique; values: no newline, no NUL), u32 CRC-32 of the M bytes
///     entry    u32 name length, name (UTF-8, no NUL), u8 dtype (kat::DType), u8 rank,
///              u16 0, u64 extent × rank, u64 byte count (= product of the extents × the
///              dtype's size), the bytes, u32 CRC-32 of everything of the entry before it
///     footer   "KATEND\0\0" (8 bytes), u64 file size, u32 CRC-32 of the 16 bytes before it
///
/// Version 1 (still read) has no metadata: its header ends after the entry count, with the
/// CRC-32 of its 24 bytes. CRC-32 is zlib's (ISO-HDLC, the one of gzip and PNG). Entries are
/// in name order; nothing follows the footer.
///
/// Reading never trusts a length: the magic is checked on the first 8 bytes, and every length
/// field is compared with what remains of the file before anything is allocated, so no read
/// holds more memory than the file's size, and a foreign file costs 8 bytes of reading.

#include "kat/core/error.hpp"
#include "kat/core/state.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <istream>
#include <limits>
#include <optional>
#include <random>
#include <streambuf>
#include <string>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include <dirent.h>

namespace kat {
namespace io {

/// The checkpoint format version this KAT writes (it reads 1 and 2).
inline constexpr std::uint32_t checkpoint_version = 2;
/// The largest metadata block a checkpoint may hold, in bytes.
inline constexpr std::uint64_t checkpoint_max_metadata = std::uint64_t(1) << 20;
/// The longest metadata key, in bytes.
inline constexpr std::size_t checkpoint_max_key = 128;

/// A checkpoint's text metadata: key-value pairs in file order (kat::train::Checkpointer
/// stores the run id, the position and the run's configuration there).
using CheckpointMetadata = std::vector<std::pair<std::string, std::string>>;

/// What a checkpoint's header says, read without its entries (read_checkpoint_header()).
struct CheckpointHeader {
  std::uint32_t version =
      checkpoint_version;      ///< the format version the file was written in (1 or 2)
  std::uint64_t entries = 0;   ///< the entry count
  CheckpointMetadata metadata; ///< empty in version 1
  std::uint64_t file_size = 0; ///< the whole file's size in bytes (the input's, when parsed)

  /// The value of `key`, or nullopt.
  std::optional<std::string> find(const std::string &key) const {
    for (const auto &[k, v] : metadata) {
      if (k == key) {
        return v;
      }
    }
    return std::nullopt;
  }
};

/// A whole checkpoint: its header (with the metadata) and its state.
struct Checkpoint {
  CheckpointHeader header; ///< the header, with the metadata
  StateDict state;         ///< the named tensors
};

namespace detail {

inline constexpr char checkpoint_magic[8] = {'K', 'A', 'T', 'C', 'K', 'P', 'T', '\0'};
inline constexpr char checkpoint_end[8] = {'K', 'A', 'T', 'E', 'N', 'D', '\0', '\0'};
/// Largest rank an entry may have.
inline constexpr std::uint8_t checkpoint_max_rank = 8;
/// The fewest bytes an entry takes (a 1-byte name, rank 0, no bytes).
inline constexpr std::uint64_t checkpoint_min_entry = 4 + 1 + 1 + 1 + 2 + 8 + 4;
/// The footer's size.
inline constexpr std::uint64_t checkpoint_footer = 8 + 8 + 4;

inline bool host_is_little_endian() {
  const std::uint16_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

inline std::uint32_t crc32_of(const unsigned char *data, std::size_t n, std::uint32_t crc = 0) {
  // zlib takes uInt lengths: feed large payloads in pieces.
  while (n > 0) {
    const uInt piece = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = static_cast<std::uint32_t>(::crc32(crc, data, piece));
    data += piece;
    n -= piece;
  }
  return crc;
}

inline std::string hex32(std::uint32_t v) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", static_cast<unsigned>(v));
  return s;
}

inline bool metadata_key_ok(const std::string &key) {
  if (key.empty() || key.size() > checkpoint_max_key) {
    return false;
  }
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

/// Appends little-endian integers and raw bytes.
class Writer {
public:
  template <class T> void put(T value) {
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out.push_back(static_cast<unsigned char>(static_cast<std::uint64_t>(value) >> (8 * i)));
    }
  }
  void put_bytes(const void *data, std::size_t n) {
    const auto *p = static_cast<const unsigned char *>(data);
    out.insert(out.end(), p, p + n);
  }
  /// Appends the CRC-32 of everything from `from` on.
  void put_crc(std::size_t from) { put(crc32_of(out.data() + from, out.size() - from)); }

  std::vector<unsigned char> out;
};

/// Bytes in memory, read in order.
class MemorySource {
public:
  MemorySource(const unsigned char *data, std::size_t size) : data_(data), size_(size) {}
  bool read(unsigned char *dst, std::size_t n) {
    if (n > size_ - pos_) {
      return false;
    }
    if (n > 0) {
      std::memcpy(dst, data_ + pos_, n);
    }
    pos_ += n;
    return true;
  }

private:
  const unsigned char *data_;
  std::size_t size_, pos_ = 0;
};

/// A std::istream, read in order.
class StreamSource {
public:
  explicit StreamSource(std::istream &in) : in_(in) {}
  bool read(unsigned char *dst, std::size_t n) {
    while (n > 0) {
      const auto piece = static_cast<std::streamsize>(std::min<std::size_t>(n, 1u << 30));
      in_.read(reinterpret_cast<char *>(dst), piece);
      if (in_.gcount() != piece) {
        return false;
      }
      dst += piece;
      n -= static_cast<std::size_t>(piece);
    }
    return true;
  }

private:
  std::istream &in_;
};

/// Reads little-endian integers and raw bytes from a source of `size` bytes, keeping the
/// running CRC-32 of what it read since start_crc(), with bounds checks that name the file and
/// what was being read. Nothing is read past `size`.
template <class Source> class Reader {
public:
  Reader(Source &source, std::uint64_t size, const std::string &path)
      : source_(source), size_(size), path_(path) {}

  template <class T> T get(const std::string &what) {
    unsigned char b[sizeof(T)];
    bytes(b, sizeof(T), what);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      v |= static_cast<std::uint64_t>(b[i]) << (8 * i);
    }
    return static_cast<T>(v);
  }
  /// Reads `n` bytes to `dst` (checked against the remaining length first).
  void bytes(unsigned char *dst, std::uint64_t n, const std::string &what) {
    if (n > remaining()) {
      fail(kat::detail::concat("the file ends at byte ", size_, " inside ", what, " (", n,
                               " bytes needed at byte ", pos_, "): it is truncated"));
    }
    if (!source_.read(dst, static_cast<std::size_t>(n))) {
      fail(kat::detail::concat("reading ", what, " at byte ", pos_,
                               " failed: the file is shorter than its size ", size_,
                               " or unreadable"));
    }
    crc_ = crc32_of(dst, static_cast<std::size_t>(n), crc_);
    pos_ += n;
  }
  void start_crc() { crc_ = 0; }
  /// Reads a CRC-32 and compares it with the one of the bytes since start_crc().
  void check_crc(const std::string &what) {
    const std::uint32_t actual = crc_;
    const auto stored = get<std::uint32_t>("the CRC-32 of " + what);
    if (stored != actual) {
      fail(kat::detail::concat("the CRC-32 of ", what, " is 0x", hex32(actual),
                               ", the file says 0x", hex32(stored), " (the file is corrupt)"));
    }
  }
  std::uint64_t position() const { return pos_; }
  std::uint64_t remaining() const { return size_ - pos_; }
  std::uint64_t size() const { return size_; }

  [[noreturn]] void fail(const std::string &message) const {
    throw FormatError(kat::detail::concat("kat::io::load_checkpoint(\"", path_, "\"): ", message));
  }

private:
  Source &source_;
  std::uint64_t size_;
  const std::string &path_;
  std::uint64_t pos_ = 0;
  std::uint32_t crc_ = 0;
};

/// Parses "key=value\n" lines.
template <class Source>
CheckpointMetadata parse_metadata(Reader<Source> &r, const std::string &text) {
  CheckpointMetadata out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string::npos) {
      r.fail(kat::detail::concat("the metadata's last line (byte ", at, " of it) has no newline"));
    }
    const std::string line = text.substr(at, end - at);
    const std::size_t eq = line.find('=');
    const std::string key = line.substr(0, eq);
    if (eq == std::string::npos || !metadata_key_ok(key)) {
      r.fail(kat::detail::concat("metadata line ", out.size() + 1,
                                 " is not key=value with a key of 1 to ", checkpoint_max_key,
                                 " of [A-Za-z0-9_.-]"));
    }
    const std::string value = line.substr(eq + 1);
    if (value.find('\0') != std::string::npos) {
      r.fail(kat::detail::concat("metadata '", key, "' holds a NUL"));
    }
    for (const auto &kv : out) {
      if (kv.first == key) {
        r.fail(kat::detail::concat("metadata '", key, "' is given twice"));
      }
    }
    out.emplace_back(key, value);
    at = end + 1;
  }
  return out;
}

/// Reads the header and the metadata.
template <class Source> CheckpointHeader parse_header(Reader<Source> &r) {
  CheckpointHeader h;
  h.file_size = r.size();
  r.start_crc();
  unsigned char magic[8];
  // The magic first, alone: a file that is not a checkpoint costs 8 bytes.
  r.bytes(magic, 8, "the header");
  if (std::memcmp(magic, checkpoint_magic, 8) != 0) {
    r.fail("it does not start with \"KATCKPT\": not a KAT checkpoint");
  }
  h.version = r.template get<std::uint32_t>("the header");
  if (h.version != 1 && h.version != 2) {
    r.fail(kat::detail::concat("format version ", h.version,
                               " is not supported (this KAT reads versions 1 and 2)"));
  }
  const auto flags = r.template get<std::uint32_t>("the header");
  h.entries = r.template get<std::uint64_t>("the header");
  const std::uint64_t metadata = h.version >= 2 ? r.template get<std::uint64_t>("the header") : 0;
  r.check_crc("the header");
  if (flags != 0) {
    r.fail(kat::detail::concat("header flags must be 0, got ", flags));
  }
  if (metadata > checkpoint_max_metadata) {
    r.fail(kat::detail::concat("the metadata length must be at most ", checkpoint_max_metadata,
                               " bytes, got ", metadata));
  }
  // Checked before the metadata is allocated and before any entry is read.
  const std::uint64_t crc = h.version >= 2 ? 4 : 0;
  if (metadata + crc + checkpoint_footer > r.remaining() ||
      h.entries > (r.remaining() - metadata - crc - checkpoint_footer) / checkpoint_min_entry) {
    r.fail(kat::detail::concat("the header gives ", metadata, " bytes of metadata and ", h.entries,
                               " entries, which need at least ", metadata + crc + checkpoint_footer,
                               " + ", checkpoint_min_entry, " per entry bytes; only ",
                               r.remaining(), " remain: the file is truncated or corrupt"));
  }
  if (h.version >= 2) {
    std::string text(static_cast<std::size_t>(metadata), '\0');
    r.start_crc();
    r.bytes(reinterpret_cast<unsigned char *>(&text[0]), metadata, "the metadata");
    r.check_crc("the metadata");
    h.metadata = parse_metadata(r, text);
  }
  return h;
}

/// Reads the entries and the footer after parse_header().
template <class Source> StateDict parse_entries(Reader<Source> &r, std::uint64_t count) {
  StateDict state;
  std::string previous;
  for (std::uint64_t k = 0; k < count; ++k) {
    r.start_crc();
    const std::string which = kat::detail::concat("entry ", k, " of ", count);
    const auto length = r.template get<std::uint32_t>(which);
    if (length == 0 || length > StateDict::max_name_length) {
      r.fail(kat::detail::concat(which, ": its name length must be 1 to ",
                                 StateDict::max_name_length, ", got ", length));
    }
    std::string name(length, '\0');
    r.bytes(reinterpret_cast<unsigned char *>(&name[0]), length, which);
    const std::string what = "entry '" + name + "'";
    StateEntry e;
    e.dtype = static_cast<DType>(r.template get<std::uint8_t>(what));
    const auto rank = r.template get<std::uint8_t>(what);
    const auto pad = r.template get<std::uint16_t>(what);
    if (rank > checkpoint_max_rank || pad != 0) {
      r.fail(kat::detail::concat(what, ": rank must be at most ", int(checkpoint_max_rank),
                                 " followed by 0, got ", int(rank), " and ", pad));
    }
    for (int i = 0; i < rank; ++i) {
      e.shape.push_back(r.template get<std::uint64_t>(what));
    }
    // The element count × the dtype's size must not wrap around (StateDict checks the
    // byte count against it).
    std::uint64_t limit =
        std::numeric_limits<std::uint64_t>::max() / std::max<std::uint64_t>(1, dtype_size(e.dtype));
    const bool empty = std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end();
    for (const std::uint64_t extent : e.shape) {
      if (!empty && limit / extent == 0) {
        r.fail(kat::detail::concat(what, ": its shape ", kat::detail::shape_string(e.shape),
                                   " has more elements than 2^64 bytes hold"));
      }
      limit = empty ? limit : limit / extent;
    }
    const auto bytes = r.template get<std::uint64_t>(what);
    // Checked before anything is allocated, so a corrupt count cannot ask for terabytes.
    if (bytes > r.remaining()) {
      r.fail(kat::detail::concat(what, " needs ", bytes, " bytes, only ", r.remaining(),
                                 " remain: the file is truncated or corrupt"));
    }
    e.bytes.resize(static_cast<std::size_t>(bytes));
    r.bytes(e.bytes.data(), bytes, what);
    r.check_crc(what);
    if (name.find('\0') != std::string::npos) {
      r.fail(kat::detail::concat(which, ": its name holds a NUL"));
    }
    if (k > 0 && !(previous < name)) {
      r.fail(kat::detail::concat(what, " follows '", previous,
                                 "': entries must be in strictly increasing name order"));
    }
    try {
      state.insert(name, std::move(e));
    } catch (const StateError &error) {
      r.fail(error.what());
    }
    previous = std::move(name);
  }
  const std::uint64_t footer = r.position();
  r.start_crc();
  unsigned char end[8];
  r.bytes(end, 8, "the footer");
  if (std::memcmp(end, checkpoint_end, 8) != 0) {
    r.fail(kat::detail::concat("no footer after ", count, " entries (byte ", footer,
                               "): the file is corrupt"));
  }
  const auto size = r.template get<std::uint64_t>("the footer");
  r.check_crc("the footer");
  if (size != r.size()) {
    r.fail(kat::detail::concat("the footer gives a file size of ", size, " bytes, the file has ",
                               r.size()));
  }
  return state;
}

inline std::string errno_text() { return std::strerror(errno); }

/// Writes all of `data` to `fd`, retrying after interruptions and short writes.
inline bool write_all(int fd, const unsigned char *data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    if (w <= 0) {
      return false;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

/// The directory part of `path` ("." when there is none).
inline std::string parent_directory(const std::string &path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    return ".";
  }
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// A read-only std::streambuf over a file descriptor (which it closes), in 64 KiB reads.
class FdStreamBuf : public std::streambuf {
public:
  explicit FdStreamBuf(int fd) : fd_(fd), buffer_(1 << 16) {}
  FdStreamBuf(const FdStreamBuf &) = delete;
  FdStreamBuf &operator=(const FdStreamBuf &) = delete;
  ~FdStreamBuf() override { ::close(fd_); }
  /// The errno of a failed read, 0 if none failed.
  int error() const { return error_; }

protected:
  int_type underflow() override {
    if (gptr() < egptr()) {
      return traits_type::to_int_type(*gptr());
    }
    ssize_t n;
    do {
      n = ::read(fd_, buffer_.data(), buffer_.size());
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      error_ = n < 0 ? errno : 0;
      return traits_type::eof();
    }
    setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

private:
  int fd_;
  std::vector<char> buffer_;
  int error_ = 0;
};

/// Opens `path` for reading if it is a regular file; the descriptor and the size.
/// @throws IOError naming the file if it cannot be opened or is not a regular file (a
///   directory, a FIFO, a device such as /dev/zero).
inline std::pair<int, std::uint64_t> open_regular(const std::string &path, const char *who) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer before fstat() can refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const std::string reason = errno_text();
    throw IOError(kat::detail::concat(who, "(\"", path, "\"): cannot open it: ", reason));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    throw IOError(kat::detail::concat(who, "(\"", path, "\"): cannot stat it: ", reason));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char *kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a file";
    throw IOError(
        kat::detail::concat(who, "(\"", path, "\"): not a regular file (it is ", kind, ")"));
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) {
    ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  }
  return {fd, static_cast<std::uint64_t>(st.st_size)};
}

} // namespace detail

/// The bytes of `state` and `metadata` in checkpoint format version 2 (see the file comment).
/// @throws Error on a big-endian host (the format is little-endian and KAT does not swap);
///   ValueError if a metadata key is not 1 to checkpoint_max_key of [A-Za-z0-9_.-] or repeats,
///   a value holds a newline or a NUL, or the metadata exceed checkpoint_max_metadata bytes.
inline std::vector<unsigned char> encode_checkpoint(const StateDict &state,
                                                    const CheckpointMetadata &metadata = {}) {
  if (!detail::host_is_little_endian()) {
    throw Error("kat::io::encode_checkpoint: checkpoints need a little-endian host");
  }
  std::string text;
  for (std::size_t i = 0; i < metadata.size(); ++i) {
    const auto &[key, value] = metadata[i];
    if (!detail::metadata_key_ok(key)) {
      throw ValueError(kat::detail::concat("kat::io::encode_checkpoint: metadata key '", key,
                                           "' must be 1 to ", checkpoint_max_key,
                                           " of [A-Za-z0-9_.-]"));
    }
    if (value.find_first_of(std::string("\n\0", 2)) != std::string::npos) {
      throw ValueError(kat::detail::concat("kat::io::encode_checkpoint: metadata '", key,
                                           "' must hold no newline and no NUL, got '", value, "'"));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (metadata[j].first == key) {
        throw ValueError(
            kat::detail::concat("kat::io::encode_checkpoint: metadata '", key, "' is given twice"));
      }
    }
    text += key + "=" + value + "\n";
  }
  if (text.size() > checkpoint_max_metadata) {
    throw ValueError(kat::detail::concat("kat::io::encode_checkpoint: the metadata take ",
                                         text.size(), " bytes, at most ", checkpoint_max_metadata,
                                         " are allowed"));
  }
  detail::Writer w;
  w.put_bytes(detail::checkpoint_magic, 8);
  w.put<std::uint32_t>(checkpoint_version);
  w.put<std::uint32_t>(0);
  w.put<std::uint64_t>(state.size());
  w.put<std::uint64_t>(text.size());
  w.put_crc(0);
  const std::size_t meta = w.out.size();
  w.put_bytes(text.data(), text.size());
  w.put_crc(meta);
  for (const auto &[name, entry] : state.entries()) {
    const std::size_t start = w.out.size();
    w.put<std::uint32_t>(static_cast<std::uint32_t>(name.size()));
    w.put_bytes(name.data(), name.size());
    w.put<std::uint8_t>(static_cast<std::uint8_t>(entry.dtype));
    if (entry.shape.size() > detail::checkpoint_max_rank) {
      throw StateError(kat::detail::concat("kat::io::encode_checkpoint: entry '", name,
                                           "' has rank ", entry.shape.size(), ", at most ",
                                           int(detail::checkpoint_max_rank), " is allowed"));
    }
    w.put<std::uint8_t>(static_cast<std::uint8_t>(entry.shape.size()));
    w.put<std::uint16_t>(0);
    for (const std::uint64_t e : entry.shape) {
      w.put<std::uint64_t>(e);
    }
    w.put<std::uint64_t>(entry.bytes.size());
    w.put_bytes(entry.bytes.data(), entry.bytes.size());
    w.put_crc(start);
  }
  const std::size_t footer = w.out.size();
  w.put_bytes(detail::checkpoint_end, 8);
  w.put<std::uint64_t>(footer + 20);
  w.put_crc(footer);
  return std::move(w.out);
}

/// Parses a whole checkpoint (format 1 or 2) from `size` bytes at `data`: the in-memory entry
/// point (a fuzzer's target). Any input is safe: nothing is read outside [data, data + size),
/// and nothing is allocated beyond `size` bytes in all.
/// @param data  the input's first byte
/// @param size  the input's length in bytes
/// @param name  names the input in errors (a file name, say)
/// @throws FormatError naming `name` and, where there is one, the entry, if the magic, the
///   version, a CRC-32, the metadata, a dtype, a rank, a byte count, a name or the footer is
///   wrong, if an entry repeats or is out of order, if the data end early, or if bytes follow
///   the footer. Nothing else.
inline Checkpoint parse_checkpoint(const unsigned char *data, std::size_t size,
                                   const std::string &name = "<memory>") {
  detail::MemorySource source(data, size);
  detail::Reader<detail::MemorySource> r(source, size, name);
  Checkpoint c;
  c.header = detail::parse_header(r);
  c.state = detail::parse_entries(r, c.header.entries);
  return c;
}

/// Parses a whole checkpoint from the next `size` bytes of `in` (as parse_checkpoint() of
/// bytes), reading it in order once: the magic before anything else, each length checked
/// against what remains of `size` before it is allocated or read.
/// @throws FormatError as the other overload, also if `in` ends or fails before `size` bytes.
inline Checkpoint parse_checkpoint(std::istream &in, std::uint64_t size,
                                   const std::string &name = "<stream>") {
  detail::StreamSource source(in);
  detail::Reader<detail::StreamSource> r(source, size, name);
  Checkpoint c;
  c.header = detail::parse_header(r);
  c.state = detail::parse_entries(r, c.header.entries);
  return c;
}

/// The header and metadata of the checkpoint in `size` bytes at `data`, without its entries
/// (which are not checked).
/// @throws FormatError as parse_checkpoint() for the header and the metadata.
inline CheckpointHeader parse_checkpoint_header(const unsigned char *data, std::size_t size,
                                                const std::string &name = "<memory>") {
  detail::MemorySource source(data, size);
  detail::Reader<detail::MemorySource> r(source, size, name);
  return detail::parse_header(r);
}

/// The header and metadata from the next bytes of `in`, a checkpoint of `size` bytes.
/// @throws FormatError as parse_checkpoint() for the header and the metadata.
inline CheckpointHeader parse_checkpoint_header(std::istream &in, std::uint64_t size,
                                                const std::string &name = "<stream>") {
  detail::StreamSource source(in);
  detail::Reader<detail::StreamSource> r(source, size, name);
  return detail::parse_header(r);
}

/// The state of a checkpoint's bytes (parse_checkpoint()); `path` only names the file in errors.
/// @throws FormatError as parse_checkpoint().
inline StateDict decode_checkpoint(const std::vector<unsigned char> &data,
                                   const std::string &path = "<memory>") {
  return parse_checkpoint(data.data(), data.size(), path).state;
}

/// Writes `state` and `metadata` to `path` so that `path` never names a partial file: the
/// bytes go to "<path>.tmp-<pid>" in the same directory, which is fsync()ed, renamed over
/// `path`, and the directory is fsync()ed. On failure the temporary file is removed and `path`
/// is untouched.
/// @throws IOError naming the file and the system's reason if any step fails; ValueError as
///   encode_checkpoint().
inline void save_checkpoint(const std::string &path, const StateDict &state,
                            const CheckpointMetadata &metadata = {}) {
  const std::vector<unsigned char> bytes = encode_checkpoint(state, metadata);
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const auto fail = [&](const std::string &step) {
    const std::string reason = detail::errno_text();
    ::unlink(tmp.c_str());
    throw IOError(
        kat::detail::concat("kat::io::save_checkpoint(\"", path, "\"): ", step, ": ", reason));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const std::string reason = detail::errno_text();
    throw IOError(kat::detail::concat("kat::io::save_checkpoint(\"", path, "\"): cannot create ",
                                      tmp, ": ", reason));
  }
  if (!detail::write_all(fd, bytes.data(), bytes.size())) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    fail("writing " + tmp);
  }
  if (::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    fail("fsync of " + tmp);
  }
  if (::close(fd) != 0) {
    fail("closing " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    fail("renaming " + tmp);
  }
  // The rename is durable once the directory is.
  const std::string dir = detail::parent_directory(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

namespace detail {
/// Runs `parse(stream, size)` on the regular file `path`; a failed read is an IOError.
template <class Parse> auto read_file_with(const std::string &path, const char *who, Parse parse) {
  const auto [fd, size] = open_regular(path, who);
  FdStreamBuf buf(fd);
  std::istream in(&buf);
  try {
    return parse(in, size);
  } catch (const FormatError &) {
    if (buf.error() != 0) {
      errno = buf.error();
      throw IOError(kat::detail::concat(who, "(\"", path, "\"): read error: ", errno_text()));
    }
    throw;
  }
}
} // namespace detail

/// Reads and validates the checkpoint at `path`, header and state (see parse_checkpoint()):
/// the magic is checked on the first 8 bytes read, and no length read from the file is
/// trusted before it is compared with the file's size.
/// @throws IOError if the file cannot be opened or read, or is not a regular file (a
///   directory, a FIFO, a device: "not a regular file"); FormatError as parse_checkpoint().
inline Checkpoint read_checkpoint(const std::string &path) {
  return detail::read_file_with(
      path, "kat::io::load_checkpoint",
      [&](std::istream &in, std::uint64_t size) { return parse_checkpoint(in, size, path); });
}

/// Reads only the header and the metadata of the checkpoint at `path` (a few hundred bytes
/// of a file of any size).
/// @throws IOError and FormatError as read_checkpoint(), for the header and the metadata.
inline CheckpointHeader read_checkpoint_header(const std::string &path) {
  return detail::read_file_with(path, "kat::io::load_checkpoint",
                                [&](std::istream &in, std::uint64_t size) {
                                  return parse_checkpoint_header(in, size, path);
                                });
}

/// The state of the checkpoint at `path` (read_checkpoint()).
/// @throws IOError and FormatError as read_checkpoint().
inline StateDict load_checkpoint(const std::string &path) { return read_checkpoint(path).state; }

/// A new random run id: 16 lowercase hexadecimal digits (64 bits from std::random_device).
inline std::string new_run_id() {
  std::random_device device;
  const std::uint64_t v = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

/// One file of a CheckpointDirectory as its header describes it.
struct CheckpointFile {
  std::string path;        ///< the path: the directory + "/" + name
  std::string name;        ///< the file name
  std::string error;       ///< why the file is not a usable checkpoint; empty if it is
  CheckpointHeader header; ///< the file's header (default-constructed where it could not be read)
  std::int64_t step = -1;  ///< the stored step (metadata "step")
  std::string run;         ///< the stored run id (metadata "run"; "" for an anonymous run)
  int rank = 0;            ///< the stored rank (metadata "rank")
  int ranks = 1;           ///< the stored rank count (metadata "ranks")
  /// Whether the file is a usable checkpoint (error is empty).
  bool usable() const { return error.empty(); }
};

/// A directory of one run's checkpoints, "checkpoint-<step>.kat" (with R > 1 ranks, one file
/// per rank: "checkpoint-<step>.rank<r>-of-<R>.kat"), of which save() keeps the newest `keep`.
/// One writer per directory and rank.
///
/// Names are only names: every file's step, run id, rank and rank count are read from its
/// header (metadata "step", "run", "rank", "ranks", written by save()), so a renamed or copied
/// file is ordered by what it holds, and files of another run (set_run()) or another rank are
/// neither listed by steps() nor deleted by prune(). Files of format 1 hold no such metadata:
/// they are never listed nor deleted (load them by name with load_checkpoint()).
class CheckpointDirectory {
public:
  /// @param dir   the directory; created (one level) if missing.
  /// @param keep  how many of this rank's checkpoints save() keeps, >= 1.
  /// @param rank, ranks  this process's rank and the rank count (0 and 1 without MPI).
  /// @throws ValueError if keep == 0 or rank >= ranks; IOError if `dir` cannot be created or
  ///   is not a directory.
  CheckpointDirectory(std::string dir, std::size_t keep, int rank = 0, int ranks = 1)
      : dir_(std::move(dir)), keep_(keep), rank_(rank), ranks_(ranks) {
    if (keep_ == 0) {
      throw ValueError("kat::io::CheckpointDirectory: keep must be >= 1, got 0");
    }
    if (ranks_ < 1 || rank_ < 0 || rank_ >= ranks_) {
      throw ValueError(kat::detail::concat("kat::io::CheckpointDirectory: rank must be in [0, ",
                                           ranks_, "), got ", rank_));
    }
    if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
      throw IOError(kat::detail::concat("kat::io::CheckpointDirectory: cannot create \"", dir_,
                                        "\": ", detail::errno_text()));
    }
    struct stat st;
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      throw IOError(
          kat::detail::concat("kat::io::CheckpointDirectory: \"", dir_, "\" is not a directory"));
    }
  }

  /// The directory the checkpoints are in.
  const std::string &directory() const { return dir_; }
  /// This process's rank.
  int rank() const { return rank_; }
  /// The rank count.
  int ranks() const { return ranks_; }

  /// The run whose checkpoints this directory writes, lists and prunes ("" by default: an
  /// anonymous run). kat::io::new_run_id() makes one.
  /// @throws ValueError if `run` holds a newline or a NUL.
  void set_run(const std::string &run) {
    if (run.find_first_of(std::string("\n\0", 2)) != std::string::npos) {
      throw ValueError("kat::io::CheckpointDirectory::set_run: the run id must hold no newline "
                       "and no NUL");
    }
    run_ = run;
  }
  /// The run set by set_run() ("" for an anonymous run).
  const std::string &run() const { return run_; }

  /// The file name save() gives this rank's checkpoint of `step`.
  std::string path(std::int64_t step) const { return dir_ + "/" + file_name(step, rank_, ranks_); }

  /// Saves `state` as step `step` (atomically, see save_checkpoint()) with the metadata
  /// "run", "step", "rank", "ranks" and then `metadata`, then deletes this run's and rank's
  /// checkpoints beyond the newest `keep` and temporary files a killed writer left.
  /// @returns the path written.
  /// @throws IOError as save_checkpoint(); ValueError if `metadata` holds one of the four keys.
  /// Distributed runs pass `prune = false` and call prune() once every rank has saved, so
  /// that every rank still holds the step all of them have.
  std::string save(std::int64_t step, const StateDict &state, bool prune = true,
                   const CheckpointMetadata &metadata = {}) {
    CheckpointMetadata all{{"run", run_},
                           {"step", std::to_string(step)},
                           {"rank", std::to_string(rank_)},
                           {"ranks", std::to_string(ranks_)}};
    for (const auto &kv : metadata) {
      if (kv.first == "run" || kv.first == "step" || kv.first == "rank" || kv.first == "ranks") {
        throw ValueError(kat::detail::concat("kat::io::CheckpointDirectory::save: metadata key '",
                                             kv.first, "' is the directory's own"));
      }
      all.push_back(kv);
    }
    const std::string p = path(step);
    save_checkpoint(p, state, all);
    if (prune) {
      this->prune();
    }
    return p;
  }

  /// Deletes this run's and rank's checkpoints beyond the newest `keep` by stored step, and
  /// temporary files a killed writer of this rank left. Other files are left alone.
  void prune() {
    const std::vector<CheckpointFile> mine = files();
    for (std::size_t i = 0; i + keep_ < mine.size(); ++i) {
      ::unlink(mine[i].path.c_str());
    }
    const std::string own = ranks_ > 1 ? kat::detail::concat(".rank", rank_, "-of-", ranks_, ".kat")
                                       : std::string(".kat");
    for (const std::string &name : list()) {
      const auto tmp = name.find(".kat.tmp-");
      if (tmp != std::string::npos && name.compare(0, 11, "checkpoint-") == 0) {
        const std::string base = name.substr(0, tmp + 4);
        const bool ranked = base.find(".rank") != std::string::npos;
        if ((ranks_ > 1) == ranked && base.size() >= own.size() &&
            base.compare(base.size() - own.size(), own.size(), own) == 0) {
          ::unlink((dir_ + "/" + name).c_str());
        }
      }
    }
  }

  /// Every "checkpoint-*.kat" file in the directory, of any run and rank, described by its
  /// header (read alone), in increasing stored step (unusable files first), then name.
  std::vector<CheckpointFile> scan() const {
    std::vector<CheckpointFile> out;
    for (const std::string &name : list()) {
      if (name.size() < 15 || name.compare(0, 11, "checkpoint-") != 0 ||
          name.compare(name.size() - 4, 4, ".kat") != 0) {
        continue;
      }
      CheckpointFile f;
      f.name = name;
      f.path = dir_ + "/" + name;
      try {
        f.header = read_checkpoint_header(f.path);
        describe(f);
      } catch (const Error &e) {
        f.error = e.what();
      }
      out.push_back(std::move(f));
    }
    std::sort(out.begin(), out.end(), [](const CheckpointFile &a, const CheckpointFile &b) {
      return a.step != b.step ? a.step < b.step : a.name < b.name;
    });
    return out;
  }

  /// This run's and rank's checkpoints, in increasing stored step (then name).
  std::vector<CheckpointFile> files() const {
    std::vector<CheckpointFile> out;
    for (auto &f : scan()) {
      if (f.usable() && f.run == run_ && f.rank == rank_ && f.ranks == ranks_) {
        out.push_back(std::move(f));
      }
    }
    return out;
  }

  /// The stored steps of this run's and rank's checkpoints, in increasing order.
  std::vector<std::int64_t> steps() const {
    std::vector<std::int64_t> out;
    for (const auto &f : files()) {
      out.push_back(f.step);
    }
    return out;
  }

  /// This run's and rank's newest checkpoint's stored step, if there is one.
  std::optional<std::int64_t> latest() const {
    const auto s = steps();
    if (s.empty()) {
      return std::nullopt;
    }
    return s.back();
  }

  /// The file of this run's and rank's checkpoint of stored step `step`, if there is one (the
  /// first by name if several hold it).
  std::optional<std::string> find(std::int64_t step) const {
    for (const auto &f : files()) {
      if (f.step == step) {
        return f.path;
      }
    }
    return std::nullopt;
  }

  /// The rank counts of the usable checkpoints in the directory, of any run (to explain a
  /// resume that finds none for this rank count).
  std::vector<int> rank_counts() const {
    std::vector<int> out;
    for (const auto &f : scan()) {
      if (f.usable() && std::find(out.begin(), out.end(), f.ranks) == out.end()) {
        out.push_back(f.ranks);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// "checkpoint-<step, 12 digits>.kat", or "...rank<r>-of-<R>.kat" with R > 1.
  static std::string file_name(std::int64_t step, int rank, int ranks) {
    char s[96];
    if (ranks > 1) {
      std::snprintf(s, sizeof s, "checkpoint-%012lld.rank%d-of-%d.kat",
                    static_cast<long long>(step), rank, ranks);
    } else {
      std::snprintf(s, sizeof s, "checkpoint-%012lld.kat", static_cast<long long>(step));
    }
    return s;
  }

private:
  std::vector<std::string> list() const {
    std::vector<std::string> names;
    DIR *d = ::opendir(dir_.c_str());
    if (d == nullptr) {
      throw IOError(kat::detail::concat("kat::io::CheckpointDirectory: cannot list \"", dir_,
                                        "\": ", detail::errno_text()));
    }
    while (const dirent *e = ::readdir(d)) {
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  /// Fills step, run, rank and ranks from the header, or the error.
  static void describe(CheckpointFile &f) {
    const auto integer = [&f](const char *key, long long lo, long long hi, long long &out) {
      const auto text = f.header.find(key);
      if (!text) {
        f.error = kat::detail::concat(f.path, ": its metadata have no '", key, "'");
        return false;
      }
      errno = 0;
      char *end = nullptr;
      out = std::strtoll(text->c_str(), &end, 10);
      if (text->empty() || *end != '\0' || errno != 0 || out < lo || out > hi) {
        f.error = kat::detail::concat(f.path, ": its metadata '", key, "' must be an integer in [",
                                      lo, ", ", hi, "], got '", *text, "'");
        return false;
      }
      return true;
    };
    if (f.header.version < 2) {
      f.error = kat::detail::concat(f.path, ": format version ", f.header.version,
                                    " holds no step, run or rank in its header");
      return;
    }
    long long step = 0, rank = 0, ranks = 0;
    if (!integer("step", 0, std::numeric_limits<long long>::max(), step) ||
        !integer("ranks", 1, 1 << 24, ranks) || !integer("rank", 0, ranks - 1, rank)) {
      return;
    }
    f.step = step;
    f.rank = static_cast<int>(rank);
    f.ranks = static_cast<int>(ranks);
    f.run = f.header.find("run").value_or("");
  }

  std::string dir_;
  std::size_t keep_;
  int rank_, ranks_;
  std::string run_;
};

} // namespace io
} // namespace kat
