// GPU members across MPI processes (staged through host memory, or NCCL
// bootstrapped over MPI on real GPUs; simulated GPUs in CI: ctest parallel_mpi.gpu_np2 and gpu_np3 run these cases with
// WEFT_GPU_BACKEND=sim). Where no GPU answers every rank skips them alike, so
// the plain parallel_mpi runs stay in step. Checked: every collective exact
// against a serial reference at sizes 0, 1, prime and large (Weft's ring over
// MPI messages), send/recv around the ring of ranks, a failed input on one
// rank's GPU failing every rank, and two GPUs per process (in-process ring
// on the GPUs, then across processes); bfloat16 and float16 reductions
// rounded once where staged (half_values.h), within NCCL's per-hop rounding
// over NCCL; NCCL's send/recv in both directions (a GPU per rank, real GPUs
// only). Each scenario over the naive engine and the threaded one at 1,
// 2, 4 and 8 workers per device.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_workers.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"
#include "mpi_test_util.h"
#include "collectives/half_values.h"

namespace {

using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace par = weft::parallel;

// Every rank sees the same environment, so every rank skips alike.
bool no_gpus(int wanted) {
  if (weft::gpu::device_count() >= wanted) return false;
  std::printf("[weft-skip] fewer than %d GPUs answer (WEFT_GPU_BACKEND=sim simulates them)\n", wanted);
  std::fflush(stdout);
  return true;
}

template <class F>
void for_each_engine(int gpus, F&& fn) {
  {
    INFO("naive engine");
    auto e = Engine::create({.kind = "naive", .cpu_devices = 1, .gpu_devices = gpus});
    fn(*e);
    e->wait_all();
  }
  for (int workers : weft_test::worker_counts()) {
    INFO("threaded engine, " << workers << " workers per device");
    auto e = Engine::create({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = workers,
                             .gpu_devices = gpus, .compute_streams_per_gpu = workers});
    fn(*e);
    e->wait_all();
  }
}

using mpi_test::error_of;
using mpi_test::reduced;
using mpi_test::require_values;
using mpi_test::value;
Tensor member_tensor(Engine& e, int member, std::int64_t n, Device d) { return mpi_test::rank_tensor(e, member, n, d); }

const std::int64_t kCounts[] = {0, 1, 7, 1003, 300007};

}  // namespace

TEST_CASE("GPU members across processes: every collective exact, staged through host memory or over NCCL" *
          doctest::timeout(600)) {
  if (no_gpus(1)) return;
  for_each_engine(1, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::gpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size();
    CHECK(comm.device(rank) == Device::gpu(0));
    // Staged through host memory on simulated GPUs (and with WEFT_NCCL=0);
    // NCCL bootstrapped over MPI on real ones where it was built.
    const bool staged = comm.str().find("staged through host memory") != std::string::npos;
    CHECK((staged || (!weft::gpu::properties(0).simulated && comm.str().find("NCCL") != std::string::npos)));
    const Device g = Device::gpu(0);
    for (std::int64_t count : kCounts) {
      INFO("elements: " << count << ", ranks: " << n);
      for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
        Tensor t = member_tensor(e, rank, count, g);
        par::allreduce(comm, {t}, op, {.name = "grad"});
        require_values(t, count, [&](std::int64_t i) { return reduced(op, n, i); });
      }
      if (count > 2000) continue;
      for (int root = 0; root < n; ++root) {
        Tensor b = member_tensor(e, rank, count, g);
        par::broadcast(comm, {b}, {.name = "weights", .root = root});
        require_values(b, count, [&](std::int64_t i) { return value(root, i); });
        Tensor r = member_tensor(e, rank, count, g);
        par::reduce(comm, {r}, par::ReduceOp::sum, {.name = "loss", .root = root});
        require_values(r, count, [&](std::int64_t i) { return rank == root ? reduced(par::ReduceOp::sum, n, i) : value(rank, i); });
      }
      Tensor in = member_tensor(e, rank, count, g);
      Tensor part = Tensor::empty(e, Shape{par::chunk(count, n, rank).size()}, g);
      par::reduce_scatter(comm, {in}, {part}, par::ReduceOp::max, {.name = "shards"});
      const par::Chunk c = par::chunk(count, n, rank);
      require_values(part, c.size(), [&](std::int64_t i) { return reduced(par::ReduceOp::max, n, c.begin + i); });
      Tensor whole = Tensor::empty(e, Shape{count}, g);
      par::all_gather(comm, {part}, {whole}, {.name = "params"});
      require_values(whole, count, [&](std::int64_t i) { return reduced(par::ReduceOp::max, n, i); });
      require_values(in, count, [&](std::int64_t i) { return value(rank, i); });  // only read
    }
    par::barrier(comm, {.name = "between"});
    if (n > 1) {
      // Around the ring of ranks; the sender overwrites right after sending.
      // Odd ranks post their recv first (the naive engine completes each op
      // within its push, as blocking MPI calls would).
      const int right = (rank + 1) % n, left = (rank + n - 1) % n;
      for (std::int64_t count : {std::int64_t{1}, std::int64_t{1003}}) {
        Tensor x = member_tensor(e, rank, count, g), y = Tensor::zeros(e, Shape{count}, g);
        auto post_send = [&] {
          par::send(comm, x, right, {.name = "act"});
          x.copy_from(Tensor::full(e, Shape{count}, -7.0f, g));
        };
        auto post_recv = [&] { par::recv(comm, y, left, {.name = "act"}); };
        if (rank % 2) {
          post_recv();
          post_send();
        } else {
          post_send();
          post_recv();
        }
        require_values(y, count, [&](std::int64_t i) { return value(left, i); });
      }
    }
  });
}

