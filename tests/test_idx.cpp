// Tests of the IDX reader/writer and of Dataset construction, including the real
// Fashion-MNIST test split when it is installed.
#include <catch2/catch.hpp>

#include "kat/data/dataset.hpp"
#include "kat/data/idx.hpp"

#include <zlib.h>

#include <sys/stat.h>
#if defined(__linux__)
#include <sys/resource.h>
#include <unistd.h>
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

namespace test_idx {

namespace {

namespace fs = std::filesystem;

/// A fresh directory under the system temp dir, removed when the test ends.
class TempDir {
public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = fs::temp_directory_path() /
            ("kat_test_idx_" + std::to_string(stamp) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  std::string file(const std::string &name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

private:
  fs::path path_;
};

std::vector<std::uint8_t> read_bytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string &path, const std::vector<std::uint8_t> &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void gzip_file(const std::string &from, const std::string &to) {
  const std::vector<std::uint8_t> bytes = read_bytes(from);
  gzFile f = gzopen(to.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

/// 3 images of 2 x 4 with pixel value 10 * i + k (k its row-major position).
std::vector<std::uint8_t> sample_pixels() {
  std::vector<std::uint8_t> pixels(3 * 2 * 4);
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    pixels[i] = static_cast<std::uint8_t>(10 * (i / 8) + i % 8);
  }
  return pixels;
}

/// `bytes` gzip-compressed in memory (one gzip member).
std::vector<std::uint8_t> gzip_bytes(const std::vector<std::uint8_t> &bytes) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) ==
          Z_OK);
  std::vector<std::uint8_t> out(deflateBound(&zs, static_cast<uLong>(bytes.size())) + 64);
  zs.next_in = const_cast<Bytef *>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  const int ret = deflate(&zs, Z_FINISH);
  deflateEnd(&zs);
  REQUIRE(ret == Z_STREAM_END);
  out.resize(zs.total_out);
  return out;
}

/// An IDX header (type 0x08) with extents `dims`, followed by `data`.
std::vector<std::uint8_t> idx_bytes(const std::vector<std::uint32_t> &dims,
                                    const std::vector<std::uint8_t> &data) {
  std::vector<std::uint8_t> out{0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      out.push_back(static_cast<std::uint8_t>(d >> shift));
    }
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KAT_TEST_IDX_NO_RLIMIT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(memory_sanitizer)
#define KAT_TEST_IDX_NO_RLIMIT 1
#endif
#endif

/// While alive, lowers the soft address-space limit (RLIMIT_AS) to the process's current size
/// plus 1 GiB, so an allocation sized by a lying multi-GiB header fails with std::bad_alloc
/// instead of quietly succeeding; restores the old limit on destruction. `active()` is false
/// where that cannot be done (not Linux, sanitizers that reserve huge address ranges).
class AddressSpaceLimit {
public:
  AddressSpaceLimit() {
#if defined(__linux__) && !defined(KAT_TEST_IDX_NO_RLIMIT)
    std::ifstream statm("/proc/self/statm");
    unsigned long long pages = 0;
    if (!(statm >> pages) || getrlimit(RLIMIT_AS, &old_) != 0) {
      return;
    }
    const rlim_t target =
        static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t(1) << 30);
    if (old_.rlim_cur != RLIM_INFINITY && old_.rlim_cur <= target) {
      return; // already as tight
    }
    rlimit lowered = old_;
    lowered.rlim_cur = target;
    active_ = setrlimit(RLIMIT_AS, &lowered) == 0;
#endif
  }
  ~AddressSpaceLimit() {
#if defined(__linux__) && !defined(KAT_TEST_IDX_NO_RLIMIT)
    if (active_) {
      setrlimit(RLIMIT_AS, &old_);
    }
#endif
  }
  AddressSpaceLimit(const AddressSpaceLimit &) = delete;
  AddressSpaceLimit &operator=(const AddressSpaceLimit &) = delete;
  bool active() const { return active_; }

private:
#if defined(__linux__)
  rlimit old_{};
#endif
  bool active_ = false;
};

/// The message of the FormatError `f` throws (fails the test if it throws anything else, e.g.
/// std::bad_alloc from an allocation sized by the header).
template <class F> std::string format_error_of(F &&f) {
  try {
    f();
  } catch (const kat::FormatError &e) {
    return e.what();
  } catch (const std::bad_alloc &) {
    FAIL("std::bad_alloc: an allocation was sized by the header");
  }
  FAIL("no exception");
  return "";
}

} // namespace

using kat::data::IdxArray;
using kat::data::read_idx;
using kat::data::write_idx;

TEST_CASE("idx: write then read raw and gzip", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels = sample_pixels();
  const std::string raw = dir.file("images-idx3-ubyte");
  write_idx(raw, {3, 2, 4}, pixels.data());
  CHECK_FALSE(fs::exists(raw + ".tmp"));

  const std::vector<std::uint8_t> bytes = read_bytes(raw);
  REQUIRE(bytes.size() == 4 + 3 * 4 + pixels.size());
  CHECK(bytes[0] == 0);
  CHECK(bytes[1] == 0);
  CHECK(bytes[2] == 0x08);
  CHECK(bytes[3] == 3);
  CHECK(bytes[7] == 3); // big-endian first dimension

  const IdxArray a = read_idx(raw);
  CHECK(a.dims == std::vector<std::size_t>{3, 2, 4});
  CHECK(a.data == pixels);

  const std::string gz = dir.file("images-idx3-ubyte.gz");
  gzip_file(raw, gz);
  CHECK(read_bytes(gz)[0] == 0x1f); // really compressed
  const IdxArray b = read_idx(gz);
  CHECK(b.dims == a.dims);
  CHECK(b.data == pixels);

  const std::vector<std::uint8_t> labels{0, 1, 2, 1};
  const std::string lab = dir.file("labels-idx1-ubyte");
  write_idx(lab, {4}, labels.data());
  const IdxArray c = read_idx(lab);
  CHECK(c.dims == std::vector<std::size_t>{4});
  CHECK(c.data == labels);

  CHECK_THROWS_AS(write_idx(dir.file("bad"), {}, pixels.data()), kat::ValueError);
  CHECK_THROWS_AS(write_idx(dir.file("bad"), {3, 0}, pixels.data()), kat::ValueError);
  CHECK_THROWS_AS(write_idx(dir.file("no_such_dir/x"), {3}, pixels.data()), kat::IOError);
  CHECK_FALSE(fs::exists(dir.file("bad")));
}

TEST_CASE("idx: truncated files are FormatErrors", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels = sample_pixels();
  const std::string full = dir.file("full");
  write_idx(full, {3, 2, 4}, pixels.data());
  const std::vector<std::uint8_t> bytes = read_bytes(full);

  SECTION("raw, cut in the data") {
    const std::string cut = dir.file("cut");
    write_bytes(cut, std::vector<std::uint8_t>(bytes.begin(), bytes.end() - 5));
    REQUIRE_THROWS_AS(read_idx(cut), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(cut), Catch::Contains("truncated") &&
                                           Catch::Contains("claims 3 x 2 x 4 = 24 data bytes") &&
                                           Catch::Contains("40 bytes with its 16-byte header") &&
                                           Catch::Contains("the file holds 35 bytes") &&
                                           Catch::Contains(cut));
  }
  SECTION("raw, cut in the header") {
    const std::string cut = dir.file("cut");
    write_bytes(cut, std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 9));
    REQUIRE_THROWS_AS(read_idx(cut), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(cut), Catch::Contains("truncated"));
  }
  SECTION("empty file") {
    const std::string cut = dir.file("cut");
    write_bytes(cut, {});
    REQUIRE_THROWS_AS(read_idx(cut), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(cut), Catch::Contains("truncated"));
  }
  SECTION("gzip, cut in the compressed stream") {
    // Incompressible-looking pixels make the compressed data long enough to cut inside.
    std::vector<std::uint8_t> noise(4000);
    std::uint32_t state = 12345;
    for (auto &p : noise) {
      state = state * 1664525u + 1013904223u;
      p = static_cast<std::uint8_t>(state >> 24);
    }
    const std::string big = dir.file("big");
    write_idx(big, {4000}, noise.data());
    const std::string gz = dir.file("big.gz");
    gzip_file(big, gz);
    const std::vector<std::uint8_t> zbytes = read_bytes(gz);
    REQUIRE(zbytes.size() > 1000);
    const std::string cut = dir.file("cut.gz");
    write_bytes(cut, std::vector<std::uint8_t>(zbytes.begin(), zbytes.begin() + 1000));
    REQUIRE_THROWS_AS(read_idx(cut), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(cut), Catch::Contains("truncated") && Catch::Contains(cut));
  }
  SECTION("gzip, cut in the trailer") {
    const std::string gz = dir.file("full.gz");
    gzip_file(full, gz);
    const std::vector<std::uint8_t> zbytes = read_bytes(gz);
    const std::string cut = dir.file("cut.gz");
    write_bytes(cut, std::vector<std::uint8_t>(zbytes.begin(), zbytes.end() - 3));
    REQUIRE_THROWS_AS(read_idx(cut), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(cut), Catch::Contains("truncated"));
  }
}

