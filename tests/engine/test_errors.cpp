// Engine error rules: failures stored on written variables, skipped readers,
// one report per failure, wait_all, async completion errors, waits from inside
// ops, and bad input refused at push time. Every scenario runs over naive and
// threaded × {1, 2, 4, 8} workers.
#include <doctest/doctest.h>

#include <atomic>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "engine/engine_internals.h"
#include "engine/engine_test_util.h"
#include "weft/engine.h"

using namespace weft_test;

namespace {

// A user exception type the engine knows nothing about.
struct TestError : std::runtime_error {
  int code;
  TestError(const std::string& what, int c) : std::runtime_error(what), code(c) {}
};

// What a call threw: its dynamic type name and message ("" when nothing).
struct Thrown {
  bool threw = false;
  std::string type;
  std::string what;
  int code = 0;
};

template <class F>
Thrown catch_all(F&& f) {
  Thrown t;
  try {
    f();
  } catch (const TestError& e) {
    t = {true, typeid(e).name(), e.what(), e.code};
  } catch (const std::exception& e) {
    t = {true, typeid(e).name(), e.what(), 0};
  } catch (int i) {
    t = {true, "int", std::to_string(i), i};
  } catch (...) {
    t = {true, "unknown", "", 0};
  }
  return t;
}

const std::string kRuntimeError = typeid(std::runtime_error).name();
const std::string kWeftError = typeid(weft::Error).name();
const std::string kOpError = typeid(weft::OpError).name();
const std::string kTestError = typeid(TestError).name();

}  // namespace

TEST_CASE("a failure propagates along a chain and is reported once" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<bool> b_ran{false}, c_ran{false};
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y"), z = e->new_var("z");
    e->push([](RunContext&) { throw std::runtime_error("boom in A"); }, cpu0, {}, {x}, {.name = "A"});
    e->push([&](RunContext&) { b_ran = true; }, cpu0, {x}, {y}, {.name = "B"});
    e->push([&](RunContext&) { c_ran = true; }, cpu0, {y}, {z}, {.name = "C"});
    Thrown t = catch_all([&] { e->wait_to_read(z); });
    CHECK(t.threw);
    CHECK(t.type == kRuntimeError);  // the original type, not a wrapper
    CHECK(t.what == "boom in A");
    CHECK_FALSE(b_ran.load());
    CHECK_FALSE(c_ran.load());
    // Skipped ops still count as writes.
    CHECK(e->version(x) == 1);
    CHECK(e->version(y) == 1);
    CHECK(e->version(z) == 1);
    // The same failure is not reported again, through any variable.
    CHECK_FALSE(catch_all([&] { e->wait_to_read(y); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_to_read(x); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_to_write(z); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
  });
}

// Whether an op is skipped must not depend on timing: B is pushed after A
// failed and reads A's output, so B is skipped, even when the failure gets
// reported (by a wait) before B gets to run. The naive engine (the oracle)
// runs B at push time and skips it; the threaded engine must agree. A blocker
// holds B back on the threaded engine until after the report.
TEST_CASE("an op pushed before a failure is reported is skipped even if it runs after the report" *
          doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<bool> b_ran{false};
    auto e = make_engine(cfg);
    Blocker blocker;
    Var x = e->new_var("x"), g = e->new_var("blocker"), z = e->new_var("z");
    e->push([](RunContext&) { throw TestError("A failed", 31); }, cpu0, {}, {x}, {.name = "A"});
    if (cfg.threaded()) {
      e->push(blocker.body(), cpu0, {}, {g}, {.name = "blocker"});
      REQUIRE(blocker.wait_entered());
    }
    e->push([&](RunContext&) { b_ran = true; }, cpu0, {x, g}, {z}, {.name = "B"});
    Thrown t = catch_all([&] { e->wait_to_read(x); });  // reports A's failure
    CHECK(t.code == 31);
    blocker.open();
    CHECK_FALSE(catch_all([&] { e->wait_to_read(z); }).threw);  // the same failure: reported already
    CHECK_FALSE(b_ran.load());
    CHECK(e->version(z) == 1);
    CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
  });
}

