// The CUDA backend behind weft/gpu.h: a Stream* is the cudaStream_t itself and
// a NativeEvent* the cudaEvent_t, so the real-GPU path adds no indirection.
// Compiled only where CUDA was found (WEFT_HAVE_CUDA).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "backend.h"
#include "weft/checked_call.h"
#include "weft/error.h"

namespace weft::gpu::detail {

namespace {

cudaStream_t cu(Stream* s) noexcept { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t cu(NativeEvent* e) noexcept { return reinterpret_cast<cudaEvent_t>(e); }

// Makes `device` current until the end of the scope (events and streams
// belong to a device, whatever the calling thread has current).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    WEFT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) WEFT_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

void CUDART_CB run_host_func(void* data) {
  auto* fn = static_cast<UniqueFunction<void()>*>(data);
  try {
    (*fn)();
  } catch (const std::exception& e) {
    // A host function cannot fail its stream on CUDA; say so loudly.
    std::fprintf(stderr, "weft: a stream host function threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "weft: a stream host function threw\n");
  }
  delete fn;
}

struct CudaStreamGraph final : StreamGraph {
  cudaGraphExec_t exec = nullptr;
  // Launches still in flight finish: CUDA frees the graph after them.
  ~CudaStreamGraph() override {
    if (exec) (void)cudaGraphExecDestroy(exec);
  }
};

// Work that must not be recorded into a CUDA Graph is refused while the
// stream captures (the caller ends and drops the capture).
void refuse_if_stream_captures(Stream* stream, const char* call) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(cu(stream), &status));
  if (status != cudaStreamCaptureStatusNone)
    throw InvalidArgument(std::string(call) + " while its stream is captured into a graph: only work that can run "
                          "again may be recorded" + weft::detail::current_op_suffix());
}

class CudaBackend final : public BackendImpl {
 public:
  CudaBackend() {
    int n = 0;
    // No driver (error 35 on CPU machines), no device, or a broken install:
    // all mean zero GPUs, silently. The error is not sticky; clear it.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    count_ = n;
  }

  Backend kind() const noexcept override { return Backend::cuda; }
  int device_count() const noexcept override { return count_; }

  DeviceProperties properties(int device) override {
    cudaDeviceProp p{};
    WEFT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    return DeviceProperties{p.name, p.totalGlobalMem, p.major, p.minor, false};
  }

  std::string describe(int device) override {
    const DeviceProperties p = properties(device);
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(p.memory_bytes) / (1 << 30));
    return p.name + ", " + mem + ", sm_" + std::to_string(p.compute_major) + std::to_string(p.compute_minor);
  }

  void set_device(int device) override { WEFT_CUDA_CHECK(cudaSetDevice(device)); }

  MemInfo mem_info(int device) override {
    DeviceScope scope(device);
    MemInfo m;
    WEFT_CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
    return m;
  }

