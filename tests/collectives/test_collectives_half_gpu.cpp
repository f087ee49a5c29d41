// In-process collectives on bfloat16 and float16 tensors, GPU members. On
// simulated GPUs (the ring over peer copies, reducing float32 copies) every
// reduction equals the float64 reference rounded once, bit for bit, as on
// CPU members; on real GPUs NCCL reduces the halves itself, rounding each
// partial sum, and results are within that bound (half_values.h). Groups of
// 1 to all the GPUs, sizes 0, 1, prime and not divisible by the group;
// broadcast, all_gather and send/recv carry the halves unchanged. Each
// scenario over the naive engine and the threaded one at 1, 2, 4 and 8
// workers per device.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/half_values.h"
#include "gpu_test_util.h"
#include "weft/parallel/collectives.h"

namespace {

using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace par = weft::parallel;

const std::int64_t kHalfGpuSizes[] = {0, 1, 7, 13, 1003};
const DType kHalves[] = {DType::bfloat16, DType::float16};

std::vector<Device> half_gpu_members(int n) {
  std::vector<Device> d;
  for (int r = 0; r < n; ++r) d.push_back(Device::gpu(r));
  return d;
}

std::vector<Tensor> half_gpu_member_tensors(Engine& e, int n, std::int64_t count, DType dtype) {
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r)
    t.push_back(Tensor::from_host(e, Shape{count}, half_test::values(r, count), Device::gpu(r), dtype));
  return t;
}

// A reduced element: exact on simulated GPUs, within NCCL's per-hop
// rounding on real ones.
void check_reduced(float got, DType dtype, int n, std::int64_t i, par::ReduceOp op) {
  const float once = half_test::rounded_once(dtype, n, i, op);
  if (gputest::simulated()) {
    REQUIRE(got == once);
    return;
  }
  double exact = half_test::reference(n, i, op);
  if (op == par::ReduceOp::average) exact /= n;
  REQUIRE(std::fabs(static_cast<double>(got) - exact) <= half_test::per_hop_bound(dtype, n, i));
}

}  // namespace

TEST_CASE("gpu collectives - half: allreduce of bfloat16 and float16 within the dtype's rounding" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  gputest::with_each_gpu_engine(gputest::member_gpus(), [](Engine& e) {
    for (DType dtype : kHalves)
      for (int n = 1; n <= gputest::member_gpus(); ++n) {
        const par::Communicator comm = par::Communicator::local(e, half_gpu_members(n));
        for (std::int64_t count : kHalfGpuSizes)
          for (par::ReduceOp op : {par::ReduceOp::sum, par::ReduceOp::average, par::ReduceOp::max}) {
            INFO(half_test::name(dtype) << ", " << n << " GPUs, " << count << " elements, " << par::to_string(op));
            std::vector<Tensor> t = half_gpu_member_tensors(e, n, count, dtype);
            par::allreduce(comm, t, op, {.name = "grad"});
            for (int r = 0; r < n; ++r) {
              const std::vector<float> got = t[static_cast<std::size_t>(r)].to_host();
              REQUIRE(static_cast<std::int64_t>(got.size()) == count);
              for (std::int64_t i = 0; i < count; ++i) {
                INFO("member " << r << ", element " << i);
                check_reduced(got[static_cast<std::size_t>(i)], dtype, n, i, op);
              }
            }
          }
      }
  });
}

TEST_CASE("gpu collectives - half: reduce, reduce_scatter, broadcast, all_gather and send/recv" *
          doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  gputest::with_each_gpu_engine(gputest::member_gpus(), [](Engine& e) {
    for (DType dtype : kHalves)
      for (int n = 1; n <= gputest::member_gpus(); ++n) {
        const par::Communicator comm = par::Communicator::local(e, half_gpu_members(n));
        for (std::int64_t count : kHalfGpuSizes) {
          INFO(half_test::name(dtype) << ", " << n << " GPUs, " << count << " elements");
          const int root = n - 1;
          std::vector<Tensor> r = half_gpu_member_tensors(e, n, count, dtype), b = half_gpu_member_tensors(e, n, count, dtype);
          par::reduce(comm, r, par::ReduceOp::sum, {.name = "r", .root = root});
          par::broadcast(comm, b, {.name = "b", .root = root});
          std::vector<Tensor> in = half_gpu_member_tensors(e, n, count, dtype), parts, whole;
          for (int m = 0; m < n; ++m) {
            parts.push_back(Tensor::empty(e, Shape{par::chunk(count, n, m).size()}, Device::gpu(m), dtype));
            whole.push_back(Tensor::empty(e, Shape{count}, Device::gpu(m), dtype));
          }
          par::reduce_scatter(comm, in, parts, par::ReduceOp::sum, {.name = "rs"});
          // all_gather of the reduced parts: every member ends with the whole sum.
          par::all_gather(comm, parts, whole, {.name = "ag"});
          const std::vector<float> rv = r[static_cast<std::size_t>(root)].to_host();
          for (std::int64_t i = 0; i < count; ++i) check_reduced(rv[static_cast<std::size_t>(i)], dtype, n, i, par::ReduceOp::sum);
          for (int m = 0; m < n; ++m) {
            CHECK(b[static_cast<std::size_t>(m)].to_host() == half_test::values(root, count));
            if (m != root) CHECK(r[static_cast<std::size_t>(m)].to_host() == half_test::values(m, count));
            const std::vector<float> wv = whole[static_cast<std::size_t>(m)].to_host();
            for (std::int64_t i = 0; i < count; ++i) check_reduced(wv[static_cast<std::size_t>(i)], dtype, n, i, par::ReduceOp::sum);
          }
        }
        if (n < 2) continue;
        // send and recv along the chain of GPUs.
        std::vector<Tensor> got;
        for (int m = 0; m + 1 < n; ++m) {
          Tensor x = Tensor::from_host(e, Shape{13}, half_test::values(m, 13), Device::gpu(m), dtype);
          got.push_back(Tensor::empty(e, Shape{13}, Device::gpu(m + 1), dtype));
          par::send(comm, x, m + 1, {.name = "act"});
          par::recv(comm, got.back(), m, {.name = "act"});
        }
        for (int m = 0; m + 1 < n; ++m) CHECK(got[static_cast<std::size_t>(m)].to_host() == half_test::values(m, 13));
      }
  });
}
