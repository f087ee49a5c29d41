// Element types of the .cu kernels: loads into float32 and stores that round
// to nearest even, and the once-per-call dispatch from DType to a type. Half
// conversions give the bits of weft/dtype.h's host conversions, NaN included
// (cuda_bf16.h / cuda_fp16.h alone would canonicalize a NaN's payload).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpu_internal.h"
#include "launch.cuh"
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

// N consecutive elements moved by one access: 16 bytes (one 128-bit load or
// store) for 8 halves or 4 floats, two for 8 floats. Aligned to 16 bytes
// (or its own size, when smaller), so a Pack pointer must be too.
template <class T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) Pack {
  T v[N];
};

// Elements per pack for a kernel reading X... and writing Y: 16 bytes of the
// narrowest type (8 when a half is involved, 4 for float32 alone).
template <class Y, class... X>
inline constexpr int kPackWidth = static_cast<int>(16 / std::min({sizeof(Y), sizeof(X)...}));

__host__ __device__ inline bool aligned16(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// y[i] = op(x[i]...) for i < n, as float32 values rounded once on store.
// Thread k takes packs k, k + stride, ... (grid-stride), then the last
// n % N elements one each; with N == 1 it is the one-element kernel. Each
// thread reads a whole pack before writing it, so y may be one of the x.
template <int N, class Op, class Y, class... X>
__global__ void elementwise_kernel(std::int64_t n, Op op, Y* y, const X*... x) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t packs = n / N;
  for (std::int64_t p = first; p < packs; p += stride) {
    Pack<Y, N> out;
    [&](const auto&... in) {
#pragma unroll
      for (int j = 0; j < N; ++j) out.v[j] = from_float<Y>(op(to_float(in.v[j])...));
    }(reinterpret_cast<const Pack<X, N>*>(x)[p]...);
    reinterpret_cast<Pack<Y, N>*>(y)[p] = out;
  }
  for (std::int64_t i = packs * N + first; i < n; i += stride) y[i] = from_float<Y>(op(to_float(x[i])...));
}

// Launches elementwise_kernel on the worker's stream: in packs of
// kPackWidth<Y, X...> when every pointer is 16-byte aligned (a tensor's own
// storage always is; a view at an odd offset may not be), else element by
// element. n may be 0.
template <class Op, class Y, class... X>
void launch_elementwise(const WorkerHandles& h, std::int64_t n, Op op, Y* y, const X*... x) {
  if (n <= 0) return;
  constexpr int N = kPackWidth<Y, X...>;
  if (aligned16(y) && (aligned16(x) && ...))
    elementwise_kernel<N><<<blocks_for((n + N - 1) / N), kThreads, 0, cuda_stream(h)>>>(n, op, y, x...);
  else
    elementwise_kernel<1><<<blocks_for(n), kThreads, 0, cuda_stream(h)>>>(n, op, y, x...);
  WEFT_LAUNCH_CHECK();
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
