// The state protocol (kat/core/state.hpp) and checkpoint files (kat/io/checkpoint.hpp):
// exact round trips, the format's bytes against the written specification, every corruption
// tried gives a FormatError, and a writer killed at any moment leaves the newest complete
// checkpoint loadable.
#include "test_helpers.hpp"

#include <kat/data/data_loader.hpp>
#include <kat/io/checkpoint.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/dropout.hpp>
#include <kat/nn/residual.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/optim/adam.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/train/checkpointer.hpp>
#include <kat/train/metrics_writer.hpp>

#include <zlib.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <streambuf>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace test_checkpoint {

using namespace kat;
using namespace kat::test;

namespace {

// A fresh, empty directory under the system's temporary directory, removed with its files.
struct TempDir {
  TempDir() {
    char name[] = "/tmp/kat-checkpoint-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path = name;
  }
  ~TempDir() {
    for (const auto &f : files()) {
      ::unlink((path + "/" + f).c_str());
    }
    ::rmdir(path.c_str());
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR *d = ::opendir(path.c_str())) {
      while (const dirent *e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") {
          out.push_back(n);
        }
      }
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string path;
};

// A state with every dtype, a scalar, a vector, a matrix and an empty vector.
StateDict sample_state() {
  StateDict s;
  s.set("a.steps", std::int64_t(-7));
  s.set("a.lr", 0.125);
  s.set("b.weights", std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 8.0f}, {2, 3});
  s.set("b.labels", std::vector<std::int32_t>{-1, 0, 1});
  s.set("c.bytes", std::vector<std::uint8_t>{0, 255, 7});
  s.set("c.counter", std::uint64_t(0xfedcba9876543210ull));
  s.set("d.empty", std::vector<double>{});
  return s;
}

void require_same(const StateDict &a, const StateDict &b) {
  REQUIRE(a.size() == b.size());
  for (const auto &[name, e] : a.entries()) {
    INFO(name);
    REQUIRE(b.contains(name));
    const StateEntry &f = b.at(name);
    CHECK(e.dtype == f.dtype);
    CHECK(e.shape == f.shape);
    CHECK(e.bytes == f.bytes);
  }
}

template <class T> void put_le(std::vector<unsigned char> &out, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i)));
  }
}

std::uint32_t crc_of(const std::vector<unsigned char> &b, std::size_t from, std::size_t to) {
  return static_cast<std::uint32_t>(::crc32(0, b.data() + from, static_cast<uInt>(to - from)));
}

} // namespace

TEST_CASE("state: entries keep their dtype and shape and values", "[state]") {
  const StateDict s = sample_state();
  CHECK(s.get<std::int64_t>("a.steps") == -7);
  CHECK(s.get<double>("a.lr") == 0.125);
  CHECK(s.get<std::uint64_t>("c.counter") == 0xfedcba9876543210ull);
  CHECK(s.get_vector<float>("b.weights", {2, 3}) ==
        std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 8.0f});
  CHECK(s.get_vector<double>("d.empty", {0}).empty());
  CHECK(s.at("b.weights").bytes.size() == 24);

  const StateDict a = s.sub("a");
  CHECK(a.size() == 2);
  CHECK(a.get<double>("lr") == 0.125);
  StateDict merged;
  merged.merge("x", a);
  CHECK(merged.get<std::int64_t>("x.steps") == -7);

  CHECK_THROWS_MATCHES(s.get<float>("a.lr"), StateError,
                       Catch::Message("state entry 'a.lr' must have dtype float32, got float64"));
  CHECK_THROWS_MATCHES(
      s.get_vector<float>("b.weights", {3, 2}), StateError,
      Catch::Message("state entry 'b.weights' must have shape [3, 2], got [2, 3]"));
  CHECK_THROWS_MATCHES(s.get<double>("a.momentum"), StateError,
                       Catch::Message("state entry 'a.momentum' is missing"));
  StateDict dup = sample_state();
  CHECK_THROWS_WITH(dup.set("a.lr", 1.0), Catch::Contains("'a.lr' is already present"));
  CHECK_THROWS_WITH(dup.set("", 1.0), Catch::Contains("1 to 4096 bytes"));
  CHECK_THROWS_WITH(dup.set("v", std::vector<float>{1, 2, 3}, {2, 2}),
                    Catch::Contains("shape [2, 2] needs 4 values, got 3"));
  CHECK_THROWS_WITH(a.require_names("who", {"steps"}),
                    Catch::Contains("who: unexpected state entry 'lr'"));
  CHECK_THROWS_WITH(a.require_names("who", {"steps", "lr", "exp_avg"}),
                    Catch::Contains("who: state entry 'exp_avg' is missing"));
}

TEST_CASE("state: views round trip through the host in column-major order", "[state]") {
  const auto m = random_matrix<double>(3, 4, 11);
  StateDict s;
  s.set_view("m", m);
  const auto h = to_host(m);
  const auto values = s.get_vector<double>("m", {3, 4});
  for (std::size_t j = 0; j < 4; ++j)
    for (std::size_t i = 0; i < 3; ++i)
      CHECK(values[i + 3 * j] == h(i, j));
  Matrix<double, Mem> back("back", 3, 4);
  s.copy_to("m", back);
  const auto hb = to_host(back);
  for (std::size_t j = 0; j < 4; ++j)
    for (std::size_t i = 0; i < 3; ++i)
      CHECK(hb(i, j) == h(i, j));
  Matrix<double, Mem> wrong("wrong", 4, 3);
  CHECK_THROWS_MATCHES(s.copy_to("m", wrong), StateError,
                       Catch::Message("state entry 'm' must have shape [4, 3], got [3, 4]"));
}

