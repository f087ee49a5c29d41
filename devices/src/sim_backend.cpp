// Simulated GPUs: the GPU backend interface (backend.h) on host threads, so
// that every GPU path of Weft — the engine's GPU worker pools,
// stream-ordered completion, cross-stream waits, copy engines, the
// stream-aware allocator, multi-GPU placement — runs on any machine.
// docs/design/simulated-gpus.md says what it models and what it does not.
//
// Model:
//   * A stream is a FIFO run by its own host thread, asynchronously to the
//     host: launch_host_func, memcpy_async, record_event and
//     stream_wait_event enqueue an item and return at once.
//   * An event's recording is an item: it completes when its stream reaches
//     it. A stream wait is an item that blocks only its stream until the
//     recording it captured (the latest one at the time of the call)
//     completed; a host wait blocks the calling thread the same way.
//   * Device memory is host memory owned by the simulated device, with a
//     capacity (WEFT_SIM_GPU_MEMORY, default 4 GiB per GPU): allocation past
//     it fails, as cudaMalloc does. Copies check that their pointers are
//     memory of the devices the copy kind names.
//   * Copy engines: per GPU one for host->device, one for device->host and
//     one for incoming peer copies. A copy holds its engine (copies in one
//     direction run one at a time, in arrival order, as on real hardware)
//     for latency + bytes / bandwidth — PCIe-like for host copies
//     (WEFT_SIM_PCIE_GBPS, default 25 GB/s), NVLink-like for peer copies
//     (WEFT_SIM_NVLINK_GBPS, default 150 GB/s) — or for the memcpy itself
//     when that is slower; the rest of the time it sleeps, holding no core.
//   * Kernels are host functions (ops/src/launch.h runs the CPU kernels
//     there): they take their CPU time.
//   * Modeled mode (weft/gpu_sim.h, sim_model.h): virtual time. Kernels
//     take the time the cost model gives them and copies the time of the
//     links they cross (each link direction a calendar of held intervals),
//     on modeled clocks; no thread sleeps. A device or peer copy enqueued
//     under gpu::ScopedUndefinedBytes takes that time and moves nothing
//     (its bytes are undefined). Each stream keeps a modeled clock: an item
//     starts when the previous one ended or when the host issued it,
//     whichever is later; the host issues at its modeled time (the
//     frontend's last wait, or the pushing op's) plus launch_us per launch
//     on the stream. Event recordings carry the stream's time, stream waits
//     pass it on, and host waits move the host's modeled clock.
//   * Jitter (WEFT_SIM_JITTER=<seed>): before each item a stream sleeps a
//     random 0-WEFT_SIM_JITTER_US microseconds (default 200) with
//     probability 1/2, from a generator seeded by (seed, device, stream), so
//     streams overtake one another in ways a fast GPU rarely shows and a
//     missing dependency becomes a wrong result.
//   * Errors: an exception from a host function (or a stream wait on a failed
//     recording) is held by the stream and carried by the next event
//     recorded on it; a host wait on that event rethrows it. Later work on
//     the stream runs normally.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "backend.h"
#include "sim_model.h"
#include "weft/check_context.h"
#include "weft/env.h"
#include "weft/error.h"

namespace weft::gpu {

// The opaque handles of weft/gpu.h are these objects.
struct Stream {};
struct NativeEvent {};

namespace detail {

namespace {

using Clock = std::chrono::steady_clock;
// How long a copy engine may have been idle and still count the next copy as
// back to back (CopyEngine::busy_until).
constexpr Clock::duration kBackToBack = std::chrono::microseconds(200);

struct SimConfig {
  int gpus = 2;
  std::size_t memory = std::size_t{4} << 30;
  double pcie_gbps = 25, nvlink_gbps = 150, device_gbps = 2000;
  double copy_latency_us = 5;
  bool jitter = false;
  std::uint64_t seed = 0;
  int jitter_us = 200;
};

std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether the modeled mode is on (set_sim_model).
std::atomic<bool> g_sim_modeled{false};
// Modeled mode: the host's modeled clock (ns on the steady clock's
// timeline), moved by the frontend's waits; and the issue time of the op
// this thread runs (gpu::ScopedModeledIssue; -1: none).
std::atomic<std::int64_t> g_host_ns{0};
thread_local std::int64_t tls_issue_ns = -1;

std::int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
Clock::time_point from_ns(std::int64_t ns) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}
void raise_to(std::atomic<std::int64_t>& clock, std::int64_t ns) {
  std::int64_t now = clock.load(std::memory_order_relaxed);
  while (now < ns && !clock.compare_exchange_weak(now, ns, std::memory_order_acq_rel)) {
  }
}
// When work this thread enqueues now is issued in the model.
std::int64_t issue_ns() { return tls_issue_ns >= 0 ? tls_issue_ns : g_host_ns.load(std::memory_order_acquire); }
// A host wait for modeled work that ended at `t`: the waiting host goes on
// from there (an op's issue time, else the frontend's clock; waits of other
// causes — the allocator's, a shutdown's — leave the model alone).
void host_waited(Clock::time_point t) {
  const std::int64_t ns = to_ns(t);
  if (tls_issue_ns >= 0) {
    tls_issue_ns = std::max(tls_issue_ns, ns);
    return;
  }
  const WaitCause cause = thread_wait_cause();
  if (cause == WaitCause::frontend || cause == WaitCause::cpu_worker) raise_to(g_host_ns, ns);
}
// gpu::ScopedUndefinedBytes: this thread's copies move undefined bytes.
thread_local bool tls_undefined_bytes = false;

// One recording of an event: complete once its stream reached it.
struct Recording {
  std::atomic<bool> done{false};
  // When the stream reached it (written before done): the host's clock, or
  // in the modeled mode the stream's modeled clock.
  Clock::time_point at{};
  std::exception_ptr error;     // what failed on the stream before it (written before done)
  void complete(std::exception_ptr failure, Clock::time_point when = Clock::now()) {
    at = when;
    error = std::move(failure);
    done.store(true, std::memory_order_release);
    done.notify_all();
  }
  void wait() const {
    while (!done.load(std::memory_order_acquire)) done.wait(false, std::memory_order_acquire);
  }
};

struct SimEvent final : NativeEvent {
  SimEvent(int d, bool t) : device(d), timing(t) {}
  const int device;
  const bool timing;
  std::mutex mutex;
  std::shared_ptr<Recording> latest;  // null: never recorded (complete)
  std::shared_ptr<Recording> current() {
    std::lock_guard lock(mutex);
    return latest;
  }
};

// A copy engine: copies that need it run one at a time, in arrival order.
class CopyEngine {
 public:
  // The modeled end of the last copy (read and written while acquired).
  Clock::time_point busy_until{};

