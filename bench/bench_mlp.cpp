// Benchmarks for the foundation: the Dense layer against the GEMMs it calls, and one SGD
// epoch of the Fashion-MNIST MLP (784-256-256-10, batch 128) against the GEMM-only floor.
//
// Ratios are measured inside one benchmark, interleaving the two timings each iteration,
// because the machines are shared and noisy.
#include "common.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <filesystem>
#include <vector>

namespace {

using namespace kat::bench;

// The three GEMMs of one Dense forward + backward (dx included): y = x Wᵀ, dW += dyᵀ x,
// dx = dy W.
struct DenseGemms {
  M x, w, y, dy, dw, dx;
  DenseGemms(std::size_t n, std::size_t in, std::size_t out)
      : x(filled(n, in, 1)), w(filled(out, in, 2)), y("y", n, out), dy(filled(n, out, 3)),
        dw("dw", out, in), dx("dx", n, in) {}
  void run(const Space &s) const {
    kat::gemm(s, kat::Trans::N, kat::Trans::T, 1.f, x, w, 0.f, y);
    kat::gemm(s, kat::Trans::T, kat::Trans::N, 1.f, dy, x, 1.f, dw);
    kat::gemm(s, kat::Trans::N, kat::Trans::N, 1.f, dy, w, 0.f, dx);
  }
};

// Dense forward+backward (bias, dx) vs the same three GEMMs, timed alternately.
void BM_DenseForwardBackward(benchmark::State &state) {
  const std::size_t n = state.range(0), in = state.range(1), out = state.range(2);
  const Space space;
  kat::ParameterBuffer<float, Mem> buffer;
  kat::nn::Dense<float, Mem> layer(in, out);
  buffer.reserve("dense", layer.parameter_count());
  buffer.allocate();
  layer.bind(buffer.parameters().data(), buffer.gradients().data());
  layer.reset_parameters(space, 1);
  const M x = filled(n, in, 4), dy = filled(n, out, 5);
  M y("y", n, out), dx("dx", n, in);
  const DenseGemms gemms(n, in, out);
  time_against_gemms(
      state, 3.0 * 2.0 * double(n) * double(in) * double(out),
      [&] {
        layer.forward(space, x, y);
        layer.backward(space, dy, dx);
      },
      [&] { gemms.run(space); });
}
BENCHMARK(BM_DenseForwardBackward)
    ->ArgNames({"batch", "in", "out"})
    ->Args({128, 784, 256})
    ->Args({128, 256, 256})
    ->Args({128, 256, 10})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The Dense layers' shapes the precision benchmarks run: the ViT's token matrices (N·P = 128 ·
// 16 rows; its layers 64 -> 192, 64 -> 64, 64 -> 128, 128 -> 64) and the MLP's first layer.
void dense_layer_shapes(benchmark::internal::Benchmark *b) {
  using Shape = std::array<std::int64_t, 3>;
  constexpr std::array<Shape, 5> shapes{
      {{2048, 64, 192}, {2048, 64, 64}, {2048, 64, 128}, {2048, 128, 64}, {128, 784, 256}}};
  b->ArgNames({"rows", "in", "out"});
  for (const Shape &shape : shapes) {
    b->Args({shape[0], shape[1], shape[2]});
  }
}

// Binds two Dense layers to blocks of `buffer` (named as given) and gives both the same
// parameters (seed 1): the two sides of a comparison.
void bind_pair(kat::ParameterBuffer<float, Mem> &buffer, const Space &space,
               kat::nn::Dense<float, Mem> &a, const char *a_name, kat::nn::Dense<float, Mem> &b,
               const char *b_name) {
  const std::size_t blocks[2] = {buffer.reserve(a_name, a.parameter_count()),
                                 buffer.reserve(b_name, b.parameter_count())};
  buffer.allocate();
  a.bind(buffer.parameter_vector(blocks[0]).data(), buffer.gradient_vector(blocks[0]).data());
  b.bind(buffer.parameter_vector(blocks[1]).data(), buffer.gradient_vector(blocks[1]).data());
  a.reset_parameters(space, 1);
  b.reset_parameters(space, 1);
}

// A Dense layer's forward + backward (bias, dx) in fp32 and in bf16 (Precision::bf16), and
// the three products each makes alone: kat::gemm in fp32, MixedPrecisionGemm on operands
// rounded beforehand (kat::Bf16Operand, as the layer reuses them) in bf16. The four run
// alternately in every iteration, so their ratios come from one run. The timed iteration is
// the bf16 layer's. Counters (microseconds per forward + backward): fp32_layer_us,
// bf16_layer_us, fp32_gemm_us, bf16_gemm_us; layer_speedup = fp32 layer / bf16 layer and
// gemm_speedup = fp32 products / bf16 products: how much of the bf16 products' gain the layer
// keeps (rounding x and dy, the bias, the calls). Shapes: dense_layer_shapes.
void BM_DensePrecision(benchmark::State &state) {
  const std::size_t n = state.range(0), in = state.range(1), out = state.range(2);
  const Space space;
  kat::ParameterBuffer<float, Mem> buffer;
  kat::nn::Dense<float, Mem> fp32(in, out), bf16(in, out);
  bind_pair(buffer, space, fp32, "fp32", bf16, "bf16");
  bf16.set_precision(kat::Precision::bf16);
  const M x = filled(n, in, 4), dy = filled(n, out, 5);
  M y("y", n, out), dx("dx", n, in);
  const DenseGemms gemms(n, in, out);
  kat::MixedPrecisionGemm<float, Mem> product;
  kat::Bf16Operand<float, Mem> x16, w16, dy16;
  x16.assign(space, gemms.x);
  w16.assign(space, gemms.w);
  dy16.assign(space, gemms.dy);
  using kat::Trans;
  const auto bf16_products = [&] {
    product(space, Trans::N, Trans::T, 1.f, x16, w16, 0.f, gemms.y);
    product(space, Trans::T, Trans::N, 1.f, dy16, x16, 1.f, gemms.dw);
    product(space, Trans::N, Trans::N, 1.f, dy16, w16, 0.f, gemms.dx);
  };
  const auto layer_step = [&](kat::nn::Dense<float, Mem> &layer) {
    return [&] {
      layer.forward(space, x, y);
      layer.backward(space, dy, dx);
    };
  };
  for (int i = 0; i < 3; ++i) { // plans, workspaces
    layer_step(fp32)();
    layer_step(bf16)();
    bf16_products();
  }
  double fp32_layer_s = 0, bf16_layer_s = 0, fp32_gemm_s = 0, bf16_gemm_s = 0;
  for (auto _ : state) {
    fp32_layer_s += fenced_seconds(space, layer_step(fp32));
    fp32_gemm_s += fenced_seconds(space, [&] { gemms.run(space); });
    bf16_gemm_s += fenced_seconds(space, bf16_products);
    const double this_s = fenced_seconds(space, layer_step(bf16));
    bf16_layer_s += this_s;
    state.SetIterationTime(this_s);
  }
  const double us = 1e6 / double(state.iterations());
  state.counters["fp32_layer_us"] = fp32_layer_s * us;
  state.counters["bf16_layer_us"] = bf16_layer_s * us;
  state.counters["fp32_gemm_us"] = fp32_gemm_s * us;
  state.counters["bf16_gemm_us"] = bf16_gemm_s * us;
  state.counters["layer_speedup"] = fp32_layer_s / bf16_layer_s;
  state.counters["gemm_speedup"] = fp32_gemm_s / bf16_gemm_s;
}
BENCHMARK(BM_DensePrecision)
    ->Apply(dense_layer_shapes)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The two ways a bf16 Dense layer can handle its bias, on the layer's shapes, each product
// alternately with its counterpart (time_alternately; the timed iteration is the first):
//   in_product: forward rounds [x 1] and computes y = [x 1] [W b]ᵀ, an inner dimension of
//               in + 1; the weight gradient is [dW db] = dyᵀ [x 1], in + 1 columns (what
//               kat::nn::Dense does since commits ec6e3eb and 344c0b2);
//   separate:   forward rounds x, writes b into every row of y (fill_rows) and adds
//               y += x Wᵀ (oneDNN's sum post-op), an inner dimension of in; the weight gradient
//               is dW = dyᵀ x and db the fp32 column sums of dy (Dense's path before).
// dy is rounded in both (the layer rounds it once for dW and dx). On AVX512-BF16 the extra
// column costs one more pair of a dot product's 32; on AMX, whose tiles take the inner
// dimension 32 bf16 values at a time and the output 16 columns at a time, in = 64 becomes 65:
// three tile steps for two in forward, five column tiles for four in the weight gradient.
// This benchmark is the check that the bias in the products is not slower there. Counters
// (µs): forward_in_product_us, forward_separate_us, gradient_in_product_us,
// gradient_separate_us; forward_speedup and gradient_speedup = separate / in_product (above
// 1: the bias in the product is faster). The label names the kernels oneDNN chose for the two
// forward products (`in_product | separate`).
void BM_Bf16BiasPaths(benchmark::State &state) {
  const std::size_t n = state.range(0), in = state.range(1), out = state.range(2);
  const Space space;
  const M x = filled(n, in, 1), weight_bias = filled(out, in + 1, 2), dy = filled(n, out, 3);
  const auto w = Kokkos::subview(weight_bias, Kokkos::ALL, std::make_pair(std::size_t(0), in));
  const auto b = Kokkos::subview(weight_bias, Kokkos::ALL, in);
  M y_product("y_product", n, out), y_separate("y_separate", n, out);
  M grad_product("grad_product", out, in + 1), grad_separate("grad_separate", out, in + 1);
  const auto dw = Kokkos::subview(grad_separate, Kokkos::ALL, std::make_pair(std::size_t(0), in));
  const auto db = Kokkos::subview(grad_separate, Kokkos::ALL, in);
  kat::MixedPrecisionGemm<float, Mem> product, separate;
  kat::Bf16Operand<float, Mem> x1_16, wb16, x16, w16, dy16;
  wb16.assign(space, weight_bias); // rounded once per forward either way: not timed
  w16.assign(space, w);
  using kat::Trans;
  const auto forward_in_product = [&] {
    x1_16.assign_with_ones_column(space, x);
    product(space, Trans::N, Trans::T, 1.f, x1_16, wb16, 0.f, y_product);
  };
  const auto forward_separate = [&] {
    x16.assign(space, x);
    kat::nn::detail::fill_rows(space, "BM_Bf16BiasPaths::fill", b, y_separate);
    separate(space, Trans::N, Trans::T, 1.f, x16, w16, 1.f, y_separate);
  };
  const auto gradient_in_product = [&] {
    dy16.assign(space, dy);
    product(space, Trans::T, Trans::N, 1.f, dy16.matrix(), x1_16.matrix(), 0.f, grad_product);
  };
  const auto gradient_separate = [&] {
    dy16.assign(space, dy);
    separate(space, Trans::T, Trans::N, 1.f, dy16.matrix(), x16.matrix(), 0.f, dw);
    kat::nn::detail::column_sums(space, "BM_Bf16BiasPaths::db", dy, db, false);
  };
  const auto forward_label = [&] {
    forward_in_product();
    forward_separate();
    return product.implementation() + " | " + separate.implementation();
  };
  const std::string label = forward_label();
  for (int i = 0; i < 3; ++i) { // plans, workspaces
    forward_in_product();
    gradient_in_product();
    forward_separate();
    gradient_separate();
  }
  const auto [f_product, g_product, f_separate, g_separate] = time_alternately(
      state, forward_in_product, gradient_in_product, forward_separate, gradient_separate);
  state.counters["forward_in_product_us"] = 1e6 * f_product;
  state.counters["forward_separate_us"] = 1e6 * f_separate;
  state.counters["gradient_in_product_us"] = 1e6 * g_product;
  state.counters["gradient_separate_us"] = 1e6 * g_separate;
  state.counters["forward_speedup"] = f_separate / f_product;
  state.counters["gradient_speedup"] = g_separate / g_product;
  state.SetLabel(label);
}
BENCHMARK(BM_Bf16BiasPaths)
    ->Apply(dense_layer_shapes)
    ->Args({128, 256, 256})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// A bf16 Dense layer's backward in two calls, dx first (kat::distributed::ColumnParallelDense
// starts the all-reduce of dx between them), as it ran before 2026-12-03 (backward() for dx
// with compute_parameter_gradients(false), then again for the parameter gradients: dy rounded
// to bf16 twice) and as it runs now (backward_input(), backward_parameters(): rounded once),
// alternately, each layer on its own operands. The timed iteration is the two calls'.
// Counters (µs): two_calls_us, twice_rounded_us; speedup = twice_rounded / two_calls. Shapes:
// dense_layer_shapes, and a tensor-parallel shard (2048 token rows, 512 -> 1024 of 2048).
void BM_DenseBackwardInTwoCalls(benchmark::State &state) {
  const std::size_t n = state.range(0), in = state.range(1), out = state.range(2);
  const Space space;
  kat::ParameterBuffer<float, Mem> buffer;
  kat::nn::Dense<float, Mem> two_calls(in, out), twice_rounded(in, out);
  bind_pair(buffer, space, two_calls, "two_calls", twice_rounded, "twice_rounded");
  const M x = filled(n, in, 4), dy = filled(n, out, 5), x2 = filled(n, in, 4),
          dy2 = filled(n, out, 5);
  M y("y", n, out), dx("dx", n, in), y2("y2", n, out), dx2("dx2", n, in);
  two_calls.set_precision(kat::Precision::bf16);
  twice_rounded.set_precision(kat::Precision::bf16);
  two_calls.forward(space, x, y);
  twice_rounded.forward(space, x2, y2);
  const auto split = [&] {
    two_calls.backward_input(space, dy, dx);
    two_calls.backward_parameters(space, dy);
  };
  const auto before = [&] {
    twice_rounded.compute_parameter_gradients(false);
    twice_rounded.backward(space, dy2, dx2);
    twice_rounded.compute_parameter_gradients(true);
    twice_rounded.backward(space, dy2, M());
  };
  for (int i = 0; i < 3; ++i) { // plans, workspaces
    split();
    before();
  }
  const auto [split_s, before_s] = time_alternately(state, split, before);
  state.counters["two_calls_us"] = 1e6 * split_s;
  state.counters["twice_rounded_us"] = 1e6 * before_s;
  state.counters["speedup"] = before_s / split_s;
}
BENCHMARK(BM_DenseBackwardInTwoCalls)
    ->Apply(dense_layer_shapes)
    ->Args({2048, 512, 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Runs `product` and `sgemm` three times (plans, first touch), then times them alternately
// (time_alternately; the timed iteration is `product`'s). Sets the counters `name` (product's
// µs), sgemm_us and speedup = sgemm / product; returns product's seconds.
template <class Product, class Sgemm>
double time_against_sgemm(benchmark::State &state, const char *name, const Product &product,
                          const Sgemm &sgemm) {
  for (int i = 0; i < 3; ++i) {
    product();
    sgemm();
  }
  const auto [product_s, sgemm_s] = time_alternately(state, product, sgemm);
  state.counters[name] = 1e6 * product_s;
  state.counters["sgemm_us"] = 1e6 * sgemm_s;
  state.counters["speedup"] = sgemm_s / product_s;
  return product_s;
}

// A float weight gradient dW = dyᵀ x (kat::gemm with Trans::T, Trans::N; m = out, n = in,
// k = the batch rows) as kat::gemm computes it, against oneDNN's dnnl_sgemm called directly
// (kat::gemm's path for these products before they went to oneDNN's matmul primitive;
// kat/core/detail/matmul_f32_onednn.hpp), alternately (time_alternately). The timed iteration
// is kat::gemm's. Counters: kat_us, sgemm_us, speedup = sgemm / kat, kat_GFLOPs. Shapes: the
// ViT's Dense layers (2048 token rows), the MLP's and the CNN's dense layers (batch 128), one
// im2col weight gradient (ResNet-14's 16 -> 16 3x3 convolution: 16 x 144, 100,352 rows), and
// layers over a batch two to four times as long as they are wide (256 and 512 wide from 1024
// rows, 64 x 256 from 512).
void BM_GemmWeightGradient(benchmark::State &state) {
  const std::size_t m = state.range(0), n = state.range(1), k = state.range(2);
  const Space space;
  // Each product has its own copies of the operands and the result: run on the same ones, the
  // second of the two found them in cache, which favoured it by up to 20 % at the shapes with
  // k = 128 (either way round).
  const M dy = filled(k, m, 3), x = filled(k, n, 1), dy2 = filled(k, m, 3), x2 = filled(k, n, 1);
  M dw("dw", m, n), dw2("dw2", m, n);
  const auto kat_product = [&] {
    kat::gemm(space, kat::Trans::T, kat::Trans::N, 1.f, dy, x, 0.f, dw);
  };
#if defined(KAT_ENABLE_ONEDNN)
  const auto sgemm = [&] {
    kat::detail::onednn_sgemm('T', 'N', m, n, k, 1.f, dy2.data(), dy2.stride(1), x2.data(),
                              x2.stride(1), 0.f, dw2.data(), dw2.stride(1));
  };
#else
  const auto sgemm = kat_product; // no oneDNN: the same product twice
#endif
  const double kat_s = time_against_sgemm(state, "kat_us", kat_product, sgemm);
  state.counters["kat_GFLOPs"] = 2.0 * double(m * n * k) / kat_s * 1e-9;
}
BENCHMARK(BM_GemmWeightGradient)
    ->ArgNames({"m", "n", "k"})
    ->Args({192, 64, 2048})
    ->Args({64, 64, 2048})
    ->Args({128, 64, 2048})
    ->Args({64, 128, 2048})
    ->Args({256, 784, 128})
    ->Args({256, 256, 128})
    ->Args({10, 256, 128})
    ->Args({256, 3136, 128})
    ->Args({16, 144, 100352})
    ->Args({256, 256, 1024})
    ->Args({512, 512, 1024})
    ->Args({64, 256, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

#if defined(KAT_ENABLE_ONEDNN)
// The check of kat::gemm's rule for float Aᵀ B (onednn_f32_matmul_preferred) on another CPU:
// oneDNN's matmul primitive (the plan kat::gemm runs) against dnnl_sgemm at shapes on both sides
// of the rule's bounds, each on its own operands, alternately (time_alternately; the timed
// iteration is the primitive's). Counters: matmul_us, sgemm_us, speedup = sgemm / matmul, and
// preferred = 1 where the rule takes the primitive: a CPU that agrees with the rule shows
// speedup >= 1 where preferred is 1 (docs/benchmarks.md, "Weight gradients over a batch two to
// eight times the layer's width"). Skipped where oneDNN has no brg kernel (no AVX-512).
void BM_GemmAtBPaths(benchmark::State &state) {
  const std::size_t m = state.range(0), n = state.range(1), k = state.range(2);
  kat::detail::MatmulProblem p;
  p.trans_a = 'T';
  p.m = m, p.n = n, p.k = k, p.lda = k, p.ldb = k, p.ldc = m;
  p.threads = std::size_t(Space().concurrency());
  kat::detail::OnednnF32MatmulPlan plan(p);
  if (!plan.usable()) {
    state.SkipWithError("oneDNN has no brg kernel for this product on this CPU");
    return;
  }
  const M a = filled(k, m, 3), b = filled(k, n, 1), a2 = filled(k, m, 3), b2 = filled(k, n, 1);
  M c("c", m, n), c2("c2", m, n);
  const auto primitive = [&] { plan.run(a.data(), b.data(), c.data()); };
  const auto sgemm = [&] {
    kat::detail::onednn_sgemm('T', 'N', m, n, k, 1.f, a2.data(), k, b2.data(), k, 0.f, c2.data(),
                              m);
  };
  time_against_sgemm(state, "matmul_us", primitive, sgemm);
  state.counters["preferred"] = kat::detail::onednn_f32_matmul_preferred('T', 'N', m, n, k);
}
BENCHMARK(BM_GemmAtBPaths)
    ->ArgNames({"m", "n", "k"})
    ->Args({192, 64, 2048})  // k >= 8 max: the ViT's QKV weights
    ->Args({256, 256, 1024}) // 2 to 8 max, both sides >= 16
    ->Args({512, 64, 2048})
    ->Args({64, 256, 512})
    ->Args({128, 128, 256})
    ->Args({1024, 1024, 2048})
    ->Args({32, 32, 64})   // m n k below 2^17
    ->Args({10, 256, 512}) // a side of 10
    ->Args({10, 256, 1024})
    ->Args({32, 32, 32}) // k from 1 to 2 max
    ->Args({512, 512, 512})
    ->Args({1024, 128, 1024})
    ->Args({1024, 1024, 1024})
    ->Args({256, 784, 128}) // k below max: the MLP's weight gradient
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
#endif

// GELU's training forward (y = x Φ(x) and GELU'(x) kept for backward) on the ViT MLP's hidden
// activations (N·P = 128 · 16 rows, 128 features), against its backward, dx = GELU'(x) ⊙ dy: a
// pass over the same three matrices without Φ or φ, the floor of a kernel limited by memory
// traffic. Both run alternately in every iteration; the timed iteration is the forward.
// Counters: forward_ns (per element), backward_ns, forward_over_backward.
void BM_GELU(benchmark::State &state) {
  const std::size_t n = state.range(0), features = state.range(1);
  const Space space;
  kat::nn::GELU<float, Mem> gelu;
  // x in [-6, 6]: GELU's inputs in a trained ViT are mostly within a few units of 0.
  const M x = filled(n, features, 6, 6.0), dy = filled(n, features, 7);
  M y("y", n, features), dx("dx", n, features);
  const auto forward = [&] { gelu.forward(space, x, y); };
  const auto backward = [&] { gelu.backward(space, dy, dx); };
  for (int i = 0; i < 3; ++i) { // workspace
    forward();
    backward();
  }
  double forward_s = 0, backward_s = 0;
  for (auto _ : state) {
    backward_s += fenced_seconds(space, backward);
    const double this_s = fenced_seconds(space, forward);
    forward_s += this_s;
    state.SetIterationTime(this_s);
  }
  const double ns = 1e9 / (double(state.iterations()) * double(n * features));
  state.counters["forward_ns"] = forward_s * ns;
  state.counters["backward_ns"] = backward_s * ns;
  state.counters["forward_over_backward"] = forward_s / backward_s;
}
BENCHMARK(BM_GELU)
    ->ArgNames({"rows", "features"})
    ->Args({2048, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// One SGD epoch of the MLP (lr 0.05, momentum 0.9, batch 128, 60,000 images), as kat_train
// runs it, against a floor: exactly the GEMM calls an epoch makes and nothing else.
void BM_MLPEpochSGD(benchmark::State &state) {
  const Space space;
  const auto train = training_data();
  kat::data::DataLoader<float, Mem> loader(train, 128, true, 0);
  auto model = kat::nn::models::mlp<float, Mem>(train.shape, train.classes);
  model.compile(space, 0);
  kat::optim::SGD<float, Mem>::Options o;
  o.lr = 0.05;
  o.momentum = 0.9;
  kat::optim::SGD<float, Mem> sgd(model.parameter_count(), o);
  kat::nn::SoftmaxCrossEntropy<float, Mem> ce;
  kat::Workspace<float, Mem> dlogits_ws;
  M x;
  kat::Vector<std::int32_t, Mem> y;

  const DenseGemms l1(128, 784, 256), l2(128, 256, 256), l3(128, 256, 10);
  auto gemm_epoch = [&] {
    for (std::size_t b = 0; b < loader.batches(); ++b) {
      l1.run(space); // the first layer's dx GEMM is one more than an epoch needs:
      l2.run(space); // the floor is slightly pessimistic, never optimistic
      l3.run(space);
    }
    space.fence();
  };
  std::size_t epoch = 0;
  double epoch_s = 0, gemm_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    loader.start_epoch(epoch++);
    while (loader.next(space, x, y)) {
      const auto &logits = model.forward(space, x);
      const auto dlogits = dlogits_ws.matrix(x.extent(0), 10);
      ce.forward_backward(space, logits, y, dlogits);
      model.backward(space, dlogits, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
      sgd.step(space, model.parameters(), model.gradients());
    }
    space.fence();
    const double this_epoch_s = seconds(t0);
    epoch_s += this_epoch_s;
    t0 = Clock::now();
    gemm_epoch();
    gemm_s += seconds(t0);
    state.SetIterationTime(this_epoch_s);
  }
  state.counters["epoch_s"] = epoch_s / state.iterations();
  state.counters["gemm_only_s"] = gemm_s / state.iterations();
  state.counters["gemm_share"] = gemm_s / epoch_s;
  state.counters["samples_per_s"] = double(train.size()) * state.iterations() / epoch_s;
}
BENCHMARK(BM_MLPEpochSGD)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

} // namespace