TEST_CASE("checkpoint: the bytes follow the format's specification", "[checkpoint]") {
  // zlib's CRC-32 is the ISO-HDLC one: its check value for "123456789" is 0xCBF43926.
  const char *check = "123456789";
  CHECK(io::detail::crc32_of(reinterpret_cast<const unsigned char *>(check), 9) == 0xCBF43926u);

  StateDict s;
  s.set("lr", 0.5);
  s.set("w", std::vector<float>{1.0f, 2.0f});
  const io::CheckpointMetadata metadata{{"run", "r1"}, {"config.lr", "0.5"}};
  const auto bytes = io::encode_checkpoint(s, metadata);

  // Built by hand from the file comment of kat/io/checkpoint.hpp.
  std::vector<unsigned char> expected{'K', 'A', 'T', 'C', 'K', 'P', 'T', 0};
  const std::string text = "run=r1\nconfig.lr=0.5\n";
  put_le<std::uint32_t>(expected, 2);
  put_le<std::uint32_t>(expected, 0);
  put_le<std::uint64_t>(expected, 2);
  put_le<std::uint64_t>(expected, text.size());
  put_le(expected, crc_of(expected, 0, 32));
  expected.insert(expected.end(), text.begin(), text.end());
  put_le(expected, crc_of(expected, 36, 36 + text.size()));
  // Version 1, still read: no metadata, a 24-byte header.
  std::vector<unsigned char> v1{'K', 'A', 'T', 'C', 'K', 'P', 'T', 0};
  put_le<std::uint32_t>(v1, 1);
  put_le<std::uint32_t>(v1, 0);
  put_le<std::uint64_t>(v1, 2);
  put_le(v1, crc_of(v1, 0, 24));
  auto entry = [&](const std::string &name, std::uint8_t dtype, std::vector<std::uint64_t> shape,
                   const void *data, std::size_t n) {
    const std::size_t start = expected.size();
    put_le<std::uint32_t>(expected, static_cast<std::uint32_t>(name.size()));
    expected.insert(expected.end(), name.begin(), name.end());
    expected.push_back(dtype);
    expected.push_back(static_cast<unsigned char>(shape.size()));
    put_le<std::uint16_t>(expected, 0);
    for (auto e : shape)
      put_le<std::uint64_t>(expected, e);
    put_le<std::uint64_t>(expected, n);
    const auto *p = static_cast<const unsigned char *>(data);
    expected.insert(expected.end(), p, p + n);
    put_le(expected, crc_of(expected, start, expected.size()));
  };
  const double lr = 0.5;
  const float w[2] = {1.0f, 2.0f};
  const char end[8] = {'K', 'A', 'T', 'E', 'N', 'D', 0, 0};
  const auto entries_and_footer = [&] {
    entry("lr", 2, {}, &lr, 8);
    entry("w", 1, {2}, w, 8);
    const std::size_t footer = expected.size();
    expected.insert(expected.end(), end, end + 8);
    put_le<std::uint64_t>(expected, footer + 20);
    put_le(expected, crc_of(expected, footer, expected.size()));
  };
  entries_and_footer();
  CHECK(bytes == expected);
  const io::Checkpoint c = io::parse_checkpoint(expected.data(), expected.size());
  require_same(c.state, s);
  CHECK(c.header.version == 2);
  CHECK(c.header.metadata == metadata);
  CHECK(c.header.find("config.lr") == std::optional<std::string>("0.5"));
  CHECK(!c.header.find("config"));

  expected = v1;
  entries_and_footer();
  const io::Checkpoint old = io::parse_checkpoint(expected.data(), expected.size(), "v1.kat");
  CHECK(old.header.version == 1);
  CHECK(old.header.metadata.empty());
  require_same(old.state, s);
}

TEST_CASE("checkpoint: save and load round trip every dtype exactly", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.path + "/state.kat";
  const StateDict s = sample_state();
  io::save_checkpoint(path, s);
  CHECK(dir.files() == std::vector<std::string>{"state.kat"}); // no temporary file left
  require_same(io::load_checkpoint(path), s);
  // Saving again replaces the file whole.
  StateDict t;
  t.set("only", 1.0);
  io::save_checkpoint(path, t);
  require_same(io::load_checkpoint(path), t);
  CHECK(dir.files() == std::vector<std::string>{"state.kat"});

  CHECK_THROWS_AS(io::save_checkpoint(dir.path + "/missing/state.kat", s), IOError);
  CHECK_THROWS_WITH(io::save_checkpoint(dir.path + "/missing/state.kat", s),
                    Catch::Contains("missing/state.kat.tmp-") &&
                        Catch::Contains("No such file or directory"));
  CHECK_THROWS_AS(io::load_checkpoint(dir.path + "/none.kat"), IOError);
  CHECK_THROWS_WITH(io::load_checkpoint(dir.path + "/none.kat"),
                    Catch::Contains("none.kat") && Catch::Contains("cannot open"));
  CHECK(dir.files() == std::vector<std::string>{"state.kat"});
}

