// The GPU backend interface: everything the engine, the allocators and the
// ops ask of a GPU, behind one abstract class with two implementations —
// CudaBackend (cuda_backend.cpp, only where CUDA was built) and SimBackend
// (sim_backend.cpp, every build). Internal to devices/: the rest of Weft
// reaches it through weft/gpu.h, weft/gpu_streams.h, weft/gpu_timing.h and
// weft/allocator.h, and never asks which backend is active (the one
// exception is the kernel dispatch point in ops/src/launch.h).
//
// Contract (both backends):
//   * streams are FIFOs executed asynchronously to the host; a stream wait on
//     an event blocks only that stream; an event completes when its stream
//     reaches it; host waits block the calling thread until then;
//   * an event never recorded counts as complete; re-recording an event
//     affects only waits and queries made after it;
//   * device memory has a capacity; allocation returns null when full;
//   * errors are thrown as weft::DeviceError (OutOfMemory, InvalidArgument
//     where they apply), naming the call and the op on this thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "weft/gpu.h"
#include "weft/gpu_streams.h"
#include "weft/unique_function.h"

namespace weft::gpu::detail {

// The cause this thread declared for its host waits (gpu::ScopedWaitCause).
WaitCause thread_wait_cause() noexcept;

struct MemInfo {
  std::size_t free = 0, total = 0;
};

class BackendImpl {
 public:
  virtual ~BackendImpl();
  virtual Backend kind() const noexcept = 0;  // which one this is
  virtual int device_count() const noexcept = 0;
  virtual DeviceProperties properties(int device) = 0;
  virtual std::string describe(int device) = 0;
  virtual void set_device(int device) = 0;
  virtual MemInfo mem_info(int device) = 0;

  // Streams. `highest_priority`: the device's highest stream priority.
  virtual Stream* create_stream(int device, bool highest_priority) = 0;
  virtual void destroy_stream(Stream* stream) noexcept = 0;
  virtual int stream_device(Stream* stream) = 0;
  virtual void* native_handle(Stream* stream) noexcept = 0;
  // Library handles and workspace of a compute stream (CUDA); nothing when simulated.
  virtual void create_handles(WorkerHandles& h, std::size_t workspace_bytes) = 0;
  virtual void destroy_handles(WorkerHandles& h) noexcept = 0;

  // Events. record_event and stream_wait_event honour captures (below).
  virtual NativeEvent* create_event(int device, bool timing) = 0;
  virtual void destroy_event(NativeEvent* event) noexcept = 0;
  void record_event(NativeEvent* event, Stream* stream);
  void stream_wait_event(Stream* stream, NativeEvent* event);
  virtual bool event_done(NativeEvent* event) = 0;  // throws what failed before it
  virtual float elapsed_ms(NativeEvent* start, NativeEvent* end) = 0;
  // The sim backend's modeled mode: the event's modeled time in seconds (done); else -1.
  virtual double event_modeled_time(NativeEvent*) { return -1; }

  // Stream-ordered work.
  virtual void launch_host_func(Stream* stream, UniqueFunction<void()> fn) = 0;
  virtual void launch_host_kernel(Stream* stream, UniqueFunction<void()> fn) = 0;
  virtual void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream* stream) = 0;
  virtual void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                                 Stream* stream) = 0;

  // Stream graphs (weft/gpu_streams.h). While a thread captures a stream:
  //   * that thread may not record an event on it, make it wait for one,
  //     synchronize with it or any event, or allocate device memory (what a
  //     graph cannot replay, or CUDA refuses): InvalidArgument;
  //   * another thread recording an event on it (the allocator freeing a
  //     block the stream used) gets an event for the stream's work up to the
  //     capture's start — what the capture records is not enqueued yet —
  //     made on a helper stream of the device; another thread synchronizing
  //     with it waits for that point too. Nothing of theirs joins the capture.
  // A lock-free check keeps operations on streams no one captures as cheap
  // as before (two atomic counters, Dekker-style, against begin_capture).
  void begin_capture(Stream* stream);
  std::unique_ptr<StreamGraph> end_capture(Stream* stream, std::string* why);
  virtual void launch_graph(StreamGraph& graph, Stream* stream) = 0;
  // The stream this thread captures, or null.
  static Stream* capturing_stream() noexcept;

  // Memory. Null when there is no room (never throws).
  virtual void* device_malloc(int device, std::size_t bytes) noexcept = 0;
  virtual void device_free(int device, void* ptr) noexcept = 0;
  virtual void* pinned_malloc(std::size_t bytes) noexcept = 0;
  virtual void pinned_free(void* ptr) noexcept = 0;

  // Host waits: counted by the caller's declared cause (weft::gpu::WaitCause).
  void event_synchronize(NativeEvent* event);
  void stream_synchronize(Stream* stream);
  void device_synchronize(int device);

  BackendImpl();

 protected:
  virtual void do_record_event(NativeEvent* event, Stream* stream) = 0;
  virtual void do_stream_wait_event(Stream* stream, NativeEvent* event) = 0;
  virtual void do_begin_capture(Stream* stream) = 0;
  // Null when the capture failed (`*why`); the stream captures no more.
  virtual std::unique_ptr<StreamGraph> do_end_capture(Stream* stream, std::string* why) = 0;
  virtual void do_event_synchronize(NativeEvent* event) = 0;
  virtual void do_stream_synchronize(Stream* stream) = 0;
  virtual void do_device_synchronize(int device) = 0;

 private:
  static void count_host_wait() noexcept;
  // Refuses `call` on the stream (or, with null, any host wait) this thread captures.
  static void refuse_while_capturing(Stream* stream, const char* call);
  struct Captures;
  std::unique_ptr<Captures> captures_;
  // Calls plain() at once where no stream captures (lock-free); else under
  // the captures' mutex: captured(capture) when `stream` captures, plain()
  // when it does not (stream_capture.cpp).
  template <class Plain, class Captured>
  void on_stream(Stream* stream, Plain&& plain, Captured&& captured);
};

// The process's backend, created at first use from the environment (or what
// select_backend chose).
BackendImpl& active_backend();

std::unique_ptr<BackendImpl> make_sim_backend(int gpus);  // sim_backend.cpp
#if WEFT_HAVE_CUDA
std::unique_ptr<BackendImpl> make_cuda_backend();  // cuda_backend.cpp
#endif
std::unique_ptr<BackendImpl> make_no_backend(std::string why);  // gpu.cpp

// "4.00 GiB", "512 bytes".
std::string human_bytes(std::size_t bytes);

}  // namespace weft::gpu::detail
