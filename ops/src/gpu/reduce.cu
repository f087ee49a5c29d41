// Reductions: sum (double accumulation, two passes through h.workspace),
// argmax per row (one warp per row), and column and channel sums for bias
// gradients, each templated on the element type (element.cuh).
// All are deterministic: fixed partitioning and fixed combination order, no
// atomics, so the same input gives the same bits on every run.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cstdint>
#include <string>
#include <type_traits>

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
using detail::kMaxBlocks;
using detail::kMaxReduceBlocks;
using detail::kThreads;

// Each block reduces its grid-stride share of x to one double; with
// `partials` it stores that per block, otherwise (a single-block launch) it
// writes the final value. N > 1 reads x in packs of N (x 16-byte aligned:
// 128-bit loads of 8 halves or 4 floats), each thread summing its packs in
// order and then the last n % N elements one each; the partition is fixed
// by (N, grid), so a given input and launch give the same bits every run.
template <int N, class In, class Out>
__global__ void sum_blocks(const In* x, std::int64_t n, double* partials, Out* out, double scale) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  double acc = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t packs = N > 1 ? n / N : 0;  // N == 1: the loop below takes every element
  if constexpr (N > 1) {
    for (std::int64_t p = first; p < packs; p += stride) {
      const detail::Pack<In, N> v = reinterpret_cast<const detail::Pack<In, N>*>(x)[p];
#pragma unroll
      for (int j = 0; j < N; ++j) acc += static_cast<double>(detail::to_float(v.v[j]));
    }
  }
  for (std::int64_t i = packs * N + first; i < n; i += stride)
    if constexpr (std::is_same_v<In, double>)
      acc += x[i];  // partials of the first pass
    else
      acc += static_cast<double>(load(x, i));
  const double total = Reduce(temp).Sum(acc);
  if (threadIdx.x == 0) {
    if (partials != nullptr)
      partials[blockIdx.x] = total;
    else
      store(out, 0, static_cast<float>(total * scale));
  }
}

// The first pass over x: packed when x is 16-byte aligned.
template <class T>
void sum_pass(const WorkerHandles& h, const T* x, std::int64_t n, std::int64_t blocks, double* partials, T* out) {
  constexpr int N = detail::kPackWidth<T>;
  if (detail::aligned16(x))
    sum_blocks<N, T, T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, detail::cuda_stream(h)>>>(x, n, partials, out, 1.0);
  else
    sum_blocks<1, T, T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, detail::cuda_stream(h)>>>(x, n, partials, out, 1.0);
  WEFT_LAUNCH_CHECK();
}

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;

// Ties (and the merge of lane results) go to the lower index, as on the CPU.
__device__ inline void argmax_merge(float& v, std::int64_t& i, float ov, std::int64_t oi) {
  if (oi < 0) return;
  if (i < 0 || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

template <class T>
__global__ void argmax_rows_kernel(float* y, const T* x, std::int64_t rows, std::int64_t cols) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (std::int64_t r = warp; r < rows; r += warps) {
    const T* row = x + r * cols;
    float best = 0.0f;
    std::int64_t at = -1;  // no element seen yet
    for (std::int64_t j = lane; j < cols; j += kWarp) {
      const float v = load(row, j);
      if (at < 0 || v > best) {
        best = v;
        at = j;
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float ov = __shfl_down_sync(0xffffffffu, best, offset);
      const std::int64_t oi = __shfl_down_sync(0xffffffffu, at, offset);
      argmax_merge(best, at, ov, oi);
    }
    // An empty row has no largest element: -1, as on the CPU.
    if (lane == 0) y[r] = static_cast<float>(at);
  }
}

// A 32-column tile per block: threads along x read consecutive columns of a
// row (coalesced), the 8 rows of threads split the rows, then a fixed-order
// tree over shared memory combines them.
constexpr int kColTile = 32;
constexpr int kRowLanes = kThreads / kColTile;

template <class T>
__global__ void column_sums_kernel(T* y, const T* x, std::int64_t rows, std::int64_t cols) {
  __shared__ double part[kRowLanes][kColTile + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  double acc = 0.0;
  if (c < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += kRowLanes) acc += static_cast<double>(load(x, r * cols + c));
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  for (int s = kRowLanes / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.y) < s) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + s][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < cols) store(y, c, static_cast<float>(part[0][threadIdx.x]));
}

// One block per channel of an [n, c, hw] tensor: threads stride over its
// n * hw values (consecutive threads read consecutive positions of a plane),
// then a fixed-order block reduction.
template <class T>
__global__ void channel_sums_kernel(T* db, const T* dy, std::int64_t n, std::int64_t c, std::int64_t hw) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const std::int64_t ch = blockIdx.x;
  const std::int64_t per_channel = n * hw;
  double acc = 0.0;
  for (std::int64_t k = threadIdx.x; k < per_channel; k += blockDim.x) {
    const std::int64_t i = k / hw, j = k % hw;
    acc += static_cast<double>(load(dy, (i * c + ch) * hw + j));
  }
  const double total = Reduce(temp).Sum(acc);
  if (threadIdx.x == 0) store(db, ch, static_cast<float>(total));
}

}  // namespace

