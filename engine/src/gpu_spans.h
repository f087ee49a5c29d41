// GPU-side spans: when a stream actually ran each op, timed with CUDA events.
//
// While the profiler runs, a GPU worker brackets each op's work with two
// timing events on its stream and queues the op's span. The host clock of
// those events is only known once they have completed, so the spans reach the
// profiler later: resolve() (called by wait_all and at shutdown, after the
// streams were synchronized) records a reference event, waits for it, reads
// the host clock, and places every completed span by its distance in GPU time
// from that reference. The error is the reference's host wake-up latency
// (microseconds), the same for all spans of one resolve.
//
// Precision: cudaEventElapsedTime gives float milliseconds, whose step grows
// with the distance measured (about 8 us at 100 s), so only a span's start is
// measured from the reference; its duration is end minus start, exact at any
// distance.
//
// Between resolves: a training loop may run an epoch of ops without wait_all
// (ResNet-18 on an H200: ~47,000 spans per stream). When kMaxPending spans
// wait on a stream, end() turns the completed ones (a prefix: one stream
// completes in order) into timings relative to an anchor, the first of them
// kept as an event, and gives their events back; resolve() places the anchor
// like any span and the timings after it. Such a timing's start has the
// float step of its distance from the anchor.
//
// Failures: begin/end never throw. Profiling must not change what an op does,
// so a span whose events cannot be created or recorded is dropped, and so is
// a span that finds kMaxPending unresolved ones on its stream still queued,
// or kMaxCompleted timings waiting (a program that never calls wait_all would
// otherwise hold them until exit); resolve() says how many on stderr.
//
// Threads: begin/end run on the owning worker; resolve on any thread (under
// the recorder's mutex, which also makes it the single writer of the stream
// track).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "profiler_recorder.h"
#include "weft/gpu_timing.h"

namespace weft::detail {

class GpuSpanRecorder {
 public:
  static constexpr std::size_t kMaxPending = std::size_t{1} << 14;
  static constexpr std::size_t kMaxCompleted = std::size_t{1} << 19;

  GpuSpanRecorder(int device, ProfilerTrack* stream_track) : device_(device), track_(stream_track) {}

  void begin(gpu::Stream* stream) noexcept;
  void end(gpu::Stream* stream, const SpanInfo& info) noexcept;
  // Throws what CUDA reports; the spans not yet placed stay pending.
  void resolve(gpu::Stream* stream);

 private:
  std::unique_ptr<gpu::TimingEvent> take_event();
  // Under mutex_: the completed prefix of pending_ into completed_.
  void compact_completed();

  struct Pending {
    std::unique_ptr<gpu::TimingEvent> start, end;
    SpanInfo info;
  };
  const int device_;
  ProfilerTrack* const track_;
  std::unique_ptr<gpu::TimingEvent> open_;  // begun, not yet ended (owning worker only)
  std::mutex mutex_;                        // guards what follows
  std::vector<Pending> pending_;
  struct Completed {
    float start_ms, duration_ms;  // start: from anchor_'s recording
    SpanInfo info;
  };
  std::unique_ptr<gpu::TimingEvent> anchor_;  // set while completed_ is not empty
  std::vector<Completed> completed_;
  std::vector<std::unique_ptr<gpu::TimingEvent>> free_;
  std::int64_t dropped_ = 0;           // spans lost so far
  std::int64_t dropped_reported_ = 0;  // the count resolve() last reported
};

}  // namespace weft::detail
