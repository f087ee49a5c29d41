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
