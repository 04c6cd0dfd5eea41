// Mixed precision (kat::Precision::bf16): the bfloat16 conversion against an independent
// nearest-value search, kat::MixedPrecisionGemm against products of the rounded operands in
// double, Dense and Conv2d against their fp32 passes within bounds derived from bf16's 8-bit
// significand, and short training runs of the four models against fp32.
//
// The bounds. bf16 keeps 8 significant bits, so rounding x gives x(1 + d), |d| <= u = 2^-8.
// A product of two rounded operands, summed in fp32 over k terms, differs from the fp32 sum of
// the unrounded products by at most (2u + u^2) S + 2 gamma S, S = sum |a_l b_l|, gamma =
// (k + 2) 2^-24 covering both fp32 summations (in any order). Against the exact sum of the
// *rounded* operands only the fp32 summation remains: gamma S (the bf16 x bf16 products are
// exact in fp32). So the rounding itself is checked to be round-to-nearest on both operands:
// truncation, or one operand left unrounded, would exceed the second bound.
#include "test_helpers.hpp"

#include <kat/core/bf16_support.hpp>
#include <kat/core/bfloat16.hpp>
#include <kat/core/mixed_gemm.hpp>
#include <kat/core/precision.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/models.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>

#include <KokkosBlas1_axpby.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace test_precision {

using namespace kat;
using namespace kat::test;

constexpr double u_bf16 = 0x1.0p-8;
constexpr double u_fp32 = 0x1.0p-24;

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// The bfloat16 nearest to the float with bits `b`, found without the bit trick under test:
// the two bf16 neighbours of |x| (its truncation and the next bf16 up, 2^128 standing for the
// step past the largest finite value, which rounds to infinity) compared in double, ties to
// the even significand. NaN: a quiet NaN of the same sign.
std::uint16_t nearest_bf16_reference(std::uint32_t b) {
  const std::uint32_t sign = b & 0x80000000u, mag = b & 0x7fffffffu;
  if (mag > 0x7f800000u) {
    return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  }
  if (mag == 0x7f800000u) {
    return static_cast<std::uint16_t>((sign >> 16) | 0x7f80u);
  }
  const std::uint32_t lo = mag & 0xffff0000u, hi = lo + 0x10000u;
  const double x = from_bits(mag), vlo = from_bits(lo);
  const double vhi = hi == 0x7f800000u ? std::ldexp(1.0, 128) : double(from_bits(hi));
  std::uint32_t pick;
  if (x - vlo < vhi - x) {
    pick = lo;
  } else if (x - vlo > vhi - x) {
    pick = hi;
  } else {
    pick = (lo & 0x10000u) == 0 ? lo : hi;
  }
  return static_cast<std::uint16_t>((sign | pick) >> 16);
}

struct ConvertOnDevice {
  Kokkos::View<const float *, Mem> in;
  Kokkos::View<std::uint16_t *, Mem> out;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const {
    out(i) = bfloat16::from_float(in(i)).bits;
  }
};

TEST_CASE("precision: bf16 conversion on the device matches the nearest-value search",
          "[precision][bf16]") {
  std::vector<std::uint32_t> patterns = {
      0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
      0x3f807fffu, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0xff7f8000u, 0x00000001u,
      0x00008000u, 0x00018000u, 0x007fffffu, 0x00800000u, 0x7f800000u, 0xff800000u,
      0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fff0000u, 0x7fbfffffu};
  // Every upper half reached by a stride through the 2^32 patterns, each with the lower halves
  // just below, at and above the tie.
  for (std::uint64_t b = 0; b < (1ull << 32); b += 65537ull * 7) {
    const std::uint32_t upper = static_cast<std::uint32_t>(b) & 0xffff0000u;
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                              static_cast<std::uint32_t>(b) & 0xffffu}) {
      patterns.push_back(upper | low);
    }
  }
  const std::size_t n = patterns.size();
  Kokkos::View<float *, Mem> in("in", n);
  Kokkos::View<std::uint16_t *, Mem> out("out", n);
  auto in_h = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < n; ++i) {
    in_h(i) = from_bits(patterns[i]); // bit for bit: deep_copy moves bytes
  }
  Kokkos::deep_copy(in, in_h);
  Kokkos::parallel_for("test_precision::convert", Kokkos::RangePolicy<Space>(0, n),
                       ConvertOnDevice{in, out});
  const auto out_h = to_host(out);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t want = nearest_bf16_reference(patterns[i]);
    if (out_h(i) != want && wrong++ < 5) {
      FAIL_CHECK("bits " << std::hex << patterns[i] << ": got " << out_h(i) << ", want " << want);
    }
  }
  CHECK(wrong == 0);
  CHECK(n > 60000);

  SECTION("named cases") {
    const auto bf = [](std::uint32_t b) { return bfloat16::from_float(from_bits(b)).bits; };
    CHECK(bf(0x3f808000u) == 0x3f80u); // 1 + 2^-8: a tie, to even (down)
    CHECK(bf(0x3f818000u) == 0x3f82u); // 1 + 3 2^-8: a tie, to even (up)
    CHECK(bf(0x7f7f8000u) == 0x7f80u); // half a step past the largest finite: infinity
    CHECK(bf(0x7f7f7fffu) == 0x7f7fu); // just below: the largest finite
    CHECK(bf(0xff800000u) == 0xff80u); // -inf stays -inf
    CHECK(bf(0x80000000u) == 0x8000u); // -0 stays -0
    CHECK(bf(0x7f800001u) == 0x7fc0u); // a signalling NaN becomes a quiet one
    CHECK(bf(0xffc00001u) == 0xffc0u); // NaN keeps its sign
  }
  SECTION("to_float is exact for every bf16") {
    for (std::uint32_t h = 0; h < 0x10000u; ++h) {
      bfloat16 v;
      v.bits = static_cast<std::uint16_t>(h);
      REQUIRE(bits_of(v.to_float()) == h << 16);
    }
  }
}

