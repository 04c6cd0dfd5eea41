#pragma once
/// @file
/// @brief Deprecated include path, kept for one release: use
/// kat/distributed/comm/thread_budget.hpp.

#include "kat/distributed/comm/thread_budget.hpp"
