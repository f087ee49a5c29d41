// Conversions between float32 and the half types (weft/dtype.h's rounding),
// split over the intra-op arena.
#include <cstdint>
#include <cstring>
#include <string>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "weft/error.h"

namespace weft::kernels::cpu {
namespace {

float load(DType t, const void* x, std::int64_t i) {
  switch (t) {
    case DType::float32: return static_cast<const float*>(x)[i];
    case DType::bfloat16: return bfloat16_to_float(static_cast<const std::uint16_t*>(x)[i]);
    case DType::float16: return float16_to_float(static_cast<const std::uint16_t*>(x)[i]);
    default: return 0.0f;
  }
}

void require_floating(DType t, const char* role) {
  if (!has_kernels(t))
    throw Error(std::string("cast: ") + role + " dtype " + std::string(to_string(t)) +
                " is not float32, bfloat16 or float16");
}

}  // namespace

void cast(void* y, DType yt, const void* x, DType xt, std::int64_t n) {
  require_floating(yt, "output");
  require_floating(xt, "input");
  if (n <= 0) return;
  if (yt == xt) {
    std::memcpy(y, x, static_cast<std::size_t>(n) * dtype_size(yt));
    return;
  }
  detail::parallel_for(n, detail::grain_for(2), [&](std::int64_t begin, std::int64_t end) {
    switch (yt) {
      case DType::float32:
        for (std::int64_t i = begin; i < end; ++i) static_cast<float*>(y)[i] = load(xt, x, i);
        break;
      case DType::bfloat16:
        for (std::int64_t i = begin; i < end; ++i)
          static_cast<std::uint16_t*>(y)[i] = float_to_bfloat16(load(xt, x, i));
        break;
      case DType::float16:
        for (std::int64_t i = begin; i < end; ++i)
          static_cast<std::uint16_t*>(y)[i] = float_to_float16(load(xt, x, i));
        break;
      default: break;
    }
  });
}

void round_to_tf32(float* y, const float* x, std::int64_t n) {
  detail::parallel_for(n, detail::grain_for(2), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) y[i] = weft::round_to_tf32(x[i]);
  });
}

}  // namespace weft::kernels::cpu
