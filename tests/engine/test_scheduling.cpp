// Engine basics: read/write ordering, versions, priorities, deletion, waits,
// async completion, nested pushes, VarList forms, RunContext and several CPU
// devices. Every scenario runs over naive and threaded × {1, 2, 4, 8} workers
// where it can (blockers block a worker, so gated scenarios are threaded-only).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <future>
#include <latch>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"
#include "weft/engine.h"

using namespace weft_test;

TEST_CASE("reads of one version run concurrently" * doctest::timeout(120)) {
  for_each_threaded(
      [](const Config& cfg) {
        const int readers = cfg.workers;  // all workers must be inside at once
        std::latch all_inside(readers);
        std::atomic<int> met{0};
        std::atomic<int> ran{0};
        {
          auto e = make_engine(cfg);
          Var v = e->new_var("shared");
          e->push([](RunContext&) {}, cpu0, {}, {v}, {.name = "init"});
          for (int i = 0; i < readers; ++i) {
            e->push(
                [&](RunContext&) {
                  ran.fetch_add(1);
                  all_inside.count_down();
                  // Bounded: if reads were serialized this would time out
                  // (and the test fail) instead of hanging.
                  if (eventually([&] { return all_inside.try_wait(); }, 20s)) met.fetch_add(1);
                },
                cpu0, {v}, {}, {.name = "reader"});
          }
          e->wait_all();
        }
        CHECK(ran.load() == readers);
        CHECK(met.load() == readers);
      },
      /*min_workers=*/2);
}

