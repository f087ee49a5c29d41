// weft::Profiler — what an engine's ops did and when: one span per op on
// every worker and GPU stream, written as a chrome://tracing (Perfetto) JSON
// trace, summarized per op name, per named variable and per resource (busy
// time, compute/copy and device/device overlap), and the dependency graph of
// the recorded pushes as Graphviz DOT. Engine::profiler() gives an engine's.
//
// start/stop/running: any thread, any time; while stopped, recording costs
// the engine one relaxed load per op. Read (dump, write_trace, spans,
// summarize, aggregate*, summary_table, write_dot) after Engine::wait_all(),
// or after stop() once the ops in flight have finished; read while ops still
// run, each track shows its spans so far, each whole or absent. clear() needs
// no op running. Trace schema: docs/trace-format.md; how the engines record:
// docs/design/engine-invariants.md, "Profiling".
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/allocator.h"
#include "weft/device.h"
#include "weft/op_property.h"

namespace weft {

namespace detail {
class ProfilerRecorder;
}

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

struct Span {
  std::string_view name;  // interned by the profiler: valid for its lifetime
  Device device;
  int track = 0;  // index within the device (worker; GPU: role * 100 + stream, launch tracks + 1000; inline 2000 + n)
  std::uint64_t op_id = 0;
  std::int64_t start_ns = 0;  // Profiler::now_ns() clock
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

// A device's most bytes in use while profiling (its allocator's, rounded
// to size classes), and what held them at that moment (weft/allocator.h).
struct MemoryPeak {
  Device device;
  std::size_t bytes = 0;
  double at_ms = 0;  // since the window's start
  MemoryByRole by_role{};
};

struct ProfileSummary {
  double window_ms = 0;  // earliest span start to latest span end
  std::vector<ResourceUsage> resources;
  Overlap compute_copy;          // compute spans vs copy spans (launch tracks excluded)
  std::vector<Overlap> devices;  // each pair of devices that ran ops
  std::vector<MemoryPeak> memory;  // per device whose allocator was used while profiling
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
  std::string summary_table() const;           // aggregate() as a printable table, then the notes

  // Notes: one line of text per key, process-wide, for choices a kernel
  // makes once per shape and that explain its times (the cuDNN algorithm of
  // each convolution geometry: its measured time and workspace). Kernels see
  // no engine, so the notes belong to no profiler: every summary_table()
  // prints them all, by key, under "notes:". A note replaces the one with the
  // same key. Any thread, any time.
  static void note(std::string key, std::string text);
  static std::vector<std::pair<std::string, std::string>> notes();  // (key, text), by key
  static void clear_notes();

  // steady_clock nanoseconds since a process-wide epoch: the clock of
  // Span::start_ns / end_ns / push_ns. Under simulated GPUs' modeled mode it
  // is the host's modeled clock, on the same timeline (weft/gpu_sim.h).
  static std::int64_t now_ns() noexcept;

  // The graph of the ops pushed while profiling: one node per op, an edge
  // for each dependency (read after write, write after read or write),
  // labelled with the variable; nodes coloured by device. Graphviz DOT.
  void write_dot(std::ostream& os) const;
  void dump_dot(const std::string& path) const;  // throws weft::Error naming the path

 private:
  friend class detail::ProfilerRecorder;  // the engines' recording side (internal)
  struct Impl;
  std::atomic<bool> running_{false};  // read on the engine's hot path: kept inline
  std::unique_ptr<Impl> impl_;
};

inline bool Profiler::running() const noexcept { return running_.load(std::memory_order_relaxed); }

}  // namespace weft
