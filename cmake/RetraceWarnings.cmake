# Warnings for retrace's own targets (never for dependencies).
function(retrace_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough)
  if(RETRACE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