TEST_CASE("idx: malformed headers and trailing data are FormatErrors", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels = sample_pixels();
  const std::string full = dir.file("full");
  write_idx(full, {3, 2, 4}, pixels.data());
  const std::vector<std::uint8_t> good = read_bytes(full);
  const std::string bad = dir.file("bad");

  SECTION("wrong magic") {
    std::vector<std::uint8_t> bytes = good;
    bytes[1] = 0x01;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("bad magic number") &&
                                           Catch::Contains("0x00010803") && Catch::Contains(bad));
  }
  SECTION("wrong type code") {
    std::vector<std::uint8_t> bytes = good;
    bytes[2] = 0x0D;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("0x0D") && Catch::Contains("float32") &&
                                           Catch::Contains("unsigned byte"));
  }
  SECTION("zero dimensions") {
    std::vector<std::uint8_t> bytes = good;
    bytes[3] = 0;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
  }
  SECTION("more than four dimensions") {
    std::vector<std::uint8_t> bytes = good;
    bytes[3] = 5;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
  }
  SECTION("a zero extent") {
    std::vector<std::uint8_t> bytes = good;
    bytes[8] = bytes[9] = bytes[10] = bytes[11] = 0;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("dimension 1 is 0"));
  }
  SECTION("huge extents are refused before allocating") {
    // 4 x 0xFFFFFFFF^3 would overflow 64 bits.
    const std::vector<std::uint8_t> bytes{0,    0,    8,    4,    0,    0,    0,    4,
                                          0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                          0xFF, 0xFF, 0xFF, 0xFF, 1,    2,    3};
    write_bytes(bad, bytes);
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(bad),
                        Catch::Contains("4 x 4294967295 x 4294967295 x 4294967295") &&
                            Catch::Contains("multiply to more than 2^64"));
  }
  SECTION("the number of dimensions is named") {
    std::vector<std::uint8_t> bytes = good;
    bytes[3] = 0x11;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("0x00000811") && Catch::Contains("got 17"));
  }
  SECTION("other type bytes are named") {
    std::vector<std::uint8_t> bytes = good;
    bytes[2] = 0x0C;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("0x0C") && Catch::Contains("int32"));
    bytes[2] = 0x42;
    write_bytes(bad, bytes);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("0x42") && Catch::Contains("unknown"));
    gzip_file(bad, bad + ".gz");
    REQUIRE_THROWS_WITH(read_idx(bad + ".gz"), Catch::Contains("0x42"));
  }
  SECTION("trailing byte") {
    std::vector<std::uint8_t> bytes = good;
    bytes.push_back(7);
    write_bytes(bad, bytes);
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("trailing data"));
  }
  SECTION("trailing byte in a gzip file") {
    std::vector<std::uint8_t> bytes = good;
    bytes.push_back(7);
    write_bytes(bad, bytes);
    gzip_file(bad, bad + ".gz");
    REQUIRE_THROWS_WITH(read_idx(bad + ".gz"), Catch::Contains("trailing data"));
  }
}

