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

# With Kokkos's OpenMP backend, the BLAS must share its OpenMP thread pool: Debian's default
# libblas.so.3 is the pthread OpenBLAS, whose own pool fights Kokkos's threads for the cores
# (an MLP epoch on 2 cores: 12.4-13.0 s against 3.2-3.8 s, docs/backends.md). So programs that
# link KAT::kat against an OpenMP Kokkos link Debian's OpenMP OpenBLAS (libopenblas0-openmp)
# by its full path, which also puts its directory on their run path; the loader then maps
# libblas.so.3 and liblapack.so.3 to it for Kokkos Kernels and LAPACK as well.
# KAT_OPENMP_BLAS_DIR overrides the directory; set it to an empty string to keep the default BLAS.
if(NOT DEFINED KAT_KOKKOS_HAS_OPENMP)
  set(KAT_KOKKOS_HAS_OPENMP OFF)
  foreach(dir IN LISTS Kokkos_INCLUDE_DIRS)
    if(EXISTS "${dir}/KokkosCore_config.h")
      file(STRINGS "${dir}/KokkosCore_config.h" openmp REGEX "^#define KOKKOS_ENABLE_OPENMP")
      if(openmp)
        set(KAT_KOKKOS_HAS_OPENMP ON)
      endif()
    endif()
  endforeach()
  if(NOT Kokkos_INCLUDE_DIRS AND TARGET Kokkos::kokkos)
    get_target_property(dirs Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
    foreach(dir IN LISTS dirs)
      if(EXISTS "${dir}/KokkosCore_config.h")
        file(STRINGS "${dir}/KokkosCore_config.h" openmp REGEX "^#define KOKKOS_ENABLE_OPENMP")
        if(openmp)
          set(KAT_KOKKOS_HAS_OPENMP ON)
        endif()
      endif()
    endforeach()
  endif()
endif()
set(KAT_OPENMP_BLAS_LIBRARIES "")
if(KAT_KOKKOS_HAS_OPENMP)
  if(NOT DEFINED KAT_OPENMP_BLAS_DIR AND CMAKE_LIBRARY_ARCHITECTURE)
    set(KAT_OPENMP_BLAS_DIR "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
  endif()
  if(KAT_OPENMP_BLAS_DIR AND EXISTS "${KAT_OPENMP_BLAS_DIR}/libblas.so.3"
     AND EXISTS "${KAT_OPENMP_BLAS_DIR}/liblapack.so.3")
    set(KAT_OPENMP_BLAS_LIBRARIES
      "${KAT_OPENMP_BLAS_DIR}/liblapack.so.3;${KAT_OPENMP_BLAS_DIR}/libblas.so.3")
    message(STATUS "KAT: OpenMP Kokkos: linking the OpenMP BLAS of ${KAT_OPENMP_BLAS_DIR}")
  else()
    message(STATUS "KAT: OpenMP Kokkos, but no OpenMP OpenBLAS in '${KAT_OPENMP_BLAS_DIR}' "
                   "(Debian: libopenblas0-openmp): the default BLAS may start a second thread pool")
  endif()
endif()
