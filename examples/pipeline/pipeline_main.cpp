// weft-pipeline: pipeline-parallelism experiments on LeNet and ResNet-18
// split over a device list (CPU devices, simulated or real GPUs), with
// weft::parallel::Pipeline:
//   1. plain model parallelism (one micro-batch) vs the pipeline (M = 4K);
//   2. a micro-batch sweep, the bubble measured from the trace beside
//      (K - 1) / (M + K - 1);
//   3. the balance: naive even split vs by time vs by memory;
//   4. GPipe vs 1F1B, with and without recomputation: peak memory per device;
//   5. on GPUs, the largest batch that fits, with and without recomputation
//      (simulated GPUs have a capacity: WEFT_SIM_GPU_MEMORY);
//   6. the schedules (GPipe, 1F1B, ZB-H1, interleaved 1F1B, or files) at
//      M = K, 2K and 4K: bubble measured vs theory, peak memory, throughput.
// --dist runs one pipeline rank per MPI process instead (pipeline_dist.h),
// with --replicas for pipeline x data parallelism.
// Synthetic data (the throughput, bubble and memory do not depend on it).
// Each configuration: a warm-up step, then --steps timed steps, each
// flushed (wait_all) so steps do not overlap. --sim-model runs the sweeps on
// simulated GPUs whose kernels take modeled time (examples/common/sim_mode.h):
// times are then predictions, with each GPU stream's utilization, the
// compute/copy overlap and the host's share per configuration.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "arg_cursor.h"
#include "device_list.h"
#include "pipeline_dist.h"
#include "sim_mode.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/ops.h"
#include "weft/optim.h"
#include "weft/parallel/metrics.h"
#include "weft/parallel/pipeline.h"
#include "weft/tensor.h"

