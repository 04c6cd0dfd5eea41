// Benchmarks for the Dense layer's sparse path (weight masks, kat::sparse::CsrWeight): the
// dense path (GEMMs, masked gradient) against the sparse path (spmv, sampled gradient) at
// mask densities from 1 to 0.01, for the 784-256-256-10 MLP's layers at batch 128, float.
//
// Ratios come from one run: every iteration times each path in turn (each fenced), because
// the machines are shared and noisy.
#include "common.hpp"

#include <kat/core/csr_weight.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace kat::bench;
using kat::nn::SparsePath;
using MaskView = Kokkos::View<std::uint8_t *, Mem>;

constexpr std::size_t batch = 128; // kat_train's default --batch-size

// A uniformly random out x in mask (column-major) with about `density` of its entries active.
MaskView random_mask(std::size_t out, std::size_t in, double density, std::uint64_t seed) {
  MaskView m("mask", out * in);
  auto h = Kokkos::create_mirror_view(m);
  kat::HostRng rng(seed);
  for (std::size_t k = 0; k < out * in; ++k) {
    h(k) = (rng.next() >> 11) * 0x1.0p-53 < density ? 1 : 0;
  }
  Kokkos::deep_copy(m, h);
  return m;
}

// w(k) = 0 where mask(k) == 0: the mask component's invariant.
void zero_inactive(const M &w, const MaskView &mask) {
  Kokkos::parallel_for(
      "zero_inactive", Kokkos::RangePolicy<Space>(0, mask.extent(0)),
      KOKKOS_LAMBDA(const std::size_t k) {
        if (mask(k) == 0) {
          w.data()[k] = 0;
        }
      });
}

// One Dense layer bound to its own buffer, its inactive weights zeroed, its activations.
struct MaskedLayer {
  kat::ParameterBuffer<float, Mem> buffer;
  kat::nn::Dense<float, Mem> layer;
  M x, y, dy, dx;

  MaskedLayer(std::size_t in, std::size_t out, const MaskView &mask, SparsePath path, bool need_dx,
              std::uint64_t seed)
      : layer(in, out), x(filled(batch, in, seed)), y("y", batch, out),
        dy(filled(batch, out, seed + 1)), dx(need_dx ? M("dx", batch, in) : M()) {
    buffer.reserve("dense", layer.parameter_count());
    buffer.allocate();
    layer.bind(buffer.parameters().data(), buffer.gradients().data());
    layer.reset_parameters(Space(), seed);
    // kat_train overwrites the gradients each step.
    layer.accumulate_gradients(false);
    if (mask.extent(0) != 0) {
      zero_inactive(layer.weight(), mask);
      layer.set_weight_mask(Space(), mask, path);
    }
  }
  void step(const Space &s) {
    layer.forward(s, x, y);
    layer.backward(s, dy, dx);
  }
};

// The MLP's three Dense layers, all with masks of one density (none for density < 0): the
// first layer computes no dx, as in a model.
struct MaskedMLP {
  std::vector<std::unique_ptr<MaskedLayer>> layers;
  MaskedMLP(double density, SparsePath path) {
    const std::array<std::array<std::size_t, 2>, 3> shapes{{{784, 256}, {256, 256}, {256, 10}}};
    for (std::size_t l = 0; l < shapes.size(); ++l) {
      const auto [in, out] = shapes[l];
      const MaskView mask = density < 0 ? MaskView() : random_mask(out, in, density, 10 + l);
      layers.push_back(std::make_unique<MaskedLayer>(in, out, mask, path, l > 0, 20 + 3 * l));
    }
  }
  // Forward through the layers, backward in reverse.
  void step(const Space &s) {
    for (auto &l : layers) {
      l->layer.forward(s, l->x, l->y);
    }
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
      (*it)->layer.backward(s, (*it)->dy, (*it)->dx);
    }
  }
};

// Times each step in turn every iteration; the iteration time is the last step's. Counters:
// <name>_us, the mean per step, and <name>_min_us, the fastest iteration (the least disturbed
// on a shared machine); for each step but the first, first/<name> = the ratio of the means and
// min:first/<name> = the ratio of the minima.
template <std::size_t K, class Step>
void time_in_turn(benchmark::State &state, const std::array<const char *, K> &names,
                  const std::array<Step, K> &steps) {
  const Space space;
  std::array<double, K> total{}, best{};
  best.fill(1e30);
  for (auto _ : state) {
    double last = 0;
    for (std::size_t k = 0; k < K; ++k) {
      const auto t0 = Clock::now();
      steps[k]();
      space.fence();
      last = seconds(t0);
      total[k] += last;
      best[k] = std::min(best[k], last);
    }
    state.SetIterationTime(last);
  }
  const double n = double(state.iterations());
  for (std::size_t k = 0; k < K; ++k) {
    state.counters[std::string(names[k]) + "_us"] = total[k] / n * 1e6;
    state.counters[std::string(names[k]) + "_min_us"] = best[k] * 1e6;
  }
  for (std::size_t k = 1; k < K; ++k) {
    state.counters[std::string(names[0]) + "/" + names[k]] = total[0] / total[k];
    state.counters[std::string("min:") + names[0] + "/" + names[k]] = best[0] / best[k];
  }
}

