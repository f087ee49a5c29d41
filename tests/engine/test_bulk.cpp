// Bulking (Engine::set_bulk_size, BulkScope; docs/design/bulking.md): a
// thread's consecutive pushes for one device run as one engine op, each op
// keeping its meaning. Checked against the serial oracle with the random
// differential workload, on the naive engine and the threaded one at 1, 2,
// 4, 8 workers; errors inside a bulk, flush points, follow-ups, capture,
// traces, and misuse.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"
#include "engine/random_workload.h"
#include "weft/engine.h"
#include "weft/op_graph.h"

using namespace weft_test;

namespace {

// The workload with every op on one device, priority 0 and synchronous: the
// shape that joins bulks most (the mixed workload flushes at most changes).
std::vector<OpSpec> plain(std::vector<OpSpec> ops) {
  for (OpSpec& op : ops) {
    op.device = 0;
    op.priority = 0;
    op.async = false;
  }
  return ops;
}

// What fn() throws (op failures reach waits as thrown, std::runtime_error
// here), or "(no error)".
std::string what_of(auto&& fn) { return what_thrown<std::exception>(fn); }

}  // namespace

TEST_CASE("bulk: the random workload pushed in bulks equals the serial loop" * doctest::timeout(300)) {
  const int n = kSanitized ? 3'000 : 20'000;
  for (std::uint64_t seed : {21u, 22u}) {
    const std::vector<OpSpec> mixed = make_ops(seed, n, 0, range(0, kVars), range(0, kVars));
    for (const bool joinable : {false, true}) {
      // Under the sanitizers one seed each for the mixed and the joinable ops.
      if (kSanitized && joinable != (seed == 22u)) continue;
      const std::vector<OpSpec> ops = joinable ? plain(mixed) : mixed;
      std::vector<std::uint64_t> expected = initial_values(seed);
      std::vector<std::uint64_t> expected_writes(kVars, 0);
      run_serial(ops, expected, expected_writes);
      for (const std::size_t size : {std::size_t{2}, std::size_t{7}, std::size_t{64}}) {
        for (const Config& cfg : all_configs(/*cpu_devices=*/3)) {
          INFO("engine config: " << cfg.str() << ", bulk size " << size << (joinable ? ", joinable ops" : ""));
          CAPTURE(seed);
          std::vector<std::uint64_t> values = initial_values(seed);
          std::vector<std::uint64_t> versions;
          {
            auto e = make_engine(cfg);
            const std::vector<Var> vars = new_vars(*e);
            // The ops' bodies point into these: they outlive the scope.
            const std::vector<OpSpec> first(ops.begin(), ops.begin() + n / 2);
            const std::vector<OpSpec> second(ops.begin() + n / 2, ops.end());
            {
              weft::BulkScope bulk(*e, size);
              CHECK(e->bulk_size() == size);
              // A wait in the middle flushes what was collected.
              push_ops(*e, cfg, first, vars, values.data());
              e->wait_to_read(vars[5]);
              push_ops(*e, cfg, second, vars, values.data());
            }
            CHECK(e->bulk_size() == 0);
            e->wait_all();
            CHECK(e->inflight() == 0);
            versions = versions_of(*e, vars);
          }
          check_against_oracle(values, expected, versions, expected_writes);
        }
      }
    }
  }
}

TEST_CASE("bulk: collected ops are pushed at the flush, as one op run back to back on one worker") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    std::vector<int> order;
    std::set<std::thread::id> threads;
    std::set<int> workers;
    auto body = [&](int i) {
      return [&, i](RunContext& ctx) {
        order.push_back(i);
        threads.insert(std::this_thread::get_id());
        workers.insert(ctx.worker);
      };
    };
    CHECK(e->set_bulk_size(4) == 0);
    e->push(body(0), {}, {x});
    e->push(body(1), {x}, {y});
    e->push(body(2), {y}, {x});
    // Collected, not pushed: nothing in flight, nothing written.
    CHECK(e->inflight() == 0);
    CHECK(e->version(x) == 0);
    e->push(body(3), {x, y}, {y});  // the fourth: the bulk is full and pushed
    CHECK(e->set_bulk_size(0) == 4);
    e->wait_all();
    CHECK(order == std::vector<int>{0, 1, 2, 3});
    CHECK(threads.size() == 1);
    CHECK(workers.size() == 1);
    CHECK(e->version(x) == 2);  // versions count each member's writes
    CHECK(e->version(y) == 2);
  });
}

