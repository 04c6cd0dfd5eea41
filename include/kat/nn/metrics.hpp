#pragma once
/// @file
/// @brief Classification metrics computed on the device.

#include "kat/core/error.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/detail/metrics_kernels.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kat::nn {

/// Number of rows i whose argmax over `logits(i, :)` equals `labels(i)`; ties resolve to the
/// lowest class index, as torch.argmax does. logits: N x C; labels: N.
/// @throws ShapeError if the lengths differ.
template <class ExecSpace, class Scalar, class MemorySpace>
std::size_t count_correct(const ExecSpace &space, const Matrix<Scalar, MemorySpace> &logits,
                          const Vector<const std::int32_t, MemorySpace> &labels) {
  const std::size_t n = logits.extent(0);
  const int classes = static_cast<int>(logits.extent(1));
  kat::detail::require_extent("kat::nn::count_correct", "labels length", n, labels.extent(0));
  std::size_t correct = 0;
  Kokkos::parallel_reduce(
      "kat::nn::count_correct", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
      detail::CountCorrect<Matrix<Scalar, MemorySpace>, Vector<const std::int32_t, MemorySpace>>{
          logits, labels, classes},
      correct);
  return correct;
}

} // namespace kat::nn