// wait_to_read(x) reports x's failure as of the writes pushed before the
// wait, not as of whenever the waiting thread gets to look: a write pushed
// after the wait must neither hide an earlier failure (a successful write
// clears it) nor leak a later one into this wait. Threaded only: the naive
// engine has no window between the writes and the wait. Each round is
// arranged so the later write is queued behind the wait before the earlier
// one completes; the window the engine must not have is between the wait's
// completion and the waiter's wake-up, so each round has a high chance of
// exposing it, and 20 rounds make a miss all but impossible.
TEST_CASE("a wait reports the failure state as of the writes pushed before it" * doctest::timeout(120)) {
  constexpr int kRounds = 20;
  for_each_threaded([](const Config& cfg) {
    int missed = 0, leaked = 0, later_lost = 0;
    auto e = make_engine(cfg);
    for (int round = 0; round < kRounds; ++round) {
      for (bool first_fails : {true, false}) {
        std::atomic<bool> go{false};
        std::atomic<int> result{0};  // 1: threw the first op's error, 2: threw the later one's, 3: no throw
        Var x = e->new_var("x");
        e->push(
            [&go, first_fails](RunContext&) {
              while (!go.load()) std::this_thread::yield();
              if (first_fails) throw TestError("before the wait", 1);
            },
            cpu0, {}, {x}, {.name = "before the wait"});
        std::thread waiter([&] {
          Thrown t = catch_all([&] { e->wait_to_read(x); });
          result = !t.threw ? 3 : t.code == 1 ? 1 : 2;
        });
        // The waiter's barrier is queued on x behind the gated op ...
        REQUIRE(eventually([&] { return queued_accesses(x) >= 1; }, 20s));
        // ... and this write-only op queues behind it.
        e->push(
            [first_fails](RunContext&) {
              if (!first_fails) throw TestError("after the wait", 2);
            },
            cpu0, {}, {x}, {.name = "after the wait"});
        go = true;
        waiter.join();
        if (first_fails) {
          missed += result.load() != 1;
          try {
            e->wait_all();  // the first failure, if the wait missed it
          } catch (const TestError&) {
          }
        } else {
          leaked += result.load() != 3;
          // The later failure is still there for the next wait.
          later_lost += catch_all([&] { e->wait_to_read(x); }).code != 2;
        }
        CHECK_NOTHROW(e->wait_all());
      }
    }
    CHECK(missed == 0);
    CHECK(leaked == 0);
    CHECK(later_lost == 0);
  });
}

TEST_CASE("an op failing on several variables, and a skipped op writing its read variable" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<int> ran{0};
    auto e = make_engine(cfg);
    Var a = e->new_var("a"), b = e->new_var("b"), c = e->new_var("c");
    e->push([](RunContext&) { throw TestError("two outputs", 7); }, cpu0, {}, {a, b}, {.name = "fails"});
    e->push([&](RunContext&) { ran.fetch_add(1); }, cpu0, {a}, {a}, {.name = "reads+writes a"});
    e->push([&](RunContext&) { ran.fetch_add(1); }, cpu0, {b, c}, {c}, {.name = "reads b"});
    Thrown t = catch_all([&] { e->wait_to_read(c); });
    CHECK(t.type == kTestError);
    CHECK(t.code == 7);
    CHECK(ran.load() == 0);
    CHECK_FALSE(catch_all([&] { e->wait_to_read(a); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_to_read(b); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
    CHECK(e->version(a) == 2);
    CHECK(e->version(b) == 1);
    CHECK(e->version(c) == 1);
  });
}

TEST_CASE("non-standard exceptions keep their type" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var v = e->new_var("v");
    e->push([](RunContext&) { throw 42; }, cpu0, {}, {v}, {.name = "throws int"});
    Thrown t = catch_all([&] { e->wait_to_read(v); });
    CHECK(t.type == "int");
    CHECK(t.code == 42);
    CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
  });
}

