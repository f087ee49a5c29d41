// Pipelines on GPUs (simulated in CI): LeNet split over two GPUs (one on a
// one-GPU machine: both stages on gpu(0)), and over a CPU device and a GPU,
// gives the parameters of the unpipelined model after two steps, for GPipe
// and 1F1B with recomputation; activations and gradients cross devices as
// copies on the copy streams. Tolerance 1e-4 of the magnitude: cuDNN and
// cuBLAS sum in another order than the CPU on a real GPU. Naive engine and
// threaded at 1, 2, 4, 8 workers and streams.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "data_parallel/data_parallel_util.h"
#include "weft/parallel/pipeline.h"

using namespace dp_test;

TEST_CASE("gpu pipeline - LeNet over two GPUs, and a CPU device and a GPU, equals one device" * doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  const std::vector<Batch> batches = lenet_batches(2, 10);
  const Device second = weft::gpu::device_count() > 1 ? Device::gpu(1) : Device::gpu(0);
  gputest::with_each_gpu_engine(std::min(weft::gpu::device_count(), 2), [&](Engine& e) {
    const auto want = reference_run(e, lenet_model(), batches, 0.1f, Device::cpu(0));
    for (const std::vector<Device>& devices : {std::vector<Device>{Device::gpu(0), second},
                                               std::vector<Device>{Device::cpu(0), Device::gpu(0)}})
      for (const char* schedule : {"gpipe", "1f1b"}) {
        const std::string what = std::string(schedule) + " on " + devices[0].str() + "," + devices[1].str();
        INFO(what);
        auto net = lenet_model()(e, Device::cpu(0), 0);
        par::Pipeline pipe(e, *net,
                           {.balance = {4, 6}, .devices = devices, .chunks = 3,
                            .checkpoint = par::Checkpoint::except_last, .schedule = schedule});
        for (const Batch& b : batches) {
          const Tensor x = Tensor::from_host(e, b.x_shape, b.x);
          const Tensor y = Tensor::from_host(e, Shape{b.x_shape[0]}, b.y);
          CHECK(std::isfinite(pipe.train_step(x, y).item()));
          pipe.step(0.1f);
        }
        CHECK(net->parameters().front()->value.device() == devices[0]);
        CHECK(net->parameters().back()->value.device() == devices[1]);
        const auto got = values_of(*net);
        REQUIRE(got.size() == want.size());
        for (std::size_t i = 0; i < got.size(); ++i)
          gputest::expect_close_scaled(got[i], want[i], 1e-4, what + ", parameter " + std::to_string(i));
      }
  });
}
