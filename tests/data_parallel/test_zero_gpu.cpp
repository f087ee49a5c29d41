// DataParallel with ZeRO sharding on GPUs (simulated in CI, with jitter):
// each stage gives Shard::none's weights with AdamW on 2 GPUs (LeNet and
// the residual network: bit for bit on simulated GPUs, whose reduce-scatter
// sums in the allreduce's order; within 1e-5 on real ones, where NCCL and
// cuDNN may sum in other orders), stage 3 keeps no full parameters between steps, and a
// mix of a CPU device and GPUs (no collective group) is refused for
// sharding. Each scenario over the naive engine and the threaded one at 1,
// 2, 4 and 8 workers and streams.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <vector>

#include "data_parallel/zero_util.h"
#include "engine/engine_test_util.h"
#include "gpu_test_util.h"

using namespace zero_test;

TEST_CASE("gpu zero: every stage on 2 GPUs gives Shard::none's weights (LeNet, residual network, AdamW)" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_GPUS(2);
  const std::vector<Batch> lenet = lenet_batches(2, 8);
  const std::vector<Batch> residual = zero_residual_batches(2, 6);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(1e-3f);
  gputest::with_each_gpu_engine(2, [&](Engine& e) {
    for (const auto& [model, batches, name] :
         {std::tuple{lenet_model(), lenet, "LeNet"}, std::tuple{zero_residual_model(), residual, "residual"}}) {
      const par::DataParallelOptions base{.bucket_bytes = std::size_t{16} << 10};
      auto ref = data_parallel_run(e, model, zero_gpus(2), batches, opt.lr, zero_options(par::Shard::none, opt, base));
      const auto want = zero_weights(*ref);
      for (par::Shard shard : {par::Shard::optimizer, par::Shard::gradients, par::Shard::parameters}) {
        auto dp = data_parallel_run(e, model, zero_gpus(2), batches, opt.lr, zero_options(shard, opt, base));
        for (int r = 0; r < 2; ++r) {
          const std::string what = std::string(name) + ", " + zero_what(shard, 2, opt) + ", replica " + std::to_string(r);
          if (weft::gpu::backend() == weft::gpu::Backend::sim)
            zero_expect_bitwise(zero_weights(*dp, r), want, what);
          else
            expect_close(zero_weights(*dp, r), want, 1e-5, what);
        }
        if (shard == par::Shard::parameters)
          for (nn::Parameter* p : dp->replica(1).parameters()) CHECK_MESSAGE(!p->value.defined(), p->name);
      }
    }
  });
}

TEST_CASE("gpu zero: sharding over a mix of a CPU device and a GPU is refused, naming the mix" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  gputest::with_each_gpu_engine(1, [&](Engine& e) {
    const std::string msg = weft_test::error_of([&] {
      par::DataParallel dp(e, {Device::cpu(0), Device::gpu(0)}, [&](Device d) { return nn::mlp(e, {4, 3}, d, 0); },
                           {.shard = par::Shard::optimizer});
    });
    CHECK(weft_test::contains(msg, "Shard::optimizer needs replicas on CPU devices only or GPUs only"));
  });
}