TEST_CASE("wait_all rethrows the first unreported failure, then is clean" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y"), z = e->new_var("z");
    e->push([](RunContext&) { throw TestError("first", 1); }, cpu0, {}, {x});
    CHECK(catch_all([&] { e->wait_to_read(x); }).code == 1);  // reported here
    e->push([](RunContext&) { throw TestError("second", 2); }, cpu0, {}, {y});
    // Write-only on y: runs after "second" and fails too.
    e->push([](RunContext&) { throw TestError("third", 3); }, cpu0, {}, {y, z});
    Thrown t = catch_all([&] { e->wait_all(); });
    CHECK(t.type == kTestError);
    CHECK(t.code == 2);
    CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
    // wait_all marked every pending failure reported.
    CHECK_FALSE(catch_all([&] { e->wait_to_read(y); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_to_read(z); }).threw);
    CHECK(e->version(y) == 2);
  });
}

TEST_CASE("an op that only writes a failed variable runs and clears the failure" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<bool> writer_ran{false}, reader_ran{false};
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), out = e->new_var("out");
    e->push([](RunContext&) { throw TestError("old", 1); }, cpu0, {}, {x}, {.name = "fails"});
    e->push([&](RunContext&) { writer_ran = true; }, cpu0, {}, {x, x}, {.name = "overwrites"});  // duplicates: still write-only
    e->push([&](RunContext&) { reader_ran = true; }, cpu0, {x}, {out}, {.name = "reads new value"});
    CHECK_FALSE(catch_all([&] { e->wait_to_read(out); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_to_read(x); }).threw);
    CHECK(writer_ran.load());
    CHECK(reader_ran.load());
    CHECK(e->version(x) == 2);
    // A failing write-only op replaces the failure.
    e->push([](RunContext&) { throw TestError("new", 2); }, cpu0, {}, {x}, {.name = "fails again"});
    CHECK(catch_all([&] { e->wait_to_read(x); }).code == 2);
    try {
      e->wait_all();  // the overwritten failure may still count as unreported
    } catch (...) {
    }
  });
}

TEST_CASE("async ops: done(exception) and bodies that throw" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<bool> dependent_ran{false};
    // The failing thread also keeps a reference to its exception until it is
    // joined: otherwise the last reference may drop in that thread, and TSan
    // cannot see libsupc++'s (uninstrumented) reference count that orders
    // that free after the main thread's reads of the message.
    std::vector<std::exception_ptr> kept;
    std::vector<std::thread> threads;
    std::mutex m;
    {
      auto e = make_engine(cfg);
      Var a = e->new_var("a"), b = e->new_var("b"), c = e->new_var("c"), d = e->new_var("d");
      // done(exception_ptr) inline.
      e->push_async([](RunContext&, Completion done) { done(std::make_exception_ptr(TestError("via done", 11))); },
                    cpu0, {}, {a}, {.name = "done with error"});
      e->push([&](RunContext&) { dependent_ran = true; }, cpu0, {a}, {b}, {.name = "dependent"});
      Thrown t = catch_all([&] { e->wait_to_read(b); });
      CHECK(t.type == kTestError);
      CHECK(t.code == 11);
      CHECK_FALSE(dependent_ran.load());

      // done(exception_ptr) from another thread.
      e->push_async(
          [&threads, &m, &kept](RunContext&, Completion done) {
            auto* ts = &threads;
            std::lock_guard lock(m);
            ts->emplace_back([done = std::move(done), &kept, &m] {
              try {
                throw TestError("from a thread", 12);
              } catch (...) {
                {
                  std::lock_guard keep_lock(m);
                  kept.push_back(std::current_exception());
                }
                done(std::current_exception());
              }
            });
          },
          cpu0, {}, {c}, {.name = "thread fails"});
      t = catch_all([&] { e->wait_to_read(c); });
      CHECK(t.type == kTestError);
      CHECK(t.code == 12);

      // The body throws before calling done.
      e->push_async([](RunContext&, Completion) { throw TestError("body threw", 13); }, cpu0, {}, {d},
                    {.name = "body throws"});
      t = catch_all([&] { e->wait_to_read(d); });
      CHECK(t.type == kTestError);
      CHECK(t.code == 13);
      CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
      CHECK(e->version(d) == 1);
    }
    for (auto& th : threads) th.join();
  });
}

