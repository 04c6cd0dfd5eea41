#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/comm/mpi_environment.hpp.

#include "kat/distributed/comm/mpi_environment.hpp"