// The CPU flags Linux reports (empty where /proc/cpuinfo cannot be read).
std::string cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line + " ";
    }
  }
  return {};
}

TEST_CASE("precision: bf16_support names the units the products run on", "[precision][bf16]") {
  const Bf16Support support = bf16_support<Mem>();
  INFO(support.description);
  CHECK(!support.description.empty());
  if (kat::detail::cublas_bf16_memory<float, Mem>()) {
    CHECK(support.native);
    CHECK_THAT(support.description, Catch::Contains("cuBLAS"));
    return;
  }
#if defined(KAT_ENABLE_ONEDNN)
  // On host memory: what oneDNN found, which must agree with the CPU's own flags (unless
  // ONEDNN_MAX_CPU_ISA lowers it; the tests do not set it).
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible &&
      std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr && std::getenv("DNNL_MAX_CPU_ISA") == nullptr) {
    const std::string flags = cpu_flags();
    if (!flags.empty()) {
      const bool amx = flags.find(" amx_bf16 ") != std::string::npos;
      const bool avx512_bf16 = flags.find(" avx512_bf16 ") != std::string::npos;
      CHECK(support.native == (amx || avx512_bf16));
      if (amx) {
        CHECK_THAT(support.description, Catch::Contains("AMX"));
      } else if (avx512_bf16) {
        CHECK_THAT(support.description, Catch::Contains("AVX512-BF16"));
      } else {
        CHECK_THAT(support.description, Catch::Contains("no bf16 unit"));
      }
    }
    return;
  }
#endif
  CHECK_FALSE(support.native); // the portable path
}

TEST_CASE("precision: parse_precision names the bad value", "[precision]") {
  CHECK(parse_precision("fp32") == Precision::fp32);
  CHECK(parse_precision("bf16") == Precision::bf16);
  CHECK_THROWS_AS(parse_precision("fp16", "--precision"), ValueError);
  CHECK_THROWS_WITH(parse_precision("fp16", "--precision"),
                    Catch::Contains("--precision") && Catch::Contains("fp16"));
}

// S(i, j) = sum_l |op(A)(i, l) op(B)(l, j)| and E(i, j) = sum_l r(op(A)) r(op(B)) in double,
// r = identity or round_to_bf16.
struct Reference {
  std::vector<double> exact, abs_sum;
};
template <class HA, class HB>
Reference product_reference(const HA &a, const HB &b, bool ta, bool tb, std::size_t m,
                            std::size_t n, std::size_t k, bool rounded) {
  Reference r{std::vector<double>(m * n), std::vector<double>(m * n)};
  const auto rd = [rounded](double x) { return rounded ? round_to_bf16(x) : x; };
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < m; ++i) {
      double s = 0, t = 0;
      for (std::size_t l = 0; l < k; ++l) {
        const double p = rd(ta ? a(l, i) : a(i, l)) * rd(tb ? b(j, l) : b(l, j));
        s += p;
        t += std::abs(p);
      }
      r.exact[i + m * j] = s;
      r.abs_sum[i + m * j] = t;
    }
  return r;
}

