# cmake -DCOMMAND=prog -DARGS="a;b" -DEXPECTED=N -P expect_status.cmake: runs the command and
# fails unless it exits with status N.
execute_process(COMMAND ${COMMAND} ${ARGS} RESULT_VARIABLE status OUTPUT_QUIET ERROR_QUIET)
if(NOT status EQUAL EXPECTED)
  message(FATAL_ERROR "${COMMAND} ${ARGS}: exit status ${status}, expected ${EXPECTED}")
endif()
