// The R-operator (Pearlmutter 1994) of the layers and losses, and the exact Hessian- and
// Gauss-Newton-vector products of whole models, against finite differences of exact
// gradients and dense matrices formed independently.
#include "r_operator_check.hpp"
#include "test_helpers.hpp"

#include <kat/core/lanczos.hpp>
#include <kat/core/linalg.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/hessian_vector_product.hpp>
#include <kat/nn/mse_loss.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

namespace test_hessian_vector {

using namespace kat;
using namespace kat::test;
using Catch::Matchers::Contains;

Vector<double, Mem> random_vector(std::size_t n, std::uint64_t seed) {
  const auto m = random_matrix<double>(n, 1, seed);
  Vector<double, Mem> v("v", n);
  Kokkos::deep_copy(v, Kokkos::subview(m, Kokkos::ALL, 0));
  return v;
}

double dot(const std::vector<double> &a, const std::vector<double> &b) {
  double s = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    s += a[k] * b[k];
  return s;
}

// Dense(4,5) Tanh Dense(5,4) ReLU Dense(4,3) in double: 64 parameters.
std::unique_ptr<nn::Sequential<double, Mem>> small_mlp(std::uint64_t seed) {
  auto model = std::make_unique<nn::Sequential<double, Mem>>(FeatureShape{4});
  model->add<nn::Dense>(4, 5);
  model->add<nn::Tanh>();
  model->add<nn::Dense>(5, 4);
  model->add<nn::ReLU>();
  model->add<nn::Dense>(4, 3);
  model->compile(Space(), seed);
  return model;
}

TEST_CASE("r-operator: Dense alone equals finite differences", "[hvp]") {
  nn::Dense<double, Mem> with_bias(6, 4);
  check_layer_r_operator(with_bias, FeatureShape{6}, 5, 11);
  nn::Dense<double, Mem> without_bias(3, 7, false);
  check_layer_r_operator(without_bias, FeatureShape{3}, 4, 12);
}

TEST_CASE("r-operator: Dense with a weight mask masks the product like the gradient", "[hvp]") {
  for (const auto path : {sparse::SparsePath::dense, sparse::SparsePath::sparse}) {
    nn::Dense<double, Mem> layer(5, 4);
    auto buffer = bind_fresh<double>(layer, 3);
    // Every third weight active; the inactive ones 0 in the buffer, as a mask keeps them.
    Kokkos::View<std::uint8_t *, Mem> active("active", 20);
    auto ah = Kokkos::create_mirror_view(active);
    auto th = to_host(buffer.parameters());
    for (int k = 0; k < 20; ++k) {
      ah(k) = k % 3 == 0;
      if (!ah(k))
        th(k) = 0;
    }
    Kokkos::deep_copy(active, ah);
    Kokkos::deep_copy(buffer.parameters(), th);
    layer.set_weight_mask(active, path);
    Vector<double, Mem> v = random_vector(layer.parameter_count(), 4);
    Vector<double, Mem> hv("hv", layer.parameter_count());
    layer.bind_direction(v.data(), hv.data());
    const Space space;
    const auto x = random_matrix<double>(3, 5, 5);
    const auto rx = random_matrix<double>(3, 5, 6);
    const auto dy = random_matrix<double>(3, 4, 7);
    const auto rdy = random_matrix<double>(3, 4, 8);
    Matrix<double, Mem> y("y", 3, 4), ry("ry", 3, 4), dx("dx", 3, 5), rdx("rdx", 3, 5);
    layer.forward(space, x, y);
    layer.forward_r(space, rx, ry);
    layer.backward(space, dy, dx);
    layer.backward_r(space, dy, rdy, rdx);
    // R{dW} = mask ⊙ (rdyᵀ x + dyᵀ rx), computed here on the host.
    const auto xh = to_host(x), rxh = to_host(rx), dyh = to_host(dy), rdyh = to_host(rdy);
    const auto hvh = to_host(hv);
    for (int o = 0; o < 4; ++o)
      for (int i = 0; i < 5; ++i) {
        double ref = 0;
        for (int b = 0; b < 3; ++b)
          ref += rdyh(b, o) * xh(b, i) + dyh(b, o) * rxh(b, i);
        CHECK(hvh(o + 4 * i) == Approx(ah(o + 4 * i) ? ref : 0.0).margin(1e-13));
      }
  }
}

TEST_CASE("r-operator: ReLU and Tanh and Sigmoid alone equal finite differences", "[hvp]") {
  nn::ReLU<double, Mem> relu;
  check_layer_r_operator(relu, FeatureShape{7}, 4, 21);
  nn::Tanh<double, Mem> tanh_layer;
  check_layer_r_operator(tanh_layer, FeatureShape{7}, 4, 22);
  nn::Sigmoid<double, Mem> sigmoid;
  check_layer_r_operator(sigmoid, FeatureShape{7}, 4, 23);
}

TEST_CASE("r-operator: the losses' Hessian products equal finite differences of their "
          "gradients",
          "[hvp]") {
  const Space space;
  const auto z = random_matrix<double>(5, 4, 31, -2, 2);
  const auto rz = random_matrix<double>(5, 4, 32);
  const double h = 1e-6;
  auto shifted = [&](double eps) {
    Matrix<double, Mem> ze("ze", 5, 4);
    auto zh = to_host(z);
    const auto rzh = to_host(rz);
    for (int i = 0; i < 5; ++i)
      for (int c = 0; c < 4; ++c)
        zh(i, c) += eps * rzh(i, c);
    Kokkos::deep_copy(ze, zh);
    return ze;
  };
  // The loss's Hessian product against a central difference of its gradient along rz.
  auto check = [&](const auto &loss, const auto &targets) {
    Matrix<double, Mem> gp("gp", 5, 4), gm("gm", 5, 4), rdz("rdz", 5, 4);
    loss.forward_backward(space, shifted(h), targets, gp);
    loss.forward_backward(space, shifted(-h), targets, gm);
    loss.hessian_product(space, z, rz, rdz);
    const auto p = host_values(gp), m = host_values(gm);
    std::vector<double> fd(p.size());
    for (std::size_t k = 0; k < p.size(); ++k)
      fd[k] = (p[k] - m[k]) / (2 * h);
    CHECK(scaled_error(host_values(rdz), fd) < 1e-8);
  };
  SECTION("softmax cross-entropy") {
    check(nn::SoftmaxCrossEntropy<double, Mem>(), labels_of({0, 3, 1, 1, 2}));
  }
  SECTION("mean squared error") {
    const Matrix<const double, Mem> t = random_matrix<double>(5, 4, 33);
    check(nn::MSELoss<double, Mem>(), t);
  }
}

TEST_CASE("hessian_vector_product: a small MLP's product equals its explicit Hessian", "[hvp]") {
  const Space space;
  auto model = small_mlp(7);
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto x = random_matrix<double>(6, 4, 41, -2, 2);
  const auto labels = labels_of({0, 2, 1, 1, 0, 2});
  const std::size_t n = model->parameter_count();
  REQUIRE(n == 64);
  const auto hessian = explicit_hessian(*model, loss, x, labels);
  Vector<double, Mem> hv("hv", n), hu("hu", n);
  nn::CurvatureVectorProduct<double, Mem, nn::SoftmaxCrossEntropy<double, Mem>> product;
  for (std::uint64_t seed : {1, 2, 3}) {
    const auto v = random_vector(n, 100 + seed);
    const double value = product.apply(space, *model, loss, x, labels, v, hv);
    CHECK(value == Approx(loss.forward(space, model->forward(space, x), labels)).epsilon(1e-14));
    CHECK(scaled_error(host_values(hv), multiply(hessian, host_values(v))) < 1e-7);
  }
  // Exactly symmetric up to rounding: uᵀ H v = vᵀ H u.
  const auto u = random_vector(n, 200), v = random_vector(n, 201);
  nn::hessian_vector_product(space, *model, loss, x, labels, v, hv);
  nn::hessian_vector_product(space, *model, loss, x, labels, u, hu);
  CHECK(dot(host_values(u), host_values(hv)) ==
        Approx(dot(host_values(v), host_values(hu))).epsilon(1e-12));
}

TEST_CASE("hessian_vector_product: MSE through Sigmoid equals the explicit Hessian", "[hvp]") {
  const Space space;
  nn::Sequential<double, Mem> model(FeatureShape{3});
  model.add<nn::Dense>(3, 4);
  model.add<nn::Sigmoid>();
  model.add<nn::Dense>(4, 2, false);
  model.compile(space, 5);
  const nn::MSELoss<double, Mem> loss;
  const auto x = random_matrix<double>(5, 3, 51, -2, 2);
  const Matrix<const double, Mem> t = random_matrix<double>(5, 2, 52);
  const std::size_t n = model.parameter_count();
  const auto hessian = explicit_hessian(model, loss, x, t);
  Vector<double, Mem> hv("hv", n);
  const auto v = random_vector(n, 53);
  nn::hessian_vector_product(space, model, loss, x, t, v, hv);
  CHECK(scaled_error(host_values(hv), multiply(hessian, host_values(v))) < 1e-7);
}

TEST_CASE("gauss_newton_vector_product equals J^T H_L J formed densely", "[hvp]") {
  const Space space;
  auto model = small_mlp(9);
  model->eval();
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const std::size_t batch = 5, classes = 3, n = model->parameter_count();
  const auto x = random_matrix<double>(batch, 4, 61, -2, 2);
  const auto labels = labels_of({2, 0, 1, 2, 1});
  // J (batch·classes x n) by central differences of the outputs.
  const double h = 1e-6;
  std::vector<double> jac(batch * classes * n);
  auto theta = to_host(model->parameters());
  for (std::size_t j = 0; j < n; ++j) {
    const double saved = theta(j);
    theta(j) = saved + h;
    Kokkos::deep_copy(model->parameters(), theta);
    const auto plus = host_values(model->forward(space, x));
    theta(j) = saved - h;
    Kokkos::deep_copy(model->parameters(), theta);
    const auto minus = host_values(model->forward(space, x));
    theta(j) = saved;
    for (std::size_t r = 0; r < batch * classes; ++r)
      jac[r + batch * classes * j] = (plus[r] - minus[r]) / (2 * h);
  }
  Kokkos::deep_copy(model->parameters(), theta);
  // H_L: for each sample, (diag(p) - p pᵀ) / batch, p = softmax of its logits.
  const auto z = to_host(model->forward(space, x));
  const auto v = random_vector(n, 62);
  const auto vh = host_values(v);
  std::vector<double> jv(batch * classes, 0.0);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t r = 0; r < batch * classes; ++r)
      jv[r] += jac[r + batch * classes * j] * vh[j];
  std::vector<double> hjv(batch * classes, 0.0);
  for (std::size_t i = 0; i < batch; ++i) {
    double zmax = z(i, 0), denom = 0;
    for (std::size_t c = 1; c < classes; ++c)
      zmax = std::max(zmax, z(i, c));
    std::vector<double> p(classes);
    for (std::size_t c = 0; c < classes; ++c)
      denom += p[c] = std::exp(z(i, c) - zmax);
    for (auto &pc : p)
      pc /= denom;
    for (std::size_t a = 0; a < classes; ++a)
      for (std::size_t b = 0; b < classes; ++b)
        hjv[i + batch * a] += ((a == b ? p[a] : 0.0) - p[a] * p[b]) / batch * jv[i + batch * b];
  }
  std::vector<double> gv_ref(n, 0.0);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t r = 0; r < batch * classes; ++r)
      gv_ref[j] += jac[r + batch * classes * j] * hjv[r];
  Vector<double, Mem> gv("gv", n);
  model->train();
  nn::gauss_newton_vector_product(space, *model, loss, x, labels, v, gv);
  CHECK(scaled_error(host_values(gv), gv_ref) < 1e-7);
  CHECK(dot(vh, host_values(gv)) >= 0.0); // positive semi-definite
}

