// KVStore's dist_sync kind across MPI processes (ctest runs this binary
// alone and under mpirun with 2 and 3 ranks; every rank runs the same cases
// in the same order): a push from two devices of every process sums over
// all of them, bit-exact; every process runs the updater on the same total,
// so all hold the same value; processes pushing different keys fail on
// every rank naming both, instead of hanging. Each scenario over the naive
// engine and the threaded one at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "mpi_test_util.h"
#include "weft/engine.h"
#include "weft/parallel/kvstore.h"
#include "weft/tensor.h"

namespace {

using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using weft_test::contains;
namespace par = weft::parallel;
using namespace std::chrono_literals;
using mpi_test::error_of;
using mpi_test::rank_tensor;
using mpi_test::reduced;
using mpi_test::require_values;
using mpi_test::sync_ranks;


// This process's two values: members 2 * rank and 2 * rank + 1 of the
// job's 2 * size, on cpu(0) and cpu(1).
std::vector<Tensor> two_values(Engine& e, int rank, std::int64_t count) {
  return {rank_tensor(e, 2 * rank, count, Device::cpu(0)), rank_tensor(e, 2 * rank + 1, count, Device::cpu(1))};
}

}  // namespace

TEST_CASE("dist_sync kvstore: a push sums every process's values, pull sees the total on every process" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    par::KVStore store(e, par::KVStoreKind::dist_sync);
    const int rank = store.rank(), n = store.num_workers();
    CHECK(store.kind() == par::KVStoreKind::dist_sync);
    for (std::int64_t count : {1, 13, 1003}) {
      INFO(count << " elements");
      const par::Key key = "grad." + std::to_string(count);
      store.init(key, Tensor::zeros(e, Shape{count}));
      for (int round = 0; round < 2; ++round) {  // assignment: the second push replaces the first
        store.push(key, two_values(e, rank, count));
        Tensor a = Tensor::empty(e, Shape{count}, Device::cpu(0)), b = Tensor::empty(e, Shape{count}, Device::cpu(1));
        store.pull(key, {a, b});
        for (const Tensor& out : {a, b})
          require_values(out.to_host(), count, [&](std::int64_t i) { return reduced(par::ReduceOp::sum, 2 * n, i); });
      }
    }
    CHECK(contains(store.str(), "dist_sync KVStore on cpu(0) across " + std::to_string(n) + " processes: 3 keys"));
    sync_ranks(e);
  });
}

TEST_CASE("dist_sync kvstore: every process runs the updater once per push, on the same total" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    par::KVStore store(e, par::KVStoreKind::dist_sync);
    const int rank = store.rank(), n = store.num_workers();
    const std::int64_t count = 257;
    // Every process starts from the same value and applies the same steps.
    store.init(0, rank_tensor(e, 0, count));
    std::atomic<int> calls{0};
    const par::Updater sgd = par::sgd_updater(0.5f);
    store.set_updater([&](const par::Key& key, const Tensor& merged, Tensor& stored) {
      ++calls;
      sgd(key, merged, stored);
    });
    std::vector<float> want(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) want[static_cast<std::size_t>(i)] = mpi_test::value(0, i);
    for (int step = 0; step < 3; ++step) {
      store.push(0, two_values(e, rank, count));
      for (std::int64_t i = 0; i < count; ++i)
        want[static_cast<std::size_t>(i)] -= 0.5f * reduced(par::ReduceOp::sum, 2 * n, i);
    }
    CHECK(calls == 3);
    Tensor out = Tensor::empty(e, Shape{count});
    store.pull(0, {out});
    require_values(out.to_host(), count, [&](std::int64_t i) { return want[static_cast<std::size_t>(i)]; });
    sync_ranks(e);
  });
}

TEST_CASE("dist_sync kvstore: processes pushing different keys fail on every rank, naming both" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 2});
  par::KVStore store(*e, par::KVStoreKind::dist_sync, {.communicator = {.timeout = 30s}});
  const int rank = store.rank();
  store.init("a", Tensor::zeros(*e, Shape{4}));
  store.init("b", Tensor::zeros(*e, Shape{4}));
  if (mpi_test::alone(store.num_workers())) return;
  const auto start = std::chrono::steady_clock::now();
  const par::Key mine = rank == 1 ? "b" : "a";
  store.push(mine, {Tensor::ones(*e, Shape{4})});
  Tensor out = Tensor::empty(*e, Shape{4});
  store.pull(mine, {out});
  const std::string message = error_of(out);
  MESSAGE("rank " << rank << ": " << message);
  CHECK(contains(message, "rank 0 called allreduce(sum) 'kvstore push a' [4] float32 as #1"));
  CHECK(contains(message, "rank 1 called allreduce(sum) 'kvstore push b' [4] float32 as #1"));
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  // The store still works once the processes agree again.
  store.push("a", {Tensor::ones(*e, Shape{4})});
  store.pull("a", {out});
  CHECK(out.to_host() == std::vector<float>(4, static_cast<float>(store.num_workers())));
  sync_ranks(*e);
}
