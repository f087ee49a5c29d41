// Element types of the .cu kernels: loads into float32 and stores that round
// to nearest even, and the once-per-call dispatch from DType to a type. Half
// conversions give the bits of weft/dtype.h's host conversions, NaN included
// (cuda_bf16.h / cuda_fp16.h alone would canonicalize a NaN's payload).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_internal.h"
#include "weft/dtype.h"

namespace weft::kernels::gpu::detail {

using bf16 = __nv_bfloat16;
using f16 = __half;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }  // exact (a shift)
__device__ __forceinline__ float to_float(f16 v) {
  const unsigned b = __half_as_ushort(v);
  if ((b & 0x7C00u) == 0x7C00u && (b & 0x3FFu) != 0u)  // NaN: keep sign and payload
    return __uint_as_float(((b & 0x8000u) << 16) | 0x7F800000u | ((b & 0x3FFu) << 13));
  return __half2float(v);  // exact
}

template <class T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float f) {
  const unsigned x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return __ushort_as_bfloat16(static_cast<unsigned short>((x >> 16) | 0x0040u));
  return __float2bfloat16_rn(f);
}
template <>
__device__ __forceinline__ f16 from_float<f16>(float f) {
  const unsigned x = __float_as_uint(f);
  const unsigned ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u)
    return __ushort_as_half(static_cast<unsigned short>(((x >> 16) & 0x8000u) | 0x7E00u | ((ax >> 13) & 0x3FFu)));
  return __float2half_rn(f);  // overflow (|f| >= 65520) gives Inf, subnormals round to nearest even
}

template <class T>
__device__ __forceinline__ float load(const T* p, std::int64_t i) {
  return to_float(p[i]);
}
template <class T>
__device__ __forceinline__ void store(T* p, std::int64_t i, float v) {
  p[i] = from_float<T>(v);
}

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the element type of `t`; a dtype without GPU
// kernels throws weft::Error naming the kernel and the dtype.
template <class F>
void dispatch(DType t, const char* kernel, F&& f) {
  switch (t) {
    case DType::float32: return f(TypeTag<float>{});
    case DType::bfloat16: return f(TypeTag<bf16>{});
    case DType::float16: return f(TypeTag<f16>{});
    default: break;
  }
  unsupported_dtype(kernel, t);
}

}  // namespace weft::kernels::gpu::detail
