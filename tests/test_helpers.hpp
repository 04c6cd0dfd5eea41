#pragma once
// Shared helpers for KAT's tests: host/device transfer, random inputs, finite differences.
#include <kat/core/parameter_buffer.hpp>
#include <kat/core/random.hpp>
#include <kat/core/views.hpp>
#include <kat/data/dataset.hpp>

#include <Kokkos_Core.hpp>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kat::test {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// A host copy of any view; always a new allocation, so it is a snapshot even when the view
// already lives in host memory.
template <class View> auto to_host(const View &v) {
  auto h = Kokkos::create_mirror(Kokkos::HostSpace(), v);
  Kokkos::deep_copy(h, v);
  return h;
}

// An n x m device matrix with entries U(lo, hi) from a host generator (independent of KAT's
// counter-based initializers).
template <class Scalar>
Matrix<Scalar, Mem> random_matrix(std::size_t n, std::size_t m, std::uint64_t seed,
                                  double lo = -1.0, double hi = 1.0) {
  Matrix<Scalar, Mem> d("random_matrix", n, m);
  auto h = Kokkos::create_mirror_view(d);
  HostRng rng(seed);
  for (std::size_t j = 0; j < m; ++j)
    for (std::size_t i = 0; i < n; ++i)
      h(i, j) = static_cast<Scalar>(lo + (hi - lo) * (rng.next() >> 11) * 0x1.0p-53);
  Kokkos::deep_copy(d, h);
  return d;
}

// An n x n orthogonal matrix (host, column-major): modified Gram-Schmidt, applied twice, on a
// matrix of U(-1, 1) entries from a host generator.
inline std::vector<double> random_orthogonal(std::size_t n, std::uint64_t seed) {
  HostRng rng(seed);
  std::vector<double> q(n * n);
  for (auto &x : q) {
    x = 2.0 * static_cast<double>(rng.next() >> 11) * 0x1.0p-53 - 1.0;
  }
  for (std::size_t j = 0; j < n; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t p = 0; p < j; ++p) {
        double d = 0;
        for (std::size_t i = 0; i < n; ++i) {
          d += q[p * n + i] * q[j * n + i];
        }
        for (std::size_t i = 0; i < n; ++i) {
          q[j * n + i] -= d * q[p * n + i];
        }
      }
    }
    double norm = 0;
    for (std::size_t i = 0; i < n; ++i) {
      norm += q[j * n + i] * q[j * n + i];
    }
    norm = std::sqrt(norm);
    for (std::size_t i = 0; i < n; ++i) {
      q[j * n + i] /= norm;
    }
  }
  return q;
}

// Binds a layer to a parameter buffer of its own and initializes it from `seed`.
template <class Scalar, class L>
ParameterBuffer<Scalar, Mem> bind_fresh(L &layer, std::uint64_t seed = 0) {
  ParameterBuffer<Scalar, Mem> buffer;
  buffer.reserve("layer", layer.parameter_count());
  buffer.allocate();
  layer.bind(buffer.parameters().data(), buffer.gradients().data());
  layer.reset_parameters(Space(), seed);
  return buffer;
}

// Checks that `values` look like U(-bound, bound) draws: all inside the bounds, mean within
// mean_tol * bound of 0, mean square within relative var_tol of bound^2 / 3.
template <class View>
void check_uniform(const View &values, double bound, double mean_tol, double var_tol) {
  auto h = to_host(values);
  double sum = 0, sq = 0;
  for (std::size_t k = 0; k < h.extent(0); ++k) {
    REQUIRE(std::abs(h(k)) <= bound);
    sum += h(k);
    sq += double(h(k)) * h(k);
  }
  const double n = double(h.extent(0));
  CHECK(std::abs(sum / n) < mean_tol * bound);
  CHECK(sq / n == Approx(bound * bound / 3).epsilon(var_tol));
}

// A device vector of class labels.
inline Vector<std::int32_t, Mem> labels_of(const std::vector<std::int32_t> &v) {
  Vector<std::int32_t, Mem> d("labels", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i)
    h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

// Central-difference gradient of loss() with respect to every element of the contiguous
// device view `theta`, perturbing it through a host mirror.
template <class View>
std::vector<double> numeric_gradient(const View &theta, const std::function<double()> &loss,
                                     double h = 1e-6) {
  using Scalar = typename View::non_const_value_type;
  Kokkos::View<Scalar *, Kokkos::LayoutLeft, typename View::memory_space> flat(theta.data(),
                                                                               theta.span());
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), flat);
  std::vector<double> grad(flat.extent(0));
  for (std::size_t k = 0; k < flat.extent(0); ++k) {
    const Scalar saved = host(k);
    host(k) = saved + h;
    Kokkos::deep_copy(flat, host);
    const double plus = loss();
    host(k) = saved - h;
    Kokkos::deep_copy(flat, host);
    const double minus = loss();
    host(k) = saved;
    Kokkos::deep_copy(flat, host);
    grad[k] = (plus - minus) / (2 * h);
  }
  return grad;
}

