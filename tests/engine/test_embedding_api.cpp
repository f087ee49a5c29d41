// The embedding API: push and push_async with callables that take no
// RunContext, the default device, the owning SharedVar handle (released after
// pending work, from any thread, inside ops, during and after shutdown), and
// variable names reaching error messages, traces, the graph and the
// profiler's table. Every scenario over naive and threaded at 1, 2, 4, 8
// workers.
#include <algorithm>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine_test_util.h"

using namespace weft_test;
using weft::Engine;
using weft::SharedVar;

TEST_CASE("push and push_async accept callables without a RunContext" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var a = e->new_var("a"), b = e->new_var("b");
    int x = 0, y = 0;
    e->push([&] { x = 41; }, cpu0, {}, {a});
    e->push([&] { y = x + 1; }, cpu0, {a}, {b}, {.name = "y = x + 1"});
    e->wait_to_read(b);
    CHECK(y == 42);

    // An I/O callback: the op hands its Completion to another thread. The
    // thread is started under a lock, so that the frontend, woken by done(),
    // joins it only once the body has stored it.
    std::mutex io_mutex;
    std::thread io;
    int loaded = 0;
    e->push_async(
        [&](Completion done) {
          std::lock_guard lock(io_mutex);
          io = std::thread([&loaded, done = std::move(done)] {
            loaded = 7;
            done();
          });
        },
        cpu0, {}, {a}, {.name = "load"});
    e->push([&] { y = loaded * 2; }, cpu0, {a}, {b});
    e->wait_to_read(b);
    CHECK(y == 14);
    {
      std::lock_guard lock(io_mutex);
      io.join();
    }

    // A plain function pointer, a mutable lambda, a move-only capture.
    static int calls = 0;
    calls = 0;
    e->push(+[] { ++calls; }, cpu0, {}, {a});
    auto owned = std::make_unique<int>(5);
    e->push([p = std::move(owned), n = 0]() mutable { calls += *p + ++n; }, cpu0, {a}, {b});
    e->wait_all();
    CHECK(calls == 7);
  });
}

TEST_CASE("ops pushed without a device run on cpu(0)" * doctest::timeout(60)) {
  for_each_config(
      [](const Config& cfg) {
        auto e = make_engine(cfg);
        Var a = e->new_var("a");
        std::vector<Device> seen;
        std::mutex m;
        auto note = [&](RunContext& ctx) {
          std::lock_guard lock(m);
          seen.push_back(ctx.device);
        };
        e->push(note, {}, {a});
        e->push(note, {a}, {}, {.name = "reader"});
        e->push_async(
            [&](RunContext& ctx, Completion done) {
              note(ctx);
              done();
            },
            {}, {a});
        e->push([&] {}, a, {});  // a lone Var is a list of one
        e->push([] {}, {}, {}, {});  // reads, writes, options: no device
        e->push_async([](Completion done) { done(); }, {}, {}, {});
        e->wait_all();
        CHECK(seen == std::vector<Device>{cpu0, cpu0, cpu0});
      },
      /*cpu_devices=*/2);
}

TEST_CASE("null and empty callables are refused at push, naming the op" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var a = e->new_var("a");
    void (*null_fn)() = nullptr;
    std::function<void()> empty;
    std::function<void(Completion)> empty_async;
    CHECK(contains(thrown_message<weft::InvalidArgument>([&] { e->push(null_fn, {}, {a}, {.name = "op-null"}); }),
                   "op-null"));
    CHECK(contains(thrown_message<weft::InvalidArgument>([&] { e->push(empty, {}, {a}, {.name = "op-empty"}); }),
                   "op-empty"));
    CHECK(contains(
        thrown_message<weft::InvalidArgument>([&] { e->push_async(empty_async, {}, {a}, {.name = "async-empty"}); }),
        "async-empty"));
    e->wait_all();
  });
}

TEST_CASE("a SharedVar deletes its variable after the work pushed on it" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var out = e->new_var("out");
    Blocker blocker;
    int value = 0, seen = 0;
    Var raw;
    {
      SharedVar v(*e, "scratch");
      raw = v;
      CHECK(e->var_name(v) == "scratch");
      if (cfg.threaded()) e->push(blocker.body(), {}, {v}, {.name = "held writer"});
      e->push([&] { value = 3; }, {}, v);
      e->push([&] { seen = value; }, {v}, {out});
      SharedVar copy = v;
      CHECK(copy.use_count() == 2);
    }  // both handles gone: deletion is queued behind the three ops
    CHECK(contains(thrown_message<weft::InvalidArgument>([&] { (void)e->version(raw); }), "was deleted"));
    if (cfg.threaded()) {
      REQUIRE(blocker.wait_entered());
      blocker.open();
    }
    e->wait_to_read(out);
    CHECK(seen == 3);
    e->wait_all();  // no failure: the pending ops ran normally
  });
}

TEST_CASE("SharedVar copies dropped on many threads and inside ops delete once" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    std::vector<Var> raws;
    for (int round = 0; round < 20; ++round) {
      SharedVar v(*e, "shared " + std::to_string(round));
      raws.push_back(v);
      std::atomic<int> ran{0};
      for (int k = 0; k < 4; ++k)  // copies held by ops, dropped on workers
        e->push([keep = v, &ran] { ran.fetch_add(1); }, {v}, {});
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) threads.emplace_back([copy = v]() mutable { copy.reset(); });
      v.reset();
      for (auto& t : threads) t.join();
      e->wait_all();
      CHECK(ran.load() == 4);
    }
    for (const Var& raw : raws) CHECK_THROWS_AS((void)e->version(raw), weft::InvalidArgument);
  });
}

