# Applies WEFT_SANITIZE to every target defined after this point.
if(WEFT_SANITIZE)
  string(REPLACE ";" "," _weft_san "${WEFT_SANITIZE}")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_weft_san};-fno-omit-frame-pointer;-g>")
  add_link_options(-fsanitize=${_weft_san})
  # The sanitizer builds are where CI checks the invariants: their asserts stay
  # on even in RelWithDebInfo.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-UNDEBUG>)
  if("thread" IN_LIST WEFT_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # TSan does not model atomic_thread_fence; the worker pool's one fence only
    # orders its wake-up check (the data itself passes through release/acquire
    # operations TSan does see), so the warning carries no news.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-tsan>)
  endif()
  if("undefined" IN_LIST WEFT_SANITIZE)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  endif()
  message(STATUS "weft: sanitizers ${_weft_san}")
endif()
