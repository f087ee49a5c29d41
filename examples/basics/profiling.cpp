// Profiling an embedded application: name the variables, profile a stretch
// of work, then read the per-op and per-variable tables here and open the
// trace (one track per worker, arrows from each op to what it unblocked) in
// the Perfetto UI or chrome://tracing. WEFT_PROFILE=trace.json does the same
// for a whole run without code.
#include <weft/engine.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arg_cursor.h"

int main(int argc, char** argv) {
  std::string trace = "weft-profile.json";
  for (weft::examples::ArgCursor args(argc, argv); args.next();) {
    std::optional<std::string> value;
    if (args.flag() != "--trace" || !(value = args.value())) {
      std::fprintf(stderr, "usage: %s [--trace FILE]\n", argv[0]);
      return 2;
    }
    trace = *value;
  }
  auto engine = weft::Engine::create();
  auto work = [](int us) { return [us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); }; };
  std::vector<weft::SharedVar> layers;
  for (int i = 0; i < 4; ++i) layers.emplace_back(*engine, "layer" + std::to_string(i) + ".weight");

  engine->profiler().start();
  for (int step = 0; step < 3; ++step)
    for (std::size_t i = 0; i < layers.size(); ++i) {
      engine->push(work(300), {layers[i]}, {}, {.name = "forward"});
      engine->push(work(500), {}, {layers[i]}, {.name = "update"});
    }
  engine->wait_all();
  engine->profiler().stop();

  std::printf("%s", engine->profiler().summary_table().c_str());
  engine->profiler().dump(trace);
  std::printf("trace: %s (open it in the Perfetto UI or chrome://tracing; scripts/trace-summary reads it too)\n",
              trace.c_str());
  return 0;
}
