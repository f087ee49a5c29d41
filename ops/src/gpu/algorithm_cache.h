// A per-device cache of algorithm choices (cuDNN convolution algorithms):
// shared by the device's workers, bounded (least recently used out first),
// and safe under stream capture. Plain C++, no CUDA: the cuDNN code
// (cudnn_conv.cpp) supplies the key and the two ways of choosing, and the
// tests run the cache on its own. How and why: docs/design/precision.md,
// "Algorithm cache".
//
//   get(key, capturing, measure, estimate)
//     - a final entry is returned as is;
//     - a missing key is chosen once: by measure() (trial runs) outside
//       capture, by estimate() (no trial runs, no synchronization) while the
//       caller's stream is capturing; the latter entry is provisional;
//     - a provisional entry serves capturing callers (also while it is
//       being measured), and the first caller outside capture measures it
//       again and makes it final;
//     - one caller chooses a key at a time: others asking for it wait and
//       take its result; a choice that throws leaves the key as it was
//       (others then retry) and the exception goes to its caller;
//     - measure() is never called with capturing == true.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft/env.h"
#include "weft/error.h"

namespace weft::kernels::gpu {

inline constexpr const char* kAlgorithmCacheSizeVariable = "WEFT_CUDNN_CACHE_SIZE";
inline constexpr long long kAlgorithmCacheSizeDefault = 1024;
inline constexpr long long kAlgorithmCacheSizeMax = 1LL << 20;

// WEFT_CUDNN_CACHE_SIZE (entries per device), read each call; 0, a negative
// number or text is a weft::InvalidArgument naming the variable.
inline std::size_t algorithm_cache_size_from_env() {
  return static_cast<std::size_t>(weft::env::number_or(
      kAlgorithmCacheSizeVariable, kAlgorithmCacheSizeDefault, 1, kAlgorithmCacheSizeMax,
      "a number in [1, " + std::to_string(kAlgorithmCacheSizeMax) +
          "] (convolution algorithm choices kept per GPU)"));
}

// One algorithm of a ranking (cuDNN's heuristic order, or the trial runs' by
// time): whether it ran (or may run), is deterministic, uses FMA math only.
struct RankedAlgorithm {
  int algo = 0;
  bool ok = true;
  bool deterministic = true;
  bool fma_only = true;
};

// The indices of `ranking` in the order they are tried: failed ones left out,
// with `deterministic` the nondeterministic ones too, and with `strict`
// (float32 without TF32) the FMA-only ones first, then the others, each group
// in ranking order. A pure function of its arguments: the same ranking gives
// the same order.
inline std::vector<std::size_t> candidate_order(const std::vector<RankedAlgorithm>& ranking, bool deterministic,
                                                bool strict) {
  std::vector<std::size_t> order;
  for (int tier = strict ? 0 : 1; tier < 2; ++tier)
    for (std::size_t i = 0; i < ranking.size(); ++i) {
      const RankedAlgorithm& r = ranking[i];
      if (!r.ok || (deterministic && !r.deterministic)) continue;
      if (strict && (tier == 0) != r.fma_only) continue;
      order.push_back(i);
    }
  return order;
}

template <class Key, class Plan, class Compare = std::less<Key>>
class AlgorithmCache {
 public:
  struct Stats {
    std::uint64_t hits = 0;       // a final (or, while capturing, provisional) entry returned
    std::uint64_t measured = 0;   // measure() calls that completed
    std::uint64_t estimated = 0;  // estimate() calls that completed (provisional entries made)
    std::uint64_t waits = 0;      // callers that waited for another caller's choice
    std::uint64_t evictions = 0;
  };

  explicit AlgorithmCache(std::size_t capacity) : capacity_(capacity) {
    if (capacity == 0)
      throw weft::InvalidArgument(std::string("AlgorithmCache: a capacity of 0 entries (") +
                                  kAlgorithmCacheSizeVariable + " must be at least 1)");
  }
  AlgorithmCache(const AlgorithmCache&) = delete;
  AlgorithmCache& operator=(const AlgorithmCache&) = delete;

  template <class Measure, class Estimate>
  Plan get(const Key& key, bool capturing, Measure&& measure, Estimate&& estimate) {
    std::unique_lock lock(mu_);
    for (;;) {
      auto it = entries_.find(key);
      if (it == entries_.end()) {
        lru_.push_front(key);
        it = entries_.emplace(key, Entry{std::nullopt, false, true, lru_.begin()}).first;
        evict_locked();
        break;
      }
      Entry& e = it->second;
      if (capturing && e.plan) {  // final or provisional, even while being measured
        touch_locked(e);
        ++stats_.hits;
        return *e.plan;
      }
      if (e.pending) {
        ++stats_.waits;
        cv_.wait(lock);
        continue;  // the entry may have been chosen, dropped (a throw) or evicted meanwhile
      }
      touch_locked(e);
      if (!e.provisional) {
        ++stats_.hits;
        return *e.plan;
      }
      e.pending = true;  // provisional, outside capture: measure it now
      break;
    }
    lock.unlock();
    std::optional<Plan> chosen;
    try {
      if (capturing)
        chosen.emplace(estimate());
      else
        chosen.emplace(measure());
    } catch (...) {
      lock.lock();
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        if (it->second.plan) {
          it->second.pending = false;  // the provisional choice stays
        } else {
          lru_.erase(it->second.lru);
          entries_.erase(it);
        }
      }
      cv_.notify_all();
      throw;
    }
    lock.lock();
    Entry& e = entries_.at(key);  // pending entries are never evicted
    e.plan = *chosen;
    e.provisional = capturing;
    e.pending = false;
    ++(capturing ? stats_.estimated : stats_.measured);
    evict_locked();
    cv_.notify_all();
    return *chosen;
  }

  // The entry's choice without touching its recency; empty when missing or
  // still being chosen.
  std::optional<Plan> peek(const Key& key) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(key);
    return it == entries_.end() ? std::nullopt : it->second.plan;
  }
  bool provisional(const Key& key) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(key);
    return it != entries_.end() && it->second.plan && it->second.provisional;
  }
  // Keys from the most to the least recently used.
  std::vector<Key> keys() const {
    std::lock_guard lock(mu_);
    return {lru_.begin(), lru_.end()};
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return entries_.size();
  }
  std::size_t capacity() const noexcept { return capacity_; }
  Stats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  struct Entry {
    std::optional<Plan> plan;
    bool provisional = false;
    bool pending = false;  // some caller is choosing it
    typename std::list<Key>::iterator lru;
  };

  void touch_locked(Entry& e) { lru_.splice(lru_.begin(), lru_, e.lru); }

  // Drops least recently used entries beyond the capacity; an entry being
  // chosen stays (its chooser will store into it), so the cache may hold
  // more than its capacity while more keys than that are being chosen.
  void evict_locked() {
    auto it = lru_.end();
    while (entries_.size() > capacity_ && it != lru_.begin()) {
      --it;
      auto e = entries_.find(*it);
      if (e->second.pending) continue;
      it = lru_.erase(it);
      entries_.erase(e);
      ++stats_.evictions;
    }
  }

  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, Entry, Compare> entries_;
  std::list<Key> lru_;  // front: most recently used
  Stats stats_;
};

}  // namespace weft::kernels::gpu
