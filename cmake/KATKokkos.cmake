# Finds Kokkos and Kokkos Kernels and provides two INTERFACE targets, KAT::KokkosShim and
# KAT::KokkosKernelsShim, whatever flavour of Kokkos is installed:
#
#  * a standalone Kokkos 3.x / 4.x (CUDA, HIP, OpenMP, ...) that exports `Kokkos::kokkos` and
#    `Kokkos::kokkoskernels`;
#  * the TriBITS-style Kokkos 3.4 shipped inside Debian's Trilinos packages, which exports
#    `trilinos_kokkoscore` etc. with no include directories. Its KokkosConfig.cmake also
#    defines a `Kokkos::kokkos`, but with the include directory `/usr/lib/include` (the
#    prefix computed from a multiarch path is one level short), so the TriBITS targets are
#    preferred whenever they exist.
#
# This file is installed next to KATConfig.cmake so that consumers get the same discovery.
include_guard(GLOBAL)

find_package(Kokkos REQUIRED)
find_package(KokkosKernels REQUIRED)

if(NOT TARGET KAT::KokkosShim)
  add_library(KAT::KokkosShim INTERFACE IMPORTED)
  if(TARGET trilinos_kokkoscore)
    set_target_properties(KAT::KokkosShim PROPERTIES
      INTERFACE_LINK_LIBRARIES "${Kokkos_LIBRARIES};${Kokkos_TPL_LIBRARIES}"
      INTERFACE_INCLUDE_DIRECTORIES "${Kokkos_INCLUDE_DIRS};${Kokkos_TPL_INCLUDE_DIRS}")
  elseif(TARGET Kokkos::kokkos)
    set_target_properties(KAT::KokkosShim PROPERTIES INTERFACE_LINK_LIBRARIES Kokkos::kokkos)
  else()
    message(FATAL_ERROR "KAT: found Kokkos in '${Kokkos_DIR}' but it exports neither "
                        "Kokkos::kokkos nor trilinos_kokkoscore")
  endif()
endif()

if(NOT TARGET KAT::KokkosKernelsShim)
  add_library(KAT::KokkosKernelsShim INTERFACE IMPORTED)
  if(TARGET trilinos_kokkoskernels)
    set_target_properties(KAT::KokkosKernelsShim PROPERTIES
      INTERFACE_LINK_LIBRARIES "trilinos_kokkoskernels;KAT::KokkosShim"
      INTERFACE_INCLUDE_DIRECTORIES "${KokkosKernels_INCLUDE_DIRS}")
  elseif(TARGET Kokkos::kokkoskernels)
    set_target_properties(KAT::KokkosKernelsShim PROPERTIES
      INTERFACE_LINK_LIBRARIES "Kokkos::kokkoskernels;KAT::KokkosShim")
  else()
    message(FATAL_ERROR "KAT: found Kokkos Kernels in '${KokkosKernels_DIR}' but it exports "
                        "neither Kokkos::kokkoskernels nor trilinos_kokkoskernels")
  endif()
endif()

# LAPACK is called directly for the factorizations Kokkos Kernels 3.4 lacks (K-FAC).
find_package(LAPACK REQUIRED)
find_package(ZLIB REQUIRED)
