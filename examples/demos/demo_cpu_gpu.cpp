// Demo 4: the CPU and a GPU compute at once. 10 matmuls of 2000^2 on the CPU
// and 10 of 6000^2 on the GPU, each alone, then both pushed together.
// Overlap efficiency = (t_cpu + t_gpu - t_both) / min(t_cpu, t_gpu). Without a
// GPU the demo runs on two CPU devices (one worker and one kernel thread each,
// so each has a core of its own) and says so.
#include <cstdio>

#include <weft/ops.h>
#include <weft/tensor.h>

#include "demos.h"

namespace weft::demo {

void add_flags(DemoCli& cli, CpuGpuOptions& o) {
  cli.add("--count", &o.count, "matmuls per device");
  cli.add("--cpu-n", &o.cpu_n, "matrix size on the CPU");
  cli.add("--gpu-n", &o.gpu_n, "matrix size on the GPU (simulated GPU or none: --cpu-n)");
  cli.add("--reps", &o.reps, "repetitions (medians are reported)");
}

nlohmann::json run_cpu_gpu(const CpuGpuOptions& o, const CommonOptions& c) {
  OverlapEngine setup = make_overlap_engine(c, 2);
  const bool gpu = setup.gpus > 0;
  std::unique_ptr<Engine>& engine = setup.engine;
  Engine& e = *engine;
  const Device dev_a = Device::cpu(0), dev_b = gpu ? Device::gpu(0) : Device::cpu(1);
  // A simulated GPU computes at CPU speed: it gets the CPU's size.
  const std::int64_t n_a = o.cpu_n, n_b = gpu && !setup.simulated ? o.gpu_n : o.cpu_n;
  const Tensor a = Tensor::uniform(e, {n_a, n_a}, -1.0f, 1.0f, 1, dev_a);
  const Tensor b = Tensor::uniform(e, {n_b, n_b}, -1.0f, 1.0f, 2, dev_b);
  auto push = [&](const Tensor& m, std::vector<Tensor>& out) { out.push_back(m.matmul(m)); };
  auto only = [&](const Tensor& m) {
    return time_seconds([&] {
      std::vector<Tensor> out;
      for (std::int64_t i = 0; i < o.count; ++i) push(m, out);
      e.wait_all();
    });
  };
  auto both = [&] {
    return time_seconds([&] {
      std::vector<Tensor> out;
      for (std::int64_t i = 0; i < o.count; ++i) {
        push(a, out);
        push(b, out);
      }
      e.wait_all();
    });
  };
  e.wait_all();
  (void)only(a);  // warm-up: caches, cuBLAS kernel choice
  (void)only(b);
  std::vector<double> ta, tb, tboth;
  for (std::int64_t r = 0; r < o.reps; ++r) {
    ta.push_back(only(a));
    tb.push_back(only(b));
    if (r + 1 == o.reps) traced(e, c, [&] { tboth.push_back(both()); });
    else tboth.push_back(both());
  }
  const double t_a = median(ta), t_b = median(tb), t_both = median(tboth);
  const double efficiency = overlap_efficiency(t_a, t_b, t_both);
  const std::string hw = hardware(e);
  const std::string form = !gpu ? "two CPU devices standing in for CPU + GPU (no GPU answers)"
                           : setup.simulated
                               ? "CPU + simulated GPU (its kernels share the host's cores: compare the GPU form "
                                 "on a real GPU)"
                               : "CPU + GPU";
  if (!c.quiet) {
    std::printf("4. CPU and GPU at once: %s\n   (%s)\n\n", form.c_str(), hw.c_str());
    Table t({"phase (median of " + std::to_string(o.reps) + ")", "time"});
    t.row({std::to_string(o.count) + " x matmul " + std::to_string(n_a) + "^2 on " + dev_a.str(), ms(t_a)});
    t.row({std::to_string(o.count) + " x matmul " + std::to_string(n_b) + "^2 on " + dev_b.str(), ms(t_b)});
    t.row({"both, pushed together", ms(t_both)});
    t.print();
    std::printf(" overlap efficiency (t_a + t_b - t_both) / min(t_a, t_b) = %.2f (1: the shorter fully hidden)\n",
                efficiency);
    print_trace_note(e, c);
  }
  return {{"demo", "cpu-gpu"},
          {"hardware", hw},
          {"form", gpu ? "cpu+gpu" : "two-cpu-devices"},
          {"gpu_backend", setup.gpu_backend},
          {"device_a", dev_a.str()},
          {"device_b", dev_b.str()},
          {"n_a", n_a},
          {"n_b", n_b},
          {"count", o.count},
          {"a_ms", t_a * 1e3},
          {"b_ms", t_b * 1e3},
          {"both_ms", t_both * 1e3},
          {"overlap_efficiency", efficiency}};
}

}  // namespace weft::demo