TEST_CASE("checkpoint: every truncation and every flipped byte is a FormatError", "[checkpoint]") {
  const auto good = io::encode_checkpoint(sample_state(), {{"run", "abc"}, {"step", "12"}});
  REQUIRE(good.size() < 1000);
  for (std::size_t n = 0; n < good.size(); ++n) {
    INFO("truncated to " << n << " of " << good.size() << " bytes");
    const std::vector<unsigned char> cut(good.begin(), good.begin() + n);
    CHECK_THROWS_AS(io::decode_checkpoint(cut, "cut.kat"), FormatError);
  }
  // CRC-32 detects every error burst up to 32 bits, and every byte is under one CRC.
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (const unsigned char mask : {0x01, 0x80, 0xff}) {
      INFO("byte " << i << " xor " << int(mask));
      auto bad = good;
      bad[i] ^= mask;
      CHECK_THROWS_AS(io::decode_checkpoint(bad, "flipped.kat"), FormatError);
    }
  }
  auto longer = good;
  longer.push_back(0);
  CHECK_THROWS_WITH(io::decode_checkpoint(longer, "long.kat"),
                    Catch::Contains("footer gives a file size of"));
  CHECK_THROWS_WITH(io::decode_checkpoint({good.begin(), good.begin() + 30}, "short.kat"),
                    Catch::Contains("load_checkpoint(\"short.kat\")") &&
                        Catch::Contains("truncated"));
  auto flipped = good;
  flipped[60] ^= 1;
  CHECK_THROWS_WITH(io::decode_checkpoint(flipped, "f.kat"), Catch::Contains("corrupt"));
}

TEST_CASE("checkpoint: another version or a foreign file or random bytes are refused clearly",
          "[checkpoint]") {
  auto v3 = io::encode_checkpoint(sample_state());
  v3[8] = 3; // version 3, with a header CRC that matches it
  const std::uint32_t crc = crc_of(v3, 0, 32);
  for (int i = 0; i < 4; ++i)
    v3[32 + i] = static_cast<unsigned char>(crc >> (8 * i));
  CHECK_THROWS_AS(io::decode_checkpoint(v3, "v3.kat"), FormatError);
  CHECK_THROWS_WITH(
      io::decode_checkpoint(v3, "v3.kat"),
      Catch::Contains("format version 3 is not supported (this KAT reads versions 1 and 2)"));
  const std::string text = "P5\n28 28\n255\nnot a checkpoint at all";
  CHECK_THROWS_WITH(io::decode_checkpoint({text.begin(), text.end()}, "image.pgm"),
                    Catch::Contains("not a KAT checkpoint"));
  HostRng rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<unsigned char> noise(rng.uniform_index(300));
    for (auto &b : noise)
      b = static_cast<unsigned char>(rng.next());
    if (trial % 2 == 0 && noise.size() >= 8)
      std::memcpy(noise.data(), "KATCKPT", 8); // get past the magic
    CHECK_THROWS_AS(io::decode_checkpoint(noise, "noise.kat"), FormatError);
  }
}

TEST_CASE("checkpoint: a directory keeps the newest K and finds the latest", "[checkpoint]") {
  TempDir dir;
  io::CheckpointDirectory ckpt(dir.path, 2);
  CHECK(!ckpt.latest());
  for (std::int64_t step : {10, 20, 30}) {
    StateDict s;
    s.set("step", step);
    ckpt.save(step, s);
  }
  CHECK(dir.files() ==
        std::vector<std::string>{"checkpoint-000000000020.kat", "checkpoint-000000000030.kat"});
  REQUIRE(ckpt.latest() == std::int64_t(30));
  CHECK(io::load_checkpoint(ckpt.path(30)).get<std::int64_t>("step") == 30);
  // A temporary file a killed writer left is not a checkpoint, and the next save removes it.
  std::ofstream(ckpt.path(40) + ".tmp-99999") << "partial";
  CHECK(ckpt.latest() == std::int64_t(30));
  StateDict s;
  s.set("step", std::int64_t(50));
  ckpt.save(50, s);
  CHECK(dir.files() ==
        std::vector<std::string>{"checkpoint-000000000030.kat", "checkpoint-000000000050.kat"});
  // Ranks keep their own files.
  io::CheckpointDirectory r1(dir.path, 1, 1, 2);
  r1.save(50, s);
  CHECK(r1.latest() == std::int64_t(50));
  CHECK(r1.path(50) == dir.path + "/checkpoint-000000000050.rank1-of-2.kat");
  CHECK(ckpt.steps() == std::vector<std::int64_t>{30, 50});
  CHECK(ckpt.rank_counts() == std::vector<int>{1, 2});
  CHECK_THROWS_WITH(io::CheckpointDirectory(dir.path, 0),
                    Catch::Contains("keep must be >= 1, got 0"));
  CHECK_THROWS_AS(io::CheckpointDirectory(ckpt.path(50), 1), IOError);
}

