// The R-operator (Pearlmutter 1994) of the convolution, pooling, normalization, dropout,
// flatten and residual layers against finite differences, and exact Hessian-vector products
// of small convolutional and residual networks against their explicit Hessians.
#include "r_operator_check.hpp"
#include "test_helpers.hpp"

#include <kat/nn/activation.hpp>
#include <kat/nn/avg_pool2d.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/dropout.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/global_avg_pool2d.hpp>
#include <kat/nn/hessian_vector_product.hpp>
#include <kat/nn/max_pool2d.hpp>
#include <kat/nn/models.hpp>
#include <kat/nn/residual.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace test_hessian_layers {

using namespace kat;
using namespace kat::test;

// A managed copy: a view of the matrix's memory would dangle once the matrix is gone.
Vector<double, Mem> random_vector(std::size_t n, std::uint64_t seed) {
  const auto m = random_matrix<double>(n, 1, seed);
  Vector<double, Mem> v("v", n);
  Kokkos::deep_copy(v, Kokkos::subview(m, Kokkos::ALL(), 0));
  return v;
}

double dot(const std::vector<double> &a, const std::vector<double> &b) {
  double s = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    s += a[k] * b[k];
  return s;
}

template <class V> void set_values(const V &v, const std::vector<double> &values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t k = 0; k < values.size(); ++k)
    h(k) = values[k];
  Kokkos::deep_copy(v, h);
}

// An rx of extent 0 stands for R{x} = 0: forward_r and backward_r (rdx included) must give
// what an explicit zero rx gives, and neither may touch the parameter gradients.
template <class LayerT>
void check_empty_rx(LayerT &layer, FeatureShape in, std::size_t n, std::uint64_t seed) {
  const Space space;
  const FeatureShape out = layer.output_shape(in);
  auto buffer = bind_fresh<double>(layer, seed);
  const std::size_t np = layer.parameter_count();
  REQUIRE(np > 0);
  const auto x = random_matrix<double>(n, in.size(), seed + 1);
  const auto dy = random_matrix<double>(n, out.size(), seed + 2);
  const auto rdy = random_matrix<double>(n, out.size(), seed + 3);
  const auto v = random_vector(np, seed + 4);
  Vector<double, Mem> hv("hv", np);
  layer.bind_direction(v.data(), hv.data());
  layer.accumulate_gradients(false);
  auto run = [&](const Matrix<double, Mem> &rx) {
    Kokkos::deep_copy(hv, 0.0);
    Matrix<double, Mem> y("y", n, out.size()), ry("ry", n, out.size());
    Matrix<double, Mem> dx("dx", n, in.size()), rdx("rdx", n, in.size());
    layer.forward(space, x, y);
    layer.forward_r(space, rx, ry);
    layer.backward(space, dy, dx);
    const auto grads = host_values(buffer.gradients());
    layer.backward_r(space, dy, rdy, rdx);
    CHECK(host_values(buffer.gradients()) == grads);
    return std::vector<std::vector<double>>{host_values(ry), host_values(rdx), host_values(hv)};
  };
  const auto empty = run(Matrix<double, Mem>());
  const auto zero = run(Matrix<double, Mem>("zero_rx", n, in.size()));
  INFO(layer.name());
  CHECK(scaled_error(empty[0], zero[0]) < 1e-14);
  CHECK(scaled_error(empty[1], zero[1]) < 1e-14);
  CHECK(scaled_error(empty[2], zero[2]) < 1e-14);
}

