// TransformerEncoderBlock and models::vit: the block equals its two residuals computed by hand
// from its sublayers, its gradients and R-operator equal finite differences, K-FAC sees its four
// weight matrices per position, and a small ViT's Hessian-vector product equals the explicit
// Hessian.
#include "layer_check.hpp"
#include "r_operator_check.hpp"
#include "test_helpers.hpp"

#include <kat/core/parameter_buffer.hpp>
#include <kat/nn/hessian_vector_product.hpp>
#include <kat/nn/models.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/nn/transformer.hpp>
#include <kat/plan/folding.hpp>
#include <kat/plan/graph.hpp>
#include <kat/plan/megatron.hpp>
#include <kat/plan/search.hpp>
#include <kat/precond/kfac.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

namespace test_transformer {

using namespace kat;
using namespace kat::test;

// A managed copy of random values.
Vector<double, Mem> random_vector(std::size_t n, std::uint64_t seed) {
  const auto m = random_matrix<double>(n, 1, seed);
  Vector<double, Mem> v("v", n);
  Kokkos::deep_copy(v, Kokkos::subview(m, Kokkos::ALL(), 0));
  return v;
}
using Block = nn::TransformerEncoderBlock<double, Mem>;

nn::TransformerBlockOptions options(std::size_t heads, std::size_t hidden, bool causal = false) {
  nn::TransformerBlockOptions o;
  o.heads = heads;
  o.mlp_hidden = hidden;
  o.causal = causal;
  return o;
}

// y = f(x) for a standalone layer of the block (already bound), into a new matrix.
Matrix<double, Mem> apply(nn::Layer<double, Mem> &layer, FeatureShape in,
                          const Matrix<double, Mem> &x) {
  Matrix<double, Mem> y("y", x.extent(0), layer.output_shape(in).size());
  layer.forward(Space(), x, y);
  return y;
}

Matrix<double, Mem> add(const Matrix<double, Mem> &a, const Matrix<double, Mem> &b) {
  auto ha = to_host(a);
  auto hb = to_host(b);
  Matrix<double, Mem> c("c", a.extent(0), a.extent(1));
  auto hc = Kokkos::create_mirror_view(c);
  for (std::size_t i = 0; i < a.extent(0); ++i)
    for (std::size_t j = 0; j < a.extent(1); ++j)
      hc(i, j) = ha(i, j) + hb(i, j);
  Kokkos::deep_copy(c, hc);
  return c;
}

TEST_CASE("transformer block: output is x + Attn(LN(x)) then h + MLP(LN(h)) of its own "
          "sublayers",
          "[transformer]") {
  const FeatureShape in{6, 3, 2}; // 6 positions of width 6
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    Block block(in, options(3, 10, causal));
    auto buffer = bind_fresh<double>(block, 5);
    REQUIRE(block.parameter_count() ==
            2 * (2 * 6) + (6 * 18 + 18) + (6 * 6 + 6) + (6 * 10 + 10) + (10 * 6 + 6));
    const auto x = random_matrix<double>(3, in.size(), 6);
    Matrix<double, Mem> y("y", 3, in.size());
    block.forward(Space(), x, y);

    // The same computation, sublayer by sublayer (each tested on its own elsewhere).
    auto attn = block.attention().sublayers();
    auto mlp = block.mlp().sublayers();
    REQUIRE(attn.size() == 4);
    REQUIRE(mlp.size() == 4);
    CHECK(attn[2]->name() == "ScaledDotProductAttention");
    CHECK(mlp[2]->name() == "GELU");
    const FeatureShape qkv{18, 3, 2}, hidden{10, 3, 2};
    auto t = apply(*attn[0], in, x);
    t = apply(*attn[1], in, t);
    t = apply(*attn[2], qkv, t);
    t = apply(*attn[3], in, t);
    const auto h = add(x, t);
    auto u = apply(*mlp[0], in, h);
    u = apply(*mlp[1], in, u);
    u = apply(*mlp[2], hidden, u);
    u = apply(*mlp[3], hidden, u);
    const auto expected = add(h, u);
    CHECK(max_diff_over_scale(y, expected) < 1e-14);
  }
}

TEST_CASE("transformer block: gradients and R-operator equal finite differences",
          "[transformer][gradcheck]") {
  SECTION("two heads, 3 x 2 positions") {
    Block block(FeatureShape{4, 3, 2}, options(2, 8));
    check_layer_gradients(block, FeatureShape{4, 3, 2}, 3, 11);
  }
  SECTION("causal, one head, a sequence of 4") {
    Block block(FeatureShape{3, 4, 1}, options(1, 5, true));
    check_layer_gradients(block, FeatureShape{3, 4, 1}, 2, 12);
  }
  SECTION("R-operator") {
    Block block(FeatureShape{4, 3, 1}, options(2, 6));
    REQUIRE(block.supports_r_operator());
    check_layer_r_operator(block, FeatureShape{4, 3, 1}, 2, 13);
  }
}