namespace {

// A stream over bytes in memory that counts the bytes it hands out, to show what a parser read.
class CountingBuf : public std::streambuf {
public:
  explicit CountingBuf(const std::vector<unsigned char> &bytes) : bytes_(bytes) {}
  std::size_t served = 0;

protected:
  int_type underflow() override {
    if (served >= bytes_.size()) {
      return traits_type::eof();
    }
    // One byte at a time: `served` is then exactly what the reader took.
    c_ = static_cast<char>(bytes_[served]);
    setg(&c_, &c_, &c_ + 1);
    return traits_type::to_int_type(c_);
  }
  int_type uflow() override {
    const int_type c = underflow();
    if (c != traits_type::eof()) {
      ++served;
      setg(nullptr, nullptr, nullptr);
    }
    return c;
  }
  std::streamsize xsgetn(char *out, std::streamsize n) override {
    const auto k = static_cast<std::streamsize>(
        std::min<std::size_t>(static_cast<std::size_t>(n), bytes_.size() - served));
    std::memcpy(out, bytes_.data() + served, static_cast<std::size_t>(k));
    served += static_cast<std::size_t>(k);
    return k;
  }

private:
  const std::vector<unsigned char> &bytes_;
  char c_ = 0;
};

// Bytes read by this process so far (Linux's /proc/self/io "rchar"), or -1 if unavailable.
long long bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  long long value = -1;
  while (io >> key >> value) {
    if (key == "rchar:") {
      return value;
    }
  }
  return -1;
}

// Overwrites the little-endian u64 at `at` of `b` and recomputes the header CRC-32 (format 2).
void set_header_u64(std::vector<unsigned char> &b, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i)
    b[at + i] = static_cast<unsigned char>(v >> (8 * i));
  const std::uint32_t crc = crc_of(b, 0, 32);
  for (int i = 0; i < 4; ++i)
    b[32 + i] = static_cast<unsigned char>(crc >> (8 * i));
}

void write_file(const std::string &path, const std::vector<unsigned char> &bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char *>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

} // namespace

TEST_CASE("checkpoint: the magic is checked before anything else is read", "[checkpoint]") {
  // 4 MiB of noise: refused after its first 8 bytes.
  HostRng rng(17);
  std::vector<unsigned char> noise(4 << 20);
  for (auto &b : noise)
    b = static_cast<unsigned char>(rng.next());
  noise[0] = 'X';
  CountingBuf buf(noise);
  std::istream in(&buf);
  CHECK_THROWS_WITH(io::parse_checkpoint(in, noise.size(), "noise.bin"),
                    Catch::Contains("noise.bin") && Catch::Contains("not a KAT checkpoint"));
  CHECK(buf.served == 8);

  // The same from a file: the reader takes one buffer's worth (64 KiB), not the 4 MiB.
  TempDir dir;
  const std::string path = dir.path + "/noise.kat";
  write_file(path, noise);
  const long long before = bytes_read_so_far();
  CHECK_THROWS_WITH(io::load_checkpoint(path), Catch::Contains("not a KAT checkpoint"));
  const long long after = bytes_read_so_far();
  if (before >= 0 && after >= 0) {
    CHECK(after - before < (1 << 20));
  } else {
    WARN("no /proc/self/io: the bytes a file read took are not measured");
  }
}

TEST_CASE("checkpoint: a length field larger than the file is refused before it is allocated",
          "[checkpoint]") {
  const auto good = io::encode_checkpoint(sample_state(), {{"run", "abc"}});
  const std::size_t first_entry = 36 + std::string("run=abc\n").size() + 4;
  SECTION("the metadata length") {
    auto bad = good;
    set_header_u64(bad, 24, std::uint64_t(1) << 40);
    CHECK_THROWS_WITH(io::decode_checkpoint(bad, "m.kat"),
                      Catch::Contains("metadata length must be at most 1048576 bytes, got "
                                      "1099511627776"));
    set_header_u64(bad, 24, 100000);
    CHECK_THROWS_WITH(io::decode_checkpoint(bad, "m.kat"),
                      Catch::Contains("100000 bytes of metadata") &&
                          Catch::Contains("truncated or corrupt"));
  }
  SECTION("the entry count") {
    auto bad = good;
    set_header_u64(bad, 16, std::uint64_t(1) << 60);
    CHECK_THROWS_WITH(io::decode_checkpoint(bad, "n.kat"),
                      Catch::Contains("1152921504606846976 entries") &&
                          Catch::Contains("truncated or corrupt"));
  }
  SECTION("an entry's byte count, in a file of 4 MiB, with its CRC-32 intact") {
    // The first entry ("a.lr", a float64 scalar) claims 2^40 bytes, then 4 MiB of padding
    // follow: the parser stops at the count, and reads none of the padding.
    std::vector<unsigned char> bad(good.begin(), good.begin() + first_entry);
    const std::size_t entry = bad.size();
    put_le<std::uint32_t>(bad, 4);
    bad.insert(bad.end(), {'a', '.', 'l', 'r', 2, 0, 0, 0});
    put_le<std::uint64_t>(bad, std::uint64_t(1) << 40);
    const std::size_t count_ends = bad.size();
    bad.resize(bad.size() + (4 << 20), 0);
    (void)entry;
    CountingBuf buf(bad);
    std::istream in(&buf);
    CHECK_THROWS_WITH(io::parse_checkpoint(in, bad.size(), "big.kat"),
                      Catch::Contains("big.kat") &&
                          Catch::Contains("entry 'a.lr' needs 1099511627776 bytes, only " +
                                          std::to_string(bad.size() - count_ends) + " remain"));
    CHECK(buf.served == count_ends);
    // Extents whose product wraps around 2^64 (2^62 × 8 float32: 0 bytes after wrapping).
    std::vector<unsigned char> wrap(good.begin(), good.begin() + first_entry);
    const std::size_t start = wrap.size();
    put_le<std::uint32_t>(wrap, 1);
    wrap.insert(wrap.end(), {'w', 1, 2, 0, 0});
    put_le<std::uint64_t>(wrap, std::uint64_t(1) << 62);
    put_le<std::uint64_t>(wrap, 8);
    put_le<std::uint64_t>(wrap, 0);
    put_le(wrap, crc_of(wrap, start, wrap.size()));
    wrap.resize(wrap.size() + 200, 0);
    CHECK_THROWS_WITH(io::decode_checkpoint(wrap, "wrap.kat"),
                      Catch::Contains("entry 'w': its shape [4611686018427387904, 8] has more "
                                      "elements than 2^64 bytes hold"));
    // A stream that holds fewer bytes than the size it was given: an error, not a hang.
    std::vector<unsigned char> cut(good.begin(), good.begin() + 40);
    CountingBuf short_buf(cut);
    std::istream short_in(&short_buf);
    CHECK_THROWS_WITH(io::parse_checkpoint(short_in, good.size(), "short.kat"),
                      Catch::Contains("shorter than its size"));
  }
}

