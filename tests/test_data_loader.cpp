// Tests of DataLoader: batch counts, exact contents against a host computation, seeded
// shuffles, and the short last batch.
#include <catch2/catch.hpp>

#include "kat/data/data_loader.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

namespace test_data_loader {

namespace {

using kat::data::DataLoader;
using kat::data::Dataset;

constexpr std::size_t kFeatures = 6; // 3 x 2 images

/// n samples of (1, 3, 2) with pixel f of sample i equal to 10 * i + f, label i % 3.
Dataset synthetic(std::size_t n = 10) {
  Dataset d;
  d.shape = kat::FeatureShape{1, 3, 2};
  d.classes = 3;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t f = 0; f < kFeatures; ++f) {
      d.images.push_back(static_cast<std::uint8_t>(10 * i + f));
    }
    d.labels.push_back(static_cast<std::int32_t>(i % 3));
  }
  return d;
}

/// One batch copied to the host.
template <class Scalar> struct HostBatch {
  std::vector<std::vector<Scalar>> x; // x[i][f]
  std::vector<std::int32_t> y;
};

/// Every batch of one epoch, copied to the host.
template <class Scalar>
std::vector<HostBatch<Scalar>> run_epoch(DataLoader<Scalar> &loader, std::size_t epoch) {
  using Loader = DataLoader<Scalar>;
  typename Loader::execution_space space;
  typename Loader::matrix_type x;
  typename Loader::label_vector y;
  std::vector<HostBatch<Scalar>> out;
  loader.start_epoch(epoch);
  while (loader.next(space, x, y)) {
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    Kokkos::deep_copy(space, hx, x);
    Kokkos::deep_copy(space, hy, y);
    space.fence();
    REQUIRE(x.extent(0) == y.extent(0));
    REQUIRE(x.extent(1) == loader.features());
    HostBatch<Scalar> b;
    for (std::size_t i = 0; i < x.extent(0); ++i) {
      b.x.emplace_back();
      for (std::size_t f = 0; f < x.extent(1); ++f) {
        b.x.back().push_back(hx(i, f));
      }
      b.y.push_back(hy(i));
    }
    out.push_back(std::move(b));
  }
  return out;
}

/// The sample index each row came from, recovered from its first pixel (10 * i / 255).
template <class Scalar>
std::vector<std::size_t> sample_ids(const std::vector<HostBatch<Scalar>> &epoch) {
  std::vector<std::size_t> ids;
  for (const auto &b : epoch) {
    for (const auto &row : b.x) {
      ids.push_back(static_cast<std::size_t>(row[0] * Scalar(255) / Scalar(10) + Scalar(0.5)));
    }
  }
  return ids;
}

/// Checks every row against the dataset byte / 255 computed on the host, exactly.
template <class Scalar>
void check_rows_match(const Dataset &d, const std::vector<HostBatch<Scalar>> &epoch) {
  for (const auto &b : epoch) {
    for (std::size_t i = 0; i < b.x.size(); ++i) {
      const std::size_t s =
          static_cast<std::size_t>(b.x[i][0] * Scalar(255) / Scalar(10) + Scalar(0.5));
      REQUIRE(s < d.size());
      for (std::size_t f = 0; f < kFeatures; ++f) {
        CHECK(b.x[i][f] == static_cast<Scalar>(d.images[s * kFeatures + f]) / Scalar(255));
      }
      CHECK(b.y[i] == d.labels[s]);
    }
  }
}

} // namespace

