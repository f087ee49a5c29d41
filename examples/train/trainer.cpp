// The trainer behind weft-train-lenet and weft-train-resnet (trainer.h):
// a model on Fashion-MNIST with minibatch SGD, momentum SGD, Adam or AdamW
// (weft/optim.h), on one device or
// data-parallel on several (weft::parallel::DataParallel: the batch split
// over the devices, gradients reduced bucket by bucket while backward goes
// on), and across the processes of an mpirun job with --dist.
//
// The frontend never waits per batch: each batch pushes its ops (from_host,
// forward, loss, backward, the bucket reductions, SGD) and the loss and
// argmax tensors go into a queue that is read back kLag batches later, by
// which time they are usually computed; the engine's in-flight bound keeps
// the frontend at most a few dozen batches ahead. Test accuracy is measured
// at each epoch's end. The engine's profiler records every epoch; the
// fraction of the gradient reduction's time during which other ops ran
// (comm overlap) comes from its spans. --checkpoint saves the training state
// (weights, optimizer state, the data order's position) in the background at
// each epoch's end and every --checkpoint-every steps, keeping the newest
// --keep-checkpoints (a crash at any moment leaves DIR/latest loadable);
// --resume continues from one bit for bit, on the same or another number
// of devices and ranks (from a checkpoint at the last epoch's end, it only
// reports). --json gives weights_digest and, with --checkpoint,
// optimizer_digest (the final checkpoint's optimizer and loss-scaler state).
// Each device's allocator gives the peak of the bytes it had handed out
// (the memory report).
//
// --hybridize captures one training step per batch size (forward, loss,
// backward, SGD: Engine::begin_capture / end_capture) on fixed input
// tensors, and then per batch copies the batch into them and replays the
// step: MXNet's hybridization, with its dependencies resolved once.
// --bulk N pushes each step's ops in bulks of up to N (Engine::set_bulk_size):
// MXNet's bulk execution, one engine op per run of consecutive ops of a device.
#include "trainer.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arg_cursor.h"
#include "device_list.h"
#include "sim_mode.h"
#include "train_common.h"
#include "weft/checkpoint.h"
#include "weft/dataset.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/op_graph.h"
#include "weft/ops.h"
#include "weft/optim.h"
#include "weft/parallel/data_parallel.h"
#include "weft/parallel/metrics.h"
#include "weft/precision.h"
#include "weft/tensor.h"

