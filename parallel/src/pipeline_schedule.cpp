// Pipeline schedules as data (GPipe, 1F1B), their validation by simulation,
// and the balance: the block-partition solver and the per-layer costs it
// splits (time on a sample batch, memory).
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/parallel/pipeline.h"

namespace weft::parallel {

std::string_view to_string(ActionKind kind) noexcept {
  switch (kind) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward_input: return "backward_input";
    case ActionKind::backward_weight: return "backward_weight";
    case ActionKind::send_activation: return "send_activation";
    case ActionKind::recv_activation: return "recv_activation";
    case ActionKind::send_grad: return "send_grad";
    case ActionKind::recv_grad: return "recv_grad";
  }
  return "?";
}

namespace {

// The short form describe() prints: F3 (forward), B3 (input gradient), W3
// (weight gradient), S3 / R3 (send / receive the activation), s3 / r3 (the
// gradient).
std::string short_name(const Action& a) {
  static constexpr const char* kLetters[] = {"F", "B", "W", "S", "R", "s", "r"};
  return kLetters[static_cast<int>(a.kind)] + std::to_string(a.micro_batch);
}

void check_sizes(int stages, int micro_batches) {
  if (stages < 1) throw InvalidArgument("Schedule: need at least one stage, got " + std::to_string(stages));
  if (micro_batches < 1)
    throw InvalidArgument("Schedule: need at least one micro-batch, got " + std::to_string(micro_batches));
}

// A micro-batch's forward on stage k with its transfers.
void add_forward(std::vector<Action>& list, int k, int stages, int m) {
  if (k > 0) list.push_back({ActionKind::recv_activation, m});
  list.push_back({ActionKind::forward, m});
  if (k + 1 < stages) list.push_back({ActionKind::send_activation, m});
}

// Its backward: the input gradient, sent on at once, then the weight gradient.
void add_backward(std::vector<Action>& list, int k, int stages, int m) {
  if (k + 1 < stages) list.push_back({ActionKind::recv_grad, m});
  list.push_back({ActionKind::backward_input, m});
  if (k > 0) list.push_back({ActionKind::send_grad, m});
  list.push_back({ActionKind::backward_weight, m});
}

std::string where(int stage, std::size_t index, const Action& a) {
  return "stage " + std::to_string(stage) + " action " + std::to_string(index) + " (" +
         std::string(to_string(a.kind)) + " of micro-batch " + std::to_string(a.micro_batch) + ")";
}

}  // namespace

Schedule Schedule::gpipe(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  Schedule s{"gpipe", std::vector<std::vector<Action>>(static_cast<std::size_t>(stages))};
  for (int k = 0; k < stages; ++k) {
    std::vector<Action>& list = s.stages[static_cast<std::size_t>(k)];
    for (int m = 0; m < micro_batches; ++m) add_forward(list, k, stages, m);
    for (int m = micro_batches; m-- > 0;) add_backward(list, k, stages, m);
  }
  return s;
}

Schedule Schedule::one_f_one_b(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  Schedule s{"1f1b", std::vector<std::vector<Action>>(static_cast<std::size_t>(stages))};
  for (int k = 0; k < stages; ++k) {
    std::vector<Action>& list = s.stages[static_cast<std::size_t>(k)];
    const int warmup = std::min(stages - k - 1, micro_batches);
    int fwd = 0, bwd = 0;
    while (fwd < warmup) add_forward(list, k, stages, fwd++);
    while (fwd < micro_batches) {
      add_forward(list, k, stages, fwd++);
      add_backward(list, k, stages, bwd++);
    }
    while (bwd < micro_batches) add_backward(list, k, stages, bwd++);
  }
  return s;
}

Schedule Schedule::named(const std::string& name, int stages, int micro_batches) {
  if (name == "gpipe") return gpipe(stages, micro_batches);
  if (name == "1f1b" || name == "one_f_one_b") return one_f_one_b(stages, micro_batches);
  throw InvalidArgument("Schedule: unknown schedule '" + name + "' (gpipe, 1f1b)");
}

