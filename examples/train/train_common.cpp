// The trainers' shared flags, set-up, checkpoint bookkeeping and report
// helpers (train_common.h).
#include "train_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "device_list.h"
#include "weft/error.h"
#include "weft/nn.h"

namespace weft::examples {

float parse_float_flag(std::string_view flag, const std::string& text) {
  char* end = nullptr;
  const float v = std::strtof(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0)
    throw UsageError{std::string(flag) + " wants a positive number, got '" + text + "'"};
  return v;
}

bool parse_train_flag(ArgCursor& args, TrainFlags& o) {
  const std::string& arg = args.flag();
  auto take = [&]() -> std::string {
    std::optional<std::string> v = args.value();
    if (!v) throw UsageError{arg + " needs a value"};
    return *std::move(v);
  };
  if (arg == "--json") {
    if (args.has_inline_value()) throw UsageError{"--json takes no value"};
    o.json = true;
  } else if (arg == "--batch-size") {
    o.batch_size = parse_int_flag<std::int64_t>(arg, take(), 1);
  } else if (arg == "--lr") {
    o.lr = parse_float_flag(arg, take());
    o.lr_given = true;
  } else if (arg == "--optimizer") {
    o.optimizer = take();
    try {
      (void)weft::optim::OptimizerOptions::parse(o.optimizer, 0.1f, "--optimizer");
    } catch (const weft::Error& e) {
      throw UsageError{e.what()};
    }
  } else if (arg == "--weight-decay") {
    const std::string v = take();
    char* end = nullptr;
    const float wd = std::strtof(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(wd) || wd < 0)
      throw UsageError{"--weight-decay wants a number >= 0, got '" + v + "'"};
    o.weight_decay = wd;
  } else if (arg == "--lr-schedule") {
    o.lr_schedule = take();
    try {
      (void)weft::optim::LrSchedule::parse(o.lr_schedule, "--lr-schedule");
    } catch (const weft::Error& e) {
      throw UsageError{e.what()};
    }
  } else if (arg == "--max-grad-norm") {
    o.max_grad_norm = parse_float_flag(arg, take());
  } else if (arg == "--shard") {
    try {
      o.shard = weft::parallel::parse_shard(take(), "--shard");
    } catch (const weft::Error& e) {
      throw UsageError{e.what()};
    }
  } else if (arg == "--prefetch") {
    o.prefetch = parse_int_flag<int>(arg, take(), 0);
  } else if (arg == "--offload") {
    if (args.has_inline_value()) throw UsageError{"--offload takes no value"};
    o.offload = true;
  } else if (arg == "--recompute") {
    o.recompute = parse_int_flag<int>(arg, take(), 1);
  } else if (arg == "--checkpoint") {
    o.checkpoint = take();
    if (o.checkpoint.empty()) throw UsageError{"--checkpoint needs a directory"};
  } else if (arg == "--checkpoint-every") {
    o.checkpoint_every = parse_int_flag<std::int64_t>(arg, take(), 1);
  } else if (arg == "--keep-checkpoints") {
    o.keep_checkpoints = parse_int_flag<int>(arg, take(), 1);
  } else if (arg == "--resume") {
    o.resume = take();
    if (o.resume.empty()) throw UsageError{"--resume needs a directory"};
  } else if (arg == "--devices" || arg == "--device") {
    o.devices = take();
    o.devices_given = true;
    if (o.devices.empty()) throw UsageError{arg + " needs a device"};
  } else if (arg == "--dist") {
    if (args.has_inline_value()) throw UsageError{"--dist takes no value"};
    o.dist = true;
  } else if (arg == "--bucket-kb") {
    o.bucket_bytes = parse_int_flag<std::size_t>(arg, take(), 0) * 1024;
  } else if (arg == "--hybridize") {
    if (args.has_inline_value()) throw UsageError{"--hybridize takes no value"};
    o.hybridize = true;
  } else if (arg == "--bulk") {
    o.bulk = parse_int_flag<std::size_t>(arg, take(), 0);
  } else if (arg == "--no-overlap") {
    if (args.has_inline_value()) throw UsageError{"--no-overlap takes no value"};
    o.overlap = false;
  } else if (arg == "--trace") {
    o.trace = take();
    if (o.trace.empty()) throw UsageError{"--trace needs a file name"};
  } else if (arg == "--seed") {
    o.seed = parse_int_flag<std::uint64_t>(arg, take(), 0);
  } else if (arg == "--precision") {
    try {
      o.precision = weft::parse_precision(take(), "--precision");
    } catch (const weft::Error& e) {
      throw UsageError{e.what()};
    }
  } else {
    return false;
  }
  return true;
}

void check_train_flags(const TrainFlags& o) {
  if (o.checkpoint_every > 0 && o.checkpoint.empty()) throw UsageError{"--checkpoint-every needs --checkpoint DIR"};
  if (o.keep_checkpoints != 3 && o.checkpoint.empty()) throw UsageError{"--keep-checkpoints needs --checkpoint DIR"};
}

weft::EngineConfig engine_config(const std::vector<weft::Device>& devices) {
  weft::EngineConfig config;
  for (weft::Device d : devices)
    if (d.is_cpu()) config.cpu_devices = std::max(config.cpu_devices, d.index() + 1);
  return config;
}

weft::Precision precision_of(const TrainFlags& o, const std::vector<weft::Device>& devices) {
  const bool any_gpu = std::any_of(devices.begin(), devices.end(), [](weft::Device d) { return d.is_gpu(); });
  return o.precision.value_or(any_gpu ? weft::Precision::tf32 : weft::Precision::fp32);
}

weft::optim::OptimizerOptions optimizer_of(const TrainFlags& o) {
  const bool adaptive = o.optimizer == "adam" || o.optimizer == "adamw";
  weft::optim::OptimizerOptions optimizer =
      weft::optim::OptimizerOptions::parse(o.optimizer, o.lr_given || !adaptive ? o.lr : 1e-3f, "--optimizer");
  if (o.weight_decay) optimizer.weight_decay = *o.weight_decay;
  return optimizer;
}

weft::parallel::DataParallelOptions data_parallel_options(const TrainFlags& o, weft::Precision precision,
                                                          const weft::optim::OptimizerOptions& optimizer) {
  weft::parallel::DataParallelOptions dp_options{.bucket_bytes = o.bucket_bytes, .overlap = o.overlap,
                                                 .distributed = o.dist};
  if (weft::needs_loss_scaling(precision)) dp_options.loss_scaling = weft::parallel::LossScaling{};
  dp_options.optimizer = optimizer;
  dp_options.max_grad_norm = o.max_grad_norm;
  dp_options.shard = o.shard;
  dp_options.prefetch_layers = o.prefetch;
  if (o.offload) dp_options.offload = weft::Device::cpu_pinned(0);
  return dp_options;
}

weft::checkpoint::Reader open_resume(const std::string& resume) {
  std::filesystem::path from = resume;
  if (!std::filesystem::exists(from / "index.json") && !std::filesystem::is_regular_file(from))
    from = weft::checkpoint::latest(from);
  return weft::checkpoint::Reader::open(from);
}

std::string metadata_field(const weft::checkpoint::Reader& reader, const char* key) {
  const weft::checkpoint::Metadata& meta = reader.metadata();
  auto f = meta.find(key);
  if (f == meta.end())
    throw weft::InvalidArgument("checkpoint '" + reader.path().string() + "' has no '" + key +
                                "' in its metadata (not a checkpoint of this trainer)");
  return f->second;
}

void CheckpointSaver::save(weft::parallel::DataParallel& dp, weft::checkpoint::Metadata meta) {
  if (dir_.empty()) return;
  if (saving_) saving_->wait();  // the previous one (long done, as a rule)
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(dp.steps()));
  const std::filesystem::path run_dir = dir_;
  saving_ = dp.save_checkpoint(run_dir / name, std::move(meta), run_dir, keep_);
}