namespace weft::examples {
namespace {

// Batches between pushing a batch and reading its loss/argmax back.
constexpr std::size_t kLag = 8;

// The shared flags (train_common.h) and this trainer's own.
struct Options : TrainFlags {
  int epochs = 10;
  bool channels_last = false;  // --channels-last: activations NHWC (nn::Layer::set_memory_format)
  bool gpu_graphs = false;
  std::string data;
  std::int64_t limit = 0;
  std::string conv_algo = "heuristic";
  weft::examples::SimFlags sim;  // --sim-model: predict steps instead of training
  std::int64_t steps = 0;        // --steps: measured steps under --sim-model; 0: not given (3)
};

void usage(std::FILE* out, const ModelSpec& m) {
  const char* p = m.program;
  std::fprintf(out,
               "%s: train %s on Fashion-MNIST (SGD, momentum, Adam or AdamW), on one device or data-parallel\n"
               "\n"
               "usage: %s [options]\n"
               "       mpirun -np N %s --dist [options]\n"
               "  --epochs N       passes over the training set (default 10)\n"
               "  --batch-size N   minibatch size, split over every device of every process (default %lld)\n"
               "  --lr X           learning rate (default %g%s;\n"
               "                   with adam or adamw 0.001)\n"
               "  --optimizer O    sgd (plain, the default), momentum (SGD, momentum 0.9), adam or adamw\n"
               "                   (weight decay 0.01 unless --weight-decay), as torch.optim computes them\n"
               "  --weight-decay X weight decay (adamw: decoupled; the others: added to the gradient)\n"
               "  --lr-schedule S  constant (default), step:SIZE[:GAMMA] or cosine:TOTAL_STEPS, optionally\n"
               "                   followed by ,warmup:STEPS (a linear warm-up)\n"
               "  --max-grad-norm X  clip the global gradient norm to X before each update\n"
               "  --shard S        what each replica keeps (ZeRO): none (default), optimizer (stage 1: its\n"
               "                   chunk of the optimizer state), gradients (stage 2: and of the gradients)\n"
               "                   or parameters (stage 3, FSDP: and of the parameters)\n"
               "  --prefetch N     with --shard parameters: layers gathered ahead of the one that runs (1)\n"
               "  --offload        with GPUs and --shard optimizer or above: each replica's chunk of the\n"
               "                   optimizer state, master weights and update on the host (ZeRO-Offload)\n"
               "  --recompute N    activation recomputation: the model's layers in N segments, each but the\n"
               "                   last keeping only its input and recomputing its activations in backward\n"
               "  --checkpoint DIR save a checkpoint (safetensors) under DIR at the end of every epoch;\n"
               "                   DIR/latest names the newest\n"
               "  --checkpoint-every N  also every N steps\n"
               "  --keep-checkpoints K  keep DIR's newest K checkpoints (default 3; at least 1)\n"
               "  --resume DIR     continue from DIR's newest checkpoint (or from DIR itself, a checkpoint\n"
               "                   directory): the same data order, weights and optimizer state, on any\n"
               "                   number of devices and processes; --epochs stays the total. Prints when\n"
               "                   the first step after it is done (scripts/weft-run restarts a failed\n"
               "                   mpirun job this way)\n"
               "  --devices D,...  the devices of this process: cpu:0 (default), cpu:0,cpu:1, gpu:0,gpu:1,\n"
               "                   a mix (also cpu(0) / gpu(0)); --device D is the same for one device.\n"
               "                   CPU devices beyond cpu:0 are made for the run (EngineConfig::cpu_devices)\n"
               "  --dist           data-parallel across the processes of an mpirun job too (each process\n"
               "                   gives as many devices; rank 0 prints)\n"
               "  --bucket-kb N    gradient bucket capacity in KiB (default 25 MiB, as PyTorch DDP%s;\n"
               "                   0: one bucket per parameter)\n"
               "  --no-overlap     reduce the buckets only after the whole backward (the baseline)\n"
               "  --hybridize      capture one training step (forward, loss, backward, SGD) per batch\n"
               "                   size once and replay it for every batch (one device, no --dist)\n"
               "  --gpu-graphs     with --hybridize on a GPU: the captured step's GPU ops replay as one\n"
               "                   CUDA Graph (CaptureOptions::gpu_graphs; simulated GPUs record their items)\n"
               "  --bulk N         push each step's ops in bulks of up to N (Engine::set_bulk_size, MXNet's\n"
               "                   bulk execution): consecutive ops of one device run as one engine op\n"
               "                   (default 0: off)\n"
               "  --precision P    fp32 (strict IEEE), tf32 (TF32 GEMMs and convolutions), bf16 or fp16\n"
               "                   (mixed precision: float32 master weights, half compute; fp16 with dynamic\n"
               "                   loss scaling). Default: tf32 when a GPU trains, else fp32\n"
               "  --channels-last  activations in the channels-last memory format (NHWC; PyTorch's\n"
               "                   --channels-last): the model converts its input once, convolutions, batch\n"
               "                   norm and pooling compute in NHWC (cuDNN's NHWC descriptors on a GPU)\n"
               "  --conv-algo A    GPU convolution algorithms: heuristic (cuDNN's ranking, the default),\n"
               "                   benchmark (time the candidates once per shape), deterministic, or\n"
               "                   benchmark+deterministic (EngineConfig::conv_algo)\n"
               "  --trace FILE     write the last epoch's trace (chrome://tracing / Perfetto JSON)\n"
               "  --data DIR       Fashion-MNIST IDX files (train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz]);\n"
               "                   default $WEFT_FASHION_MNIST, else %s\n"
               "  --limit N        use only the first N training and the first N test examples\n"
               "                   (0: all; the default)\n"
               "  --seed N         seed of the initial weights and the shuffling (default 0)\n"
               "  --json           end the output with one JSON line of the results\n"
               "%s"
               "  --steps N        with --sim-model: the measured steps, after one warm-up step (default 3;\n"
               "                   --epochs is then unused, --limit still bounds the data loaded)\n"
               "  --help           this text\n"
               "\n"
               "Prints the model, the gradient buckets, a progress line every ~20%% of an epoch's batches,\n"
               "and per epoch: loss and accuracy on the training batches (measured as they were trained;\n"
               "with --dist, rank 0's share), test accuracy, the epoch's training seconds (without the\n"
               "test pass) and, on several devices, the comm overlap: the fraction of the gradient\n"
               "reduction's time during which other ops ran, from the engine's profiler. The summary\n"
               "gives each device's peak of allocated memory.%s\n"
               "\n"
               "With --sim-model (on simulated GPUs only, --devices gpu:0 by default; WEFT_GPU_BACKEND=sim\n"
               "unless set so already) it prints the prediction instead: the predicted step time, each\n"
               "GPU stream's utilization, the compute/copy overlap and, on several devices, the fraction\n"
               "of the gradient reduction hidden, and the cost model's report; the same command gives\n"
               "the same prediction on any host (time is virtual). Loss, accuracy and weights are n/a:\n"
               "modeled kernels compute nothing; --checkpoint, --resume, --dist and --hybridize are\n"
               "refused. --json's line then has sim_model, sim_gpus, nodes, predicted_step_ms,\n"
               "utilization, comm_overlap, reduction_overlap, kernels_modeled, table_hits and fallbacks.\n"
               "Exit status: 0 done, 2 bad arguments or data, 1 failure while training.\n",
               p, m.model, p, p, static_cast<long long>(m.default_batch_size), static_cast<double>(m.default_lr),
               m.lr_note, m.bucket_note, weft::default_fashion_mnist_dir().c_str(), weft::examples::sim_flags_help(19).c_str(),
               m.usage_note);
}

// Returns false when --help was given (usage already printed).
bool parse(int argc, char** argv, Options& o, const ModelSpec& m) {
  o.lr = m.default_lr;
  o.batch_size = m.default_batch_size;
  weft::examples::ArgCursor args(argc, argv);
  while (args.next()) {
    const std::string& arg = args.flag();
    auto take = [&]() -> std::string {
      std::optional<std::string> v = args.value();
      if (!v) throw UsageError{arg + " needs a value"};
      return *std::move(v);
    };
    if (arg == "--help" || arg == "-h") {
      usage(stdout, m);
      return false;
    } else if (arg == "--epochs") {
      o.epochs = parse_int_flag<int>(arg, take(), 1);
    } else if (arg == "--channels-last") {
      if (args.has_inline_value()) throw UsageError{"--channels-last takes no value"};
      o.channels_last = true;
    } else if (arg == "--gpu-graphs") {
      if (args.has_inline_value()) throw UsageError{"--gpu-graphs takes no value"};
      o.gpu_graphs = true;
    } else if (arg == "--data") {
      o.data = take();
      if (o.data.empty()) throw UsageError{"--data needs a directory"};
    } else if (arg == "--limit") {
      o.limit = parse_int_flag<std::int64_t>(arg, take(), 0);
    } else if (arg == "--conv-algo") {
      o.conv_algo = take();
      try {
        (void)weft::ConvAlgo::parse(o.conv_algo, "--conv-algo");
      } catch (const weft::Error& e) {
        throw UsageError{e.what()};
      }
    } else if (arg == "--steps") {
      o.steps = parse_int_flag<std::int64_t>(arg, take(), 1);
    } else if (!parse_train_flag(args, o) && !o.sim.parse(args)) {
      throw UsageError{"unknown argument '" + arg + "'"};
    }
  }
  check_train_flags(o);
  o.sim.check();
  if (o.steps > 0 && !o.sim.on) throw UsageError{"--steps counts the steps --sim-model measures (training runs --epochs)"};
  if (o.sim.on) {
    // Modeled kernels compute nothing: no values to save, resume or read
    // across processes; a captured step is not what is predicted.
    if (!o.checkpoint.empty()) throw UsageError{"--sim-model computes no values to save: it takes no --checkpoint"};
    if (!o.resume.empty()) throw UsageError{"--sim-model computes no values: it takes no --resume"};
    if (o.dist) throw UsageError{"--sim-model predicts one process's simulated GPUs: it takes no --dist"};
    if (o.hybridize) throw UsageError{"--sim-model predicts plain steps: it takes no --hybridize"};
    if (!o.devices_given) o.devices = "gpu:0";
    if (o.steps == 0) o.steps = 3;
  }
  return true;
}

// A batch in flight: each replica's mean loss and predicted classes, read back later.
struct Pending {
  struct Part {
    weft::Tensor loss;  // undefined in evaluation
    weft::Tensor pred;  // [n] class indices as float
    std::vector<float> labels;
    std::int64_t n = 0;
  };
  std::vector<Part> parts;
};

struct Tally {
  double loss_sum = 0;  // sum over examples of the per-example loss
  std::int64_t correct = 0, examples = 0, batches = 0;

