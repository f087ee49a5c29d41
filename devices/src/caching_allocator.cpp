#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "weft/check_context.h"
#include "backend.h"
#include "weft/allocator.h"
#include "weft/error.h"

namespace weft {

namespace detail {
struct BlockRecord {
  void* ptr = nullptr;
  std::size_t size = 0;              // the size class: what the system gave us
  MemoryRole role = MemoryRole::activations;  // while handed out
  gpu::Stream* stream = nullptr;     // allocating stream: may reuse at once after free
  std::vector<gpu::Stream*> uses;    // other streams that touched it
  std::vector<gpu::NativeEvent*> pending;  // recorded on `uses` at free time
};
}  // namespace detail

namespace {

using detail::BlockRecord;
using gpu::detail::human_bytes;
using gpu::detail::active_backend;

constexpr std::size_t kAlign = 64;

// Size classes: 512-byte steps below 1 MiB, then 32 classes per power of
// two, so a block wastes at most a 32nd of itself (what a model's large
// tensors and flat buckets take is what the accounting sees) and sizes a
// few percent apart still share a class and hit the cache.
std::size_t size_class(std::size_t bytes) {
  if (bytes <= (std::size_t{1} << 20)) return (bytes + 511) & ~std::size_t{511};
  std::size_t p = std::size_t{1} << (63 - __builtin_clzll(bytes - 1));  // largest power of two below bytes
  std::size_t step = p / 32;
  return (bytes + step - 1) / step * step;
}

// Where the memory comes from.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual void* raw_alloc(std::size_t bytes) noexcept = 0;
  virtual void raw_free(void* ptr) noexcept = 0;
  virtual std::string kind() const = 0;
  // What the system has left for this memory (for out-of-memory errors).
  virtual std::size_t free_bytes() const noexcept {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
  }
  // Stream events (only GPU-touched blocks ever get here), recorded on the
  // stream's own device whatever the freeing thread has current.
  gpu::NativeEvent* record_event(gpu::Stream* stream) {
    gpu::detail::BackendImpl& impl = active_backend();
    gpu::NativeEvent* e = impl.create_event(impl.stream_device(stream), /*timing=*/false);
    try {
      impl.record_event(e, stream);
    } catch (...) {
      impl.destroy_event(e);
      throw;
    }
    return e;
  }
  bool event_done(gpu::NativeEvent* event) noexcept {
    try {
      return active_backend().event_done(event);
    } catch (...) {
      return true;  // the stream failed: its work is over all the same
    }
  }
  void wait_event(gpu::NativeEvent* event) noexcept {
    try {
      active_backend().event_synchronize(event);
    } catch (...) {  // as above
    }
  }
  void destroy_event(gpu::NativeEvent* event) noexcept { active_backend().destroy_event(event); }
};

class HostMemory : public MemorySource {
 public:
  void* raw_alloc(std::size_t bytes) noexcept override { return std::aligned_alloc(kAlign, bytes); }
  void raw_free(void* ptr) noexcept override { std::free(ptr); }
  std::string kind() const override { return "pageable"; }
};

// Page-locked host memory from the GPU backend (cudaHostAlloc; plain host
// memory on simulated GPUs, which copy from anything).
class PinnedMemory final : public MemorySource {
 public:
  void* raw_alloc(std::size_t bytes) noexcept override { return active_backend().pinned_malloc(bytes); }
  void raw_free(void* ptr) noexcept override { active_backend().pinned_free(ptr); }
  std::string kind() const override {
    return active_backend().kind() == gpu::Backend::sim ? "pinned (simulated)" : "pinned";
  }
};

class GpuMemory final : public MemorySource {
 public:
  explicit GpuMemory(int device) : device_(device) {}
  void* raw_alloc(std::size_t bytes) noexcept override { return active_backend().device_malloc(device_, bytes); }
  void raw_free(void* ptr) noexcept override { active_backend().device_free(device_, ptr); }
  std::string kind() const override { return "device"; }
  std::size_t free_bytes() const noexcept override {
    try {
      return active_backend().mem_info(device_).free;
    } catch (...) {
      return 0;
    }
  }

 private:
  int device_;
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<MemorySource> source, std::string kind_note)
      : device_(device), source_(std::move(source)), kind_note_(std::move(kind_note)) {}