TEST_CASE("GPU members across processes: a failed input on one rank's GPU fails every rank" * doctest::timeout(300)) {
  if (no_gpus(1)) return;
  for_each_engine(1, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, Device::gpu(0));
    const int rank = comm.local_ranks()[0], n = comm.size(), failing = n - 1;
    Tensor t = member_tensor(e, rank, 16, Device::gpu(0));
    if (rank == failing)
      weft::push_tensor_op(Device::gpu(0), {}, {t}, [](weft::RunContext&, const weft::TensorData&) {
        throw std::runtime_error("data loader died");
      }, {.name = "load"});
    par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "grad"});
    const std::string message = error_of(t);
    CHECK(message.find("data loader died") != std::string::npos);
    if (rank != failing) CHECK(message.find("rank " + std::to_string(failing) + "'s input failed: ") != std::string::npos);
    // The communicator goes on.
    Tensor ok = member_tensor(e, rank, 4, Device::gpu(0));
    par::allreduce(comm, {ok}, par::ReduceOp::max, {.name = "after"});
    require_values(ok, 4, [&](std::int64_t i) { return reduced(par::ReduceOp::max, n, i); });
  });
}

TEST_CASE("GPU members across processes: two GPUs per process, in-process ring then across processes" *
          doctest::timeout(600)) {
  if (no_gpus(2)) return;
  for_each_engine(2, [](Engine& e) {
    const par::Communicator comm = par::Communicator::mpi(e, {Device::gpu(0), Device::gpu(1)});
    const int n = comm.size(), first = comm.local_ranks()[0];
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{7}, std::int64_t{1003}, std::int64_t{300007}}) {
      INFO("elements: " << count << ", members: " << n);
      for (auto op : {par::ReduceOp::sum, par::ReduceOp::max, par::ReduceOp::average}) {
        std::vector<Tensor> ts{member_tensor(e, first, count, Device::gpu(0)),
                               member_tensor(e, first + 1, count, Device::gpu(1))};
        par::allreduce(comm, ts, op, {.name = "grad"});
        for (const Tensor& t : ts) require_values(t, count, [&](std::int64_t i) { return reduced(op, n, i); });
      }
      for (int root = 0; root < n && count < 2000; ++root) {
        std::vector<Tensor> ts{member_tensor(e, first, count, Device::gpu(0)),
                               member_tensor(e, first + 1, count, Device::gpu(1))};
        par::broadcast(comm, ts, {.name = "weights", .root = root});
        for (const Tensor& t : ts) require_values(t, count, [&](std::int64_t i) { return value(root, i); });
        std::vector<Tensor> rs{member_tensor(e, first, count, Device::gpu(0)),
                               member_tensor(e, first + 1, count, Device::gpu(1))};
        par::reduce(comm, rs, par::ReduceOp::average, {.name = "loss", .root = root});
        for (int k = 0; k < 2; ++k)
          require_values(rs[static_cast<std::size_t>(k)], count, [&](std::int64_t i) {
            return first + k == root ? reduced(par::ReduceOp::average, n, i) : value(first + k, i);
          });
      }
      std::vector<Tensor> inputs{member_tensor(e, first, count, Device::gpu(0)),
                                 member_tensor(e, first + 1, count, Device::gpu(1))};
      std::vector<Tensor> parts;
      for (int k = 0; k < 2; ++k)
        parts.push_back(Tensor::empty(e, Shape{par::chunk(count, n, first + k).size()}, Device::gpu(k)));
      par::reduce_scatter(comm, inputs, parts, par::ReduceOp::sum, {.name = "shards"});
      for (int k = 0; k < 2; ++k) {
        const par::Chunk c = par::chunk(count, n, first + k);
        require_values(parts[static_cast<std::size_t>(k)], c.size(),
                       [&](std::int64_t i) { return reduced(par::ReduceOp::sum, n, c.begin + i); });
      }
      std::vector<Tensor> wholes{Tensor::empty(e, Shape{count}, Device::gpu(0)), Tensor::empty(e, Shape{count}, Device::gpu(1))};
      par::all_gather(comm, parts, wholes, {.name = "params"});
      for (const Tensor& w : wholes) require_values(w, count, [&](std::int64_t i) { return reduced(par::ReduceOp::sum, n, i); });
    }
    par::barrier(comm);
  });
}

