// weft::Profiler on its own (no engine), filled through the engines'
// recording side (ProfilerRecorder): tracks, interning, spans, aggregate, the
// chrome://tracing JSON and dump() errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "profiler_recorder.h"  // engine/src: internal
#include "weft/device.h"
#include "weft/error.h"
#include "weft/profiler.h"

namespace {

using weft::Device;
using weft::Profiler;
using weft::detail::ProfilerRecorder;
using weft::detail::ProfilerTrack;
using Json = nlohmann::json;

Json parse_trace(const Profiler& p) {
  std::ostringstream os;
  p.write_trace(os);
  return Json::parse(os.str());
}

std::string temp_path(const std::string& stem) {
  auto dir = std::filesystem::temp_directory_path();
  return (dir / (stem + "-" + std::to_string(::getpid()) + "-" +
                 std::to_string(Profiler::now_ns()) + ".json"))
      .string();
}

// Checks the documented schema (docs/trace-format.md); returns the X events.
std::vector<Json> check_schema(const Json& doc) {
  REQUIRE(doc.is_object());
  CHECK(doc.at("displayTimeUnit") == "ns");
  const Json& weft = doc.at("weft");
  CHECK(weft.at("schema") == 2);
  REQUIRE(weft.at("window_us").is_array());
  REQUIRE(weft.at("window_us").size() == 2);
  CHECK(weft.at("window_us")[0].get<double>() <= weft.at("window_us")[1].get<double>());
  std::map<std::pair<std::int64_t, std::int64_t>, Json> described;  // (pid, tid) -> weft.tracks entry
  for (const Json& t : weft.at("tracks")) {
    for (const char* key : {"device", "label", "kind", "resource"}) CHECK(t.at(key).is_string());
    const std::string kind = t.at("kind");
    CHECK((kind == "worker" || kind == "launch" || kind == "stream"));
    CHECK(described.emplace(std::pair{t.at("pid").get<std::int64_t>(), t.at("tid").get<std::int64_t>()}, t).second);
  }
  const Json& events = doc.at("traceEvents");
  REQUIRE(events.is_array());

  std::map<std::int64_t, std::string> processes;                       // pid -> name
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> threads;  // (pid, tid) -> name
  std::set<std::int64_t> process_sorted;
  std::set<std::pair<std::int64_t, std::int64_t>> thread_sorted;
  std::vector<Json> xs, flows, counters;
  for (const Json& e : events) {
    REQUIRE(e.is_object());
    const std::string ph = e.at("ph");
    if (ph == "M") {
      const std::string name = e.at("name");
      std::int64_t pid = e.at("pid");
      if (name == "process_name") {
        CHECK(processes.emplace(pid, e.at("args").at("name").get<std::string>()).second);
      } else if (name == "process_sort_index") {
        CHECK(e.at("args").at("sort_index").is_number_integer());
        process_sorted.insert(pid);
      } else if (name == "thread_name") {
        std::int64_t tid = e.at("tid");
        CHECK(threads.emplace(std::pair{pid, tid}, e.at("args").at("name").get<std::string>()).second);
      } else if (name == "thread_sort_index") {
        CHECK(e.at("args").at("sort_index").is_number_integer());
        thread_sorted.insert({pid, e.at("tid").get<std::int64_t>()});
      } else {
        FAIL("unexpected metadata event " << name);
      }
    } else if (ph == "X") {
      xs.push_back(e);
    } else if (ph == "s" || ph == "f") {
      flows.push_back(e);
    } else {
      REQUIRE(ph == "C");
      counters.push_back(e);
    }
  }
  for (const auto& [key, name] : threads) {
    CHECK(processes.count(key.first) == 1);
    CHECK(thread_sorted.count(key) == 1);
    REQUIRE(described.count(key) == 1);
    CHECK(described.at(key).at("label") == name);
    CHECK(processes.at(key.first) == described.at(key).at("device"));
  }
  CHECK(described.size() == threads.size());
  for (const auto& [pid, name] : processes) CHECK(process_sorted.count(pid) == 1);
  for (const Json& x : xs) {
    CHECK(x.at("name").is_string());
    const std::string cat = x.at("cat");
    CHECK((cat == "compute" || cat == "copy"));
    std::int64_t pid = x.at("pid");
    std::int64_t tid = x.at("tid");
    CHECK(processes.count(pid) == 1);
    CHECK(threads.count({pid, tid}) == 1);
    CHECK(x.at("ts").is_number());
    CHECK(x.at("ts").get<double>() >= 0.0);
    CHECK(x.at("dur").is_number());
    CHECK(x.at("dur").get<double>() >= 0.0);
    const Json& args = x.at("args");
    CHECK(args.at("op_id").is_number_unsigned());
    const std::string property = args.at("property");
    CHECK((cat == "copy") == (property.rfind("copy_", 0) == 0));
    if (args.contains("bytes")) {
      CHECK(args.at("bytes").is_number_unsigned());
      CHECK(args.at("GB_per_s").is_number());
    }
  }
  for (const Json& f : flows) {
    CHECK(f.at("id").is_number_unsigned());
    CHECK(f.at("cat") == "dependency");
    CHECK(threads.count({f.at("pid").get<std::int64_t>(), f.at("tid").get<std::int64_t>()}) == 1);
    if (f.at("ph") == "f") CHECK(f.at("bp") == "e");
  }
  for (const Json& c : counters) {
    CHECK(processes.count(c.at("pid").get<std::int64_t>()) == 1);
    const std::string name = c.at("name");
    CHECK((name == "ops in flight" || name == "memory in use"));
    CHECK(c.at("args").is_object());
    CHECK(c.at("args").size() == 1);
  }
  return xs;
}

}  // namespace

