// What the trace adds over plain spans (docs/trace-format.md): flow arrows
// that connect each op to the op whose completion made it ready, copy sizes,
// counters for ops in flight and allocator memory, the per-resource summary
// (which must agree with the spans), and the dependency graph as DOT.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "engine_test_util.h"
#include "profiler_recorder.h"  // engine/src: internal

using namespace weft_test;
using weft::OpProperty;
using weft::Profiler;
using weft::detail::ProfilerRecorder;
using weft::detail::SpanInfo;
using Json = nlohmann::json;

namespace {

Json trace_of(const Profiler& p) {
  std::ostringstream os;
  p.write_trace(os);
  return Json::parse(os.str());
}

struct XSpan {
  std::int64_t pid, tid;
  double ts, dur;
  std::uint64_t op_id;
};

std::vector<XSpan> x_spans(const Json& doc) {
  std::vector<XSpan> out;
  for (const Json& e : doc.at("traceEvents"))
    if (e.at("ph") == "X")
      out.push_back({e.at("pid"), e.at("tid"), e.at("ts"), e.at("dur"), e.at("args").at("op_id")});
  return out;
}

}  // namespace

TEST_CASE("trace flows: a chain's arrows go from each op to the next, between real spans" * doctest::timeout(120)) {
  for_each_threaded(
      [](const Config& cfg) {
        auto e = make_engine(cfg);
        Var v = e->new_var("chain");
        e->profiler().start();
        constexpr int kOps = 200;
        for (int i = 0; i < kOps; ++i)
          e->push([](RunContext&) {}, Device::cpu(i % 2), {}, {v}, {.name = "link"});
        e->wait_all();
        e->profiler().stop();

        // Every op but the first was unblocked by the one pushed just before.
        std::map<std::uint64_t, weft::Span> by_id;
        for (const weft::Span& s : e->profiler().spans()) by_id.emplace(s.op_id, s);
        REQUIRE(by_id.size() == kOps);
        std::size_t unblocked = 0;
        for (const auto& [id, s] : by_id) {
          if (s.unblocked_by == 0) continue;
          ++unblocked;
          CHECK(s.unblocked_by == id - 1);
          CHECK(by_id.at(s.unblocked_by).end_ns <= s.start_ns);
          CHECK(s.push_ns >= 0);
          CHECK(s.push_ns <= s.start_ns);
        }
        // Only ops still queued when their predecessor finished have arrows;
        // the frontend outruns 200 empty ops by far, so nearly all are.
        CHECK(unblocked >= kOps / 2);

        // In the file: each arrow's start lies inside the unblocking op's
        // span on that op's track, its end at the unblocked op's start.
        const Json doc = trace_of(e->profiler());
        std::map<std::uint64_t, XSpan> spans;
        for (const XSpan& x : x_spans(doc)) spans.emplace(x.op_id, x);
        std::map<std::uint64_t, Json> starts, ends;
        for (const Json& f : doc.at("traceEvents")) {
          if (f.at("ph") == "s") CHECK(starts.emplace(f.at("id").get<std::uint64_t>(), f).second);
          if (f.at("ph") == "f") CHECK(ends.emplace(f.at("id").get<std::uint64_t>(), f).second);
        }
        CHECK(starts.size() == unblocked);
        CHECK(ends.size() == unblocked);
        for (const auto& [id, f] : ends) {
          REQUIRE(spans.count(id) == 1);
          const XSpan& to = spans.at(id);
          CHECK(f.at("pid") == to.pid);
          CHECK(f.at("tid") == to.tid);
          CHECK(f.at("ts").get<double>() == doctest::Approx(to.ts).epsilon(1e-12));
          REQUIRE(starts.count(id) == 1);
          const Json& s = starts.at(id);
          REQUIRE(spans.count(id - 1) == 1);
          const XSpan& from = spans.at(id - 1);
          CHECK(s.at("pid") == from.pid);
          CHECK(s.at("tid") == from.tid);
          CHECK(s.at("ts").get<double>() >= from.ts);
          CHECK(s.at("ts").get<double>() <= from.ts + from.dur + 1e-9);
        }
      },
      1, /*cpu_devices=*/2);
}

