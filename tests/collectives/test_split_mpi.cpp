// Sub-communicators across MPI processes (Communicator::split). ctest runs
// this binary alone (a group of one) and under mpirun with 2 and 3 ranks;
// every rank runs the same cases in the same order. Checked: a split by
// rank parity and an uneven one ({0, 0, 1} at 3 ranks) reduce exactly
// within each group; send and recv between members of a sub-communicator;
// two splits in a row and a split of a split; a collective that differs
// within a sub-communicator named with its own sequence numbers; colors
// that differ across ranks fail every rank naming both, and the parent
// still works; a rank that never splits named by the others at the
// timeout; bad colors refused; two devices per process split by
// process; GPU members (staged through host memory on simulated GPUs).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "mpi_test_util.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/parallel/collectives.h"
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
using mpi_test::require_values;
using mpi_test::sync_ranks;
using mpi_test::value;

// The members of `parent` (given by their world ranks, in rank order) whose
// colour is that of member `me`: the world ranks of me's sub-communicator.
std::vector<int> group_of(const std::vector<int>& parent, const std::vector<int>& colors, int me) {
  std::vector<int> world;
  for (std::size_t k = 0; k < parent.size(); ++k)
    if (colors[k] == colors[static_cast<std::size_t>(me)]) world.push_back(parent[k]);
  return world;
}

std::vector<int> all_ranks(int n) {
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(r);
  return ranks;
}

// Each member allreduces (sum) its world rank's values over `comm`, whose
// members are the world ranks `world`: every element is exactly their sum.
void require_group_sum(Engine& e, const par::Communicator& comm, const std::vector<int>& world, std::int64_t count,
                       const std::string& name) {
  INFO(name << ": " << comm.str());
  REQUIRE(comm.size() == static_cast<int>(world.size()));
  const int me = comm.local_ranks()[0];
  Tensor t = rank_tensor(e, world[static_cast<std::size_t>(me)], count);
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = name});
  require_values(t, count, [&](std::int64_t i) {
    float sum = 0;
    for (const int w : world) sum += value(w, i);
    return sum;
  });
}

// What the split refuses with (InvalidArgument).
std::string split_refusal(const par::Communicator& comm, const std::vector<int>& colors) {
  try {
    (void)comm.split(colors);
  } catch (const weft::InvalidArgument& err) {
    return err.what();
  }
  return "(no InvalidArgument)";
}

// Every rank sees the same environment, so every rank skips alike.
bool split_no_gpus(int wanted) {
  if (weft::gpu::device_count() >= wanted) return false;
  std::printf("[weft-skip] fewer than %d GPUs answer (WEFT_GPU_BACKEND=sim simulates them)\n", wanted);
  std::fflush(stdout);
  return true;
}

}  // namespace

TEST_CASE("split by rank parity: each group's allreduce is its own sum, with its ranks, str and world rank" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int rank = world.local_ranks()[0], n = world.size();
  std::vector<int> parity;
  for (int r = 0; r < n; ++r) parity.push_back(r % 2);
  const par::Communicator half = world.split(parity);
  const std::vector<int> members = group_of(all_ranks(n), parity, rank);
  REQUIRE(half.size() == static_cast<int>(members.size()));
  REQUIRE(half.local_ranks() == std::vector<int>{rank / 2});
  CHECK(half.device(rank / 2) == Device::cpu(0));
  CHECK(half.str() == "MPI communicator of " + std::to_string(half.size()) + (half.size() == 1 ? " rank" : " ranks") +
                          " (rank " + std::to_string(rank / 2) + " on cpu(0) here; world rank " + std::to_string(rank) +
                          ")");
  for (std::int64_t count : {std::int64_t{1}, std::int64_t{1003}}) require_group_sum(*e, half, members, count, "parity");
  // The parent still works, and the group again after it.
  require_group_sum(*e, world, all_ranks(n), 7, "world");
  require_group_sum(*e, half, members, 7, "parity again");
  sync_ranks(*e);
}

