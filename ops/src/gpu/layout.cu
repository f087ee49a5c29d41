// Memory-format conversions NCHW <-> NHWC, and axis permutations, as gather
// kernels over the output's elements, moving raw elements (any dtype of the
// sizes they take).
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

// to_last: y NHWC from x NCHW; else y NCHW from x NHWC.
template <class E>
__global__ void permute_kernel(E* y, const E* x, std::int64_t total, std::int64_t c, std::int64_t hw, bool to_last) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    if (to_last) {  // i = (n * hw + p) * c + k
      const std::int64_t k = i % c, p = (i / c) % hw, n = i / (c * hw);
      y[i] = x[(n * c + k) * hw + p];
    } else {  // i = (n * c + k) * hw + p
      const std::int64_t p = i % hw, k = (i / hw) % c, n = i / (c * hw);
      y[i] = x[(n * hw + p) * c + k];
    }
  }
}

void permute(const WorkerHandles& h, void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw,
             std::size_t elem, bool to_last, const char* op) {
  const std::int64_t total = n * c * hw;
  if (total <= 0) return;
  const unsigned blocks = blocks_for(total);
  if (elem == 4)
    permute_kernel<std::uint32_t><<<blocks, kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<std::uint32_t*>(y), static_cast<const std::uint32_t*>(x), total, c, hw, to_last);
  else if (elem == 2)
    permute_kernel<std::uint16_t><<<blocks, kThreads, 0, detail::cuda_stream(h)>>>(
        static_cast<std::uint16_t*>(y), static_cast<const std::uint16_t*>(x), total, c, hw, to_last);
  else
    throw weft::Error(std::string(op) + ": no kernel for elements of " + std::to_string(elem) + " bytes");
  WEFT_LAUNCH_CHECK();
}

// Up to 6 output axes: extents, and each one's stride in x (elements).
struct PermuteDims {
  int rank;
  std::int64_t extent[6];
  std::int64_t stride[6];
};

template <class E>
__global__ void axes_kernel(E* __restrict__ y, const E* __restrict__ x, std::int64_t total, PermuteDims d) {
  const std::int64_t step = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    std::int64_t r = i, off = 0;
#pragma unroll
    for (int a = 5; a >= 0; --a) {
      if (a < d.rank) {
        off += (r % d.extent[a]) * d.stride[a];
        r /= d.extent[a];
      }
    }
    y[i] = x[off];
  }
}

template <class E>
void launch_axes(const WorkerHandles& h, void* y, const void* x, std::int64_t total, const PermuteDims& d) {
  axes_kernel<E><<<blocks_for(total), kThreads, 0, detail::cuda_stream(h)>>>(static_cast<E*>(y),
                                                                             static_cast<const E*>(x), total, d);
}

}  // namespace

void permute(const WorkerHandles& h, void* y, const void* x, int rank, const std::int64_t* extent,
             const std::int64_t* src_stride, std::size_t elem) {
  if (rank < 1 || rank > 6) throw weft::Error("permute: rank " + std::to_string(rank) + " is outside 1..6");
  PermuteDims d{};
  d.rank = rank;
  std::int64_t total = 1;
  for (int a = 0; a < rank; ++a) {
    d.extent[a] = extent[a];
    d.stride[a] = src_stride[a];
    total *= extent[a];
  }
  if (total <= 0) return;
  switch (elem) {
    case 1: launch_axes<std::uint8_t>(h, y, x, total, d); break;
    case 2: launch_axes<std::uint16_t>(h, y, x, total, d); break;
    case 4: launch_axes<std::uint32_t>(h, y, x, total, d); break;
    case 8: launch_axes<std::uint64_t>(h, y, x, total, d); break;
    default: throw weft::Error("permute: no kernel for elements of " + std::to_string(elem) + " bytes");
  }
  WEFT_LAUNCH_CHECK();
}

void to_channels_last(const WorkerHandles& h, void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw,
                      std::size_t elem) {
  permute(h, y, x, n, c, hw, elem, true, "to_channels_last");
}

void to_channels_first(const WorkerHandles& h, void* y, const void* x, std::int64_t n, std::int64_t c,
                       std::int64_t hw, std::size_t elem) {
  permute(h, y, x, n, c, hw, elem, false, "to_contiguous");
}

}  // namespace weft::kernels::gpu
