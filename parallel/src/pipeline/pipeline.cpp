// Pipeline: the runner that pushes a schedule's actions as engine ops.
//
// One step: the batch's rows are split into micro-batches; in one process
// the ranks' lists are merged into one push order in which every action
// comes after what it needs (a receive after its send); across processes
// each member pushes its own list, its receives in their senders' order.
// Each action pushes its ops under an ops::PushScope naming the rank and
// action (traces read "conv2d [stage 1 F3]"), backward above forward in
// priority. A rank's actions run in its list's order: every op of a
// forward, input or weight gradient reads the rank's order variable, which
// a "done" op writes once they are done, and a send waits for it too (the
// phony dependencies of torchgpipe's fork and join), so a device neither
// runs ahead of its schedule nor holds more activations than it says.
//
// What a stage's layers keep between a micro-batch's forward and its
// backward is taken out of them after each action (Layer::take_saved) and
// put back before the next one of that micro-batch (restore_saved).
#include <algorithm>
#include <any>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft/error.h"
#include "weft/nn_ops.h"
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

// One micro-batch on one model stage.
struct Micro {
  Tensor input;     // the stage's input (received, or the batch's rows on stage 0)
  Tensor output;    // the forward's output
  Tensor grad_out;  // the gradient of the loss w.r.t. the output
  Tensor grad_in;   // backward_input's result, w.r.t. the input
  std::vector<std::any> saved;  // what the stage's layers keep for it, between its actions
  bool checkpointed = false;
  bool holding = false;  // its activations are kept (forward or recomputation done, weight gradient not)
};

// One model stage: chunk `chunk` of rank `rank`.
struct Stage {
  int rank = 0, chunk = 0;
  bool local = true;  // this process runs it
  Device device;      // local stages only
  int first = 0, last = 0;  // layer indices [first, last)
  std::vector<nn::Layer*> layers;
  std::vector<nn::Parameter*> params;  // local stages only
  std::vector<Tensor> grads;  // accumulated over the step's micro-batches, one per param
  std::vector<bool> have;     // grads[i] holds a micro-batch's gradient already
  int weights_done = 0;  // weight gradients of this step so far
  std::optional<optim::Optimizer> optimizer;  // over params, on the stage's device
  std::vector<Micro> micro;
};

// One rank of the schedule: its device and the variable that orders its actions.
struct Rank {
  bool local = true;
  Device device;
  Var order;  // read by every op of an action, written once the action's ops are done
  Var arrivals;  // in one process: written by each receive's copy (they start in list order)
  int saved_now = 0, saved_peak = 0;
  // Loss scaling: the scaler's state on the rank's device ([1] float32 each),
  // as buffers for checkpoints ("pipeline.stage<r>.loss_scale.scale", ...).
  nn::Buffer scale, growth_tracker, skipped;
};

// A transfer between model stages, as both ends name it (the name is part
// of the send's and recv's fingerprint).
struct Message {
  bool gradient = false;
  int to = 0;  // the receiving model stage
  int micro_batch = 0;
};

std::string action_label(int rank, const Action& a, int virtual_stages) {
  static constexpr const char* kLetters[] = {"F", "B", "W", "S", "R", "s", "r"};
  std::string label = "stage " + std::to_string(rank) + " " + kLetters[static_cast<int>(a.kind)] + std::to_string(a.micro_batch);
  if (virtual_stages > 1) label += ":" + std::to_string(a.chunk);
  return label;
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::forward || kind == ActionKind::backward_input || kind == ActionKind::backward_weight;
}

// A 64-bit FNV-1a hash, for the plan's fingerprint.
std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

struct Pipeline::Impl {
  Engine* engine = nullptr;
  nn::Sequential* model = nullptr;
  PipelineOptions options;
  LossFunction loss;
  Schedule schedule;
  std::vector<Stage> stages;  // model stages
  std::vector<Rank> ranks;
  int my_rank = -1;  // across processes: this process's member; -1 in one process
  std::vector<Tensor> labels;  // per micro-batch, on the last stage's device
  std::vector<double> weight;  // per micro-batch: its share of the batch's rows
  std::vector<std::int64_t> rows;  // per micro-batch
  Shape sample;  // the batch's shape (rows included)
  Tensor total_loss;
  std::vector<int> last_peaks;
  // Across processes: per peer, the messages it sends this rank in its
  // list's order, and how many of them have a recv pushed.
  std::map<int, std::vector<Message>> expected;
  std::map<int, std::size_t> posted;

  int rank_count() const { return static_cast<int>(ranks.size()); }
  int stage_count() const { return static_cast<int>(stages.size()); }
  int stage_of(int rank, int chunk) const { return chunk * rank_count() + rank; }
  Stage& stage(int index) { return stages[static_cast<std::size_t>(index)]; }
  Rank& rank_of(const Stage& s) { return ranks[static_cast<std::size_t>(s.rank)]; }
  bool distributed() const { return my_rank >= 0; }
  const Communicator& comm() const { return *options.ranks; }
  Precision policy = Precision::fp32;  // the model's precision (options.precision, or the model's own)
  // Across processes: the dtype activations and gradients travel in (the
  // layers' compute dtype), so a receive knows what to allocate.
  DType wire_dtype() const { return compute_dtype(policy); }
  Tensor on_wire(const Tensor& t) const { return t.dtype() == wire_dtype() ? t : ops::cast(t, wire_dtype()); }

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

