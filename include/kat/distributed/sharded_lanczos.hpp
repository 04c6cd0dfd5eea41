#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/fosi/sharded_lanczos.hpp.

#include "kat/distributed/fosi/sharded_lanczos.hpp"
