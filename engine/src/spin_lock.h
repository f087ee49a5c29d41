// A one-byte test-and-test-and-set lock: a variable's dependency state and
// its GPU history.
//
// Why not tbb::spin_mutex: it retries the exchange itself while it waits, and
// every exchange takes the lock's line (which is the variable's whole state)
// away from the thread that holds it, which then stalls on its own next write
// there; after five retries it yields the core. Waiting here reads the line,
// which stays shared until the holder lets go. Measured on 2 and 16 cores of
// a Xeon (docs/performance.md,
// "Design choices"): with oneTBB's lock, trees of ops on 16 workers
// took 648 ns per op against 472 with this one (491 before either). After a
// while a waiter yields its core, as oneTBB's does, so that a preempted
// holder on an oversubscribed machine gets to run.
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WEFT_CPU_RELAX() _mm_pause()
#else
#define WEFT_CPU_RELAX() ((void)0)
#endif

namespace weft::detail {

class SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire)) {
      int spins = 0;
      do {
        if (++spins < kSpinsBeforeYield) {
          WEFT_CPU_RELAX();
        } else {
          std::this_thread::yield();
          spins = 0;
        }
      } while (held_.load(std::memory_order_relaxed));
    }
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  static constexpr int kSpinsBeforeYield = 256;
  std::atomic<bool> held_{false};
};

}  // namespace weft::detail