TEST_CASE("idx: missing file is an IOError naming the path", "[data][idx]") {
  TempDir dir;
  const std::string missing = dir.file("does-not-exist-idx1-ubyte");
  REQUIRE_THROWS_AS(read_idx(missing), kat::IOError);
  REQUIRE_THROWS_WITH(read_idx(missing),
                      Catch::Contains(missing) && Catch::Contains("No such file or directory"));
}

TEST_CASE("idx: a directory or FIFO or device is not a regular file", "[data][idx]") {
  TempDir dir;
  REQUIRE_THROWS_AS(read_idx(dir.str()), kat::IOError);
  REQUIRE_THROWS_WITH(read_idx(dir.str()),
                      Catch::Contains("is not a regular file (it is a directory)") &&
                          Catch::Contains(dir.str()));
  // A FIFO without a writer: opening it must neither block nor be reported as missing.
  const std::string fifo = dir.file("fifo-idx1-ubyte");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE_THROWS_AS(read_idx(fifo), kat::IOError);
  REQUIRE_THROWS_WITH(read_idx(fifo), Catch::Contains("is not a regular file (it is a FIFO)") &&
                                          Catch::Contains(fifo));
  if (fs::exists("/dev/null")) {
    REQUIRE_THROWS_WITH(read_idx("/dev/null"),
                        Catch::Contains("not a regular file (it is a character device)"));
  }
}

