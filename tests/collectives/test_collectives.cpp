// In-process collectives on CPU devices: every collective bit-exact against a
// serial reference (integer values in float), groups of 1 to 4 members,
// sizes 0, 1, prime and not divisible by the group; many collectives in
// flight at once; collectives interleaved with compute on the same tensors;
// a failed input failing every member by name instead of hanging; bad input
// refused at push time. Each scenario over the naive engine and the threaded
// one at 1, 2, 4 and 8 workers per device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "collectives/collective_values.h"
#include "weft/engine.h"
#include "weft/op_graph.h"
#include "weft/error.h"
#include "weft/ops.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"

namespace {

using weft::Device;
using weft_test::contains;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace par = weft::parallel;

constexpr int kMaxMembers = 4;
const std::int64_t kSizes[] = {0, 1, 7, 13, 1003};

// Each scenario over the naive engine and the threaded one at 1, 2, 4 and 8
// workers per device.
std::vector<Device> devices(int n) {
  std::vector<Device> d;
  for (int r = 0; r < n; ++r) d.push_back(Device::cpu(r));
  return d;
}

using collective_test::reduced;
using collective_test::values;

std::vector<Tensor> member_tensors(Engine& e, int n, std::int64_t count, int salt = 0) {
  return collective_test::member_tensors(e, n, count, [](int r) { return Device::cpu(r); }, salt);
}

std::string what(int n, std::int64_t count) { return std::to_string(n) + " members, " + std::to_string(count) + " elements"; }

TEST_CASE("allreduce: sum, average and max, bit-exact for 1 to 4 members and awkward sizes") {
  weft_test::with_each_engine(kMaxMembers, [](Engine& e) {
    for (int n = 1; n <= kMaxMembers; ++n) {
      const par::Communicator comm = par::Communicator::local(e, devices(n));
      for (std::int64_t count : kSizes)
        for (par::ReduceOp op : {par::ReduceOp::sum, par::ReduceOp::average, par::ReduceOp::max}) {
          INFO(what(n, count) << ", " << par::to_string(op));
          std::vector<Tensor> t = member_tensors(e, n, count);
          par::allreduce(comm, t, op, {.name = "grad"});
          const std::vector<float> want = reduced(n, count, op);
          for (int r = 0; r < n; ++r) CHECK(t[static_cast<std::size_t>(r)].to_host() == want);
        }
    }
  });
}

TEST_CASE("broadcast and reduce: from and to every root") {
  weft_test::with_each_engine(kMaxMembers, [](Engine& e) {
    for (int n = 1; n <= kMaxMembers; ++n) {
      const par::Communicator comm = par::Communicator::local(e, devices(n));
      for (std::int64_t count : kSizes)
        for (int root = 0; root < n; ++root) {
          INFO(what(n, count) << ", root " << root);
          std::vector<Tensor> b = member_tensors(e, n, count);
          par::broadcast(comm, b, {.name = "w", .root = root});
          for (int r = 0; r < n; ++r) CHECK(b[static_cast<std::size_t>(r)].to_host() == values(root, count));

          std::vector<Tensor> t = member_tensors(e, n, count);
          par::reduce(comm, t, par::ReduceOp::sum, {.name = "loss", .root = root});
          for (int r = 0; r < n; ++r)
            CHECK(t[static_cast<std::size_t>(r)].to_host() ==
                  (r == root ? reduced(n, count, par::ReduceOp::sum) : values(r, count)));
        }
    }
  });
}

TEST_CASE("reduce_scatter and all_gather split and join by chunk, sizes not divisible by the group") {
  CHECK(par::chunk(10, 4, 0).size() == 3);
  CHECK(par::chunk(10, 4, 1).begin == 3);
  CHECK(par::chunk(10, 4, 3).end == 10);
  CHECK(par::chunk(2, 4, 3).size() == 0);
  weft_test::with_each_engine(kMaxMembers, [](Engine& e) {
    for (int n = 1; n <= kMaxMembers; ++n) {
      const par::Communicator comm = par::Communicator::local(e, devices(n));
      for (std::int64_t count : kSizes) {
        INFO(what(n, count));
        const std::vector<Tensor> in = member_tensors(e, n, count);
        std::vector<Tensor> parts, full;
        for (int r = 0; r < n; ++r) {
          parts.push_back(Tensor::empty(e, Shape{par::chunk(count, n, r).size()}, Device::cpu(r)));
          full.push_back(Tensor::empty(e, Shape{count}, Device::cpu(r)));
        }
        par::reduce_scatter(comm, in, parts, par::ReduceOp::sum, {.name = "grads"});
        par::all_gather(comm, parts, full, {.name = "params"});
        const std::vector<float> sum = reduced(n, count, par::ReduceOp::sum);
        for (int r = 0; r < n; ++r) {
          const par::Chunk k = par::chunk(count, n, r);
          CHECK(parts[static_cast<std::size_t>(r)].to_host() ==
                std::vector<float>(sum.begin() + k.begin, sum.begin() + k.end));
          CHECK(full[static_cast<std::size_t>(r)].to_host() == sum);
          CHECK(in[static_cast<std::size_t>(r)].to_host() == values(r, count));  // inputs are only read
        }
      }
    }
  });
}

TEST_CASE("many collectives in flight, interleaved with compute on the same tensors") {
  weft_test::with_each_engine(kMaxMembers, [](Engine& e) {
    const int n = kMaxMembers;
    const par::Communicator comm = par::Communicator::local(e, devices(n));
    const std::int64_t count = 257;
    std::vector<Tensor> t = member_tensors(e, n, count);
    std::vector<std::vector<float>> want(n);
    for (int r = 0; r < n; ++r) want[static_cast<std::size_t>(r)] = values(r, count);
    std::mt19937 rng(7);
    // Each round: every member adds its rank to its tensor, then an
    // allreduce (sum) or a broadcast from a random root; no wait in between.
    for (int round = 0; round < 12; ++round) {
      for (int r = 0; r < n; ++r) {
        t[static_cast<std::size_t>(r)] = t[static_cast<std::size_t>(r)] + static_cast<float>(r);
        for (float& x : want[static_cast<std::size_t>(r)]) x += static_cast<float>(r);
      }
      if (rng() % 2) {
        par::allreduce(comm, t, par::ReduceOp::max, {.name = "round " + std::to_string(round)});
        std::vector<float> m = want[0];
        for (int r = 1; r < n; ++r)
          for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::max(m[i], want[static_cast<std::size_t>(r)][i]);
        for (auto& w : want) w = m;
      } else {
        const int root = static_cast<int>(rng() % n);
        par::broadcast(comm, t, {.name = "round " + std::to_string(round), .root = root});
        const std::vector<float> b = want[static_cast<std::size_t>(root)];
        for (auto& w : want) w = b;
      }
    }
    // And several independent allreduces at once, waited for in reverse.
    std::vector<std::vector<Tensor>> many;
    for (int k = 0; k < 8; ++k) {
      many.push_back(member_tensors(e, n, 101 + k, k));
      par::allreduce(comm, many.back(), par::ReduceOp::sum, {.name = "bucket " + std::to_string(k)});
    }
    par::barrier(comm, {.name = "end of step"});
    for (int k = 7; k >= 0; --k)
      for (int r = 0; r < n; ++r)
        CHECK(many[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)].to_host() ==
              reduced(n, 101 + k, par::ReduceOp::sum, k));
    for (int r = 0; r < n; ++r) CHECK(t[static_cast<std::size_t>(r)].to_host() == want[static_cast<std::size_t>(r)]);
  });
}

