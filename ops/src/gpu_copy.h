// The CUDA memcpy calls behind Tensor copies (gpu_copy.cpp; errors without CUDA).
#pragma once

#include <cstddef>

#include "weft/gpu.h"

namespace weft::detail {

enum class CopyKind { host_to_device, device_to_host, device_to_device };
// Enqueued on `stream`; host memory must be pinned for the copy to be async.
void gpu_memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, CUstream_st* stream);
void gpu_memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                           CUstream_st* stream);

}  // namespace weft::detail
