#include "weft/precision.h"

#include <string>

#include "weft/error.h"

namespace weft {

std::string_view to_string(Precision p) noexcept {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

Precision parse_precision(std::string_view text, std::string_view what) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16})
    if (text == to_string(p)) return p;
  throw InvalidArgument(std::string(what) + ": '" + std::string(text) + "' is not one of fp32, tf32, bf16, fp16");
}

DType compute_dtype(Precision p) noexcept {
  switch (p) {
    case Precision::bf16: return DType::bfloat16;
    case Precision::fp16: return DType::float16;
    default: return DType::float32;
  }
}

}  // namespace weft
