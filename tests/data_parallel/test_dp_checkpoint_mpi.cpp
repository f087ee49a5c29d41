// DataParallel checkpoints across MPI processes (ctest runs this binary
// alone and under mpirun with 2 and 3 ranks): every rank writes its shard
// (stage 3: its members' pieces of the parameters and the optimizer state)
// and rank 0 the index; the checkpoint loads into another member count and
// shard setting — two devices per process with stage 2, and one process
// alone, unsharded — and the continued run ends where the uninterrupted one
// ends (within 1e-5: the split differs). Each scenario over the naive
// engine and the threaded one at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "data_parallel/zero_util.h"
#include "engine/engine_test_util.h"
#include "mpi_test_util.h"
#include "weft/checkpoint.h"

using namespace zero_test;
namespace ckpt = weft::checkpoint;
namespace fs = std::filesystem;

namespace {

// A directory every rank names alike (rank 0's process id, broadcast).
fs::path dp_ckpt_mpi_dir(Engine& e) {
  const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
  const bool root = comm.local_ranks().front() == 0;
  Tensor id = Tensor::full(e, Shape{1}, root ? static_cast<float>(::getpid() % 1000000) : 0.0f, Device::cpu(0));
  par::broadcast(comm, {id}, {.name = "checkpoint directory"});
  return fs::temp_directory_path() /
         ("weft-dp-ckpt-mpi-" + std::to_string(static_cast<long long>(id.item())) + "-" + std::to_string(comm.size()));
}

}  // namespace

TEST_CASE("distributed dp checkpoint: each rank's shard and the index reload on another member count and shard "
          "setting" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = mlp_batches(4, 12, 23);
  const std::vector<Batch> first(batches.begin(), batches.begin() + 2), rest(batches.begin() + 2, batches.end());
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(0.01f);
  auto model = [](Engine& e) {
    return [&e](Device d) { return nn::mlp(e, {20, 32, 16, 5}, d, 3); };
  };
  weft_test::with_each_engine(2, [&](Engine& e) {
    const fs::path dir = dp_ckpt_mpi_dir(e);
    const par::DataParallelOptions base{.bucket_bytes = 700, .distributed = true};
    par::DataParallel whole(e, {Device::cpu(0)}, model(e), zero_options(par::Shard::none, opt, base));
    train_steps(whole, batches);
    const auto want = zero_weights(whole);
    {
      par::DataParallel a(e, {Device::cpu(0)}, model(e), zero_options(par::Shard::parameters, opt, base));
      train_steps(a, first);
      a.save_checkpoint(dir / "step-2").wait();
    }
    mpi_test::sync_ranks(e);  // rank 0's index is written
    const ckpt::Reader reader = ckpt::Reader::open(dir / "step-2");
    CHECK(reader.ranks() == whole.processes());
    {
      par::DataParallel b(e, {Device::cpu(0), Device::cpu(1)}, model(e), zero_options(par::Shard::gradients, opt, base));
      b.load_checkpoint(reader);
      train_steps(b, rest);
      for (int r = 0; r < 2; ++r) expect_close(zero_weights(b, r), want, 1e-5, "2 devices per process, Shard::gradients");
    }
    {
      // One process alone (not distributed), unsharded.
      par::DataParallel c(e, {Device::cpu(0)}, model(e), zero_options(par::Shard::none, opt, {.bucket_bytes = 700}));
      c.load_checkpoint(reader);
      CHECK(c.steps() == 2);
      train_steps(c, rest);
      expect_close(zero_weights(c), want, 1e-5, "one process, Shard::none");
    }
    mpi_test::sync_ranks(e);
    if (whole.process_rank() == 0) fs::remove_all(dir);
  });
}