TEST_CASE("idx: in-memory read_idx parses raw and gzip bytes like the file reader", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels = sample_pixels();
  const std::string raw = dir.file("images");
  write_idx(raw, {3, 2, 4}, pixels.data());
  const std::vector<std::uint8_t> bytes = read_bytes(raw);
  const IdxArray a = read_idx(bytes.data(), bytes.size(), "mem");
  CHECK(a.dims == std::vector<std::size_t>{3, 2, 4});
  CHECK(a.data == pixels);
  const std::vector<std::uint8_t> gz = gzip_bytes(bytes);
  REQUIRE(gz[0] == 0x1f);
  const IdxArray b = read_idx(gz.data(), gz.size(), "mem.gz");
  CHECK(b.dims == a.dims);
  CHECK(b.data == pixels);

  // Errors name the given name and say "the buffer".
  REQUIRE_THROWS_WITH(read_idx(bytes.data(), bytes.size() - 1, "short-buffer"),
                      Catch::Contains("'short-buffer' is truncated") &&
                          Catch::Contains("the buffer holds 39 bytes"));
  REQUIRE_THROWS_WITH(read_idx(nullptr, 0, "empty"),
                      Catch::Contains("'empty' is truncated: expected 4 header bytes, got 0"));
  // A cut gzip stream in memory.
  REQUIRE_THROWS_WITH(read_idx(gz.data(), gz.size() - 9, "cut.gz"),
                      Catch::Contains("'cut.gz' is truncated"));
}

TEST_CASE("idx: a raw header claiming more than the file holds is refused before allocating",
          "[data][idx]") {
  TempDir dir;
  const std::string bad = dir.file("bad");
  SECTION("60000 x 28 x 28 in a 16-byte file") {
    write_bytes(bad, idx_bytes({60000, 28, 28}, {}));
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(bad),
                        Catch::Contains("is truncated") &&
                            Catch::Contains("claims 60000 x 28 x 28 = 47040000 data bytes") &&
                            Catch::Contains("47040016 bytes with its 16-byte header") &&
                            Catch::Contains("the file holds 16 bytes"));
  }
  SECTION("2^40 elements in a 16-byte file") {
    write_bytes(bad, idx_bytes({1u << 20, 1u << 20}, {1, 2, 3, 4}));
    REQUIRE_THROWS_AS(read_idx(bad), kat::FormatError);
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("1048576 x 1048576 = 1099511627776") &&
                                           Catch::Contains("the file holds 16 bytes"));
  }
  SECTION("3 GiB claimed, with the address space limited to 1 GiB more than in use") {
    write_bytes(bad, idx_bytes({3, 1024, 1024, 1024}, {1, 2, 3}));
    const std::vector<std::uint8_t> bytes = read_bytes(bad);
    AddressSpaceLimit limit;
    if (!limit.active()) {
      WARN("RLIMIT_AS cannot be lowered here; checking the message only");
    }
    const std::string file_msg = format_error_of([&] { read_idx(bad); });
    const std::string mem_msg = format_error_of([&] { read_idx(bytes.data(), bytes.size(), "m"); });
    CHECK_THAT(file_msg, Catch::Contains("= 3221225472 data bytes") &&
                             Catch::Contains("the file holds 23 bytes"));
    CHECK_THAT(mem_msg, Catch::Contains("= 3221225472 data bytes") &&
                            Catch::Contains("the buffer holds 23 bytes"));
  }
}