namespace detail {

std::int64_t partial_slots(const WorkerHandles& h) {
  if (h.workspace == nullptr || reinterpret_cast<std::uintptr_t>(h.workspace) % alignof(double) != 0) return 0;
  return std::min<std::int64_t>(static_cast<std::int64_t>(h.workspace_bytes / sizeof(double)), kMaxReduceBlocks);
}

void finish_partials(const WorkerHandles& h, const double* partials, std::int64_t count, double scale, DType t,
                     void* out) {
  dispatch(t, "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    sum_blocks<1, double, T>
        <<<1, kThreads, 0, detail::cuda_stream(h)>>>(partials, count, nullptr, static_cast<T*>(out), scale);
    WEFT_LAUNCH_CHECK();
  });
}

void column_sums(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t rows, std::int64_t cols) {
  if (cols <= 0) return;
  if (rows <= 0) return zero(h, t, y, cols);
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile));
  dispatch(t, "column_sums", [&](auto tag) {
    using T = typename decltype(tag)::type;
    column_sums_kernel<T>
        <<<grid, block, 0, detail::cuda_stream(h)>>>(static_cast<T*>(y), static_cast<const T*>(x), rows, cols);
    WEFT_LAUNCH_CHECK();
  });
}

void channel_sums(const WorkerHandles& h, DType t, void* db, const void* dy, std::int64_t n, std::int64_t c,
                  std::int64_t hw) {
  if (c <= 0) return;
  if (n <= 0 || hw <= 0) return zero(h, t, db, c);
  if (c > 0x7FFFFFFF) throw weft::Error("channel_sums: " + std::to_string(c) + " channels exceed one grid");
  dispatch(t, "channel_sums", [&](auto tag) {
    using T = typename decltype(tag)::type;
    channel_sums_kernel<T><<<static_cast<unsigned>(c), kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<T*>(db), static_cast<const T*>(dy), n, c, hw);
    WEFT_LAUNCH_CHECK();
  });
}

}  // namespace detail

void sum(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n) {
  dispatch(t, "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= 0) return detail::zero(h, t, y, 1);
    const auto* xt = static_cast<const T*>(x);
    const std::int64_t blocks = std::min<std::int64_t>(blocks_for(n, kMaxReduceBlocks), detail::partial_slots(h));
    if (blocks <= 1) return sum_pass<T>(h, xt, n, 1, nullptr, static_cast<T*>(y));
    auto* partials = static_cast<double*>(h.workspace);
    sum_pass<T>(h, xt, n, blocks, partials, nullptr);
    detail::finish_partials(h, partials, blocks, 1.0, t, y);
  });
}

void argmax_rows(const WorkerHandles& h, DType t, float* y, const void* x, std::int64_t rows, std::int64_t cols) {
  dispatch(t, "argmax_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows <= 0) return;
    const std::int64_t blocks = std::min<std::int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
    argmax_rows_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, detail::cuda_stream(h)>>>(
        y, static_cast<const T*>(x), rows, cols);
    WEFT_LAUNCH_CHECK();
  });
}

}  // namespace weft::kernels::gpu
