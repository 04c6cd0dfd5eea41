// The Dense layer's sparse path (weight masks for sparse training): its forward, input
// gradient and sampled weight gradient against a dense layer holding the masked weights.
#include "layer_check.hpp"
#include "test_helpers.hpp"

#include <kat/core/csr_weight.hpp>
#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/dense.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace test_sparse_dense {

using namespace kat;
using namespace kat::test;
using kat::nn::SparsePath;

namespace {

using MaskView = Kokkos::View<std::uint8_t *, Mem>;

// A column-major out x in mask with the given density. Row 0 is all inactive and row 1 all
// active (when out >= 3), so empty and full CSR rows are always covered.
std::vector<std::uint8_t> random_mask(std::size_t out, std::size_t in, double density,
                                      std::uint64_t seed) {
  std::vector<std::uint8_t> m(out * in);
  HostRng rng(seed);
  for (std::size_t c = 0; c < in; ++c)
    for (std::size_t r = 0; r < out; ++r) {
      const double u = (rng.next() >> 11) * 0x1.0p-53;
      std::uint8_t active = u < density ? 1 : 0;
      if (out >= 3 && r == 0)
        active = 0;
      if (out >= 3 && r == 1)
        active = 1;
      m[r + out * c] = active;
    }
  return m;
}

MaskView mask_view(const std::vector<std::uint8_t> &m) {
  return vector_of<std::uint8_t>(m.size(), [&](std::size_t k) { return m[k]; });
}

// Zeroes the inactive weights of a Dense layer's block (W first, column-major), as the mask
// component does in training.
template <class Scalar>
void zero_inactive(const ParameterBuffer<Scalar, Mem> &buffer, const std::vector<std::uint8_t> &m) {
  auto h = to_host(buffer.parameters());
  for (std::size_t k = 0; k < m.size(); ++k)
    if (!m[k])
      h(k) = 0;
  Kokkos::deep_copy(buffer.parameters(), h);
}

// The same parameters in another layer's buffer.
template <class Scalar>
void copy_parameters(const ParameterBuffer<Scalar, Mem> &from,
                     const ParameterBuffer<Scalar, Mem> &to) {
  Kokkos::deep_copy(to.parameters(), from.parameters());
}

template <class Scalar> double tolerance() {
  return std::is_same<Scalar, float>::value ? 2e-5 : 1e-12;
}

// max |a - b| / max(1, |b|) over two views of the same extents (any rank up to 2).
template <class A, class B> double max_diff(const A &a, const B &b) {
  auto ha = to_host(a);
  auto hb = to_host(b);
  REQUIRE(ha.span() == hb.span());
  double err = 0;
  for (std::size_t k = 0; k < ha.span(); ++k) {
    const double x = ha.data()[k], y = hb.data()[k];
    err = std::max(err, std::abs(x - y) / std::max(1.0, std::abs(y)));
  }
  return err;
}

// The masked reference gradient: g ⊙ mask (+ before, where accumulating).
template <class Scalar, class G>
std::vector<double> masked(const G &g, const std::vector<std::uint8_t> &m,
                           const std::vector<double> &before = {}) {
  auto h = to_host(g);
  std::vector<double> out(m.size());
  for (std::size_t k = 0; k < m.size(); ++k) {
    const double base = before.empty() ? 0.0 : before[k];
    out[k] = base + (m[k] ? double(h.data()[k]) : 0.0);
  }
  return out;
}

template <class View> std::vector<double> host_vector(const View &v) {
  auto h = to_host(v);
  return std::vector<double>(h.data(), h.data() + h.span());
}

// A layer with a mask next to a dense reference layer holding the same, masked, parameters.
template <class Scalar> struct Pair {
  nn::Dense<Scalar, Mem> layer, ref;
  ParameterBuffer<Scalar, Mem> buffer, ref_buffer;
  std::vector<std::uint8_t> mask;

  Pair(std::size_t in, std::size_t out, bool bias, double density, SparsePath path,
       std::uint64_t seed)
      : layer(in, out, bias), ref(in, out, bias), buffer(bind_fresh<Scalar>(layer, seed)),
        ref_buffer(bind_fresh<Scalar>(ref, seed + 1)),
        mask(random_mask(out, in, density, seed + 2)) {
    zero_inactive(buffer, mask);
    copy_parameters(buffer, ref_buffer);
    layer.set_weight_mask(Space(), mask_view(mask), path);
  }
};

} // namespace

