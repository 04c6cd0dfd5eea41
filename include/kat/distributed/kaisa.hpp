#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use kat/distributed/kfac/kaisa.hpp.

#include "kat/distributed/kfac/kaisa.hpp"