TEST_CASE("profiler: running() toggles with start/stop, and clear keeps the state" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  CHECK_FALSE(p.running());
  p.start();
  CHECK(p.running());
  p.start();  // idempotent
  CHECK(p.running());
  p.stop();
  CHECK_FALSE(p.running());
  p.stop();
  CHECK_FALSE(p.running());

  // Spans recorded while running survive stop/start; clear() forgets them.
  auto* t = rec.track(Device::cpu(0), 0, "w0");
  auto name = rec.intern("op");
  p.start();
  rec.record(t, name, 1, 10, 20);
  p.stop();
  CHECK(p.spans().size() == 1);
  p.start();
  rec.record(t, name, 2, 30, 40);
  CHECK(p.spans().size() == 2);
  p.clear();
  CHECK(p.running());  // clear does not stop
  CHECK(p.spans().empty());
  CHECK(p.aggregate().empty());
  // The track stays usable after clear().
  rec.record(t, name, 3, 50, 60);
  auto spans = p.spans();
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].op_id == 3);
  p.stop();
  CHECK_FALSE(p.running());
}

TEST_CASE("profiler: track() is stable per (device, index) and thread-safe" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  auto* a = rec.track(Device::cpu(0), 0, "cpu0 w0");
  CHECK(a != nullptr);
  CHECK(rec.track(Device::cpu(0), 0, "other label") == a);
  CHECK(rec.track(Device::cpu(0), 1, "cpu0 w1") != a);
  CHECK(rec.track(Device::cpu(1), 0, "cpu1 w0") != a);
  CHECK(rec.track(Device::gpu(0), 0, "gpu0 w0") != a);
  CHECK_THROWS_AS(rec.track(Device::cpu(0), -1, "bad"), weft::Error);

  // Many threads asking for the same few tracks get the same pointers.
  constexpr int kThreads = 8, kKeys = 16;
  std::vector<std::vector<ProfilerTrack*>> got(kThreads, std::vector<ProfilerTrack*>(kKeys));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      for (int k = 0; k < kKeys; ++k) {
        int key = (k + i) % kKeys;
        got[i][key] = rec.track(Device::cpu(2), key, "t" + std::to_string(key));
      }
    });
  go = true;
  for (auto& t : threads) t.join();
  std::set<ProfilerTrack*> distinct;
  for (int k = 0; k < kKeys; ++k) {
    for (int i = 1; i < kThreads; ++i) CHECK(got[i][k] == got[0][k]);
    distinct.insert(got[0][k]);
  }
  CHECK(distinct.size() == kKeys);

  // The first label wins, an empty label gets a default.
  auto* d = rec.track(Device::cpu(3), 4, "");
  rec.record(d, rec.intern("x"), 1, 0, 1);
  rec.record(a, rec.intern("x"), 2, 0, 1);
  Json doc = parse_trace(p);
  std::set<std::string> labels;
  for (const Json& e : doc.at("traceEvents"))
    if (e.at("name") == "thread_name") labels.insert(e.at("args").at("name").get<std::string>());
  CHECK(labels.count("cpu0 w0") == 1);
  CHECK(labels.count("other label") == 0);
  CHECK(labels.count("cpu(3) worker 4") == 1);
}

