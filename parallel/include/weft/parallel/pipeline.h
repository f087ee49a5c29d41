// weft::parallel::Pipeline — an nn::Sequential split into consecutive stages
// on a device list or on the members of a communicator (one per process),
// each batch split into micro-batches that flow through the stages (GPipe,
// 1F1B, ZB-H1, interleaved 1F1B, or a schedule of your own), with
// recomputation, the balance that decides the split, data parallelism
// over replicas of each stage, and any precision (with dynamic loss
// scaling agreed over every stage).
//
//   nn::Sequential& model = ...;                     // built anywhere; its layers move to the stages' devices
//   Pipeline pipe(*engine, model, {.balance = {5, 9}, .devices = {gpu(0), gpu(1)}, .chunks = 8});
//   Tensor loss = pipe.train_step(images, labels);  // forward and backward of every micro-batch
//   pipe.step(lr);                                  // the optimizer's update on every stage
//
// A step follows a Schedule: per rank, a list of actions (forward, input
// gradient, weight gradient, send and receive), each pushed as engine ops
// and run in the list's order; the gradients equal the unpipelined model's
// on the whole batch. Not thread-safe: drive a Pipeline from one thread.
// The design: docs/design/pipeline.md; the bubble: weft/parallel/metrics.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/nn.h"
#include "weft/optim.h"
#include "weft/parallel/collectives.h"
#include "weft/parallel/data_parallel.h"  // LossScaling
#include "weft/precision.h"
#include "weft/tensor.h"

namespace weft::parallel {

// ---- schedules ---------------------------------------------------------------

enum class ActionKind : std::uint8_t {
  forward,          // the stage's layers on the micro-batch's input
  backward_input,   // the input gradient (what the previous stage waits for)
  backward_weight,  // the parameters' gradients, added to the step's
  send_activation,  // the forward's output to the next stage
  recv_activation,  // the previous stage's output, as this stage's input
  send_grad,        // the input gradient to the previous stage
  recv_grad,        // the next stage's input gradient, as this stage's output gradient
};
std::string_view to_string(ActionKind kind) noexcept;

struct Action {
  ActionKind kind;
  int micro_batch;
  int chunk = 0;  // which of its rank's model chunks (interleaved schedules; 0 otherwise)
  bool operator==(const Action&) const = default;
};

// What each pipeline rank (a stage's device, or an MPI rank) does in one
// step, in order. With v virtual stages, rank d holds v model chunks: chunk
// c of rank d is model stage c * ranks + d (Megatron-LM's round-robin), and
// a model has ranks * v stages; v = 1 otherwise (rank d is model stage d).
// An action's transfers go to the neighbouring model stage: the last chunk
// of rank ranks-1 sends on to chunk c+1 of rank 0.
struct Schedule {
  std::string name;
  std::vector<std::vector<Action>> stages;  // one list per rank
  int virtual_stages = 1;

  int ranks() const noexcept { return static_cast<int>(stages.size()); }
  int model_stages() const noexcept { return ranks() * virtual_stages; }

  // Every stage: all forwards (micro-batches 0..M-1), then all backwards in
  // reverse order, each backward's weight gradient before its input gradient
  // is sent. Stage k holds M micro-batches' activations at its peak.
  static Schedule gpipe(int stages, int micro_batches);
  // PipeDream-Flush: stage k runs min(K - k - 1, M) warm-up forwards, then
  // alternates one forward and one whole backward (input then weight
  // gradient, then the send), then the remaining backwards. Stage k holds at
  // most K - k micro-batches' activations. Bubble (K-1)/(M+K-1).
  static Schedule one_f_one_b(int stages, int micro_batches);
  // ZB-H1 (zero-bubble pipeline parallelism): 1F1B's order with each input
  // gradient sent at once and stage k's weight gradients deferred by k
  // micro-batches into the cool-down; every stage holds at most K
  // micro-batches (1F1B's peak). Bubble (K-1)/(3M+K-1) with equal forward,
  // input-gradient and weight-gradient times.
  static Schedule zb_h1(int stages, int micro_batches);
  // Interleaved 1F1B (Megatron-LM): `virtual_stages` model chunks per rank,
  // micro-batches in groups of `stages` through the chunks round-robin.
  // Bubble (K-1)/(v*M+K-1). Throws weft::InvalidArgument unless
  // micro_batches is a multiple of stages.
  static Schedule interleaved_1f1b(int stages, int micro_batches, int virtual_stages);
  // "gpipe", "1f1b" (also "one_f_one_b"), "zb-h1" or "interleaved-1f1b"
  // (virtual_stages only for the last; 1 elsewhere).
  static Schedule named(const std::string& name, int stages, int micro_batches, int virtual_stages = 1);
  // A schedule written as text (the format describe() prints): one line per
  // rank, "stage <k>:" and then its actions separated by spaces or commas:
  // F3 (forward of micro-batch 3), B3 (input gradient), W3 (weight
  // gradient), S3 / R3 (send / receive the activation), s3 / r3 (send /
  // receive the gradient); ":c" after one names chunk c (F3:1). Blank lines
  // and text after '#' are ignored. A file that lists no transfers at all
  // gets them: R before each forward, S after it, r before each input
  // gradient, s after it (where a neighbour exists). The virtual stages are
  // the most chunks named. Throws weft::InvalidArgument naming the line and
  // token it cannot read; validate() judges the rest.
  static Schedule parse(const std::string& text, std::string name);
  // parse() of a file's text, named by the file's name without directory
  // and extension; throws naming the file it cannot read.
  static Schedule from_file(const std::string& path);

