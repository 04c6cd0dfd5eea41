# Installs KAT from the build tree into a scratch prefix, then configures, builds and runs a
# tiny consumer that uses find_package(KAT), with the build's compiler and prefix path. The
# consumer checks that it found the same Kokkos as the build (tests/install/consumer).
#   -DSETTINGS=<file>  written by tests/CMakeLists.txt: KAT_SOURCE_DIR, KAT_BINARY_DIR,
#                      WORK_DIR, KAT_PREFIX_PATH, KAT_CXX_COMPILER, KAT_EXPECTED_KOKKOS_*
include(${SETTINGS})
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

# The consumer's cache, written as a script so that list values keep their ';'.
set(search_path ${prefix} ${KAT_PREFIX_PATH})
file(WRITE ${WORK_DIR}/initial_cache.cmake
  "set(CMAKE_PREFIX_PATH [==[${search_path}]==] CACHE STRING \"\")\n"
  "set(CMAKE_CXX_COMPILER [==[${KAT_CXX_COMPILER}]==] CACHE FILEPATH \"\")\n"
  "set(CMAKE_BUILD_TYPE Release CACHE STRING \"\")\n"
  "set(KAT_EXPECTED_KOKKOS_DIR [==[${KAT_EXPECTED_KOKKOS_DIR}]==] CACHE PATH \"\")\n"
  "set(KAT_EXPECTED_KOKKOS_VERSION [==[${KAT_EXPECTED_KOKKOS_VERSION}]==] CACHE STRING \"\")\n")

run(${CMAKE_COMMAND} --install ${KAT_BINARY_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -C ${WORK_DIR}/initial_cache.cmake -S ${KAT_SOURCE_DIR}/tests/install/consumer
    -B ${WORK_DIR}/build)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/kat_consumer)
message(STATUS "consumer built against the installed KAT with Kokkos ${KAT_EXPECTED_KOKKOS_VERSION} "
               "from ${KAT_EXPECTED_KOKKOS_DIR} and ran")
