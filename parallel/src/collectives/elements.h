// Host element loops of the reducing collectives for every dtype they take
// (internal to parallel/). float32 is reduced as it is; bfloat16 and float16
// are widened to float32, reduced in float32 and rounded to nearest even
// once, where the result is written (docs/design/parallel-collectives.md,
// "Half precision").
#pragma once

#include <cstddef>
#include <cstdint>

#include "weft/dtype.h"

namespace weft::parallel::detail {

// How one dtype's elements load as float32 and store from it.
struct Float32Elements {
  using T = float;
  static float load(T x) noexcept { return x; }
  static T store(float x) noexcept { return x; }
};
struct Bfloat16Elements {
  using T = std::uint16_t;
  static float load(T x) noexcept { return bfloat16_to_float(x); }
  static T store(float x) noexcept { return float_to_bfloat16(x); }
};
struct Float16Elements {
  using T = std::uint16_t;
  static float load(T x) noexcept { return float16_to_float(x); }
  static T store(float x) noexcept { return float_to_float16(x); }
};

// Calls f(Elements{}) for `t` (float32, bfloat16 or float16; the
// collectives refuse the rest at push).
template <class F>
decltype(auto) with_elements(DType t, F&& f) {
  switch (t) {
    case DType::bfloat16: return f(Bfloat16Elements{});
    case DType::float16: return f(Float16Elements{});
    default: return f(Float32Elements{});
  }
}

// n elements of `t` at `src` widened into float32 at `dst`, and back
// (rounded to nearest even).
inline void widen(float* dst, const void* src, DType t, std::int64_t n) {
  with_elements(t, [&](auto e) {
    using E = decltype(e);
    const auto* s = static_cast<const typename E::T*>(src);
    for (std::int64_t i = 0; i < n; ++i) dst[i] = E::load(s[i]);
  });
}
inline void narrow(void* dst, const float* src, DType t, std::int64_t n) {
  with_elements(t, [&](auto e) {
    using E = decltype(e);
    auto* d = static_cast<typename E::T*>(dst);
    for (std::int64_t i = 0; i < n; ++i) d[i] = E::store(src[i]);
  });
}

}  // namespace weft::parallel::detail
