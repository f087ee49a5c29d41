// weft::optim — stateful optimizers, learning-rate schedules and gradient
// clipping as engine ops, with PyTorch's documented formulas (torch.optim):
//
//   optim::Optimizer opt(model.parameters(), optim::OptimizerOptions::adamw(1e-3f));
//   optim::LrSchedule schedule = optim::LrSchedule::cosine(total_steps, /*warmup=*/100);
//   ... backward ...
//   opt.step(schedule.lr(opt.options().lr, opt.steps()));
//
// Each parameter's state (momentum_buffer; exp_avg, exp_avg_sq; and its step
// count) is a float32 tensor on the parameter's device named
// "<parameter>.<state>", so traces, errors and checkpoints show it. With
// `foreach` (the default) one step pushes one op per device (PyTorch's
// multi-tensor form), else one per parameter; the values are the same. The
// host never waits: a step's skip flag, gradient scale (clipping, loss
// scaling) and the bias corrections are read on the device when the op runs.
// Design notes: docs/design/optimizers.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/nn.h"
#include "weft/tensor.h"

namespace weft::optim {

enum class Algorithm : std::uint8_t { sgd, adam, adamw };
std::string_view to_string(Algorithm a) noexcept;

// Per step t (from 1), with g the gradient times the step's grad_scale:
//   sgd:   g += wd * w; with momentum: b = g at t = 1, else momentum * b +
//          (1 - dampening) * g; g = nesterov ? g + momentum * b : b;
//          w -= lr * g.
//   adam:  g += wd * w; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//          w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
//   adamw: w *= 1 - lr * wd first (decoupled decay), then adam's update
//          without the wd term.
struct OptimizerOptions {
  Algorithm algorithm = Algorithm::sgd;
  float lr = 0.01f;            // the base rate; a schedule's lr() scales it per step
  float weight_decay = 0.0f;   // >= 0
  float momentum = 0.0f;       // sgd: [0, 1); 0 keeps no state
  float dampening = 0.0f;      // sgd
  bool nesterov = false;       // sgd: needs momentum > 0 and dampening 0
  float beta1 = 0.9f;          // adam, adamw: [0, 1)
  float beta2 = 0.999f;        // adam, adamw: [0, 1)
  float eps = 1e-8f;           // adam, adamw: > 0
  bool foreach = true;         // one op per device (true) or per parameter

  static OptimizerOptions sgd(float lr, float momentum = 0.0f, float weight_decay = 0.0f, bool nesterov = false);
  static OptimizerOptions adam(float lr, float weight_decay = 0.0f);
  static OptimizerOptions adamw(float lr, float weight_decay = 0.01f);
  // The trainers' --optimizer: "sgd", "momentum" (sgd, momentum 0.9),
  // "adam" or "adamw" (weight decay 0.01), at `lr`. Throws
  // weft::InvalidArgument naming `what` (the flag) and the choices.
  static OptimizerOptions parse(std::string_view name, float lr, std::string_view what = "optimizer");
  // Throws weft::InvalidArgument naming `who` and the field out of range.
  void validate(std::string_view who) const;
  // "adamw(lr 0.001, betas (0.9, 0.999), eps 1e-08, weight decay 0.01)"
  std::string str() const;
  // The names of the per-parameter state tensors, in order ({} for plain
  // sgd; {"momentum_buffer", "step"}; {"exp_avg", "exp_avg_sq", "step"}).
  std::vector<std::string> state_names() const;
};

// What one step reads on the device besides the gradients. Each vector holds
// at most one [1] float32 tensor per device of the parameters (matched by
// device; a device without one uses the default).
struct StepInputs {
  // Not zero when the op runs: the update of that device's parameters is
  // skipped, their state and step counts untouched (a loss scaler's
  // found-inf flag). Default: never skipped.
  std::vector<Tensor> skip;
  // Multiplies every gradient before use (a clipping coefficient, or 1 /
  // loss scale). Default: 1.
  std::vector<Tensor> grad_scale;
};

class Optimizer {
 public:
  // params: float32 parameters on any devices (distinct; pointers stay
  // valid as long as the optimizer). Creates every state tensor (zeros) at
  // once. Throws weft::InvalidArgument for bad options, a null or repeated
  // parameter, or one that is not float32.
  Optimizer(std::vector<nn::Parameter*> params, OptimizerOptions options);
  ~Optimizer();
  Optimizer(Optimizer&&) noexcept;
  Optimizer& operator=(Optimizer&&) noexcept;

  // Pushes the update of every parameter at rate `lr` (options().lr when
  // omitted). Every parameter must have a gradient of its shape on its
  // device: otherwise weft::InvalidArgument naming it.
  void step(const StepInputs& inputs = {});
  void step(float lr, const StepInputs& inputs = {});

  const OptimizerOptions& options() const noexcept;
  // step() calls so far (host-side: skipped ones count; the per-parameter
  // "step" states count only applied updates). A checkpoint restores it.
  std::int64_t steps() const noexcept;
  void set_steps(std::int64_t steps);
  const std::vector<nn::Parameter*>& parameters() const noexcept;
  // Every state tensor, named "<parameter>.<state>", parameter by parameter
  // in state_names() order. Writing them (a checkpoint's load) is allowed
  // between steps.
  std::vector<nn::Buffer*> state();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Learning-rate schedules as a factor of the base rate at step t (0-based:
// the step about to run), computed on the host (no device state):
//   constant: 1.
//   step:     gamma ^ floor(t / step_size)                 (StepLR)
//   cosine:   0.5 * (1 + cos(pi * t' / (total - warmup))), (CosineAnnealingLR, eta_min 0)
//             t' = t - warmup, clamped to [0, total - warmup]
// With warmup > 0 the factor first rises linearly: (t + 1) / warmup for
// t < warmup (LinearLR from 1/warmup), then the schedule runs from t - warmup.
class LrSchedule {
 public:
  enum class Kind : std::uint8_t { constant, step, cosine };
  static LrSchedule constant(std::int64_t warmup = 0);
  static LrSchedule step(std::int64_t step_size, float gamma = 0.1f, std::int64_t warmup = 0);
  static LrSchedule cosine(std::int64_t total_steps, std::int64_t warmup = 0);
  // "constant", "step:SIZE[:GAMMA]", "cosine:TOTAL", each optionally
  // followed by ",warmup:N" (the trainers' --lr-schedule). Throws
  // weft::InvalidArgument naming `what`.
  static LrSchedule parse(std::string_view text, std::string_view what = "lr schedule");

  float factor(std::int64_t t) const noexcept;
  float lr(float base, std::int64_t t) const noexcept { return base * factor(t); }
  Kind kind() const noexcept { return kind_; }
  std::string str() const;  // parse()'s form

 private:
  Kind kind_ = Kind::constant;
  std::int64_t step_size_ = 1, total_ = 1, warmup_ = 0;
  float gamma_ = 0.1f;
};

// ---- global gradient-norm clipping (torch.nn.utils.clip_grad_norm_) -----
// One op over the float32 gradients of one device: a [1] float32 tensor on
// that device holding the sum of their squares (accumulated in double).
// Throws weft::InvalidArgument for an empty list or gradients on several
// devices.
Tensor grad_norm_squared(const std::vector<Tensor>& grads);
// One op: [1] float32 clip coefficient min(1, max_norm / (sqrt(norm_sq) +
// 1e-6)) on norm_sq's device, for StepInputs::grad_scale. Sum the partial
// norm_sq of every member first (an allreduce) when each holds part of the
// gradients. max_norm > 0.
Tensor clip_coefficient(const Tensor& norm_sq, float max_norm);

}  // namespace weft::optim