void CheckpointSaver::wait() {
  if (saving_) saving_->wait();
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string bytes_str(std::size_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

std::string peak_str(const weft::MemoryStats& m) {
  std::string out = bytes_str(m.peak_in_use) + " (";
  for (std::size_t k = 0; k < weft::kMemoryRoles; ++k)
    out += std::string(k ? ", " : "") + std::string(weft::to_string(static_cast<weft::MemoryRole>(k))) + " " +
           bytes_str(m.peak_by_role[k]);
  return out + ")";
}

PeakReport peak_report(weft::Engine& engine, const std::vector<weft::Device>& devices) {
  PeakReport r;
  for (weft::Device d : devices) {
    const weft::MemoryStats stats = weft::memory_stats(engine, d);
    r.text += (r.text.empty() ? "" : "; ") + d.str() + " " + peak_str(stats);
    r.json += (r.json.empty() ? "\"" : ",\"") + d.str() + "\":" + std::to_string(stats.peak_in_use);
  }
  return r;
}

bool devices_available(const weft::Engine& engine, const std::vector<weft::Device>& devices, const char* program) {
  const auto known = engine.devices();
  for (weft::Device d : devices)
    if (std::find(known.begin(), known.end(), d) == known.end()) {
      std::fprintf(stderr, "%s: device %s is not available (this machine has: %s)\n", program, d.str().c_str(),
                   device_list_str(known).c_str());
      return false;
    }
  return true;
}

bool hybridize_allowed(const TrainFlags& o, const weft::optim::LrSchedule& schedule, const char* program) {
  if (!o.hybridize ||
      (schedule.kind() == weft::optim::LrSchedule::Kind::constant && o.checkpoint.empty() && o.resume.empty()))
    return true;
  std::fprintf(stderr, "%s: --hybridize replays one captured step: it takes no --lr-schedule, --checkpoint or "
                       "--resume\n", program);
  return false;
}

namespace {

struct Fnv1a {
  std::uint64_t value = 14695981039346656037ull;
  void mix(const void* data, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) value = (value ^ b[i]) * 1099511628211ull;
  }
};

}  // namespace

std::uint64_t weights_digest(weft::parallel::DataParallel& dp) {
  Fnv1a h;
  const weft::parallel::DataParallel::FullParameters full = dp.full_parameters();
  for (weft::nn::Parameter* p : dp.replica(0).parameters()) {
    const std::vector<float> v = p->value.to_host();
    h.mix(p->name.data(), p->name.size());
    h.mix(v.data(), v.size() * sizeof(float));
  }
  return h.value;
}

std::string optimizer_digest(weft::parallel::DataParallel& dp, const std::string& checkpoint_dir) {
  if (checkpoint_dir.empty()) return "null";
  std::set<std::string> params;
  for (weft::nn::Parameter* p : dp.replica(0).parameters()) params.insert(p->name);
  const weft::checkpoint::Reader final_state = weft::checkpoint::Reader::open(weft::checkpoint::latest(checkpoint_dir));
  Fnv1a h;
  for (const std::string& name : final_state.names()) {
    if (params.count(name)) continue;
    const std::vector<std::byte> bytes = final_state.read(name);
    h.mix(name.data(), name.size());
    h.mix(bytes.data(), bytes.size());
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "\"%016llx\"", static_cast<unsigned long long>(h.value));
  return buf;
}

}  // namespace weft::examples