TEMPLATE_TEST_CASE("precision: MixedPrecisionGemm in bf16 is the fp32 sum of rounded operands",
                   "[precision][bf16]", float, double) {
  using T = TestType;
  const std::size_t m = 37, n = 29, k = 300;
  const double u_acc = std::is_same<T, float>::value ? u_fp32 : 0x1.0p-53;
  MixedPrecisionGemm<T, Mem> product;
  const std::vector<std::pair<double, double>> alpha_beta = {{1.0, 0.0}, {0.5, 2.0}};
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const auto &ab : alpha_beta) {
        // A and B as column ranges of wider matrices: leading dimensions above the rows.
        const auto a_full = random_matrix<T>(ta ? k : m, (ta ? m : k) + 3, 1 + ta + 2 * tb);
        const auto b_full = random_matrix<T>(tb ? n : k, (tb ? k : n) + 2, 7 + ta + 2 * tb);
        const auto A =
            Kokkos::subview(a_full, Kokkos::ALL(), std::make_pair(1, int(ta ? m : k) + 1));
        const auto B =
            Kokkos::subview(b_full, Kokkos::ALL(), std::make_pair(2, int(tb ? k : n) + 2));
        const auto c0 = random_matrix<T>(m, n, 13);
        Matrix<T, Mem> C("C", m, n), C32("C32", m, n);
        Kokkos::deep_copy(C, c0);
        Kokkos::deep_copy(C32, c0);
        const Trans TA = ta ? Trans::T : Trans::N, TB = tb ? Trans::T : Trans::N;
        product(Space(), Precision::bf16, TA, TB, T(ab.first), A, B, T(ab.second), C);
        product(Space(), Precision::fp32, TA, TB, T(ab.first), A, B, T(ab.second), C32);
        // The same product from operands rounded once (Bf16Operand: bf16 storage read by
        // oneDNN directly, or rounded Scalars for kat::gemm).
        Bf16Operand<T, Mem> a16, b16;
        a16.assign(Space(), A);
        b16.assign(Space(), B);
        Matrix<T, Mem> C16("C16", m, n);
        Kokkos::deep_copy(C16, c0);
        MixedPrecisionGemm<T, Mem> from_operands;
        from_operands(Space(), TA, TB, T(ab.first), a16, b16, T(ab.second), C16);
        CHECK(from_operands.last_path() == product.last_path());
        const auto ah = to_host(A), bh = to_host(B), ch = to_host(C), c32 = to_host(C32),
                   c0h = to_host(c0), c16 = to_host(C16);
        const Reference rounded = product_reference(ah, bh, ta, tb, m, n, k, true);
        const Reference plain = product_reference(ah, bh, ta, tb, m, n, k, false);
        double worst_rounded = 0, worst_operands = 0, worst_plain = 0, moved = 0;
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t i = 0; i < m; ++i) {
            const std::size_t e = i + m * j;
            const double beta_c = ab.second * c0h(i, j);
            const double s = std::abs(ab.first) * rounded.abs_sum[e] + std::abs(beta_c);
            const double want = ab.first * rounded.exact[e] + beta_c;
            worst_rounded =
                std::max(worst_rounded, std::abs(ch(i, j) - want) / ((k + 2) * u_acc * s));
            worst_operands =
                std::max(worst_operands, std::abs(c16(i, j) - want) / ((k + 2) * u_acc * s));
            const double sp = std::abs(ab.first) * plain.abs_sum[e] + std::abs(beta_c);
            const double bound =
                (2 * u_bf16 + u_bf16 * u_bf16) * std::abs(ab.first) * plain.abs_sum[e] +
                2 * (k + 2) * u_acc * sp;
            worst_plain = std::max(worst_plain, std::abs(double(ch(i, j)) - c32(i, j)) / bound);
            moved = std::max(moved, std::abs(double(ch(i, j)) - c32(i, j)));
          }
        INFO("trans " << ta << tb << ", alpha " << ab.first << ", beta " << ab.second << ", path "
                      << int(product.last_path()) << " " << product.implementation());
        CHECK(worst_rounded <= 1.0);
        CHECK(worst_operands <= 1.0);
        CHECK(worst_plain <= 1.0);
        CHECK(moved > 1e-4); // the operands were rounded: the products moved
        CHECK(product.last_path() != Bf16GemmPath::none);
        // Where cuBLAS serves the space (a CUDA build with KAT_ENABLE_CUBLAS), it took both.
        if (kat::detail::cublas_bf16_available<Space, T, Mem>()) {
          CHECK(product.last_path() == Bf16GemmPath::cublas);
          CHECK(from_operands.last_path() == Bf16GemmPath::cublas);
        }
      }
}

// Host copies in double of a layer's outputs, and the relative error bound check: |got - want|
// <= factor * scale elementwise.
template <class V, class W, class S>
void check_within(const char *what, const V &got, const W &want, const S &scale, double factor) {
  const auto g = to_host(got), w = to_host(want);
  const auto s = to_host(scale);
  double worst = 0, moved = 0;
  for (std::size_t j = 0; j < g.extent(1); ++j)
    for (std::size_t i = 0; i < g.extent(0); ++i) {
      const double d = std::abs(double(g(i, j)) - double(w(i, j)));
      worst = std::max(worst, d / (factor * double(s(i, j)) + 1e-30));
      moved = std::max(moved, d);
    }
  INFO(what << ": worst |bf16 - fp32| / bound = " << worst);
  CHECK(worst <= 1.0);
  CHECK(moved > 0); // bf16 changed something
}

