#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/fosi/sharded_operator.hpp.

#include "kat/distributed/fosi/sharded_operator.hpp"
