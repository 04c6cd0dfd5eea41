#pragma once
// Checks of the R-operator (Pearlmutter 1994) against finite differences, for one layer alone
// and for whole models (explicit Hessians and Gauss-Newton matrices).
#include "test_helpers.hpp"

#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/layer.hpp>
#include <kat/nn/sequential.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kat::test {

// All entries of a contiguous view, as doubles.
template <class View> std::vector<double> host_values(const View &v) {
  auto h = to_host(v);
  return std::vector<double>(h.data(), h.data() + h.span());
}

// max_k |a_k - b_k| / max(1, max_k |b_k|): an error relative to the reference's scale.
inline double scaled_error(const std::vector<double> &a, const std::vector<double> &b) {
  REQUIRE(a.size() == b.size());
  double scale = 1, err = 0;
  for (double x : b)
    scale = std::max(scale, std::abs(x));
  for (std::size_t k = 0; k < a.size(); ++k)
    err = std::max(err, std::abs(a[k] - b[k]));
  return err / scale;
}

// One layer alone, in double. Along ε, move the parameters by ε v, the input by ε rx and the
// output gradient by ε rdy; then R{y} = dy/dε, R{dx} = d(dx)/dε and R{dθ} = d(dθ)/dε, which
// forward_r and backward_r must give (central differences with step h).
template <class LayerT>
void check_layer_r_operator(
    LayerT &layer, FeatureShape in, std::size_t n, std::uint64_t seed,
    const std::function<void()> &before_forward = [] {}, double tol = 1e-7, double h = 1e-5) {
  const Space space;
  const FeatureShape out = layer.output_shape(in);
  auto buffer = bind_fresh<double>(layer, seed);
  const std::size_t np = layer.parameter_count();
  REQUIRE(layer.supports_r_operator());

  const auto x = random_matrix<double>(n, in.size(), seed + 1);
  const auto rx = random_matrix<double>(n, in.size(), seed + 2);
  const auto dy = random_matrix<double>(n, out.size(), seed + 3);
  const auto rdy = random_matrix<double>(n, out.size(), seed + 4);
  const auto v2 = random_matrix<double>(std::max<std::size_t>(np, 1), 1, seed + 5);
  const Vector<double, Mem> v(v2.data(), np);
  Vector<double, Mem> hv("hv", np);
  layer.bind_direction(v.data(), hv.data());

  Matrix<double, Mem> y("y", n, out.size()), ry("ry", n, out.size());
  Matrix<double, Mem> dx("dx", n, in.size()), rdx("rdx", n, in.size());
  layer.accumulate_gradients(false);
  before_forward();
  layer.forward(space, x, y);
  layer.forward_r(space, rx, ry);
  layer.backward(space, dy, dx);
  layer.backward_r(space, dy, rdy, rdx);
  space.fence();
  const auto ry_a = host_values(ry), rdx_a = host_values(rdx), hv_a = host_values(hv);

  // y, dx and dθ at ε.
  const auto theta0 = host_values(buffer.parameters());
  const auto x0 = host_values(x), rx0 = host_values(rx), dy0 = host_values(dy),
             rdy0 = host_values(rdy), v0 = host_values(v);
  auto at = [&](double eps) {
    auto th = Kokkos::create_mirror_view(buffer.parameters());
    for (std::size_t k = 0; k < np; ++k)
      th(k) = theta0[k] + eps * v0[k];
    Kokkos::deep_copy(buffer.parameters(), th);
    Matrix<double, Mem> xe("xe", n, in.size()), dye("dye", n, out.size());
    auto xh = Kokkos::create_mirror_view(xe);
    for (std::size_t k = 0; k < x0.size(); ++k)
      xh.data()[k] = x0[k] + eps * rx0[k];
    Kokkos::deep_copy(xe, xh);
    auto dyh = Kokkos::create_mirror_view(dye);
    for (std::size_t k = 0; k < dy0.size(); ++k)
      dyh.data()[k] = dy0[k] + eps * rdy0[k];
    Kokkos::deep_copy(dye, dyh);
    Matrix<double, Mem> ye("ye", n, out.size()), dxe("dxe", n, in.size());
    before_forward();
    layer.forward(space, xe, ye);
    layer.backward(space, dye, dxe);
    space.fence();
    return std::vector<std::vector<double>>{host_values(ye), host_values(dxe),
                                            host_values(buffer.gradients())};
  };
  const auto plus = at(h), minus = at(-h);
  at(0);
  auto diff = [&](int which) {
    std::vector<double> d(plus[which].size());
    for (std::size_t k = 0; k < d.size(); ++k)
      d[k] = (plus[which][k] - minus[which][k]) / (2 * h);
    return d;
  };
  INFO(layer.name() << ": R{y}");
  CHECK(scaled_error(ry_a, diff(0)) < tol);
  INFO(layer.name() << ": R{dx}");
  CHECK(scaled_error(rdx_a, diff(1)) < tol);
  if (np > 0) {
    INFO(layer.name() << ": R{dtheta}");
    CHECK(scaled_error(hv_a, diff(2)) < tol);
  }
}

