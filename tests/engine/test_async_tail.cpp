// An async op's body may go on running after it called done(), and may push
// follow-ups then. Those pushes belong to the op: wait_all must not return
// before them.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>

#include "engine_test_util.h"

using namespace weft_test;

TEST_CASE("an async body that pushes after done() is waited for by wait_all" * doctest::timeout(60)) {
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    std::atomic<bool> follow_up_ran{false};
    std::atomic<bool> wait_all_returned{false};
    auto e = weft::Engine::create({.kind = "threaded", .cpu_devices = devices, .workers_per_cpu_device = 1});
    Var a = e->new_var("a"), c = e->new_var("c");
    e->push_async(
        [&, c](RunContext& ctx, Completion done) {
          done();
          // Hold the body open past done(). A correct wait_all cannot return
          // meanwhile, so this wait ends by its bound; a wait_all that ignores
          // the running body returns, and the follow-up below comes too late.
          auto until = std::chrono::steady_clock::now() + 200ms;
          while (!wait_all_returned.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
          ctx.engine->push([&](RunContext&) { follow_up_ran = true; }, Device::cpu(0), {}, {c}, {.name = "follow-up"});
        },
        Device::cpu(devices - 1), {}, {a}, {.name = "async tail"});
    e->wait_all();
    const bool ran_before_return = follow_up_ran.load();
    wait_all_returned = true;
    CHECK(ran_before_return);
  }
}
