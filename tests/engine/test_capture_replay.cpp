// Capture and replay (weft/op_graph.h): a replayed graph has the effect of
// pushing its ops again in capture order — checked against the serial oracle
// with the random differential workload — on the naive engine and the
// threaded one at 1, 2, 4, 8 workers; errors, waits and pushes between
// replays, deleted variables, concurrent replays and misuse.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
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

std::vector<Config> replay_configs() {
  std::vector<Config> out = all_configs();
  for (int w : worker_counts()) out.push_back(Config{"threaded", w, 3, 0});
  return out;
}

}  // namespace

TEST_CASE("replay: a random workload captured once and replayed equals pushing it again, serially checked" *
          doctest::timeout(300)) {
  const int ops_per_graph = kSanitized ? 2'000 : 10'000;
  constexpr int kReplays = 4;
  for (std::uint64_t seed : {11u, 12u}) {
    CAPTURE(seed);
    const std::vector<OpSpec> ops = make_ops(seed, ops_per_graph, 0, range(0, kVars), range(0, kVars));
    // Between replays a few ordinary ops touch the same variables.
    const std::vector<OpSpec> between =
        make_ops(seed + 100, 50, static_cast<std::uint32_t>(ops_per_graph), range(0, kVars), range(0, kVars));
    std::vector<std::uint64_t> expected = initial_values(seed);
    std::vector<std::uint64_t> expected_writes(kVars, 0);
    for (int r = 0; r < kReplays; ++r) {
      run_serial(ops, expected, expected_writes);
      run_serial(between, expected, expected_writes);
    }
    for (const Config& cfg : replay_configs()) {
      INFO("engine config: " << cfg.str());
      std::vector<std::uint64_t> values = initial_values(seed);
      std::vector<std::uint64_t> versions(kVars, 0);
      {
        auto e = make_engine(cfg);
        const std::vector<Var> vars = new_vars(*e);
        e->begin_capture();
        CHECK(e->capturing());
        push_ops(*e, cfg, ops, vars, values.data());
        weft::OpGraph graph = e->end_capture();
        CHECK_FALSE(e->capturing());
        CHECK(graph.ops() == ops.size());
        CHECK(graph.vars() <= static_cast<std::size_t>(kVars));
        // Nothing ran while capturing.
        CHECK(values == initial_values(seed));
        for (int i = 0; i < kVars; ++i) CHECK(e->version(vars[static_cast<std::size_t>(i)]) == 0);
        for (int r = 0; r < kReplays; ++r) {
          e->replay(graph);
          push_ops(*e, cfg, between, vars, values.data());
          if (r == 1) e->wait_to_read(vars[3]);  // a wait between replays
        }
        e->wait_all();
        CHECK(e->inflight() == 0);
        versions = versions_of(*e, vars);
      }
      check_against_oracle(values, expected, versions, expected_writes);
    }
  }
}

TEST_CASE("replay: the graph's dependencies are resolved once, each pair once") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var a = e->new_var("a"), b = e->new_var("b"), c = e->new_var("c"), d = e->new_var("d");
    std::vector<int> order;  // written by ops the graph orders
    std::atomic<int> b_or_c{0};
    e->begin_capture();
    e->push([&] { order.push_back(0); }, {}, {a});
    e->push([&] { b_or_c.fetch_add(1); }, {a}, {b});
    e->push([&] { b_or_c.fetch_add(1); }, {a, a}, {c});
    e->push([&] { order.push_back(b_or_c.load()); }, {b, c, a}, {d, a});
    weft::OpGraph graph = e->end_capture();
    // 0->1, 0->2 (a), 1->3 (b, and a: 3 writes what 1 read), 2->3, 0->3 (3 writes a after 0 did).
    CHECK(graph.ops() == 4);
    CHECK(graph.dependencies() == 5);
    CHECK(graph.vars() == 4);
    for (int r = 0; r < 3; ++r) {
      b_or_c.store(0);
      order.clear();
      e->replay(graph);
      e->wait_to_read(d);
      CHECK(order == std::vector<int>{0, 2});
    }
    CHECK(e->version(a) == 6);
    CHECK(e->version(b) == 3);
    CHECK(e->version(d) == 3);
  });
}

