// Collectives across MPI processes. ctest runs this binary alone (a group
// of one) and under mpirun with 2 and 3 ranks; every rank runs the same test
// cases in the same order, so the collectives of one case meet. Checked:
// every collective bit-exact against a serial reference (integer values in
// float) at sizes 0, 1, prime and not divisible by the group; many in flight
// whose inputs become ready in a different order on each rank; collectives
// interleaved with compute on the same tensors; a mismatch named on every
// rank; a rank that never joins named by the others within seconds; a
// failed input failing every rank; bad input refused at push time;
// bfloat16 and float16 reductions rounded once (half_values.h), and a dtype
// that differs across ranks named on every rank. Each
// scenario over the naive engine and the threaded one at 1, 2, 4 and 8
// workers.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collectives/half_values.h"
#include "engine/engine_test_util.h"
#include "mpi_test_util.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/ops.h"
#include "weft/parallel/collectives.h"
#include "weft/profiler.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"

namespace {

using weft::Device;
using weft_test::contains;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace par = weft::parallel;
using namespace std::chrono_literals;
using mpi_test::error_of;
using mpi_test::rank_tensor;
using mpi_test::reduced;
using mpi_test::require_values;
using mpi_test::sync_ranks;
using mpi_test::value;

const std::int64_t kSizes[] = {0, 1, 7, 13, 1003};

// Each scenario over the naive engine and the threaded one at 1, 2, 4 and 8
// workers per device.
// Every collective on `count` elements, against the serial reference.
void every_collective_exact(Engine& e, const par::Communicator& comm, std::int64_t count) {
  const int rank = comm.local_ranks()[0], n = comm.size();
  INFO("elements: " << count << ", ranks: " << n);
  std::vector<Tensor> sums, maxes, averages;
  for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
    Tensor t = rank_tensor(e, rank, count);
    par::allreduce(comm, {t}, op, {.name = "allreduce " + std::string(par::to_string(op))});
    (op == par::ReduceOp::sum ? sums : op == par::ReduceOp::max ? maxes : averages).push_back(t);
  }
  std::vector<Tensor> broadcasts, reductions;
  for (int root = 0; root < n; ++root) {
    Tensor b = rank_tensor(e, rank, count);
    par::broadcast(comm, {b}, {.name = "b", .root = root});
    broadcasts.push_back(b);
    Tensor r = rank_tensor(e, rank, count);
    par::reduce(comm, {r}, par::ReduceOp::sum, {.name = "r", .root = root});
    reductions.push_back(r);
  }
  const par::Chunk mine = par::chunk(count, n, rank);
  Tensor input = rank_tensor(e, rank, count);
  Tensor part = Tensor::zeros(e, Shape{mine.size()}, Device::cpu(0));
  par::reduce_scatter(comm, {input}, {part}, par::ReduceOp::sum, {.name = "rs"});
  std::vector<float> own(static_cast<std::size_t>(mine.size()));
  for (std::int64_t i = 0; i < mine.size(); ++i) own[static_cast<std::size_t>(i)] = value(rank, mine.begin + i);
  Tensor piece = Tensor::from_host(e, Shape{mine.size()}, own, Device::cpu(0));
  Tensor gathered = Tensor::zeros(e, Shape{count}, Device::cpu(0));
  par::all_gather(comm, {piece}, {gathered}, {.name = "ag"});
  par::barrier(comm);

  const auto s = sums[0].to_host(), m = maxes[0].to_host(), a = averages[0].to_host();
  const auto rs = part.to_host(), ag = gathered.to_host();
  for (std::int64_t i = 0; i < count; ++i) {
    const auto k = static_cast<std::size_t>(i);
    REQUIRE(s[k] == reduced(par::ReduceOp::sum, n, i));
    REQUIRE(m[k] == reduced(par::ReduceOp::max, n, i));
    REQUIRE(a[k] == reduced(par::ReduceOp::average, n, i));
    int owner = 0;  // the rank whose piece element i is
    while (i >= par::chunk(count, n, owner).end) ++owner;
    REQUIRE(ag[k] == value(owner, i));
  }
  for (std::int64_t i = 0; i < mine.size(); ++i)
    REQUIRE(rs[static_cast<std::size_t>(i)] == reduced(par::ReduceOp::sum, n, mine.begin + i));
  for (int root = 0; root < n; ++root) {
    const auto b = broadcasts[static_cast<std::size_t>(root)].to_host();
    const auto r = reductions[static_cast<std::size_t>(root)].to_host();
    for (std::int64_t i = 0; i < count; ++i) {
      const auto k = static_cast<std::size_t>(i);
      REQUIRE(b[k] == value(root, i));
      // The root holds the sum; the others' tensors are only read.
      REQUIRE(r[k] == (rank == root ? reduced(par::ReduceOp::sum, n, i) : value(rank, i)));
    }
  }
}

}  // namespace

TEST_CASE("a group of the processes of the MPI job" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 2});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(1));
  REQUIRE(comm.local_ranks().size() == 1);
  const int rank = comm.local_ranks()[0];
  CHECK(rank < comm.size());
  CHECK(comm.device(rank) == Device::cpu(1));
  CHECK(comm.str() == "MPI communicator of " + std::to_string(comm.size()) + (comm.size() == 1 ? " rank" : " ranks") +
                          " (rank " + std::to_string(rank) + " on cpu(1) here)");
  if (comm.size() > 1) CHECK_THROWS_WITH_AS(comm.device((rank + 1) % comm.size()), doctest::Contains("driven by another process"), weft::InvalidArgument);
  sync_ranks(*e);
}

