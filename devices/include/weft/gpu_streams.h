// Streams, events and stream-ordered work, the same on real and simulated
// GPUs: what the engine builds its GPU workers on, and what a GPU op may call
// to enqueue work on its stream. With the `none` backend, creating any of it
// throws (no GPU can exist).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "weft/gpu.h"
#include "weft/unique_function.h"

namespace weft::gpu {

struct NativeEvent;  // the backend's event (cudaEvent_t on CUDA)

// The streams of one GPU, one per engine worker (one word: a stream's role).
enum class StreamRole : unsigned char { compute, h2d, d2h, peer, priority };
std::string_view to_string(StreamRole role) noexcept;

// A worker's stream and handles. Created on any thread, used by one worker at
// a time (handles are not thread-bound, only not re-entrant).
class StreamResources {
 public:
  // Compute and priority streams get the library handles and a workspace
  // (CUDA); the priority stream is created with the device's highest priority.
  StreamResources(int device, StreamRole role, std::size_t workspace_bytes);
  ~StreamResources();
  StreamResources(const StreamResources&) = delete;
  StreamResources& operator=(const StreamResources&) = delete;

  const WorkerHandles& handles() const noexcept { return handles_; }
  StreamRole role() const noexcept { return role_; }
  void synchronize() const;  // host wait (barriers and shutdown only, never in an op)

 private:
  WorkerHandles handles_;
  StreamRole role_;
};

// A recorded event shared by every variable an op wrote or read.
class Event {
 public:
  // Records an event (recycled from a per-device pool) on `stream` of `device`.
  static Event* record(int device, Stream* stream);
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;

  // Makes `stream` wait for the event without blocking the host.
  void stream_wait(Stream* stream) const;
  // Blocks the calling thread until the event completed (CPU consumers and
  // wait_to_read only); work that failed on the stream surfaces here as a
  // weft::DeviceError.
  void host_wait() const;
  // Whether the work before the recording has completed, without waiting
  // (for threads that poll many events, such as parallel/'s communication
  // thread); work that failed surfaces here as a weft::DeviceError.
  bool done() const;
  Stream* stream() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

 private:
  Event(NativeEvent* event, Stream* stream, int device) : event_(event), stream_(stream), device_(device) {}
  ~Event();
  std::atomic<int> refs_{1};
  NativeEvent* event_;
  Stream* stream_;
  int device_;
};

// Owning pointer to an Event.
class EventRef {
 public:
  EventRef() = default;
  explicit EventRef(Event* e) noexcept : e_(e) {}  // adopts the reference
  EventRef(const EventRef& o) noexcept : e_(o.e_) {
    if (e_) e_->retain();
  }
  EventRef(EventRef&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  EventRef& operator=(EventRef o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~EventRef() {
    if (e_) e_->release();
  }
  Event* operator->() const noexcept { return e_; }
  explicit operator bool() const noexcept { return e_ != nullptr; }
  void reset() noexcept { EventRef().swap(*this); }
  void swap(EventRef& o) noexcept { std::swap(e_, o.e_); }

 private:
  Event* e_ = nullptr;
};

// ---- stream-ordered work (what a GPU op body may enqueue) -----------------
enum class CopyKind : unsigned char { host_to_device, device_to_host, device_to_device };
// Enqueued on `stream`; host memory must be pinned (cpu_pinned) for the copy
// to be asynchronous on CUDA. bytes == 0 enqueues nothing.
void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream* stream);
void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                       Stream* stream);
// Runs `fn` on a host thread once the work enqueued before it on `stream`
// has completed; work enqueued after it waits for it (cudaLaunchHostFunc).
// `fn` must make no GPU call (CUDA, or this header's), nor wait for another
// stream's work: CUDA runs the host functions of all streams on one thread
// of its runtime, in order, so one that blocks holds back every stream's. An
// exception it throws fails the stream's next recorded event (see
// Event::host_wait).
void launch_host_func(Stream* stream, UniqueFunction<void()> fn);
// launch_host_func for work that may run again: recorded into a stream graph
// (below), it runs at every launch. The CPU kernels of simulated GPUs.
void launch_host_kernel(Stream* stream, UniqueFunction<void()> fn);

// ---- stream graphs (CUDA Graphs) --------------------------------------------
// What one stream recorded between begin_stream_capture and
// end_stream_capture, launched again as a whole with one call: a CUDA Graph
// (cudaStreamBeginCapture, cudaGraphInstantiate) on CUDA, the recorded stream
// items on simulated GPUs. While a stream captures, work enqueued on it is
// recorded, not run, and only work that can run again may be enqueued:
// kernels, library calls, copies, launch_host_kernel. launch_host_func,
// event records and stream waits throw there (as CUDA refuses what is not
// capturable); the caller then ends the capture and drops it. A graph holds
// raw pointers and arguments as captured: launch it where the same memory
// holds the new data, on the stream it was captured on (library calls use
// that stream's workspace). Destroying a graph while launches are in flight
// is safe (they finish).
class StreamGraph {
 public:
  virtual ~StreamGraph() = default;
};
void begin_stream_capture(Stream* stream);
// The graph, or null when the capture failed (`*why` says why; the stream
// is no longer capturing either way).
std::unique_ptr<StreamGraph> end_stream_capture(Stream* stream, std::string* why);
void launch_stream_graph(StreamGraph& graph, Stream* stream);
// The backend's own handle: the cudaStream_t on CUDA, null when simulated.
void* native_handle(Stream* stream) noexcept;

// Makes `device` current on the calling thread.
void set_device(int device);
// Host wait for all work on the device (destructor paths).
void synchronize_device(int device);

// ---- host waits, counted by cause -------------------------------------------
// Every host wait on GPU work (an event, a stream, a device) is counted under
// the cause the calling thread declared. The engine declares `gpu_worker` on
// its GPU workers, which must never block on the GPU (their dependencies are
// stream waits): a nonzero count there is a bug.
enum class WaitCause : unsigned char { other, frontend, cpu_worker, gpu_worker, shutdown, count_ };
std::string_view to_string(WaitCause cause) noexcept;
struct HostWaits {
  std::uint64_t by_cause[static_cast<int>(WaitCause::count_)] = {};
  std::uint64_t of(WaitCause c) const noexcept { return by_cause[static_cast<int>(c)]; }
};
HostWaits host_waits() noexcept;  // since the process started
// Declares the cause of host waits on this thread for its lifetime (worker threads).
void declare_thread_wait_cause(WaitCause cause) noexcept;
// Declares the cause of host waits on this thread until destroyed.
class ScopedWaitCause {
 public:
  explicit ScopedWaitCause(WaitCause cause) noexcept;
  ~ScopedWaitCause();
  ScopedWaitCause(const ScopedWaitCause&) = delete;
  ScopedWaitCause& operator=(const ScopedWaitCause&) = delete;

 private:
  WaitCause saved_;
};

}  // namespace weft::gpu