TEST_CASE("bulk: a failing member fails what reads it (later members included), the others run") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y"), z = e->new_var("z"), w = e->new_var("w");
    int y_runs = 0, z_runs = 0, w_runs = 0;
    std::string seen_failure;
    {
      weft::BulkScope bulk(*e, 16);
      e->push([] { throw std::runtime_error("bad load"); }, {}, {x}, {.name = "load"});
      e->push([&] { ++y_runs; }, {x}, {y}, {.name = "use"});
      e->push([&] { ++z_runs; }, {}, {z}, {.name = "independent"});
      e->push(
          [&](RunContext& ctx) {
            ++w_runs;
            if (ctx.failed_input) seen_failure = what_of([&] { std::rethrow_exception(ctx.failed_input); });
          },
          {y}, {w}, {.name = "answers", .run_on_failed_input = true});
    }
    // It answered: what it wrote is clean.
    CHECK(what_of([&] { e->wait_to_read(w); }) == "(no error)");
    CHECK(contains(what_of([&] { e->wait_to_read(y); }), "bad load"));
    CHECK(what_of([&] { e->wait_to_read(x); }) == "(no error)");  // reported once
    e->wait_all();
    CHECK(y_runs == 0);  // skipped
    CHECK(z_runs == 1);
    CHECK(w_runs == 1);
    CHECK(contains(seen_failure, "bad load"));
    CHECK(e->version(x) == 1);
    CHECK(e->version(y) == 1);  // a skipped op still counts as a write
    CHECK(e->version(w) == 1);
    // A later write clears the failure, inside a bulk as outside.
    {
      weft::BulkScope bulk(*e, 16);
      e->push([] { throw std::runtime_error("second"); }, {}, {x});
      e->push([] {}, {}, {x});
      e->push([&] { ++y_runs; }, {x}, {y});
    }
    e->wait_to_read(y);
    CHECK(y_runs == 1);
    CHECK(contains(what_of([&] { e->wait_all(); }), "second"));  // nobody waited on it before
  });
}

TEST_CASE("bulk: a failure carried in from before the bulk skips the members that read it") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y"), z = e->new_var("z");
    e->push([] { throw std::runtime_error("before"); }, {}, {x});
    int y_runs = 0, z_runs = 0;
    {
      weft::BulkScope bulk(*e, 8);
      e->push([&] { ++y_runs; }, {x}, {y});
      e->push([&] { ++z_runs; }, {}, {z});
    }
    CHECK(contains(what_of([&] { e->wait_to_read(y); }), "before"));
    e->wait_all();
    CHECK(y_runs == 0);
    CHECK(z_runs == 1);
  });
}

TEST_CASE("bulk: pushes that cannot join flush first, so push order holds") {
  for_each_config(
      [](const Config& cfg) {
        auto e = make_engine(cfg);
        Var x = e->new_var("x");
        std::vector<std::string> order;  // every op writes x: all in push order
        auto note = [&](std::string what) { return [&, what] { order.push_back(what); }; };
        {
          weft::BulkScope bulk(*e, 100);
          e->push(note("a"), {}, {x});
          e->push(note("b"), {}, {x});
          e->push_async([&](Completion done) {  // async: never joins
            order.push_back("async");
            done();
          }, {}, {x});
          e->push(note("c"), {}, {x});
          e->push(note("cpu1"), Device::cpu(1), {}, {x});  // another device
          e->push(note("d"), {}, {x});
          e->push(note("prio"), {}, {x}, {.priority = 3});  // another priority
          e->push(note("e"), {}, {x});
        }
        e->wait_all();
        CHECK(order == std::vector<std::string>{"a", "b", "async", "c", "cpu1", "d", "prio", "e"});
        CHECK(e->version(x) == 8);
      },
      /*cpu_devices=*/2);
}

TEST_CASE("bulk: waits, deletion, capture and replay on the bulking thread flush first") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    int vx = 0, vy = 0;
    weft::BulkScope bulk(*e, 1000);
    e->push([&] { vx = 1; }, {}, {x});
    e->wait_to_read(x);
    CHECK(vx == 1);
    e->push([&] { vx = 2; }, {}, {x});
    e->wait_to_write(x);
    CHECK(vx == 2);
    e->push([&] { vy = vx; }, {x}, {y});
    e->wait_all();
    CHECK(vy == 2);
    // Deleting a variable: the collected ops that use it run before.
    Var t = e->new_var("t");
    int vt = 0;
    e->push([&] { vt = 5; }, {}, {t});
    e->delete_var(t);
    e->wait_all();
    CHECK(vt == 5);
    // Capture: collected ops are pushed before it; captured ops are not collected.
    e->push([&] { vx = 10; }, {}, {x});
    e->begin_capture();
    e->push([&] { vx += 1; }, {}, {x});
    e->push([&] { vy = vx; }, {x}, {y});
    weft::OpGraph graph = e->end_capture();
    CHECK(graph.ops() == 2);
    e->push([&] { vx *= 100; }, {}, {x});  // collected: after the flush at replay
    e->replay(graph);
    e->wait_to_read(y);
    CHECK(vy == 1001);
  });
}

