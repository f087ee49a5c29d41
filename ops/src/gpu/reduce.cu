// Reductions: sum (double accumulation, two passes through h.workspace),
// argmax per row (one warp per row), and column sums for bias gradients.
// All are deterministic: fixed partitioning and fixed combination order, no
// atomics, so the same input gives the same bits on every run.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cstdint>

#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::blocks_for;
using detail::kMaxBlocks;
using detail::kMaxReduceBlocks;
using detail::kThreads;

// Each block reduces its grid-stride share of x to one double; with
// `partials` it stores that per block, otherwise (a single-block launch) it
// writes the final float.
template <class In>
__global__ void sum_blocks(const In* x, std::int64_t n, double* partials, float* out, double scale) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  double acc = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += static_cast<double>(x[i]);
  const double total = Reduce(temp).Sum(acc);
  if (threadIdx.x == 0) {
    if (partials != nullptr)
      partials[blockIdx.x] = total;
    else
      *out = static_cast<float>(total * scale);
  }
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

__global__ void argmax_rows_kernel(float* y, const float* x, std::int64_t rows, std::int64_t cols) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (std::int64_t r = warp; r < rows; r += warps) {
    const float* row = x + r * cols;
    float best = 0.0f;
    std::int64_t at = -1;  // no element seen yet
    for (std::int64_t j = lane; j < cols; j += kWarp) {
      const float v = row[j];
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

__global__ void column_sums_kernel(float* y, const float* x, std::int64_t rows, std::int64_t cols) {
  __shared__ double part[kRowLanes][kColTile + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  double acc = 0.0;
  if (c < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += kRowLanes) acc += static_cast<double>(x[r * cols + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  for (int s = kRowLanes / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.y) < s) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + s][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < cols) y[c] = static_cast<float>(part[0][threadIdx.x]);
}

}  // namespace

namespace detail {

std::int64_t partial_slots(const WorkerHandles& h) {
  if (h.workspace == nullptr || reinterpret_cast<std::uintptr_t>(h.workspace) % alignof(double) != 0) return 0;
  return std::min<std::int64_t>(static_cast<std::int64_t>(h.workspace_bytes / sizeof(double)), kMaxReduceBlocks);
}

void finish_partials(const WorkerHandles& h, const double* partials, std::int64_t count, double scale, float* out) {
  sum_blocks<double><<<1, kThreads, 0, detail::cuda_stream(h)>>>(partials, count, nullptr, out, scale);
  WEFT_LAUNCH_CHECK();
}

void column_sums(const WorkerHandles& h, float* y, const float* x, std::int64_t rows, std::int64_t cols) {
  if (cols <= 0) return;
  if (rows <= 0) return zero(h, y, cols);
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile));
  column_sums_kernel<<<grid, block, 0, detail::cuda_stream(h)>>>(y, x, rows, cols);
  WEFT_LAUNCH_CHECK();
}

}  // namespace detail

void sum(const WorkerHandles& h, float* y, const float* x, std::int64_t n) {
  if (n <= 0) return detail::zero(h, y, 1);
  const std::int64_t blocks = std::min<std::int64_t>(blocks_for(n, kMaxReduceBlocks), detail::partial_slots(h));
  if (blocks <= 1) {
    sum_blocks<float><<<1, kThreads, 0, detail::cuda_stream(h)>>>(x, n, nullptr, y, 1.0);
    WEFT_LAUNCH_CHECK();
    return;
  }
  auto* partials = static_cast<double*>(h.workspace);
  sum_blocks<float><<<static_cast<unsigned>(blocks), kThreads, 0, detail::cuda_stream(h)>>>(x, n, partials, nullptr, 1.0);
  WEFT_LAUNCH_CHECK();
  detail::finish_partials(h, partials, blocks, 1.0, y);
}

void argmax_rows(const WorkerHandles& h, float* y, const float* x, std::int64_t rows, std::int64_t cols) {
  if (rows <= 0) return;
  const std::int64_t blocks = std::min<std::int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  argmax_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, detail::cuda_stream(h)>>>(y, x, rows, cols);
  WEFT_LAUNCH_CHECK();
}

}  // namespace weft::kernels::gpu
