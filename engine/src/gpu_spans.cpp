#include "gpu_spans.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "weft/gpu_sim.h"

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

void GpuSpanRecorder::begin(gpu::Stream* stream) noexcept {
  try {
    open_ = take_event();
    open_->record(stream);
  } catch (...) {
    open_.reset();
    std::lock_guard lock(mutex_);
    ++dropped_;
  }
}

void GpuSpanRecorder::end(gpu::Stream* stream, const SpanInfo& info) noexcept {
  if (!open_) return;  // profiling started while the op ran, or begin failed
  std::unique_ptr<gpu::TimingEvent> start = std::move(open_);
  try {
    {
      std::lock_guard lock(mutex_);
      if (pending_.size() >= kMaxPending) compact_completed();
      if (pending_.size() >= kMaxPending) {
        free_.push_back(std::move(start));
        ++dropped_;
        return;
      }
    }
    auto stop = take_event();
    stop->record(stream);
    std::lock_guard lock(mutex_);
    pending_.push_back(Pending{std::move(start), std::move(stop), info});
  } catch (...) {
    std::lock_guard lock(mutex_);
    ++dropped_;
  }
}

void GpuSpanRecorder::compact_completed() {
  std::size_t done = 0;
  try {
    free_.reserve(free_.size() + 2 * pending_.size());
    completed_.reserve(std::min(kMaxCompleted, completed_.size() + pending_.size()));
    for (; done < pending_.size() && completed_.size() < kMaxCompleted; ++done) {
      Pending& p = pending_[done];
      if (!p.end->done()) break;
      const float duration = p.end->ms_since(*p.start);
      if (!anchor_) {
        completed_.push_back(Completed{0.0f, duration, p.info});
        anchor_ = std::move(p.start);
      } else {
        completed_.push_back(Completed{p.start->ms_since(*anchor_), duration, p.info});
        free_.push_back(std::move(p.start));
      }
      free_.push_back(std::move(p.end));
    }
  } catch (...) {
    // A span whose timing failed is lost (its events with it); the rest stay pending.
    if (done < pending_.size()) {
      ++done;
      ++dropped_;
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
}

void GpuSpanRecorder::resolve(gpu::Stream* stream) {
  std::lock_guard lock(mutex_);
  if (dropped_ != dropped_reported_) {
    std::fprintf(stderr,
                 "weft: profiler: %lld GPU-side spans of gpu(%d) were dropped (events could not be created, or "
                 "%zu spans were still queued on one stream, or %zu completed ones waited for wait_all)\n",
                 static_cast<long long>(dropped_ - dropped_reported_), device_, kMaxPending, kMaxCompleted);
    dropped_reported_ = dropped_;
  }
  if (pending_.empty() && completed_.empty()) return;
  gpu::TimingEvent reference(device_);
  reference.record(stream);
  reference.synchronize();
  // Under the simulator's modeled mode the reference's own modeled time
  // places the spans (the host's clock may have moved past it).
  const double modeled = reference.modeled_time();
  const std::int64_t host_ns = modeled >= 0 ? profiler_ns_of_modeled(modeled) : Profiler::now_ns();
  auto ns = [](float ms) { return static_cast<std::int64_t>(std::llround(static_cast<double>(ms) * 1e6)); };
  if (anchor_) {
    const std::int64_t anchor_ns = host_ns - ns(reference.ms_since(*anchor_));
    for (const Completed& c : completed_) {
      SpanInfo span = c.info;
      span.start_ns = anchor_ns + ns(c.start_ms);
      span.end_ns = span.start_ns + std::max<std::int64_t>(0, ns(c.duration_ms));
      ProfilerRecorder::record(track_, span);
    }
    completed_.clear();
    free_.push_back(std::move(anchor_));
  }
  // Room for every event first: past this point only CUDA calls and
  // recording a span can throw, and each leaves the entry it was on pending.
  free_.reserve(free_.size() + 2 * pending_.size());
  std::size_t kept = 0;  // pending_[0, kept): recorded after the reference, for next time
  std::size_t i = 0;
  try {
    for (; i < pending_.size(); ++i) {
      Pending& p = pending_[i];
      if (!p.end->done()) {
        if (kept != i) pending_[kept] = std::move(p);
        ++kept;
        continue;
      }
      SpanInfo span = p.info;
      span.start_ns = host_ns - ns(reference.ms_since(*p.start));
      span.end_ns = span.start_ns + std::max<std::int64_t>(0, ns(p.end->ms_since(*p.start)));
      ProfilerRecorder::record(track_, span);
      free_.push_back(std::move(p.start));
      free_.push_back(std::move(p.end));
    }
  } catch (...) {
    for (; i < pending_.size(); ++i, ++kept)
      if (kept != i) pending_[kept] = std::move(pending_[i]);
    pending_.resize(kept);
    throw;
  }
  pending_.resize(kept);
}

}  // namespace weft::detail