  void acquire() {
    std::unique_lock lock(mutex_);
    const std::uint64_t ticket = next_++;
    cv_.wait(lock, [&] { return serving_ == ticket; });
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      ++serving_;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t next_ = 0, serving_ = 0;
};

class SimBackend;

struct SimStream final : Stream {
  using Item = UniqueFunction<void(SimStream&), 96>;

  SimStream(SimBackend& r, int d, int i, bool high, const SimConfig& config)
      : sim(r), device(d), index(i), high_priority(high), jitter(config.jitter), jitter_us(config.jitter_us) {
    rng = config.seed ^ (static_cast<std::uint64_t>(d) << 32) ^ static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    thread = std::thread([this] { run(); });
  }
  ~SimStream() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    work_cv.notify_all();
    thread.join();
  }

  // `one_shot`: the call that enqueues an item that cannot run again (an
  // event's recording, a wait, a host function), refused while capturing.
  // `launch`: in the modeled mode, the host's time to issue it.
  void enqueue(Item item, const char* one_shot = nullptr, Clock::duration launch = Clock::duration::zero()) {
    // Set and cleared by the capturing thread; other threads never enqueue
    // on a capturing stream (BackendImpl::record_event, stream_capture.cpp).
    if (capture) {
      if (one_shot)
        throw InvalidArgument(std::string("sim: ") + one_shot +
                              " while its stream is captured into a graph: only work that can run again may be "
                              "recorded" + weft::detail::current_op_suffix());
      capture->push_back(std::move(item));
      return;
    }
    {
      std::lock_guard lock(mutex);
      Clock::time_point at;
      if (g_sim_modeled.load(std::memory_order_relaxed)) {
        at = std::max(issue_cursor, from_ns(issue_ns()));
        issue_cursor = at + launch;
      } else {
        at = Clock::now();
      }
      queue.push_back(Queued{std::move(item), at});
      ++enqueued;
    }
    work_cv.notify_one();
  }

  // Modeled mode, on the stream thread: when the current item may start in
  // the model (the previous item's modeled end, or its issue).
  Clock::time_point ready() const { return std::max(model_clock, item_enqueued); }
  // Runs a modeled duration: the item ends `d` after it may start.
  void run_modeled(Clock::duration d) { model_clock = ready() + d; }

  // Host wait for everything enqueued so far, leaving any error for the
  // next event (what freeing memory waits for). Not from this stream's own
  // thread, whose earlier items are done anyway.
  void drain() {
    if (tls_stream == this) return;
    std::unique_lock lock(mutex);
    const std::uint64_t target = enqueued;
    done_cv.wait(lock, [&] { return finished >= target; });
  }

  // Host wait for everything enqueued so far; rethrows an error no event took.
  void synchronize() {
    std::unique_lock lock(mutex);
    const std::uint64_t target = enqueued;
    done_cv.wait(lock, [&] { return finished >= target; });
    if (g_sim_modeled.load(std::memory_order_relaxed)) host_waited(finished_clock);
    if (pending_error) std::rethrow_exception(std::exchange(pending_error, nullptr));
  }

  // On the stream thread: the error the next recorded event carries.
  std::exception_ptr take_error() {
    std::lock_guard lock(mutex);
    return std::exchange(pending_error, nullptr);
  }
  void hold_error(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    if (!pending_error) pending_error = std::move(e);
  }

  // Jitter for copies: extra modeled time (stream thread only).
  Clock::duration jitter_delay() {
    if (!jitter || (splitmix(rng) & 1u) == 0) return Clock::duration::zero();
    return std::chrono::microseconds(static_cast<std::int64_t>(splitmix(rng) % static_cast<std::uint64_t>(jitter_us)));
  }

  SimBackend& sim;  // the backend this stream belongs to
  const int device, index;
  const bool high_priority;
  const bool jitter;
  const int jitter_us;
  std::uint64_t rng;

