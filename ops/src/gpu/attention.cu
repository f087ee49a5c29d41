// Causal attention on CUDA from batched GEMMs and one row kernel
// (docs/design/attention.md, "CUDA"). The scores of every plane are
// materialized in float32 in the caller's memory ([planes, t, t]); the
// probabilities (and in backward the score gradients) are written over them
// in the data's dtype, at the start of each row (a half row of t elements
// takes the first half of its float32 row), so the GEMMs read them with a
// leading dimension of t * 4 / sizeof(element). The causal triangle is cut
// into row chunks: chunk c's rows see keys [0, end of chunk c) only, so the
// GEMMs skip most of the masked upper half.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "element.cuh"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::dispatch;
using detail::from_float;
using detail::kThreads;
using detail::load;
using i64 = std::int64_t;

constexpr int kAttnWarp = 32;

// Rows per chunk of the causal triangle: at least 256 (GEMMs of fewer rows
// lose more to launches than the mask saves), at most 8 chunks, a multiple
// of 64 (aligned halves for the tensor cores).
i64 attention_chunk_rows(i64 t) {
  const i64 eighth = (t + 7) / 8;
  return std::max<i64>(256, (eighth + 63) / 64 * 64);
}

__device__ inline float attn_warp_max(float v) {
  for (int offset = kAttnWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ inline float attn_warp_sum(float v) {
  for (int offset = kAttnWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One warp per row r (plane r / t, query i = r % t), grid-stride: one read
// of the row's scores s[0..i] gives its max m and sum l of exp(s - m), then
// lse = m + log l;
// p_j = exp(s_j - m) / l for j <= i and 0 past the diagonal up to the end of
// the row's chunk are stored as T over the row's own memory. Lanes read a
// stretch of 32 scores before any lane stores over it (__syncwarp): a half
// store at j lands on score j / 2, already read.
template <class T>
__global__ void attention_softmax_rows(float* s, float* lse, i64 rows, i64 t, i64 chunk) {
  const i64 warp = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / kAttnWarp;
  const i64 warps = static_cast<i64>(gridDim.x) * blockDim.x / kAttnWarp;
  const int lane = static_cast<int>(threadIdx.x % kAttnWarp);
  for (i64 r = warp; r < rows; r += warps) {
    const i64 i = r % t;
    const i64 chunk_end = (i / chunk + 1) * chunk;
    const i64 end = chunk_end < t ? chunk_end : t;
    float* z = s + r * t;
    // One pass for max and sum: each lane keeps its own running pair,
    // rescaled when its max grows, and the warp combines them.
    float lane_m = -INFINITY, lane_l = 0.0f;
    for (i64 j = lane; j <= i; j += kAttnWarp) {
      const float x = z[j];
      if (x > lane_m) {
        lane_l = lane_l * expf(lane_m - x) + 1.0f;
        lane_m = x;
      } else {
        lane_l += expf(x - lane_m);
      }
    }
    const float m = attn_warp_max(lane_m);
    const float l = attn_warp_sum(lane_m == -INFINITY ? 0.0f : lane_l * expf(lane_m - m));
    if (lane == 0) lse[r] = m + logf(l);
    const float inv = 1.0f / l;
    T* p = reinterpret_cast<T*>(z);
    for (i64 j0 = 0; j0 < end; j0 += kAttnWarp) {
      const i64 j = j0 + lane;
      const float v = j <= i ? expf(z[j] - m) * inv : 0.0f;
      __syncwarp();
      if (j < end) p[j] = from_float<T>(v);
      __syncwarp();
    }
  }
}

// Backward's row kernel, one warp per row as above: delta = dout_i . out_i,
// then for j <= i, p = exp(s_j - lse_i) and ds = p (dp_j - delta); p over
// the scores' row and ds over dp's row, both as T, zeros past the diagonal
// up to the end of the row's chunk.
template <class T>
__global__ void attention_backward_rows(float* s, float* dp, const float* lse, const T* out, const T* dout, i64 rows,
                                        i64 t, i64 d, i64 chunk) {
  const i64 warp = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / kAttnWarp;
  const i64 warps = static_cast<i64>(gridDim.x) * blockDim.x / kAttnWarp;
  const int lane = static_cast<int>(threadIdx.x % kAttnWarp);
  for (i64 r = warp; r < rows; r += warps) {
    const i64 i = r % t;
    const i64 chunk_end = (i / chunk + 1) * chunk;
    const i64 end = chunk_end < t ? chunk_end : t;
    float delta = 0.0f;
    for (i64 c = lane; c < d; c += kAttnWarp) delta += load(dout, r * d + c) * load(out, r * d + c);
    delta = attn_warp_sum(delta);
    const float row_lse = lse[r];
    float* zs = s + r * t;
    float* zg = dp + r * t;
    T* p = reinterpret_cast<T*>(zs);
    T* ds = reinterpret_cast<T*>(zg);
    for (i64 j0 = 0; j0 < end; j0 += kAttnWarp) {
      const i64 j = j0 + lane;
      float pv = 0.0f, gv = 0.0f;
      if (j <= i) {
        pv = expf(zs[j] - row_lse);
        gv = pv * (zg[j] - delta);
      }
      __syncwarp();
      if (j < end) {
        p[j] = from_float<T>(pv);
        ds[j] = from_float<T>(gv);
      }
      __syncwarp();
    }
  }
}

unsigned attention_row_blocks(i64 rows) {
  constexpr i64 warps_per_block = kThreads / kAttnWarp;
  return detail::blocks_for((rows + warps_per_block - 1) / warps_per_block * kThreads);
}

// Byte offsets into dtype-typed memory.
const void* at(const void* p, i64 elements, std::size_t elem) {
  return static_cast<const unsigned char*>(p) + static_cast<std::size_t>(elements) * elem;
}
void* at(void* p, i64 elements, std::size_t elem) {
  return static_cast<unsigned char*>(p) + static_cast<std::size_t>(elements) * elem;
}

// Chunk c's scores: dst[:, r0:r1, 0:r1] = alpha a[:, r0:r1] b[:, 0:r1]^T (float32).
void chunk_scores(const WorkerHandles& h, DType dt, float* dst, const void* a, const void* b, float alpha, i64 planes,
                  i64 t, i64 d, i64 r0, i64 r1) {
  const std::size_t elem = dtype_size(dt);
  detail::gemm_batched_float_out(h, dt, false, true, planes, r1 - r0, r1, d, alpha, at(a, r0 * d, elem), d, t * d, b,
                                 d, t * d, 0.0f, dst + r0 * t, t, t * t);
}

}  // namespace

void causal_attention_forward(const WorkerHandles& h, DType dt, void* out, float* lse, const void* q, const void* k,
                              const void* v, i64 planes, i64 t, i64 d, float scale, float* scores) {
  if (planes <= 0 || t <= 0) return;
  dispatch(dt, "causal_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::size_t elem = sizeof(T);
    const i64 ld_p = t * static_cast<i64>(sizeof(float) / elem);  // P over the scores, in T elements
    const i64 chunk = attention_chunk_rows(t);
    for (i64 r0 = 0; r0 < t; r0 += chunk)
      chunk_scores(h, dt, scores, q, k, scale, planes, t, d, r0, std::min(t, r0 + chunk));
    attention_softmax_rows<T><<<attention_row_blocks(planes * t), kThreads, 0, detail::cuda_stream(h)>>>(
        scores, lse, planes * t, t, chunk);
    WEFT_LAUNCH_CHECK();
    // out[:, r0:r1] = P[:, r0:r1, 0:r1] v[:, 0:r1], rounded once to T.
    for (i64 r0 = 0; r0 < t; r0 += chunk) {
      const i64 r1 = std::min(t, r0 + chunk);
      gemm_batched(h, dt, false, false, false, planes, r1 - r0, d, r1, 1.0f, at(scores, r0 * ld_p, elem), ld_p,
                   t * ld_p, v, d, t * d, 0.0f, at(out, r0 * d, elem), d, t * d);
    }
  });
}

void causal_attention_backward(const WorkerHandles& h, DType dt, void* dq, void* dk, void* dv, const void* q,
                               const void* k, const void* v, const void* out, const void* dout, const float* lse,
                               i64 planes, i64 t, i64 d, float scale, float* scores) {
  if (planes <= 0 || t <= 0) return;
  dispatch(dt, "causal_attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::size_t elem = sizeof(T);
    const i64 ld_p = t * static_cast<i64>(sizeof(float) / elem);
    const i64 stride = t * ld_p;
    const i64 chunk = attention_chunk_rows(t);
    float* s = scores;
    float* dp = scores + planes * t * t;
    // Scores again (scale q k^T) and dp = dout v^T, chunk by chunk.
    for (i64 r0 = 0; r0 < t; r0 += chunk) {
      const i64 r1 = std::min(t, r0 + chunk);
      chunk_scores(h, dt, s, q, k, scale, planes, t, d, r0, r1);
      chunk_scores(h, dt, dp, dout, v, 1.0f, planes, t, d, r0, r1);
    }
    attention_backward_rows<T><<<attention_row_blocks(planes * t), kThreads, 0, detail::cuda_stream(h)>>>(
        s, dp, lse, static_cast<const T*>(out), static_cast<const T*>(dout), planes * t, t, d, chunk);
    WEFT_LAUNCH_CHECK();
    for (i64 c0 = 0; c0 < t; c0 += chunk) {
      const i64 c1 = std::min(t, c0 + chunk);
      // Rows r0:r1 = c0:c1: dq = scale ds[:, r0:r1, 0:r1] k[:, 0:r1].
      gemm_batched(h, dt, false, false, false, planes, c1 - c0, d, c1, scale, at(dp, c0 * ld_p, elem), ld_p, stride,
                   k, d, t * d, 0.0f, at(dq, c0 * d, elem), d, t * d);
      // Keys c0:c1, seen by queries c0:t: dv = p[:, c0:t, c0:c1]^T dout[:, c0:t]
      // and dk = scale ds[:, c0:t, c0:c1]^T q[:, c0:t].
      gemm_batched(h, dt, false, true, false, planes, c1 - c0, d, t - c0, 1.0f, at(s, c0 * ld_p + c0, elem), ld_p,
                   stride, at(dout, c0 * d, elem), d, t * d, 0.0f, at(dv, c0 * d, elem), d, t * d);
      gemm_batched(h, dt, false, true, false, planes, c1 - c0, d, t - c0, scale, at(dp, c0 * ld_p + c0, elem), ld_p,
                   stride, at(q, c0 * d, elem), d, t * d, 0.0f, at(dk, c0 * d, elem), d, t * d);
    }
  });
}

}  // namespace weft::kernels::gpu
