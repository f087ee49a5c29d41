// Creation, cast, elementwise, optimizer and loss-scaling kernels: one
// grid-stride map kernel instantiated with small functors, each templated on
// the element type (load as float32, compute, store rounded: element.cuh).
// Outputs may alias inputs (y += ...), so no __restrict__: each index is read
// before it is written by the same thread.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../random.h"
#include "element.cuh"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::blocks_for;
using detail::dispatch;
using detail::kThreads;
using detail::load;
using detail::store;

template <class F>
__global__ void map_kernel(std::int64_t n, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

template <class F>
void launch_map(const WorkerHandles& h, std::int64_t n, F f) {
  if (n <= 0) return;
  map_kernel<<<blocks_for(n), kThreads, 0, detail::cuda_stream(h)>>>(n, f);
  WEFT_LAUNCH_CHECK();
}

template <class T>
struct Fill {
  T* y;
  float v;
  __device__ void operator()(std::int64_t i) const { store(y, i, v); }
};

// __fmul_rn/__fadd_rn keep nvcc from contracting into an FMA: the host
// compiler (x86-64 baseline) rounds twice, and the generators must give the
// CPU's values bit for bit.
struct Uniform {
  float* y;
  float lo, span;
  std::uint64_t seed;
  __device__ void operator()(std::int64_t i) const {
    y[i] = __fadd_rn(lo, __fmul_rn(span, uniform01(seed, static_cast<std::uint64_t>(i))));
  }
};

struct Normal {
  float* y;
  float mean, stddev;
  std::uint64_t seed;
  __device__ void operator()(std::int64_t i) const {
    y[i] = __fadd_rn(mean, __fmul_rn(stddev, standard_normal(seed, static_cast<std::uint64_t>(i))));
  }
};

template <class Y, class X>
struct Cast {
  Y* y;
  const X* x;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(x, i)); }
};

template <class T>
struct Add {
  T* y;
  const T *a, *b;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(a, i) + load(b, i)); }
};
template <class T>
struct Sub {
  T* y;
  const T *a, *b;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(a, i) - load(b, i)); }
};
template <class T>
struct Mul {
  T* y;
  const T *a, *b;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(a, i) * load(b, i)); }
};
template <class T>
struct Maximum {
  T* y;
  const T *a, *b;
  __device__ void operator()(std::int64_t i) const {
    const float u = load(a, i), v = load(b, i);
    store(y, i, u < v ? v : u);
  }
};
template <class T>
struct AddScalar {
  T* y;
  const T* x;
  float s;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(x, i) + s); }
};
template <class T>
struct MulScalar {
  T* y;
  const T* x;
  float s;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(x, i) * s); }
};
template <class T>
struct Axpy {
  T* y;
  float alpha;
  const T* x;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(y, i) + alpha * load(x, i)); }
};
// Written as comparisons (not fmaxf) so NaN inputs behave like the CPU's
// `x > 0` test: NaN is not positive, so it gives 0.
template <class T>
struct Relu {
  T* y;
  const T* x;
  __device__ void operator()(std::int64_t i) const {
    const float v = load(x, i);
    store(y, i, v > 0.0f ? v : 0.0f);
  }
};
template <class T>
struct ReluGrad {
  T* dx;
  const T *x, *dy;
  __device__ void operator()(std::int64_t i) const { store(dx, i, load(x, i) > 0.0f ? load(dy, i) : 0.0f); }
};
struct Sgd {
  float* w;
  const float* g;
  float lr, wd;
  const float* skip;
  __device__ void operator()(std::int64_t i) const {
    if (skip != nullptr && *skip != 0.0f) return;
    const float wi = w[i];
    w[i] = wi - lr * (g[i] + wd * wi);
  }
};
// The verdict is the input's (an Inf or NaN gradient), as on the CPU; every
// thread that finds one writes the same 1, so the race is benign.
struct Unscale {
  float* x;
  const float* scale;
  float* found_inf;
  __device__ void operator()(std::int64_t i) const {
    const float inv = 1.0f / *scale;
    const float v = x[i];
    if (!isfinite(v)) *found_inf = 1.0f;
    x[i] = v * inv;
  }
};
__global__ void update_loss_scale_kernel(float* scale, float* growth_tracker, float* skipped, const float* found_inf,
                                         float growth, float backoff, float interval) {
  if (*found_inf != 0.0f) {
    *scale *= backoff;
    *growth_tracker = 0.0f;
    *skipped += 1.0f;
    return;
  }
  const float tracker = *growth_tracker + 1.0f;
  if (tracker >= interval) {
    *scale *= growth;
    *growth_tracker = 0.0f;
  } else {
    *growth_tracker = tracker;
  }
}
template <class T>
struct RowBias {
  T* y;
  const T* b;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(y, i) + load(b, i % cols)); }
};
template <class T>
struct BroadcastRows {
  T* y;
  const T* b;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i) const { y[i] = b[i % cols]; }
};
template <class T>
struct ChannelBias {
  T* y;
  const T* b;
  std::int64_t c, hw;
  __device__ void operator()(std::int64_t i) const { store(y, i, load(y, i) + load(b, (i / hw) % c)); }
};
template <class T>
struct ScaleMatrix {
  T* c;
  std::int64_t n, ldc;
  float beta;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t at = (i / n) * ldc + (i % n);
    store(c, at, beta == 0.0f ? 0.0f : beta * load(c, at));
  }
};

