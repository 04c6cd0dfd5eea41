// fuzz_checkpoint: KAT's checkpoint reader (kat::io::parse_checkpoint, the in-memory entry
// point that load_checkpoint's file reader shares) on arbitrary bytes. The seeds
// (fuzz/corpus/checkpoint) are tiny checkpoints written by kat::io::save_checkpoint.
//
// Beyond not crashing, an accepted input must be what the format (docs/checkpoints.md, the
// file comment of kat/io/checkpoint.hpp) allows: every entry of a known dtype, rank <= 8,
// and exactly product(shape) x dtype size bytes, the product computed without wrapping; and
// since the format has one encoding of a state, encoding the state again must give the input
// byte for byte (for the current format, version 2; a version-1 input is read but written
// back as version 2).
#include "common.hpp"

#include "kat/io/checkpoint.hpp"

#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

namespace {

// The one place that hands the bytes to the reader.
kat::io::Checkpoint parse(const std::uint8_t *data, std::size_t size) {
  return kat::io::parse_checkpoint(data, size, "fuzz-input");
}

kat_fuzz::Counts counts("fuzz_checkpoint");

void check(const kat::io::Checkpoint &c, const std::uint8_t *data, std::size_t size) {
  using kat_fuzz::finding;
  const kat::StateDict &state = c.state;
  for (const auto &[name, e] : state.entries()) {
    const std::size_t element = kat::dtype_size(e.dtype);
    if (element == 0) {
      finding("entry '%s' accepted with dtype code %d", name.c_str(), int(e.dtype));
    }
    if (e.shape.size() > 8) {
      finding("entry '%s' accepted with rank %zu", name.c_str(), e.shape.size());
    }
    // product(shape) x element size without wrapping (0 when an extent is 0).
    bool zero = false, wraps = false;
    unsigned __int128 bytes = element;
    for (const std::uint64_t extent : e.shape) {
      zero = zero || extent == 0;
      wraps = wraps || __builtin_mul_overflow(bytes, extent, &bytes);
    }
    if (zero) {
      bytes = 0;
    } else if (wraps) {
      finding("entry '%s' accepted with a shape whose product exceeds 2^128", name.c_str());
    }
    if (bytes != e.bytes.size()) {
      finding("entry '%s' accepted with %zu bytes, which its shape (rank %zu) and dtype do not "
              "describe",
              name.c_str(), e.bytes.size(), e.shape.size());
    }
  }
  if (c.header.file_size != size) {
    finding("accepted with a file size of %llu for %zu bytes",
            static_cast<unsigned long long>(c.header.file_size), size);
  }
  if (c.header.version != kat::io::checkpoint_version) {
    return;
  }
  const std::vector<unsigned char> again = kat::io::encode_checkpoint(state, c.header.metadata);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) {
    finding("the accepted state encodes to %zu bytes that differ from the %zu input bytes",
            again.size(), size);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  return counts.run(data, size, parse, check);
}