TEST_CASE("an uneven split ({0, 0, 1} at 3 ranks): collectives and send and recv within each group" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int rank = world.local_ranks()[0], n = world.size();
  std::vector<int> colors;
  for (int r = 0; r < n; ++r) colors.push_back(r < 2 ? 0 : 1);
  const par::Communicator sub = world.split(colors);
  const std::vector<int> members = group_of(all_ranks(n), colors, rank);
  const int me = sub.local_ranks()[0], k = sub.size();
  CHECK(me == (rank < 2 ? rank : rank - 2));
  require_group_sum(*e, sub, members, 13, "uneven");
  // Broadcast from the group's last member.
  Tensor b = rank_tensor(*e, rank, 13);
  par::broadcast(sub, {b}, {.name = "from the last", .root = k - 1});
  require_values(b, 13, [&](std::int64_t i) { return value(members.back(), i); });
  // Around the ring of the group's members, twice, each message stamped.
  if (k > 1) {
    const int to = (me + 1) % k, from = (me + k - 1) % k;
    std::vector<Tensor> got;
    for (int round = 0; round < 2; ++round) {
      std::vector<float> v(1003);
      for (std::int64_t i = 0; i < 1003; ++i) v[static_cast<std::size_t>(i)] = value(rank, i) + static_cast<float>(round);
      par::send(sub, Tensor::from_host(*e, Shape{1003}, v, Device::cpu(0)), to, {.name = "act"});
      Tensor r = Tensor::zeros(*e, Shape{1003}, Device::cpu(0));
      par::recv(sub, r, from, {.name = "act"});
      got.push_back(r);
    }
    for (int round = 0; round < 2; ++round)
      require_values(got[static_cast<std::size_t>(round)], 1003, [&](std::int64_t i) {
        return value(members[static_cast<std::size_t>(from)], i) + static_cast<float>(round);
      });
  }
  sync_ranks(*e);
}

TEST_CASE("two splits in a row and a split of a split, each with its own group" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int rank = world.local_ranks()[0], n = world.size();
  // At 3 ranks {1, 0, 0}: world ranks 1 and 2 together; at 2 ranks, both.
  std::vector<int> first_colors, all_one(static_cast<std::size_t>(n), 7);
  for (int r = 0; r < n; ++r) first_colors.push_back((n - 1 - r) / 2);
  const par::Communicator first = world.split(first_colors);
  const par::Communicator whole = world.split(all_one);
  const std::vector<int> first_members = group_of(all_ranks(n), first_colors, rank);
  CHECK(whole.size() == n);
  CHECK(whole.local_ranks()[0] == rank);
  // The split of the split: its members by their rank in `first`, the
  // first member apart from the others.
  std::vector<int> second_colors;
  for (int k = 0; k < first.size(); ++k) second_colors.push_back(k == 0 ? 0 : 1);
  const par::Communicator second = first.split(second_colors);
  const std::vector<int> second_members = group_of(first_members, second_colors, first.local_ranks()[0]);
  CHECK(contains(second.str(), "world rank " + std::to_string(rank)));
  require_group_sum(*e, second, second_members, 1003, "second");
  require_group_sum(*e, whole, all_ranks(n), 1003, "whole");
  require_group_sum(*e, first, first_members, 1003, "first");
  require_group_sum(*e, world, all_ranks(n), 1003, "world");
  sync_ranks(*e);
}

