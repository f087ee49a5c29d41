// GPU discovery and stream resources. Without CUDA (WEFT_HAVE_CUDA unset) every
// query answers "no GPU" and constructors throw: nothing can ask for a GPU
// that discovery did not report.
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>
#include <utility>

#include "weft/error.h"
#include "weft/gpu_streams.h"

#if WEFT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "weft/cuda_check.h"
#endif

namespace weft::gpu {

std::string_view to_string(StreamRole role) noexcept {
  switch (role) {
    case StreamRole::compute: return "compute";
    case StreamRole::h2d: return "h2d";
    case StreamRole::d2h: return "d2h";
    case StreamRole::peer: return "p2p";
    case StreamRole::priority: return "priority";
  }
  return "?";
}

#if WEFT_HAVE_CUDA

bool built_with_cuda() noexcept { return true; }

int device_count() noexcept {
  static const int count = [] {
    int n = 0;
    // No driver (error 35 on CPU machines), no device, or a broken install:
    // all mean zero GPUs, silently. The error is not sticky; clear it.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

std::string describe(int device) {
  if (device < 0 || device >= device_count())
    throw Error("gpu(" + std::to_string(device) + ") does not exist (" + std::to_string(device_count()) + " GPU(s))");
  cudaDeviceProp p{};
  WEFT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(p.totalGlobalMem) / (1 << 30));
  return std::string(p.name) + ", " + mem + ", sm_" + std::to_string(p.major) + std::to_string(p.minor);
}

void set_device(int device) { WEFT_CUDA_CHECK(cudaSetDevice(device)); }
void synchronize_device(int device) {
  set_device(device);
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
}

StreamResources::StreamResources(int device, StreamRole role, std::size_t workspace_bytes) : role_(role) {
  handles_.device = Device::gpu(device);
  set_device(device);
  int least = 0, greatest = 0;
  WEFT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking,
                                               role == StreamRole::priority ? greatest : least));
  handles_.stream = s;
  if (role == StreamRole::compute || role == StreamRole::priority) {
    cublasHandle_t b = nullptr;
    WEFT_CUBLAS_CHECK(cublasCreate(&b));
    WEFT_CUBLAS_CHECK(cublasSetStream(b, s));
    handles_.cublas = b;
    cudnnHandle_t d = nullptr;
    WEFT_CUDNN_CHECK(cudnnCreate(&d));
    WEFT_CUDNN_CHECK(cudnnSetStream(d, s));
    handles_.cudnn = d;
    if (workspace_bytes) {
      WEFT_CUDA_CHECK(cudaMalloc(&handles_.workspace, workspace_bytes));
      handles_.workspace_bytes = workspace_bytes;
    }
  }
}

StreamResources::~StreamResources() {
  cudaSetDevice(handles_.device.index());
  if (handles_.stream) cudaStreamSynchronize(handles_.stream);
  if (handles_.workspace) cudaFree(handles_.workspace);
  if (handles_.cudnn) cudnnDestroy(handles_.cudnn);
  if (handles_.cublas) cublasDestroy(handles_.cublas);
  if (handles_.stream) cudaStreamDestroy(handles_.stream);
}

void StreamResources::synchronize() const { WEFT_CUDA_CHECK(cudaStreamSynchronize(handles_.stream)); }

namespace {
// Recycled CUDA events, one list per device: creating and destroying an event
// per GPU op would cost a driver call each. Never shrinks; events are tiny.
class EventPool {
 public:
  cudaEvent_t acquire(int device) {
    {
      std::lock_guard lock(mutex_);
      if (device < static_cast<int>(free_.size()) && !free_[static_cast<std::size_t>(device)].empty()) {
        cudaEvent_t e = free_[static_cast<std::size_t>(device)].back();
        free_[static_cast<std::size_t>(device)].pop_back();
        return e;
      }
    }
    // Created on `device` whatever is current: events belong to a device.
    int previous = 0;
    WEFT_CUDA_CHECK(cudaGetDevice(&previous));
    WEFT_CUDA_CHECK(cudaSetDevice(device));
    cudaEvent_t e = nullptr;
    const cudaError_t status = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaSetDevice(previous);
    WEFT_CUDA_CHECK(status);
    return e;
  }
  // Re-recording a returned event later is safe: waits already enqueued on
  // it captured the recording they saw.
  void release(int device, cudaEvent_t e) noexcept {
    std::lock_guard lock(mutex_);
    if (device >= static_cast<int>(free_.size())) free_.resize(static_cast<std::size_t>(device) + 1);
    free_[static_cast<std::size_t>(device)].push_back(e);
  }

 private:
  std::mutex mutex_;
  std::vector<std::vector<cudaEvent_t>> free_;
};

EventPool& event_pool() {
  static EventPool* pool = new EventPool;  // never destroyed: events may be released during exit
  return *pool;
}
}  // namespace

Event* Event::record(int device, CUstream_st* stream) {
  cudaEvent_t e = event_pool().acquire(device);
  try {
    WEFT_CUDA_CHECK(cudaEventRecord(e, stream));
  } catch (...) {
    event_pool().release(device, e);
    throw;
  }
  return new Event(e, stream, device);
}

Event::~Event() { event_pool().release(device_, event_); }

void Event::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void Event::stream_wait(CUstream_st* stream) const {
  if (stream == stream_) return;  // stream order already covers it
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

void Event::host_wait() const { WEFT_CUDA_CHECK(cudaEventSynchronize(event_)); }

#else  // no CUDA in this build

bool built_with_cuda() noexcept { return false; }
int device_count() noexcept { return 0; }
[[noreturn]] static void no_cuda(const char* what) {
  throw Error(std::string(what) + ": this Weft was built without CUDA (no GPU paths)");
}
std::string describe(int) { no_cuda("gpu::describe"); }
void set_device(int) { no_cuda("gpu::set_device"); }
void synchronize_device(int) { no_cuda("gpu::synchronize_device"); }
StreamResources::StreamResources(int, StreamRole role, std::size_t) : role_(role) { no_cuda("gpu stream"); }
StreamResources::~StreamResources() = default;
void StreamResources::synchronize() const {}
Event* Event::record(int, CUstream_st*) { no_cuda("gpu event"); }
Event::~Event() = default;
void Event::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}
void Event::stream_wait(CUstream_st*) const {}
void Event::host_wait() const {}

#endif

}  // namespace weft::gpu
