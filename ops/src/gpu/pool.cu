// 2-D average and max pooling (with implicit padding, windows clipped to the
// input as on the CPU) and global average pooling as own kernels rather than cuDNN: cuDNN's max
// pooling backward needs the forward output (our signature has only x and
// dy) and its tie-breaking is unspecified, while the CPU contract routes the
// gradient to the FIRST maximum of each window in row-major order. Every
// kernel is templated on the element type: loads into float32, sums in
// float32 (global average: double), one rounding on store.
//
// Channels-last data (PoolGeometry::nhwc) takes the same loops with strided
// planes: a thread's element is decomposed in the layout's order, and the
// values of its plane lie `step` (C) apart.
//
// Backward kernels gather: one thread per dx element visits the windows that
// cover it. Overlapping windows (stride < kernel) then need no atomics, the
// result is deterministic, and every dx element is written (overwrite
// semantics, uncovered elements get 0) without a separate memset.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "element.cuh"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::blocks_for;
using detail::dispatch;
using detail::load;
using detail::store;
using detail::kThreads;

struct Dims {
  std::int64_t h, w, oh, ow, k, s, pad;
  std::int64_t c;  // channels
  bool nhwc;
  __host__ __device__ std::int64_t step() const { return nhwc ? c : 1; }
};

// Element i of an [n, c, rows, cols] tensor in d's layout: its image, channel,
// row and column, and where its plane starts.
struct Place {
  std::int64_t n, ch, r, col, base;
};
__device__ inline Place place_of(const Dims& d, std::int64_t i, std::int64_t rows, std::int64_t cols) {
  Place p;
  if (d.nhwc) {
    p.ch = i % d.c;
    p.col = (i / d.c) % cols;
    p.r = (i / (d.c * cols)) % rows;
    p.n = i / (d.c * cols * rows);
    p.base = p.n * rows * cols * d.c + p.ch;
  } else {
    p.col = i % cols;
    p.r = (i / cols) % rows;
    const std::int64_t plane = i / (cols * rows);
    p.n = plane / d.c;
    p.ch = plane % d.c;
    p.base = plane * rows * cols;
  }
  return p;
}
// Where the plane of (n, ch) starts in a tensor of rows x cols planes.
__device__ inline std::int64_t plane_base(const Dims& d, std::int64_t n, std::int64_t ch, std::int64_t rows,
                                          std::int64_t cols) {
  return d.nhwc ? n * rows * cols * d.c + ch : (n * d.c + ch) * rows * cols;
}

// The part of window (oh, ow) inside the input, as on the CPU: rows [r0, r1),
// columns [c0, c1).
struct Window {
  std::int64_t r0, r1, c0, c1;
};

__device__ inline Window window_of(const Dims& d, std::int64_t oh, std::int64_t ow) {
  const std::int64_t r = oh * d.s - d.pad, c = ow * d.s - d.pad;
  Window win;
  win.r0 = r > 0 ? r : 0;
  win.r1 = r + d.k < d.h ? r + d.k : d.h;
  win.c0 = c > 0 ? c : 0;
  win.c1 = c + d.k < d.w ? c + d.k : d.w;
  return win;
}

// Plane offset of the window's first largest element in row-major order.
template <class T>
__device__ inline std::int64_t first_max_offset(const T* plane, const Dims& d, std::int64_t oh, std::int64_t ow,
                                                float* value) {
  const Window win = window_of(d, oh, ow);
  const std::int64_t st = d.step();
  std::int64_t at = win.r0 * d.w + win.c0;
  float best = load(plane, at * st);
  for (std::int64_t i = win.r0; i < win.r1; ++i)
    for (std::int64_t j = win.c0; j < win.c1; ++j) {
      const float v = load(plane, (i * d.w + j) * st);
      if (v > best) {
        best = v;
        at = i * d.w + j;
      }
    }
  if (value != nullptr) *value = best;
  return at;
}

