// Errors on GPU paths: mixing devices in one op, devices that do not exist,
// out of device memory (after which the engine keeps working), and the
// RunContext a raw GPU op receives.
#include <atomic>
#include <functional>

#include "gpu_test_util.h"

using namespace gputest;
namespace ops = weft::ops;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const weft::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("not a weft::Error: " << e.what());
    return e.what();
  }
  FAIL_CHECK("no exception");
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("gpu errors - an op mixing gpu and cpu tensors names both devices" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  const Device gpu = Device::gpu(0), cpu = Device::cpu(0);
  const Tensor g = Tensor::ones(*e, Shape{4, 4}, gpu);
  const Tensor c = Tensor::ones(*e, Shape{4, 4}, cpu);
  Tensor gm = g, cm = c;
  const std::vector<std::pair<std::string, std::function<void()>>> cases{
      {"add", [&] { (void)ops::add(g, c); }},
      {"sub", [&] { (void)ops::sub(c, g); }},
      {"mul", [&] { (void)(g * c); }},
      {"relu_grad", [&] { (void)ops::relu_grad(g, c); }},
      {"matmul", [&] { (void)ops::matmul(c, g); }},
      {"axpy", [&] { ops::axpy(1.0f, c, gm); }},
      {"sgd_update", [&] { ops::sgd_update(cm, g, 0.1f); }},
      {"dense", [&] { (void)ops::dense(g, c, Tensor()); }},
      {"dense_backward", [&] { (void)ops::dense_backward(g, g, c); }},
      {"softmax_cross_entropy",
       [&] { (void)ops::softmax_cross_entropy(g, Tensor::zeros(*e, Shape{4}, cpu)); }},
      {"conv2d",
       [&] {
         (void)ops::conv2d(Tensor::ones(*e, Shape{1, 1, 4, 4}, gpu), Tensor::ones(*e, Shape{1, 1, 3, 3}, cpu),
                           Tensor());
       }},
  };
  for (const auto& [name, f] : cases) {
    const std::string msg = message_of(f);
    INFO(name << ": " << msg);
    CHECK(contains(msg, name));
    CHECK(contains(msg, "gpu(0)"));
    CHECK(contains(msg, "cpu(0)"));
  }
  // Nothing was pushed: the operands are untouched.
  for (float x : g.to_host()) REQUIRE(x == 1.0f);
  for (float x : c.to_host()) REQUIRE(x == 1.0f);
  // Copies are how data moves: they are fine.
  CHECK(ops::add(g, c.copy_to(gpu)).sum().item() == 32.0f);
  e->wait_all();
}

TEST_CASE("gpu errors - a gpu beyond device_count is an error naming it" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  const int count = weft::gpu::device_count();
  const Device missing = Device::gpu(count);
  const std::string name = missing.str();
  {
    const std::string msg = message_of([&] { weft::gpu::describe(count); });
    CHECK(contains(msg, "gpu(" + std::to_string(count) + ")"));
  }
  CHECK(!weft::gpu::describe(0).empty());
  {
    const std::string msg = message_of([&] { (void)make_engine({.kind = "threaded", .gpu_devices = count + 1}); });
    INFO(msg);
    CHECK(contains(msg, std::to_string(count + 1)));
    CHECK(contains(msg, std::to_string(count)));
  }
  for (const char* kind : {"threaded", "naive"}) {
    auto e = make_engine({.kind = kind, .gpu_devices = 1});
    const Device beyond = Device::gpu(1);  // this engine has only gpu(0)
    const std::vector<std::function<void()>> cases{
        [&] { (void)Tensor::zeros(*e, Shape{3}, beyond); },
        [&] { (void)Tensor::ones(*e, Shape{3}, Device::gpu(0)).copy_to(beyond); },
        [&] { (void)Tensor::from_host(*e, Shape{1}, std::vector<float>{1.0f}, beyond); },
        [&] { e->push([](weft::RunContext&) {}, beyond, {}, {}); },
        [&] { (void)e->allocator(beyond); },
        [&] { (void)e->workers(beyond); },
    };
    for (const auto& f : cases) {
      const std::string msg = message_of(f);
      INFO(kind << ": " << msg);
      CHECK(contains(msg, "gpu(1)"));
    }
    const std::string msg = message_of([&] { (void)Tensor::zeros(*e, Shape{3}, missing); });
    CHECK(contains(msg, name));
    // Still working.
    CHECK(Tensor::full(*e, Shape{5}, 2.0f, Device::gpu(0)).sum().item() == 10.0f);
    e->wait_all();
  }
}