TEST_CASE("r-operator: Conv2d alone equals finite differences", "[hvp]") {
  SECTION("3x3 with bias") {
    nn::Conv2d<double, Mem> layer(2, 3, 3);
    check_layer_r_operator(layer, FeatureShape{2, 5, 6}, 3, 101);
  }
  SECTION("3x3 without bias, padding 1") {
    nn::Conv2d<double, Mem> layer(2, 3, 3, 1, 1, 1, false);
    check_layer_r_operator(layer, FeatureShape{2, 5, 4}, 3, 102);
  }
  SECTION("rectangular kernel with stride and padding and dilation") {
    nn::Conv2d<double, Mem> layer(2, 3, {3, 2}, {2, 1}, {1, 2}, {2, 1});
    check_layer_r_operator(layer, FeatureShape{2, 7, 6}, 2, 103);
  }
  SECTION("1x1 strided projection without bias") {
    nn::Conv2d<double, Mem> layer(3, 2, 1, 2, 0, 1, false);
    check_layer_r_operator(layer, FeatureShape{3, 5, 5}, 3, 104);
  }
  SECTION("chunked one output position at a time") {
    nn::Conv2d<double, Mem> layer(2, 3, 3, 2, 1);
    layer.set_chunk_bytes(1);
    check_layer_r_operator(layer, FeatureShape{2, 6, 5}, 3, 105);
  }
  SECTION("chunks of positions across output columns") {
    // 3 positions per chunk with a 4-row output: chunks straddle output columns.
    nn::Conv2d<double, Mem> layer(2, 2, 3, 1, 1, 1, false);
    layer.set_chunk_bytes(3 * 2 * layer.patch_size() * sizeof(double));
    check_layer_r_operator(layer, FeatureShape{2, 4, 5}, 2, 106);
  }
  SECTION("whole patch matrix while recording curvature") {
    nn::Conv2d<double, Mem> layer(2, 3, 3, 1, 1);
    layer.record_curvature(true);
    check_layer_r_operator(layer, FeatureShape{2, 4, 4}, 3, 107);
  }
}

TEST_CASE("r-operator: pooling layers and Flatten alone equal finite differences", "[hvp]") {
  SECTION("MaxPool2d 2x2") {
    nn::MaxPool2d<double, Mem> layer(2);
    check_layer_r_operator(layer, FeatureShape{2, 4, 6}, 3, 201);
  }
  SECTION("MaxPool2d 3x3 overlapping with padding") {
    nn::MaxPool2d<double, Mem> layer({3, 3}, {2, 2}, {1, 1});
    check_layer_r_operator(layer, FeatureShape{2, 5, 5}, 3, 202);
  }
  SECTION("AvgPool2d 3x3 overlapping with padding") {
    nn::AvgPool2d<double, Mem> layer(3, 2, 1);
    check_layer_r_operator(layer, FeatureShape{2, 5, 6}, 3, 203);
  }
  SECTION("AvgPool2d 2x2") {
    nn::AvgPool2d<double, Mem> layer(2);
    check_layer_r_operator(layer, FeatureShape{3, 4, 4}, 2, 204);
  }
  SECTION("GlobalAvgPool2d") {
    nn::GlobalAvgPool2d<double, Mem> layer;
    check_layer_r_operator(layer, FeatureShape{3, 4, 2}, 3, 205);
  }
  SECTION("Flatten") {
    nn::Flatten<double, Mem> layer;
    check_layer_r_operator(layer, FeatureShape{2, 3, 3}, 3, 206);
  }
}

TEST_CASE("r-operator: MaxPool2d routes R{x} through the argmax of the forward", "[hvp]") {
  // One 2x2 window per channel; the maximum of x is at (1, 0), so R{y} is R{x} there even
  // where R{x} is larger elsewhere, and R{dx} puts R{dy} there only.
  const Space space;
  nn::MaxPool2d<double, Mem> layer(2);
  layer.output_shape(FeatureShape{1, 2, 2});
  const auto x = matrix_of<double>(1, 4, [](int, int j) { return j == 1 ? 5.0 : 1.0; });
  const auto rx = matrix_of<double>(1, 4, [](int, int j) { return 10.0 * (j + 1); });
  Matrix<double, Mem> y("y", 1, 1), ry("ry", 1, 1), rdx("rdx", 1, 4);
  const auto rdy = matrix_of<double>(1, 1, [](int, int) { return 3.0; });
  layer.forward(space, x, y);
  layer.forward_r(space, rx, ry);
  layer.backward_r(space, rdy, rdy, rdx);
  CHECK(host_values(ry) == std::vector<double>{20.0});
  CHECK(host_values(rdx) == std::vector<double>{0.0, 3.0, 0.0, 0.0});
}

