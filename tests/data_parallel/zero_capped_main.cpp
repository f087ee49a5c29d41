// A model whose unsharded AdamW training needs three times a GPU's memory,
// on four simulated GPUs capped by WEFT_SIM_GPU_MEMORY (a capacity fixed when
// the backend starts: this binary of its own is ctest's
// gpu.zero_memory.capped, run with WEFT_SIM_GPUS=4 WEFT_SIM_GPU_MEMORY=10M):
// unsharded it fails with OutOfMemory, on one GPU and on four; it trains with
// stage 3 on four GPUs and with offload on one, each GPU within the cap, to
// the weights of unsharded training on an uncapped CPU device (bit for bit
// offloaded, within 1e-5 on four members).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "data_parallel/zero_memory_util.h"
#include "engine/engine_test_util.h"
#include "gpu_test_util.h"
#include "weft/checkpoint.h"

using namespace zero_test;
using weft_test::contains;
using weft_test::error_of;

TEST_CASE("gpu zero memory - a model three times a GPU's memory trains with stage 3 and with offload" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  const std::size_t cap = weft::gpu::properties(0).memory_bytes;
  if (!weft::gpu::properties(0).simulated || cap > (std::size_t{64} << 20) || weft::gpu::device_count() < 4) {
    std::printf("[weft-skip] needs four simulated GPUs of at most 64 MiB (WEFT_SIM_GPU_MEMORY=10M "
                "WEFT_SIM_GPUS=4, as gpu.zero_memory.capped runs it)\n");
    return;
  }
  // Dense layers sized so that unsharded AdamW training (16 bytes per
  // parameter) needs at least three times the cap.
  constexpr int kLayers = 24;
  std::int64_t width = 64;
  while (16.0 * kLayers * static_cast<double>(width * width + width) < 3.0 * static_cast<double>(cap)) width += 16;
  const ModelFn model = wide_mlp_model(width, kLayers);
  const std::vector<Batch> batches = wide_mlp_batches(2, 8, width);
  MESSAGE("cap " << cap << " bytes per GPU; " << kLayers << " layers of " << width << "^2: unsharded AdamW needs "
                 << 16.0 * kLayers * static_cast<double>(width * width + width) << " bytes");
  auto e = gputest::make_engine({.cpu_devices = 1, .gpu_devices = 4});
  par::DataParallelOptions layers{.bucket_bytes = std::size_t{4} << 10};
  // The weights, read without gathering them on the capped GPUs: through a
  // checkpoint loaded into an unsharded copy on the CPU device.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("weft-zero-capped-" + std::to_string(::getpid()));
  auto weights_of = [&](par::DataParallel& dp, const optim::OptimizerOptions& opt) {
    dp.save_checkpoint(dir).wait();
    par::DataParallel cpu(*e, {Device::cpu(0)}, [&](Device d) { return model(*e, d, 0); },
                          zero_options(par::Shard::none, opt, layers));
    cpu.load_checkpoint(weft::checkpoint::Reader::open(dir));
    std::filesystem::remove_all(dir);
    return values_of(cpu.replica(0));
  };

  // Unsharded, on one GPU and on four: out of memory, named.
  for (int members : {1, 4}) {
    const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(1e-3f);
    const std::string message = error_of([&] {
      auto dp = data_parallel_run(*e, model, zero_gpus(members), batches, opt.lr, zero_options(par::Shard::none, opt, layers));
      e->wait_all();
    });
    INFO(message);
    CHECK(contains(message, "out of memory on gpu("));
    e->wait_all();
  }
  // Stage 3 on four GPUs (momentum SGD: the four members sum the batch in
  // another order, within 1e-5) and offload on one (AdamW, the same order:
  // bit for bit), against unsharded training on an uncapped CPU device.
  struct Run {
    optim::OptimizerOptions opt;
    par::Shard shard;
    int members;
    bool offload;
  };
  for (const Run& run : {Run{optim::OptimizerOptions::sgd(0.05f, 0.9f), par::Shard::parameters, 4, false},
                         Run{optim::OptimizerOptions::adamw(1e-3f), par::Shard::gradients, 1, true},
                         Run{optim::OptimizerOptions::adamw(1e-3f), par::Shard::parameters, 1, true}}) {
    const std::string what = zero_what(run.shard, static_cast<std::size_t>(run.members), run.opt) +
                             (run.offload ? ", offloaded" : "");
    INFO(what);
    e->wait_all();
    for (int r = 0; r < 4; ++r) e->allocator(Device::gpu(r)).reset_peak();
    auto ref = data_parallel_run(*e, model, {Device::cpu(0)}, batches, run.opt.lr,
                                 zero_options(par::Shard::none, run.opt, layers));
    par::DataParallelOptions options = zero_options(run.shard, run.opt, run.offload ? with_offload(layers) : layers);
    options.prefetch_layers = 0;
    auto dp = data_parallel_run(*e, model, zero_gpus(run.members), batches, run.opt.lr, options);
    e->wait_all();
    for (int r = 0; r < run.members; ++r) {
      const weft::MemoryStats m = weft::memory_stats(*e, Device::gpu(r));
      std::string roles;
      for (std::size_t k = 0; k < weft::kMemoryRoles; ++k)
        roles += std::string(k ? ", " : "") + std::string(weft::to_string(static_cast<MemoryRole>(k))) + " " +
                 std::to_string(m.peak_by_role[k]);
      MESSAGE(what << ": gpu(" << r << ") peak " << m.peak_in_use << " bytes of " << cap << " (" << roles << ")");
      CHECK(m.peak_in_use <= cap);
    }
    if (run.members == 1) zero_expect_bitwise(weights_of(*dp, run.opt), values_of(ref->replica(0)), what);
    else expect_close(weights_of(*dp, run.opt), values_of(ref->replica(0)), 1e-5, what);
  }
}