  Stream* create_stream(int device, bool highest_priority) override {
    DeviceScope scope(device);
    int least = 0, greatest = 0;
    WEFT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    WEFT_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, highest_priority ? greatest : least));
    try {
      std::lock_guard lock(stream_devices_mutex_);
      stream_devices_[s] = device;
    } catch (...) {
      cudaStreamDestroy(s);
      throw;
    }
    return reinterpret_cast<Stream*>(s);
  }

  void destroy_stream(Stream* stream) noexcept override {
    if (!stream) return;
    {
      std::lock_guard lock(stream_devices_mutex_);
      stream_devices_.erase(cu(stream));
    }
    cudaStreamDestroy(cu(stream));
  }

  // Remembered from creation: cudaStreamGetDevice on a stream another thread
  // captures fails and invalidates that capture (the allocator asks for the
  // device of a stream that used a block it frees).
  int stream_device(Stream* stream) override {
    {
      std::shared_lock lock(stream_devices_mutex_);
      if (auto it = stream_devices_.find(cu(stream)); it != stream_devices_.end()) return it->second;
    }
    int device = 0;
    WEFT_CUDA_CHECK(cudaStreamGetDevice(cu(stream), &device));
    return device;
  }

  void* native_handle(Stream* stream) noexcept override { return cu(stream); }

  void create_handles(WorkerHandles& h, std::size_t workspace_bytes) override {
    DeviceScope scope(h.device.index());
    try {
      cublasHandle_t b = nullptr;
      WEFT_CUBLAS_CHECK(cublasCreate(&b));
      h.cublas = b;
      WEFT_CUBLAS_CHECK(cublasSetStream(b, cu(h.stream)));
      cudnnHandle_t d = nullptr;
      WEFT_CUDNN_CHECK(cudnnCreate(&d));
      h.cudnn = d;
      WEFT_CUDNN_CHECK(cudnnSetStream(d, cu(h.stream)));
      if (workspace_bytes) {
        WEFT_CUDA_CHECK(cudaMalloc(&h.workspace, workspace_bytes));
        h.workspace_bytes = workspace_bytes;
      }
    } catch (...) {
      destroy_handles(h);
      throw;
    }
  }

  void destroy_handles(WorkerHandles& h) noexcept override {
    cudaSetDevice(h.device.index());
    if (h.workspace) cudaFree(h.workspace);
    if (h.cudnn) cudnnDestroy(h.cudnn);
    if (h.cublas) cublasDestroy(h.cublas);
    h.workspace = nullptr;
    h.workspace_bytes = 0;
    h.cudnn = nullptr;
    h.cublas = nullptr;
  }

  NativeEvent* create_event(int device, bool timing) override {
    DeviceScope scope(device);
    cudaEvent_t e = nullptr;
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return reinterpret_cast<NativeEvent*>(e);
  }
  void destroy_event(NativeEvent* event) noexcept override {
    if (event) cudaEventDestroy(cu(event));
  }
  void do_record_event(NativeEvent* event, Stream* stream) override {
    WEFT_CUDA_CHECK(cudaEventRecord(cu(event), cu(stream)));
  }
  void do_stream_wait_event(Stream* stream, NativeEvent* event) override {
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(cu(stream), cu(event), 0));
  }
  bool event_done(NativeEvent* event) override {
    const cudaError_t status = cudaEventQuery(cu(event));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      return false;
    }
    WEFT_CUDA_CHECK(status);
    return true;
  }
  float elapsed_ms(NativeEvent* start, NativeEvent* end) override {
    float ms = 0;
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, cu(start), cu(end)));
    return ms;
  }

  void launch_host_func(Stream* stream, UniqueFunction<void()> fn) override {
    // Its box is freed after one call: a graph launching it again would call freed memory.
    refuse_if_stream_captures(stream, "gpu::launch_host_func (a host function that runs once)");
    auto* boxed = new UniqueFunction<void()>(std::move(fn));
    const cudaError_t status = cudaLaunchHostFunc(cu(stream), run_host_func, boxed);
    if (status != cudaSuccess) delete boxed;
    WEFT_CUDA_CHECK(status);
  }

  // Not used on CUDA (its kernels are CUDA kernels); refused while capturing as launch_host_func is.
  void launch_host_kernel(Stream* stream, UniqueFunction<void()> fn) override {
    launch_host_func(stream, std::move(fn));
  }

  void do_begin_capture(Stream* stream) override {
    // Thread-local mode: an unsafe call of this thread (a synchronization,
    // cudaMalloc) fails and invalidates the capture; other threads' calls
    // go on as usual.
    WEFT_CUDA_CHECK(cudaStreamBeginCapture(cu(stream), cudaStreamCaptureModeThreadLocal));
  }

  std::unique_ptr<StreamGraph> do_end_capture(Stream* stream, std::string* why) override {
    cudaGraph_t graph = nullptr;
    cudaError_t status = cudaStreamEndCapture(cu(stream), &graph);
    auto failed = [&](const char* call) -> std::unique_ptr<StreamGraph> {
      if (why) *why = std::string(call) + ": " + cudaGetErrorString(status);
      (void)cudaGetLastError();  // capture errors are not sticky; clear the last error
      if (graph) (void)cudaGraphDestroy(graph);
      return nullptr;
    };
    if (status != cudaSuccess || graph == nullptr) return failed("cudaStreamEndCapture");
    auto g = std::make_unique<CudaStreamGraph>();
    status = cudaGraphInstantiate(&g->exec, graph, 0);
    if (status != cudaSuccess) return failed("cudaGraphInstantiate");
    (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
    return g;
  }

  void launch_graph(StreamGraph& graph, Stream* stream) override {
    WEFT_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaStreamGraph&>(graph).exec, cu(stream)));
  }

  void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream* stream) override {
    const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                                : cudaMemcpyDeviceToDevice;
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, cu(stream)));
  }
  void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                         Stream* stream) override {
    WEFT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, cu(stream)));
  }

  void* device_malloc(int device, std::size_t bytes) noexcept override {
    void* p = nullptr;
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is not sticky; clear it
      return nullptr;
    }
    return p;
  }
  void device_free(int device, void* ptr) noexcept override {
    cudaSetDevice(device);
    cudaFree(ptr);
  }
  void* pinned_malloc(std::size_t bytes) noexcept override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void pinned_free(void* ptr) noexcept override { cudaFreeHost(ptr); }

 protected:
  void do_event_synchronize(NativeEvent* event) override { WEFT_CUDA_CHECK(cudaEventSynchronize(cu(event))); }
  void do_stream_synchronize(Stream* stream) override { WEFT_CUDA_CHECK(cudaStreamSynchronize(cu(stream))); }
  void do_device_synchronize(int device) override {
    WEFT_CUDA_CHECK(cudaSetDevice(device));
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  int count_ = 0;
  std::shared_mutex stream_devices_mutex_;
  std::unordered_map<cudaStream_t, int> stream_devices_;  // every stream create_stream made
};

}  // namespace

std::unique_ptr<BackendImpl> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace weft::gpu::detail
