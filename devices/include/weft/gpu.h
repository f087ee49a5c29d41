// GPU discovery and the per-worker CUDA resources ops receive.
//
// This header names CUDA's handle types by forward declaration only, so it is
// safe to include in CPU-only builds and in files compiled without CUDA
// headers. Discovery never prints: a machine with no driver, no device, or a
// build without CUDA simply has zero GPUs.
#pragma once

#include <cstddef>
#include <string>

#include "weft/device.h"

struct CUstream_st;   // cudaStream_t
struct CUevent_st;    // cudaEvent_t
struct cublasContext; // cublasHandle_t
struct cudnnContext;  // cudnnHandle_t

namespace weft::gpu {

// Whether this build has the GPU paths (CUDA found at configure time).
bool built_with_cuda() noexcept;
// Number of usable GPUs: 0 without CUDA, without a driver or without devices.
// Cached after the first call.
int device_count() noexcept;
// "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90" (throws weft::Error for a bad index).
std::string describe(int device);

// What a GPU op gets in its RunContext: the stream of the worker it runs on
// and that worker's own library handles (never shared between workers, so
// no locking). The workspace is for cuDNN/cuBLAS algorithms that need one.
struct WorkerHandles {
  Device device;
  CUstream_st* stream = nullptr;
  cublasContext* cublas = nullptr;
  cudnnContext* cudnn = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

}  // namespace weft::gpu