TEST_CASE("trace flows: an op waiting on two producers is unblocked by the later one" * doctest::timeout(60)) {
  for_each_threaded([](const Config& cfg) {
    auto e = make_engine(cfg);
    Var a = e->new_var("a"), b = e->new_var("b"), out = e->new_var("out");
    Var blocker = e->new_var("blocker");
    e->profiler().start();
    // Both producers wait for the blocker; the consumer needs both.
    std::atomic<bool> open{false};
    e->push_async([&](RunContext&, weft::Completion done) {
      std::thread([&open, done = std::move(done)]() mutable {
        while (!open.load()) std::this_thread::yield();
        done();
      }).detach();
    }, Device::cpu(0), {}, {blocker}, {.name = "blocker"});
    e->push([](RunContext&) {}, Device::cpu(0), {blocker}, {a}, {.name = "make a"});
    e->push([](RunContext&) {}, Device::cpu(0), {a}, {b}, {.name = "make b"});
    e->push([](RunContext&) {}, Device::cpu(0), {a, b}, {out}, {.name = "use"});
    open.store(true);
    e->wait_all();
    e->profiler().stop();
    std::map<std::string, weft::Span> by_name;
    for (const weft::Span& s : e->profiler().spans()) by_name.emplace(std::string(s.name), s);
    REQUIRE(by_name.size() == 4);
    CHECK(by_name.at("use").unblocked_by == by_name.at("make b").op_id);
    CHECK(by_name.at("make b").unblocked_by == by_name.at("make a").op_id);
    CHECK(by_name.at("make a").unblocked_by == by_name.at("blocker").op_id);
  });
}

TEST_CASE("trace flows: a producer that finishes while its consumer's push is linking still names it" *
          doctest::timeout(120)) {
  // The consumer's push links its accesses, unlocks, then drops its own hold
  // on `pending`; a producer finishing in between grants the access without
  // making the op ready, and the push dispatches it. The id must be there all
  // the same (the sanitizer builds assert it in submit). The consumer is
  // pushed once the producer runs, and the producer's spin is steered so that
  // it ends around the moment the push returns, where that window lies; 255
  // more variables to unlock after `v` widen it (with 31 the assert, without
  // the fix, tripped in one run of three; with 255 in five of five).
  for_each_threaded(
      [](const Config& cfg) {
        auto e = make_engine(cfg);
        Var v = e->new_var("v");
        std::vector<Var> reads{v};
        for (int i = 0; i < 255; ++i) reads.push_back(e->new_var());
        e->profiler().start();
        constexpr int kRounds = 2000;
        std::atomic<bool> running{false};
        std::atomic<std::int64_t> produced_at{0};
        int spin = 64;
        for (int r = 0; r < kRounds; ++r) {
          running.store(false);
          e->push(
              [&running, &produced_at, spin](RunContext&) {
                running.store(true);
                (void)spin_work(spin);
                produced_at.store(Profiler::now_ns());
              },
              Device::cpu(0), {}, {v}, {.name = "produce"});
          REQUIRE(eventually([&] { return running.load(); }));
          e->push([](RunContext&) {}, Device::cpu(1), reads, {}, {.name = "consume"});
          const std::int64_t pushed_at = Profiler::now_ns();
          e->wait_all();
          spin = produced_at.load() < pushed_at ? std::min(spin + spin / 16 + 1, 1 << 16)
                                                : std::max(spin - spin / 16 - 1, 0);
        }
        e->profiler().stop();
        std::map<std::uint64_t, weft::Span> by_id;
        for (const weft::Span& s : e->profiler().spans()) by_id.emplace(s.op_id, s);
        REQUIRE(by_id.size() == 2 * kRounds);
        std::size_t arrows = 0;
        for (const auto& [id, s] : by_id) {
          if (s.name != "consume" || s.unblocked_by == 0) continue;
          ++arrows;
          REQUIRE(by_id.count(s.unblocked_by) == 1);
          CHECK(by_id.at(s.unblocked_by).name == "produce");
          CHECK(by_id.at(s.unblocked_by).end_ns <= s.start_ns);
        }
        std::size_t flows = 0;
        const Json doc = trace_of(e->profiler());
        for (const Json& f : doc.at("traceEvents")) flows += f.at("ph") == "f";
        CHECK(flows == arrows);
      },
      1, /*cpu_devices=*/2);
}

