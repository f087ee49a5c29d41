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
// Trace layout and schema: docs/trace-format.md (one process per device, one
// thread per track, flow arrows from each op to the ops it unblocked, counters
// for ops in flight and allocator memory, a "weft" object describing tracks).
// summarize() computes per-resource busy time and the compute/copy and
// device/device overlap from the spans; scripts/trace-summary computes the
// same figures from a trace file.
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
#include "weft/op_property.h"

namespace weft {

struct OpStats {
  std::string name;
  std::uint64_t count = 0;
  double total_us = 0, min_us = 0, max_us = 0, mean_us = 0;
};

// The ops that wrote one named variable.
struct VarStats {
  std::string name;            // the variable's (a tensor's, a parameter's) name
  std::uint64_t writes = 0;    // ops that wrote it
  double total_us = 0;         // their time
  std::vector<std::string> ops;  // their names, distinct, in first-write order
};

// What a track's spans are: op bodies on a CPU worker, the host side of GPU
// work (a GPU worker enqueuing it), or the GPU side (when the stream ran it,
// timed with CUDA events).
enum class TrackKind : std::uint8_t { worker, launch, stream };
std::string_view to_string(TrackKind kind) noexcept;

// One op as a track records it.
struct SpanInfo {
  std::string_view name;  // interned (Profiler::intern)
  std::uint64_t op_id = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t push_ns = -1;       // when the op was pushed; -1: unknown
  std::uint64_t unblocked_by = 0;  // the op whose completion made it ready; 0: ready at push
  std::uint64_t bytes = 0;         // payload of a copy
  OpProperty property = OpProperty::normal;
};

struct Span {
  std::string_view name;  // interned by the profiler: valid for its lifetime
  Device device;
  int track = 0;  // index within the device (worker; GPU: role * 100 + stream, launch tracks + 1000; inline 2000 + n)
  std::uint64_t op_id = 0;
  std::int64_t start_ns = 0;  // steady clock, relative to the profiler's epoch
  std::int64_t end_ns = 0;
  TrackKind kind = TrackKind::worker;
  std::string_view resource;  // what the summary groups by, e.g. "cpu(0) workers"
  std::int64_t push_ns = -1;
  std::uint64_t unblocked_by = 0;
  std::uint64_t bytes = 0;
  OpProperty property = OpProperty::normal;
};

// Busy time of one resource (a CPU device's workers together, one GPU
// stream, the host side of one GPU stream) over the profiled window.
struct ResourceUsage {
  std::string resource;
  Device device;
  TrackKind kind = TrackKind::worker;
  int tracks = 0;
  std::uint64_t ops = 0;
  double busy_ms = 0;      // sum of its spans
  double utilization = 0;  // busy / (window * tracks)
  std::uint64_t bytes = 0;  // moved by its copy spans
};

// Two kinds of work and how much they ran at the same time.
struct Overlap {
  std::string a, b;
  double a_ms = 0, b_ms = 0;  // time during which at least one span of a (b) ran
  double both_ms = 0;         // time during which both ran
  double efficiency = 0;      // both / min(a, b); 0 when either is empty
};

struct ProfileSummary {
  double window_ms = 0;  // earliest span start to latest span end
  std::vector<ResourceUsage> resources;
  Overlap compute_copy;          // compute spans vs copy spans (launch tracks excluded)
  std::vector<Overlap> devices;  // each pair of devices that ran ops
  std::string table() const;     // printable
  std::string json() const;      // one line, keys as docs/trace-format.md
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
  ProfileSummary summarize() const;            // see docs/trace-format.md
  std::vector<OpStats> aggregate() const;      // per op name, by total time (largest first)
  // Per named variable: the ops that wrote it (count, total time, their
  // names), by total time; unnamed variables are left out.
  std::vector<VarStats> aggregate_by_variable() const;
  std::string summary_table() const;           // aggregate() as a printable table

  // Engines call these. A track is a single-writer buffer (one per worker).
  class Track;
  // Thread-safe. The same (device, index) gives the same Track (the first
  // label wins; empty: "<device> worker <index>"); the pointer stays valid for
  // the profiler's lifetime, across clear(). Throws weft::Error for index < 0.
  // `resource` groups tracks in the summary (empty: "<device> workers").
  Track* track(Device device, int index, std::string label, TrackKind kind = TrackKind::worker,
               std::string resource = {});
  // Thread-safe. Equal names give the same view, valid for the profiler's lifetime.
  std::string_view intern(std::string_view name);
  // steady_clock nanoseconds since a process-wide epoch.
  static std::int64_t now_ns() noexcept;
  // Owner thread of `track` only; lock-free. Requires end_ns >= start_ns
  // (asserted in debug and sanitizer builds, clamped otherwise).
  void record(Track* track, const SpanInfo& span);
  void record(Track* track, std::string_view interned_name, std::uint64_t op_id, std::int64_t start_ns,
              std::int64_t end_ns) {
    record(track, SpanInfo{interned_name, op_id, start_ns, end_ns});
  }

  // Thread-safe (a short mutex; call while running()). A counter sample, e.g.
  // "memory in use" of a device's allocator, shown as a counter track.
  void counter(Device device, std::string_view name, std::int64_t value);
  // Thread-safe (a short mutex; engines call it at push while running()). The
  // accesses of each op, in push order: the dependency graph for write_dot.
  struct VarUse {
    std::uint64_t key = 0;   // unique over the engine's life (id and generation)
    std::string_view name;   // interned; empty: "v<id>"
    bool write = false;      // a variable read and written is a write
  };
  struct PushRecord {
    std::uint64_t op_id = 0;
    std::string_view name;  // interned
    Device device;
    std::vector<VarUse> vars;
  };
  void record_push(PushRecord push);
  // Thread-safe (engines call it when a variable is named while profiling). A name given to a variable
  // after ops using it were recorded: the trace, the graph and the table
  // show the latest name. `key` as in VarUse.
  void record_var_name(std::uint64_t key, std::string_view name);
  // The graph the engine built from the recorded pushes: one node per op,
  // an edge for each dependency (read after write, write after read or
  // write), labelled with the variable; nodes coloured by device. Graphviz DOT.
  void write_dot(std::ostream& os) const;
  void dump_dot(const std::string& path) const;  // throws weft::Error naming the path

 private:
  struct Impl;
  std::atomic<bool> running_{false};  // read on the engine's hot path: kept inline
  std::unique_ptr<Impl> impl_;
};

inline bool Profiler::running() const noexcept { return running_.load(std::memory_order_relaxed); }

}  // namespace weft
