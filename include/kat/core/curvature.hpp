#pragma once
/// @file
/// @brief What a curvature method (K-FAC) reads of one layer, independent of kat::nn.

#include "kat/core/views.hpp"

#include <cstddef>

namespace kat {

/// The views K-FAC needs of one layer with a weight matrix W (out x in) and bias b, following
/// Martens & Grosse 2015 (Dense) and Grosse & Martens 2016 (Conv2d, "KFC"):
///
/// - `a`: the layer input with a ones column appended when there is a bias, rows x (in+1).
///   For Dense, rows = N (the batch); for Conv2d, `a` is the im2col patch matrix and
///   rows = N * H_out * W_out.
/// - `g`: the gradient of the loss with respect to the layer output, rows x out, as
///   backpropagated (for a batch-mean loss it carries the 1/N).
/// - `weight_gradient`: d[W b], one out x (in+1) column-major matrix; K-FAC preconditions it
///   in place.
/// - `weight`: [W b] (out x (in+1)); not needed by K-FAC, kept for methods that are.
/// - `samples`: N, the number of samples in the batch (rows / positions per sample).
///
/// All are views of memory the layer owns (or of the flat buffers), valid until the next
/// forward/backward. `a` and `g` are empty when the layer did not record them.
template <class Scalar, class MemorySpace> struct CurvatureRecord {
  Matrix<Scalar, MemorySpace>
      a; ///< the layer input (with a ones column with a bias), rows x (in+1)
  Matrix<Scalar, MemorySpace> g;               ///< dL/d(layer output), rows x out
  Matrix<Scalar, MemorySpace> weight_gradient; ///< d[W b], out x (in+1), column-major
  Matrix<Scalar, MemorySpace> weight;          ///< [W b], out x (in+1)
  std::size_t samples = 0;                     ///< N, the samples in the batch
};

} // namespace kat
