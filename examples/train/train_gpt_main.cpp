// weft-train-gpt: a GPT (weft::nn::gpt) as a byte-level language model on a
// text file (weft::TextCorpus: the first 90% trains, the last 10%
// validates), with AdamW by default, on one device or data-parallel on
// several (weft::parallel::DataParallel: the batch's sequences split over
// the replicas), and across the processes of an mpirun job with --dist. The
// training flags are the image trainers' (train_common.h).
//
// The frontend never waits per step: each step pushes its ops (from_host,
// forward, the language-model loss per replica, backward, the bucket
// reductions, the update) and its losses go into a queue read back kLag
// steps later. Every --eval-every steps (and at the end) it drains the
// queue and measures the validation loss (mean nats per byte over the fixed
// --eval-batches batches) on replica 0; the tokens per second count training
// time only. Batch s is drawn from (--seed, s) alone, so --checkpoint saves
// the step as the data's position and --resume continues bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <deque>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "arg_cursor.h"
#include "device_list.h"
#include "train_common.h"
#include "weft/checkpoint.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/nn_transformer.h"
#include "weft/op_graph.h"
#include "weft/ops.h"
#include "weft/optim.h"
#include "weft/parallel/data_parallel.h"
#include "weft/parallel/metrics.h"
#include "weft/parallel/pipeline.h"
#include "weft/precision.h"
#include "weft/tensor.h"
#include "weft/text_corpus.h"

