// weft-bench-data-parallel: seconds per training step of data-parallel
// LeNet (or an MLP) in one run, for each way of reducing the gradients —
// bucketed with overlap, one bucket, one reduction per parameter
// (unbucketed), bucketed without overlap — beside the same model on one
// device, the peer. The configurations' repetitions are interleaved (rep r
// of each before rep r + 1 of any), so a slow spell of this noisy machine
// falls on all of them. A separate profiled pass per configuration gives its
// comm overlap (the fraction of the reduction's time during which other ops
// ran); the timed reps run with the profiler off. JSON lines with --json.
// --reduce-dtype bf16 (or fp16) adds the bucketed configuration with its
// gradients sent in half precision (half_precision_reduction); every row
// gives the gradient bytes each replica puts into the reductions per step.
//
// --shard none,optimizer,gradients,parameters runs ZeRO's stages instead
// (DataParallel with that Shard, each on an engine of its own so that its
// allocator's peak is its own), with --optimizer (sgd, momentum, adam,
// adamw; default sgd): each row adds the largest member's allocator peak
// during a pass of --steps steps, the bytes in use between steps, and its
// state_bytes() (parameters, gradients and optimizer state held between
// steps).
//
// --checkpoint-every N adds a copy of one configuration (bucketed; with
// --shard, the last stage listed) that saves a checkpoint every N steps
// (DataParallel::save_checkpoint into a temporary directory): its
// save_overhead is its step time over the copied configuration's, the cost
// of a save overlapping the steps (snapshots, and the background writer's
// share of the cores).
//
// Every configuration trains its own replicas from the same initial weights
// on the same synthetic batches, so after the first steps their weights must
// agree with the one-device peer's (with --shard: the unsharded one's) up to
// float rounding: the exit status is 1 when they do not (the bench doubles
// as a correctness check).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "arg_cursor.h"
#include "device_list.h"
#include "measure.h"
#include "weft/engine.h"
#include "weft/nn.h"
#include "weft/ops.h"
#include "weft/optim.h"
#include "weft/parallel/data_parallel.h"
#include "weft/parallel/metrics.h"
#include "weft/tensor.h"

