#include "collectives/comm_thread.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <utility>

#include <boost/fiber/fiber.hpp>
#include <boost/fiber/fixedsize_stack.hpp>
#include <boost/fiber/operations.hpp>

namespace weft::parallel::detail {
namespace {
// MPI's progress engine runs on a fiber's stack inside MPI_Test.
constexpr std::size_t kFiberStack = 256 * 1024;
// Rounds without progress spin this long before the thread starts sleeping.
constexpr auto kSpin = std::chrono::microseconds(200);
// With nothing in flight, the thread looks for new work this long before it
// sleeps.
constexpr auto kIdleSpin = std::chrono::microseconds(50);
constexpr auto kMaxSleep = std::chrono::microseconds(500);
}  // namespace

CommThread::CommThread(std::chrono::milliseconds quiet_sleep) : quiet_sleep_(quiet_sleep), thread_([this] { loop(); }) {}

CommThread::~CommThread() { stop(); }

bool CommThread::spawn(UniqueFunction<void()> body, Start start) {
  bool notify = true;
  {
    std::lock_guard lock(mutex_);
    if (stop_) return false;  // `body` goes with this frame
    queue_.push_back(std::move(body));
    queued_.fetch_add(1, std::memory_order_release);
    // With fibers alive the thread polls or sleeps a bounded while; with
    // none it waits for this.
    notify = start == Start::now || idle_;
  }
  if (notify) wake_.notify_one();
  return true;
}

void CommThread::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    queued_.fetch_add(1, std::memory_order_release);  // the loop looks
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void CommThread::wake() {
  {
    std::lock_guard lock(mutex_);
    woken_ = true;
  }
  wake_.notify_one();
}

void CommThread::wake_if_quiet() {
  // Pairs with the fence in sleep_quietly: either this sees the flag, or
  // the thread's last round of polls sees the change made before this call.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (quiet_asleep_.load(std::memory_order_relaxed)) wake();
}

void CommThread::yield() { boost::this_fiber::yield(); }

bool CommThread::sleep_quietly(std::uint64_t seen) {
  quiet_asleep_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  yield();  // a change made before wake_if_quiet() could see the flag is seen here
  // Still every fiber in wait_woken: one whose wait ended without progress
  // (its deadline) may be polling something else now.
  const bool slept = progress_ == seen && quiet_ == live_ && queued_.load(std::memory_order_acquire) == 0;
  if (slept) {
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, quiet_sleep_, [&] { return stop_ || !queue_.empty() || woken_; });
    woken_ = false;
    if (stop_) stopping_ = true;
  }
  quiet_asleep_.store(false, std::memory_order_relaxed);
  return slept;
}

namespace {
template <ThreadPurpose P>
CommThread& started_once() {
  static CommThread* thread = [] {
    auto* t = new CommThread();  // never deleted: stopped at exit
    std::atexit([] { started_once<P>().stop(); });
    return t;
  }();
  return *thread;
}
}  // namespace

CommThread& process_thread(ThreadPurpose purpose) {
  return purpose == ThreadPurpose::poll ? started_once<ThreadPurpose::poll>() : started_once<ThreadPurpose::nccl>();
}

void CommThread::loop() {
  std::uint64_t seen = 0;
  Clock::time_point idle_since = Clock::now();
  for (;;) {
    std::deque<UniqueFunction<void()>> batch;
    if (live_ == 0) {
      // Nothing in flight: new work often follows at once (the next
      // collective on a tensor is pushed by the completion of this one), so
      // look for it a little while, giving the core away meanwhile, before
      // sleeping until spawn() wakes the thread.
      const Clock::time_point until = Clock::now() + kIdleSpin;
      while (queued_.load(std::memory_order_acquire) == 0 && Clock::now() < until) std::this_thread::yield();
      std::unique_lock lock(mutex_);
      idle_ = true;
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      idle_ = false;
    }
    if (queued_.load(std::memory_order_acquire) != 0 || live_ == 0) {
      std::lock_guard lock(mutex_);
      if (stop_) stopping_ = true;
      if (stop_ && queue_.empty() && live_ == 0) return;
      batch.swap(queue_);
      queued_.store(0, std::memory_order_relaxed);
    }
    for (auto& body : batch) {
      ++live_;
      boost::fibers::fiber(std::allocator_arg, boost::fibers::fixedsize_stack(kFiberStack),
                           [this, body = std::move(body)]() mutable {
                             body();
                             body = {};  // what it captured goes on this fiber, not later
                             --live_;
                             ++progress_;
                           })
          .detach();
    }
    yield();  // every ready fiber runs once
    if (!batch.empty() || progress_ != seen) {
      seen = progress_;
      idle_since = Clock::now();
    } else if (live_ > 0 && quiet_ == live_) {
      // Every fiber waits for another thread to wake it (a blocking lane's
      // call): nothing to poll.
      if (!sleep_quietly(seen)) {
        seen = progress_;
        idle_since = Clock::now();
      }
    } else if (const auto idle = Clock::now() - idle_since; idle > kSpin) {
      // Nothing progressed for a while (a peer is late): sleep a fraction
      // of the idle time, so that polling does not take the core the
      // others need; spawn() cuts the sleep short.
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock,
                     std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(idle / 16),
                                std::chrono::microseconds(5), kMaxSleep),
                     [&] { return stop_ || !queue_.empty() || woken_; });
      if (woken_) idle_since = Clock::now();  // a poll is about to succeed: no longer idle
      woken_ = false;
      if (stop_) stopping_ = true;
    } else {
      std::this_thread::yield();  // polling: let the engine's threads on this core run
    }
  }
}

}  // namespace weft::parallel::detail
