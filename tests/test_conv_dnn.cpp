// Conv2d through the vendor DNN library (oneDNN, kat/core/dnn.hpp) against the im2col + GEMM
// path: every shape the example models use and the edge cases (padding, stride, 1x1,
// dilation, rectangular kernels, channels that do not fill oneDNN's blocks, a smaller last
// batch), in float, where oneDNN serves this build's memory space.
#include "test_helpers.hpp"

#include <kat/core/dnn.hpp>
#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/avg_pool2d.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/global_avg_pool2d.hpp>
#include <kat/nn/hessian_vector_product.hpp>
#include <kat/nn/max_pool2d.hpp>
#include <kat/nn/models.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

namespace test_conv_dnn {

using namespace kat;
using namespace kat::test;

namespace {

using Conv = nn::Conv2d<float, Mem>;
constexpr bool have_dnn = dnn_available<Space, float>();

struct Shape {
  int cin, cout, h, w, kh, kw, sh, sw, ph, pw, dh, dw;
  bool bias;
  FeatureShape in() const { return FeatureShape{cin, h, w}; }
};

std::ostream &operator<<(std::ostream &os, const Shape &c) {
  return os << "cin " << c.cin << " cout " << c.cout << " input " << c.h << "x" << c.w << " kernel "
            << c.kh << "x" << c.kw << " stride " << c.sh << "x" << c.sw << " padding " << c.ph
            << "x" << c.pw << " dilation " << c.dh << "x" << c.dw << " bias " << c.bias;
}

// The convolutions of models::cnn and models::resnet (28x28 inputs), then edge cases.
const std::vector<Shape> shapes = {
    // CNN: 5x5, padding 2
    {1, 32, 28, 28, 5, 5, 1, 1, 2, 2, 1, 1, true},
    {32, 64, 14, 14, 5, 5, 1, 1, 2, 2, 1, 1, true},
    // ResNet-14: stem, 3x3 blocks, strided 3x3 and 1x1 projections, no bias
    {1, 16, 28, 28, 3, 3, 1, 1, 1, 1, 1, 1, false},
    {16, 16, 28, 28, 3, 3, 1, 1, 1, 1, 1, 1, false},
    {16, 32, 28, 28, 3, 3, 2, 2, 1, 1, 1, 1, false},
    {16, 32, 28, 28, 1, 1, 2, 2, 0, 0, 1, 1, false},
    {32, 32, 14, 14, 3, 3, 1, 1, 1, 1, 1, 1, false},
    {32, 64, 14, 14, 3, 3, 2, 2, 1, 1, 1, 1, false},
    {32, 64, 14, 14, 1, 1, 2, 2, 0, 0, 1, 1, false},
    {64, 64, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, false},
    // no padding; odd, non-square images; channels not a multiple of 8 or 16
    {3, 5, 7, 5, 3, 3, 1, 1, 0, 0, 1, 1, true},
    // stride 2 whose last window ends before the padding (oneDNN's right padding < 1)
    {3, 2, 8, 6, 3, 3, 2, 2, 1, 1, 1, 1, true},
    // dilation 2, mixed strides and paddings, rectangular kernel
    {2, 3, 9, 8, 3, 2, 1, 2, 1, 0, 2, 2, true},
    // stride 3 > kernel 2: inputs no window reaches
    {1, 2, 8, 7, 2, 2, 3, 3, 0, 1, 1, 1, true},
    // 1x1, 20 -> 24 channels
    {20, 24, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, true}};

std::unique_ptr<Conv> make_conv(const Shape &c, nn::Conv2dBackend backend) {
  auto layer = std::make_unique<Conv>(
      c.cin, c.cout, std::array<int, 2>{c.kh, c.kw}, std::array<int, 2>{c.sh, c.sw},
      std::array<int, 2>{c.ph, c.pw}, std::array<int, 2>{c.dh, c.dw}, c.bias);
  layer->output_shape(c.in());
  layer->set_backend(backend);
  return layer;
}

// A batch of (C, P = H·W) features converted between KAT's layout and channels16, from the
// two layouts' definitions (kat::ActivationLayout), on the host.
Matrix<float, Mem> convert(const Matrix<float, Mem> &m, std::size_t c, bool to_blocked) {
  const std::size_t n = m.extent(0), plane = m.extent(1) / c;
  auto in = to_host(m);
  auto out = Kokkos::create_mirror(in);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t k = 0; k < plane; ++k) {
        const std::size_t blocked = ((b * (c / 16) + ch / 16) * plane + k) * 16 + ch % 16;
        const std::size_t features = b + n * (k + plane * ch);
        if (to_blocked) {
          out.data()[blocked] = in.data()[features];
        } else {
          out.data()[features] = in.data()[blocked];
        }
      }
  Matrix<float, Mem> result("converted", n, m.extent(1));
  Kokkos::deep_copy(result, out);
  return result;
}

} // namespace

