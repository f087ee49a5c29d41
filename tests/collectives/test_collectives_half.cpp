// In-process collectives on bfloat16 and float16 tensors, CPU devices: the
// reductions (allreduce, reduce, reduce_scatter; sum, average and max) sum
// in float32 and round once, so they equal the float64 reference rounded
// once, bit for bit (half_values.h); broadcast, all_gather and send/recv move
// the half values unchanged. Groups of 1 to 4 members, sizes 0, 1, prime and
// not divisible by the group; members that give different dtypes are
// refused at push time, naming both. Each scenario over the naive engine and
// the threaded one at 1, 2, 4 and 8 workers per device.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/half_values.h"
#include "engine/engine_test_util.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace {

using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using weft_test::contains;
namespace par = weft::parallel;

constexpr int kHalfMaxMembers = 4;
const std::int64_t kHalfSizes[] = {0, 1, 7, 13, 1003};
const DType kHalves[] = {DType::bfloat16, DType::float16};

std::vector<Device> half_members(int n) {
  std::vector<Device> d;
  for (int r = 0; r < n; ++r) d.push_back(Device::cpu(r));
  return d;
}

std::vector<Tensor> half_member_tensors(Engine& e, int n, std::int64_t count, DType dtype, int salt = 0) {
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r)
    t.push_back(Tensor::from_host(e, Shape{count}, half_test::values(r, count, salt), Device::cpu(r), dtype));
  return t;
}

std::string half_what(DType dtype, int n, std::int64_t count) {
  return half_test::name(dtype) + ", " + std::to_string(n) + " members, " + std::to_string(count) + " elements";
}

}  // namespace

TEST_CASE("half collectives: allreduce of bfloat16 and float16 sums in float32 and rounds once") {
  weft_test::with_each_engine(kHalfMaxMembers, [](Engine& e) {
    for (DType dtype : kHalves)
      for (int n = 1; n <= kHalfMaxMembers; ++n) {
        const par::Communicator comm = par::Communicator::local(e, half_members(n));
        for (std::int64_t count : kHalfSizes)
          for (par::ReduceOp op : {par::ReduceOp::sum, par::ReduceOp::average, par::ReduceOp::max}) {
            INFO(half_what(dtype, n, count) << ", " << par::to_string(op));
            std::vector<Tensor> t = half_member_tensors(e, n, count, dtype);
            par::allreduce(comm, t, op, {.name = "grad"});
            for (int r = 0; r < n; ++r) {
              const Tensor& x = t[static_cast<std::size_t>(r)];
              CHECK(x.dtype() == dtype);
              const std::vector<float> got = x.to_host();
              REQUIRE(static_cast<std::int64_t>(got.size()) == count);
              for (std::int64_t i = 0; i < count; ++i) {
                INFO("member " << r << ", element " << i << ", float64 reference " << half_test::reference(n, i, op));
                REQUIRE(got[static_cast<std::size_t>(i)] == half_test::rounded_once(dtype, n, i, op));
              }
            }
          }
      }
  });
}

