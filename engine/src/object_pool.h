// A per-engine object pool with per-thread caches.
//
// The frontend allocates op blocks and workers free them, so blocks flow in
// one direction; caches hand full batches back through a mutex-protected depot
// and take them from it, touching the mutex once per kBatch objects. Chunks
// are freed only with the pool. No allocation in steady state.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace weft::detail {

template <class T>
class ObjectPool {
 public:
  static constexpr std::size_t kBatch = 64;
  static constexpr std::size_t kPrefetchBytes = 512;  // of the next item, at each acquire

  ObjectPool() : id_(next_pool_id()) {}
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;

  T* acquire() {
    Cache& cache = local_cache();
    if (cache.items.empty()) refill(cache);
    T* item = cache.items.back();
    cache.items.pop_back();
    // The next items were most likely released by another thread (a worker
    // on another core): start moving their first lines here, for writing,
    // two acquires ahead (one is too short to hide a transfer between
    // cores), so that the callers do not stall on them.
    for (std::size_t ahead = 1; ahead <= 2 && ahead <= cache.items.size(); ++ahead) {
      const char* next = reinterpret_cast<const char*>(cache.items[cache.items.size() - ahead]);
      for (std::size_t offset = 0; offset < std::min<std::size_t>(sizeof(T), kPrefetchBytes); offset += 64)
        __builtin_prefetch(next + offset, 1, 3);
    }
    return item;
  }

  void release(T* item) {
    Cache& cache = local_cache();
    cache.items.push_back(item);
    if (cache.items.size() >= 2 * kBatch) {
      std::lock_guard lock(mutex_);
      depot_.insert(depot_.end(), cache.items.end() - kBatch, cache.items.end());
      cache.items.resize(cache.items.size() - kBatch);
    }
  }

  std::size_t allocated() const {
    std::lock_guard lock(mutex_);
    return chunks_.size() * kBatch;
  }

 private:
  struct Cache {
    std::vector<T*> items;
  };
  struct ThreadMemo {
    std::uint64_t pool_id = 0;
    Cache* cache = nullptr;
  };

  static std::uint64_t next_pool_id() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  Cache& local_cache() {
    // Pool ids are never reused, so a memo left by a dead pool never matches.
    static thread_local ThreadMemo memo;
    if (memo.pool_id == id_) return *memo.cache;
    std::lock_guard lock(mutex_);
    auto& slot = caches_[std::this_thread::get_id()];
    if (!slot) {
      slot = std::make_unique<Cache>();
      slot->items.reserve(2 * kBatch);
    }
    memo = {id_, slot.get()};
    return *slot;
  }

  void refill(Cache& cache) {
    std::lock_guard lock(mutex_);
    if (!depot_.empty()) {
      std::size_t n = std::min(kBatch, depot_.size());
      cache.items.insert(cache.items.end(), depot_.end() - n, depot_.end());
      depot_.resize(depot_.size() - n);
      return;
    }
    auto chunk = std::make_unique<T[]>(kBatch);
    for (std::size_t i = 0; i < kBatch; ++i) cache.items.push_back(&chunk[i]);
    chunks_.push_back(std::move(chunk));
  }

  const std::uint64_t id_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::vector<T*> depot_;  // capacity is kept: handing batches back does not allocate
  std::unordered_map<std::thread::id, std::unique_ptr<Cache>> caches_;
};

}  // namespace weft::detail