template <class V> Matrix<double, Mem> abs_copy(const V &v) {
  const auto h = to_host(v);
  Matrix<double, Mem> d("abs", h.extent(0), h.extent(1));
  auto dh = Kokkos::create_mirror_view(d);
  for (std::size_t j = 0; j < h.extent(1); ++j)
    for (std::size_t i = 0; i < h.extent(0); ++i)
      dh(i, j) = std::abs(double(h(i, j)));
  Kokkos::deep_copy(d, dh);
  return d;
}

// A layer's float passes in fp32 and bf16, and the same layer in double with |W|, |b| run on
// |x| and |dy|: its outputs are the sums of absolute products S the bounds scale with.
template <class MakeLayer>
void check_layer_bf16(MakeLayer make, FeatureShape in, std::size_t batch, std::size_t k_fwd,
                      std::size_t k_dx, std::uint64_t seed) {
  auto l32 = make(float());
  auto l16 = make(float());
  auto lab = make(double());
  const FeatureShape out = l32->output_shape(in);
  l16->output_shape(in);
  lab->output_shape(in);
  auto b32 = bind_fresh<float>(*l32, seed);
  auto b16 = bind_fresh<float>(*l16, seed);
  auto bab = bind_fresh<double>(*lab, seed);
  {
    const auto p = to_host(b32.parameters());
    auto q = Kokkos::create_mirror_view(bab.parameters());
    for (std::size_t i = 0; i < p.extent(0); ++i)
      q(i) = std::abs(double(p(i)));
    Kokkos::deep_copy(bab.parameters(), q);
  }
  l16->set_precision(Precision::bf16);
  const auto x = random_matrix<float>(batch, in.size(), seed + 1);
  const auto dy = random_matrix<float>(batch, out.size(), seed + 2);
  Matrix<float, Mem> y32("y32", batch, out.size()), y16("y16", batch, out.size());
  Matrix<float, Mem> dx32("dx32", batch, in.size()), dx16("dx16", batch, in.size());
  Matrix<double, Mem> yab("yab", batch, out.size()), dxab("dxab", batch, in.size());
  const auto xab = abs_copy(x), dyab = abs_copy(dy);
  l32->accumulate_gradients(false);
  l16->accumulate_gradients(false);
  lab->accumulate_gradients(false);
  l32->forward(Space(), x, y32);
  l16->forward(Space(), x, y16);
  lab->forward(Space(), xab, yab);
  l32->backward(Space(), dy, dx32);
  l16->backward(Space(), dy, dx16);
  lab->backward(Space(), dyab, dxab);
  const double rel = 2 * u_bf16 + u_bf16 * u_bf16;
  check_within("y", y16, y32, yab, rel + 2 * (k_fwd + 2) * u_fp32);
  check_within("dx", dx16, dx32, dxab, rel + 2 * (k_dx + 2) * u_fp32);
  // The weight gradient sums over the batch (and positions). The bias gradient sums dy: in
  // fp32 (Dense) or, in a bf16 convolution (oneDNN's, or dYᵀ P on the im2col path, whose
  // patches hold a ones column), the rounded dy, as PyTorch's bf16 convolution: within
  // u sum |dy| either way.
  const std::size_t k_dw = batch * (out.size() / l32->weight_gradient().extent(0));
  check_within("dW", l16->weight_gradient(), l32->weight_gradient(), lab->weight_gradient(),
               rel + 2 * (k_dw + 2) * u_fp32);
  const auto db32 = to_host(l32->bias_gradient()), db16 = to_host(l16->bias_gradient());
  const auto dbab = to_host(lab->bias_gradient()); // sum |dy|
  for (std::size_t i = 0; i < db32.extent(0); ++i) {
    CHECK(std::abs(double(db16(i)) - db32(i)) <= (u_bf16 + 2 * (k_dw + 2) * u_fp32) * dbab(i));
  }
}

TEMPLATE_TEST_CASE("precision: Bf16Operand's ones column keeps assign's values before it",
                   "[precision][bf16]", float, double) {
  using T = TestType;
  const std::size_t rows = 19, cols = 7;
  const auto x = random_matrix<T>(rows, cols, 41);
  Bf16Operand<T, Mem> plain, ones;
  plain.assign(Space(), x);
  ones.assign_with_ones_column(Space(), x);
  REQUIRE(ones.matrix().extent(0) == rows);
  REQUIRE(ones.matrix().extent(1) == cols + 1);
  const auto p = to_host(plain.matrix()), o = to_host(ones.matrix());
  const auto lead = to_host(ones.leading_columns(cols));
  REQUIRE(lead.extent(1) == cols);
  const auto value = [](auto v) -> double {
    if constexpr (std::is_same_v<decltype(v), kat::bfloat16>) {
      return v.to_float();
    } else {
      return double(v);
    }
  };
  for (std::size_t j = 0; j < cols; ++j)
    for (std::size_t i = 0; i < rows; ++i) {
      CHECK(value(o(i, j)) == value(p(i, j)));
      CHECK(value(lead(i, j)) == value(p(i, j)));
    }
  for (std::size_t i = 0; i < rows; ++i)
    CHECK(value(o(i, cols)) == 1.0);
  CHECK_THROWS_AS(ones.leading_columns(cols + 2), kat::ShapeError);
}

