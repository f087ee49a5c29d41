// Pipeline: the runner that pushes a schedule's actions as engine ops.
//
// One step: the batch's rows are split into micro-batches; the stages'
// action lists are merged into one push order in which every action comes
// after what it needs (a receive after its send); each action pushes its
// ops under an ops::PushScope naming the stage and action (traces read
// "conv2d [stage 1 F3]") with backward above forward in priority. Actions of
// one stage run in list order: each action's ops wait, through an order op
// on the stage's device, for the stage's previous action's outputs (the
// "phony" dependencies torchgpipe builds with fork/join), so a CPU device
// does not run ahead of its schedule, and a schedule's memory bound holds
// when the ops run, not only when they are pushed.
//
// What a stage's layers keep between a micro-batch's forward and its
// backward is taken out of them after each action (Layer::take_saved) and
// put back before the next one of that micro-batch (restore_saved).
#include <algorithm>
#include <any>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft/error.h"
#include "weft/ops.h"
#include "weft/parallel/pipeline.h"

namespace weft::parallel {

std::string_view to_string(Checkpoint c) noexcept {
  switch (c) {
    case Checkpoint::always: return "always";
    case Checkpoint::except_last: return "except_last";
    case Checkpoint::never: return "never";
  }
  return "?";
}

Checkpoint checkpoint_from_string(const std::string& text) {
  if (text == "always") return Checkpoint::always;
  if (text == "except_last") return Checkpoint::except_last;
  if (text == "never") return Checkpoint::never;
  throw InvalidArgument("checkpoint: unknown mode '" + text + "' (always, except_last, never)");
}

namespace {

// Priorities: a stage's backward before its forward when both are ready.
constexpr int kForwardPriority = 0;
constexpr int kBackwardPriority = 1;

// One micro-batch on one stage.
struct Micro {
  Tensor input;     // the stage's input (received, or the batch's rows on stage 0)
  Tensor output;    // the forward's output
  Tensor grad_out;  // the gradient of the loss w.r.t. the output
  Tensor grad_in;   // backward_input's result, w.r.t. the input
  std::vector<std::any> saved;  // what the stage's layers keep for it, between its actions
  bool checkpointed = false;
  bool holding = false;  // its activations are kept (forward or recomputation done, weight gradient not)
};

struct Stage {
  Device device;
  int first = 0, last = 0;  // layer indices [first, last)
  std::vector<nn::Layer*> layers;
  std::vector<nn::Parameter*> params;
  std::vector<Tensor> grads;  // accumulated over the step's micro-batches, one per param
  bool have_grads = false;
  std::optional<optim::Optimizer> optimizer;  // over params, on the stage's device
  Var order;                  // written by each action's last op, read by the next action's order op
  std::vector<Micro> micro;
  int saved_now = 0, saved_peak = 0;
};

std::string action_label(int stage, const Action& a) {
  static constexpr const char* kLetters[] = {"F", "B", "W", "S", "R", "s", "r"};
  return "stage " + std::to_string(stage) + " " + kLetters[static_cast<int>(a.kind)] + std::to_string(a.micro_batch);
}

}  // namespace

struct Pipeline::Impl {
  Engine* engine = nullptr;
  nn::Sequential* model = nullptr;
  PipelineOptions options;
  LossFunction loss;
  Schedule schedule;
  std::vector<Stage> stages;
  std::vector<Tensor> labels;  // per micro-batch, on the last stage's device
  std::vector<double> weight;  // per micro-batch: its share of the batch's rows
  Tensor total_loss;
  std::vector<int> last_peaks;

  int k_count() const { return static_cast<int>(stages.size()); }

  void move_layers_to(Stage& s) {
    for (nn::Layer* layer : s.layers) {
      for (nn::Parameter* p : layer->parameters()) {
        if (p->value.device() != s.device) p->value = p->value.copy_to(s.device).set_name(p->name);
        p->grad = Tensor();
      }
      for (nn::Buffer* b : layer->buffers())
        if (b->value.device() != s.device) b->value = b->value.copy_to(s.device).set_name(b->name);
    }
  }