  // Modeled mode (stream thread only): the modeled end of the last modeled
  // item, and when the running item was issued.
  Clock::time_point model_clock{}, item_enqueued{};

  struct Queued {
    Item item;
    Clock::time_point at;  // when it was enqueued
  };
  std::mutex mutex;
  std::condition_variable work_cv, done_cv;
  std::deque<Queued> queue;
  // While captured (gpu::begin_stream_capture): what enqueue records instead.
  std::unique_ptr<std::vector<Item>> capture;
  std::uint64_t enqueued = 0, finished = 0;
  Clock::time_point issue_cursor{};   // modeled mode: when the host may issue the next item
  Clock::time_point finished_clock{};  // modeled mode: model_clock when `finished` last grew
  bool stopping = false;
  std::exception_ptr pending_error;
  std::thread thread;
  static thread_local const SimStream* tls_stream;  // the stream whose thread this is, if any

 private:
  void run() {
#ifdef __linux__
    // Modeled copy times are slept: wake within a microsecond of the
    // deadline, not the default 50 us timer slack.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
    tls_stream = this;
    std::unique_lock lock(mutex);
    while (true) {
      work_cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping, and drained
      Item item = std::move(queue.front().item);
      item_enqueued = queue.front().at;
      queue.pop_front();
      lock.unlock();
      const Clock::duration delay = jitter_delay();
      if (delay != Clock::duration::zero()) std::this_thread::sleep_for(delay);
      try {
        item(*this);
      } catch (...) {
        hold_error(std::current_exception());
      }
      item = nullptr;  // captures die before the item counts as finished
      lock.lock();
      ++finished;
      finished_clock = model_clock;
      done_cv.notify_all();
    }
  }
};

thread_local const SimStream* SimStream::tls_stream = nullptr;

struct SimDevice {
  std::size_t capacity = 0;
  std::mutex mutex;  // guards what follows
  std::size_t used = 0;
  std::map<std::uintptr_t, std::size_t> blocks;  // start -> bytes
  std::vector<SimStream*> streams;
  int next_stream = 0;
  CopyEngine h2d, d2h, peer_in;
};

thread_local int tls_current_device = 0;

class SimBackend final : public BackendImpl {
 public:
  explicit SimBackend(SimConfig config) : config_(config), devices_(static_cast<std::size_t>(config.gpus)) {
    for (SimDevice& d : devices_) d.capacity = config_.memory;
  }

  Backend kind() const noexcept override { return Backend::sim; }
  int device_count() const noexcept override { return config_.gpus; }

  DeviceProperties properties(int device) override {
    return DeviceProperties{"Weft simulated GPU", dev(device).capacity, 0, 0, true};
  }

  std::string describe(int device) override {
    char text[256];
    std::snprintf(text, sizeof text,
                  "simulated GPU (Weft sim backend), %s, copies %.0f GB/s host<->device and %.0f GB/s peer, %s",
                  human_bytes(dev(device).capacity).c_str(), config_.pcie_gbps, config_.nvlink_gbps,
                  config_.jitter ? ("jitter seed " + std::to_string(config_.seed)).c_str() : "no jitter");
    std::string out = text;
    if (std::shared_ptr<SimModel> m = model()) {
      std::snprintf(text, sizeof text, "; kernels modeled by %s (%s), %d GPU(s) and %d NIC(s) per node",
                    m->options.model.c_str(), m->table ? ("cost table, fallback " + m->profile.name).c_str()
                                                       : ("profile " + m->profile.name).c_str(),
                    m->per_node, m->profile.nics_per_node);
      out += text;
    }
    return out;
  }

  void set_device(int device) override {
    (void)dev(device);
    tls_current_device = device;
  }

  MemInfo mem_info(int device) override {
    SimDevice& d = dev(device);
    std::lock_guard lock(d.mutex);
    return MemInfo{d.capacity - d.used, d.capacity};
  }

  Stream* create_stream(int device, bool highest_priority) override {
    SimDevice& d = dev(device);
    int index;
    {
      std::lock_guard lock(d.mutex);
      index = d.next_stream++;
    }
    auto* s = new SimStream(*this, device, index, highest_priority, config_);
    std::lock_guard lock(d.mutex);
    d.streams.push_back(s);
    return s;
  }

  void destroy_stream(Stream* stream) noexcept override {
    if (!stream) return;
    auto* s = static_cast<SimStream*>(stream);
    {
      std::unique_lock life(streams_life_);  // not while a free drains the streams
      SimDevice& d = devices_[static_cast<std::size_t>(s->device)];
      std::lock_guard lock(d.mutex);
      d.streams.erase(std::remove(d.streams.begin(), d.streams.end(), s), d.streams.end());
    }
    delete s;  // runs what is left, then joins its thread
  }

  int stream_device(Stream* stream) override { return sim(stream).device; }
  void* native_handle(Stream*) noexcept override { return nullptr; }
  void create_handles(WorkerHandles&, std::size_t) override {}  // kernels run on the host: no library handles
  void destroy_handles(WorkerHandles&) noexcept override {}

  NativeEvent* create_event(int device, bool timing) override {
    (void)dev(device);
    return new SimEvent(device, timing);
  }
  void destroy_event(NativeEvent* event) noexcept override { delete static_cast<SimEvent*>(event); }

