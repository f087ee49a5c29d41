// Timing and the summary statistics the bench reports.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace weft_bench {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

struct Summary {
  double median = 0, min = 0, max = 0;
};

// The median rather than the mean: a 2-core machine with other load gives
// occasional outliers that would drag a mean around.
inline Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  return s;
}

// Two threads take turns on one atomic: each store is seen by the other side
// after one cache-line transfer, so a turn there and back is a round trip.
// A waiter that polls long yields, so that on a loaded machine (ctest -j) a
// descheduled partner costs a context switch rather than a time slice.
inline double core_round_trip_ns() {
  if (std::thread::hardware_concurrency() < 2) return 0;
  constexpr int kTrips = 100'000;
  auto await = [](const std::atomic<int>& turn, int value) {
    for (int polls = 0; turn.load(std::memory_order_acquire) != value; ++polls)
      if (polls > 4096) std::this_thread::yield();
  };
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    alignas(64) std::atomic<int> turn{0};
    std::thread other([&] {
      for (int i = 0; i < kTrips; ++i) {
        await(turn, 2 * i + 1);
        turn.store(2 * i + 2, std::memory_order_release);
      }
    });
    Stopwatch sw;
    for (int i = 0; i < kTrips; ++i) {
      turn.store(2 * i + 1, std::memory_order_release);
      await(turn, 2 * i + 2);
    }
    runs.push_back(sw.seconds() * 1e9 / kTrips);
    other.join();
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace weft_bench