TEST_CASE("writes to one variable serialize, reads never overlap a write" * doctest::timeout(120)) {
  const int writers = kSanitized ? 600 : 3000;
  for_each_config([&](const Config& cfg) {
    long counter = 0;  // not atomic on purpose: the engine must serialize writers
    std::atomic<int> writers_inside{0};
    std::atomic<int> readers_inside{0};
    std::atomic<int> overlaps{0};
    std::atomic<int> reads{0};
    std::atomic<std::uint64_t> sink{0};
    Var v;
    auto e = make_engine(cfg);
    v = e->new_var("counter");
    Var other = e->new_var("other");
    auto writer = [&](RunContext&) {
      if (writers_inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      if (readers_inside.load() != 0) overlaps.fetch_add(1);
      long c = counter;
      sink.fetch_add(spin_work(50));
      counter = c + 1;
      writers_inside.fetch_sub(1);
    };
    auto reader = [&](RunContext&) {
      readers_inside.fetch_add(1);
      if (writers_inside.load() != 0) overlaps.fetch_add(1);
      sink.fetch_add(spin_work(20));
      if (writers_inside.load() != 0) overlaps.fetch_add(1);
      readers_inside.fetch_sub(1);
      reads.fetch_add(1);
    };
    int pushed_reads = 0;
    for (int i = 0; i < writers; ++i) {
      // The write access in several shapes: plain, read+write, duplicated.
      switch (i % 3) {
        case 0: e->push(writer, cpu0, {}, {v}); break;
        case 1: e->push(writer, cpu0, {v}, {v}); break;
        default: e->push(writer, cpu0, {other, v}, {v, v}); break;
      }
      if (i % 4 == 0) {
        e->push(reader, cpu0, {v}, {});
        e->push(reader, cpu0, {v, v}, {});
        pushed_reads += 2;
      }
    }
    e->wait_to_read(v);
    e->wait_all();
    CHECK(overlaps.load() == 0);
    CHECK(counter == writers);
    CHECK(reads.load() == pushed_reads);
    CHECK(e->version(v) == static_cast<std::uint64_t>(writers));
    CHECK(e->version(other) == 0);
  });
}

TEST_CASE("read-after-write and write-after-read follow push order" * doctest::timeout(120)) {
  const int rounds = kSanitized ? 300 : 1500;
  for_each_config([&](const Config& cfg) {
    long value = 0;  // guarded by the engine only
    std::atomic<int> readers_inside{0};
    std::atomic<int> bad{0};
    std::atomic<int> reads_done{0};
    auto e = make_engine(cfg);
    Var v = e->new_var("v");
    for (int r = 1; r <= rounds; ++r) {
      e->push(
          [&, r](RunContext&) {
            if (readers_inside.load() != 0) bad.fetch_add(1);  // WAR violated
            if (value != r - 1) bad.fetch_add(1);              // WAW order violated
            value = r;
          },
          cpu0, {}, {v});
      const int k = 1 + r % 3;
      for (int j = 0; j < k; ++j) {
        e->push(
            [&, r](RunContext&) {
              readers_inside.fetch_add(1);
              if (value != r) bad.fetch_add(1);  // RAW violated
              (void)spin_work(10);
              if (value != r) bad.fetch_add(1);
              readers_inside.fetch_sub(1);
              reads_done.fetch_add(1);
            },
            cpu0, {v}, {});
      }
    }
    e->wait_to_write(v);
    CHECK(bad.load() == 0);
    CHECK(value == rounds);
    CHECK(e->version(v) == static_cast<std::uint64_t>(rounds));
  });
}

TEST_CASE("a blocked writer holds back later readers, and a blocked reader later writers" *
          doctest::timeout(120)) {
  for_each_threaded(
      [](const Config& cfg) {
        // Read after write.
        {
          std::atomic<bool> reader_started{false};
          std::atomic<int> seen{-1};
          int value = 0;
          auto e = make_engine(cfg);
          Blocker blocker;
          Var v = e->new_var("v");
          Var u = e->new_var("unrelated");
          e->push(
              [&, g = blocker.body()](RunContext& ctx) mutable {
                g(ctx);
                value = 1;
              },
              cpu0, {}, {v}, {.name = "gated writer"});
          REQUIRE(blocker.wait_entered());
          e->push(
              [&](RunContext&) {
                reader_started = true;
                seen = value;
              },
              cpu0, {v}, {}, {.name = "reader"});
          // A free worker runs the unrelated op; were the reader (pushed
          // before it) ready, the FIFO would have started it first.
          e->push([](RunContext&) {}, cpu0, {}, {u});
          e->wait_to_read(u);
          CHECK_FALSE(reader_started.load());
          blocker.open();
          e->wait_all();
          CHECK(seen.load() == 1);
        }
        // Write after read.
        {
          std::atomic<bool> writer_started{false};
          std::atomic<bool> reader_done{false};
          std::atomic<bool> writer_saw_reader_done{false};
          auto e = make_engine(cfg);
          Blocker blocker;
          Var v = e->new_var("v");
          Var u = e->new_var("unrelated");
          e->push(
              [&, g = blocker.body()](RunContext& ctx) mutable {
                g(ctx);
                reader_done = true;
              },
              cpu0, {v}, {}, {.name = "gated reader"});
          REQUIRE(blocker.wait_entered());
          e->push(
              [&](RunContext&) {
                writer_started = true;
                writer_saw_reader_done = reader_done.load();
              },
              cpu0, {}, {v}, {.name = "writer"});
          e->push([](RunContext&) {}, cpu0, {}, {u});
          e->wait_to_read(u);
          CHECK_FALSE(writer_started.load());
          blocker.open();
          e->wait_all();
          CHECK(writer_started.load());
          CHECK(writer_saw_reader_done.load());
        }
      },
      /*min_workers=*/2);
}

TEST_CASE("versions count completed writes only" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<int> runs{0};
    auto e = make_engine(cfg);
    Var a = e->new_var("a");
    Var b = e->new_var("b");
    auto body = [&](RunContext&) { runs.fetch_add(1); };
    CHECK(e->version(a) == 0);
    e->push(body, cpu0, {}, {a});
    e->wait_to_read(a);
    CHECK(e->version(a) == 1);
    e->push(body, cpu0, {a}, {});  // a read does not bump
    e->push(body, cpu0, {a, a, a}, {b});
    e->wait_to_write(a);
    CHECK(e->version(a) == 1);
    CHECK(e->version(b) == 1);
    e->push(body, cpu0, {a}, {a});  // both lists: one write
    e->wait_to_read(a);
    CHECK(e->version(a) == 2);
    e->push(body, cpu0, {a, b}, {a, a, b, a});  // duplicates ignored
    e->wait_all();
    CHECK(e->version(a) == 3);
    CHECK(e->version(b) == 2);
    e->push(body, cpu0, {}, {});  // no variables at all
    e->wait_all();
    CHECK(runs.load() == 6);
    CHECK(e->version(a) == 3);
    CHECK(e->version(b) == 2);
  });
}

struct Prioritized {
  int priority;
  const char* label;
};