  void do_record_event(NativeEvent* event, Stream* stream) override {
    SimEvent& e = ev(event);
    SimStream& s = sim(stream);
    if (e.device != s.device)
      throw InvalidArgument("sim: an event of gpu(" + std::to_string(e.device) + ") recorded on a stream of gpu(" +
                            std::to_string(s.device) + ") (events are recorded on their own device's streams)" +
                            weft::detail::current_op_suffix());
    auto rec = std::make_shared<Recording>();
    {
      std::lock_guard lock(e.mutex);
      e.latest = rec;
    }
    if (g_sim_modeled.load(std::memory_order_relaxed)) {
      s.enqueue(
          [rec](SimStream& self) {
            self.model_clock = self.ready();
            rec->complete(self.take_error(), self.model_clock);
          },
          "gpu event record");
      return;
    }
    s.enqueue([rec](SimStream& self) { rec->complete(self.take_error()); }, "gpu event record");
  }

  void do_stream_wait_event(Stream* stream, NativeEvent* event) override {
    std::shared_ptr<Recording> rec = ev(event).current();
    if (!rec) return;  // never recorded: nothing to wait for
    sim(stream).enqueue(
        [rec = std::move(rec), modeled = g_sim_modeled.load(std::memory_order_relaxed)](SimStream& self) {
          rec->wait();
          if (rec->error) self.hold_error(rec->error);  // what it waited for failed: so does what follows
          if (modeled) self.model_clock = std::max(self.ready(), rec->at);
        },
        "gpu stream wait");
  }

  // As cudaEventQuery: work that failed before the event surfaces here.
  bool event_done(NativeEvent* event) override {
    std::shared_ptr<Recording> rec = ev(event).current();
    if (!rec) return true;
    if (!rec->done.load(std::memory_order_acquire)) return false;
    if (rec->error) std::rethrow_exception(rec->error);
    return true;
  }

  float elapsed_ms(NativeEvent* start, NativeEvent* end) override {
    SimEvent &a = ev(start), &b = ev(end);
    if (!a.timing || !b.timing) throw InvalidArgument("sim: elapsed time between events created without timing");
    std::shared_ptr<Recording> ra = a.current(), rb = b.current();
    if (!ra || !rb || !ra->done.load(std::memory_order_acquire) || !rb->done.load(std::memory_order_acquire))
      throw DeviceError("sim: elapsed time of an event not yet recorded or not yet complete");
    return std::chrono::duration<float, std::milli>(rb->at - ra->at).count();
  }

  double event_modeled_time(NativeEvent* event) override {
    if (!g_sim_modeled.load(std::memory_order_relaxed)) return -1;
    std::shared_ptr<Recording> rec = ev(event).current();
    if (!rec || !rec->done.load(std::memory_order_acquire)) return -1;
    return 1e-9 * static_cast<double>(to_ns(rec->at));
  }

  void launch_host_func(Stream* stream, UniqueFunction<void()> fn) override {
    sim(stream).enqueue([fn = std::move(fn)](SimStream&) mutable { fn(); }, "gpu::launch_host_func (a host function that runs once)");
  }
  void launch_host_kernel(Stream* stream, UniqueFunction<void()> fn) override {
    sim(stream).enqueue([fn = std::move(fn)](SimStream&) mutable { fn(); });
  }

  // A graph is the captured items, run in order as one item at each launch
  // (an item that throws fails the stream's next event, as when enqueued).
  struct SimStreamGraph final : StreamGraph {
    std::shared_ptr<std::vector<SimStream::Item>> items;
  };
  void do_begin_capture(Stream* stream) override {
    SimStream& s = sim(stream);
    if (s.capture)
      throw InvalidArgument("sim: begin_stream_capture on a stream already capturing" +
                            weft::detail::current_op_suffix());
    s.capture = std::make_unique<std::vector<SimStream::Item>>();
  }
  std::unique_ptr<StreamGraph> do_end_capture(Stream* stream, std::string* why) override {
    SimStream& s = sim(stream);
    if (!s.capture) {
      if (why) *why = "sim: end_stream_capture on a stream that is not capturing";
      return nullptr;
    }
    std::unique_ptr<std::vector<SimStream::Item>> items = std::move(s.capture);  // capturing no more, whatever follows
    auto g = std::make_unique<SimStreamGraph>();
    g->items = std::shared_ptr<std::vector<SimStream::Item>>(std::move(items));
    return g;
  }
  void launch_graph(StreamGraph& graph, Stream* stream) override {
    sim(stream).enqueue([items = static_cast<SimStreamGraph&>(graph).items](SimStream& self) {
      for (SimStream::Item& item : *items) {
        try {
          item(self);
        } catch (...) {
          self.hold_error(std::current_exception());
        }
      }
    });
  }

