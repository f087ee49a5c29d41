// push_tensor_op on GPUs: a GPU op's body enqueues accumulate/scale on its
// stream; an async CPU op may hold GPU tensors (their addresses handed to GPU
// ops it pushes, its completion after their work) and everything after it
// sees that work done; a synchronous CPU op still may not name a GPU tensor.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "weft/tensor_op.h"

using gputest::make_engine;
using weft::Device;
using weft::RunContext;
using weft::Shape;
using weft::Tensor;
using weft::TensorData;

TEST_CASE("gpu tensor op - accumulate and scale on a GPU stream equal the CPU's" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  const std::vector<float> a{1, -2, 3, 7, 0.5f}, b{4, 5, -6, 7, -0.25f};
  for (Device d : {Device::cpu(0), Device::gpu(0)})
    for (weft::Accumulate how : {weft::Accumulate::sum, weft::Accumulate::max}) {
      INFO(d.str());
      Tensor y = Tensor::from_host(*e, Shape{5}, a, d), x = Tensor::from_host(*e, Shape{5}, b, d);
      weft::push_tensor_op(d, {x}, {y}, [how](RunContext& ctx, const TensorData& io) {
        weft::accumulate(ctx, io.out(0), io.in(0), 5, how);
        weft::scale(ctx, io.out(0), 0.5f, 5);
      }, {.name = "accumulate then scale"});
      std::vector<float> want(5);
      for (std::size_t i = 0; i < 5; ++i)
        want[i] = 0.5f * (how == weft::Accumulate::max ? (a[i] < b[i] ? b[i] : a[i]) : a[i] + b[i]);
      CHECK(y.to_host() == want);
    }
}

TEST_CASE("gpu tensor op - an async CPU op holds GPU tensors while GPU ops it pushed work on them" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  for (const char* kind : {"naive", "threaded"}) {
    INFO(kind);
    auto e = make_engine({.kind = kind, .gpu_devices = 1});
    Tensor x = Tensor::full(*e, Shape{1000}, 2.0f, Device::gpu(0));
    Tensor fresh = Tensor::empty(*e, Shape{1000}, Device::gpu(0));  // allocated by the hold
    weft::push_tensor_op_async(Device::cpu(0), {x}, {fresh}, [](RunContext& ctx, const TensorData& d, weft::Completion done) {
      // Addresses only: a GPU op does the work, the last op completes the hold.
      auto v = std::make_shared<weft::SharedVar>(*ctx.engine, "held work");
      const float* src = d.in(0);
      float* dst = d.out(0);
      ctx.engine->push([src, dst](RunContext& g) {
        weft::gpu::memcpy_async(dst, src, 1000 * sizeof(float), weft::gpu::CopyKind::device_to_device, g.gpu->stream);
        weft::scale(g, dst, 3.0f, 1000);
      }, Device::gpu(0), {}, {*v}, {.name = "held work on gpu(0)"});
      ctx.engine->push([done, v] { done(); }, Device::cpu(0), {}, {*v}, {.name = "complete the hold"});
    }, {.name = "hold"});
    Tensor after = fresh + 1.0f;  // a GPU op ordered after the hold
    CHECK(after.to_host() == std::vector<float>(1000, 7.0f));
    CHECK(x.to_host() == std::vector<float>(1000, 2.0f));
  }
}

TEST_CASE("gpu tensor op - a synchronous CPU op naming a GPU tensor is refused at push time") {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  Tensor x = Tensor::zeros(*e, Shape{4}, Device::gpu(0));
  CHECK_THROWS_WITH_AS(weft::push_tensor_op(Device::cpu(0), {x}, {}, [](RunContext&, const TensorData&) {},
                                            {.name = "peek"}),
                       doctest::Contains("cannot touch"), weft::InvalidArgument);
  e->wait_all();
}