TEST_CASE("SharedVars may outlive their engine, or be released while it shuts down" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    SharedVar outlives;
    std::atomic<int> ran{0};
    {
      auto e = make_engine(cfg);
      outlives = SharedVar(*e, "outlives");
      SharedVar held_by_ops(*e, "held by ops");
      for (int k = 0; k < 16; ++k)  // still queued when the engine starts to end
        e->push(
            [keep = held_by_ops, &ran] {
              std::this_thread::sleep_for(std::chrono::microseconds(200));
              ran.fetch_add(1);
            },
            {}, {held_by_ops});
    }  // the destructor drains: the ops run and drop their copies
    CHECK(ran.load() == 16);
    CHECK(outlives.use_count() == 1);
    outlives.reset();  // the engine is gone: nothing to do
  });
}

// The last handle dropped with an op's closure: the deletion still comes
// after the follow-ups that op pushed (a follow-up writing the variable must
// not write a recycled slot that a new variable reuses).
TEST_CASE("a SharedVar dropped with an op's closure is deleted after the op's follow-ups" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var v;
    {
      SharedVar x(*e, "x");
      const Var raw = x;
      e->push(
          [keep = std::move(x), raw, &v](RunContext& ctx) {
            Engine* engine = ctx.engine;
            engine->push([engine, &v] { v = engine->new_var("v"); }, {}, {});
            engine->push([] { throw std::runtime_error("follow-up failed"); }, {}, {raw});
          },
          {}, {raw}, {.name = "holder"});
    }
    CHECK(contains(thrown_message<std::runtime_error>([&] { e->wait_all(); }), "follow-up failed"));
    REQUIRE_FALSE(v.is_null());
    CHECK(e->version(v) == 0);
    CHECK_NOTHROW(e->wait_to_read(v));
  });
}

TEST_CASE("SharedVar::adopt takes a live variable and refuses bad ones" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var raw = e->new_var("adopted");
    { SharedVar v = SharedVar::adopt(*e, raw); }
    CHECK_THROWS_AS((void)e->version(raw), weft::InvalidArgument);
    CHECK_THROWS_AS(SharedVar::adopt(*e, Var()), weft::InvalidArgument);
    CHECK(contains(thrown_message<weft::InvalidArgument>([&] { (void)SharedVar::adopt(*e, raw); }), "was deleted"));
    SharedVar empty;
    CHECK_FALSE(empty);
    CHECK(empty.var().is_null());
    CHECK_THROWS_AS(e->push([] {}, {}, empty), weft::InvalidArgument);  // the null Var
  });
}

TEST_CASE("variable names reach error messages" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var w = e->new_var();
    e->set_var_name(w, "conv1.weight");
    CHECK(e->var_name(w) == "conv1.weight");
    std::string message;
    e->push(
        [&](RunContext& ctx) {
          try {
            ctx.engine->wait_to_read(w);
          } catch (const weft::OpError& err) {
            message = err.what();
          }
        },
        {}, {}, {.name = "impatient"});
    e->wait_all();
    CHECK(contains(message, "conv1.weight"));
    CHECK(contains(message, "impatient"));
    e->set_var_name(w, "");
    CHECK(e->var_name(w).empty());
  });
}

TEST_CASE("variable names reach the trace, the graph and the profiler's table" * doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    e->profiler().start();
    Var x = e->new_var("x"), w = e->new_var();  // w is named after its first op
    e->push([] {}, {}, {w}, {.name = "init"});
    e->push([] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, {x, w}, {}, {.name = "use"});
    e->push([] {}, {}, {x}, {.name = "fill x"});
    e->set_var_name(w, "conv1.weight");
    e->wait_all();
    e->profiler().stop();

    std::ostringstream trace;
    e->profiler().write_trace(trace);
    const auto j = nlohmann::json::parse(trace.str());
    int checked = 0;
    for (const auto& ev : j["traceEvents"]) {
      if (ev.value("ph", "") != "X") continue;
      const std::string name = ev["name"];
      if (name == "use") {
        std::vector<std::string> reads = ev["args"]["reads"];
        std::sort(reads.begin(), reads.end());
        CHECK(reads == std::vector<std::string>{"conv1.weight", "x"});
        CHECK(ev["args"]["writes"] == nlohmann::json::array());
        ++checked;
      } else if (name == "init") {
        CHECK(ev["args"]["writes"] == nlohmann::json::array({"conv1.weight"}));  // renamed after the push
        ++checked;
      }
    }
    CHECK(checked == 2);

    std::ostringstream dot;
    e->profiler().write_dot(dot);
    CHECK(contains(dot.str(), "conv1.weight"));

    const std::vector<weft::VarStats> vars = e->profiler().aggregate_by_variable();
    REQUIRE(vars.size() == 2);
    auto find = [&](const std::string& n) {
      return std::find_if(vars.begin(), vars.end(), [&](const weft::VarStats& v) { return v.name == n; });
    };
    REQUIRE(find("conv1.weight") != vars.end());
    CHECK(find("conv1.weight")->writes == 1);
    CHECK(find("conv1.weight")->ops == std::vector<std::string>{"init"});
    REQUIRE(find("x") != vars.end());
    CHECK(find("x")->ops == std::vector<std::string>{"fill x"});
    CHECK(contains(e->profiler().summary_table(), "conv1.weight"));
  });
}
