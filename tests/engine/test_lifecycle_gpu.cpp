// Engine lifecycle on GPUs: destroying an engine drains its pending GPU work
// (ops queued behind a held tensor, copies between GPUs and back to the host)
// as it drains CPU work (test_lifecycle.cpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "weft/tensor_op.h"

using gputest::make_engine;
using weft::Completion;
using weft::Device;
using weft::EngineConfig;
using weft::RunContext;
using weft::Shape;
using weft::Tensor;
using weft::TensorData;

TEST_CASE("gpu lifecycle - destroying an engine with pending GPU work drains it" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  constexpr std::int64_t n = 1000;
  constexpr int kSteps = 64;
  const bool two_gpus = weft::gpu::device_count() >= 2;
  std::vector<float> data(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(static_cast<int>(i % 17) - 8);
  std::vector<float> want = data;
  for (float& v : want) v += 2 * kSteps;  // small integers: exact on every device

  std::vector<EngineConfig> configs{{.kind = "naive", .gpu_devices = two_gpus ? 2 : 1}};
  for (int workers : weft_test::worker_counts())
    configs.push_back({.kind = "threaded", .workers_per_cpu_device = workers, .gpu_devices = two_gpus ? 2 : 1,
                       .compute_streams_per_gpu = workers});
  for (EngineConfig cfg : configs) {
    INFO(cfg.kind << " engine, " << cfg.workers_per_cpu_device << " workers per device");
    const bool threaded = cfg.kind == "threaded";
    cfg.max_inflight = 1'000'000;  // everything queues behind the hold; nothing blocks the frontend
    std::vector<float> got;
    std::promise<Completion> held;
    std::thread opener;
    {
      auto e = make_engine(cfg);
      {
        Tensor x = Tensor::from_host(*e, Shape{n}, data, Device::gpu(0));
        // An async CPU op holds x until the opener completes it: every GPU op
        // below is still pending when the engine is destroyed.
        weft::push_tensor_op_async(Device::cpu(0), {}, {x},
                                   [&held, threaded](RunContext&, const TensorData&, Completion done) {
                                     if (threaded)
                                       held.set_value(std::move(done));
                                     else
                                       done();  // the naive engine's push returns once the op completed
                                   },
                                   {.name = "hold"});
        for (int i = 0; i < kSteps; ++i) x = x + 1.0f;
        if (two_gpus) x = x.copy_to(Device::gpu(1));
        for (int i = 0; i < kSteps; ++i) x = x + 1.0f;
        Tensor back = x.copy_to(Device::cpu(0));
        weft::push_tensor_op(Device::cpu(0), {back}, {}, [&got](RunContext&, const TensorData& d) {
          got.assign(d.in(0), d.in(0) + n);
        }, {.name = "read back"});
        if (threaded) {
          CHECK(e->inflight() >= static_cast<std::size_t>(2 * kSteps + 2));
          opener = std::thread([f = held.get_future()]() mutable { f.get()(); });
        }
      }  // every Tensor handle dropped, nothing waited on
      e.reset();  // the destructor must drain everything
      if (opener.joinable()) opener.join();
    }
    CHECK(got == want);
  }
}