TEST_CASE("hessian_vector_product leaves gradients and mode and backward hook alone", "[hvp]") {
  const Space space;
  auto model = small_mlp(13);
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto x = random_matrix<double>(4, 4, 71);
  const auto labels = labels_of({0, 1, 2, 0});
  const auto g = random_vector(model->parameter_count(), 72);
  Kokkos::deep_copy(model->gradients(), g);
  int hook_calls = 0;
  model->set_backward_hook([&](std::size_t) { ++hook_calls; });
  model->train();
  Vector<double, Mem> hv("hv", model->parameter_count());
  const auto v = random_vector(model->parameter_count(), 73);
  nn::hessian_vector_product(space, *model, loss, x, labels, v, hv);
  nn::gauss_newton_vector_product(space, *model, loss, x, labels, v, hv);
  CHECK(model->training());
  CHECK(hook_calls == 0);
  CHECK(host_values(model->gradients()) == host_values(g));
  // And the hook still runs in an ordinary backward.
  const auto &y = model->forward(space, x);
  Matrix<double, Mem> dy("dy", 4, 3);
  loss.forward_backward(space, y, labels, dy);
  model->backward(space, dy);
  CHECK(hook_calls == 5);
}

TEST_CASE("hessian_vector_product refuses a layer without an R-operator and bad lengths", "[hvp]") {
  const Space space;
  nn::Sequential<double, Mem> model(FeatureShape{3});
  model.add<nn::Dense>(3, 3);
  model.add<Opaque>();
  model.add<nn::Dense>(3, 2);
  model.compile(space, 1);
  CHECK_FALSE(model.supports_r_operator());
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto x = random_matrix<double>(2, 3, 81);
  const auto labels = labels_of({0, 1});
  Vector<double, Mem> v("v", model.parameter_count()), hv("hv", model.parameter_count());
  CHECK_THROWS_MATCHES(nn::hessian_vector_product(space, model, loss, x, labels, v, hv), Error,
                       MessageContains("layer Opaque has no R-operator"));
  auto good = small_mlp(1);
  Vector<double, Mem> short_v("v", 10);
  CHECK_THROWS_MATCHES(nn::hessian_vector_product(space, *good, loss, x, labels, short_v, hv),
                       ShapeError, MessageContains("v length"));
}