  // The shape of model stage `index`'s input for a micro-batch of `n` rows.
  Shape input_shape(int index, std::int64_t n) const {
    std::vector<std::int64_t> dims = sample.dims();
    dims[0] = n;
    Shape shape(dims);
    for (int i = 0; i < stages[static_cast<std::size_t>(index)].first; ++i)
      shape = (*model)[static_cast<std::size_t>(i)].output_shape(shape);
    return shape;
  }

  // A transfer's tensor waits for the rank's previous action (a send runs in
  // its list's place): an op reading the rank's order variable rewrites it (a
  // no-op), so the send, which reads it, waits. Read as well as written: a
  // failed tensor stays failed instead of being cleared by the no-op.
  //
  // The order ops do nothing: on a GPU they go to its priority stream, which
  // holds nothing else of the pipeline, so what they wait for is only what
  // they depend on, not whatever kernels a compute stream queued before them.
  void follow_order(Rank& r, const Tensor& t) {
    if (!t.defined()) return;
    engine->push([] {}, r.device, {t.var(), r.order}, {t.var()},
                 OpOptions{.name = "in order", .property = OpProperty::prioritized});
  }
  // An action's ops done: the rank's next action may start.
  void mark(Rank& r) {
    engine->push([] {}, r.device, {}, {r.order}, OpOptions{.name = "done", .property = OpProperty::prioritized});
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
  // Micro-batches whose activations the rank keeps: from the forward (or,
  // checkpointed, the recomputation) to the weight gradient.
  void hold(Stage& s, Micro& m) {
    m.holding = true;
    Rank& r = rank_of(s);
    r.saved_peak = std::max(r.saved_peak, ++r.saved_now);
  }
  void release(Stage& s, Micro& m) {
    if (m.holding) --rank_of(s).saved_now;
    m.holding = false;
  }

  Tensor run_forward(Stage& s, const Tensor& x) {
    Tensor y = x;
    for (nn::Layer* layer : s.layers) y = layer->forward(y);
    return y;
  }

  void forward(int index, int mb) {
    Stage& s = stage(index);
    Micro& m = s.micro[static_cast<std::size_t>(mb)];
    m.output = run_forward(s, m.input);
    if (m.checkpointed) {
      // Keep only the input: what the layers kept goes (its memory is freed
      // once the forward's ops are done with it).
      for (nn::Layer* layer : s.layers) (void)layer->take_saved();
    } else {
      take(s, m);
      hold(s, m);
    }
    if (index + 1 == stage_count()) {
      // The loss of this micro-batch (on float32 logits), weighted by its
      // share of the rows and, with loss scaling, multiplied by the scale;
      // the gradient enters backward in the output's dtype.
      const Tensor logits = m.output.dtype() == DType::float32 ? m.output : ops::cast(m.output, DType::float32);
      MicroBatchLoss l = loss(logits, labels[static_cast<std::size_t>(mb)]);
      const float w = static_cast<float>(weight[static_cast<std::size_t>(mb)]);
      Tensor g = ops::mul_scalar(l.dlogits, w);
      if (options.loss_scaling) g = ops::scale_by(g, rank_of(s).scale.value);
      m.grad_out = g.dtype() == m.output.dtype() ? g : ops::cast(g, m.output.dtype());
      const Tensor part = ops::mul_scalar(l.loss, w);
      total_loss = total_loss.defined() ? total_loss + part : part;
    }
  }

  void backward_input(int index, int mb) {
    Stage& s = stage(index);
    Micro& m = s.micro[static_cast<std::size_t>(mb)];
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
    const std::vector<Tensor> before = current_grads(s);
    for (auto it = s.layers.rbegin(); it != s.layers.rend(); ++it) d = (*it)->backward_input(d);
    // Layers whose gradients come from one op (layer norm, batch norm) set
    // them here; another micro-batch's input gradient may come before this
    // one's weight gradient, so they are taken now.
    accumulate_new_grads(s, before);
    m.grad_in = d;
    m.output = Tensor();
    take(s, m);
  }

  void backward_weight(int index, int mb) {
    Stage& s = stage(index);
    Micro& m = s.micro[static_cast<std::size_t>(mb)];
    restore(s, m);
    const std::vector<Tensor> before = current_grads(s);
    for (auto it = s.layers.rbegin(); it != s.layers.rend(); ++it) (*it)->backward_weight();
    release(s, m);
    for (std::size_t i = 0; i < s.params.size(); ++i)
      if (!s.params[i]->grad.defined())
        throw InvalidArgument("Pipeline: parameter '" + s.params[i]->name + "' on stage " + std::to_string(index) +
                              " got no gradient from its layer");
    accumulate_new_grads(s, before);
    m.input = m.grad_out = Tensor();
    ++s.weights_done;
  }

  static std::vector<Tensor> current_grads(const Stage& s) {
    std::vector<Tensor> out;
    out.reserve(s.params.size());
    for (const nn::Parameter* p : s.params) out.push_back(p->grad);
    return out;
  }

  // The step's gradient: of each parameter, the first micro-batch's
  // gradient becomes the accumulator, later ones are added to it. Only the
  // gradients set since `before` (a new tensor) count.
  static void accumulate_new_grads(Stage& s, const std::vector<Tensor>& before) {
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      const Tensor& g = s.params[i]->grad;
      if (!g.defined() || g.storage() == before[i].storage()) continue;
      if (!s.have[i]) {
        s.grads[i] = g;
        s.have[i] = true;
      } else {
        ops::axpy(1.0f, g, s.grads[i]);
      }
    }
  }

