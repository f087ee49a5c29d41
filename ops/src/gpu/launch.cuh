// Launch configuration shared by the .cu kernel files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "weft/checked_call.h"

namespace weft::kernels::gpu::detail {

inline constexpr int kThreads = 256;
// Grid-stride loops cover any n, so the grid only needs to fill the GPU a few
// times over; more blocks would just be scheduling overhead.
inline constexpr std::int64_t kMaxBlocks = 8192;
// Reductions write one partial per block and finish in a single block, so the
// partial count is capped at what one block reduces in one step.
inline constexpr std::int64_t kMaxReduceBlocks = 1024;

inline unsigned blocks_for(std::int64_t n, std::int64_t cap = kMaxBlocks) {
  return static_cast<unsigned>(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1, cap));
}

}  // namespace weft::kernels::gpu::detail

// Every launch is followed by a check so a bad configuration names this call
// site instead of surfacing as a sticky error in some later op.
#define WEFT_LAUNCH_CHECK() WEFT_CUDA_CHECK(cudaGetLastError())