// One worker held by a blocker; the ops are pushed while it is held, either
// ready at once (each writes its own variable) or all released together by
// the blocker's completion (each reads the blocker's variable). Returns the order
// they ran in.
std::vector<std::string> run_order_behind_gate(std::initializer_list<Prioritized> ops, bool released_together) {
  Config cfg{"threaded", 1, 1, 0};
  INFO("engine config: " << cfg.str() << (released_together ? ", released together" : ", ready at push"));
  std::mutex m;
  std::vector<std::string> order;
  auto e = make_engine(cfg);
  Blocker blocker;
  Var g = e->new_var("blocker");
  e->push(blocker.body(), cpu0, {}, {g}, {.name = "blocker"});
  REQUIRE(blocker.wait_entered());
  for (const Prioritized& p : ops) {
    auto record = [&, label = p.label](RunContext&) {
      std::lock_guard lock(m);
      order.emplace_back(label);
    };
    if (released_together)
      e->push(record, cpu0, {g}, {}, {.priority = p.priority, .name = p.label});
    else
      e->push(record, cpu0, {}, {e->new_var(p.label)}, {.priority = p.priority, .name = p.label});
  }
  blocker.open();
  e->wait_all();
  return order;
}

TEST_CASE("ready ops run by priority, FIFO among equals (one worker)" * doctest::timeout(60)) {
  CHECK(run_order_behind_gate({{-1, "m1"}, {0, "z1"}, {5, "f1"}, {5, "f2"}, {3, "t1"}, {0, "z2"}}, false) ==
        std::vector<std::string>{"f1", "f2", "t1", "z1", "z2", "m1"});
}

// Ops that become ready at the same moment (all released by one completion)
// must still run in push order among equal priorities.
TEST_CASE("ops released together run by priority, FIFO among equals (one worker)" * doctest::timeout(60)) {
  CHECK(run_order_behind_gate({{0, "z1"}, {0, "z2"}, {5, "f1"}, {0, "z3"}, {5, "f2"}, {-1, "m1"}, {0, "z4"}, {-1, "m2"}},
                              true) == std::vector<std::string>{"f1", "f2", "z1", "z2", "z3", "z4", "m1", "m2"});
}

TEST_CASE("many ready ops run in a stable priority order (one worker)" * doctest::timeout(60)) {
  Config cfg{"threaded", 1, 1, 0};
  INFO("engine config: " << cfg.str());
  SplitMix rng(42);
  std::vector<int> order;  // one worker: no lock needed, but the engine must publish
  std::mutex m;
  auto e = make_engine(cfg);
  Blocker blocker;
  Var g = e->new_var("blocker");
  e->push(blocker.body(), cpu0, {}, {g});
  REQUIRE(blocker.wait_entered());
  std::vector<std::pair<int, int>> expected;  // (priority, push index)
  for (int i = 0; i < 300; ++i) {
    int priority = static_cast<int>(rng.below(7)) - 3;
    expected.emplace_back(priority, i);
    e->push(
        [&, i](RunContext&) {
          std::lock_guard lock(m);
          order.push_back(i);
        },
        cpu0, {}, {}, {.priority = priority});
  }
  blocker.open();
  e->wait_all();
  std::stable_sort(expected.begin(), expected.end(), [](auto& x, auto& y) { return x.first > y.first; });
  std::vector<int> want;
  for (auto& p : expected) want.push_back(p.second);
  CHECK(order == want);
}

TEST_CASE("thousands of ready ops of one priority run in push order (one worker)" * doctest::timeout(60)) {
  Config cfg{"threaded", 1, 1, 100000};
  INFO("engine config: " << cfg.str());
  constexpr int kOps = 5000;  // more than any fixed-size ready ring
  std::vector<int> order;
  std::vector<int> released_order;
  std::mutex m;
  auto e = make_engine(cfg);
  Blocker blocker;
  Var g = e->new_var("blocker");
  e->push(blocker.body(), cpu0, {}, {g});
  REQUIRE(blocker.wait_entered());
  for (int i = 0; i < kOps; ++i) {
    // Ready at push: they queue while the blocker holds the only worker.
    e->push(
        [&, i](RunContext&) {
          std::lock_guard lock(m);
          order.push_back(i);
        },
        cpu0, {}, {});
  }
  for (int i = 0; i < kOps; ++i) {
    // Ready all at once when the blocker's write completes.
    e->push(
        [&, i](RunContext&) {
          std::lock_guard lock(m);
          released_order.push_back(i);
        },
        cpu0, {g}, {});
  }
  blocker.open();
  e->wait_all();
  std::vector<int> want(kOps);
  for (int i = 0; i < kOps; ++i) want[static_cast<std::size_t>(i)] = i;
  CHECK(order.size() == want.size());
  CHECK(order == want);
  CHECK(released_order.size() == want.size());
  CHECK(released_order == want);
}