TEST_CASE("r-operator: BatchNorm in evaluation mode equals finite differences", "[hvp]") {
  for (bool affine : {true, false}) {
    INFO("affine = " << affine);
    nn::BatchNorm2d<double, Mem> layer(3, 1e-5, 0.1, affine);
    layer.train(false);
    // Running statistics away from (0, 1), and γ, β away from (1, 0) on the first forward
    // only, so the finite differences perturb from there.
    auto set_state = [&layer, first = true]() mutable {
      set_values(layer.running_mean(), {0.2, -0.4, 1.0});
      set_values(layer.running_var(), {0.5, 1.5, 3.0});
      if (first && layer.affine()) {
        set_values(layer.gamma(), {0.7, 1.3, -0.6});
        set_values(layer.beta(), {0.1, -0.2, 0.4});
      }
      first = false;
    };
    check_layer_r_operator(layer, FeatureShape{3, 2, 2}, 3, 301, set_state);
  }
  nn::BatchNorm1d<double, Mem> flat(4, 1e-3);
  flat.train(false);
  auto set_stats = [&flat]() {
    set_values(flat.running_mean(), {0.5, -1.0, 0.0, 2.0});
    set_values(flat.running_var(), {0.25, 2.0, 1.0, 4.0});
  };
  check_layer_r_operator(flat, FeatureShape{4}, 5, 302, set_stats);
}

TEST_CASE("r-operator: BatchNorm after a training forward refuses and names evaluation mode",
          "[hvp]") {
  const Space space;
  nn::BatchNorm2d<double, Mem> layer(2);
  auto buffer = bind_fresh<double>(layer, 1);
  Vector<double, Mem> v("v", 4), hv("hv", 4);
  layer.bind_direction(v.data(), hv.data());
  const auto x = random_matrix<double>(3, 8, 311);
  Matrix<double, Mem> y("y", 3, 8), r("r", 3, 8), dx("dx", 3, 8);
  CHECK_THROWS_MATCHES(layer.forward_r(space, x, r), Error, MessageContains("forward() first"));
  layer.forward(space, x, y); // training mode
  CHECK_THROWS_MATCHES(layer.forward_r(space, x, r), Error,
                       MessageContains("R-operator needs evaluation mode (frozen running "
                                       "statistics)"));
  layer.backward(space, x, dx);
  CHECK_THROWS_MATCHES(layer.backward_r(space, x, x, dx), Error,
                       MessageContains("needs evaluation mode"));
  // The mode of the forward counts, as for backward().
  layer.train(false);
  CHECK_THROWS_AS(layer.forward_r(space, x, r), Error);
  layer.forward(space, x, y);
  CHECK_NOTHROW(layer.forward_r(space, x, r));

  // A model in training mode refuses its own R pass; hessian_vector_product runs it in
  // evaluation mode and puts training mode back.
  nn::Sequential<double, Mem> model(FeatureShape{3});
  model.add<nn::Dense>(3, 4);
  model.add<nn::BatchNorm1d>(4);
  model.add<nn::Dense>(4, 2);
  model.compile(space, 2);
  model.train();
  const auto xm = random_matrix<double>(4, 3, 312);
  model.forward(space, xm);
  CHECK_THROWS_MATCHES(model.forward_r(space), Error, MessageContains("needs evaluation mode"));
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto labels = labels_of({0, 1, 1, 0});
  Vector<double, Mem> mv = random_vector(model.parameter_count(), 313);
  Vector<double, Mem> mhv("mhv", model.parameter_count());
  CHECK_NOTHROW(nn::hessian_vector_product(space, model, loss, xm, labels, mv, mhv));
  CHECK(model.training());
}

TEST_CASE("r-operator: Dropout with the forward's mask and in evaluation mode", "[hvp]") {
  SECTION("training: the mask of the last forward") {
    nn::Dropout<double, Mem> layer(0.4, 7);
    check_layer_r_operator(layer, FeatureShape{3, 2, 2}, 4, 401,
                           [&layer] { layer.set_mask_counter(3); });
    // And it is that mask: R{y} = 0 exactly where y = 0 for x with no zeros.
    const Space space;
    const auto x = random_matrix<double>(4, 6, 402, 1, 2);
    const auto rx = random_matrix<double>(4, 6, 403, 1, 2);
    Matrix<double, Mem> y("y", 4, 6), ry("ry", 4, 6), rdx("rdx", 4, 6);
    layer.forward(space, x, y);
    layer.forward_r(space, rx, ry);
    layer.backward_r(space, rx, rx, rdx);
    const auto yh = host_values(y), xh = host_values(x), rxh = host_values(rx),
               ryh = host_values(ry), rdxh = host_values(rdx);
    int dropped = 0;
    for (std::size_t k = 0; k < yh.size(); ++k) {
      const double s = yh[k] / xh[k];
      dropped += s == 0.0;
      CHECK(ryh[k] == Approx(s * rxh[k]).epsilon(1e-15));
      CHECK(rdxh[k] == Approx(s * rxh[k]).epsilon(1e-15));
    }
    CHECK(dropped > 0);
    CHECK(dropped < 24);
  }
  SECTION("evaluation: the identity") {
    nn::Dropout<double, Mem> layer(0.4, 7);
    layer.train(false);
    check_layer_r_operator(layer, FeatureShape{5}, 3, 404);
  }
}