TEST_CASE("GPU members across processes: two GPUs per process, send and recv between any two members" *
          doctest::timeout(600)) {
  if (no_gpus(2)) return;
  for_each_engine(2, [](Engine& e) {
    const std::vector<Device> devices{Device::gpu(0), Device::gpu(1)};
    const par::Communicator comm = par::Communicator::mpi(e, devices);
    mpi_test::member_rings(e, comm, devices, e.kind() != "naive");
  });
}

TEST_CASE("GPU members across processes: bfloat16 and float16 reductions round once (staged) or per hop (NCCL)" *
          doctest::timeout(600)) {
  if (no_gpus(2)) return;
  for_each_engine(2, [](Engine& e) {
    for (weft::DType dtype : {weft::DType::bfloat16, weft::DType::float16}) {
      // One GPU per process (staged or NCCL), then two (in-process, then across).
      const par::Communicator single = par::Communicator::mpi(e, Device::gpu(0));
      const par::Communicator pair = par::Communicator::mpi(e, {Device::gpu(0), Device::gpu(1)});
      const bool nccl = single.str().find("NCCL") != std::string::npos;
      for (std::int64_t count : {std::int64_t{0}, std::int64_t{7}, std::int64_t{1003}, std::int64_t{70001}}) {
        INFO(half_test::name(dtype) << ", elements: " << count);
        auto tensor = [&](int member, Device d) {
          return Tensor::from_host(e, Shape{count}, half_test::values(member, count), d, dtype);
        };
        const int rank = single.local_ranks()[0];
        Tensor one = tensor(rank, Device::gpu(0));
        par::allreduce(single, {one}, par::ReduceOp::sum, {.name = "grad"});
        const int first = pair.local_ranks()[0];
        std::vector<Tensor> two{tensor(first, Device::gpu(0)), tensor(first + 1, Device::gpu(1))};
        par::allreduce(pair, two, par::ReduceOp::average, {.name = "grad"});
        auto check = [&](const Tensor& t, int n, par::ReduceOp op) {
          CHECK(t.dtype() == dtype);
          const std::vector<float> got = t.to_host();
          REQUIRE(static_cast<std::int64_t>(got.size()) == count);
          for (std::int64_t i = 0; i < count; ++i) {
            INFO("element " << i << ", members " << n);
            const float g = got[static_cast<std::size_t>(i)];
            if (!nccl) {
              REQUIRE(g == half_test::rounded_once(dtype, n, i, op));
              continue;
            }
            double exact = half_test::reference(n, i, op);
            if (op == par::ReduceOp::average) exact /= n;
            REQUIRE(std::abs(static_cast<double>(g) - exact) <= half_test::per_hop_bound(dtype, n, i));
          }
        };
        check(one, single.size(), par::ReduceOp::sum);
        for (const Tensor& t : two) check(t, pair.size(), par::ReduceOp::average);
      }
    }
  });
}

