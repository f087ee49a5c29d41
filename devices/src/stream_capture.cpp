// Stream capture, the same on every backend (backend.h, "Stream graphs"):
// what the capturing thread may not do while its stream captures, and what
// other threads' operations on that stream stand for meanwhile.
//
// CUDA attaches a capture to the stream, not to the thread: an event another
// thread records on a capturing stream (the allocator freeing a block the
// stream used) would join the capture and never be recorded, and a
// synchronization would invalidate it. So while any stream captures, other
// threads' operations on streams go through a mutex; on a capturing stream,
// an event recorded stands for the stream's work up to the capture's start
// (everything really enqueued on it): just before the capture begins, a
// start event is recorded on the stream and the device's helper stream is
// made to wait for it; foreign records go on the helper stream. Nothing
// touches the capturing stream, nor an event last recorded on it (CUDA
// refuses both while the stream captures).
//
// The fast path (no capture anywhere) is two atomic counters: an operation
// raises `touching` and reads `active`; begin_capture raises `active` and
// waits until `touching` is zero before it starts capturing. Both in
// sequentially consistent order, one of them sees the other (Dekker): an
// operation either completes before the capture starts or takes the mutex.
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend.h"
#include "weft/check_context.h"
#include "weft/error.h"

namespace weft::gpu::detail {

namespace {
thread_local Stream* tls_capturing = nullptr;
}  // namespace

struct BackendImpl::Captures {
  std::atomic<int> active{0};    // streams capturing now
  std::atomic<int> touching{0};  // operations on the fast path now
  std::mutex mutex;              // guards what follows
  struct Capture {
    Stream* stream;
    NativeEvent* start;  // recorded on the stream just before the capture began
    Stream* helper;      // the device's helper stream, ordered after `start`
    NativeEvent* mark;   // recorded on `helper` after its wait for `start`
  };
  std::vector<Capture> capturing;
  std::vector<std::pair<int, Stream*>> helpers;  // per device, made at first need; kept

  const Capture* find(Stream* s) const noexcept {
    for (const Capture& c : capturing)
      if (c.stream == s) return &c;
    return nullptr;
  }
};

BackendImpl::BackendImpl() : captures_(std::make_unique<Captures>()) {}
BackendImpl::~BackendImpl() = default;

Stream* BackendImpl::capturing_stream() noexcept { return tls_capturing; }

void BackendImpl::refuse_while_capturing(Stream* stream, const char* call) {
  if (tls_capturing == nullptr || (stream != nullptr && stream != tls_capturing)) return;
  throw InvalidArgument(std::string(call) + " while this thread captures its stream into a graph: a graph holds " +
                        "only work that can run again, without waiting" + weft::detail::current_op_suffix());
}

namespace {
// Leaves the fast path (also when the operation throws).
struct Touch {
  std::atomic<int>& touching;
  ~Touch() { touching.fetch_sub(1); }
};
}  // namespace

template <class Plain, class Captured>
void BackendImpl::on_stream(Stream* stream, Plain&& plain, Captured&& captured) {
  Captures& c = *captures_;
  c.touching.fetch_add(1);
  {
    Touch touch{c.touching};
    if (c.active.load() == 0) {
      plain();
      return;
    }
  }
  std::lock_guard lock(c.mutex);
  if (const Captures::Capture* capture = c.find(stream)) {
    captured(*capture);
  } else {
    plain();
  }
}

void BackendImpl::record_event(NativeEvent* event, Stream* stream) {
  refuse_while_capturing(stream, "recording an event on the stream");
  // Another thread captures the stream: the event marks the stream's work
  // up to the capture's start, on the helper stream ordered after it.
  on_stream(
      stream, [&] { do_record_event(event, stream); },
      [&](const Captures::Capture& capture) { do_record_event(event, capture.helper); });
}

void BackendImpl::stream_wait_event(Stream* stream, NativeEvent* event) {
  refuse_while_capturing(stream, "a stream wait on the stream");
  on_stream(
      stream, [&] { do_stream_wait_event(stream, event); },
      [](const Captures::Capture&) {
        throw InvalidArgument("a stream wait on a stream another thread captures into a graph" +
                              weft::detail::current_op_suffix());
      });
}

void BackendImpl::event_synchronize(NativeEvent* event) {
  refuse_while_capturing(nullptr, "a host wait for an event");
  count_host_wait();
  do_event_synchronize(event);
}

void BackendImpl::stream_synchronize(Stream* stream) {
  refuse_while_capturing(nullptr, "a host wait for a stream");
  count_host_wait();
  // Captured: under the mutex, the capture's mark lives until the capture
  // ends, which waits for this (the work before its start needs nothing of
  // the capture).
  on_stream(
      stream, [&] { do_stream_synchronize(stream); },
      [&](const Captures::Capture& capture) { do_event_synchronize(capture.mark); });
}

void BackendImpl::device_synchronize(int device) {
  refuse_while_capturing(nullptr, "a host wait for the device");
  count_host_wait();
  do_device_synchronize(device);
}

void BackendImpl::begin_capture(Stream* stream) {
  if (tls_capturing != nullptr)
    throw InvalidArgument("begin_stream_capture: this thread already captures a stream" +
                          weft::detail::current_op_suffix());
  Captures& c = *captures_;
  const int device = stream_device(stream);
  NativeEvent* start = create_event(device, /*timing=*/false);
  NativeEvent* mark = nullptr;
  try {
    mark = create_event(device, /*timing=*/false);
    record_event(start, stream);  // not capturing yet: an ordinary record
    std::lock_guard lock(c.mutex);
    if (c.find(stream) != nullptr)
      throw InvalidArgument("begin_stream_capture: another thread captures this stream" +
                            weft::detail::current_op_suffix());
    Stream* helper = nullptr;
    for (const auto& [d, s] : c.helpers)
      if (d == device) helper = s;
    if (helper == nullptr) {
      helper = create_stream(device, /*highest_priority=*/false);
      c.helpers.emplace_back(device, helper);
    }
    do_stream_wait_event(helper, start);
    do_record_event(mark, helper);
    c.capturing.push_back({stream, start, helper, mark});
    c.active.fetch_add(1);
    while (c.touching.load() != 0) std::this_thread::yield();  // operations that saw no capture finish first
    try {
      do_begin_capture(stream);
    } catch (...) {
      c.capturing.pop_back();
      c.active.fetch_sub(1);
      throw;
    }
  } catch (...) {
    destroy_event(start);
    if (mark) destroy_event(mark);
    throw;
  }
  tls_capturing = stream;
}

std::unique_ptr<StreamGraph> BackendImpl::end_capture(Stream* stream, std::string* why) {
  if (tls_capturing != stream) {
    if (why) *why = "end_stream_capture: this thread does not capture that stream";
    return nullptr;
  }
  Captures& c = *captures_;
  std::unique_ptr<StreamGraph> graph;
  NativeEvent* start = nullptr;
  NativeEvent* mark = nullptr;
  {
    std::lock_guard lock(c.mutex);
    try {
      graph = do_end_capture(stream, why);
    } catch (const std::exception& e) {
      if (why) *why = e.what();
    }
    for (auto it = c.capturing.begin(); it != c.capturing.end(); ++it)
      if (it->stream == stream) {
        start = it->start;
        mark = it->mark;
        c.capturing.erase(it);
        break;
      }
    c.active.fetch_sub(1);
  }
  tls_capturing = nullptr;
  if (start) destroy_event(start);
  if (mark) destroy_event(mark);
  return graph;
}

}  // namespace weft::gpu::detail
