// DataParallel with ZeRO sharding across MPI processes (ctest runs this
// binary alone and under mpirun with 2 and 3 ranks): the members are every
// replica of every process, one or two devices per process. Each stage gives
// the weights of Shard::none with the same optimizer (stage 1 bit for bit:
// the same allreduce; stages 2 and 3 within 1e-5: the reduce-scatter sums
// in its own order), for the MLP and (in the Release build) LeNet; an Inf in one process's rows
// skips the step on every rank under every stage, and clipping's norm spans
// every rank's chunks. Each scenario over the naive engine and the threaded
// one at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "data_parallel/zero_util.h"
#include "engine/engine_test_util.h"
#include "mpi_test_util.h"

using namespace zero_test;

TEST_CASE("distributed zero: every stage gives Shard::none's weights across ranks (LeNet and MLP, 1 and 2 devices each)" *
          doctest::timeout(600)) {
  const std::vector<Batch> mlp = mlp_batches(3, 13);
  const std::vector<Batch> lenet = lenet_batches(2, 12);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(2e-3f);
  weft_test::with_each_engine(2, [&](Engine& e) {
    for (const std::vector<Device>& devices :
         {std::vector<Device>{Device::cpu(0)}, std::vector<Device>{Device::cpu(0), Device::cpu(1)}}) {
      const par::DataParallelOptions base{.bucket_bytes = std::size_t{64} << 10, .distributed = true};
      // LeNet in the Release build only: its convolutions under the
      // sanitizers cost CI minutes, and the MLP crosses the same code.
      std::vector<std::tuple<ModelFn, std::vector<Batch>, const char*>> models{{mlp_model(), mlp, "MLP"}};
      if (!weft_test::kSanitized) models.emplace_back(lenet_model(), lenet, "LeNet");
      for (const auto& [model, batches, name] : models) {
        auto ref = data_parallel_run(e, model, devices, batches, opt.lr, zero_options(par::Shard::none, opt, base));
        const auto want = zero_weights(*ref);
        for (par::Shard shard : {par::Shard::optimizer, par::Shard::gradients, par::Shard::parameters}) {
          auto dp = data_parallel_run(e, model, devices, batches, opt.lr, zero_options(shard, opt, base));
          CHECK(dp->world_size() == dp->processes() * static_cast<int>(devices.size()));
          for (int r = 0; r < dp->replicas(); ++r) {
            const std::string what = std::string(name) + ", " +
                                     zero_what(shard, static_cast<std::size_t>(dp->world_size()), opt) + ", rank " +
                                     std::to_string(dp->process_rank()) + " replica " + std::to_string(r);
            if (shard == par::Shard::optimizer)
              zero_expect_bitwise(zero_weights(*dp, r), want, what);
            else
              expect_close(zero_weights(*dp, r), want, 1e-5, what);
          }
        }
      }
    }
    mpi_test::sync_ranks(e);
  });
}

TEST_CASE("distributed zero: an Inf in one rank's rows skips the step everywhere, and clipping spans every rank" *
          doctest::timeout(300)) {
  std::vector<Batch> batches = mlp_batches(3, 12, 41);
  batches[1].x[0] = std::numeric_limits<float>::infinity();  // process 0's first row
  const optim::OptimizerOptions opt = optim::OptimizerOptions::sgd(0.1f, 0.9f);
  const par::DataParallelOptions base{.bucket_bytes = 600,
                                      .distributed = true,
                                      .loss_scaling = par::LossScaling{.init_scale = 1024.0f},
                                      .max_grad_norm = 0.05f};
  weft_test::with_each_engine(2, [&](Engine& e) {
    const std::vector<Device> devices{Device::cpu(0), Device::cpu(1)};
    auto ref = data_parallel_run(e, mlp_model(), devices, batches, opt.lr, zero_options(par::Shard::none, opt, base));
    const auto want = zero_weights(*ref);
    CHECK(ref->skipped_steps() == 1);
    for (par::Shard shard : {par::Shard::optimizer, par::Shard::gradients, par::Shard::parameters}) {
      auto dp = data_parallel_run(e, mlp_model(), devices, batches, opt.lr, zero_options(shard, opt, base));
      const std::string what = zero_what(shard, static_cast<std::size_t>(dp->world_size()), opt);
      CHECK_MESSAGE(dp->skipped_steps() == 1, what);
      CHECK_MESSAGE(dp->loss_scale() == 512.0f, what);
      for (int r = 0; r < dp->replicas(); ++r) expect_close(zero_weights(*dp, r), want, 1e-5, what);
    }
    mpi_test::sync_ranks(e);
  });
}
