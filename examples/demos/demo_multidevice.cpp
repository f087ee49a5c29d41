// Demo 6: a 2-layer MLP trained data-parallel on a CPU and two devices, as in
// Dive into Deep Learning's multi-GPU figure: cpu(0) holds the data and the
// master weights; each device gets half of every minibatch and a replica,
// runs forward and backward, sends its gradients to cpu(0), which sums them,
// updates, and sends the weights back. The engine builds the graph from the
// variables each op touches; the demo writes that graph (DOT) and the
// timeline (--trace).
// Devices: two GPUs, else one GPU and cpu(1), else cpu(1) and cpu(2).
#include <cstdio>

#include <weft/gpu.h>
#include <weft/nn.h>
#include <weft/ops.h>
#include <weft/tensor.h>

#include "demos.h"

namespace weft::demo {

void add_flags(DemoCli& cli, MultiDeviceOptions& o) {
  cli.add("--steps", &o.steps, "training steps");
  cli.add("--batch-size", &o.batch_size, "examples per step (half per device)");
  cli.add("--inputs", &o.inputs, "input features");
  cli.add("--hidden", &o.hidden, "hidden width");
  cli.add("--dot", &o.dot_path, "where to write the dependency graph (Graphviz DOT)");
}

nlohmann::json run_multidevice(const MultiDeviceOptions& o, const CommonOptions& c) {
  if (o.batch_size < 2) throw UsageError("--batch-size must be at least 2 (half per device)");
  // CPU devices stand in for missing GPUs (with one core each).
  OverlapEngine setup = make_overlap_engine(c, 3, 2);  // with one GPU, cpu(1) is the second device
  const int gpus = setup.gpus;
  std::unique_ptr<Engine>& engine = setup.engine;
  Engine& e = *engine;
  const Device host = Device::cpu(0);
  const Device devices[2] = {gpus >= 1 ? Device::gpu(0) : Device::cpu(1),
                             gpus >= 2 ? Device::gpu(1) : Device::cpu(gpus >= 1 ? 1 : 2)};
  constexpr std::int64_t kClasses = 10;
  const std::int64_t half = o.batch_size / 2;
  auto master = nn::mlp(e, {o.inputs, o.hidden, kClasses}, host, 3);
  std::unique_ptr<nn::Sequential> replicas[2] = {nn::mlp(e, {o.inputs, o.hidden, kClasses}, devices[0], 3),
                                                 nn::mlp(e, {o.inputs, o.hidden, kClasses}, devices[1], 3)};
  const auto master_params = master->parameters();
  const float lr = 0.05f, scale = 2.0f / static_cast<float>(o.batch_size * kClasses);

  Tensor losses[2];
  auto step = [&](std::int64_t s) {
    std::vector<Tensor> grads[2];
    for (int r = 0; r < 2; ++r) {
      const auto seed = static_cast<std::uint64_t>(s * 2 + r);
      const Tensor x = Tensor::uniform(e, {half, o.inputs}, -1.0f, 1.0f, seed, host).copy_to(devices[r]);
      const Tensor target = Tensor::uniform(e, {half, kClasses}, 0.0f, 1.0f, seed + 7919, host).copy_to(devices[r]);
      const Tensor diff = replicas[r]->forward(x) - target;
      losses[r] = (diff * diff).mean();
      replicas[r]->backward(diff * scale);
      for (nn::Parameter* p : replicas[r]->parameters()) grads[r].push_back(p->grad.copy_to(host));
    }
    for (std::size_t k = 0; k < master_params.size(); ++k)
      ops::axpy(-lr, grads[0][k] + grads[1][k], master_params[k]->value);
    for (auto& replica : replicas) {
      const auto params = replica->parameters();
      for (std::size_t k = 0; k < params.size(); ++k) params[k]->value.copy_from(master_params[k]->value);
    }
  };
  step(0);  // warm-up, outside the graph and the timeline
  e.wait_all();

  std::vector<double> per_step;
  e.profiler().clear();
  e.profiler().start();
  CommonOptions quiet = c;
  quiet.quiet = true;
  for (std::int64_t s = 1; s <= o.steps; ++s) per_step.push_back(time_seconds([&] {
    step(s);
    e.wait_all();
  }));
  e.profiler().stop();
  const weft::ProfileSummary summary = e.profiler().summarize();
  e.profiler().dump_dot(o.dot_path);
  if (!c.trace_path.empty()) e.profiler().dump(c.trace_path);
  const float loss = 0.5f * (losses[0].item() + losses[1].item());

  weft::Overlap between{devices[0].str(), devices[1].str()};
  for (const weft::Overlap& ov : summary.devices)
    if ((ov.a == devices[0].str() && ov.b == devices[1].str()) || (ov.a == devices[1].str() && ov.b == devices[0].str()))
      between = ov;
  const std::string hw = hardware(e);
  if (!c.quiet) {
    std::printf("6. Data parallel over %s and %s, master weights on %s\n   (%s)\n\n", devices[0].str().c_str(),
                devices[1].str().c_str(), host.str().c_str(), hw.c_str());
    Table t({"MLP " + std::to_string(o.inputs) + " -> " + std::to_string(o.hidden) + " -> 10, batch " +
                 std::to_string(o.batch_size),
             "value"});
    t.row({"time per step (median of " + std::to_string(o.steps) + ")", ms(median(per_step))});
    t.row({devices[0].str() + " busy", fixed(between.a_ms, 3) + " ms"});
    t.row({devices[1].str() + " busy", fixed(between.b_ms, 3) + " ms"});
    t.row({"both busy at once", fixed(between.both_ms, 3) + " ms"});
    t.row({"device overlap (both / shorter)", fixed(between.efficiency, 2)});
    t.row({"loss after the last step", fixed(loss, 5)});
    t.print();
    std::printf(" dependency graph: %s (render: dot -Tsvg %s -o graph.svg)%s%s\n", o.dot_path.c_str(),
                o.dot_path.c_str(), c.trace_path.empty() ? "" : "; timeline: ", c.trace_path.c_str());
    std::printf("%s", summary.table().c_str());
  }
  return {{"demo", "multidevice"},
          {"hardware", hw},
          {"devices", {host.str(), devices[0].str(), devices[1].str()}},
          {"gpu_backend", setup.gpu_backend},
          {"steps", o.steps},
          {"step_ms", median(per_step) * 1e3},
          {"device_a_busy_ms", between.a_ms},
          {"device_b_busy_ms", between.b_ms},
          {"both_busy_ms", between.both_ms},
          {"device_overlap", between.efficiency},
          {"loss", loss},
          {"dot", o.dot_path}};
}

}  // namespace weft::demo