TEST_CASE("delete_var runs after pending ops, and the handle is invalid at once" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::mutex m;
    std::vector<int> ran;
    auto e = make_engine(cfg);
    Blocker blocker;
    Var g = e->new_var("blocker");
    Var v = e->new_var("doomed");
    if (cfg.threaded()) {
      e->push(blocker.body(), cpu0, {}, {g}, {.name = "blocker"});
      REQUIRE(blocker.wait_entered());
    }
    auto record = [&](int i) {
      return [&, i](RunContext&) {
        std::lock_guard lock(m);
        ran.push_back(i);
      };
    };
    e->push(record(1), cpu0, {g}, {v});  // pending behind the blocker (threaded)
    e->push(record(2), cpu0, {v}, {});
    e->push(record(3), cpu0, {v}, {v});
    e->push(record(4), cpu0, {v}, {});
    e->delete_var(v);
    if (cfg.threaded()) CHECK(e->inflight() >= 5);  // the blocker and ops 1-4 are all pending

    CHECK(contains(thrown_message<weft::Error>([&] { e->push(record(99), cpu0, {v}, {}); }), "deleted"));
    CHECK(contains(thrown_message<weft::Error>([&] { e->push(record(99), cpu0, {}, {v}); }), "deleted"));
    CHECK(contains(thrown_message<weft::Error>([&] { (void)e->version(v); }), "deleted"));
    CHECK(contains(thrown_message<weft::Error>([&] { e->wait_to_read(v); }), "deleted"));
    CHECK(contains(thrown_message<weft::Error>([&] { e->wait_to_write(v); }), "deleted"));
    CHECK(contains(thrown_message<weft::Error>([&] { e->delete_var(v); }), "deleted"));
    auto msg = thrown_message<weft::Error>([&] { e->push(record(99), cpu0, {}, {v}); });
    CHECK(contains(msg, "var #" + std::to_string(v.id())));

    // A new variable never aliases the deleted one.
    Var w = e->new_var("fresh");
    CHECK(w != v);
    CHECK(e->version(w) == 0);
    blocker.open();
    e->wait_all();
    {
      std::lock_guard lock(m);
      CHECK(ran == std::vector<int>{1, 2, 3, 4});  // push order: each op shares v with a writer
    }
    e->push(record(5), cpu0, {}, {w});
    e->wait_to_read(w);
    CHECK(e->version(w) == 1);
    CHECK(contains(thrown_message<weft::Error>([&] { (void)e->version(v); }), "deleted"));
  });
}

TEST_CASE("delete_var many times interleaved with ops recycles slots safely" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<int> ran{0};
    auto e = make_engine(cfg);
    Var keep = e->new_var("keep");
    std::vector<Var> dead;
    for (int round = 0; round < 200; ++round) {
      Var v = e->new_var();
      e->push([&](RunContext&) { ran.fetch_add(1); }, cpu0, {keep}, {v});
      e->push([&](RunContext&) { ran.fetch_add(1); }, cpu0, {v}, {keep});
      e->delete_var(v);
      dead.push_back(v);
    }
    e->wait_all();
    CHECK(ran.load() == 400);
    CHECK(e->version(keep) == 200);
    for (Var v : dead) CHECK_THROWS_AS(e->push([](RunContext&) {}, cpu0, {v}, {}), weft::Error);
  });
}

