// Shared by the ZeRO tests on CPU devices, simulated GPUs and MPI ranks
// (test_zero*.cpp, test_dp_checkpoint*.cpp): weights read through
// FullParameters (stage 3 frees them between steps), a bitwise comparison, a
// small residual network, and a run of each shard setting beside Shard::none.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data_parallel/data_parallel_util.h"
#include "weft/optim.h"

namespace zero_test {

using namespace dp_test;
namespace optim = weft::optim;

// Replica r's parameters, gathered for the read under Shard::parameters.
inline std::vector<std::vector<float>> zero_weights(par::DataParallel& dp, int r = 0) {
  auto full = dp.full_parameters();
  return values_of(dp.replica(r));
}

// Bit for bit (the first differing element named).
inline void zero_expect_bitwise(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                                const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i].size() == want[i].size());
    for (std::size_t j = 0; j < got[i].size(); ++j)
      if (std::memcmp(&got[i][j], &want[i][j], sizeof(float)) != 0) {
        FAIL_CHECK(what << ": parameter " << i << " element " << j << " is " << got[i][j] << ", want "
                        << want[i][j]);
        return;
      }
  }
}

// conv -> BN -> ReLU -> two residual blocks (one with a projection) -> global
// average pooling -> dense; input [N, 1, 8, 8]. Batch norm's buffers and a
// leaf (Residual) with several layers' parameters.
inline std::unique_ptr<nn::Sequential> zero_residual_net(Engine& e, Device d, std::uint64_t seed) {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Conv2d>(e, 1, 4, 3, nn::Conv2dParams{.stride = 1, .pad = 1}, d, nn::derive_seed(seed, 0),
                           nn::Init::kaiming_uniform, "conv1");
  net->emplace<nn::BatchNorm>(e, 4, d, "bn1");
  net->emplace<nn::ReLU>();
  net->emplace<nn::Residual>(e, 4, 8, 2, true, d, nn::derive_seed(seed, 1), "layer1");
  net->emplace<nn::Residual>(e, 8, 8, 1, false, d, nn::derive_seed(seed, 2), "layer2");
  net->emplace<nn::GlobalAvgPool2d>();
  net->emplace<nn::Flatten>();
  net->emplace<nn::Dense>(e, 8, 10, d, nn::derive_seed(seed, 3), nn::Init::xavier_uniform, "fc");
  return net;
}
inline ModelFn zero_residual_model() {
  return [](Engine& e, Device d, std::uint64_t seed) { return zero_residual_net(e, d, seed); };
}
inline std::vector<Batch> zero_residual_batches(int steps, std::int64_t rows, std::uint64_t seed = 5) {
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) out.push_back(random_batch(rows, {1, 8, 8}, 10, seed + static_cast<std::uint64_t>(i)));
  return out;
}

// gpu(0), ..., gpu(n - 1).
inline std::vector<Device> zero_gpus(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.push_back(Device::gpu(i));
  return out;
}

inline par::DataParallelOptions zero_options(par::Shard shard, const optim::OptimizerOptions& opt,
                                             par::DataParallelOptions base = {}) {
  base.shard = shard;
  base.optimizer = opt;
  return base;
}

inline std::string zero_what(par::Shard shard, std::size_t members, const optim::OptimizerOptions& opt) {
  return "Shard::" + std::string(par::to_string(shard)) + ", " + std::to_string(members) + " members, " + opt.str();
}

}  // namespace zero_test