TEST_CASE("bulk: follow-ups pushed by members run as usual, after them") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    std::atomic<int> vx{0};
    int vy = 0;
    {
      weft::BulkScope bulk(*e, 8);
      for (int i = 0; i < 4; ++i) {
        e->push(
            [&](RunContext& ctx) {
              vx.fetch_add(1);
              // Not collected (a push from inside an op): pushed at once.
              ctx.engine->push([&] { vy += vx.load(); }, {x}, {y});
            },
            {}, {x});
      }
    }
    e->wait_all();
    CHECK(vx.load() == 4);
    // The threaded engine: each follow-up reads x, so it runs after the whole
    // bulk (which holds x). The naive engine runs the members as pushed ops,
    // each one's follow-up right after it.
    CHECK(vy == (cfg.threaded() ? 16 : 1 + 2 + 3 + 4));
  });
}

TEST_CASE("bulk: sizes are per thread and per engine, scopes nest and restore") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    auto other = make_engine(cfg);
    Var x = e->new_var("x"), ox = other->new_var("ox");
    CHECK(e->bulk_size() == 0);
    {
      weft::BulkScope outer(*e, 8);
      {
        weft::BulkScope inner(*e, 3);
        CHECK(e->bulk_size() == 3);
      }
      CHECK(e->bulk_size() == 8);
      CHECK(other->bulk_size() == 0);
      std::thread([&] { CHECK(e->bulk_size() == 0); }).join();
      // Another engine's pushes are not collected.
      int vo = 0;
      other->push([&] { vo = 1; }, {}, {ox});
      other->wait_to_read(ox);
      CHECK(vo == 1);
      e->push([] {}, {}, {x});
      CHECK(e->version(x) == 0);  // still collected
    }
    e->wait_all();
    CHECK(e->version(x) == 1);
    CHECK(e->set_bulk_size(1) == 0);  // 1: off, as 0
    CHECK(e->bulk_size() == 0);
  });
}

TEST_CASE("bulk: an engine destroyed while this thread collects runs what it collected") {
  for_each_config([](const Config& cfg) {
    int runs = 0;
    {
      auto e = make_engine(cfg);
      Var x = e->new_var("x");
      e->set_bulk_size(50);
      for (int i = 0; i < 10; ++i) e->push([&] { ++runs; }, {}, {x});
    }
    CHECK(runs == 10);
  });
}

TEST_CASE("bulk: a variable deleted by another thread before the flush is a named error") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    int runs = 0;
    e->set_bulk_size(8);
    e->push([&] { ++runs; }, {}, {y}, {.name = "first"});
    e->push([&] { ++runs; }, {y}, {x}, {.name = "second"});
    std::thread([&] { e->delete_var(x); }).join();
    const std::string message = error_of([&] { e->set_bulk_size(0); });
    CHECK(contains(message, "bulk of 2 ops ('first' .. 'second')"));
    CHECK(contains(message, "was deleted"));
    CHECK(e->bulk_size() == 0);  // the size changed all the same
    e->wait_all();
    CHECK(runs == 0);
    // At a BulkScope's end the failure waits for wait_all.
    Var z = e->new_var("z");
    {
      weft::BulkScope bulk(*e, 8);
      e->push([] {}, {}, {z}, {.name = "third"});
      e->push([] {}, {}, {z}, {.name = "fourth"});
      std::thread([&] { e->delete_var(z); }).join();
    }
    CHECK(contains(what_of([&] { e->wait_all(); }), "was deleted"));
  });
}

TEST_CASE("bulk: a bulk counts once against the in-flight bound") {
  for (const Config& base : threaded_configs()) {
    Config cfg = base;
    cfg.max_inflight = 4;
    INFO("engine config: " << cfg.str());
    auto e = make_engine(cfg);
    Var x = e->new_var("x");
    Blocker blocker;
    e->push(blocker.body(), {}, {x});
    REQUIRE(blocker.wait_entered());
    {
      weft::BulkScope bulk(*e, 16);
      // 2 bulks of 16 behind the blocker: 3 in flight, under the bound of 4,
      // so the frontend is not blocked.
      for (int i = 0; i < 32; ++i) e->push([] {}, {}, {x});
      CHECK(e->inflight() == 3);
    }
    blocker.open();
    e->wait_all();
    CHECK(e->version(x) == 33);
  }
}

