#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use kat/distributed/kfac/dpkfac.hpp.

#include "kat/distributed/kfac/dpkfac.hpp"
