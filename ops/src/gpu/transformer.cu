// GELU (tanh form), softmax over the last dimension, layer normalization
// over it and the embedding lookup. Elementwise GELU runs in element.cuh's
// packs; the row kernels give each row one warp (grid-stride over rows), load
// into float32, reduce with warp shuffles in a fixed lane order and round on
// store. Layer norm's dweight / dbias take one thread per column, summing the
// rows in order, so those results are deterministic; embedding's backward is
// too when asked (one thread per column), else it adds with atomics.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "element.cuh"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::blocks_for;
using detail::dispatch;
using detail::kThreads;
using detail::launch_elementwise;
using detail::load;
using detail::store;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

struct GeluOp {
  __device__ float operator()(float v) const {
    const float u = kGeluC * (v + kGeluA * v * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
  }
};
struct GeluGradOp {
  __device__ float operator()(float v, float g) const {
    const float u = kGeluC * (v + kGeluA * v * v * v);
    const float t = tanhf(u);
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
};

__device__ inline float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

unsigned row_blocks(std::int64_t rows) {
  return blocks_for((rows + kWarpsPerBlock - 1) / kWarpsPerBlock * kThreads);
}

// The warp of this thread and how many warps the grid has.
struct WarpIndex {
  std::int64_t warp, warps;
  int lane;
};
__device__ inline WarpIndex warp_index() {
  return {(static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp,
          static_cast<std::int64_t>(gridDim.x) * blockDim.x / kWarp, static_cast<int>(threadIdx.x % kWarp)};
}

template <class T>
__global__ void softmax_kernel(T* y, const T* x, std::int64_t rows, std::int64_t cols) {
  const WarpIndex w = warp_index();
  for (std::int64_t r = w.warp; r < rows; r += w.warps) {
    const T* z = x + r * cols;
    float m = -INFINITY;
    for (std::int64_t j = w.lane; j < cols; j += kWarp) m = fmaxf(m, load(z, j));
    m = warp_max(m);
    float s = 0.0f;
    for (std::int64_t j = w.lane; j < cols; j += kWarp) s += expf(load(z, j) - m);
    const float inv = 1.0f / warp_sum(s);
    for (std::int64_t j = w.lane; j < cols; j += kWarp) store(y + r * cols, j, expf(load(z, j) - m) * inv);
  }
}

template <class T>
__global__ void softmax_backward_kernel(T* dx, const T* y, const T* dy, std::int64_t rows, std::int64_t cols) {
  const WarpIndex w = warp_index();
  for (std::int64_t r = w.warp; r < rows; r += w.warps) {
    const T* p = y + r * cols;
    const T* g = dy + r * cols;
    float dot = 0.0f;
    for (std::int64_t j = w.lane; j < cols; j += kWarp) dot += load(p, j) * load(g, j);
    dot = warp_sum(dot);
    for (std::int64_t j = w.lane; j < cols; j += kWarp) store(dx + r * cols, j, load(p, j) * (load(g, j) - dot));
  }
}

template <class T>
__global__ void layer_norm_kernel(T* y, float* mean, float* rstd, const T* x, const float* weight, const float* bias,
                                  std::int64_t rows, std::int64_t cols, float eps) {
  const WarpIndex w = warp_index();
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = w.warp; r < rows; r += w.warps) {
    const T* v = x + r * cols;
    float s = 0.0f;
    for (std::int64_t j = w.lane; j < cols; j += kWarp) s += load(v, j);
    const float m = warp_sum(s) * inv_cols;
    float ss = 0.0f;
    for (std::int64_t j = w.lane; j < cols; j += kWarp) {
      const float d = load(v, j) - m;
      ss += d * d;
    }
    const float inv = rsqrtf(warp_sum(ss) * inv_cols + eps);
    if (w.lane == 0) {
      mean[r] = m;
      rstd[r] = inv;
    }
    for (std::int64_t j = w.lane; j < cols; j += kWarp)
      store(y + r * cols, j, (load(v, j) - m) * inv * weight[j] + bias[j]);
  }
}

template <class T>
__global__ void layer_norm_backward_kernel(T* dx, const T* x, const T* dy, const float* weight, const float* mean,
                                           const float* rstd, std::int64_t rows, std::int64_t cols) {
  const WarpIndex w = warp_index();
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = w.warp; r < rows; r += w.warps) {
    const T* v = x + r * cols;
    const T* d = dy + r * cols;
    const float m = mean[r], inv = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (std::int64_t j = w.lane; j < cols; j += kWarp) {
      const float g = load(d, j) * weight[j];
      sg += g;
      sgx += g * (load(v, j) - m) * inv;
    }
    const float mg = warp_sum(sg) * inv_cols, mgx = warp_sum(sgx) * inv_cols;
    for (std::int64_t j = w.lane; j < cols; j += kWarp) {
      const float g = load(d, j) * weight[j];
      store(dx + r * cols, j, inv * (g - mg - (load(v, j) - m) * inv * mgx));
    }
  }
}

template <class T>
__global__ void layer_norm_params_kernel(float* dweight, float* dbias, const T* x, const T* dy, const float* mean,
                                         const float* rstd, std::int64_t rows, std::int64_t cols) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols; j += stride) {
    float sw = 0.0f, sb = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float g = load(dy, r * cols + j);
      sw += g * (load(x, r * cols + j) - mean[r]) * rstd[r];
      sb += g;
    }
    dweight[j] = sw;
    dbias[j] = sb;
  }
}