TEST_CASE("bulk: each member has its own trace span, named, on the bulk's worker") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    e->profiler().start();
    {
      weft::BulkScope bulk(*e, 3);
      for (int i = 0; i < 9; ++i)
        e->push([] {}, {x}, {y}, {.name = i % 3 == 0 ? "head" : "member"});
    }
    e->wait_all();
    e->profiler().stop();
    const auto spans = e->profiler().spans();
    std::map<std::string, int> counts;
    std::set<std::uint64_t> ids;
    for (const auto& s : spans) {
      ++counts[std::string(s.name)];
      ids.insert(s.op_id);
    }
    CHECK(counts["head"] == 3);
    CHECK(counts["member"] == 6);
    CHECK(ids.size() == 9);  // the members' own ids
  });
}

TEST_CASE("bulk: a single collected op whose variable another thread deleted is refused, naming it") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x");
    int runs = 0;
    e->set_bulk_size(8);
    e->push([&] { ++runs; }, {}, {x}, {.name = "lonely"});
    std::thread([&] { e->delete_var(x); }).join();
    const std::string message = error_of([&] { e->wait_all(); });
    CHECK(contains(message, "op 'lonely'"));
    CHECK(contains(message, "was deleted"));
    e->set_bulk_size(0);
    e->wait_all();
    CHECK(runs == 0);
    // The slot was not written after its deletion: a new variable starts clean.
    Var fresh = e->new_var("fresh");
    CHECK(e->version(fresh) == 0);
  });
}

TEST_CASE("bulk: a member deleting a variable a later member uses never writes a freed slot") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var t = e->new_var("t"), x = e->new_var("x");
    int runs = 0;
    std::string message;
    {
      weft::BulkScope bulk(*e, 8);
      e->push([&](RunContext& ctx) {
        ++runs;
        ctx.engine->delete_var(t);  // from inside the op: after what was pushed before it
      }, {}, {x}, {.name = "deleter"});
      e->push([&] { ++runs; }, {}, {t}, {.name = "user"});
      message = error_of([&] { e->wait_all(); });
    }
    e->wait_all();
    if (cfg.threaded()) {
      // The bulk holds t: the deletion queues behind it, as it would behind
      // the second op pushed one by one.
      CHECK(message == "(no error)");
      CHECK(runs == 2);
    } else {
      // The naive engine runs the first op (and the deletion) before it
      // pushes the second, which fails as its push would have.
      CHECK(contains(message, "op 'user'"));
      CHECK(contains(message, "was deleted"));
      CHECK(runs == 1);
    }
    Var fresh = e->new_var("fresh");
    CHECK(e->version(fresh) == 0);
    CHECK(what_of([&] { e->wait_to_read(fresh); }) == "(no error)");
  });
}

TEST_CASE("bulk: delete_var deletes even when pushing what was collected fails, and a later push still goes") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y"), z = e->new_var("z");
    int z_runs = 0;
    e->set_bulk_size(8);
    e->push([] {}, {}, {x}, {.name = "on x"});
    std::thread([&] { e->delete_var(x); }).join();
    CHECK(contains(error_of([&] { e->delete_var(y); }), "was deleted"));  // the flush's failure
    CHECK(contains(error_of([&] { (void)e->version(y); }), "deleted"));   // y is gone all the same
    Var w = e->new_var("w");
    e->push([&] { ++z_runs; }, {}, {z});
    e->push([] {}, {}, {w}, {.name = "on w"});
    std::thread([&] { e->delete_var(w); }).join();  // gone before the flush
    // A push that cannot join flushes first; the flush fails, the push goes.
    CHECK(contains(error_of([&] { e->push_async([&](Completion done) { ++z_runs; done(); }, {}, {z}); }),
                   "was deleted"));
    e->set_bulk_size(0);
    e->wait_all();
    CHECK(z_runs == 1);  // the async op ran; the bulk (the op on z and "on w") was refused
  });
}

TEST_CASE("bulk: a thread that ends while it bulks pushes what it collected") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x");
    std::atomic<int> runs{0};
    std::thread([&] {
      e->set_bulk_size(16);  // never set back
      for (int i = 0; i < 5; ++i) e->push([&] { runs.fetch_add(1); }, {}, {x});
    }).join();
    e->wait_all();
    CHECK(runs.load() == 5);
    CHECK(e->version(x) == 5);
  });
}
