// What the trainers share (weft-train-lenet, weft-train-resnet and
// weft-train-gpt): the training flags with one spelling and meaning
// (--devices, --dist, --batch-size, --lr, --optimizer, --weight-decay,
// --lr-schedule, --max-grad-norm, --shard, --prefetch, --offload,
// --recompute, --checkpoint, --checkpoint-every, --keep-checkpoints,
// --resume, --bucket-kb, --no-overlap, --hybridize, --bulk, --trace,
// --seed, --precision, --json), what they build from them (the engine's
// devices, the precision, the optimizer and its schedule, the
// DataParallelOptions), the checkpoint bookkeeping (opening --resume, the
// run directory's lock and its saves) and the report's helpers (JSON
// numbers, memory peaks, the weights' and optimizer state's digests).
#pragma once

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arg_cursor.h"
#include "weft/checkpoint.h"
#include "weft/device.h"
#include "weft/engine.h"
#include "weft/optim.h"
#include "weft/parallel/data_parallel.h"
#include "weft/precision.h"

namespace weft::examples {

using Clock = std::chrono::steady_clock;

// The shared flags' values (a program keeps its own flags beside them).
struct TrainFlags {
  std::int64_t batch_size = 256;
  float lr = 0.1f;
  bool lr_given = false;
  std::string devices = "cpu:0";
  bool devices_given = false;
  bool dist = false;
  std::optional<std::size_t> bucket_bytes;  // unset: DataParallel's default
  bool overlap = true;
  bool hybridize = false;
  std::size_t bulk = 0;  // 0: off
  std::string trace;
  std::uint64_t seed = 0;
  bool json = false;
  std::optional<weft::Precision> precision;  // unset: tf32 with a GPU among the devices, else fp32
  std::string optimizer = "sgd";
  std::optional<float> weight_decay;  // unset: the optimizer's default
  std::string lr_schedule = "constant";
  std::optional<float> max_grad_norm;
  weft::parallel::Shard shard = weft::parallel::Shard::none;
  bool offload = false;  // --offload: the optimizer on cpu_pinned(0)
  int prefetch = 1;      // --prefetch: stage 3's prefetch_layers
  int recompute = 0;     // --recompute: segments (0: off)
  std::string checkpoint;             // run directory; empty: none
  std::int64_t checkpoint_every = 0;  // steps; 0: at the program's own save points only
  int keep_checkpoints = 3;           // the newest kept in the run directory
  std::string resume;                 // run or checkpoint directory; empty: a fresh start
};

// A whole number >= min; a UsageError naming the flag otherwise.
template <class T>
T parse_int_flag(std::string_view flag, std::string_view text, T min) {
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError{std::string(flag) + " wants an integer, got '" + std::string(text) + "'"};
  if (v < min) throw UsageError{std::string(flag) + " must be at least " + std::to_string(min) + ", got " + std::string(text)};
  return v;
}
// A positive finite number; a UsageError naming the flag otherwise.
float parse_float_flag(std::string_view flag, const std::string& text);

// Takes `args`' current flag when it is a shared one (true), reading its
// value; a bad value is a UsageError naming the flag. --help,
// --epochs, --data and the program's own flags are left to the program.
bool parse_train_flag(ArgCursor& args, TrainFlags& o);
// The checks between shared flags once all are read (--checkpoint-every and
// --keep-checkpoints need --checkpoint).
void check_train_flags(const TrainFlags& o);

// The engine's settings for the devices (as many CPU devices as they name).
weft::EngineConfig engine_config(const std::vector<weft::Device>& devices);
// --precision, else tf32 with a GPU among the devices, else fp32.
weft::Precision precision_of(const TrainFlags& o, const std::vector<weft::Device>& devices);
// The optimizer: adam and adamw start from lr 0.001 unless --lr says.
weft::optim::OptimizerOptions optimizer_of(const TrainFlags& o);
// DataParallel's options from the flags (loss scaling for fp16).
weft::parallel::DataParallelOptions data_parallel_options(const TrainFlags& o, weft::Precision precision,
                                                          const weft::optim::OptimizerOptions& optimizer);

// --resume: the checkpoint of `from` (a checkpoint directory, or a run
// directory's newest), opened; throws weft::Error on a bad one.
weft::checkpoint::Reader open_resume(const std::string& from);
// The metadata value of `key`; weft::InvalidArgument naming the checkpoint
// and the key when it has none ("not a checkpoint of this trainer").
std::string metadata_field(const weft::checkpoint::Reader& reader, const char* key);

// --checkpoint DIR's saves: one directory per save, DIR/step-<steps>;
// DIR/latest follows once a save is whole; the newest --keep-checkpoints
// kept. Writes in the background; a save waits for the one before.
class CheckpointSaver {
 public:
  explicit CheckpointSaver(const TrainFlags& o) : dir_(o.checkpoint), keep_(o.keep_checkpoints) {}
  bool on() const { return !dir_.empty(); }
  // Takes the run directory's lock (a lock naming this host and pid; one
  // left by a dead job is taken over): call on rank 0 before the first save.
  void lock() const { weft::checkpoint::lock_run(dir_); }
  // Saves dp's state with `meta` (nothing without --checkpoint).
  void save(weft::parallel::DataParallel& dp, weft::checkpoint::Metadata meta);
  // Waits for the last save (a failed write throws).
  void wait();

 private:
  std::string dir_;
  int keep_;
  std::optional<weft::checkpoint::PendingSave> saving_;
};

// JSON has no NaN or infinity: null for those; else "%.6f".
std::string json_number(double v);
double seconds_since(Clock::time_point t);
// "1.23 GiB", "456.7 MiB", "12.0 KiB".
std::string bytes_str(std::size_t bytes);
// A device's peak and what held it: "412.0 MiB (parameters 40.1 MiB, gradients ..., ...)".
std::string peak_str(const weft::MemoryStats& m);
// Each device's allocator peak: text "cpu(0) 412.0 MiB (...); cpu(1) ..." and
// JSON members "\"cpu(0)\":432013312,...".
struct PeakReport {
  std::string text, json;
};
PeakReport peak_report(weft::Engine& engine, const std::vector<weft::Device>& devices);
// Whether the engine has every device; if not, says which it lacks on
// stderr (naming the program and the devices it has).
bool devices_available(const weft::Engine& engine, const std::vector<weft::Device>& devices, const char* program);
// --hybridize replays one captured step: it holds its learning rate, and
// replays do not pass through DataParallel::step, which counts the steps a
// checkpoint saves. Says so on stderr and returns false for a schedule,
// --checkpoint or --resume beside it.
bool hybridize_allowed(const TrainFlags& o, const weft::optim::LrSchedule& schedule, const char* program);
// The weights, bit for bit: FNV-1a over replica 0's parameters (names and
// float32 bytes), gathered first when sharded (a collective: every rank calls it).
std::uint64_t weights_digest(weft::parallel::DataParallel& dp);
// The optimizer state, bit for bit: FNV-1a over every tensor of the run
// directory's latest checkpoint that is not a parameter (names and bytes, in
// name order): "\"<16 hex digits>\"" (a JSON string), or "null" without a
// checkpoint directory. Call on rank 0 after the last save is written.
std::string optimizer_digest(weft::parallel::DataParallel& dp, const std::string& checkpoint_dir);

}  // namespace weft::examples