  // The order op: the stage's next action starts after its previous one.
  // Its inputs are read and rewritten (a no-op) by an op that also reads the
  // stage's order variable, so every op reading them waits. Read as well as
  // written: a failed input (out of memory upstream, say) skips the order op
  // and stays failed, instead of being cleared by a successful write.
  void follow_order(Stage& s, const std::vector<Tensor>& inputs) {
    std::vector<Var> vars;
    for (const Tensor& t : inputs)
      if (t.defined()) vars.push_back(t.var());
    if (vars.empty()) return;
    std::vector<Var> reads = vars;
    reads.push_back(s.order);
    engine->push([] {}, s.device, reads, vars, OpOptions{.name = "in order"});
  }
  // ...and the action's outputs, once written, mark the stage's order.
  void mark(Stage& s, const std::vector<Tensor>& outputs) {
    std::vector<Var> reads;
    for (const Tensor& t : outputs)
      if (t.defined()) reads.push_back(t.var());
    engine->push([] {}, s.device, reads, {s.order}, OpOptions{.name = "done"});
  }

  // The layers' state for micro-batch m: put back before its action, taken
  // out after it.
  void restore(Stage& s, Micro& m) {
    if (m.saved.empty()) return;
    for (std::size_t i = 0; i < s.layers.size(); ++i) s.layers[i]->restore_saved(std::move(m.saved[i]));
    m.saved.clear();
  }
  void take(Stage& s, Micro& m) {
    m.saved.clear();
    for (nn::Layer* layer : s.layers) m.saved.push_back(layer->take_saved());
  }
  // Micro-batches whose activations the stage keeps: from the forward (or,
  // checkpointed, the recomputation) to the weight gradient.
  void hold(Stage& s, Micro& m) {
    m.holding = true;
    s.saved_peak = std::max(s.saved_peak, ++s.saved_now);
  }
  void release(Stage& s, Micro& m) {
    if (m.holding) --s.saved_now;
    m.holding = false;
  }

  Tensor run_forward(Stage& s, const Tensor& x) {
    Tensor y = x;
    for (nn::Layer* layer : s.layers) y = layer->forward(y);
    return y;
  }

  void forward(int k, int mb) {
    Stage& s = stages[static_cast<std::size_t>(k)];
    Micro& m = s.micro[static_cast<std::size_t>(mb)];
    follow_order(s, {m.input});
    m.output = run_forward(s, m.input);
    if (m.checkpointed) {
      // Keep only the input: what the layers kept goes (its memory is freed
      // once the forward's ops are done with it).
      for (nn::Layer* layer : s.layers) (void)layer->take_saved();
    } else {
      take(s, m);
      hold(s, m);
    }
    std::vector<Tensor> done{m.output};
    if (k + 1 == k_count()) {
      // The loss of this micro-batch, weighted by its share of the rows.
      MicroBatchLoss l = loss(m.output, labels[static_cast<std::size_t>(mb)]);
      const float w = static_cast<float>(weight[static_cast<std::size_t>(mb)]);
      m.grad_out = ops::mul_scalar(l.dlogits, w);
      const Tensor part = ops::mul_scalar(l.loss, w);
      total_loss = total_loss.defined() ? total_loss + part : part;
      done.push_back(m.grad_out);
    }
    mark(s, done);
  }

  void backward_input(int k, int mb) {
    Stage& s = stages[static_cast<std::size_t>(k)];
    Micro& m = s.micro[static_cast<std::size_t>(mb)];
    follow_order(s, {m.grad_out, m.input});
    if (m.checkpointed) {
      // Recompute the forward (same input, same batch statistics; running
      // statistics frozen so they see this micro-batch once).
      for (nn::Layer* layer : s.layers) layer->freeze_running_stats(true);
      (void)run_forward(s, m.input);
      for (nn::Layer* layer : s.layers) layer->freeze_running_stats(false);
      hold(s, m);
    } else {
      restore(s, m);
    }
    Tensor d = m.grad_out;
    for (auto it = s.layers.rbegin(); it != s.layers.rend(); ++it) d = (*it)->backward_input(d);
    m.grad_in = d;
    m.output = Tensor();
    take(s, m);
    mark(s, {m.grad_in});
  }