TEST_CASE("conv_dnn: oneDNN and im2col agree on y dx and gradients", "[conv2d][dnn]") {
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const Shape &c = shapes[t];
    auto dnn = make_conv(c, nn::Conv2dBackend::dnn);
    auto ref = make_conv(c, nn::Conv2dBackend::im2col);
    const FeatureShape out = dnn->output_shape(c.in());
    ref->output_shape(c.in());
    auto b1 = bind_fresh<float>(*dnn, 7 + t);
    auto b2 = bind_fresh<float>(*ref, 7 + t);
    for (const bool accumulate : {true, false}) {
      dnn->accumulate_gradients(accumulate);
      ref->accumulate_gradients(accumulate);
      // Same non-zero starting gradients: accumulate must add to them, overwrite must not.
      auto g0 = random_matrix<float>(b1.gradients().extent(0), 1, 9);
      Kokkos::deep_copy(b1.gradients(), Kokkos::subview(g0, Kokkos::ALL(), 0));
      Kokkos::deep_copy(b2.gradients(), Kokkos::subview(g0, Kokkos::ALL(), 0));
      // A full batch, then a smaller one (a plan of its own), then the full one again
      // (its cached plan); with and without dx.
      for (const std::size_t n : {std::size_t(6), std::size_t(3), std::size_t(6)}) {
        for (const bool want_dx : {true, false}) {
          INFO(c << " batch " << n << " accumulate " << accumulate << " dx " << want_dx);
          auto x = random_matrix<float>(n, c.in().size(), 11 + t + n);
          auto dy = random_matrix<float>(n, out.size(), 12 + t + n);
          Matrix<float, Mem> y1("y1", n, out.size()), y2("y2", n, out.size());
          Matrix<float, Mem> dx1("dx1", want_dx ? n : 0, x.extent(1));
          Matrix<float, Mem> dx2("dx2", want_dx ? n : 0, x.extent(1));
          Kokkos::deep_copy(dx1, 3.f); // stale values must be overwritten
          Kokkos::deep_copy(y1, 3.f);
          dnn->forward(Space(), x, y1);
          dnn->backward(Space(), dy, dx1);
          ref->forward(Space(), x, y2);
          ref->backward(Space(), dy, dx2);
          CHECK(max_diff_over_scale(y1, y2) < 1e-5);
          if (want_dx) {
            CHECK(max_diff_over_scale(dx1, dx2) < 1e-5);
          }
          CHECK(max_diff_over_scale(b1.gradients(), b2.gradients()) < 1e-5);
        }
      }
    }
    const DnnReorderStats stats = dnn->dnn_reorder_stats();
    CHECK(ref->dnn_reorder_stats().reorders == 0);
    // Every shape here has operands oneDNN keeps blocked: x or y at least.
    CHECK(stats.reorders > 0);
    CHECK(stats.bytes > 0);
    CHECK(stats.seconds > 0);
  }
}

