// The backend-neutral GPU API (weft/gpu.h, weft/gpu_streams.h) over the
// process's backend: which backend is active, streams with their handles,
// pooled completion events, stream-ordered copies and host functions, and
// the host-wait accounting.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "weft/env.h"
#include "weft/error.h"
#include "weft/gpu_streams.h"

namespace weft::gpu {

using detail::active_backend;

std::string_view to_string(Backend backend) noexcept {
  switch (backend) {
    case Backend::none: return "none";
    case Backend::cuda: return "cuda";
    case Backend::sim: return "sim";
  }
  return "?";
}

Backend parse_backend(std::string_view text) {
  if (text == "none") return Backend::none;
  if (text == "cuda") return Backend::cuda;
  if (text == "sim") return Backend::sim;
  throw InvalidArgument("weft: GPU backend '" + std::string(text) + "' is not one of: cuda, sim, none");
}

bool built_with_cuda() noexcept { return WEFT_HAVE_CUDA != 0; }

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

namespace detail {

std::string human_bytes(std::size_t bytes) {
  char buf[64];
  if (bytes >= (std::size_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  else if (bytes >= (std::size_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  return buf;
}

namespace {

// A backend with no GPU: zero devices, and anything that needs one says why.
class NoBackend final : public BackendImpl {
 public:
  explicit NoBackend(std::string why) : why_(std::move(why)) {}
  Backend kind() const noexcept override { return Backend::none; }
  int device_count() const noexcept override { return 0; }
  DeviceProperties properties(int device) override { fail("gpu(" + std::to_string(device) + ")"); }
  std::string describe(int device) override { fail("gpu(" + std::to_string(device) + ")"); }
  void set_device(int device) override { fail("gpu(" + std::to_string(device) + ")"); }
  MemInfo mem_info(int device) override { fail("gpu(" + std::to_string(device) + ")"); }
  Stream* create_stream(int, bool) override { fail("gpu stream"); }
  void destroy_stream(Stream*) noexcept override {}
  int stream_device(Stream*) override { fail("gpu stream"); }
  void* native_handle(Stream*) noexcept override { return nullptr; }
  void create_handles(WorkerHandles&, std::size_t) override { fail("gpu handles"); }
  void destroy_handles(WorkerHandles&) noexcept override {}
  NativeEvent* create_event(int, bool) override { fail("gpu event"); }
  void destroy_event(NativeEvent*) noexcept override {}
  void do_record_event(NativeEvent*, Stream*) override { fail("gpu event"); }
  void do_stream_wait_event(Stream*, NativeEvent*) override { fail("gpu event"); }
  bool event_done(NativeEvent*) override { return true; }
  float elapsed_ms(NativeEvent*, NativeEvent*) override { fail("gpu timing"); }
  void launch_host_func(Stream*, UniqueFunction<void()>) override { fail("gpu host function"); }
  void launch_host_kernel(Stream*, UniqueFunction<void()>) override { fail("gpu host function"); }
  void do_begin_capture(Stream*) override { fail("gpu stream capture"); }
  std::unique_ptr<StreamGraph> do_end_capture(Stream*, std::string*) override { fail("gpu stream capture"); }
  void launch_graph(StreamGraph&, Stream*) override { fail("gpu stream graph"); }
  void memcpy_async(void*, const void*, std::size_t, CopyKind, Stream*) override { fail("GPU copy"); }
  void memcpy_peer_async(void*, int, const void*, int, std::size_t, Stream*) override { fail("GPU copy"); }
  void* device_malloc(int, std::size_t) noexcept override { return nullptr; }
  void device_free(int, void*) noexcept override {}
  void* pinned_malloc(std::size_t) noexcept override { return nullptr; }
  void pinned_free(void*) noexcept override {}

 protected:
  void do_event_synchronize(NativeEvent*) override {}
  void do_stream_synchronize(Stream*) override {}
  void do_device_synchronize(int device) override { fail("gpu(" + std::to_string(device) + ")"); }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(what + ": no GPU backend is active (" + why_ + ")");
  }
  std::string why_;
};

struct Selection {
  std::mutex mutex;
  std::atomic<BackendImpl*> active{nullptr};
  std::unique_ptr<BackendImpl> owned;  // never destroyed: streams and memory may outlive static destruction
  bool explicit_choice = false;
};

Selection& selection() {
  static Selection* s = new Selection;
  return *s;
}

std::unique_ptr<BackendImpl> make_backend(Backend backend, int sim_gpus, bool asked) {
  switch (backend) {
    case Backend::sim:
      if (sim_gpus <= 0) sim_gpus = static_cast<int>(env::number_or("WEFT_SIM_GPUS", 2, 1, 64));
      return make_sim_backend(sim_gpus);
    case Backend::cuda:
#if WEFT_HAVE_CUDA
      return make_cuda_backend();
#else
      return make_no_backend(asked ? "WEFT_GPU_BACKEND=cuda, but this build has no CUDA" : "this build has no CUDA");
#endif
    case Backend::none: break;
  }
  return make_no_backend(asked ? "WEFT_GPU_BACKEND=none" : "no GPU answers");
}

BackendImpl& install(std::unique_ptr<BackendImpl> r) {
  Selection& s = selection();
  s.owned = std::move(r);
  s.active.store(s.owned.get(), std::memory_order_release);
  return *s.owned;
}

}  // namespace

std::unique_ptr<BackendImpl> make_no_backend(std::string why) { return std::make_unique<NoBackend>(std::move(why)); }

BackendImpl& active_backend() {
  if (BackendImpl* r = selection().active.load(std::memory_order_acquire)) return *r;
  Selection& s = selection();
  std::lock_guard lock(s.mutex);
  if (BackendImpl* r = s.active.load(std::memory_order_acquire)) return *r;
  if (const std::string_view text = env::choice_or("WEFT_GPU_BACKEND", "", {"cuda", "sim", "none"}); !text.empty()) {
    const Backend b = parse_backend(text);
    return install(make_backend(b, 0, true));
  }
#if WEFT_HAVE_CUDA
  auto cuda = make_cuda_backend();
  if (cuda->device_count() > 0) return install(std::move(cuda));
#endif
  return install(make_backend(Backend::none, 0, false));
}

}  // namespace detail

void select_backend(Backend backend, int sim_gpus) {
  detail::Selection& s = detail::selection();
  std::lock_guard lock(s.mutex);
  if (detail::BackendImpl* r = s.active.load(std::memory_order_acquire)) {
    const bool same = r->kind() == backend && (backend != Backend::sim || sim_gpus <= 0 ||
                                                  sim_gpus == r->device_count());
    if (same) return;
    throw InvalidArgument("weft: GPU backend '" + std::string(to_string(backend)) +
                          (backend == Backend::sim && sim_gpus > 0 ? " with " + std::to_string(sim_gpus) + " GPU(s)"
                                                                   : std::string()) +
                          "' asked for, but this process already uses '" + std::string(to_string(r->kind())) +
                          "' with " + std::to_string(r->device_count()) +
                          " GPU(s) (the backend is fixed at first use: choose it with WEFT_GPU_BACKEND or before "
                          "creating the first engine)");
  }
  detail::install(detail::make_backend(backend, sim_gpus, true));
}

Backend backend() noexcept {
  try {
    return active_backend().kind();
  } catch (...) {  // a bad WEFT_GPU_BACKEND: the engine's configuration reports it
    return Backend::none;
  }
}

int device_count() noexcept {
  try {
    return active_backend().device_count();
  } catch (...) {
    return 0;
  }
}

namespace {
void check_index(int device) {
  const int n = device_count();
  if (device < 0 || device >= n)
    throw InvalidArgument("gpu(" + std::to_string(device) + ") does not exist (" + std::to_string(n) + " GPU(s), " +
                          std::string(to_string(backend())) + " backend)");
}
}  // namespace

DeviceProperties properties(int device) {
  check_index(device);
  return active_backend().properties(device);
}

std::string describe(int device) {
  check_index(device);
  return active_backend().describe(device);
}

void set_device(int device) { active_backend().set_device(device); }
void synchronize_device(int device) { active_backend().device_synchronize(device); }

// ---- streams ---------------------------------------------------------------

StreamResources::StreamResources(int device, StreamRole role, std::size_t workspace_bytes) : role_(role) {
  detail::BackendImpl& impl = active_backend();
  handles_.device = Device::gpu(device);
  handles_.stream = impl.create_stream(device, role == StreamRole::priority);
  if (role == StreamRole::compute || role == StreamRole::priority) {
    try {
      impl.create_handles(handles_, workspace_bytes);
    } catch (...) {
      impl.destroy_stream(handles_.stream);
      throw;
    }
  }
}

StreamResources::~StreamResources() {
  detail::BackendImpl& impl = active_backend();
  try {
    impl.stream_synchronize(handles_.stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: %s\n", e.what());
  }
  impl.destroy_handles(handles_);
  impl.destroy_stream(handles_.stream);
}

void StreamResources::synchronize() const { active_backend().stream_synchronize(handles_.stream); }

// ---- completion events -------------------------------------------------------

namespace {
// Recycled events, one list per device: creating and destroying an event per
// GPU op would cost a driver call each. Never shrinks; events are tiny.
class EventPool {
 public:
  NativeEvent* acquire(int device) {
    {
      std::lock_guard lock(mutex_);
      if (device < static_cast<int>(free_.size()) && !free_[static_cast<std::size_t>(device)].empty()) {
        NativeEvent* e = free_[static_cast<std::size_t>(device)].back();
        free_[static_cast<std::size_t>(device)].pop_back();
        return e;
      }
    }
    return active_backend().create_event(device, /*timing=*/false);
  }
  // Re-recording a returned event later is safe: waits already enqueued on
  // it captured the recording they saw.
  void release(int device, NativeEvent* e) noexcept {
    std::lock_guard lock(mutex_);
    if (device >= static_cast<int>(free_.size())) free_.resize(static_cast<std::size_t>(device) + 1);
    free_[static_cast<std::size_t>(device)].push_back(e);
  }

 private:
  std::mutex mutex_;
  std::vector<std::vector<NativeEvent*>> free_;
};

EventPool& event_pool() {
  static EventPool* pool = new EventPool;  // never destroyed: events may be released during exit
  return *pool;
}
}  // namespace

Event* Event::record(int device, Stream* stream) {
  NativeEvent* e = event_pool().acquire(device);
  try {
    active_backend().record_event(e, stream);
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

void Event::stream_wait(Stream* stream) const {
  if (stream == stream_) return;  // stream order already covers it
  active_backend().stream_wait_event(stream, event_);
}

void Event::host_wait() const { active_backend().event_synchronize(event_); }
bool Event::done() const { return active_backend().event_done(event_); }

// ---- stream-ordered work -------------------------------------------------------

void memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream* stream) {
  if (!bytes) return;
  active_backend().memcpy_async(dst, src, bytes, kind, stream);
}

void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                       Stream* stream) {
  if (!bytes) return;
  active_backend().memcpy_peer_async(dst, dst_device, src, src_device, bytes, stream);
}

void launch_host_func(Stream* stream, UniqueFunction<void()> fn) {
  if (!fn) throw InvalidArgument("gpu::launch_host_func: the function is empty");
  active_backend().launch_host_func(stream, std::move(fn));
}

void launch_host_kernel(Stream* stream, UniqueFunction<void()> fn) {
  if (!fn) throw InvalidArgument("gpu::launch_host_kernel: the function is empty");
  active_backend().launch_host_kernel(stream, std::move(fn));
}

void begin_stream_capture(Stream* stream) { active_backend().begin_capture(stream); }

std::unique_ptr<StreamGraph> end_stream_capture(Stream* stream, std::string* why) {
  return active_backend().end_capture(stream, why);
}

void launch_stream_graph(StreamGraph& graph, Stream* stream) { active_backend().launch_graph(graph, stream); }

void* native_handle(Stream* stream) noexcept { return active_backend().native_handle(stream); }

// ---- host waits ------------------------------------------------------------------

namespace {
thread_local WaitCause tls_cause = WaitCause::other;
std::atomic<std::uint64_t> g_waits[static_cast<int>(WaitCause::count_)];
}  // namespace

std::string_view to_string(WaitCause cause) noexcept {
  switch (cause) {
    case WaitCause::other: return "other";
    case WaitCause::frontend: return "frontend";
    case WaitCause::cpu_worker: return "cpu_worker";
    case WaitCause::gpu_worker: return "gpu_worker";
    case WaitCause::shutdown: return "shutdown";
    case WaitCause::count_: break;
  }
  return "?";
}

HostWaits host_waits() noexcept {
  HostWaits w;
  for (int i = 0; i < static_cast<int>(WaitCause::count_); ++i)
    w.by_cause[i] = g_waits[i].load(std::memory_order_relaxed);
  return w;
}

void declare_thread_wait_cause(WaitCause cause) noexcept { tls_cause = cause; }
ScopedWaitCause::ScopedWaitCause(WaitCause cause) noexcept : saved_(tls_cause) { tls_cause = cause; }
ScopedWaitCause::~ScopedWaitCause() { tls_cause = saved_; }

WaitCause detail::thread_wait_cause() noexcept { return tls_cause; }

void detail::BackendImpl::count_host_wait() noexcept {
  g_waits[static_cast<int>(tls_cause)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace weft::gpu