TEST_CASE("async op: a Completion called after the body threw is a weft::Error" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::promise<void> go;
    std::shared_future<void> go_f = go.get_future().share();
    std::thread late;
    std::atomic<int> late_result{0};  // 1: weft::Error, 2: no throw, 3: other
    std::string late_message;
    {
      auto e = make_engine(cfg);
      Var v = e->new_var("v");
      e->push_async(
          [&late, &late_result, &late_message, go_f](RunContext&, Completion done) {
            auto* slot = &late;
            auto* result = &late_result;
            auto* message = &late_message;
            *slot = std::thread([done, go_f, result, message] {
              go_f.wait();
              try {
                done();
                result->store(2);
              } catch (const weft::Error& err) {
                *message = err.what();
                result->store(1);
              } catch (...) {
                result->store(3);
              }
            });
            throw TestError("threw after handing out done", 21);
          },
          cpu0, {}, {v}, {.name = "hands out done then throws"});
      Thrown t = catch_all([&] { e->wait_to_read(v); });
      CHECK(t.code == 21);
      go.set_value();
      late.join();
      CHECK(late_result.load() == 1);
      CHECK(contains(late_message, "hands out done then throws"));
      CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
    }
  });
}

TEST_CASE("a Completion called twice throws weft::OpError" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<int> second_call{0};  // 1: weft::Error naming the op, 2: weft::Error, 3: no throw
    std::atomic<int> thread_second_call{0};
    std::thread t;
    {
      auto e = make_engine(cfg);
      Var v = e->new_var("v"), w = e->new_var("w");
      e->push_async(
          [&second_call](RunContext&, Completion done) {
            auto* out = &second_call;  // a local: usable after done()
            done();
            try {
              done();
              out->store(3);
            } catch (const weft::OpError& err) {
              out->store(err.op_name() == "twice op" && contains(std::string(err.what()), "twice op") ? 1 : 2);
            }
          },
          cpu0, {}, {v}, {.name = "twice op"});
      e->wait_to_read(v);
      // The op completed at the first done(); its body may still be running.
      while (second_call.load() == 0) std::this_thread::yield();
      CHECK(second_call.load() == 1);
      // From another thread, the copies share one completion.
      e->push_async(
          [&t, &thread_second_call](RunContext&, Completion done) {
            auto* slot = &t;
            auto* out = &thread_second_call;
            *slot = std::thread([done, out] {
              Completion copy = done;
              copy();
              try {
                done();
                out->store(3);
              } catch (const weft::OpError&) {
                out->store(1);
              }
            });
          },
          cpu0, {}, {w}, {.name = "twice from thread"});
      e->wait_to_read(w);
      e->wait_all();
    }
    t.join();
    CHECK(thread_second_call.load() == 1);
    // An empty Completion refuses to be called.
    Completion empty;
    CHECK_THROWS_AS(empty(), weft::InvalidArgument);
  });
}