TEST_CASE("conv_dnn: recording curvature takes the im2col path", "[conv2d][dnn][curvature]") {
  const Shape c = shapes[1];
  auto layer = make_conv(c, nn::Conv2dBackend::automatic);
  auto buffer = bind_fresh<float>(*layer, 3);
  CHECK(layer->uses_dnn() == have_dnn);
  layer->record_curvature(true);
  CHECK_FALSE(layer->uses_dnn());
  const std::size_t n = 2;
  auto x = random_matrix<float>(n, c.in().size(), 1);
  const FeatureShape out = layer->output_shape(c.in());
  Matrix<float, Mem> y("y", n, out.size()), dx("dx", n, x.extent(1));
  layer->forward(Space(), x, y);
  layer->backward(Space(), y, dx);
  const auto record = layer->curvature();
  CHECK(record.a.extent(0) == n * out.height * out.width);
  CHECK(record.a.extent(1) == layer->patch_size() + 1);
  CHECK(layer->dnn_reorder_stats().reorders == 0);
  layer->record_curvature(false);
  CHECK(layer->uses_dnn() == have_dnn);
}

TEST_CASE("conv_dnn: automatic keeps small patches in KAT's layout on im2col", "[conv2d][dnn]") {
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  // ResNet's stem: K = 9 < automatic_min_patch_size; its 16-16 3x3 layer: K = 144.
  for (const Shape &c : {shapes[2], shapes[3]}) {
    const bool small =
        static_cast<std::size_t>(c.cin * c.kh * c.kw) < Conv::automatic_min_patch_size;
    for (const auto backend : {nn::Conv2dBackend::automatic, nn::Conv2dBackend::dnn}) {
      INFO(c << " automatic " << (backend == nn::Conv2dBackend::automatic));
      auto layer = make_conv(c, backend);
      auto buffer = bind_fresh<float>(*layer, 1);
      const FeatureShape out = layer->output_shape(c.in());
      auto x = random_matrix<float>(2, c.in().size(), 1);
      Matrix<float, Mem> y("y", 2, out.size());
      layer->forward(Space(), x, y);
      const bool through_dnn = layer->dnn_reorder_stats().reorders > 0;
      CHECK(through_dnn == !(small && backend == nn::Conv2dBackend::automatic));
      // In oneDNN's layout on the output side, automatic takes oneDNN whatever K.
      layer->set_layouts(ActivationLayout::features, ActivationLayout::channels16);
      const std::size_t before = layer->dnn_reorder_stats().reorders;
      layer->forward(Space(), x, y);
      CHECK(layer->dnn_reorder_stats().reorders > before); // x, from KAT's layout
    }
  }
}

TEST_CASE("conv_dnn: the models give the same outputs and gradients on either path",
          "[conv2d][dnn][models]") {
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  for (const char *name : {"cnn", "resnet"}) {
    INFO(name);
    const FeatureShape in{1, 28, 28};
    auto a = nn::models::by_name<float, Mem>(name, in, 10);
    auto b = nn::models::by_name<float, Mem>(name, in, 10);
    a.compile(Space(), 5);
    b.compile(Space(), 5);
    CHECK(nn::set_conv2d_backend(a.layers(), nn::Conv2dBackend::dnn) ==
          (std::string(name) == "cnn" ? 2u : 15u));
    nn::set_conv2d_backend(b.layers(), nn::Conv2dBackend::im2col);
    const std::size_t n = 5;
    auto x = random_matrix<float>(n, in.size(), 21);
    auto dy = random_matrix<float>(n, 10, 22);
    const auto &ya = a.forward(Space(), x);
    const auto &yb = b.forward(Space(), x);
    CHECK(max_diff_over_scale(ya, yb) < 1e-4);
    a.zero_grad(Space());
    b.zero_grad(Space());
    a.backward(Space(), dy);
    b.backward(Space(), dy);
    if (std::string(name) == "resnet") {
      // Batch normalization ran on oneDNN's path in `a` (channels16), on KAT's in `b`: the
      // running statistics agree too.
      for (std::size_t i : {std::size_t(1)}) {
        auto *bn_a = dynamic_cast<nn::BatchNorm<float, Mem> *>(&a.layer(i));
        auto *bn_b = dynamic_cast<nn::BatchNorm<float, Mem> *>(&b.layer(i));
        REQUIRE(bn_a != nullptr);
        REQUIRE(bn_b != nullptr);
        CHECK(bn_a->input_layout() == ActivationLayout::channels16);
        CHECK(bn_b->input_layout() == ActivationLayout::features);
        CHECK(max_diff_over_scale(bn_a->running_mean(), bn_b->running_mean()) < 1e-5);
        CHECK(max_diff_over_scale(bn_a->running_var(), bn_b->running_var()) < 1e-5);
        CHECK(bn_a->num_batches_tracked() == 1);
      }
    }
    // The CNN's max pooling routes each window's gradient to its largest input, and the two
    // paths' rounding may order two nearly equal inputs differently; its gradients are
    // compared layer by layer in the test above. ResNet-14 has no max pooling.
    if (std::string(name) == "resnet") {
      CHECK(max_diff_over_scale(a.gradients(), b.gradients()) < 1e-4);
    }
  }
}

