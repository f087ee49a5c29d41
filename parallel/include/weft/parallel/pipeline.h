// weft::parallel::Pipeline — an nn::Sequential split into consecutive stages
// on a device list (model parallelism), each batch split into micro-batches
// that flow through the stages as a pipeline (GPipe, 1F1B, or a schedule of
// your own), with recomputation, and the balance that decides the split.
//
//   nn::Sequential& model = ...;                     // built anywhere; its layers move to the stages' devices
//   Pipeline pipe(*engine, model, {.balance = {5, 9}, .devices = {gpu(0), gpu(1)}, .chunks = 8});
//   Tensor loss = pipe.train_step(images, labels);  // forward and backward of every micro-batch
//   pipe.step(lr);                                  // the optimizer's update on every stage
//
// A step follows a Schedule: per stage, a list of actions (forward, input
// gradient, weight gradient, send and receive), each pushed as engine ops;
// the gradients equal the unpipelined model's on the whole batch. Not
// thread-safe: drive a Pipeline from one thread. The design:
// docs/design/pipeline.md; the bubble: weft/parallel/metrics.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/nn.h"
#include "weft/optim.h"
#include "weft/tensor.h"

namespace weft::parallel {

// ---- schedules ---------------------------------------------------------------

enum class ActionKind : std::uint8_t {
  forward,          // the stage's layers on the micro-batch's input
  backward_input,   // the input gradient (what the previous stage waits for)
  backward_weight,  // the parameters' gradients, added to the step's
  send_activation,  // the forward's output to the next stage's device
  recv_activation,  // the previous stage's output, as this stage's input
  send_grad,        // the input gradient to the previous stage's device
  recv_grad,        // the next stage's input gradient, as this stage's output gradient
};
std::string_view to_string(ActionKind kind) noexcept;

struct Action {
  ActionKind kind;
  int micro_batch;
  bool operator==(const Action&) const = default;
};

// What each stage does in one step, in order.
struct Schedule {
  std::string name;
  std::vector<std::vector<Action>> stages;

  // Every stage: all forwards (micro-batches 0..M-1), then all backwards in
  // reverse order. Stage k holds M micro-batches' activations at its peak.
  static Schedule gpipe(int stages, int micro_batches);
  // PipeDream-Flush: stage k runs min(K - k - 1, M) warm-up forwards, then
  // alternates one forward and one backward, then the remaining backwards.
  // Stage k holds at most K - k micro-batches' activations.
  static Schedule one_f_one_b(int stages, int micro_batches);
  // "gpipe" or "1f1b" (also "one_f_one_b").
  static Schedule named(const std::string& name, int stages, int micro_batches);

  // Throws weft::InvalidArgument naming the stage, action and micro-batch
  // when the lists cannot run: a forward, backward or transfer missing or
  // repeated, a backward before its forward, a send without its receive on
  // the neighbouring stage, or a stage waiting for something its neighbour
  // only does later (a deadlock in the plan).
  void validate(int micro_batches) const;
  // The most micro-batches whose forward ran and whose backward has not, on
  // each stage (what the stage keeps alive).
  std::vector<int> peak_in_flight() const;
  // One line per stage: "stage 0: F0 S0 F1 S1 ... R1 B1 W1 s1 ...".
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
  std::vector<int> balance;     // layers per stage, summing to the model's layer count
  std::vector<Device> devices;  // one per stage (a device may repeat)
  int chunks = 1;               // micro-batches per batch (M)
  Checkpoint checkpoint = Checkpoint::never;
  std::string schedule = "gpipe";  // Schedule::named, unless `custom` is given
  std::function<Schedule(int stages, int micro_batches)> custom;  // a schedule of one's own
  // The update step() pushes on each stage's parameters, on its device
  // (weft/optim.h; default: plain SGD).
  optim::OptimizerOptions optimizer;
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
  // device the engine lacks, chunks < 1, or an unknown schedule name.
  Pipeline(Engine& engine, nn::Sequential& model, PipelineOptions options, LossFunction loss = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Pushes one step over `x` (rows along dim 0, any device) and `labels`
  // ([rows]): split into `chunks` micro-batches (rows as even as can be;
  // throws when there are fewer rows than chunks), each micro-batch's loss
  // gradient weighted by its share of the rows, the schedule's actions in
  // order. Afterwards each parameter's grad holds the gradient of the whole
  // batch's mean loss (as the unpipelined model's on the whole batch).
  // Returns that mean loss (a scalar on the last stage's device).
  Tensor train_step(const Tensor& x, const Tensor& labels);
  // The output for `x` in evaluation mode, stage after stage (no
  // micro-batches).
  Tensor forward(const Tensor& x);
  // The optimizer's update of every stage's parameters at rate `lr`
  // (options().optimizer.lr when omitted): one op per stage (foreach).
  void step();
  void step(float lr);
  // Every stage's optimizer state ("<parameter>.<state>"), for checkpoints.
  std::vector<nn::Buffer*> optimizer_state();

  int stages() const noexcept;
  Device device(int stage) const;
  // Layer indices [first, last) of the model on a stage.
  std::pair<int, int> layers(int stage) const;
  const Schedule& schedule() const noexcept;
  const PipelineOptions& options() const noexcept;
  // Of the last train_step, per stage: the most micro-batches it kept
  // saved activations for at once (stage input only, for a checkpointed
  // micro-batch, is not counted), counted as the ops were pushed.
  std::vector<int> peak_saved() const;
  // What trace spans of a stage's ops contain: "[stage <k> " (every op a
  // stage's action pushes is named "<op> [stage k F3]" and the like;
  // measured_bubble, weft/parallel/metrics.h, reads them).
  static std::string span_marker(int stage);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::parallel