#if defined(KAT_ENABLE_ONEDNN)
TEST_CASE("precision: onednn_row_batches splits only tall products of bf16 operands",
          "[precision][bf16]") {
  kat::detail::MatmulProblem p;
  p.m = 2048, p.n = 192, p.k = 65, p.bf16_operands = true, p.threads = 2;
  const std::string avx512 = "brg:avx512_core_bf16", amx = "brg:avx512_core_amx";
  CHECK(kat::detail::onednn_row_batches(p, avx512) == 2);
  CHECK(kat::detail::onednn_row_batches(p, amx) == 1); // AMX tiles: kept whole
  auto changed = [&](auto change) {
    kat::detail::MatmulProblem q = p;
    change(q);
    return kat::detail::onednn_row_batches(q, avx512);
  };
  CHECK(changed([](auto &q) { q.bf16_operands = false; }) == 1);
  CHECK(changed([](auto &q) { q.threads = 1; }) == 1);
  CHECK(changed([](auto &q) { q.threads = 4; }) == 4);
  CHECK(changed([](auto &q) { q.m = 2047; }) == 1);               // not a multiple
  CHECK(changed([](auto &q) { q.m = 2 * 255; }) == 1);            // blocks too short
  CHECK(changed([](auto &q) { q.n = 2048 / 4 + 1; }) == 1);       // not tall enough
  CHECK(changed([](auto &q) { q.m = 2 * 256, q.n = 128; }) == 2); // the limits
}

TEST_CASE("precision: oneDNN's bf16 matmul in blocks of rows is the fp32 sum of its operands",
          "[precision][bf16]") {
  // A tall product, as a ViT's Dense layers have (N·P rows): on two threads the plan runs it
  // as a batch of two blocks of rows (unless oneDNN's kernel for the whole uses AMX tiles).
  // Operands in bf16 with leading dimensions above their rows, C within a wider matrix.
  const std::size_t m = 1024, n = 24, k = 70;
  const bool avx512_bf16 =
      kat::bf16_support<Kokkos::HostSpace>().description.rfind("AVX512-BF16", 0) == 0;
  try { // where oneDNN has no bf16 matmul at all (a CPU below AVX-512), there is nothing to test
    kat::detail::MatmulProblem whole;
    whole.m = whole.n = whole.k = whole.lda = whole.ldb = whole.ldc = 1;
    whole.bf16_operands = true;
    kat::detail::OnednnBf16MatmulPlan probe(whole);
  } catch (const dnnl::error &e) {
    WARN("oneDNN has no bf16 matmul on this CPU: " << e.what());
    return;
  }
  for (const char ta : {'N', 'T'})
    for (const char tb : {'N', 'T'})
      for (const std::size_t threads : {std::size_t(1), std::size_t(2)})
        for (const auto &ab : std::vector<std::pair<float, float>>{{1.0f, 0.0f}, {0.5f, 2.0f}}) {
          kat::detail::MatmulProblem p;
          p.trans_a = ta, p.trans_b = tb, p.m = m, p.n = n, p.k = k;
          const std::size_t a_rows = ta == 'T' ? k : m, a_cols = ta == 'T' ? m : k;
          const std::size_t b_rows = tb == 'T' ? n : k, b_cols = tb == 'T' ? k : n;
          p.lda = a_rows + 3, p.ldb = b_rows + 5, p.ldc = m + 7;
          p.alpha = ab.first, p.beta = ab.second, p.bf16_operands = true, p.threads = threads;
          // Random values rounded to bf16: the operands, and in float the reference's input.
          const auto ah = to_host(random_matrix<float>(p.lda, a_cols, 51 + ta + 2 * tb));
          const auto bh = to_host(random_matrix<float>(p.ldb, b_cols, 53 + ta + 2 * tb));
          const auto c0 = to_host(random_matrix<float>(p.ldc, n, 57));
          std::vector<kat::bfloat16> a(p.lda * a_cols), b(p.ldb * b_cols);
          for (std::size_t j = 0; j < a_cols; ++j)
            for (std::size_t i = 0; i < p.lda; ++i) {
              a[i + j * p.lda] = kat::bfloat16::from_float(ah(i, j));
              ah(i, j) = a[i + j * p.lda].to_float();
            }
          for (std::size_t j = 0; j < b_cols; ++j)
            for (std::size_t i = 0; i < p.ldb; ++i) {
              b[i + j * p.ldb] = kat::bfloat16::from_float(bh(i, j));
              bh(i, j) = b[i + j * p.ldb].to_float();
            }
          std::vector<float> c(c0.data(), c0.data() + p.ldc * n);
          kat::detail::OnednnBf16MatmulPlan plan(p);
          const bool amx = plan.implementation().find("amx") != std::string::npos;
          INFO("trans " << ta << tb << ", threads " << threads << ", alpha " << ab.first
                        << ", beta " << ab.second << ", " << plan.implementation());
          // Split on AVX512-BF16; whole on AMX tiles and on one thread; where oneDNN emulates
          // bf16 either (it may have no kernel for the batch).
          if (threads == 1 || amx) {
            CHECK(plan.row_batches() == 1);
          } else if (avx512_bf16) {
            CHECK(plan.row_batches() == 2);
          } else {
            CHECK((plan.row_batches() == 1 || plan.row_batches() == 2));
          }
          plan.run(a.data(), b.data(), c.data());
          const Reference r = product_reference(ah, bh, ta == 'T', tb == 'T', m, n, k, false);
          double worst = 0;
          for (std::size_t j = 0; j < n; ++j)
            for (std::size_t i = 0; i < m; ++i) {
              const double beta_c = double(ab.second) * c0(i, j);
              const double want = double(ab.first) * r.exact[i + m * j] + beta_c;
              const double scale = std::abs(ab.first) * r.abs_sum[i + m * j] + std::abs(beta_c);
              worst =
                  std::max(worst, std::abs(c[i + j * p.ldc] - want) / ((k + 2) * u_fp32 * scale));
            }
          CHECK(worst <= 1.0);
          // The rows between C's columns (ldc > m) are untouched.
          for (std::size_t j = 0; j < n; ++j)
            for (std::size_t i = m; i < p.ldc; ++i)
              CHECK(c[i + j * p.ldc] == c0(i, j));
        }
}
#endif