  void read(const Pending& p) {
    for (const Pending::Part& part : p.parts) {
      if (part.loss.defined()) loss_sum += static_cast<double>(part.loss.item()) * static_cast<double>(part.n);
      const std::vector<float> pred = part.pred.to_host();
      for (std::int64_t i = 0; i < part.n; ++i)
        correct += pred[static_cast<std::size_t>(i)] == part.labels[static_cast<std::size_t>(i)];
      examples += part.n;
    }
    ++batches;
  }
  double loss() const { return examples ? loss_sum / static_cast<double>(examples) : 0.0; }
  double acc() const { return examples ? static_cast<double>(correct) / static_cast<double>(examples) : 0.0; }
};

// Test accuracy of `net` on `data`, in evaluation mode (the layers keep nothing).
double evaluate(weft::Engine& engine, weft::nn::Sequential& net, const weft::Dataset& data, std::int64_t batch_size,
                weft::Device device) {
  net.train(false);
  weft::MinibatchIterator it(data, batch_size, /*shuffle=*/false, 0);
  std::deque<Pending> pending;
  Tally tally;
  std::vector<float> images, labels;
  std::int64_t n = 0;
  while (it.next(images, labels, n)) {
    weft::Tensor x = weft::Tensor::from_host(engine, weft::Shape{n, data.channels, data.height, data.width}, images, device);
    weft::Tensor logits = net.forward(x);
    pending.push_back(Pending{{{weft::Tensor(), weft::ops::argmax(logits), labels, n}}});
    if (pending.size() > kLag) {
      tally.read(pending.front());
      pending.pop_front();
    }
  }
  for (const Pending& p : pending) tally.read(p);
  net.train(true);
  return tally.acc();
}

// --sim-model: one warm-up step, then o.steps steps timed one by one on
// simulated GPUs whose kernels take modeled time; prints the prediction.
// Nothing is read back (the values were never computed).
template <class LossOf>
int predict_steps(const Options& o, const ModelSpec& m, weft::Engine& engine, weft::parallel::DataParallel& dp,
                  const weft::Dataset& train, const std::vector<weft::Device>& devices,
                  const weft::optim::OptimizerOptions& optimizer, const weft::optim::LrSchedule& schedule,
                  weft::Precision precision, const LossOf& loss_of) {
  const std::int64_t world = dp.world_size();
  const bool several = world > 1;
  weft::MinibatchIterator it(train, o.batch_size, /*shuffle=*/true, o.seed);
  int epoch = 0;
  it.start_epoch(epoch);
  std::vector<float> images, labels;
  std::int64_t n = 0;
  auto next_batch = [&] {
    bool restarted = false;
    for (;;) {
      if (it.next(images, labels, n)) {
        if (n >= world) return;
        continue;  // (a last batch smaller than the replicas)
      }
      if (restarted)
        throw weft::InvalidArgument(std::to_string(train.size) + " training examples give no batch of at least " +
                                    std::to_string(world) + " examples (one per replica)");
      restarted = true;
      it.start_epoch(++epoch);
    }
  };
  auto push_step = [&] {
    next_batch();
    std::optional<weft::BulkScope> bulk;
    if (o.bulk > 1) bulk.emplace(engine, o.bulk);
    const std::vector<weft::Tensor> x =
        dp.split_and_load(weft::Shape{n, train.channels, train.height, train.width}, images);
    const std::vector<weft::Tensor> y = dp.split_and_load(weft::Shape{n}, labels);
    const std::vector<weft::Tensor> logits = dp.forward(x);
    std::vector<weft::Tensor> dlogits;
    for (std::size_t r = 0; r < logits.size(); ++r) dlogits.push_back(loss_of(logits[r], y[r]).dlogits);
    dp.backward(dlogits);
    dp.step(schedule.lr(optimizer.lr, dp.steps()));
  };
  const weft::gpu::SimModelOptions model = weft::gpu::sim_model();
  std::printf("modeled: %s, %d simulated GPU(s), %d per node; one warm-up step, %lld measured steps of batch %lld\n",
              model.model.c_str(), weft::gpu::device_count(), weft::gpu::sim_topology().gpus_per_node,
              static_cast<long long>(o.steps), static_cast<long long>(o.batch_size));
  std::fflush(stdout);
  for (weft::Device d : devices) engine.allocator(d).reset_peak();
  push_step();  // warm-up: caches, allocators, the buckets' first reduction
  engine.wait_all();
  weft::examples::SimMeasure measure(engine);
  measure.begin();
  for (std::int64_t s = 0; s < o.steps; ++s) measure.step(push_step);
  const weft::examples::SimPrediction p = measure.end();
  for (std::size_t s = 0; s < p.step_ms.size(); ++s) std::printf("  step %zu: %.3f ms predicted\n", s + 1, p.step_ms[s]);
  std::optional<double> reduction;
  if (several) reduction = weft::parallel::comm_overlap(engine.profiler().spans(), dp.comm_marker()).fraction;
  if (!o.trace.empty()) engine.profiler().dump(o.trace);
  std::printf("%s", p.text().c_str());
  if (reduction) std::printf("gradient reduction hidden behind other ops: %.2f\n", *reduction);
  std::printf("loss, accuracy, test accuracy, weights: n/a (modeled)\n");
  std::string peaks, peaks_json;
  for (weft::Device d : devices) {
    const std::size_t peak = weft::memory_stats(engine, d).peak_in_use;
    peaks += (peaks.empty() ? "" : ", ") + d.str() + " " + bytes_str(peak);
    peaks_json += (peaks_json.empty() ? "\"" : ",\"") + d.str() + "\":" + std::to_string(peak);
  }
  std::printf("peak memory allocated: %s\n", peaks.c_str());
  if (o.json)
    std::printf("{\"model\":\"%s\",\"device\":\"%s\",\"devices\":\"%s\",\"replicas\":%lld,\"buckets\":%zu,"
                "\"batch_size\":%lld,\"precision\":\"%s\",\"optimizer\":\"%s\",\"shard\":\"%s\",\"bulk\":%zu,"
                "\"steps\":%lld%s,\"reduction_overlap\":%s,\"peak_bytes\":{%s}}\n",
                m.json_name, devices[0].str().c_str(), device_list_str(devices).c_str(), static_cast<long long>(world),
                dp.buckets().size(), static_cast<long long>(o.batch_size),
                std::string(weft::to_string(precision)).c_str(), o.optimizer.c_str(),
                std::string(weft::parallel::to_string(o.shard)).c_str(), o.bulk > 1 ? o.bulk : std::size_t{0},
                static_cast<long long>(o.steps), p.json().c_str(),
                reduction ? json_number(*reduction).c_str() : "null", peaks_json.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int run_trainer(int argc, char** argv, const ModelSpec& m) {
  const char* prog = m.program;
  Options o;
  try {
    if (!parse(argc, argv, o, m)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", prog, e.message.c_str(), prog);
    return 2;
  }

  std::vector<weft::Device> devices;
  try {
    devices = weft::examples::parse_device_list(o.devices);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "%s: bad --devices: %s\n", prog, e.what());
    return 2;
  }

  // ---- data ----
  const std::string dir = o.data.empty() ? weft::default_fashion_mnist_dir() : o.data;
  weft::Dataset train, test;
  double load_secs = 0;
  {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      std::fprintf(stderr,
                   "%s: Fashion-MNIST directory '%s' does not exist\n"
                   "  pass --data DIR or set WEFT_FASHION_MNIST (Debian: apt install dataset-fashion-mnist)\n",
                   prog, dir.c_str());
      return 2;
    }
    try {
      const auto t0 = Clock::now();
      train = weft::load_mnist_split(dir, "train", o.limit);
      test = weft::load_mnist_split(dir, "t10k", o.limit);
      load_secs = seconds_since(t0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: cannot load Fashion-MNIST from '%s': %s\n", prog, dir.c_str(), e.what());
      return 2;
    }
    if (train.channels != 1 || train.height != 28 || train.width != 28 || test.channels != 1 || test.height != 28 ||
        test.width != 28) {
      std::fprintf(stderr, "%s: '%s' does not hold 1x28x28 images (%s's input)\n", prog, dir.c_str(), m.model);
      return 2;
    }
  }

  try {
    // As many CPU devices as the list names (cpu:1 needs two).
    weft::EngineConfig config = engine_config(devices);
    config.conv_algo = o.conv_algo;
    const weft::Precision precision = precision_of(o, devices);
    std::unique_ptr<weft::Engine> engine;
    try {
      if (o.sim.on) weft::examples::sim_prepare(devices, config, "--devices");
      engine = weft::Engine::create(config);
    } catch (const weft::InvalidArgument& e) {
      if (!o.sim.on) throw;
      std::fprintf(stderr, "%s: %s\n", prog, e.what());
      return 2;
    }
    if (!devices_available(*engine, devices, prog)) return 2;
    if (o.sim.on) {
      try {
        (void)weft::examples::sim_install(o.sim);
      } catch (const weft::InvalidArgument& e) {
        std::fprintf(stderr, "%s: bad --sim-model: %s\n", prog, e.what());
        return 2;
      }
    }

    const weft::optim::OptimizerOptions optimizer = optimizer_of(o);
    const weft::optim::LrSchedule schedule = weft::optim::LrSchedule::parse(o.lr_schedule, "--lr-schedule");
    if (!hybridize_allowed(o, schedule, prog)) return 2;

    // --resume: the checkpoint, opened and checked before anything is built.
    std::optional<weft::checkpoint::Reader> resume;
    std::int64_t start_epoch = 0, start_batch = 0;
    std::uint64_t seed = o.seed;
    if (!o.resume.empty()) {
      try {
        resume.emplace(open_resume(o.resume));
        auto field = [&](const char* key) { return metadata_field(*resume, key); };
        if (field("weft.model") != m.json_name)
          throw weft::InvalidArgument("checkpoint '" + resume->path().string() + "' is of model '" +
                                      field("weft.model") + "', not " + m.json_name);
        if (std::stoll(field("weft.batch_size")) != o.batch_size ||
            std::stoll(field("weft.train_examples")) != train.size)
          throw weft::InvalidArgument("checkpoint '" + resume->path().string() + "' was trained with batch " +
                                      field("weft.batch_size") + " on " + field("weft.train_examples") +
                                      " examples; give the same --batch-size and --limit to continue its data order");
        start_epoch = std::stoll(field("weft.epoch"));
        start_batch = std::stoll(field("weft.batch"));
        seed = std::stoull(field("weft.seed"));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: cannot resume from '%s': %s\n", prog, o.resume.c_str(), e.what());
        return 2;
      }
      // At the end already (a run stopped after its last save): nothing is
      // left to train; the loaded state is reported.
      if (start_epoch > o.epochs || (start_epoch == o.epochs && start_batch > 0)) {
        std::fprintf(stderr, "%s: the checkpoint in '%s' is at epoch %lld already; --epochs %d is the total to reach\n",
                     prog, o.resume.c_str(), static_cast<long long>(start_epoch), o.epochs);
        return 2;
      }
    }

    const weft::parallel::DataParallelOptions dp_options = data_parallel_options(o, precision, optimizer);
    std::optional<weft::parallel::DataParallel> dp_made;
    try {
      dp_made.emplace(
          *engine, devices,
          [&](weft::Device d) {
            auto net = m.make(*engine, d, o.seed);
            net->set_precision(precision);
            if (o.channels_last) {
              try {
                net->set_memory_format(weft::MemoryFormat::channels_last);
              } catch (const weft::Error& e) {
                throw weft::InvalidArgument(std::string("--channels-last: ") + m.model + ": " + e.what());
              }
            }
            if (o.recompute > 0) net->recompute(o.recompute);
            return net;
          },
          dp_options);
    } catch (const weft::InvalidArgument& e) {
      std::fprintf(stderr, "%s: %s\n", prog, e.what());
      return 2;
    }
    weft::parallel::DataParallel& dp = *dp_made;
    // The loss in float32 whatever the model computes in (autocast's rule).
    auto loss_of = [](const weft::Tensor& logits, const weft::Tensor& labels) {
      return weft::ops::softmax_cross_entropy(
          logits.dtype() == weft::DType::float32 ? logits : weft::ops::cast(logits, weft::DType::float32), labels);
    };
    const bool main_rank = dp.process_rank() == 0;
    // Only rank 0 prints; every rank runs the same steps.
    auto say = [&](const char* fmt, auto... args) {
      if (!main_rank) return;
      std::printf(fmt, args...);
      std::fflush(stdout);
    };
    const bool several = dp.world_size() > 1;
    if (o.gpu_graphs && !o.hybridize) {
      std::fprintf(stderr, "%s: --gpu-graphs needs --hybridize (it is how the captured step replays)\n", prog);
      return 2;
    }
    if (o.hybridize && several) {
      // A collective creates and deletes variables of its own at each call,
      // which a captured graph cannot hold.
      std::fprintf(stderr, "%s: --hybridize trains on one device without --dist (got %d replicas)\n", prog,
                   dp.world_size());
      return 2;
    }
    say("data: %s: %lld training, %lld test examples of %lldx%lldx%lld (%.2f s to load)\n", dir.c_str(),
        static_cast<long long>(train.size), static_cast<long long>(test.size), static_cast<long long>(train.channels),
        static_cast<long long>(train.height), static_cast<long long>(train.width), load_secs);
    {
      // (sharded parameters: gathered for the description, on every rank)
      const weft::parallel::DataParallel::FullParameters full = dp.full_parameters();
      say("model: %s\n", dp.replica(0).describe().c_str());
    }
    std::string where = device_list_str(devices);
    if (dp.processes() > 1) where.append(" in each of ").append(std::to_string(dp.processes())).append(" processes");
    std::string split;
    if (several) split.append(" split over ").append(std::to_string(dp.world_size())).append(" replicas");
    const std::string length = o.sim.on ? std::to_string(o.steps) + " measured steps" : std::to_string(o.epochs) + " epochs";
    say("%s on %s (%s engine, %d workers per device): %s, batch %lld%s, lr %g, seed %llu, "
        "precision %s%s, conv algorithms %s%s\n",
        o.sim.on ? "predicting" : "training", where.c_str(), std::string(engine->kind()).c_str(),
        engine->workers(devices[0]), length.c_str(),
        static_cast<long long>(o.batch_size), split.c_str(), static_cast<double>(optimizer.lr),
        static_cast<unsigned long long>(seed), std::string(weft::to_string(precision)).c_str(),
        weft::needs_loss_scaling(precision) ? " (dynamic loss scaling)" : "", engine->conv_algo().str().c_str(),
        o.channels_last ? ", channels_last" : "");
    if (several)
      say("gradient buckets (%s, reduced %s):\n%s", o.bucket_bytes ? "--bucket-kb" : "default capacity",
          o.overlap ? "as soon as each is complete" : "after the whole backward", dp.describe_buckets().c_str());

    if (o.offload || o.recompute > 0 || (o.shard == weft::parallel::Shard::parameters && o.prefetch != 1))
      say("memory: %s%s%s\n", o.offload ? "optimizer offloaded to cpu_pinned(0); " : "",
          o.recompute > 0 ? ("recomputation in " + std::to_string(o.recompute) + " segments; ").c_str() : "",
          o.shard == weft::parallel::Shard::parameters ? ("prefetch " + std::to_string(o.prefetch) + " layers").c_str()
                                                       : "");
    say("optimizer: %s, lr schedule %s%s, shard %s\n", optimizer.str().c_str(), schedule.str().c_str(),
        o.max_grad_norm ? (", gradient norm clipped to " + std::to_string(*o.max_grad_norm)).c_str() : "",
        std::string(weft::parallel::to_string(o.shard)).c_str());
    if (o.sim.on) return predict_steps(o, m, *engine, dp, train, devices, optimizer, schedule, precision, loss_of);
    if (resume) {
      try {
        dp.load_checkpoint(*resume);
      } catch (const weft::InvalidArgument& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s: cannot resume from '%s': %s\n", prog, o.resume.c_str(), e.what());
        return 2;
      }
      say("resumed from %s: epoch %lld, batch %lld, step %lld\n", resume->path().c_str(),
          static_cast<long long>(start_epoch + 1), static_cast<long long>(start_batch),
          static_cast<long long>(dp.steps()));
    }
    const std::int64_t resumed_at = dp.steps();
    CheckpointSaver checkpoints(o);
    // --checkpoint: this job is its run directory's only writer (a lock
    // naming this host and pid; one left by a dead job is taken over).
    if (!o.checkpoint.empty() && main_rank) {
      try {
        checkpoints.lock();
      } catch (const weft::InvalidArgument& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s: --checkpoint %s: %s\n", prog, o.checkpoint.c_str(), e.what());
        return 2;
      }
    }
    // --checkpoint: the training state with where the data order stands.
    auto save_checkpoint = [&](std::int64_t epoch, std::int64_t batch) {
      if (!checkpoints.on()) return;
      checkpoints.save(dp, {{"weft.model", m.json_name},
                            {"weft.epoch", std::to_string(epoch)},
                            {"weft.batch", std::to_string(batch)},
                            {"weft.seed", std::to_string(seed)},
                            {"weft.batch_size", std::to_string(o.batch_size)},
                            {"weft.train_examples", std::to_string(train.size)},
                            {"weft.optimizer", optimizer.str()},
                            {"weft.lr_schedule", schedule.str()},
                            {"weft.precision", std::string(weft::to_string(precision))}});
    };
    weft::MinibatchIterator it(train, o.batch_size, /*shuffle=*/true, seed);
    const std::int64_t batches = dp.agree_steps(it.batches_per_epoch());
    const std::int64_t world = dp.world_size();
    const std::size_t first_replica = static_cast<std::size_t>(dp.process_rank()) * devices.size();
    double train_seconds = 0, test_acc = 0, comm_ms = 0, hidden_ms = 0;
    std::int64_t steps = 0;
    // --hybridize: per batch size, the step captured on fixed input tensors.
    struct Hybrid {
      weft::Tensor x, y, loss, pred;
      weft::OpGraph step;
    };
    std::map<std::int64_t, Hybrid> hybrid;
    auto capture_step = [&](std::int64_t rows) {
      Hybrid h;
      h.x = weft::Tensor::empty(*engine, weft::Shape{rows, train.channels, train.height, train.width}, devices[0]);
      h.y = weft::Tensor::empty(*engine, weft::Shape{rows}, devices[0]);
      engine->begin_capture({.gpu_graphs = o.gpu_graphs});
      try {
        const std::vector<weft::Tensor> logits = dp.forward({h.x});
        weft::ops::SoftmaxCrossEntropy sce = loss_of(logits[0], h.y);
        h.loss = sce.loss;
        h.pred = weft::ops::argmax(logits[0]);
        dp.backward({sce.dlogits});
        dp.step(optimizer.lr);
      } catch (...) {
        (void)engine->end_capture();
        throw;
      }
      h.step = engine->end_capture();
      say("  captured the training step for batch %lld: %zu ops, %zu dependencies, %zu variables",
          static_cast<long long>(rows), h.step.ops(), h.step.dependencies(), h.step.vars());
      if (o.gpu_graphs) say(", %zu ops in %zu stream graphs", h.step.gpu_segment_ops(), h.step.gpu_segments());
      say("\n");
      return h;
    };
    Tally last;
    bool first_step_reported = false;
    // Peak memory from here on: the model and everything training allocates.
    for (weft::Device d : devices) engine->allocator(d).reset_peak();
    weft::Profiler& profiler = engine->profiler();
    for (int epoch = static_cast<int>(start_epoch); epoch < o.epochs; ++epoch) {
      it.start_epoch(epoch);
      engine->wait_all();
      profiler.clear();
      profiler.start();
      const auto t0 = Clock::now();
      std::deque<Pending> pending;
      Tally tally;
      std::int64_t next_report = 1;  // in fifths of the epoch
      auto read_front = [&] {
        tally.read(pending.front());
        pending.pop_front();
        if (resume && !first_step_reported) {
          // (when the resumed run's first step's loss is computed: what a
          // restart after a failure costs until training goes on, scripts/weft-run)
          first_step_reported = true;
          say("  first step after resuming done at unix time %.3f\n",
              std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
        }
        if (tally.batches * 5 >= next_report * batches && tally.batches < batches) {
          while (tally.batches * 5 >= next_report * batches) ++next_report;
          const double s = seconds_since(t0);
          say("  epoch %d: %3lld%% (%lld/%lld batches), loss %.4f, train acc %.4f, %.0f examples/s\n", epoch + 1,
              static_cast<long long>(100 * tally.batches / batches), static_cast<long long>(tally.batches),
              static_cast<long long>(batches), tally.loss(), tally.acc(),
              static_cast<double>(tally.examples) * static_cast<double>(dp.processes()) / s);
        }
      };

      std::vector<float> images, labels;
      std::int64_t n = 0;
      const std::int64_t first = epoch == start_epoch ? start_batch : 0;
      for (std::int64_t b = 0; b < first && it.next(images, labels, n); ++b) {
        // (the batches a resumed checkpoint had trained: the same order, skipped)
      }
      for (std::int64_t b = first; b < batches && it.next(images, labels, n); ++b) {
        if (n < world) continue;  // (a last batch smaller than the replicas: skipped on every rank alike)
        ++steps;
        // --bulk: this step's pushes in bulks; its end pushes the rest.
        std::optional<weft::BulkScope> bulk;
        if (o.bulk > 1) bulk.emplace(*engine, o.bulk);
        if (o.hybridize) {
          auto found = hybrid.find(n);
          if (found == hybrid.end()) found = hybrid.emplace(n, capture_step(n)).first;
          Hybrid& h = found->second;
          h.x.copy_from(weft::Tensor::from_host(*engine, h.x.shape(), images, devices[0]));
          h.y.copy_from(weft::Tensor::from_host(*engine, h.y.shape(), labels, devices[0]));
          engine->replay(h.step);
          // Copies: the next replay overwrites the step's own outputs.
          Pending p;
          p.parts.push_back({h.loss.copy_to(devices[0]), h.pred.copy_to(devices[0]), labels, n});
          pending.push_back(std::move(p));
          if (pending.size() > kLag) read_front();
          continue;
        }
        const std::vector<weft::Tensor> x =
            dp.split_and_load(weft::Shape{n, train.channels, train.height, train.width}, images);
        const std::vector<weft::Tensor> y = dp.split_and_load(weft::Shape{n}, labels);
        const std::vector<weft::Tensor> logits = dp.forward(x);
        // This process's replicas' rows of the batch.
        const std::vector<std::int64_t> rows = weft::parallel::split_rows(n, static_cast<int>(world));
        std::int64_t row = 0;
        for (std::size_t i = 0; i < first_replica; ++i) row += rows[i];
        Pending p;
        std::vector<weft::Tensor> dlogits;
        for (std::size_t r = 0; r < logits.size(); ++r) {
          weft::ops::SoftmaxCrossEntropy sce = loss_of(logits[r], y[r]);
          dlogits.push_back(sce.dlogits);
          const std::int64_t rn = rows[first_replica + r];
          p.parts.push_back({sce.loss, weft::ops::argmax(logits[r]),
                             std::vector<float>(labels.begin() + row, labels.begin() + row + rn), rn});
          row += rn;
        }
        dp.backward(dlogits);
        dp.step(schedule.lr(optimizer.lr, dp.steps()));
        pending.push_back(std::move(p));
        if (pending.size() > kLag) read_front();
        if (o.checkpoint_every > 0 && dp.steps() % o.checkpoint_every == 0 && b + 1 < batches)
          save_checkpoint(epoch, b + 1);
      }
      while (!pending.empty()) read_front();
      engine->wait_all();  // the last batch's SGD updates too
      const double secs = seconds_since(t0);
      profiler.stop();
      train_seconds += secs;
      const weft::parallel::CommOverlap overlap = weft::parallel::comm_overlap(profiler.spans(), dp.comm_marker());
      comm_ms += overlap.comm_ms;
      hidden_ms += overlap.hidden_ms;
      if (!o.trace.empty() && epoch + 1 == o.epochs && main_rank) profiler.dump(o.trace);

      save_checkpoint(epoch + 1, 0);
      double test_secs = 0;
      {
        // Sharded parameters are gathered on every rank (collectives) for
        // the test pass.
        const weft::parallel::DataParallel::FullParameters full = dp.full_parameters();
        if (main_rank) {  // the replicas are equal: rank 0's first one is measured
          const auto t1 = Clock::now();
          test_acc = evaluate(*engine, dp.replica(0), test, o.batch_size, devices[0]);
          test_secs = seconds_since(t1);
        }
      }
      if (!std::isfinite(tally.loss()))
        say("  warning: the training loss is %f: the learning rate %g is too high\n", tally.loss(),
            static_cast<double>(optimizer.lr));
      std::string comm;
      if (several) {
        char buf[128];
        std::snprintf(buf, sizeof buf, ", comm overlap %.2f (%.0f of %.0f ms reducing hidden)", overlap.fraction,
                      overlap.hidden_ms, overlap.comm_ms);
        comm = buf;
      }
      say("epoch %2d: loss %.4f, train acc %.4f, test acc %.4f, %.1f s (%.0f examples/s; test pass %.1f s)%s\n",
          epoch + 1, tally.loss(), tally.acc(), test_acc, secs,
          static_cast<double>(tally.examples) * static_cast<double>(dp.processes()) / secs, test_secs, comm.c_str());
      last = tally;
    }

    checkpoints.wait();  // a failed write fails the run
    if (start_epoch == o.epochs) {  // resumed at the end: the loaded state's test accuracy
      const weft::parallel::DataParallel::FullParameters full = dp.full_parameters();
      if (main_rank) test_acc = evaluate(*engine, dp.replica(0), test, o.batch_size, devices[0]);
    }
    const std::uint64_t digest = weights_digest(dp);
    // (the state the run ended with: its last save comes after the last step)
    const std::string optimizer_digest = main_rank ? weft::examples::optimizer_digest(dp, o.checkpoint) : "null";
    std::size_t state_bytes = 0;
    for (std::size_t b : dp.state_bytes()) state_bytes = std::max(state_bytes, b);
    const int epochs_run = o.epochs - static_cast<int>(start_epoch);
    const double sec_per_epoch = epochs_run > 0 ? train_seconds / epochs_run : 0.0;
    const double comm_overlap = comm_ms > 0 ? hidden_ms / comm_ms : 0.0;
    char overlap_text[64] = "";
    if (several) std::snprintf(overlap_text, sizeof overlap_text, ", comm overlap %.2f", comm_overlap);
    const double ms_per_step = steps ? 1e3 * train_seconds / static_cast<double>(steps) : 0.0;
    std::string mode = o.hybridize ? (o.gpu_graphs ? ", hybridized, stream graphs" : ", hybridized") : "";
    if (o.bulk > 1) mode += ", bulks of " + std::to_string(o.bulk);
    say("done: test acc %.4f, train loss %.4f, train acc %.4f, %.1f s per epoch (%.2f ms per step%s) on %s%s\n",
        test_acc, last.loss(), last.acc(), sec_per_epoch, ms_per_step, mode.c_str(), where.c_str(), overlap_text);
    // Per device of this process (rank 0's with --dist): the peak of bytes
    // its allocator had handed out since training began (parameters,
    // activations, gradients, buckets, the test pass).
    const PeakReport peaks = peak_report(*engine, devices);
    say("peak memory allocated: %s\n", peaks.text.c_str());
    const float loss_scale = dp.loss_scale();
    const std::int64_t skipped = dp.skipped_steps();
    if (weft::needs_loss_scaling(precision))
      say("loss scale %g at the end, %lld of %lld steps skipped (Inf/NaN gradients)\n", static_cast<double>(loss_scale),
          static_cast<long long>(skipped), static_cast<long long>(steps));
    if (o.json)
      say("{\"model\":\"%s\",\"test_acc\":%.6f,\"train_loss\":%s,\"train_acc\":%.6f,\"sec_per_epoch\":%.4f,"
          "\"epochs\":%d,\"device\":\"%s\",\"devices\":\"%s\",\"processes\":%d,\"replicas\":%d,\"buckets\":%zu,"
          "\"comm_overlap\":%s,\"comm_ms\":%.3f,\"batch_size\":%lld,\"lr\":%g,\"train_examples\":%lld,"
          "\"ms_per_step\":%.4f,\"hybridize\":%s,\"gpu_graphs\":%s,\"bulk\":%zu,\"peak_bytes\":{%s},"
          "\"precision\":\"%s\",\"conv_algo\":\"%s\",\"loss_scale\":%g,\"skipped_steps\":%lld,\"steps\":%lld,"
          "\"optimizer\":\"%s\",\"lr_schedule\":\"%s\",\"shard\":\"%s\",\"state_bytes\":%zu,\"resumed_at_step\":%lld,"
          "\"total_steps\":%lld,\"weights_digest\":\"%016llx\",\"optimizer_digest\":%s,\"offload\":%s,\"recompute\":%d,\"channels_last\":%s}\n",
          m.json_name, test_acc, json_number(last.loss()).c_str(), last.acc(), sec_per_epoch, o.epochs,
          devices[0].str().c_str(), device_list_str(devices).c_str(), dp.processes(), dp.world_size(),
          dp.buckets().size(), several ? json_number(comm_overlap).c_str() : "null", comm_ms,
          static_cast<long long>(o.batch_size), static_cast<double>(optimizer.lr), static_cast<long long>(train.size),
          ms_per_step, o.hybridize ? "true" : "false", o.gpu_graphs ? "true" : "false", o.bulk > 1 ? o.bulk : std::size_t{0}, peaks.json.c_str(),
          std::string(weft::to_string(precision)).c_str(), engine->conv_algo().str().c_str(),
          static_cast<double>(loss_scale), static_cast<long long>(skipped), static_cast<long long>(steps),
          o.optimizer.c_str(), schedule.str().c_str(), std::string(weft::parallel::to_string(o.shard)).c_str(),
          state_bytes, static_cast<long long>(resumed_at), static_cast<long long>(dp.steps()),
          static_cast<unsigned long long>(digest), optimizer_digest.c_str(), o.offload ? "true" : "false", o.recompute,
          o.channels_last ? "true" : "false");
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: training failed: %s\n", prog, e.what());
    return 1;
  }
  return 0;
}

}  // namespace weft::examples