TEST_CASE("profiler: intern() returns one stable view per name" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  std::string_view a;
  {
    std::string tmp = "matmul";
    a = rec.intern(tmp);
    tmp = "clobbered";
  }
  CHECK(a == "matmul");
  CHECK(rec.intern("matmul").data() == a.data());
  CHECK(rec.intern(std::string("mat") + "mul").data() == a.data());
  CHECK(rec.intern("conv") != a);
  CHECK(rec.intern("").empty());

  // Concurrent interning agrees on the storage.
  constexpr int kThreads = 4, kNames = 200;
  std::vector<std::vector<std::string_view>> got(kThreads, std::vector<std::string_view>(kNames));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      for (int r = 0; r < 5; ++r)
        for (int k = 0; k < kNames; ++k) got[i][k] = rec.intern("op_" + std::to_string(k));
    });
  for (auto& t : threads) t.join();
  for (int k = 0; k < kNames; ++k) {
    CHECK(got[0][k] == "op_" + std::to_string(k));
    for (int i = 1; i < kThreads; ++i) CHECK(got[i][k].data() == got[0][k].data());
  }
  CHECK(a == "matmul");  // still valid after the set grew
}

TEST_CASE("profiler: now_ns() is monotonic" * doctest::timeout(30)) {
  std::int64_t prev = Profiler::now_ns();
  CHECK(prev >= 0);
  for (int i = 0; i < 10000; ++i) {
    std::int64_t t = Profiler::now_ns();
    REQUIRE(t >= prev);
    prev = t;
  }
}

TEST_CASE("profiler: 4 threads x 10000 spans on their own tracks all come back" * doctest::timeout(30)) {
  constexpr int kThreads = 4, kSpans = 10000;
  Profiler p;
  ProfilerRecorder rec(p);
  p.start();
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      Device dev = Device::cpu(i % 2);
      auto* t = rec.track(dev, i, "worker " + std::to_string(i));
      std::string_view names[2] = {rec.intern("even"), rec.intern("odd")};
      while (!go.load()) std::this_thread::yield();
      for (int k = 0; k < kSpans; ++k) {
        std::int64_t s = 1000 * static_cast<std::int64_t>(k) + i;
        rec.record(t, names[k % 2], static_cast<std::uint64_t>(i) * kSpans + k, s, s + 500 + k % 7);
      }
    });
  go = true;
  for (auto& t : threads) t.join();
  p.stop();

  auto spans = p.spans();
  REQUIRE(spans.size() == static_cast<std::size_t>(kThreads) * kSpans);
  std::vector<int> seen(kThreads * kSpans, 0);
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const auto& s = spans[i];
    if (i > 0) REQUIRE(spans[i - 1].start_ns <= s.start_ns);  // sorted by start
    REQUIRE(s.op_id < seen.size());
    ++seen[s.op_id];
    int thread = static_cast<int>(s.op_id / kSpans), k = static_cast<int>(s.op_id % kSpans);
    REQUIRE(s.track == thread);
    REQUIRE(s.device == Device::cpu(thread % 2));
    REQUIRE(s.name == (k % 2 ? "odd" : "even"));
    REQUIRE(s.start_ns == 1000 * static_cast<std::int64_t>(k) + thread);
    REQUIRE(s.end_ns == s.start_ns + 500 + k % 7);
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));

  auto stats = p.aggregate();
  REQUIRE(stats.size() == 2);
  CHECK(stats[0].count + stats[1].count == static_cast<std::uint64_t>(kThreads) * kSpans);

  auto xs = check_schema(parse_trace(p));
  CHECK(xs.size() == spans.size());
}

TEST_CASE("profiler: readers see whole spans while a writer is still recording" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  p.start();
  auto* t = rec.track(Device::cpu(0), 0, "w");
  auto name = rec.intern("op");
  constexpr int kSpans = 20000;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int k = 0; k < kSpans; ++k) rec.record(t, name, static_cast<std::uint64_t>(k), 10 * k, 10 * k + 5);
    done = true;
  });
  std::size_t last = 0;
  while (!done.load()) {
    auto spans = p.spans();
    REQUIRE(spans.size() >= last);
    last = spans.size();
    for (std::size_t i = 0; i < spans.size(); ++i) {
      REQUIRE(spans[i].op_id == i);  // a prefix, in order
      REQUIRE(spans[i].end_ns == spans[i].start_ns + 5);
      REQUIRE(spans[i].name == "op");
    }
  }
  writer.join();
  CHECK(p.spans().size() == kSpans);
}

