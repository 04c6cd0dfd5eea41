#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use kat/distributed/kfac/dkfac.hpp.

#include "kat/distributed/kfac/dkfac.hpp"