namespace {

namespace nn = weft::nn;
namespace par = weft::parallel;
using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using weft::examples::ArgCursor;
using weft::examples::UsageError;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string models = "all";  // lenet, resnet18, all (both), dense
  std::int64_t width = 1024;    // dense: features per layer
  std::vector<int> stage_counts;  // sweep 6: stage counts (default: the devices)
  std::string devices = "cpu:0,cpu:1";
  std::int64_t lenet_batch = 256, resnet_batch = 64;
  int steps = 3;
  int kernel_threads = 1;
  bool quick = false, json = false;
  std::string trace;
  std::string sweeps = "123456";  // which of the six experiments
  std::vector<std::string> schedules = {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b"};  // sweep 6
  int virtual_stages = 2;  // interleaved-1f1b
  int chunks = 0;          // --dist: micro-batches (0: 2 x stages)
  int stages = 0, replicas = 1;  // --dist
  bool dist = false, check = false;
  std::string optimizer = "sgd";  // --dist
  std::string checkpoint, resume;  // --dist
  int checkpoint_every = 0;        // --dist
  bool devices_given = false;
  weft::Precision precision = weft::Precision::fp32;  // the pipelines' PipelineOptions::precision
  weft::examples::SimFlags sim;
  bool wants(char sweep) const { return sweeps.find(sweep) != std::string::npos; }
};

void usage(std::FILE* out) {
  std::fprintf(out,
               "weft-pipeline: pipeline parallelism (GPipe, 1F1B) on LeNet and ResNet-18 over a device list\n"
               "\n"
               "usage: weft-pipeline [options]\n"
               "  --models M         lenet, resnet18, all (the two; default) or dense: 16 Dense(W, W) layers,\n"
               "                     whose forward, input and weight gradients cost the same (--width W,\n"
               "                     default 1024; its batch is --batch-size)\n"
               "  --devices D,...    one device per stage (default cpu:0,cpu:1; gpu:0,gpu:1 with\n"
               "                     WEFT_GPU_BACKEND=sim for simulated GPUs)\n"
               "  --batch-size N     LeNet's batch (default 256); ResNet-18's is --resnet-batch-size (default 64)\n"
               "  --resnet-batch-size N\n"
               "  --steps N          timed steps per configuration (default 3)\n"
               "  --kernel-threads N threads each CPU kernel may use (default 1: a stage on a CPU device\n"
               "                     is one core, so K stages need K cores to overlap)\n"
               "  --quick            a reduced sweep (under a minute on two cores)\n"
               "  --sweeps LIST      which experiments, e.g. 24 (default 123456: all six above)\n"
               "  --schedules L,...  sweep 6's schedules: gpipe, 1f1b, zb-h1, interleaved-1f1b or a schedule\n"
               "                     file (default all four names); with --dist, the first is run\n"
               "  --virtual-stages V model chunks per device for interleaved-1f1b (default 2)\n"
               "  --stage-counts K,...  sweep 6 over the first K devices for each K (default: all of them)\n"
               "  --dist             one pipeline rank per MPI process (under mpirun): --stages S (default:\n"
               "                     the processes / replicas), --replicas R (pipeline x data parallel:\n"
               "                     S x R processes), --chunks M (default 2S), --batch-size per replica,\n"
               "                     --models lenet or resnet18, --check (compare with one device, trained\n"
               "                     all the steps), --optimizer sgd (default), momentum, adam or adamw\n"
               "  --checkpoint DIR   with --dist: each stage's process saves its stage's parameters and\n"
               "                     optimizer state as its shard of DIR/step-<steps> after the last step\n"
               "                     (and every --checkpoint-every N steps); DIR/latest names the newest\n"
               "  --precision P      fp32 (default), tf32, bf16 or fp16 (PipelineOptions::precision; fp16\n"
               "                     with dynamic loss scaling), also with --dist\n"
               "  --resume DIR       with --dist: continue from DIR's newest checkpoint (or DIR itself, a\n"
               "                     checkpoint) on the same grid and plan; the warm-up and --steps count\n"
               "                     from the job's start, the steps already trained are not run again\n"
               "  --trace PREFIX     write traces of the first model's pipelined step: PREFIX-gpipe.json\n"
               "                     (sweep 1, M = 4K) and PREFIX-1f1b.json (sweep 4, no recomputation), and\n"
               "                     PREFIX-<schedule>-k<K>-m<M>.json for each configuration of sweep 6\n"
               "  --json             one JSON line per configuration instead of the tables\n"
               "%s"
               "  --help             this text\n"
               "\n"
               "JSON keys: sweep, model, precision, schedule, checkpoint, stages, virtual_stages, chunks, ranks,\n"
               "balance, batch, samples_per_sec, step_ms, bubble_measured (mean over stages),\n"
               "bubble_per_stage, bubble_predicted (the schedule's theory), peak_bytes (per device), for\n"
               "the fit sweep max_batch; --dist adds replicas and, with --check, max_diff.\n"
               "\n"
               "With --sim-model (simulated GPUs only, --devices gpu:0,gpu:1 by default; WEFT_GPU_BACKEND=sim\n"
               "unless set so already) step_ms and samples_per_sec are predictions (step_ms: the median\n"
               "step in modeled time), and each line adds sim_model, sim_gpus, nodes, predicted_step_ms,\n"
               "utilization (GPU stream -> busy fraction), comm_overlap (compute vs copies),\n"
               "kernels_modeled, table_hits and fallbacks.\n"
               "Exit status: 0 done, 2 bad arguments, 1 failure.\n",
               weft::examples::sim_flags_help(21).c_str());
}

bool parse(int argc, char** argv, Options& o) {
  ArgCursor args(argc, argv);
  while (args.next()) {
    const std::string arg = args.flag();
    auto number = [&](long long lo, long long hi) {
      const std::optional<long long> v = args.int_value(lo, hi);
      if (!v) throw UsageError{arg + " wants a whole number from " + std::to_string(lo) + " to " + std::to_string(hi)};
      return *v;
    };
    auto text = [&] {
      std::optional<std::string> v = args.value();
      if (!v || v->empty()) throw UsageError{arg + " needs a value"};
      return *v;
    };
    auto flag = [&] {
      if (args.has_inline_value()) throw UsageError{arg + " takes no value"};
    };
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return false;
    } else if (arg == "--models") {
      o.models = text();
      if (o.models != "lenet" && o.models != "resnet18" && o.models != "all" && o.models != "dense")
        throw UsageError{"--models wants lenet, resnet18, all or dense, got '" + o.models + "'"};
    } else if (arg == "--width") {
      o.width = number(1, 1 << 16);
    } else if (arg == "--stage-counts") {
      const std::string list = text();
      for (const std::string& item : ArgCursor::split_list(list)) {
        const std::optional<long long> k = ArgCursor::parse_int(item, 1, 4096);
        if (!k) throw UsageError{"--stage-counts wants whole numbers separated by commas, got '" + list + "'"};
        o.stage_counts.push_back(static_cast<int>(*k));
      }
    } else if (arg == "--devices") {
      o.devices = text();
      o.devices_given = true;
    } else if (arg == "--batch-size") {
      o.lenet_batch = number(1, 1 << 20);
    } else if (arg == "--resnet-batch-size") {
      o.resnet_batch = number(1, 1 << 20);
    } else if (arg == "--steps") {
      o.steps = static_cast<int>(number(1, 1000));
    } else if (arg == "--kernel-threads") {
      o.kernel_threads = static_cast<int>(number(1, 1024));
    } else if (arg == "--quick") {
      flag();
      o.quick = true;
    } else if (arg == "--json") {
      flag();
      o.json = true;
    } else if (arg == "--trace") {
      o.trace = text();
    } else if (arg == "--sweeps") {
      o.sweeps = text();
      if (o.sweeps.find_first_not_of("123456") != std::string::npos)
        throw UsageError{"--sweeps wants digits 1 to 6, got '" + o.sweeps + "'"};
    } else if (arg == "--schedules") {
      o.schedules.clear();
      for (std::string& item : ArgCursor::split_list(text()))
        if (!item.empty()) o.schedules.push_back(std::move(item));
      if (o.schedules.empty()) throw UsageError{"--schedules needs at least one schedule"};
    } else if (arg == "--virtual-stages") {
      o.virtual_stages = static_cast<int>(number(1, 64));
    } else if (arg == "--chunks") {
      o.chunks = static_cast<int>(number(1, 1 << 16));
    } else if (arg == "--stages") {
      o.stages = static_cast<int>(number(1, 4096));
    } else if (arg == "--replicas") {
      o.replicas = static_cast<int>(number(1, 4096));
    } else if (arg == "--dist") {
      flag();
      o.dist = true;
    } else if (arg == "--check") {
      flag();
      o.check = true;
    } else if (arg == "--optimizer") {
      o.optimizer = text();
      try {
        (void)weft::optim::OptimizerOptions::parse(o.optimizer, 0.01f, "--optimizer");
      } catch (const weft::Error& e) {
        throw UsageError{e.what()};
      }
    } else if (arg == "--checkpoint") {
      o.checkpoint = text();
    } else if (arg == "--checkpoint-every") {
      o.checkpoint_every = static_cast<int>(number(1, 1 << 30));
    } else if (arg == "--resume") {
      o.resume = text();
    } else if (arg == "--precision") {
      try {
        o.precision = weft::parse_precision(text(), "--precision");
      } catch (const weft::Error& e) {
        throw UsageError{e.what()};
      }
    } else if (!o.sim.parse(args)) {
      throw UsageError{"unknown argument '" + arg + "'"};
    }
  }
  o.sim.check();
  if (o.sim.on && !o.devices_given) o.devices = "gpu:0,gpu:1";
  if (!o.dist && (o.stages || o.replicas != 1 || o.chunks || o.check || o.optimizer != "sgd" ||
                  !o.checkpoint.empty() || o.checkpoint_every || !o.resume.empty()))
    throw UsageError{"--stages, --replicas, --chunks, --check, --optimizer, --checkpoint, --checkpoint-every and "
                     "--resume go with --dist"};
  if (o.checkpoint_every && o.checkpoint.empty()) throw UsageError{"--checkpoint-every needs --checkpoint DIR"};
  if (o.dist && o.sim.on) throw UsageError{"--dist runs on real devices (CPU or a GPU per process), not --sim-model"};
  if (o.dist && o.models != "lenet" && o.models != "resnet18") o.models = "lenet";
  return true;
}

