// Conv2d through the vendor DNN library (oneDNN, kat/core/dnn.hpp) against the im2col + GEMM
// path: every shape the example models use and the edge cases (padding, stride, 1x1,
// dilation, rectangular kernels, channels that do not fill oneDNN's blocks, a smaller last
// batch), in float, where oneDNN serves this build's memory space.
#include "test_helpers.hpp"

#include <kat/core/bfloat16.hpp>
#include <kat/core/dnn.hpp>
#include <kat/core/host_isa.hpp>
#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/avg_pool2d.hpp>
#include <kat/nn/batch_norm.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/global_avg_pool2d.hpp>
#include <kat/nn/hessian_vector_product.hpp>
#include <kat/nn/max_pool2d.hpp>
#include <kat/nn/models.hpp>
#include <kat/nn/residual.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
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

// Offset of element (b, ch, i, j) (row i, column j) of an (N, C, H, W) batch in `layout`,
// from the layouts' definitions (kat::ActivationLayout; oneDNN's orders the plane by rows,
// KAT's by columns).
std::size_t offset_in(ActivationLayout layout, std::size_t n, const FeatureShape &s, std::size_t b,
                      std::size_t ch, std::size_t i, std::size_t j) {
  const std::size_t c = s.channels, h = s.height, w = s.width;
  if (layout_blocks16(layout)) {
    return (((b * (c / 16) + ch / 16) * h + i) * w + j) * 16 + ch % 16;
  }
  if (layout == ActivationLayout::channels_last || layout == ActivationLayout::channels_last_bf16) {
    return ((b * h + i) * w + j) * c + ch;
  }
  return b + n * (i + h * (j + w * ch));
}

// A batch of `shape` features converted between KAT's layout and `layout`, on the host.
Matrix<float, Mem> convert(const Matrix<float, Mem> &m, const FeatureShape &shape,
                           ActivationLayout layout, bool to_layout) {
  const std::size_t n = m.extent(0);
  REQUIRE(m.extent(1) == shape.size());
  auto in = to_host(m);
  auto out = Kokkos::create_mirror(in);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t ch = 0; ch < std::size_t(shape.channels); ++ch)
      for (std::size_t i = 0; i < std::size_t(shape.height); ++i)
        for (std::size_t j = 0; j < std::size_t(shape.width); ++j) {
          const std::size_t other = offset_in(layout, n, shape, b, ch, i, j);
          const std::size_t features = offset_in(ActivationLayout::features, n, shape, b, ch, i, j);
          if (to_layout) {
            out.data()[other] = in.data()[features];
          } else {
            out.data()[features] = in.data()[other];
          }
        }
  Matrix<float, Mem> result("converted", n, m.extent(1));
  Kokkos::deep_copy(result, out);
  return result;
}

// m's values rounded to bf16 (kept as float), so that storing them in bf16 loses nothing.
Matrix<float, Mem> bf16_values(const Matrix<float, Mem> &m) {
  auto h = to_host(m);
  for (std::size_t i = 0; i < h.span(); ++i)
    h.data()[i] = bfloat16::from_float(h.data()[i]).to_float();
  Matrix<float, Mem> result("bf16_values", m.extent(0), m.extent(1));
  Kokkos::deep_copy(result, h);
  return result;
}

// The layout of Scalar values in the order of a bf16-storage layout: channels_last for
// channels_last_bf16, channels16 for channels16_bf16.
ActivationLayout fp32_order(ActivationLayout bf16_layout) {
  return layout_blocks16(bf16_layout) ? ActivationLayout::channels16
                                      : ActivationLayout::channels_last;
}

// A batch in KAT's layout stored in `layout` (channels_last_bf16 or channels16_bf16; rounded to
// nearest even), in a float matrix of the same extents whose first half holds the bf16 values.
Matrix<float, Mem> to_bf16(const Matrix<float, Mem> &m, const FeatureShape &shape,
                           ActivationLayout layout) {
  auto last = to_host(convert(m, shape, fp32_order(layout), true));
  auto out = Kokkos::create_mirror(last);
  Kokkos::deep_copy(out, 0.0f);
  auto *b = reinterpret_cast<bfloat16 *>(out.data());
  for (std::size_t i = 0; i < last.span(); ++i)
    b[i] = bfloat16::from_float(last.data()[i]);
  Matrix<float, Mem> result("bf16_layout", m.extent(0), m.extent(1));
  Kokkos::deep_copy(result, out);
  return result;
}

// ... and back: the bf16 values of a batch in `layout`, widened (exactly), in KAT's layout.
Matrix<float, Mem> from_bf16(const Matrix<float, Mem> &m, const FeatureShape &shape,
                             ActivationLayout layout) {
  auto h = to_host(m);
  auto wide = Kokkos::create_mirror(h);
  const auto *b = reinterpret_cast<const bfloat16 *>(h.data());
  for (std::size_t i = 0; i < h.span(); ++i)
    wide.data()[i] = b[i].to_float();
  Matrix<float, Mem> result("widened", m.extent(0), m.extent(1));
  Kokkos::deep_copy(result, wide);
  return convert(result, shape, fp32_order(layout), false);
}

// The two layouts that store bf16 values.
constexpr ActivationLayout bf16_layouts[] = {ActivationLayout::channels_last_bf16,
                                             ActivationLayout::channels16_bf16};

// The largest |a - b| - 2^-8 |b| over the elements, relative to max |b|: at most a few 1e-6
// when a is b rounded to bf16 (8-bit significand: a relative error of at most 2^-9) after
// fp32 sums in another order.
double excess_over_bf16_rounding(const Matrix<float, Mem> &a, const Matrix<float, Mem> &b) {
  auto ha = to_host(a);
  auto hb = to_host(b);
  REQUIRE(ha.span() == hb.span());
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < hb.span(); ++i)
    scale = std::max(scale, std::abs(double(hb.data()[i])));
  for (std::size_t i = 0; i < hb.span(); ++i) {
    const double d = std::abs(double(ha.data()[i]) - double(hb.data()[i]));
    worst = std::max(worst, d - std::ldexp(std::abs(double(hb.data()[i])), -8));
  }
  return scale > 0 ? worst / scale : worst;
}