  ~CachingAllocator() override {
    std::lock_guard lock(mutex_);
    // Blocks other streams were still using at free time: wait for them, then
    // give them back like the cached ones.
    for (BlockRecord* r : pending_) {
      settle(r, /*wait=*/true);
      drop(r);
    }
    pending_.clear();
    for (auto& [key, list] : free_)
      for (BlockRecord* r : list) drop(r);
    free_.clear();
    // Blocks still handed out are leaked on purpose: their owners may free
    // them later, and the engine that owns this allocator is already gone.
  }

  Block allocate(std::size_t bytes, gpu::Stream* stream, MemoryRole role) override {
    if (bytes == 0) return {};
    // Memory a capture hands out would be a graph's for good, and CUDA
    // refuses cudaMalloc there: what a captured op writes is allocated at
    // the replay before (its warm-up).
    if (device_.is_gpu() && gpu::detail::BackendImpl::capturing_stream() != nullptr)
      throw InvalidArgument("allocating " + human_bytes(bytes) + " on " + device_.str() +
                            " while this thread captures a stream graph: a captured op must find its memory "
                            "allocated (by the replay before, its warm-up)" + detail::current_op_suffix());
    const std::size_t size = size_class(bytes);
    std::lock_guard lock(mutex_);
    ++stats_.allocations;
    BlockRecord* r = take_cached(size, stream);
    if (r) {
      ++stats_.cache_hits;
    } else {
      void* p = source_->raw_alloc(size);
      if (!p) {
        // Before giving up: blocks waiting for other streams will be free
        // once those streams catch up (GPU ops complete when enqueued, so
        // the frontend may be far ahead); wait for them, then drop the cache.
        for (BlockRecord* pending : pending_) settle(pending, /*wait=*/true);
        for (BlockRecord* pending : pending_) free_[key(pending->size, pending->stream)].push_back(pending);
        pending_.clear();
        release_cached_locked();
        p = source_->raw_alloc(size);
      }
      if (!p) {
        const std::size_t free = source_->free_bytes();
        throw OutOfMemory("out of memory on " + device_.str() + ": requested " + human_bytes(bytes) + " (" +
                              human_bytes(size) + " size class); " + human_bytes(free) + " free, " +
                              human_bytes(stats_.in_use) + " in use, " + human_bytes(stats_.reserved) +
                              " reserved after releasing the cache" + detail::current_op_suffix(),
                          device_, bytes, free);
      }
      r = new BlockRecord{p, size, role, stream, {}, {}};
      stats_.reserved += size;
    }
    r->stream = stream;
    r->role = role;
    stats_.in_use += size;
    by_role(role) += size;
    if (stats_.in_use >= stats_.peak_in_use) {
      stats_.peak_in_use = stats_.in_use;
      stats_.peak_by_role = stats_.in_use_by_role;
    }
    notify();
    return Block{r->ptr, bytes, r};
  }

  void set_role(const Block& block, MemoryRole role) noexcept override {
    BlockRecord* r = block.record;
    if (!r) return;
    std::lock_guard lock(mutex_);
    if (r->role == role) return;
    by_role(r->role) -= r->size;
    by_role(role) += r->size;
    r->role = role;
    if (stats_.in_use == stats_.peak_in_use) stats_.peak_by_role = stats_.in_use_by_role;
    notify();
  }

  void record_use(const Block& block, gpu::Stream* stream) override {
    if (!block.record || stream == block.record->stream) return;
    std::lock_guard lock(mutex_);
    auto& uses = block.record->uses;
    if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  }

  void free(Block block) noexcept override {
    BlockRecord* r = block.record;
    if (!r) return;
    std::lock_guard lock(mutex_);
    stats_.in_use -= r->size;
    by_role(r->role) -= r->size;
    notify();
    if (r->uses.empty()) {
      free_[key(r->size, r->stream)].push_back(r);
      return;
    }
    try {
      for (gpu::Stream* s : r->uses) r->pending.push_back(source_->record_event(s));
      r->uses.clear();
      pending_.push_back(r);
    } catch (const std::exception& e) {
      // No event means no proof the other streams are done: never reuse it.
      std::fprintf(stderr, "weft: %s: a freed block of %s is never reused (no event for the streams that used it: %s)\n",
                   device_.str().c_str(), human_bytes(r->size).c_str(), e.what());
      stats_.reserved -= r->size;
      delete r;
    }
  }

  void release_cached() noexcept override {
    std::lock_guard lock(mutex_);
    release_cached_locked();
  }

  MemoryStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void reset_peak() noexcept override {
    std::lock_guard lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
    stats_.peak_by_role = stats_.in_use_by_role;
  }
  Device device() const noexcept override { return device_; }
  void set_observer(UsageObserver observer) override {
    std::lock_guard lock(mutex_);
    observer_ = std::move(observer);
  }
  std::string memory_kind() const override { return kind_note_.empty() ? source_->kind() : kind_note_; }

 private:
  struct Key {
    std::size_t size;
    gpu::Stream* stream;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return std::hash<std::size_t>()(k.size) ^ (std::hash<const void*>()(k.stream) << 1);
    }
  };
  static Key key(std::size_t size, gpu::Stream* stream) { return Key{size, stream}; }

  BlockRecord* take_cached(std::size_t size, gpu::Stream* stream) {
    auto it = free_.find(key(size, stream));
    if (it == free_.end() || it->second.empty()) {
      poll_pending();
      it = free_.find(key(size, stream));
      if (it == free_.end() || it->second.empty()) return nullptr;
    }
    BlockRecord* r = it->second.back();
    it->second.pop_back();
    return r;
  }

  // Blocks whose other-stream events have completed go back to the cache.
  void poll_pending() {
    auto done = [&](BlockRecord* r) {
      if (!settle(r, false)) return false;
      free_[key(r->size, r->stream)].push_back(r);
      return true;
    };
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
  }

  // Whether the other streams' events of `r` completed (waiting for them when
  // `wait`); if so, forgets them.
  bool settle(BlockRecord* r, bool wait) {
    for (gpu::NativeEvent* e : r->pending) {
      if (wait)
        source_->wait_event(e);
      else if (!source_->event_done(e))
        return false;
    }
    for (gpu::NativeEvent* e : r->pending) source_->destroy_event(e);
    r->pending.clear();
    return true;
  }

  void drop(BlockRecord* r) noexcept {
    source_->raw_free(r->ptr);
    stats_.reserved -= r->size;
    delete r;
  }

  void release_cached_locked() noexcept {
    poll_pending();
    for (auto& [k, list] : free_) {
      for (BlockRecord* r : list) drop(r);
      list.clear();
    }
  }

  Device device_;
  std::unique_ptr<MemorySource> source_;
  std::string kind_note_;
  void notify() noexcept {
    if (!observer_) return;
    try {
      observer_(device_, stats_.in_use, stats_.in_use_by_role);
    } catch (...) {
    }
  }
  std::size_t& by_role(MemoryRole role) noexcept { return stats_.in_use_by_role[static_cast<std::size_t>(role)]; }

  mutable std::mutex mutex_;
  UsageObserver observer_;  // guarded by mutex_
  std::unordered_map<Key, std::vector<BlockRecord*>, KeyHash> free_;
  std::vector<BlockRecord*> pending_;
  MemoryStats stats_;
};

}  // namespace

std::string_view to_string(MemoryRole role) noexcept {
  switch (role) {
    case MemoryRole::activations: return "activations";
    case MemoryRole::parameters: return "parameters";
    case MemoryRole::gradients: return "gradients";
    case MemoryRole::optimizer_state: return "optimizer_state";
    case MemoryRole::communication: return "communication";
  }
  return "?";
}

std::unique_ptr<Allocator> make_caching_allocator(Device device) {
  switch (device.kind()) {
    case DeviceKind::cpu:
      return std::make_unique<CachingAllocator>(device, std::make_unique<HostMemory>(), "");
    case DeviceKind::cpu_pinned:
      if (gpu::device_count() > 0)
        return std::make_unique<CachingAllocator>(device, std::make_unique<PinnedMemory>(), "");
      return std::make_unique<CachingAllocator>(device, std::make_unique<HostMemory>(),
                                                "pageable (no GPU answers: pinned memory unavailable)");
    case DeviceKind::gpu:
      if (device.index() < gpu::device_count())
        return std::make_unique<CachingAllocator>(device, std::make_unique<GpuMemory>(device.index()), "");
      throw InvalidArgument("no allocator for " + device.str() + ": " + std::to_string(gpu::device_count()) +
                            " GPU(s) available (" + std::string(gpu::to_string(gpu::backend())) + " backend)");
  }
  throw InvalidArgument("no allocator for " + device.str());
}

}  // namespace weft
