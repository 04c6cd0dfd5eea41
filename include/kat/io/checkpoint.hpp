#pragma once
/// @file
/// @brief Checkpoint files: a StateDict written atomically in a versioned, checksummed binary
/// format, and a directory of numbered checkpoints that keeps the newest K.
///
/// Format, version 1 (every integer little-endian):
///
///     header   "KATCKPT\0" (8 bytes), u32 version = 1, u32 flags = 0, u64 entry count,
///              u32 CRC-32 of the 24 bytes before it
///     entry    u32 name length, name (UTF-8, no NUL), u8 dtype (kat::DType), u8 rank,
///              u16 0, u64 extent × rank, u64 byte count (= product of the extents × the
///              dtype's size), the bytes, u32 CRC-32 of everything of the entry before it
///     footer   "KATEND\0\0" (8 bytes), u64 file size, u32 CRC-32 of the 16 bytes before it
///
/// CRC-32 is zlib's (ISO-HDLC, the one of gzip and PNG). Entries are in name order; nothing
/// follows the footer.

#include "kat/core/error.hpp"
#include "kat/core/state.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <optional>
#include <string>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include <dirent.h>

namespace kat {
namespace io {

/// The checkpoint format version this KAT writes and reads.
inline constexpr std::uint32_t checkpoint_version = 1;

namespace detail {

inline constexpr char checkpoint_magic[8] = {'K', 'A', 'T', 'C', 'K', 'P', 'T', '\0'};
inline constexpr char checkpoint_end[8] = {'K', 'A', 'T', 'E', 'N', 'D', '\0', '\0'};
/// Largest rank an entry may have.
inline constexpr std::uint8_t checkpoint_max_rank = 8;

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

/// Reads little-endian integers and raw bytes from an in-memory file, with bounds checks that
/// name the file and what was being read.
class Reader {
public:
  Reader(const std::vector<unsigned char> &data, const std::string &path)
      : data_(data), path_(path) {}