TEST_CASE("profiler: aggregate() agrees with the spans" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  p.start();
  auto* t0 = rec.track(Device::cpu(0), 0, "w0");
  auto* t1 = rec.track(Device::gpu(0), 0, "g0");
  auto a = rec.intern("a"), b = rec.intern("b");
  // a: 1000, 3000, 2000 ns; b: 10000 ns; unnamed: 1 and 2 ns.
  rec.record(t0, a, 1, 0, 1000);
  rec.record(t0, a, 2, 1000, 4000);
  rec.record(t1, a, 3, 500, 2500);
  rec.record(t1, b, 4, 3000, 13000);
  rec.record(t0, {}, 5, 5000, 5001);
  rec.record(t0, rec.intern(""), 6, 6000, 6002);
  p.stop();

  auto stats = p.aggregate();
  REQUIRE(stats.size() == 3);
  // Sorted by total, largest first.
  CHECK(stats[0].name == "b");
  CHECK(stats[1].name == "a");
  CHECK(stats[2].name == "(unnamed)");
  for (std::size_t i = 1; i < stats.size(); ++i) CHECK(stats[i - 1].total_us >= stats[i].total_us);

  CHECK(stats[1].count == 3);
  CHECK(stats[1].total_us == doctest::Approx(6.0));
  CHECK(stats[1].min_us == doctest::Approx(1.0));
  CHECK(stats[1].max_us == doctest::Approx(3.0));
  CHECK(stats[1].mean_us == doctest::Approx(2.0));
  CHECK(stats[0].count == 1);
  CHECK(stats[0].total_us == doctest::Approx(10.0));
  CHECK(stats[0].min_us == doctest::Approx(10.0));
  CHECK(stats[0].max_us == doctest::Approx(10.0));
  CHECK(stats[2].count == 2);
  CHECK(stats[2].total_us == doctest::Approx(0.003));
  CHECK(stats[2].min_us == doctest::Approx(0.001));
  CHECK(stats[2].max_us == doctest::Approx(0.002));
  CHECK(stats[2].mean_us == doctest::Approx(0.0015));

  // Recompute from spans(): the same numbers.
  struct Acc {
    std::uint64_t count = 0;
    double total = 0, min = 1e300, max = -1;
  };
  std::map<std::string, Acc> expect;
  for (const auto& s : p.spans()) {
    Acc& acc = expect[s.name.empty() ? "(unnamed)" : std::string(s.name)];
    double us = static_cast<double>(s.end_ns - s.start_ns) / 1000.0;
    ++acc.count;
    acc.total += us;
    acc.min = std::min(acc.min, us);
    acc.max = std::max(acc.max, us);
  }
  REQUIRE(expect.size() == stats.size());
  for (const auto& s : stats) {
    const Acc& e = expect.at(s.name);
    CHECK(s.count == e.count);
    CHECK(s.total_us == doctest::Approx(e.total));
    CHECK(s.min_us == doctest::Approx(e.min));
    CHECK(s.max_us == doctest::Approx(e.max));
    CHECK(s.mean_us == doctest::Approx(e.total / static_cast<double>(e.count)));
  }

  // The table: a header, then one row per op name.
  std::string table = p.summary_table();
  std::istringstream lines(table);
  std::string header;
  std::getline(lines, header);
  for (const char* col : {"name", "count", "total ms", "mean us", "min us", "max us"})
    CHECK(header.find(col) != std::string::npos);
  for (const char* row : {"a", "b", "(unnamed)"}) {
    bool found = false;
    std::istringstream rows(table);
    std::string line;
    std::getline(rows, line);
    while (std::getline(rows, line))
      if (line.rfind(std::string(row) + " ", 0) == 0) found = true;
    CHECK_MESSAGE(found, "no row for " << row << " in\n" << table);
  }
}