  void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream* stream) override {
    SimStream& s = sim(stream);
    if (std::shared_ptr<SimModel> m = modeled()) {
      switch (kind) {
        case CopyKind::host_to_device:
          require_device_memory(dst, bytes, s.device, "host_to_device", "destination");
          require_host_memory(src, bytes, "host_to_device", "source");
          enqueue_linked_copy(s, dst, src, bytes, std::move(m), LinkPath::h2d, s.device, s.device);
          break;
        case CopyKind::device_to_host:
          require_device_memory(src, bytes, s.device, "device_to_host", "source");
          require_host_memory(dst, bytes, "device_to_host", "destination");
          enqueue_linked_copy(s, dst, src, bytes, std::move(m), LinkPath::d2h, s.device, s.device);
          break;
        case CopyKind::device_to_device:
          require_device_memory(src, bytes, s.device, "device_to_device", "source");
          require_device_memory(dst, bytes, s.device, "device_to_device", "destination");
          enqueue_linked_copy(s, dst, src, bytes, std::move(m), LinkPath::local, s.device, s.device,
                              tls_undefined_bytes);
          break;
      }
      return;
    }
    switch (kind) {
      case CopyKind::host_to_device:
        require_device_memory(dst, bytes, s.device, "host_to_device", "destination");
        require_host_memory(src, bytes, "host_to_device", "source");
        enqueue_copy(s, dst, src, bytes, &dev(s.device).h2d, config_.pcie_gbps);
        break;
      case CopyKind::device_to_host:
        require_device_memory(src, bytes, s.device, "device_to_host", "source");
        require_host_memory(dst, bytes, "device_to_host", "destination");
        enqueue_copy(s, dst, src, bytes, &dev(s.device).d2h, config_.pcie_gbps);
        break;
      case CopyKind::device_to_device:
        require_device_memory(src, bytes, s.device, "device_to_device", "source");
        require_device_memory(dst, bytes, s.device, "device_to_device", "destination");
        enqueue_copy(s, dst, src, bytes, nullptr, config_.device_gbps);
        break;
    }
  }

  void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                         Stream* stream) override {
    SimStream& s = sim(stream);
    require_device_memory(dst, bytes, dst_device, "peer", "destination");
    require_device_memory(src, bytes, src_device, "peer", "source");
    if (std::shared_ptr<SimModel> m = modeled()) {
      const LinkPath path = src_device == dst_device                       ? LinkPath::local
                            : m->node_of(src_device) == m->node_of(dst_device) ? LinkPath::nvlink
                                                                                : LinkPath::network;
      enqueue_linked_copy(s, dst, src, bytes, std::move(m), path, src_device, dst_device, tls_undefined_bytes);
      return;
    }
    enqueue_copy(s, dst, src, bytes, &dev(dst_device).peer_in,
                 src_device == dst_device ? config_.device_gbps : config_.nvlink_gbps);
  }

  void* device_malloc(int device, std::size_t bytes) noexcept override {
    if (device < 0 || device >= config_.gpus || bytes == 0) return nullptr;
    SimDevice& d = devices_[static_cast<std::size_t>(device)];
    const std::size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    {
      std::lock_guard lock(d.mutex);
      if (size > d.capacity - d.used) return nullptr;
      d.used += size;
    }
    void* p = std::aligned_alloc(kAlign, size);
    std::lock_guard lock(d.mutex);
    if (!p) {
      d.used -= size;
      return nullptr;
    }
    d.blocks.emplace(reinterpret_cast<std::uintptr_t>(p), size);
    return p;
  }

  void device_free(int device, void* ptr) noexcept override {
    if (!ptr || device < 0 || device >= config_.gpus) return;
    SimDevice& d = devices_[static_cast<std::size_t>(device)];
    {
      std::lock_guard lock(d.mutex);
      auto it = d.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
      if (it == d.blocks.end()) {
        std::fprintf(stderr, "weft: sim: gpu(%d) freed %p, which it never allocated\n", device, ptr);
        return;
      }
      d.used -= it->second;
      d.blocks.erase(it);
    }
    drain_all();
    std::free(ptr);
  }