TEST_CASE("a failed input fails the collective on every member, without hanging") {
  weft_test::with_each_engine(kMaxMembers, [](Engine& e) {
    const int n = 3;
    const par::Communicator comm = par::Communicator::local(e, devices(n));
    std::vector<Tensor> t = member_tensors(e, n, 10);
    weft::push_tensor_op(Device::cpu(1), {}, {t[1]},
                         [](weft::RunContext&, const weft::TensorData&) { throw std::runtime_error("data loader died"); },
                         {.name = "load member 1"});
    par::allreduce(comm, t, par::ReduceOp::sum, {.name = "grad.fc1"});
    std::vector<Tensor> after(n);  // each member's tensor read after the collective: skipped too
    for (int r = 0; r < n; ++r) after[static_cast<std::size_t>(r)] = t[static_cast<std::size_t>(r)] + 1.0f;
    // Every member's tensor carries the failure, reported once (the first
    // wait that reaches it throws it, with its own type).
    try {
      e.wait_to_read(after[0].var());
      FAIL("member 0's allreduce did not fail");
    } catch (const std::runtime_error& err) {
      CHECK(std::string(err.what()) == "data loader died");
    }
    for (int r = 0; r < n; ++r) CHECK_NOTHROW(e.wait_to_read(t[static_cast<std::size_t>(r)].var()));
    // The engine and the communicator go on.
    std::vector<Tensor> u = member_tensors(e, n, 5);
    par::allreduce(comm, u);
    CHECK(u[2].to_host() == reduced(n, 5, par::ReduceOp::sum));
  });
}

