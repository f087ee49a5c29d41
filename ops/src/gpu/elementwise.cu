// Creation, elementwise and optimizer kernels: one grid-stride map kernel
// instantiated with small functors. Outputs may alias inputs (y += ...), so no
// __restrict__: each index is read before it is written by the same thread.
#include <cuda_runtime.h>

#include <cstdint>

#include "../random.h"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::blocks_for;
using detail::kThreads;

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

struct Fill {
  float* y;
  float v;
  __device__ void operator()(std::int64_t i) const { y[i] = v; }
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

struct Add {
  float* y;
  const float *a, *b;
  __device__ void operator()(std::int64_t i) const { y[i] = a[i] + b[i]; }
};
struct Sub {
  float* y;
  const float *a, *b;
  __device__ void operator()(std::int64_t i) const { y[i] = a[i] - b[i]; }
};
struct Mul {
  float* y;
  const float *a, *b;
  __device__ void operator()(std::int64_t i) const { y[i] = a[i] * b[i]; }
};
struct Maximum {
  float* y;
  const float *a, *b;
  __device__ void operator()(std::int64_t i) const { y[i] = a[i] < b[i] ? b[i] : a[i]; }
};
struct AddScalar {
  float* y;
  const float* x;
  float s;
  __device__ void operator()(std::int64_t i) const { y[i] = x[i] + s; }
};
struct MulScalar {
  float* y;
  const float* x;
  float s;
  __device__ void operator()(std::int64_t i) const { y[i] = x[i] * s; }
};
struct Axpy {
  float* y;
  float alpha;
  const float* x;
  __device__ void operator()(std::int64_t i) const { y[i] += alpha * x[i]; }
};
// Written as comparisons (not fmaxf) so NaN inputs behave like the CPU's
// `x > 0` test: NaN is not positive, so it gives 0.
struct Relu {
  float* y;
  const float* x;
  __device__ void operator()(std::int64_t i) const {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
};
struct ReluGrad {
  float* dx;
  const float *x, *dy;
  __device__ void operator()(std::int64_t i) const { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; }
};
struct Sgd {
  float* w;
  const float* g;
  float lr, wd;
  __device__ void operator()(std::int64_t i) const {
    const float wi = w[i];
    w[i] = wi - lr * (g[i] + wd * wi);
  }
};
struct RowBias {
  float* y;
  const float* b;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i) const { y[i] += b[i % cols]; }
};
struct ScaleMatrix {
  float* c;
  std::int64_t n, ldc;
  float beta;
  __device__ void operator()(std::int64_t i) const {
    float* p = c + (i / n) * ldc + (i % n);
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
};

}  // namespace

void fill(const WorkerHandles& h, float* y, std::int64_t n, float value) { launch_map(h, n, Fill{y, value}); }

void uniform(const WorkerHandles& h, float* y, std::int64_t n, float lo, float hi, std::uint64_t seed) {
  launch_map(h, n, Uniform{y, lo, hi - lo, seed});
}

void normal(const WorkerHandles& h, float* y, std::int64_t n, float mean, float stddev, std::uint64_t seed) {
  launch_map(h, n, Normal{y, mean, stddev, seed});
}

void add(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n) {
  launch_map(h, n, Add{y, a, b});
}
void sub(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n) {
  launch_map(h, n, Sub{y, a, b});
}
void mul(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n) {
  launch_map(h, n, Mul{y, a, b});
}
void maximum(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n) {
  launch_map(h, n, Maximum{y, a, b});
}
void add_scalar(const WorkerHandles& h, float* y, const float* x, float s, std::int64_t n) {
  launch_map(h, n, AddScalar{y, x, s});
}
void mul_scalar(const WorkerHandles& h, float* y, const float* x, float s, std::int64_t n) {
  launch_map(h, n, MulScalar{y, x, s});
}
void axpy(const WorkerHandles& h, float* y, float alpha, const float* x, std::int64_t n) {
  launch_map(h, n, Axpy{y, alpha, x});
}
void relu(const WorkerHandles& h, float* y, const float* x, std::int64_t n) { launch_map(h, n, Relu{y, x}); }
void relu_grad(const WorkerHandles& h, float* dx, const float* x, const float* dy, std::int64_t n) {
  launch_map(h, n, ReluGrad{dx, x, dy});
}
void sgd_update(const WorkerHandles& h, float* w, const float* g, std::int64_t n, float lr, float weight_decay) {
  launch_map(h, n, Sgd{w, g, lr, weight_decay});
}

namespace detail {

void zero(const WorkerHandles& h, float* y, std::int64_t n) {
  if (n <= 0) return;
  WEFT_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<std::size_t>(n) * sizeof(float), detail::cuda_stream(h)));
}

void add_row_bias(const WorkerHandles& h, float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  launch_map(h, rows * cols, RowBias{y, b, cols});
}

void scale_matrix(const WorkerHandles& h, float* c, std::int64_t m, std::int64_t n, std::int64_t ldc, float beta) {
  if (m <= 0 || n <= 0 || beta == 1.0f) return;
  launch_map(h, m * n, ScaleMatrix{c, n, ldc, beta});
}

}  // namespace detail
}  // namespace weft::kernels::gpu