void Schedule::validate(int micro_batches) const {
  const int k_count = static_cast<int>(stages.size());
  check_sizes(k_count, micro_batches);
  // Per stage and kind, the position of each micro-batch's action.
  using Positions = std::vector<std::vector<long>>;  // [kind][micro-batch] -> index, -1 if absent
  std::vector<Positions> pos(stages.size(), Positions(7, std::vector<long>(static_cast<std::size_t>(micro_batches), -1)));
  for (int k = 0; k < k_count; ++k) {
    const std::vector<Action>& list = stages[static_cast<std::size_t>(k)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
        throw InvalidArgument(name + ": " + where(k, i, a) + ": no such micro-batch (" + std::to_string(micro_batches) +
                              " in a step)");
      const bool first = k == 0, last = k + 1 == k_count;
      if ((first && (a.kind == ActionKind::recv_activation || a.kind == ActionKind::send_grad)) ||
          (last && (a.kind == ActionKind::send_activation || a.kind == ActionKind::recv_grad)))
        throw InvalidArgument(name + ": " + where(k, i, a) + ": the " + (first ? "first" : "last") +
                              " stage has no neighbour there");
      long& p = pos[static_cast<std::size_t>(k)][static_cast<std::size_t>(a.kind)][static_cast<std::size_t>(a.micro_batch)];
      if (p >= 0) throw InvalidArgument(name + ": " + where(k, i, a) + " repeats action " + std::to_string(p));
      p = static_cast<long>(i);
    }
    // Every action each micro-batch needs, in order.
    for (int m = 0; m < micro_batches; ++m) {
      auto at = [&](ActionKind kind) {
        return pos[static_cast<std::size_t>(k)][static_cast<std::size_t>(kind)][static_cast<std::size_t>(m)];
      };
      auto need = [&](ActionKind kind, bool wanted) {
        if (wanted && at(kind) < 0)
          throw InvalidArgument(name + ": stage " + std::to_string(k) + " has no " + std::string(to_string(kind)) +
                                " of micro-batch " + std::to_string(m));
      };
      need(ActionKind::forward, true);
      need(ActionKind::backward_input, true);
      need(ActionKind::backward_weight, true);
      need(ActionKind::recv_activation, k > 0);
      need(ActionKind::send_activation, k + 1 < k_count);
      need(ActionKind::recv_grad, k + 1 < k_count);
      need(ActionKind::send_grad, k > 0);
      auto before = [&](ActionKind a, ActionKind b) {
        if (at(a) >= 0 && at(b) >= 0 && at(a) > at(b))
          throw InvalidArgument(name + ": stage " + std::to_string(k) + " runs " + std::string(to_string(b)) +
                                " of micro-batch " + std::to_string(m) + " (action " + std::to_string(at(b)) +
                                ") before its " + std::string(to_string(a)) + " (action " + std::to_string(at(a)) + ")");
      };
      before(ActionKind::recv_activation, ActionKind::forward);
      before(ActionKind::forward, ActionKind::send_activation);
      before(ActionKind::forward, ActionKind::backward_input);
      before(ActionKind::recv_grad, ActionKind::backward_input);
      before(ActionKind::backward_input, ActionKind::send_grad);
      before(ActionKind::backward_input, ActionKind::backward_weight);
    }
  }
  // Run the lists: a receive waits for its send on the neighbour (sends
  // never wait). No stage able to move is a deadlock in the plan.
  std::vector<std::size_t> next(stages.size(), 0);
  std::vector<std::vector<std::vector<bool>>> sent(stages.size(), std::vector<std::vector<bool>>(
                                                                       2, std::vector<bool>(static_cast<std::size_t>(micro_batches))));
  for (bool moved = true; moved;) {
    moved = false;
    for (int k = 0; k < k_count; ++k) {
      const std::vector<Action>& list = stages[static_cast<std::size_t>(k)];
      std::size_t& i = next[static_cast<std::size_t>(k)];
      while (i < list.size()) {
        const Action& a = list[i];
        const auto m = static_cast<std::size_t>(a.micro_batch);
        if (a.kind == ActionKind::recv_activation && !sent[static_cast<std::size_t>(k - 1)][0][m]) break;
        if (a.kind == ActionKind::recv_grad && !sent[static_cast<std::size_t>(k + 1)][1][m]) break;
        if (a.kind == ActionKind::send_activation) sent[static_cast<std::size_t>(k)][0][m] = true;
        if (a.kind == ActionKind::send_grad) sent[static_cast<std::size_t>(k)][1][m] = true;
        ++i;
        moved = true;
      }
    }
  }
  std::string stuck;
  for (int k = 0; k < k_count; ++k) {
    const std::size_t i = next[static_cast<std::size_t>(k)];
    if (i < stages[static_cast<std::size_t>(k)].size())
      stuck += (stuck.empty() ? "" : "; ") + where(k, i, stages[static_cast<std::size_t>(k)][i]) + " waits forever";
  }
  if (!stuck.empty()) throw InvalidArgument(name + ": the schedule deadlocks: " + stuck);
}

