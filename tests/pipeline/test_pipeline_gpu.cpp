// Pipelines on GPUs (simulated in CI): LeNet split over two GPUs (one on a
// one-GPU machine: both stages on gpu(0)), and over a CPU device and a GPU,
// gives the parameters of the unpipelined model after two steps, for GPipe
// and 1F1B with recomputation; activations and gradients cross devices as
// copies on the copy streams. Tolerance 1e-4 of the magnitude: cuDNN and
// cuBLAS sum in another order than the CPU on a real GPU. In bf16 and fp16
// (loss scaling) over two GPUs: one device in the same precision within
// 1e-3, and an Inf in stage 0's gradients skipped on both GPUs alike. Naive engine and
// threaded at 1, 2, 4, 8 workers and streams.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "data_parallel/data_parallel_util.h"
#include "pipeline/pipeline_precision_util.h"
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

TEST_CASE("gpu pipeline - bf16 and fp16 with loss scaling over two GPUs equal one device, and an Inf skips on both" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  const std::vector<Batch> batches = lenet_batches(2, 12);
  const Device second = weft::gpu::device_count() > 1 ? Device::gpu(1) : Device::gpu(0);
  gputest::with_each_gpu_engine(std::min(weft::gpu::device_count(), 2), [&](Engine& e) {
    for (weft::Precision p : {weft::Precision::bf16, weft::Precision::fp16}) {
      const std::optional<par::LossScaling> ls =
          p == weft::Precision::fp16 ? std::optional<par::LossScaling>(par::LossScaling{.init_scale = 1024.0f}) : std::nullopt;
      const pipe_precision::Trained want = pipe_precision::train_one_device(e, lenet_model(), batches, p, ls, 0.1f);
      const auto want_values = values_of(*want.net);
      const std::string what = std::string(weft::to_string(p)) + " on gpu(0)," + second.str();
      INFO(what);
      auto net = lenet_model()(e, Device::cpu(0), 0);
      par::Pipeline pipe(e, *net, {.balance = {4, 6}, .devices = {Device::gpu(0), second}, .chunks = 3,
                                   .schedule = "zb-h1", .precision = p, .loss_scaling = ls});
      for (const Batch& b : batches) {
        CHECK(std::isfinite(pipe.train_step(Tensor::from_host(e, b.x_shape, b.x),
                                            Tensor::from_host(e, Shape{b.x_shape[0]}, b.y))
                                .item()));
        pipe.step(0.1f);
      }
      const auto got = values_of(*net);
      REQUIRE(got.size() == want_values.size());
      // |got - want| / max(1, |want|), as the CPU devices' case: a half's
      // rounding is relative to the activations, not to each small weight.
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        REQUIRE(got[i].size() == want_values[i].size());
        for (std::size_t j = 0; j < got[i].size(); ++j)
          worst = std::max(worst, std::abs(static_cast<double>(got[i][j]) - want_values[i][j]) /
                                      std::max(1.0, std::abs(static_cast<double>(want_values[i][j]))));
      }
      CHECK(worst < 1e-3);
      CHECK(pipe.loss_scale(0) == want.scale);
      CHECK(pipe.loss_scale(1) == want.scale);
    }
    // An Inf in stage 0's first weight gradient only: both GPUs skip, both scales halve.
    auto mlp = mlp_model()(e, Device::cpu(0), 0);
    pipe_precision::zero_first_column(*mlp);
    par::Pipeline pipe(e, *mlp, {.balance = {2, 3}, .devices = {Device::gpu(0), second}, .chunks = 3,
                                 .loss_scaling = par::LossScaling{.init_scale = 65536.0f}});
    const auto before = values_of(*mlp);
    const Batch bad = pipe_precision::overflowing_batch(6);
    (void)pipe.train_step(Tensor::from_host(e, bad.x_shape, bad.x), Tensor::from_host(e, Shape{6}, bad.y));
    pipe.step(0.1f);
    CHECK(values_of(*mlp) == before);
    for (int rank = 0; rank < 2; ++rank) {
      CHECK(pipe.loss_scale(rank) == 32768.0f);
      CHECK(pipe.skipped_steps(rank) == 1);
    }
  });
}
