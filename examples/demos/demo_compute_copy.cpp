// Demo 5: compute overlapped with copies. `count` matmuls on the GPU, then
// each result copied to (pinned) host memory: all matmuls then all copies,
// each phase alone, and interleaved (copy i runs on the device-to-host
// stream while matmul i + 1 runs on a compute stream). Overlap efficiency as
// in demo 4; the copies of the last result have no matmul left to hide
// under, so it is at most 1 - 1/count. Without a GPU: matmuls on cpu(0),
// each result copied to cpu(1) by cpu(1)'s worker (k times, k calibrated so
// that copies take about as long as the matmuls), one core each. On
// simulated GPUs each result is copied k times too (kernels run at CPU
// speed), on one compute stream (demo_support.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <weft/ops.h>
#include <weft/tensor.h>

#include "demos.h"

namespace weft::demo {

void add_flags(DemoCli& cli, ComputeCopyOptions& o) {
  cli.add("--count", &o.count, "matmuls (and results copied)");
  cli.add("--n", &o.n, "matrix size on the GPU");
  cli.add("--cpu-n", &o.cpu_n, "matrix size without GPU");
  cli.add("--reps", &o.reps, "repetitions (medians are reported)");
}

nlohmann::json run_compute_copy(const ComputeCopyOptions& o, const CommonOptions& c) {
  OverlapEngine setup = make_overlap_engine(c, 2);
  const bool gpu = setup.gpus > 0;
  std::unique_ptr<Engine>& engine = setup.engine;
  Engine& e = *engine;
  const Device compute_on = gpu ? Device::gpu(0) : Device::cpu(0);
  const Device copy_dst = gpu ? Device::cpu_pinned(0) : Device::cpu(1);
  const std::int64_t n = gpu && !setup.simulated ? o.n : o.cpu_n;  // simulated kernels run at CPU speed
  const Tensor a = Tensor::uniform(e, {n, n}, -1.0f, 1.0f, 1, compute_on);
  e.wait_all();

  // One destination per result, allocated before the timing: what a program
  // that streams results to the host keeps (on a GPU, pinned buffers it
  // reuses). Repeated copies of one result overwrite its destination in push
  // order, so the CPU form's extra copies need no memory of their own.
  std::vector<Tensor> host;
  for (std::int64_t i = 0; i < o.count; ++i) host.push_back(Tensor::zeros(e, {n, n}, copy_dst));
  e.wait_all();

  // Copies per result: 1 on a GPU; on the CPU (and simulated GPUs, whose
  // kernels run at CPU speed) enough to match a matmul,
  // calibrated with the same copies the timed phases make (into a destination
  // that is already resident, a batch at a time so push-to-finish latency does
  // not count as copy time).
  std::int64_t repeat = 1;
  {
    const Tensor warm = a.matmul(a);
    host[0].copy_from(warm);
    e.wait_all();
    if (!gpu || setup.simulated) {
      constexpr int batch = 8;
      std::vector<double> tm, tc;
      for (int i = 0; i < 3; ++i) {
        Tensor r;
        tm.push_back(time_seconds([&] {
          r = a.matmul(a);
          r.wait_to_read();
        }));
        tc.push_back(time_seconds([&] {
                       for (int k = 0; k < batch; ++k) host[0].copy_from(r);
                       host[0].wait_to_read();
                     }) /
                     batch);
      }
      repeat = std::clamp<std::int64_t>(std::llround(median(tm) / std::max(median(tc), 1e-9)), 1, 1000);
    }
  }
  std::vector<Tensor> results;
  auto compute = [&] {
    results.clear();
    for (std::int64_t i = 0; i < o.count; ++i) results.push_back(a.matmul(a));
  };
  auto copies = [&] {
    for (std::size_t i = 0; i < results.size(); ++i) {
      for (std::int64_t k = 0; k < repeat; ++k) host[i].copy_from(results[i]);
      // A CPU worker takes ready ops in the order they became ready, which
      // would interleave the copies of all results (each copy of a result
      // waits for its previous one, the first copies of the others do not)
      // and run them out of cache. Interleaved with the matmuls they come
      // one result at a time: so they do here. (GPU worker pools take ops in push
      // order.)
      if (!gpu) host[i].wait_to_read();
    }
    e.wait_all();
  };
  auto interleaved = [&] {
    results.clear();
    for (std::int64_t i = 0; i < o.count; ++i) {
      results.push_back(a.matmul(a));
      for (std::int64_t k = 0; k < repeat; ++k) host[static_cast<std::size_t>(i)].copy_from(results.back());
    }
    e.wait_all();
  };
  std::vector<double> tc, tcopy, tboth;
  for (std::int64_t r = 0; r < o.reps; ++r) {
    tc.push_back(time_seconds([&] {
      compute();
      e.wait_all();
    }));
    tcopy.push_back(time_seconds(copies));
    if (r + 1 == o.reps) traced(e, c, [&] { tboth.push_back(time_seconds(interleaved)); });
    else tboth.push_back(time_seconds(interleaved));
  }
  const double t_compute = median(tc), t_copy = median(tcopy), t_both = median(tboth);
  const double efficiency = overlap_efficiency(t_compute, t_copy, t_both);
  const double bytes = static_cast<double>(o.count * repeat * n * n) * sizeof(float);
  const std::string hw = hardware(e);
  const std::string form = !gpu ? "no GPU: compute on cpu(0), copies cpu(0)->cpu(1) on cpu(1)'s worker"
                           : setup.simulated
                               ? "simulated GPU compute + device-to-host copies to pinned memory (copies timed "
                                 "by the simulator's PCIe model)"
                               : "GPU compute + device-to-host copies to pinned memory";
  if (!c.quiet) {
    std::printf("5. Compute and copies at once: %s\n   (%s)\n\n", form.c_str(), hw.c_str());
    Table t({"phase (median of " + std::to_string(o.reps) + ")", "time", "GB/s"});
    t.row({std::to_string(o.count) + " x matmul " + std::to_string(n) + "^2 on " + compute_on.str(), ms(t_compute), ""});
    t.row({std::to_string(o.count * repeat) + " copies of " + mib(static_cast<double>(n * n) * 4) + " to " +
               copy_dst.str(),
           ms(t_copy), fixed(bytes / t_copy / 1e9, 2)});
    t.row({"interleaved: matmul i, then copy i", ms(t_both), ""});
    t.print();
    if (repeat > 1)
      std::printf(" each result copied %lld times so that both phases take about as long\n",
                  static_cast<long long>(repeat));
    std::printf(" overlap efficiency (t_compute + t_copy - t_both) / min = %.2f (at most 1 - 1/count = %.2f)\n",
                efficiency, 1.0 - 1.0 / static_cast<double>(o.count));
    print_trace_note(e, c);
  }
  return {{"demo", "compute-copy"},
          {"hardware", hw},
          {"form", gpu ? "gpu" : "cpu"},
          {"gpu_backend", setup.gpu_backend},
          {"compute_device", compute_on.str()},
          {"copy_to", copy_dst.str()},
          {"n", n},
          {"count", o.count},
          {"copies_per_result", repeat},
          {"compute_ms", t_compute * 1e3},
          {"copy_ms", t_copy * 1e3},
          {"both_ms", t_both * 1e3},
          {"copy_GB_per_s", bytes / t_copy / 1e9},
          {"overlap_efficiency", efficiency}};
}

}  // namespace weft::demo