// Whether two float matrices hold the same bits in their first `count` bf16 values.
bool same_bf16(const Matrix<float, Mem> &a, const Matrix<float, Mem> &b, std::size_t count) {
  auto ha = to_host(a);
  auto hb = to_host(b);
  const auto *pa = reinterpret_cast<const bfloat16 *>(ha.data());
  const auto *pb = reinterpret_cast<const bfloat16 *>(hb.data());
  for (std::size_t i = 0; i < count; ++i)
    if (pa[i].bits != pb[i].bits)
      return false;
  return true;
}

// Whether oneDNN's bf16 primitives serve this build (kat::detail::dnn_bf16_convolutions();
// oneDNN 2.x has none below AVX-512), so that `layer`, set to bf16, offers `layout`; if not,
// checks that it refuses the layout (forward() would fail there) and warns it is untested.
bool bf16_primitives_offer(const kat::nn::Layer<float, Mem> &layer, ActivationLayout layout) {
  if (have_dnn && kat::detail::dnn_bf16_convolutions()) {
    return true;
  }
  CHECK_FALSE(layer.supports_layouts(layout, layout));
  WARN("no bf16 primitives from a DNN library here: " << layer.name() << " in " << to_string(layout)
                                                      << " untested");
  return false;
}

// The layout a Conv2d's fp32 DNN path computes in on this CPU: oneDNN's nChw16c where its f32
// convolutions compute in it (AVX-512), channels last elsewhere.
ActivationLayout fp32_dnn_layout() { return kat::detail::dnn_f32_layout(); }

// bf16_primitives_offer for a bf16 Conv2d (nothing but oneDNN reads a bf16 layout of its).
bool bf16_convolutions_offer(ActivationLayout layout) {
  Conv conv(16, 16, 3, 1, 1);
  conv.output_shape(FeatureShape{16, 8, 8});
  conv.set_precision(Precision::bf16);
  return bf16_primitives_offer(conv, layout);
}

