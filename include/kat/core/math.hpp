#pragma once
/// @file
/// @brief Device math functions under one name across Kokkos versions.
///
/// Kokkos 3.4 offers them only as Kokkos::Experimental::exp etc.; Kokkos 3.7 promoted them to
/// Kokkos::exp and 4.x deprecates the Experimental names. KAT code calls kat::math::exp.

#include <Kokkos_Core.hpp>

namespace kat::math {

#if KOKKOS_VERSION >= 30700
using Kokkos::erf;
using Kokkos::erfc;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::isfinite;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::erf;
using Kokkos::Experimental::erfc;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

} // namespace kat::math