TEST_CASE("trace counters: ops in flight rise and fall back to zero, memory follows the allocator" *
          doctest::timeout(60)) {
  for_each_config([](const Config& cfg) {
    auto e = make_engine(cfg);
    std::vector<Var> vars;
    for (int i = 0; i < 16; ++i) vars.push_back(e->new_var());
    e->profiler().start();
    for (int r = 0; r < 8; ++r)
      for (int i = 0; i < 16; ++i) e->push([](RunContext&) {}, Device::cpu(0), {vars[(i + 1) % 16]}, {vars[i]});
    weft::Allocator& alloc = e->allocator(Device::cpu(0));
    const weft::MemoryStats before = alloc.stats();
    weft::Block block = alloc.allocate(1 << 20);
    alloc.free(block);
    e->wait_all();
    e->profiler().stop();

    const Json doc = trace_of(e->profiler());
    std::vector<std::int64_t> in_flight;
    std::vector<std::int64_t> memory;
    double last_ts = -1;
    for (const Json& c : doc.at("traceEvents")) {
      if (c.at("ph") != "C") continue;
      if (c.at("name") == "ops in flight") {
        CHECK(c.at("ts").get<double>() >= last_ts);  // one sample per change, in time order
        last_ts = c.at("ts");
        in_flight.push_back(c.at("args").at("ops"));
      } else if (c.at("name") == "memory in use") {
        memory.push_back(c.at("args").at("bytes"));
      }
    }
    REQUIRE(!in_flight.empty());
    CHECK(*std::min_element(in_flight.begin(), in_flight.end()) >= 0);
    CHECK(*std::max_element(in_flight.begin(), in_flight.end()) >= 1);
    CHECK(*std::max_element(in_flight.begin(), in_flight.end()) <= 8 * 16);
    CHECK(in_flight.back() == 0);
    REQUIRE(memory.size() == 2);  // the allocation, then the free
    CHECK(memory[0] >= static_cast<std::int64_t>(before.in_use + (1 << 20)));
    CHECK(memory[1] == static_cast<std::int64_t>(before.in_use));
  });
}

TEST_CASE("trace copies: bytes and bandwidth on copy spans, category copy" * doctest::timeout(60)) {
  for_each_config(
      [](const Config& cfg) {
        auto e = make_engine(cfg);
        Var src = e->new_var("src"), dst = e->new_var("dst");
        e->profiler().start();
        e->push([](RunContext&) {}, Device::cpu(0), {}, {src}, {.name = "fill"});
        e->push([](RunContext&) {}, Device::cpu(1), {src}, {dst},
                {.name = "copy", .property = OpProperty::copy_peer, .bytes = 4096});
        e->wait_all();
        e->profiler().stop();
        std::size_t copies = 0;
        const Json doc = trace_of(e->profiler());
        for (const Json& x : doc.at("traceEvents")) {
          if (x.at("ph") != "X") continue;
          if (x.at("name") == "copy") {
            ++copies;
            CHECK(x.at("cat") == "copy");
            CHECK(x.at("args").at("property") == "copy_peer");
            CHECK(x.at("args").at("bytes") == 4096);
            const double dur_us = x.at("dur");
            if (dur_us > 0)
              CHECK(x.at("args").at("GB_per_s").get<double>() == doctest::Approx(4096 / (dur_us * 1e3)).epsilon(0.01));
          } else {
            CHECK(x.at("cat") == "compute");
            CHECK_FALSE(x.at("args").contains("bytes"));
          }
        }
        CHECK(copies == 1);
      },
      2);
}

TEST_CASE("profile summary: busy time, utilization and overlaps from known spans" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  auto* w0 = rec.track(Device::cpu(0), 0, "worker 0");
  auto* w1 = rec.track(Device::cpu(0), 1, "worker 1");
  auto* c0 = rec.track(Device::cpu(1), 0, "worker 0");
  auto* launch = rec.track(Device::gpu(0), 1000, "compute stream 0 (launch)", weft::TrackKind::launch,
                           "gpu(0) compute stream 0 launch");
  const auto n = rec.intern("op");
  constexpr std::int64_t ms = 1'000'000;
  // cpu(0): compute 0-10 ms on worker 0, 5-15 ms on worker 1. cpu(1): a copy
  // 12-20 ms of 8 MB. A launch span 0-20 ms that counts for nothing.
  rec.record(w0, SpanInfo{n, 1, 0, 10 * ms});
  rec.record(w1, SpanInfo{n, 2, 5 * ms, 15 * ms});
  rec.record(c0, SpanInfo{n, 3, 12 * ms, 20 * ms, -1, 0, 8'000'000, OpProperty::copy_peer});
  rec.record(launch, SpanInfo{n, 4, 0, 20 * ms});
  const weft::ProfileSummary s = p.summarize();
  CHECK(s.window_ms == doctest::Approx(20));
  REQUIRE(s.resources.size() == 3);
  CHECK(s.resources[0].resource == "cpu(0) workers");
  CHECK(s.resources[0].tracks == 2);
  CHECK(s.resources[0].ops == 2);
  CHECK(s.resources[0].busy_ms == doctest::Approx(20));
  CHECK(s.resources[0].utilization == doctest::Approx(0.5));  // 20 ms of 2 x 20 ms
  CHECK(s.resources[1].resource == "cpu(1) workers");
  CHECK(s.resources[1].bytes == 8'000'000);
  CHECK(s.resources[1].utilization == doctest::Approx(0.4));
  CHECK(s.resources[2].kind == weft::TrackKind::launch);
  CHECK(s.resources[2].busy_ms == doctest::Approx(20));
  // compute covers 0-15, copy 12-20: both 3 ms, efficiency 3 / min(15, 8).
  CHECK(s.compute_copy.a_ms == doctest::Approx(15));
  CHECK(s.compute_copy.b_ms == doctest::Approx(8));
  CHECK(s.compute_copy.both_ms == doctest::Approx(3));
  CHECK(s.compute_copy.efficiency == doctest::Approx(3.0 / 8));
  // devices: cpu(0) 0-15, cpu(1) 12-20 (the gpu's launch track does not count).
  REQUIRE(s.devices.size() == 1);
  CHECK(s.devices[0].a == "cpu(0)");
  CHECK(s.devices[0].b == "cpu(1)");
  CHECK(s.devices[0].both_ms == doctest::Approx(3));
  const Json j = Json::parse(s.json());
  CHECK(j.at("compute_copy").at("efficiency").get<double>() == doctest::Approx(0.375));
  CHECK(j.at("resources").size() == 3);
  CHECK(s.table().find("cpu(0) workers") != std::string::npos);

  Profiler empty;
  const weft::ProfileSummary none = empty.summarize();
  CHECK(none.window_ms == 0);
  CHECK(none.compute_copy.efficiency == 0);
  CHECK(none.devices.empty());
}