TEST_CASE("every collective across processes is exact against a serial reference" * doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    for (std::int64_t count : kSizes) every_collective_exact(e, comm, count);
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

// 100,003 floats (400 KB, above the lane's 256 KiB): every data phase on
// the blocking lane (the lane does not depend on the engine: one engine
// suffices). Without a lane the same collectives are non-blocking on the
// communication thread, the path of the small sizes above, and large
// allreduces take Weft's ring (the next case; ctest's
// parallel_mpi.np2_no_lane runs that one with WEFT_MPI_LANE=0).
TEST_CASE("large collectives of every kind are exact (the blocking lane)" * doctest::timeout(240)) {
  auto e = Engine::create({.kind = "threaded", .workers_per_cpu_device = 2});
  {
    const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0));
    every_collective_exact(*e, comm, 100003);
  }
  sync_ranks(*e);
}

TEST_CASE("large allreduces are exact (the blocking lane; without it, Weft's ring, several segments per chunk)" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    for (std::int64_t count : {std::int64_t{65537}, std::int64_t{1100003}}) {
      INFO("elements: " << count << ", ranks: " << n);
      std::vector<Tensor> ts;
      for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
        Tensor t = rank_tensor(e, rank, count);
        par::allreduce(comm, {t}, op, {.name = "large"});
        ts.push_back(t);
      }
      int k = 0;
      for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
        require_values(ts[static_cast<std::size_t>(k++)].to_host(), count, [&](std::int64_t i) { return reduced(op, n, i); });
      }
    }
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

// CommunicatorOptions::ranks_per_node: nodes of two consecutive ranks.
// Allreduces of 256 KiB and more run as a reduce-scatter in the node, an
// allreduce on the rail and an all-gather in the node (the profile's notes
// say so), exact on values whose sums are exact in any order; smaller ones
// go to MPI whole. Ranks that do not fill whole nodes are refused by name.
TEST_CASE("across whole nodes large allreduces run hierarchically and are exact; small ones go whole" *
          doctest::timeout(240)) {
  auto e = Engine::create({.kind = "threaded", .workers_per_cpu_device = 2});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int n = world.size();
  if (n < 4 || n % 2 != 0) {
    if (n == 3)
      CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(0), {.ranks_per_node = 2}),
                           doctest::Contains("3 ranks do not fill nodes of 2"), weft::InvalidArgument);
    std::printf("[weft-skip] hierarchical allreduce: needs an even number of ranks, 4 or more (have %d)\n", n);
    sync_ranks(*e);
    return;
  }
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.ranks_per_node = 2});
  const int rank = comm.local_ranks()[0];
  weft::Profiler::clear_notes();
  for (std::int64_t count : {std::int64_t{1000}, std::int64_t{65536}, std::int64_t{1100003}}) {
    INFO("elements: " << count << ", ranks: " << n);
    for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
      Tensor t = rank_tensor(*e, rank, count);
      const std::string name = "tiered " + std::to_string(count) + " " + std::to_string(static_cast<int>(op));
      par::allreduce(comm, {t}, op, {.name = name});
      require_values(t.to_host(), count, [&](std::int64_t i) { return reduced(op, n, i); });
      bool tiered = false;
      for (const auto& [key, text] : weft::Profiler::notes())
        tiered = tiered || (key.find("'" + name + "'") != std::string::npos && text.rfind("hierarchical", 0) == 0);
      CHECK(tiered == (count * 4 >= 256 * 1024));
    }
  }
  sync_ranks(*e);
}