TEST_CASE("a collective that differs within a sub-communicator is named with the sub-communicator's sequence" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = world.local_ranks()[0], n = world.size();
  if (mpi_test::alone(n)) return;
  // Two collectives on the parent first: the sub-communicator's still
  // counts from 1.
  require_group_sum(*e, world, all_ranks(n), 3, "before");
  require_group_sum(*e, world, all_ranks(n), 3, "before");
  const par::Communicator sub = world.split(std::vector<int>(static_cast<std::size_t>(n), 0));
  const auto start = std::chrono::steady_clock::now();
  Tensor t = Tensor::zeros(*e, Shape{8}, Device::cpu(0));
  par::allreduce(sub, {t}, par::ReduceOp::sum, {.name = rank == 1 ? "odd" : "even"});
  const std::string message = error_of(t);
  MESSAGE("rank " << rank << ": " << message);
  CHECK(contains(message, "rank 0 called allreduce(sum) 'even' [8] float32 as #1; "
                          "rank 1 called allreduce(sum) 'odd' [8] float32 as #1"));
  CHECK(std::chrono::steady_clock::now() - start < 25s);  // well before the 30 s timeout
  require_group_sum(*e, sub, all_ranks(n), 5, "after");
  sync_ranks(*e);
}

TEST_CASE("colors that differ across ranks fail the split on every rank, naming both, and the parent still works" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = world.local_ranks()[0], n = world.size();
  if (mpi_test::alone(n)) return;
  std::vector<int> colors(static_cast<std::size_t>(n), 0);
  if (rank == 1) colors[0] = 1;  // rank 1 alone puts member 0 apart
  const auto start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    (void)world.split(colors);
  } catch (const weft::CommunicationError& err) {
    message = err.what();
    CHECK(err.rank() == rank);
    CHECK(err.peer() == (rank == 1 ? 0 : 1));
  }
  MESSAGE("rank " << rank << ": " << message);
  CHECK(contains(message, "weft::parallel::Communicator::split (MPI communicator of " + std::to_string(n) + " ranks"));
  CHECK(contains(message, "ranks 0 and 1 passed different colors"));
  CHECK(contains(message, rank == 1 ? "this rank passed {1, 0" : "this rank passed {0, 0"));
  CHECK(std::chrono::steady_clock::now() - start < 25s);  // well before the 30 s timeout
  require_group_sum(*e, world, all_ranks(n), 7, "after the refused split");
  // And the next split, with the same colors everywhere, works.
  require_group_sum(*e, world.split(std::vector<int>(static_cast<std::size_t>(n), 3)), all_ranks(n), 7, "next split");
  sync_ranks(*e);
}

TEST_CASE("a rank that never splits is named by the others at the communicator's timeout" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 2s});
  const int rank = world.local_ranks()[0], n = world.size();
  if (mpi_test::alone(n)) return;
  const int absent = n - 1;
  sync_ranks(*e);  // the others reach the split together, well within the timeout
  if (rank != absent) {
    const auto start = std::chrono::steady_clock::now();
    std::string message = "(no error)";
    try {
      (void)world.split(std::vector<int>(static_cast<std::size_t>(n), 0));
    } catch (const weft::CommunicationError& err) {
      message = err.what();
      CHECK(err.peer() == absent);
    }
    MESSAGE("rank " << rank << ": " << message);
    CHECK(contains(message, "rank " + std::to_string(absent) + " did not split this communicator within 2 s"));
    CHECK(std::chrono::steady_clock::now() - start < 30s);
  }
  sync_ranks(*e);
}

TEST_CASE("bad colors are refused on every rank before anything moves" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 2});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int n = world.size();
  CHECK(contains(split_refusal(world, std::vector<int>(static_cast<std::size_t>(n + 1), 0)),
                 std::to_string(n + 1) + " colors for " + std::to_string(n) + " members"));
  std::vector<int> negative(static_cast<std::size_t>(n), 0);
  negative.back() = -1;
  CHECK(contains(split_refusal(world, negative), "member " + std::to_string(n - 1) + "'s colour is -1"));
  // Two devices per process: a process's members share a colour.
  const par::Communicator pairs = par::Communicator::mpi(*e, {Device::cpu(0), Device::cpu(1)});
  std::vector<int> apart(static_cast<std::size_t>(pairs.size()), 0);
  apart.back() = 1;
  CHECK(contains(split_refusal(pairs, apart), "members " + std::to_string(pairs.size() - 2) + " and " +
                                            std::to_string(pairs.size() - 1) + ", of one process, have colours 0 and 1"));
  require_group_sum(*e, world, all_ranks(n), 7, "after");
  sync_ranks(*e);
}