  // Data parallel: the stage's gradients averaged over its replicas, in
  // buckets (last parameters first, as a backward produces them).
  void reduce_over_replicas(int index) {
    Stage& s = stage(index);
    if (!options.replicas || s.params.empty()) return;
    // Not named after the rank's actions: the bubble counts those alone.
    ops::PushScope scope(kBackwardPriority, "pipeline allreduce of model stage " + std::to_string(index));
    std::vector<Tensor> bucket;
    std::int64_t elements = 0;
    int count = 0;
    auto flush = [&] {
      if (bucket.empty()) return;
      Tensor flat = Tensor::empty(*engine, Shape{elements}, s.device)
                        .set_name("pipeline stage " + std::to_string(index) + " bucket " + std::to_string(count));
      ops::pack(bucket, flat);
      allreduce(*options.replicas, {flat}, ReduceOp::average,
                {.name = "pipeline stage " + std::to_string(index) + " bucket " + std::to_string(count),
                 .priority = kBackwardPriority});
      ops::unpack(flat, bucket);
      bucket.clear();
      elements = 0;
      ++count;
    };
    for (std::size_t i = s.grads.size(); i-- > 0;) {
      bucket.push_back(s.grads[i]);
      elements += s.grads[i].numel();
      if (static_cast<std::size_t>(elements) * sizeof(float) >= options.bucket_bytes) flush();
    }
    flush();
  }

  std::string message_name(const Message& msg) const {
    return std::string(msg.gradient ? "pipeline gradient " : "pipeline activation ") +
           std::to_string(msg.gradient ? msg.to + 1 : msg.to - 1) + "->" + std::to_string(msg.to) + " micro-batch " +
           std::to_string(msg.micro_batch);
  }

  // Hands `t` (of model stage `from`) to model stage `to`, once the
  // sender's earlier actions are done: across processes a send to its
  // rank's member; in one process the tensor itself, which the receive
  // copies to its device (arrive()).
  void transfer(int from, int to, bool gradient, int mb, const Tensor& t) {
    Stage& src = stage(from);
    Stage& dst = stage(to);
    follow_order(rank_of(src), t);
    if (dst.local) {
      Micro& m = dst.micro[static_cast<std::size_t>(mb)];
      (gradient ? m.grad_out : m.input) = t;
      return;
    }
    send(comm(), on_wire(t), dst.rank, {.name = message_name({gradient, to, mb}), .priority = kForwardPriority});
  }

  // In one process: the receive copies what its sender handed over to its
  // device after the rank's previous receive, so each device's incoming
  // copies take their peer stream in its list's order (a copy queued there
  // ahead of its turn would hold later ones behind the work it waits for),
  // while they overlap its compute.
  void arrive(Stage& dst, Tensor& slot, const std::string& label) {
    if (!slot.defined() || slot.device() == dst.device) return;
    Rank& r = rank_of(dst);
    ops::PushScope chained(kForwardPriority, label, {}, r.arrivals);
    slot = slot.copy_to(dst.device);
  }

  // Across processes: the recv of `want` from `peer`, and first those the
  // peer sends earlier (the k-th send between two members meets the k-th
  // recv), each into a new tensor of the shape its stage expects.
  void post_recvs(int peer, const Message& want) {
    // Posted already, ahead of an earlier receive of this rank's list.
    Micro& wanted = stage(want.to).micro[static_cast<std::size_t>(want.micro_batch)];
    if ((want.gradient ? wanted.grad_out : wanted.input).defined()) return;
    const std::vector<Message>& list = expected[peer];
    std::size_t& next = posted[peer];
    for (;;) {
      if (next == list.size())
        throw Error("Pipeline: rank " + std::to_string(my_rank) + " waits for " + message_name(want) + " from rank " +
                    std::to_string(peer) + ", whose list does not send it");
      const Message msg = list[next++];
      Stage& dst = stage(msg.to);
      const Shape shape =
          input_shape(msg.gradient ? msg.to + 1 : msg.to, rows[static_cast<std::size_t>(msg.micro_batch)]);
      Tensor t = Tensor::empty(*engine, shape, dst.device, wire_dtype()).set_name(message_name(msg));
      recv(comm(), t, peer, {.name = message_name(msg), .priority = kForwardPriority});
      Micro& m = dst.micro[static_cast<std::size_t>(msg.micro_batch)];
      (msg.gradient ? m.grad_out : m.input) = t;
      if (msg.gradient == want.gradient && msg.to == want.to && msg.micro_batch == want.micro_batch) return;
    }
  }

  void run(int rank, const Action& a) {
    const int index = stage_of(rank, a.chunk);
    Stage& s = stage(index);
    Rank& r = ranks[static_cast<std::size_t>(rank)];
    const bool backward = a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_weight ||
                          a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad;
    const int priority = backward ? kBackwardPriority : kForwardPriority;
    const std::string label = action_label(rank, a, schedule.virtual_stages);
    const int mb = a.micro_batch;
    if (is_compute(a.kind)) {
      {
        ops::PushScope scope(priority, label, r.order);
        if (a.kind == ActionKind::forward) forward(index, mb);
        else if (a.kind == ActionKind::backward_input) backward_input(index, mb);
        else backward_weight(index, mb);
      }
      mark(r);
      if (a.kind == ActionKind::backward_weight && s.weights_done == options.chunks) reduce_over_replicas(index);
      return;
    }
    // Transfers keep one priority: a GPU pool takes ready ops by priority,
    // then push order, and a copy stream runs them in the order taken.
    ops::PushScope scope(kForwardPriority, label);
    Micro& m = s.micro[static_cast<std::size_t>(mb)];
    switch (a.kind) {
      case ActionKind::send_activation: transfer(index, index + 1, false, mb, m.output); return;
      case ActionKind::send_grad:
        transfer(index, index - 1, true, mb, m.grad_in);
        m.grad_in = Tensor();
        return;
      case ActionKind::recv_activation:
        if (!stage(index - 1).local) post_recvs(stage(index - 1).rank, {false, index, mb});
        else arrive(s, m.input, label);
        return;
      case ActionKind::recv_grad:
        if (!stage(index + 1).local) post_recvs(stage(index + 1).rank, {true, index, mb});
        else arrive(s, m.grad_out, label);
        return;
      default: return;
    }
  }