TEST_CASE("replay: ops pushed before a replay finish first, ops pushed after wait for all of it") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    std::int64_t vx = 0, vy = 0;
    e->begin_capture();
    e->push([&] { vy = vx * 10; }, {x}, {y});
    e->push([&] { vy += 1; }, {}, {y});
    weft::OpGraph graph = e->end_capture();
    std::vector<std::int64_t> seen;
    for (int r = 1; r <= 5; ++r) {
      e->push([&, r] { vx = r; }, {}, {x});  // new data in the same variable
      e->replay(graph);
      e->push([&] { seen.push_back(vy); }, {y}, {});
    }
    e->wait_all();
    CHECK(seen == std::vector<std::int64_t>{11, 21, 31, 41, 51});
  });
}

TEST_CASE("replay: an op failing in one replay fails what reads it there, and is reported once") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y"), z = e->new_var("z");
    int replay = 0, y_runs = 0, z_runs = 0;
    e->begin_capture();
    e->push([&] {
      if (++replay == 2) throw std::runtime_error("bad batch");
    }, {}, {x}, {.name = "load"});
    e->push([&] { ++y_runs; }, {x}, {y}, {.name = "use"});
    e->push([&] { ++z_runs; }, {}, {z}, {.name = "independent"});
    weft::OpGraph graph = e->end_capture();
    e->replay(graph);
    e->wait_to_read(y);
    CHECK(y_runs == 1);
    e->replay(graph);
    CHECK(contains(thrown_message<std::runtime_error>([&] { e->wait_to_read(y); }), "bad batch"));
    CHECK(y_runs == 1);  // skipped: it read the failed x
    CHECK(error_of([&] { e->wait_to_read(x); }) == "(no error)");  // reported once
    e->replay(graph);  // the failure was reported: later replays run clean
    e->wait_to_read(y);
    e->wait_all();
    CHECK(y_runs == 2);
    CHECK(z_runs == 3);
    CHECK(e->version(y) == 3);  // a skipped op still counts as a write
  });
}

TEST_CASE("replay: async ops in a graph, completed from other threads") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    std::atomic<int> vx{0}, vy{0};
    e->begin_capture();
    e->push_async([&](weft::Completion done) {
      std::thread([&, done]() mutable {
        vx.fetch_add(1);
        done();
      }).detach();
    }, {}, {x});
    e->push([&] { vy.store(vx.load() * 2); }, {x}, {y});
    weft::OpGraph graph = e->end_capture();
    for (int r = 0; r < 20; ++r) e->replay(graph);
    e->wait_to_read(y);
    CHECK(vy.load() == 40);
    e->wait_all();
  });
}

TEST_CASE("replay: one graph replayed from two threads at once runs one replay at a time") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x");
    long plain = 0;  // not atomic: replays overlapping would race on it (TSan)
    e->begin_capture();
    // It only reads: the graph's own variable serializes the replays.
    e->push([&] { plain += 1; }, {x}, {});
    weft::OpGraph graph = e->end_capture();
    const int n = kSanitized ? 200 : 1000;
    std::thread other([&] {
      for (int i = 0; i < n; ++i) e->replay(graph);
    });
    for (int i = 0; i < n; ++i) e->replay(graph);
    other.join();
    e->wait_all();
    CHECK(plain == 2L * n);
  });
}

TEST_CASE("replay: the graph may be dropped while replays are pending, its captures live until they end") {
  for_each_threaded([](const Config& cfg) {
    auto e = make_engine(cfg);
    LiveCounter live;
    Var x = e->new_var("x");
    int runs = 0;
    Blocker blocker;
    e->push([&] { blocker.pass(); }, {}, {x});
    {
      e->begin_capture();
      e->push([&, token = LiveToken(live)] { ++runs; }, {}, {x});
      weft::OpGraph graph = e->end_capture();
      e->replay(graph);
      e->replay(graph);
    }
    CHECK(live.live.load() == 1);  // the replays hold the body
    blocker.open();
    e->wait_all();
    CHECK(runs == 2);
    CHECK(eventually([&] { return live.live.load() == 0; }));
  });
}

TEST_CASE("replay: ops another thread pushes while one captures run as usual") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    int vx = 0, vy = 0;
    e->begin_capture();
    e->push([&] { vx += 1; }, {}, {x});
    std::thread([&] {
      CHECK_FALSE(e->capturing());
      e->push([&] { vy = 7; }, {}, {y});
      e->wait_to_read(y);
    }).join();
    CHECK(vy == 7);
    weft::OpGraph graph = e->end_capture();
    CHECK(graph.ops() == 1);
    CHECK(vx == 0);
    e->replay(graph);
    e->wait_to_read(x);
    CHECK(vx == 1);
  });
}