TEST_CASE("many collectives in flight, ready in a different order on each rank, interleaved with compute" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    constexpr int kTensors = 24;
    constexpr std::int64_t kCount = 257;
    std::mt19937 rng(static_cast<unsigned>(1234 + rank));  // a different readiness order on each rank
    std::vector<Tensor> ts;
    for (int k = 0; k < kTensors; ++k) {
      Tensor t = rank_tensor(e, rank, kCount, Device::cpu(k % 2));
      // A producer that takes a rank-dependent time: the collectives' inputs
      // become ready out of order, and MPI must still see them in push order.
      const auto delay = std::chrono::microseconds(rng() % 3000);
      weft::push_tensor_op(t.device(), {}, {t}, [delay, k](weft::RunContext&, const weft::TensorData& d) {
        std::this_thread::sleep_for(delay);
        d.out(0)[0] += static_cast<float>(k);
      }, {.name = std::string("produce ").append(std::to_string(k))});
      ts.push_back(t);
    }
    // Tensors on cpu(1) go through a communicator of their own device.
    const par::Communicator comm1 = par::Communicator::mpi(e, Device::cpu(1));
    for (int k = 0; k < kTensors; ++k) {
      const par::Communicator& c = k % 2 ? comm1 : comm;
      par::allreduce(c, {ts[static_cast<std::size_t>(k)]}, par::ReduceOp::sum, {.name = std::string("t").append(std::to_string(k))});
      // Compute on the result: waits for the collective, and the next
      // collective on it waits for this.
      Tensor& t = ts[static_cast<std::size_t>(k)];
      weft::push_tensor_op(t.device(), {}, {t}, [](weft::RunContext&, const weft::TensorData& d) {
        for (std::int64_t i = 0; i < kCount; ++i) d.out(0)[i] *= 2.0f;
      }, {.name = "double"});
      if (k % 3 == 0) par::allreduce(c, {t}, par::ReduceOp::max, {.name = std::string("again ").append(std::to_string(k))});
    }
    for (int k = 0; k < kTensors; ++k) {
      const auto v = ts[static_cast<std::size_t>(k)].to_host();
      for (std::int64_t i = 0; i < kCount; ++i) {
        float want = reduced(par::ReduceOp::sum, n, i) + (i == 0 ? static_cast<float>(n * k) : 0.0f);
        want *= 2.0f;  // max of equal values is the value
        REQUIRE(v[static_cast<std::size_t>(i)] == want);
      }
    }
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("hundreds of collectives pushed ahead of their inputs, from two threads, are exact" * doctest::timeout(240)) {
  // More fingerprints than the record fiber posts at once (64), pushed
  // while every input is still being produced behind one slow op, half of
  // them from a second thread: sequence numbers reach the record fiber out
  // of order, and each collective's check is done long before its data.
  // (Which tensor takes which number then differs across ranks: the
  // collectives share a name and their inputs hold the same values.)
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    constexpr int kCalls = 160;
    constexpr std::int64_t kCount = 5;
    Tensor slow = Tensor::zeros(e, Shape{1}, Device::cpu(0));
    weft::push_tensor_op(Device::cpu(0), {}, {slow}, [](weft::RunContext&, const weft::TensorData&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }, {.name = "slow producer"});
    std::vector<Tensor> ts;
    for (int k = 0; k < kCalls; ++k) {
      Tensor t = rank_tensor(e, rank, kCount);
      weft::push_tensor_op(Device::cpu(0), {slow}, {t}, [](weft::RunContext&, const weft::TensorData& d) {
        d.out(0)[0] += 1.0f;
      }, {.name = "after the slow producer"});
      ts.push_back(t);
    }
    auto push_range = [&](int first, int step) {
      for (int k = first; k < kCalls; k += step)
        par::allreduce(comm, {ts[static_cast<std::size_t>(k)]}, par::ReduceOp::sum,
                       {.name = "ahead"});
    };
    // The naive engine runs each collective at its push: one thread there,
    // so that both ranks push in the same order.
    if (e.kind() == "naive") {
      push_range(0, 1);
    } else {
      std::thread other([&] { push_range(1, 2); });
      push_range(0, 2);
      other.join();
    }
    for (int k = 0; k < kCalls; ++k) {
      const auto v = ts[static_cast<std::size_t>(k)].to_host();
      for (std::int64_t i = 0; i < kCount; ++i)
        REQUIRE(v[static_cast<std::size_t>(i)] ==
                reduced(par::ReduceOp::sum, n, i) + (i == 0 ? static_cast<float>(n) : 0.0f));
    }
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("collectives that differ across ranks fail on every rank, naming both sides" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (mpi_test::alone(n)) return;
  const auto start = std::chrono::steady_clock::now();
  Tensor t = rank == 1 ? Tensor::zeros(*e, Shape{10}, Device::cpu(0)) : Tensor::zeros(*e, Shape{4096}, Device::cpu(0));
  if (rank == 1) par::broadcast(comm, {t}, {.name = "w"});
  else par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "grad.fc1"});
  const std::string message = error_of(t);
  MESSAGE("rank " << rank << ": " << message);
  CHECK(contains(message, "rank 0 called allreduce(sum) 'grad.fc1' [4096] float32 as #1; "
                          "rank 1 called broadcast 'w' [10] float32 root 0 as #1"));
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  // Every rank skipped the data phase: the communicator still works.
  Tensor ok = rank_tensor(*e, rank, 5);
  par::allreduce(comm, {ok}, par::ReduceOp::sum, {.name = "after"});
  const auto v = ok.to_host();
  for (std::int64_t i = 0; i < 5; ++i) CHECK(v[static_cast<std::size_t>(i)] == reduced(par::ReduceOp::sum, n, i));
  sync_ranks(*e);
}

TEST_CASE("a rank that never joins is named by the others within seconds" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 1500ms});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (mpi_test::alone(n)) return;
  const int absent = n - 1;
  if (rank != absent) {
    const auto start = std::chrono::steady_clock::now();
    Tensor t = rank_tensor(*e, rank, 100);
    par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "grad.fc2"});
    const std::string message = error_of(t);
    MESSAGE("rank " << rank << ": " << message);
    CHECK(contains(message, "allreduce 'grad.fc2' #1"));
    CHECK(contains(message, "rank " + std::to_string(absent) + " never joined within 1500 ms"));
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 1400ms);
    CHECK(took < 10s);
    try {
      e->wait_to_read(t.var());
    } catch (const weft::CommunicationError& err) {
      CHECK(err.rank() == rank);
      CHECK(err.peer() == absent);
    }
    // The communicator is broken: the next collective fails at once.
    Tensor u = rank_tensor(*e, rank, 3);
    par::allreduce(comm, {u}, par::ReduceOp::sum, {.name = "next"});
    CHECK(contains(error_of(u), "the communicator is broken: allreduce 'grad.fc2' #1"));
  }
  sync_ranks(*e);
}

namespace {

// Rank n - 1's producer of `t` outlasts the communicator's 1500 ms timeout
// before the allreduce `name` (number `seq`): the other ranks enter the data
// phase without waiting for it, and their deadline names it.
void late_rank_is_named(Engine& e, const par::Communicator& comm, const Tensor& t, const std::string& name, int seq) {
  const int rank = comm.local_ranks()[0], late = comm.size() - 1;
  if (rank == late)
    weft::push_tensor_op(Device::cpu(0), {}, {t}, [](weft::RunContext&, const weft::TensorData&) {
      std::this_thread::sleep_for(3s);
    }, {.name = "slow producer"});
  const auto start = std::chrono::steady_clock::now();
  par::allreduce(comm, {t}, par::ReduceOp::max, {.name = name});
  if (rank != late) {
    const std::string message = error_of(t);
    MESSAGE("rank " << rank << ": " << message);
    CHECK(contains(message, "allreduce '" + name + "' #" + std::to_string(seq)));
    CHECK(contains(message, "the data phase did not complete within 1500 ms: rank " + std::to_string(late) +
                                " never reached it (no status came: its input was not ready"));
    CHECK(std::chrono::steady_clock::now() - start < 10s);
  } else {
    // The late rank's own result depends on whether the peers' abandoned
    // calls still meet it: success, or its own timeout. Either way it ends.
    try {
      e.wait_all();
    } catch (const weft::Error&) {
    }
  }
  sync_ranks(e);
}

}  // namespace

TEST_CASE("a rank whose input is not ready within the timeout is named by the others" * doctest::timeout(120)) {
  // Every rank pushes the collective (their fingerprints match at once).
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 1500ms});
  if (mpi_test::alone(comm.size())) return;
  late_rank_is_named(*e, comm, rank_tensor(*e, comm.local_ranks()[0], 100), "grad.late", 1);
}

