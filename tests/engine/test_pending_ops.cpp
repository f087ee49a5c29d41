// Engine::pending_ops: a snapshot of the ops waiting for variables (with the
// variables they wait for and the op holding each) and of the running ops
// that hold variables, taken from another thread while an op stalls. The
// naive engine and the threaded one.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "weft/engine.h"

namespace {

const weft::PendingOp* find_op(const std::vector<weft::PendingOp>& ops, const std::string& name) {
  for (const weft::PendingOp& op : ops)
    if (op.name == name) return &op;
  return nullptr;
}

// Spins until `flag` is set (a bounded wait: a failure, never a hang).
bool wait_for(const std::atomic<bool>& flag) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("pending_ops names the stalled op that holds what a waiting op needs (threaded)") {
  auto engine = weft::Engine::create({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 2});
  weft::Var x = engine->new_var("x"), y = engine->new_var("y"), z = engine->new_var("z");
  std::atomic<bool> running{false}, release{false};
  engine->push(
      [&] {
        running = true;
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      {}, {x}, {.name = "stall"});
  REQUIRE(wait_for(running));
  // Reads x (held by the stall) and writes y, which it is granted at once.
  engine->push([] {}, {x}, {y}, {.name = "reader"});
  // Reads y, held by the waiting reader; writes z, free.
  engine->push([] {}, {y}, {z}, {.name = "second"});

  const std::vector<weft::PendingOp> ops = engine->pending_ops();
  const weft::PendingOp* stall = find_op(ops, "stall");
  const weft::PendingOp* reader = find_op(ops, "reader");
  const weft::PendingOp* second = find_op(ops, "second");
  REQUIRE(stall != nullptr);
  REQUIRE(reader != nullptr);
  REQUIRE(second != nullptr);
  CHECK(stall->running);
  CHECK(stall->waits.empty());
  CHECK(stall->device == weft::Device::cpu(0));
  CHECK_FALSE(reader->running);
  REQUIRE(reader->waits.size() == 1);
  CHECK(reader->waits[0].var == x.id());
  CHECK(reader->waits[0].var_name == "x");
  CHECK_FALSE(reader->waits[0].write);
  CHECK(reader->waits[0].holder == stall->id);
  CHECK(reader->waits[0].holder_name == "stall");
  CHECK(reader->waits[0].holder_running);
  CHECK_FALSE(second->running);
  REQUIRE(second->waits.size() == 1);
  CHECK(second->waits[0].var_name == "y");
  CHECK(second->waits[0].holder == reader->id);
  CHECK(second->waits[0].holder_name == "reader");
  CHECK_FALSE(second->waits[0].holder_running);
  CHECK(reader->id < second->id);  // waiting ops by push order

  release = true;
  engine->wait_all();
  CHECK(engine->pending_ops().empty());
}

TEST_CASE("pending_ops names a writer queued behind a writer (threaded)") {
  auto engine = weft::Engine::create({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 1});
  weft::Var x = engine->new_var("weights");
  std::atomic<bool> running{false}, release{false};
  engine->push(
      [&] {
        running = true;
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      {}, {x}, {.name = "first writer"});
  REQUIRE(wait_for(running));
  engine->push([] {}, {}, {x}, {.name = "second writer"});
  engine->push([] {}, {x}, {}, {.name = "reader"});
  const std::vector<weft::PendingOp> ops = engine->pending_ops();
  const weft::PendingOp* second = find_op(ops, "second writer");
  const weft::PendingOp* reader = find_op(ops, "reader");
  REQUIRE(second != nullptr);
  REQUIRE(reader != nullptr);
  REQUIRE(second->waits.size() == 1);
  CHECK(second->waits[0].write);
  CHECK(second->waits[0].holder_name == "first writer");
  CHECK(second->waits[0].behind == 0);  // the head of the queue
  REQUIRE(reader->waits.size() == 1);
  CHECK(reader->waits[0].behind == second->id);  // queued behind the second writer
  CHECK(reader->waits[0].holder_name == "first writer");
  release = true;
  engine->wait_all();
}

TEST_CASE("pending_ops names the stalled op that holds what a waiting op needs (naive)") {
  auto engine = weft::Engine::create({.kind = "naive"});
  weft::Var x = engine->new_var("x"), y = engine->new_var("y");
  std::atomic<bool> running{false}, release{false}, pushed{false};
  // The naive engine runs an op in its pusher: each push on its own thread.
  std::thread a([&] {
    engine->push(
        [&] {
          running = true;
          while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        },
        {}, {x}, {.name = "stall"});
  });
  REQUIRE(wait_for(running));
  std::thread b([&] {
    pushed = true;
    engine->push([] {}, {x}, {y}, {.name = "reader"});
  });
  REQUIRE(wait_for(pushed));
  // The reader's push shows it once it is inside the engine.
  std::vector<weft::PendingOp> ops;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!find_op(ops = engine->pending_ops(), "reader") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const weft::PendingOp* stall = find_op(ops, "stall");
  const weft::PendingOp* reader = find_op(ops, "reader");
  REQUIRE(stall != nullptr);
  REQUIRE(reader != nullptr);
  CHECK(stall->running);
  CHECK_FALSE(reader->running);
  bool names_x = false;
  for (const weft::PendingOp::Wait& w : reader->waits)
    if (w.var_name == "x") {
      names_x = true;
      CHECK_FALSE(w.write);
      CHECK(w.holder == stall->id);
      CHECK(w.holder_name == "stall");
      CHECK(w.holder_running);
    }
  CHECK(names_x);
  release = true;
  a.join();
  b.join();
  engine->wait_all();
  CHECK(engine->pending_ops().empty());
}
