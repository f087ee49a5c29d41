// Mean softmax cross-entropy: one warp per row (max, sum of exponentials,
// gradient), row losses summed in double per block, then the per-block
// partials (in h.workspace) finished in one block, the same deterministic
// two-pass scheme as sum(). Logits and their gradient may be half: loaded
// into float32, the arithmetic as for float32, the gradient rounded on store.
// A row whose logits (and gradient) start 16-byte aligned is read (and
// written) in packs of 16 bytes, lane k taking packs k, k + 32, ..., then the
// row's last cols % N elements one each; otherwise one element per access.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "element.cuh"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::dispatch;
using detail::kMaxReduceBlocks;
using detail::load;
using detail::store;
using detail::kThreads;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;

// f(j, x[j] as float32) for the lane's share of a row of `cols` elements:
// in packs of N when x is 16-byte aligned, one by one otherwise. Which lane
// sees which element depends only on (N, alignment, cols): deterministic.
template <int N, class T, class F>
__device__ __forceinline__ void row_each(const T* x, std::int64_t cols, int lane, F&& f) {
  std::int64_t j0 = lane;
  if (N > 1 && detail::aligned16(x)) {
    const std::int64_t packs = cols / N;
    for (std::int64_t q = lane; q < packs; q += kWarp) {
      const detail::Pack<T, N> v = reinterpret_cast<const detail::Pack<T, N>*>(x)[q];
#pragma unroll
      for (int k = 0; k < N; ++k) f(q * N + k, detail::to_float(v.v[k]));
    }
    j0 = packs * N + lane;
  }
  for (std::int64_t j = j0; j < cols; j += kWarp) f(j, load(x, j));
}

// d[j] = g(j, x[j]) for the lane's share of a row: packed when both rows are
// 16-byte aligned.
template <int N, class T, class G>
__device__ __forceinline__ void row_map(T* d, const T* x, std::int64_t cols, int lane, G&& g) {
  std::int64_t j0 = lane;
  if (N > 1 && detail::aligned16(x) && detail::aligned16(d)) {
    const std::int64_t packs = cols / N;
    for (std::int64_t q = lane; q < packs; q += kWarp) {
      const detail::Pack<T, N> v = reinterpret_cast<const detail::Pack<T, N>*>(x)[q];
      detail::Pack<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = detail::from_float<T>(g(q * N + k, detail::to_float(v.v[k])));
      reinterpret_cast<detail::Pack<T, N>*>(d)[q] = out;
    }
    j0 = packs * N + lane;
  }
  for (std::int64_t j = j0; j < cols; j += kWarp) store(d, j, g(j, load(x, j)));
}

__device__ inline float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ inline double warp_sum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Rows are split across all warps of the grid; each block leaves the sum of
// its rows' losses in partials[blockIdx.x], or, launched as a single block
// without partials, the final mean in *loss. The arithmetic follows the CPU
// kernel (shift by the row max, exponentials, log and gradient in double) so
// the two agree to float rounding.
template <class T>
__global__ void softmax_ce_kernel(float* loss, double* partials, T* dlogits, const T* logits,
                                  const float* labels, std::int64_t rows, std::int64_t cols) {
  __shared__ double warp_loss[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarp;
  const int warp_in_block = threadIdx.x / kWarp;
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / kWarp;
  const double inv_rows = 1.0 / static_cast<double>(rows);
  double acc = 0.0;  // meaningful in lane 0 only
  for (std::int64_t r = warp; r < rows; r += warps) {
    const T* x = logits + r * cols;
    const float l = labels[r];
    // The CPU's test, written so a NaN label also fails it; the CPU throws,
    // here the row's loss (and gradient) become NaN.
    const bool valid = l >= 0.0f && static_cast<double>(l) < static_cast<double>(cols) && floorf(l) == l;
    const std::int64_t label = valid ? static_cast<std::int64_t>(l) : -1;

    constexpr int N = detail::kPackWidth<T>;
    float m = -INFINITY;
    row_each<N>(x, cols, lane, [&](std::int64_t, float v) { m = fmaxf(m, v); });
    const double zmax = warp_max(m);
    double denom = 0.0;
    row_each<N>(x, cols, lane, [&](std::int64_t, float v) { denom += exp(static_cast<double>(v) - zmax); });
    const double log_denom = log(warp_sum(denom));

    if (dlogits != nullptr) {
      row_map<N>(dlogits + r * cols, x, cols, lane, [&](std::int64_t j, float v) {
        const double p = exp(static_cast<double>(v) - zmax - log_denom);
        return valid ? static_cast<float>((j == label ? p - 1.0 : p) * inv_rows) : NAN;
      });
    }
    if (lane == 0) acc += valid ? log_denom - (static_cast<double>(load(x, label)) - zmax) : static_cast<double>(NAN);
  }
  if (lane == 0) warp_loss[warp_in_block] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarpsPerBlock; ++w) total += warp_loss[w];
    if (partials != nullptr)
      partials[blockIdx.x] = total;
    else
      *loss = static_cast<float>(total * inv_rows);
  }
}

}  // namespace

void softmax_cross_entropy(const WorkerHandles& h, DType t, float* loss, void* dlogits, const void* logits,
                           const float* labels, std::int64_t rows, std::int64_t cols) {
  dispatch(t, "softmax_cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The mean over no rows is 0 (not 0/0), as on the CPU.
    if (rows <= 0) return detail::zero(h, loss, 1);
    auto* d = static_cast<T*>(dlogits);
    const auto* x = static_cast<const T*>(logits);
    const std::int64_t blocks =
        std::min<std::int64_t>(std::min<std::int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxReduceBlocks),
                               detail::partial_slots(h));
    if (blocks <= 1) {
      softmax_ce_kernel<T><<<1, kThreads, 0, detail::cuda_stream(h)>>>(loss, nullptr, d, x, labels, rows, cols);
      WEFT_LAUNCH_CHECK();
      return;
    }
    auto* partials = static_cast<double*>(h.workspace);
    softmax_ce_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, detail::cuda_stream(h)>>>(
        loss, partials, d, x, labels, rows, cols);
    WEFT_LAUNCH_CHECK();
    detail::finish_partials(h, partials, blocks, 1.0 / static_cast<double>(rows), loss);
  });
}

}  // namespace weft::kernels::gpu