TEST_CASE("hessian_vector_product in float follows the double product", "[hvp]") {
  const Space space;
  auto model_d = small_mlp(17);
  nn::Sequential<float, Mem> model_f(FeatureShape{4});
  model_f.add<nn::Dense>(4, 5);
  model_f.add<nn::Tanh>();
  model_f.add<nn::Dense>(5, 4);
  model_f.add<nn::ReLU>();
  model_f.add<nn::Dense>(4, 3);
  model_f.compile(space, 17);
  const std::size_t n = model_d->parameter_count();
  const auto theta = host_values(model_d->parameters());
  auto tf = Kokkos::create_mirror_view(model_f.parameters());
  for (std::size_t k = 0; k < n; ++k)
    tf(k) = static_cast<float>(theta[k]);
  Kokkos::deep_copy(model_f.parameters(), tf);
  auto td = Kokkos::create_mirror_view(model_d->parameters());
  for (std::size_t k = 0; k < n; ++k)
    td(k) = tf(k);
  Kokkos::deep_copy(model_d->parameters(), td);
  const auto xd = random_matrix<double>(6, 4, 91);
  Matrix<float, Mem> xf("xf", 6, 4);
  {
    const auto xh = to_host(xd);
    auto xfh = Kokkos::create_mirror_view(xf);
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 4; ++j)
        xfh(i, j) = static_cast<float>(xh(i, j));
    Kokkos::deep_copy(xf, xfh);
    auto xdh = Kokkos::create_mirror_view(xd);
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 4; ++j)
        xdh(i, j) = xfh(i, j);
    Kokkos::deep_copy(xd, xdh);
  }
  const auto labels = labels_of({1, 0, 2, 2, 1, 0});
  const auto vd = random_vector(n, 92);
  Vector<float, Mem> vf("vf", n), hvf("hvf", n);
  Vector<double, Mem> hvd("hvd", n);
  {
    const auto vh = host_values(vd);
    auto vfh = Kokkos::create_mirror_view(vf);
    for (std::size_t k = 0; k < n; ++k)
      vfh(k) = static_cast<float>(vh[k]);
    Kokkos::deep_copy(vf, vfh);
    auto vdh = Kokkos::create_mirror_view(vd);
    for (std::size_t k = 0; k < n; ++k)
      vdh(k) = vfh(k);
    Kokkos::deep_copy(vd, vdh);
  }
  nn::hessian_vector_product(space, *model_d, nn::SoftmaxCrossEntropy<double, Mem>(), xd, labels,
                             vd, hvd);
  nn::hessian_vector_product(space, model_f, nn::SoftmaxCrossEntropy<float, Mem>(), xf, labels, vf,
                             hvf);
  CHECK(scaled_error(host_values(hvf), host_values(hvd)) < 1e-5);
}