TEST_CASE("half collectives: reduce and reduce_scatter round once, broadcast and all_gather move halves unchanged") {
  weft_test::with_each_engine(kHalfMaxMembers, [](Engine& e) {
    for (DType dtype : kHalves)
      for (int n = 1; n <= kHalfMaxMembers; ++n) {
        const par::Communicator comm = par::Communicator::local(e, half_members(n));
        for (std::int64_t count : kHalfSizes) {
          INFO(half_what(dtype, n, count));
          for (int root = 0; root < n; ++root) {
            std::vector<Tensor> r = half_member_tensors(e, n, count, dtype);
            par::reduce(comm, r, par::ReduceOp::average, {.name = "r", .root = root});
            std::vector<Tensor> b = half_member_tensors(e, n, count, dtype);
            par::broadcast(comm, b, {.name = "b", .root = root});
            for (int m = 0; m < n; ++m) {
              const std::vector<float> rv = r[static_cast<std::size_t>(m)].to_host();
              const std::vector<float> bv = b[static_cast<std::size_t>(m)].to_host();
              for (std::int64_t i = 0; i < count; ++i) {
                const auto k = static_cast<std::size_t>(i);
                REQUIRE(rv[k] == (m == root ? half_test::rounded_once(dtype, n, i, par::ReduceOp::average)
                                            : half_test::value(m, i)));
                REQUIRE(bv[k] == half_test::value(root, i));
              }
            }
          }
          std::vector<Tensor> in = half_member_tensors(e, n, count, dtype), parts, pieces, whole;
          for (int m = 0; m < n; ++m) {
            const par::Chunk c = par::chunk(count, n, m);
            parts.push_back(Tensor::empty(e, Shape{c.size()}, Device::cpu(m), dtype));
            std::vector<float> own;
            for (std::int64_t i = c.begin; i < c.end; ++i) own.push_back(half_test::value(m, i, 1));
            pieces.push_back(Tensor::from_host(e, Shape{c.size()}, own, Device::cpu(m), dtype));
            whole.push_back(Tensor::empty(e, Shape{count}, Device::cpu(m), dtype));
          }
          par::reduce_scatter(comm, in, parts, par::ReduceOp::sum, {.name = "rs"});
          par::all_gather(comm, pieces, whole, {.name = "ag"});
          for (int m = 0; m < n; ++m) {
            const par::Chunk c = par::chunk(count, n, m);
            const std::vector<float> pv = parts[static_cast<std::size_t>(m)].to_host();
            for (std::int64_t i = c.begin; i < c.end; ++i)
              REQUIRE(pv[static_cast<std::size_t>(i - c.begin)] ==
                      half_test::rounded_once(dtype, n, i, par::ReduceOp::sum));
            const std::vector<float> wv = whole[static_cast<std::size_t>(m)].to_host();
            for (int owner = 0; owner < n; ++owner) {
              const par::Chunk oc = par::chunk(count, n, owner);
              for (std::int64_t i = oc.begin; i < oc.end; ++i)
                REQUIRE(wv[static_cast<std::size_t>(i)] == half_test::value(owner, i, 1));
            }
          }
        }
      }
  });
}

TEST_CASE("half collectives: send and recv carry bfloat16 and float16 unchanged") {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 2});
  const par::Communicator comm = par::Communicator::local(*e, half_members(2));
  for (DType dtype : kHalves) {
    INFO(half_test::name(dtype));
    Tensor sent = Tensor::from_host(*e, Shape{13}, half_test::values(0, 13), Device::cpu(0), dtype);
    Tensor got = Tensor::empty(*e, Shape{13}, Device::cpu(1), dtype);
    par::send(comm, sent, 1, {.name = "act"});
    par::recv(comm, got, 0, {.name = "act"});
    CHECK(got.to_host() == half_test::values(0, 13));
  }
}

TEST_CASE("half collectives: members that give different dtypes are refused, naming both") {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 2});
  const par::Communicator comm = par::Communicator::local(*e, half_members(2));
  const std::vector<float> v = half_test::values(0, 5);
  for (DType other : {DType::float32, DType::float16}) {
    INFO(half_test::name(other));
    Tensor a = Tensor::from_host(*e, Shape{5}, v, Device::cpu(0), DType::bfloat16).set_name("grad.a");
    Tensor b = Tensor::from_host(*e, Shape{5}, v, Device::cpu(1), other).set_name("grad.b");
    auto refused = [&](auto push) {
      try {
        push();
      } catch (const weft::InvalidArgument& err) {
        return std::string(err.what());
      }
      return std::string("(not refused)");
    };
    for (const std::string& message :
         {refused([&] { par::allreduce(comm, {a, b}, par::ReduceOp::sum, {.name = "mixed"}); }),
          refused([&] { par::broadcast(comm, {a, b}, {.name = "mixed"}); })}) {
      CHECK(contains(message, "dtypes differ"));
      CHECK(contains(message, "member 0 has Tensor 'grad.a' [5] bfloat16 on cpu(0)"));
      CHECK(contains(message, "member 1 has Tensor 'grad.b' [5] " + half_test::name(other) + " on cpu(1)"));
    }
  }
  // A reduce_scatter's outputs must have its inputs' dtype.
  std::vector<Tensor> in, out;
  for (int m = 0; m < 2; ++m) {
    in.push_back(Tensor::from_host(*e, Shape{4}, half_test::values(m, 4), Device::cpu(m), DType::bfloat16));
    out.push_back(Tensor::empty(*e, Shape{2}, Device::cpu(m), DType::float32));
  }
  CHECK_THROWS_WITH_AS(par::reduce_scatter(comm, in, out, par::ReduceOp::sum, {.name = "rs"}),
                       doctest::Contains("elements of bfloat16"), weft::InvalidArgument);
}