// max_k |a_k - b_k| / max(1, |b_k|) over a contiguous view and a reference vector.
template <class View> double max_rel_error(const View &a, const std::vector<double> &b) {
  auto host = to_host(a);
  const auto *p = host.data();
  double err = 0;
  for (std::size_t k = 0; k < b.size(); ++k)
    err = std::max(err, std::abs(static_cast<double>(p[k]) - b[k]) / std::max(1.0, std::abs(b[k])));
  return err;
}

// sum_ij y_ij * r_ij, the scalar whose gradient with respect to y is r.
// max |a - b| / max(1, max |b|) over two views with the same number of elements (a non-finite
// difference counts as 1e30): for comparing two computations of the same values in a
// different summation order, scaled by the values' magnitude.
template <class A, class B> double max_diff_over_scale(const A &a, const B &b) {
  auto ah = to_host(a);
  auto bh = to_host(b);
  REQUIRE(ah.span() == bh.span());
  double err = 0, scale = 1;
  for (std::size_t k = 0; k < bh.span(); ++k) {
    scale = std::max(scale, std::abs(double(bh.data()[k])));
  }
  for (std::size_t k = 0; k < ah.span(); ++k) {
    const double d = std::abs(double(ah.data()[k]) - double(bh.data()[k]));
    err = std::max(err, std::isfinite(d) ? d : 1e30);
  }
  return err / scale;
}

template <class Scalar>
double weighted_sum(const Matrix<Scalar, Mem> &y, const Matrix<Scalar, Mem> &r) {
  auto yh = to_host(y);
  auto rh = to_host(r);
  double s = 0;
  for (std::size_t j = 0; j < y.extent(1); ++j)
    for (std::size_t i = 0; i < y.extent(0); ++i)
      s += double(yh(i, j)) * double(rh(i, j));
  return s;
}

// A device vector with v(i) = f(i).
template <class T, class F> Vector<T, Mem> vector_of(std::size_t n, F f) {
  Vector<T, Mem> v("v", n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < n; ++i)
    h(i) = static_cast<T>(f(i));
  Kokkos::deep_copy(v, h);
  return v;
}

// A device LayoutLeft matrix with m(i, j) = f(i, j).
template <class T, class F> Matrix<T, Mem> matrix_of(std::size_t rows, std::size_t cols, F f) {
  Matrix<T, Mem> m("m", rows, cols);
  auto h = Kokkos::create_mirror_view(m);
  for (std::size_t j = 0; j < cols; ++j)
    for (std::size_t i = 0; i < rows; ++i)
      h(i, j) = static_cast<T>(f(i, j));
  Kokkos::deep_copy(m, h);
  return m;
}

/// Matches an exception whose what() contains `needle` (Catch2 v2 only has exact Message).
class MessageContains : public Catch::MatcherBase<std::exception> {
public:
  explicit MessageContains(std::string needle) : needle_(std::move(needle)) {}
  bool match(const std::exception &e) const override {
    return std::string(e.what()).find(needle_) != std::string::npos;
  }
  std::string describe() const override { return "message contains \"" + needle_ + "\""; }

private:
  std::string needle_;
};

// n deterministic samples of 6 features in 3 classes (label i % 3; the label's feature is
// raised by 120), from a linear congruential stream started at `state`.
inline data::Dataset toy_dataset(std::size_t n, std::uint32_t state) {
  data::Dataset d;
  d.shape = {6, 1, 1};
  d.classes = 3;
  for (std::size_t i = 0; i < n; ++i) {
    const auto label = static_cast<std::int32_t>(i % 3);
    d.labels.push_back(label);
    for (int f = 0; f < 6; ++f) {
      state = state * 1664525u + 1013904223u;
      d.images.push_back(static_cast<std::uint8_t>((state >> 24) / 2 + (f == label ? 120 : 0)));
    }
  }
  return d;
}

} // namespace kat::test
