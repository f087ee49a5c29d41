// weft-demo-<name>: each demo program is this entry point with its name
// (examples/CMakeLists.txt generates one main per demo).
#include "demo_registry.h"

#include <cstdio>

#include "demos.h"

namespace weft::demo {

namespace {
template <class Options>
int run(const char* program, const char* summary, int argc, char** argv,
        nlohmann::json (*fn)(const Options&, const CommonOptions&)) {
  Options o;
  CommonOptions c;
  DemoCli cli(program, summary);
  add_flags(cli, o);
  return demo_main(program, cli, argc, argv, c, [&] { return fn(o, c); });
}
}  // namespace

int run_named(std::string_view name, int argc, char** argv) {
  if (name == "async")
    return run<AsyncOptions>("weft-demo-async",
                             "Demo 1: asynchronous vs synchronous dispatch. N x (y = x + 1) with a wait after each\n"
                             "push, then with one wait; then products of random matrices pushed before wait_all.",
                             argc, argv, run_async);
  if (name == "barriers")
    return run<BarrierOptions>("weft-demo-barriers",
                               "Demo 2: barriers. wait_to_read on an intermediate result returns before wait_all;\n"
                               "to_host() and item() block on their own tensor only.",
                               argc, argv, run_barriers);
  if (name == "memory")
    return run<MemoryOptions>("weft-demo-memory",
                              "Demo 3: memory footprint of an MLP trained with a wait per minibatch and without,\n"
                              "with the engine's in-flight bound and with it lifted: time, peak RSS, allocator peaks.",
                              argc, argv, run_memory);
  if (name == "cpu-gpu")
    return run<CpuGpuOptions>("weft-demo-cpu-gpu",
                              "Demo 4: matmuls on the CPU and on the GPU, alone and together, and the overlap\n"
                              "efficiency (two CPU devices stand in for CPU + GPU where no GPU answers).",
                              argc, argv, run_cpu_gpu);
  if (name == "compute-copy")
    return run<ComputeCopyOptions>("weft-demo-compute-copy",
                                   "Demo 5: matmuls on the GPU and copies of their results to pinned host memory,\n"
                                   "alone and interleaved, and the overlap efficiency (CPU form without GPU).",
                                   argc, argv, run_compute_copy);
  if (name == "multidevice")
    return run<MultiDeviceOptions>("weft-demo-multidevice",
                                   "Demo 6: a 2-layer MLP data-parallel on a CPU and two devices; writes the\n"
                                   "dependency graph the engine built (DOT) and, with --trace, the timeline.",
                                   argc, argv, run_multidevice);
  std::fprintf(stderr, "weft-demo: no demo named '%.*s'\n", static_cast<int>(name.size()), name.data());
  return 2;
}

}  // namespace weft::demo