// ---- models and data --------------------------------------------------------

struct Model {
  std::string name;
  std::function<std::unique_ptr<nn::Sequential>(Engine&, Device)> make;
  std::vector<std::int64_t> example;  // one input's shape
  std::int64_t batch = 0;
  weft::Precision precision = weft::Precision::fp32;  // how the pipelines (and the balance probes) compute
};

// Dynamic loss scaling where the precision needs it (fp16).
std::optional<par::LossScaling> loss_scaling_for(weft::Precision p) {
  if (!weft::needs_loss_scaling(p)) return std::nullopt;
  return par::LossScaling{};
}

struct Batch {
  Tensor x, y;
};

Batch synthetic(Engine& e, const Model& m, std::int64_t rows, Device device = Device::cpu(0)) {
  std::vector<std::int64_t> dims{rows};
  dims.insert(dims.end(), m.example.begin(), m.example.end());
  const Shape shape(dims);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(shape.numel())), y(static_cast<std::size_t>(rows));
  for (float& v : x) v = u(gen);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i % 10);
  return {Tensor::from_host(e, shape, x, device), Tensor::from_host(e, Shape{rows}, y, device)};
}

// ---- one configuration ----------------------------------------------------------

struct Config {
  std::string sweep;
  std::vector<int> balance;
  std::string balance_by;  // even, time, size
  int chunks = 1;
  std::string schedule = "gpipe";
  par::Checkpoint checkpoint = par::Checkpoint::never;
  std::int64_t batch = 0;
  int virtual_stages = 1;
};

// A schedule name, or else a file (Schedule::from_file).
bool is_schedule_file(const std::string& schedule) {
  return schedule != "gpipe" && schedule != "1f1b" && schedule != "zb-h1" && schedule != "interleaved-1f1b" &&
         schedule != "one_f_one_b";
}

// The theory of the configuration's schedule with equal forward, input and
// weight gradient times; a file's lists simulated at those times.
double theory(const Config& c, int stages) {
  if (is_schedule_file(c.schedule)) return par::Schedule::from_file(c.schedule).bubble();
  return par::predicted_bubble(c.schedule, stages, c.chunks, c.virtual_stages);
}