TEST_CASE("transformer block: parameter names and accumulate versus overwrite", "[transformer]") {
  Block block(FeatureShape{4, 2, 1}, options(2, 8));
  const auto specs = block.parameter_specs();
  REQUIRE(specs.size() == 12);
  CHECK(specs[0].name == "attention.body.0.weight");
  CHECK(specs[2].name == "attention.body.1.weight");
  CHECK(specs[2].shape == std::vector<std::size_t>{12, 4});
  CHECK(specs[6].name == "mlp.body.0.weight");
  CHECK(specs.back().name == "mlp.body.3.bias");
  CHECK(specs.back().offset + specs.back().size() == block.parameter_count());

  auto buffer = bind_fresh<double>(block, 3);
  const auto x = random_matrix<double>(2, 8, 4);
  const auto dy = random_matrix<double>(2, 8, 5);
  Matrix<double, Mem> y("y", 2, 8), dx("dx", 2, 8);
  block.forward(Space(), x, y);
  block.accumulate_gradients(false);
  block.backward(Space(), dy, dx);
  const auto once = to_host(buffer.gradients());
  block.accumulate_gradients(true);
  block.backward(Space(), dy, dx);
  const auto twice = to_host(buffer.gradients());
  for (std::size_t k = 0; k < once.extent(0); ++k)
    CHECK(twice(k) == Approx(2 * once(k)).margin(1e-14));
}

TEST_CASE("transformer block: K-FAC sees its four Dense layers per position", "[transformer]") {
  const std::size_t n = 3, positions = 4;
  nn::Sequential<double, Mem> model(FeatureShape{4, 4, 1});
  model.add<nn::TransformerEncoderBlock>(FeatureShape{4, 4, 1}, options(2, 8));
  model.compile(Space(), 7);
  precond::KFAC<double, Mem> kfac;
  CHECK(kfac.register_model(model) == 4);
  CHECK(kfac.size() == 4);
  for (auto *residual : model.layers()[0]->sublayers())
    for (auto *layer : residual->sublayers())
      if (layer->supports_curvature())
        layer->record_curvature(true);
  const auto x = random_matrix<double>(n, 16, 8);
  const auto &y = model.forward(Space(), x);
  const auto dy = random_matrix<double>(n, y.extent(1), 9);
  model.backward(Space(), dy);
  for (auto *residual : model.layers()[0]->sublayers())
    for (auto *layer : residual->sublayers())
      if (layer->supports_curvature()) {
        const auto rec = layer->curvature();
        CHECK(rec.samples == n);
        CHECK(rec.a.extent(0) == n * positions);
        CHECK(rec.g.extent(0) == n * positions);
      }
}

TEST_CASE("transformer block: bad options name the values", "[transformer][errors]") {
  CHECK_THROWS_WITH(Block(FeatureShape{6, 2, 2}, options(4, 8)),
                    Catch::Contains("heads must divide the width D = 6, got heads = 4"));
  CHECK_THROWS_WITH(Block(FeatureShape{6, 2, 2}, options(0, 8)), Catch::Contains("got heads = 0"));
  Block block(FeatureShape{4, 2, 2}, options(2, 0));
  CHECK(block.options().mlp_hidden == 16); // 0 means 4·D
  CHECK_THROWS_WITH(block.output_shape(FeatureShape{4, 4, 1}),
                    Catch::Contains("input shape must be (4, 2, 2), got (4, 4, 1)"));
  nn::models::VitOptions o;
  o.patch = {5, 5};
  const auto make = [&] { return nn::models::vit<double, Mem>(FeatureShape{1, 28, 28}, 10, o); };
  CHECK_THROWS_WITH(make(), Catch::Contains("the patch (5, 5) must divide the image (28, 28)"));
}

TEST_CASE("vit: token shapes and an exact Hessian-vector product", "[transformer][vit][hvp]") {
  // 8x8 images, 4x4 patches: 4 tokens of width 4, one block with 2 heads, MLP 6.
  nn::models::VitOptions o;
  o.patch = {4, 4};
  o.width = 4;
  o.depth = 1;
  o.heads = 2;
  o.mlp_hidden = 6;
  auto model = nn::models::vit<double, Mem>(FeatureShape{1, 8, 8}, 3, o);
  REQUIRE(model.layers().size() == 6);
  CHECK(model.layers()[0]->output_shape(FeatureShape{1, 8, 8}) == FeatureShape{4, 2, 2});
  CHECK(model.output_shape() == FeatureShape{3});
  model.compile(Space(), 31);
  REQUIRE(model.supports_r_operator());
  const Space space;
  const nn::SoftmaxCrossEntropy<double, Mem> loss;
  const auto x = random_matrix<double>(3, 64, 32, -1, 1);
  const auto targets = labels_of({0, 2, 1});
  const std::size_t n = model.parameter_count();
  const auto hessian = explicit_hessian(model, loss, x, targets);
  nn::CurvatureVectorProduct<double, Mem, nn::SoftmaxCrossEntropy<double, Mem>> product;
  Vector<double, Mem> hv("hv", n);
  const auto v = random_vector(n, 33);
  product.apply(space, model, loss, x, targets, v, hv);
  CHECK(scaled_error(host_values(hv), multiply(hessian, host_values(v))) < 1e-6);

  // The rows-as-tokens variant: 8 tokens of one image row each.
  o.patch = {1, 8};
  auto rows = nn::models::vit<double, Mem>(FeatureShape{1, 8, 8}, 3, o);
  CHECK(rows.layers()[0]->output_shape(FeatureShape{1, 8, 8}) == FeatureShape{4, 8, 1});
}

