#include "gpu_spans.h"

#include <cmath>

namespace weft::detail {

std::unique_ptr<gpu::TimingEvent> GpuSpanRecorder::take_event() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      auto e = std::move(free_.back());
      free_.pop_back();
      return e;
    }
  }
  return std::make_unique<gpu::TimingEvent>(device_);
}

void GpuSpanRecorder::begin(CUstream_st* stream) {
  open_ = take_event();
  open_->record(stream);
}

void GpuSpanRecorder::end(CUstream_st* stream, const SpanInfo& info) {
  if (!open_) return;  // profiling started while the op ran
  auto stop = take_event();
  stop->record(stream);
  std::lock_guard lock(mutex_);
  pending_.push_back(Pending{std::move(open_), std::move(stop), info});
}

void GpuSpanRecorder::resolve(Profiler& profiler, CUstream_st* stream) {
  std::lock_guard lock(mutex_);
  if (pending_.empty()) return;
  gpu::TimingEvent reference(device_);
  reference.record(stream);
  reference.synchronize();
  const std::int64_t host_ns = Profiler::now_ns();
  auto ns_before_reference = [&](const gpu::TimingEvent& e) {
    return static_cast<std::int64_t>(std::llround(static_cast<double>(reference.ms_since(e)) * 1e6));
  };
  std::vector<Pending> later;  // recorded after the reference was taken: next time
  for (Pending& p : pending_) {
    if (!p.end->done()) {
      later.push_back(std::move(p));
      continue;
    }
    SpanInfo span = p.info;
    span.start_ns = host_ns - ns_before_reference(*p.start);
    span.end_ns = std::max(span.start_ns, host_ns - ns_before_reference(*p.end));
    profiler.record(track_, span);
    free_.push_back(std::move(p.start));
    free_.push_back(std::move(p.end));
  }
  pending_ = std::move(later);
}

}  // namespace weft::detail
