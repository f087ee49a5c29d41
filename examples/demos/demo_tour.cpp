// weft-demo: the README's first command. A tour of the six overlap demos at
// small sizes (under a minute on 2 CPU cores), each printing its table, then
// a one-screen summary. The full-size demos are weft-demo-<name>.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "demos.h"

namespace {

using weft::demo::fixed;
using weft::demo::mib;

struct Sizes {
  weft::demo::AsyncOptions async;
  weft::demo::BarrierOptions barriers;
  weft::demo::MemoryOptions memory;
  weft::demo::CpuGpuOptions cpu_gpu;
  weft::demo::ComputeCopyOptions compute_copy;
  weft::demo::MultiDeviceOptions multidevice;
};

Sizes small_sizes(bool tiny) {
  Sizes s;
  s.async = {.ops = 1000, .elements = 1000, .products = 10, .n = 600};
  s.barriers = {.n = 600, .chain = 6};
  s.memory = {.batches = 60, .batch_size = 512, .width = 1024, .inputs = 256};
  s.cpu_gpu = {.count = 10, .cpu_n = 700, .gpu_n = 4000, .reps = 3};
  s.compute_copy = {.count = 24, .n = 4000, .cpu_n = 600, .reps = 3};
  s.multidevice = {.steps = 5, .batch_size = 1024, .inputs = 256, .hidden = 1024};
  if (tiny) {  // the test suite: every path, seconds in all
    s.async = {.ops = 50, .elements = 16, .products = 2, .n = 32};
    s.barriers = {.n = 32, .chain = 2};
    s.memory = {.batches = 6, .batch_size = 16, .width = 32, .inputs = 16};
    s.cpu_gpu = {.count = 2, .cpu_n = 64, .gpu_n = 64, .reps = 1};
    s.compute_copy = {.count = 2, .n = 64, .cpu_n = 64, .reps = 1};
    s.multidevice = {.steps = 2, .batch_size = 16, .inputs = 8, .hidden = 16};
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  bool tiny = false;
  std::string out_dir = "weft-demo-out";
  weft::demo::CommonOptions common;
  weft::demo::DemoCli cli("weft-demo",
                          "A tour of Weft's six overlap demos at small sizes, ending with a summary. Writes the\n"
                          "timeline of demo 5 and the dependency graph of demo 6 to --out. The full-size demos:\n"
                          "weft-demo-async, -barriers, -memory, -cpu-gpu, -compute-copy, -multidevice.");
  cli.add("--tiny", &tiny, "smallest sizes (the test suite's run)");
  cli.add("--out", &out_dir, "folder for the trace and the graph");
  return weft::demo::demo_main("weft-demo", cli, argc, argv, common, [&] {
    const Sizes s = small_sizes(tiny);
    std::filesystem::create_directories(out_dir);
    weft::demo::CommonOptions plain = common;
    plain.trace_path.clear();
    plain.json = false;
    std::printf("Weft tour: six demos at small sizes (full sizes: weft-demo-<name>)\n\n");
    auto a = weft::demo::run_async(s.async, plain);
    std::printf("\n");
    auto b = weft::demo::run_barriers(s.barriers, plain);
    std::printf("\n");
    auto m = weft::demo::run_memory(s.memory, plain);
    std::printf("\n");
    auto g = weft::demo::run_cpu_gpu(s.cpu_gpu, plain);
    std::printf("\n");
    weft::demo::CommonOptions traced = plain;
    traced.trace_path = out_dir + "/compute-copy-trace.json";
    auto cc = weft::demo::run_compute_copy(s.compute_copy, traced);
    std::printf("\n");
    weft::demo::MultiDeviceOptions md = s.multidevice;
    md.dot_path = out_dir + "/multidevice.dot";
    auto mdj = weft::demo::run_multidevice(md, plain);

    std::printf("\n================ summary ================\n");
    std::printf(" hardware: %s\n\n", a["hardware"].get<std::string>().c_str());
    weft::demo::Table t({"demo", "what it shows", "measured"});
    t.row({"1 async", "one wait instead of one per push",
           fixed(a["speedup"].get<double>(), 2) + "x the speed; matmul pushes took " +
               fixed(100.0 * a["push_ms"].get<double>() / a["total_ms"].get<double>(), 2) + "% of their run"});
    t.row({"2 barriers", "wait_to_read(intermediate) vs wait_all",
           "returned at " + fixed(100.0 * b["wait_to_read_ms"].get<double>() / b["then_wait_all_ms"].get<double>(), 0) +
               "% of wait_all's time"});
    t.row({"3 memory", "RSS growth: wait each / bound / no bound",
           mib(m["wait_each"]["rss_growth_bytes"].get<double>()) + " / " +
               mib(m["no_wait"]["rss_growth_bytes"].get<double>()) + " / " +
               mib(m["no_wait_unbounded"]["rss_growth_bytes"].get<double>())});
    t.row({"4 cpu-gpu", g["form"].get<std::string>() == "cpu+gpu" ? "CPU and GPU at once" : "two CPU devices at once",
           "overlap efficiency " + fixed(g["overlap_efficiency"].get<double>(), 2)});
    t.row({"5 compute-copy", cc["form"].get<std::string>() == "gpu" ? "GPU compute + D2H copies" : "compute + copies (CPU form)",
           "overlap efficiency " + fixed(cc["overlap_efficiency"].get<double>(), 2)});
    t.row({"6 multidevice", "data parallel on two devices",
           "devices busy together " + fixed(mdj["device_overlap"].get<double>(), 2) + " of the shorter; " +
               fixed(mdj["step_ms"].get<double>(), 1) + " ms/step"});
    t.print();
    std::printf("\n trace of demo 5: %s   (scripts/trace-summary %s; or open it in ui.perfetto.dev)\n",
                traced.trace_path.c_str(), traced.trace_path.c_str());
    std::printf(" graph of demo 6: %s   (dot -Tsvg %s -o graph.svg)\n", md.dot_path.c_str(), md.dot_path.c_str());
    return nlohmann::json{{"tour", {a, b, m, g, cc, mdj}}};
  });
}
