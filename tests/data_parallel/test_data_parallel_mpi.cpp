// DataParallel across MPI processes (ctest runs this binary alone and under
// mpirun with 2 and 3 ranks; the GPU case under parallel_mpi.gpu_np2/3 on
// simulated GPUs): every rank reads the same whole batches and trains its
// share; the result equals one device trained on all of it (LeNet and the
// MLP, one and two devices per process, even and uneven splits), with and
// without no_sync; ranks with different numbers of batches agree on the
// smallest and all end the epoch; ranks whose models differ fail, naming the
// bucket plans of both sides, instead of hanging. Each scenario over the
// naive engine and the threaded one at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "data_parallel/data_parallel_util.h"
#include "mpi_test_util.h"
#include "weft/gpu.h"
#include "weft/profiler.h"

using namespace dp_test;
using weft_test::contains;

TEST_CASE("distributed data parallel: every rank's share of each batch equals one device with all of it" *
          doctest::timeout(300)) {
  const std::vector<Batch> mlp = mlp_batches(3, 13);
  const std::vector<Batch> lenet = lenet_batches(2, 12);
  weft_test::with_each_engine(2, [&](Engine& e) {
    const auto want_mlp = reference_run(e, mlp_model(), mlp, 0.1f);
    const auto want_lenet = reference_run(e, lenet_model(), lenet, 0.1f);
    for (const std::vector<Device>& devices :
         {std::vector<Device>{Device::cpu(0)}, std::vector<Device>{Device::cpu(0), Device::cpu(1)}})
      for (std::size_t bucket : {std::size_t{0}, std::size_t{25} << 20}) {
        // Under the sanitizers each device count with one bucket plan (the
        // four pairs cost ~28 s there): per-parameter buckets over two
        // devices, one bucket for everything over one.
        if (weft_test::kSanitized && (bucket == 0) != (devices.size() == 2)) continue;
        const std::string what = std::to_string(devices.size()) + " devices per process, bucket " + std::to_string(bucket);
        auto a = data_parallel_run(e, mlp_model(), devices, mlp, 0.1f, {.bucket_bytes = bucket, .distributed = true});
        auto b = data_parallel_run(e, lenet_model(), devices, lenet, 0.1f, {.bucket_bytes = bucket, .distributed = true});
        CHECK(a->world_size() == a->processes() * static_cast<int>(devices.size()));
        for (int r = 0; r < a->replicas(); ++r) {
          expect_close(values_of(a->replica(r)), want_mlp, 1e-5, "MLP, " + what + ", replica " + std::to_string(r));
          expect_close(values_of(b->replica(r)), want_lenet, 1e-5, "LeNet, " + what + ", replica " + std::to_string(r));
        }
      }
    mpi_test::sync_ranks(e);
  });
}

// Nodes of two ranks (CommunicatorOptions::ranks_per_node): an MLP of
// 0.4 M parameters in one bucket of 1.6 MB, above the hierarchy's 256 KiB,
// reduces in the node, on the rail and in the node again, and trains as one
// device with every batch does.
TEST_CASE("distributed data parallel: across whole nodes the hierarchical reduction equals one device" *
          doctest::timeout(300)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 2});
  const int n = par::Communicator::mpi(*e, Device::cpu(0)).size();
  if (n < 4 || n % 2 != 0) {
    std::printf("[weft-skip] hierarchical reduction: needs an even number of ranks, 4 or more (have %d)\n", n);
    mpi_test::sync_ranks(*e);
    return;
  }
  const ModelFn wide = [](Engine& en, Device d, std::uint64_t seed) { return nn::mlp(en, {20, 512, 512, 5}, d, seed); };
  const std::vector<Batch> batches = mlp_batches(2, 4 * n);
  const auto want = reference_run(*e, wide, batches, 0.1f);
  weft::Profiler::clear_notes();
  auto dp = data_parallel_run(*e, wide, {Device::cpu(0)}, batches, 0.1f,
                              {.distributed = true, .communicator = {.ranks_per_node = 2}});
  expect_close(values_of(dp->replica(0)), want, 1e-5, "MLP over nodes of 2 ranks");
  bool tiered = false;
  for (const auto& [key, text] : weft::Profiler::notes()) tiered = tiered || text.rfind("hierarchical", 0) == 0;
  CHECK(tiered);
  mpi_test::sync_ranks(*e);
}

