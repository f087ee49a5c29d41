// Devices as the engine sees them: which exist, op properties on CPU devices,
// allocators, GPU settings on a machine where no GPU answers, and the
// checked-call macro's message.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "weft/check_context.h"
#include "weft/engine.h"
#include "weft/gpu.h"

using namespace weft;
using namespace weft_test;

namespace {
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("a prioritized op on a cpu device runs ahead of every ordinary ready op" * doctest::timeout(60)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 1});
  Blocker blocker;
  e->push(blocker.body(), cpu0, {}, {}, {.name = "blocker"});
  REQUIRE(blocker.wait_entered());
  std::mutex m;
  std::vector<std::string> order;
  auto record = [&](const char* label) {
    return [&, label](RunContext&) {
      std::lock_guard lock(m);
      order.emplace_back(label);
    };
  };
  e->push(record("high"), cpu0, {}, {}, {.priority = 100, .name = "high"});
  e->push(record("normal"), cpu0, {}, {}, {.name = "normal"});
  e->push(record("prioritized"), cpu0, {}, {}, {.name = "prioritized", .property = OpProperty::prioritized});
  blocker.open();
  e->wait_all();
  CHECK(order == std::vector<std::string>{"prioritized", "high", "normal"});
}

TEST_CASE("copy properties on cpu devices run on the ordinary workers" * doctest::timeout(60)) {
  for_each_config(
      [](const Config& cfg) {
        auto engine = make_engine(cfg);
        Engine& e = *engine;
        int runs = 0;
        Var v = e.new_var("v");
        for (OpProperty p : {OpProperty::normal, OpProperty::copy_to_device, OpProperty::copy_from_device,
                             OpProperty::copy_peer, OpProperty::prioritized})
          e.push(
              [&](RunContext& ctx) {
                CHECK(ctx.device == Device::cpu(1));
                CHECK(ctx.gpu == nullptr);  // CPU ops get no stream
                ++runs;
              },
              Device::cpu(1), {}, {v}, {.name = std::string(to_string(p)), .property = p});
        e.wait_all();
        CHECK(runs == 5);
      },
      2);
}

TEST_CASE("the engine lists its devices and refuses the ones it lacks by name" * doctest::timeout(60)) {
  for (const char* kind : {"threaded", "naive"}) {
    auto e =
        Engine::create(EngineConfig{.kind = kind, .cpu_devices = 2, .workers_per_cpu_device = 1, .gpu_devices = 0});
    CHECK(e->devices() == std::vector<Device>{Device::cpu(0), Device::cpu(1)});
    std::string m = error_of([&] { e->push([](RunContext&) {}, Device::gpu(0), {}, {}, {.name = "k"}); });
    CHECK(has(m, "gpu(0)"));
    CHECK(has(m, "no GPU"));
    CHECK(has(m, "op 'k'"));
    m = error_of([&] { e->push([](RunContext&) {}, Device::cpu_pinned(0), {}, {}, {.name = "p"}); });
    CHECK(has(m, "cpu_pinned(0)"));
    CHECK(has(m, "run host ops on a cpu device"));
    CHECK(has(error_of([&] { (void)e->workers(Device::gpu(0)); }), "gpu(0)"));
  }
}

TEST_CASE("allocators exist for the engine's cpu devices and pinned memory only" * doctest::timeout(60)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = 1});
  CHECK(e->allocator(Device::cpu(1)).device() == Device::cpu(1));
  CHECK(e->allocator(Device::cpu_pinned(0)).device() == Device::cpu_pinned(0));
  CHECK(&e->allocator(Device::cpu(0)) != &e->allocator(Device::cpu(1)));
  CHECK(has(error_of([&] { (void)e->allocator(Device::cpu(2)); }), "cpu(2)"));
  if (gpu::device_count() == 0) CHECK(has(error_of([&] { (void)e->allocator(Device::gpu(0)); }), "gpu(0)"));
  // An op allocating from its device's allocator inside its body.
  Var v = e->new_var("buffer");
  Block block;
  e->push([&](RunContext& ctx) { block = ctx.engine->allocator(ctx.device).allocate(1000); }, Device::cpu(1), {}, {v});
  e->wait_to_read(v);
  CHECK(block.ptr != nullptr);
  CHECK(e->allocator(Device::cpu(1)).stats().in_use >= 1000);
  e->allocator(Device::cpu(1)).free(block);
  CHECK(e->allocator(Device::cpu(1)).stats().in_use == 0);
}

TEST_CASE("gpu settings: asking for more gpus than answer is an error naming the setting" * doctest::timeout(60)) {
  const int n = gpu::device_count();
  std::string m = error_of([&] { (void)Engine::create(EngineConfig{.gpu_devices = n + 1}); });
  CHECK(has(m, std::to_string(n + 1) + " GPU(s) asked for"));
  CHECK(has(m, "WEFT_GPU_DEVICES"));
  CHECK(has(error_of([&] { (void)Engine::create(EngineConfig{.gpu_devices = -2}); }), "gpu_devices"));
  CHECK(has(error_of([&] { (void)Engine::create(EngineConfig{.compute_streams_per_gpu = 65}); }),
            "compute_streams_per_gpu"));
  {
    EnvGuard env("WEFT_GPU_DEVICES", std::to_string(n + 3).c_str());
    CHECK(has(error_of([&] { (void)Engine::create(); }), "WEFT_GPU_DEVICES"));
  }
  if (n == 0) CHECK_NOTHROW((void)Engine::create(EngineConfig{.gpu_devices = 0}));
}