TEST_CASE("precision: Dense in bf16 stays within the bf16 bound of fp32", "[precision][bf16]") {
  const std::size_t in = 300, out = 24, batch = 17;
  check_layer_bf16(
      [&](auto s) {
        using S = decltype(s);
        return std::make_unique<nn::Dense<S, Mem>>(in, out);
      },
      FeatureShape{in}, batch, in + 1, out, 31);
}

TEST_CASE("precision: bf16 Dense's bias gradient sums the rounded dy and accumulates",
          "[precision][bf16]") {
  const std::size_t in = 5, out = 3, batch = 41;
  nn::Dense<float, Mem> layer(in, out);
  auto buffer = bind_fresh<float>(layer, 7);
  layer.set_precision(Precision::bf16);
  const auto x = random_matrix<float>(batch, in, 8);
  const auto dy = random_matrix<float>(batch, out, 9);
  Matrix<float, Mem> y("y", batch, out), dx("dx", batch, in);
  layer.forward(Space(), x, y);
  layer.accumulate_gradients(false);
  layer.backward(Space(), dy, dx);
  const auto db1 = to_host(layer.bias_gradient());
  const auto dw1 = to_host(layer.weight_gradient());
  // db = the fp32 sum of dy rounded to bf16: within k u_fp32 sum |dy| of the exact sum of the
  // rounded values, and (random dy) away from the sum of the unrounded ones.
  const auto dyh = to_host(dy);
  double moved = 0;
  for (std::size_t j = 0; j < out; ++j) {
    double rounded = 0, plain = 0, scale = 0;
    for (std::size_t i = 0; i < batch; ++i) {
      rounded += double(round_to_bf16(dyh(i, j)));
      plain += double(dyh(i, j));
      scale += std::abs(double(dyh(i, j)));
    }
    CHECK(std::abs(double(db1(j)) - rounded) <= (batch + 2) * u_fp32 * scale);
    moved = std::max(moved, std::abs(rounded - plain));
  }
  CHECK(moved > 1e-5);
  // Accumulating adds the same product again: twice the values, up to the summation order
  // of a product kernel that also reads C (2 (k + 2) u_fp32 of the sum of |terms|).
  layer.accumulate_gradients(true);
  layer.backward(Space(), dy, dx);
  const auto db2 = to_host(layer.bias_gradient());
  const auto dw2 = to_host(layer.weight_gradient());
  const auto xh = to_host(x);
  const double k_bound = 2 * (batch + 2) * u_fp32;
  for (std::size_t j = 0; j < out; ++j) {
    double scale = 0;
    for (std::size_t n = 0; n < batch; ++n)
      scale += std::abs(double(dyh(n, j)));
    CHECK(std::abs(double(db2(j)) - 2 * double(db1(j))) <= 2 * k_bound * scale);
  }
  for (std::size_t j = 0; j < in; ++j)
    for (std::size_t i = 0; i < out; ++i) {
      double scale = 0;
      for (std::size_t n = 0; n < batch; ++n)
        scale += std::abs(double(dyh(n, i)) * double(xh(n, j)));
      CHECK(std::abs(double(dw2(i, j)) - 2 * double(dw1(i, j))) <= 2 * k_bound * scale);
      CHECK(dw2(i, j) != 0);
    }
}