// delete_var called from inside an op, after the op pushed a follow-up that
// writes the variable: the deletion is ordered after the follow-up, and the
// recycled slot must not carry the follow-up's write into a new variable.
TEST_CASE("delete_var from inside an op runs after the follow-ups it pushed before" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::atomic<bool> follow_up_ran{false};
    std::atomic<bool> inner_var_ok{false};
    std::atomic<std::uint64_t> inner_version{99};
    auto e = make_engine(cfg);
    Var v = e->new_var("v");
    Var out = e->new_var("out");
    Var inner{};
    e->push(
        [&](RunContext& ctx) {
          ctx.engine->push([&](RunContext&) { follow_up_ran = true; }, cpu0, {}, {v}, {.name = "writes v"});
          ctx.engine->delete_var(v);
          inner = ctx.engine->new_var("created after the delete");
          inner_version = ctx.engine->version(inner);
          inner_var_ok = true;
        },
        cpu0, {}, {out}, {.name = "parent"});
    e->wait_all();
    REQUIRE(inner_var_ok.load());
    CHECK(follow_up_ran.load());
    CHECK(inner_version.load() == 0);
    CHECK(e->version(inner) == 0);  // nothing ever wrote it
    Var fresh = e->new_var("fresh");
    CHECK(e->version(fresh) == 0);
    CHECK_THROWS_AS((void)e->version(v), weft::Error);
    e->push([](RunContext&) {}, cpu0, {}, {fresh});
    e->wait_to_read(fresh);
    CHECK(e->version(fresh) == 1);
    CHECK(e->version(inner) == 0);
  });
}

TEST_CASE("waiting on a fresh variable returns at once" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var v = e->new_var("fresh");
    e->wait_to_read(v);
    e->wait_to_write(v);
    e->wait_all();
    CHECK(e->version(v) == 0);
    CHECK(e->inflight() == 0);
  });
}

TEST_CASE("wait_to_write waits for pending readers, wait_to_read does not" * doctest::timeout(60)) {
  for_each_threaded([](const Config& cfg) {
    std::atomic<bool> reader_done{false};
    std::atomic<bool> read_returned{false};
    std::atomic<bool> write_returned{false};
    std::atomic<bool> writer_saw_reader_done{false};
    auto e = make_engine(cfg);
    Var v = e->new_var("v");
    {
      Blocker blocker;
      e->push(
          [&, g = blocker.body()](RunContext& ctx) mutable {
            g(ctx);
            reader_done = true;
          },
          cpu0, {v}, {}, {.name = "gated reader"});
      REQUIRE(blocker.wait_entered());
      std::thread read_waiter([&] {
        e->wait_to_read(v);  // nothing writes v: no reason to wait
        read_returned = true;
      });
      CHECK(eventually([&] { return read_returned.load(); }, 20s));
      CHECK_FALSE(reader_done.load());
      std::thread write_waiter([&] {
        e->wait_to_write(v);
        writer_saw_reader_done = reader_done.load();
        write_returned = true;
      });
      CHECK(holds_for([&] { return !write_returned.load(); }, 50ms));
      blocker.open();
      read_waiter.join();
      write_waiter.join();
    }
    CHECK(write_returned.load());
    CHECK(writer_saw_reader_done.load());

    // wait_to_read waits for a pending writer.
    std::atomic<bool> writer_done{false};
    std::atomic<bool> waiter_saw_writer_done{false};
    std::atomic<bool> returned{false};
    {
      Blocker blocker;
      e->push(
          [&, g = blocker.body()](RunContext& ctx) mutable {
            g(ctx);
            writer_done = true;
          },
          cpu0, {}, {v}, {.name = "gated writer"});
      REQUIRE(blocker.wait_entered());
      std::thread waiter([&] {
        e->wait_to_read(v);
        waiter_saw_writer_done = writer_done.load();
        returned = true;
      });
      CHECK(holds_for([&] { return !returned.load(); }, 50ms));
      blocker.open();
      waiter.join();
    }
    CHECK(waiter_saw_writer_done.load());
    CHECK(e->version(v) == 1);
  });
}