TEST_CASE("distributed data parallel: no_sync across processes equals one step on the summed micro-batches" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = mlp_batches(4, 9, 21);
  weft_test::with_each_engine(2, [&](Engine& e) {
    auto want = reference_run(e, mlp_model(), {batches[0], batches[1]}, 0.05f, Device::cpu(0), true);
    auto dp = data_parallel_run(e, mlp_model(), {Device::cpu(0), Device::cpu(1)}, {batches[0], batches[1]}, 0.05f,
                                {.bucket_bytes = 700, .distributed = true}, 2);
    for (int r = 0; r < 2; ++r) expect_close(values_of(dp->replica(r)), want, 1e-5, "replica " + std::to_string(r));
    mpi_test::sync_ranks(e);
  });
}

TEST_CASE("distributed data parallel: ranks with different numbers of batches all end the epoch" * doctest::timeout(300)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    par::DataParallel dp(e, {Device::cpu(0)}, [&](Device d) { return nn::mlp(e, {20, 8, 5}, d, 0); },
                         {.distributed = true});
    // Rank r has 3 + 2r batches; every rank takes 3 steps.
    const std::int64_t mine = 3 + 2 * dp.process_rank();
    const std::int64_t steps = dp.agree_steps(mine);
    CHECK(steps == 3);
    const std::vector<Batch> batches = mlp_batches(static_cast<int>(mine), 2 * dp.world_size(), 40);
    for (std::int64_t s = 0; s < steps; ++s) {
      const Batch& b = batches[static_cast<std::size_t>(s)];
      std::vector<Tensor> x = dp.split_and_load(b.x_shape, b.x);
      std::vector<Tensor> y = dp.split_and_load(Shape{b.x_shape[0]}, b.y);
      std::vector<Tensor> logits = dp.forward(x);
      dp.backward({weft::ops::softmax_cross_entropy(logits[0], y[0]).dlogits});
      dp.step(0.1f);
    }
    const std::vector<Batch> common(batches.begin(), batches.begin() + 3);
    expect_close(values_of(dp.replica(0)), reference_run(e, [](Engine& en, Device d, std::uint64_t) {
                   return nn::mlp(en, {20, 8, 5}, d, 0);
                 }, common, 0.1f), 1e-5, "after the agreed steps");
    mpi_test::sync_ranks(e);
  });
}

TEST_CASE("distributed data parallel: ranks whose models differ fail naming both bucket plans" * doctest::timeout(300)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator world = par::Communicator::mpi(e, Device::cpu(0));
    if (mpi_test::alone(world.size())) return;  // (the same on every rank)
    const int rank = world.local_ranks().front();
    // Rank 1 calls its last layer "out": the same sizes, another plan.
    auto make = [&](Device d) {
      auto net = std::make_unique<nn::Sequential>();
      net->emplace<nn::Dense>(e, 4, 3, d, 1, nn::Init::kaiming_uniform, "fc1");
      net->emplace<nn::Dense>(e, 3, 2, d, 2, nn::Init::xavier_uniform, rank == 1 ? "out" : "fc2");
      return net;
    };
    // The first failure reaches a reader of the parameters, or wait_all.
    std::string err = "(no error)";
    try {
      par::DataParallel dp(e, {Device::cpu(0)}, make, {.bucket_bytes = 0, .distributed = true});
      for (nn::Parameter* p : dp.replica(0).parameters()) p->value.wait_to_read();
      e.wait_all();
    } catch (const weft::Error& x) {
      err = x.what();
    }
    INFO(err);
    CHECK(contains(err, "collectives differ across ranks"));
    CHECK(contains(err, "rank 0 called broadcast 'grad params bucket "));
    CHECK(contains(err, ": fc2."));
    CHECK(contains(err, "rank 1 called broadcast 'grad params bucket "));
    CHECK(contains(err, ": out."));
    try {
      e.wait_all();
    } catch (const weft::Error&) {  // (a second failed bucket, if the first was read above)
    }
    mpi_test::sync_ranks(e);
  });
}

TEST_CASE("distributed data parallel on GPU members: two GPUs per process equal one device" * doctest::timeout(600)) {
  if (weft::gpu::device_count() < 2) {
    std::printf("[weft-skip] fewer than 2 GPUs answer (WEFT_GPU_BACKEND=sim simulates them)\n");
    return;
  }
  const std::vector<Batch> batches = mlp_batches(2, 13, 31);
  for (int workers : {1, 4}) {
    INFO(workers << " workers and streams");
    auto e = Engine::create({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = workers, .gpu_devices = 2,
                             .compute_streams_per_gpu = workers});
    const auto want = reference_run(*e, mlp_model(), batches, 0.1f);
    auto dp = data_parallel_run(*e, mlp_model(), {Device::gpu(0), Device::gpu(1)}, batches, 0.1f,
                                {.bucket_bytes = 1024, .distributed = true});
    for (int r = 0; r < 2; ++r) expect_close(values_of(dp->replica(r)), want, 1e-5, "replica " + std::to_string(r));
    mpi_test::sync_ranks(*e);
  }
}