namespace {

using namespace weft::examples;

constexpr const char* kProgram = "weft-train-gpt";
// Steps between pushing a step and reading its loss back.
constexpr std::size_t kLag = 8;

struct Options : TrainFlags {
  std::string model = "tiny";
  std::optional<std::int64_t> context;  // unset: the model's
  std::int64_t steps = 200;
  double minutes = 0;  // 0: no time limit
  std::int64_t eval_every = 50;
  std::int64_t eval_batches = 8;
  std::string data;
  std::string pipeline;     // a schedule: pipelined over --devices instead of data-parallel
  int chunks = 4;           // --chunks: micro-batches per step
  int virtual_stages = 1;   // --virtual-stages: model chunks per device (interleaved-1f1b)
  std::vector<int> balance; // --balance: layers per stage; empty: as even as they divide
};

weft::nn::GptConfig model_config(const std::string& name) {
  if (name == "tiny") return weft::nn::GptConfig::tiny();
  if (name == "small") return weft::nn::GptConfig::small();
  throw UsageError{"--model: '" + name + "' is not one of tiny, small"};
}

void usage(std::FILE* out) {
  std::fprintf(out,
               "%s: train a GPT as a byte-level language model on a text file (AdamW by default), on one\n"
               "device or data-parallel on several\n"
               "\n"
               "usage: %s [options]\n"
               "       mpirun -np N %s --dist [options]\n"
               "  --model M        tiny (the default: %s)\n"
               "                   or small (GPT-2 small: %s)\n"
               "  --context T      sequence length in bytes (default: the model's; at most the model's)\n"
               "  --batch-size B   sequences per step, split over every device of every process (default 16)\n"
               "  --steps N        training steps in all (default 200; a resumed run counts its earlier ones)\n"
               "  --minutes M      stop at the first step boundary after M minutes of training (wall time),\n"
               "                   then evaluate (with --dist every %zu steps the ranks agree on it)\n"
               "  --eval-every N   measure the validation loss every N steps and at the end (default 50)\n"
               "  --eval-batches N validation batches of B sequences each, at evenly spaced offsets of the\n"
               "                   validation split, the same every time (default 8)\n"
               "  --data FILE      the text (bytes are the tokens; the first 90%% trains, the last 10%%\n"
               "                   validates); default $WEFT_TEXT_CORPUS, else %s\n"
               "  --lr X           learning rate (default 0.001 with adam or adamw, else 0.1)\n"
               "  --optimizer O    adamw (the default, weight decay 0.01 unless --weight-decay), adam, sgd or\n"
               "                   momentum (SGD, momentum 0.9), as torch.optim computes them\n"
               "  --weight-decay X weight decay (adamw: decoupled; the others: added to the gradient)\n"
               "  --lr-schedule S  constant (default), step:SIZE[:GAMMA] or cosine:TOTAL_STEPS, optionally\n"
               "                   followed by ,warmup:STEPS (a linear warm-up)\n"
               "  --max-grad-norm X  clip the global gradient norm to X before each update\n"
               "  --shard S        none (default), optimizer, gradients or parameters (ZeRO stages 1-3)\n"
               "  --prefetch N     with --shard parameters: layers gathered ahead of the one that runs (1)\n"
               "  --offload        with GPUs and --shard optimizer or above: the optimizer on the host\n"
               "  --recompute N    activation recomputation in N segments of the model's layers\n"
               "  --checkpoint DIR save a checkpoint under DIR at every evaluation and at the end;\n"
               "                   DIR/latest names the newest\n"
               "  --checkpoint-every N  also every N steps\n"
               "  --keep-checkpoints K  keep DIR's newest K checkpoints (default 3; at least 1)\n"
               "  --resume DIR     continue from DIR's newest checkpoint (or DIR itself): the same weights,\n"
               "                   optimizer state and data position; --steps stays the total\n"
               "  --devices D,...  the devices of this process: cpu:0 (default), cpu:0,cpu:1, gpu:0,gpu:1,\n"
               "                   a mix; --device D is the same for one device\n"
               "  --dist           data-parallel across the processes of an mpirun job too (rank 0 prints)\n"
               "  --pipeline S     pipeline the model's layers over --devices (one stage per device, in\n"
               "                   order) instead of data parallelism, with schedule S: gpipe, 1f1b, zb-h1 or\n"
               "                   interleaved-1f1b (in this process; lm_head tied to wte across devices)\n"
               "  --chunks M       with --pipeline: micro-batches per step (default 4)\n"
               "  --virtual-stages V  with --pipeline: model chunks per device (interleaved-1f1b; default 1,\n"
               "                   2 for interleaved-1f1b)\n"
               "  --balance L,...  with --pipeline: layers per stage (default: as even as they divide)\n"
               "  --bucket-kb N    gradient bucket capacity in KiB (default 25 MiB, as PyTorch DDP;\n"
               "                   0: one bucket per parameter)\n"
               "  --no-overlap     reduce the buckets only after the whole backward\n"
               "  --hybridize      capture one training step and replay it for every step (one device, no\n"
               "                   --dist, a constant learning rate, no --checkpoint or --resume)\n"
               "  --bulk N         push each step's ops in bulks of up to N (default 0: off)\n"
               "  --precision P    fp32, tf32, bf16 or fp16 (mixed precision; fp16 with dynamic loss\n"
               "                   scaling). Default: tf32 when a GPU trains, else fp32\n"
               "  --trace FILE     write the training's trace (chrome://tracing / Perfetto JSON)\n"
               "  --seed N         seed of the initial weights and of the batches' offsets (default 0)\n"
               "  --json           one JSON line per evaluation and a summary line at the end\n"
               "  --help           this text\n"
               "\n"
               "Prints the data, the model, and per evaluation: the step, the training loss (mean nats per\n"
               "byte over the steps since the previous report; with --dist, rank 0's share), the validation\n"
               "loss, training tokens per second since the previous report (evaluation excluded) and the\n"
               "seconds since training began. Exit status: 0 done, 2 bad arguments or data, 1 failure\n"
               "while training.\n",
               kProgram, kProgram, kProgram, weft::nn::GptConfig::tiny().describe().c_str(),
               weft::nn::GptConfig::small().describe().c_str(), kLag, weft::default_text_corpus().c_str());
}

// Returns false when --help was given (usage already printed).
bool parse(int argc, char** argv, Options& o) {
  bool virtual_given = false;
  o.optimizer = "adamw";
  o.batch_size = 16;
  ArgCursor args(argc, argv);
  while (args.next()) {
    const std::string& arg = args.flag();
    auto take = [&]() -> std::string {
      std::optional<std::string> v = args.value();
      if (!v) throw UsageError{arg + " needs a value"};
      return *std::move(v);
    };
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return false;
    } else if (arg == "--model") {
      o.model = take();
      (void)model_config(o.model);
    } else if (arg == "--context") {
      o.context = parse_int_flag<std::int64_t>(arg, take(), 1);
    } else if (arg == "--steps") {
      o.steps = parse_int_flag<std::int64_t>(arg, take(), 1);
    } else if (arg == "--minutes") {
      o.minutes = parse_float_flag(arg, take());
    } else if (arg == "--eval-every") {
      o.eval_every = parse_int_flag<std::int64_t>(arg, take(), 1);
    } else if (arg == "--eval-batches") {
      o.eval_batches = parse_int_flag<std::int64_t>(arg, take(), 1);
    } else if (arg == "--data") {
      o.data = take();
      if (o.data.empty()) throw UsageError{"--data needs a file"};
    } else if (arg == "--pipeline") {
      o.pipeline = take();
    } else if (arg == "--chunks") {
      o.chunks = parse_int_flag<int>(arg, take(), 1);
    } else if (arg == "--virtual-stages") {
      o.virtual_stages = parse_int_flag<int>(arg, take(), 1);
      virtual_given = true;
    } else if (arg == "--balance") {
      const std::string text = take();
      o.balance.clear();
      for (std::size_t pos = 0; pos <= text.size();) {
        const std::size_t comma = std::min(text.find(',', pos), text.size());
        o.balance.push_back(parse_int_flag<int>(arg, text.substr(pos, comma - pos), 1));
        pos = comma + 1;
      }
    } else if (!parse_train_flag(args, o)) {
      throw UsageError{"unknown argument '" + arg + "'"};
    }
  }
  check_train_flags(o);
  if (!o.pipeline.empty()) {
    if (o.pipeline == "interleaved-1f1b" && !virtual_given) o.virtual_stages = 2;
    // What the pipeline does not take (it trains in one process, its stages
    // on --devices; weft-pipeline --dist pipelines across processes).
    const std::pair<bool, const char*> refused[] = {
        {o.dist, "--dist"}, {o.shard != weft::parallel::Shard::none, "--shard"}, {o.offload, "--offload"},
        {o.recompute > 0, "--recompute"}, {o.hybridize, "--hybridize"}, {o.bulk > 1, "--bulk"},
        {o.max_grad_norm.has_value(), "--max-grad-norm"}, {!o.checkpoint.empty(), "--checkpoint"},
        {!o.resume.empty(), "--resume"}, {o.bucket_bytes.has_value(), "--bucket-kb"}};
    for (const auto& [given, flag] : refused)
      if (given) throw UsageError{std::string("--pipeline trains the stages in this process; it takes no ") + flag};
  } else if (!o.balance.empty() || virtual_given) {
    throw UsageError{"--balance and --virtual-stages need --pipeline"};
  }
  const weft::nn::GptConfig config = model_config(o.model);
  if (o.context && *o.context > config.context)
    throw UsageError{"--context " + std::to_string(*o.context) + " is longer than the model's context " +
                     std::to_string(config.context) + " (--model " + o.model + ": " + config.describe() + ")"};
  return true;
}

