// The profiler as engines feed it: spans per worker, named as pushed, never
// overlapping on one track, agreeing with the aggregate table, and the
// WEFT_PROFILE file written at engine destruction.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unistd.h>
#include <string>

#include "engine_test_util.h"

using namespace weft_test;

namespace {

// A few named ops over a small dependency graph on two CPU devices.
void push_workload(weft::Engine& e, int rounds) {
  std::vector<Var> vars;
  for (int i = 0; i < 8; ++i) vars.push_back(e.new_var());
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < 8; ++i) {
      const Device dev = Device::cpu(i % 2);
      e.push([](RunContext&) { std::this_thread::yield(); }, dev, {vars[(i + 7) % 8]}, {vars[i]},
             {.name = i % 2 ? "odd" : "even"});
    }
  }
  e.push([](RunContext&) {}, Device::cpu(0), {}, {vars[0]});  // unnamed
}

}  // namespace

TEST_CASE("engine spans: one per op, named, on its device's workers, never overlapping" * doctest::timeout(60)) {
  for (const Config& base : all_configs(/*cpu_devices=*/2)) {
    Config cfg = base;
    INFO("engine config: " << cfg.str());
    auto e = make_engine(cfg);
    e->profiler().start();
    push_workload(*e, 50);
    e->wait_all();
    e->profiler().stop();

    auto spans = e->profiler().spans();
    REQUIRE(spans.size() == 401);
    std::map<std::pair<Device, int>, std::int64_t> last_end;
    std::map<std::string, std::uint64_t> counts;
    for (const auto& s : spans) {
      CHECK(s.end_ns >= s.start_ns);
      CHECK(s.device.is_cpu());
      CHECK(s.device.index() < 2);
      if (cfg.threaded()) CHECK(s.track < cfg.workers);
      if (!s.name.empty()) CHECK(((s.name == "even") == (s.device.index() == 0)));
      auto key = std::make_pair(s.device, s.track);
      auto it = last_end.find(key);
      if (it != last_end.end()) CHECK(s.start_ns >= it->second);  // sorted by start: no overlap on a track
      last_end[key] = s.end_ns;
      counts[std::string(s.name)]++;
    }
    CHECK(counts["even"] == 200);
    CHECK(counts["odd"] == 200);
    CHECK(counts[""] == 1);

    auto table = e->profiler().aggregate();
    std::map<std::string, std::uint64_t> table_counts;
    for (const auto& row : table) table_counts[row.name] = row.count;
    CHECK(table_counts["even"] == 200);
    CHECK(table_counts["odd"] == 200);
    CHECK(table_counts["(unnamed)"] == 1);
    CHECK(e->profiler().summary_table().find("even") != std::string::npos);
  }
}

TEST_CASE("engine spans: nothing is recorded while the profiler is stopped" * doctest::timeout(60)) {
  for (const Config& cfg : all_configs()) {
    INFO("engine config: " << cfg.str());
    auto e = make_engine(cfg);
    Var v = e->new_var();
    e->push([](RunContext&) {}, Device::cpu(0), {}, {v}, {.name = "before"});
    e->wait_all();
    e->profiler().start();
    e->push([](RunContext&) {}, Device::cpu(0), {}, {v}, {.name = "during"});
    e->wait_all();
    e->profiler().stop();
    e->push([](RunContext&) {}, Device::cpu(0), {}, {v}, {.name = "after"});
    e->wait_all();
    auto spans = e->profiler().spans();
    REQUIRE(spans.size() == 1);
    CHECK(spans[0].name == "during");
  }
}

TEST_CASE("WEFT_PROFILE writes a Perfetto trace when the engine is destroyed" * doctest::timeout(60)) {
  const auto path = std::filesystem::temp_directory_path() / ("weft-trace-" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(path);
  for (const char* kind : {"threaded", "naive"}) {
    INFO("kind " << kind);
    {
      const std::string path_text = path.string();
      EnvGuard guard("WEFT_PROFILE", path_text.c_str());
      auto e = weft::Engine::create({.kind = kind, .cpu_devices = 2, .workers_per_cpu_device = 2});
      push_workload(*e, 10);
      e->wait_all();
    }
    REQUIRE(std::filesystem::exists(path));
    std::ifstream in(path);
    auto trace = nlohmann::json::parse(in);
    std::set<std::string> processes;
    std::size_t op_events = 0;
    for (const auto& ev : trace["traceEvents"]) {
      if (ev["ph"] == "M" && ev["name"] == "process_name") processes.insert(ev["args"]["name"].get<std::string>());
      if (ev["ph"] == "X") {
        ++op_events;
        CHECK(ev["dur"].get<double>() >= 0.0);
      }
    }
    CHECK(processes.count("cpu(0)") == 1);
    CHECK(processes.count("cpu(1)") == 1);
    CHECK(op_events == 81);
    std::filesystem::remove(path);
  }
}