// Runs `layer` on a batch of n samples with its input in `in_layout` and its output in
// `out_layout` (set here), and `ref` on the same batch in KAT's layout, both with parameters
// drawn from `seed` (x from seed + 10, dy from seed + 11), and checks that y, dx and the
// parameter gradients agree to 1e-5 of their scale: the same operands (in bf16 rounded
// element-wise alike), fp32 sums in another order.
void check_against_kat_layout(Conv &layer, Conv &ref, const Shape &c, ActivationLayout in_layout,
                              ActivationLayout out_layout, std::size_t n, std::uint64_t seed) {
  const FeatureShape out = layer.output_shape(c.in());
  layer.set_layouts(in_layout, out_layout);
  auto b1 = bind_fresh<float>(layer, seed);
  auto b2 = bind_fresh<float>(ref, seed);
  auto x = random_matrix<float>(n, c.in().size(), seed + 10);
  auto dy = random_matrix<float>(n, out.size(), seed + 11);
  Matrix<float, Mem> y1("y1", n, out.size()), y2("y2", n, out.size());
  Matrix<float, Mem> dx1("dx1", n, x.extent(1)), dx2("dx2", n, x.extent(1));
  layer.forward(Space(), convert(x, c.in(), in_layout, true), y1);
  layer.backward(Space(), convert(dy, out, out_layout, true), dx1);
  ref.forward(Space(), x, y2);
  ref.backward(Space(), dy, dx2);
  CHECK(max_diff_over_scale(convert(y1, out, out_layout, false), y2) < 1e-5);
  CHECK(max_diff_over_scale(convert(dx1, c.in(), in_layout, false), dx2) < 1e-5);
  CHECK(max_diff_over_scale(b1.gradients(), b2.gradients()) < 1e-5);
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
      layer->set_layouts(ActivationLayout::features, fp32_dnn_layout());
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
      // Batch normalization ran on oneDNN's path in `a` (fp32_dnn_layout()), on KAT's in `b`: the
      // running statistics agree too.
      for (std::size_t i : {std::size_t(1)}) {
        auto *bn_a = dynamic_cast<nn::BatchNorm<float, Mem> *>(&a.layer(i));
        auto *bn_b = dynamic_cast<nn::BatchNorm<float, Mem> *>(&b.layer(i));
        REQUIRE(bn_a != nullptr);
        REQUIRE(bn_b != nullptr);
        CHECK(bn_a->input_layout() == fp32_dnn_layout());
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
    CHECK(trained[i] == (have_dnn ? fp32_dnn_layout() : L::features));
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

TEST_CASE("conv_dnn: global average pooling reads every layout", "[dnn][layouts]") {
  for (const std::size_t c : {std::size_t(32), std::size_t(5)})
    for (const auto layout : {ActivationLayout::channels16, ActivationLayout::channels_last}) {
      INFO("channels " << c << " layout " << to_string(layout));
      const std::size_t n = 3, plane = 6;
      nn::GlobalAvgPool2d<float, Mem> pool;
      const FeatureShape in{static_cast<int>(c), 2, 3};
      pool.output_shape(in);
      if (!layout_fits(layout, c)) { // channels16 with 5 channels
        CHECK_FALSE(pool.supports_layouts(layout, ActivationLayout::features));
        continue;
      }
      REQUIRE(pool.supports_layouts(layout, ActivationLayout::features));
      REQUIRE_FALSE(pool.supports_layouts(ActivationLayout::features, layout));
      auto x = random_matrix<float>(n, c * plane, 4);
      auto dy = random_matrix<float>(n, c, 5);
      Matrix<float, Mem> y1("y1", n, c), y2("y2", n, c);
      Matrix<float, Mem> dx1("dx1", n, c * plane), dx2("dx2", n, c * plane);
      pool.forward(Space(), x, y1);
      pool.backward(Space(), dy, dx1);
      pool.set_layouts(layout, ActivationLayout::features);
      pool.forward(Space(), convert(x, in, layout, true), y2);
      pool.backward(Space(), dy, dx2);
      // The plane summed in another order (rows first): 6 values, a few roundings apart.
      CHECK(max_diff_over_scale(y2, y1) < 1e-6);
      CHECK(max_diff_over_scale(convert(dx2, in, layout, false), dx1) == 0);
    }
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

namespace {

// A pooling layer's hyperparameters and input size.
struct PoolCase {
  bool max;
  int channels, size, kernel, stride, padding;

  std::unique_ptr<nn::Layer<float, Mem>> make() const {
    if (max) {
      return std::make_unique<nn::MaxPool2d<float, Mem>>(kernel, stride, padding);
    }
    return std::make_unique<nn::AvgPool2d<float, Mem>>(kernel, stride, padding);
  }
};

std::ostream &operator<<(std::ostream &os, const PoolCase &t) {
  return os << (t.max ? "max" : "avg") << " channels " << t.channels << " size " << t.size
            << " kernel " << t.kernel << " stride " << t.stride << " padding " << t.padding;
}

// The CNN's 2x2 max pooling, and 3x3 windows with stride 2 and padding 1 on an odd image (the
// last window's bottom/right padding differs from the top/left; an input element gets dy from
// up to four windows). The channels-last layouts take any channel count: 5 channels there.
constexpr PoolCase pool_cases[] = {{true, 32, 8, 2, 2, 0},  {true, 16, 7, 3, 2, 1},
                                   {false, 32, 8, 2, 2, 0}, {false, 16, 7, 3, 2, 1},
                                   {true, 5, 7, 3, 2, 1},   {false, 5, 6, 2, 2, 0}};

} // namespace

TEST_CASE("conv_dnn: pooling in oneDNN's layouts agrees with KAT's layout", "[dnn][layouts]") {
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  for (const auto layout : {ActivationLayout::channels16, ActivationLayout::channels_last})
    for (const PoolCase &t : pool_cases) {
      if (!layout_fits(layout, t.channels)) {
        continue;
      }
      INFO(t << " layout " << to_string(layout));
      const auto kat_pool = t.make(), dnn_pool = t.make();
      const FeatureShape in{t.channels, t.size, t.size};
      const FeatureShape out = kat_pool->output_shape(in);
      dnn_pool->output_shape(in);
      if (!kat::detail::dnn_reads_layout(layout)) { // channels16 below AVX-512
        CHECK_FALSE(dnn_pool->supports_layouts(layout, layout));
        continue;
      }
      REQUIRE(dnn_pool->supports_layouts(layout, layout));
      dnn_pool->set_layouts(layout, layout);
      const std::size_t n = 3;
      auto x = random_matrix<float>(n, in.size(), 40);
      if (layout == ActivationLayout::channels_last) {
        // Four levels only, so most windows hold ties: the scan order shows.
        auto h = to_host(x);
        for (std::size_t j = 0; j < h.extent(1); ++j)
          for (std::size_t i = 0; i < n; ++i) {
            h(i, j) = std::floor(4.0f * h(i, j));
          }
        Kokkos::deep_copy(x, h);
      }
      auto dy = random_matrix<float>(n, out.size(), 41);
      Matrix<float, Mem> y1("y1", n, out.size()), y2("y2", n, out.size());
      Matrix<float, Mem> dx1("dx1", n, in.size()), dx2("dx2", n, in.size());
      kat_pool->forward(Space(), x, y1);
      kat_pool->backward(Space(), dy, dx1);
      dnn_pool->forward(Space(), convert(x, in, layout, true), y2);
      dnn_pool->backward(Space(), convert(dy, out, layout, true), dx2);
      if (layout == ActivationLayout::channels_last) {
        // KAT's kernels on the transposed batch: the same window order, so the same bits (the
        // first maximum of a tie, the same sums).
        CHECK(max_diff_over_scale(convert(y2, out, layout, false), y1) == 0);
        CHECK(max_diff_over_scale(convert(dx2, in, layout, false), dx1) == 0);
      } else {
        CHECK(max_diff_over_scale(convert(y2, out, layout, false), y1) < 1e-6);
        CHECK(max_diff_over_scale(convert(dx2, in, layout, false), dx1) < 1e-6);
      }
      // The R passes need KAT's own forward records in KAT's layout.
      Matrix<float, Mem> ry("ry", n, out.size());
      CHECK_THROWS_WITH(
          dnn_pool->forward_r(Space(), x, ry),
          Catch::Contains(std::string("ran in the ") + to_string(layout) + " layout"));
    }
  // Evaluation mode keeps pooling in KAT's layout.
  nn::MaxPool2d<float, Mem> pool(2);
  pool.output_shape(FeatureShape{16, 4, 4});
  pool.train(false);
  CHECK_FALSE(pool.supports_layouts(ActivationLayout::channels16, ActivationLayout::channels16));
  CHECK_FALSE(
      pool.supports_layouts(ActivationLayout::channels_last, ActivationLayout::channels_last));
  pool.train(true);
  CHECK(pool.supports_layouts(ActivationLayout::channels_last, ActivationLayout::channels_last));
  CHECK_FALSE(pool.supports_layouts(ActivationLayout::channels_last, ActivationLayout::channels16));
}

TEST_CASE("conv_dnn: in bf16 pooling reads and writes bf16 activations", "[dnn][layouts][bf16]") {
  using L = ActivationLayout;
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  for (const L layout : bf16_layouts)
    for (const PoolCase &t : pool_cases) {
      INFO(t << " layout " << to_string(layout));
      const auto ref = t.make(), b16 = t.make();
      const FeatureShape in{t.channels, t.size, t.size};
      const FeatureShape out = ref->output_shape(in);
      b16->output_shape(in);
      // Only in bf16: fp32 never stores activations in bf16.
      CHECK_FALSE(b16->supports_layouts(layout, layout));
      b16->set_precision(Precision::bf16);
      if (!layout_fits_bf16(layout, t.channels)) {
        CHECK_FALSE(b16->supports_layouts(layout, layout));
        continue;
      }
      if (!bf16_primitives_offer(*b16, layout)) {
        continue;
      }
      REQUIRE(b16->supports_layouts(layout, layout));
      CHECK_FALSE(b16->supports_layouts(layout, L::features));
      b16->set_layouts(layout, layout);
      // The reference: KAT's fp32 kernels on the same bf16 values.
      const std::size_t n = 3;
      auto x = bf16_values(random_matrix<float>(n, in.size(), 42));
      auto dy = bf16_values(random_matrix<float>(n, out.size(), 43));
      Matrix<float, Mem> y1("y1", n, out.size()), y2("y2", n, out.size());
      Matrix<float, Mem> dx1("dx1", n, in.size()), dx2("dx2", n, in.size());
      ref->forward(Space(), x, y1);
      ref->backward(Space(), dy, dx1);
      b16->forward(Space(), to_bf16(x, in, layout), y2);
      b16->backward(Space(), to_bf16(dy, out, layout), dx2);
      if (t.max) {
        // A maximum is one of its inputs: bit for bit.
        CHECK(max_diff_over_scale(from_bf16(y2, out, layout), y1) == 0);
      } else {
        // The average, computed in fp32 and rounded to bf16 once (a relative error of at most
        // 2^-9).
        CHECK(excess_over_bf16_rounding(from_bf16(y2, out, layout), y1) < 1e-6);
      }
      if (t.stride == t.kernel) {
        // Windows that do not overlap: each dx is one dy (max: bit for bit) or dy / area
        // rounded once.
        if (t.max) {
          CHECK(max_diff_over_scale(from_bf16(dx2, in, layout), dx1) == 0);
        } else {
          CHECK(excess_over_bf16_rounding(from_bf16(dx2, in, layout), dx1) < 1e-6);
        }
        continue;
      }
      // Overlapping windows: oneDNN adds the up to m = 4 contributions to an element in bf16,
      // rounding each partial sum (relative error 2^-9 of at most Σ|dy_k|; the average's
      // dy_k / area once more), so |dx - dx_ref| <= (m + 1) 2^-9 Σ|dy_k|, Σ|dy_k| being the
      // same backward applied to |dy|.
      auto abs_dy = to_host(dy);
      for (std::size_t i = 0; i < abs_dy.span(); ++i)
        abs_dy.data()[i] = std::abs(abs_dy.data()[i]);
      Matrix<float, Mem> dy_abs("dy_abs", n, out.size()), dx_abs("dx_abs", n, in.size());
      Kokkos::deep_copy(dy_abs, abs_dy);
      ref->backward(Space(), dy_abs, dx_abs);
      const auto got = to_host(from_bf16(dx2, in, layout));
      const auto want = to_host(dx1);
      const auto bound = to_host(dx_abs);
      double worst = 0;
      for (std::size_t i = 0; i < want.span(); ++i)
        worst = std::max(worst, std::abs(double(got.data()[i]) - double(want.data()[i])) -
                                    5 * std::ldexp(double(bound.data()[i]), -9));
      CHECK(worst <= 0);
    }
}

TEST_CASE("conv_dnn: Flatten gathers every layout into KAT's order and scatters dy back",
          "[layouts][flatten]") {
  using L = ActivationLayout;
  const std::size_t n = 3;
  for (const FeatureShape in : {FeatureShape{16, 3, 2}, FeatureShape{5, 2, 4}})
    for (const L layout :
         {L::channels16, L::channels_last, L::channels16_bf16, L::channels_last_bf16}) {
      INFO("input " << in << " layout " << to_string(layout));
      nn::Flatten<float, Mem> flatten;
      CHECK(flatten.output_shape(in) == FeatureShape{static_cast<int>(in.size())});
      CHECK(flatten.supports_layouts(L::features, L::features));
      CHECK_FALSE(flatten.supports_layouts(L::features, layout));
      CHECK_FALSE(flatten.supports_layouts(layout, layout));
      CHECK(flatten.supports_layouts(layout, L::features) == layout_fits(layout, in.channels));
      flatten.set_precision(Precision::bf16);
      if (!layout_fits(layout, in.channels, Precision::bf16)) {
        CHECK_FALSE(flatten.supports_layouts(layout, L::features));
        continue;
      }
      REQUIRE(flatten.supports_layouts(layout, L::features));
      flatten.set_layouts(layout, L::features);
      CHECK_FALSE(flatten.passes_through());
      auto x = random_matrix<float>(n, in.size(), 44);
      auto dy = random_matrix<float>(n, in.size(), 45);
      Matrix<float, Mem> y("y", n, in.size()), dx("dx", n, in.size());
      Matrix<float, Mem> ry("ry", n, in.size()), rdx("rdx", n, in.size());
      const bool b16 = layout_stores_bf16(layout);
      const auto x_in = b16 ? to_bf16(x, in, layout) : convert(x, in, layout, true);
      flatten.forward(Space(), x_in, y);
      flatten.backward(Space(), dy, dx);
      flatten.forward_r(Space(), x_in, ry);
      flatten.backward_r(Space(), dy, dy, rdx);
      // A permutation: exact, bf16 values widened exactly; dy rounded to nearest even.
      const auto expected_y = b16 ? bf16_values(x) : x;
      CHECK(max_diff_over_scale(y, expected_y) == 0);
      CHECK(max_diff_over_scale(ry, expected_y) == 0);
      if (b16) {
        const auto expected_dx = to_bf16(dy, in, layout);
        CHECK(same_bf16(dx, expected_dx, n * in.size()));
        CHECK(same_bf16(rdx, expected_dx, n * in.size()));
      } else {
        CHECK(max_diff_over_scale(convert(dx, in, layout, false), dy) == 0);
        CHECK(max_diff_over_scale(convert(rdx, in, layout, false), dy) == 0);
      }
      // Outside KAT's layout the matrices must hold the recorded input shape.
      Matrix<float, Mem> wrong("wrong", n, in.size() + 1);
      CHECK_THROWS_AS(flatten.forward(Space(), wrong, wrong), ShapeError);
      // Back in KAT's layout, y = x again.
      flatten.set_layouts(L::features, L::features);
      CHECK(flatten.passes_through());
      flatten.forward(Space(), x, y);
      CHECK(max_diff_over_scale(y, x) == 0);
    }
}

TEST_CASE("conv_dnn: in bf16 convolutions in oneDNN's layouts equal those in KAT's layout",
          "[conv2d][dnn][layouts][bf16]") {
  using L = ActivationLayout;
  if (!bf16_convolutions_offer(L::channels_last)) {
    return;
  }
  // The ResNet-14 shapes (the strided and 1x1 ones included) and channel counts that are no
  // multiple of 16, which channels_last takes and channels16 does not.
  for (const L layout : {L::channels_last, L::channels16})
    for (const std::size_t t :
         {std::size_t(2), std::size_t(3), std::size_t(4), std::size_t(5), std::size_t(9),
          std::size_t(10), std::size_t(12), std::size_t(14)}) {
      const Shape &c = shapes[t];
      INFO(c << " layout " << to_string(layout));
      auto dnn = make_conv(c, nn::Conv2dBackend::dnn);
      auto kat_layout = make_conv(c, nn::Conv2dBackend::dnn);
      const bool fits = layout_fits(layout, c.cin) && layout_fits(layout, c.cout);
      // fp32 computes in one of them (channels16, for multiples of 16 only, with AVX-512;
      // channels_last below it), bf16 in either.
      const L f32 = fp32_dnn_layout();
      CHECK(dnn->supports_layouts(L::channels_last, L::channels_last) == (f32 == L::channels_last));
      CHECK(dnn->supports_layouts(L::channels16, L::channels16) ==
            (f32 == L::channels16 && c.cin % 16 == 0 && c.cout % 16 == 0));
      dnn->set_precision(Precision::bf16);
      kat_layout->set_precision(Precision::bf16);
      if (!fits) {
        CHECK_FALSE(dnn->supports_layouts(layout, layout));
        continue;
      }
      REQUIRE(dnn->supports_layouts(layout, layout));
      REQUIRE(dnn->supports_layouts(L::features, layout));
      check_against_kat_layout(*dnn, *kat_layout, c, layout, layout, 5, 50 + t);
    }
}

TEST_CASE("conv_dnn: batch normalization in oneDNN's layouts equals KAT's kernels",
          "[dnn][layouts]") {
  using L = ActivationLayout;
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  for (const std::size_t c : {std::size_t(16), std::size_t(5)})
    for (const L layout : {L::channels16, L::channels_last}) {
      nn::BatchNorm<float, Mem> dnn_bn(c), kat_bn(c);
      const FeatureShape in{static_cast<int>(c), 3, 4};
      dnn_bn.output_shape(in);
      kat_bn.output_shape(in);
      INFO("channels " << c << " layout " << to_string(layout));
      if (!layout_fits(layout, c) || !kat::detail::dnn_reads_layout(layout)) {
        CHECK_FALSE(dnn_bn.supports_layouts(layout, layout));
        continue;
      }
      REQUIRE(dnn_bn.supports_layouts(layout, layout));
      CHECK_FALSE(dnn_bn.supports_layouts(L::features, layout));
      dnn_bn.set_layouts(layout, layout);
      auto b1 = bind_fresh<float>(dnn_bn, 3);
      auto b2 = bind_fresh<float>(kat_bn, 3);
      // γ and β away from 1 and 0.
      auto p = random_matrix<float>(b1.parameters().extent(0), 1, 70);
      Kokkos::deep_copy(b1.parameters(), Kokkos::subview(p, Kokkos::ALL(), 0));
      Kokkos::deep_copy(b2.parameters(), Kokkos::subview(p, Kokkos::ALL(), 0));
      const std::size_t n = 6;
      auto x = random_matrix<float>(n, in.size(), 71);
      auto dy = random_matrix<float>(n, in.size(), 72);
      Matrix<float, Mem> y1("y1", n, in.size()), y2("y2", n, in.size());
      Matrix<float, Mem> dx1("dx1", n, in.size()), dx2("dx2", n, in.size());
      dnn_bn.forward(Space(), convert(x, in, layout, true), y1);
      dnn_bn.backward(Space(), convert(dy, in, layout, true), dx1);
      kat_bn.forward(Space(), x, y2);
      kat_bn.backward(Space(), dy, dx2);
      CHECK(max_diff_over_scale(convert(y1, in, layout, false), y2) < 1e-5);
      CHECK(max_diff_over_scale(convert(dx1, in, layout, false), dx2) < 1e-5);
      CHECK(max_diff_over_scale(b1.gradients(), b2.gradients()) < 1e-5);
      CHECK(max_diff_over_scale(dnn_bn.running_mean(), kat_bn.running_mean()) < 1e-6);
      CHECK(max_diff_over_scale(dnn_bn.running_var(), kat_bn.running_var()) < 1e-6);
    }
}

TEST_CASE("conv_dnn: in bf16 ResNet-14 keeps bf16 activations between its layers",
          "[dnn][layouts][bf16]") {
  using L = ActivationLayout;
  const bool bf16_dnn = have_dnn && kat::detail::dnn_bf16_convolutions();
  // In the order oneDNN's bf16 convolutions compute in on this CPU: channels last with AMX,
  // nChw16c with AVX512-BF16 alone.
  const bool blocked = kat::detail::dnn_bf16_blocked();
  CHECK((bf16_dnn || !blocked));
  const L expected =
      bf16_dnn ? (blocked ? L::channels16_bf16 : L::channels_last_bf16) : L::features;
  INFO("bf16 convolutions " << bf16_dnn << ", in nChw16c " << blocked);
  const FeatureShape in{1, 28, 28};
  auto resnet = nn::models::resnet<float, Mem>(in, 10);
  resnet.compile(Space(), 3);
  resnet.set_precision(Precision::bf16);
  auto x = random_matrix<float>(4, in.size(), 5);
  resnet.forward(Space(), x);
  const std::size_t layers = resnet.layers().size();
  CHECK(resnet.layer(0).input_layout() == L::features);
  for (std::size_t i = 0; i + 2 < layers; ++i) {
    INFO("layer " << i << " " << resnet.layer(i).name());
    CHECK(resnet.layer(i).output_layout() == expected);
  }
  CHECK(resnet.layer(layers - 2).output_layout() == L::features); // global average pool
  // Inside the residual blocks too (their additions and ReLUs run on bf16 values).
  std::size_t inner = 0;
  for (nn::Layer<float, Mem> *l : resnet.layer(3).sublayers()) {
    INFO("block 1, sublayer " << inner++ << " " << l->name());
    CHECK(l->input_layout() == expected);
    CHECK(l->output_layout() == expected);
  }
  CHECK(inner >= 4);
  // Back to fp32: fp32_dnn_layout() again where oneDNN serves the space.
  resnet.set_precision(Precision::fp32);
  resnet.forward(Space(), x);
  CHECK(resnet.layer(0).output_layout() == (have_dnn ? fp32_dnn_layout() : L::features));
  for (nn::Layer<float, Mem> *l : resnet.layer(3).sublayers()) {
    CHECK(l->output_layout() == (have_dnn ? fp32_dnn_layout() : L::features));
  }
  // The CNN: conv, max-pool, ReLU, conv, max-pool, ReLU, flatten, dense, ...: bf16 values
  // from the first convolution's output to Flatten, which hands the dense layers fp32 in KAT's
  // order.
  auto cnn = nn::models::cnn<float, Mem>(in, 10);
  cnn.compile(Space(), 2);
  cnn.set_precision(Precision::bf16);
  cnn.forward(Space(), x);
  CHECK(cnn.layer(0).input_layout() == L::features);
  for (std::size_t i = 0; i < 6; ++i) {
    INFO("layer " << i << " " << cnn.layer(i).name());
    CHECK(cnn.layer(i).output_layout() == expected);
  }
  CHECK(cnn.layer(6).input_layout() == expected);
  CHECK(cnn.layer(6).output_layout() == L::features);
  CHECK(cnn.layer(6).passes_through() == (expected == L::features));
}

TEST_CASE("conv_dnn: in bf16 convolutions read and write bf16 activations",
          "[conv2d][dnn][layouts][bf16]") {
  using L = ActivationLayout;
  if (!bf16_convolutions_offer(L::channels_last_bf16)) {
    return;
  }
  // ResNet-14's stem (KAT's layout in), its 3x3, strided and 1x1 shapes, and channel counts
  // that are no multiple of 16 (channels_last_bf16 only). The reference is the same layer on
  // fp32 values in the same order, with the same bf16 operands (x and dy already bf16
  // values): y and dx then differ by their rounding to bf16 only, the weight gradients (fp32
  // in both) by summation order. With a fused ReLU, the backward masks dy by the sign of the
  // bf16 y (the sign survives rounding).
  for (const L layout : bf16_layouts)
    for (const bool relu : {false, true})
      for (const std::size_t t : {std::size_t(2), std::size_t(3), std::size_t(4), std::size_t(5),
                                  std::size_t(10), std::size_t(14)}) {
        const Shape &c = shapes[t];
        const L in_layout = t == 2 ? L::features : layout;
        const L order = fp32_order(layout);
        INFO(c << " input " << to_string(in_layout) << " output " << to_string(layout)
               << " fused ReLU " << relu);
        auto b16 = make_conv(c, nn::Conv2dBackend::dnn);
        auto ref = make_conv(c, nn::Conv2dBackend::dnn);
        const FeatureShape out = b16->output_shape(c.in());
        // Only in bf16: fp32 never stores activations in bf16.
        CHECK_FALSE(b16->supports_layouts(layout, layout));
        b16->set_precision(Precision::bf16);
        ref->set_precision(Precision::bf16);
        if (!layout_fits_bf16(layout, c.cout)) {
          CHECK_FALSE(b16->supports_layouts(in_layout, layout));
          continue;
        }
        REQUIRE(b16->supports_layouts(in_layout, layout));
        REQUIRE(b16->supports_layouts(in_layout, order));
        b16->set_layouts(in_layout, layout);
        ref->set_layouts(in_layout == L::features ? L::features : order, order);
        REQUIRE(b16->can_fuse_relu());
        b16->fuse_relu(relu);
        ref->fuse_relu(relu);
        auto b1 = bind_fresh<float>(*b16, 80 + t);
        auto b2 = bind_fresh<float>(*ref, 80 + t);
        const std::size_t n = 5;
        const auto x = bf16_values(random_matrix<float>(n, c.in().size(), 90 + t));
        const auto dy = bf16_values(random_matrix<float>(n, out.size(), 91 + t));
        Matrix<float, Mem> y1("y1", n, out.size()), y2("y2", n, out.size());
        Matrix<float, Mem> dx1("dx1", n, x.extent(1)), dx2("dx2", n, x.extent(1));
        const auto x_ref = in_layout == L::features ? x : convert(x, c.in(), order, true);
        b16->forward(Space(), in_layout == L::features ? x : to_bf16(x, c.in(), layout), y1);
        b16->backward(Space(), to_bf16(dy, out, layout), dx1);
        ref->forward(Space(), x_ref, y2);
        ref->backward(Space(), convert(dy, out, order, true), dx2);
        const auto y_ref = convert(y2, out, order, false);
        CHECK(excess_over_bf16_rounding(from_bf16(y1, out, layout), y_ref) < 1e-5);
        if (in_layout == L::features) {
          CHECK(max_diff_over_scale(dx1, dx2) < 1e-5); // dx in KAT's layout, fp32
        } else {
          CHECK(excess_over_bf16_rounding(from_bf16(dx1, c.in(), layout),
                                          convert(dx2, c.in(), order, false)) < 1e-5);
        }
        CHECK(max_diff_over_scale(b1.gradients(), b2.gradients()) < 1e-5);
      }
}

TEST_CASE("conv_dnn: in bf16 batch normalization reads and writes bf16 activations",
          "[dnn][layouts][bf16]") {
  using L = ActivationLayout;
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  for (const L layout : bf16_layouts)
    for (const std::size_t c : {std::size_t(16), std::size_t(5)})
      for (const bool relu : {false, true}) {
        INFO("channels " << c << " layout " << to_string(layout) << " fused ReLU " << relu);
        nn::BatchNorm<float, Mem> b16(c), kat_bn(c);
        const FeatureShape in{static_cast<int>(c), 3, 4};
        b16.output_shape(in);
        kat_bn.output_shape(in);
        CHECK_FALSE(b16.supports_layouts(layout, layout));
        b16.set_precision(Precision::bf16);
        if (!layout_fits_bf16(layout, static_cast<long long>(c))) {
          CHECK_FALSE(b16.supports_layouts(layout, layout));
          continue;
        }
        if (!bf16_primitives_offer(b16, layout)) {
          continue;
        }
        REQUIRE(b16.supports_layouts(layout, layout));
        CHECK_FALSE(b16.supports_layouts(layout, fp32_order(layout)));
        b16.set_layouts(layout, layout);
        b16.fuse_relu(relu);
        kat_bn.fuse_relu(relu);
        auto b1 = bind_fresh<float>(b16, 3);
        auto b2 = bind_fresh<float>(kat_bn, 3);
        auto p = random_matrix<float>(b1.parameters().extent(0), 1, 73);
        Kokkos::deep_copy(b1.parameters(), Kokkos::subview(p, Kokkos::ALL(), 0));
        Kokkos::deep_copy(b2.parameters(), Kokkos::subview(p, Kokkos::ALL(), 0));
        const std::size_t n = 6;
        const auto x = bf16_values(random_matrix<float>(n, in.size(), 74));
        const auto dy = bf16_values(random_matrix<float>(n, in.size(), 75));
        Matrix<float, Mem> y1("y1", n, in.size()), y2("y2", n, in.size());
        Matrix<float, Mem> dx1("dx1", n, in.size()), dx2("dx2", n, in.size());
        b16.forward(Space(), to_bf16(x, in, layout), y1);
        b16.backward(Space(), to_bf16(dy, in, layout), dx1);
        kat_bn.forward(Space(), x, y2);
        kat_bn.backward(Space(), dy, dx2);
        // The statistics in fp32 from the same values: y and dx are the fp32 results rounded.
        CHECK(excess_over_bf16_rounding(from_bf16(y1, in, layout), y2) < 1e-5);
        CHECK(excess_over_bf16_rounding(from_bf16(dx1, in, layout), dx2) < 1e-5);
        CHECK(max_diff_over_scale(b1.gradients(), b2.gradients()) < 1e-5);
        CHECK(max_diff_over_scale(b16.running_mean(), kat_bn.running_mean()) < 1e-6);
        CHECK(max_diff_over_scale(b16.running_var(), kat_bn.running_var()) < 1e-6);
      }
}

TEST_CASE("conv_dnn: ReLU residual sums and global average pooling on bf16 values",
          "[dnn][layouts][bf16]") {
  using L = ActivationLayout;
  for (const L layout : bf16_layouts) {
    // 5 channels (no multiple of 16) where channels_last_bf16 takes them, 16 for channels16.
    const FeatureShape in{layout_blocks16(layout) ? 16 : 5, 3, 2};
    INFO("layout " << to_string(layout) << " shape " << in);
    const std::size_t n = 4, count = n * in.size();
    // Values with ties to round (sums of two bf16 values need more than 8 bits) and zeros.
    auto x = bf16_values(random_matrix<float>(n, in.size(), 11));
    auto dy = bf16_values(random_matrix<float>(n, in.size(), 12));
    const auto x16 = to_bf16(x, in, layout), dy16 = to_bf16(dy, in, layout);
    const auto hx = to_host(convert(x, in, fp32_order(layout), true));
    const auto hdy = to_host(convert(dy, in, fp32_order(layout), true));
    const auto bf = [](double v) { return bfloat16::from_float(static_cast<float>(v)); };
    // Expected values in the layout's order, then stored as bf16 (every one exact in bf16 or
    // rounded once, as the kernels round).
    const auto expect = [&](auto f) {
      Matrix<float, Mem> e("expected", n, in.size());
      auto he = Kokkos::create_mirror_view(e);
      Kokkos::deep_copy(he, 0.0f);
      auto *b = reinterpret_cast<bfloat16 *>(he.data());
      for (std::size_t i = 0; i < count; ++i)
        b[i] = f(double(hx.data()[i]), double(hdy.data()[i]));
      Kokkos::deep_copy(e, he);
      return e;
    };
    {
      INFO("ReLU");
      nn::ReLU<float, Mem> relu;
      CHECK_FALSE(nn::GELU<float, Mem>().supports_layouts(layout, layout));
      REQUIRE(relu.supports_layouts(layout, layout));
      relu.set_layouts(layout, layout);
      Matrix<float, Mem> y("y", n, in.size()), dx("dx", n, in.size());
      relu.forward(Space(), x16, y);
      relu.backward(Space(), dy16, dx);
      CHECK(same_bf16(y, expect([&](double a, double) { return bf(a > 0 ? a : 0); }), count));
      CHECK(same_bf16(dx, expect([&](double a, double d) { return bf(a > 0 ? d : 0); }), count));
      Matrix<float, Mem> ry("ry", n, in.size());
      CHECK_THROWS_WITH(relu.forward_r(Space(), x16, ry), Catch::Contains(to_string(layout)));
    }
    for (const bool fused : {false, true}) {
      INFO("Residual with a ReLU body, identity shortcut, fused ReLU " << fused);
      nn::Residual<float, Mem> block(in);
      block.add<nn::ReLU>();
      CHECK_FALSE(block.supports_layouts(layout, layout));
      block.set_precision(Precision::bf16);
      REQUIRE(block.supports_layouts(layout, layout));
      block.set_layouts(layout, layout);
      block.fuse_relu(fused);
      Matrix<float, Mem> y("y", n, in.size()), dx("dx", n, in.size());
      block.forward(Space(), x16, y);
      block.backward(Space(), dy16, dx);
      // y = relu(x) + x rounded once (then the fused ReLU); dx = relu'(x) dy + dy, masked by
      // y > 0 when fused.
      const auto y_of = [&](double a) {
        const double v = bf(a > 0 ? a : 0).to_float() + a;
        return fused ? std::max(v, 0.0) : v;
      };
      CHECK(same_bf16(y, expect([&](double a, double) { return bf(y_of(a)); }), count));
      CHECK(same_bf16(dx, expect([&](double a, double d) {
                        const double g = fused && bf(y_of(a)).to_float() <= 0 ? 0 : d;
                        return bf((a > 0 ? g : 0) + g);
                      }),
                      count));
    }
    {
      INFO("global average pooling");
      nn::GlobalAvgPool2d<float, Mem> pool;
      pool.output_shape(in);
      CHECK_FALSE(pool.supports_layouts(layout, L::features));
      pool.set_precision(Precision::bf16);
      REQUIRE(pool.supports_layouts(layout, L::features));
      pool.set_layouts(layout, L::features);
      const std::size_t c = in.channels, plane = in.height * in.width;
      Matrix<float, Mem> y("y", n, c), dx("dx", n, in.size());
      auto g = random_matrix<float>(n, c, 13);
      pool.forward(Space(), x16, y);
      pool.backward(Space(), g, dx);
      const auto hy = to_host(y);
      const auto hg = to_host(g);
      const auto hxf = to_host(x);
      const auto hdx = to_host(from_bf16(dx, in, layout));
      for (std::size_t b = 0; b < n; ++b)
        for (std::size_t ch = 0; ch < c; ++ch) {
          double mean = 0;
          for (std::size_t k = 0; k < plane; ++k)
            mean += hxf(b, ch * plane + k);
          mean /= double(plane);
          CHECK(std::abs(hy(b, ch) - mean) <= 1e-6 * (1 + std::abs(mean)));
          for (std::size_t k = 0; k < plane; ++k)
            CHECK(hdx(b, ch * plane + k) == bf(hg(b, ch) / float(plane)).to_float());
        }
    }
  }
  // channels16_bf16 needs a multiple of 16 channels.
  nn::GlobalAvgPool2d<float, Mem> pool;
  pool.output_shape(FeatureShape{5, 3, 2});
  pool.set_precision(Precision::bf16);
  CHECK_FALSE(pool.supports_layouts(L::channels16_bf16, L::features));
  CHECK(pool.supports_layouts(L::channels_last_bf16, L::features));
}

// The oneDNN implementations (forward, backward) of ResNet-14's and the CNN's pooling, batch
// normalization and 5x5 convolution shapes in `layout`, on ExecSpace (a template, so that the
// DNN classes are instantiated only where they exist).
template <class ExecSpace> std::string onednn_implementations(ActivationLayout layout) {
  if constexpr (dnn_available<ExecSpace, float>()) {
    kat::Pool2dProblem pp;
    pp.batch = 128, pp.channels = 32, pp.height = pp.width = 28, pp.out_height = pp.out_width = 14;
    pp.kernel_h = pp.kernel_w = pp.stride_h = pp.stride_w = 2, pp.layout = layout;
    kat::BatchNormProblem bp;
    bp.batch = 128, bp.channels = 32, bp.plane = 14 * 14, bp.layout = layout;
    kat::Conv2dProblem cp;
    cp.batch = 128, cp.in_channels = 32, cp.out_channels = 64, cp.height = cp.width = 14;
    cp.out_height = cp.out_width = 14, cp.kernel_h = cp.kernel_w = 5, cp.pad_h = cp.pad_w = 2;
    cp.input_layout = cp.output_layout = layout;
    return "pooling " + kat::Pool2dDnn<ExecSpace, float>().implementations(pp) +
           "; batch normalization " + kat::BatchNormDnn<ExecSpace, float>().implementations(bp) +
           "; convolution " + kat::Conv2dDnn<ExecSpace, float>().implementations(cp);
  } else {
    return {};
  }
}

TEST_CASE(
    "conv_dnn: the fp32 layouts run on oneDNN's kernels for this CPU and not its reference ones",
    "[dnn][layouts]") {
  if (!have_dnn) {
    WARN("no vendor DNN library for this build's space: kat::dnn_available is false");
    return;
  }
  // oneDNN's f32 convolutions compute in nChw16c exactly where the CPU has AVX-512 (its
  // avx512_core: F, BW, DQ, VL; the tests do not cap oneDNN's ISA), in nChw8c on AVX2.
  if (std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr && std::getenv("DNNL_MAX_CPU_ISA") == nullptr) {
    CHECK(kat::detail::dnn_f32_blocked() == kat::detail::cpu_has_avx512());
  }
  // The layouts the layers offer in fp32 training run on kernels of oneDNN's own for the CPU
  // (below AVX-512, nChw16c has only "ref:any" ones, which made a CNN epoch 188 s on Zen 3).
  using L = ActivationLayout;
  for (const L layout : {L::channels16, L::channels_last}) {
    INFO("layout " << to_string(layout));
    nn::MaxPool2d<float, Mem> pool(2);
    pool.output_shape(FeatureShape{32, 28, 28});
    nn::BatchNorm<float, Mem> bn(32);
    bn.output_shape(FeatureShape{32, 14, 14});
    Conv conv(32, 64, 5, 1, 2);
    conv.output_shape(FeatureShape{32, 14, 14});
    const bool offered = pool.supports_layouts(layout, layout);
    CHECK(bn.supports_layouts(layout, layout) == offered);
    CHECK(conv.supports_layouts(layout, layout) == (layout == fp32_dnn_layout()));
    if (offered) {
      const std::string implementations = onednn_implementations<Space>(layout);
      INFO(implementations);
      CHECK(implementations.find("ref") == std::string::npos);
    }
  }
}

TEST_CASE("conv_dnn: in fp32 channels last oneDNN reads and writes the activations in place",
          "[conv2d][dnn][layouts]") {
  using L = ActivationLayout;
  if (!have_dnn || fp32_dnn_layout() != L::channels_last) {
    WARN("fp32 convolutions do not compute in channels_last here (no oneDNN, or AVX-512)");
    return;
  }
  // Every shape, on KAT's layout or channels last on the input side (a first convolution
  // reads the data loader's batch), channels last on the output side, against im2col in
  // KAT's layout. oneDNN takes x, y, dx and dy as they are (nhwc) where it has kernels of its
  // own for the shape; only the weights, and x in KAT's layout, are reordered.
  for (const L in_layout : {L::features, L::channels_last})
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const Shape &c = shapes[t];
      INFO(c << " input layout " << to_string(in_layout));
      auto dnn = make_conv(c, nn::Conv2dBackend::dnn);
      auto ref = make_conv(c, nn::Conv2dBackend::im2col);
      REQUIRE(dnn->supports_layouts(in_layout, L::channels_last));
      check_against_kat_layout(*dnn, *ref, c, in_layout, L::channels_last, 4, 80 + t);
      // The reorders: at most the weights (into the forward's and the backward-data pass's
      // layouts) and their gradient out, plus x in and dx out from and to KAT's layout, on the
      // CNN's and ResNet's shapes (the first ten), whose every pass oneDNN 2.6 serves in nhwc
      // on AVX2. In nChw8c there would be y out and dy in as well.
      if (t < 10) {
        const std::size_t activations = in_layout == L::features ? 2 : 0;
        CHECK(dnn->dnn_reorder_stats().reorders <= 3 + activations);
      }
    }
}

TEST_CASE("conv_dnn: the CNN keeps its activations blocked from the first convolution to Flatten",
          "[dnn][layouts]") {
  auto model = nn::models::cnn<float, Mem>(FeatureShape{1, 28, 28}, 10);
  model.compile(Space(), 2);
  auto x = random_matrix<float>(2, 784, 3);
  model.forward(Space(), x);
  const ActivationLayout blocked = have_dnn ? fp32_dnn_layout() : ActivationLayout::features;
  // conv, max-pool, ReLU, conv, max-pool, ReLU, flatten, dense, ReLU, dense
  for (std::size_t i = 0; i < 6; ++i) {
    INFO("layer " << i << " " << model.layer(i).name());
    CHECK(model.layer(i).output_layout() == blocked);
  }
  // Flatten gathers the last pooling's output into KAT's order for the dense layers.
  CHECK(model.layer(6).input_layout() == blocked);
  CHECK(model.layer(6).output_layout() == ActivationLayout::features);
  CHECK(model.layer(7).input_layout() == ActivationLayout::features);
  // Evaluation: pooling computes in KAT's layout, and so does everything up to it.
  model.eval();
  model.forward(Space(), x);
  CHECK(model.layer(6).input_layout() == ActivationLayout::features);
  CHECK(model.layer(6).passes_through());
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
