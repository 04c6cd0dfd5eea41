#pragma once
/// @file
/// @brief kat::Precision, the arithmetic a layer's matrix products and convolutions run in:
/// fp32, or bf16 inputs with fp32 accumulation (mixed precision).

#include "kat/core/bfloat16.hpp"
#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <string>

namespace kat {

/// The compute precision of matrix products and convolutions.
///
/// - `fp32`: operands and accumulation in the layer's scalar type (float, or double in the
///   gradient checks).
/// - `bf16`: mixed precision as in PyTorch's `torch.autocast(dtype=torch.bfloat16)` (Micikevicius
///   et al., "Mixed Precision Training", ICLR 2018, with bfloat16 instead of fp16: Kalamkar et
///   al., "A Study of BFLOAT16 for Deep Learning Training", 2019): the two operands of every
///   forward and backward product of Dense and Conv2d are rounded to bfloat16 (8 significant
///   bits, round to nearest even) and the products are accumulated in fp32. Parameters,
///   gradients, optimizer state, K-FAC factors, FOSI's basis, reductions, softmax,
///   normalization statistics and the loss stay in fp32. bfloat16 has fp32's exponent range,
///   so gradients neither underflow nor overflow where fp32 would not: no loss scaling is
///   needed (fp16's 5 exponent bits are why fp16 needs it). See docs/precision.md for the
///   table of which operation runs in which type.
enum class Precision { fp32, bf16 };

/// "fp32" or "bf16".
inline const char *to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

/// The Precision named by `text` ("fp32" or "bf16").
/// @throws ValueError naming `what`, the expected names and the text given.
inline Precision parse_precision(const std::string &text, const char *what = "precision") {
  if (text == "fp32") {
    return Precision::fp32;
  }
  if (text == "bf16") {
    return Precision::bf16;
  }
  throw ValueError(detail::concat(what, " must be fp32 or bf16, got '", text, "'"));
}

/// `x` rounded to the nearest bfloat16 (ties to even), as a float: the value a bf16 product
/// unit sees. NaN stays NaN, values beyond bfloat16's largest finite value become infinity.
KOKKOS_INLINE_FUNCTION float round_to_bf16(float x) { return bfloat16::from_float(x).to_float(); }

/// ... for double operands (the gradient checks): rounded through float.
KOKKOS_INLINE_FUNCTION double round_to_bf16(double x) {
  return static_cast<double>(round_to_bf16(static_cast<float>(x)));
}

} // namespace kat
