# One thread pool per process. When the OpenMP runtime runs in KAT's programs (Kokkos's OpenMP
# backend, or oneDNN, whose Debian build threads with OpenMP), the BLAS must thread with it too:
# Debian's default libblas.so.3 is the pthread OpenBLAS, whose own pool fights the OpenMP
# threads for the cores (an MLP epoch on the OpenMP backend with 2 cores: 12.4-13.0 s against
# 3.2-3.8 s; a K-FAC epoch of the Serial build, where oneDNN's GEMMs alternate with LAPACK's
# eigendecompositions: twice as long; docs/backends.md). So KAT::kat then links Debian's OpenMP
# OpenBLAS (libopenblas0-openmp) by its full path in place of the default LAPACK, which also
# puts its directory on the programs' run path; the loader then maps libblas.so.3 and
# liblapack.so.3 to it for Kokkos Kernels and LAPACK as well.
#
# Sets KAT_OPENMP_BLAS_LIBRARIES (empty when not needed or not found).
# KAT_OPENMP_BLAS_DIR overrides the directory; set it to an empty string to keep the default BLAS.
include_guard(GLOBAL)

set(KAT_OPENMP_RUNTIME OFF)
set(kat_openmp_users "")
# Kokkos's OpenMP backend (its package sets Kokkos_ENABLE_<DEVICE> for each enabled device).
if(Kokkos_ENABLE_OPENMP)
  set(KAT_OPENMP_RUNTIME ON)
  set(kat_openmp_users "Kokkos's OpenMP backend")
endif()
# oneDNN's CPU threading runtime (dnnl_config.h: DNNL_CPU_THREADING_RUNTIME).
if(KAT_ENABLE_ONEDNN AND TARGET DNNL::dnnl)
  get_target_property(dirs DNNL::dnnl INTERFACE_INCLUDE_DIRECTORIES)
  foreach(dir IN LISTS dirs)
    if(EXISTS "${dir}/oneapi/dnnl/dnnl_config.h")
      file(STRINGS "${dir}/oneapi/dnnl/dnnl_config.h" omp
        REGEX "^#define DNNL_CPU_THREADING_RUNTIME DNNL_RUNTIME_OMP")
      if(omp)
        set(KAT_OPENMP_RUNTIME ON)
        list(APPEND kat_openmp_users "oneDNN")
      endif()
    endif()
  endforeach()
endif()

set(KAT_OPENMP_BLAS_LIBRARIES "")
if(KAT_OPENMP_RUNTIME)
  list(JOIN kat_openmp_users " and " kat_openmp_users)
  if(NOT DEFINED KAT_OPENMP_BLAS_DIR AND CMAKE_LIBRARY_ARCHITECTURE)
    set(KAT_OPENMP_BLAS_DIR "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
  endif()
  if(KAT_OPENMP_BLAS_DIR AND EXISTS "${KAT_OPENMP_BLAS_DIR}/libblas.so.3"
     AND EXISTS "${KAT_OPENMP_BLAS_DIR}/liblapack.so.3")
    set(KAT_OPENMP_BLAS_LIBRARIES
      "${KAT_OPENMP_BLAS_DIR}/liblapack.so.3;${KAT_OPENMP_BLAS_DIR}/libblas.so.3")
    message(STATUS "KAT: ${kat_openmp_users} thread with OpenMP: linking the OpenMP BLAS of "
                   "${KAT_OPENMP_BLAS_DIR}")
  else()
    message(STATUS "KAT: ${kat_openmp_users} thread with OpenMP, but there is no OpenMP OpenBLAS "
                   "in '${KAT_OPENMP_BLAS_DIR}' (Debian: libopenblas0-openmp): the default BLAS "
                   "may start a second thread pool")
  endif()
endif()