template <bool Max, class T>
__global__ void pool_forward_kernel(T* y, const T* x, std::int64_t total, Dims d) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const Place at = place_of(d, i, d.oh, d.ow);
    const std::int64_t ow = at.col, oh = at.r, st = d.step();
    const T* xp = x + plane_base(d, at.n, at.ch, d.h, d.w);
    if constexpr (Max) {
      float best;
      first_max_offset(xp, d, oh, ow, &best);
      store(y, i, best);
    } else {
      const Window win = window_of(d, oh, ow);
      float acc = 0.0f;
      for (std::int64_t a = win.r0; a < win.r1; ++a)
        for (std::int64_t b = win.c0; b < win.c1; ++b) acc += load(xp, (a * d.w + b) * st);
      store(y, i, acc * (1.0f / static_cast<float>(d.k * d.k)));
    }
  }
}

// Windows covering input row r (padded coordinate r + pad) are those with
// oh * s <= r + pad <= oh * s + k - 1.
__device__ inline void covering(std::int64_t r, std::int64_t k, std::int64_t s, std::int64_t pad, std::int64_t n_out,
                                std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t rp = r + pad;
  lo = rp >= k ? (rp - k) / s + 1 : 0;
  hi = rp / s;
  if (hi > n_out - 1) hi = n_out - 1;
}

template <bool Max, class T>
__global__ void pool_backward_kernel(T* dx, const T* x, const T* dy, std::int64_t total, Dims d) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  // Multiplying by the reciprocal, window by window in (oh, ow) order, is the
  // CPU's arithmetic: the gather gives its sums bit for bit.
  const float inv_area = 1.0f / static_cast<float>(d.k * d.k);
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const Place at = place_of(d, i, d.h, d.w);
    const std::int64_t iw = at.col, ih = at.r, st = d.step();
    const T* dyp = dy + plane_base(d, at.n, at.ch, d.oh, d.ow);
    std::int64_t oh0, oh1, ow0, ow1;
    covering(ih, d.k, d.s, d.pad, d.oh, oh0, oh1);
    covering(iw, d.k, d.s, d.pad, d.ow, ow0, ow1);
    float acc = 0.0f;
    for (std::int64_t oh = oh0; oh <= oh1; ++oh)
      for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
        if constexpr (Max) {
          if (first_max_offset(x + at.base, d, oh, ow, nullptr) == ih * d.w + iw)
            acc += load(dyp, (oh * d.ow + ow) * st);
        } else {
          acc += load(dyp, (oh * d.ow + ow) * st) * inv_area;
        }
      }
    store(dx, i, acc);
  }
}

// One warp per plane: lanes stride over the plane, partial sums in double,
// then a fixed shuffle tree (deterministic, not the CPU's serial order).
template <class T>
__global__ void global_avg_forward_kernel(T* y, const T* x, std::int64_t planes, std::int64_t hw) {
  const std::int64_t warps = static_cast<std::int64_t>(blockDim.x) * gridDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (std::int64_t p = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; p < planes;
       p += warps) {
    const T* xp = x + p * hw;
    double s = 0.0;
    for (std::int64_t i = lane; i < hw; i += 32) s += load(xp, i);
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) store(y, p, hw > 0 ? static_cast<float>(s / static_cast<double>(hw)) : 0.0f);
  }
}

// NHWC: plane p = (image p / c, channel p % c), its values c apart.
template <class T>
__global__ void global_avg_forward_nhwc_kernel(T* y, const T* x, std::int64_t planes, std::int64_t hw,
                                               std::int64_t c) {
  const std::int64_t warps = static_cast<std::int64_t>(blockDim.x) * gridDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (std::int64_t p = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; p < planes;
       p += warps) {
    const T* xp = x + (p / c) * hw * c + p % c;
    double s = 0.0;
    for (std::int64_t i = lane; i < hw; i += 32) s += load(xp, i * c);
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) store(y, p, hw > 0 ? static_cast<float>(s / static_cast<double>(hw)) : 0.0f);
  }
}

template <class T>
__global__ void global_avg_backward_nhwc_kernel(T* dx, const T* dy, std::int64_t total, std::int64_t hw,
                                                std::int64_t c, float inv) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    store(dx, i, load(dy, (i / (hw * c)) * c + i % c) * inv);
}

template <class T>
__global__ void global_avg_backward_kernel(T* dx, const T* dy, std::int64_t total, std::int64_t hw, float inv) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    store(dx, i, load(dy, i / hw) * inv);
}