// Steps pushed but not read back: each replica's mean loss and its tokens.
struct Pending {
  std::vector<std::pair<weft::Tensor, std::int64_t>> parts;
};

struct Tally {
  double loss_sum = 0;  // nats, summed over tokens
  std::int64_t tokens = 0, steps = 0;
  void read(const Pending& p) {
    for (const auto& [loss, tokens_of] : p.parts) {
      loss_sum += static_cast<double>(loss.item()) * static_cast<double>(tokens_of);
      tokens += tokens_of;
    }
    ++steps;
  }
  double loss() const { return tokens ? loss_sum / static_cast<double>(tokens) : 0.0; }
};

// The mean validation loss (nats per byte) over the fixed batches, of
// `forward` (an evaluation-mode forward: ids on `device` -> logits).
double validation_loss(weft::Engine& engine, const std::function<weft::Tensor(const weft::Tensor&)>& forward,
                       const weft::TextCorpus& corpus, std::int64_t batches, std::int64_t batch, weft::Device device) {
  const weft::Shape shape{batch, corpus.context()};
  std::deque<Pending> pending;
  Tally tally;
  std::vector<float> x, y;
  for (std::int64_t i = 0; i < batches; ++i) {
    corpus.validation_batch(i, batches, batch, x, y);
    const weft::Tensor logits = forward(weft::Tensor::from_host(engine, shape, x, device));
    const weft::ops::SoftmaxCrossEntropy sce =
        weft::nn::lm_loss(logits, weft::Tensor::from_host(engine, shape, y, logits.device()));
    pending.push_back(Pending{{{sce.loss, batch * corpus.context()}}});
    if (pending.size() > kLag) {
      tally.read(pending.front());
      pending.pop_front();
    }
  }
  for (const Pending& p : pending) tally.read(p);
  return tally.loss();
}

double validation_loss(weft::Engine& engine, weft::nn::Sequential& net, const weft::TextCorpus& corpus,
                       std::int64_t batches, std::int64_t batch, weft::Device device) {
  net.train(false);
  const double loss = validation_loss(
      engine, [&](const weft::Tensor& x) { return net.forward(x); }, corpus, batches, batch, device);
  net.train(true);
  return loss;
}

// Layers per stage as even as they divide (the first and last stages' extra
// layers, the embeddings and the head, are light: the remainder goes to the
// middle stages first).
std::vector<int> even_balance(int layers, int stages) {
  std::vector<int> out(static_cast<std::size_t>(stages), layers / stages);
  for (int k = 0; k < layers % stages; ++k) ++out[static_cast<std::size_t>((stages / 2 + k) % stages)];
  return out;
}

