// The communication thread: one per process, running one Boost.Fiber per
// collective in flight, so that a multi-step protocol (fingerprints, then
// the data phase, each polled with MPI_Test) is straight-line code and many
// collectives progress at once without blocking engine workers (internal to
// parallel/; docs/design/parallel-collectives.md).
//
// Fibers never leave this thread: other threads hand work in through
// spawn() (a mutex-guarded queue) and get results back through engine
// Completions or std::promise, so no fiber object is shared across threads.
// Polling fibers yield to one another; when a whole round made no progress
// for a while, the thread sleeps in short, growing steps (woken at once by
// new work, unless it can wait for the next step), so an idle wait on a slow
// peer does not burn a core. While every fiber waits for another thread to
// wake it (wait_woken: a blocking lane's call), the thread does not poll at
// all.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "weft/unique_function.h"

namespace weft::parallel::detail {

using Clock = std::chrono::steady_clock;

class CommThread {
 public:
  // The longest sleep while every fiber waits in wait_woken: how late such
  // a fiber may see its deadline. Tests make it long, so that a lost
  // wake-up shows.
  static constexpr std::chrono::milliseconds kQuietSleep{20};
  explicit CommThread(std::chrono::milliseconds quiet_sleep = kQuietSleep);
  ~CommThread();  // stop()
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Runs `body` as a new fiber on the thread. Any thread. False, with
  // `body` destroyed unrun, once stop() was called. A body that can wait
  // (`soon`: it only watches work already under way) does not cut short
  // the thread's sleep between polling rounds (at most kMaxSleep, or
  // kQuietSleep while every fiber is in wait_woken): the futex wake-up is
  // then off the caller's path.
  enum class Start { now, soon };
  bool spawn(UniqueFunction<void()> body, Start start = Start::now);
  // Fibers still running see stopping() and give up; then the thread ends.
  // Idempotent; not from the thread itself.
  void stop();
  bool on_this_thread() const noexcept { return std::this_thread::get_id() == thread_.get_id(); }
  // Cuts short a sleep between polling rounds: something a fiber polls
  // (the end of a blocking lane's call) just changed. Any thread.
  void wake();

  // ---- for fibers on the thread ----
  enum class Wait { done, timeout, stopping };
  // Yields to the other fibers until done() is true, the deadline passes,
  // or the process is stopping the thread. `cut`, where given, ends the
  // wait as its deadline would once another fiber of this thread sets it
  // (a peer declared dead by the heartbeat: the communicator's waits give
  // up at once instead of at the deadline).
  template <class Done>
  Wait poll_until(Done&& done, Clock::time_point deadline, const bool* cut = nullptr) {
    for (;;) {
      if (done()) {
        ++progress_;
        return Wait::done;
      }
      if (stopping_) return Wait::stopping;
      if (Clock::now() >= deadline || (cut && *cut)) return Wait::timeout;
      yield();
    }
  }
  // Like poll_until, for a condition whose changes are followed by
  // wake_if_quiet() from the thread that made them (a blocking lane's call
  // ending, mpi_lane.h), or by wake() where the fiber has work to do at once.
  // A change may go without either where seeing it late costs nothing but
  // the fiber's own cleanup (the lane skips it while calls are queued): the
  // fiber then sees it at the end of the quiet sleep. While every fiber on
  // the thread waits in one of these, the thread stops polling and sleeps until it is woken, new work
  // is spawned with Start::now, or kQuietSleep passes: polling then would
  // only take a core from the thread doing the work (on a machine with
  // fewer cores than threads, a wake-up every few hundred microseconds
  // preempts that thread). A deadline is then seen up to the quiet sleep
  // (kQuietSleep) late.
  template <class Done>
  Wait wait_woken(Done&& done, Clock::time_point deadline, const bool* cut = nullptr) {
    ++quiet_;
    struct Leave {
      int& quiet;
      ~Leave() { --quiet; }
    } leave{quiet_};
    return poll_until(std::forward<Done>(done), deadline, cut);
  }
  bool stopping() const noexcept { return stopping_; }

  // After changing what a wait_woken condition looks at: wakes the thread
  // if it sleeps quietly. The change must be stored before the call (a
  // fence here orders it before the look at the thread's state). Any thread.
  void wake_if_quiet();

 private:
  static void yield();
  void loop();
  // The loop's sleep while every fiber is in wait_woken; false if a last
  // round of polls found progress instead.
  bool sleep_quietly(std::uint64_t seen);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<UniqueFunction<void()>> queue_;  // guarded by mutex_
  bool stop_ = false;                         // guarded by mutex_
  bool woken_ = false;                        // guarded by mutex_: wake() since the last sleep
  bool idle_ = false;                         // guarded by mutex_: waiting for work, no fiber left
  std::atomic<int> queued_{0};                // queue_ (or stop_) changed since the thread last looked
  std::atomic<bool> quiet_asleep_{false};     // in sleep_quietly: wake_if_quiet() must wake it
  // Touched by the thread (its fibers) only.
  int live_ = 0;
  int quiet_ = 0;  // fibers in wait_woken
  const std::chrono::milliseconds quiet_sleep_;
  std::uint64_t progress_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

// Process-wide communication threads, each started at first use and
// stopped at exit (never deleted): one per purpose, so that one kind of
// fiber never waits behind another.
enum class ThreadPurpose { poll, nccl };
CommThread& process_thread(ThreadPurpose purpose);
// Fibers that only poll GPU events (the completion of in-process GPU
// collectives).
inline CommThread& poll_thread() { return process_thread(ThreadPurpose::poll); }

// Lets collectives through in sequence order: open(n) once 1..n-1 have all
// been passed. A number passed early (a collective that ended without
// posting, say) is kept until those before it pass, so a gate never opens
// past a collective still running. Fibers wait for it with poll_until; any
// thread may look and pass (an MPI hold op that begins its data phase
// itself, mpi_collectives.cpp).
class SequenceGate {
 public:
  bool open(std::uint64_t n) const noexcept { return next_.load(std::memory_order_acquire) >= n; }
  // n's turn now: 1..n-1 passed, n not yet.
  bool turn_of(std::uint64_t n) const noexcept { return next_.load(std::memory_order_acquire) == n; }
  void pass(std::uint64_t n) {
    std::lock_guard lock(mutex_);
    std::uint64_t next = next_.load(std::memory_order_relaxed);
    if (n < next) return;
    early_.insert(n);
    while (!early_.empty() && *early_.begin() == next) {
      early_.erase(early_.begin());
      ++next;
    }
    next_.store(next, std::memory_order_release);
  }

 private:
  std::mutex mutex_;
  std::atomic<std::uint64_t> next_{1};
  std::set<std::uint64_t> early_;  // guarded by mutex_: passed, waiting for the ones before
};

}  // namespace weft::parallel::detail