  // Across processes: what each peer sends this rank, in its list's order.
  void plan_messages() {
    expected.clear();
    posted.clear();
    for (int q = 0; q < rank_count(); ++q) {
      if (q == my_rank) continue;
      for (const Action& a : schedule.stages[static_cast<std::size_t>(q)]) {
        const int from = stage_of(q, a.chunk);
        int to = -1;
        if (a.kind == ActionKind::send_activation) to = from + 1;
        if (a.kind == ActionKind::send_grad) to = from - 1;
        if (to < 0 || stage(to).rank != my_rank) continue;
        expected[q].push_back({a.kind == ActionKind::send_grad, to, a.micro_batch});
      }
    }
  }

  void make_loss_scaler();
  void step(float lr);
  const Rank& local_rank(int rank, const char* what) const {
    if (rank < 0 || rank >= rank_count())
      throw InvalidArgument(std::string("Pipeline::") + what + ": rank " + std::to_string(rank) + " of " +
                            std::to_string(rank_count()));
    const Rank& r = ranks[static_cast<std::size_t>(rank)];
    if (!r.local)
      throw InvalidArgument(std::string("Pipeline::") + what + ": rank " + std::to_string(rank) + " runs in another process");
    return r;
  }
  int first_local_rank() const { return distributed() ? my_rank : 0; }