TEST_CASE("bad input is refused at push time, naming the collective and the member") {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = kMaxMembers, .workers_per_cpu_device = 1});
  const par::Communicator comm = par::Communicator::local(*e, devices(2));
  CHECK(comm.str() == "in-process communicator of 2 members: cpu(0), cpu(1)");
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const weft::InvalidArgument& err) {
      return std::string(err.what());
    }
    return std::string("(no InvalidArgument)");
  };
  const std::vector<Tensor> ok = member_tensors(*e, 2, 4);
  const Tensor on0 = Tensor::zeros(*e, Shape{4}, Device::cpu(0));
  CHECK(contains(message([&] { par::allreduce(comm, {ok[0]}, par::ReduceOp::sum, {.name = "g"}); }),
                 "1 tensors given, one per member this process drives wanted (2)"));
  CHECK(contains(message([&] { par::allreduce(comm, {ok[0], on0}); }), "is not on the member's device cpu(1)"));
  CHECK(contains(message([&] { par::allreduce(comm, {ok[0], ok[0]}); }), "same tensor"));
  const Tensor longer = Tensor::zeros(*e, Shape{5}, Device::cpu(1));
  CHECK(contains(message([&] { par::allreduce(comm, {ok[0], longer}, par::ReduceOp::sum, {.name = "g"}); }),
                 "tensor sizes differ"));
  const Tensor halves = Tensor::empty(*e, Shape{4}, Device::cpu(1), weft::DType::bfloat16);
  CHECK(contains(message([&] { par::allreduce(comm, {ok[0], halves}); }), "dtypes differ"));
  CHECK(contains(message([&] { par::broadcast(comm, ok, {.root = 2}); }), "root 2 is not a member"));
  CHECK(contains(message([&] { par::allreduce(comm, {ok[0], Tensor()}); }), "undefined"));
  const std::vector<Tensor> bad_parts{Tensor::zeros(*e, Shape{3}, Device::cpu(0)),
                                      Tensor::zeros(*e, Shape{2}, Device::cpu(1))};
  CHECK(contains(message([&] { par::reduce_scatter(comm, ok, bad_parts); }), "should have 2 elements"));
  CHECK(contains(message([&] { par::Communicator::local(*e, {Device::cpu(0), Device::cpu(0)}); }),
                 "both cpu(0)"));
  CHECK(contains(message([&] { par::Communicator::local(*e, {Device::cpu(9)}); }), "does not have"));
  CHECK(contains(message([&] { par::Communicator::local(*e, {}); }), "no devices"));
  e->wait_all();
}

