// fuzz_idx: kat::data::read_idx on arbitrary bytes, the bytes of a file, raw or gzip (the
// reader tells them apart by content: 1f 8b starts a gzip stream). The seeds
// (fuzz/corpus/idx) are a tiny images/labels pair, raw and gzipped.
//
// Beyond not crashing, an accepted input must give what read_idx documents: 1 to 4 nonzero
// extents whose product is the number of data bytes, at most 2^34; and a raw input (first
// byte 0, so not gzip) must be exactly the header those extents write followed by the data.
//
// KAT_FUZZ_IDX_BOUND=1 (environment) skips inputs whose header claims more data bytes than
// the input can hold (raw: its own length; gzip: 1032 times it, deflate's largest ratio):
// read_idx allocates what the header claims before reading (fuzz/findings/README.md, F1), so
// without this the target stops at its first such input. For fuzzing past that finding only.
#include "common.hpp"

#include "kat/data/idx.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace {

// The one place that hands the bytes to the reader. read_idx takes a path only, so the bytes
// go to an in-memory file (memfd, one per process) that it opens as /proc/self/fd/<fd>.
// When an in-memory entry point exists, this becomes a call to it.
kat::data::IdxArray parse(const std::uint8_t *data, std::size_t size) {
  static const int fd = [] {
    const int f = ::memfd_create("kat-fuzz-idx", 0);
    if (f < 0) {
      std::perror("fuzz_idx: memfd_create");
      std::abort();
    }
    return f;
  }();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, 0) != 0 ||
      (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))) {
    std::perror("fuzz_idx: writing the input to the memfd");
    std::abort();
  }
  return kat::data::read_idx(path);
}

kat_fuzz::Counts counts("fuzz_idx");

// The data bytes the IDX header at the start of the input (inflated first if it is gzip)
// claims, or 0 when there is no complete, well-formed header.
unsigned __int128 claimed_bytes(const std::uint8_t *data, std::size_t size) {
  std::uint8_t header[4 + 4 * 4] = {};
  std::size_t got = 0;
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    z_stream z{};
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
      return 0;
    }
    z.next_in = const_cast<Bytef *>(data);
    z.avail_in = static_cast<uInt>(size);
    z.next_out = header;
    z.avail_out = sizeof header;
    inflate(&z, Z_SYNC_FLUSH);
    got = sizeof header - z.avail_out;
    inflateEnd(&z);
  } else {
    got = size < sizeof header ? size : sizeof header;
    std::memcpy(header, data, got);
  }
  const std::size_t rank = got >= 4 ? header[3] : 0;
  if (rank == 0 || rank > 4 || got < 4 + 4 * rank) {
    return 0;
  }
  unsigned __int128 count = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    const std::uint8_t *p = header + 4 + 4 * i;
    count *= (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) |
             (std::uint32_t(p[2]) << 8) | std::uint32_t(p[3]);
  }
  return count;
}

// Whether KAT_FUZZ_IDX_BOUND=1 asks to skip `data` (see the file comment).
bool skip(const std::uint8_t *data, std::size_t size) {
  static const bool bound = [] {
    const char *v = std::getenv("KAT_FUZZ_IDX_BOUND");
    return v != nullptr && std::string(v) == "1";
  }();
  if (!bound) {
    return false;
  }
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  return claimed_bytes(data, size) > static_cast<unsigned __int128>(size) * (gzip ? 1032 : 1);
}

void check(const kat::data::IdxArray &a, const std::uint8_t *data, std::size_t size) {
  using kat_fuzz::finding;
  if (a.dims.empty() || a.dims.size() > 4) {
    finding("accepted with %zu dimensions (must be 1 to 4)", a.dims.size());
  }
  unsigned __int128 count = 1;
  for (std::size_t d : a.dims) {
    if (d == 0 || d > 0xFFFFFFFFu) {
      finding("accepted with an extent of %zu (must be in [1, 2^32))", d);
    }
    count *= d;
  }
  if (count != a.data.size() || count > (std::uint64_t(1) << 34)) {
    finding("accepted %zu data bytes, the extents' product is %llu", a.data.size(),
            static_cast<unsigned long long>(count));
  }
  if (size > 0 && data[0] == 0) { // raw: the input is the header and the data, nothing else
    const std::size_t header = 4 + 4 * a.dims.size();
    if (size != header + a.data.size()) {
      finding("raw input of %zu bytes accepted as a %zu-byte header and %zu data bytes", size,
              header, a.data.size());
    }
    if (data[3] != a.dims.size() || std::memcmp(data + header, a.data.data(), a.data.size()) != 0) {
      finding("raw input accepted with other dimensions or data than it holds");
    }
    for (std::size_t i = 0; i < a.dims.size(); ++i) {
      const std::uint8_t *p = data + 4 + 4 * i;
      const std::uint32_t d = (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) |
                              (std::uint32_t(p[2]) << 8) | std::uint32_t(p[3]);
      if (d != a.dims[i]) {
        finding("extent %zu read as %zu, the header says %u", i, a.dims[i], d);
      }
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  if (skip(data, size)) {
    return -1; // libFuzzer: do not add this input to the corpus
  }
  try {
    const kat::data::IdxArray a = parse(data, size);
    ++counts.accepted;
    check(a, data, size);
  } catch (const std::exception &) { // kat::Error derives from it: an expected rejection
    ++counts.rejected;
  }
  return 0;
}