TEST_CASE("idx: a gzip stream holding less than its header claims costs only what it holds",
          "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> payload(100, 7);
  // The header claims 3 GiB; the stream holds 100 data bytes. Compressed, a few dozen bytes.
  const std::vector<std::uint8_t> gz = gzip_bytes(idx_bytes({3, 1024, 1024, 1024}, payload));
  REQUIRE(gz.size() < 200);
  const std::string path = dir.file("liar.gz");
  write_bytes(path, gz);
  AddressSpaceLimit limit;
  if (!limit.active()) {
    WARN("RLIMIT_AS cannot be lowered here; checking the message only");
  }
  const std::string file_msg = format_error_of([&] { read_idx(path); });
  const std::string mem_msg = format_error_of([&] { read_idx(gz.data(), gz.size(), "liar"); });
  for (const std::string &msg : {file_msg, mem_msg}) {
    CHECK_THAT(msg, Catch::Contains("is truncated") &&
                        Catch::Contains("claims 3 x 1024 x 1024 x 1024 = 3221225472 data bytes") &&
                        Catch::Contains("the gzip stream holds 100 after the 20-byte header"));
  }
  CHECK_THAT(file_msg, Catch::Contains(path));
}

TEST_CASE("idx: a stated limit caps what read_idx accepts", "[data][idx]") {
  TempDir dir;
  // 3 MiB of zeros compress to a few KiB: an honest header, decompressed in several chunks.
  const std::size_t n = 3u << 20;
  std::vector<std::uint8_t> data(n);
  for (std::size_t i = 0; i < n; ++i) {
    data[i] = static_cast<std::uint8_t>((i * 7) >> 12);
  }
  const std::vector<std::uint8_t> gz = gzip_bytes(idx_bytes({3, 1024, 1024}, data));
  REQUIRE(gz.size() < n / 10);
  const std::string path = dir.file("big.gz");
  write_bytes(path, gz);

  const IdxArray a = read_idx(path);
  CHECK(a.dims == std::vector<std::size_t>{3, 1024, 1024});
  CHECK(a.data == data);

  REQUIRE_THROWS_AS(read_idx(path, n - 1), kat::FormatError);
  REQUIRE_THROWS_WITH(
      read_idx(path, n - 1),
      Catch::Contains("= 3145728 data bytes, more than the limit of 3145727 bytes"));
  REQUIRE_THROWS_WITH(read_idx(gz.data(), gz.size(), "big", 1000),
                      Catch::Contains("more than the limit of 1000 bytes"));
  CHECK(read_idx(gz.data(), gz.size(), "big", n).data == data);
  CHECK(kat::data::idx_max_data_bytes == (std::uint64_t(1) << 34));
}

TEST_CASE("idx: concatenated gzip members are read and garbage after the stream is refused",
          "[data][idx]") {
  const std::vector<std::uint8_t> bytes = idx_bytes({2, 3}, {1, 2, 3, 4, 5, 6});
  // Two gzip members: the header and first byte, then the rest (what `cat a.gz b.gz` gives).
  std::vector<std::uint8_t> two =
      gzip_bytes(std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 13));
  const std::vector<std::uint8_t> second =
      gzip_bytes(std::vector<std::uint8_t>(bytes.begin() + 13, bytes.end()));
  two.insert(two.end(), second.begin(), second.end());
  const IdxArray a = read_idx(two.data(), two.size(), "two");
  CHECK(a.dims == std::vector<std::size_t>{2, 3});
  CHECK(a.data == std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6});

  std::vector<std::uint8_t> garbage = gzip_bytes(bytes);
  garbage.push_back(0);
  garbage.push_back(0);
  REQUIRE_THROWS_AS(read_idx(garbage.data(), garbage.size(), "garbage"), kat::FormatError);
  REQUIRE_THROWS_WITH(read_idx(garbage.data(), garbage.size(), "garbage"),
                      Catch::Contains("corrupt gzip data"));
}

TEST_CASE("data: load_fashion_mnist on a directory without the files", "[data][idx]") {
  TempDir dir;
  REQUIRE_THROWS_AS(kat::data::load_fashion_mnist(dir.str(), kat::data::Split::train),
                    kat::IOError);
  REQUIRE_THROWS_WITH(kat::data::load_fashion_mnist(dir.str(), kat::data::Split::test),
                      Catch::Contains("dataset-fashion-mnist") &&
                          Catch::Contains("t10k-images-idx3-ubyte.gz") &&
                          Catch::Contains("t10k-labels-idx1-ubyte") &&
                          Catch::Contains("--data-dir") && Catch::Contains(dir.str()));
}