TEST_CASE("conv_dnn: layouts are negotiated between the layers that compute through oneDNN",
          "[conv2d][dnn][layouts]") {
  using L = ActivationLayout;
  const FeatureShape in{1, 28, 28};
  auto model = nn::models::resnet<float, Mem>(in, 10);
  model.compile(Space(), 3);
  auto x = random_matrix<float>(4, in.size(), 5);
  const auto layouts = [&] {
    std::vector<L> out;
    for (const auto &l : model.layers()) {
      out.push_back(l->output_layout());
    }
    return out;
  };
  // resnet: conv, BN, ReLU, 6 x (block, ReLU), global average pool, dense.
  const std::size_t layers = model.layers().size();
  REQUIRE(layers == 17);
  model.train();
  model.forward(Space(), x);
  const std::vector<L> trained = layouts();
  CHECK(model.layer(0).input_layout() == L::features); // the model's input, 1 channel
  CHECK(model.layer(layers - 1).output_layout() == L::features);
  CHECK(model.layer(layers - 2).output_layout() == L::features); // global average pool
  for (std::size_t i = 0; i + 2 < layers; ++i) {
    INFO("layer " << i << " " << model.layer(i).name());
    CHECK(trained[i] == (have_dnn ? L::channels16 : L::features));
  }
  // Evaluation (batch normalization with running statistics) stays in KAT's layout, and so
  // does a convolution recording curvature, with its neighbours.
  model.eval();
  model.forward(Space(), x);
  for (const L l : layouts()) {
    CHECK(l == L::features);
  }
  model.train();
  model.layer(0).record_curvature(true);
  model.forward(Space(), x);
  // Its neighbours follow, and the residual blocks (the same layout in and out, for the
  // identity shortcuts) carry KAT's layout to the end.
  for (const L l : layouts()) {
    CHECK(l == L::features);
  }
  model.layer(0).record_curvature(false);
  model.forward(Space(), x);
  CHECK(layouts() == trained);
  // A layer refuses a pair it does not support, naming it.
  nn::Dense<float, Mem> dense(4, 3);
  CHECK_THROWS_MATCHES(dense.set_layouts(L::channels16, L::features), ValueError,
                       Catch::Message("kat::nn::Dense::set_layouts: input layout channels16 and "
                                      "output layout features are not supported in the layer's "
                                      "current mode"));
}

