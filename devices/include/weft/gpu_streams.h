// The CUDA resources the engine builds its GPU workers on: one stream per
// worker (with its own cuBLAS and cuDNN handles for compute workers), and
// reference-counted events for stream-ordered completion. All of it compiles
// without CUDA; there, creating any of it throws (no GPU can exist).
#pragma once

#include <atomic>
#include <cstddef>
#include <string_view>

#include "weft/gpu.h"

namespace weft::gpu {

enum class StreamRole : unsigned char { compute, h2d, d2h, peer, priority };
std::string_view to_string(StreamRole role) noexcept;

// A worker's stream and handles. Created on any thread, used by one worker at
// a time (handles are not thread-bound, only not re-entrant).
class StreamResources {
 public:
  // Compute and priority streams get cuBLAS/cuDNN handles and a workspace;
  // the priority stream is created with the device's highest priority.
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

// A recorded CUDA event shared by every variable an op wrote or read.
class Event {
 public:
  // Records an event (recycled from a per-device pool) on `stream` of `device`.
  static Event* record(int device, CUstream_st* stream);
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;

  // Makes `stream` wait for the event without blocking the host.
  void stream_wait(CUstream_st* stream) const;
  // Blocks the calling thread until the event completed (CPU consumers and
  // wait_to_read only); a failed kernel surfaces here as a weft::Error.
  void host_wait() const;
  CUstream_st* stream() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

 private:
  Event(CUevent_st* event, CUstream_st* stream, int device) : event_(event), stream_(stream), device_(device) {}
  ~Event();
  std::atomic<int> refs_{1};
  CUevent_st* event_;
  CUstream_st* stream_;
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

// Makes `device` current on the calling thread.
void set_device(int device);
// Host wait for all work on the device (destructor paths).
void synchronize_device(int device);

}  // namespace weft::gpu