__device__ inline bool valid_id(float v, std::int64_t vocab) {
  return v >= 0.0f && static_cast<double>(v) < static_cast<double>(vocab) && floorf(v) == v;
}

template <class T>
__global__ void embedding_kernel(T* y, const T* weight, const float* ids, std::int64_t n, std::int64_t vocab,
                                 std::int64_t width) {
  const std::int64_t total = n * width;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t i = e / width, j = e % width;
    const float v = ids[i];
    store(y, e, valid_id(v, vocab) ? load(weight, static_cast<std::int64_t>(v) * width + j) : NAN);
  }
}

// One thread per column, the ids in order: no two threads touch one element.
template <class T>
__global__ void embedding_backward_ordered(float* dweight, const float* ids, const T* dy, std::int64_t n,
                                          std::int64_t vocab, std::int64_t width) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < width; j += stride)
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = ids[i];
      if (valid_id(v, vocab)) dweight[static_cast<std::int64_t>(v) * width + j] += load(dy, i * width + j);
    }
}

template <class T>
__global__ void embedding_backward_atomic(float* dweight, const float* ids, const T* dy, std::int64_t n,
                                         std::int64_t vocab, std::int64_t width) {
  const std::int64_t total = n * width;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t i = e / width, j = e % width;
    const float v = ids[i];
    if (valid_id(v, vocab)) atomicAdd(dweight + static_cast<std::int64_t>(v) * width + j, load(dy, e));
  }
}

}  // namespace

void gelu(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n) {
  dispatch(t, "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(h, n, GeluOp{}, static_cast<T*>(y), static_cast<const T*>(x));
  });
}

void gelu_grad(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy, std::int64_t n) {
  dispatch(t, "gelu_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(h, n, GeluGradOp{}, static_cast<T*>(dx), static_cast<const T*>(x), static_cast<const T*>(dy));
  });
}

void softmax_rows(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  dispatch(t, "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<T><<<row_blocks(rows), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(y), static_cast<const T*>(x), rows, cols);
    WEFT_LAUNCH_CHECK();
  });
}

void softmax_rows_backward(const WorkerHandles& h, DType t, void* dx, const void* y, const void* dy,
                           std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  dispatch(t, "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T><<<row_blocks(rows), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(dx), static_cast<const T*>(y), static_cast<const T*>(dy), rows, cols);
    WEFT_LAUNCH_CHECK();
  });
}

void layer_norm_forward(const WorkerHandles& h, DType t, void* y, float* mean, float* rstd, const void* x,
                        const float* weight, const float* bias, std::int64_t rows, std::int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  dispatch(t, "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    layer_norm_kernel<T><<<row_blocks(rows), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(y), mean, rstd, static_cast<const T*>(x), weight, bias, rows, cols, eps);
    WEFT_LAUNCH_CHECK();
  });
}

void layer_norm_backward(const WorkerHandles& h, DType t, void* dx, float* dweight, float* dbias, const void* x,
                         const void* dy, const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                         std::int64_t cols) {
  if (cols <= 0) return;
  dispatch(t, "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(x);
    const auto* dyt = static_cast<const T*>(dy);
    if (rows > 0) {
      layer_norm_backward_kernel<T><<<row_blocks(rows), kThreads, 0, detail::cuda_stream(h)>>>(
          static_cast<T*>(dx), xt, dyt, weight, mean, rstd, rows, cols);
      WEFT_LAUNCH_CHECK();
    }
    layer_norm_params_kernel<T><<<blocks_for(cols), kThreads, 0, detail::cuda_stream(h)>>>(dweight, dbias, xt, dyt,
                                                                                           mean, rstd, rows, cols);
    WEFT_LAUNCH_CHECK();
  });
}

void embedding_forward(const WorkerHandles& h, DType t, void* y, const void* weight, const float* ids, std::int64_t n,
                       std::int64_t vocab, std::int64_t width) {
  if (n <= 0 || width <= 0) return;
  dispatch(t, "embedding", [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_kernel<T><<<blocks_for(n * width), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(y), static_cast<const T*>(weight), ids, n, vocab, width);
    WEFT_LAUNCH_CHECK();
  });
}

void embedding_backward(const WorkerHandles& h, DType t, bool deterministic, float* dweight, const float* ids,
                        const void* dy, std::int64_t n, std::int64_t vocab, std::int64_t width) {
  if (vocab <= 0 || width <= 0) return;
  dispatch(t, "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::zero(h, dweight, vocab * width);
    if (n <= 0) return;
    const auto* g = static_cast<const T*>(dy);
    if (deterministic)
      embedding_backward_ordered<T><<<blocks_for(width), kThreads, 0, detail::cuda_stream(h)>>>(dweight, ids, g, n,
                                                                                              vocab, width);
    else
      embedding_backward_atomic<T><<<blocks_for(n * width), kThreads, 0, detail::cuda_stream(h)>>>(dweight, ids, g, n,
                                                                                                 vocab, width);
    WEFT_LAUNCH_CHECK();
  });
}

}  // namespace weft::kernels::gpu
