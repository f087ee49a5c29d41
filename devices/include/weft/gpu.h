// GPU discovery: which GPU backend this process uses, how many GPUs it has,
// and what a GPU op receives to enqueue its work.
//
// Two backends sit behind one interface: `cuda`, the real GPUs, and `sim`,
// simulated GPUs that run the same engine, stream, event, allocator and copy
// paths on any machine (docs/design/simulated-gpus.md).
// The process picks one at its first GPU query, from WEFT_GPU_BACKEND
// (cuda | sim | none; unset: cuda where a GPU answers, else none) and, for
// sim, WEFT_SIM_GPUS (default 2) — or from select_backend() / EngineConfig
// before that. Discovery never prints: no driver, no device, or a build
// without CUDA simply means zero GPUs.
//
// This header names no CUDA type, so it is safe in CPU-only builds.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "weft/device.h"

struct cublasContext;  // cublasHandle_t
struct cudnnContext;   // cudnnHandle_t

namespace weft::gpu {

// A stream of one GPU: work enqueued on it runs in order, asynchronously to
// the host. Opaque: on CUDA it is the cudaStream_t itself.
struct Stream;

enum class Backend : unsigned char { none, cuda, sim };
std::string_view to_string(Backend backend) noexcept;
// Parses "none" | "cuda" | "sim"; throws weft::InvalidArgument naming the text.
Backend parse_backend(std::string_view text);

// Whether this build has the cuda backend (CUDA found at configure time).
// Simulated GPUs exist in every build.
bool built_with_cuda() noexcept;

// Chooses the process's GPU backend before its first use. `sim_gpus` (sim
// only; 0: WEFT_SIM_GPUS, else 2) is the number of simulated GPUs. Choosing
// what is already active is fine; anything else once the backend is in use
// throws weft::InvalidArgument naming both choices.
void select_backend(Backend backend, int sim_gpus = 0);
// The process's GPU backend (fixed by this call if nothing chose it yet).
Backend backend() noexcept;
// Number of usable GPUs of the active backend: 0 without one.
int device_count() noexcept;

struct DeviceProperties {
  std::string name;                 // "NVIDIA H100 80GB HBM3" / "Weft simulated GPU"
  std::size_t memory_bytes = 0;     // capacity
  int compute_major = 0, compute_minor = 0;  // sm_90 -> 9, 0 (0, 0 when simulated)
  bool simulated = false;
};
// Throws weft::InvalidArgument for a GPU that does not exist.
DeviceProperties properties(int device);
// "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90", or "simulated GPU (Weft sim
// backend), 4.0 GiB, ..." with the simulator's timing model.
std::string describe(int device);

// What a GPU op gets in its RunContext: the stream of the worker it runs on
// and, on CUDA, that worker's own library handles (never shared between
// workers, so no locking; null on simulated GPUs). The workspace is for
// cuDNN/cuBLAS algorithms that need one.
struct WorkerHandles {
  Device device;
  Stream* stream = nullptr;
  cublasContext* cublas = nullptr;
  cudnnContext* cudnn = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

}  // namespace weft::gpu
