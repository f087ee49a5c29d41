// weft::Profiler — per-op spans on every worker, written as a chrome://tracing
// (Perfetto) JSON file, plus an aggregate table per op name.
//
// Recording costs one relaxed load per op while stopped; while running, each
// worker appends to its own buffer, so workers never contend on the profiler.
//
// Threading contract:
//   * start/stop/running may be called from any thread at any time.
//   * track() and intern() are thread-safe (short mutexes); engines call them
//     at start-up / push time, not per span.
//   * record(track, ...) is called only by the thread that owns `track` (one
//     writer per track), takes no lock, and never moves spans already recorded
//     (storage is a chain of fixed-size chunks). Callers check running()
//     first; record() itself appends whatever it is given.
//   * Readers (dump, write_trace, spans, aggregate, summary_table) are meant
//     for quiescent writers: after Engine::wait_all(), or after stop() once the
//     ops in flight have finished. Called while workers still record, they see
//     a consistent prefix of every track (each span whole or absent).
//   * clear() requires quiescent writers (no record() in progress or later
//     racing with it); tracks and interned names survive it.
//
// Trace layout: pid = 1 + 100000 * kind + device index (one process per
// device), tid = track index + 1; ts/dur are microseconds (3 decimals) with ts
// relative to the earliest recorded span.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weft/device.h"

namespace weft {

struct OpStats {
  std::string name;
  std::uint64_t count = 0;
  double total_us = 0, min_us = 0, max_us = 0, mean_us = 0;
};

struct Span {
  std::string_view name;  // interned by the profiler: valid for its lifetime
  Device device;
  int track = 0;  // worker index within the device (naive engine: pushing thread)
  std::uint64_t op_id = 0;
  std::int64_t start_ns = 0;  // steady clock, relative to the profiler's epoch
  std::int64_t end_ns = 0;
};

class Profiler {
 public:
  Profiler();
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  void start();  // spans recorded from now on (the previous spans are kept)
  void stop();
  bool running() const noexcept;
  void clear();  // forget recorded spans

  // Writes the trace: {"traceEvents": [...]} with one process per device, one
  // thread per worker and one complete ("X") event per op. Throws weft::Error
  // naming the path when it cannot be written.
  void dump(const std::string& path) const;
  void write_trace(std::ostream& os) const;

  std::vector<Span> spans() const;             // every recorded span, by start time
  std::vector<OpStats> aggregate() const;      // per op name, by total time (largest first)
  std::string summary_table() const;           // aggregate() as a printable table

  // Engines call these. A track is a single-writer buffer (one per worker).
  class Track;
  // Thread-safe. The same (device, index) gives the same Track (the first
  // label wins; empty: "<device> worker <index>"); the pointer stays valid for
  // the profiler's lifetime, across clear(). Throws weft::Error for index < 0.
  Track* track(Device device, int index, std::string label);
  // Thread-safe. Equal names give the same view, valid for the profiler's lifetime.
  std::string_view intern(std::string_view name);
  // steady_clock nanoseconds since a process-wide epoch.
  static std::int64_t now_ns() noexcept;
  // Owner thread of `track` only; lock-free. Requires end_ns >= start_ns
  // (asserted in debug builds, clamped otherwise).
  void record(Track* track, std::string_view interned_name, std::uint64_t op_id, std::int64_t start_ns,
              std::int64_t end_ns);

 private:
  struct Impl;
  std::atomic<bool> running_{false};  // read on the engine's hot path: kept inline
  std::unique_ptr<Impl> impl_;
};

inline bool Profiler::running() const noexcept { return running_.load(std::memory_order_relaxed); }

}  // namespace weft