TEST_CASE("a Completion dropped without being called fails the op with a weft::OpError" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<bool> dependent_ran{false};
    std::promise<void> drop;
    std::shared_future<void> drop_f = drop.get_future().share();
    std::thread holder;
    {
      auto e = make_engine(cfg);
      Var v = e->new_var("v"), out = e->new_var("out"), w = e->new_var("w");
      e->push_async([](RunContext&, Completion) {}, cpu0, {}, {v}, {.name = "forgetful op"});
      e->push([&](RunContext&) { dependent_ran = true; }, cpu0, {v}, {out}, {.name = "dependent"});
      Thrown t = catch_all([&] { e->wait_to_read(out); });
      CHECK(t.type == kOpError);
      CHECK(contains(t.what, "forgetful op"));
      CHECK_FALSE(dependent_ran.load());

      // The last copy dropped later, on another thread (released at once:
      // the naive engine's push_async returns only when the op completes).
      drop.set_value();
      e->push_async(
          [&holder, drop_f](RunContext&, Completion done) {
            auto* slot = &holder;
            *slot = std::thread([done = std::move(done), drop_f]() mutable {
              drop_f.wait();
              done = Completion();  // drop it
            });
          },
          cpu0, {}, {w}, {.name = "dropped on a thread"});
      try {
        e->wait_to_read(w);
        FAIL("the dropped Completion did not fail its op");
      } catch (const weft::OpError& err) {
        CHECK(err.op_name() == "dropped on a thread");
        CHECK(err.device() == cpu0);
        CHECK(contains(std::string(err.what()), "dropped on a thread"));
      }
      CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
    }
    holder.join();
  });
}

TEST_CASE("waiting from inside an op throws weft::OpError naming the op" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::mutex m;
    std::vector<std::string> messages;
    std::atomic<int> not_thrown{0};
    auto e = make_engine(cfg);
    Var v = e->new_var("v"), z = e->new_var("z"), out = e->new_var("out");
    auto attempt = [&](auto&& call) {
      try {
        call();
        not_thrown.fetch_add(1);
      } catch (const weft::Error& err) {
        std::lock_guard lock(m);
        messages.emplace_back(err.what());
      }
    };
    e->push(
        [&](RunContext& ctx) {
          attempt([&] { ctx.engine->wait_to_read(v); });
          attempt([&] { ctx.engine->wait_to_write(v); });
          attempt([&] { ctx.engine->wait_all(); });
        },
        cpu0, {}, {out}, {.name = "impatient op"});
    e->push_async(
        [&](RunContext& ctx, Completion done) {
          attempt([&] { ctx.engine->wait_to_read(v); });
          done();
        },
        cpu0, {}, {out}, {.name = "impatient async op"});  // after the first op
    e->wait_all();
    CHECK(not_thrown.load() == 0);
    {
      std::lock_guard lock(m);
      REQUIRE(messages.size() == 4);
      for (int i = 0; i < 3; ++i) CHECK(contains(messages[i], "impatient op"));
      CHECK(contains(messages[0], "wait_to_read"));
      CHECK(contains(messages[1], "wait_to_write"));
      CHECK(contains(messages[2], "wait_all"));
      CHECK(contains(messages[3], "impatient async op"));
    }
    // Left to propagate, the error fails the op.
    e->push([&](RunContext& ctx) { ctx.engine->wait_all(); }, cpu0, {}, {z}, {.name = "propagating waiter"});
    Thrown t = catch_all([&] { e->wait_to_read(z); });
    CHECK(t.type == kOpError);
    CHECK(contains(t.what, "propagating waiter"));
  });
}

TEST_CASE("an op may wait on another engine" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    long other_value = 0, seen = -1;
    std::atomic<int> threw{0};
    auto e = make_engine(cfg);
    auto other = make_engine(cfg);
    Var theirs = other->new_var("theirs");
    Var out = e->new_var("out");
    other->push([&](RunContext&) { other_value = 5; }, cpu0, {}, {theirs}, {.name = "other engine's writer"});
    e->push(
        [&](RunContext&) {
          try {
            other->wait_to_read(theirs);  // not this engine: no deadlock to refuse
            seen = other_value;
          } catch (...) {
            threw.fetch_add(1);
          }
        },
        cpu0, {}, {out}, {.name = "waits on the other engine"});
    e->wait_to_read(out);
    CHECK(threw.load() == 0);
    CHECK(seen == 5);
  });
}

