// Shared by the ZeRO memory tests on CPU devices, simulated GPUs and MPI
// ranks (test_zero_memory*.cpp): a model whose training state outweighs its
// activations, and what ZeRO's accounting expects a member's allocator peak
// to be (the formula weft-bench-data-parallel prints as expected_bytes).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data_parallel/zero_util.h"

namespace zero_test {

using weft::MemoryRole;

// `layers` Dense layers of width x width: the state-dominated MLP.
inline ModelFn wide_mlp_model(std::int64_t width, int layers) {
  return [width, layers](Engine& e, Device d, std::uint64_t seed) {
    return nn::mlp(e, std::vector<std::int64_t>(static_cast<std::size_t>(layers) + 1, width), d, seed);
  };
}
inline std::vector<Batch> wide_mlp_batches(int steps, std::int64_t rows, std::int64_t width, std::uint64_t seed = 3) {
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i)
    out.push_back(random_batch(rows, {width}, static_cast<int>(std::min<std::int64_t>(width, 10)),
                               seed + static_cast<std::uint64_t>(i)));
  return out;
}

// The options with ZeRO-Offload to pinned host memory.
inline par::DataParallelOptions with_offload(par::DataParallelOptions options) {
  options.offload = Device::cpu_pinned(0);
  return options;
}

inline std::size_t role_of(const weft::MemoryStats& m, MemoryRole r) { return m.peak_by_role[static_cast<std::size_t>(r)]; }

// ZeRO's accounting for a member of `dp` at its peak (float32, `state`
// param-shaped optimizer tensors per parameter): parameters, gradients and
// optimizer state; stage 3's two gathered layers; one bucket in flight (in
// stages 2 and 3 its gradients and the flat they are packed into); plus
// `activations`, measured. With offload, what stays on the member's device.
inline double zero_expected_peak(const par::DataParallel& dp, par::Shard shard, bool offload, int state,
                                 double activations) {
  double psi = 0, largest = 0;
  for (const par::GradientBucket& b : dp.buckets()) {
    psi += static_cast<double>(b.elements);
    largest = std::max(largest, static_cast<double>(b.elements));
  }
  const double n = dp.world_size(), k = state, p = 4 * psi, bucket = 4 * largest;
  double model = 0;
  switch (shard) {
    case par::Shard::none: model = (2 + k) * p; break;
    case par::Shard::optimizer: model = offload ? 2 * p : 2 * p + k * p / n; break;
    case par::Shard::gradients: model = offload ? p : p + (1 + k) * p / n; break;
    case par::Shard::parameters: model = (offload ? p / n : (2 + k) * p / n) + 2 * bucket; break;
  }
  return model + (shard >= par::Shard::gradients ? 2 : 1) * bucket + activations;
}

}  // namespace zero_test
