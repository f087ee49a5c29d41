// The optimizer step as a multi-tensor apply (in the manner of PyTorch's
// multi_tensor_apply): the pointers of up to kTensorsPerLaunch tensors and a
// block -> (tensor, chunk) map travel by value in the kernel's arguments, one
// block per kChunk elements, so a step over a model's many small tensors is a
// few launches rather than one per tensor. The step counters are incremented
// by one more launch after every update of the op, so all blocks of a tensor
// read the same t. The arithmetic is ../optim_math.h's, as on the CPU. A
// tensor whose weight, gradient and states are all 16-byte aligned is read
// and written 4 floats per access (128-bit), the chunk's last n % 4 elements
// one by one; each element's arithmetic is the same either way.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <string>
#include <vector>

#include "element.cuh"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "launch.cuh"

namespace weft::kernels::gpu {
namespace {

using detail::kThreads;

constexpr std::int64_t kChunk = 32768;
constexpr int kTensorsPerLaunch = 36;
constexpr int kBlocksPerLaunch = 320;
constexpr int kStepsPerLaunch = 256;
constexpr int kSquaresPerLaunch = 120;

// Kernel arguments stay under the classic 4 KiB limit.
struct TensorChunks {
  OptimizerTensor tensors[kTensorsPerLaunch];
  std::uint8_t block_tensor[kBlocksPerLaunch];
  std::int32_t block_chunk[kBlocksPerLaunch];
};
static_assert(sizeof(TensorChunks) + sizeof(OptimizerHyper) + 2 * sizeof(void*) <= 4096);

__global__ void optimizer_step_kernel(OptimizerHyper h, TensorChunks a, const float* grad_scale, const float* skip) {
  if (skip != nullptr && *skip != 0.0f) return;
  const float scale = grad_scale != nullptr ? *grad_scale : 1.0f;
  const OptimizerTensor& p = a.tensors[a.block_tensor[blockIdx.x]];
  const optim_math::StepConstants c = optim_math::constants(h, p.step != nullptr ? *p.step : 0.0f);
  const std::int64_t lo = static_cast<std::int64_t>(a.block_chunk[blockIdx.x]) * kChunk;
  const std::int64_t hi = p.n < lo + kChunk ? p.n : lo + kChunk;
  std::int64_t tail = lo;  // where the one-by-one loop starts
  if (detail::aligned16(p.w) && detail::aligned16(p.g) && (p.s0 == nullptr || detail::aligned16(p.s0)) &&
      (p.s1 == nullptr || detail::aligned16(p.s1))) {
    using P = detail::Pack<float, 4>;
    static_assert(kChunk % 4 == 0, "chunks start on a pack");
    const std::int64_t q_hi = hi / 4;
    for (std::int64_t q = lo / 4 + threadIdx.x; q < q_hi; q += blockDim.x) {
      P w = reinterpret_cast<const P*>(p.w)[q];
      const P g = reinterpret_cast<const P*>(p.g)[q];
      P s0{}, s1{};
      if (p.s0 != nullptr) s0 = reinterpret_cast<const P*>(p.s0)[q];
      if (p.s1 != nullptr) s1 = reinterpret_cast<const P*>(p.s1)[q];
#pragma unroll
      for (int j = 0; j < 4; ++j) optim_math::update_values(h, c, scale, w.v[j], g.v[j], s0.v[j], s1.v[j]);
      reinterpret_cast<P*>(p.w)[q] = w;
      if (p.s0 != nullptr) reinterpret_cast<P*>(p.s0)[q] = s0;
      if (p.s1 != nullptr) reinterpret_cast<P*>(p.s1)[q] = s1;
    }
    tail = q_hi * 4 > lo ? q_hi * 4 : lo;
  }
  for (std::int64_t i = tail + threadIdx.x; i < hi; i += blockDim.x) optim_math::update(h, c, p, scale, i);
}

struct StepCounters {
  float* step[kStepsPerLaunch];
  int count;
};

__global__ void increment_steps_kernel(StepCounters s, const float* skip) {
  if (skip != nullptr && *skip != 0.0f) return;
  const int k = static_cast<int>(threadIdx.x);
  if (k < s.count) *s.step[k] += 1.0f;
}

struct SquareList {
  const float* x[kSquaresPerLaunch];
  std::int64_t n[kSquaresPerLaunch];
  int count;
};

// Each block's grid-stride share of every listed tensor, to one double.
__global__ void sum_squares_blocks(SquareList a, double* partials) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  double acc = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (int k = 0; k < a.count; ++k) {
    const float* x = a.x[k];
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n[k]; i += stride) {
      const double v = x[i];
      acc += v * v;
    }
  }
  const double total = Reduce(temp).Sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void clip_coefficient_kernel(float* coef, const float* norm_sq, float max_norm) {
  *coef = optim_math::clip_coefficient(*norm_sq, max_norm);
}

}  // namespace

