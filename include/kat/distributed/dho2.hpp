#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use kat/distributed/fosi/dho2.hpp.

#include "kat/distributed/fosi/dho2.hpp"
