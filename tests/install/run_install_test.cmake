# Installs KAT from the build tree into a scratch prefix, then configures, builds and runs a
# tiny consumer that uses find_package(KAT).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${KAT_BINARY_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${KAT_SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/build
    "-DCMAKE_PREFIX_PATH=${prefix};${CMAKE_PREFIX_PATH}" -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/kat_consumer)
message(STATUS "consumer built against the installed KAT and ran")