struct Result {
  double samples_per_sec = 0, step_ms = 0;
  std::vector<double> bubble;
  std::vector<std::size_t> peak;
  std::optional<weft::examples::SimPrediction> sim;  // under --sim-model
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

Result run(Engine& e, const Model& m, const std::vector<Device>& devices, const Config& c, int steps,
           const std::string& trace = "") {
  auto net = m.make(e, devices[0]);
  par::PipelineOptions options{.balance = c.balance, .devices = devices, .chunks = c.chunks,
                               .virtual_stages = c.virtual_stages, .checkpoint = c.checkpoint, .schedule = c.schedule};
  options.precision = m.precision;
  options.loss_scaling = loss_scaling_for(m.precision);
  if (is_schedule_file(c.schedule)) {
    const par::Schedule file = par::Schedule::from_file(c.schedule);
    options.custom = [file](int, int) { return file; };
    options.virtual_stages = file.virtual_stages;
  }
  par::Pipeline pipe(e, *net, options);
  const Batch b = synthetic(e, m, c.batch);
  auto one_step = [&] {
    pipe.train_step(b.x, b.y).wait_to_read();
    pipe.step(0.01f);
    e.wait_all();
  };
  one_step();  // warm-up: caches, allocators, cuDNN plans
  for (Device d : devices) e.allocator(d).reset_peak();
  Result r;
  if (weft::gpu::kernels_modeled()) {
    // Each step timed on its own: the median, on the modeled timeline.
    weft::examples::SimMeasure measure(e);
    measure.begin();
    for (int s = 0; s < steps; ++s) measure.step(one_step);
    r.sim = measure.end();
    r.step_ms = r.sim->predicted_step_ms;
    r.samples_per_sec = r.step_ms > 0 ? static_cast<double>(c.batch) * 1e3 / r.step_ms : 0.0;
  } else {
    e.profiler().clear();
    e.profiler().start();
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) one_step();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    e.profiler().stop();
    r.step_ms = secs * 1e3 / steps;
    r.samples_per_sec = static_cast<double>(c.batch) * steps / secs;
  }
  if (!trace.empty()) e.profiler().dump(trace);
  r.bubble = par::measured_bubble(e.profiler().spans(), pipe.ranks());
  // The bubble per step: the measurement spans all timed steps, and the
  // flush between steps is idle time of every stage, as within a step.
  for (Device d : devices) r.peak.push_back(weft::memory_stats(e, d).peak_in_use);
  return r;
}

// "a<sep>b<sep>c" of the items as text.
template <class T, class F>
std::string joined(const std::vector<T>& items, const char* sep, F text) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += text(i, items[i]);
  }
  return out;
}

std::string balance_str(const std::vector<int>& b) {
  std::string out = "[";
  out += joined(b, ",", [](std::size_t, int v) { return std::to_string(v); });
  out += "]";
  return out;
}

