# oneDNN is optional: KAT_ENABLE_ONEDNN defaults to ON when oneDNN's CMake package loads, OFF
# otherwise. A package configuration can fail hard from inside (Debian's dnnl-config.cmake
# calls find_package(OpenCL REQUIRED) while libdnnl-dev only recommends OpenCL's headers), and
# CMake cannot catch that; so the package is first loaded in a separate CMake run
# (cmake/probe_dnnl), and only loaded here when that succeeded. The probe's verdict is cached
# (KAT_ONEDNN_PROBE); delete it from the cache to probe again.
if(NOT DEFINED KAT_ONEDNN_PROBE)
  set(probe_dir "${CMAKE_BINARY_DIR}/CMakeFiles/kat_probe_dnnl")
  file(REMOVE_RECURSE "${probe_dir}")
  set(probe_args)
  foreach(var CMAKE_PREFIX_PATH dnnl_DIR CMAKE_C_COMPILER CMAKE_CXX_COMPILER)
    if(DEFINED ${var})
      list(JOIN ${var} "\\;" value)
      list(APPEND probe_args "-D${var}=${value}")
    endif()
  endforeach()
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}/probe_dnnl" -B "${probe_dir}"
      ${probe_args}
    RESULT_VARIABLE probe_result OUTPUT_VARIABLE probe_output ERROR_VARIABLE probe_output)
  if(probe_result EQUAL 0)
    set(probe_verdict "usable")
  elseif(probe_output MATCHES "Could not find a package configuration file provided by \"dnnl\"")
    set(probe_verdict "not installed")
  else()
    # The package's own error: "Could NOT find OpenCL (missing: ...)", else the first error's
    # first line of text.
    string(REGEX MATCH "Could NOT find [^\n]*" first "${probe_output}")
    if(NOT first)
      string(REGEX MATCH "CMake Error[^\n]*\n[^\n]*" first "${probe_output}")
      string(REGEX REPLACE "[\n ]+" " " first "${first}")
    endif()
    set(probe_verdict "installed but its CMake package fails: ${first}")
  endif()
  set(KAT_ONEDNN_PROBE "${probe_verdict}" CACHE INTERNAL "oneDNN package probe (cmake/KATOneDNN.cmake)")
endif()
set(dnnl_FOUND FALSE)
if(KAT_ONEDNN_PROBE STREQUAL "usable")
  find_package(dnnl CONFIG QUIET)
endif()
option(KAT_ENABLE_ONEDNN
  "Conv2d, BatchNorm2d and float GEMMs on host memory through oneDNN (kat/core/dnn.hpp, kat/core/blas.hpp)"
  ${dnnl_FOUND})
if(KAT_ENABLE_ONEDNN AND NOT dnnl_FOUND)
  message(FATAL_ERROR "KAT_ENABLE_ONEDNN is ON but oneDNN is ${KAT_ONEDNN_PROBE}; install "
                      "libdnnl-dev and ocl-icd-opencl-dev (scripts/setup.sh does) or set dnnl_DIR")
endif()
if(NOT dnnl_FOUND)
  message(STATUS "KAT: building without oneDNN: it is ${KAT_ONEDNN_PROBE} (KAT's own kernels and the system BLAS serve host memory)")
endif()
