// The AVX-512 copies of KAT's vectorized host loops (kat/core/host_isa.hpp) against the copies
// compiled for the build's -march, bit for bit: GELU's forward over special values, the bf16
// rounding over values at every rounding case, attention's forward and backward (16-sample
// chunks against 8-sample ones) at batch sizes that leave partial blocks and chunks, and whole
// training steps (forward, backward,
// every parameter gradient) of the MLP, the CNN and the ViT in fp32 and bf16. This file is its
// own executable compiled with -march=x86-64-v3 (tests/CMakeLists.txt), the build that carries
// both copies. On a CPU without AVX-512 only the selection's errors are checked.
#include <kat/core/detail/float_math.hpp>
#include <kat/core/host_isa.hpp>
#include <kat/core/mixed_gemm.hpp>
#include <kat/nn/attention.hpp>
#include <kat/nn/gelu.hpp>
#include <kat/nn/models.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace test_host_isa {

using Space = Kokkos::DefaultHostExecutionSpace;
using Mem = Kokkos::HostSpace;
using kat::HostVectorIsa;

/// Sets the ISA for a scope, restoring the process's choice after it.
struct IsaScope {
  HostVectorIsa before = kat::host_vector_isa();
  explicit IsaScope(HostVectorIsa isa) { kat::set_host_vector_isa(isa); }
  ~IsaScope() { kat::set_host_vector_isa(before); }
};

/// f() run under each ISA: its results (vectors of 32-bit patterns) must be equal.
template <class F> void require_same_bits(const F &f) {
  std::vector<std::uint32_t> compiled, avx512;
  {
    IsaScope scope(HostVectorIsa::compiled);
    compiled = f();
  }
  {
    IsaScope scope(HostVectorIsa::avx512);
    avx512 = f();
  }
  REQUIRE(compiled.size() == avx512.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < compiled.size(); ++i) {
    differ += compiled[i] != avx512[i];
  }
  REQUIRE(differ == 0);
}

using kat::math::detail::float_from_bits;

/// The bits of a float, or of a bf16 (a Bf16Operand stores either, by build).
std::uint32_t bits_of(float f) { return kat::math::detail::float_bits(f); }
std::uint32_t bits_of(kat::bfloat16 b) { return b.bits; }

/// 10,000 values: uniform in [-8, 8], then every special case of GELU and of the rounding:
/// ±0, ±inf, NaNs of both signs and payloads, subnormals, the largest floats, and ties.
std::vector<float> test_values() {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  std::vector<float> v(10000);
  for (auto &x : v) {
    x = u(gen);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special{0.0f,
                                   -0.0f,
                                   inf,
                                   -inf,
                                   std::numeric_limits<float>::quiet_NaN(),
                                   float_from_bits(0xffc00001u),
                                   float_from_bits(0x7f800001u),
                                   std::numeric_limits<float>::denorm_min(),
                                   -float_from_bits(0x00400000u),
                                   std::numeric_limits<float>::max(),
                                   -std::numeric_limits<float>::max(),
                                   float_from_bits(0x3f808000u), // a tie, rounds down to even
                                   float_from_bits(0x3f818000u), // a tie, rounds up to even
                                   float_from_bits(0x7f7f8000u), // rounds to infinity
                                   100.0f,
                                   -100.0f};
  for (std::size_t i = 0; i < special.size(); ++i) {
    v[7 * i + 3] = special[i];
  }
  return v;
}

TEST_CASE("host ISA: this test's build carries the AVX-512 copies", "[host_isa]") {
  // tests/CMakeLists.txt compiles this file with -march=x86-64-v3, so the loops have both.
  REQUIRE(KAT_HOST_ISA_DISPATCH == 1);
  if (kat::detail::cpu_has_avx512()) {
    REQUIRE_NOTHROW(kat::set_host_vector_isa(HostVectorIsa::avx512));
  } else {
    REQUIRE_THROWS_WITH(kat::set_host_vector_isa(HostVectorIsa::avx512),
                        Catch::Contains("isa must be 'compiled' on this CPU"));
  }
  kat::set_host_vector_isa(HostVectorIsa::compiled);
  REQUIRE(kat::host_vector_isa() == HostVectorIsa::compiled);
  REQUIRE(std::string(kat::host_vector_isa_name(HostVectorIsa::avx512)) == "avx512");
}

TEST_CASE("host ISA: KAT_HOST_ISA is checked", "[host_isa]") {
  ::setenv("KAT_HOST_ISA", "avx2", 1);
  REQUIRE_THROWS_WITH(kat::detail::initial_host_vector_isa(),
                      Catch::Contains("KAT_HOST_ISA must be 'compiled' or 'avx512', got 'avx2'"));
  ::setenv("KAT_HOST_ISA", "compiled", 1);
  REQUIRE(kat::detail::initial_host_vector_isa() == HostVectorIsa::compiled);
  ::setenv("KAT_HOST_ISA", "avx512", 1);
  if (kat::detail::cpu_has_avx512()) {
    REQUIRE(kat::detail::initial_host_vector_isa() == HostVectorIsa::avx512);
  } else {
    REQUIRE_THROWS_WITH(kat::detail::initial_host_vector_isa(),
                        Catch::Contains("this CPU lacks AVX-512"));
  }
  ::unsetenv("KAT_HOST_ISA");
  REQUIRE(kat::detail::initial_host_vector_isa() ==
          (kat::detail::cpu_has_avx512() ? HostVectorIsa::avx512 : HostVectorIsa::compiled));
}

TEST_CASE("host ISA: GELU and the bf16 rounding give the same bits", "[host_isa]") {
  if (!kat::detail::cpu_has_avx512()) {
    SUCCEED("no AVX-512 on this CPU: one copy runs");
    return;
  }
  const std::vector<float> values = test_values();
  const std::size_t n = values.size();
  Kokkos::View<float *, Mem> x("x", n), y("y", n), g("g", n);
  for (std::size_t i = 0; i < n; ++i) {
    x(i) = values[i];
  }
  const Space space;
  require_same_bits([&] {
    kat::nn::detail::gelu_forward_with_derivative(space, n, x.data(), y.data(), g.data());
    space.fence();
    std::vector<std::uint32_t> out;
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(bits_of(y(i)));
      out.push_back(bits_of(g(i)));
    }
    return out;
  });
  // [x 1] rounded to bf16, as a Dense layer's input: 100 rows x 100 columns and the ones.
  Kokkos::View<float **, Kokkos::LayoutLeft, Mem> m(x.data(), 100, 100);
  require_same_bits([&] {
    kat::Bf16Operand<float, Mem> op;
    op.assign_with_ones_column(space, m);
    space.fence();
    std::vector<std::uint32_t> out;
    const auto r = op.matrix();
    for (std::size_t j = 0; j < r.extent(1); ++j) {
      for (std::size_t i = 0; i < r.extent(0); ++i) {
        out.push_back(bits_of(r(i, j)));
      }
    }
    return out;
  });
}