std::string fixed(double v, const char* format = "%.3f") {
  char buf[48];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string bubbles_str(const std::vector<double>& b) {
  return joined(b, " ", [](std::size_t, double v) { return fixed(v); });
}

// A schedule's name in tables: a file's name without directory and extension.
std::string schedule_label(const std::string& schedule) {
  return is_schedule_file(schedule) ? std::filesystem::path(schedule).stem().string() : schedule;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

class Report {
 public:
  Report(bool json, std::vector<Device> devices) : json_(json), devices_(std::move(devices)) {}

  void title(const std::string& text) {
    if (!json_) std::printf("\n%s\n", text.c_str());
  }
  void header(const std::string& text) {
    if (!json_) std::printf("%s\n", text.c_str());
  }
  void row(const std::string& text) {
    if (!json_) std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
  void json(const Model& m, const Config& c, const Result& r, const std::string& extra = "") {
    if (!json_) {
      if (r.sim) {
        // The busiest GPU stream stands for the utilization in the table.
        const auto busiest = std::max_element(r.sim->utilization.begin(), r.sim->utilization.end(),
                                              [](const auto& a, const auto& b) { return a.second < b.second; });
        std::printf("           modeled: compute/copy overlap %.2f%s%s\n", r.sim->comm_overlap,
                    busiest == r.sim->utilization.end() ? "" : (", busiest " + busiest->first).c_str(),
                    busiest == r.sim->utilization.end() ? "" : (" " + fixed(busiest->second, "%.2f")).c_str());
        std::fflush(stdout);
      }
      return;
    }
    std::string bubbles = "[", peaks = "{";
    bubbles += joined(r.bubble, ",", [](std::size_t, double v) { return num(v); });
    peaks += joined(r.peak, ",", [&](std::size_t i, std::size_t v) {
      std::string entry = "\"";
      entry += devices_[i].str();
      entry += "\":";
      entry += std::to_string(v);
      return entry;
    });
    std::printf(
        "{\"sweep\":\"%s\",\"model\":\"%s\",\"precision\":\"%s\",\"schedule\":\"%s\",\"checkpoint\":\"%s\",\"stages\":%zu,"
        "\"virtual_stages\":%d,\"chunks\":%d,\"ranks\":1,\"balance\":%s,\"balance_by\":\"%s\",\"batch\":%lld,\"samples_per_sec\":%s,\"step_ms\":%s,"
        "\"bubble_measured\":%s,\"bubble_per_stage\":%s],\"bubble_predicted\":%s,\"peak_bytes\":%s}%s%s}\n",
        c.sweep.c_str(), m.name.c_str(), std::string(weft::to_string(m.precision)).c_str(), schedule_label(c.schedule).c_str(),
        std::string(par::to_string(c.checkpoint)).c_str(), devices_.size(), c.virtual_stages, c.chunks,
        balance_str(c.balance).c_str(), c.balance_by.c_str(),
        static_cast<long long>(c.batch), num(r.samples_per_sec).c_str(), num(r.step_ms).c_str(),
        num(mean(r.bubble)).c_str(), bubbles.c_str(),
        num(theory(c, static_cast<int>(devices_.size()))).c_str(), peaks.c_str(),
        r.sim ? r.sim->json().c_str() : "", extra.c_str());
    std::fflush(stdout);
  }
  void set_devices(std::vector<Device> devices) { devices_ = std::move(devices); }
  std::string peaks(const Result& r) const {
    return joined(r.peak, " / ", [](std::size_t, std::size_t v) { return mib(v); });
  }

 private:
  static std::string num(double v) { return fixed(v, "%.4f"); }
  bool json_;
  std::vector<Device> devices_;
};

// The rows of a batch's largest micro-batch (Pipeline gives the first
// rows % chunks micro-batches one row more).
std::int64_t micro_rows(std::int64_t batch, int chunks) {
  return std::max<std::int64_t>(1, (batch + chunks - 1) / chunks);
}

std::vector<int> even_split(int layers, int stages) {
  std::vector<int> out;
  for (int k = 0; k < stages; ++k) out.push_back(layers / stages + (k < layers % stages ? 1 : 0));
  return out;
}

// The largest batch (a power of two, then bisected) whose step trains
// without running out of device memory, each attempt on a fresh engine.
std::int64_t largest_batch(const Model& m, const std::vector<Device>& devices, const std::vector<int>& balance,
                           par::Checkpoint cp, int chunks, std::int64_t limit) {
  auto fits = [&](std::int64_t batch) {
    weft::EngineConfig config;
    for (Device d : devices)
      if (d.is_cpu()) config.cpu_devices = std::max(config.cpu_devices, d.index() + 1);
    auto e = Engine::create(config);
    try {
      auto net = m.make(*e, devices[0]);
      const int micro = static_cast<int>(std::min<std::int64_t>(chunks, batch));
      par::Pipeline pipe(*e, *net, {.balance = balance, .devices = devices, .chunks = micro, .checkpoint = cp,
                                    .precision = m.precision, .loss_scaling = loss_scaling_for(m.precision)});
      const Batch b = synthetic(*e, m, batch);
      pipe.train_step(b.x, b.y).wait_to_read();
      e->wait_all();
      return true;
    } catch (const weft::OutOfMemory&) {
      try {
        e->wait_all();
      } catch (...) {
      }
      return false;
    }
  };
  std::int64_t lo = 0, hi = 1;
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > limit) return lo;
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

void sweep_model(const Options& o, Engine& e, const Model& m, const std::vector<Device>& devices, Report& rep,
                 bool first_model) {
  const int k_count = static_cast<int>(devices.size());
  auto probe = m.make(e, devices[0]);
  probe->set_precision(m.precision);
  const int layers = static_cast<int>(probe->size());
  if (layers < k_count)
    throw weft::InvalidArgument(m.name + " has " + std::to_string(layers) + " layers, fewer than the " +
                                std::to_string(k_count) + " stages");
  const int steps = o.quick ? std::max(1, o.steps - 1) : o.steps;
  const int pipelined_chunks = static_cast<int>(std::min<std::int64_t>(4 * k_count, m.batch));
  const bool heavy = m.name == "resnet18";
  std::vector<int> chunk_sweep = {1, 2, 4, 8, 16, 32};
  if (o.quick) chunk_sweep = heavy ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8};
  // Balance by time (on the first device) at the micro-batch each
  // configuration runs, by memory, and the naive even split. A layer's share
  // of the time depends on its rows (ResNet-18's last blocks weigh about
  // twice as much against the first ones at two rows as at sixteen), so a
  // split timed on the whole batch leaves a pipeline of small micro-batches
  // with one stage idle half the time.
  std::map<std::int64_t, std::vector<int>> by_time_at;  // micro-batch rows -> balance
  auto by_time = [&](int chunks) { return by_time_at.at(micro_rows(m.batch, chunks)); };
  {
    std::vector<int> chunk_counts = chunk_sweep;
    chunk_counts.push_back(pipelined_chunks);
    for (int chunks : chunk_counts) {
      const std::int64_t rows = micro_rows(m.batch, chunks);
      if (chunks > m.batch || by_time_at.count(rows)) continue;
      const Batch sample = synthetic(e, m, rows, devices[0]);
      by_time_at[rows] = par::balance_by_time(*probe, sample.x, k_count, 3);
    }
  }
  std::vector<std::int64_t> dims{m.batch};
  dims.insert(dims.end(), m.example.begin(), m.example.end());
  const std::vector<int> by_size = par::balance_by_size(*probe, Shape(dims), k_count);
  const std::vector<int> even = even_split(layers, k_count);
  probe.reset();
  e.wait_all();

  if (!o.json)
    std::printf("\n== %s, batch %lld, %d stages on %s; balance by time (M = %d) %s, by size %s, even %s ==\n",
                m.name.c_str(), static_cast<long long>(m.batch), k_count, weft::examples::device_list_str(devices).c_str(),
                pipelined_chunks, balance_str(by_time(pipelined_chunks)).c_str(), balance_str(by_size).c_str(), balance_str(even).c_str());

  // 1. Model parallelism vs the pipeline.
  if (o.wants('1')) {
  rep.title("1. plain model parallelism (one micro-batch) vs pipelined (M = 4K), GPipe, balance by time");
  rep.header("   chunks  samples/s   ms/step  bubble measured / predicted");
  double base = 0;
  for (int chunks : {1, pipelined_chunks}) {
    const Config c{"model_parallel", by_time(chunks), "time", chunks, "gpipe", par::Checkpoint::never, m.batch};
    const Result r = run(e, m, devices, c, steps, chunks > 1 && first_model && !o.trace.empty() ? o.trace + "-gpipe.json" : "");
    if (chunks == 1) base = r.samples_per_sec;
    const std::string speedup = chunks > 1 ? "   (speed-up " + fixed(r.samples_per_sec / base, "%.2f") + "x)" : "";
    char line[160];
    std::snprintf(line, sizeof line, "   %6d  %9.1f  %8.1f  %.3f / %.3f%s", chunks, r.samples_per_sec, r.step_ms,
                  mean(r.bubble), par::predicted_bubble(k_count, chunks), speedup.c_str());
    rep.row(line);
    rep.json(m, c, r);
  }
  }

  // 2. The micro-batch sweep.
  if (o.wants('2')) {
  rep.title("2. micro-batches: bubble per stage from the trace vs (K - 1) / (M + K - 1), GPipe, balance by time");
  rep.header("   chunks  samples/s   ms/step  bubble per stage           mean / predicted");
  for (int chunks : chunk_sweep) {
    if (chunks > m.batch) break;
    const Config c{"chunks", by_time(chunks), "time", chunks, "gpipe", par::Checkpoint::never, m.batch};
    const Result r = run(e, m, devices, c, steps);
    char line[200];
    std::snprintf(line, sizeof line, "   %6d  %9.1f  %8.1f  %-26s %.3f / %.3f", chunks, r.samples_per_sec, r.step_ms,
                  bubbles_str(r.bubble).c_str(), mean(r.bubble), par::predicted_bubble(k_count, chunks));
    rep.row(line);
    rep.json(m, c, r);
  }
  }
  if (o.quick && heavy) return;

  // 3. Balance.
  if (o.wants('3')) {
  rep.title("3. balance: naive even split vs by time vs by memory (GPipe, M = 4K)");
  rep.header("   balance by  layers per stage  samples/s   ms/step  bubble per stage");
  for (const auto& [name, balance] : {std::pair<std::string, std::vector<int>>{"even", even}, {"time", by_time(pipelined_chunks)},
                                      {"size", by_size}}) {
    const Config c{"balance", balance, name, pipelined_chunks, "gpipe", par::Checkpoint::never, m.batch};
    const Result r = run(e, m, devices, c, steps);
    char line[200];
    std::snprintf(line, sizeof line, "   %-10s  %-16s  %9.1f  %8.1f  %s", name.c_str(), balance_str(balance).c_str(),
                  r.samples_per_sec, r.step_ms, bubbles_str(r.bubble).c_str());
    rep.row(line);
    rep.json(m, c, r);
  }
  }

  // 4. Schedules and recomputation: memory.
  if (o.wants('4')) {
  rep.title("4. GPipe vs 1F1B, recomputation: peak allocated MiB per device (M = 4K, balance by time)");
  rep.header("   schedule  checkpoint   samples/s  peak MiB per device");
  for (const char* schedule : {"gpipe", "1f1b"})
    for (par::Checkpoint cp : {par::Checkpoint::never, par::Checkpoint::except_last, par::Checkpoint::always}) {
      const Config c{"memory", by_time(pipelined_chunks), "time", pipelined_chunks, schedule, cp, m.batch};
      const bool traced = first_model && !o.trace.empty() && cp == par::Checkpoint::never && schedule[0] == '1';
      const Result r = run(e, m, devices, c, steps, traced ? o.trace + "-1f1b.json" : "");
      char line[200];
      std::snprintf(line, sizeof line, "   %-8s  %-11s  %9.1f  %s", schedule,
                    std::string(par::to_string(cp)).c_str(), r.samples_per_sec, rep.peaks(r).c_str());
      rep.row(line);
      rep.json(m, c, r);
    }
  }

  // 5. The largest batch that fits (GPUs only: CPU memory has no set limit).
  if (!o.wants('5')) return;
  rep.title("5. largest batch that fits, with and without recomputation (GPipe, M = 4K)");
  bool all_gpus = true;
  for (Device d : devices) all_gpus = all_gpus && d.is_gpu();
  if (!all_gpus) {
    rep.row("   skipped: CPU devices have no memory limit to hit (--devices gpu:0,gpu:1 with WEFT_GPU_BACKEND=sim "
            "and WEFT_SIM_GPU_MEMORY set)");
    return;
  }
  // Each attempt runs on an engine of its own; this one's cached blocks
  // would take the GPUs' memory from them.
  e.wait_all();
  for (Device d : devices) e.allocator(d).release_cached();
  for (par::Checkpoint cp : {par::Checkpoint::never, par::Checkpoint::always}) {
    const std::int64_t most = largest_batch(m, devices, by_time(pipelined_chunks), cp, pipelined_chunks, heavy ? 4096 : 65536);
    char line[120];
    std::snprintf(line, sizeof line, "   checkpoint %-11s largest batch %lld", std::string(par::to_string(cp)).c_str(),
                  static_cast<long long>(most));
    rep.row(line);
    Config c{"fit", by_time(pipelined_chunks), "time", pipelined_chunks, "gpipe", cp, most};
    rep.json(m, c, Result{}, ",\"max_batch\":" + std::to_string(most));
  }
}

// 6. The schedules at M = K, 2K and 4K (quick: 2K), balanced by time over
// every model stage (K x v with interleaving).
void sweep_schedules(const Options& o, Engine& e, const Model& m, const std::vector<Device>& all_devices,
                     Report& rep) {
  if (!o.wants('6') || (o.quick && m.name == "resnet18")) return;
  std::vector<int> stage_counts = o.stage_counts;
  if (stage_counts.empty()) stage_counts = {static_cast<int>(all_devices.size())};
  for (int k_count : stage_counts) {
    if (k_count > static_cast<int>(all_devices.size()))
      throw weft::InvalidArgument("--stage-counts " + std::to_string(k_count) + ": only " +
                                  std::to_string(all_devices.size()) + " devices in --devices");
    const std::vector<Device> devices(all_devices.begin(), all_devices.begin() + k_count);
    rep.set_devices(devices);
    auto probe = m.make(e, devices[0]);
    probe->set_precision(m.precision);
    const int layers = static_cast<int>(probe->size());
    const int steps = o.quick ? std::max(1, o.steps - 1) : o.steps;
    std::vector<int> counts = {k_count, 2 * k_count, 4 * k_count};
    if (o.quick) counts = {2 * k_count};
    // Layer times at each micro-batch size run (see sweep_model).
    std::map<std::int64_t, std::vector<double>> times_at;
    for (int chunks : counts) {
      const std::int64_t rows = micro_rows(m.batch, chunks);
      if (chunks > m.batch || times_at.count(rows)) continue;
      times_at[rows] = par::layer_times(*probe, synthetic(e, m, rows, devices[0]).x, 3);
    }
    if (times_at.empty()) times_at[m.batch] = par::layer_times(*probe, synthetic(e, m, m.batch, devices[0]).x, 3);
    probe.reset();
    e.wait_all();
    rep.title("6. schedules on " + std::to_string(k_count) +
              " stages: bubble measured / theory, peak allocated MiB per device, samples/s (balance by time)");
    rep.header("   schedule           v  chunks  samples/s   ms/step  bubble / theory  peak MiB per device");
    for (const std::string& schedule : o.schedules) {
      const bool file = is_schedule_file(schedule);
      std::optional<par::Schedule> from_file;
      if (file) from_file = par::Schedule::from_file(schedule);
      const int v = file ? from_file->virtual_stages : schedule == "interleaved-1f1b" ? o.virtual_stages : 1;
      if (layers < k_count * v) {
        rep.row("   " + schedule + ": skipped, " + m.name + " has fewer layers than " + std::to_string(k_count * v) +
                " model stages");
        continue;
      }
      for (int chunks : counts) {
        if (file) {
          // A file's lists fix the micro-batch count: the most it names.
          int most = 0;
          for (const auto& list : from_file->stages)
            for (const par::Action& a : list) most = std::max(most, a.micro_batch + 1);
          if (chunks != counts.front()) break;
          chunks = most;
        }
        if (chunks > m.batch) break;
        const auto timed = times_at.lower_bound(micro_rows(m.batch, chunks));  // a file's count: the nearest above
        const std::vector<int> balance =
            par::partition(timed == times_at.end() ? times_at.rbegin()->second : timed->second, k_count * v);
        Config c{"schedules", balance, "time", chunks, schedule, par::Checkpoint::never, m.batch, v};
        const std::string trace = o.trace.empty() ? "" : o.trace + "-" + schedule_label(schedule) + "-k" +
                                                             std::to_string(k_count) + "-m" + std::to_string(chunks) + ".json";
        const Result r = run(e, m, devices, c, steps, trace);
        char line[240];
        std::snprintf(line, sizeof line, "   %-17s %2d  %6d  %9.1f  %8.1f  %.3f / %.3f    %s",
                      schedule_label(schedule).c_str(), v, chunks, r.samples_per_sec, r.step_ms, mean(r.bubble),
                      theory(c, k_count), rep.peaks(r).c_str());
        rep.row(line);
        rep.json(m, c, r);
      }
    }
  }
  rep.set_devices(all_devices);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    if (!parse(argc, argv, o)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "weft-pipeline: %s\nRun 'weft-pipeline --help' for usage.\n", e.message.c_str());
    return 2;
  }
  std::vector<Device> devices;
  try {
    devices = weft::examples::parse_device_list(o.devices);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "weft-pipeline: bad --devices: %s\n", e.what());
    return 2;
  }
  if (o.dist) {
    if (o.devices_given && devices.size() != 1) {
      std::fprintf(stderr, "weft-pipeline: --dist takes one device per process (--devices cpu:0 or gpu:N)\n");
      return 2;
    }
    weft::examples::DistRun run{.model = o.models, .schedule = o.schedules.front(), .stages = o.stages,
                                .replicas = o.replicas, .virtual_stages = o.virtual_stages, .chunks = o.chunks,
                                .batch = o.lenet_batch, .steps = o.steps, .check = o.check, .json = o.json,
                                .device = devices.front(), .optimizer = o.optimizer, .checkpoint = o.checkpoint,
                                .checkpoint_every = o.checkpoint_every, .resume = o.resume, .precision = o.precision};
    if (!o.devices_given) run.device = Device::cpu(0);
    try {
      return weft::examples::run_distributed(run);
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "weft-pipeline: %s\n", e.what());
      return 1;
    }
  }
  if (o.quick) {
    o.lenet_batch = std::min<std::int64_t>(o.lenet_batch, 64);
    o.resnet_batch = std::min<std::int64_t>(o.resnet_batch, 16);
  }
  try {
    weft::EngineConfig config;
    for (Device d : devices)
      if (d.is_cpu()) config.cpu_devices = std::max(config.cpu_devices, d.index() + 1);
    config.workers_per_cpu_device = 1;  // a stage on a CPU device: one worker, like a GPU's stream
    std::unique_ptr<Engine> engine;
    try {
      if (o.sim.on) weft::examples::sim_prepare(devices, config, "--devices");
      engine = Engine::create(config);
    } catch (const weft::InvalidArgument& e) {
      if (!o.sim.on) throw;
      std::fprintf(stderr, "weft-pipeline: %s\n", e.what());
      return 2;
    }
    const auto known = engine->devices();
    for (Device d : devices)
      if (std::find(known.begin(), known.end(), d) == known.end()) {
        std::fprintf(stderr, "weft-pipeline: device %s is not available (this machine has: %s)\n", d.str().c_str(),
                     weft::examples::device_list_str(known).c_str());
        return 2;
      }
    if (o.sim.on) {
      try {
        const weft::gpu::SimModelOptions model = weft::examples::sim_install(o.sim);
        if (!o.json)
          std::printf("modeled: %s, %d simulated GPU(s), %d per node: times are predictions\n", model.model.c_str(),
                      weft::gpu::device_count(), weft::gpu::sim_topology().gpus_per_node);
      } catch (const weft::InvalidArgument& e) {
        std::fprintf(stderr, "weft-pipeline: bad --sim-model: %s\n", e.what());
        return 2;
      }
    }
    weft::ops::set_cpu_kernel_threads(o.kernel_threads);
    Report report(o.json, devices);
    std::vector<Model> models;
    if (o.models == "dense") {
      const std::int64_t w = o.width;
      models.push_back({"dense",
                        [w](Engine& e, Device d) {
                          auto net = std::make_unique<nn::Sequential>();
                          for (int l = 0; l < 16; ++l) net->emplace<nn::Dense>(e, w, w, d, static_cast<std::uint64_t>(l + 1));
                          return net;
                        },
                        {w},
                        o.lenet_batch});
    }
    if (o.models == "lenet" || o.models == "all")
      models.push_back({"lenet", [](Engine& e, Device d) { return nn::lenet(e, d, 0); }, {1, 28, 28}, o.lenet_batch});
    if (o.models == "resnet18" || o.models == "all")
      models.push_back({"resnet18", [](Engine& e, Device d) { return nn::resnet18(e, d, 0); }, {1, 28, 28},
                        o.resnet_batch});
    for (Model& m : models) m.precision = o.precision;
    if (!o.json)
      std::printf("weft-pipeline: %zu stages on %s, %d timed steps per configuration, %d thread(s) per CPU kernel\n",
                  devices.size(), weft::examples::device_list_str(devices).c_str(), o.steps, o.kernel_threads);
    for (std::size_t i = 0; i < models.size(); ++i) {
      sweep_model(o, *engine, models[i], devices, report, i == 0);
      sweep_schedules(o, *engine, models[i], devices, report);
    }
    if (o.sim.on && !o.json) std::printf("\ncost model: %s\n", weft::gpu::sim_model_report().c_str());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "weft-pipeline: %s\n", e.what());
    return 1;
  }
  return 0;
}
