#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/data_parallel/daso.hpp.

#include "kat/distributed/data_parallel/daso.hpp"
