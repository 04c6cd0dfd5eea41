// fuzz_idx: kat::data::read_idx on arbitrary bytes, the bytes of a file, raw or gzip (the
// reader tells them apart by content: 1f 8b starts a gzip stream). The seeds
// (fuzz/corpus/idx) are a tiny images/labels pair, raw and gzipped.
//
// Beyond not crashing, an accepted input must give what read_idx documents: 1 to 4 nonzero
// extents whose product is the number of data bytes, at most the limit below; and a raw input
// (first byte 0, so not gzip) must be exactly the header those extents write followed by the data.
//
// The reader is given a data limit of 64 MiB (kat::data::read_idx's max_data_bytes), so a
// gzip stream that really inflates to gigabytes is refused by the limit, not by the fuzzer's
// memory cap; a header that claims more than the input holds must be refused before any
// allocation of that size (fuzz/findings/README.md, F1, fixed).
#include "common.hpp"

#include "kat/data/idx.hpp"

#include <cstdint>
#include <cstring>
#include <exception>

namespace {

constexpr std::uint64_t max_data_bytes = std::uint64_t(64) << 20;

// The one place that hands the bytes to the reader: its in-memory entry point.
kat::data::IdxArray parse(const std::uint8_t *data, std::size_t size) {
  return kat::data::read_idx(data, size, "fuzz input", max_data_bytes);
}

kat_fuzz::Counts counts("fuzz_idx");

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
  if (count != a.data.size() || count > max_data_bytes) {
    finding("accepted %zu data bytes, the extents' product is %llu (limit 64 MiB)", a.data.size(),
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
  return counts.run(data, size, parse, check);
}
