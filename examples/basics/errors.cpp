// Errors: an exception thrown by an op is stored on the variables it writes;
// ops reading them are skipped and pass it on; the wait that reaches it
// rethrows it — once, with its own type. Bad input is refused at push time.
#include <weft/engine.h>

#include <cstdio>
#include <stdexcept>

struct ParseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int main() {
  auto engine = weft::Engine::create();
  weft::SharedVar raw(*engine, "raw"), parsed(*engine, "parsed"), stats(*engine, "stats");
  bool stats_ran = false;

  engine->push([] { throw ParseError("line 3: expected a number"); }, {}, {raw, parsed}, {.name = "parse"});
  engine->push([&] { stats_ran = true; }, {parsed}, {stats}, {.name = "stats"});  // skipped
  int caught = 0;
  try {
    engine->wait_to_read(stats);
  } catch (const ParseError& e) {  // the op's own type
    std::printf("wait_to_read(stats): ParseError: %s (stats ran: %s)\n", e.what(), stats_ran ? "yes" : "no");
    ++caught;
  }
  engine->wait_all();  // reported once: nothing left to throw

  // Weft's own errors are weft::Error subclasses naming the op and the variable.
  try {
    engine->push([] {}, weft::Device::cpu(7), {}, {raw}, {.name = "misplaced"});
  } catch (const weft::InvalidArgument& e) {
    std::printf("push: weft::InvalidArgument: %s\n", e.what());
    ++caught;
  }
  engine->push([](weft::RunContext& ctx) { ctx.engine->wait_all(); }, {}, {raw}, {.name = "impatient"});
  try {
    engine->wait_to_read(raw);
  } catch (const weft::OpError& e) {  // an op misused the engine
    std::printf("wait_to_read(raw): weft::OpError from op '%s' on %s: %s\n", e.op_name().c_str(),
                e.device().str().c_str(), e.what());
    ++caught;
  }
  return caught == 3 && !stats_ran ? 0 : 1;
}