TEST_CASE("conv_dnn: global average pooling reads either layout", "[dnn][layouts]") {
  const std::size_t n = 3, c = 32, plane = 6;
  nn::GlobalAvgPool2d<float, Mem> pool;
  pool.output_shape(FeatureShape{static_cast<int>(c), 2, 3});
  REQUIRE(pool.supports_layouts(ActivationLayout::channels16, ActivationLayout::features));
  REQUIRE_FALSE(pool.supports_layouts(ActivationLayout::features, ActivationLayout::channels16));
  auto x = random_matrix<float>(n, c * plane, 4);
  auto dy = random_matrix<float>(n, c, 5);
  // x in channels16, element by element from its definition.
  auto xh = to_host(x);
  auto blocked = Kokkos::create_mirror(xh);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t k = 0; k < plane; ++k)
        blocked.data()[((b * (c / 16) + ch / 16) * plane + k) * 16 + ch % 16] =
            xh(b, k + plane * ch);
  Matrix<float, Mem> xb("xb", n, c * plane);
  Kokkos::deep_copy(xb, blocked);
  Matrix<float, Mem> y1("y1", n, c), y2("y2", n, c);
  Matrix<float, Mem> dx1("dx1", n, c * plane), dx2("dx2", n, c * plane);
  pool.forward(Space(), x, y1);
  pool.backward(Space(), dy, dx1);
  pool.set_layouts(ActivationLayout::channels16, ActivationLayout::features);
  pool.forward(Space(), xb, y2);
  pool.backward(Space(), dy, dx2);
  CHECK(max_diff_over_scale(y2, y1) == 0);
  auto d1 = to_host(dx1);
  auto d2 = to_host(dx2);
  double err = 0;
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t k = 0; k < plane; ++k)
        err = std::max(
            err, std::abs(double(d2.data()[((b * (c / 16) + ch / 16) * plane + k) * 16 + ch % 16]) -
                          double(d1(b, k + plane * ch))));
  CHECK(err == 0);
}

TEST_CASE("conv_dnn: Hessian-vector products of ResNet-14 agree on either path",
          "[conv2d][dnn][hvp]") {
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  const FeatureShape in{1, 28, 28};
  auto a = nn::models::resnet<float, Mem>(in, 10);
  auto b = nn::models::resnet<float, Mem>(in, 10);
  a.compile(Space(), 8);
  b.compile(Space(), 8);
  nn::set_conv2d_backend(b.layers(), nn::Conv2dBackend::im2col);
  const std::size_t n = 4;
  auto x = random_matrix<float>(n, in.size(), 31);
  auto labels = labels_of({1, 7, 3, 0});
  // A training step first, so the layers last ran in channels16.
  a.forward(Space(), x);
  b.forward(Space(), x);
  nn::SoftmaxCrossEntropy<float, Mem> loss;
  auto v = random_matrix<float>(a.parameter_count(), 1, 32);
  const Vector<float, Mem> vv(v.data(), a.parameter_count());
  Vector<float, Mem> ha("ha", a.parameter_count()), hb("hb", b.parameter_count());
  nn::hessian_vector_product(Space(), a, loss, x, labels, vv, ha);
  nn::hessian_vector_product(Space(), b, loss, x, labels, vv, hb);
  CHECK(max_diff_over_scale(ha, hb) < 1e-3);
  CHECK(a.training());
}