Dims checked_dims(const PoolGeometry& g, const char* op) {
  if (g.kernel < 1 || g.stride < 1 || g.pad < 0 || 2 * g.pad > g.kernel || g.n < 0 || g.c < 0 || g.h < 0 || g.w < 0)
    throw weft::Error(std::string(op) + ": invalid pooling geometry (kernel " + std::to_string(g.kernel) +
                      ", stride " + std::to_string(g.stride) + ", pad " + std::to_string(g.pad) + ")");
  const std::int64_t oh = g.h + 2 * g.pad >= g.kernel ? g.out_h() : 0;
  const std::int64_t ow = g.w + 2 * g.pad >= g.kernel ? g.out_w() : 0;
  return Dims{g.h, g.w, oh, ow, g.kernel, g.stride, g.pad, g.c, g.nhwc};
}

template <bool Max>
void forward(const WorkerHandles& h, DType t, void* y, const void* x, const PoolGeometry& g, const char* op) {
  dispatch(t, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Dims d = checked_dims(g, op);
    const std::int64_t total = g.n * g.c * d.oh * d.ow;
    if (total <= 0) return;
    pool_forward_kernel<Max, T><<<blocks_for(total), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(y), static_cast<const T*>(x), total, d);
    WEFT_LAUNCH_CHECK();
  });
}

template <bool Max>
void backward(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy, const PoolGeometry& g,
              const char* op) {
  dispatch(t, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Dims d = checked_dims(g, op);
    const std::int64_t total = g.n * g.c * g.h * g.w;
    if (total <= 0) return;
    if (d.oh <= 0 || d.ow <= 0) return detail::zero(h, t, dx, total);  // no window: no gradient flows
    pool_backward_kernel<Max, T><<<blocks_for(total), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(dx), static_cast<const T*>(x), static_cast<const T*>(dy), total, d);
    WEFT_LAUNCH_CHECK();
  });
}

}  // namespace

void avg_pool2d_forward(const WorkerHandles& h, DType t, void* y, const void* x, const PoolGeometry& g) {
  forward<false>(h, t, y, x, g, "avg_pool2d_forward");
}
void avg_pool2d_backward(const WorkerHandles& h, DType t, void* dx, const void* dy, const PoolGeometry& g) {
  backward<false>(h, t, dx, nullptr, dy, g, "avg_pool2d_backward");
}
void max_pool2d_forward(const WorkerHandles& h, DType t, void* y, const void* x, const PoolGeometry& g) {
  forward<true>(h, t, y, x, g, "max_pool2d_forward");
}
void max_pool2d_backward(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy,
                         const PoolGeometry& g) {
  backward<true>(h, t, dx, x, dy, g, "max_pool2d_backward");
}

void global_avg_pool2d_forward(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t planes,
                               std::int64_t hw) {
  dispatch(t, "global_avg_pool2d_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (planes <= 0) return;
    global_avg_forward_kernel<T><<<blocks_for(planes * 32), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(y), static_cast<const T*>(x), planes, hw);
    WEFT_LAUNCH_CHECK();
  });
}

void global_avg_pool2d_backward(const WorkerHandles& h, DType t, void* dx, const void* dy, std::int64_t planes,
                                std::int64_t hw) {
  dispatch(t, "global_avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t total = planes * hw;
    if (total <= 0) return;
    const float inv = static_cast<float>(1.0 / static_cast<double>(hw));
    global_avg_backward_kernel<T><<<blocks_for(total), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), total, hw, inv);
    WEFT_LAUNCH_CHECK();
  });
}

void global_avg_pool2d_forward_nhwc(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n,
                                    std::int64_t hw, std::int64_t c) {
  dispatch(t, "global_avg_pool2d_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t planes = n * c;
    if (planes <= 0) return;
    global_avg_forward_nhwc_kernel<T><<<blocks_for(planes * 32), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(y), static_cast<const T*>(x), planes, hw, c);
    WEFT_LAUNCH_CHECK();
  });
}

void global_avg_pool2d_backward_nhwc(const WorkerHandles& h, DType t, void* dx, const void* dy, std::int64_t n,
                                     std::int64_t hw, std::int64_t c) {
  dispatch(t, "global_avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t total = n * hw * c;
    if (total <= 0) return;
    const float inv = static_cast<float>(1.0 / static_cast<double>(hw));
    global_avg_backward_nhwc_kernel<T><<<blocks_for(total), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), total, hw, c, inv);
    WEFT_LAUNCH_CHECK();
  });
}

}  // namespace weft::kernels::gpu
