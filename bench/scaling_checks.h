// Validation checks of the simulated-GPU mode against what is known in
// closed form, run by weft-bench-scaling: each check runs real engine work on
// simulated GPUs under the modeled mode and compares its predicted time (or
// bubble fraction) with the formula's. The caller has set the mode
// (gpu::set_sim_model) with enough simulated GPUs for the largest check; each
// check sets the nodes it needs and restores the caller's options.
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace weft_bench {

struct ValidationCheck {
  std::string check;     // e.g. "ring_allreduce gpus=8 nodes=1 bytes=67108864"
  std::string unit;      // "ms", "fraction"
  double expected = 0;   // the formula's
  double measured = 0;   // the simulator's prediction
  double tolerance = 0;  // the target: relative error (or, for "fraction", absolute difference) allowed
  bool at_most = false;  // a bound: holds when measured <= expected + tolerance ("fraction")
  double relative_error() const { return expected != 0 ? std::abs(measured - expected) / std::abs(expected) : 0; }
  bool holds() const {
    if (at_most) return measured <= expected + tolerance;
    return unit == "fraction" ? std::abs(measured - expected) <= tolerance : relative_error() <= tolerance;
  }
};

// A ring allreduce of S bytes over N simulated GPUs against
// 2(N-1)/N * S / link bandwidth + 2(N-1) * link latency: N = 2, 4, 8 in one
// node (NVLink; plus the N-1 reduce-scatter adds on the ring's path) and
// N = 16, 64 over nodes of 8 (the NIC is the ring's slowest link).
// Tolerance 0.10.
std::vector<ValidationCheck> ring_allreduce_checks(double dilation);

// GPipe and 1F1B with K = 4 and 8 balanced stages and M = 8 and 32
// micro-batches. Weft splits a stage's backward into the input gradient
// (sent at once) and the weight gradient, so its bubble is
// (K-1)(F+B) / (M(F+B+W) + (K-1)(F+B)), 2(K-1)/(3M+2K-2) when forward, input
// gradient and weight gradient cost alike (Dense stages): one check against
// that (tolerance 0.03, absolute), and one that the bubble is at most the
// unsplit schedule's (K-1)/(M+K-1) (+ 0.03).
std::vector<ValidationCheck> pipeline_bubble_checks(double dilation);

}  // namespace weft_bench
