// Start-up calibration of the busy work, so "1us" means about a microsecond
// per op on this machine (run by the sequential loop, i.e. with no runtime).
#pragma once

#include <cstdint>

#include "peer.h"

namespace weft_bench {

struct Calibration {
  std::uint64_t spin_iters_per_us = 0;
  // What the sequential loop then measures on the independent shape, ns/op.
  double empty_ns = 0, one_us_ns = 0, ten_us_ns = 0;
  // One cache line passed to another thread and back (median of a few runs;
  // 0 with one hardware thread). Handing ops between threads costs a few of
  // these, so empty-body figures from two machines compare only alongside it.
  double core_round_trip_ns = 0;
};

// `items` must hold at least kCalibrationItems values.
inline constexpr std::size_t kCalibrationItems = 20'000;
Calibration calibrate(Peer& sequential, std::uint64_t* items);

}  // namespace weft_bench
