// DataParallel's half-precision bucket reduction on 2 GPUs (simulated in
// CI): the scenarios of test_data_parallel_half.cpp. With two members NCCL
// too adds each pair of halves in float32 and rounds once, so the bucket's
// values are exact on real GPUs as well. Each scenario over the naive engine
// and the threaded one at 1, 2, 4 and 8 workers and streams.
#include <doctest/doctest.h>

#include <vector>

#include "data_parallel/half_reduction_util.h"
#include "gpu_test_util.h"

using namespace dp_half_test;

namespace {

std::vector<Device> two_gpus() { return {Device::gpu(0), Device::gpu(1)}; }

#define WEFT_REQUIRE_TWO_GPUS()                                                     \
  WEFT_REQUIRE_GPU();                                                               \
  if (weft::gpu::device_count() < 2) {                                              \
    std::printf("[weft-skip] the half-precision reduction needs two GPUs here\n");  \
    return;                                                                         \
  }

}  // namespace

TEST_CASE("gpu data parallel - the half-precision reduction of a bucket rounds each part, then the sum once" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_TWO_GPUS();
  gputest::with_each_gpu_engine(2, [](Engine& e) { check_bucket(e, two_gpus()); });
}

TEST_CASE("gpu data parallel - bf16 gradient reduction equals the float32 one within bf16 rounding" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_TWO_GPUS();
  gputest::with_each_gpu_engine(2, [](Engine& e) { check_training(e, two_gpus()); });
}

TEST_CASE("gpu data parallel - error feedback keeps the accumulated rounding error below the plain cast's" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_TWO_GPUS();
  gputest::with_each_gpu_engine(2, [](Engine& e) { check_error_feedback(e, two_gpus()); });
}