TEST_CASE("checkpoint: every truncation of the header and the metadata names what is cut",
          "[checkpoint]") {
  const std::string text = "run=abc\nstep=5\n";
  const auto good = io::encode_checkpoint(sample_state(), {{"run", "abc"}, {"step", "5"}});
  for (std::size_t n = 0; n < 36 + text.size() + 4; ++n) {
    INFO("cut to " << n << " bytes");
    const std::vector<unsigned char> cut(good.begin(), good.begin() + n);
    if (n < 8) {
      CHECK_THROWS_WITH(io::decode_checkpoint(cut, "cut.kat"),
                        Catch::Contains("inside the header") && Catch::Contains("truncated"));
    } else if (n < 36) {
      CHECK_THROWS_WITH(io::decode_checkpoint(cut, "cut.kat"),
                        Catch::Contains("header") && Catch::Contains("truncated"));
    } else {
      // The header is whole and says more follows than the file holds.
      CHECK_THROWS_WITH(io::decode_checkpoint(cut, "cut.kat"),
                        Catch::Contains("only " + std::to_string(n - 36) + " remain"));
    }
    CHECK_THROWS_AS(io::parse_checkpoint_header(cut.data(), cut.size(), "cut.kat"), FormatError);
  }
}

TEST_CASE("checkpoint: the in-memory parser round trips state and metadata", "[checkpoint]") {
  const StateDict s = sample_state();
  const io::CheckpointMetadata m{{"run", "0123abcd"},
                                 {"step", "40"},
                                 {"config.lr", "0.05"},
                                 {"config.metrics", ""},
                                 {"config.path", "a b=c"}};
  const auto bytes = io::encode_checkpoint(s, m);
  const io::Checkpoint c = io::parse_checkpoint(bytes.data(), bytes.size(), "mem");
  require_same(c.state, s);
  CHECK(c.header.metadata == m);
  CHECK(c.header.entries == s.size());
  CHECK(c.header.file_size == bytes.size());
  CHECK(c.header.find("config.path") == std::optional<std::string>("a b=c"));

  std::string text(bytes.begin(), bytes.end());
  std::istringstream in(text + "trailing bytes the parser must not touch");
  const io::Checkpoint d = io::parse_checkpoint(in, bytes.size(), "stream");
  require_same(d.state, s);
  CHECK(d.header.metadata == m);
  CHECK(io::parse_checkpoint_header(bytes.data(), bytes.size()).metadata == m);

  TempDir dir;
  io::save_checkpoint(dir.path + "/x.kat", s, m);
  CHECK(io::read_checkpoint_header(dir.path + "/x.kat").metadata == m);
  require_same(io::read_checkpoint(dir.path + "/x.kat").state, s);

  // What cannot be written is refused by name.
  CHECK_THROWS_WITH(io::encode_checkpoint(s, {{"bad key", "1"}}),
                    Catch::Contains("metadata key 'bad key'"));
  CHECK_THROWS_WITH(io::encode_checkpoint(s, {{"k", "two\nlines"}}),
                    Catch::Contains("metadata 'k' must hold no newline"));
  CHECK_THROWS_WITH(io::encode_checkpoint(s, {{"k", "1"}, {"k", "2"}}),
                    Catch::Contains("metadata 'k' is given twice"));
  CHECK_THROWS_WITH(io::encode_checkpoint(s, {{"k", std::string(2 << 20, 'x')}}),
                    Catch::Contains("at most 1048576"));
  // A repeated key written by someone else, with a CRC-32 that matches: refused on reading.
  auto twice = io::encode_checkpoint(s, {{"a", "1"}, {"b", "2"}});
  twice[36 + 4] = 'a';
  const std::uint32_t crc = crc_of(twice, 36, 36 + 8);
  for (int i = 0; i < 4; ++i)
    twice[44 + i] = static_cast<unsigned char>(crc >> (8 * i));
  CHECK_THROWS_WITH(io::decode_checkpoint(twice, "twice.kat"),
                    Catch::Contains("metadata 'a' is given twice"));
}