TEST_CASE("gpu errors - out of gpu memory is an error and the engine keeps working" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  for (const char* kind : {"threaded", "naive"}) {
    INFO(kind);
    auto e = make_engine({.kind = kind, .gpu_devices = 1});
    const Device gpu = Device::gpu(0);
    // Some live memory first, so the allocator has a cache to release.
    Tensor keep = Tensor::full(*e, Shape{1 << 20}, 3.0f, gpu);
    (void)ops::mul_scalar(keep, 2.0f).sum().item();
    {
      const Tensor huge = Tensor::empty(*e, Shape{std::int64_t{1} << 38}, gpu);  // 1 TiB
      const std::string msg = message_of([&] { (void)huge.to_host(); });
      INFO(msg);
      CHECK(contains(msg, "out of memory on gpu(0)"));
      // Each failure is thrown once: wait_all has nothing left to report.
      // (`huge` has no memory: it must not be read again, see the report.)
      CHECK_NOTHROW(e->wait_all());
    }
    // An op whose output does not fit fails too, at its own wait.
    {
      const Tensor big_a = Tensor::zeros(*e, Shape{1, std::int64_t{1} << 19}, gpu);
      const Tensor big_b = Tensor::zeros(*e, Shape{std::int64_t{1} << 19, 1}, gpu);
      // [2^19, 2^19] floats = 1 TiB.
      const std::string msg = message_of([&] { (void)ops::matmul(big_a, big_b, true, true).to_host(); });
      CHECK(contains(msg, "out of memory on gpu(0)"));
      CHECK(contains(msg, "op 'matmul'"));  // raised inside the op: it names the op
      // Users catch it by type, with the device and the request.
      try {
        (void)ops::matmul(big_a, big_b, true, true).to_host();
        FAIL("no out-of-memory error");
      } catch (const weft::OutOfMemory& oom) {
        CHECK(oom.device() == gpu);
        CHECK(oom.requested() == (std::size_t{1} << 40));
      }
    }
    // The errors were reported; the engine goes on.
    CHECK_NOTHROW(e->wait_all());
    CHECK(ops::sum(keep).item() == doctest::Approx(3.0 * (1 << 20)));
    Tensor y = Tensor::uniform(*e, Shape{1000, 1000}, -1.0f, 1.0f, 9, gpu);
    const std::vector<float> want = Tensor::uniform(*e, Shape{1000, 1000}, -1.0f, 1.0f, 9, Device::cpu(0)).to_host();
    expect_close(ops::mul_scalar(y, 2.0f).to_host(), ops::mul_scalar(Tensor::from_host(*e, Shape{1000, 1000}, want,
                                                                                         Device::cpu(0)),
                                                                      2.0f)
                                                         .to_host(),
                 0, 1e-6, std::string("after OOM on ") + kind);
    const weft::MemoryStats stats = weft::memory_stats(*e, gpu);
    MESSAGE(kind << ": gpu(0) in use " << stats.in_use << " bytes, reserved " << stats.reserved);
    CHECK(stats.in_use < (std::size_t{1} << 30));
    CHECK_NOTHROW(e->wait_all());
  }
}

TEST_CASE("gpu errors - gpu ops get a stream and handles and may not be async" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  for (const char* kind : {"threaded", "naive"}) {
    INFO(kind);
    auto e = make_engine({.kind = kind, .gpu_devices = 1});
    const weft::Var v = e->new_var("v");
    std::atomic<int> gpu_ok{0}, cpu_ok{0};
    for (auto property : {weft::OpProperty::normal, weft::OpProperty::copy_to_device,
                          weft::OpProperty::copy_from_device, weft::OpProperty::prioritized}) {
      e->push(
          [&, property](weft::RunContext& ctx) {
            const bool compute = property == weft::OpProperty::normal || property == weft::OpProperty::prioritized;
            // Library handles exist on CUDA only: simulated GPUs run CPU kernels.
            const bool handles = ctx.gpu != nullptr && ctx.gpu->cublas != nullptr && ctx.gpu->cudnn != nullptr;
            if (ctx.gpu != nullptr && ctx.device == Device::gpu(0) && ctx.gpu->device == Device::gpu(0) &&
                ctx.gpu->stream != nullptr && (!compute || handles || simulated()))
              ++gpu_ok;
          },
          Device::gpu(0), {}, {v}, weft::OpOptions{0, "probe", property});
    }
    e->push([&](weft::RunContext& ctx) { cpu_ok += ctx.gpu == nullptr; }, Device::cpu(0), {v}, {});
    e->wait_all();
    CHECK(gpu_ok == 4);
    CHECK(cpu_ok == 1);
    const std::string msg = message_of([&] {
      e->push_async([](weft::RunContext&, weft::Completion done) { done(); }, Device::gpu(0), {}, {v});
    });
    CHECK(contains(msg, "gpu(0)"));
    // An exception from a GPU op reaches the waiter and the variable recovers.
    e->push([](weft::RunContext&) { throw weft::Error("boom on the gpu"); }, Device::gpu(0), {}, {v},
            weft::OpOptions{0, "thrower"});
    CHECK(contains(message_of([&] { e->wait_to_read(v); }), "boom on the gpu"));
    int after = 0;
    e->push([&](weft::RunContext&) { ++after; }, Device::gpu(0), {}, {v});
    e->wait_to_read(v);
    CHECK(after == 1);
    e->delete_var(v);
    e->wait_all();
  }
}