void optimizer_step(const WorkerHandles& h, const OptimizerHyper& hyper, const OptimizerTensor* tensors,
                    std::size_t count, const float* grad_scale, const float* skip) {
  cudaStream_t stream = detail::cuda_stream(h);
  TensorChunks args{};
  int slots = 0, blocks = 0;
  auto flush = [&] {
    if (blocks == 0) return;
    optimizer_step_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(hyper, args, grad_scale, skip);
    WEFT_LAUNCH_CHECK();
    slots = 0;
    blocks = 0;
  };
  for (std::size_t k = 0; k < count; ++k) {
    const OptimizerTensor& p = tensors[k];
    if (p.n <= 0) continue;
    const std::int64_t chunks = (p.n + kChunk - 1) / kChunk;
    if (chunks > 0x7FFFFFFF) throw weft::Error("optimizer_step: a tensor of " + std::to_string(p.n) + " elements exceeds the chunk map");
    for (std::int64_t c = 0; c < chunks; ++c) {
      if (slots == kTensorsPerLaunch || blocks == kBlocksPerLaunch) flush();
      // The tensor takes a slot in this launch at its first chunk here.
      if (slots == 0 || args.tensors[slots - 1].w != p.w) args.tensors[slots++] = p;
      args.block_tensor[blocks] = static_cast<std::uint8_t>(slots - 1);
      args.block_chunk[blocks] = static_cast<std::int32_t>(c);
      ++blocks;
    }
  }
  flush();
  StepCounters counters{};
  for (std::size_t k = 0; k < count; ++k) {
    if (tensors[k].step == nullptr) continue;
    counters.step[counters.count++] = tensors[k].step;
    if (counters.count == kStepsPerLaunch) {
      increment_steps_kernel<<<1, kStepsPerLaunch, 0, stream>>>(counters, skip);
      WEFT_LAUNCH_CHECK();
      counters.count = 0;
    }
  }
  if (counters.count > 0) {
    increment_steps_kernel<<<1, kStepsPerLaunch, 0, stream>>>(counters, skip);
    WEFT_LAUNCH_CHECK();
  }
}

void sum_squares(const WorkerHandles& h, float* y, const float* const* xs, const std::int64_t* ns,
                 std::size_t count) {
  cudaStream_t stream = detail::cuda_stream(h);
  const std::size_t launches = (count + kSquaresPerLaunch - 1) / kSquaresPerLaunch;
  if (launches == 0) return detail::zero(h, y, 1);
  const std::int64_t slots = detail::partial_slots(h);
  if (slots < static_cast<std::int64_t>(launches))
    throw weft::Error("sum_squares: the worker's workspace holds " + std::to_string(slots) + " partial sums, " +
                      std::to_string(launches) + " needed");
  const std::int64_t per_launch = slots / static_cast<std::int64_t>(launches);
  auto* partials = static_cast<double*>(h.workspace);
  std::int64_t used = 0;
  for (std::size_t l = 0; l < launches; ++l) {
    SquareList list{};
    std::int64_t total = 0;
    for (std::size_t k = l * kSquaresPerLaunch; k < count && list.count < kSquaresPerLaunch; ++k) {
      list.x[list.count] = xs[k];
      list.n[list.count++] = ns[k];
      total += ns[k];
    }
    const std::int64_t blocks = std::min<std::int64_t>(detail::blocks_for(total, detail::kMaxReduceBlocks), per_launch);
    sum_squares_blocks<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(list, partials + used);
    WEFT_LAUNCH_CHECK();
    used += blocks;
  }
  detail::finish_partials(h, partials, used, 1.0, y);
}

void clip_coefficient(const WorkerHandles& h, float* coef, const float* norm_sq, float max_norm) {
  clip_coefficient_kernel<<<1, 1, 0, detail::cuda_stream(h)>>>(coef, norm_sq, max_norm);
  WEFT_LAUNCH_CHECK();
}

}  // namespace weft::kernels::gpu