  // Throws weft::InvalidArgument naming the rank, chunk, action and
  // micro-batch when the lists cannot run: a forward, backward or transfer
  // missing or repeated, a backward before its forward, a send without its
  // receive on the neighbouring stage, or a rank waiting for something its
  // neighbour only does later (a deadlock in the plan).
  void validate(int micro_batches) const;
  // Per rank: the most micro-batches (of all its chunks) whose forward ran
  // and whose weight gradient has not (what the rank keeps alive).
  std::vector<int> peak_in_flight() const;
  // The lists run with these times per action (forward, input gradient,
  // weight gradient; transfers take none): the fraction of ranks x makespan
  // left idle. validate() first.
  double bubble(double forward = 1, double backward_input = 1, double backward_weight = 1) const;
  // One line per rank: "stage 0: F0 S0 F1 S1 ... R1 B1 W1 s1 ..." (what
  // parse() reads).
  std::string describe() const;
};

// ---- balance -----------------------------------------------------------------

// Consecutive blocks of `costs` (one per layer, non-negative) into `parts`
// non-empty blocks minimizing the largest block's sum; returns the block
// sizes. Exact (dynamic programming over prefix sums). Throws for more
// parts than costs or a negative cost.
std::vector<int> partition(const std::vector<double>& costs, int parts);

// Per layer: forward and backward time on `sample` (a batch, on the
// device the model's parameters are on), the median of `reps` runs after a
// warm-up run; the model is left as it was (training mode, gradients set).
// On simulated GPUs whose kernels are modeled, modeled time.
// Give it one micro-batch: layers' shares of the time change with the rows.
std::vector<double> layer_times(nn::Sequential& model, const Tensor& sample, int reps = 3);
// Per layer: its parameters' bytes plus its output's bytes for `sample`'s
// shape (what a stage keeps per micro-batch).
std::vector<double> layer_sizes(nn::Sequential& model, const Shape& sample);
// partition() of those, as torchgpipe's balance_by_time / balance_by_size.
std::vector<int> balance_by_time(nn::Sequential& model, const Tensor& sample, int stages, int reps = 3);
std::vector<int> balance_by_size(nn::Sequential& model, const Shape& sample, int stages);

// ---- the pipeline ------------------------------------------------------------

// Recomputation: a checkpointed micro-batch keeps only its stage input
// through the forward; its forward runs again just before its backward.
// except_last: all but the last micro-batch (whose backward follows its
// forward at once in GPipe). As torchgpipe.
enum class Checkpoint : std::uint8_t { always, except_last, never };
std::string_view to_string(Checkpoint c) noexcept;
Checkpoint checkpoint_from_string(const std::string& text);  // throws naming the text

struct PipelineOptions {
  // Layers per model stage (ranks x virtual stages of them, in model order),
  // summing to the model's layer count.
  std::vector<int> balance;
  // One device per rank (a device may repeat). Across processes (`ranks`
  // set): empty, or this process's member's device.
  std::vector<Device> devices;
  int chunks = 1;          // micro-batches per batch (M)
  int virtual_stages = 1;  // model chunks per rank (interleaved-1f1b)
  Checkpoint checkpoint = Checkpoint::never;
  std::string schedule = "gpipe";  // Schedule::named, unless `custom` is given
  std::function<Schedule(int stages, int micro_batches)> custom;  // a schedule of one's own (Schedule::from_file, say)
  // Stages on ranks: member d of this communicator (one member per
  // process) runs rank d's list on its device, activations and gradients
  // moving by send and recv. Every member builds the same model and
  // pipeline; the plans are compared across members before any data moves.
  std::optional<Communicator> ranks;
  // Data parallelism (pipeline x data parallel): the members holding this
  // rank's stages in the other pipelines, this one included. Each model
  // stage's gradients are averaged over them in buckets of about
  // bucket_bytes, pushed as the stage's last weight gradient of the step is,
  // so the reduction overlaps the rest of the cool-down.
  std::optional<Communicator> replicas;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // The update step() pushes on each stage's parameters, on its device
  // (weft/optim.h; default: plain SGD).
  optim::OptimizerOptions optimizer;
  // How the layers compute (weft/precision.h): set, the whole model gets it
  // (Layer::set_precision); unset, the layers keep theirs. Parameters and
  // the optimizer stay float32 (master weights); under bf16 / fp16 the loss
  // is taken on float32 logits. Across processes activations and gradients
  // travel in the layers' compute dtype.
  std::optional<Precision> precision;
  // Set: dynamic loss scaling (GradScaler's rules, LossScaling): the last
  // stage's loss gradient is multiplied by the scale; step() unscales every
  // stage's gradients, and the found-Inf/NaN flags are agreed over all
  // ranks (and replicas), so every stage skips the same steps and the scale
  // stays the same everywhere. Required when a layer computes in fp16.
  std::optional<LossScaling> loss_scaling;
};

// Loss of one micro-batch: its logits and labels -> the mean loss over its
// rows and d(mean loss)/d(logits). The default is softmax cross-entropy.
struct MicroBatchLoss {
  Tensor loss, dlogits;
};
using LossFunction = std::function<MicroBatchLoss(const Tensor& logits, const Tensor& labels)>;

class Pipeline {
 public:
  // Moves the model's layers' parameters and buffers to their stage's
  // device (the model must outlive the pipeline and is used through it from
  // now on). Throws weft::InvalidArgument for a balance that does not sum
  // to the layer count or has an empty stage, fewer devices than stages, a
  // device the engine lacks, chunks < 1, an unknown or invalid schedule, a
  // schedule whose ranks differ from the communicator's members, fp16
  // without loss scaling, or a loss scale (init_scale, rule) that cannot
  // work. Across
  // processes the constructor is collective over `ranks`: a plan (schedule,
  // balance, chunks) that differs between members throws
  // weft::CommunicationError on each, naming both sides, before any data
  // moves.
  Pipeline(Engine& engine, nn::Sequential& model, PipelineOptions options, LossFunction loss = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Pushes one step over `x` (rows along dim 0, any device) and `labels`
  // ([rows], or [rows, ...] for a loss function that takes them, as
  // nn::lm_loss's [rows, T] targets): split into `chunks` micro-batches (rows as even as can be;
  // throws when there are fewer rows than chunks), each micro-batch's loss
  // gradient weighted by its share of the rows, the schedule's actions in
  // order. Afterwards each parameter's grad holds the gradient of the whole
  // batch's mean loss (as the unpipelined model's on the whole batch).
  // Returns that mean loss (a scalar on the last stage's device). Across
  // processes every member passes the same batch (the first stage's member
  // reads x, the last stage's the labels; the others only their shapes),
  // and the loss comes back on the last stage's member (undefined
  // elsewhere); with `replicas`, each replica its own batch (of the same
  // rows on every replica) and the gradients are those of all their rows.
  Tensor train_step(const Tensor& x, const Tensor& labels);
  // The output for `x` in evaluation mode, stage after stage (no
  // micro-batches); across processes, on the last stage's member only.
  Tensor forward(const Tensor& x);
  // The optimizer's update of every stage's parameters at rate `lr`
  // (options().optimizer.lr when omitted): one op per stage (foreach).
  // With loss scaling: first unscaled and checked, the verdict agreed over
  // all ranks and replicas, the update skipped on the device on Inf/NaN and
  // the scale grown or backed off (nothing waits on the host).
  void step();
  void step(float lr);
  // With loss scaling: the current scale and the steps skipped so far of a
  // local rank (waits for the steps pushed; the same on every rank); no
  // argument: this process's first rank. Without: 1 and 0.
  float loss_scale() const;
  float loss_scale(int rank) const;
  std::int64_t skipped_steps() const;
  std::int64_t skipped_steps(int rank) const;
  // Every stage's optimizer state ("<parameter>.<state>"), for checkpoints;
  // with loss scaling also each local rank's scaler
  // ("pipeline.stage<r>.loss_scale.scale", ".growth_tracker", ".skipped").
  std::vector<nn::Buffer*> optimizer_state();

  int stages() const noexcept;  // model stages (ranks x virtual stages)
  int ranks() const noexcept;   // the schedule's ranks
  // Whether this process runs model stage `stage` (always, in one process).
  bool is_local(int stage) const;
  Device device(int stage) const;  // of a local model stage
  // Layer indices [first, last) of the model on a stage.
  std::pair<int, int> layers(int stage) const;
  const Schedule& schedule() const noexcept;
  const PipelineOptions& options() const noexcept;
  // Of the last train_step, per rank (0 for another process's): the most
  // micro-batches its stages kept
  // saved activations for at once (stage input only, for a checkpointed
  // micro-batch, is not counted), counted as the ops were pushed.
  std::vector<int> peak_saved() const;
  // What trace spans of a rank's ops contain: "[stage <k> " (every op rank
  // k's action pushes is named "<op> [stage k F3]", "[stage k F3:1]" for
  // chunk 1, and the like; measured_bubble, weft/parallel/metrics.h, reads
  // them).
  static std::string span_marker(int rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::parallel