  void* pinned_malloc(std::size_t bytes) noexcept override {
    return std::aligned_alloc(kAlign, (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign);
  }
  void pinned_free(void* ptr) noexcept override {
    drain_all();
    std::free(ptr);
  }

 protected:
  void do_event_synchronize(NativeEvent* event) override {
    std::shared_ptr<Recording> rec = ev(event).current();
    if (!rec) return;
    rec->wait();
    if (g_sim_modeled.load(std::memory_order_relaxed)) host_waited(rec->at);
    if (rec->error) std::rethrow_exception(rec->error);
  }
  void do_stream_synchronize(Stream* stream) override { sim(stream).synchronize(); }
  // cudaFree and cudaFreeHost synchronize before they free, and so must
  // this: work enqueued earlier on any stream may still use the memory (the
  // caching allocator hands a block back to the system when it drops its
  // cache — running out of memory, or at its end — and a cached block's
  // last use may still be queued on its stream). Freeing at once let a
  // stream write into freed heap memory.
  void drain_all() noexcept {
    std::shared_lock life(streams_life_);  // no stream is destroyed meanwhile
    for (SimDevice& d : devices_) {
      std::vector<SimStream*> streams;
      {
        std::lock_guard lock(d.mutex);
        streams = d.streams;
      }
      for (SimStream* s : streams) s->drain();
    }
  }

  void do_device_synchronize(int device) override {
    SimDevice& d = dev(device);
    std::vector<SimStream*> streams;
    {
      std::lock_guard lock(d.mutex);
      streams = d.streams;
    }
    // Streams are destroyed only by their owners, who do not race with a
    // device-wide synchronize of their own device.
    for (SimStream* s : streams) s->synchronize();
  }

 private:
  static constexpr std::size_t kAlign = 256;  // cudaMalloc's guarantee

  SimDevice& dev(int device) {
    if (device < 0 || device >= config_.gpus)
      throw InvalidArgument("gpu(" + std::to_string(device) + ") does not exist (" + std::to_string(config_.gpus) +
                            " simulated GPU(s))");
    return devices_[static_cast<std::size_t>(device)];
  }
  static SimStream& sim(Stream* s) {
    if (!s) throw InvalidArgument("sim: null stream" + weft::detail::current_op_suffix());
    return *static_cast<SimStream*>(s);
  }
  static SimEvent& ev(NativeEvent* e) {
    if (!e) throw InvalidArgument("sim: null event" + weft::detail::current_op_suffix());
    return *static_cast<SimEvent*>(e);
  }

  // Which simulated GPU owns [p, p + bytes), or -1.
  int owner(const void* p, std::size_t bytes) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (int i = 0; i < config_.gpus; ++i) {
      SimDevice& d = devices_[static_cast<std::size_t>(i)];
      std::lock_guard lock(d.mutex);
      auto it = d.blocks.upper_bound(a);
      if (it == d.blocks.begin()) continue;
      --it;
      if (a >= it->first && a < it->first + it->second) {
        if (a + bytes > it->first + it->second)
          throw InvalidArgument("sim: copy of " + std::to_string(bytes) + " bytes runs past the end of a block of gpu(" +
                                std::to_string(i) + ")" + weft::detail::current_op_suffix());
        return i;
      }
    }
    return -1;
  }
  void require_device_memory(const void* p, std::size_t bytes, int device, const char* kind, const char* which) {
    const int o = owner(p, bytes);
    if (o != device)
      throw InvalidArgument(std::string("sim: memcpy ") + kind + ": the " + which + " is not memory of gpu(" +
                            std::to_string(device) + ")" +
                            (o >= 0 ? " (it belongs to gpu(" + std::to_string(o) + "))" : std::string(" (host memory)")) +
                            weft::detail::current_op_suffix());
  }
  void require_host_memory(const void* p, std::size_t bytes, const char* kind, const char* which) {
    const int o = owner(p, bytes);
    if (o >= 0)
      throw InvalidArgument(std::string("sim: memcpy ") + kind + ": the " + which + " is memory of gpu(" +
                            std::to_string(o) + "), not host memory" + weft::detail::current_op_suffix());
  }