// wait_all's contract is "every op pushed before": another thread that keeps
// pushing must not keep it waiting forever. The pusher keeps a backlog of a
// few hundred ops (~30 ms of work on one worker), so the engine is never
// empty while it runs, yet everything pushed before wait_all is done quickly.
TEST_CASE("wait_all returns once the ops pushed before it are done, while another thread keeps pushing" *
          doctest::timeout(120)) {
  for_each_config([](const Config& base) {
    Config cfg = base;
    cfg.max_inflight = 100'000;  // the pusher throttles itself, never blocks
    std::atomic<bool> stop{false};
    std::atomic<long> pushed{0};
    std::atomic<bool> before_done{false};
    std::atomic<std::uint64_t> sink{0};
    std::promise<bool> waited;  // the value: the op pushed before had run
    std::future<bool> waited_f = waited.get_future();
    auto e = make_engine(cfg);
    Var mine = e->new_var("mine");
    std::vector<Var> theirs;
    for (int i = 0; i < 8; ++i) theirs.push_back(e->new_var());
    std::thread pusher([&] {
      for (long i = 0; !stop.load();) {
        if (e->inflight() >= 500) {
          std::this_thread::yield();
          continue;
        }
        e->push([&](RunContext&) { sink.fetch_add(spin_work(20000)); }, cpu0, {}, {theirs[i % 8]});
        pushed = ++i;
      }
    });
    CHECK(eventually([&] { return pushed.load() > 100; }, 20s));  // a backlog exists
    e->push([&](RunContext&) { before_done = true; }, cpu0, {}, {mine});
    std::thread waiter([&] {
      e->wait_all();
      waited.set_value(before_done.load());
    });
    const bool returned = waited_f.wait_for(3s) == std::future_status::ready;  // bounded: detects starvation
    stop = true;  // lets a starved wait_all finish either way
    waiter.join();
    pusher.join();
    CHECK(returned);
    CHECK(waited_f.get());
    e->wait_all();
  });
}

TEST_CASE("async ops completed from another thread" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    const int n = 20;
    std::mutex m;
    std::vector<std::thread> threads;
    long value = 0;
    long seen = -1;
    {
      auto e = make_engine(cfg);
      Var v = e->new_var("v");
      Var out = e->new_var("out");
      for (int i = 0; i < n; ++i) {
        e->push_async(
            [&m, &threads, &value](RunContext&, Completion done) {
              long* val = &value;
              std::lock_guard lock(m);
              threads.emplace_back([done = std::move(done), val] {
                *val += 1;  // the op's write, done on another thread
                done();
              });
            },
            cpu0, {}, {v}, {.name = "async increment"});
      }
      e->push([&](RunContext&) { seen = value; }, cpu0, {v}, {out});
      e->wait_to_read(out);
      CHECK(seen == n);
      CHECK(e->version(v) == static_cast<std::uint64_t>(n));
      e->wait_all();
    }
    for (auto& t : threads) t.join();
  });
}

// An async op's body may go on after calling done() (e.g. log, update a
// counter it captured): the callable and its captures must stay alive until
// the body returns, like any function object being invoked.
TEST_CASE("async op: captures stay alive while the body runs after done()" * doctest::timeout(60)) {
  struct Probe {
    std::atomic<bool>* destroyed;
    explicit Probe(std::atomic<bool>* d) : destroyed(d) {}
    Probe(Probe&& o) noexcept : destroyed(std::exchange(o.destroyed, nullptr)) {}
    Probe(const Probe&) = delete;
    ~Probe() {
      if (destroyed) destroyed->store(true);
    }
  };
  for_each_config([](const Config& cfg) {
    std::atomic<bool> destroyed{false};
    std::atomic<int> observed{0};  // 1: captures destroyed before the body returned, 2: alive
    auto e = make_engine(cfg);
    Var v = e->new_var("v");
    e->push_async(
        [probe = Probe(&destroyed), out = &observed](RunContext&, Completion done) {
          std::atomic<bool>* d = probe.destroyed;  // locals: safe to use after done()
          std::atomic<int>* o = out;
          done();
          o->store(d->load() ? 1 : 2);
        },
        cpu0, {}, {v}, {.name = "async body continues after done"});
    e->wait_all();  // returns once done() was called: the body may still be running
    REQUIRE(eventually([&] { return observed.load() != 0; }, 20s));
    CHECK(observed.load() == 2);
    CHECK(eventually([&] { return destroyed.load(); }, 20s));  // freed once the body returned
  });
}

