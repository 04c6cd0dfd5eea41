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

#include <zlib.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <memory>
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
  const auto bytes = io::encode_checkpoint(s);

  // Built by hand from the file comment of kat/io/checkpoint.hpp.
  std::vector<unsigned char> expected{'K', 'A', 'T', 'C', 'K', 'P', 'T', 0};
  put_le<std::uint32_t>(expected, 1);
  put_le<std::uint32_t>(expected, 0);
  put_le<std::uint64_t>(expected, 2);
  put_le(expected, crc_of(expected, 0, 24));
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
  entry("lr", 2, {}, &lr, 8);
  entry("w", 1, {2}, w, 8);
  const std::size_t footer = expected.size();
  const char end[8] = {'K', 'A', 'T', 'E', 'N', 'D', 0, 0};
  expected.insert(expected.end(), end, end + 8);
  put_le<std::uint64_t>(expected, footer + 20);
  put_le(expected, crc_of(expected, footer, expected.size()));
  CHECK(bytes == expected);
  require_same(io::decode_checkpoint(expected), s);
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
  const auto good = io::encode_checkpoint(sample_state());
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
  auto v2 = io::encode_checkpoint(sample_state());
  v2[8] = 2; // version 2, with a header CRC that matches it
  const std::uint32_t crc = crc_of(v2, 0, 24);
  for (int i = 0; i < 4; ++i)
    v2[24 + i] = static_cast<unsigned char>(crc >> (8 * i));
  CHECK_THROWS_AS(io::decode_checkpoint(v2, "v2.kat"), FormatError);
  CHECK_THROWS_WITH(
      io::decode_checkpoint(v2, "v2.kat"),
      Catch::Contains("format version 2 is not supported (this KAT reads version 1)"));
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