  void backward_weight(int k, int mb) {
    Stage& s = stages[static_cast<std::size_t>(k)];
    Micro& m = s.micro[static_cast<std::size_t>(mb)];
    restore(s, m);
    for (auto it = s.layers.rbegin(); it != s.layers.rend(); ++it) (*it)->backward_weight();
    release(s, m);
    // The step's gradient: the first micro-batch's becomes the accumulator,
    // later ones are added to it.
    std::vector<Tensor> written;
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      nn::Parameter& p = *s.params[i];
      if (!p.grad.defined())
        throw InvalidArgument("Pipeline: parameter '" + p.name + "' on stage " + std::to_string(k) +
                              " got no gradient from its layer");
      if (!s.have_grads) {
        s.grads[i] = p.grad;
      } else {
        ops::axpy(1.0f, p.grad, s.grads[i]);
      }
      written.push_back(s.grads[i]);
    }
    s.have_grads = true;
    m.input = m.grad_out = Tensor();
    mark(s, written);
  }

  void send_activation(int k, int mb) {
    Stage& to = stages[static_cast<std::size_t>(k) + 1];
    Micro& m = stages[static_cast<std::size_t>(k)].micro[static_cast<std::size_t>(mb)];
    to.micro[static_cast<std::size_t>(mb)].input = m.output.device() == to.device ? m.output : m.output.copy_to(to.device);
  }

  void send_grad(int k, int mb) {
    Stage& to = stages[static_cast<std::size_t>(k) - 1];
    Micro& m = stages[static_cast<std::size_t>(k)].micro[static_cast<std::size_t>(mb)];
    to.micro[static_cast<std::size_t>(mb)].grad_out =
        m.grad_in.device() == to.device ? m.grad_in : m.grad_in.copy_to(to.device);
    m.grad_in = Tensor();
  }

  void run(int k, const Action& a) {
    const bool backward = a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_weight ||
                          a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad;
    ops::PushScope scope(backward ? kBackwardPriority : kForwardPriority, action_label(k, a));
    switch (a.kind) {
      case ActionKind::forward: return forward(k, a.micro_batch);
      case ActionKind::backward_input: return backward_input(k, a.micro_batch);
      case ActionKind::backward_weight: return backward_weight(k, a.micro_batch);
      case ActionKind::send_activation: return send_activation(k, a.micro_batch);
      case ActionKind::send_grad: return send_grad(k, a.micro_batch);
      case ActionKind::recv_activation:
      case ActionKind::recv_grad: return;  // the send put it in place
    }
  }
};

Pipeline::Pipeline(Engine& engine, nn::Sequential& model, PipelineOptions options, LossFunction loss)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.engine = &engine;
  m.model = &model;
  m.loss = loss ? std::move(loss) : LossFunction([](const Tensor& logits, const Tensor& labels) {
    ops::SoftmaxCrossEntropy s = ops::softmax_cross_entropy(logits, labels);
    return MicroBatchLoss{s.loss, s.dlogits};
  });
  const std::vector<int>& balance = options.balance;
  const int layers = static_cast<int>(model.size());
  if (balance.empty()) throw InvalidArgument("Pipeline: the balance is empty (one layer count per stage)");
  int total = 0;
  for (std::size_t k = 0; k < balance.size(); ++k) {
    if (balance[k] < 1)
      throw InvalidArgument("Pipeline: stage " + std::to_string(k) + " of the balance has " + std::to_string(balance[k]) +
                            " layers (each stage needs at least one)");
    total += balance[k];
  }
  if (total != layers)
    throw InvalidArgument("Pipeline: the balance sums to " + std::to_string(total) + " layers but the model has " +
                          std::to_string(layers));
  if (options.devices.size() < balance.size())
    throw InvalidArgument("Pipeline: " + std::to_string(balance.size()) + " stages but only " +
                          std::to_string(options.devices.size()) + " devices");
  if (options.devices.size() > balance.size())
    throw InvalidArgument("Pipeline: " + std::to_string(options.devices.size()) + " devices for " +
                          std::to_string(balance.size()) + " stages (one device per stage)");
  const std::vector<Device> known = engine.devices();
  for (Device d : options.devices)
    if (std::find(known.begin(), known.end(), d) == known.end())
      throw InvalidArgument("Pipeline: device " + d.str() + " is not one of the engine's");
  if (options.chunks < 1) throw InvalidArgument("Pipeline: chunks must be at least 1, got " + std::to_string(options.chunks));
  const int k_count = static_cast<int>(balance.size());
  m.schedule = options.custom ? options.custom(k_count, options.chunks)
                              : Schedule::named(options.schedule, k_count, options.chunks);
  if (static_cast<int>(m.schedule.stages.size()) != k_count)
    throw InvalidArgument("Pipeline: the schedule '" + m.schedule.name + "' has " +
                          std::to_string(m.schedule.stages.size()) + " stages, the balance " + std::to_string(k_count));
  m.schedule.validate(options.chunks);
  int first = 0;
  for (int k = 0; k < k_count; ++k) {
    Stage s;
    s.device = options.devices[static_cast<std::size_t>(k)];
    s.first = first;
    s.last = first + balance[static_cast<std::size_t>(k)];
    for (int i = s.first; i < s.last; ++i) {
      s.layers.push_back(&model[static_cast<std::size_t>(i)]);
      for (nn::Parameter* p : model[static_cast<std::size_t>(i)].parameters()) s.params.push_back(p);
    }
    s.grads.resize(s.params.size());
    s.order = engine.new_var("pipeline stage " + std::to_string(k) + " order");
    m.move_layers_to(s);
    if (!s.params.empty()) s.optimizer.emplace(s.params, options.optimizer);
    first = s.last;
    m.stages.push_back(std::move(s));
  }
  m.options = std::move(options);
}