TEST_CASE("checkpoint: a directory or a FIFO or a device is not a regular file", "[checkpoint]") {
  TempDir dir;
  CHECK_THROWS_AS(io::load_checkpoint(dir.path), IOError);
  CHECK_THROWS_WITH(io::load_checkpoint(dir.path),
                    Catch::Contains(dir.path) &&
                        Catch::Contains("not a regular file (it is a directory)"));
  const std::string fifo = dir.path + "/fifo.kat";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Opened without waiting for a writer, then refused.
  CHECK_THROWS_WITH(io::load_checkpoint(fifo),
                    Catch::Contains("not a regular file (it is a FIFO)"));
  CHECK_THROWS_WITH(io::read_checkpoint_header("/dev/zero"),
                    Catch::Contains("\"/dev/zero\"") &&
                        Catch::Contains("not a regular file (it is a character device)"));
  ::unlink(fifo.c_str());
  // A zero-length file is a truncated one.
  write_file(dir.path + "/empty.kat", {});
  CHECK_THROWS_WITH(io::load_checkpoint(dir.path + "/empty.kat"),
                    Catch::Contains("empty.kat") && Catch::Contains("truncated"));
}

TEST_CASE("checkpoint: a directory orders and prunes by the step stored in the files and only "
          "its run's",
          "[checkpoint]") {
  TempDir dir;
  io::CheckpointDirectory ckpt(dir.path, 100);
  ckpt.set_run("run-a");
  for (std::int64_t step : {10, 20, 30}) {
    StateDict s;
    s.set("step", step);
    ckpt.save(step, s);
  }
  // Names that lie: the file of step 10 is renamed to a step far beyond the others.
  const std::string liar = dir.path + "/checkpoint-000000099999.kat";
  REQUIRE(::rename(ckpt.path(10).c_str(), liar.c_str()) == 0);
  CHECK(ckpt.steps() == std::vector<std::int64_t>{10, 20, 30});
  CHECK(ckpt.latest() == std::int64_t(30));
  CHECK(ckpt.find(10) == std::optional<std::string>(liar));
  CHECK(io::load_checkpoint(*ckpt.find(30)).get<std::int64_t>("step") == 30);

  // Another run's checkpoint, a newer one, and a format-1 file: neither listed nor deleted.
  io::CheckpointDirectory other(dir.path, 1);
  other.set_run("run-b");
  StateDict s;
  s.set("step", std::int64_t(50));
  other.save(50, s);
  const std::string old = dir.path + "/checkpoint-000000000001.kat";
  {
    auto v1 = io::encode_checkpoint(s);
    v1.erase(v1.begin() + 24, v1.begin() + 40); // drop M, the header CRC and the metadata CRC
    v1[8] = 1;
    const std::uint32_t crc = crc_of(v1, 0, 24);
    v1.insert(v1.begin() + 24,
              {static_cast<unsigned char>(crc), static_cast<unsigned char>(crc >> 8),
               static_cast<unsigned char>(crc >> 16), static_cast<unsigned char>(crc >> 24)});
    // The footer's file size: 12 bytes less.
    const std::size_t footer = v1.size() - 20;
    for (int i = 0; i < 8; ++i)
      v1[footer + 8 + i] = static_cast<unsigned char>((footer + 20) >> (8 * i));
    const std::uint32_t fcrc = crc_of(v1, footer, footer + 16);
    for (int i = 0; i < 4; ++i)
      v1[footer + 16 + i] = static_cast<unsigned char>(fcrc >> (8 * i));
    write_file(old, v1);
    REQUIRE(io::load_checkpoint(old).get<std::int64_t>("step") == 50);
  }
  CHECK(ckpt.latest() == std::int64_t(30));
  CHECK(other.steps() == std::vector<std::int64_t>{50});

  io::CheckpointDirectory keep2(dir.path, 2);
  keep2.set_run("run-a");
  StateDict t;
  t.set("step", std::int64_t(40));
  keep2.save(40, t); // prunes run-a's to steps 30 and 40: the liar (step 10) and step 20 go
  CHECK(dir.files() ==
        std::vector<std::string>{"checkpoint-000000000001.kat", "checkpoint-000000000030.kat",
                                 "checkpoint-000000000040.kat", "checkpoint-000000000050.kat"});
  const auto all = keep2.scan();
  REQUIRE(all.size() == 4);
  CHECK(!all[0].usable()); // the format-1 file
  CHECK_THAT(all[0].error, Catch::Contains("format version 1"));
  CHECK(all[3].run == "run-b");
  CHECK(all[3].step == 50);

  // A Checkpointer refuses to guess between two runs' checkpoints.
  train::ProcessGroup alone;
  train::Checkpointer<float, Mem> checkpointer(dir.path, 0, 3, alone);
  CHECK_THROWS_WITH(checkpointer.latest(),
                    Catch::Contains(dir.path + " holds checkpoints of 2 runs (run-a, run-b)"));
  ::unlink((dir.path + "/checkpoint-000000000050.kat").c_str());
  CHECK(checkpointer.latest() == dir.path + "/checkpoint-000000000040.kat");
  checkpointer.set_run({"run-a", {}});
  REQUIRE(checkpointer.foreign().size() == 1); // the format-1 file
  CHECK(checkpointer.foreign()[0].name == "checkpoint-000000000001.kat");
}

