// Values and references shared by the bfloat16 and float16 collective tests
// (CPU devices, GPUs, MPI ranks). Each value is k * 2^-e with |k| <= 255 and
// 0 <= e <= 6: exact in both half types, and every sum of up to eight of
// them is exact in float32 (16 significant bits at most), whatever the
// order. So a collective that reduces in float32 and rounds once gives
// exactly round(the float64 sum); one that rounded partial sums on the way
// would not, for most elements.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "weft/dtype.h"
#include "weft/parallel/collectives.h"

namespace half_test {

inline float value(int member, std::int64_t i, int salt = 0) {
  const std::int64_t k = ((member + 1) * 7919 + i * 31 + salt * 13) % 511 - 255;
  const int e = static_cast<int>((i + member + salt) % 7);
  return std::ldexp(static_cast<float>(k), -e);
}

inline std::vector<float> values(int member, std::int64_t count, int salt = 0) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) v[static_cast<std::size_t>(i)] = value(member, i, salt);
  return v;
}

// x rounded to `dtype` (nearest even) and widened back.
inline float round_to(weft::DType dtype, float x) {
  if (dtype == weft::DType::bfloat16) return weft::bfloat16_to_float(weft::float_to_bfloat16(x));
  if (dtype == weft::DType::float16) return weft::float16_to_float(weft::float_to_float16(x));
  return x;
}

// The float64 reduction of members 0 .. n - 1 at element i (exact).
inline double reference(int n, std::int64_t i, weft::parallel::ReduceOp op, int salt = 0) {
  double out = value(0, i, salt);
  for (int m = 1; m < n; ++m)
    out = op == weft::parallel::ReduceOp::max ? std::max(out, static_cast<double>(value(m, i, salt)))
                                              : out + value(m, i, salt);
  return out;
}

// What a collective that reduces in float32 and rounds once leaves: the
// exact result, averaged by a float32 multiply by 1/n (as every transport
// does), rounded once.
inline float rounded_once(weft::DType dtype, int n, std::int64_t i, weft::parallel::ReduceOp op, int salt = 0) {
  auto f = static_cast<float>(reference(n, i, op, salt));
  if (op == weft::parallel::ReduceOp::average && n > 1) f *= 1.0f / static_cast<float>(n);
  return round_to(dtype, f);
}

// The unit roundoff of `dtype` (half an ulp, relative).
inline double unit_roundoff(weft::DType dtype) {
  return dtype == weft::DType::bfloat16 ? std::ldexp(1.0, -8) : dtype == weft::DType::float16 ? std::ldexp(1.0, -11)
                                                                                                : std::ldexp(1.0, -24);
}

// A bound on |result - exact| for a reduction that may round each of the
// n - 1 partial sums and the result (NCCL on real GPUs rounds per hop):
// n roundings of at most the sum of magnitudes each.
inline double per_hop_bound(weft::DType dtype, int n, std::int64_t i, int salt = 0) {
  double magnitude = 0;
  for (int m = 0; m < n; ++m) magnitude += std::fabs(value(m, i, salt));
  return static_cast<double>(n) * unit_roundoff(dtype) * magnitude;
}

inline std::string name(weft::DType dtype) { return std::string(weft::to_string(dtype)); }

}  // namespace half_test
