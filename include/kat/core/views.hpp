#pragma once
/// @file
/// @brief View aliases and the per-sample feature shape shared by layers and data.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <ostream>

namespace kat {

/// Kokkos's default execution space: where KAT's work runs unless told otherwise.
using DefaultExecutionSpace = Kokkos::DefaultExecutionSpace;
/// Its memory space: the default of every KAT class's MemorySpace.
using DefaultMemorySpace = Kokkos::DefaultExecutionSpace::memory_space;

/// Column-major matrix, the layout BLAS, LAPACK, cuBLAS and rocBLAS take directly.
/// Activations are `batch x features`.
template <class Scalar, class MemorySpace = DefaultMemorySpace>
using Matrix = Kokkos::View<Scalar **, Kokkos::LayoutLeft, MemorySpace>;

/// Contiguous vector (flat parameter buffers, biases, labels).
template <class Scalar, class MemorySpace = DefaultMemorySpace>
using Vector = Kokkos::View<Scalar *, Kokkos::LayoutLeft, MemorySpace>;

/// Shape of one sample's features as (channels, height, width); a flat feature vector of
/// length n is (n, 1, 1). A batch of such samples is stored as a `batch x size()` Matrix whose
/// feature index is `h + height * (w + width * c)`: the memory order of a LayoutLeft
/// (N, H, W, C) view, batch fastest and channel slowest. With that order a convolution's
/// output, computed as one GEMM of (N·H·W) x C, is already the next layer's input, and each
/// channel's N·H·W values (what batch normalization reduces over) are contiguous.
struct FeatureShape {
  int channels = 0; ///< C
  int height = 1;   ///< H (1 for a flat vector)
  int width = 1;    ///< W (1 for a flat vector)

  /// Features per sample, C·H·W.
  constexpr std::size_t size() const {
    return static_cast<std::size_t>(channels) * static_cast<std::size_t>(height) *
           static_cast<std::size_t>(width);
  }
  /// Whether the features are a flat vector (H = W = 1).
  constexpr bool is_flat() const { return height == 1 && width == 1; }
  friend constexpr bool operator==(const FeatureShape &a, const FeatureShape &b) {
    return a.channels == b.channels && a.height == b.height && a.width == b.width;
  }
  friend constexpr bool operator!=(const FeatureShape &a, const FeatureShape &b) {
    return !(a == b);
  }
  friend std::ostream &operator<<(std::ostream &os, const FeatureShape &s) {
    return os << '(' << s.channels << ", " << s.height << ", " << s.width << ')';
  }
};

} // namespace kat