Pipeline::~Pipeline() {
  // The order variables go once the ops on them are done; the pipeline
  // holds no tensors between steps (a wait here would also take, and hide,
  // errors of other work on the engine).
  for (Stage& s : impl_->stages) impl_->engine->delete_var(s.order);
}

Tensor Pipeline::train_step(const Tensor& x, const Tensor& labels) {
  Impl& m = *impl_;
  if (!x.defined() || !labels.defined()) throw InvalidArgument("Pipeline::train_step: undefined input or labels");
  if (x.shape().rank() == 0) throw InvalidArgument("Pipeline::train_step: the input " + x.str() + " has no rows");
  const std::int64_t rows = x.shape()[0];
  const int chunks = m.options.chunks;
  if (rows < chunks)
    throw InvalidArgument("Pipeline::train_step: a batch of " + std::to_string(rows) + " rows cannot make " +
                          std::to_string(chunks) + " micro-batches (chunks); use a larger batch or fewer chunks");
  if (labels.shape() != Shape{rows})
    throw InvalidArgument("Pipeline::train_step: labels " + labels.str() + " do not match the input's " +
                          std::to_string(rows) + " rows");
  const int k_count = m.k_count();
  const Device first = m.stages.front().device, last = m.stages.back().device;
  m.labels.clear();
  m.weight.clear();
  m.total_loss = Tensor();
  // Micro-batches of rows as even as can be (the first rows % chunks one longer).
  for (Stage& s : m.stages) {
    s.micro.assign(static_cast<std::size_t>(chunks), Micro{});
    s.have_grads = false;
    s.saved_now = s.saved_peak = 0;
  }
  const Checkpoint cp = m.options.checkpoint;
  std::int64_t begin = 0;
  for (int c = 0; c < chunks; ++c) {
    const std::int64_t n = rows / chunks + (c < rows % chunks ? 1 : 0);
    Tensor part = ops::slice_rows(x, begin, begin + n);
    Tensor lab = ops::slice_rows(labels, begin, begin + n);
    begin += n;
    m.stages.front().micro[static_cast<std::size_t>(c)].input = part.device() == first ? part : part.copy_to(first);
    m.labels.push_back(lab.device() == last ? lab : lab.copy_to(last));
    m.weight.push_back(static_cast<double>(n) / static_cast<double>(rows));
    const bool checkpointed = cp == Checkpoint::always || (cp == Checkpoint::except_last && c + 1 < chunks);
    for (Stage& s : m.stages) s.micro[static_cast<std::size_t>(c)].checkpointed = checkpointed;
  }
  for (Stage& s : m.stages)
    for (nn::Layer* layer : s.layers) {
      layer->train(true);
      (void)layer->take_saved();  // nothing left over from an earlier forward
    }
  // The lists merged into one push order: the order in which the actions
  // would run with unit costs (a forward, an input gradient and a weight
  // gradient one unit each, a send none, a receive not before its send),
  // ties to the lower stage. A GPU runs each stream's work in push order, so
  // any other order can hold a copy behind a later one on the receiver's
  // peer stream (a gradient behind the next activations in 1F1B); draining
  // one stage's list first would also fill the engine's in-flight bound with
  // that stage's ops. validate() ruled out deadlocks.
  const Schedule& sched = m.schedule;
  const auto kc = static_cast<std::size_t>(k_count), mc = static_cast<std::size_t>(chunks);
  std::vector<std::size_t> next(kc, 0);
  std::vector<double> clock(kc, 0.0);
  // sent_at[k][0 activation | 1 gradient][micro-batch]: when stage k sent it (-1: not yet).
  std::vector<std::vector<std::vector<double>>> sent_at(kc, std::vector<std::vector<double>>(2, std::vector<double>(mc, -1.0)));
  for (;;) {
    std::size_t best = kc;
    double best_start = 0;
    for (std::size_t k = 0; k < kc; ++k) {
      const std::vector<Action>& list = sched.stages[k];
      if (next[k] == list.size()) continue;
      const Action& a = list[next[k]];
      const auto mb = static_cast<std::size_t>(a.micro_batch);
      double start = clock[k];
      if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::recv_grad) {
        const double at = a.kind == ActionKind::recv_activation ? sent_at[k - 1][0][mb] : sent_at[k + 1][1][mb];
        if (at < 0) continue;
        start = std::max(start, at);
      }
      if (best == kc || start < best_start) best = k, best_start = start;
    }
    if (best == kc) break;
    const Action& a = sched.stages[best][next[best]];
    m.run(static_cast<int>(best), a);
    const bool computes = a.kind == ActionKind::forward || a.kind == ActionKind::backward_input ||
                          a.kind == ActionKind::backward_weight;
    clock[best] = best_start + (computes ? 1.0 : 0.0);
    const auto mb = static_cast<std::size_t>(a.micro_batch);
    if (a.kind == ActionKind::send_activation) sent_at[best][0][mb] = clock[best];
    if (a.kind == ActionKind::send_grad) sent_at[best][1][mb] = clock[best];
    ++next[best];
  }
  m.last_peaks.clear();
  for (Stage& s : m.stages) {
    m.last_peaks.push_back(s.saved_peak);
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      s.params[i]->grad = s.grads[i];
      s.grads[i] = Tensor();
    }
    s.micro.clear();
  }
  m.labels.clear();
  return std::exchange(m.total_loss, Tensor());
}

