#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/tensor_parallel/tensor_parallel_dense.hpp.

#include "kat/distributed/tensor_parallel/tensor_parallel_dense.hpp"
