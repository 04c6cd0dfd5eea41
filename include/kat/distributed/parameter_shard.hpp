#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/fosi/parameter_shard.hpp.

#include "kat/distributed/fosi/parameter_shard.hpp"
