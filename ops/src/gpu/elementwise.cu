// Creation, cast, elementwise, optimizer and loss-scaling kernels. Pure
// elementwise ops (y[i] = op(x1[i], ...)) run in packs: 16 bytes of the
// narrowest type per access (8 halves, 4 floats) when every pointer is
// 16-byte aligned, one element per access otherwise (views at odd offsets),
// with the last n % pack elements done one by one (element.cuh: Pack,
// launch_elementwise). Ops that index (bias rows, channels, generators) keep
// one grid-stride map kernel instantiated with small functors. Values load as
// float32, compute and store rounded, so a pack computes the same bits as
// single elements. Outputs may alias inputs (y += ...), so no __restrict__:
// each element is read before it is written by the same thread.
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
using detail::launch_elementwise;
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

// The pure elementwise ops, on float32 values (element.cuh's packs).
struct Identity {
  __device__ float operator()(float v) const { return v; }
};
struct FillValue {
  float v;
  __device__ float operator()() const { return v; }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct SubOp {
  __device__ float operator()(float a, float b) const { return a - b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct MaximumOp {
  __device__ float operator()(float u, float v) const { return u < v ? v : u; }
};
struct AddScalarOp {
  float s;
  __device__ float operator()(float a) const { return a + s; }
};
struct MulScalarOp {
  float s;
  __device__ float operator()(float a) const { return a * s; }
};
// x times a factor the device holds (a loss scale).
struct ScaleByOp {
  const float* factor;
  __device__ float operator()(float a) const { return a * *factor; }
};
struct AxpyOp {
  float alpha;
  __device__ float operator()(float y, float x) const { return y + alpha * x; }
};
// Written as comparisons (not fmaxf) so NaN inputs behave like the CPU's
// `x > 0` test: NaN is not positive, so it gives 0.
struct ReluOp {
  __device__ float operator()(float v) const { return v > 0.0f ? v : 0.0f; }
};
struct ReluGradOp {
  __device__ float operator()(float x, float dy) const { return x > 0.0f ? dy : 0.0f; }
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
template <class Op>
void binary(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n,
            const char* kernel) {
  dispatch(t, kernel, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(h, n, Op{}, static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b));
  });
}

// The unary ones too.
template <class Op>
void unary(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n, const char* kernel, Op op) {
  dispatch(t, kernel, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(h, n, op, static_cast<T*>(y), static_cast<const T*>(x));
  });
}

}  // namespace

void fill(const WorkerHandles& h, DType t, void* y, std::int64_t n, float value) {
  dispatch(t, "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(h, n, FillValue{value}, static_cast<T*>(y));
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
      launch_elementwise(h, n, Identity{}, static_cast<Y*>(y), static_cast<const X*>(x));
    });
  });
}

void add(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<AddOp>(h, t, y, a, b, n, "add");
}
void sub(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<SubOp>(h, t, y, a, b, n, "sub");
}
void mul(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<MulOp>(h, t, y, a, b, n, "mul");
}
void maximum(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n) {
  binary<MaximumOp>(h, t, y, a, b, n, "maximum");
}
void add_scalar(const WorkerHandles& h, DType t, void* y, const void* x, float s, std::int64_t n) {
  unary(h, t, y, x, n, "add_scalar", AddScalarOp{s});
}
void mul_scalar(const WorkerHandles& h, DType t, void* y, const void* x, float s, std::int64_t n) {
  unary(h, t, y, x, n, "mul_scalar", MulScalarOp{s});
}
void scale_by(const WorkerHandles& h, DType t, void* y, const void* x, const float* factor, std::int64_t n) {
  unary(h, t, y, x, n, "scale_by", ScaleByOp{factor});
}
void axpy(const WorkerHandles& h, DType t, void* y, float alpha, const void* x, std::int64_t n) {
  dispatch(t, "axpy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(h, n, AxpyOp{alpha}, static_cast<T*>(y), static_cast<const T*>(y), static_cast<const T*>(x));
  });
}
void relu(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n) {
  unary(h, t, y, x, n, "relu", ReluOp{});
}
void relu_grad(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy, std::int64_t n) {
  binary<ReluGradOp>(h, t, dx, x, dy, n, "relu_grad");
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