// "The op (or any thread it hands the Completion to) calls done()": handing it
// to a follow-up op the async op pushes (one that does not depend on it) is
// such a hand-off. The scenario runs on its own thread so that an engine that
// deadlocks here fails the test instead of hanging the binary (the stuck
// thread and its engine are then abandoned).
TEST_CASE("an async op may hand its Completion to a follow-up op it pushes" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    struct State {
      std::atomic<bool> follow_up_ran{false};
      std::atomic<bool> reader_ran{false};
      std::promise<void> finished;
    };
    auto state = std::make_shared<State>();
    std::future<void> finished = state->finished.get_future();
    std::shared_ptr<weft::Engine> e = make_engine(cfg);
    std::thread runner([e, state] {
      Var v = e->new_var("async out");
      Var other = e->new_var("follow-up out");
      e->push_async(
          [state, other](RunContext& ctx, Completion done) {
            ctx.engine->push(
                [state, done](RunContext&) {
                  state->follow_up_ran = true;
                  done();
                },
                cpu0, {}, {other}, {.name = "completes its parent"});
          },
          cpu0, {}, {v}, {.name = "completed by its follow-up"});
      e->push([state](RunContext&) { state->reader_ran = true; }, cpu0, {v}, {}, {.name = "reader"});
      e->wait_all();
      state->finished.set_value();
    });
    const bool completed = finished.wait_for(5s) == std::future_status::ready;
    CHECK(completed);
    if (completed) {
      runner.join();
      CHECK(state->follow_up_ran.load());
      CHECK(state->reader_ran.load());
    } else {
      runner.detach();  // deadlocked: abandon it (it keeps its engine alive)
    }
  });
}

TEST_CASE("nested push: a follow-up pushed from an op runs and can be waited on" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    long x = 0, y = 0;
    auto e = make_engine(cfg);
    Var vx = e->new_var("x");
    Var vy = e->new_var("y");
    e->push(
        [&](RunContext& ctx) {
          x = 1;
          ctx.engine->push([&](RunContext&) { y = 7; }, cpu0, {}, {vy}, {.name = "follow-up"});
        },
        cpu0, {}, {vx}, {.name = "parent"});
    e->wait_to_read(vx);  // the follow-up is pushed by now
    e->wait_to_read(vy);
    CHECK(x == 1);
    CHECK(y == 7);
    CHECK(e->version(vy) == 1);
  });
}

// The follow-up reads what its parent writes, and the parent was pushed first:
// push order says the follow-up runs after the parent completed.
TEST_CASE("nested push: a follow-up reading the parent's output runs after the parent" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    long x = 0, y = 0;
    std::uint64_t version_seen = 99;
    auto e = make_engine(cfg);
    Var vx = e->new_var("x");
    Var vy = e->new_var("y");
    e->push(
        [&](RunContext& ctx) {
          x = 1;
          ctx.engine->push(
              [&](RunContext& inner) {
                y = x;
                version_seen = inner.engine->version(vx);
              },
              cpu0, {vx}, {vy}, {.name = "follow-up"});
          x = 2;  // still the parent's write: the follow-up must see it
        },
        cpu0, {}, {vx}, {.name = "parent"});
    e->wait_to_read(vx);
    e->wait_to_read(vy);
    CHECK(y == 2);
    CHECK(version_seen == 1);
  });
}

TEST_CASE("nested pushes never block on the in-flight bound (max_inflight = 1)" * doctest::timeout(60)) {
  for_each_config(
      [](const Config& cfg) {
        std::atomic<int> ran{0};
        long chain = 0;
        auto e = make_engine(cfg);
        CHECK(e->max_inflight() == 1);
        Var vx = e->new_var("x");
        Var vy = e->new_var("y");
        for (int round = 0; round < 5; ++round) {
          e->push(
              [&](RunContext& ctx) {
                for (int i = 0; i < 20; ++i) {
                  ctx.engine->push(
                      [&](RunContext& inner) {
                        ++chain;
                        ran.fetch_add(1);
                        // and one level deeper
                        inner.engine->push([&](RunContext&) { ran.fetch_add(1); }, cpu0, {}, {});
                      },
                      cpu0, {}, {vy});
                }
              },
              cpu0, {}, {vx});
        }
        e->wait_to_read(vx);
        e->wait_to_read(vy);
        e->wait_all();
        CHECK(chain == 100);
        CHECK(ran.load() == 200);
        CHECK(e->version(vy) == 100);
      },
      1, /*max_inflight=*/1);
}