TEST_CASE("a failed input fails the collective on every rank, naming the rank" * doctest::timeout(120)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    const int failing = n - 1;
    // Large allreduces (Weft's ring) on both sides of the failed one: the
    // failed one ends without a data phase, and must not let the second
    // ring start while the first still runs.
    constexpr std::int64_t kLarge = 400003;
    Tensor before = rank_tensor(e, rank, kLarge);
    par::allreduce(comm, {before}, par::ReduceOp::sum, {.name = "large before"});
    Tensor t = rank_tensor(e, rank, 16);
    if (rank == failing)
      weft::push_tensor_op(Device::cpu(0), {}, {t}, [](weft::RunContext&, const weft::TensorData&) {
        throw std::runtime_error("data loader died");
      }, {.name = "load"});
    par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "grad"});
    Tensor after = rank_tensor(e, rank, kLarge);
    par::allreduce(comm, {after}, par::ReduceOp::max, {.name = "large after"});
    require_values(before.to_host(), kLarge, [&](std::int64_t i) { return reduced(par::ReduceOp::sum, n, i); });
    require_values(after.to_host(), kLarge, [&](std::int64_t i) { return reduced(par::ReduceOp::max, n, i); });
    const std::string message = error_of(t);
    if (rank == failing) {
      CHECK(contains(message, "data loader died"));
    } else {
      CHECK(contains(message, "rank " + std::to_string(failing) + "'s input failed: "));
      CHECK(contains(message, "data loader died"));
    }
    // The failing rank took part with zeros; every rank failed the
    // collective from the statuses: the communicator goes on.
    Tensor ok = rank_tensor(e, rank, 4);
    par::allreduce(comm, {ok}, par::ReduceOp::max, {.name = "after"});
    const auto v = ok.to_host();
    for (std::int64_t i = 0; i < 4; ++i) CHECK(v[static_cast<std::size_t>(i)] == reduced(par::ReduceOp::max, n, i));
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

// A chain of large collectives on one tensor: each link's hold op runs
// when the link before completes (on the blocking lane's thread), its
// fingerprints matched long before, so it begins its own data phase there
// (begin_data_phase: its status and its lane call, without waiting for its
// fiber). Exact; and a failed input between two links, on one rank only, is
// named on every rank, the others having begun the link at once.
TEST_CASE("a chain of large collectives on one tensor is exact, and a failed input within it is named on every rank" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    constexpr std::int64_t kLarge = 70001;  // 280 KB: on the blocking lane
    Tensor t = rank_tensor(e, rank, kLarge);
    par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "link 0"});
    for (int k = 1; k < 8; ++k) {
      const std::string name = "link " + std::to_string(k);
      if (k % 2) {
        par::allreduce(comm, {t}, par::ReduceOp::max, {.name = name});
      } else {
        par::broadcast(comm, {t}, {.name = name, .root = k % n});
      }
    }
    require_values(t, kLarge, [&](std::int64_t i) { return reduced(par::ReduceOp::sum, n, i); });
    if (mpi_test::alone(n)) return;
    const int failing = n - 1;
    Tensor u = rank_tensor(e, rank, kLarge);
    par::allreduce(comm, {u}, par::ReduceOp::sum, {.name = "first link"});
    if (rank == failing)
      weft::push_tensor_op(Device::cpu(0), {}, {u}, [](weft::RunContext&, const weft::TensorData&) {
        throw std::runtime_error("data loader died");
      }, {.name = "load"});
    par::allreduce(comm, {u}, par::ReduceOp::max, {.name = "second link"});
    const std::string message = error_of(u);
    CHECK(contains(message, "data loader died"));
    if (rank != failing) {
      CHECK(contains(message, "allreduce 'second link' #"));
      CHECK(contains(message, "rank " + std::to_string(failing) + "'s input failed: "));
    }
    // The communicator goes on.
    Tensor ok = rank_tensor(e, rank, kLarge);
    par::allreduce(comm, {ok}, par::ReduceOp::sum, {.name = "after the chain"});
    par::allreduce(comm, {ok}, par::ReduceOp::max, {.name = "after the chain, again"});
    require_values(ok, kLarge, [&](std::int64_t i) { return reduced(par::ReduceOp::sum, n, i); });
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("a rank late within a chain of large collectives is named by the others" * doctest::timeout(120)) {
  // The others begin the second link's data phase as soon as the first
  // completes (begin_data_phase).
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 1500ms});
  if (mpi_test::alone(comm.size())) return;
  Tensor t = rank_tensor(*e, comm.local_ranks()[0], 70001);
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "link 1"});
  late_rank_is_named(*e, comm, t, "link 2", 2);
}