TEST_CASE("profiler: notes appear under every summary table, by key, and a note replaces its key's" *
          doctest::timeout(30)) {
  Profiler::clear_notes();
  Profiler p;
  CHECK(p.summary_table().find("notes:") == std::string::npos);
  Profiler::note("conv2d fwd b", "conv2d fwd b: algo GEMM, time unknown (heuristic), workspace 0 B");
  Profiler::note("conv2d fwd a", "conv2d fwd a: algo WINOGRAD 0.125 ms, workspace 1.0 MiB");
  Profiler::note("conv2d fwd b", "conv2d fwd b: algo FFT 0.500 ms, workspace 2.0 MiB");
  const auto notes = Profiler::notes();
  REQUIRE(notes.size() == 2);
  CHECK(notes[0].first == "conv2d fwd a");
  CHECK(notes[1].second == "conv2d fwd b: algo FFT 0.500 ms, workspace 2.0 MiB");
  // Every profiler prints them, after the op table, one per line by key.
  Profiler other;
  for (const Profiler* q : {&p, &other}) {
    const std::string table = q->summary_table();
    const std::size_t at = table.find("\nnotes:\n");
    REQUIRE_MESSAGE(at != std::string::npos, table);
    CHECK(table.find("name") < at);
    const std::size_t a = table.find("  conv2d fwd a: algo WINOGRAD 0.125 ms", at);
    const std::size_t b = table.find("  conv2d fwd b: algo FFT 0.500 ms", at);
    CHECK(a != std::string::npos);
    CHECK(b != std::string::npos);
    CHECK(a < b);
    CHECK(table.find("algo GEMM") == std::string::npos);
  }
  Profiler::clear_notes();
  CHECK(Profiler::notes().empty());
  CHECK(p.summary_table().find("notes:") == std::string::npos);
}

TEST_CASE("profiler: the trace JSON follows the documented schema" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  SUBCASE("empty profiler") {
    Json doc = parse_trace(p);
    CHECK(check_schema(doc).empty());
    CHECK(doc.at("traceEvents").empty());
  }
  SUBCASE("spans on several devices and tracks") {
    p.start();
    const std::string weird = "q\"uote\\back\nnew\ttab\x01 \xC3\xBC \xE2\x82\xAC";  // ü €
    auto* c0 = rec.track(Device::cpu(0), 0, "cpu0 \"w0\"");
    auto* c1 = rec.track(Device::cpu(0), 1, "cpu0 w1");
    auto* g = rec.track(Device::gpu(1), 0, "gpu1 w0\n");
    auto* pin = rec.track(Device::cpu_pinned(0), 3, "pinned w3");
    rec.record(c0, rec.intern(weird), 7, 2000, 3500);
    rec.record(c1, rec.intern("plain"), 8, 1000, 1000);  // zero duration
    rec.record(g, rec.intern("plain"), 9, 4321, 9876);
    rec.record(pin, {}, 10, 5000, 5001);
    p.stop();

    Json doc = parse_trace(p);
    auto xs = check_schema(doc);
    REQUIRE(xs.size() == 4);

    std::map<std::uint64_t, Json> by_op;
    for (const Json& x : xs) by_op[x.at("args").at("op_id").get<std::uint64_t>()] = x;
    REQUIRE(by_op.size() == 4);
    CHECK(by_op[7].at("name").get<std::string>() == weird);  // escaped and round-tripped
    CHECK(by_op[8].at("name") == "plain");
    CHECK(by_op[10].at("name") == "(unnamed)");

    // ts relative to the earliest span (1000 ns), in microseconds.
    CHECK(by_op[8].at("ts").get<double>() == doctest::Approx(0.0));
    CHECK(by_op[8].at("dur").get<double>() == doctest::Approx(0.0));
    CHECK(by_op[7].at("ts").get<double>() == doctest::Approx(1.0));
    CHECK(by_op[7].at("dur").get<double>() == doctest::Approx(1.5));
    CHECK(by_op[9].at("ts").get<double>() == doctest::Approx(3.321));
    CHECK(by_op[9].at("dur").get<double>() == doctest::Approx(5.555));
    CHECK(by_op[10].at("dur").get<double>() == doctest::Approx(0.001));

    // Processes by device, threads by track; distinct devices get distinct pids,
    // tracks of one device share it.
    CHECK(by_op[7].at("pid") == by_op[8].at("pid"));
    CHECK(by_op[7].at("tid") != by_op[8].at("tid"));
    CHECK(by_op[7].at("pid") != by_op[9].at("pid"));
    CHECK(by_op[9].at("pid") != by_op[10].at("pid"));

    std::map<std::int64_t, std::string> process_names;
    std::map<std::pair<std::int64_t, std::int64_t>, std::string> thread_names;
    for (const Json& e : doc.at("traceEvents")) {
      if (e.at("name") == "process_name") process_names[e.at("pid")] = e.at("args").at("name");
      if (e.at("name") == "thread_name") thread_names[{e.at("pid"), e.at("tid")}] = e.at("args").at("name");
    }
    CHECK(process_names.at(by_op[7].at("pid")) == "cpu(0)");
    CHECK(process_names.at(by_op[9].at("pid")) == "gpu(1)");
    CHECK(process_names.at(by_op[10].at("pid")) == "cpu_pinned(0)");
    CHECK(thread_names.at({by_op[7].at("pid"), by_op[7].at("tid")}) == "cpu0 \"w0\"");
    CHECK(thread_names.at({by_op[9].at("pid"), by_op[9].at("tid")}) == "gpu1 w0\n");

    // Raw text: numbers carry exactly 3 decimals, and escapes are JSON escapes.
    std::ostringstream os;
    p.write_trace(os);
    const std::string text = os.str();
    CHECK(text.find("\"ts\":3.321") != std::string::npos);
    CHECK(text.find("\"dur\":5.555") != std::string::npos);
    CHECK(text.find("\"dur\":0.000") != std::string::npos);
    CHECK(text.find("\\u0001") != std::string::npos);
    CHECK(text.find("q\\\"uote\\\\back\\nnew\\ttab") != std::string::npos);
  }
  SUBCASE("invalid UTF-8 in a name does not break the trace") {
    auto* t = rec.track(Device::cpu(0), 0, "w");
    rec.record(t, rec.intern("bad \xFF\xFE utf8"), 1, 0, 10);
    auto xs = check_schema(parse_trace(p));
    REQUIRE(xs.size() == 1);
    CHECK(xs[0].at("name").get<std::string>().rfind("bad ", 0) == 0);
  }
}

