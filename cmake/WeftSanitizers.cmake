# Applies WEFT_SANITIZE to every target defined after this point.
if(WEFT_SANITIZE)
  string(REPLACE ";" "," _weft_san "${WEFT_SANITIZE}")
  # Reports need file:line, not variables: line tables (-g1) are enough. The
  # sanitizer presets set RelWithDebInfo to -O1 -g1 (CMakePresets.json), half
  # the compile time of -O2 -g (tests/engine/test_errors.cpp under ASan: 24 s
  # against 50). Builds without debug info of their own (Release) get line
  # tables here; Debug and RelWithDebInfo keep what they have.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_weft_san};-fno-omit-frame-pointer>"
                      "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release,MinSizeRel>>:-g1>")
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

# The test binaries' own translation units under ASan + UBSan: UBSan nearly
# doubles their compile time (tests/engine/test_scheduling.cpp at -O1 -g1: 11.0 s
# with -fsanitize=address, 19.8 s with address,undefined; CI compiles 43 such
# files), and what it would check there is the tests' own code. The libraries
# they link and the examples keep every sanitizer.
function(weft_test_sanitizers target)
  if("undefined" IN_LIST WEFT_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize=undefined>)
  endif()
endfunction()