TEST_CASE("data: DataLoader batch counts", "[data][loader]") {
  const Dataset d = synthetic(10);
  CHECK(DataLoader<float>(d, 4, false, 0).batches() == 3);
  CHECK(DataLoader<float>(d, 4, false, 0, true).batches() == 2);
  CHECK(DataLoader<float>(d, 5, false, 0).batches() == 2);
  CHECK(DataLoader<float>(d, 5, false, 0, true).batches() == 2);
  CHECK(DataLoader<float>(d, 1, false, 0).batches() == 10);
  CHECK(DataLoader<float>(d, 64, false, 0).batches() == 1);
  CHECK(DataLoader<float>(d, 64, false, 0, true).batches() == 0);

  DataLoader<float> loader(d, 4, true, 7);
  CHECK(loader.size() == 10);
  CHECK(loader.batch_size() == 4);
  CHECK(loader.features() == kFeatures);
  CHECK(loader.shape() == kat::FeatureShape{1, 3, 2});
  CHECK(loader.host_labels() == d.labels);
}

TEST_CASE("data: DataLoader rejects batch_size 0", "[data][loader]") {
  const Dataset d = synthetic(10);
  CHECK_THROWS_AS(DataLoader<float>(d, 0, false, 0), kat::ValueError);
  Dataset broken = d;
  broken.images.pop_back();
  CHECK_THROWS_AS(DataLoader<float>(broken, 2, false, 0), kat::ShapeError);
}

TEMPLATE_TEST_CASE("data: DataLoader without shuffle serves samples in order", "[data][loader]",
                   float, double) {
  const Dataset d = synthetic(10);
  DataLoader<TestType> loader(d, 4, false, 0);
  for (std::size_t epoch : {0u, 1u}) {
    const auto batches = run_epoch(loader, epoch);
    REQUIRE(batches.size() == 3);
    CHECK(batches[0].x.size() == 4);
    CHECK(batches[1].x.size() == 4);
    CHECK(batches[2].x.size() == 2); // the remainder
    std::size_t s = 0;
    for (const auto &b : batches) {
      for (std::size_t i = 0; i < b.x.size(); ++i, ++s) {
        for (std::size_t f = 0; f < kFeatures; ++f) {
          const TestType expected = static_cast<TestType>(10 * s + f) / TestType(255);
          CHECK(b.x[i][f] == expected);
          CHECK(b.x[i][f] >= TestType(0));
          CHECK(b.x[i][f] <= TestType(1));
        }
        CHECK(b.y[i] == static_cast<std::int32_t>(s % 3));
      }
    }
    CHECK(s == 10);
  }
}

TEST_CASE("data: DataLoader next returns false at the end of an epoch", "[data][loader]") {
  const Dataset d = synthetic(10);
  DataLoader<float> loader(d, 4, false, 0, true);
  DataLoader<float>::execution_space space;
  DataLoader<float>::matrix_type x;
  DataLoader<float>::label_vector y;
  // The constructor prepares epoch 0, so next() works without start_epoch.
  REQUIRE(loader.next(space, x, y));
  CHECK(x.extent(0) == 4);
  REQUIRE(loader.next(space, x, y));
  CHECK_FALSE(loader.next(space, x, y)); // drop_last: the 2-sample remainder is skipped
  CHECK_FALSE(loader.next(space, x, y));
  loader.start_epoch(1);
  CHECK(loader.next(space, x, y));

  DataLoader<float> keep(d, 4, false, 0);
  REQUIRE(keep.next(space, x, y));
  const float *buffer = x.data();
  REQUIRE(keep.next(space, x, y));
  REQUIRE(keep.next(space, x, y));
  CHECK(x.extent(0) == 2);
  CHECK(y.extent(0) == 2);
  CHECK(x.data() == buffer); // the short batch reuses the loader's buffer
  CHECK_FALSE(keep.next(space, x, y));
}