std::vector<int> Schedule::peak_in_flight() const {
  std::vector<int> out;
  for (const std::vector<Action>& list : stages) {
    int live = 0, peak = 0;
    for (const Action& a : list) {
      if (a.kind == ActionKind::forward) peak = std::max(peak, ++live);
      if (a.kind == ActionKind::backward_weight) --live;
    }
    out.push_back(peak);
  }
  return out;
}

std::string Schedule::describe() const {
  std::ostringstream os;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    if (k) os << "\n";
    os << "stage " << k << ":";
    for (const Action& a : stages[k]) os << " " << short_name(a);
  }
  return os.str();
}

// ---- balance ---------------------------------------------------------------

std::vector<int> partition(const std::vector<double>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  if (parts < 1) throw InvalidArgument("partition: parts must be positive, got " + std::to_string(parts));
  if (parts > n)
    throw InvalidArgument("partition: " + std::to_string(parts) + " parts of " + std::to_string(n) +
                          " costs (each part needs one)");
  for (int i = 0; i < n; ++i)
    if (!(costs[static_cast<std::size_t>(i)] >= 0))
      throw InvalidArgument("partition: cost " + std::to_string(i) + " is " + std::to_string(costs[static_cast<std::size_t>(i)]) +
                            " (must be a non-negative number)");
  std::vector<double> prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<std::size_t>(i) + 1] = prefix[static_cast<std::size_t>(i)] + costs[static_cast<std::size_t>(i)];
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[j][i]: the smallest largest-block sum of the first i costs in j
  // blocks; cut[j][i]: where its last block starts.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(parts) + 1,
                                        std::vector<double>(static_cast<std::size_t>(n) + 1, kInf));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(static_cast<std::size_t>(n) + 1, 0));
  best[0][0] = 0;
  for (int j = 1; j <= parts; ++j)
    for (int i = j; i <= n; ++i)
      for (int c = j - 1; c < i; ++c) {  // the last block is [c, i)
        const double v = std::max(best[static_cast<std::size_t>(j) - 1][static_cast<std::size_t>(c)],
                                  prefix[static_cast<std::size_t>(i)] - prefix[static_cast<std::size_t>(c)]);
        if (v < best[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)]) {
          best[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = v;
          cut[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = c;
        }
      }
  std::vector<int> sizes(static_cast<std::size_t>(parts));
  for (int j = parts, i = n; j > 0; --j) {
    const int c = cut[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)];
    sizes[static_cast<std::size_t>(j) - 1] = i - c;
    i = c;
  }
  return sizes;
}

std::vector<double> layer_times(nn::Sequential& model, const Tensor& sample, int reps) {
  if (reps < 1) throw InvalidArgument("layer_times: reps must be positive, got " + std::to_string(reps));
  using Clock = std::chrono::steady_clock;
  const std::size_t n = model.size();
  std::vector<std::vector<double>> runs(n);
  for (int r = 0; r <= reps; ++r) {  // run 0 warms the caches and allocators up
    std::vector<double> t(n, 0.0);
    Tensor x = sample;
    x.wait_to_read();
    for (std::size_t i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      x = model[i].forward(x);
      x.wait_to_read();
      t[i] += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    Tensor d = Tensor::ones(x.engine(), x.shape(), x.device());
    d.wait_to_read();
    for (std::size_t i = n; i-- > 0;) {
      const auto t0 = Clock::now();
      d = model[i].backward(d);
      d.wait_to_read();
      for (nn::Parameter* p : model[i].parameters())
        if (p->grad.defined()) p->grad.wait_to_read();
      t[i] += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    if (r > 0)
      for (std::size_t i = 0; i < n; ++i) runs[i].push_back(t[i]);
  }
  std::vector<double> out;
  for (std::vector<double>& v : runs) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

std::vector<double> layer_sizes(nn::Sequential& model, const Shape& sample) {
  std::vector<double> out;
  Shape s = sample;
  for (std::size_t i = 0; i < model.size(); ++i) {
    s = model[i].output_shape(s);
    double bytes = static_cast<double>(s.numel()) * 4.0;
    for (const nn::Parameter* p : model[i].parameters()) bytes += static_cast<double>(p->value.numel()) * 4.0;
    out.push_back(bytes);
  }
  return out;
}

std::vector<int> balance_by_time(nn::Sequential& model, const Tensor& sample, int stages, int reps) {
  return partition(layer_times(model, sample, reps), stages);
}

std::vector<int> balance_by_size(nn::Sequential& model, const Shape& sample, int stages) {
  return partition(layer_sizes(model, sample), stages);
}

}  // namespace weft::parallel