TEST_CASE("data: load_fashion_mnist names a data dir that is a file", "[data][idx]") {
  TempDir dir;
  const std::string file = dir.file("not-a-dir");
  write_bytes(file, {1, 2, 3});
  REQUIRE_THROWS_AS(kat::data::load_fashion_mnist(file, kat::data::Split::train), kat::IOError);
  REQUIRE_THROWS_WITH(kat::data::load_fashion_mnist(file, kat::data::Split::train),
                      Catch::Contains("'" + file + "' is not a directory (it is a regular file)"));
}

TEST_CASE("data: load_fashion_mnist refuses a FIFO or directory as a data file", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels = sample_pixels();
  const std::vector<std::uint8_t> labels{2, 0, 9};
  write_idx(dir.file("t10k-images-idx3-ubyte"), {3, 2, 4}, pixels.data());
  write_idx(dir.file("t10k-labels-idx1-ubyte"), {3}, labels.data());
  REQUIRE(kat::data::load_fashion_mnist(dir.str(), kat::data::Split::test).size() == 3);

  // The .gz name is looked at first: a FIFO there is refused, not skipped or waited on.
  const std::string fifo = dir.file("t10k-labels-idx1-ubyte.gz");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE_THROWS_AS(kat::data::load_fashion_mnist(dir.str(), kat::data::Split::test), kat::IOError);
  REQUIRE_THROWS_WITH(kat::data::load_fashion_mnist(dir.str(), kat::data::Split::test),
                      Catch::Contains("'" + fifo + "' is not a regular file (it is a FIFO)"));
  fs::remove(fifo);

  fs::create_directory(dir.file("t10k-images-idx3-ubyte.gz"));
  REQUIRE_THROWS_WITH(kat::data::load_fashion_mnist(dir.str(), kat::data::Split::test),
                      Catch::Contains("t10k-images-idx3-ubyte.gz' is not a regular file (it "
                                      "is a directory)"));
}

TEST_CASE("data: load_fashion_mnist names swapped labels and images files", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels = sample_pixels();
  const std::vector<std::uint8_t> labels{2, 0, 9};
  const std::string images_path = dir.file("t10k-images-idx3-ubyte");
  const std::string labels_path = dir.file("t10k-labels-idx1-ubyte");
  const auto load = [&] {
    return kat::data::load_fashion_mnist(dir.str(), kat::data::Split::test);
  };

  SECTION("images in the labels file") {
    write_idx(images_path, {3, 2, 4}, pixels.data());
    write_idx(labels_path, {3, 2, 4}, pixels.data());
    REQUIRE_THROWS_AS(load(), kat::FormatError);
    REQUIRE_THROWS_WITH(load(), Catch::Contains("'" + labels_path +
                                                "' is an images file (magic 0x00000803), "
                                                "expected labels (magic 0x00000801)"));
  }
  SECTION("labels in the images file") {
    write_idx(images_path, {3}, labels.data());
    write_idx(labels_path, {3}, labels.data());
    REQUIRE_THROWS_AS(load(), kat::FormatError);
    REQUIRE_THROWS_WITH(load(), Catch::Contains("'" + images_path +
                                                "' is a labels file (magic 0x00000801), "
                                                "expected images (magic 0x00000803)"));
  }
  SECTION("a rank-2 file") {
    write_idx(images_path, {3, 8}, pixels.data());
    write_idx(labels_path, {3}, labels.data());
    REQUIRE_THROWS_WITH(load(), Catch::Contains("has rank 2 (magic 0x00000802), expected "
                                                "images (magic 0x00000803)"));
  }
  SECTION("different sample counts") {
    write_idx(images_path, {3, 2, 4}, pixels.data());
    write_idx(labels_path, {2}, labels.data());
    REQUIRE_THROWS_AS(load(), kat::ShapeError);
    REQUIRE_THROWS_WITH(load(), Catch::Contains("3 images") && Catch::Contains("2 labels") &&
                                    Catch::Contains(images_path) && Catch::Contains(labels_path));
  }
}