namespace {

namespace par = weft::parallel;

struct Options {
  bool json = false;
  std::string model = "lenet";
  std::int64_t width = 2048;  // wide-mlp
  int layers = 8;             // wide-mlp
  bool offload = false;       // --offload: each sharded stage again with its optimizer on the host
  int prefetch_layers = 1;
  int recompute = 0;          // --recompute N: each stage again with the model in N recomputed segments
  std::string devices = "cpu:0,cpu:1";
  std::int64_t batch = 256;
  std::size_t bucket_bytes = 64 << 10;
  int steps = 10;  // per rep
  int reps = 7;
  float lr = 0.05f;
  std::optional<weft::DType> reduce_dtype;  // --reduce-dtype: an extra half-precision configuration
  std::vector<par::Shard> shards;            // --shard: ZeRO's stages instead of the reduction variants
  std::string optimizer = "sgd";
  int checkpoint_every = 0;  // --checkpoint-every: an extra configuration that saves
};

int usage(std::FILE* out, int rc) {
  std::fprintf(out,
               "usage: weft-bench-data-parallel [--json] [--model lenet|mlp|wide-mlp|resnet18] [--width N]\n"
               "                                [--layers N] [--devices D,...] [--batch N] [--bucket-kb N]\n"
               "                                [--steps N] [--recompute N]\n"
               "                                [--reps N] [--quick] [--reduce-dtype bf16|fp16] [--shard S,...]\n"
               "                                [--offload] [--prefetch N] [--optimizer sgd|momentum|adam|adamw]\n"
               "                                [--checkpoint-every N]\n"
               "  Seconds per SGD step (split_and_load, forward, softmax cross-entropy, backward with the\n"
               "  gradient reductions, step) of data-parallel training on --devices (default cpu:0,cpu:1;\n"
               "  gpu:0,gpu:1 with real or simulated GPUs), batch --batch (default 256) split over them,\n"
               "  synthetic data. Configurations, their reps interleaved:\n"
               "    one_device   the whole batch on the first device alone (the peer; nothing to reduce)\n"
               "    bucketed     buckets of --bucket-kb (default 64), each reduced as soon as it is complete\n"
               "    one_bucket   the default capacity (25 MiB): every gradient in one bucket\n"
               "    per_param    one reduction per parameter (unbucketed)\n"
               "    no_overlap   --bucket-kb buckets, reduced only after the whole backward\n"
               "    bucketed_bf16  (or _fp16, with --reduce-dtype) as bucketed, the gradients sent in that dtype\n"
               "  grad_bytes: the gradient bytes each replica puts into the reductions per step.\n"
               "  --shard none,optimizer,gradients,parameters: instead, one configuration per ZeRO stage\n"
               "  (bucketed, each on an engine of its own), with peak_bytes (the largest member's allocator\n"
               "  peak over a pass) and state_bytes (its parameters, gradients and optimizer state between\n"
               "  steps); held_bytes: the allocator's bytes in use between steps (state and buffers);\n"
               "  max_weight_diff is from the unsharded one, the peer. --optimizer (default sgd) for all\n"
               "  (adam, adamw: fewer than 0.1%% of the weights may differ by more than 1e-5, their update\n"
               "  being ~lr * sign(g), flipped by rounding where g is near zero).\n"
               "  Memory per row: expected_bytes is ZeRO's accounting for the stage (parameters, gradients and\n"
               "  optimizer state; stage 3's two gathered layers; one bucket in flight, in stages 2 and 3 its\n"
               "  gradients and its flat) plus the activations at the peak; peak_vs_expected, peak_vs_unsharded\n"
               "  and the peak's composition by role (peak_parameters, ..., activation_bytes).\n"
               "  --recompute N: each stage again with the model's layers in N segments, all but the last\n"
               "  recomputed in backward (Sequential::recompute); --model resnet18 (28x28 inputs).\n"
               "  --offload (GPU devices): each sharded stage again with its optimizer on cpu_pinned(0)\n"
               "  (DataParallelOptions::offload; its rows count the GPU's memory; offload_overlap: the share\n"
               "  of the host updates' time during which GPU streams ran, offload_update_ms their time per\n"
               "  step, from the profiled pass). --prefetch N: stage 3's\n"
               "  prefetch_layers (default 1).\n"
               "  --checkpoint-every N: also a copy of bucketed (with --shard, of the last stage listed)\n"
               "  that saves a checkpoint every N steps into a temporary directory; save_overhead is its\n"
               "  step time over the copied configuration's.\n"
               "  Per configuration the median over --reps (default 7) of --steps steps (default 10) each,\n"
               "  after a warm-up rep; then one profiled pass for comm_overlap. --model mlp: 784-512-512-10\n"
               "  (more gradient per flop than LeNet); wide-mlp: --layers (default 8) Dense layers of --width\n"
               "  (default 2048) squared, where the training state outweighs the activations (ZeRO's case).\n"
               "  --quick: 3 reps of 4 steps. Exit status 1 when a\n"
               "  configuration's weights after its first 4 steps differ from the peer's (relative 1e-5:\n"
               "  beyond float rounding; 2e-2 for a half-precision reduction; weight_diff).\n");
  return rc;
}

struct Config {
  std::string name;
  std::vector<weft::Device> devices;
  std::size_t bucket_bytes;
  bool overlap;
  weft::DType reduce_dtype = weft::DType::float32;
  par::Shard shard = par::Shard::none;
  bool offload = false;
  int recompute = 0;
  std::unique_ptr<weft::Engine> own_engine;  // --shard: each configuration's own
  weft::Engine* engine = nullptr;
  std::unique_ptr<par::DataParallel> dp;
  std::vector<double> sec_per_step;
  par::CommOverlap overlap_figure, offload_figure;  // offload_figure: with offload
  std::size_t peak_bytes = 0, held_bytes = 0, state_bytes = 0;
  weft::MemoryByRole peak_by_role{};  // the largest member's, at its peak
  // --checkpoint-every: saves every `checkpoint_every` steps into
  // checkpoint_dir; `base` is the configuration it copies.
  int checkpoint_every = 0;
  std::filesystem::path checkpoint_dir;
  std::int64_t steps_run = 0;
  std::deque<weft::checkpoint::PendingSave> saves;
  int base = -1;
};

struct Batch {
  weft::Shape x_shape, y_shape;
  std::vector<float> x, y;
};

std::vector<Batch> synthetic_batches(const Options& o, int count) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, 9);
  std::vector<Batch> out;
  for (int b = 0; b < count; ++b) {
    Batch batch;
    const std::int64_t features = o.model == "wide-mlp" ? o.width : 784;
    const bool images = o.model == "lenet" || o.model == "resnet18";
    batch.x_shape = images ? weft::Shape{o.batch, 1, 28, 28} : weft::Shape{o.batch, features};
    batch.y_shape = weft::Shape{o.batch};
    batch.x.resize(static_cast<std::size_t>(o.batch * features));
    for (float& v : batch.x) v = pixel(gen);
    for (std::int64_t i = 0; i < o.batch; ++i) batch.y.push_back(static_cast<float>(label(gen)));
    out.push_back(std::move(batch));
  }
  return out;
}