TEST_CASE("reads and writes accept braced lists, vectors, arrays, spans and a lone Var" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    long a = 0, b = 0, c = 0, d = 0;
    auto e = make_engine(cfg);
    Var va = e->new_var("a"), vb = e->new_var("b"), vc = e->new_var("c"), vd = e->new_var("d");
    e->push([&](RunContext&) { a = 1; }, cpu0, {}, {va});
    std::vector<Var> reads{va};
    std::vector<Var> writes{vb, vc};
    e->push(
        [&](RunContext&) {
          b = a + 1;
          c = a + 2;
        },
        cpu0, reads, writes);
    std::array<Var, 2> arr{vb, vc};
    e->push([&](RunContext&) { d = b * 10 + c; }, cpu0, arr, vd);
    std::vector<Var> bcd{vb, vc, vd};
    std::span<const Var> sp(bcd);
    e->push([&](RunContext&) { a = b + c + d; }, cpu0, sp, std::vector<Var>{va});
    e->wait_all();
    CHECK(b == 2);
    CHECK(c == 3);
    CHECK(d == 23);
    CHECK(a == 28);
    CHECK(e->version(va) == 2);
    CHECK(e->version(vb) == 1);
    CHECK(e->version(vc) == 1);
    CHECK(e->version(vd) == 1);
  });
}

TEST_CASE("RunContext names the device, a worker index in range, the op and the engine" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    std::mutex m;
    std::map<int, std::set<std::thread::id>> threads_of_worker;
    std::atomic<int> bad{0};
    std::atomic<int> ran{0};
    auto e = make_engine(cfg);
    const int workers = e->workers(cpu0);
    CHECK(workers == cfg.workers);
    weft::Engine* engine = e.get();
    for (int i = 0; i < 400; ++i) {
      e->push(
          [&, engine, workers](RunContext& ctx) {
            if (ctx.device != cpu0) bad.fetch_add(1);
            if (ctx.worker < 0 || ctx.worker >= workers) bad.fetch_add(1);
            if (ctx.op_name != "ctx-op") bad.fetch_add(1);
            if (ctx.engine != engine) bad.fetch_add(1);
            (void)spin_work(20);
            std::lock_guard lock(m);
            threads_of_worker[ctx.worker].insert(std::this_thread::get_id());
            ran.fetch_add(1);
          },
          cpu0, {}, {}, {.name = "ctx-op"});
    }
    e->wait_all();
    CHECK(ran.load() == 400);
    CHECK(bad.load() == 0);
    if (cfg.threaded()) {
      // A worker index names one thread, and no two indices share a thread.
      std::set<std::thread::id> all;
      for (auto& [w, ids] : threads_of_worker) {
        CHECK(ids.size() == 1);
        all.insert(ids.begin(), ids.end());
      }
      CHECK(all.size() == threads_of_worker.size());
      CHECK(all.count(std::this_thread::get_id()) == 0);
    }
  });
}

TEST_CASE("several CPU devices: ops run on their own device's pool" * doctest::timeout(60)) {
  for_each_config(
      [](const Config& cfg) {
        constexpr int kDevices = 3;
        std::mutex m;
        std::array<std::set<std::thread::id>, kDevices> threads;
        std::atomic<int> bad{0};
        std::atomic<int> ran{0};
        auto e = make_engine(cfg);
        REQUIRE(e->devices().size() == kDevices);
        for (int d = 0; d < kDevices; ++d) {
          CHECK(e->devices()[d] == Device::cpu(d));
          CHECK(e->workers(Device::cpu(d)) == cfg.workers);
        }
        CHECK_THROWS_AS((void)e->workers(Device::cpu(kDevices)), weft::Error);
        Var shared = e->new_var("shared");
        for (int i = 0; i < 300; ++i) {
          const int d = i % kDevices;
          e->push(
              [&, d](RunContext& ctx) {
                if (ctx.device != Device::cpu(d)) bad.fetch_add(1);
                if (ctx.worker < 0 || ctx.worker >= cfg.workers) bad.fetch_add(1);
                (void)spin_work(20);
                std::lock_guard lock(m);
                threads[d].insert(std::this_thread::get_id());
                ran.fetch_add(1);
              },
              Device::cpu(d), {shared}, {});
        }
        e->wait_all();
        CHECK(ran.load() == 300);
        CHECK(bad.load() == 0);
        if (cfg.threaded()) {
          for (int d = 0; d < kDevices; ++d) {
            CHECK(threads[d].size() >= 1);
            CHECK(threads[d].size() <= static_cast<std::size_t>(cfg.workers));
            CHECK(threads[d].count(std::this_thread::get_id()) == 0);
            for (int o = d + 1; o < kDevices; ++o)
              for (auto id : threads[d]) CHECK(threads[o].count(id) == 0);
          }
        }
      },
      /*cpu_devices=*/3);
}