TEMPLATE_TEST_CASE("sparse dense: forward and gradients equal the dense layer with masked weights",
                   "[sparse][dense]", float, double) {
  using Scalar = TestType;
  const std::size_t in = 37, out = 13;
  for (const bool bias : {true, false})
    for (const double density : {0.0, 0.01, 0.1, 0.3, 0.7, 1.0})
      for (const SparsePath path : {SparsePath::sparse, SparsePath::dense})
        for (const std::size_t n : {std::size_t(1), std::size_t(17), std::size_t(40)}) {
          INFO("bias " << bias << ", density " << density << ", path "
                       << (path == SparsePath::sparse ? "sparse" : "dense") << ", batch " << n);
          Pair<Scalar> p(in, out, bias, density, path, 100 + n);
          REQUIRE(p.layer.uses_sparse_path() == (path == SparsePath::sparse));
          p.layer.accumulate_gradients(false);
          p.ref.accumulate_gradients(false);
          const auto x = random_matrix<Scalar>(n, in, 7 + n);
          const auto dy = random_matrix<Scalar>(n, out, 8 + n);
          Matrix<Scalar, Mem> y("y", n, out), y_ref("y_ref", n, out);
          Matrix<Scalar, Mem> dx("dx", n, in), dx_ref("dx_ref", n, in);
          // Garbage in the gradient buffer: overwrite mode must replace all of it.
          Kokkos::deep_copy(p.buffer.gradients(), Scalar(3));
          p.layer.forward(Space(), x, y);
          p.ref.forward(Space(), x, y_ref);
          p.layer.backward(Space(), dy, dx);
          p.ref.backward(Space(), dy, dx_ref);
          CHECK(max_diff(y, y_ref) < tolerance<Scalar>());
          CHECK(max_diff(dx, dx_ref) < tolerance<Scalar>());
          const auto want = masked<Scalar>(p.ref.weight_gradient(), p.mask);
          CHECK(max_rel_error(p.layer.weight_gradient(), want) < tolerance<Scalar>());
          if (bias)
            CHECK(max_diff(p.layer.bias_gradient(), p.ref.bias_gradient()) < tolerance<Scalar>());
        }
}

TEST_CASE("sparse dense: the first layer skips dx and a larger layer matches too",
          "[sparse][dense]") {
  // The MLP's first layer shape, batch 128 (the strip-mined spmv's full 16-column strips),
  // dx not requested as for a model's first layer.
  Pair<float> p(784, 256, true, 0.05, SparsePath::sparse, 5);
  const auto x = random_matrix<float>(128, 784, 1);
  const auto dy = random_matrix<float>(128, 256, 2);
  Matrix<float, Mem> y("y", 128, 256), y_ref("y_ref", 128, 256);
  p.layer.forward(Space(), x, y);
  p.ref.forward(Space(), x, y_ref);
  p.layer.backward(Space(), dy, Matrix<float, Mem>());
  p.ref.backward(Space(), dy, Matrix<float, Mem>());
  CHECK(max_diff(y, y_ref) < 1e-5);
  CHECK(max_rel_error(p.layer.weight_gradient(), masked<float>(p.ref.weight_gradient(), p.mask)) <
        1e-5);
  CHECK(max_diff(p.layer.bias_gradient(), p.ref.bias_gradient()) < 1e-5);
}

TEMPLATE_TEST_CASE(
    "sparse dense: accumulate mode adds the masked gradient and keeps inactive entries",
    "[sparse][dense]", float, double) {
  using Scalar = TestType;
  for (const SparsePath path : {SparsePath::sparse, SparsePath::dense}) {
    INFO("path " << (path == SparsePath::sparse ? "sparse" : "dense"));
    Pair<Scalar> p(11, 6, true, 0.4, path, 31);
    p.layer.accumulate_gradients(true);
    p.ref.accumulate_gradients(false);
    // Earlier gradients, nonzero everywhere (inactive entries included).
    const auto before = random_matrix<Scalar>(p.layer.parameter_count(), 1, 9);
    Kokkos::deep_copy(p.buffer.gradients(), Kokkos::subview(before, Kokkos::ALL(), std::size_t(0)));
    const auto before_h = host_vector(p.buffer.gradients());
    const auto x = random_matrix<Scalar>(5, 11, 10);
    const auto dy = random_matrix<Scalar>(5, 6, 11);
    Matrix<Scalar, Mem> y("y", 5, 6), dx("dx", 5, 11);
    p.layer.forward(Space(), x, y);
    p.ref.forward(Space(), x, y);
    p.layer.backward(Space(), dy, dx);
    p.ref.backward(Space(), dy, dx);
    const std::vector<double> w_before(before_h.begin(), before_h.begin() + 66);
    CHECK(max_rel_error(p.layer.weight_gradient(), masked<Scalar>(p.ref.weight_gradient(), p.mask,
                                                                  w_before)) < tolerance<Scalar>());
    auto db = host_vector(p.ref.bias_gradient());
    for (std::size_t j = 0; j < 6; ++j)
      db[j] += before_h[66 + j];
    CHECK(max_rel_error(p.layer.bias_gradient(), db) < tolerance<Scalar>());
    // Inactive entries are bit-for-bit what they were.
    const auto after = host_vector(p.layer.weight_gradient());
    for (std::size_t k = 0; k < 66; ++k)
      if (!p.mask[k])
        REQUIRE(after[k] == before_h[k]);
  }
}

