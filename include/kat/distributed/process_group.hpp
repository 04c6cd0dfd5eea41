#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/comm/process_group.hpp.

#include "kat/distributed/comm/process_group.hpp"
