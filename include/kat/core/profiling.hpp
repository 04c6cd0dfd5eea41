#pragma once
/// @file
/// @brief Scoped Kokkos profiling regions, so Kokkos Tools and Nsight attribute time to
/// KAT's phases.

#include <Kokkos_Core.hpp>

#include <string>

namespace kat {

/// Pushes a Kokkos profiling region for the lifetime of the object.
class ScopedRegion {
public:
  /// Pushes the region `name` (Kokkos::Profiling::pushRegion); the destructor pops it.
  explicit ScopedRegion(const std::string &name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion &) = delete;
  ScopedRegion &operator=(const ScopedRegion &) = delete;
};

} // namespace kat