TEST_CASE("sparse dense: request_dense_weight_gradient gives the full gradient for one backward",
          "[sparse][dense]") {
  for (const SparsePath path : {SparsePath::sparse, SparsePath::dense})
    for (const bool accumulate : {false, true}) {
      INFO("path " << (path == SparsePath::sparse ? "sparse" : "dense") << ", accumulate "
                   << accumulate);
      Pair<double> p(9, 7, true, 0.2, path, 41);
      p.layer.accumulate_gradients(accumulate);
      p.ref.accumulate_gradients(false);
      const auto x = random_matrix<double>(6, 9, 12);
      const auto dy = random_matrix<double>(6, 7, 13);
      Matrix<double, Mem> y("y", 6, 7), dx("dx", 6, 9);
      CHECK_FALSE(p.layer.dense_weight_gradient_requested());
      p.layer.request_dense_weight_gradient();
      CHECK(p.layer.dense_weight_gradient_requested());
      p.layer.forward(Space(), x, y);
      p.ref.forward(Space(), x, y);
      p.layer.backward(Space(), dy, dx);
      p.ref.backward(Space(), dy, dx);
      CHECK_FALSE(p.layer.dense_weight_gradient_requested());
      // The full dyᵀx, inactive entries included (those are not zero here).
      CHECK(max_diff(p.layer.weight_gradient(), p.ref.weight_gradient()) < 1e-12);
      // The next backward is masked again (overwrite to compare directly).
      p.layer.accumulate_gradients(false);
      p.layer.backward(Space(), dy, dx);
      CHECK(max_rel_error(p.layer.weight_gradient(),
                          masked<double>(p.ref.weight_gradient(), p.mask)) < 1e-12);
    }
}

TEST_CASE("sparse dense: a new mask rebuilds the structure and clear_weight_mask restores dense",
          "[sparse][dense]") {
  Pair<double> p(20, 8, true, 0.3, SparsePath::sparse, 51);
  p.layer.accumulate_gradients(false);
  p.ref.accumulate_gradients(false);
  const auto x = random_matrix<double>(4, 20, 14);
  const auto dy = random_matrix<double>(4, 8, 15);
  Matrix<double, Mem> y("y", 4, 8), y_ref("y_ref", 4, 8), dx("dx", 4, 20), dx_ref("dx_ref", 4, 20);
  p.layer.forward(Space(), x, y);
  p.layer.backward(Space(), dy, dx);
  CHECK(p.layer.sparse_structure_built());

  // A RigL-style update: another mask, the newly inactive weights zeroed, grown ones at their
  // (here: previous, nonzero) values.
  const auto other = random_mask(8, 20, 0.6, 99);
  REQUIRE(other != p.mask);
  auto fresh = bind_fresh<double>(p.ref, 77); // new values everywhere, then masked
  zero_inactive(fresh, other);
  Kokkos::deep_copy(p.buffer.parameters(), fresh.parameters());
  p.layer.set_weight_mask(Space(), mask_view(other), SparsePath::sparse);
  std::size_t active = 0;
  for (const auto a : other)
    active += a;
  CHECK(p.layer.active_weights() == active);
  CHECK(p.layer.weight_density() == Approx(double(active) / 160));
  p.layer.forward(Space(), x, y);
  p.ref.forward(Space(), x, y_ref);
  p.layer.backward(Space(), dy, dx);
  p.ref.backward(Space(), dy, dx_ref);
  CHECK(max_diff(y, y_ref) < 1e-12);
  CHECK(max_diff(dx, dx_ref) < 1e-12);
  CHECK(max_rel_error(p.layer.weight_gradient(), masked<double>(p.ref.weight_gradient(), other)) <
        1e-12);

  // The mask is a snapshot: changing the caller's view afterwards changes nothing.
  auto view = mask_view(other);
  p.layer.set_weight_mask(Space(), view, SparsePath::sparse);
  Kokkos::deep_copy(view, std::uint8_t(0));
  p.layer.forward(Space(), x, y);
  CHECK(max_diff(y, y_ref) < 1e-12);

  p.layer.clear_weight_mask();
  CHECK_FALSE(p.layer.has_weight_mask());
  CHECK_FALSE(p.layer.uses_sparse_path());
  CHECK(p.layer.weight_density() == 1.0);
  p.layer.forward(Space(), x, y);
  p.layer.backward(Space(), dy, dx);
  CHECK(max_diff(p.layer.weight_gradient(), p.ref.weight_gradient()) < 1e-12);
}