TEST_CASE("vit: describe gives the plan graph named by layer paths that folds into one block",
          "[transformer][vit][plan]") {
  nn::models::VitOptions o;
  o.patch = {7, 7}; // 16 tokens
  o.width = 8;
  o.depth = 3;
  o.heads = 4;
  o.mlp_hidden = 16;
  const auto model = nn::models::vit<float, Mem>(FeatureShape{1, 28, 28}, 10, o);
  const plan::Graph g = model.describe(32);
  CHECK(g.dtype_bytes() == 4);
  // Conv2d, PositionEmbedding, 3 x (4 + Add + 4 + Add), LayerNorm, GlobalAvgPool2d, Dense.
  REQUIRE(g.operators().size() == 2 + 3 * 10 + 3);
  const auto &qkv = g.op(g.find("2.attention.body.1"));
  CHECK(qkv.type == "Dense");
  CHECK(qkv.scope == "2.attention.body");
  CHECK(qkv.integer("in") == 8);
  CHECK(qkv.integer("out") == 24);
  CHECK(qkv.integer("positions") == 16);
  CHECK(qkv.integer("bias") == 1);
  CHECK(g.tensor(qkv.inputs[0]).shape == plan::Shape{32, 16, 8});
  const auto &attention = g.op(g.find("3.attention.body.2"));
  CHECK(attention.type == "Attention");
  CHECK(attention.integer("heads") == 4);
  CHECK(attention.integer("head_dim") == 2);
  CHECK(attention.integer("causal") == 0);
  CHECK(g.op(g.find("4.mlp.body.2")).type == "GELU");
  CHECK(g.op(g.find("4.mlp.add")).type == "Add");
  CHECK(g.op(g.find("4.mlp.add")).inputs.size() == 2);
  CHECK(g.op(g.find("5")).type == "LayerNorm");
  const auto &head = g.op(g.find("7"));
  CHECK(head.type == "Dense");
  CHECK(head.integer("positions") == 1);
  CHECK(g.tensor(head.inputs[0]).shape == plan::Shape{32, 8});
  std::int64_t parameters = 0;
  for (const auto &t : g.tensors())
    if (t.parameter)
      parameters += plan::numel(t.shape);
  CHECK(parameters == static_cast<std::int64_t>(model.parameter_count()));

  const plan::Folding f = plan::fold(g);
  CHECK(f.depth == 1);
  REQUIRE(f.unique.size() == 1);
  CHECK(f.instances.size() == 3);
  CHECK(f.loose_operators == 5);
  const auto megatron = plan::megatron_strategies(g);
  CHECK(megatron[g.find("3.attention.body.1")] == "column");
  CHECK(megatron[g.find("3.attention.body.2")] == "heads");
  CHECK(megatron[g.find("3.attention.body.3")] == "row");
  CHECK(megatron[g.find("3.mlp.body.1")] == "column");
  CHECK(megatron[g.find("3.mlp.body.3")] == "row");
  CHECK(megatron[g.find("7")] == "replicated");
  // Where arithmetic is slow, splitting everything would pay; the executor's filter keeps the
  // splits inside the blocks' attention and MLP.
  plan::CostModel cm;
  cm.cluster = plan::mpi_local_cluster();
  cm.cluster.flop_rate = 1e3;
  cm.mesh = {1, 2};
  plan::SearchOptions so;
  so.allowed = plan::megatron_executor_allows;
  const plan::Plan p = plan::search(g, cm, so);
  for (const auto &op : p.operators) {
    INFO(op.name << " " << op.strategy);
    const std::string &scope = g.op(g.find(op.name)).scope;
    const bool in_body = scope.find(".attention.body") != std::string::npos ||
                         scope.find(".mlp.body") != std::string::npos;
    if (!in_body || op.type == "LayerNorm")
      CHECK(op.strategy == "replicated");
  }
  CHECK(p.at("3.attention.body.1").strategy == "column");
  CHECK(p.at("3.mlp.body.3").strategy == "row");
  plan::SearchOptions unfiltered;
  unfiltered.disabled = {"batch"};
  CHECK(plan::search(g, cm, unfiltered).at("1").strategy == "sharded"); // what the filter stops
  CHECK_THROWS_WITH(model.describe(0), Catch::Contains("batch must be >= 1, got 0"));
}

} // namespace test_transformer
