// DataParallel on GPUs (simulated in CI): 2 GPUs with the batch split equal
// one GPU with all of it (LeNet and the MLP), a mix of a CPU device and GPUs
// (reduced through the host) equals the CPU reference, no_sync over GPUs
// equals the summed micro-batches, and the no-overlap baseline still gives
// the same values. Tolerance 1e-5: simulated GPUs run the CPU kernels; on
// real GPUs cuBLAS/cuDNN sum in another order. Each scenario over the naive
// engine and the threaded one at 1, 2, 4 and 8 workers and streams.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "data_parallel/data_parallel_util.h"

using namespace dp_test;

namespace {

// Two GPUs where there are (simulated: always); one on a one-GPU machine.
int available() { return std::min(weft::gpu::device_count(), 2); }

std::vector<Device> gpus(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.push_back(Device::gpu(i));
  return out;
}

}  // namespace

TEST_CASE("gpu data parallel - 2 GPUs with the batch split equal one GPU with all of it" * doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  const std::vector<Batch> mlp = mlp_batches(3, 10);
  const std::vector<Batch> lenet = lenet_batches(2, 8);
  gputest::with_each_gpu_engine(available(), [&](Engine& e) {
    const auto want_mlp = reference_run(e, mlp_model(), mlp, 0.1f, Device::gpu(0));
    const auto want_lenet = reference_run(e, lenet_model(), lenet, 0.1f, Device::gpu(0));
    for (std::size_t bucket : {std::size_t{0}, std::size_t{25} << 20})
      for (bool overlap : {true, false}) {
        const std::string what = "bucket " + std::to_string(bucket) + (overlap ? "" : ", no overlap");
        auto a = data_parallel_run(e, mlp_model(), gpus(available()), mlp, 0.1f, {.bucket_bytes = bucket, .overlap = overlap});
        auto b = data_parallel_run(e, lenet_model(), gpus(available()), lenet, 0.1f, {.bucket_bytes = bucket, .overlap = overlap});
        for (int r = 0; r < available(); ++r) {
          expect_close(values_of(a->replica(r)), want_mlp, 1e-5, "MLP, " + what + ", replica " + std::to_string(r));
          expect_close(values_of(b->replica(r)), want_lenet, 1e-5, "LeNet, " + what + ", replica " + std::to_string(r));
        }
      }
  });
}

TEST_CASE("gpu data parallel - a CPU device and two GPUs, reduced through the host, equal the CPU reference" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  const std::vector<Batch> batches = mlp_batches(3, 11);  // 4, 4 and 3 rows
  gputest::with_each_gpu_engine(available(), [&](Engine& e) {
    const auto want = reference_run(e, mlp_model(), batches, 0.1f);
    std::vector<Device> mixed = gpus(available());
    mixed.insert(mixed.begin(), Device::cpu(0));
    auto dp = data_parallel_run(e, mlp_model(), mixed, batches, 0.1f, {.bucket_bytes = 512});
    for (int r = 0; r < dp->replicas(); ++r) expect_close(values_of(dp->replica(r)), want, 1e-5, "replica " + std::to_string(r));
  });
}

TEST_CASE("gpu data parallel - no_sync over GPUs equals one step on the summed micro-batches" * doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  const std::vector<Batch> batches = mlp_batches(3, 8, 11);
  gputest::with_each_gpu_engine(available(), [&](Engine& e) {
    const auto want = reference_run(e, mlp_model(), batches, 0.05f, Device::gpu(0), /*accumulate=*/true);
    auto dp = data_parallel_run(e, mlp_model(), gpus(available()), batches, 0.05f, {.bucket_bytes = 1024}, 3);
    for (int r = 0; r < available(); ++r) expect_close(values_of(dp->replica(r)), want, 1e-5, "replica " + std::to_string(r));
  });
}