TEST_CASE("host ISA: training steps give the same bits", "[host_isa]") {
  if (!kat::detail::cpu_has_avx512()) {
    SUCCEED("no AVX-512 on this CPU: one copy runs");
    return;
  }
  const kat::FeatureShape input{1, 28, 28};
  const std::size_t n = 64;
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  Kokkos::View<float **, Kokkos::LayoutLeft, Mem> x("x", n, input.size()), dy("dy", n, 10);
  for (std::size_t i = 0; i < x.span(); ++i) {
    x.data()[i] = normal(gen);
  }
  for (std::size_t i = 0; i < dy.span(); ++i) {
    dy.data()[i] = normal(gen) / float(n);
  }
  const Space space;
  for (const std::string name : {"mlp", "cnn", "vit"}) {
    for (const auto precision : {kat::Precision::fp32, kat::Precision::bf16}) {
      INFO(name << ", " << (precision == kat::Precision::bf16 ? "bf16" : "fp32"));
      require_same_bits([&] {
        auto model = kat::nn::models::by_name<float, Mem>(name, input, 10);
        model.set_precision(precision);
        model.compile(space, 3);
        const auto y = model.forward(space, x);
        model.backward(space, dy, kat::nn::Sequential<float, Mem>::Gradients::overwrite);
        space.fence();
        std::vector<std::uint32_t> out;
        const auto &grads = model.gradients();
        for (std::size_t i = 0; i < grads.extent(0); ++i) {
          out.push_back(bits_of(grads(i)));
        }
        for (std::size_t i = 0; i < y.span(); ++i) {
          out.push_back(bits_of(y.data()[i]));
        }
        return out;
      });
    }
  }
}

TEST_CASE("host ISA: attention gives the same bits at every block size", "[host_isa]") {
  if (!kat::detail::cpu_has_avx512()) {
    SUCCEED("no AVX-512 on this CPU: one copy runs");
    return;
  }
  const std::size_t heads = 2, head_dim = 5, d = heads * head_dim;
  const Space space;
  // 32 samples make a full block (two 16-sample chunks in the AVX-512 copy); 50 leaves a
  // partial block of 18 (a full chunk and one of 2), 7 a block with one partial chunk.
  for (const std::size_t n : {std::size_t(7), std::size_t(32), std::size_t(50)}) {
    for (const bool causal : {false, true}) {
      INFO("batch " << n << (causal ? ", causal" : ""));
      const int height = 3, width = 2;
      kat::nn::ScaledDotProductAttention<float, Mem> layer(heads, head_dim, causal);
      const kat::FeatureShape out = layer.output_shape({int(3 * d), height, width});
      const std::size_t p = std::size_t(height * width);
      std::mt19937 gen(13 + std::uint32_t(n));
      std::normal_distribution<float> normal;
      Kokkos::View<float **, Kokkos::LayoutLeft, Mem> x("x", n, 3 * d * p), y("y", n, out.size()),
          dy("dy", n, out.size()), dx("dx", n, 3 * d * p);
      for (std::size_t i = 0; i < x.span(); ++i) {
        x.data()[i] = normal(gen);
      }
      for (std::size_t i = 0; i < dy.span(); ++i) {
        dy.data()[i] = normal(gen);
      }
      require_same_bits([&] {
        layer.forward(space, x, y);
        layer.backward(space, dy, dx);
        space.fence();
        std::vector<std::uint32_t> bits;
        for (std::size_t i = 0; i < y.span(); ++i) {
          bits.push_back(bits_of(y.data()[i]));
        }
        for (std::size_t i = 0; i < dx.span(); ++i) {
          bits.push_back(bits_of(dx.data()[i]));
        }
        return bits;
      });
    }
  }
}

} // namespace test_host_isa
