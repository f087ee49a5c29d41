// The threaded engine's in-flight bound: ops are counted in flight per push
// epoch from push to finish; a frontend blocks while the bound is reached;
// wait_all and the destructor drain. docs/design/engine-invariants.md,
// "Waiting and the in-flight bound".
#include <thread>

#include "threaded_engine.h"

namespace weft::detail {

namespace {

// The completion counter of the worker running on this thread.
struct WorkerCounter {
  const void* engine = nullptr;
  InflightCounts::Completions* counter = nullptr;
};
thread_local WorkerCounter tls_counter;

}  // namespace

template <class Pred>
void ThreadedEngine::wait_until(std::condition_variable& cv, std::atomic<std::int32_t>& waiters, Pred done) {
  std::unique_lock lock(wait_mutex_);
  waiters.fetch_add(1, std::memory_order_seq_cst);
  cv.wait(lock, done);
  waiters.fetch_sub(1, std::memory_order_relaxed);
}

void ThreadedEngine::enter_inflight(OpBlock* op) {
  const OpScope* parent = running_op_of(scope_key());
  if (parent) {
    // A follow-up joins its parent's epoch and never blocks: the worker that
    // would have to drain the backlog is the one pushing.
    op->epoch = parent->epoch;
  } else {
    // Workers never block on the bound either, even outside an op body (a
    // capture's destructor may push).
    if ((op->kind == OpKind::user || op->kind == OpKind::graph || op->kind == OpKind::bulk) &&
        tls_counter.engine != this) {
      // Counts read by other threads may be newer than `pushed`: differences
      // saturate at zero instead of wrapping into "over the bound".
      const std::uint64_t pushed = counts_.pushed_total();
      const std::uint64_t seen = completed_seen_.load(std::memory_order_relaxed);
      if (pushed > seen && pushed - seen >= config_.max_inflight) {
        const std::uint64_t completed = counts_.completed_total();
        completed_seen_.store(completed, std::memory_order_relaxed);
        // Wait for the backlog to fall well below the bound, so the frontend
        // sleeps once per many ops instead of trading the last slot back and
        // forth with the workers.
        if (pushed > completed && pushed - completed >= config_.max_inflight)
          wait_until(throttle_cv_, throttled_, [&] { return counts_.total() < resume_below_; });
      }
    }
    op->epoch = static_cast<std::uint8_t>(counts_.current_epoch());
  }
  counts_.add_pushed(op->epoch);
}

bool ThreadedEngine::drained() const noexcept {
  return closing_.load(std::memory_order_acquire) ? counts_.total() == 0
                                                 : counts_.pending(draining_epoch_.load(std::memory_order_acquire)) == 0;
}

void ThreadedEngine::leave_inflight(unsigned epoch) noexcept {
  InflightCounts::add_completed(tls_counter.engine == this ? tls_counter.counter : counts_.shared_completions(), epoch);
  // Pairs with wait_until's increment-then-check: it sees our count or we see it.
  const bool throttled = throttled_.load(std::memory_order_seq_cst) > 0;
  const bool draining = draining_.load(std::memory_order_seq_cst) > 0;
  if (!throttled && !draining) return;
  const bool wake_throttled = throttled && counts_.total() < resume_below_;
  const bool wake_draining = draining && drained();
  if (!wake_throttled && !wake_draining) return;
  std::lock_guard lock(wait_mutex_);
  if (wake_throttled) throttle_cv_.notify_all();
  if (wake_draining) drain_cv_.notify_all();
}

void ThreadedEngine::count_completions_in(std::size_t slot) noexcept {
  tls_counter = {this, counts_.completions_of(slot)};
}

void ThreadedEngine::drain_pushed_so_far() {
  std::lock_guard serial(wait_all_mutex_);  // one closes an epoch at a time
  unsigned closed;
  {
    std::lock_guard lock(wait_mutex_);
    closed = counts_.close_epoch();
    draining_epoch_.store(closed, std::memory_order_release);
  }
  wait_until(drain_cv_, draining_, [&] { return counts_.pending(closed) == 0; });
}

void ThreadedEngine::drain() noexcept {
  closing_.store(true, std::memory_order_seq_cst);
  wait_until(drain_cv_, draining_, [&] { return counts_.total() == 0; });
  // A thread that completed the last async op may still be leaving
  // complete_async; it touches the engine until it decrements this.
  while (external_finishers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

}  // namespace weft::detail