// Residual blocks for the checks below, in double, with their BatchNorms in evaluation mode.
std::unique_ptr<nn::Residual<double, Mem>> identity_block(FeatureShape in) {
  auto block = std::make_unique<nn::Residual<double, Mem>>(in);
  block->add<nn::Conv2d>(in.channels, in.channels, 3, 1, 1);
  block->add<nn::BatchNorm2d>(in.channels);
  block->add<nn::Tanh>();
  block->add<nn::Conv2d>(in.channels, in.channels, 3, 1, 1, 1, false);
  block->train(false);
  return block;
}
std::unique_ptr<nn::Residual<double, Mem>> projection_block(FeatureShape in, int out) {
  auto block = std::make_unique<nn::Residual<double, Mem>>(in);
  block->add<nn::Conv2d>(in.channels, out, 3, 2, 1, 1, false);
  block->add<nn::BatchNorm2d>(out);
  block->add<nn::Sigmoid>();
  block->add<nn::Conv2d>(out, out, 3, 1, 1);
  block->add_shortcut<nn::Conv2d>(in.channels, out, 1, 2, 0, 1, false);
  block->add_shortcut<nn::BatchNorm2d>(out);
  block->train(false);
  return block;
}

TEST_CASE("r-operator: Residual with identity and projection shortcuts equals finite "
          "differences",
          "[hvp]") {
  SECTION("identity shortcut") {
    auto block = identity_block(FeatureShape{2, 4, 3});
    check_layer_r_operator(*block, FeatureShape{2, 4, 3}, 3, 501);
  }
  SECTION("projection shortcut") {
    auto block = projection_block(FeatureShape{2, 5, 4}, 3);
    check_layer_r_operator(*block, FeatureShape{2, 5, 4}, 3, 502);
  }
  SECTION("dense body with a parameter-free start and an identity shortcut") {
    nn::Residual<double, Mem> block(FeatureShape{4});
    block.add<nn::Tanh>();
    block.add<nn::Dense>(4, 4);
    block.add<nn::ReLU>();
    check_layer_r_operator(block, FeatureShape{4}, 5, 503);
  }
  SECTION("parameters in the shortcut only") {
    nn::Residual<double, Mem> block(FeatureShape{2, 4, 4});
    block.add<nn::MaxPool2d>(2);
    block.add_shortcut<nn::AvgPool2d>(2);
    block.add_shortcut<nn::Conv2d>(2, 2, 1);
    check_layer_r_operator(block, FeatureShape{2, 4, 4}, 3, 504);
  }
  SECTION("a layer without an R-operator in the shortcut is named") {
    nn::Residual<double, Mem> block(FeatureShape{3});
    block.add<nn::Dense>(3, 3);
    CHECK(block.supports_r_operator());
    block.add_shortcut<Opaque>();
    CHECK_FALSE(block.supports_r_operator());
    const Space space;
    auto buffer = bind_fresh<double>(block, 1);
    Vector<double, Mem> v("v", block.parameter_count()), hv("hv", block.parameter_count());
    block.bind_direction(v.data(), hv.data());
    const auto x = random_matrix<double>(2, 3, 505);
    Matrix<double, Mem> y("y", 2, 3), ry("ry", 2, 3);
    block.forward(space, x, y);
    CHECK_THROWS_MATCHES(block.forward_r(space, x, ry), Error,
                         MessageContains("layer Opaque has no R-operator"));
  }
}

