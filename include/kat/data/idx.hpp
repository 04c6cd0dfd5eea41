#pragma once
/// @file
/// @brief Reader and writer for IDX files, the format of MNIST and Fashion-MNIST
/// (LeCun et al., http://yann.lecun.com/exdb/mnist/), raw or gzip-compressed.
///
/// An IDX file is: two zero bytes, a type byte (0x08 = unsigned byte), a byte giving the
/// number of dimensions d, d big-endian uint32 extents, then the elements in row-major order
/// (the last dimension varies fastest). KAT reads only unsigned-byte files, the type every
/// MNIST-family image and label file uses.

#include "kat/core/error.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace kat::data {

/// An unsigned-byte IDX array: `dims` are the extents (outermost first), `data` holds
/// `product(dims)` elements in row-major order.
struct IdxArray {
  std::vector<std::size_t> dims;
  std::vector<std::uint8_t> data;
};

namespace detail {

/// The IDX type code of unsigned bytes, the only element type KAT reads.
inline constexpr std::uint8_t idx_ubyte = 0x08;
/// At most this many dimensions; MNIST-family files have 1 (labels) or 3 (images).
inline constexpr std::size_t idx_max_dims = 4;
/// Refuse arrays above 16 GiB: a corrupt header must not make us allocate without bound.
inline constexpr std::uint64_t idx_max_bytes = std::uint64_t(1) << 34;

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

struct GzCloser {
  void operator()(gzFile_s *f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

/// zlib's description of the stream's error state, or "" when there is none.
inline std::string gz_error_text(gzFile f) {
  int errnum = Z_OK;
  const char *msg = gzerror(f, &errnum);
  if (errnum == Z_OK) {
    return "";
  }
  if (errnum == Z_ERRNO) {
    return std::strerror(errno);
  }
  return msg != nullptr ? msg : "unknown zlib error";
}

/// Reads up to `len` bytes; returns how many were read before end of file or an error.
/// gzread takes an unsigned and returns an int, so large reads go in chunks.
inline std::uint64_t gz_read_fully(gzFile f, std::uint8_t *buf, std::uint64_t len) {
  constexpr std::uint64_t chunk = std::uint64_t(1) << 30;
  std::uint64_t got = 0;
  while (got < len) {
    const std::uint64_t want = len - got < chunk ? len - got : chunk;
    const int n = gzread(f, buf + got, static_cast<unsigned>(want));
    if (n <= 0) {
      break;
    }
    got += static_cast<std::uint64_t>(n);
  }
  return got;
}

/// Throws for a short read: IOError when the operating system failed the read, FormatError
/// (with zlib's explanation, e.g. "unexpected end of file" for a cut .gz) otherwise.
[[noreturn]] inline void throw_short_read(const std::string &path, gzFile f, const char *what,
                                          std::uint64_t expected, std::uint64_t got) {
  int errnum = Z_OK;
  gzerror(f, &errnum);
  const std::string zlib = gz_error_text(f);
  if (errnum == Z_ERRNO) {
    throw IOError(kat::detail::concat("read_idx: cannot read '", path, "': ", zlib));
  }
  throw FormatError(kat::detail::concat(
      "read_idx: '", path, "' is truncated: expected ", expected, " ", what, ", got ", got,
      zlib.empty() ? "" : " (zlib: ", zlib, zlib.empty() ? "" : ")"));
}

inline std::uint32_t load_be32(const std::uint8_t *p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}

} // namespace detail

/// Reads an unsigned-byte IDX file, raw or gzip-compressed (detected from the content, not
/// the name).
///
/// @param path file to read.
/// @return the array; `dims` has 1 to 4 nonzero extents and `data` their product in bytes.
/// @throws IOError if the file is missing, a directory, or cannot be read.
/// @throws FormatError if the magic number's leading bytes are not zero, the type is not
///   unsigned byte (0x08), the rank is 0 or above 4, an extent is 0, the array would exceed
///   2^34 bytes, the file (or the compressed stream) ends early ("truncated"), or bytes follow
///   the data ("trailing data"). Every message names `path`.
inline IdxArray read_idx(const std::string &path) {
  using kat::detail::concat;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw IOError(concat("read_idx: '", path, "' is a directory, not an IDX file"));
  }
  errno = 0;
  detail::GzHandle file(gzopen(path.c_str(), "rb"));
  if (!file) {
    throw IOError(concat("read_idx: cannot open '", path,
                         "': ", errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  gzFile f = file.get();
  // A larger buffer than zlib's 8 KiB default cuts the number of read calls on 47 MB images.
  gzbuffer(f, 1u << 17);

  std::uint8_t magic[4];
  if (const auto got = detail::gz_read_fully(f, magic, 4); got != 4) {
    detail::throw_short_read(path, f, "header bytes", 4, got);
  }
  const std::uint32_t magic_value = detail::load_be32(magic);
  if (magic[0] != 0 || magic[1] != 0) {
    throw FormatError(concat("read_idx: '", path, "': bad magic number: expected 0x0000TTDD, got ",
                             detail::hex(magic_value, 8), " (not an IDX file)"));
  }
  if (magic[2] != detail::idx_ubyte) {
    throw FormatError(concat("read_idx: '", path, "': unsupported element type ",
                             detail::hex(magic[2], 2), " (", detail::idx_type_name(magic[2]),
                             "); only unsigned byte (0x08) is supported"));
  }
  const std::size_t rank = magic[3];
  if (rank == 0 || rank > detail::idx_max_dims) {
    throw FormatError(concat("read_idx: '", path, "': number of dimensions must be 1 to ",
                             detail::idx_max_dims, ", got ", rank));
  }

  std::uint8_t dim_bytes[4 * detail::idx_max_dims];
  if (const auto got = detail::gz_read_fully(f, dim_bytes, 4 * rank); got != 4 * rank) {
    detail::throw_short_read(path, f, "dimension bytes", 4 * rank, got);
  }
  IdxArray out;
  out.dims.resize(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    out.dims[i] = detail::load_be32(dim_bytes + 4 * i);
    if (out.dims[i] == 0) {
      throw FormatError(concat("read_idx: '", path, "': dimension ", i, " is 0"));
    }
  }
  const std::uint64_t count =
      detail::idx_element_count<FormatError>(concat("read_idx: '", path, "'"), out.dims);

  out.data.resize(static_cast<std::size_t>(count));
  if (const auto got = detail::gz_read_fully(f, out.data.data(), count); got != count) {
    detail::throw_short_read(path, f, "data bytes", count, got);
  }
  // Reading past the data also makes zlib verify the gzip trailer (CRC and length), so a
  // .gz cut inside its last 8 bytes is caught here rather than passing silently.
  std::uint8_t extra = 0;
  const int more = gzread(f, &extra, 1);
  if (more > 0) {
    throw FormatError(concat("read_idx: '", path, "': trailing data after the ", count,
                             " data bytes the header describes"));
  }
  if (const std::string zlib = detail::gz_error_text(f); !zlib.empty()) {
    throw FormatError(concat("read_idx: '", path, "' is truncated or corrupt after the ", count,
                             " data bytes (zlib: ", zlib, ")"));
  }
  return out;
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
