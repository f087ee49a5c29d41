// Element types, and the exact conversions between float32 and the half
// types. Tensors hold float32, bfloat16 or float16 (the rest name what a
// tensor may be described as, and an op asked for one says so by name).
// Half tensors compute in float32 and round to nearest even on store, on
// every device; docs/design/tensors.md, "Precision".
#pragma once

#include <bit>
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

// The two 16-bit floating types.
constexpr bool is_half(DType t) noexcept { return t == DType::bfloat16 || t == DType::float16; }
// The types tensor ops compute on: float32 and the halves.
constexpr bool has_kernels(DType t) noexcept { return t == DType::float32 || is_half(t); }

// ---- conversions (bit patterns of the 16-bit types) ---------------------
// float32 -> half rounds to nearest, ties to even; NaN stays a (quiet) NaN
// of the same sign, Inf stays Inf, and a value past the type's largest
// finite one rounds to Inf (float16: |x| >= 65520). half -> float32 is exact.

constexpr std::uint16_t float_to_bfloat16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // NaN
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bfloat16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

constexpr std::uint16_t float_to_float16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // NaN
  if (ax >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520: Inf
  if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);            // <= 2^-25: zero
  if (ax < 0x38800000u) {                                                    // a float16 subnormal
    const std::uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = (ax - 0x38000000u) >> 13;  // rebias the exponent (127 -> 15)
  const std::uint32_t rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

constexpr float float16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;  // exact: m < 2^10
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// A float32 with its mantissa rounded to TF32's 10 bits (nearest even):
// what a TF32 tensor core multiplies. NaN and Inf pass unchanged.
constexpr float round_to_tf32(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7F800000u) == 0x7F800000u) return f;
  return std::bit_cast<float>((x + 0xFFFu + ((x >> 13) & 1u)) & ~0x1FFFu);
}

}  // namespace weft