// The model's parameter gradient of the mean loss on (x, targets) in evaluation mode, exact
// (backward), as a host vector.
template <class Model, class Loss, class Targets>
std::vector<double> model_gradient(Model &model, const Loss &loss, const Matrix<double, Mem> &x,
                                   const Targets &targets) {
  const Space space;
  const auto &y = model.forward(space, x);
  Matrix<double, Mem> dy("dy", y.extent(0), y.extent(1));
  loss.forward_backward(space, y, targets, dy);
  model.backward(space, dy, Model::Gradients::overwrite);
  space.fence();
  return host_values(model.gradients());
}

// The explicit Hessian of the mean loss (n x n, column-major), column j a central difference
// of exact gradients along e_j; evaluation mode, parameters restored.
template <class Model, class Loss, class Targets>
std::vector<double> explicit_hessian(Model &model, const Loss &loss, const Matrix<double, Mem> &x,
                                     const Targets &targets, double h = 1e-5) {
  const bool was_training = model.training();
  model.eval();
  const std::size_t n = model.parameter_count();
  auto theta = to_host(model.parameters());
  std::vector<double> hessian(n * n);
  for (std::size_t j = 0; j < n; ++j) {
    const double saved = theta(j);
    theta(j) = saved + h;
    Kokkos::deep_copy(model.parameters(), theta);
    const auto plus = model_gradient(model, loss, x, targets);
    theta(j) = saved - h;
    Kokkos::deep_copy(model.parameters(), theta);
    const auto minus = model_gradient(model, loss, x, targets);
    theta(j) = saved;
    for (std::size_t i = 0; i < n; ++i)
      hessian[i + n * j] = (plus[i] - minus[i]) / (2 * h);
  }
  Kokkos::deep_copy(model.parameters(), theta);
  if (was_training)
    model.train();
  return hessian;
}

// A parameter-free identity layer without an R-operator, for the errors that name it.
template <class Scalar, class MemorySpace>
class Opaque final : public nn::Layer<Scalar, MemorySpace> {
public:
  using typename nn::Layer<Scalar, MemorySpace>::execution_space;
  using typename nn::Layer<Scalar, MemorySpace>::matrix_type;
  std::string name() const override { return "Opaque"; }
  FeatureShape output_shape(const FeatureShape &in) const override { return in; }
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    Kokkos::deep_copy(space, y, x);
  }
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    if (dx.extent(0) != 0)
      Kokkos::deep_copy(space, dx, dy);
  }
};

// y = A v for a column-major n x n matrix.
inline std::vector<double> multiply(const std::vector<double> &a, const std::vector<double> &v) {
  const std::size_t n = v.size();
  std::vector<double> y(n, 0.0);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i)
      y[i] += a[i + n * j] * v[j];
  return y;
}

} // namespace kat::test
