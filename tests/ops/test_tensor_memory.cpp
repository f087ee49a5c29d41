// A tensor's memory: views (one storage and Var, ops ordered as on one
// tensor), Tensor::empty taking its memory at its first use (and not before,
// however far ahead the frontend pushes), a later writer of a tensor whose
// creating op failed, and the accounting by role (MemoryRole) in the
// allocator's statistics and the profiler's memory track and peaks. Each
// scenario on the naive engine and the threaded one at several worker counts.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "weft/ops.h"
#include "weft/tensor.h"

namespace {

using weft::Device;
using weft::Engine;
using weft::MemoryRole;
using weft::Shape;
using weft::SharedVar;
using weft::Tensor;
using weft_test::contains;
using weft_test::error_of;

std::size_t role_bytes(const weft::MemoryStats& m, MemoryRole r) { return m.in_use_by_role[static_cast<std::size_t>(r)]; }

std::vector<float> iota(std::int64_t n, float from = 0) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = from + static_cast<float>(i);
  return v;
}

}  // namespace

TEST_CASE("tensor memory: a view reads and writes its part of the storage, ordered with the whole" *
          doctest::timeout(60)) {
  weft_test::with_each_engine(1, [](Engine& e) {
    Tensor flat = Tensor::from_host(e, Shape{10}, iota(10));
    Tensor a = flat.view(0, Shape{2, 2});
    const Tensor b = flat.view(4, Shape{6});
    CHECK(a.var() == flat.var());
    CHECK(b.storage_offset() == 4);
    CHECK(b.reshape(Shape{2, 3}).storage_offset() == 4);
    CHECK(a.to_host() == std::vector<float>{0, 1, 2, 3});
    // Writing through a view: the rest of the storage is untouched, and a
    // read of the whole pushed after it sees the write.
    Tensor bw = b;
    bw.copy_from(Tensor::full(e, Shape{6}, -1.0f));
    weft::ops::axpy(2.0f, Tensor::ones(e, Shape{2, 2}), a);
    CHECK(flat.to_host() == std::vector<float>{2, 3, 4, 5, -1, -1, -1, -1, -1, -1});
    // A view of a view; ops take views as inputs and outputs.
    const Tensor inner = b.view(2, Shape{2});
    CHECK(inner.storage_offset() == 6);
    CHECK(weft::ops::add(inner, inner).to_host() == std::vector<float>{-2, -2});
    CHECK(a.overlaps(flat));
    CHECK_FALSE(a.overlaps(b));
    CHECK(b.overlaps(inner));
    CHECK_FALSE(a.overlaps(Tensor::zeros(e, Shape{4})));
  });
}

TEST_CASE("tensor memory: bad views and copies between overlapping views name the problem" * doctest::timeout(60)) {
  weft_test::with_each_engine(1, [](Engine& e) {
    Tensor flat = Tensor::zeros(e, Shape{8}).set_name("flat");
    CHECK(contains(error_of([&] { (void)flat.view(6, Shape{3}); }), "elements [6, 9)"));
    CHECK(contains(error_of([&] { (void)flat.view(6, Shape{3}); }), "'flat'"));
    CHECK(contains(error_of([&] { (void)flat.view(-1, Shape{1}); }), "do not lie within"));
    Tensor left = flat.view(0, Shape{4});
    CHECK(contains(error_of([&] { left.copy_from(flat.view(2, Shape{4})); }), "overlapping parts of one storage"));
    // Several views as the outputs of one op: they must not overlap.
    CHECK(contains(error_of([&] { weft::ops::unpack(Tensor::zeros(e, Shape{6}), {flat.view(0, Shape{3}), flat.view(2, Shape{3})}); }),
                   "dsts 0 and 1"));
    weft::ops::unpack(Tensor::from_host(e, Shape{6}, iota(6, 1)), {flat.view(0, Shape{3}), flat.view(5, Shape{3})});
    CHECK(flat.to_host() == std::vector<float>{1, 2, 3, 0, 0, 4, 5, 6});
  });
}

TEST_CASE("tensor memory: empty() takes its memory when the first op that touches it runs, not when pushed" *
          doctest::timeout(60)) {
  weft_test::with_each_engine(1, [](Engine& e) {
    const Device cpu = Device::cpu(0);
    e.wait_all();
    const std::size_t before = weft::memory_stats(e, cpu).in_use;
    constexpr std::int64_t kN = 1 << 18;  // 1 MiB
    Tensor t = Tensor::empty(e, Shape{kN}).set_role(MemoryRole::communication);
    e.wait_all();
    CHECK(weft::memory_stats(e, cpu).in_use == before);
    // A gate holds the writer: pushed, not run, the memory is not taken
    // (the naive engine runs each op as it is pushed: no gate to hold).
    SharedVar gate(e, "gate");
    std::atomic<bool> open{e.kind() == "naive"};
    e.push([&] { while (!open.load()) std::this_thread::yield(); }, cpu, {}, {gate});
    {
      weft::ops::WaitFor wait(gate);
      t.copy_from(Tensor::full(e, Shape{kN}, 3.0f));
    }
    if (e.kind() != "naive")
      CHECK(weft_test::holds_for([&] { return role_bytes(weft::memory_stats(e, cpu), MemoryRole::communication) == 0; },
                                 std::chrono::milliseconds(50)));
    open = true;
    CHECK(t.to_host()[kN - 1] == 3.0f);
    CHECK(role_bytes(weft::memory_stats(e, cpu), MemoryRole::communication) >= kN * sizeof(float));
    // A never-written tensor is uninitialized memory: reading it takes it.
    const Tensor u = Tensor::empty(e, Shape{4});
    CHECK(weft::ops::add(u, u).to_host().size() == 4);
    CHECK(u.to_host().size() == 4);
  });
}