// --pipeline: the model's layers in stages over the devices, trained by
// weft::parallel::Pipeline under the schedule; the loss and report as the
// data-parallel run's.
int run_pipelined(const Options& o, weft::Engine& engine, const std::vector<weft::Device>& devices,
                  const weft::nn::GptConfig& config, const weft::TextCorpus& corpus, const std::string& file,
                  weft::Precision precision, const weft::optim::OptimizerOptions& optimizer,
                  const weft::optim::LrSchedule& schedule) {
  const std::int64_t context = corpus.context();
  auto model = weft::nn::gpt(engine, config, devices[0], o.seed);
  const int stages = static_cast<int>(devices.size()) * o.virtual_stages;
  const std::vector<int> balance = o.balance.empty() ? even_balance(static_cast<int>(model->size()), stages) : o.balance;
  std::size_t parameters = 0;
  for (weft::nn::Parameter* p : model->parameters()) parameters += static_cast<std::size_t>(p->value.numel());
  std::optional<weft::parallel::Pipeline> pipe_made;
  try {
    weft::parallel::PipelineOptions options{.balance = balance,
                                            .devices = devices,
                                            .chunks = o.chunks,
                                            .virtual_stages = o.virtual_stages,
                                            .schedule = o.pipeline,
                                            .optimizer = optimizer,
                                            .precision = precision};
    if (weft::needs_loss_scaling(precision)) options.loss_scaling = weft::parallel::LossScaling{};
    pipe_made.emplace(engine, *model, std::move(options), [](const weft::Tensor& logits, const weft::Tensor& targets) {
      weft::ops::SoftmaxCrossEntropy l = weft::nn::lm_loss(logits, targets);
      return weft::parallel::MicroBatchLoss{l.loss, l.dlogits};
    });
  } catch (const weft::InvalidArgument& e) {
    std::fprintf(stderr, "%s: --pipeline %s: %s\n", kProgram, o.pipeline.c_str(), e.what());
    return 2;
  }
  weft::parallel::Pipeline& pipe = *pipe_made;
  std::string balance_text;
  for (int b : balance) {
    if (!balance_text.empty()) balance_text += ',';
    balance_text += std::to_string(b);
  }
  std::printf("data: %s: %lld bytes, %lld training and %lld validation; context %lld\n", file.c_str(),
              static_cast<long long>(corpus.size()), static_cast<long long>(corpus.train_size()),
              static_cast<long long>(corpus.validation_size()), static_cast<long long>(context));
  std::printf("model: GPT %s (%s), %zu parameters\n", o.model.c_str(), config.describe().c_str(), parameters);
  std::printf("pipelined over %s (%s engine): schedule %s, %d stages (balance %s), %d micro-batches of %lld "
              "sequences; %lld steps, lr %g, precision %s\n",
              device_list_str(devices).c_str(), std::string(engine.kind()).c_str(), o.pipeline.c_str(), stages,
              balance_text.c_str(), o.chunks, static_cast<long long>(o.batch_size / o.chunks),
              static_cast<long long>(o.steps), static_cast<double>(optimizer.lr),
              std::string(weft::to_string(precision)).c_str());
  std::fflush(stdout);
  for (weft::Device d : devices) engine.allocator(d).reset_peak();
  weft::Profiler& profiler = engine.profiler();
  engine.wait_all();
  if (!o.trace.empty()) {
    profiler.clear();
    profiler.start();
  }
  const std::int64_t tokens_per_step = o.batch_size * context;
  const weft::Shape shape{o.batch_size, context};
  const auto begin = Clock::now();
  auto t0 = begin;
  double train_seconds = 0, since_report_seconds = 0, val_loss = NAN;
  std::int64_t step = 0, report_steps = 0;
  bool time_up = false;
  std::deque<Pending> pending;
  Tally tally, last;
  auto evaluate = [&] {
    for (; !pending.empty(); pending.pop_front()) tally.read(pending.front());
    engine.wait_all();
    const double secs = seconds_since(t0);
    train_seconds += secs;
    since_report_seconds += secs;
    val_loss = validation_loss(
        engine, [&](const weft::Tensor& x) { return pipe.forward(x); }, corpus, o.eval_batches, o.batch_size,
        devices[0]);
    const double tokens_per_s =
        since_report_seconds > 0 ? static_cast<double>(report_steps * tokens_per_step) / since_report_seconds : 0.0;
    std::printf("step %lld: train loss %.4f, val loss %.4f, %.0f tokens/s, %.1f s\n", static_cast<long long>(step),
                tally.loss(), val_loss, tokens_per_s, seconds_since(begin));
    if (o.json)
      std::printf("{\"eval\":%lld,\"train_loss\":%s,\"val_loss\":%s,\"tokens_per_s\":%.1f,\"seconds\":%.3f}\n",
                  static_cast<long long>(step), json_number(tally.loss()).c_str(), json_number(val_loss).c_str(),
                  tokens_per_s, seconds_since(begin));
    std::fflush(stdout);
    last = tally;
    tally = Tally{};
    report_steps = 0;
    since_report_seconds = 0;
    t0 = Clock::now();
  };
  std::vector<float> x, y;
  while (step < o.steps && !time_up) {
    corpus.train_batch(o.seed, step, o.batch_size, x, y);
    const weft::Tensor loss = pipe.train_step(weft::Tensor::from_host(engine, shape, x, devices.front()),
                                              weft::Tensor::from_host(engine, shape, y, devices.back()));
    pipe.step(schedule.lr(optimizer.lr, step));
    pending.push_back(Pending{{{loss, tokens_per_step}}});
    ++step;
    ++report_steps;
    if (pending.size() > kLag) {
      tally.read(pending.front());
      pending.pop_front();
    }
    if (o.minutes > 0) time_up = seconds_since(begin) >= o.minutes * 60.0;
    if (step % o.eval_every == 0 || step == o.steps || time_up) evaluate();
  }
  if (!o.trace.empty()) {
    profiler.stop();
    profiler.dump(o.trace);
  }
  const double tokens_per_s =
      train_seconds > 0 ? static_cast<double>(step * tokens_per_step) / train_seconds : 0.0;
  std::uint64_t digest = 0xcbf29ce484222325ull;  // FNV-1a over the parameters' float32 bytes, in order
  for (weft::nn::Parameter* p : model->parameters())
    for (float v : p->value.to_host()) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, &v, sizeof bits);
      for (int k = 0; k < 4; ++k) digest = (digest ^ ((bits >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
    }
  std::printf("done: %lld steps, train loss %.4f, val loss %.4f, %.0f tokens/s (training), %.1f s, schedule %s%s\n",
              static_cast<long long>(step), last.loss(), val_loss, tokens_per_s, seconds_since(begin),
              o.pipeline.c_str(), time_up ? " (--minutes reached)" : "");
  const PeakReport peaks = peak_report(engine, devices);
  std::printf("peak memory allocated: %s\n", peaks.text.c_str());
  if (o.json)
    std::printf("{\"model\":\"gpt-%s\",\"steps\":%lld,\"tokens_per_s\":%.1f,\"val_loss\":%s,\"train_loss\":%s,"
                "\"seconds\":%.3f,\"precision\":\"%s\",\"devices\":\"%s\",\"pipeline\":\"%s\",\"chunks\":%d,"
                "\"virtual_stages\":%d,\"balance\":[%s],\"batch_size\":%lld,\"context\":%lld,\"parameters\":%zu,"
                "\"lr\":%g,\"optimizer\":\"%s\",\"lr_schedule\":\"%s\",\"minutes_reached\":%s,\"loss_scale\":%g,"
                "\"skipped_steps\":%lld,\"peak_bytes\":{%s},\"weights_digest\":\"%016llx\"}\n",
                o.model.c_str(), static_cast<long long>(step), tokens_per_s, json_number(val_loss).c_str(),
                json_number(last.loss()).c_str(), seconds_since(begin), std::string(weft::to_string(precision)).c_str(),
                device_list_str(devices).c_str(), o.pipeline.c_str(), o.chunks, o.virtual_stages,
                balance_text.c_str(), static_cast<long long>(o.batch_size), static_cast<long long>(context),
                parameters, static_cast<double>(optimizer.lr), o.optimizer.c_str(), schedule.str().c_str(),
                time_up ? "true" : "false", static_cast<double>(pipe.loss_scale()),
                static_cast<long long>(pipe.skipped_steps()), peaks.json.c_str(),
                static_cast<unsigned long long>(digest));
  return 0;
}

int run(int argc, char** argv) {
  Options o;
  try {
    if (!parse(argc, argv, o)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", kProgram, e.message.c_str(), kProgram);
    return 2;
  }
  std::vector<weft::Device> devices;
  try {
    devices = parse_device_list(o.devices);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "%s: bad --devices: %s\n", kProgram, e.what());
    return 2;
  }
  weft::nn::GptConfig config = model_config(o.model);
  const std::int64_t context = o.context.value_or(config.context);
  const std::string json_name = "gpt-" + o.model;

  // ---- data ----
  const std::string file = o.data.empty() ? weft::default_text_corpus() : o.data;
  std::optional<weft::TextCorpus> corpus_made;
  try {
    corpus_made.emplace(weft::TextCorpus::load(file, context));
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "%s: cannot read the text: %s\n", kProgram, e.what());
    if (o.data.empty())
      std::fprintf(stderr, "  pass --data FILE or set WEFT_TEXT_CORPUS (scripts/setup-debian.sh writes %s)\n",
                   file.c_str());
    return 2;
  }
  const weft::TextCorpus& corpus = *corpus_made;

  try {
    const weft::Precision precision = precision_of(o, devices);
    std::unique_ptr<weft::Engine> engine = weft::Engine::create(engine_config(devices));
    if (!devices_available(*engine, devices, kProgram)) return 2;
    const weft::optim::OptimizerOptions optimizer = optimizer_of(o);
    const weft::optim::LrSchedule schedule = weft::optim::LrSchedule::parse(o.lr_schedule, "--lr-schedule");
    if (!hybridize_allowed(o, schedule, kProgram)) return 2;

    // --resume: the checkpoint, opened and checked before anything is built.
    std::optional<weft::checkpoint::Reader> resume;
    std::int64_t start_step = 0;
    std::uint64_t seed = o.seed;
    if (!o.resume.empty()) {
      try {
        resume.emplace(open_resume(o.resume));
        auto field = [&](const char* key) { return metadata_field(*resume, key); };
        const std::string where = "checkpoint '" + resume->path().string() + "'";
        if (field("weft.model") != json_name)
          throw weft::InvalidArgument(where + " is of model '" + field("weft.model") + "', not " + json_name);
        if (std::stoll(field("weft.batch_size")) != o.batch_size || std::stoll(field("weft.context")) != context)
          throw weft::InvalidArgument(where + " was trained with batch " + field("weft.batch_size") + " and context " +
                                      field("weft.context") + "; give the same --batch-size and --context to "
                                      "continue its data order");
        if (std::stoll(field("weft.text_bytes")) != corpus.size())
          throw weft::InvalidArgument(where + " was trained on a text of " + field("weft.text_bytes") + " bytes (" +
                                      field("weft.text") + "), " + file + " has " + std::to_string(corpus.size()));
        start_step = std::stoll(field("weft.data_step"));
        seed = std::stoull(field("weft.seed"));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: cannot resume from '%s': %s\n", kProgram, o.resume.c_str(), e.what());
        return 2;
      }
      if (start_step > o.steps) {
        std::fprintf(stderr, "%s: the checkpoint in '%s' is at step %lld already; --steps %lld is the total to reach\n",
                     kProgram, o.resume.c_str(), static_cast<long long>(start_step), static_cast<long long>(o.steps));
        return 2;
      }
    }

    if (!o.pipeline.empty())
      return run_pipelined(o, *engine, devices, config, corpus, file, precision, optimizer, schedule);

    std::optional<weft::parallel::DataParallel> dp_made;
    try {
      dp_made.emplace(
          *engine, devices,
          [&](weft::Device d) {
            auto net = weft::nn::gpt(*engine, config, d, o.seed);
            net->set_precision(precision);
            if (o.recompute > 0) net->recompute(o.recompute);
            return net;
          },
          data_parallel_options(o, precision, optimizer));
    } catch (const weft::InvalidArgument& e) {
      std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
      return 2;
    }
    weft::parallel::DataParallel& dp = *dp_made;
    const bool main_rank = dp.process_rank() == 0;
    auto say = [&](const char* fmt, auto... args) {
      if (!main_rank) return;
      std::printf(fmt, args...);
      std::fflush(stdout);
    };
    const std::int64_t world = dp.world_size();
    const bool several = world > 1;
    if (o.hybridize && several) {
      std::fprintf(stderr, "%s: --hybridize trains on one device without --dist (got %lld replicas)\n", kProgram,
                   static_cast<long long>(world));
      return 2;
    }
    if (o.batch_size < world) {
      std::fprintf(stderr, "%s: --batch-size %lld gives no sequence to some of the %lld replicas\n", kProgram,
                   static_cast<long long>(o.batch_size), static_cast<long long>(world));
      return 2;
    }
    say("data: %s: %lld bytes, %lld training and %lld validation; context %lld\n", file.c_str(),
        static_cast<long long>(corpus.size()), static_cast<long long>(corpus.train_size()),
        static_cast<long long>(corpus.validation_size()), static_cast<long long>(context));
    std::size_t parameters = 0;
    {
      const weft::parallel::DataParallel::FullParameters full = dp.full_parameters();
      for (weft::nn::Parameter* p : dp.replica(0).parameters())
        parameters += static_cast<std::size_t>(p->value.shape().numel());
    }
    say("model: GPT %s (%s), %zu parameters\n", o.model.c_str(), config.describe().c_str(), parameters);
    std::string where = device_list_str(devices);
    if (dp.processes() > 1) where.append(" in each of ").append(std::to_string(dp.processes())).append(" processes");
    say("training on %s (%s engine): %lld steps of %lld sequences x %lld bytes%s, lr %g, seed %llu, precision %s%s\n",
        where.c_str(), std::string(engine->kind()).c_str(), static_cast<long long>(o.steps),
        static_cast<long long>(o.batch_size), static_cast<long long>(context),
        several ? (" split over " + std::to_string(world) + " replicas").c_str() : "",
        static_cast<double>(optimizer.lr), static_cast<unsigned long long>(seed),
        std::string(weft::to_string(precision)).c_str(),
        weft::needs_loss_scaling(precision) ? " (dynamic loss scaling)" : "");
    say("optimizer: %s, lr schedule %s%s, shard %s\n", optimizer.str().c_str(), schedule.str().c_str(),
        o.max_grad_norm ? (", gradient norm clipped to " + std::to_string(*o.max_grad_norm)).c_str() : "",
        std::string(weft::parallel::to_string(o.shard)).c_str());
    if (resume) {
      try {
        dp.load_checkpoint(*resume);
      } catch (const weft::InvalidArgument& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s: cannot resume from '%s': %s\n", kProgram, o.resume.c_str(), e.what());
        return 2;
      }
      say("resumed from %s: step %lld\n", resume->path().c_str(), static_cast<long long>(start_step));
    }
    CheckpointSaver checkpoints(o);
    if (checkpoints.on() && main_rank) {
      try {
        checkpoints.lock();
      } catch (const weft::InvalidArgument& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s: --checkpoint %s: %s\n", kProgram, o.checkpoint.c_str(), e.what());
        return 2;
      }
    }
    std::int64_t step = start_step;  // batches drawn so far: the data's position
    auto save_checkpoint = [&] {
      checkpoints.save(dp, {{"weft.model", json_name},
                            {"weft.data_step", std::to_string(step)},
                            {"weft.seed", std::to_string(seed)},
                            {"weft.batch_size", std::to_string(o.batch_size)},
                            {"weft.context", std::to_string(context)},
                            {"weft.text", file},
                            {"weft.text_bytes", std::to_string(corpus.size())},
                            {"weft.optimizer", optimizer.str()},
                            {"weft.lr_schedule", schedule.str()},
                            {"weft.precision", std::string(weft::to_string(precision))}});
    };

    // This process's replicas' rows of each batch.
    const std::vector<std::int64_t> rows = weft::parallel::split_rows(o.batch_size, static_cast<int>(world));
    const std::size_t first_replica = static_cast<std::size_t>(dp.process_rank()) * devices.size();
    const weft::Shape batch_shape{o.batch_size, context};
    struct Hybrid {
      weft::Tensor x, y, loss;
      weft::OpGraph step;
    };
    std::optional<Hybrid> hybrid;
    auto capture_step = [&] {
      Hybrid h;
      h.x = weft::Tensor::empty(*engine, batch_shape, devices[0]);
      h.y = weft::Tensor::empty(*engine, batch_shape, devices[0]);
      engine->begin_capture({});
      try {
        const std::vector<weft::Tensor> logits = dp.forward({h.x});
        const weft::ops::SoftmaxCrossEntropy sce = weft::nn::lm_loss(logits[0], h.y);
        h.loss = sce.loss;
        dp.backward({sce.dlogits});
        dp.step(optimizer.lr);
      } catch (...) {
        (void)engine->end_capture();
        throw;
      }
      h.step = engine->end_capture();
      say("  captured the training step: %zu ops, %zu dependencies, %zu variables\n", h.step.ops(),
          h.step.dependencies(), h.step.vars());
      return h;
    };

    for (weft::Device d : devices) engine->allocator(d).reset_peak();
    weft::Profiler& profiler = engine->profiler();
    engine->wait_all();
    if (!o.trace.empty()) {
      profiler.clear();
      profiler.start();
    }
    const auto begin = Clock::now();
    double train_seconds = 0, since_report_seconds = 0;
    std::int64_t trained_steps = 0, report_steps = 0;
    auto t0 = Clock::now();
    std::deque<Pending> pending;
    Tally tally, last;
    double val_loss = NAN;
    std::int64_t evaluated_at = -1;
    bool time_up = false;
    const std::int64_t tokens_per_step = o.batch_size * context;  // over every replica of every process

    auto evaluate = [&](bool save) {
      while (!pending.empty()) {
        tally.read(pending.front());
        pending.pop_front();
      }
      engine->wait_all();  // the last update too
      const double secs = seconds_since(t0);
      train_seconds += secs;
      since_report_seconds += secs;
      {
        const weft::parallel::DataParallel::FullParameters full = dp.full_parameters();
        if (main_rank) val_loss = validation_loss(*engine, dp.replica(0), corpus, o.eval_batches, o.batch_size, devices[0]);
      }
      const double tokens_per_s =
          since_report_seconds > 0 ? static_cast<double>(report_steps * tokens_per_step) / since_report_seconds : 0.0;
      const double elapsed = seconds_since(begin);
      if (!std::isfinite(tally.loss()))
        say("  warning: the training loss is %f: the learning rate %g is too high\n", tally.loss(),
            static_cast<double>(optimizer.lr));
      say("step %lld: train loss %.4f, val loss %.4f, %.0f tokens/s, %.1f s\n", static_cast<long long>(step),
          tally.loss(), val_loss, tokens_per_s, elapsed);
      if (o.json)
        say("{\"eval\":%lld,\"train_loss\":%s,\"val_loss\":%s,\"tokens_per_s\":%.1f,\"seconds\":%.3f}\n",
            static_cast<long long>(step), json_number(tally.loss()).c_str(), json_number(val_loss).c_str(),
            tokens_per_s, elapsed);
      if (save) save_checkpoint();
      last = tally;
      tally = Tally{};
      report_steps = 0;
      since_report_seconds = 0;
      evaluated_at = step;
      t0 = Clock::now();
    };

    std::vector<float> x, y;
    while (step < o.steps && !time_up) {
      corpus.train_batch(seed, step, o.batch_size, x, y);
      {
        std::optional<weft::BulkScope> bulk;
        if (o.bulk > 1) bulk.emplace(*engine, o.bulk);
        Pending p;
        if (o.hybridize) {
          if (!hybrid) hybrid = capture_step();
          hybrid->x.copy_from(weft::Tensor::from_host(*engine, batch_shape, x, devices[0]));
          hybrid->y.copy_from(weft::Tensor::from_host(*engine, batch_shape, y, devices[0]));
          engine->replay(hybrid->step);
          // A copy: the next replay overwrites the step's own output.
          p.parts.emplace_back(hybrid->loss.copy_to(devices[0]), tokens_per_step);
        } else {
          const std::vector<weft::Tensor> xs = dp.split_and_load(batch_shape, x);
          const std::vector<weft::Tensor> ys = dp.split_and_load(batch_shape, y);
          const std::vector<weft::Tensor> logits = dp.forward(xs);
          std::vector<weft::Tensor> dlogits;
          for (std::size_t r = 0; r < logits.size(); ++r) {
            weft::ops::SoftmaxCrossEntropy sce = weft::nn::lm_loss(logits[r], ys[r]);
            dlogits.push_back(sce.dlogits);
            p.parts.emplace_back(sce.loss, rows[first_replica + r] * context);
          }
          dp.backward(dlogits);
          dp.step(schedule.lr(optimizer.lr, dp.steps()));
        }
        pending.push_back(std::move(p));
      }
      ++step;
      ++trained_steps;
      ++report_steps;
      if (pending.size() > kLag) {
        tally.read(pending.front());
        pending.pop_front();
      }
      if (o.minutes > 0) {
        const bool mine = seconds_since(begin) >= o.minutes * 60.0;
        // Across processes the ranks agree (a collective: every kLag steps).
        if (!o.dist) time_up = mine;
        else if (step % static_cast<std::int64_t>(kLag) == 0) time_up = dp.agree_steps(mine ? 0 : 1) == 0;
      }
      if (step % o.eval_every == 0 || step == o.steps || time_up) {
        evaluate(true);
      } else if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) {
        save_checkpoint();
      }
    }
    if (evaluated_at != step) evaluate(false);  // resumed at the end: the loaded state's validation loss
    checkpoints.wait();  // a failed write fails the run
    if (!o.trace.empty()) {
      profiler.stop();
      if (main_rank) profiler.dump(o.trace);
    }
    const double seconds = seconds_since(begin);
    const double tokens_per_s =
        train_seconds > 0 ? static_cast<double>(trained_steps * tokens_per_step) / train_seconds : 0.0;

    const std::uint64_t digest = weights_digest(dp);
    const std::string opt_digest = main_rank ? optimizer_digest(dp, o.checkpoint) : "null";
    say("done: %lld steps, train loss %.4f, val loss %.4f, %.0f tokens/s (training), %.1f s on %s%s\n",
        static_cast<long long>(step), last.loss(), val_loss, tokens_per_s, seconds, where.c_str(),
        time_up ? " (--minutes reached)" : "");
    const PeakReport peaks = peak_report(*engine, devices);
    say("peak memory allocated: %s\n", peaks.text.c_str());
    if (weft::needs_loss_scaling(precision))
      say("loss scale %g at the end, %lld of %lld steps skipped (Inf/NaN gradients)\n",
          static_cast<double>(dp.loss_scale()), static_cast<long long>(dp.skipped_steps()),
          static_cast<long long>(dp.steps()));
    if (o.json)
      say("{\"model\":\"%s\",\"steps\":%lld,\"tokens_per_s\":%.1f,\"val_loss\":%s,\"train_loss\":%s,\"seconds\":%.3f,"
          "\"precision\":\"%s\",\"devices\":\"%s\",\"shard\":\"%s\",\"processes\":%d,\"replicas\":%lld,"
          "\"batch_size\":%lld,\"context\":%lld,\"parameters\":%zu,\"lr\":%g,\"optimizer\":\"%s\","
          "\"lr_schedule\":\"%s\",\"hybridize\":%s,\"bulk\":%zu,\"minutes_reached\":%s,\"resumed_at_step\":%lld,"
          "\"trained_steps\":%lld,\"loss_scale\":%g,\"skipped_steps\":%lld,\"peak_bytes\":{%s},"
          "\"text_bytes\":%lld,\"weights_digest\":\"%016llx\",\"optimizer_digest\":%s,\"offload\":%s,"
          "\"recompute\":%d}\n",
          json_name.c_str(), static_cast<long long>(step), tokens_per_s, json_number(val_loss).c_str(),
          json_number(last.loss()).c_str(), seconds, std::string(weft::to_string(precision)).c_str(),
          device_list_str(devices).c_str(), std::string(weft::parallel::to_string(o.shard)).c_str(), dp.processes(),
          static_cast<long long>(world), static_cast<long long>(o.batch_size), static_cast<long long>(context),
          parameters, static_cast<double>(optimizer.lr), o.optimizer.c_str(), schedule.str().c_str(),
          o.hybridize ? "true" : "false", o.bulk > 1 ? o.bulk : std::size_t{0}, time_up ? "true" : "false",
          static_cast<long long>(start_step), static_cast<long long>(trained_steps),
          static_cast<double>(dp.loss_scale()), static_cast<long long>(dp.skipped_steps()), peaks.json.c_str(),
          static_cast<long long>(corpus.size()), static_cast<unsigned long long>(digest), opt_digest.c_str(),
          o.offload ? "true" : "false", o.recompute);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: training failed: %s\n", kProgram, e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