// The binary elementwise kernels share one dispatch.
template <template <class> class Op>
void binary(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n,
            const char* kernel) {
  dispatch(t, kernel, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, n, Op<T>{static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b)});
  });
}

}  // namespace

void fill(const WorkerHandles& h, DType t, void* y, std::int64_t n, float value) {
  dispatch(t, "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, n, Fill<T>{static_cast<T*>(y), value});
  });
}

void uniform(const WorkerHandles& h, float* y, std::int64_t n, float lo, float hi, std::uint64_t seed) {
  launch_map(h, n, Uniform{y, lo, hi - lo, seed});
}

void normal(const WorkerHandles& h, float* y, std::int64_t n, float mean, float stddev, std::uint64_t seed) {
  launch_map(h, n, Normal{y, mean, stddev, seed});
}

void cast(const WorkerHandles& h, void* y, DType yt, const void* x, DType xt, std::int64_t n) {
  if (yt == xt) {
    // Every dtype copies, kernels or not.
    if (n <= 0) return;
    WEFT_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<std::size_t>(n) * dtype_size(xt), cudaMemcpyDeviceToDevice,
                                    detail::cuda_stream(h)));
    return;
  }
  dispatch(yt, "cast", [&](auto ytag) {
    using Y = typename decltype(ytag)::type;
    dispatch(xt, "cast", [&](auto xtag) {
      using X = typename decltype(xtag)::type;
      launch_map(h, n, Cast<Y, X>{static_cast<Y*>(y), static_cast<const X*>(x)});
    });
  });
}

void add(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<Add>(h, t, y, a, b, n, "add");
}
void sub(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<Sub>(h, t, y, a, b, n, "sub");
}
void mul(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<Mul>(h, t, y, a, b, n, "mul");
}
void maximum(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<Maximum>(h, t, y, a, b, n, "maximum");
}
void add_scalar(const WorkerHandles& h, DType t, void* y, const void* x, float s, std::int64_t n) {
  dispatch(t, "add_scalar", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, n, AddScalar<T>{static_cast<T*>(y), static_cast<const T*>(x), s});
  });
}
void mul_scalar(const WorkerHandles& h, DType t, void* y, const void* x, float s, std::int64_t n) {
  dispatch(t, "mul_scalar", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, n, MulScalar<T>{static_cast<T*>(y), static_cast<const T*>(x), s});
  });
}
void axpy(const WorkerHandles& h, DType t, void* y, float alpha, const void* x, std::int64_t n) {
  dispatch(t, "axpy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, n, Axpy<T>{static_cast<T*>(y), alpha, static_cast<const T*>(x)});
  });
}
void relu(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n) {
  dispatch(t, "relu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, n, Relu<T>{static_cast<T*>(y), static_cast<const T*>(x)});
  });
}
void relu_grad(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy, std::int64_t n) {
  binary<ReluGrad>(h, t, dx, x, dy, n, "relu_grad");
}
void sgd_update(const WorkerHandles& h, float* w, const float* g, std::int64_t n, float lr, float weight_decay,
                const float* skip) {
  launch_map(h, n, Sgd{w, g, lr, weight_decay, skip});
}

void unscale_and_check(const WorkerHandles& h, float* x, std::int64_t n, const float* scale, float* found_inf) {
  launch_map(h, n, Unscale{x, scale, found_inf});
}

void update_loss_scale(const WorkerHandles& h, float* scale, float* growth_tracker, float* skipped,
                       const float* found_inf, float growth, float backoff, std::int64_t interval) {
  update_loss_scale_kernel<<<1, 1, 0, detail::cuda_stream(h)>>>(scale, growth_tracker, skipped, found_inf, growth,
                                                                backoff, static_cast<float>(interval));
  WEFT_LAUNCH_CHECK();
}

namespace detail {

void zero(const WorkerHandles& h, DType t, void* y, std::int64_t n) {
  if (n <= 0) return;
  WEFT_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<std::size_t>(n) * dtype_size(t), detail::cuda_stream(h)));
}

void add_row_bias(const WorkerHandles& h, DType t, void* y, const void* b, std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  dispatch(t, "add_row_bias", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, rows * cols, RowBias<T>{static_cast<T*>(y), static_cast<const T*>(b), cols});
  });
}

void broadcast_rows(const WorkerHandles& h, DType t, void* y, const void* b, std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  dispatch(t, "broadcast_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, rows * cols, BroadcastRows<T>{static_cast<T*>(y), static_cast<const T*>(b), cols});
  });
}

void add_channel_bias(const WorkerHandles& h, DType t, void* y, const void* b, std::int64_t n, std::int64_t c,
                      std::int64_t hw) {
  if (n <= 0 || c <= 0 || hw <= 0) return;
  dispatch(t, "add_channel_bias", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, n * c * hw, ChannelBias<T>{static_cast<T*>(y), static_cast<const T*>(b), c, hw});
  });
}

void scale_matrix(const WorkerHandles& h, DType t, void* c, std::int64_t m, std::int64_t n, std::int64_t ldc,
                  float beta) {
  if (m <= 0 || n <= 0 || beta == 1.0f) return;
  dispatch(t, "scale_matrix", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map(h, m * n, ScaleMatrix<T>{static_cast<T*>(c), n, ldc, beta});
  });
}

}  // namespace detail
}  // namespace weft::kernels::gpu