TEST_CASE("replay: misuse is a named error") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    auto other = make_engine(cfg);
    Var x = e->new_var("x"), y = e->new_var("y");
    CHECK(contains(error_of([&] { (void)e->end_capture(); }), "end_capture without begin_capture"));
    CHECK(contains(error_of([&] { e->replay(weft::OpGraph()); }), "invalid OpGraph"));

    e->begin_capture();
    e->push([] {}, {}, {x}, {.name = "step"});
    CHECK(contains(error_of([&] { e->wait_to_read(x); }), "wait_to_read(var #"));
    CHECK(contains(error_of([&] { e->wait_to_read(x); }), "have not run"));
    CHECK(contains(error_of([&] { e->wait_all(); }), "wait_all() while this thread captures"));
    CHECK(contains(error_of([&] { e->begin_capture(); }), "already capturing"));
    Var ox = other->new_var("ox");
    CHECK(contains(error_of([&] { other->push([] {}, {}, {ox}, {.name = "elsewhere"}); }),
                   "op 'elsewhere'): this thread is capturing ops for another engine"));
    CHECK(contains(error_of([&] { other->begin_capture(); }), "for another engine"));
    weft::OpGraph graph = e->end_capture();
    CHECK(graph.ops() == 1);

    e->begin_capture();
    CHECK(contains(error_of([&] { e->replay(graph); }), "replay while this thread captures"));
    (void)e->end_capture();
    CHECK(contains(error_of([&] { other->replay(graph); }), "captured on another engine"));

    // Capturing from inside an op is refused (the op reports it).
    e->push([&] { e->begin_capture(); }, {}, {y}, {.name = "inner"});
    CHECK(contains(error_of([&] { e->wait_to_read(y); }), "begin_capture called from inside op 'inner'"));

    // A variable the graph uses, deleted after the capture.
    e->delete_var(x);
    const std::string deleted = error_of([&] { e->replay(graph); });
    CHECK(contains(deleted, "used by captured op 'step'"));
    CHECK(contains(deleted, "was deleted after the capture"));
    e->wait_all();
    other->wait_all();
  });
}

TEST_CASE("replay: an empty capture replays as nothing") {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    e->begin_capture();
    weft::OpGraph graph = e->end_capture();
    CHECK(graph.valid());
    CHECK(graph.ops() == 0);
    e->replay(graph);
    e->wait_all();
    CHECK(e->inflight() == 0);
  });
}

TEST_CASE("replay: a wide graph (roots claimed in batches, successors run where they became ready) with failures") {
  // 512 leaves (a quarter of them async), 256 pair sums above them, one
  // total: the roots go to the workers in batches, the sums mostly run on
  // the worker that finished their second leaf. Leaf 77 fails in the second
  // replay: its pair sum and the total are skipped and carry its error.
  constexpr int kLeaves = 512;
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    std::vector<Var> leaf, pair;
    for (int i = 0; i < kLeaves; ++i) leaf.push_back(e->new_var());
    for (int i = 0; i < kLeaves / 2; ++i) pair.push_back(e->new_var());
    Var total = e->new_var("total");
    std::vector<long> lv(kLeaves), pv(kLeaves / 2);
    long tv = 0;
    int replay = 0;  // set between replays, when no op runs
    e->begin_capture();
    for (int i = 0; i < kLeaves; ++i) {
      if (i % 4 == 3) {
        e->push_async([&, i](Completion done) {
          lv[static_cast<std::size_t>(i)] = i + 1000L * replay;
          done();
        }, {}, {leaf[static_cast<std::size_t>(i)]});
      } else {
        e->push([&, i] {
          if (i == 77 && replay == 2) throw std::runtime_error("leaf 77 failed");
          lv[static_cast<std::size_t>(i)] = i + 1000L * replay;
        }, {}, {leaf[static_cast<std::size_t>(i)]});
      }
    }
    for (int i = 0; i < kLeaves / 2; ++i)
      e->push([&, i] { pv[static_cast<std::size_t>(i)] = lv[2 * static_cast<std::size_t>(i)] + lv[2 * static_cast<std::size_t>(i) + 1]; },
              {leaf[2 * static_cast<std::size_t>(i)], leaf[2 * static_cast<std::size_t>(i) + 1]}, {pair[static_cast<std::size_t>(i)]});
    e->push([&] {
      tv = 0;
      for (long p : pv) tv += p;
    }, pair, {total});
    weft::OpGraph graph = e->end_capture();
    CHECK(graph.ops() == kLeaves + kLeaves / 2 + 1);
    auto expected_total = [&](long r) {
      long sum = 0;
      for (int i = 0; i < kLeaves; ++i) sum += i + 1000L * r;
      return sum;
    };
    replay = 1;
    e->replay(graph);
    e->wait_to_read(total);
    CHECK(tv == expected_total(1));
    replay = 2;
    e->replay(graph);
    CHECK(contains(thrown_message<std::runtime_error>([&] { e->wait_to_read(total); }), "leaf 77 failed"));
    CHECK(tv == expected_total(1));  // the total's op was skipped
    CHECK(pv[38] == 76 + 77 + 2 * 1000);  // ... and so was leaf 77's pair sum: the first replay's value
    CHECK(lv[76] == 76 + 2 * 1000);       // while its sibling ran
    replay = 3;
    e->replay(graph);
    e->wait_all();
    CHECK(tv == expected_total(3));
    CHECK(e->version(pair[0]) == 3);
    CHECK(e->version(total) == 3);
  });
}