namespace {
const char* fake_status_name(int status) { return status == 2 ? "cudaErrorMemoryAllocation" : "?"; }
int fake_cuda_call(int status) { return status; }
weft::detail::Failure fake_failure(int status) {
  return status == 2 ? weft::detail::Failure::out_of_memory : weft::detail::Failure::device;
}
}  // namespace

TEST_CASE("a failing checked call names the call, its status, the op and the device" * doctest::timeout(60)) {
  for_each_config(
      [](const Config& cfg) {
        auto engine = make_engine(cfg);
        Engine& e = *engine;
        Var out = e.new_var("out");
        e.push([](RunContext&) { WEFT_DETAIL_CHECK("CUDA", fake_cuda_call(2), 0, fake_status_name, fake_failure); },
               Device::cpu(1), {}, {out}, {.name = "upload weights"});
        const std::string m = error_of([&] { e.wait_to_read(out); });
        CHECK(has(m, "fake_cuda_call(2) failed"));
        CHECK(has(m, "CUDA error 2 (cudaErrorMemoryAllocation)"));
        CHECK(has(m, "test_devices.cpp"));
        CHECK(has(m, "op 'upload weights' on cpu(1)"));
        // Outside an op the message names no op.
        // The status decides the type users catch: out of memory here, on the op's device.
        try {
          e.wait_to_read(out);  // reported once already: nothing left
          e.push([](RunContext&) { WEFT_DETAIL_CHECK("CUDA", fake_cuda_call(2), 0, fake_status_name, fake_failure); },
                 Device::cpu(1), {}, {out}, {.name = "upload weights"});
          e.wait_to_read(out);
          FAIL("no error");
        } catch (const weft::OutOfMemory& oom) {
          CHECK(oom.device() == Device::cpu(1));
        }
        const std::string outside =
            error_of([] { WEFT_DETAIL_CHECK("cuDNN", fake_cuda_call(3), 0, fake_status_name, fake_failure); });
        CHECK(has(outside, "cuDNN error 3"));
        CHECK(!has(outside, "op '"));
        CHECK_THROWS_AS(WEFT_DETAIL_CHECK("cuDNN", fake_cuda_call(3), 0, fake_status_name, fake_failure),
                        weft::DeviceError);
      },
      2);
}

namespace {
// A status text that only lives as long as the full expression (MPI's).
std::string fake_mpi_text(int status) { return "MPI_ERR_RANK: invalid rank " + std::to_string(status); }
}  // namespace
#define WEFT_TEST_FAKE_RANK 7

TEST_CASE("a checked call's failure: one message for every library, the call as written, the right error kind" *
          doctest::timeout(60)) {
  using weft::detail::CallFailure;
  using weft::detail::Failure;
  // Communication failures (MPI, NCCL) are CommunicationErrors naming the ranks known.
  try {
    WEFT_DETAIL_CHECKED_CALL("MPI", "fake_mpi_send(WEFT_TEST_FAKE_RANK)", fake_cuda_call(6),
                             [](int s) { return s != 0; }, fake_mpi_text,
                             [](int) { return CallFailure(Failure::communication, 3, 1); });
    FAIL("no error");
  } catch (const weft::CommunicationError& e) {
    CHECK(e.rank() == 3);
    CHECK(e.peer() == 1);
    CHECK(has(e.what(), "fake_mpi_send(WEFT_TEST_FAKE_RANK) failed: MPI error 6 (MPI_ERR_RANK: invalid rank 6) ["));
    CHECK(has(e.what(), "test_devices.cpp:"));
  }
  // The message shows the call as written, before its arguments' macros expand.
  const std::string written = error_of(
      [] { WEFT_DETAIL_CHECK("cuDNN", fake_cuda_call(WEFT_TEST_FAKE_RANK), 0, fake_status_name, fake_failure); });
  CHECK(has(written, "fake_cuda_call(WEFT_TEST_FAKE_RANK) failed: cuDNN error 7 (?)"));
  // A null status text reads "?"; a failure handled where it happened gets
  // the same message without the file:line.
  CHECK(weft::detail::call_failure_message("MPI", "MPI_Isend", 6, "MPI_ERR_RANK: invalid rank") ==
        "MPI_Isend failed: MPI error 6 (MPI_ERR_RANK: invalid rank)");
  CHECK_THROWS_WITH_AS(
      weft::detail::throw_call_failure("NCCL", "ncclAllReduce(...)", "x.cpp", 12, 4, "invalid argument",
                                       Failure::invalid_argument),
      "ncclAllReduce(...) failed: NCCL error 4 (invalid argument) [x.cpp:12]", weft::InvalidArgument);
  // Without a rank, a CommunicationError says none is known.
  try {
    weft::detail::throw_call_failure("MPI", "MPI_Comm_rank(...)", "x.cpp", 3, 5, "?", Failure::communication);
    FAIL("no error");
  } catch (const weft::CommunicationError& e) {
    CHECK(e.rank() == -1);
    CHECK(e.peer() == weft::CommunicationError::kNoPeer);
  }
}
