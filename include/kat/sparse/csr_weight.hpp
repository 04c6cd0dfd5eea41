#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: kat::sparse::CsrWeight now lives in
/// kat/core/csr_weight.hpp, on the floor below kat::nn, whose Dense layer uses it (no header
/// of nn includes a header of sparse). Include kat/core/csr_weight.hpp instead.

#include "kat/core/csr_weight.hpp"