TEST_CASE("replay: a failure reported after replay() but before the replay starts still reaches its ops") {
  // As for pushed ops: the nodes take their place in push order at replay(),
  // so a failure reported by a later wait reaches them, whenever they run.
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var x = e->new_var("x"), z = e->new_var("z"), y = e->new_var("y"), w = e->new_var("w");
    std::atomic<int> ran{0};
    e->begin_capture();
    e->push([&] { ran.fetch_add(1); }, {x, w}, {y}, {.name = "N"});
    weft::OpGraph graph = e->end_capture();
    Blocker blocker;
    e->push([] { throw std::runtime_error("A failed"); }, {}, {x, z}, {.name = "A"});
    if (cfg.threaded()) e->push([&] { blocker.pass(); }, {}, {w}, {.name = "B"});  // holds the replay back
    e->replay(graph);
    CHECK(contains(thrown_message<std::runtime_error>([&] { e->wait_to_read(z); }), "A failed"));
    blocker.open();
    e->wait_all();
    CHECK(ran.load() == 0);
  });
}

TEST_CASE("replay: replays count against the in-flight bound, and keep at most a few holders") {
  for_each_threaded([](const Config& cfg) {
    weft::EngineConfig c = cfg.engine_config();
    c.max_inflight = 8;
    auto e = weft::Engine::create(c);
    std::vector<Var> vars;
    for (int i = 0; i < 100; ++i) vars.push_back(e->new_var());
    Blocker blocker;
    e->push([&] { blocker.pass(); }, {}, {vars[0]}, {.name = "blocker"});
    e->begin_capture();
    e->push([] {}, {}, vars, {.name = "writes 100"});
    weft::OpGraph graph = e->end_capture();
    std::atomic<bool> pushed{false};
    std::thread frontend([&] {
      for (int i = 0; i < 40; ++i) e->replay(graph);
      pushed.store(true);
    });
    // The frontend blocks at the bound while the blocker holds the replays back.
    CHECK(holds_for([&] { return !pushed.load() && e->inflight() <= 8; }, 200ms));
    blocker.open();
    frontend.join();
    e->wait_all();
    CHECK(e->version(vars[99]) == 40);
  });
}

TEST_CASE("replay: a follow-up of a replayed async op that uses the replay's variables is refused, not a hang") {
  for_each_threaded([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var a = e->new_var("a"), c = e->new_var("c"), d = e->new_var("d");
    std::string refused;
    e->begin_capture();
    e->push_async([&](RunContext& ctx, Completion done) {
      try {
        // Completing the op from a follow-up on c: c is held by this replay.
        ctx.engine->push([done]() mutable { done(); }, {c}, {d}, {.name = "completer"});
      } catch (const weft::InvalidArgument& err) {
        refused = err.what();
        done();
      }
    }, {}, {a}, {.name = "hold"});
    e->push([] {}, {}, {c}, {.name = "writer of c"});
    weft::OpGraph graph = e->end_capture();
    e->replay(graph);
    e->wait_all();
    CHECK(contains(refused, "push (op 'completer') from inside the replayed async op 'hold'"));
    CHECK(contains(refused, "which the replay holds"));
    // Pushed, not replayed, the same pattern works.
    e->push_async([&](RunContext& ctx, Completion done) {
      ctx.engine->push([done]() mutable { done(); }, {c}, {d}, {.name = "completer"});
    }, {}, {a}, {.name = "hold"});
    e->push([] {}, {}, {c}, {.name = "writer of c"});
    e->wait_all();
  });
}