TEST_CASE("profile summary: agrees with the engine's spans" * doctest::timeout(60)) {
  for_each_threaded(
      [](const Config& cfg) {
        auto e = make_engine(cfg);
        std::vector<Var> vars;
        for (int i = 0; i < 6; ++i) vars.push_back(e->new_var());
        e->profiler().start();
        for (int r = 0; r < 30; ++r)
          for (int i = 0; i < 6; ++i)
            e->push([](RunContext&) { (void)spin_work(2000); }, Device::cpu(i % 2), {vars[(i + 5) % 6]}, {vars[i]},
                    {.name = "w", .property = i == 3 ? OpProperty::copy_peer : OpProperty::normal});
        e->wait_all();
        e->profiler().stop();
        const auto spans = e->profiler().spans();
        const weft::ProfileSummary s = e->profiler().summarize();
        std::int64_t first = spans.front().start_ns, last = 0;
        std::map<std::string, std::int64_t> busy;
        for (const weft::Span& sp : spans) {
          first = std::min(first, sp.start_ns);
          last = std::max(last, sp.end_ns);
          busy[std::string(sp.resource)] += sp.end_ns - sp.start_ns;
        }
        CHECK(s.window_ms == doctest::Approx((last - first) / 1e6));
        REQUIRE(s.resources.size() == 2);
        for (const weft::ResourceUsage& r : s.resources) {
          CHECK(r.busy_ms == doctest::Approx(busy.at(r.resource) / 1e6));
          CHECK(r.tracks == cfg.workers);
          CHECK(r.utilization <= 1.0 + 1e-9);
        }
        CHECK(s.compute_copy.b_ms > 0);
        CHECK(s.compute_copy.both_ms <= std::min(s.compute_copy.a_ms, s.compute_copy.b_ms) + 1e-9);
        REQUIRE(s.devices.size() == 1);
        CHECK(s.devices[0].both_ms <= std::min(s.devices[0].a_ms, s.devices[0].b_ms) + 1e-9);
      },
      1, 2);
}

TEST_CASE("dependency graph: DOT nodes per op, edges for read-after-write and write-after-read" *
          doctest::timeout(30)) {
  for_each_config(
      [](const Config& cfg) {
        auto e = make_engine(cfg);
        Var x = e->new_var("x"), y = e->new_var("y");
        e->profiler().start();
        e->push([](RunContext&) {}, Device::cpu(0), {}, {x}, {.name = "produce"});   // 1
        e->push([](RunContext&) {}, Device::cpu(1), {x}, {y}, {.name = "consume"});  // 2: x from 1
        e->push([](RunContext&) {}, Device::cpu(0), {}, {x}, {.name = "overwrite"}); // 3: after 2 read x
        e->wait_all();
        e->profiler().stop();
        std::ostringstream os;
        e->profiler().write_dot(os);
        const std::string dot = os.str();
        CHECK(dot.rfind("digraph weft {", 0) == 0);
        CHECK(dot.find("label=\"cpu(0)\"") != std::string::npos);
        CHECK(dot.find("label=\"cpu(1)\"") != std::string::npos);
        // Op ids of this engine start at 1 and nothing else was pushed.
        CHECK(dot.find("op1 -> op2 [label=\"x\"]") != std::string::npos);
        CHECK(dot.find("op2 -> op3 [label=\"x\"]") != std::string::npos);
        CHECK(dot.find("op1 -> op3") == std::string::npos);  // ordered through the read
        CHECK(std::count(dot.begin(), dot.end(), '>') == 2);
      },
      2);
}
