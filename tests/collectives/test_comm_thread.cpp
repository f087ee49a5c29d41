// The communication thread's sleep while its fibers wait to be woken
// (parallel/src/collectives/comm_thread.h, white-box): a fiber in
// wait_woken is polled a handful of times, not thousands, while it waits;
// the wake-up that follows a change is never lost, whatever the
// interleaving with the thread falling asleep; work spawned with
// Start::now, a fiber that polls, a deadline and stop() each still end the
// sleep. The threads here sleep quietly for a minute unless woken, so a
// lost wake-up fails the test instead of costing 20 ms.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "collectives/comm_thread.h"

namespace {

using weft::parallel::detail::Clock;
using weft::parallel::detail::CommThread;
using namespace std::chrono_literals;

constexpr auto kLongQuietSleep = std::chrono::milliseconds(60'000);
constexpr auto kPatience = 20s;  // far below the quiet sleep, far above any wake-up

// A fiber in wait_woken on `flag`, its result in the returned future.
std::future<CommThread::Wait> wait_for_flag(CommThread& thread, const std::atomic<bool>& flag,
                                            std::atomic<int>* polls = nullptr,
                                            Clock::time_point deadline = Clock::time_point::max()) {
  auto result = std::make_shared<std::promise<CommThread::Wait>>();
  std::future<CommThread::Wait> done = result->get_future();
  REQUIRE(thread.spawn([&thread, &flag, polls, deadline, result] {
    result->set_value(thread.wait_woken(
        [&] {
          if (polls) polls->fetch_add(1, std::memory_order_relaxed);
          return flag.load(std::memory_order_acquire);
        },
        deadline));
  }));
  return done;
}

}  // namespace

TEST_CASE("communication thread: a fiber waiting to be woken is not polled meanwhile" * doctest::timeout(60)) {
  std::atomic<bool> flag{false};  // before the thread: its fiber reads them until stop()
  std::atomic<int> polls{0};
  CommThread thread(kLongQuietSleep);
  std::future<CommThread::Wait> done = wait_for_flag(thread, flag, &polls);
  // Time for a polling thread to poll thousands of times (it polls every
  // few microseconds at first, then at least every 500 µs); a sleeping one
  // polls the fiber a few times as it starts and before it sleeps.
  std::this_thread::sleep_for(100ms);
  CHECK(polls.load() <= 8);
  CHECK(done.wait_for(0s) == std::future_status::timeout);
  flag.store(true, std::memory_order_release);
  thread.wake_if_quiet();
  REQUIRE(done.wait_for(kPatience) == std::future_status::ready);
  CHECK(done.get() == CommThread::Wait::done);
}

TEST_CASE("communication thread: the wake-up after a change is never lost" * doctest::timeout(120)) {
  // The race: the thread polls the fiber (false), the change lands and
  // wake_if_quiet() looks before the thread says it sleeps, and the thread
  // then sleeps. Each round makes its change just after the fiber's second
  // poll (the last before the thread would sleep) plus a short spin that
  // grows with the round, so the rounds sweep that window. On a loaded
  // machine each round waits for several wake-ups: after 10 s the sweep
  // stops once it has covered every spin a few times.
  const auto sweep_end = Clock::now() + 10s;
  for (int round = 0; round < 2000 && (round < 200 || Clock::now() < sweep_end); ++round) {
    std::atomic<bool> flag{false};  // before the thread: its fiber reads them until stop()
    std::atomic<int> polls{0};
    CommThread thread(kLongQuietSleep);
    std::future<CommThread::Wait> done = wait_for_flag(thread, flag, &polls);
    const auto give_up = Clock::now() + kPatience;
    while (polls.load(std::memory_order_relaxed) < 2 && Clock::now() < give_up) {
    }
    for (int spin = 0; spin < round % 50 * 4; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
    flag.store(true, std::memory_order_release);
    thread.wake_if_quiet();
    REQUIRE_MESSAGE(done.wait_for(kPatience) == std::future_status::ready, "round ", round, ": the wake-up was lost");
    CHECK(done.get() == CommThread::Wait::done);
  }
}

TEST_CASE("communication thread: what ends a quiet sleep besides the wake-up" * doctest::timeout(60)) {
  std::atomic<bool> never{false};

  SUBCASE("work spawned to start now runs at once") {
    CommThread thread(kLongQuietSleep);
    std::future<CommThread::Wait> waiting = wait_for_flag(thread, never);
    std::this_thread::sleep_for(10ms);  // most likely asleep by now; either way the spawn must run
    std::promise<void> ran;
    REQUIRE(thread.spawn([&] { ran.set_value(); }, CommThread::Start::now));
    CHECK(ran.get_future().wait_for(kPatience) == std::future_status::ready);
    thread.stop();
    CHECK(waiting.get() == CommThread::Wait::stopping);
  }

  SUBCASE("a fiber that polls keeps the thread polling") {
    std::atomic<bool> flag{false};  // before the thread: its fiber reads them until stop()
    std::promise<CommThread::Wait> polled;
    CommThread thread(kLongQuietSleep);
    std::future<CommThread::Wait> waiting = wait_for_flag(thread, never);
    REQUIRE(thread.spawn([&] {
      polled.set_value(thread.poll_until([&] { return flag.load(std::memory_order_acquire); },
                                         Clock::time_point::max()));
    }));
    std::this_thread::sleep_for(10ms);
    flag.store(true, std::memory_order_release);  // no wake-up: the thread must find it by polling
    std::future<CommThread::Wait> seen = polled.get_future();
    REQUIRE(seen.wait_for(kPatience) == std::future_status::ready);
    CHECK(seen.get() == CommThread::Wait::done);
    thread.stop();
    CHECK(waiting.get() == CommThread::Wait::stopping);
  }

  SUBCASE("a deadline is seen within the quiet sleep") {
    CommThread thread(std::chrono::milliseconds(5));
    const auto deadline = Clock::now() + 50ms;
    std::future<CommThread::Wait> waiting = wait_for_flag(thread, never, nullptr, deadline);
    REQUIRE(waiting.wait_for(kPatience) == std::future_status::ready);
    CHECK(waiting.get() == CommThread::Wait::timeout);
    // Seen at the next quiet sleep's end (5 ms), not at a minute's; seconds
    // of slack for a loaded machine.
    CHECK(Clock::now() - deadline < 5s);
  }

  SUBCASE("stop() ends the wait") {
    CommThread thread(kLongQuietSleep);
    std::future<CommThread::Wait> waiting = wait_for_flag(thread, never);
    std::this_thread::sleep_for(10ms);
    const auto before = Clock::now();
    thread.stop();
    CHECK(Clock::now() - before < kPatience);
    CHECK(waiting.get() == CommThread::Wait::stopping);
  }
}
