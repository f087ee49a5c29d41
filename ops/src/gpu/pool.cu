// 2-D average and max pooling as own kernels rather than cuDNN: cuDNN's max
// pooling backward needs the forward output (our signature has only x and
// dy) and its tie-breaking is unspecified, while the CPU contract routes the
// gradient to the FIRST maximum of each window in row-major order.
//
// Backward kernels gather: one thread per dx element visits the windows that
// cover it. Overlapping windows (stride < kernel) then need no atomics, the
// result is deterministic, and every dx element is written (overwrite
// semantics, uncovered elements get 0) without a separate memset.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::blocks_for;
using detail::kThreads;

struct Dims {
  std::int64_t h, w, oh, ow, k, s;
};

__device__ inline std::int64_t first_max_offset(const float* plane, const Dims& d, std::int64_t oh, std::int64_t ow,
                                                float* value) {
  const float* win = plane + oh * d.s * d.w + ow * d.s;
  float best = win[0];
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < d.k; ++i)
    for (std::int64_t j = 0; j < d.k; ++j) {
      const float v = win[i * d.w + j];
      if (v > best) {
        best = v;
        at = i * d.w + j;
      }
    }
  if (value != nullptr) *value = best;
  return (oh * d.s) * d.w + ow * d.s + at;
}

template <bool Max>
__global__ void pool_forward_kernel(float* y, const float* x, std::int64_t total, Dims d) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t ow = i % d.ow;
    const std::int64_t oh = (i / d.ow) % d.oh;
    const std::int64_t plane = i / (d.ow * d.oh);
    const float* xp = x + plane * d.h * d.w;
    if constexpr (Max) {
      float best;
      first_max_offset(xp, d, oh, ow, &best);
      y[i] = best;
    } else {
      const float* win = xp + oh * d.s * d.w + ow * d.s;
      float acc = 0.0f;
      for (std::int64_t a = 0; a < d.k; ++a)
        for (std::int64_t b = 0; b < d.k; ++b) acc += win[a * d.w + b];
      y[i] = acc * (1.0f / static_cast<float>(d.k * d.k));
    }
  }
}

// Windows covering input row r are those with oh * s <= r <= oh * s + k - 1.
__device__ inline void covering(std::int64_t r, std::int64_t k, std::int64_t s, std::int64_t n_out, std::int64_t& lo,
                                std::int64_t& hi) {
  lo = r >= k ? (r - k) / s + 1 : 0;
  hi = r / s;
  if (hi > n_out - 1) hi = n_out - 1;
}

template <bool Max>
__global__ void pool_backward_kernel(float* dx, const float* x, const float* dy, std::int64_t total, Dims d) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  // Multiplying by the reciprocal, window by window in (oh, ow) order, is the
  // CPU's arithmetic: the gather gives its sums bit for bit.
  const float inv_area = 1.0f / static_cast<float>(d.k * d.k);
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t iw = i % d.w;
    const std::int64_t ih = (i / d.w) % d.h;
    const std::int64_t plane = i / (d.w * d.h);
    const float* dyp = dy + plane * d.oh * d.ow;
    std::int64_t oh0, oh1, ow0, ow1;
    covering(ih, d.k, d.s, d.oh, oh0, oh1);
    covering(iw, d.k, d.s, d.ow, ow0, ow1);
    float acc = 0.0f;
    for (std::int64_t oh = oh0; oh <= oh1; ++oh)
      for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
        if constexpr (Max) {
          if (first_max_offset(x + plane * d.h * d.w, d, oh, ow, nullptr) == ih * d.w + iw) acc += dyp[oh * d.ow + ow];
        } else {
          acc += dyp[oh * d.ow + ow] * inv_area;
        }
      }
    dx[i] = acc;
  }
}

Dims checked_dims(const PoolGeometry& g, const char* op) {
  if (g.kernel < 1 || g.stride < 1 || g.n < 0 || g.c < 0 || g.h < 0 || g.w < 0)
    throw weft::Error(std::string(op) + ": invalid pooling geometry (kernel " + std::to_string(g.kernel) +
                      ", stride " + std::to_string(g.stride) + ")");
  const std::int64_t oh = g.h >= g.kernel ? g.out_h() : 0;
  const std::int64_t ow = g.w >= g.kernel ? g.out_w() : 0;
  return Dims{g.h, g.w, oh, ow, g.kernel, g.stride};
}

template <bool Max>
void forward(const WorkerHandles& h, float* y, const float* x, const PoolGeometry& g, const char* op) {
  const Dims d = checked_dims(g, op);
  const std::int64_t total = g.n * g.c * d.oh * d.ow;
  if (total <= 0) return;
  pool_forward_kernel<Max><<<blocks_for(total), kThreads, 0, detail::cuda_stream(h)>>>(y, x, total, d);
  WEFT_LAUNCH_CHECK();
}

template <bool Max>
void backward(const WorkerHandles& h, float* dx, const float* x, const float* dy, const PoolGeometry& g,
              const char* op) {
  const Dims d = checked_dims(g, op);
  const std::int64_t total = g.n * g.c * g.h * g.w;
  if (total <= 0) return;
  if (d.oh <= 0 || d.ow <= 0) return detail::zero(h, dx, total);  // no window: no gradient flows
  pool_backward_kernel<Max><<<blocks_for(total), kThreads, 0, detail::cuda_stream(h)>>>(dx, x, dy, total, d);
  WEFT_LAUNCH_CHECK();
}

}  // namespace

void avg_pool2d_forward(const WorkerHandles& h, float* y, const float* x, const PoolGeometry& g) {
  forward<false>(h, y, x, g, "avg_pool2d_forward");
}
void avg_pool2d_backward(const WorkerHandles& h, float* dx, const float* dy, const PoolGeometry& g) {
  backward<false>(h, dx, nullptr, dy, g, "avg_pool2d_backward");
}
void max_pool2d_forward(const WorkerHandles& h, float* y, const float* x, const PoolGeometry& g) {
  forward<true>(h, y, x, g, "max_pool2d_forward");
}
void max_pool2d_backward(const WorkerHandles& h, float* dx, const float* x, const float* dy, const PoolGeometry& g) {
  backward<true>(h, dx, x, dy, g, "max_pool2d_backward");
}

}  // namespace weft::kernels::gpu