// Forward + backward of the MLP's Dense layers: no mask (plain GEMMs), a mask on the dense
// path (GEMMs plus the gradient masking) and the same mask on the sparse path. Argument:
// density in thousandths.
void BM_SparseMLPLayers(benchmark::State &state) {
  const double density = double(state.range(0)) / 1000;
  MaskedMLP plain(-1, SparsePath::dense), dense(density, SparsePath::dense),
      sparse(density, SparsePath::sparse);
  const Space space;
  using Step = std::function<void()>;
  time_in_turn<3, Step>(
      state, {"plain", "dense", "sparse"},
      {[&] { plain.step(space); }, [&] { dense.step(space); }, [&] { sparse.step(space); }});
  state.counters["density"] = sparse.layers[0]->layer.weight_density();
}
BENCHMARK(BM_SparseMLPLayers)
    ->ArgName("density_permille")
    ->Arg(1000)
    ->Arg(500)
    ->Arg(200)
    ->Arg(100)
    ->Arg(80)
    ->Arg(60)
    ->Arg(50)
    ->Arg(40)
    ->Arg(30)
    ->Arg(10)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// One layer's forward + backward (dx included), dense path against sparse path.
void BM_SparseDenseLayer(benchmark::State &state) {
  const std::size_t in = state.range(0), out = state.range(1);
  const double density = double(state.range(2)) / 1000;
  const MaskView mask = random_mask(out, in, density, 3);
  MaskedLayer dense(in, out, mask, SparsePath::dense, true, 4),
      sparse(in, out, mask, SparsePath::sparse, true, 4);
  const Space space;
  using Step = std::function<void()>;
  time_in_turn<2, Step>(state, {"dense", "sparse"},
                        {[&] { dense.step(space); }, [&] { sparse.step(space); }});
}
BENCHMARK(BM_SparseDenseLayer)
    ->ArgNames({"in", "out", "density_permille"})
    ->ArgsProduct({{784}, {256}, {200, 100, 50, 20, 10}})
    ->ArgsProduct({{256}, {256}, {200, 100, 50, 20, 10}})
    ->ArgsProduct({{256}, {10}, {200, 100, 50, 20, 10}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The three products of the 784 -> 256 layer, each against the GEMM it replaces, with the
// rates that explain the crossover: 2 N nnz flop for a sparse product, 2 N out in for a GEMM.
void BM_SparseProducts(benchmark::State &state) {
  const std::size_t in = 784, out = 256;
  const double density = double(state.range(0)) / 1000;
  const MaskView mask = random_mask(out, in, density, 5);
  kat::sparse::CsrWeight<float, Mem> csr(out, in);
  const Space space;
  csr.build(space, mask);
  csr.build_transposed(space);
  const M x = filled(batch, in, 1), w = filled(out, in, 2), dy = filled(batch, out, 3);
  M y("y", batch, out), dw("dw", out, in), dx("dx", batch, in);
  using Step = std::function<void()>;
  const std::array<Step, 6> steps{
      [&] { kat::gemm(space, kat::Trans::N, kat::Trans::T, 1.f, x, w, 0.f, y); },
      [&] { csr.multiply(space, w, x, 0.f, y); },
      [&] { kat::gemm(space, kat::Trans::N, kat::Trans::N, 1.f, dy, w, 0.f, dx); },
      [&] { csr.multiply_transposed(space, w, dy, 0.f, dx); },
      [&] { kat::gemm(space, kat::Trans::T, kat::Trans::N, 1.f, dy, x, 0.f, dw); },
      [&] { csr.sampled_gradient(space, dy, x, dw, false); }};
  std::array<double, 6> best{};
  best.fill(1e30);
  for (auto _ : state) {
    double sparse_s = 0;
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const auto t0 = Clock::now();
      steps[k]();
      space.fence();
      const double t = seconds(t0);
      best[k] = std::min(best[k], t);
      sparse_s += k % 2 == 1 ? t : 0;
    }
    state.SetIterationTime(sparse_s);
  }
  // The fastest iteration of each product: the least disturbed on a shared machine.
  const double gemm_flop = 2.0 * batch * in * out, sparse_flop = 2.0 * batch * double(csr.nnz());
  const char *names[3] = {"fwd", "dx", "dW"};
  for (std::size_t p = 0; p < 3; ++p) {
    state.counters[std::string(names[p]) + "_gemm_min_us"] = best[2 * p] * 1e6;
    state.counters[std::string(names[p]) + "_sparse_min_us"] = best[2 * p + 1] * 1e6;
    state.counters[std::string(names[p]) + "_gemm_GFLOPs"] = gemm_flop / best[2 * p] * 1e-9;
    state.counters[std::string(names[p]) + "_sparse_GFLOPs"] = sparse_flop / best[2 * p + 1] * 1e-9;
  }
}
BENCHMARK(BM_SparseProducts)
    ->ArgName("density_permille")
    ->Arg(1000)
    ->Arg(100)
    ->Arg(50)
    ->Arg(10)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// dx = dy W on the sparse path: a spmv with the CSR of Wᵀ (what CsrWeight does: a gather of
// Wᵀ's values, then a row-parallel product) against spmv mode "T" on the CSR of W (a gather
// of W's values, then a product that scatters with atomics).
void BM_SparseInputGradient(benchmark::State &state) {
  const std::size_t in = state.range(0), out = state.range(1);
  const double density = double(state.range(2)) / 1000;
  const MaskView mask = random_mask(out, in, density, 6);
  kat::sparse::CsrWeight<float, Mem> csr(out, in);
  const Space space;
  csr.build(space, mask);
  csr.build_transposed(space);
  const M w = filled(out, in, 2), dy = filled(batch, out, 3);
  M dx("dx", batch, in);
  using Right = Kokkos::View<float **, Kokkos::LayoutRight, Mem>;
  using RightConst = Kokkos::View<const float **, Kokkos::LayoutRight, Mem>;
  const RightConst dy_t(dy.data(), out, batch);
  const Right dx_t(dx.data(), in, batch);
  using Step = std::function<void()>;
  time_in_turn<2, Step>(state, {"mode_T", "csr_of_Wt"},
                        {[&] {
                           csr.gather(space, w);
                           KokkosSparse::spmv("T", 1.f, csr.matrix(), dy_t, 0.f, dx_t);
                         },
                         [&] { csr.multiply_transposed(space, w, dy, 0.f, dx); }});
}
BENCHMARK(BM_SparseInputGradient)
    ->ArgNames({"in", "out", "density_permille"})
    ->ArgsProduct({{784, 256}, {256}, {200, 50, 10}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// With the cuSPARSE TPL, Kokkos Kernels hands LayoutLeft multivectors to cuSPARSE column by
// column, which is not the comparison below; Kokkos Kernels 3.4.1 also declares that cuSPARSE
// product for int offsets but defines it only in ETI builds, so the program would not link.
#if !defined(KOKKOSKERNELS_ENABLE_TPL_CUSPARSE)
// y = x Wᵀ as one spmv yᵀ = W xᵀ. A column-major N x in batch x is, in memory, xᵀ stored
// row-major, so CsrWeight hands Kokkos Kernels LayoutRight multivectors without a copy; KK 3.4's
// multivector kernel then reads 16 contiguous batch entries per nonzero. The alternative,
// LayoutLeft multivectors, needs xᵀ and yᵀ copied out and back, and reads the 16 entries with
// a stride of `in`.
void BM_SparseForwardLayout(benchmark::State &state) {
  const std::size_t in = 784, out = 256;
  const double density = double(state.range(0)) / 1000;
  const MaskView mask = random_mask(out, in, density, 7);
  kat::sparse::CsrWeight<float, Mem> csr(out, in);
  const Space space;
  csr.build(space, mask);
  const M x = filled(batch, in, 1), w = filled(out, in, 2);
  M y("y", batch, out), x_t("x_t", in, batch), y_t("y_t", out, batch);
  using Step = std::function<void()>;
  time_in_turn<2, Step>(
      state, {"layout_left", "layout_right"},
      {[&] {
         csr.gather(space, w);
         Kokkos::parallel_for(
             "transpose_x", kat::matrix_policy(space, in, batch),
             KOKKOS_LAMBDA(const std::size_t c, const std::size_t i) { x_t(c, i) = x(i, c); });
         KokkosSparse::spmv("N", 1.f, csr.matrix(), x_t, 0.f, y_t);
         Kokkos::parallel_for(
             "transpose_y", kat::matrix_policy(space, batch, out),
             KOKKOS_LAMBDA(const std::size_t i, const std::size_t r) { y(i, r) = y_t(r, i); });
       },
       [&] { csr.multiply(space, w, x, 0.f, y); }});
}
BENCHMARK(BM_SparseForwardLayout)
    ->ArgName("density_permille")
    ->Arg(200)
    ->Arg(50)
    ->Arg(10)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
#endif

} // namespace