TEST_CASE("curvature_operator: Lanczos on a small MLP's Hessian finds its extreme eigenvalues",
          "[hvp]") {
  const Space space;
  auto model = small_mlp(23);
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto x = random_matrix<double>(8, 4, 101, -2, 2);
  const auto labels = labels_of({0, 1, 2, 0, 1, 2, 2, 1});
  const std::size_t n = model->parameter_count();
  // The explicit Hessian's spectrum, from LAPACK.
  const auto hessian = explicit_hessian(*model, loss, x, labels);
  Matrix<double, Mem> a("a", n, n);
  auto ah = Kokkos::create_mirror_view(a);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i)
      ah(i, j) = 0.5 * (hessian[i + n * j] + hessian[j + n * i]);
  Kokkos::deep_copy(a, ah);
  Vector<double, Mem> w("w", n);
  symmetric_eigen(space, a, w);
  const auto wh = to_host(w); // ascending
  // Lanczos with m = n through the exact product recovers the k largest and l smallest.
  const auto op = nn::curvature_operator(*model, loss, x, labels);
  LanczosOptions o;
  o.m = n;
  o.k = 3;
  o.l = 2;
  o.seed = 5;
  const auto r = lanczos<Mem>(space, op, n, o);
  REQUIRE(r.eigenvalues.size() == 5);
  const double scale = std::max(std::abs(wh(0)), std::abs(wh(n - 1)));
  CHECK(std::abs(r.eigenvalues[0] - wh(0)) < 1e-6 * scale);
  CHECK(std::abs(r.eigenvalues[1] - wh(1)) < 1e-6 * scale);
  for (int j = 0; j < 3; ++j)
    CHECK(std::abs(r.eigenvalues[2 + j] - wh(n - 3 + j)) < 1e-6 * scale);
  CHECK(wh(0) < 0); // the Hessian of this network is indefinite: l = 2 sees it
}

} // namespace test_hessian_vector
