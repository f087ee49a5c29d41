#include "gpu_copy.h"

#include "weft/error.h"

#if WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/cuda_check.h"
#endif

namespace weft::detail {

#if WEFT_HAVE_CUDA
void gpu_memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, CUstream_st* stream) {
  if (!bytes) return;
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, stream));
}

void gpu_memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                           CUstream_st* stream) {
  if (!bytes) return;
  WEFT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream));
}
#else
void gpu_memcpy_async(void*, const void*, std::size_t, CopyKind, CUstream_st*) {
  throw Error("GPU copy: this Weft was built without CUDA");
}
void gpu_memcpy_peer_async(void*, int, const void*, int, std::size_t, CUstream_st*) {
  throw Error("GPU copy: this Weft was built without CUDA");
}
#endif

}  // namespace weft::detail