TEST_CASE("bad input is refused at push time with a message naming it" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<int> ran{0};
    auto e = make_engine(cfg);
    auto other = make_engine(cfg);
    Var v = e->new_var("good");
    Var dead = e->new_var("dead");
    e->delete_var(dead);
    Var foreign = other->new_var("foreign");
    auto body = [&](RunContext&) { ran.fetch_add(1); };
    // Bad input is a weft::InvalidArgument.
    auto push_msg = [&](auto&& call) { return thrown_message<weft::InvalidArgument>(call); };

    // Null Var, in reads and in writes, push and push_async.
    auto m = push_msg([&] { e->push(body, cpu0, {v, Var()}, {}, {.name = "op-null-read"}); });
    CHECK(contains(m, "null"));
    CHECK(contains(m, "op-null-read"));
    m = push_msg([&] { e->push(body, cpu0, {}, {Var()}, {.name = "op-null-write"}); });
    CHECK(contains(m, "null"));
    CHECK(contains(m, "op-null-write"));
    m = push_msg([&] {
      e->push_async([](RunContext&, Completion done) { done(); }, cpu0, {Var()}, {}, {.name = "async-null"});
    });
    CHECK(contains(m, "null"));

    // Deleted Var.
    m = push_msg([&] { e->push(body, cpu0, {dead}, {v}, {.name = "op-dead"}); });
    CHECK(contains(m, "deleted"));
    CHECK(contains(m, "var #" + std::to_string(dead.id())));
    CHECK(contains(m, "op-dead"));

    // A Var of another engine.
    m = push_msg([&] { e->push(body, cpu0, {}, {foreign}, {.name = "op-foreign"}); });
    CHECK(contains(m, "another engine"));
    CHECK(contains(m, "op-foreign"));
    CHECK(contains(push_msg([&] { e->wait_to_read(foreign); }), "another engine"));
    CHECK(contains(push_msg([&] { (void)e->version(foreign); }), "another engine"));

    // Unknown devices.
    m = push_msg([&] { e->push(body, Device::cpu(5), {}, {v}, {.name = "op-cpu5"}); });
    CHECK(contains(m, "cpu(5)"));
    CHECK(contains(m, "op-cpu5"));
    m = push_msg([&] { e->push(body, Device::gpu(0), {}, {v}, {.name = "op-gpu"}); });
    CHECK(contains(m, "gpu(0)"));
    CHECK(contains(m, "op-gpu"));
    m = push_msg([&] {
      e->push_async([](RunContext&, Completion done) { done(); }, Device::cpu(1), {}, {v}, {.name = "async-cpu1"});
    });
    CHECK(contains(m, "cpu(1)"));
    CHECK(contains(m, "async-cpu1"));

    // Empty functions.
    m = push_msg([&] { e->push(weft::OpFunction(), cpu0, {}, {v}, {.name = "op-empty"}); });
    CHECK(contains(m, "empty"));
    CHECK(contains(m, "op-empty"));
    std::function<void(RunContext&)> empty_std;
    m = push_msg([&] { e->push(empty_std, cpu0, {}, {v}, {.name = "op-empty-std"}); });
    CHECK(contains(m, "empty"));
    CHECK(contains(m, "op-empty-std"));
    m = push_msg([&] { e->push_async(weft::AsyncOpFunction(), cpu0, {}, {v}, {.name = "async-empty"}); });
    CHECK(contains(m, "empty"));
    CHECK(contains(m, "async-empty"));

    // Other calls refuse bad handles too.
    CHECK(contains(push_msg([&] { e->wait_to_read(Var()); }), "null"));
    CHECK(contains(push_msg([&] { e->wait_to_write(Var()); }), "null"));
    CHECK(contains(push_msg([&] { e->delete_var(Var()); }), "null"));
    CHECK(contains(push_msg([&] { (void)e->version(Var()); }), "null"));
    CHECK(contains(push_msg([&] { e->delete_var(foreign); }), "another engine"));

    // Nothing ran, nothing leaked into the in-flight count, the engine works.
    e->wait_all();
    CHECK(ran.load() == 0);
    CHECK(e->inflight() == 0);
    CHECK(e->version(v) == 0);
    e->push(body, cpu0, {}, {v}, {.name = "fine"});
    e->wait_to_read(v);
    CHECK(ran.load() == 1);
    CHECK(e->version(v) == 1);
    // The other engine is untouched and its Var still works there.
    other->push(body, cpu0, {}, {foreign});
    other->wait_all();
    CHECK(other->version(foreign) == 1);
  });
}