// Pushes one SGD step on `batch`.
void train_step(par::DataParallel& dp, const Batch& batch, float lr) {
  const std::vector<weft::Tensor> x = dp.split_and_load(batch.x_shape, batch.x);
  const std::vector<weft::Tensor> y = dp.split_and_load(batch.y_shape, batch.y);
  const std::vector<weft::Tensor> logits = dp.forward(x);
  std::vector<weft::Tensor> dlogits;
  for (std::size_t r = 0; r < logits.size(); ++r)
    dlogits.push_back(weft::ops::softmax_cross_entropy(logits[r], y[r]).dlogits);
  dp.backward(dlogits);
  dp.step(lr);
}

// How two configurations' parameters (replica 0) differ: the largest
// |difference| relative to the largest |value|, and the fraction of
// elements that differ by more than 1e-5 of that.
struct WeightDifference {
  double max_relative = 0, fraction_beyond = 0;
};
WeightDifference weight_difference(par::DataParallel& dp_a, par::DataParallel& dp_b) {
  auto full_a = dp_a.full_parameters();  // gathered under Shard::parameters
  auto full_b = dp_b.full_parameters();
  const std::vector<weft::nn::Parameter*> pa = dp_a.replica(0).parameters(), pb = dp_b.replica(0).parameters();
  std::vector<double> diffs;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const std::vector<float> va = pa[i]->value.to_host(), vb = pb[i]->value.to_host();
    for (std::size_t k = 0; k < va.size(); ++k) {
      diffs.push_back(std::fabs(static_cast<double>(va[k]) - vb[k]));
      diff = std::max(diff, diffs.back());
      scale = std::max(scale, static_cast<double>(std::fabs(va[k])));
    }
  }
  WeightDifference out;
  out.max_relative = scale > 0 ? diff / scale : diff;
  const double tolerance = 1e-5 * (scale > 0 ? scale : 1.0);
  std::size_t beyond = 0;
  for (double d : diffs) beyond += d > tolerance;
  out.fraction_beyond = diffs.empty() ? 0.0 : static_cast<double>(beyond) / static_cast<double>(diffs.size());
  return out;
}

