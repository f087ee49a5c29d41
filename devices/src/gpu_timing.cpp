#include "weft/gpu_timing.h"

#include <string>

#include "weft/error.h"

#if WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/cuda_check.h"
#endif

namespace weft::gpu {

#if WEFT_HAVE_CUDA

TimingEvent::TimingEvent(int device) : device_(device) {
  int previous = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&previous));
  WEFT_CUDA_CHECK(cudaSetDevice(device));
  cudaEvent_t e = nullptr;
  const cudaError_t status = cudaEventCreate(&e);  // timing enabled
  cudaSetDevice(previous);
  WEFT_CUDA_CHECK(status);
  event_ = e;
}

TimingEvent::~TimingEvent() {
  if (event_) cudaEventDestroy(event_);
}

void TimingEvent::record(CUstream_st* stream) { WEFT_CUDA_CHECK(cudaEventRecord(event_, stream)); }

bool TimingEvent::done() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it
    return false;
  }
  WEFT_CUDA_CHECK(status);
  return true;
}

void TimingEvent::synchronize() const { WEFT_CUDA_CHECK(cudaEventSynchronize(event_)); }

float TimingEvent::ms_since(const TimingEvent& earlier) const {
  float ms = 0;
  WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, earlier.event_, event_));
  return ms;
}

#else  // no CUDA in this build

TimingEvent::TimingEvent(int device) : device_(device) {
  throw Error("gpu timing event on gpu(" + std::to_string(device) + "): this build of Weft has no CUDA");
}
TimingEvent::~TimingEvent() = default;
void TimingEvent::record(CUstream_st*) {}
bool TimingEvent::done() const { return true; }
void TimingEvent::synchronize() const {}
float TimingEvent::ms_since(const TimingEvent&) const { return 0; }

#endif

}  // namespace weft::gpu