TEST_CASE("bad engine settings are refused, naming them" * doctest::timeout(60)) {
  EnvGuard no_engine("WEFT_ENGINE", nullptr);
  auto m = thrown_message<weft::Error>([] { (void)weft::Engine::create({.kind = "bogus"}); });
  CHECK(contains(m, "bogus"));
  {
    EnvGuard bogus("WEFT_ENGINE", "bogus");
    m = thrown_message<weft::Error>([] { (void)weft::Engine::create({}); });
    CHECK(contains(m, "bogus"));
    CHECK(contains(m, "WEFT_ENGINE"));
    // An explicit kind wins over the environment.
    auto e = weft::Engine::create({.kind = "naive", .cpu_devices = 1, .workers_per_cpu_device = 1});
    CHECK(e->kind() == "naive");
  }
  m = thrown_message<weft::Error>([] { (void)weft::Engine::create({.kind = "threaded", .cpu_devices = -1}); });
  CHECK(contains(m, "cpu_devices"));
  {
    EnvGuard bad_workers("WEFT_CPU_WORKERS", "lots");
    m = thrown_message<weft::Error>([] { (void)weft::Engine::create({.kind = "threaded", .cpu_devices = 1}); });
    CHECK(contains(m, "WEFT_CPU_WORKERS"));
    CHECK(contains(m, "lots"));
  }
  {
    EnvGuard bad_inflight("WEFT_MAX_INFLIGHT", "0");
    m = thrown_message<weft::Error>(
        [] { (void)weft::Engine::create({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 1}); });
    CHECK(contains(m, "WEFT_MAX_INFLIGHT"));
  }
}

TEST_CASE("an op that runs on failed inputs sees the failure and may pass it on, reported once" *
          doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var a = e->new_var("a"), b = e->new_var("b"), c = e->new_var("c"), d = e->new_var("d");
    e->push([](RunContext&) { throw std::runtime_error("producer failed"); }, cpu0, {}, {a}, {.name = "producer"});
    std::atomic<int> saw{0};
    // Passes the failure on: its writes carry the original record.
    e->push(
        [&](RunContext& ctx) {
          if (ctx.failed_input) {
            saw.fetch_add(1);
            std::rethrow_exception(ctx.failed_input);
          }
        },
        cpu0, {a}, {b}, {.name = "passes it on", .run_on_failed_input = true});
    // Handles it: its writes are clean.
    e->push([&](RunContext& ctx) { saw.fetch_add(ctx.failed_input ? 1 : 100); }, cpu0, {a}, {c},
            {.name = "handles it", .run_on_failed_input = true});
    // An ordinary reader is skipped as before.
    e->push([&](RunContext&) { saw.fetch_add(1000); }, cpu0, {a}, {d}, {.name = "skipped"});
    CHECK_NOTHROW(e->wait_to_read(c));
    Thrown t = catch_all([&] { e->wait_to_read(b); });
    CHECK(t.threw);
    CHECK(contains(t.what, "producer failed"));
    // The same record: reported once, so neither a nor d throws again.
    CHECK_FALSE(catch_all([&] { e->wait_to_read(a); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_to_read(d); }).threw);
    CHECK_FALSE(catch_all([&] { e->wait_all(); }).threw);
    CHECK(saw.load() == 2);
  });
}
