#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/comm/emulated_link.hpp.

#include "kat/distributed/comm/emulated_link.hpp"
