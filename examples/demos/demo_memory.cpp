// Demo 3: memory footprint. An MLP (512 -> 2048 -> 512 -> 1, batch 1024,
// squared loss, SGD) trained for 150 minibatches with a wait per batch, then
// with none. Without waits the frontend runs ahead; the engine's in-flight
// bound (EngineConfig::max_inflight) stops it, which keeps the inputs that
// were generated early but not consumed yet from piling up. A third run lifts
// the bound to show what it prevents.
#include <algorithm>
#include <cstdio>

#include <weft/nn.h>
#include <weft/ops.h>
#include <weft/tensor.h>

#include "demos.h"

namespace weft::demo {

void add_flags(DemoCli& cli, MemoryOptions& o) {
  cli.add("--batches", &o.batches, "minibatches per run");
  cli.add("--batch-size", &o.batch_size, "examples per minibatch");
  cli.add("--inputs", &o.inputs, "input features (and the second hidden width)");
  cli.add("--width", &o.width, "first hidden width");
  cli.add("--device", &o.device, "cpu:0 or gpu:0");
}

namespace {

struct Run {
  std::string label;
  std::size_t bound = 0;
  double seconds = 0;
  std::size_t peak_rss = 0, start_rss = 0;
  std::size_t peak_host = 0, peak_device = 0;  // allocator high-water marks
  std::size_t max_in_flight = 0;               // seen by the frontend after each batch
  float last_loss = 0;
  std::string trace_summary;  // the profiler's per-resource table, when traced
};

Run train(const MemoryOptions& o, const CommonOptions& c, Device device, bool wait_each, std::size_t bound,
          std::string label, bool trace) {
  Run r;
  r.label = std::move(label);
  auto engine = make_engine(c, {.max_inflight = bound});
  Engine& e = *engine;
  r.bound = e.max_inflight();
  auto model = nn::mlp(e, {o.inputs, o.width, o.inputs, 1}, device, 7);
  const std::vector<nn::Parameter*> params = model->parameters();
  const float lr = 0.01f, scale = 2.0f / static_cast<float>(o.batch_size);
  Tensor loss;
  auto step = [&](std::int64_t b) {
    const auto seed = static_cast<std::uint64_t>(b);
    const Tensor x = Tensor::uniform(e, {o.batch_size, o.inputs}, -1.0f, 1.0f, seed, device);
    const Tensor target = Tensor::uniform(e, {o.batch_size, 1}, -1.0f, 1.0f, seed + 1000003, device);
    const Tensor diff = model->forward(x) - target;
    loss = (diff * diff).mean();
    model->backward(diff * scale);
    nn::sgd_step(params, lr);
    if (wait_each) loss.wait_to_read();
    r.max_in_flight = std::max(r.max_in_flight, e.inflight());
  };
  for (Device d : {Device::cpu(0), device}) e.allocator(d).reset_peak();
  CommonOptions traced_common = c;
  if (!trace) traced_common.trace_path.clear();
  traced_common.quiet = true;
  const Footprint f = measure_footprint([&] {
    traced(e, traced_common, [&] {
      for (std::int64_t b = 0; b < o.batches; ++b) step(b);
      e.wait_all();
    });
  });
  r.seconds = f.seconds;
  r.peak_rss = f.peak_rss;
  r.start_rss = f.start_rss;
  r.peak_host = memory_stats(e, Device::cpu(0)).peak_in_use;
  if (device.is_gpu()) r.peak_device = memory_stats(e, device).peak_in_use;
  r.last_loss = loss.item();
  if (trace) r.trace_summary = e.profiler().summarize().table();
  return r;
}

}  // namespace

nlohmann::json run_memory(const MemoryOptions& o, const CommonOptions& c) {
  const Device device = Device::parse(o.device);
  std::vector<Run> runs;
  runs.push_back(train(o, c, device, true, 0, "wait_to_read(loss) every batch", false));
  runs.push_back(train(o, c, device, false, 0, "no wait (default in-flight bound)", !c.trace_path.empty()));
  runs.push_back(train(o, c, device, false, std::size_t{1} << 24, "no wait, bound lifted", false));
  const std::string hw = [&] {
    auto e = make_engine(c);
    return hardware(*e);
  }();
  if (!c.quiet) {
    std::printf("3. Memory footprint: MLP %lld -> %lld -> %lld -> 1, batch %lld, %lld minibatches on %s\n   (%s)\n\n",
                static_cast<long long>(o.inputs), static_cast<long long>(o.width), static_cast<long long>(o.inputs),
                static_cast<long long>(o.batch_size), static_cast<long long>(o.batches), device.str().c_str(),
                hw.c_str());
    std::vector<std::string> header{"run", "bound", "time", "max in flight", "peak RSS growth", "allocator peak"};
    if (device.is_gpu()) header.push_back("GPU peak");
    Table t(header);
    for (const Run& r : runs) {
      std::vector<std::string> row{r.label, std::to_string(r.bound), ms(r.seconds), std::to_string(r.max_in_flight),
                                   mib(static_cast<double>(r.peak_rss - std::min(r.peak_rss, r.start_rss))),
                                   mib(static_cast<double>(r.peak_host))};
      if (device.is_gpu()) row.push_back(mib(static_cast<double>(r.peak_device)));
      t.row(row);
    }
    t.print();
    std::printf(" outputs are allocated when an op runs, so what piles up without a bound is the inputs\n"
                " generated ahead of the model (nothing orders them after earlier batches); the bound stops the\n"
                " frontend %zu ops ahead. Final losses: %.6f %.6f %.6f (%s)\n",
                runs[1].bound, runs[0].last_loss, runs[1].last_loss, runs[2].last_loss,
                runs[0].last_loss == runs[1].last_loss && runs[1].last_loss == runs[2].last_loss
                    ? "identical: waiting changes when work runs, never what it computes"
                    : "DIFFERENT: a bug");
    if (!c.trace_path.empty())
      std::printf("\n trace of the run without waits: %s; what the engine saw in it:\n%s", c.trace_path.c_str(),
                  runs[1].trace_summary.c_str());
  }
  nlohmann::json j{{"demo", "memory"}, {"hardware", hw}, {"device", device.str()}, {"batches", o.batches}};
  const char* keys[] = {"wait_each", "no_wait", "no_wait_unbounded"};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    j[keys[i]] = {{"bound", r.bound},
                  {"ms", r.seconds * 1e3},
                  {"max_in_flight", r.max_in_flight},
                  {"peak_rss_bytes", r.peak_rss},
                  {"rss_growth_bytes", r.peak_rss - std::min(r.peak_rss, r.start_rss)},
                  {"allocator_peak_bytes", r.peak_host},
                  {"device_peak_bytes", r.peak_device},
                  {"loss", r.last_loss}};
  }
  return j;
}

}  // namespace weft::demo
