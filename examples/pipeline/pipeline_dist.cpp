// weft-pipeline --dist (pipeline_dist.h): the process grid from
// Communicator::split, a Pipeline over each replica's ranks whose gradients
// are averaged over each stage's replicas, synthetic data (the same on every
// rank; replica r trains rows [r * batch, (r + 1) * batch)), and the figures
// gathered on rank 0: samples/s, the bubble per stage (each rank's own
// trace), peak bytes, and with --check the largest difference of any
// parameter from the unpipelined model trained on every replica's rows.
#include "pipeline_dist.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "weft/checkpoint.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"
#include "weft/optim.h"
#include "weft/parallel/collectives.h"
#include "weft/parallel/metrics.h"
#include "weft/parallel/pipeline.h"
#include "weft/tensor.h"

namespace weft::examples {

namespace {

namespace par = weft::parallel;
using Clock = std::chrono::steady_clock;

std::unique_ptr<nn::Sequential> make_model(Engine& e, const std::string& name, Device d) {
  return name == "resnet18" ? nn::resnet18(e, d, 0) : nn::lenet(e, d, 0);
}

std::vector<int> even_blocks(int layers, int parts) {
  std::vector<int> out;
  for (int k = 0; k < parts; ++k) out.push_back(layers / parts + (k < layers % parts ? 1 : 0));
  return out;
}

// Every rank's `values` summed (or the largest, with max) on every rank.
std::vector<float> across(const par::Communicator& world, Device d, const std::vector<float>& values,
                          par::ReduceOp op = par::ReduceOp::sum) {
  Engine& e = world.engine();
  Tensor t = Tensor::from_host(e, Shape{static_cast<std::int64_t>(values.size())}, values, d);
  par::allreduce(world, {t}, op, {.name = "weft-pipeline figures"});
  return t.to_host();
}

// This process's stages' tensors, as checkpoint entries: each local layer's
// parameters and buffers, then its stages' optimizer state.
std::vector<checkpoint::Entry> stage_entries(par::Pipeline& pipe, nn::Sequential& net) {
  std::vector<checkpoint::Entry> out;
  for (int k = 0; k < pipe.stages(); ++k) {
    if (!pipe.is_local(k)) continue;
    const auto [first, last] = pipe.layers(k);
    for (int i = first; i < last; ++i) {
      for (nn::Parameter* p : net[static_cast<std::size_t>(i)].parameters()) out.push_back({p->name, p->value});
      for (nn::Buffer* b : net[static_cast<std::size_t>(i)].buffers()) out.push_back({b->name, b->value});
    }
  }
  for (nn::Buffer* b : pipe.optimizer_state()) out.push_back({b->name, b->value});
  return out;
}

}  // namespace

int run_distributed(const DistRun& run) {
  EngineConfig config;
  config.workers_per_cpu_device = 1;
  auto engine = Engine::create(config);
  Engine& e = *engine;
  const Device device = run.device;
  const par::Communicator world = par::Communicator::mpi(e, device);
  const int size = world.size(), me = world.local_ranks().front();
  const int replicas = run.replicas;
  const int stages = run.stages > 0 ? run.stages : size / replicas;
  if (stages * replicas != size) {
    if (me == 0)
      std::fprintf(stderr, "weft-pipeline: %d stages x %d replicas make %d ranks, but the job has %d processes\n",
                   stages, replicas, stages * replicas, size);
    return 2;
  }
  const int stage = me % stages, replica = me / stages;
  // The pipelines: ranks of one replica; the replicas: ranks of one stage.
  std::vector<int> by_replica, by_stage;
  for (int r = 0; r < size; ++r) {
    by_replica.push_back(r / stages);
    by_stage.push_back(r % stages);
  }
  const par::Communicator pipeline_ranks = world.split(by_replica);
  std::optional<par::Communicator> replica_group;
  if (replicas > 1) replica_group = world.split(by_stage);

  const bool from_file = std::filesystem::exists(run.schedule);
  const bool interleaved = run.schedule == "interleaved-1f1b";
  const int v = interleaved ? run.virtual_stages : 1;
  const int chunks = run.chunks > 0 ? run.chunks : 2 * stages;
  auto net = make_model(e, run.model, device);
  const int layers = static_cast<int>(net->size());
  par::PipelineOptions options{.chunks = chunks, .virtual_stages = v, .schedule = run.schedule,
                               .ranks = pipeline_ranks, .replicas = replica_group};
  options.optimizer = optim::OptimizerOptions::parse(run.optimizer, 0.01f, "--optimizer");
  options.precision = run.precision;
  if (needs_loss_scaling(run.precision)) options.loss_scaling = par::LossScaling{};
  if (from_file) {
    const par::Schedule file = par::Schedule::from_file(run.schedule);
    options.custom = [file](int, int) { return file; };
    options.virtual_stages = file.virtual_stages;
  }
  options.balance = even_blocks(layers, stages * options.virtual_stages);
  par::Pipeline pipe(e, *net, options);
  const std::string schedule_name = pipe.schedule().name;

  // The plan a checkpoint must match to be resumed (the same grid).
  const checkpoint::Metadata plan{{"weft.model", "pipeline-" + run.model},
                                  {"weft.stages", std::to_string(stages)},
                                  {"weft.replicas", std::to_string(replicas)},
                                  {"weft.virtual_stages", std::to_string(options.virtual_stages)},
                                  {"weft.chunks", std::to_string(chunks)},
                                  {"weft.schedule", schedule_name},
                                  {"weft.batch", std::to_string(run.batch)},
                                  {"weft.optimizer", pipe.options().optimizer.str()},
                                  {"weft.precision", std::string(to_string(run.precision))}};
  // The job trains steps 0 .. run.steps (step 0 the warm-up); `start` of them
  // are done already when resuming.
  const int total = run.steps + 1;
  int start = 0;
  if (!run.resume.empty()) {
    try {
      std::filesystem::path from = run.resume;
      if (!std::filesystem::exists(from / "index.json")) from = checkpoint::latest(from);
      const checkpoint::Reader reader = checkpoint::Reader::open(from);
      const checkpoint::Metadata& meta = reader.metadata();
      for (const char* key : {"weft.model", "weft.stages", "weft.replicas", "weft.virtual_stages", "weft.schedule",
                              "weft.chunks", "weft.batch", "weft.optimizer", "weft.precision"}) {
        const std::string& want = plan.at(key);
        const auto found = meta.find(key);
        const bool precision = std::string_view(key) == "weft.precision";
        if (found == meta.end() && !precision)
          throw InvalidArgument("checkpoint '" + reader.path().string() + "' has no '" + key +
                                "' in its metadata (not a checkpoint of weft-pipeline --dist)");
        // Checkpoints from before --precision were trained in fp32.
        const std::string saved = found == meta.end() ? "fp32" : found->second;
        if (saved != want)
          throw InvalidArgument("checkpoint '" + reader.path().string() + "' was saved with " + key + " " + saved +
                                ", this run has " + want + " (resume on the same grid and plan)");
      }
      const auto steps_saved = meta.find("weft.steps");
      if (steps_saved == meta.end())
        throw InvalidArgument("checkpoint '" + reader.path().string() + "' has no 'weft.steps' in its metadata");
      start = std::stoi(steps_saved->second);
      if (start >= total)
        throw InvalidArgument("checkpoint '" + reader.path().string() + "' is at step " + std::to_string(start) +
                              " already; --steps " + std::to_string(run.steps) + " trains " + std::to_string(total) +
                              " steps (a warm-up and " + std::to_string(run.steps) + " timed)");
      checkpoint::load(reader, stage_entries(pipe, *net), {.strict = false});
      e.wait_all();
      if (me == 0 && !run.json)
        std::printf("resumed from %s: step %d of %d\n", reader.path().c_str(), start, total);
    } catch (const InvalidArgument& err) {
      std::fflush(stdout);
      if (me == 0)  // (every rank reads the same checkpoint and refuses it alike)
        std::fprintf(stderr, "weft-pipeline: cannot resume from '%s': %s\n", run.resume.c_str(), err.what());
      return 2;
    }
  }
  // --checkpoint: replica 0 of each stage writes that stage's shard; the
  // job is its run directory's only writer (stage 0 takes the lock before
  // any stage can run a save).
  if (!run.checkpoint.empty() && me == 0) {
    try {
      checkpoint::lock_run(run.checkpoint);
    } catch (const InvalidArgument& err) {
      std::fprintf(stderr, "weft-pipeline: --checkpoint %s: %s\n", run.checkpoint.c_str(), err.what());
      return 2;
    }
  }
  std::optional<checkpoint::PendingSave> saving;
  auto save = [&](int done) {
    if (run.checkpoint.empty() || replica != 0) return;
    if (saving) saving->wait();
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", done);
    checkpoint::Metadata meta = plan;
    meta["weft.steps"] = std::to_string(done);
    const std::filesystem::path run_dir = run.checkpoint;
    saving = checkpoint::save(e, run_dir / name, stage_entries(pipe, *net),
                              {.rank = stage, .ranks = stages, .metadata = std::move(meta), .run_dir = run_dir});
  };

  // Synthetic data: the same global batch on every rank.
  const std::int64_t rows = run.batch, global = rows * replicas;
  std::vector<std::int64_t> dims{global, 1, 28, 28};
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(Shape(dims).numel())), y(static_cast<std::size_t>(global));
  for (float& value : x) value = u(gen);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i % 10);
  const Tensor all_x = Tensor::from_host(e, Shape(dims), x, device);
  const Tensor all_y = Tensor::from_host(e, Shape{global}, y, device);
  const Tensor my_x = ops::slice_rows(all_x, replica * rows, (replica + 1) * rows);
  const Tensor my_y = ops::slice_rows(all_y, replica * rows, (replica + 1) * rows);

  if (me == 0 && !run.json)
    std::printf("weft-pipeline --dist: %s, %d stages x %d replicas on %d processes, schedule %s (%d virtual "
                "stages), %d micro-batches of a %lld-row batch per replica\n",
                run.model.c_str(), stages, replicas, size, schedule_name.c_str(), options.virtual_stages, chunks,
                static_cast<long long>(rows));
  const float lr = pipe.options().optimizer.lr;
  auto one_step = [&](int step, bool print) {
    const Tensor loss = pipe.train_step(my_x, my_y);
    pipe.step(lr);
    const int done = step + 1;
    if (!run.checkpoint.empty() && (done == total || (run.checkpoint_every > 0 && done % run.checkpoint_every == 0)))
      save(done);
    // The mean loss over the replicas, from each replica's last stage.
    const float mine = loss.defined() ? loss.item() : 0.0f;
    const float mean = across(world, device, {mine})[0] / static_cast<float>(replicas);
    e.wait_all();
    if (print && me == 0 && !run.json) std::printf("  step %d  loss %.4f\n", step, mean);
  };
  one_step(start, true);  // warm-up (the first step not yet trained, when resuming)
  e.allocator(device).reset_peak();
  e.profiler().clear();
  e.profiler().start();
  const auto t0 = Clock::now();
  for (int s = start + 1; s < total; ++s) one_step(s, true);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const int timed = total - start - 1;
  e.profiler().stop();
  if (saving) saving->wait();  // a failed write fails the run
  // Per stage: this rank's bubble from its own trace; the mean over replicas.
  const std::vector<double> bubble = par::measured_bubble(e.profiler().spans(), stages);
  std::vector<float> per_stage(static_cast<std::size_t>(stages), 0.0f);
  per_stage[static_cast<std::size_t>(stage)] = static_cast<float>(bubble[static_cast<std::size_t>(stage)]) / static_cast<float>(replicas);
  per_stage = across(world, device, per_stage);
  std::vector<float> peaks(static_cast<std::size_t>(size), 0.0f);
  peaks[static_cast<std::size_t>(me)] = static_cast<float>(memory_stats(e, device).peak_in_use);
  peaks = across(world, device, peaks);
  const float slowest = across(world, device, {static_cast<float>(secs)}, par::ReduceOp::max)[0];

  // --check: the unpipelined model on every replica's rows, the same steps.
  double max_diff = -1;
  if (run.check) {
    auto ref = make_model(e, run.model, device);
    ref->set_precision(run.precision);
    optim::Optimizer ref_optimizer(ref->parameters(), pipe.options().optimizer);
    // The same loss scaler as the pipeline's (GradScaler's rules).
    const std::optional<par::LossScaling>& ls = pipe.options().loss_scaling;
    Tensor scale, growth, skipped;
    if (ls) {
      scale = Tensor::full(e, Shape{1}, ls->init_scale, device);
      growth = Tensor::zeros(e, Shape{1}, device);
      skipped = Tensor::zeros(e, Shape{1}, device);
    }
    for (int s = 0; s < total; ++s) {  // every step, those before a resume too
      const Tensor out = ref->forward(all_x);
      Tensor g = ops::softmax_cross_entropy(out.dtype() == DType::float32 ? out : ops::cast(out, DType::float32), all_y).dlogits;
      if (ls) g = ops::scale_by(g, scale);
      ref->backward(g.dtype() == out.dtype() ? g : ops::cast(g, out.dtype()));
      if (!ls) {
        ref_optimizer.step(lr);
        continue;
      }
      std::vector<Tensor> grads;
      for (nn::Parameter* p : ref->parameters()) grads.push_back(p->grad);
      const Tensor found = ops::unscale_and_check(grads, scale);
      ref_optimizer.step(lr, {.skip = {found}});
      ops::update_loss_scale(scale, growth, skipped, found, ls->rule);
    }
    float worst = 0;
    for (int k = 0; k < pipe.stages(); ++k) {
      if (!pipe.is_local(k)) continue;
      const auto [first, last] = pipe.layers(k);
      for (int i = first; i < last; ++i) {
        const auto got = (*net)[static_cast<std::size_t>(i)].parameters();
        const auto want = (*ref)[static_cast<std::size_t>(i)].parameters();
        for (std::size_t j = 0; j < got.size(); ++j) {
          const std::vector<float> a = got[j]->value.to_host(), b = want[j]->value.to_host();
          for (std::size_t q = 0; q < a.size(); ++q)
            worst = std::max(worst, std::abs(a[q] - b[q]) / std::max(1.0f, std::abs(b[q])));
        }
      }
    }
    max_diff = across(world, device, {worst}, par::ReduceOp::max)[0];
  }
  if (me != 0) return 0;
  double mean_bubble = 0;
  for (float b : per_stage) mean_bubble += b / stages;
  const double predicted = from_file ? pipe.schedule().bubble()
                                     : par::predicted_bubble(schedule_name, stages, chunks, options.virtual_stages);
  const double samples_per_sec = timed > 0 ? static_cast<double>(global) * timed / slowest : 0.0;
  const double step_ms = timed > 0 ? slowest * 1e3 / timed : 0.0;
  std::string peak_json, bubble_json;
  for (int r = 0; r < size; ++r) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s\"rank %d\":%lld", r ? "," : "", r,
                  static_cast<long long>(peaks[static_cast<std::size_t>(r)]));
    peak_json += buf;
  }
  for (int k = 0; k < stages; ++k) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4f", k ? "," : "", per_stage[static_cast<std::size_t>(k)]);
    bubble_json += buf;
  }
  if (run.json) {
    std::printf("{\"sweep\":\"dist\",\"model\":\"%s\",\"precision\":\"%s\",\"schedule\":\"%s\",\"stages\":%d,\"virtual_stages\":%d,"
                "\"chunks\":%d,\"ranks\":%d,\"replicas\":%d,\"batch\":%lld,\"samples_per_sec\":%.4f,\"step_ms\":%.4f,"
                "\"bubble_measured\":%.4f,\"bubble_per_stage\":[%s],\"bubble_predicted\":%.4f,\"peak_bytes\":{%s}%s}\n",
                run.model.c_str(), std::string(to_string(run.precision)).c_str(), schedule_name.c_str(), stages, options.virtual_stages, chunks, size, replicas,
                static_cast<long long>(global), samples_per_sec, step_ms, mean_bubble,
                bubble_json.c_str(), predicted, peak_json.c_str(),
                max_diff >= 0 ? (",\"max_diff\":" + std::to_string(max_diff)).c_str() : "");
  } else {
    std::printf("  %.1f samples/s, %.1f ms/step; bubble per stage [%s], mean %.3f (theory %.3f)\n", samples_per_sec,
                step_ms, bubble_json.c_str(), mean_bubble, predicted);
    if (max_diff >= 0) std::printf("  largest difference from one device on all %lld rows: %.2e\n",
                                   static_cast<long long>(global), max_diff);
  }
  std::fflush(stdout);
  // Half precisions round each micro-batch's activations and gradients
  // apart from the whole batch's.
  const double tolerance = run.precision == Precision::bf16 || run.precision == Precision::fp16 ? 1e-3 : 1e-5;
  if (max_diff > tolerance) {
    std::fprintf(stderr, "weft-pipeline: --check: the pipelined model differs from one device by %.2e (more than %.0e)\n",
                 max_diff, tolerance);
    return 1;
  }
  return 0;
}

}  // namespace weft::examples
