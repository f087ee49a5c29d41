#include "options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "arg_cursor.h"

namespace weft_bench {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: weft-bench-engine [--json] [--quick] [--reps N] [--body empty|1us|10us]\n"
               "                         [--shape independent|chain|wavefront|tree] [--engines a,b,...]\n"
               "                         [--noise N]\n"
               "\n"
               "Runs the same dependency shapes on Weft and peer runtimes, checks every run's\n"
               "result against the sequential loop and prints one JSON line per\n"
               "(engine, shape, body), then a table (unless --json).\n"
               "\n"
               "  --json       JSON lines only on stdout (the header goes to stderr)\n"
               "  --quick      1/16 of the nominal sizes and 3 repetitions\n"
               "  --smoke      1/256 of the nominal sizes, 1 repetition: checks every peer's\n"
               "               results in seconds (the test suite runs this)\n"
               "  --reps N     timed repetitions per peer (default 5; one warm-up run is extra)\n"
               "  --body B     one body (default: all three); may be repeated\n"
               "  --shape S    one shape (default: all four); may be repeated\n"
               "  --engines L  comma-separated subset of the engines below; 'sequential' is\n"
               "               always run, as the reference result and the speedup baseline;\n"
               "               without it, all but push_alone and drain_alone (the two halves\n"
               "               of weft's pushed ops timed apart: bench/README.md)\n"
               "  --noise N    N threads spinning at normal priority during every measurement\n"
               "               (after calibration): the cores are oversubscribed, so workers\n"
               "               are descheduled as on a shared machine; the sequential loop is\n"
               "               preempted too, and the spread (min, max) shows the stalls\n"
               "\n"
               "engines in this build:");
  for (const std::string& e : available_engines()) std::fprintf(out, " %s", e.c_str());
  std::fprintf(out, "\n");
}

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "weft-bench-engine: %s (see --help)\n", msg.c_str());
  std::exit(2);
}

}  // namespace

std::vector<std::string> available_engines() {
  std::vector<std::string> e{"sequential"};
#ifndef WEFT_BENCH_NO_WEFT
  e.push_back("weft");
  e.push_back("replay");
  e.push_back("bulk");
  e.push_back("push_alone");
  e.push_back("drain_alone");
#endif
  e.push_back("tbb_flow_graph");
#ifdef WEFT_BENCH_HAVE_OMP
  e.push_back("omp_depend");
#endif
#ifdef WEFT_BENCH_HAVE_STARPU
  e.push_back("starpu");
#endif
  return e;
}

Options parse_options(int argc, char** argv) {
  Options o;
  const std::vector<std::string> known = available_engines();
  for (weft::examples::ArgCursor args(argc, argv); args.next();) {
    const std::string& a = args.flag();
    auto value = [&]() -> std::string {
      std::optional<std::string> v = args.value();
      if (!v) fail(a + " needs a value");
      return *v;
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    } else if (a == "--json") {
      o.json_only = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--smoke") {
      o.smoke = true;
    } else if (a == "--reps") {
      const std::string v = value();
      const auto n = weft::examples::ArgCursor::parse_int(v, 1, 1000);
      if (!n) fail("--reps wants a number from 1 to 1000, not '" + v + "'");
      o.reps = static_cast<int>(*n);
    } else if (a == "--noise") {
      const std::string v = value();
      const auto n = weft::examples::ArgCursor::parse_int(v, 0, 256);
      if (!n) fail("--noise wants a thread count from 0 to 256, not '" + v + "'");
      o.noise_threads = static_cast<int>(*n);
    } else if (a == "--body") {
      const std::string v = value();
      if (v != "empty" && v != "1us" && v != "10us") fail("unknown body '" + v + "'");
      o.bodies.push_back(v);
    } else if (a == "--shape") {
      const std::string v = value();
      const auto k = parse_shape(v);
      if (!k) fail("unknown shape '" + v + "'");
      o.shapes.push_back(*k);
    } else if (a == "--engines") {
      for (const std::string& e : weft::examples::ArgCursor::split_list(value())) {
        if (e.empty()) continue;
        if (std::find(known.begin(), known.end(), e) == known.end())
          fail("engine '" + e + "' is not in this build");
        o.engines.push_back(e);
      }
    } else {
      fail("unknown argument '" + a + "'");
    }
  }
  if (o.reps == 0) o.reps = o.smoke ? 1 : o.quick ? 3 : 5;
  return o;
}

}  // namespace weft_bench