TEST_CASE("data: load_fashion_mnist reads raw and gzip IDX files", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels = sample_pixels(); // 3 images of 2 x 4
  const std::vector<std::uint8_t> labels{2, 0, 9};
  write_idx(dir.file("t10k-images-idx3-ubyte"), {3, 2, 4}, pixels.data());
  write_idx(dir.file("t10k-labels-idx1-ubyte"), {3}, labels.data());
  gzip_file(dir.file("t10k-labels-idx1-ubyte"), dir.file("t10k-labels-idx1-ubyte.gz"));
  fs::remove(dir.file("t10k-labels-idx1-ubyte"));

  const kat::data::Dataset d = kat::data::load_fashion_mnist(dir.str(), kat::data::Split::test);
  REQUIRE(d.size() == 3);
  CHECK(d.shape == kat::FeatureShape{1, 2, 4});
  CHECK(d.features() == 8);
  CHECK(d.classes == 10);
  CHECK(d.labels == std::vector<std::int32_t>{2, 0, 9});
  // Pixel (r, c) of sample i sits at feature r + rows * c (FeatureShape order).
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t r = 0; r < 2; ++r) {
      for (std::size_t c = 0; c < 4; ++c) {
        CHECK(d.images[i * 8 + r + 2 * c] == pixels[i * 8 + r * 4 + c]);
      }
    }
  }
  CHECK_THROWS_AS(kat::data::load_fashion_mnist(dir.str(), kat::data::Split::train), kat::IOError);

  const kat::data::Dataset head = d.take(2);
  CHECK(head.size() == 2);
  CHECK(head.images == std::vector<std::uint8_t>(d.images.begin(), d.images.begin() + 16));
  CHECK(head.shape == d.shape);
  CHECK_THROWS_AS(d.take(4), kat::ValueError);
}

TEST_CASE("data: make_dataset validates shapes and labels", "[data][idx]") {
  IdxArray images{{3, 2, 4}, sample_pixels()};
  IdxArray labels{{3}, {0, 1, 2}};
  CHECK(kat::data::make_dataset(images, labels, 3).size() == 3);

  IdxArray short_labels{{2}, {0, 1}};
  REQUIRE_THROWS_AS(kat::data::make_dataset(images, short_labels, 3), kat::ShapeError);
  REQUIRE_THROWS_WITH(kat::data::make_dataset(images, short_labels, 3),
                      Catch::Contains("3 images") && Catch::Contains("2 labels"));

  IdxArray flat_images{{3, 8}, sample_pixels()};
  CHECK_THROWS_AS(kat::data::make_dataset(flat_images, labels, 3), kat::ShapeError);
  IdxArray matrix_labels{{3, 1}, {0, 1, 2}};
  CHECK_THROWS_AS(kat::data::make_dataset(images, matrix_labels, 3), kat::ShapeError);

  IdxArray bad_label{{3}, {0, 5, 1}};
  REQUIRE_THROWS_AS(kat::data::make_dataset(images, bad_label, 5), kat::FormatError);
  REQUIRE_THROWS_WITH(kat::data::make_dataset(images, bad_label, 5),
                      Catch::Contains("label 1 is 5"));
  CHECK_THROWS_AS(kat::data::make_dataset(images, labels, 0), kat::ValueError);
}

TEST_CASE("data: real Fashion-MNIST test split", "[data][idx][real]") {
#ifdef KAT_TEST_DATA_DIR
  const std::string dir = KAT_TEST_DATA_DIR;
#else
  const std::string dir = kat::data::default_fashion_mnist_dir;
#endif
  if (!fs::exists(fs::path(dir) / "t10k-labels-idx1-ubyte.gz") &&
      !fs::exists(fs::path(dir) / "t10k-labels-idx1-ubyte")) {
    WARN("Fashion-MNIST not found in " << dir << "; skipping (install dataset-fashion-mnist)");
    return;
  }
  const kat::data::Dataset d = kat::data::load_fashion_mnist(dir, kat::data::Split::test);
  REQUIRE(d.size() == 10000);
  CHECK(d.shape == kat::FeatureShape{1, 28, 28});
  CHECK(d.images.size() == 10000u * 784u);
  CHECK(d.classes == 10);
  std::array<int, 10> per_class{};
  bool in_range = true;
  for (std::int32_t label : d.labels) {
    if (label < 0 || label >= 10) {
      in_range = false;
    } else {
      ++per_class[static_cast<std::size_t>(label)];
    }
  }
  CHECK(in_range);
  for (int count : per_class) {
    CHECK(count == 1000);
  }
}

} // namespace test_idx