TEST_CASE("checkpoint: a resumed run's metrics writer appends without a second header",
          "[checkpoint]") {
  TempDir dir;
  const std::string csv = dir.path + "/m.csv";
  std::ofstream(csv) << "epoch,wall_seconds,samples_per_second,train_loss,test_loss,"
                        "test_accuracy,lr\n1,1,1,1,1,1,1\n";
  {
    // The writer needs a trainer to be called with, any will do.
    nn::Sequential<float, Mem> model(FeatureShape{2});
    model.add<nn::Dense>(2, 2);
    model.compile(Space(), 1);
    optim::SGD<float, Mem> sgd(model.parameter_count());
    data::Dataset d;
    d.shape = FeatureShape{2};
    d.classes = 2;
    d.images = {1, 2};
    d.labels = {0};
    data::DataLoader<float, Mem> loader(d, 1, false, 0);
    train::Trainer<float, Mem> trainer(model, sgd, loader);
    train::MetricsWriter<float, Mem> w(csv, {}, true);
    train::EpochSummary e;
    e.epoch = 2;
    w.on_epoch_end(trainer, e);
  }
  std::ifstream in(csv);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(all == "epoch,wall_seconds,samples_per_second,train_loss,test_loss,test_accuracy,lr\n"
               "1,1,1,1,1,1,1\n"
               "2,0.000000,0.0,0.000000,0.000000,0.000000,0\n");
  // Another set of columns cannot continue the file.
  CHECK_THROWS_WITH((train::MetricsWriter<float, Mem>(csv, {"kfac_seconds"}, true)),
                    Catch::Contains("cannot append to") && Catch::Contains(",lr,kfac_seconds'"));
}

TEST_CASE("checkpoint: a writer killed at any moment leaves the newest complete checkpoint",
          "[checkpoint]") {
  TempDir dir;
  // Each checkpoint holds 1 Mi floats all equal to its step, so a mixed or partial one shows.
  constexpr std::size_t n = 1 << 20;
  HostRng rng(2026);
  std::int64_t resumed_from = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        io::CheckpointDirectory ckpt(dir.path, 2);
        std::int64_t step = ckpt.latest().value_or(0);
        for (;;) { // until killed
          ++step;
          StateDict s;
          s.set("step", step);
          s.set("values", std::vector<float>(n, static_cast<float>(step)));
          ckpt.save(step, s);
        }
      } catch (...) {
      }
      ::_exit(1); // never back into the test runner
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng.uniform_index(150)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    io::CheckpointDirectory ckpt(dir.path, 2);
    const auto latest = ckpt.latest();
    if (!latest) {
      continue; // killed before its first rename
    }
    INFO("trial " << trial << ", latest step " << *latest);
    CHECK(*latest >= resumed_from);
    const StateDict s = io::load_checkpoint(ckpt.path(*latest));
    CHECK(s.get<std::int64_t>("step") == *latest);
    const auto values = s.get_vector<float>("values", {n});
    CHECK(std::all_of(values.begin(), values.end(),
                      [&](float v) { return v == static_cast<float>(*latest); }));
    resumed_from = *latest;
  }
  CHECK(resumed_from > 0);
}

TEST_CASE("state: optimizers restore their moments and counters exactly", "[state]") {
  const std::size_t n = 37;
  const auto p = random_matrix<float>(n, 1, 1);
  const auto g = random_matrix<float>(n, 1, 2);
  const Vector<float, Mem> params(p.data(), n), grads(g.data(), n);
  const Space space;

  typename optim::SGD<float, Mem>::Options so;
  so.momentum = 0.9;
  optim::SGD<float, Mem> sgd(n, so), sgd2(n, so), plain(n);
  sgd.step(space, params, grads);
  sgd.step(space, params, grads);
  sgd.set_lr(0.003);
  const StateDict ss = sgd.state_dict();
  CHECK(ss.get<std::int64_t>("steps") == 2);
  CHECK(ss.get<double>("lr") == 0.003);
  sgd2.load_state_dict(ss);
  CHECK(sgd2.steps() == 2);
  CHECK(sgd2.lr() == 0.003);
  const auto a = to_host(sgd.momentum_buffer()), b = to_host(sgd2.momentum_buffer());
  for (std::size_t i = 0; i < n; ++i)
    CHECK(a(i) == b(i));
  CHECK_THROWS_MATCHES(plain.load_state_dict(ss), StateError,
                       Catch::Message("kat::optim::SGD::load_state_dict: unexpected state entry "
                                      "'momentum_buffer'"));

  optim::Adam<float, Mem> adam(n), adam2(n), small(n - 1);
  adam.step(space, params, grads);
  StateDict as = adam.state_dict();
  CHECK(as.at("exp_avg").shape == std::vector<std::uint64_t>{n});
  CHECK_THROWS_MATCHES(small.load_state_dict(as), StateError,
                       Catch::Message("state entry 'exp_avg' must have shape [36], got [37]"));
  StateDict missing;
  missing.set("steps", std::int64_t(1));
  missing.set("lr", 0.001);
  missing.merge("x", as.sub("nothing"));
  CHECK_THROWS_WITH(adam2.load_state_dict(missing),
                    Catch::Contains("state entry 'exp_avg' is missing"));
  CHECK(adam2.steps() == 0); // nothing changed
  adam2.load_state_dict(as);
  // The same next step from the same state: identical parameters.
  const auto p1 = random_matrix<float>(n, 1, 1), p2 = random_matrix<float>(n, 1, 1);
  adam.step(space, Vector<float, Mem>(p1.data(), n), grads);
  adam2.step(space, Vector<float, Mem>(p2.data(), n), grads);
  const auto h1 = to_host(p1), h2 = to_host(p2);
  for (std::size_t i = 0; i < n; ++i)
    CHECK(h1(i, 0) == h2(i, 0));
}