TEST_CASE("a collective pushed while capturing is refused, and the capture and the communicator go on") {
  // A captured op runs at every replay, a collective once: replaying one
  // crashed before the refusal.
  weft_test::with_each_engine(kMaxMembers, [](Engine& e) {
    const par::Communicator comm = par::Communicator::local(e, devices(2));
    std::vector<Tensor> t = member_tensors(e, 2, 5);
    Tensor doubled = Tensor::zeros(e, Shape{5}, Device::cpu(0));
    e.begin_capture();
    CHECK_THROWS_WITH_AS(par::allreduce(comm, t, par::ReduceOp::sum, {.name = "grad"}),
                         doctest::Contains("allreduce 'grad' on in-process communicator of 2 members: cpu(0), cpu(1)): "
                                           "pushed while this thread captures ops for the engine (begin_capture)"),
                         weft::InvalidArgument);
    CHECK_THROWS_WITH_AS(par::send(comm, t[0], 1), doctest::Contains("captures ops"), weft::InvalidArgument);
    weft::push_tensor_op(Device::cpu(0), {t[0]}, {doubled}, [](weft::RunContext&, const weft::TensorData& d) {
      const auto* in = static_cast<const float*>(d.inputs[0]);
      auto* out = static_cast<float*>(d.outputs[0]);
      for (int i = 0; i < 5; ++i) out[i] = 2 * in[i];
    }, {.name = "double"});
    weft::OpGraph graph = e.end_capture();
    // Outside the capture the same call is taken, with the number the
    // refused ones did not take; the graph replays after it.
    par::allreduce(comm, t, par::ReduceOp::sum, {.name = "grad"});
    e.replay(graph);
    const std::vector<float> want = reduced(2, 5, par::ReduceOp::sum);
    CHECK(t[0].to_host() == want);
    CHECK(t[1].to_host() == want);
    std::vector<float> twice = want;
    for (float& x : twice) x *= 2;
    CHECK(doubled.to_host() == twice);
  });
}

}  // namespace

TEST_CASE("send and recv between members: snapshots in push order, a pipeline's hand-off") {
  weft_test::with_each_engine(kMaxMembers, [](Engine& e) {
    const par::Communicator comm = par::Communicator::local(e, devices(3));
    for (std::int64_t count : kSizes) {
      INFO(what(3, count));
      // A three-stage chain, twice: member 0 -> 1 -> 2, each stage adding
      // its number, the sender overwriting its tensor right after sending.
      std::vector<Tensor> results;
      for (int round = 0; round < 2; ++round) {
        Tensor x = Tensor::from_host(e, Shape{count}, values(0, count, round), Device::cpu(0));
        par::send(comm, x, 1, {.name = "act"});
        weft::push_tensor_op(Device::cpu(0), {}, {x}, [count](weft::RunContext&, const weft::TensorData& d) {
          for (std::int64_t i = 0; i < count; ++i) d.out(0)[i] = -7.0f;
        }, {.name = "next batch"});
        Tensor y = Tensor::zeros(e, Shape{count}, Device::cpu(1));
        par::recv(comm, y, 0, {.name = "act"});
        weft::push_tensor_op(Device::cpu(1), {}, {y}, [count](weft::RunContext&, const weft::TensorData& d) {
          for (std::int64_t i = 0; i < count; ++i) d.out(0)[i] += 1.0f;
        }, {.name = "stage 1"});
        par::send(comm, y, 2, {.name = "act"});
        Tensor z = Tensor::zeros(e, Shape{count}, Device::cpu(2));
        par::recv(comm, z, 1, {.name = "act"});
        results.push_back(z);
      }
      for (int round = 0; round < 2; ++round) {
        std::vector<float> want = values(0, count, round);
        for (float& v : want) v += 1.0f;
        CHECK(results[static_cast<std::size_t>(round)].to_host() == want);
      }
    }
  });
}

