// The engines' side of weft::Profiler: tracks, interned names, spans, pushes
// and counters. Internal to Weft (users only read a profiler: weft/profiler.h).
//
// Threading contract:
//   * track() and intern() are thread-safe (short mutexes); engines call them
//     at start-up and push time, not per span.
//   * record(track, ...) is called only by the thread that owns `track` (one
//     writer per track), takes no lock, and never moves spans already
//     recorded. Callers check Profiler::running() first; record() appends
//     whatever it is given.
//   * counter(), record_push() and record_var_name() are thread-safe (a short
//     mutex); engines call them while the profiler runs.
//   * Profiler::clear() requires quiescent writers (no record() in progress or
//     racing with it); tracks and interned names survive it.
// Storage: profiler_impl.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/device.h"
#include "weft/op_property.h"
#include "weft/profiler.h"

namespace weft::detail {

// One op as a track records it.
struct SpanInfo {
  std::string_view name;  // interned (ProfilerRecorder::intern)
  std::uint64_t op_id = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t push_ns = -1;       // when the op was pushed; -1: unknown
  std::uint64_t unblocked_by = 0;  // the op whose completion made it ready; 0: ready at push
  std::uint64_t bytes = 0;         // payload of a copy
  OpProperty property = OpProperty::normal;
};

// A single-writer buffer of spans (one per worker, stream or inline thread).
class ProfilerTrack;

// One variable of a recorded push.
struct VarUse {
  std::uint64_t key = 0;   // unique over the engine's life (id and generation)
  std::string_view name;   // interned; empty: "v<id>"
  bool write = false;      // a variable read and written is a write
};

// The accesses of one op, in push order: the dependency graph for write_dot.
struct PushRecord {
  std::uint64_t op_id = 0;
  std::string_view name;  // interned
  Device device;
  std::vector<VarUse> vars;
  std::string_view shape;  // interned; OpOptions::shape, empty when not given
};

// Profiler::now_ns's value for a time on the simulator's modeled timeline
// (seconds, gpu::modeled_now's clock).
std::int64_t profiler_ns_of_modeled(double seconds) noexcept;

class ProfilerRecorder {
 public:
  explicit ProfilerRecorder(Profiler& profiler) noexcept : profiler_(profiler) {}

  // The same (device, index) gives the same track (the first label wins;
  // empty: "<device> worker <index>"); the pointer stays valid for the
  // profiler's lifetime, across clear(). Throws weft::Error for index < 0.
  // `resource` groups tracks in the summary (empty: "<device> workers").
  ProfilerTrack* track(Device device, int index, std::string label, TrackKind kind = TrackKind::worker,
                       std::string resource = {});
  // Equal names give the same view, valid for the profiler's lifetime.
  std::string_view intern(std::string_view name);
  // Owner thread of `track` only; lock-free. Requires end_ns >= start_ns
  // (asserted in debug and sanitizer builds, clamped otherwise).
  static void record(ProfilerTrack* track, const SpanInfo& span);
  static void record(ProfilerTrack* track, std::string_view interned_name, std::uint64_t op_id,
                     std::int64_t start_ns, std::int64_t end_ns) {
    record(track, SpanInfo{interned_name, op_id, start_ns, end_ns});
  }

  // A counter sample, e.g. "memory in use" of a device's allocator, shown as
  // a counter track.
  void counter(Device device, std::string_view name, std::int64_t value);
  // A device allocator's bytes in use, in all and by role: the "memory in
  // use" and "memory by role" counter tracks and the summary's peaks.
  void memory(Device device, std::size_t in_use, const MemoryByRole& by_role);
  // An op's accesses at its push.
  void record_push(PushRecord push);
  // A name given to a variable after ops using it were recorded: the trace,
  // the graph and the table show the latest name. `key` as in VarUse.
  void record_var_name(std::uint64_t key, std::string_view name);

 private:
  Profiler& profiler_;
};

}  // namespace weft::detail