  void enqueue_copy(SimStream& s, void* dst, const void* src, std::size_t bytes, CopyEngine* engine, double gbps) {
    const auto modeled = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::micro>(config_.copy_latency_us + static_cast<double>(bytes) / (gbps * 1e3)));
    s.enqueue([=](SimStream& self) {
      if (engine) engine->acquire();
      const Clock::time_point now = Clock::now();
      // Back-to-back copies follow one another on the engine's modeled
      // clock: a copy starts where the previous one ended in the model, even
      // when the host woke the stream late, so that timer and scheduling
      // latency (tens of microseconds per sleep) do not add up over a
      // stream of small copies. An engine idle for longer than kBackToBack
      // starts now.
      Clock::time_point start = now;
      if (engine && engine->busy_until + kBackToBack > now) start = std::min(now, engine->busy_until);
      const Clock::time_point end = start + modeled + self.jitter_delay();
      std::memcpy(dst, src, bytes);  // the data moves, however short the model
      std::this_thread::sleep_until(end);
      if (engine) {
        engine->busy_until = end;
        engine->release();
      }
    });
  }

  // Modeled mode: which links a copy crosses.
  enum class LinkPath : unsigned char { h2d, d2h, local, nvlink, network };

  // A copy in the modeled mode: it starts when it is ready on its stream
  // (run_modeled's rule) and every link it crosses is free, holds those
  // links for bytes / bandwidth, and ends a latency later. Copies on one
  // link thus follow one another at its bandwidth, whichever streams they
  // come from; a copy within one GPU moves its bytes at memory bandwidth
  // (read and written) after a launch latency, on its stream alone.
  // `undefined`: the bytes are undefined (gpu::ScopedUndefinedBytes); the
  // copy takes its time and moves nothing.
  void enqueue_linked_copy(SimStream& s, void* dst, const void* src, std::size_t bytes, std::shared_ptr<SimModel> m,
                           LinkPath path, int from, int to, bool undefined = false) {
    const SimProfile& p = m->profile;
    SimLink *a = nullptr, *b = nullptr;
    double gbps = 0, latency_us = 0;
    const auto i = static_cast<std::size_t>(from), j = static_cast<std::size_t>(to);
    switch (path) {
      case LinkPath::h2d: a = &m->h2d[j], gbps = p.pcie_gbps, latency_us = p.pcie_latency_us; break;
      case LinkPath::d2h: a = &m->d2h[i], gbps = p.pcie_gbps, latency_us = p.pcie_latency_us; break;
      case LinkPath::local: gbps = p.memory_gbps / 2, latency_us = p.launch_us; break;
      case LinkPath::nvlink:
        a = &m->nvlink_out[i], b = &m->nvlink_in[j], gbps = p.nvlink_gbps, latency_us = p.nvlink_latency_us;
        break;
      case LinkPath::network:
        a = &m->nic_out[static_cast<std::size_t>(m->nic_of(from))];
        b = &m->nic_in[static_cast<std::size_t>(m->nic_of(to))];
        gbps = p.nic_gbps / p.fabric_oversubscription, latency_us = p.nic_latency_us;
        break;
    }
    const std::int64_t occupy = to_ns(from_ns(0) + SimModel::duration(static_cast<double>(bytes) / (gbps * 1e9)));
    const Clock::duration latency = SimModel::duration(latency_us * 1e-6);
    const Clock::duration launch = SimModel::duration(p.launch_us * 1e-6);
    s.enqueue(
        [=, m = std::move(m)](SimStream& self) {
          std::int64_t start = to_ns(self.ready());
          if (a) {
            std::unique_lock<std::mutex> la(a->mutex, std::defer_lock), lb;
            if (b) {
              lb = std::unique_lock<std::mutex>(b->mutex, std::defer_lock);
              std::lock(la, lb);
            } else {
              la.lock();
            }
            // The earliest interval free on both links.
            for (;;) {
              start = a->first_free(start, occupy);
              if (!b) break;
              const std::int64_t on_b = b->first_free(start, occupy);
              if (on_b == start) break;
              start = on_b;
            }
            a->hold(start, occupy);
            if (b) b->hold(start, occupy);
          }
          self.model_clock = from_ns(start + occupy) + latency;
          if (!undefined) std::memcpy(dst, src, bytes);
          std::lock_guard lock(m->stats_mutex);
          (undefined ? m->stats.bytes_skipped : m->stats.bytes_moved) += bytes;
        },
        nullptr, launch);
  }

 public:
  std::shared_ptr<SimModel> model() {
    std::lock_guard lock(model_mutex_);
    return model_;
  }
  // The model when the mode is on (cheap when it is off).
  std::shared_ptr<SimModel> modeled() {
    if (!g_sim_modeled.load(std::memory_order_relaxed)) return nullptr;
    return model();
  }
  void install_model(std::shared_ptr<SimModel> m) {
    std::lock_guard lock(model_mutex_);
    // The host's modeled clock goes on from the host's own time (and never back).
    if (m) raise_to(g_host_ns, to_ns(Clock::now()));
    g_sim_modeled.store(m != nullptr, std::memory_order_relaxed);
    model_ = std::move(m);
  }
  void launch_modeled(Stream* stream, const KernelCost& cost) {
    std::shared_ptr<SimModel> m = model();
    if (!m)
      throw InvalidArgument("sim: a modeled kernel (op '" + std::string(cost.op) +
                            "') while the sim model is off (WEFT_SIM_MODEL)" + weft::detail::current_op_suffix());
    SimStream& s = sim(stream);
    const std::int64_t d = to_ns(from_ns(0) + SimModel::duration(m->kernel_seconds(cost)));
    if (s.high_priority) {
      // A GPU's highest-priority stream (the collectives' reductions, as a
      // communication library's kernels on SMs of their own) runs beside the others.
      s.enqueue([d](SimStream& self) { self.run_modeled(from_ns(d) - from_ns(0)); }, nullptr,
                SimModel::duration(m->profile.launch_us * 1e-6));
      return;
    }
    // The GPU's SMs are one resource: kernels of its streams take turns on
    // them (the earliest free interval from the kernel's readiness).
    SimLink* sms = &m->compute[static_cast<std::size_t>(s.device)];
    s.enqueue(
        [d, sms, m](SimStream& self) {
          std::lock_guard lock(sms->mutex);
          const std::int64_t start = sms->first_free(to_ns(self.ready()), d);
          sms->hold(start, d);
          self.model_clock = from_ns(start + d);
        },
        nullptr, SimModel::duration(m->profile.launch_us * 1e-6));
  }

 private:
  std::mutex model_mutex_;
  std::shared_ptr<SimModel> model_;  // null: kernels compute

  const SimConfig config_;
  std::vector<SimDevice> devices_;
  std::shared_mutex streams_life_;  // drain_all (shared) vs destroy_stream (exclusive)
};

}  // namespace

std::unique_ptr<BackendImpl> make_sim_backend(int gpus) {
  SimConfig c;
  c.gpus = gpus;
  c.memory = env::bytes_or("WEFT_SIM_GPU_MEMORY", c.memory);
  c.pcie_gbps = env::real_or("WEFT_SIM_PCIE_GBPS", c.pcie_gbps, 0.001, 1e6);
  c.nvlink_gbps = env::real_or("WEFT_SIM_NVLINK_GBPS", c.nvlink_gbps, 0.001, 1e6);
  if (env::get("WEFT_SIM_JITTER")) {
    c.jitter = true;
    c.seed = static_cast<std::uint64_t>(env::number_or("WEFT_SIM_JITTER", 0, 0, (1LL << 62)));
    c.jitter_us = static_cast<int>(env::number_or("WEFT_SIM_JITTER_US", c.jitter_us, 1, 1000000));
  }
  const SimModelOptions model = sim_model_from_env();
  if (model.gpus_per_node > 0 && gpus > model.gpus_per_node && gpus % model.gpus_per_node != 0)
    throw InvalidArgument("weft: WEFT_SIM_GPUS_PER_NODE=" + std::to_string(model.gpus_per_node) +
                          " does not divide the " + std::to_string(gpus) +
                          " simulated GPUs (WEFT_SIM_GPUS): the last node would be partial");
  auto backend = std::make_unique<SimBackend>(c);
  if (!model.model.empty()) backend->install_model(make_sim_model(model, gpus));
  return backend;
}