// NCCL's send/recv (ncclSend/ncclRecv on a communicator of two ranks per
// ordered pair): activations forward and gradients back between ring
// neighbours, as a pipeline sends them, exact; then shapes that differ fail
// both ends naming both, and the pair goes on. Needs the cuda backend with
// NCCL and a GPU per rank: rank r drives gpu(r) (NCCL refuses two ranks of
// one communicator on one GPU), so a one-GPU machine skips it at np2.
TEST_CASE("GPU send/recv across processes over NCCL: both directions exact, shapes that differ named on both ends" *
          doctest::timeout(300)) {
  if (no_gpus(1)) return;
  int ranks = 1, rank = 0;
  {
    auto probe = Engine::create({.kind = "threaded"});
    const par::Communicator world = par::Communicator::mpi(*probe, Device::cpu(0));
    ranks = world.size();
    rank = world.local_ranks()[0];
    mpi_test::sync_ranks(*probe);
  }
  if (mpi_test::alone(ranks)) return;
  if (weft::gpu::backend() != weft::gpu::Backend::cuda) {
    std::printf("[weft-skip] NCCL send/recv needs the cuda backend (simulated GPUs stage messages through host memory)\n");
    std::fflush(stdout);
    return;
  }
  if (weft::gpu::device_count() < ranks) {
    std::printf("[weft-skip] NCCL send/recv across %d processes needs a GPU per rank (NCCL refuses two ranks of one "
                "communicator on one GPU); this machine has %d\n", ranks, weft::gpu::device_count());
    std::fflush(stdout);
    return;
  }
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 1, .gpu_devices = ranks});
  const Device mine = Device::gpu(rank);
  const par::Communicator comm = par::Communicator::mpi(*e, mine);
  if (comm.str().find("NCCL") == std::string::npos) {
    std::printf("[weft-skip] this communicator is not NCCL's (WEFT_NCCL=0, or a build without NCCL): %s\n",
                comm.str().c_str());
    std::fflush(stdout);
    mpi_test::sync_ranks(*e);
    return;
  }
  const int right = (rank + 1) % ranks, left = (rank + ranks - 1) % ranks;
  constexpr int kMicroBatches = 3;
  constexpr std::int64_t kCount = 300007;  // beyond NCCL's buffers: a message in flight waits for its receiver
  std::vector<Tensor> forward, backward;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    // Sends before receives on every rank, in both directions: each ordered
    // pair has its own communicator and stream, so neither waits behind the other.
    par::send(comm, member_tensor(*e, rank + mb, kCount, mine), right, {.name = "activation " + std::to_string(mb)});
    par::send(comm, member_tensor(*e, rank + 10 * mb, kCount, mine), left, {.name = "gradient " + std::to_string(mb)});
  }
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    forward.push_back(Tensor::empty(*e, Shape{kCount}, mine));
    par::recv(comm, forward.back(), left, {.name = "activation " + std::to_string(mb)});
    backward.push_back(Tensor::empty(*e, Shape{kCount}, mine));
    par::recv(comm, backward.back(), right, {.name = "gradient " + std::to_string(mb)});
  }
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    require_values(forward[static_cast<std::size_t>(mb)], kCount, [&](std::int64_t i) { return value(left + mb, i); });
    require_values(backward[static_cast<std::size_t>(mb)], kCount,
                   [&](std::int64_t i) { return value(right + 10 * mb, i); });
  }
  // Shapes that differ (as many elements): both ends fail, naming both.
  if (rank < 2) {
    // Rank 0 sent rank 1 the activations, and at np2 the gradients too.
    const int sent = ranks == 2 ? 2 * kMicroBatches : kMicroBatches;
    const std::string want = "send and recv differ: rank 0 called send 'odd' [2, 3] float32 to rank 1 as #" +
                             std::to_string(sent + 1) + "; rank 1 called recv 'odd' [3, 2] float32 from rank 0";
    Tensor t = rank == 0 ? Tensor::full(*e, Shape{2, 3}, 1.0f, mine) : Tensor::empty(*e, Shape{3, 2}, mine);
    if (rank == 0) par::send(comm, t, 1, {.name = "odd"});
    else par::recv(comm, t, 0, {.name = "odd"});
    if (rank == 1) CHECK(error_of(t).find(want) != std::string::npos);
    if (rank == 0) CHECK_THROWS_WITH_AS(e->wait_all(), doctest::Contains(want.c_str()), weft::CommunicationError);
  }
  e->wait_all();
  mpi_test::sync_ranks(*e);
}