TEST_CASE("state: a model restores parameters and layer state or nothing at all", "[state]") {
  const Space space;
  auto build = [&](std::uint64_t seed) {
    nn::Sequential<float, Mem> m(FeatureShape{6});
    m.add<nn::Dense>(6, 5);
    m.add<nn::BatchNorm>(5);
    auto res = std::make_unique<nn::Residual<float, Mem>>(FeatureShape{5});
    res->add<nn::Dense>(5, 5);
    res->add<nn::BatchNorm>(5);
    m.add(std::move(res));
    m.add<nn::Dropout>(0.25, 3);
    m.add<nn::Dense>(5, 2);
    m.compile(space, seed);
    return m;
  };
  auto a = build(1), b = build(2);
  const auto x = random_matrix<float>(8, 6, 3);
  a.forward(space, x);
  a.forward(space, x);
  const StateDict s = a.state_dict();
  CHECK(s.get<std::uint64_t>("layers.1.num_batches_tracked") == 2);
  CHECK(s.get<std::uint64_t>("layers.2.body.1.num_batches_tracked") == 2);
  CHECK(s.get<std::uint64_t>("layers.3.mask_counter") == 2);
  CHECK(s.size() == 1 + 3 + 3 + 1);

  StateDict bad;
  for (const auto &[name, e] : s.entries())
    if (name != "layers.2.body.1.running_var")
      bad.insert(name, e);
  const auto before = to_host(b.parameters());
  CHECK_THROWS_AS(b.load_state_dict(bad), StateError);
  CHECK_THROWS_WITH(b.load_state_dict(bad), Catch::Contains("under 'layers.2'") &&
                                                Catch::Contains("under 'body.1'") &&
                                                Catch::Contains("'running_var' is missing"));
  CHECK(to_host(b.parameters())(0) == before(0)); // nothing changed
  StateDict extra = s;
  extra.set("layers.4.bogus", 1.0);
  CHECK_THROWS_WITH(b.load_state_dict(extra),
                    Catch::Contains("under 'layers.4'") &&
                        Catch::Contains("unexpected state entry 'bogus'"));

  b.load_state_dict(s);
  require_same(b.state_dict(), s);
  // Both continue identically (the Dropout mask and BatchNorm statistics included).
  const auto ya = to_host(a.forward(space, x));
  const auto yb = to_host(b.forward(space, x));
  for (std::size_t j = 0; j < 2; ++j)
    for (std::size_t i = 0; i < 8; ++i)
      CHECK(ya(i, j) == yb(i, j));
}

TEST_CASE("state: a data loader resumes the rest of its epoch", "[state]") {
  data::Dataset d;
  d.shape = FeatureShape{2};
  d.classes = 3;
  for (int i = 0; i < 10; ++i) {
    d.images.push_back(static_cast<std::uint8_t>(i));
    d.images.push_back(static_cast<std::uint8_t>(100 + i));
    d.labels.push_back(i % 3);
  }
  const Space space;
  data::DataLoader<float, Mem> a(d, 3, true, 9), b(d, 3, true, 1);
  a.start_epoch(4);
  Matrix<float, Mem> x;
  Vector<std::int32_t, Mem> y;
  REQUIRE(a.next(space, x, y));
  const StateDict s = a.state_dict();
  CHECK(s.get<std::uint64_t>("position") == 3);
  b.load_state_dict(s);
  CHECK(b.order() == a.order());
  CHECK(b.epoch() == 4);
  Matrix<float, Mem> xb;
  Vector<std::int32_t, Mem> yb;
  while (a.next(space, x, y)) {
    REQUIRE(b.next(space, xb, yb));
    const auto ha = to_host(y), hb = to_host(yb);
    REQUIRE(ha.extent(0) == hb.extent(0));
    for (std::size_t i = 0; i < ha.extent(0); ++i)
      CHECK(ha(i) == hb(i));
  }
  CHECK(!b.next(space, xb, yb));
  StateDict bad = s.sub("nothing");
  bad.set("epoch", std::uint64_t(0));
  bad.set("position", std::uint64_t(11));
  bad.set("order", std::vector<std::uint64_t>(10, 0));
  CHECK_THROWS_WITH(b.load_state_dict(bad),
                    Catch::Contains("position must be <= the order's length 10, got 11"));
  bad = s.sub("nothing");
  bad.set("epoch", std::uint64_t(0));
  bad.set("position", std::uint64_t(0));
  bad.set("order", std::vector<std::uint64_t>{3, 10});
  CHECK_THROWS_WITH(b.load_state_dict(bad), Catch::Contains("order[1] = 10 must be < size() = 10"));
}

} // namespace test_checkpoint