  template <class T> T get(const std::string &what) {
    need(sizeof(T), what);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      v |= static_cast<std::uint64_t>(data_[pos_ + i]) << (8 * i);
    }
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  const unsigned char *get_bytes(std::size_t n, const std::string &what) {
    need(n, what);
    const unsigned char *p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  /// Reads a CRC-32 and compares it with the one of the bytes from `from` to here.
  void check_crc(std::size_t from, const std::string &what) {
    const std::uint32_t actual = crc32_of(data_.data() + from, pos_ - from);
    const auto stored = get<std::uint32_t>("the CRC-32 of " + what);
    if (stored != actual) {
      fail(kat::detail::concat("the CRC-32 of ", what, " is 0x", hex(actual), ", the file says 0x",
                               hex(stored), " (the file is corrupt)"));
    }
  }
  std::size_t position() const { return pos_; }
  std::size_t remaining() const { return data_.size() - pos_; }

  [[noreturn]] void fail(const std::string &message) const {
    throw FormatError(kat::detail::concat("kat::io::load_checkpoint(\"", path_, "\"): ", message));
  }

private:
  static std::string hex(std::uint32_t v) {
    char s[9];
    std::snprintf(s, sizeof s, "%08x", static_cast<unsigned>(v));
    return s;
  }
  void need(std::size_t n, const std::string &what) const {
    if (n > remaining()) {
      fail(kat::detail::concat("the file ends at byte ", data_.size(), " inside ", what, " (", n,
                               " bytes needed at byte ", pos_, "): it is truncated"));
    }
  }

  const std::vector<unsigned char> &data_;
  std::string path_;
  std::size_t pos_ = 0;
};

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

} // namespace detail

/// The bytes of `state` in checkpoint format version 1 (see the file comment).
/// @throws Error on a big-endian host (the format is little-endian and KAT does not swap).
inline std::vector<unsigned char> encode_checkpoint(const StateDict &state) {
  if (!detail::host_is_little_endian()) {
    throw Error("kat::io::encode_checkpoint: checkpoints need a little-endian host");
  }
  detail::Writer w;
  w.put_bytes(detail::checkpoint_magic, 8);
  w.put<std::uint32_t>(checkpoint_version);
  w.put<std::uint32_t>(0);
  w.put<std::uint64_t>(state.size());
  w.put_crc(0);
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

/// Parses checkpoint bytes; `path` only names the file in errors.
/// @throws FormatError naming the file and, where there is one, the entry, if the magic, the
///   version, a CRC-32, a dtype, a rank, a byte count, a name or the footer is wrong, if an
///   entry repeats or is out of order, if the data ends early, or if bytes follow the footer.
inline StateDict decode_checkpoint(const std::vector<unsigned char> &data,
                                   const std::string &path = "<memory>") {
  detail::Reader r(data, path);
  const unsigned char *magic = r.get_bytes(8, "the header");
  if (std::memcmp(magic, detail::checkpoint_magic, 8) != 0) {
    r.fail("it does not start with \"KATCKPT\": not a KAT checkpoint");
  }
  const auto version = r.get<std::uint32_t>("the header");
  const auto flags = r.get<std::uint32_t>("the header");
  const auto count = r.get<std::uint64_t>("the header");
  r.check_crc(0, "the header");
  if (version != checkpoint_version) {
    r.fail(kat::detail::concat("format version ", version,
                               " is not supported (this KAT reads version ", checkpoint_version,
                               ")"));
  }
  if (flags != 0) {
    r.fail(kat::detail::concat("header flags must be 0, got ", flags));
  }
  StateDict state;
  std::string previous;
  for (std::uint64_t k = 0; k < count; ++k) {
    const std::size_t start = r.position();
    const std::string which = kat::detail::concat("entry ", k, " of ", count);
    const auto length = r.get<std::uint32_t>(which);
    if (length == 0 || length > StateDict::max_name_length) {
      r.fail(kat::detail::concat(which, ": its name length must be 1 to ",
                                 StateDict::max_name_length, ", got ", length));
    }
    const auto *name_bytes = r.get_bytes(length, which);
    const std::string name(reinterpret_cast<const char *>(name_bytes), length);
    const std::string what = "entry '" + name + "'";
    StateEntry e;
    e.dtype = static_cast<DType>(r.get<std::uint8_t>(what));
    const auto rank = r.get<std::uint8_t>(what);
    const auto pad = r.get<std::uint16_t>(what);
    if (rank > detail::checkpoint_max_rank || pad != 0) {
      r.fail(kat::detail::concat(what, ": rank must be at most ", int(detail::checkpoint_max_rank),
                                 " followed by 0, got ", int(rank), " and ", pad));
    }
    for (int i = 0; i < rank; ++i) {
      e.shape.push_back(r.get<std::uint64_t>(what));
    }
    const auto bytes = r.get<std::uint64_t>(what);
    // Checked before anything is allocated, so a corrupt count cannot ask for terabytes.
    if (bytes > r.remaining()) {
      r.fail(kat::detail::concat(what, " needs ", bytes, " bytes, only ", r.remaining(),
                                 " remain: the file is truncated or corrupt"));
    }
    const auto *payload = r.get_bytes(static_cast<std::size_t>(bytes), what);
    r.check_crc(start, what);
    if (name.find('\0') != std::string::npos) {
      r.fail(kat::detail::concat(which, ": its name holds a NUL"));
    }
    if (k > 0 && !(previous < name)) {
      r.fail(kat::detail::concat(what, " follows '", previous,
                                 "': entries must be in strictly increasing name order"));
    }
    e.bytes.assign(payload, payload + bytes);
    try {
      state.insert(name, std::move(e));
    } catch (const StateError &error) {
      r.fail(error.what());
    }
    previous = name;
  }
  const std::size_t footer = r.position();
  const unsigned char *end = r.get_bytes(8, "the footer");
  if (std::memcmp(end, detail::checkpoint_end, 8) != 0) {
    r.fail(kat::detail::concat("no footer after ", count, " entries (byte ", footer,
                               "): the file is corrupt"));
  }
  const auto size = r.get<std::uint64_t>("the footer");
  r.check_crc(footer, "the footer");
  if (size != data.size()) {
    r.fail(kat::detail::concat("the footer gives a file size of ", size, " bytes, the file has ",
                               data.size()));
  }
  return state;
}

/// Writes `state` to `path` so that `path` never names a partial file: the bytes go to
/// "<path>.tmp-<pid>" in the same directory, which is fsync()ed, renamed over `path`, and the
/// directory is fsync()ed. On failure the temporary file is removed and `path` is untouched.
/// @throws IOError naming the file and the system's reason if any step fails.
inline void save_checkpoint(const std::string &path, const StateDict &state) {
  const std::vector<unsigned char> bytes = encode_checkpoint(state);
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

/// Reads and validates the checkpoint at `path` (see decode_checkpoint()).
/// @throws IOError if the file cannot be read; FormatError as decode_checkpoint().
inline StateDict load_checkpoint(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw IOError(kat::detail::concat("kat::io::load_checkpoint(\"", path,
                                      "\"): cannot open it: ", detail::errno_text()));
  }
  std::vector<unsigned char> data((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  if (in.bad()) {
    throw IOError(kat::detail::concat("kat::io::load_checkpoint(\"", path, "\"): read error"));
  }
  return decode_checkpoint(data, path);
}

/// A directory of numbered checkpoints, "checkpoint-<step>.kat" (with R > 1 ranks, one file
/// per rank: "checkpoint-<step>.rank<r>-of-<R>.kat"), of which save() keeps the newest
/// `keep`. One writer per directory and rank.
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

  const std::string &directory() const { return dir_; }

  /// The file this rank's checkpoint of `step` has.
  std::string path(std::int64_t step) const { return dir_ + "/" + file_name(step, rank_, ranks_); }

  /// Saves `state` as step `step` (atomically, see save_checkpoint()), then deletes this rank's
  /// older checkpoints beyond the newest `keep` and temporary files a killed writer left.
  /// @returns the path written.
  /// @throws IOError as save_checkpoint().
  /// Distributed runs pass `prune = false` and call prune() once every rank has saved, so
  /// that every rank still holds the step all of them have.
  std::string save(std::int64_t step, const StateDict &state, bool prune = true) {
    const std::string p = path(step);
    save_checkpoint(p, state);
    if (prune) {
      this->prune();
    }
    return p;
  }

  /// Deletes this rank's checkpoints beyond the newest `keep`, and temporary files a killed
  /// writer of this rank left.
  void prune() {
    const std::vector<std::int64_t> steps = this->steps();
    for (std::size_t i = 0; i + keep_ < steps.size(); ++i) {
      ::unlink(path(steps[i]).c_str());
    }
    for (const std::string &name : list()) {
      const auto tmp = name.find(".kat.tmp-");
      if (tmp != std::string::npos && owns(name.substr(0, tmp + 4))) {
        ::unlink((dir_ + "/" + name).c_str());
      }
    }
  }

  /// The steps of this rank's complete checkpoints, in increasing order.
  std::vector<std::int64_t> steps() const {
    std::vector<std::int64_t> out;
    for (const std::string &name : list()) {
      std::int64_t step = 0;
      if (parse(name, step) && owns(name)) {
        out.push_back(step);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// This rank's newest checkpoint's step, if there is one.
  std::optional<std::int64_t> latest() const {
    const auto s = steps();
    if (s.empty()) {
      return std::nullopt;
    }
    return s.back();
  }

  /// The rank counts of the checkpoints in the directory (to explain a resume that finds none
  /// for this rank count).
  std::vector<int> rank_counts() const {
    std::vector<int> out;
    for (const std::string &name : list()) {
      std::int64_t step = 0;
      if (parse(name, step)) {
        int r = 0, n = 1;
        std::sscanf(name.c_str(), "checkpoint-%*d.rank%d-of-%d.kat", &r, &n);
        if (std::find(out.begin(), out.end(), n) == out.end()) {
          out.push_back(n);
        }
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
    return names;
  }

  /// Whether `name` is "checkpoint-<digits>[.rank<r>-of-<R>].kat"; sets `step`.
  static bool parse(const std::string &name, std::int64_t &step) {
    long long s = 0;
    int used = 0;
    if (name.size() < 20 || std::sscanf(name.c_str(), "checkpoint-%12lld%n", &s, &used) != 1 ||
        used != 23) {
      return false;
    }
    const std::string rest = name.substr(static_cast<std::size_t>(used));
    int r = 0, n = 0;
    char tail = 0;
    const bool ranked = std::sscanf(rest.c_str(), ".rank%d-of-%d.ka%c", &r, &n, &tail) == 3 &&
                        tail == 't' && rest == kat::detail::concat(".rank", r, "-of-", n, ".kat");
    if (rest != ".kat" && !ranked) {
      return false;
    }
    step = s;
    return true;
  }

  /// Whether the (complete) file name `name` is this rank's.
  bool owns(const std::string &name) const {
    std::int64_t step = 0;
    return parse(name, step) && name == file_name(step, rank_, ranks_);
  }

  std::string dir_;
  std::size_t keep_;
  int rank_, ranks_;
};

} // namespace io
} // namespace kat
