#pragma once
/// @file
/// @brief Parameter initializers with PyTorch's defaults, so KAT runs compare with PyTorch's.

#include "kat/core/error.hpp"
#include "kat/core/random.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/init_kernels.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

namespace kat::nn {

/// Fills `v` with U(low, high) drawn as a pure function of (seed, stream, index).
/// @throws ValueError if low > high or either bound is not finite.
template <class ExecSpace, class View>
void uniform_(const ExecSpace &space, const View &v, double low, double high, std::uint64_t seed,
              std::uint64_t stream) {
  static_assert(View::rank == 1, "kat::nn::uniform_: needs a rank-1 view");
  if (!(std::isfinite(low) && std::isfinite(high) && low <= high)) {
    throw ValueError(
        kat::detail::concat("kat::nn::uniform_: bounds must be finite with low <= high, "
                            "got low = ",
                            low, ", high = ", high));
  }
  const double width = high - low;
  Kokkos::parallel_for("kat::nn::uniform_", Kokkos::RangePolicy<ExecSpace>(space, 0, v.extent(0)),
                       detail::UniformFill<View>{v, low, width, seed, stream});
}

/// Kaiming (He) uniform initialization, He et al., ICCV 2015, eq. (16) with the leaky-ReLU
/// gain: bound = sqrt(2 / (1 + a^2)) * sqrt(3 / fan_in). With a = sqrt(5) (PyTorch's default
/// for Linear and Conv weights) the bound is 1 / sqrt(fan_in).
/// @throws ValueError if fan_in == 0.
template <class ExecSpace, class View>
void kaiming_uniform_(const ExecSpace &space, const View &v, std::size_t fan_in, double a,
                      std::uint64_t seed, std::uint64_t stream) {
  if (fan_in == 0) {
    throw ValueError("kat::nn::kaiming_uniform_: fan_in must be > 0, got 0");
  }
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in));
  uniform_(space, v, -bound, bound, seed, stream);
}

} // namespace kat::nn