TEST_CASE("data: DataLoader shuffles are seeded permutations", "[data][loader]") {
  const Dataset d = synthetic(10);
  DataLoader<float> a(d, 3, true, 42);
  DataLoader<float> b(d, 3, true, 42);
  DataLoader<float> c(d, 3, true, 43);

  const auto a0 = run_epoch(a, 0);
  const auto a1 = run_epoch(a, 1);
  const auto b0 = run_epoch(b, 0);
  const auto b1 = run_epoch(b, 1);
  const auto c0 = run_epoch(c, 0);
  REQUIRE(a0.size() == 4);
  CHECK(a0.back().x.size() == 1);

  const auto ids_a0 = sample_ids(a0);
  const auto ids_a1 = sample_ids(a1);
  CHECK(ids_a0 == sample_ids(b0));
  CHECK(ids_a1 == sample_ids(b1));
  CHECK(ids_a0 != sample_ids(c0));
  CHECK(ids_a0 != ids_a1);

  // Each epoch visits every sample exactly once, with the right pixels and label.
  const std::vector<std::size_t> all{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (const auto *epoch : {&a0, &a1, &c0}) {
    auto ids = sample_ids(*epoch);
    std::sort(ids.begin(), ids.end());
    CHECK(ids == all);
    check_rows_match(d, *epoch);
  }
  CHECK(ids_a1 == std::vector<std::size_t>(a.order().begin(), a.order().end()));

  // The order depends only on (seed, epoch): replaying epoch 0 after epoch 1 reproduces it.
  CHECK(sample_ids(run_epoch(a, 0)) == ids_a0);
}

TEST_CASE("data: DataLoader serves a given order", "[data][loader]") {
  const Dataset d = synthetic(10);
  DataLoader<double> loader(d, 4, true, 5);
  DataLoader<double>::execution_space space;
  DataLoader<double>::matrix_type x;
  DataLoader<double>::label_vector y;

  // A subset in a chosen order, with a repeat: 3 batches of 4, 4 and 1.
  const std::vector<std::size_t> order{7, 2, 9, 0, 2, 5, 8, 1, 3};
  loader.start_epoch(3, order);
  CHECK(loader.epoch() == 3);
  CHECK(loader.epoch_size() == 9);
  CHECK(loader.size() == 10);
  CHECK(loader.batches() == 3);
  CHECK(loader.order() == order);
  std::vector<std::size_t> seen;
  std::vector<std::size_t> sizes;
  while (loader.next(space, x, y)) {
    const auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    const auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    sizes.push_back(x.extent(0));
    for (std::size_t i = 0; i < x.extent(0); ++i) {
      const auto s = static_cast<std::size_t>(hx(i, 0) * 255 / 10 + 0.5);
      seen.push_back(s);
      for (std::size_t f = 0; f < kFeatures; ++f) {
        CHECK(hx(i, f) == static_cast<double>(d.images[s * kFeatures + f]) / 255.0);
      }
      CHECK(hy(i) == d.labels[s]);
    }
  }
  CHECK(seen == order);
  CHECK(sizes == std::vector<std::size_t>{4, 4, 1});

  // Longer than the data set, with a batch larger than the data set: the buffers grow.
  DataLoader<double> big(d, 32, false, 0);
  std::vector<std::size_t> twice(20);
  for (std::size_t k = 0; k < 20; ++k)
    twice[k] = k % 10;
  big.start_epoch(0, twice);
  REQUIRE(big.next(space, x, y));
  CHECK(x.extent(0) == 20);
  const auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  CHECK(hx(15, 0) == 50.0 / 255.0);
  CHECK_FALSE(big.next(space, x, y));

  // Back to the loader's own order.
  loader.start_epoch(4);
  CHECK(loader.epoch_size() == 10);
  CHECK(loader.batches() == 3);

  // Out-of-range indices are rejected and leave the loader as it was.
  loader.start_epoch(0, {1, 2});
  CHECK_THROWS_AS(loader.start_epoch(1, {0, 10}), kat::ValueError);
  CHECK(loader.order() == std::vector<std::size_t>{1, 2});
  CHECK(loader.epoch() == 0);

  // An empty order is an empty epoch.
  loader.start_epoch(2, {});
  CHECK(loader.batches() == 0);
  CHECK_FALSE(loader.next(space, x, y));
}

} // namespace test_data_loader
