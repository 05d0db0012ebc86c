# MODE=install: installs the build tree into WORK_DIR/prefix, then configures, builds and runs
# the consumer's programs (the core and CPU device; the models) with find_package(retrace). MODE=subdirectory: the consumer adds retrace's sources
# with add_subdirectory (SOURCE_DIR) and builds them itself.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} --install ${RETRACE_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  set(configure -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  set(configure -DRETRACE_SOURCE_DIR=${SOURCE_DIR} -DRETRACE_WITH_CUDA=OFF)
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_BUILD_TYPE=Release ${configure})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
run(${WORK_DIR}/build/consumer_models)