// The bit patterns of a contiguous float view's elements, for comparisons to the bit.
template <class View> std::vector<std::uint32_t> bits_of(const View &v) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<std::uint32_t> bits(h.span());
  for (std::size_t k = 0; k < bits.size(); ++k) {
    bits[k] = bits_of(h.data()[k]);
  }
  return bits;
}

// Dense::backward_input then backward_parameters (kat::distributed::ColumnParallelDense's two
// calls) compute what one backward() does, to the bit, in either precision, with or without a
// bias, setting or accumulating; in bf16 the second call reuses the first's rounding of dy, and
// rounds a different dy anew.
TEST_CASE("precision: Dense's backward in two calls is backward() to the bit",
          "[precision][bf16]") {
  const std::size_t in = 6, out = 4, batch = 37;
  const auto precision = GENERATE(Precision::fp32, Precision::bf16);
  const bool bias = GENERATE(true, false);
  const bool accumulate = GENERATE(false, true);
  INFO(to_string(precision) << ", bias " << bias << ", accumulate " << accumulate);
  nn::Dense<float, Mem> one(in, out, bias), two(in, out, bias);
  auto buffer_one = bind_fresh<float>(one, 11);
  auto buffer_two = bind_fresh<float>(two, 11);
  const auto x = random_matrix<float>(batch, in, 12);
  const auto dy = random_matrix<float>(batch, out, 13);
  Matrix<float, Mem> y("y", batch, out), dx_one("dx_one", batch, in), dx_two("dx_two", batch, in);
  for (auto *layer : {&one, &two}) {
    layer->set_precision(precision);
    layer->accumulate_gradients(accumulate);
  }
  for (int step = 0; step < 2; ++step) { // the second step accumulates onto the first's
    one.forward(Space(), x, y);
    two.forward(Space(), x, y);
    one.backward(Space(), dy, dx_one);
    two.backward_input(Space(), dy, dx_two);
    CHECK(bits_of(dx_two) == bits_of(dx_one));
    two.backward_parameters(Space(), dy);
    CHECK(bits_of(buffer_two.gradients()) == bits_of(buffer_one.gradients()));
  }
  // Another dy in the second call is that dy's gradient, not the first's rounding reused.
  const auto other = random_matrix<float>(batch, out, 14);
  one.accumulate_gradients(false);
  two.accumulate_gradients(false);
  one.forward(Space(), x, y);
  two.forward(Space(), x, y);
  one.backward(Space(), other, dx_one);
  two.backward_input(Space(), dy, dx_two);
  two.backward_parameters(Space(), other);
  CHECK(bits_of(buffer_two.gradients()) == bits_of(buffer_one.gradients()));
  // compute_parameter_gradients(false): the second call leaves the gradients alone.
  two.compute_parameter_gradients(false);
  const auto before = bits_of(buffer_two.gradients());
  two.backward_input(Space(), dy, dx_two);
  two.backward_parameters(Space(), dy);
  CHECK(bits_of(buffer_two.gradients()) == before);
  CHECK_THROWS_AS(two.backward_input(Space(), dy, Matrix<float, Mem>()), ShapeError);
}

// A dense weight gradient requested of a masked layer survives backward_input() and is
// consumed by backward_parameters(), as by one backward().
TEST_CASE("precision: Dense's backward in two calls keeps a dense-gradient request",
          "[precision][bf16]") {
  const std::size_t in = 5, out = 3, batch = 9;
  const auto precision = GENERATE(Precision::fp32, Precision::bf16);
  INFO(to_string(precision));
  const auto mask = vector_of<std::uint8_t>(in * out, [](std::size_t k) { return k % 3 != 0; });
  nn::Dense<float, Mem> one(in, out), two(in, out);
  auto buffer_one = bind_fresh<float>(one, 21);
  auto buffer_two = bind_fresh<float>(two, 21);
  const auto x = random_matrix<float>(batch, in, 22);
  const auto dy = random_matrix<float>(batch, out, 23);
  Matrix<float, Mem> y("y", batch, out), dx("dx", batch, in);
  for (auto *layer : {&one, &two}) {
    layer->set_precision(precision);
    layer->set_weight_mask(Space(), mask, sparse::SparsePath::dense);
    layer->forward(Space(), x, y);
    layer->request_dense_weight_gradient();
  }
  one.backward(Space(), dy, dx);
  two.backward_input(Space(), dy, dx);
  CHECK(two.dense_weight_gradient_requested());
  two.backward_parameters(Space(), dy);
  CHECK_FALSE(two.dense_weight_gradient_requested());
  const auto g = to_host(two.weight_gradient());
  CHECK(bits_of(buffer_two.gradients()) == bits_of(buffer_one.gradients()));
  CHECK(g(0, 0) != 0.0f); // an inactive entry (k = 0): the dense gradient, not the masked one
}