TEST_CASE("r-operator: an empty rx stands for a zero R{x} in Conv2d and BatchNorm and Residual",
          "[hvp]") {
  SECTION("Conv2d") {
    nn::Conv2d<double, Mem> layer(2, 3, 3, 2, 1);
    layer.set_chunk_bytes(1);
    check_empty_rx(layer, FeatureShape{2, 5, 4}, 3, 601);
  }
  SECTION("BatchNorm") {
    nn::BatchNorm2d<double, Mem> layer(2);
    layer.train(false);
    check_empty_rx(layer, FeatureShape{2, 3, 2}, 3, 602);
  }
  SECTION("Residual whose chains start without parameters") {
    // Both chains' first layers see R{x} = 0 and have no parameters: the forward R pass
    // skips them and R{dx} goes through their ordinary backward.
    nn::Residual<double, Mem> block(FeatureShape{2, 4, 4});
    block.add<nn::Sigmoid>();
    block.add<nn::Conv2d>(2, 3, 3, 2, 1);
    block.add<nn::BatchNorm2d>(3);
    block.add_shortcut<nn::Tanh>();
    block.add_shortcut<nn::Conv2d>(2, 3, 1, 2, 0, 1, false);
    block.train(false);
    check_empty_rx(block, FeatureShape{2, 4, 4}, 3, 603);
  }
  SECTION("Residual with an identity shortcut") {
    auto block = identity_block(FeatureShape{2, 3, 3});
    check_empty_rx(*block, FeatureShape{2, 3, 3}, 2, 604);
  }
}

// Adds U(-scale, scale) noise to every parameter, so γ, β and biases leave their initial
// values too.
void perturb_parameters(nn::Sequential<double, Mem> &model, double scale, std::uint64_t seed) {
  const auto noise = host_values(random_vector(model.parameter_count(), seed));
  auto theta = to_host(model.parameters());
  for (std::size_t k = 0; k < noise.size(); ++k)
    theta(k) += scale * noise[k];
  Kokkos::deep_copy(model.parameters(), theta);
}

// The product of `model` against its explicit Hessian for a few directions, and uᵀ H v =
// vᵀ H u.
template <class Targets>
void check_against_explicit_hessian(nn::Sequential<double, Mem> &model,
                                    const Matrix<double, Mem> &x, const Targets &targets,
                                    std::uint64_t seed) {
  const Space space;
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const std::size_t n = model.parameter_count();
  const auto hessian = explicit_hessian(model, loss, x, targets);
  nn::CurvatureVectorProduct<double, Mem, nn::SoftmaxCrossEntropy<double, Mem>> product;
  Vector<double, Mem> hv("hv", n), hu("hu", n);
  for (std::uint64_t s : {seed, seed + 1}) {
    const auto v = random_vector(n, s);
    product.apply(space, model, loss, x, targets, v, hv);
    CHECK(scaled_error(host_values(hv), multiply(hessian, host_values(v))) < 1e-7);
  }
  const auto u = random_vector(n, seed + 2), v = random_vector(n, seed + 3);
  product.apply(space, model, loss, x, targets, v, hv);
  product.apply(space, model, loss, x, targets, u, hu);
  CHECK(dot(host_values(u), host_values(hv)) ==
        Approx(dot(host_values(v), host_values(hu))).epsilon(1e-12));
}

TEST_CASE("hessian_vector_product: a small CNN's product equals its explicit Hessian", "[hvp]") {
  // Conv2d(2->3, 3x3, padding 1) MaxPool2d(2) ReLU Flatten Dense(27->4) on 2x6x6 inputs:
  // 57 + 112 = 169 parameters. Whole-batch and one-position chunks of the convolution.
  for (std::size_t chunk_bytes : {nn::Conv2d<double, Mem>::default_chunk_bytes, std::size_t(1)}) {
    INFO("chunk bytes " << chunk_bytes);
    const Space space;
    nn::Sequential<double, Mem> model(FeatureShape{2, 6, 6});
    model.add<nn::Conv2d>(2, 3, 3, 1, 1).set_chunk_bytes(chunk_bytes);
    model.add<nn::MaxPool2d>(2);
    model.add<nn::ReLU>();
    model.add<nn::Flatten>();
    model.add<nn::Dense>(27, 4);
    model.compile(space, 21);
    REQUIRE(model.parameter_count() == 169);
    REQUIRE(model.supports_r_operator());
    const auto x = random_matrix<double>(4, 72, 701, -2, 2);
    check_against_explicit_hessian(model, x, labels_of({0, 3, 1, 2}), 710);
  }
}