TEST_CASE("tensor memory: a write after a creating op that failed gives the tensor memory again" *
          doctest::timeout(60)) {
  weft_test::with_each_engine(1, [](Engine& e) {
    Tensor t = Tensor::empty(e, Shape{4}).set_name("t");
    SharedVar bad(e, "bad");
    e.push([] { throw weft::Error("planted failure"); }, Device::cpu(0), {}, {bad});
    {
      weft::ops::WaitFor wait(bad);  // the copy reads `bad` too: it is skipped, and so t's creation failed
      t.copy_from(Tensor::ones(e, Shape{4}));
    }
    CHECK(contains(error_of([&] { (void)t.to_host(); }), "planted failure"));
    // A reader finds no memory; a writer gives it memory again.
    CHECK(contains(error_of([&] { (void)weft::ops::sum(t).item(); }), "has no memory"));
    t.copy_from(Tensor::full(e, Shape{4}, 2.0f));
    CHECK(t.to_host() == std::vector<float>(4, 2.0f));
  });
}

TEST_CASE("tensor memory: the allocators count bytes by role, before and after allocation, and at the peak" *
          doctest::timeout(60)) {
  weft_test::with_each_engine(1, [](Engine& e) {
    const Device cpu = Device::cpu(0);
    e.wait_all();
    const weft::MemoryStats start = weft::memory_stats(e, cpu);
    e.allocator(cpu).reset_peak();
    constexpr std::int64_t kN = 1 << 16;  // 256 KiB
    Tensor p = Tensor::zeros(e, Shape{kN}).set_role(MemoryRole::parameters);  // before it runs
    Tensor g = Tensor::ones(e, Shape{kN});
    e.wait_all();
    g.set_role(MemoryRole::gradients);  // after
    weft::MemoryStats m = weft::memory_stats(e, cpu);
    CHECK(role_bytes(m, MemoryRole::parameters) - role_bytes(start, MemoryRole::parameters) == kN * 4);
    CHECK(role_bytes(m, MemoryRole::gradients) - role_bytes(start, MemoryRole::gradients) == kN * 4);
    std::size_t sum = 0;
    for (std::size_t b : m.in_use_by_role) sum += b;
    CHECK(sum == m.in_use);
    CHECK(m.peak_by_role[static_cast<std::size_t>(MemoryRole::gradients)] >= kN * 4);
    g = Tensor();
    e.wait_all();
    m = weft::memory_stats(e, cpu);
    CHECK(role_bytes(m, MemoryRole::gradients) == role_bytes(start, MemoryRole::gradients));
    CHECK(m.peak_by_role[static_cast<std::size_t>(MemoryRole::gradients)] >= kN * 4);  // the peak keeps its split
  });
}

TEST_CASE("tensor memory: the profiler's trace has a memory-by-role track and its summary each device's peak" *
          doctest::timeout(60)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 1});
  weft::Profiler& prof = e->profiler();
  prof.start();
  {
    Tensor w = Tensor::uniform(*e, Shape{256, 256}, -1, 1, 3).set_role(MemoryRole::parameters);
    Tensor x = Tensor::ones(*e, Shape{64, 256});
    Tensor y = weft::ops::matmul(x, w);
    (void)y.sum().item();
  }
  e->wait_all();
  prof.stop();
  std::ostringstream trace;
  prof.write_trace(trace);
  CHECK(contains(trace.str(), "\"name\":\"memory by role\""));
  CHECK(contains(trace.str(), "\"parameters\":262144"));
  const weft::ProfileSummary s = prof.summarize();
  REQUIRE(s.memory.size() == 1);
  CHECK(s.memory[0].device == Device::cpu(0));
  CHECK(s.memory[0].bytes >= 256 * 256 * 4 + 64 * 256 * 4);
  CHECK(s.memory[0].by_role[static_cast<std::size_t>(MemoryRole::parameters)] == 256 * 256 * 4);
  CHECK(contains(s.table(), "memory peaks"));
  CHECK(contains(s.json(), "\"peak_bytes\""));
}
