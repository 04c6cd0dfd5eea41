#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use kat/distributed/comm/communicator.hpp.

#include "kat/distributed/comm/communicator.hpp"