TEST_CASE("hessian_vector_product: a small residual network with BatchNorm equals its explicit "
          "Hessian",
          "[hvp]") {
  // Residual[Tanh Conv BN | identity] ReLU, Residual[Conv BN ReLU Conv BN | identity] ReLU,
  // Residual[Conv/2 BN ReLU Conv BN | Conv1x1/2 BN] ReLU Dropout GlobalAvgPool2d Dense on
  // 2x4x4 inputs: 40 + 80 + 159 + 12 = 291 parameters. The first block takes R{x} = 0 into a
  // parameter-free layer. BatchNorm's running statistics come from a few training forwards.
  const Space space;
  const FeatureShape in{2, 4, 4};
  nn::Sequential<double, Mem> model(in);
  {
    auto first = std::make_unique<nn::Residual<double, Mem>>(in);
    first->add<nn::Tanh>();
    first->add<nn::Conv2d>(2, 2, 3, 1, 1, 1, false);
    first->add<nn::BatchNorm2d>(2);
    model.add(std::move(first));
  }
  model.add<nn::ReLU>();
  model.add(nn::models::basic_block<double, Mem>(in, 2, 1));
  model.add<nn::ReLU>();
  model.add(nn::models::basic_block<double, Mem>(in, 3, 2));
  model.add<nn::ReLU>();
  model.add<nn::Dropout>(0.25, 3);
  model.add<nn::GlobalAvgPool2d>();
  model.add<nn::Dense>(3, 3);
  model.compile(space, 31);
  REQUIRE(model.parameter_count() == 291);
  REQUIRE(model.supports_r_operator());
  perturb_parameters(model, 0.2, 801);
  model.train();
  for (std::uint64_t s : {802, 803, 804})
    model.forward(space, random_matrix<double>(6, in.size(), s, -2, 2));
  const auto x = random_matrix<double>(3, in.size(), 805, -2, 2);
  check_against_explicit_hessian(model, x, labels_of({2, 0, 1}), 810);
  CHECK(model.training());
}

TEST_CASE("r-operator: models mlp and cnn and resnet support Hessian-vector products", "[hvp]") {
  const FeatureShape in{1, 8, 8};
  CHECK(nn::models::mlp<double, Mem>(in, 3).supports_r_operator());
  CHECK(nn::models::cnn<double, Mem>(in, 3).supports_r_operator());
  CHECK(nn::models::resnet<double, Mem>(in, 3).supports_r_operator());
  CHECK(
      nn::models::by_name<float, Mem>("resnet", FeatureShape{1, 28, 28}, 10).supports_r_operator());
  // The resnet's product follows a central difference of its gradients and is symmetric.
  const Space space;
  auto model = nn::models::resnet<double, Mem>(in, 3);
  model.compile(space, 41);
  model.train();
  model.forward(space, random_matrix<double>(4, in.size(), 901)); // running statistics
  model.eval();
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto x = random_matrix<double>(2, in.size(), 902);
  const auto labels = labels_of({1, 2});
  const std::size_t n = model.parameter_count();
  const auto v = random_vector(n, 903), u = random_vector(n, 904);
  Vector<double, Mem> hv("hv", n), hu("hu", n);
  nn::hessian_vector_product(space, model, loss, x, labels, v, hv);
  nn::hessian_vector_product(space, model, loss, x, labels, u, hu);
  CHECK(dot(host_values(u), host_values(hv)) ==
        Approx(dot(host_values(v), host_values(hu))).epsilon(1e-10));
  const double h = 1e-6;
  const auto theta = host_values(model.parameters()), vh = host_values(v);
  auto gradient_at = [&](double eps) {
    auto th = Kokkos::create_mirror_view(model.parameters());
    for (std::size_t k = 0; k < n; ++k)
      th(k) = theta[k] + eps * vh[k];
    Kokkos::deep_copy(model.parameters(), th);
    return model_gradient(model, loss, x, labels);
  };
  const auto plus = gradient_at(h), minus = gradient_at(-h);
  gradient_at(0);
  std::vector<double> fd(n);
  for (std::size_t k = 0; k < n; ++k)
    fd[k] = (plus[k] - minus[k]) / (2 * h);
  CHECK(scaled_error(host_values(hv), fd) < 1e-6);
}

} // namespace test_hessian_layers
