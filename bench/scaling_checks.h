// Validation checks of the simulated-GPU mode against what is known in
// closed form, run by weft-bench-scaling: each check runs real engine work on
// simulated GPUs under the modeled mode and compares its predicted time (or
// bubble fraction) with the formula's. The caller has set the mode
// (gpu::set_sim_model) with enough simulated GPUs for the largest check; each
// check sets the nodes it needs and restores the caller's options.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
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
  std::string source;    // where the expected figure comes from (a published measurement, a formula)
  double relative_error() const { return expected != 0 ? std::abs(measured - expected) / std::abs(expected) : 0; }
  bool holds() const {
    if (at_most) return measured <= expected + tolerance;
    return unit == "fraction" ? std::abs(measured - expected) <= tolerance : relative_error() <= tolerance;
  }
};

// A published all_reduce_perf (nccl-tests) result: bus bandwidth at a
// message size on DGX-class nodes.
struct PublishedBusBandwidth {
  int gpus, nodes;
  std::int64_t bytes;
  double busbw_gbps;  // GB/s, nccl-tests' busbw = algbw x 2(n-1)/n
  const char* source;
};
// A published data-parallel scaling figure: throughput on N GPUs over N x one GPU's.
struct PublishedScaling {
  const char* profile;  // the simulated node that stands for the measured one
  int gpus;
  std::int64_t batch_per_gpu;
  const char* precision;  // Weft's name for the math it ran in
  double efficiency;
  const char* source;
};
extern const PublishedBusBandwidth kNcclTests[];
extern const std::size_t kNcclTestsCount;
extern const PublishedScaling kResnet50Scaling[];
extern const std::size_t kResnet50ScalingCount;

// Each published all_reduce_perf figure against the simulator: an
// in-process allreduce of the same size over as many simulated GPUs of the
// caller's profile (DataParallel's choice of ring or hierarchy), its bus
// bandwidth from the profiler's GPU spans. Tolerance 0.15.
std::vector<ValidationCheck> nccl_tests_checks();

// A ring allreduce of S bytes over N simulated GPUs against
// 2(N-1)/N * S / link bandwidth + 2(N-1) * link latency: N = 2, 4, 8 in one
// node (NVLink; plus the N-1 reduce-scatter adds on the ring's path) and
// N = 16, 64 over nodes of 8 (the NIC is the ring's slowest link).
// Tolerance 0.10.
std::vector<ValidationCheck> ring_allreduce_checks();

// GPipe, 1F1B, ZB-H1 and interleaved 1F1B (v = 2) with K = 4 and 8
// balanced stages of Dense layers (forward, input gradient and weight
// gradient cost alike) and M = 2K and 32 micro-batches: each bubble against
// its theory (weft/parallel/metrics.h, predicted_bubble; tolerance 0.03,
// absolute), and at M = 2K ZB-H1's bubble over 1F1B's at most the theory's
// (3K-1)/(7K-1) (+ 0.05).
std::vector<ValidationCheck> pipeline_bubble_checks();

}  // namespace weft_bench