TEST_CASE("sparse dense: the automatic path follows the crossover density", "[sparse][dense]") {
  nn::Dense<float, Mem> layer(50, 40);
  auto buffer = bind_fresh<float>(layer, 3);
  CHECK(layer.sparse_crossover() == kat::sparse::default_sparse_crossover);
  CHECK_FALSE(layer.uses_sparse_path());
  // 20 of 2000 weights active: 1%.
  std::vector<std::uint8_t> m(2000, 0);
  for (std::size_t k = 0; k < 2000; k += 100)
    m[k] = 1;
  layer.set_weight_mask(Space(), mask_view(m));
  CHECK(layer.sparse_path() == SparsePath::automatic);
  CHECK(layer.weight_density() == Approx(0.01));
  CHECK(layer.uses_sparse_path());
  CHECK(layer.sparse_structure_built());
  layer.set_sparse_crossover(0.005);
  CHECK_FALSE(layer.uses_sparse_path());
  layer.set_weight_mask(Space(), mask_view(m), SparsePath::sparse);
  CHECK(layer.uses_sparse_path());

  // Half active: dense by default, sparse above a raised crossover (the structure is built on
  // the next forward), dense again when forced.
  std::vector<std::uint8_t> half(2000);
  for (std::size_t k = 0; k < 2000; ++k)
    half[k] = k % 2;
  layer.set_sparse_crossover(kat::sparse::default_sparse_crossover);
  layer.set_weight_mask(Space(), mask_view(half));
  CHECK_FALSE(layer.uses_sparse_path());
  CHECK_FALSE(layer.sparse_structure_built());
  layer.set_sparse_crossover(0.6);
  CHECK(layer.uses_sparse_path());
  Matrix<float, Mem> x("x", 3, 50), y("y", 3, 40);
  layer.forward(Space(), x, y);
  CHECK(layer.sparse_structure_built());
  layer.set_weight_mask(Space(), mask_view(half), SparsePath::dense);
  CHECK_FALSE(layer.uses_sparse_path());

  // A full mask is never below a crossover of 1.
  layer.set_sparse_crossover(1.0);
  layer.set_weight_mask(Space(), mask_view(std::vector<std::uint8_t>(2000, 1)));
  CHECK(layer.weight_density() == 1.0);
  CHECK_FALSE(layer.uses_sparse_path());
}

TEST_CASE("sparse dense: bad masks and crossovers name the argument and values",
          "[sparse][dense][errors]") {
  nn::Dense<float, Mem> layer(4, 3);
  auto buffer = bind_fresh<float>(layer, 1);
  const MaskView short_mask("mask", 11);
  CHECK_THROWS_AS(layer.set_weight_mask(Space(), short_mask), ShapeError);
  CHECK_THROWS_WITH(layer.set_weight_mask(Space(), short_mask),
                    Catch::Contains("active extent must be 12, got 11"));
  CHECK_THROWS_WITH(layer.set_weight_mask(MaskView("mask", 13)), Catch::Contains("got 13"));
  CHECK_FALSE(layer.has_weight_mask());
  CHECK_THROWS_AS(layer.set_sparse_crossover(-0.1), ValueError);
  CHECK_THROWS_WITH(layer.set_sparse_crossover(1.5), Catch::Contains("[0, 1], got 1.5"));
  CHECK_THROWS_AS(layer.set_sparse_crossover(std::numeric_limits<double>::quiet_NaN()), ValueError);
  CHECK(layer.sparse_crossover() == kat::sparse::default_sparse_crossover);

  kat::sparse::CsrWeight<float, Mem> csr(3, 4);
  Matrix<float, Mem> w("w", 3, 4), x("x", 2, 4), y("y", 2, 3);
  CHECK_THROWS_WITH(csr.multiply(Space(), w, x, 0.f, y), Catch::Contains("call build"));
  csr.build(Space(), MaskView("mask", 12));
  CHECK_THROWS_WITH(csr.multiply(Space(), w, Matrix<float, Mem>("x", 2, 5), 0.f, y),
                    Catch::Contains("x columns must be 4, got 5"));
}