TEST_CASE("conv_dnn: pooling in oneDNN's layout agrees with KAT's kernels", "[dnn][layouts]") {
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  struct Case {
    bool max;
    int channels, size, kernel, stride, padding;
  };
  // The CNN's 2x2 max pooling, and 3x3 windows with stride 2 and padding 1 on an odd image
  // (the last window's bottom/right padding differs from the top/left).
  const Case cases[] = {{true, 32, 8, 2, 2, 0},
                        {true, 16, 7, 3, 2, 1},
                        {false, 32, 8, 2, 2, 0},
                        {false, 16, 7, 3, 2, 1}};
  for (const Case &t : cases) {
    INFO((t.max ? "max" : "avg") << " channels " << t.channels << " size " << t.size << " kernel "
                                 << t.kernel << " stride " << t.stride << " padding " << t.padding);
    std::unique_ptr<nn::Layer<float, Mem>> kat_pool, dnn_pool;
    if (t.max) {
      kat_pool = std::make_unique<nn::MaxPool2d<float, Mem>>(t.kernel, t.stride, t.padding);
      dnn_pool = std::make_unique<nn::MaxPool2d<float, Mem>>(t.kernel, t.stride, t.padding);
    } else {
      kat_pool = std::make_unique<nn::AvgPool2d<float, Mem>>(t.kernel, t.stride, t.padding);
      dnn_pool = std::make_unique<nn::AvgPool2d<float, Mem>>(t.kernel, t.stride, t.padding);
    }
    const FeatureShape in{t.channels, t.size, t.size};
    const FeatureShape out = kat_pool->output_shape(in);
    dnn_pool->output_shape(in);
    REQUIRE(dnn_pool->supports_layouts(ActivationLayout::channels16, ActivationLayout::channels16));
    dnn_pool->set_layouts(ActivationLayout::channels16, ActivationLayout::channels16);
    const std::size_t n = 3, c = static_cast<std::size_t>(t.channels);
    auto x = random_matrix<float>(n, in.size(), 40);
    auto dy = random_matrix<float>(n, out.size(), 41);
    Matrix<float, Mem> y1("y1", n, out.size()), y2("y2", n, out.size());
    Matrix<float, Mem> dx1("dx1", n, in.size()), dx2("dx2", n, in.size());
    kat_pool->forward(Space(), x, y1);
    kat_pool->backward(Space(), dy, dx1);
    dnn_pool->forward(Space(), convert(x, c, true), y2);
    dnn_pool->backward(Space(), convert(dy, c, true), dx2);
    CHECK(max_diff_over_scale(convert(y2, c, false), y1) < 1e-6);
    CHECK(max_diff_over_scale(convert(dx2, c, false), dx1) < 1e-6);
    // The R passes need KAT's own forward records.
    Matrix<float, Mem> ry("ry", n, out.size());
    CHECK_THROWS_WITH(dnn_pool->forward_r(Space(), x, ry),
                      Catch::Contains("ran in oneDNN's channels16 layout"));
  }
  // Evaluation mode keeps pooling in KAT's layout.
  nn::MaxPool2d<float, Mem> pool(2);
  pool.output_shape(FeatureShape{16, 4, 4});
  pool.train(false);
  CHECK_FALSE(pool.supports_layouts(ActivationLayout::channels16, ActivationLayout::channels16));
}

TEST_CASE("conv_dnn: the CNN keeps its first convolution's output blocked through pooling",
          "[dnn][layouts]") {
  auto model = nn::models::cnn<float, Mem>(FeatureShape{1, 28, 28}, 10);
  model.compile(Space(), 2);
  auto x = random_matrix<float>(2, 784, 3);
  model.forward(Space(), x);
  const ActivationLayout blocked =
      have_dnn ? ActivationLayout::channels16 : ActivationLayout::features;
  // conv, max-pool, ReLU, conv, max-pool, ReLU, flatten, dense, ReLU, dense
  CHECK(model.layer(0).output_layout() == blocked);
  CHECK(model.layer(1).output_layout() == blocked);
  CHECK(model.layer(2).output_layout() == blocked);
  CHECK(model.layer(3).input_layout() == blocked);
  // The second pooling's output goes to Flatten and a dense layer: KAT's layout from there.
  CHECK(model.layer(3).output_layout() == ActivationLayout::features);
  CHECK(model.layer(4).input_layout() == ActivationLayout::features);
}

TEST_CASE("conv_dnn: backend dnn is refused where no DNN library serves the layer",
          "[conv2d][dnn][errors]") {
  nn::Conv2d<double, Mem> layer(2, 3, 3);
  CHECK_THROWS_MATCHES(layer.set_backend(nn::Conv2dBackend::dnn), ValueError,
                       Catch::Message("kat::nn::Conv2d::set_backend: backend dnn needs a vendor "
                                      "DNN library for this layer (oneDNN, KAT_ENABLE_ONEDNN, "
                                      "float, host memory); kat::dnn_available is false here"));
  CHECK(layer.backend() == nn::Conv2dBackend::automatic);
  CHECK_FALSE(layer.uses_dnn());
  auto model = nn::models::cnn<double, Mem>(FeatureShape{1, 28, 28}, 10);
  CHECK_THROWS_AS(nn::set_conv2d_backend(model.layers(), nn::Conv2dBackend::dnn), ValueError);
  CHECK(nn::set_conv2d_backend(model.layers(), nn::Conv2dBackend::im2col) == 2);
}

} // namespace test_conv_dnn
