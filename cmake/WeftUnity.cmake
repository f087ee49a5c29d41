# Unity builds for Weft's libraries: each library's sources compile in
# batches of 8 per translation unit, so the standard library, oneTBB and
# Weft's own headers are parsed once per batch instead of once per file. On
# the 2-core CI machine this takes about a minute off each of its three
# builds (measured: CPU seconds per library, engine 103 -> 59, parallel
# 87 -> 59, examples 96 -> 72, devices 21 -> 10). The test binaries too
# (engine tests 71 -> 48 CPU seconds in Release): their files' helpers in
# anonymous namespaces must then have names of their own within a binary,
# and weft-tests-ops batches by helper family (tests/CMakeLists.txt).
# -DWEFT_UNITY=OFF for incremental work on one file.
option(WEFT_UNITY "Compile each library's sources in unity batches" ON)

function(weft_unity target)
  if(WEFT_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    # GCC warns when a class of a source file holds a type from that file's
    # anonymous namespace once the file is included into a batch (it only
    # expects that of headers); in a unity batch it is the same code.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>")
    endif()
  endif()
endfunction()
