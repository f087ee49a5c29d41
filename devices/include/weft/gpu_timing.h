// Events that keep time, for the profiler's GPU-side spans. Unlike the
// engine's completion events (weft/gpu_streams.h, created without timing,
// which makes them cheaper to record and wait on) these are only used while a
// profile is recorded. On simulated GPUs they read the host's steady clock
// when the stream reaches them, or in the modeled mode the stream's modeled
// clock. With the `none` backend, creating one throws.
#pragma once

#include "weft/gpu_streams.h"

namespace weft::gpu {

class TimingEvent {
 public:
  explicit TimingEvent(int device);  // created on `device`, whatever is current
  ~TimingEvent();
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;

  void record(Stream* stream);
  // Whether the work enqueued before the last record() has completed.
  bool done() const;
  void synchronize() const;
  // Milliseconds from `earlier` to this event; both recorded and done.
  float ms_since(const TimingEvent& earlier) const;
  // Simulated GPUs' modeled mode: when its stream reached it, in seconds on
  // the modeled timeline (gpu::modeled_now's clock); done. -1 otherwise.
  double modeled_time() const;
  int device() const noexcept { return device_; }

 private:
  NativeEvent* event_ = nullptr;
  int device_;
};

}  // namespace weft::gpu