TEST_CASE("profiler: spans recorded sequentially on one track never overlap" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  p.start();
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      auto* t = rec.track(Device::cpu(0), i, "w" + std::to_string(i));
      auto name = rec.intern("seq");
      for (int k = 0; k < 2000; ++k) {
        std::int64_t s = Profiler::now_ns();
        volatile int sink = 0;
        for (int j = 0; j < k % 50; ++j) sink = sink + j;
        std::int64_t e = Profiler::now_ns();
        rec.record(t, name, static_cast<std::uint64_t>(k), s, e);
      }
    });
  for (auto& t : threads) t.join();
  p.stop();

  auto spans = p.spans();
  REQUIRE(spans.size() == 4000);
  std::map<int, std::vector<weft::Span>> per_track;
  for (const auto& s : spans) {
    CHECK(s.end_ns >= s.start_ns);
    per_track[s.track].push_back(s);
  }
  REQUIRE(per_track.size() == 2);
  for (const auto& [track, list] : per_track) {
    REQUIRE(list.size() == 2000);
    for (std::size_t i = 1; i < list.size(); ++i) REQUIRE(list[i - 1].end_ns <= list[i].start_ns);
  }

  // The same holds in the trace (per pid/tid, in microseconds).
  auto xs = check_schema(parse_trace(p));
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::pair<double, double>>> per_thread;
  for (const Json& x : xs)
    per_thread[{x.at("pid"), x.at("tid")}].push_back({x.at("ts").get<double>(), x.at("dur").get<double>()});
  REQUIRE(per_thread.size() == 2);
  for (auto& [key, list] : per_thread) {
    std::sort(list.begin(), list.end());
    for (std::size_t i = 1; i < list.size(); ++i)
      REQUIRE(list[i - 1].first + list[i - 1].second <= list[i].first + 1e-6);
  }
}

TEST_CASE("profiler: dump() writes the trace and names the path on failure" * doctest::timeout(30)) {
  Profiler p;
  ProfilerRecorder rec(p);
  p.start();
  auto* t = rec.track(Device::cpu(0), 0, "w0");
  rec.record(t, rec.intern("op"), 1, 100, 200);
  p.stop();

  SUBCASE("writable path") {
    const std::string path = temp_path("weft-profiler-test");
    p.dump(path);
    std::ifstream in(path);
    REQUIRE(in.good());
    Json doc = Json::parse(in);
    auto xs = check_schema(doc);
    REQUIRE(xs.size() == 1);
    CHECK(xs[0].at("name") == "op");
    in.close();
    std::filesystem::remove(path);
  }
  SUBCASE("missing directory") {
    const std::string path = "/nonexistent-weft-dir/sub/trace.json";
    try {
      p.dump(path);
      FAIL("dump() did not throw");
    } catch (const weft::Error& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
  }
  SUBCASE("path is a directory") {
    const std::string path = std::filesystem::temp_directory_path().string();
    CHECK_THROWS_AS(p.dump(path), weft::Error);
    try {
      p.dump(path);
    } catch (const weft::Error& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
  }
}