TEST_CASE("without fingerprints the collectives give the same results" * doctest::timeout(120)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0), {.fingerprints = false});
    const int rank = comm.local_ranks()[0], n = comm.size();
    Tensor t = rank_tensor(e, rank, 1003);
    par::allreduce(comm, {t}, par::ReduceOp::average, {.name = "unchecked"});
    const auto v = t.to_host();
    for (std::int64_t i = 0; i < 1003; ++i)
      REQUIRE(v[static_cast<std::size_t>(i)] == reduced(par::ReduceOp::average, n, i));
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("bad input is refused at push time, and a refused call takes no sequence number" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 2});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0));
  const int rank = comm.local_ranks()[0], n = comm.size();
  Tensor t = rank_tensor(*e, rank, 8);
  Tensor other = rank_tensor(*e, rank, 8);
  CHECK_THROWS_WITH_AS(par::allreduce(comm, {t, other}), doctest::Contains("2 tensors given, one per member this process drives wanted (1)"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::broadcast(comm, {t}, {.root = n}), doctest::Contains(("root " + std::to_string(n) + " is not a member").c_str()), weft::InvalidArgument);
  Tensor on1 = rank_tensor(*e, rank, 8, Device::cpu(1));
  CHECK_THROWS_WITH_AS(par::allreduce(comm, {on1}), doctest::Contains("is not on the member's device cpu(0)"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(7)), doctest::Contains("cpu(7) is not a device of this engine"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu_pinned(0)), doctest::Contains("neither a CPU device nor a GPU"), weft::InvalidArgument);
  // Only rank 0 makes a refused call; if it took a number, rank 0's next
  // collective would be #2 and everyone else's #1: a mismatch.
  if (rank == 0) CHECK_THROWS_AS(par::allreduce(comm, {Tensor()}), weft::InvalidArgument);
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "after refusals"});
  const auto v = t.to_host();
  for (std::int64_t i = 0; i < 8; ++i) CHECK(v[static_cast<std::size_t>(i)] == reduced(par::ReduceOp::sum, n, i));
  // Settings from the environment are checked too, with the one message.
  for (const char* bad : {"soon", "0", "-3", "1e8"}) {
    weft_test::EnvGuard timeout("WEFT_COLLECTIVE_TIMEOUT", bad);
    CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(0)),
                         ("weft: environment variable WEFT_COLLECTIVE_TIMEOUT='" + std::string(bad) +
                          "' is not a positive number of seconds, such as 300 or 2.5")
                             .c_str(),
                         weft::InvalidArgument);
  }
  {
    weft_test::EnvGuard check("WEFT_COLLECTIVE_CHECK", "maybe");
    CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(0)),
                         "weft: environment variable WEFT_COLLECTIVE_CHECK='maybe' is not 1 (fingerprints on, the "
                         "default) or 0 (off)",
                         weft::InvalidArgument);
  }
  // The heartbeat's settings: an interval in seconds or off, a timeout of
  // at least two intervals.
  for (const char* bad : {"soon", "0", "-1", "1e9"}) {
    weft_test::EnvGuard interval("WEFT_HEARTBEAT_INTERVAL", bad);
    CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(0)),
                         ("weft: environment variable WEFT_HEARTBEAT_INTERVAL='" + std::string(bad) +
                          "' is not a number of seconds in [0.001, 3600], such as 1 or 0.25, or off")
                             .c_str(),
                         weft::InvalidArgument);
  }
  for (const char* bad : {"1.5", "never", "-10"}) {
    weft_test::EnvGuard interval("WEFT_HEARTBEAT_INTERVAL", "1");
    weft_test::EnvGuard timeout("WEFT_HEARTBEAT_TIMEOUT", bad);
    CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(0)),
                         ("weft: environment variable WEFT_HEARTBEAT_TIMEOUT='" + std::string(bad) +
                          "' is not a number of seconds at least twice WEFT_HEARTBEAT_INTERVAL (1 s), such as 10")
                             .c_str(),
                         weft::InvalidArgument);
  }
  {
    weft_test::EnvGuard interval("WEFT_HEARTBEAT_INTERVAL", "0.25");
    weft_test::EnvGuard timeout("WEFT_HEARTBEAT_TIMEOUT", "0.4");
    CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(0)),
                         "weft: environment variable WEFT_HEARTBEAT_TIMEOUT='0.4' is not a number of seconds at least "
                         "twice WEFT_HEARTBEAT_INTERVAL (250 ms), such as 10",
                         weft::InvalidArgument);
  }
  {
    weft_test::EnvGuard lane("WEFT_MPI_LANE", "maybe");
    CHECK_THROWS_WITH_AS(par::Communicator::mpi(*e, Device::cpu(0)),
                         "weft: environment variable WEFT_MPI_LANE='maybe' is not 1 (a blocking lane for large "
                         "collectives, the default) or 0 (non-blocking calls only)",
                         weft::InvalidArgument);
  }
  sync_ranks(*e);
}