TEST_CASE("several devices per process: a split by process parity reduces within each group" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 2});
  const std::vector<Device> devices{Device::cpu(0), Device::cpu(1)};
  const par::Communicator comm = par::Communicator::mpi(*e, devices);
  const int per = 2, n = comm.size(), process = comm.local_ranks()[0] / per;
  std::vector<int> colors;
  for (int m = 0; m < n; ++m) colors.push_back((m / per) % 2);
  const par::Communicator sub = comm.split(colors);
  const std::vector<int> members = group_of(all_ranks(n), colors, process * per);
  REQUIRE(sub.size() == static_cast<int>(members.size()));
  REQUIRE(sub.local_ranks() == std::vector<int>{(process / 2) * per, (process / 2) * per + 1});
  CHECK(contains(sub.str(), std::to_string(sub.size() / per) + " ranks x 2 devices"));
  for (std::int64_t count : {std::int64_t{1}, std::int64_t{1003}}) {
    INFO("elements: " << count);
    std::vector<Tensor> ts;
    for (int k = 0; k < per; ++k)
      ts.push_back(rank_tensor(*e, process * per + k, count, devices[static_cast<std::size_t>(k)]));
    par::allreduce(sub, ts, par::ReduceOp::sum, {.name = "grad"});
    for (const Tensor& t : ts)
      require_values(t, count, [&](std::int64_t i) {
        float sum = 0;
        for (const int w : members) sum += value(w, i);
        return sum;
      });
  }
  sync_ranks(*e);
}

TEST_CASE("GPU members across processes: a split by rank parity reduces within each group, and sends within it" *
          doctest::timeout(120)) {
  if (split_no_gpus(1)) return;
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 1, .gpu_devices = 1});
  const par::Communicator world = par::Communicator::mpi(*e, Device::gpu(0));
  const int rank = world.local_ranks()[0], n = world.size();
  std::vector<int> parity;
  for (int r = 0; r < n; ++r) parity.push_back(r % 2);
  const par::Communicator half = world.split(parity);
  const std::vector<int> members = group_of(all_ranks(n), parity, rank);
  REQUIRE(half.size() == static_cast<int>(members.size()));
  CHECK(half.device(rank / 2) == Device::gpu(0));
  for (std::int64_t count : {std::int64_t{1}, std::int64_t{1003}}) {
    Tensor t = rank_tensor(*e, rank, count, Device::gpu(0));
    par::allreduce(half, {t}, par::ReduceOp::sum, {.name = "grad"});
    require_values(t, count, [&](std::int64_t i) {
      float sum = 0;
      for (const int w : members) sum += value(w, i);
      return sum;
    });
  }
  // {0, 0, 1} at 3 ranks: ranks 0 and 1 send to each other.
  std::vector<int> pairs;
  for (int r = 0; r < n; ++r) pairs.push_back(r < 2 ? 0 : 1);
  const par::Communicator sub = world.split(pairs);
  if (sub.size() == 2) {
    const int me = sub.local_ranks()[0];
    par::send(sub, rank_tensor(*e, rank, 1003, Device::gpu(0)), 1 - me, {.name = "act"});
    Tensor r = Tensor::zeros(*e, Shape{1003}, Device::gpu(0));
    par::recv(sub, r, 1 - me, {.name = "act"});
    require_values(r, 1003, [&](std::int64_t i) { return value(1 - rank, i); });
  }
  require_group_sum(*e, par::Communicator::mpi(*e, Device::cpu(0)), all_ranks(n), 7, "host after");
  sync_ranks(*e);
}
