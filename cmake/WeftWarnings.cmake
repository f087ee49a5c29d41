# Warnings for Weft's own targets. Designated initializers that leave fields
# at their defaults (EngineConfig{.kind = "naive"}) are the intended style, so
# -Wmissing-field-initializers is off.
function(weft_warnings target)
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wno-missing-field-initializers>")
endfunction()
