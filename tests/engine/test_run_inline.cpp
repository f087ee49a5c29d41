// OpOptions::run_inline: an async op whose body only hands its work to
// another thread runs on the thread that makes it ready (the pusher, or the
// thread completing what it waited for) instead of waking a worker; order,
// failures and the in-flight accounting stay the engine's; inline bodies
// never nest. Every scenario over the naive engine and the threaded one at
// 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "engine_test_util.h"
#include "weft/profiler.h"

using namespace weft_test;

namespace {

// Stands in for a communication thread: completes what is handed to it, in
// order, after doing the op's work there.
class Completer {
 public:
  Completer() : thread_([this] { loop(); }) {}
  ~Completer() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void hand(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_one();
  }
  std::thread::id id() const { return thread_.get_id(); }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      work();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

thread_local int tls_depth = 0;  // inline bodies running on this thread

}  // namespace

TEST_CASE("run_inline: a chain completed elsewhere runs on the pusher and the completer, never a worker, in order" *
          doctest::timeout(60)) {
  for (const Config& config : all_configs()) {
    CAPTURE(config.str());
    auto e = weft::Engine::create(config.engine_config());
    Completer completer;
    const std::thread::id main = std::this_thread::get_id();
    Var v = e->new_var("v");
    constexpr int kOps = 200;
    int value = 0;  // written by the ops only
    std::atomic<int> wrong_order{0}, on_worker{0}, elsewhere{0};
    for (int i = 0; i < kOps; ++i) {
      e->push_async(
          [&, i](RunContext& ctx, Completion done) {
            if (value != i) ++wrong_order;
            if (ctx.worker >= 0) ++on_worker;
            const auto here = std::this_thread::get_id();
            if (here != main && here != completer.id()) ++elsewhere;
            completer.hand([&value, done = std::move(done)]() mutable {
              ++value;
              done();
            });
          },
          cpu0, {}, {v}, {.name = "hand-off", .run_inline = true});
    }
    e->wait_to_read(v);
    CHECK(value == kOps);
    CHECK(wrong_order == 0);
    if (config.threaded()) {
      CHECK(on_worker == 0);
      CHECK(elsewhere == 0);
    }
  }
}

TEST_CASE("run_inline: ops made ready by an inline body queue instead of nesting" * doctest::timeout(60)) {
  const int kOps = kSanitized ? 2000 : 20000;
  // The whole chain in flight at once, behind the blocker.
  for (const Config& config : threaded_configs(1, 1, static_cast<std::size_t>(kOps) + 1)) {
    CAPTURE(config.str());
    auto e = weft::Engine::create(config.engine_config());
    Var v = e->new_var("v");
    Blocker blocker;
    // Holds v until the whole chain is queued behind it; then each op,
    // completing inside its body, makes the next one ready from inside it.
    e->push(blocker.body(), cpu0, {}, {v}, {.name = "blocker"});
    int value = 0, max_depth = 0;
    bool wrong_order = false;
    for (int i = 0; i < kOps; ++i) {
      e->push_async(
          [&, i](Completion done) {
            max_depth = std::max(max_depth, ++tls_depth);
            if (value != i) wrong_order = true;
            ++value;
            done();
            --tls_depth;
          },
          cpu0, {}, {v}, {.name = "completes inside", .run_inline = true});
    }
    blocker.open();
    e->wait_to_read(v);
    CHECK(value == kOps);
    CHECK_FALSE(wrong_order);
    CHECK(max_depth == 1);
  }
}

TEST_CASE("run_inline: readers and writers keep engine order with ordinary ops between them" *
          doctest::timeout(60)) {
  for (const Config& config : all_configs()) {
    CAPTURE(config.str());
    auto e = weft::Engine::create(config.engine_config());
    Completer completer;
    Var v = e->new_var("v");
    std::atomic<int> value{0};
    std::atomic<int> bad{0};
    constexpr int kRounds = 100;
    for (int r = 0; r < kRounds; ++r) {
      // An inline write, two inline reads and an ordinary read of its result.
      e->push_async(
          [&, r](Completion done) {
            completer.hand([&, r, done = std::move(done)]() mutable {
              if (value.load() != 2 * r) ++bad;
              value = 2 * r + 1;
              done();
            });
          },
          cpu0, {}, {v}, {.name = "inline write", .run_inline = true});
      for (int k = 0; k < 2; ++k)
        e->push_async(
            [&, r](Completion done) {
              if (value.load() != 2 * r + 1) ++bad;
              completer.hand([done = std::move(done)]() mutable { done(); });
            },
            cpu0, {v}, {}, {.name = "inline read", .run_inline = true});
      e->push([&, r] { if (value.load() != 2 * r + 1) ++bad; }, cpu0, {v}, {}, {.name = "read"});
      e->push([&, r] { value = 2 * r + 2; }, cpu0, {}, {v}, {.name = "write"});
    }
    e->wait_all();
    CHECK(value == 2 * kRounds);
    CHECK(bad == 0);
  }
}

TEST_CASE("run_inline: a failed input skips the body or reaches it, as without the option" *
          doctest::timeout(60)) {
  for (const Config& config : all_configs()) {
    CAPTURE(config.str());
    auto e = weft::Engine::create(config.engine_config());
    Var x = e->new_var("x"), y = e->new_var("y"), z = e->new_var("z");
    e->push([] { throw std::runtime_error("producer broke"); }, cpu0, {}, {x}, {.name = "producer"});
    std::atomic<bool> skipped_ran{false};
    e->push_async([&](Completion done) { skipped_ran = true; done(); }, cpu0, {x}, {y},
                  {.name = "skipped", .run_inline = true});
    std::atomic<bool> saw_failure{false};
    e->push_async(
        [&](RunContext& ctx, Completion done) {
          saw_failure = ctx.failed_input != nullptr;
          done();  // answers anyway, without the failure
        },
        cpu0, {x}, {z}, {.name = "answers", .run_on_failed_input = true, .run_inline = true});
    CHECK_THROWS_WITH_AS(e->wait_to_read(y), doctest::Contains("producer broke"), std::runtime_error);
    e->wait_to_read(z);
    CHECK_FALSE(skipped_ran.load());
    CHECK(saw_failure.load());
    CHECK_NOTHROW(e->wait_all());  // the failure was reported once, by wait_to_read(y)
  }
}

TEST_CASE("run_inline: push refuses it for ordinary ops, naming the op" * doctest::timeout(30)) {
  for (const Config& config : all_configs()) {
    CAPTURE(config.str());
    auto e = weft::Engine::create(config.engine_config());
    Var v = e->new_var("v");
    CHECK_THROWS_WITH_AS(e->push([] {}, cpu0, {}, {v}, {.name = "sync", .run_inline = true}),
                         doctest::Contains("'sync'): OpOptions::run_inline is for push_async ops"),
                         weft::InvalidArgument);
    e->wait_all();
  }
}

TEST_CASE("run_inline: profiled bodies land on the running thread's own inline track" * doctest::timeout(60)) {
  for (const Config& config : threaded_configs()) {
    CAPTURE(config.str());
    auto e = weft::Engine::create(config.engine_config());
    Completer completer;
    e->profiler().start();
    Var v = e->new_var("v");
    constexpr int kOps = 50;
    for (int i = 0; i < kOps; ++i)
      e->push_async([&](Completion done) { completer.hand([done = std::move(done)]() mutable { done(); }); }, cpu0, {},
                    {v}, {.name = "traced hand-off", .run_inline = true});
    e->wait_all();
    e->profiler().stop();
    int found = 0;
    for (const weft::Span& s : e->profiler().spans()) {
      if (s.name != "traced hand-off") continue;
      ++found;
      CHECK(s.track >= 2000);  // inline tracks, one per thread (main, completer)
      CHECK(s.track < 2002);
      CHECK(s.resource == "cpu(0) inline");
    }
    CHECK(found == kOps);
  }
}
