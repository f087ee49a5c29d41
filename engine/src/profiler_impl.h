// The profiler's storage, shared by its source files (profiler.cpp: tracks
// and recording; profiler_trace.cpp: the JSON trace; profiler_summary.cpp:
// busy time and overlap; profiler_graph.cpp: the dependency graph).
//
// Each Track is a single-writer chain of fixed-size chunks. The owner thread
// fills a slot, then publishes it by bumping `count_` with a release store;
// a new chunk is linked (release) before the first span in it is published.
// Readers load `count_` (acquire) and walk the chain, so they see a prefix of
// whole spans even if a writer is still appending; spans never move.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "profiler_recorder.h"
#include "weft/profiler.h"

namespace weft {

namespace detail {

constexpr std::size_t kChunkSpans = 512;  // ~32 KiB per chunk

struct SpanChunk {
  std::array<SpanInfo, kChunkSpans> spans;
  std::atomic<SpanChunk*> next{nullptr};
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

struct CounterSample {
  Device device;
  std::string_view name;  // interned
  std::int64_t ts_ns;
  std::int64_t value;
  bool memory = false;  // an allocator's sample: `value` split by role in `by_role`
  MemoryByRole by_role{};
};

// Trace process of a device (one per device) and thread of a track.
std::int64_t process_id(Device d);
inline std::int64_t thread_id(int index) { return static_cast<std::int64_t>(index) + 1; }
std::string_view display_name(std::string_view name);

class ProfilerTrack {
 public:
  ProfilerTrack(Device device, int index, std::string label, TrackKind kind, std::string resource)
      : device_(device), index_(index), label_(std::move(label)), kind_(kind), resource_(std::move(resource)) {}
  ~ProfilerTrack() { free_chunks(); }
  ProfilerTrack(const ProfilerTrack&) = delete;
  ProfilerTrack& operator=(const ProfilerTrack&) = delete;

  Device device() const noexcept { return device_; }
  int index() const noexcept { return index_; }
  const std::string& label() const noexcept { return label_; }
  TrackKind kind() const noexcept { return kind_; }
  const std::string& resource() const noexcept { return resource_; }

  // Owner thread only.
  void append(const SpanInfo& span) {
    if (pos_ == kChunkSpans) [[unlikely]]
      grow();
    cur_->spans[pos_++] = span;
    count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Any thread: calls fn(const SpanInfo&) for every published span, in record order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    std::size_t n = count_.load(std::memory_order_acquire);
    const SpanChunk* c = head_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n && c != nullptr; c = c->next.load(std::memory_order_acquire)) {
      std::size_t in_chunk = std::min(kChunkSpans, n - i);
      for (std::size_t k = 0; k < in_chunk; ++k) fn(c->spans[k]);
      i += in_chunk;
    }
  }

  std::size_t size() const noexcept { return count_.load(std::memory_order_acquire); }

  // Writers must be quiescent.
  void clear() noexcept {
    free_chunks();
    count_.store(0, std::memory_order_release);
  }

 private:
  void grow() {
    auto* c = new SpanChunk;
    if (cur_ == nullptr) head_.store(c, std::memory_order_release);
    else cur_->next.store(c, std::memory_order_release);
    cur_ = c;
    pos_ = 0;
  }

  void free_chunks() noexcept {
    SpanChunk* c = head_.exchange(nullptr, std::memory_order_acq_rel);
    while (c != nullptr) {
      SpanChunk* next = c->next.load(std::memory_order_relaxed);
      delete c;
      c = next;
    }
    cur_ = nullptr;
    pos_ = kChunkSpans;
  }

  const Device device_;
  const int index_;
  const std::string label_;
  const TrackKind kind_;
  const std::string resource_;
  std::atomic<SpanChunk*> head_{nullptr};
  std::atomic<std::size_t> count_{0};
  // Writer-side state (owner thread, or clear() while quiescent).
  SpanChunk* cur_ = nullptr;
  std::size_t pos_ = kChunkSpans;
};

}  // namespace detail

// The profiler's own files name the recording types without detail::.
using detail::PushRecord;
using detail::SpanInfo;
using detail::VarUse;
using Track = detail::ProfilerTrack;

struct Profiler::Impl {
  mutable std::mutex tracks_mu;
  std::vector<std::unique_ptr<Track>> tracks;  // creation order; never removed
  std::map<std::pair<Device, int>, Track*> by_key;

  std::mutex names_mu;
  std::unordered_set<std::string, detail::StringHash, std::equal_to<>> names;  // node-based: views stay valid

  mutable std::mutex samples_mu;  // counters, pushes and renames
  std::vector<detail::CounterSample> counters;
  std::vector<PushRecord> pushes;
  std::unordered_map<std::uint64_t, std::string_view> var_names;  // key -> interned name given after push

  // The recorded pushes, every variable with its latest name (one given
  // after the push, e.g. to a tensor after its creating op, wins). Unnamed
  // variables get "v<id>" (kept alive in *labels) or, without labels, stay
  // empty.
  std::vector<PushRecord> labelled_pushes(std::deque<std::string>* labels) const {
    std::lock_guard lock(samples_mu);
    std::vector<PushRecord> out = pushes;
    for (PushRecord& p : out)
      for (VarUse& v : p.vars) {
        if (auto it = var_names.find(v.key); it != var_names.end()) v.name = it->second;
        if (v.name.empty() && labels) {
          std::string& label = labels->emplace_back(1, 'v');  // (not "v" + ...: GCC 12's -Wrestrict misfires)
          label += std::to_string(v.key >> 32);
          v.name = label;
        }
      }
    return out;
  }

  // Tracks ordered by (device, index): a snapshot safe to read without the lock
  // (tracks live as long as the profiler).
  std::vector<const Track*> sorted_tracks() const {
    std::lock_guard lock(tracks_mu);
    std::vector<const Track*> out;
    out.reserve(by_key.size());
    for (const auto& [key, t] : by_key) out.push_back(t);
    return out;
  }
};

}  // namespace weft