TEST_CASE("send and recv between ranks arrive in push order, exact, whatever order their inputs become ready" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    if (mpi_test::alone(n)) return;
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    std::mt19937 rng(static_cast<unsigned>(77 + rank));
    const std::vector<std::int64_t> sizes{0, 1, 1003, 300007, 5, 5, 5};
    std::vector<Tensor> inbox;
    auto post_sends = [&] {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        Tensor t = rank_tensor(e, rank, sizes[k]);
        const auto delay = std::chrono::microseconds(rng() % 2000);
        weft::push_tensor_op(Device::cpu(0), {}, {t}, [delay, k](weft::RunContext&, const weft::TensorData& d) {
          std::this_thread::sleep_for(delay);
          if (d.outputs[0]) *d.out(0) += 0.0f * static_cast<float>(k);
        }, {.name = "produce"});
        if (sizes[k] > 0) {
          // Message k carries k in its first element.
          weft::push_tensor_op(Device::cpu(0), {}, {t}, [k](weft::RunContext&, const weft::TensorData& d) {
            d.out(0)[0] = static_cast<float>(k);
          }, {.name = "stamp"});
        }
        par::send(comm, t, right, {.name = std::string("m").append(std::to_string(k))});
        // Overwriting after the send must not change what was sent.
        if (sizes[k] > 0) weft::push_tensor_op(Device::cpu(0), {}, {t}, [](weft::RunContext&, const weft::TensorData& d) {
          d.out(0)[0] = -1.0f;
        }, {.name = "overwrite"});
      }
    };
    auto post_recvs = [&] {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        Tensor t = Tensor::zeros(e, Shape{sizes[k]}, Device::cpu(0));
        par::recv(comm, t, left, {.name = std::string("m").append(std::to_string(k))});
        inbox.push_back(t);
      }
    };
    // Half the ranks push their recvs first: order of posting across a pair
    // must not matter.
    if (rank % 2) {
      post_recvs();
      post_sends();
    } else {
      post_sends();
      post_recvs();
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto v = inbox[k].to_host();
      REQUIRE(static_cast<std::int64_t>(v.size()) == sizes[k]);
      for (std::int64_t i = 0; i < sizes[k]; ++i)
        REQUIRE(v[static_cast<std::size_t>(i)] == (i == 0 ? static_cast<float>(k) : value(left, i)));
    }
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("a send and recv that differ fail on both ends, naming both; a failed input reaches the receiver" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (n > 1 && rank < 2) {
    const std::string want =
        "send and recv differ: rank 0 called send 'a' [10] float32 to rank 1 as #1; rank 1 called recv 'b' [12] "
        "float32 from rank 0 as #1";
    if (rank == 0) {
      Tensor t = rank_tensor(*e, rank, 10);
      par::send(comm, t, 1, {.name = "a"});
      // A send only reads its tensor: its error reaches wait_all.
      CHECK_THROWS_WITH_AS(e->wait_all(), doctest::Contains(want.c_str()), weft::CommunicationError);
      // The pair goes on: the next message matches.
      Tensor next = rank_tensor(*e, rank, 3);
      par::send(comm, next, 1, {.name = "c"});
      // A failed input: the receiver learns why.
      Tensor bad = rank_tensor(*e, rank, 4);
      weft::push_tensor_op(Device::cpu(0), {}, {bad}, [](weft::RunContext&, const weft::TensorData&) {
        throw std::runtime_error("activation overflow");
      }, {.name = "forward"});
      par::send(comm, bad, 1, {.name = "d"});
      CHECK(contains(error_of(bad), "activation overflow"));
      e->wait_all();  // the failure was reported once, through the tensor
    } else {
      Tensor t = Tensor::zeros(*e, Shape{12}, Device::cpu(0));
      par::recv(comm, t, 0, {.name = "b"});
      CHECK_THROWS_WITH_AS(e->wait_to_read(t.var()), doctest::Contains(want.c_str()), weft::CommunicationError);
      Tensor next = Tensor::zeros(*e, Shape{3}, Device::cpu(0));
      par::recv(comm, next, 0, {.name = "c"});
      const auto v = next.to_host();
      for (std::int64_t i = 0; i < 3; ++i) CHECK(v[static_cast<std::size_t>(i)] == value(0, i));
      Tensor bad = Tensor::zeros(*e, Shape{4}, Device::cpu(0));
      par::recv(comm, bad, 0, {.name = "d"});
      const std::string message = error_of(bad);
      CHECK(contains(message, "rank 0's input failed: "));
      CHECK(contains(message, "activation overflow"));
    }
  }
  sync_ranks(*e);
}

TEST_CASE("a send and recv of as many elements in other shapes, or in another dtype, fail on both ends, naming both" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (n > 1 && rank < 2) {
    const std::string shapes =
        "send and recv differ: rank 0 called send 'act' [2, 3] float32 to rank 1 as #1; rank 1 called recv 'act' "
        "[3, 2] float32 from rank 0 as #1";
    const std::string dtypes =
        "send and recv differ: rank 0 called send 'grad' [6] float32 to rank 1 as #2; rank 1 called recv 'grad' "
        "[6] float16 from rank 0 as #2";
    if (rank == 0) {
      Tensor t = Tensor::ones(*e, Shape{2, 3}, Device::cpu(0));
      par::send(comm, t, 1, {.name = "act"});
      CHECK_THROWS_WITH_AS(e->wait_all(), doctest::Contains(shapes.c_str()), weft::CommunicationError);
      Tensor g = Tensor::ones(*e, Shape{6}, Device::cpu(0));
      par::send(comm, g, 1, {.name = "grad"});
      CHECK_THROWS_WITH_AS(e->wait_all(), doctest::Contains(dtypes.c_str()), weft::CommunicationError);
      // The pair goes on: a matching message arrives whole.
      const std::vector<float> six = {1, 2, 3, 4, 5, 6};
      Tensor ok = Tensor::from_host(*e, Shape{2, 3}, six, Device::cpu(0));
      par::send(comm, ok, 1, {.name = "act"});
      e->wait_all();
    } else {
      Tensor t = Tensor::zeros(*e, Shape{3, 2}, Device::cpu(0));
      par::recv(comm, t, 0, {.name = "act"});
      CHECK_THROWS_WITH_AS(e->wait_to_read(t.var()), doctest::Contains(shapes.c_str()), weft::CommunicationError);
      Tensor g = Tensor::zeros(*e, Shape{6}, Device::cpu(0), weft::DType::float16);
      par::recv(comm, g, 0, {.name = "grad"});
      CHECK_THROWS_WITH_AS(e->wait_to_read(g.var()), doctest::Contains(dtypes.c_str()), weft::CommunicationError);
      Tensor ok = Tensor::zeros(*e, Shape{2, 3}, Device::cpu(0));
      par::recv(comm, ok, 0, {.name = "act"});
      CHECK(ok.to_host() == std::vector<float>{1, 2, 3, 4, 5, 6});
    }
  }
  sync_ranks(*e);
}

TEST_CASE("a recv whose peer never sends is named within seconds; bad peers are refused at push time" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 1500ms});
  const int rank = comm.local_ranks()[0], n = comm.size();
  Tensor t = Tensor::zeros(*e, Shape{4}, Device::cpu(0));
  CHECK_THROWS_WITH_AS(par::send(comm, t, rank), doctest::Contains("is the member itself"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::recv(comm, t, n), doctest::Contains("is not a member"), weft::InvalidArgument);
  if (n > 1 && rank == 1) {
    const auto start = std::chrono::steady_clock::now();
    par::recv(comm, t, 0, {.name = "never"});
    const std::string message = error_of(t);
    MESSAGE("rank " << rank << ": " << message);
    CHECK(contains(message, "recv 'never' from rank 0 #1"));
    CHECK(contains(message, "rank 0 sent nothing within 1500 ms"));
    CHECK(std::chrono::steady_clock::now() - start < 10s);
  }
  sync_ranks(*e);
}

