// Tests of the IDX reader/writer and of Dataset construction, including the real
// Fashion-MNIST test split when it is installed.
#include <catch2/catch.hpp>

#include "kat/data/dataset.hpp"
#include "kat/data/idx.hpp"

#include <zlib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
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
                                           Catch::Contains("expected 24 data bytes, got 19") &&
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
    REQUIRE_THROWS_WITH(read_idx(bad), Catch::Contains("more than"));
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
  REQUIRE_THROWS_WITH(read_idx(missing), Catch::Contains(missing));
  REQUIRE_THROWS_AS(read_idx(dir.str()), kat::IOError);
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