TEST_CASE("send and recv refuse what cannot meet: no send before the recv, sizes that differ, bad peers") {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = kMaxMembers, .workers_per_cpu_device = 1});
  const par::Communicator comm = par::Communicator::local(*e, devices(2));
  const Tensor a = Tensor::zeros(*e, Shape{4}, Device::cpu(0));
  const Tensor b = Tensor::zeros(*e, Shape{5}, Device::cpu(1));
  CHECK_THROWS_WITH_AS(par::recv(comm, b, 0, {.name = "early"}),
                       doctest::Contains("no send from member 0 to member 1 is waiting for it"), weft::InvalidArgument);
  par::send(comm, a, 1, {.name = "x"});
  CHECK_THROWS_WITH_AS(par::recv(comm, b, 0), doctest::Contains("member 0 sent 4 elements of float32, this recv wants 5"),
                       weft::InvalidArgument);
  // As many elements in another shape: refused too, naming both shapes.
  const Tensor square = Tensor::zeros(*e, Shape{2, 2}, Device::cpu(1));
  CHECK_THROWS_WITH_AS(par::recv(comm, square, 0),
                       doctest::Contains("member 0 sent shape [4], this recv wants shape [2, 2]"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::send(comm, a, 0), doctest::Contains("is the member itself"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::send(comm, a, 2), doctest::Contains("peer 2 is not a member"), weft::InvalidArgument);
  const Tensor elsewhere = Tensor::zeros(*e, Shape{4}, Device::cpu(3));
  CHECK_THROWS_WITH_AS(par::send(comm, elsewhere, 1), doctest::Contains("not on the device of a member"),
                       weft::InvalidArgument);
  // The refused recv took nothing: the send still meets a matching recv.
  const Tensor c = Tensor::ones(*e, Shape{4}, Device::cpu(1));
  par::recv(comm, c, 0);
  CHECK(c.to_host() == std::vector<float>(4, 0.0f));
  e->wait_all();
}

TEST_CASE("split in one process: one colour gives a communicator over the same members, and other colours are refused") {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 3, .workers_per_cpu_device = 1});
  const par::Communicator comm = par::Communicator::local(*e, devices(3));
  const std::vector<Tensor> before = member_tensors(*e, 3, 7);
  par::allreduce(comm, before, par::ReduceOp::sum, {.name = "before"});
  const par::Communicator same = comm.split({4, 4, 4});
  CHECK(same.size() == 3);
  CHECK(same.local_ranks() == comm.local_ranks());
  CHECK(same.str() == comm.str());
  for (int r = 0; r < 3; ++r) CHECK(same.device(r) == Device::cpu(r));
  std::vector<Tensor> t = member_tensors(*e, 3, 13);
  par::allreduce(same, t, par::ReduceOp::sum, {.name = "grad"});
  const std::vector<float> want = reduced(3, 13, par::ReduceOp::sum);
  for (int r = 0; r < 3; ++r) CHECK(t[static_cast<std::size_t>(r)].to_host() == want);
  for (const Tensor& b : before) CHECK(b.to_host() == reduced(3, 7, par::ReduceOp::sum));

  CHECK_THROWS_WITH_AS((void)comm.split({0, 1, 0}),
                       doctest::Contains("members 0 and 1 have colours 0 and 1 (colors {0, 1, 0}); an in-process "
                                         "communicator's members share one colour: make a Communicator::local over "
                                         "each subset instead"),
                       weft::InvalidArgument);
  CHECK_THROWS_WITH_AS((void)comm.split({0, 0}), doctest::Contains("2 colors for 3 members"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS((void)comm.split({0, -2, 0}), doctest::Contains("member 1's colour is -2"),
                       weft::InvalidArgument);
  e->wait_all();
}