Tensor Pipeline::forward(const Tensor& x) {
  Impl& m = *impl_;
  if (!x.defined()) throw InvalidArgument("Pipeline::forward: undefined input");
  Tensor y = x;
  for (std::size_t k = 0; k < m.stages.size(); ++k) {
    Stage& s = m.stages[k];
    if (y.device() != s.device) y = y.copy_to(s.device);
    for (nn::Layer* layer : s.layers) {
      layer->train(false);
      y = layer->forward(y);
      layer->train(true);
    }
  }
  return y;
}

void Pipeline::step() { step(impl_->options.optimizer.lr); }

void Pipeline::step(float lr) {
  for (Stage& s : impl_->stages)
    if (s.optimizer) s.optimizer->step(lr);
}

std::vector<nn::Buffer*> Pipeline::optimizer_state() {
  std::vector<nn::Buffer*> out;
  for (Stage& s : impl_->stages)
    if (s.optimizer)
      for (nn::Buffer* b : s.optimizer->state()) out.push_back(b);
  return out;
}

int Pipeline::stages() const noexcept { return impl_->k_count(); }
Device Pipeline::device(int stage) const { return impl_->stages.at(static_cast<std::size_t>(stage)).device; }
std::pair<int, int> Pipeline::layers(int stage) const {
  const Stage& s = impl_->stages.at(static_cast<std::size_t>(stage));
  return {s.first, s.last};
}
const Schedule& Pipeline::schedule() const noexcept { return impl_->schedule; }
const PipelineOptions& Pipeline::options() const noexcept { return impl_->options; }
std::vector<int> Pipeline::peak_saved() const { return impl_->last_peaks; }
std::string Pipeline::span_marker(int stage) { return "[stage " + std::to_string(stage) + " "; }

}  // namespace weft::parallel