TEST_CASE("precision: Conv2d in bf16 stays within the bf16 bound of fp32", "[precision][bf16]") {
  const std::size_t batch = 6;
  check_layer_bf16(
      [&](auto s) {
        using S = decltype(s);
        return std::make_unique<nn::Conv2d<S, Mem>>(16, 32, 3, 1, 1);
      },
      FeatureShape{16, 10, 10}, batch, 16 * 9 + 1, 32 * 9, 41);
}

// The im2col path in chunks (100 positions, 7 a chunk: 15 chunks, the last of 2), as every
// Conv2d on a GPU and the small convolutions on a host take it: in bf16 there, im2col rounds
// the patches itself and the GEMM reads them as bf16 where the vendor GEMM does.
TEST_CASE("precision: Conv2d on the chunked im2col path in bf16 stays within the bf16 bound",
          "[precision][bf16]") {
  const std::size_t batch = 6, cols = 16 * 9 + 1;
  check_layer_bf16(
      [&](auto s) {
        using S = decltype(s);
        auto conv = std::make_unique<nn::Conv2d<S, Mem>>(16, 32, 3, 1, 1);
        conv->set_backend(nn::Conv2dBackend::im2col);
        conv->set_chunk_bytes(7 * batch * cols * sizeof(S));
        return conv;
      },
      FeatureShape{16, 10, 10}, batch, cols, 32 * 9, 43);
  // A strided convolution with padding and no bias, in one chunk.
  check_layer_bf16(
      [&](auto s) {
        using S = decltype(s);
        auto conv = std::make_unique<nn::Conv2d<S, Mem>>(3, 8, 5, 2, 2, 1, false);
        conv->set_backend(nn::Conv2dBackend::im2col);
        conv->set_chunk_bytes(0);
        return conv;
      },
      FeatureShape{3, 11, 9}, batch, 3 * 25, 8 * 25, 47);
}

// T steps of plain SGD (lr 0.02) on a fixed batch of random images with labels i % classes;
// returns the losses and leaves the parameters in `model`.
template <class Model>
std::vector<double> sgd_steps(Model &model, const Matrix<float, Mem> &x,
                              const Vector<std::int32_t, Mem> &labels, int steps) {
  nn::SoftmaxCrossEntropy<float, Mem> loss;
  Matrix<float, Mem> grad("grad", x.extent(0), model.output_shape().size());
  std::vector<double> losses;
  for (int t = 0; t < steps; ++t) {
    const auto &logits = model.forward(Space(), x);
    losses.push_back(loss.forward_backward(Space(), logits, labels, grad));
    model.backward(Space(), grad, Model::Gradients::overwrite);
    KokkosBlas::axpy(-0.02f, model.gradients(), model.parameters());
  }
  Kokkos::fence();
  return losses;
}

TEST_CASE("precision: short bf16 training runs of the four models stay near fp32",
          "[precision][bf16][models]") {
  // Stated distance: over 5 steps the bf16 loss stays within 2 % of the fp32 loss and the
  // parameters within 1 % (relative L2) of fp32's: each step's gradient moves by about
  // 2u = 2^-7 relative, and 5 steps of lr 0.02 move the parameters by a few percent of
  // their norm at most, so 1 % leaves a wide margin; a product left unrounded or computed
  // wrongly moves the losses by far more than 2 % (the first step's loss is checked too).
  for (const char *name : {"mlp", "cnn", "resnet", "vit"}) {
    DYNAMIC_SECTION(name) {
      const FeatureShape shape{1, 28, 28};
      const std::size_t batch = 16;
      auto m32 = nn::models::by_name<float, Mem>(name, shape, 10);
      auto m16 = nn::models::by_name<float, Mem>(name, shape, 10);
      m32.compile(Space(), 3);
      m16.compile(Space(), 3);
      m16.set_precision(Precision::bf16);
      CHECK(m16.precision() == Precision::bf16);
      const auto x = random_matrix<float>(batch, shape.size(), 5, 0.0, 1.0);
      std::vector<std::int32_t> l(batch);
      for (std::size_t i = 0; i < batch; ++i)
        l[i] = static_cast<std::int32_t>(i % 10);
      const auto labels = labels_of(l);
      const auto a = sgd_steps(m32, x, labels, 5);
      const auto b = sgd_steps(m16, x, labels, 5);
      for (std::size_t t = 0; t < a.size(); ++t) {
        INFO("step " << t << ": fp32 loss " << a[t] << ", bf16 loss " << b[t]);
        CHECK(std::isfinite(b[t]));
        CHECK(std::abs(b[t] - a[t]) <= 0.02 * a[t]);
      }
      const auto p32 = to_host(m32.parameters()), p16 = to_host(m16.parameters());
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < p32.extent(0); ++i) {
        diff += (double(p16(i)) - p32(i)) * (double(p16(i)) - p32(i));
        norm += double(p32(i)) * p32(i);
      }
      INFO("relative parameter distance " << std::sqrt(diff / norm));
      CHECK(std::sqrt(diff / norm) <= 0.01);
      CHECK(diff > 0);
    }
  }
}

} // namespace test_precision
