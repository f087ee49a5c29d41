#include "calibrate.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "measure.h"

namespace weft_bench {
namespace {

// The minimum over a few runs: the least disturbed one is closest to the
// body's own cost, which is what the calibration is after.
double min_ns_per_op(Peer& seq, const ShapeSpec& shape, const Body& body, std::uint64_t* items, int runs) {
  double best = 1e300;
  for (int r = 0; r < runs; ++r) {
    reset_items(items, shape.items);
    best = std::min(best, seq.run(shape, body, items) * 1e9 / static_cast<double>(shape.ops));
  }
  return best;
}

// Two threads take turns on one atomic: each store is seen by the other side
// after one cache-line transfer, so a turn there and back is a round trip.
// A waiter that polls long yields, so that on a loaded machine (ctest -j) a
// descheduled partner costs a context switch rather than a time slice.
double core_round_trip_ns() {
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

}  // namespace

Calibration calibrate(Peer& seq, std::uint64_t* items) {
  Calibration c;
  // First guess from the spin loop alone.
  double spin_ns = 1e300;
  for (int r = 0; r < 3; ++r) {
    Stopwatch sw;
    volatile std::uint64_t sink = spin(r, 1u << 22);
    (void)sink;
    spin_ns = std::min(spin_ns, sw.seconds() * 1e9 / (1u << 22));
  }
  double iters = 1000.0 / std::max(spin_ns, 0.01);

  // Then adjust with the real sequential loop, so the body's arithmetic and
  // the loop's own overhead are accounted for.
  const ShapeSpec shape = make_shape(ShapeKind::independent, kNominalOps / kCalibrationItems);
  c.empty_ns = min_ns_per_op(seq, shape, Body{"empty", 0, 1}, items, 5);
  for (int round = 0; round < 3; ++round) {
    const double ns = min_ns_per_op(seq, shape, Body{"1us", static_cast<std::uint64_t>(iters), 1}, items, 5);
    iters *= 1000.0 / std::max(ns - c.empty_ns, 1.0);
  }
  c.spin_iters_per_us = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(iters + 0.5));
  c.one_us_ns = min_ns_per_op(seq, shape, Body{"1us", c.spin_iters_per_us, 1}, items, 3);
  const ShapeSpec small = make_shape(ShapeKind::independent, kNominalOps / (kCalibrationItems / 10));
  c.ten_us_ns = min_ns_per_op(seq, small, Body{"10us", 10 * c.spin_iters_per_us, 1}, items, 3);
  c.core_round_trip_ns = core_round_trip_ns();
  return c;
}

}  // namespace weft_bench