  // Across processes: every member's plan, compared before any data moves.
  void check_plans() {
    std::string plan = schedule.describe() + "\nbalance";
    for (int b : options.balance) {
      plan += ' ';
      plan += std::to_string(b);
    }
    plan += "\nchunks " + std::to_string(options.chunks) + " checkpoint " + std::string(to_string(options.checkpoint)) +
            " layers " + std::to_string(model->size());
    plan += " precision ";
    plan += to_string(policy);
    if (const auto& ls = options.loss_scaling) {
      plan += " loss scaling ";
      for (const double v : {static_cast<double>(ls->init_scale), static_cast<double>(ls->rule.growth_factor),
                             static_cast<double>(ls->rule.backoff_factor), static_cast<double>(ls->rule.growth_interval)}) {
        plan += std::to_string(v);
        plan += ' ';
      }
    }
    const std::uint64_t hash = fnv1a(plan);
    // 16-bit pieces and small integers are exact in float32.
    constexpr int kNameChars = 16, kWords = 4 + 4 + kNameChars;
    std::vector<float> mine(kWords, 0.0f);
    for (int i = 0; i < 4; ++i) mine[static_cast<std::size_t>(i)] = static_cast<float>((hash >> (16 * i)) & 0xffff);
    mine[4] = static_cast<float>(rank_count());
    mine[5] = static_cast<float>(schedule.virtual_stages);
    mine[6] = static_cast<float>(options.chunks);
    mine[7] = static_cast<float>(model->size());
    for (int i = 0; i < kNameChars && i < static_cast<int>(schedule.name.size()); ++i)
      mine[static_cast<std::size_t>(8 + i)] = static_cast<float>(static_cast<unsigned char>(schedule.name[static_cast<std::size_t>(i)]));
    const Device device = ranks[static_cast<std::size_t>(my_rank)].device;
    const int members = comm().size();
    Tensor in = Tensor::from_host(*engine, Shape{kWords}, mine, device).set_name("pipeline plan");
    Tensor out = Tensor::empty(*engine, Shape{static_cast<std::int64_t>(kWords) * members}, device).set_name("pipeline plans");
    all_gather(comm(), {in}, {out}, {.name = "pipeline plan"});
    const std::vector<float> all = out.to_host();
    auto describe_plan = [&](int r) {
      const float* w = all.data() + static_cast<std::ptrdiff_t>(r) * kWords;
      std::string name;
      for (int i = 0; i < kNameChars && w[8 + i] != 0.0f; ++i) name += static_cast<char>(static_cast<int>(w[8 + i]));
      return "rank " + std::to_string(r) + " has '" + name + "' over " + std::to_string(static_cast<int>(w[4])) +
             " ranks x " + std::to_string(static_cast<int>(w[5])) + " virtual stages, " +
             std::to_string(static_cast<int>(w[6])) + " micro-batches, " + std::to_string(static_cast<int>(w[7])) +
             " layers";
    };
    for (int r = 0; r < members; ++r) {
      if (r == my_rank) continue;
      const float* w = all.data() + static_cast<std::ptrdiff_t>(r) * kWords;
      if (!std::equal(w, w + kWords, mine.data())) {
        const bool same_summary = std::equal(w + 4, w + kWords, mine.data() + 4);
        throw CommunicationError("Pipeline: the plans of ranks " + std::to_string(my_rank) + " and " + std::to_string(r) +
                                     " differ: " + describe_plan(my_rank) + ", " + describe_plan(r) +
                                     (same_summary ? " (the same sizes: the action lists, balance, checkpointing, precision or loss scaling differ)" : "") +
                                     "; every member must build the same pipeline",
                                 my_rank, r);
      }
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
  if (options.chunks < 1) throw InvalidArgument("Pipeline: chunks must be at least 1, got " + std::to_string(options.chunks));
  // The model's precision is set once nothing else can be refused (below).
  m.policy = options.precision ? *options.precision : model.precision();
  if (const auto& ls = options.loss_scaling) {
    if (!(ls->init_scale > 0.0f) || !std::isfinite(ls->init_scale))
      throw InvalidArgument("Pipeline: LossScaling::init_scale " + std::to_string(ls->init_scale) +
                            " must be a positive finite number");
    const ops::LossScaleRule& rule = ls->rule;
    if (!(rule.growth_factor >= 1.0f) || !std::isfinite(rule.growth_factor) || !(rule.backoff_factor > 0.0f) ||
        !(rule.backoff_factor <= 1.0f) || rule.growth_interval < 1)
      throw InvalidArgument("Pipeline: LossScaling::rule with growth_factor " + std::to_string(rule.growth_factor) +
                            ", backoff_factor " + std::to_string(rule.backoff_factor) + ", growth_interval " +
                            std::to_string(rule.growth_interval) +
                            " cannot work (want a finite growth_factor >= 1, 0 < backoff_factor <= 1, growth_interval >= 1)");
  } else if (options.precision && needs_loss_scaling(*options.precision)) {
    throw InvalidArgument("Pipeline: precision fp16, whose gradients underflow without a loss scale: set "
                          "PipelineOptions::loss_scaling (or use bf16)");
  } else if (!options.precision) {
    for (std::size_t i = 0; i < model.size(); ++i)
      if (needs_loss_scaling(model[i].precision()))
        throw InvalidArgument("Pipeline: layer " + std::to_string(i) + " (" + model[i].describe() +
                              ") computes in fp16, whose gradients underflow without a loss scale: set "
                              "PipelineOptions::loss_scaling (or use bf16)");
  }
  if (options.virtual_stages < 1)
    throw InvalidArgument("Pipeline: virtual_stages must be at least 1, got " + std::to_string(options.virtual_stages));
  const std::vector<Device> known = engine.devices();
  // The ranks and their devices.
  int rank_count = 0;
  std::vector<Device> rank_devices;
  if (options.ranks) {
    const Communicator& comm = *options.ranks;
    if (&comm.engine() != &engine) throw InvalidArgument("Pipeline: the ranks' communicator belongs to another engine");
    if (comm.local_ranks().size() != 1)
      throw InvalidArgument("Pipeline: across processes each process runs one rank, but this one drives " +
                            std::to_string(comm.local_ranks().size()) + " members of " + comm.str());
    rank_count = comm.size();
    m.my_rank = comm.local_ranks().front();
    const Device mine = comm.device(m.my_rank);
    if (!options.devices.empty() && (options.devices.size() != 1 || options.devices.front() != mine))
      throw InvalidArgument("Pipeline: across processes the devices are the communicator's (this member's is " +
                            mine.str() + "); leave PipelineOptions::devices empty");
    rank_devices.assign(static_cast<std::size_t>(rank_count), Device{});
    rank_devices[static_cast<std::size_t>(m.my_rank)] = mine;
  } else {
    if (balance.size() % static_cast<std::size_t>(options.virtual_stages) != 0)
      throw InvalidArgument("Pipeline: " + std::to_string(balance.size()) + " model stages in the balance are not " +
                            std::to_string(options.virtual_stages) + " virtual stages per rank");
    const std::size_t wanted = balance.size() / static_cast<std::size_t>(options.virtual_stages);
    if (options.devices.size() < wanted)
      throw InvalidArgument("Pipeline: " + std::to_string(wanted) + " stages but only " +
                            std::to_string(options.devices.size()) + " devices");
    if (options.devices.size() > wanted)
      throw InvalidArgument("Pipeline: " + std::to_string(options.devices.size()) + " devices for " +
                            std::to_string(wanted) + " stages (one device per stage)");
    for (Device d : options.devices)
      if (std::find(known.begin(), known.end(), d) == known.end())
        throw InvalidArgument("Pipeline: device " + d.str() + " is not one of the engine's");
    rank_count = static_cast<int>(wanted);
    rank_devices = options.devices;
  }
  m.schedule = options.custom ? options.custom(rank_count, options.chunks)
                              : Schedule::named(options.schedule, rank_count, options.chunks, options.virtual_stages);
  if (m.schedule.ranks() != rank_count)
    throw InvalidArgument("Pipeline: the schedule '" + m.schedule.name + "' has " + std::to_string(m.schedule.ranks()) +
                          " stages, the pipeline " + std::to_string(rank_count) +
                          (options.ranks ? " ranks (" + options.ranks->str() + ")" : std::string(" devices")));
  if (m.schedule.model_stages() != static_cast<int>(balance.size()))
    throw InvalidArgument("Pipeline: the schedule '" + m.schedule.name + "' runs " +
                          std::to_string(m.schedule.model_stages()) + " model stages (" + std::to_string(rank_count) +
                          " ranks x " + std::to_string(m.schedule.virtual_stages) + " virtual stages), the balance has " +
                          std::to_string(balance.size()));
  m.schedule.validate(options.chunks);
  if (options.replicas) {
    const Communicator& replicas = *options.replicas;
    if (&replicas.engine() != &engine)
      throw InvalidArgument("Pipeline: the replicas' communicator (" + replicas.str() + ") belongs to another engine");
    if (replicas.local_ranks().size() != 1)
      throw InvalidArgument("Pipeline: replicas need one member per process, but this one drives " +
                            std::to_string(replicas.local_ranks().size()) + " members of " + replicas.str());
    if (!options.ranks && rank_count > 1)
      throw InvalidArgument("Pipeline: replicas go with stages on ranks (PipelineOptions::ranks) or a single stage");
    const Device theirs = replicas.device(replicas.local_ranks().front());
    const Device mine = options.ranks ? rank_devices[static_cast<std::size_t>(m.my_rank)] : rank_devices.front();
    if (theirs != mine)
      throw InvalidArgument("Pipeline: this process's replica member is on " + theirs.str() + " but its stage on " +
                            mine.str() + " (" + replicas.str() + ")");
  }
  if (options.precision) model.set_precision(*options.precision);
  for (int r = 0; r < rank_count; ++r) {
    Rank rank;
    rank.local = !options.ranks || r == m.my_rank;
    rank.device = rank_devices[static_cast<std::size_t>(r)];
    m.ranks.push_back(rank);
  }
  // Weight tying (LMHead computing with the Embedding's weight): within a
  // process the tied layer reads the owner's weight (copied to its device)
  // and hands its gradient to the owner; across processes it cannot.
  if (options.ranks) {
    std::vector<int> rank_of_layer;
    for (int k = 0; k < static_cast<int>(balance.size()); ++k)
      rank_of_layer.insert(rank_of_layer.end(), static_cast<std::size_t>(balance[static_cast<std::size_t>(k)]),
                           k % rank_count);
    for (std::size_t i = 0; i < model.size(); ++i)
      for (const nn::Parameter* tied : model[i].tied_parameters())
        for (std::size_t j = 0; j < model.size(); ++j) {
          const std::vector<nn::Parameter*> own = model[j].parameters();
          if (std::find(own.begin(), own.end(), tied) != own.end() && rank_of_layer[i] != rank_of_layer[j])
            throw InvalidArgument("Pipeline: layer " + std::to_string(i) + " (" + model[i].describe() + ", rank " +
                                  std::to_string(rank_of_layer[i]) + ") computes with parameter '" + tied->name +
                                  "' of layer " + std::to_string(j) + " (rank " + std::to_string(rank_of_layer[j]) +
                                  "): weight tying across processes is not supported; build the model untied "
                                  "(nn::GptConfig::tie_weights = false) or put both layers on one rank");
        }
  }
  int first = 0;
  for (int k = 0; k < static_cast<int>(balance.size()); ++k) {
    Stage s;
    s.rank = k % rank_count;
    s.chunk = k / rank_count;
    s.local = m.ranks[static_cast<std::size_t>(s.rank)].local;
    s.device = m.ranks[static_cast<std::size_t>(s.rank)].device;
    s.first = first;
    s.last = first + balance[static_cast<std::size_t>(k)];
    for (int i = s.first; i < s.last; ++i) {
      s.layers.push_back(&model[static_cast<std::size_t>(i)]);
      if (s.local)
        for (nn::Parameter* p : model[static_cast<std::size_t>(i)].parameters()) s.params.push_back(p);
    }
    s.grads.resize(s.params.size());
    s.have.assign(s.params.size(), false);
    if (s.local) {
      m.move_layers_to(s);
      if (!s.params.empty()) s.optimizer.emplace(s.params, options.optimizer);
    }
    first = s.last;
    m.stages.push_back(std::move(s));
  }
  m.options = std::move(options);
  if (m.distributed()) m.check_plans();
  m.make_loss_scaler();
  // Last: nothing throws after them (a constructor that throws runs no destructor).
  for (int r = 0; r < rank_count; ++r) {
    Rank& rank = m.ranks[static_cast<std::size_t>(r)];
    if (!rank.local) continue;
    rank.order = engine.new_var("pipeline stage " + std::to_string(r) + " order");
    rank.arrivals = engine.new_var("pipeline stage " + std::to_string(r) + " arrivals");
  }
}

void Pipeline::Impl::make_loss_scaler() {
  const auto& ls = options.loss_scaling;
  if (!ls) return;
  for (int r = 0; r < rank_count(); ++r) {
    Rank& rank = ranks[static_cast<std::size_t>(r)];
    if (!rank.local) continue;
    const std::string at = " (pipeline stage " + std::to_string(r) + ")";
    const std::string prefix = "pipeline.stage" + std::to_string(r) + ".loss_scale.";
    rank.scale = {prefix + "scale", Tensor::full(*engine, Shape{1}, ls->init_scale, rank.device).set_name("loss scale" + at)};
    rank.growth_tracker = {prefix + "growth_tracker",
                           Tensor::zeros(*engine, Shape{1}, rank.device).set_name("loss scale growth tracker" + at)};
    rank.skipped = {prefix + "skipped", Tensor::zeros(*engine, Shape{1}, rank.device).set_name("skipped steps" + at)};
  }
}

Pipeline::~Pipeline() {
  // The order variables go once the ops on them are done; the pipeline
  // holds no tensors between steps (a wait here would also take, and hide,
  // errors of other work on the engine).
  for (Rank& r : impl_->ranks)
    if (r.local) {
      impl_->engine->delete_var(r.order);
      impl_->engine->delete_var(r.arrivals);
    }
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
  if (labels.shape().rank() == 0 || labels.shape()[0] != rows)
    throw InvalidArgument("Pipeline::train_step: labels " + labels.str() + " do not match the input's " +
                          std::to_string(rows) + " rows");
  Stage& first_stage = m.stages.front();
  Stage& last_stage = m.stages.back();
  m.labels.clear();
  m.weight.clear();
  m.rows.clear();
  m.sample = x.shape();
  m.total_loss = Tensor();
  for (Stage& s : m.stages) {
    s.micro.assign(static_cast<std::size_t>(chunks), Micro{});
    s.have.assign(s.params.size(), false);
    s.weights_done = 0;
  }
  for (Rank& r : m.ranks) r.saved_now = r.saved_peak = 0;
  const Checkpoint cp = m.options.checkpoint;
  // Micro-batches of rows as even as can be (the first rows % chunks one longer).
  std::int64_t begin = 0;
  for (int c = 0; c < chunks; ++c) {
    const std::int64_t n = rows / chunks + (c < rows % chunks ? 1 : 0);
    if (first_stage.local) {
      Tensor part = ops::slice_rows(x, begin, begin + n);
      first_stage.micro[static_cast<std::size_t>(c)].input =
          part.device() == first_stage.device ? part : part.copy_to(first_stage.device);
    }
    if (last_stage.local) {
      Tensor lab = ops::slice_rows(labels, begin, begin + n);
      m.labels.push_back(lab.device() == last_stage.device ? lab : lab.copy_to(last_stage.device));
    }
    begin += n;
    m.rows.push_back(n);
    m.weight.push_back(static_cast<double>(n) / static_cast<double>(rows));
    const bool checkpointed = cp == Checkpoint::always || (cp == Checkpoint::except_last && c + 1 < chunks);
    for (Stage& s : m.stages) s.micro[static_cast<std::size_t>(c)].checkpointed = checkpointed;
  }
  for (Stage& s : m.stages)
    if (s.local)
      for (nn::Layer* layer : s.layers) {
        layer->train(true);
        (void)layer->take_saved();  // nothing left over from an earlier forward
      }
  const Schedule& sched = m.schedule;
  if (m.distributed()) {
    // This rank's list in order; receives are pushed in their sender's order.
    m.plan_messages();
    for (const Action& a : sched.stages[static_cast<std::size_t>(m.my_rank)]) m.run(m.my_rank, a);
  } else {
    // The lists merged into one push order: the order in which the actions
    // would run with unit costs (a forward, an input gradient and a weight
    // gradient one unit each, a send none, a receive not before its send),
    // ties to the lower rank. A GPU runs each stream's work in push order,
    // so any other order can hold a copy behind a later one on the
    // receiver's peer stream; draining one rank's list first would also
    // fill the engine's in-flight bound with that rank's ops. validate()
    // ruled out deadlocks.
    const auto kc = static_cast<std::size_t>(m.rank_count());
    const auto sc = static_cast<std::size_t>(m.stage_count()), mc = static_cast<std::size_t>(chunks);
    std::vector<std::size_t> next(kc, 0);
    std::vector<double> clock(kc, 0.0);
    // sent_at[model stage][0 activation | 1 gradient][micro-batch]: when it was sent (-1: not yet).
    std::vector<std::vector<std::vector<double>>> sent_at(sc, std::vector<std::vector<double>>(2, std::vector<double>(mc, -1.0)));
    for (;;) {
      std::size_t best = kc;
      double best_start = 0;
      for (std::size_t k = 0; k < kc; ++k) {
        const std::vector<Action>& list = sched.stages[k];
        if (next[k] == list.size()) continue;
        const Action& a = list[next[k]];
        const auto mb = static_cast<std::size_t>(a.micro_batch);
        const auto index = static_cast<std::size_t>(m.stage_of(static_cast<int>(k), a.chunk));
        double start = clock[k];
        if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::recv_grad) {
          const double at = a.kind == ActionKind::recv_activation ? sent_at[index - 1][0][mb] : sent_at[index + 1][1][mb];
          if (at < 0) continue;
          start = std::max(start, at);
        }
        if (best == kc || start < best_start) best = k, best_start = start;
      }
      if (best == kc) break;
      const Action& a = sched.stages[best][next[best]];
      m.run(static_cast<int>(best), a);
      clock[best] = best_start + (is_compute(a.kind) ? 1.0 : 0.0);
      const auto mb = static_cast<std::size_t>(a.micro_batch);
      const auto index = static_cast<std::size_t>(m.stage_of(static_cast<int>(best), a.chunk));
      if (a.kind == ActionKind::send_activation) sent_at[index][0][mb] = clock[best];
      if (a.kind == ActionKind::send_grad) sent_at[index][1][mb] = clock[best];
      ++next[best];
    }
  }
  m.last_peaks.clear();
  for (Rank& r : m.ranks) m.last_peaks.push_back(r.saved_peak);
  for (Stage& s : m.stages) {
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
  if (x.shape().rank() == 0) throw InvalidArgument("Pipeline::forward: the input " + x.str() + " has no rows");
  m.sample = x.shape();
  Tensor y = x;
  for (int k = 0; k < m.stage_count(); ++k) {
    Stage& s = m.stage(k);
    if (!s.local) {
      y = Tensor();
      continue;
    }
    const std::string name = "pipeline forward " + std::to_string(k - 1) + "->" + std::to_string(k);
    if (k > 0 && !m.stage(k - 1).local) {
      y = Tensor::empty(*m.engine, m.input_shape(k, x.shape()[0]), s.device, m.wire_dtype()).set_name(name);
      recv(m.comm(), y, m.stage(k - 1).rank, {.name = name});
    } else if (y.device() != s.device) {
      y = y.copy_to(s.device);
    }
    for (nn::Layer* layer : s.layers) {
      layer->train(false);
      y = layer->forward(y);
      layer->train(true);
    }
    if (k + 1 < m.stage_count() && !m.stage(k + 1).local)
      send(m.comm(), m.on_wire(y), m.stage(k + 1).rank,
           {.name = "pipeline forward " + std::to_string(k) + "->" + std::to_string(k + 1)});
  }
  return m.stages.back().local ? y : Tensor();
}

void Pipeline::step() { step(impl_->options.optimizer.lr); }

void Pipeline::step(float lr) { impl_->step(lr); }

// With loss scaling: each rank unscales its stages' gradients and flags an
// Inf or NaN; the flags are agreed (in one process summed over the ranks'
// devices, across processes the largest over the ranks and the replicas),
// so every stage skips the same step and every rank's scale moves alike.
void Pipeline::Impl::step(float lr) {
  if (!options.loss_scaling) {
    for (Stage& s : stages)
      if (s.optimizer) s.optimizer->step(lr);
    return;
  }
  const auto kc = static_cast<std::size_t>(rank_count());
  std::vector<Tensor> found(kc);
  for (std::size_t r = 0; r < kc; ++r) {
    Rank& rank = ranks[r];
    if (!rank.local) continue;
    std::vector<Tensor> grads;
    for (const Stage& s : stages)
      if (s.rank == static_cast<int>(r))
        for (const nn::Parameter* p : s.params) {
          if (!p->grad.defined())
            throw InvalidArgument("Pipeline::step: parameter '" + p->name + "' has no gradient (run train_step first)");
          grads.push_back(p->grad);
        }
    ops::PushScope scope(kBackwardPriority, "pipeline loss scaling of stage " + std::to_string(r));
    found[r] = grads.empty() ? Tensor::zeros(*engine, Shape{1}, rank.device)
                             : ops::unscale_and_check(grads, rank.scale.value).set_name("found inf (pipeline stage " + std::to_string(r) + ")");
  }
  std::vector<Tensor> agreed(kc);
  if (distributed()) {
    std::vector<Tensor> mine{found[static_cast<std::size_t>(my_rank)]};
    allreduce(comm(), mine, ReduceOp::max, {.name = "pipeline found inf"});
    agreed[static_cast<std::size_t>(my_rank)] = mine.front();
  } else {
    // Flags are 0 or 1: a sum above 0 is the same verdict as the largest.
    for (std::size_t r = 0; r < kc; ++r) {
      Tensor sum;
      for (std::size_t q = 0; q < kc; ++q) {
        const Tensor f = found[q].device() == ranks[r].device ? found[q] : found[q].copy_to(ranks[r].device);
        sum = sum.defined() ? ops::add(sum, f) : f;
      }
      agreed[r] = sum;
    }
  }
  if (options.replicas)
    for (std::size_t r = 0; r < kc; ++r)
      if (ranks[r].local) {
        std::vector<Tensor> mine{agreed[r]};
        allreduce(*options.replicas, mine, ReduceOp::max, {.name = "pipeline found inf (replicas)"});
        agreed[r] = mine.front();
      }
  for (Stage& s : stages)
    if (s.optimizer) s.optimizer->step(lr, optim::StepInputs{.skip = {agreed[static_cast<std::size_t>(s.rank)]}});
  for (std::size_t r = 0; r < kc; ++r) {
    Rank& rank = ranks[r];
    if (rank.local)
      ops::update_loss_scale(rank.scale.value, rank.growth_tracker.value, rank.skipped.value, agreed[r],
                             options.loss_scaling->rule);
  }
}

float Pipeline::loss_scale() const { return loss_scale(impl_->first_local_rank()); }
float Pipeline::loss_scale(int rank) const {
  const Rank& r = impl_->local_rank(rank, "loss_scale");
  return r.scale.value.defined() ? r.scale.value.item() : 1.0f;
}
std::int64_t Pipeline::skipped_steps() const { return skipped_steps(impl_->first_local_rank()); }
std::int64_t Pipeline::skipped_steps(int rank) const {
  const Rank& r = impl_->local_rank(rank, "skipped_steps");
  return r.skipped.value.defined() ? static_cast<std::int64_t>(r.skipped.value.item()) : 0;
}

std::vector<nn::Buffer*> Pipeline::optimizer_state() {
  std::vector<nn::Buffer*> out;
  for (Stage& s : impl_->stages)
    if (s.optimizer)
      for (nn::Buffer* b : s.optimizer->state()) out.push_back(b);
  for (Rank& r : impl_->ranks)
    if (r.scale.value.defined())
      for (nn::Buffer* b : {&r.scale, &r.growth_tracker, &r.skipped}) out.push_back(b);
  return out;
}

int Pipeline::stages() const noexcept { return impl_->stage_count(); }
int Pipeline::ranks() const noexcept { return impl_->rank_count(); }
bool Pipeline::is_local(int stage) const { return impl_->stages.at(static_cast<std::size_t>(stage)).local; }
Device Pipeline::device(int stage) const {
  const Stage& s = impl_->stages.at(static_cast<std::size_t>(stage));
  if (!s.local)
    throw InvalidArgument("Pipeline::device: stage " + std::to_string(stage) + " runs on rank " + std::to_string(s.rank) +
                          ", another process");
  return s.device;
}
std::pair<int, int> Pipeline::layers(int stage) const {
  const Stage& s = impl_->stages.at(static_cast<std::size_t>(stage));
  return {s.first, s.last};
}
const Schedule& Pipeline::schedule() const noexcept { return impl_->schedule; }
const PipelineOptions& Pipeline::options() const noexcept { return impl_->options; }
std::vector<int> Pipeline::peak_saved() const { return impl_->last_peaks; }
std::string Pipeline::span_marker(int rank) { return "[stage " + std::to_string(rank) + " "; }

}  // namespace weft::parallel
