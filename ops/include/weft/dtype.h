// Element types. Only float32 has kernels today; the rest exist so that shapes,
// storage sizes and error messages already speak of them, and an op asked for
// one it lacks says so by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace weft {

enum class DType : std::uint8_t { float32, float64, float16, bfloat16, int32, int64, uint8 };

constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::float64:
    case DType::int64: return 8;
    case DType::float32:
    case DType::int32: return 4;
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::uint8: return 1;
  }
  return 0;
}

constexpr std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
  }
  return "?";
}

}  // namespace weft