TEST_CASE("sparse dense: records a = x with a ones column and g = dy on the sparse path",
          "[sparse][dense][curvature]") {
  Pair<double> p(5, 4, true, 0.3, SparsePath::sparse, 61);
  p.layer.record_curvature(true);
  p.ref.record_curvature(true);
  const auto x = random_matrix<double>(6, 5, 16);
  const auto dy = random_matrix<double>(6, 4, 17);
  Matrix<double, Mem> y("y", 6, 4), y_ref("y_ref", 6, 4);
  p.layer.forward(Space(), x, y);
  p.ref.forward(Space(), x, y_ref);
  p.layer.backward(Space(), dy, Matrix<double, Mem>());
  p.ref.backward(Space(), dy, Matrix<double, Mem>());
  CHECK(max_diff(y, y_ref) < 1e-12);
  const auto rec = p.layer.curvature();
  const auto ref = p.ref.curvature();
  REQUIRE(rec.a.extent(0) == 6);
  REQUIRE(rec.a.extent(1) == 6);
  CHECK(max_diff(rec.a, ref.a) == 0.0);
  CHECK(max_diff(rec.g, dy) == 0.0);
  CHECK(rec.weight_gradient.data() == p.buffer.gradients().data());
  CHECK(rec.weight.data() == p.buffer.parameters().data());
}

TEST_CASE("sparse dense: padded inputs and outputs are staged", "[sparse][dense]") {
  Pair<double> p(10, 6, true, 0.5, SparsePath::sparse, 71);
  p.layer.accumulate_gradients(false);
  p.ref.accumulate_gradients(false);
  // Views of the first 5 rows of 8-row matrices: LayoutLeft with column stride 8.
  const auto big_x = random_matrix<double>(8, 10, 18);
  const auto big_dy = random_matrix<double>(8, 6, 19);
  Matrix<double, Mem> big_y("big_y", 8, 6), big_dx("big_dx", 8, 10);
  const auto rows = std::make_pair(std::size_t(0), std::size_t(5));
  const Matrix<double, Mem> x = Kokkos::subview(big_x, rows, Kokkos::ALL());
  const Matrix<double, Mem> dy = Kokkos::subview(big_dy, rows, Kokkos::ALL());
  const Matrix<double, Mem> y = Kokkos::subview(big_y, rows, Kokkos::ALL());
  const Matrix<double, Mem> dx = Kokkos::subview(big_dx, rows, Kokkos::ALL());
  REQUIRE(x.stride(1) == 8);
  Matrix<double, Mem> x_c("x", 5, 10), dy_c("dy", 5, 6), y_ref("y_ref", 5, 6),
      dx_ref("dx_ref", 5, 10);
  Kokkos::deep_copy(x_c, x);
  Kokkos::deep_copy(dy_c, dy);
  p.layer.forward(Space(), x, y);
  p.ref.forward(Space(), x_c, y_ref);
  p.layer.backward(Space(), dy, dx);
  p.ref.backward(Space(), dy_c, dx_ref);
  Matrix<double, Mem> y_c("y_c", 5, 6), dx_c("dx_c", 5, 10);
  Kokkos::deep_copy(y_c, y);
  Kokkos::deep_copy(dx_c, dx);
  CHECK(max_diff(y_c, y_ref) < 1e-12);
  CHECK(max_diff(dx_c, dx_ref) < 1e-12);
  CHECK(max_rel_error(p.layer.weight_gradient(), masked<double>(p.ref.weight_gradient(), p.mask)) <
        1e-12);
  // Rows 5..7 of the outputs are untouched.
  auto big_y_h = to_host(big_y);
  for (std::size_t j = 0; j < 6; ++j)
    for (std::size_t i = 5; i < 8; ++i)
      CHECK(big_y_h(i, j) == 0.0);
}

TEST_CASE("sparse dense: finite-difference gradients in double on the sparse path",
          "[sparse][dense][gradcheck]") {
  // Inactive weights do not enter the sparse forward, so their numeric gradient is 0, as is
  // their masked analytic one.
  nn::Dense<double, Mem> layer(6, 5);
  layer.set_weight_mask(Space(), mask_view(random_mask(5, 6, 0.5, 81)), SparsePath::sparse);
  check_layer_gradients(layer, FeatureShape{6}, 4, 82);
  nn::Dense<double, Mem> no_bias(7, 3, false);
  no_bias.set_weight_mask(Space(), mask_view(random_mask(3, 7, 0.5, 83)), SparsePath::sparse);
  check_layer_gradients(no_bias, FeatureShape{7}, 3, 84);
}

} // namespace test_sparse_dense
