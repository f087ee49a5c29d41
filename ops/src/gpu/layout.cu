// Memory-format conversions NCHW <-> NHWC as one gather kernel over the
// output's elements, moving raw elements of 2 or 4 bytes (any dtype of that size).
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

}  // namespace

void to_channels_last(const WorkerHandles& h, void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw,
                      std::size_t elem) {
  permute(h, y, x, n, c, hw, elem, true, "to_channels_last");
}

void to_channels_first(const WorkerHandles& h, void* y, const void* x, std::int64_t n, std::int64_t c,
                       std::int64_t hw, std::size_t elem) {
  permute(h, y, x, n, c, hw, elem, false, "to_contiguous");
}

}  // namespace weft::kernels::gpu
