// The checks NCCL's collectives and messages across processes take over MPI
// (parallel/src/collectives/call.h), run on CPU devices: they are the part of
// the NCCL path that needs no GPU. A collective's check ahead completes its
// token once the fingerprints matched and this rank's status went out, so a
// rank may launch while a peer's input is still being computed (the test
// holds rank 1's input behind a gate that opens only after rank 0 saw its
// token); the peers' statuses settle afterwards and name a rank whose input
// failed; a mismatch fails every rank's token, naming both calls, and lets
// nobody launch. A message's check fails both ends on shapes or dtypes that
// differ, naming both, and the receiver on a sender's failed input.
// White-box: includes parallel/src.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collectives/call.h"
#include "mpi_test_util.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"

namespace {

using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace par = weft::parallel;
namespace detail = weft::parallel::detail;
using namespace std::chrono_literals;

std::string nccl_check_error(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return err.what();
  }
  return "(no error)";
}

// Waits (yielding) until the check's statuses settled; false after `limit`.
bool nccl_check_settles(const detail::CheckAfter& after, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!after.settled.load(std::memory_order_acquire))
    if (std::chrono::steady_clock::now() > end) return false;
    else std::this_thread::yield();
  return true;
}

bool nccl_token_ok(Engine& e, const Tensor& token) {
  try {
    e.wait_to_read(token.var());
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST_CASE("NCCL's check ahead: a rank's token completes while a peer's input is still computed; statuses settle after" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const par::Communicator meet = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (mpi_test::alone(n)) return;
  // Rank 1's input is held behind a gate; every other rank's is ready.
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  Tensor x = mpi_test::rank_tensor(*e, rank, 16);
  if (rank == 1)
    weft::push_tensor_op(Device::cpu(0), {}, {x}, [opened](weft::RunContext&, const weft::TensorData&) { opened.wait(); },
                         {.name = "late producer"});
  Tensor token = Tensor::empty(*e, Shape{0}, Device::cpu(0));
  auto after = std::make_shared<detail::CheckAfter>();
  detail::check_across(comm, detail::Kind::allreduce, x, {x}, token, par::ReduceOp::sum, {.name = "grad"}, after);
  if (rank != 1) {
    // The old check waited here for rank 1's status, which waits for the
    // gate, which opens only after the meeting below: it would hang.
    CHECK(nccl_token_ok(*e, token));
    CHECK(after->entered.load());
  }
  Tensor met = Tensor::zeros(*e, Shape{1}, Device::cpu(0));
  par::allreduce(meet, {met});
  e->wait_to_read(met.var());
  if (rank == 1) {
    CHECK_FALSE(after->entered.load());  // its own input is not ready yet
    gate.set_value();
    CHECK(nccl_token_ok(*e, token));
  }
  REQUIRE(nccl_check_settles(*after, 60s));
  CHECK(nccl_check_error(after->error) == "(no error)");
  e->wait_all();
  mpi_test::sync_ranks(*e);
}

TEST_CASE("NCCL's check ahead: a failed input on one rank lets every rank launch, then fails every rank naming it" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (mpi_test::alone(n)) return;
  Tensor x = mpi_test::rank_tensor(*e, rank, 8);
  if (rank == 1)
    weft::push_tensor_op(Device::cpu(0), {}, {x}, [](weft::RunContext&, const weft::TensorData&) {
      throw std::runtime_error("gradient overflow");
    }, {.name = "backward"});
  Tensor token = Tensor::empty(*e, Shape{0}, Device::cpu(0));
  auto after = std::make_shared<detail::CheckAfter>();
  detail::check_across(comm, detail::Kind::allreduce, x, {x}, token, par::ReduceOp::sum, {.name = "grad"}, after);
  // Every rank's token completes (the collective launches everywhere; rank
  // 1 from zeros) ...
  CHECK(nccl_token_ok(*e, token));
  CHECK(after->entered.load());
  // ... and the statuses fail it on every rank, naming rank 1.
  REQUIRE(nccl_check_settles(*after, 60s));
  const std::string message = nccl_check_error(after->error);
  MESSAGE("rank " << rank << ": " << message);
  CHECK(message.find("gradient overflow") != std::string::npos);
  if (rank != 1) CHECK(message.find("allreduce 'grad' #1") != std::string::npos);
  if (rank != 1) CHECK(message.find("rank 1's input failed") != std::string::npos);
  // The communicator goes on.
  Tensor y = mpi_test::rank_tensor(*e, rank, 8);
  par::allreduce(comm, {y});
  mpi_test::require_values(y, 8, [n](std::int64_t i) { return mpi_test::reduced(par::ReduceOp::sum, n, i); });
  try {
    e->wait_all();
  } catch (const std::exception&) {  // rank 1's failed producer, reported once
  }
  mpi_test::sync_ranks(*e);
}

TEST_CASE("NCCL's check ahead: collectives that differ fail every rank's token naming both, and nobody launches" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (mpi_test::alone(n)) return;
  Tensor x = mpi_test::rank_tensor(*e, rank, rank == 1 ? 5 : 4);
  Tensor token = Tensor::empty(*e, Shape{0}, Device::cpu(0));
  auto after = std::make_shared<detail::CheckAfter>();
  detail::check_across(comm, detail::Kind::allreduce, x, {x}, token, par::ReduceOp::sum, {.name = "grad"}, after);
  const std::string message = mpi_test::error_of(token);
  MESSAGE("rank " << rank << ": " << message);
  CHECK(message.find("rank 0 called allreduce(sum) 'grad' [4] float32 as #1; rank 1 called allreduce(sum) 'grad' "
                     "[5] float32 as #1") != std::string::npos);
  CHECK_FALSE(after->entered.load());
  mpi_test::sync_ranks(*e);
}

TEST_CASE("NCCL's message checks: shapes or dtypes that differ fail both ends naming both; a failed send names its rank" *
          doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded"});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = 30s});
  const int rank = comm.local_ranks()[0], n = comm.size();
  if (mpi_test::alone(n)) return;
  if (rank < 2) {
    const bool sending = rank == 0;
    const int peer = 1 - rank;
    const detail::Kind kind = sending ? detail::Kind::send : detail::Kind::recv;
    auto check = [&](const Tensor& t, const std::string& name) {
      Tensor token = Tensor::empty(*e, Shape{0}, Device::cpu(0));
      detail::check_message_across(comm, kind, t, peer, 0, token, {.name = name});
      return token;
    };
    // Shapes that differ (as many elements).
    const Tensor a = check(Tensor::zeros(*e, sending ? Shape{2, 3} : Shape{3, 2}, Device::cpu(0)), "act");
    CHECK(mpi_test::error_of(a).find("send and recv differ: rank 0 called send 'act' [2, 3] float32 to rank 1 as #1; "
                                     "rank 1 called recv 'act' [3, 2] float32 from rank 0 as #1") != std::string::npos);
    // Dtypes that differ.
    const Tensor b = check(Tensor::zeros(*e, Shape{6}, Device::cpu(0), sending ? weft::DType::float32 : weft::DType::float16),
                           "grad");
    CHECK(mpi_test::error_of(b).find("rank 0 called send 'grad' [6] float32 to rank 1 as #2; rank 1 called recv "
                                     "'grad' [6] float16 from rank 0 as #2") != std::string::npos);
    // A match passes on both ends.
    const Tensor c = check(Tensor::zeros(*e, Shape{2, 3}, Device::cpu(0)), "act");
    CHECK(mpi_test::error_of(c) == "(no error)");
    // The sender's input failed: the receiver is told why.
    Tensor bad = Tensor::zeros(*e, Shape{4}, Device::cpu(0));
    if (sending)
      weft::push_tensor_op(Device::cpu(0), {}, {bad}, [](weft::RunContext&, const weft::TensorData&) {
        throw std::runtime_error("activation overflow");
      }, {.name = "forward"});
    const Tensor d = check(bad, "act");
    const std::string message = mpi_test::error_of(d);
    CHECK(message.find("activation overflow") != std::string::npos);
    if (!sending) CHECK(message.find("rank 0's input failed") != std::string::npos);
    try {
      e->wait_all();
    } catch (const std::exception&) {  // the failed producer, reported once
    }
  }
  mpi_test::sync_ranks(*e);
}