TEST_CASE("several devices per process: allreduce, broadcast, reduce, reduce_scatter and all_gather over ranks x devices, exact" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, {Device::cpu(0), Device::cpu(1)});
    const int per = 2, n = comm.size(), processes = n / per;
    REQUIRE(comm.local_ranks().size() == 2);
    const int first = comm.local_ranks()[0];
    CHECK(comm.local_ranks()[1] == first + 1);
    CHECK(comm.device(first + 1) == Device::cpu(1));
    CHECK(contains(comm.str(), std::to_string(processes) + " ranks x 2 devices"));
    // The largest size on the blocking lane (over 256 KiB) in every build;
    // 1,100,003 (several ring segments per chunk without the lane) where
    // there is time for it: under the sanitizers it cost this case ~25 s.
    const std::int64_t large = weft_test::kSanitized ? 300007 : 1100003;
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1003}, large}) {
      INFO("elements: " << count << ", members: " << n);
      std::vector<std::vector<Tensor>> results;
      for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
        std::vector<Tensor> ts{rank_tensor(e, first, count, Device::cpu(0)), rank_tensor(e, first + 1, count, Device::cpu(1))};
        par::allreduce(comm, ts, op, {.name = "grad"});
        results.push_back(ts);
      }
      int k = 0;
      for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
        for (const Tensor& t : results[static_cast<std::size_t>(k)])
          require_values(t.to_host(), count, [&](std::int64_t i) { return reduced(op, n, i); });
        ++k;
      }
      if (count > 2000) continue;
      for (int root = 0; root < n; ++root) {
        std::vector<Tensor> ts{rank_tensor(e, first, count, Device::cpu(0)), rank_tensor(e, first + 1, count, Device::cpu(1))};
        par::broadcast(comm, ts, {.name = "weights", .root = root});
        for (const Tensor& t : ts) require_values(t.to_host(), count, [&](std::int64_t i) { return value(root, i); });
        for (auto op : {par::ReduceOp::sum, par::ReduceOp::average}) {
          std::vector<Tensor> rs{rank_tensor(e, first, count, Device::cpu(0)),
                                 rank_tensor(e, first + 1, count, Device::cpu(1))};
          par::reduce(comm, rs, op, {.name = "loss", .root = root});
          for (int k = 0; k < 2; ++k) {
            // The root holds the reduction; every other tensor is only read.
            const int member = first + k;
            require_values(rs[static_cast<std::size_t>(k)].to_host(), count, [&](std::int64_t i) {
              return member == root ? reduced(op, n, i) : value(member, i);
            });
          }
        }
      }
      for (auto op : {par::ReduceOp::max, par::ReduceOp::average}) {
        std::vector<Tensor> inputs{rank_tensor(e, first, count, Device::cpu(0)),
                                   rank_tensor(e, first + 1, count, Device::cpu(1))};
        std::vector<Tensor> parts;
        for (int k = 0; k < 2; ++k)
          parts.push_back(Tensor::zeros(e, Shape{par::chunk(count, n, first + k).size()}, Device::cpu(k)));
        par::reduce_scatter(comm, inputs, parts, op, {.name = "shards"});
        for (int k = 0; k < 2; ++k) {
          const par::Chunk c = par::chunk(count, n, first + k);
          require_values(parts[static_cast<std::size_t>(k)].to_host(), c.size(),
                         [&](std::int64_t i) { return reduced(op, n, c.begin + i); });
          require_values(inputs[static_cast<std::size_t>(k)].to_host(), count,
                         [&](std::int64_t i) { return value(first + k, i); });  // only read
        }
      }
    }
    par::barrier(comm);
    // all_gather: member m's chunk of a `count`-element whole holds member
    // m's values at those positions; every member ends with the whole.
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1003}, std::int64_t{300007}}) {
      INFO("all_gather of " << count << " elements over " << n << " members");
      auto whole_value = [&](std::int64_t i) {
        int owner = 0;
        while (!(i < par::chunk(count, n, owner).end)) ++owner;
        return value(owner, i);
      };
      std::vector<Tensor> mine, gathered;
      for (int k = 0; k < 2; ++k) {
        const par::Chunk c = par::chunk(count, n, first + k);
        std::vector<float> v;
        for (std::int64_t i = c.begin; i < c.end; ++i) v.push_back(value(first + k, i));
        mine.push_back(Tensor::from_host(e, Shape{c.size()}, v, Device::cpu(k)));
        gathered.push_back(Tensor::empty(e, Shape{count}, Device::cpu(k)));
      }
      par::all_gather(comm, mine, gathered, {.name = "params"});
      for (const Tensor& g : gathered) require_values(g.to_host(), count, whole_value);
    }
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("several devices per process: send and recv between any two members, in push order per pair" *
          doctest::timeout(240)) {
  weft_test::with_each_engine(2, [](Engine& e) {
    const std::vector<Device> devices{Device::cpu(0), Device::cpu(1)};
    const par::Communicator comm = par::Communicator::mpi(e, devices);
    mpi_test::member_rings(e, comm, devices, e.kind() != "naive");
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

namespace {

Tensor half_tensor(Engine& e, weft::DType dtype, int member, std::int64_t count, Device d = Device::cpu(0), int salt = 0) {
  return Tensor::from_host(e, Shape{count}, half_test::values(member, count, salt), d, dtype);
}

// Every element of `t` is want(i) exactly; one assertion naming the first that is not.
template <class Want>
void require_half(const Tensor& t, weft::DType dtype, std::int64_t count, Want want) {
  CHECK(t.dtype() == dtype);
  require_values(t.to_host(), count, want);
}

}  // namespace

// 70,001 elements: over 256 KiB once widened to float32, so the data phase
// runs on the blocking lane (Weft's ring without it, under
// parallel_mpi.np2_no_lane's WEFT_MPI_LANE=0).
TEST_CASE("bfloat16 and float16 collectives across processes sum in float32 and round once" * doctest::timeout(240)) {
  using weft::DType;
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    for (DType dtype : {DType::bfloat16, DType::float16})
      for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1003}, std::int64_t{70001}}) {
        INFO(half_test::name(dtype) << ", elements: " << count << ", ranks: " << n);
        std::vector<Tensor> all;
        for (auto op : {par::ReduceOp::sum, par::ReduceOp::average, par::ReduceOp::max}) {
          all.push_back(half_tensor(e, dtype, rank, count));
          par::allreduce(comm, {all.back()}, op, {.name = "grad"});
        }
        const int root = n - 1;
        Tensor r = half_tensor(e, dtype, rank, count), b = half_tensor(e, dtype, rank, count);
        par::reduce(comm, {r}, par::ReduceOp::average, {.name = "loss", .root = root});
        par::broadcast(comm, {b}, {.name = "weights", .root = 0});
        const par::Chunk mine = par::chunk(count, n, rank);
        Tensor part = Tensor::empty(e, Shape{mine.size()}, Device::cpu(0), dtype);
        par::reduce_scatter(comm, {half_tensor(e, dtype, rank, count)}, {part}, par::ReduceOp::sum, {.name = "shards"});
        std::vector<float> own;
        for (std::int64_t i = mine.begin; i < mine.end; ++i) own.push_back(half_test::value(rank, i, 1));
        Tensor whole = Tensor::empty(e, Shape{count}, Device::cpu(0), dtype);
        par::all_gather(comm, {Tensor::from_host(e, Shape{mine.size()}, own, Device::cpu(0), dtype)}, {whole},
                        {.name = "gather"});
        int k = 0;
        for (auto op : {par::ReduceOp::sum, par::ReduceOp::average, par::ReduceOp::max})
          require_half(all[static_cast<std::size_t>(k++)], dtype, count,
                       [&](std::int64_t i) { return half_test::rounded_once(dtype, n, i, op); });
        require_half(r, dtype, count, [&](std::int64_t i) {
          return rank == root ? half_test::rounded_once(dtype, n, i, par::ReduceOp::average) : half_test::value(rank, i);
        });
        require_half(b, dtype, count, [&](std::int64_t i) { return half_test::value(0, i); });
        require_half(part, dtype, mine.size(),
                     [&](std::int64_t i) { return half_test::rounded_once(dtype, n, mine.begin + i, par::ReduceOp::sum); });
        require_half(whole, dtype, count, [&](std::int64_t i) {
          int owner = 0;
          while (par::chunk(count, n, owner).end <= i) ++owner;
          return half_test::value(owner, i, 1);
        });
      }
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("several devices per process: bfloat16 allreduce, reduce and reduce_scatter round once" *
          doctest::timeout(240)) {
  using weft::DType;
  weft_test::with_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, {Device::cpu(0), Device::cpu(1)});
    const int n = comm.size(), first = comm.local_ranks()[0];
    for (DType dtype : {DType::bfloat16, DType::float16})
      for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{13}, std::int64_t{70001}}) {
        INFO(half_test::name(dtype) << ", elements: " << count << ", members: " << n);
        auto pair = [&] {
          return std::vector<Tensor>{half_tensor(e, dtype, first, count, Device::cpu(0)),
                                     half_tensor(e, dtype, first + 1, count, Device::cpu(1))};
        };
        std::vector<Tensor> sums = pair(), averages = pair(), reduced_at_last = pair(), inputs = pair();
        par::allreduce(comm, sums, par::ReduceOp::sum, {.name = "grad"});
        par::allreduce(comm, averages, par::ReduceOp::average, {.name = "grad"});
        par::reduce(comm, reduced_at_last, par::ReduceOp::sum, {.name = "loss", .root = n - 1});
        std::vector<Tensor> parts;
        for (int k = 0; k < 2; ++k)
          parts.push_back(Tensor::empty(e, Shape{par::chunk(count, n, first + k).size()}, Device::cpu(k), dtype));
        par::reduce_scatter(comm, inputs, parts, par::ReduceOp::sum, {.name = "shards"});
        for (int k = 0; k < 2; ++k) {
          const auto kk = static_cast<std::size_t>(k);
          const int member = first + k;
          require_half(sums[kk], dtype, count,
                       [&](std::int64_t i) { return half_test::rounded_once(dtype, n, i, par::ReduceOp::sum); });
          require_half(averages[kk], dtype, count,
                       [&](std::int64_t i) { return half_test::rounded_once(dtype, n, i, par::ReduceOp::average); });
          require_half(reduced_at_last[kk], dtype, count, [&](std::int64_t i) {
            return member == n - 1 ? half_test::rounded_once(dtype, n, i, par::ReduceOp::sum) : half_test::value(member, i);
          });
          const par::Chunk c = par::chunk(count, n, member);
          require_half(parts[kk], dtype, c.size(),
                       [&](std::int64_t i) { return half_test::rounded_once(dtype, n, c.begin + i, par::ReduceOp::sum); });
        }
      }
  });
  auto e = Engine::create({.kind = "threaded"});
  sync_ranks(*e);
}

TEST_CASE("a dtype that differs across ranks fails the collective on every rank, naming both" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (mpi_test::alone(n)) return;
  const auto start = std::chrono::steady_clock::now();
  Tensor t = half_tensor(*e, rank == 1 ? weft::DType::float32 : weft::DType::bfloat16, rank, 64);
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "grad"});
  const std::string message = error_of(t);
  MESSAGE("rank " << rank << ": " << message);
  CHECK(contains(message, "rank 0 called allreduce(sum) 'grad' [64] bfloat16 as #1; "
                          "rank 1 called allreduce(sum) 'grad' [64] float32 as #1"));
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  // Every rank skipped the data phase: the communicator still works.
  Tensor ok = half_tensor(*e, weft::DType::bfloat16, rank, 5);
  par::allreduce(comm, {ok}, par::ReduceOp::sum, {.name = "after"});
  require_half(ok, weft::DType::bfloat16, 5,
               [&](std::int64_t i) { return half_test::rounded_once(weft::DType::bfloat16, n, i, par::ReduceOp::sum); });
  sync_ranks(*e);
}
