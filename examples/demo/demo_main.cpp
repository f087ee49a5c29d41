// weft-demo: the seeds' asynchronous-computation experiments on Weft.
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "seed_experiments.h"

namespace {
void usage() {
  std::printf(
      "weft-demo [--ops N] [--elements N] [--products N] [--n N] [--engine threaded|naive]\n"
      "  1. N x (y = x + 1) with a wait after each push, then with one wait at the end (default 1000 ops);\n"
      "  2. products x (random n x n, C = A*A) pushed, then wait_all (default 10 x 1000).\n"
      "Environment: WEFT_ENGINE, WEFT_CPU_WORKERS, WEFT_PROFILE=trace.json (see README).\n");
}
}  // namespace

int main(int argc, char** argv) {
  int ops = 1000, elements = 2, products = 10, n = 1000;
  std::string kind;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "weft-demo: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    } else if (arg == "--ops") {
      ops = std::atoi(value());
    } else if (arg == "--elements") {
      elements = std::atoi(value());
    } else if (arg == "--products") {
      products = std::atoi(value());
    } else if (arg == "--n") {
      n = std::atoi(value());
    } else if (arg == "--engine") {
      kind = value();
    } else {
      std::fprintf(stderr, "weft-demo: unknown argument '%s'\n", arg.c_str());
      usage();
      return 2;
    }
  }
  if (ops <= 0 || elements <= 0 || products <= 0 || n <= 0) {
    std::fprintf(stderr, "weft-demo: sizes must be positive\n");
    return 2;
  }
  // The engine's workers provide the parallelism; one BLAS thread per op
  // keeps them from oversubscribing the cores.
  openblas_set_num_threads(1);
  try {
    auto engine = weft::Engine::create({.kind = kind});
    std::printf("Weft demo: %s engine, %d CPU worker(s) on cpu(0), max %zu ops in flight\n\n",
                std::string(engine->kind()).c_str(), engine->workers(weft::Device::cpu(0)), engine->max_inflight());

    auto d = weft::demo::async_dispatch(*engine, ops, elements);
    std::printf("1. %d x (y = x + 1) on %d floats\n", d.ops, elements);
    std::printf("   wait after each push : %9.3f ms  (%.2f us per op)\n", d.wait_each_s * 1e3, d.wait_each_s * 1e6 / d.ops);
    std::printf("   one wait at the end  : %9.3f ms  (%.2f us per op)\n", d.wait_once_s * 1e3, d.wait_once_s * 1e6 / d.ops);
    std::printf("   asynchronous dispatch is %.1fx faster\n\n", d.wait_each_s / d.wait_once_s);

    auto m = weft::demo::async_matmuls(*engine, products, n);
    std::printf("2. %d x (random %dx%d, C = A*A)\n", m.products, m.n, m.n);
    std::printf("   all pushes returned after : %9.3f ms\n", m.push_s * 1e3);
    std::printf("   wait_all returned after   : %9.3f ms  (checksum %.4g)\n", m.total_s * 1e3, m.checksum);
    std::printf("   the frontend was free for %.1f%% of the run\n", 100.0 * (1.0 - m.push_s / m.total_s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-demo: %s\n", e.what());
    return 1;
  }
  return 0;
}
