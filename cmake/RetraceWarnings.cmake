# Warnings for retrace's own targets (never for dependencies). CUDA sources get the host
# compiler's warnings through nvcc's -Xcompiler and nvcc's own -Werror=all-warnings.
function(retrace_warnings target)
  set(flags -Wall -Wextra -Wshadow -Wcast-align -Wimplicit-fallthrough)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${flags} -Wpedantic -Wnon-virtual-dtor -Woverloaded-virtual>)
  if(RETRACE_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endfunction()
