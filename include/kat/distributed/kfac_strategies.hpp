#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/kfac/kfac_strategies.hpp.

#include "kat/distributed/kfac/kfac_strategies.hpp"