namespace {
SimBackend& active_sim(const char* call) {
  BackendImpl& b = active_backend();
  if (b.kind() != Backend::sim)
    throw InvalidArgument(std::string("weft::gpu::") + call + ": the sim backend is not active (this process uses '" +
                          std::string(to_string(b.kind())) + "')");
  return static_cast<SimBackend&>(b);
}
}  // namespace

}  // namespace detail

SimModelOptions sim_model_from_env() {
  SimModelOptions o;
  o.model = env::text_or("WEFT_SIM_MODEL", "");
  o.gpus_per_node = static_cast<int>(env::number_or("WEFT_SIM_GPUS_PER_NODE", 0, 1, 4096));
  return o;
}

void set_sim_model(const SimModelOptions& options) {
  detail::SimBackend& b = detail::active_sim("set_sim_model");
  b.install_model(options.model.empty() ? nullptr : detail::make_sim_model(options, b.device_count()));
}

SimModelOptions sim_model() {
  if (backend() != Backend::sim) return {};
  std::shared_ptr<detail::SimModel> m = detail::active_sim("sim_model").model();
  return m ? m->options : SimModelOptions{};
}

bool kernels_modeled() noexcept { return detail::g_sim_modeled.load(std::memory_order_relaxed); }

ScopedUndefinedBytes::ScopedUndefinedBytes(bool undefined) noexcept
    : saved_(std::exchange(detail::tls_undefined_bytes, undefined)) {}
ScopedUndefinedBytes::~ScopedUndefinedBytes() { detail::tls_undefined_bytes = saved_; }

bool copies_move_undefined_bytes() noexcept { return detail::tls_undefined_bytes; }

double modeled_now() noexcept {
  if (!detail::g_sim_modeled.load(std::memory_order_relaxed)) return 0;
  return 1e-9 * static_cast<double>(detail::g_host_ns.load(std::memory_order_acquire));
}

double modeled_issue_time() noexcept {
  if (!detail::g_sim_modeled.load(std::memory_order_relaxed)) return -1;
  return 1e-9 * static_cast<double>(detail::issue_ns());
}

ScopedModeledIssue::ScopedModeledIssue(double seconds) noexcept
    : saved_(detail::tls_issue_ns) {
  detail::tls_issue_ns = seconds >= 0 ? static_cast<std::int64_t>(std::llround(seconds * 1e9)) : -1;
}
ScopedModeledIssue::~ScopedModeledIssue() { detail::tls_issue_ns = saved_; }

SimTopology sim_topology() {
  if (backend() != Backend::sim) return {};
  std::shared_ptr<detail::SimModel> m = detail::active_sim("sim_topology").model();
  if (!m) {
    // Kernels compute, but WEFT_SIM_GPUS_PER_NODE still lays the GPUs out
    // in nodes (of the dgx-h100 profile's links), so that collectives take
    // their multi-node forms on real values.
    const int per_node = static_cast<int>(env::number_or("WEFT_SIM_GPUS_PER_NODE", 0, 1, 4096));
    if (per_node == 0) return {};
    const detail::SimProfile p = *detail::builtin_profile("dgx-h100");
    return SimTopology{per_node, p.nics_per_node, p.nvlink_gbps, p.nic_gbps, p.nvlink_latency_us, p.nic_latency_us};
  }
  const detail::SimProfile& p = m->profile;
  return SimTopology{m->per_node, p.nics_per_node, p.nvlink_gbps, p.nic_gbps / p.fabric_oversubscription,
                     p.nvlink_latency_us, p.nic_latency_us};
}

void launch_modeled_kernel(Stream* stream, const KernelCost& cost) {
  detail::active_sim("launch_modeled_kernel").launch_modeled(stream, cost);
}

double modeled_kernel_seconds(const KernelCost& cost) {
  std::shared_ptr<detail::SimModel> m = detail::active_sim("modeled_kernel_seconds").model();
  if (!m) throw InvalidArgument("weft::gpu::modeled_kernel_seconds: the sim model is off (WEFT_SIM_MODEL)");
  return m->kernel_seconds(cost);
}

SimModelStats sim_model_stats() {
  if (backend() != Backend::sim) return {};
  std::shared_ptr<detail::SimModel> m = detail::active_sim("sim_model_stats").model();
  if (!m) return {};
  std::lock_guard lock(m->stats_mutex);
  return m->stats;
}

std::string sim_model_report() {
  if (backend() != Backend::sim) return "sim model off (the sim backend is not active)";
  std::shared_ptr<detail::SimModel> m = detail::active_sim("sim_model_report").model();
  if (!m) return "sim model off";
  const SimModelStats st = sim_model_stats();
  std::string out = m->options.model + ": " + std::to_string(st.kernels) + " kernel(s) modeled";
  if (m->table) {
    out += ", " + std::to_string(st.from_table) + " from the cost table " + m->table->file + ", " +
           std::to_string(st.fallbacks) + " fell back to the profile " + m->profile.name;
    std::string missing;
    for (const auto& [key, count] : st.missing)
      missing += (missing.empty() ? "" : "; ") + key + " x" + std::to_string(count);
    if (!missing.empty()) out += " (" + missing + ")";
  } else {
    out += " by the profile " + m->profile.name;
  }
  return out;
}

}  // namespace weft::gpu
