#pragma once
/// @file
/// @brief Internal: helpers shared by the image layers (Conv2d, pooling).

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <string>

namespace kat::nn::detail {

/// Vector length of the per-sample inner loops of the image kernels. The batch index is the
/// fastest in memory, so GPU lanes over it coalesce and host backends run the loop as one
/// vectorizable loop.
template <class ExecSpace> int batch_vector_length() {
  const int max = Kokkos::TeamPolicy<ExecSpace>::vector_length_max();
  return max < 32 ? max : 32;
}

/// "(a, b)", for messages about (height, width) hyperparameters.
inline std::string format_pair(const std::array<int, 2> &v) {
  return kat::detail::concat('(', v[0], ", ", v[1], ')');
}

} // namespace kat::nn::detail