// What ZeRO's accounting (Rajbhandari et al. 2020) says a member holds at
// its peak, from float32 parameters (psi of them, 4 bytes each): the
// parameters, gradients and optimizer state of its stage (k param-shaped
// state tensors per parameter: 2 for Adam), stage 3's two gathered layers,
// and one bucket in flight; the activations are the measured ones. Under
// offload, what stays on the member's device.
struct Expected {
  double model_bytes = 0;  // parameters, gradients, optimizer state (and gathered layers)
  double bucket_bytes = 0;  // one bucket in flight
};
Expected expected_bytes(const Config& c, std::size_t state_per_param) {
  double psi = 0, largest = 0;
  for (const par::GradientBucket& b : c.dp->buckets()) {
    psi += static_cast<double>(b.elements);
    largest = std::max(largest, static_cast<double>(b.elements));
  }
  const double n = c.dp->world_size(), k = static_cast<double>(state_per_param), p = 4 * psi;
  Expected e;
  // Stages 2 and 3 make the flat bucket per step: in flight, a bucket is its
  // gradients and the flat they are packed into (as FSDP's reduce-scatter
  // input and DeepSpeed's bucket); before, the flat is part of the gradients.
  e.bucket_bytes = (c.shard >= par::Shard::gradients ? 2 : 1) * 4 * largest;
  switch (c.shard) {
    case par::Shard::none: e.model_bytes = (2 + k) * p; break;
    case par::Shard::optimizer: e.model_bytes = c.offload ? 2 * p : 2 * p + k * p / n; break;
    case par::Shard::gradients: e.model_bytes = c.offload ? p : p + (1 + k) * p / n; break;
    case par::Shard::parameters: e.model_bytes = (c.offload ? p / n : (2 + k) * p / n) + 2 * 4 * largest; break;
  }
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (weft::examples::ArgCursor args(argc, argv); args.next();) {
    const std::string& a = args.flag();
    std::optional<long long> n;
    std::optional<std::string> text;
    if (a == "--help" || a == "-h") return usage(stdout, 0);
    if (a == "--json") o.json = true;
    else if (a == "--quick") o.reps = 3, o.steps = 4;
    else if (a == "--model" && (text = args.value()) &&
             (*text == "lenet" || *text == "mlp" || *text == "wide-mlp" || *text == "resnet18"))
      o.model = *text;
    else if (a == "--recompute" && (n = args.int_value(1, 1024))) o.recompute = static_cast<int>(*n);
    else if (a == "--width" && (n = args.int_value(16, 1 << 16))) o.width = *n;
    else if (a == "--layers" && (n = args.int_value(1, 1024))) o.layers = static_cast<int>(*n);
    else if (a == "--offload") o.offload = true;
    else if (a == "--prefetch" && (n = args.int_value(0, 1024))) o.prefetch_layers = static_cast<int>(*n);
    else if (a == "--devices" && (text = args.value()) && !text->empty()) o.devices = *text;
    else if (a == "--batch" && (n = args.int_value(2, 1 << 16))) o.batch = *n;
    else if (a == "--bucket-kb" && (n = args.int_value(1, 1 << 20))) o.bucket_bytes = static_cast<std::size_t>(*n) << 10;
    else if (a == "--steps" && (n = args.int_value(1, 10000))) o.steps = static_cast<int>(*n);
    else if (a == "--reps" && (n = args.int_value(1, 1000))) o.reps = static_cast<int>(*n);
    else if (a == "--reduce-dtype" && (text = args.value()) && (*text == "bf16" || *text == "fp16"))
      o.reduce_dtype = *text == "bf16" ? weft::DType::bfloat16 : weft::DType::float16;
    else if (a == "--shard" && (text = args.value()) && !text->empty()) {
      try {
        for (const std::string& item : weft::examples::ArgCursor::split_list(*text))
          o.shards.push_back(par::parse_shard(item, "--shard"));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "weft-bench-data-parallel: %s\n", e.what());
        return 2;
      }
    } else if (a == "--checkpoint-every" && (n = args.int_value(1, 1 << 20))) {
      o.checkpoint_every = static_cast<int>(*n);
    } else if (a == "--optimizer" && (text = args.value()) && !text->empty()) {
      o.optimizer = *text;
    } else {
      std::fprintf(stderr, "weft-bench-data-parallel: bad argument '%s'\n", a.c_str());
      return usage(stderr, 2);
    }
  }
  std::vector<weft::Device> devices;
  try {
    devices = weft::examples::parse_device_list(o.devices);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-data-parallel: bad --devices: %s\n", e.what());
    return 2;
  }
  weft::optim::OptimizerOptions optimizer;
  try {
    optimizer = weft::optim::OptimizerOptions::parse(o.optimizer, o.lr, "--optimizer");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-data-parallel: %s\n", e.what());
    return 2;
  }
  if (devices.size() < 2 && o.shards.empty()) {
    std::fprintf(stderr, "weft-bench-data-parallel: --devices needs at least two devices (one with --shard), got '%s'\n",
                 o.devices.c_str());
    return 2;
  }

  try {
    const double rtt = weft_bench::core_round_trip_ns();
    weft::EngineConfig config;
    for (weft::Device d : devices)
      if (d.is_cpu()) config.cpu_devices = std::max(config.cpu_devices, d.index() + 1);
    auto engine = weft::Engine::create(config);

    std::vector<Config> configs;
    auto add = [&](std::string name, std::vector<weft::Device> on, std::size_t bucket, bool overlap,
                   weft::DType reduce_dtype = weft::DType::float32, par::Shard shard = par::Shard::none) {
      Config c;
      c.name = std::move(name);
      c.devices = std::move(on);
      c.bucket_bytes = bucket;
      c.overlap = overlap;
      c.reduce_dtype = reduce_dtype;
      c.shard = shard;
      c.engine = engine.get();
      configs.push_back(std::move(c));
    };
    if (o.shards.empty()) {
      add("one_device", {devices[0]}, o.bucket_bytes, true);
      add("bucketed", devices, o.bucket_bytes, true);
      add("one_bucket", devices, std::size_t{25} << 20, true);
      add("per_param", devices, 0, true);
      add("no_overlap", devices, o.bucket_bytes, false);
      if (o.reduce_dtype)
        add(*o.reduce_dtype == weft::DType::bfloat16 ? "bucketed_bf16" : "bucketed_fp16", devices, o.bucket_bytes,
            true, *o.reduce_dtype);
    } else {
      // The unsharded configuration first: the others' weights are compared with its.
      if (std::find(o.shards.begin(), o.shards.end(), par::Shard::none) == o.shards.end())
        o.shards.insert(o.shards.begin(), par::Shard::none);
      std::stable_partition(o.shards.begin(), o.shards.end(), [](par::Shard s) { return s == par::Shard::none; });
      for (par::Shard s : o.shards) {
        add("shard_" + std::string(par::to_string(s)), devices, o.bucket_bytes, true, weft::DType::float32, s);
        configs.back().own_engine = weft::Engine::create(config);
        configs.back().engine = configs.back().own_engine.get();
      }
      if (o.recompute > 0)
        for (par::Shard s : std::vector<par::Shard>(o.shards)) {
          add("shard_" + std::string(par::to_string(s)) + "_recompute", devices, o.bucket_bytes, true,
              weft::DType::float32, s);
          configs.back().recompute = o.recompute;
          configs.back().own_engine = weft::Engine::create(config);
          configs.back().engine = configs.back().own_engine.get();
        }
      if (o.offload)
        for (par::Shard s : o.shards) {
          if (s == par::Shard::none) continue;
          add("shard_" + std::string(par::to_string(s)) + "_offload", devices, o.bucket_bytes, true,
              weft::DType::float32, s);
          configs.back().offload = true;
          configs.back().own_engine = weft::Engine::create(config);
          configs.back().engine = configs.back().own_engine.get();
        }
    }
    const std::filesystem::path checkpoint_root =
        std::filesystem::temp_directory_path() / ("weft-bench-checkpoints-" + std::to_string(::getpid()));
    if (o.checkpoint_every > 0) {
      const int base = o.shards.empty() ? 1 : static_cast<int>(configs.size()) - 1;
      const Config& b = configs[static_cast<std::size_t>(base)];
      add(b.name + "_checkpointed", b.devices, b.bucket_bytes, b.overlap, b.reduce_dtype, b.shard);
      Config& c = configs.back();
      if (!o.shards.empty()) {
        c.own_engine = weft::Engine::create(config);
        c.engine = c.own_engine.get();
      }
      c.checkpoint_every = o.checkpoint_every;
      c.checkpoint_dir = checkpoint_root;
      c.base = base;
    }
    for (Config& c : configs) {
      auto make_on = [&](weft::Device d) {
        std::unique_ptr<weft::nn::Sequential> net;
        if (o.model == "lenet") net = weft::nn::lenet(*c.engine, d, 0);
        else if (o.model == "mlp") net = weft::nn::mlp(*c.engine, {784, 512, 512, 10}, d, 0);
        else if (o.model == "resnet18") net = weft::nn::resnet18(*c.engine, d, 0);
        else net = weft::nn::mlp(*c.engine, std::vector<std::int64_t>(static_cast<std::size_t>(o.layers) + 1, o.width), d, 0);
        if (c.recompute > 0) net->recompute(c.recompute);
        return net;
      };
      par::DataParallelOptions options{.bucket_bytes = c.bucket_bytes, .overlap = c.overlap, .name = c.name};
      options.optimizer = optimizer;
      options.shard = c.shard;
      options.prefetch_layers = o.prefetch_layers;
      if (c.offload) options.offload = weft::Device::cpu_pinned(0);
      c.dp = std::make_unique<par::DataParallel>(*c.engine, c.devices, make_on, std::move(options));
      if (c.reduce_dtype != weft::DType::float32)
        c.dp->set_reduction(par::half_precision_reduction(*c.dp, {.dtype = c.reduce_dtype}));
    }
    for (Config& c : configs) c.engine->wait_all();

    const std::vector<Batch> batches = synthetic_batches(o, o.steps);
    auto run = [&](Config& c, std::size_t steps) {
      for (std::size_t b = 0; b < steps; ++b) {
        train_step(*c.dp, batches[b], o.lr);
        if (c.checkpoint_every > 0 && ++c.steps_run % c.checkpoint_every == 0) {
          // Two directories in turn: the disk holds at most two checkpoints.
          if (c.saves.size() >= 2) {
            c.saves.front().wait();
            c.saves.pop_front();
          }
          c.saves.push_back(c.dp->save_checkpoint(c.checkpoint_dir / ("step-" + std::to_string(c.steps_run % 2))));
        }
      }
      c.engine->wait_all();
    };

    std::fprintf(o.json ? stderr : stdout,
                 "weft-bench-data-parallel: %s, batch %lld on %s, %zu-KiB buckets (%s engine, %d workers on %s); "
                 "%u hardware threads, core round trip %.1f ns\n",
                 o.model.c_str(), static_cast<long long>(o.batch), o.devices.c_str(), o.bucket_bytes >> 10,
                 std::string(engine->kind()).c_str(), engine->workers(devices[0]), devices[0].str().c_str(),
                 std::thread::hardware_concurrency(), rtt);
    if (!o.json && configs.size() > 1) std::printf("bucketed plan:\n%s", configs[1].dp->describe_buckets().c_str());

    // The check: the first few steps from the common initial weights. Same
    // batches, same steps: equal up to the order of float sums (a missing or
    // doubled reduction is off by the size of a step). Later the
    // configurations drift apart (rounding differences grow over many steps
    // on random labels), so the check comes first.
    const std::size_t check_steps = std::min<std::size_t>(batches.size(), 4);
    for (Config& c : configs) run(c, check_steps);
    std::vector<double> weight_diff;
    bool agree = true;
    for (Config& c : configs) {
      const WeightDifference d = weight_difference(*c.dp, *configs[0].dp);
      weight_diff.push_back(d.max_relative);
      // Adam's update is about lr * sign(g) where |g| is small: a gradient
      // near zero summed in another order flips that element's step. A few
      // such elements are rounding; a missing or doubled reduction moves
      // nearly all of them.
      const bool adam = optimizer.algorithm != weft::optim::Algorithm::sgd;
      if (c.reduce_dtype != weft::DType::float32) agree = agree && d.max_relative < 2e-2;
      else if (adam) agree = agree && d.fraction_beyond < 1e-3;
      else agree = agree && d.max_relative < 1e-5;
    }
    for (Config& c : configs) run(c, batches.size());  // warm-up: first touch, the allocator's pools
    for (int r = 0; r < o.reps; ++r)
      for (Config& c : configs) {
        weft_bench::Stopwatch sw;
        run(c, batches.size());
        c.sec_per_step.push_back(sw.seconds() / o.steps);
      }
    for (Config& c : configs) {
      weft::Profiler& profiler = c.engine->profiler();
      profiler.clear();
      profiler.start();
      run(c, batches.size());
      profiler.stop();
      c.overlap_figure = par::comm_overlap(profiler.spans(), c.dp->comm_marker());
      if (c.offload) c.offload_figure = par::gpu_overlap(profiler.spans(), c.dp->offload_marker());
      profiler.clear();
    }
    // Memory: the allocators' peak over one more pass (with --shard each
    // configuration's engine is its own: its peak is its own), and the
    // state held between steps.
    for (Config& c : configs) {
      for (weft::Device d : c.devices) c.engine->allocator(d).reset_peak();
      run(c, batches.size());
      for (weft::Device d : c.devices) {
        const weft::MemoryStats m = weft::memory_stats(*c.engine, d);
        if (m.peak_in_use >= c.peak_bytes) c.peak_by_role = m.peak_by_role;
        c.peak_bytes = std::max(c.peak_bytes, m.peak_in_use);
        c.held_bytes = std::max(c.held_bytes, m.in_use);
      }
      for (std::size_t b : c.dp->state_bytes()) c.state_bytes = std::max(c.state_bytes, b);
    }

    if (!o.json)
      std::printf("%-16s %8s %7s %12s %12s %12s %10s %10s %10s %12s %10s %10s\n", "config", "replicas", "buckets",
                  "ms_per_step", "min_ms", "max_ms", "vs_peer", "overlap", "weight_diff", "grad_bytes", "peak_MiB",
                  "state_MiB");
    const double peer = weft_bench::summarize(configs[0].sec_per_step).median;
    // With --shard: the peak's composition and what ZeRO's accounting expects.
    std::size_t state_per_param = 0;
    for (const std::string& name : optimizer.state_names()) state_per_param += name != "step";
    auto fixed = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.4f", v);
      return std::string(buf);
    };
    auto memory_fields = [&](const Config& c) {
      if (o.shards.empty()) return std::string();
      const Expected e = expected_bytes(c, state_per_param);
      const auto role = [&](weft::MemoryRole r) { return c.peak_by_role[static_cast<std::size_t>(r)]; };
      const double activations = static_cast<double>(role(weft::MemoryRole::activations));
      const double expected = e.model_bytes + e.bucket_bytes + activations;
      double psi = 0;
      for (const par::GradientBucket& b : c.dp->buckets()) psi += static_cast<double>(b.elements);
      char buf[640];
      std::snprintf(buf, sizeof buf,
                    ",\"offload\":%s,\"recompute\":%d,\"prefetch_layers\":%d,\"parameters\":%.0f,\"expected_bytes\":%.0f,"
                    "\"peak_vs_expected\":%.4f,\"peak_vs_unsharded\":%.4f,\"activation_bytes\":%zu,"
                    "\"peak_parameters\":%zu,\"peak_gradients\":%zu,\"peak_optimizer_state\":%zu,"
                    "\"peak_communication\":%zu,\"offload_overlap\":%s,\"offload_update_ms\":%s",
                    c.offload ? "true" : "false", c.recompute, o.prefetch_layers, psi, expected,
                    static_cast<double>(c.peak_bytes) / expected,
                    static_cast<double>(c.peak_bytes) / static_cast<double>(configs[0].peak_bytes),
                    role(weft::MemoryRole::activations), role(weft::MemoryRole::parameters),
                    role(weft::MemoryRole::gradients), role(weft::MemoryRole::optimizer_state),
                    role(weft::MemoryRole::communication), c.offload ? fixed(c.offload_figure.fraction).c_str() : "null",
                    c.offload ? fixed(c.offload_figure.comm_ms / o.steps).c_str() : "null");
      return std::string(buf);
    };
    for (std::size_t i = 0; i < configs.size(); ++i) {
      Config& c = configs[i];
      const weft_bench::Summary s = weft_bench::summarize(c.sec_per_step);
      const double diff = weight_diff[i];
      const bool reduces = c.dp->world_size() > 1;
      std::int64_t grad_bytes = 0;
      if (reduces)
        for (const par::GradientBucket& b : c.dp->buckets())
          grad_bytes += b.elements * static_cast<std::int64_t>(weft::dtype_size(c.reduce_dtype));
      std::string save_overhead = "null";
      if (c.base >= 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.4f",
                      s.median / weft_bench::summarize(configs[static_cast<std::size_t>(c.base)].sec_per_step).median);
        save_overhead = buf;
      }
      if (o.json) {
        char overlap[32] = "null";
        if (reduces) std::snprintf(overlap, sizeof overlap, "%.4f", c.overlap_figure.fraction);
        std::printf(
            "{\"config\":\"%s\",\"model\":\"%s\",\"devices\":\"%s\",\"replicas\":%d,\"batch\":%lld,"
            "\"bucket_bytes\":%zu,\"buckets\":%zu,\"overlap\":%s,\"sec_per_step\":%.6f,\"min_sec\":%.6f,"
            "\"max_sec\":%.6f,\"peer_sec_per_step\":%.6f,\"ratio_vs_one_device\":%.4f,\"comm_overlap\":%s,"
            "\"comm_ms_per_step\":%.4f,\"weight_diff\":%.3g,\"reduce_dtype\":\"%s\",\"grad_bytes_per_step\":%lld,"
            "\"steps\":%d,\"reps\":%d,\"core_round_trip_ns\":%.1f,\"shard\":\"%s\",\"members\":%d,\"optimizer\":\"%s\","
            "\"step_ms\":%.4f,\"peak_bytes\":%zu,\"held_bytes\":%zu,\"state_bytes\":%zu,\"max_weight_diff\":%.3g,"
            "\"checkpoint_every\":%d,\"save_overhead\":%s%s}\n",
            c.name.c_str(), o.model.c_str(), o.devices.c_str(), c.dp->world_size(), static_cast<long long>(o.batch),
            c.bucket_bytes, reduces ? c.dp->buckets().size() : std::size_t{0}, c.overlap ? "true" : "false",
            s.median, s.min, s.max, peer, s.median / peer, overlap, c.overlap_figure.comm_ms / o.steps, diff,
            std::string(weft::to_string(c.reduce_dtype)).c_str(), static_cast<long long>(grad_bytes), o.steps, o.reps,
            rtt, std::string(par::to_string(c.shard)).c_str(), c.dp->world_size(), o.optimizer.c_str(), s.median * 1e3,
            c.peak_bytes, c.held_bytes, c.state_bytes, diff, c.checkpoint_every, save_overhead.c_str(),
            memory_fields(c).c_str());
      } else {
        char overlap[32] = "-";
        if (reduces) std::snprintf(overlap, sizeof overlap, "%.2f", c.overlap_figure.fraction);
        std::printf("%-16s %8d %7zu %12.2f %12.2f %12.2f %10.3f %10s %10.2g %12lld %10.2f %10.2f\n", c.name.c_str(),
                    c.dp->world_size(), reduces ? c.dp->buckets().size() : std::size_t{0}, s.median * 1e3, s.min * 1e3,
                    s.max * 1e3, s.median / peer, overlap, diff, static_cast<long long>(grad_bytes),
                    static_cast<double>(c.peak_bytes) / (1 << 20), static_cast<double>(c.state_bytes) / (1 << 20));
      }
      std::fflush(stdout);
    }
    for (Config& c : configs)
      for (weft::checkpoint::PendingSave& save : c.saves) save.wait();
    std::error_code ec;
    std::filesystem::remove_all(checkpoint_root, ec);
    if (!agree) {
      std::fprintf(stderr, "weft-bench-data-parallel: a configuration's weights differ from one_device's\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-data-parallel: %s\n", e.what());
    return 1;
  }
  return 0;
}
