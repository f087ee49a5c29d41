// Pipeline schedules as data (GPipe, 1F1B, ZB-H1, interleaved 1F1B, or text
// read from a file), their validation and bubble by running the lists, and
// the balance: the block-partition solver and the per-layer costs it splits
// (time on a sample batch, memory).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "weft/error.h"
#include "weft/gpu_sim.h"
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
namespace sched {

constexpr int kKinds = 7;
// The short form describe() prints and parse() reads, in ActionKind's order:
// F3 (forward), B3 (input gradient), W3 (weight gradient), S3 / R3 (send /
// receive the activation), s3 / r3 (the gradient); ":c" names chunk c.
constexpr char kLetters[kKinds] = {'F', 'B', 'W', 'S', 'R', 's', 'r'};

std::string short_name(const Action& a, bool chunks) {
  std::string out(1, kLetters[static_cast<int>(a.kind)]);
  out.append(std::to_string(a.micro_batch));
  if (chunks) out.append(1, ':').append(std::to_string(a.chunk));
  return out;
}

bool is_transfer(ActionKind kind) {
  return kind == ActionKind::send_activation || kind == ActionKind::recv_activation || kind == ActionKind::send_grad ||
         kind == ActionKind::recv_grad;
}

void check_sizes(int stages, int micro_batches) {
  if (stages < 1) throw InvalidArgument("Schedule: need at least one stage, got " + std::to_string(stages));
  if (micro_batches < 1)
    throw InvalidArgument("Schedule: need at least one micro-batch, got " + std::to_string(micro_batches));
}

void check_virtual(const std::string& name, int virtual_stages) {
  if (virtual_stages < 1)
    throw InvalidArgument(name + ": need at least one virtual stage per rank, got " + std::to_string(virtual_stages));
}

// Model stage `stage` of `count`: a micro-batch's forward with its transfers.
void add_forward(std::vector<Action>& list, int stage, int count, int m, int chunk) {
  if (stage > 0) list.push_back({ActionKind::recv_activation, m, chunk});
  list.push_back({ActionKind::forward, m, chunk});
  if (stage + 1 < count) list.push_back({ActionKind::send_activation, m, chunk});
}

// The input gradient, sent on at once (the weight gradient comes later).
void add_input_grad(std::vector<Action>& list, int stage, int count, int m, int chunk) {
  if (stage + 1 < count) list.push_back({ActionKind::recv_grad, m, chunk});
  list.push_back({ActionKind::backward_input, m, chunk});
  if (stage > 0) list.push_back({ActionKind::send_grad, m, chunk});
}

// A whole backward: the input gradient, the weight gradient, then the send.
void add_backward(std::vector<Action>& list, int stage, int count, int m, int chunk) {
  if (stage + 1 < count) list.push_back({ActionKind::recv_grad, m, chunk});
  list.push_back({ActionKind::backward_input, m, chunk});
  list.push_back({ActionKind::backward_weight, m, chunk});
  if (stage > 0) list.push_back({ActionKind::send_grad, m, chunk});
}

// "stage 2" or, with chunks, "stage 2 chunk 1".
std::string who(int rank, int chunk, bool chunks) {
  return "stage " + std::to_string(rank) + (chunks ? " chunk " + std::to_string(chunk) : "");
}

std::string where(int rank, std::size_t index, const Action& a, bool chunks) {
  return who(rank, a.chunk, chunks) + " action " + std::to_string(index) + " (" + std::string(to_string(a.kind)) +
         " of micro-batch " + std::to_string(a.micro_batch) + ")";
}

// One token of parse()'s text ("F3", "s12:1"); false when it is not one.
bool read_action(const std::string& token, Action& out) {
  if (token.size() < 2) return false;
  const char* letter = std::find(std::begin(kLetters), std::end(kLetters), token[0]);
  if (letter == std::end(kLetters)) return false;
  const char* p = token.data() + 1;
  const char* end = token.data() + token.size();
  auto number = [&](int& value) {
    if (p == end || !std::isdigit(static_cast<unsigned char>(*p))) return false;
    const auto [next, ec] = std::from_chars(p, end, value);
    if (ec != std::errc()) return false;
    p = next;
    return true;
  };
  out = Action{static_cast<ActionKind>(letter - std::begin(kLetters)), 0, 0};
  if (!number(out.micro_batch)) return false;
  if (p != end && *p == ':') {
    ++p;
    if (!number(out.chunk)) return false;
  }
  return p == end;
}

// parse() and from_file(); `source` opens each error ("schedule 'x'", or
// the file's path).
Schedule parse_text(const std::string& text, std::string name, const std::string& source) {
  Schedule out;
  out.name = std::move(name);
  auto fail = [&](int line, const std::string& what) {
    return InvalidArgument(source + ": line " + std::to_string(line) + ": " + what);
  };
  auto separator = [](char c) { return c == ',' || std::isspace(static_cast<unsigned char>(c)); };
  bool transfers = false;
  int chunks = 1;
  std::istringstream in(text);
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (const std::size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::size_t p = 0;
    while (p < line.size() && separator(line[p])) ++p;
    if (p == line.size()) continue;
    const int rank = out.ranks();
    if (line.compare(p, 5, "stage") == 0) {  // "stage <k>:"
      std::size_t q = p + 5;
      while (q < line.size() && std::isspace(static_cast<unsigned char>(line[q]))) ++q;
      const std::size_t digits = q;
      while (q < line.size() && std::isdigit(static_cast<unsigned char>(line[q]))) ++q;
      const std::size_t digits_end = q;
      while (q < line.size() && std::isspace(static_cast<unsigned char>(line[q]))) ++q;
      int k = -1;
      if (digits == digits_end || q == line.size() || line[q] != ':' ||
          std::from_chars(line.data() + digits, line.data() + digits_end, k).ec != std::errc()) {
        const std::size_t colon = line.find(':', p);
        std::string token = line.substr(p, colon == std::string::npos ? std::string::npos : colon + 1 - p);
        while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
        throw fail(line_no, "cannot read '" + token + "' (expected 'stage <k>:' or actions)");
      }
      if (k != rank)
        throw fail(line_no, "'stage " + std::to_string(k) + ":' where stage " + std::to_string(rank) +
                                " was expected (stage lines are numbered 0, 1, 2, ... in order)");
      p = q + 1;
    }
    std::vector<Action> list;
    while (p < line.size()) {
      while (p < line.size() && separator(line[p])) ++p;
      if (p == line.size()) break;
      std::size_t e = p;
      while (e < line.size() && !separator(line[e])) ++e;
      const std::string token = line.substr(p, e - p);
      Action a{};
      if (!read_action(token, a))
        throw fail(line_no, "cannot read '" + token +
                                "' (expected an action: F3, B3, W3, S3, R3, s3 or r3, with ':c' after it for chunk c)");
      transfers = transfers || is_transfer(a.kind);
      chunks = std::max(chunks, a.chunk + 1);
      list.push_back(a);
      p = e;
    }
    out.stages.push_back(std::move(list));
  }
  if (out.stages.empty()) throw InvalidArgument(source + ": no stages (one line of actions per stage)");
  out.virtual_stages = chunks;
  if (!transfers) {  // compute actions only: each gets its transfers
    const int ranks = out.ranks(), count = out.model_stages();
    for (int d = 0; d < ranks; ++d) {
      std::vector<Action> full;
      for (const Action& a : out.stages[static_cast<std::size_t>(d)]) {
        const int stage = a.chunk * ranks + d;
        if (a.kind == ActionKind::forward)
          add_forward(full, stage, count, a.micro_batch, a.chunk);
        else if (a.kind == ActionKind::backward_input)
          add_input_grad(full, stage, count, a.micro_batch, a.chunk);
        else
          full.push_back(a);
      }
      out.stages[static_cast<std::size_t>(d)] = std::move(full);
    }
  }
  return out;
}

}  // namespace sched
}  // namespace

Schedule Schedule::gpipe(int stages, int micro_batches) {
  sched::check_sizes(stages, micro_batches);
  Schedule s{"gpipe", std::vector<std::vector<Action>>(static_cast<std::size_t>(stages))};
  for (int k = 0; k < stages; ++k) {
    std::vector<Action>& list = s.stages[static_cast<std::size_t>(k)];
    for (int m = 0; m < micro_batches; ++m) sched::add_forward(list, k, stages, m, 0);
    for (int m = micro_batches; m-- > 0;) sched::add_backward(list, k, stages, m, 0);
  }
  return s;
}

Schedule Schedule::one_f_one_b(int stages, int micro_batches) {
  sched::check_sizes(stages, micro_batches);
  Schedule s{"1f1b", std::vector<std::vector<Action>>(static_cast<std::size_t>(stages))};
  for (int k = 0; k < stages; ++k) {
    std::vector<Action>& list = s.stages[static_cast<std::size_t>(k)];
    const int warmup = std::min(stages - k - 1, micro_batches);
    int fwd = 0, bwd = 0;
    while (fwd < warmup) sched::add_forward(list, k, stages, fwd++, 0);
    while (fwd < micro_batches) {
      sched::add_forward(list, k, stages, fwd++, 0);
      sched::add_backward(list, k, stages, bwd++, 0);
    }
    while (bwd < micro_batches) sched::add_backward(list, k, stages, bwd++, 0);
  }
  return s;
}

Schedule Schedule::zb_h1(int stages, int micro_batches) {
  sched::check_sizes(stages, micro_batches);
  Schedule s{"zb-h1", std::vector<std::vector<Action>>(static_cast<std::size_t>(stages))};
  for (int k = 0; k < stages; ++k) {
    std::vector<Action>& list = s.stages[static_cast<std::size_t>(k)];
    const int warmup = std::min(stages - k - 1, micro_batches);
    int fwd = 0, weights = 0;
    while (fwd < warmup) sched::add_forward(list, k, stages, fwd++, 0);
    for (int j = 0; j < micro_batches; ++j) {
      if (fwd < micro_batches) sched::add_forward(list, k, stages, fwd++, 0);
      sched::add_input_grad(list, k, stages, j, 0);
      // Stage k's weight gradients trail its input gradients by k.
      if (j >= k) list.push_back({ActionKind::backward_weight, weights++, 0});
    }
    while (weights < micro_batches) list.push_back({ActionKind::backward_weight, weights++, 0});
  }
  return s;
}

Schedule Schedule::interleaved_1f1b(int stages, int micro_batches, int virtual_stages) {
  sched::check_sizes(stages, micro_batches);
  sched::check_virtual("interleaved-1f1b", virtual_stages);
  if (micro_batches % stages != 0)
    throw InvalidArgument("interleaved-1f1b needs micro-batches in groups of the stages: " +
                          std::to_string(micro_batches) + " micro-batches on " + std::to_string(stages) +
                          " stages (use a multiple of " + std::to_string(stages) + ")");
  const int v = virtual_stages, count = stages * v, total = micro_batches * v;
  Schedule s{"interleaved-1f1b", std::vector<std::vector<Action>>(static_cast<std::size_t>(stages)), v};
  // Megatron-LM's order: step i of a rank's forwards (or backwards) runs
  // micro-batch group i / (K v), chunk (i / K) % v (backwards: from the
  // last chunk down), micro-batch i % K of the group.
  auto chunk_of = [&](int step, bool forward) {
    const int c = (step / stages) % v;
    return forward ? c : v - 1 - c;
  };
  auto micro_batch_of = [&](int step) { return (step / (stages * v)) * stages + step % stages; };
  for (int d = 0; d < stages; ++d) {
    std::vector<Action>& list = s.stages[static_cast<std::size_t>(d)];
    auto forward = [&](int step) {
      const int c = chunk_of(step, true);
      sched::add_forward(list, c * stages + d, count, micro_batch_of(step), c);
    };
    auto backward = [&](int step) {
      const int c = chunk_of(step, false);
      sched::add_backward(list, c * stages + d, count, micro_batch_of(step), c);
    };
    const int warmup = std::min(total, (stages - d - 1) * 2 + (v - 1) * stages);
    int fwd = 0, bwd = 0;
    while (fwd < warmup) forward(fwd++);
    while (fwd < total) {
      forward(fwd++);
      backward(bwd++);
    }
    while (bwd < total) backward(bwd++);
  }
  return s;
}

Schedule Schedule::named(const std::string& name, int stages, int micro_batches, int virtual_stages) {
  if (name == "interleaved-1f1b") return interleaved_1f1b(stages, micro_batches, virtual_stages);
  const bool known = name == "gpipe" || name == "1f1b" || name == "one_f_one_b" || name == "zb-h1";
  if (!known)
    throw InvalidArgument("Schedule: unknown schedule '" + name + "' (known: gpipe, 1f1b, one_f_one_b, zb-h1, " +
                          "interleaved-1f1b)");
  if (virtual_stages != 1)
    throw InvalidArgument("Schedule: '" + name + "' runs one model chunk per stage, not " +
                          std::to_string(virtual_stages) + " virtual stages (interleaved-1f1b runs several)");
  if (name == "gpipe") return gpipe(stages, micro_batches);
  if (name == "zb-h1") return zb_h1(stages, micro_batches);
  return one_f_one_b(stages, micro_batches);
}

Schedule Schedule::parse(const std::string& text, std::string name) {
  const std::string source = "schedule '" + name + "'";
  return sched::parse_text(text, std::move(name), source);
}

Schedule Schedule::from_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InvalidArgument("Schedule::from_file: cannot read '" + path + "': a directory");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InvalidArgument("Schedule::from_file: cannot read '" + path + "'" +
                          (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InvalidArgument("Schedule::from_file: cannot read '" + path + "'");
  return sched::parse_text(text.str(), std::filesystem::path(path).stem().string(), "schedule file '" + path + "'");
}

void Schedule::validate(int micro_batches) const {
  const int ranks_count = ranks(), v = virtual_stages;
  sched::check_sizes(ranks_count, micro_batches);
  sched::check_virtual(name, v);
  const int count = ranks_count * v;
  const bool chunks = v > 1;
  const auto m_count = static_cast<std::size_t>(micro_batches);
  // Per model stage, kind and micro-batch: the position of its action in
  // its rank's list, -1 if absent.
  std::vector<long> pos(static_cast<std::size_t>(count) * sched::kKinds * m_count, -1);
  auto at = [&](int stage, ActionKind kind, int m) -> long& {
    return pos[(static_cast<std::size_t>(stage) * sched::kKinds + static_cast<std::size_t>(kind)) * m_count +
               static_cast<std::size_t>(m)];
  };
  for (int d = 0; d < ranks_count; ++d) {
    const std::vector<Action>& list = stages[static_cast<std::size_t>(d)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.chunk < 0 || a.chunk >= v)
        throw InvalidArgument(name + ": " + sched::where(d, i, a, true) + ": no such chunk (" + std::to_string(v) +
                              " per stage)");
      if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
        throw InvalidArgument(name + ": " + sched::where(d, i, a, chunks) + ": no such micro-batch (" +
                              std::to_string(micro_batches) + " in a step)");
      const int stage = a.chunk * ranks_count + d;
      const bool first = stage == 0, last = stage + 1 == count;
      if ((first && (a.kind == ActionKind::recv_activation || a.kind == ActionKind::send_grad)) ||
          (last && (a.kind == ActionKind::send_activation || a.kind == ActionKind::recv_grad)))
        throw InvalidArgument(name + ": " + sched::where(d, i, a, chunks) + ": the " + (first ? "first" : "last") +
                              (chunks ? " model" : "") + " stage has no neighbour there");
      long& p = at(stage, a.kind, a.micro_batch);
      if (p >= 0) throw InvalidArgument(name + ": " + sched::where(d, i, a, chunks) + " repeats action " + std::to_string(p));
      p = static_cast<long>(i);
    }
    // Every action each micro-batch needs on each chunk, in order.
    for (int c = 0; c < v; ++c) {
      const int stage = c * ranks_count + d;
      const std::string here = sched::who(d, c, chunks);
      for (int m = 0; m < micro_batches; ++m) {
        auto need = [&](ActionKind kind, bool wanted) {
          if (wanted && at(stage, kind, m) < 0)
            throw InvalidArgument(name + ": " + here + " has no " + std::string(to_string(kind)) + " of micro-batch " +
                                  std::to_string(m));
        };
        need(ActionKind::forward, true);
        need(ActionKind::backward_input, true);
        need(ActionKind::backward_weight, true);
        need(ActionKind::recv_activation, stage > 0);
        need(ActionKind::send_activation, stage + 1 < count);
        need(ActionKind::recv_grad, stage + 1 < count);
        need(ActionKind::send_grad, stage > 0);
        auto before = [&](ActionKind a, ActionKind b) {
          const long pa = at(stage, a, m), pb = at(stage, b, m);
          if (pa >= 0 && pb >= 0 && pa > pb)
            throw InvalidArgument(name + ": " + here + " runs " + std::string(to_string(b)) + " of micro-batch " +
                                  std::to_string(m) + " (action " + std::to_string(pb) + ") before its " +
                                  std::string(to_string(a)) + " (action " + std::to_string(pa) + ")");
        };
        before(ActionKind::recv_activation, ActionKind::forward);
        before(ActionKind::forward, ActionKind::send_activation);
        before(ActionKind::forward, ActionKind::backward_input);
        before(ActionKind::recv_grad, ActionKind::backward_input);
        before(ActionKind::backward_input, ActionKind::send_grad);
        before(ActionKind::backward_input, ActionKind::backward_weight);
      }
    }
  }
  // Run the lists: a receive waits for the send of the neighbouring model
  // stage (on another rank or, with one rank, this one); sends never wait.
  // No rank able to move is a deadlock in the plan.
  std::vector<std::size_t> next(stages.size(), 0);
  std::vector<char> sent(static_cast<std::size_t>(count) * 2 * m_count, 0);  // [stage][activation, grad][micro-batch]
  auto sent_at = [&](int stage, int grad, int m) -> char& {
    return sent[(static_cast<std::size_t>(stage) * 2 + static_cast<std::size_t>(grad)) * m_count + static_cast<std::size_t>(m)];
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int d = 0; d < ranks_count; ++d) {
      const std::vector<Action>& list = stages[static_cast<std::size_t>(d)];
      std::size_t& i = next[static_cast<std::size_t>(d)];
      while (i < list.size()) {
        const Action& a = list[i];
        const int stage = a.chunk * ranks_count + d;
        if (a.kind == ActionKind::recv_activation && !sent_at(stage - 1, 0, a.micro_batch)) break;
        if (a.kind == ActionKind::recv_grad && !sent_at(stage + 1, 1, a.micro_batch)) break;
        if (a.kind == ActionKind::send_activation) sent_at(stage, 0, a.micro_batch) = 1;
        if (a.kind == ActionKind::send_grad) sent_at(stage, 1, a.micro_batch) = 1;
        ++i;
        moved = true;
      }
    }
  }
  std::string stuck;
  for (int d = 0; d < ranks_count; ++d) {
    const std::size_t i = next[static_cast<std::size_t>(d)];
    if (i < stages[static_cast<std::size_t>(d)].size())
      stuck += (stuck.empty() ? "" : "; ") + sched::where(d, i, stages[static_cast<std::size_t>(d)][i], chunks) +
               " waits forever";
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

double Schedule::bubble(double forward, double backward_input, double backward_weight) const {
  const double times[3] = {forward, backward_input, backward_weight};
  for (int t = 0; t < 3; ++t)
    if (!(times[t] >= 0) || !std::isfinite(times[t]))
      throw InvalidArgument(name + ": bubble: the " + std::string(to_string(static_cast<ActionKind>(t))) + " time is " +
                            std::to_string(times[t]) + " (must be a non-negative number)");
  // The micro-batches are those the lists name; each needs a forward, so
  // more of them than actions cannot all be there.
  std::size_t actions = 0;
  for (const std::vector<Action>& list : stages) actions += list.size();
  int micro_batches = 1;
  for (int d = 0; d < ranks(); ++d) {
    const std::vector<Action>& list = stages[static_cast<std::size_t>(d)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const int m = list[i].micro_batch;
      if (m >= 0 && static_cast<std::size_t>(m) >= actions)
        throw InvalidArgument(name + ": " + sched::where(d, i, list[i], virtual_stages > 1) +
                              ": no such micro-batch (the lists hold " + std::to_string(actions) + " actions)");
      micro_batches = std::max(micro_batches, m + 1);
    }
  }
  validate(micro_batches);
  // Each rank runs its list in order: compute actions take their time, a
  // send is done when the action before it is, a receive waits for its send.
  const int ranks_count = ranks(), count = model_stages();
  const auto m_count = static_cast<std::size_t>(micro_batches);
  std::vector<double> sent(static_cast<std::size_t>(count) * 2 * m_count, -1.0);
  auto sent_at = [&](int stage, int grad, int m) -> double& {
    return sent[(static_cast<std::size_t>(stage) * 2 + static_cast<std::size_t>(grad)) * m_count + static_cast<std::size_t>(m)];
  };
  std::vector<std::size_t> next(stages.size(), 0);
  std::vector<double> clock(stages.size(), 0.0);
  double busy = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int d = 0; d < ranks_count; ++d) {
      const std::vector<Action>& list = stages[static_cast<std::size_t>(d)];
      std::size_t& i = next[static_cast<std::size_t>(d)];
      double& now = clock[static_cast<std::size_t>(d)];
      for (; i < list.size(); ++i, moved = true) {
        const Action& a = list[i];
        const int stage = a.chunk * ranks_count + d;
        if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::recv_grad) {
          const double ready = a.kind == ActionKind::recv_activation ? sent_at(stage - 1, 0, a.micro_batch)
                                                                     : sent_at(stage + 1, 1, a.micro_batch);
          if (ready < 0) break;
          now = std::max(now, ready);
        } else if (a.kind == ActionKind::send_activation || a.kind == ActionKind::send_grad) {
          sent_at(stage, a.kind == ActionKind::send_grad ? 1 : 0, a.micro_batch) = now;
        } else {
          const double t = times[static_cast<int>(a.kind)];
          now += t;
          busy += t;
        }
      }
    }
  }
  const double makespan = *std::max_element(clock.begin(), clock.end());
  return makespan > 0 ? 1.0 - busy / (static_cast<double>(ranks_count) * makespan) : 0.0;
}

std::string Schedule::describe() const {
  std::ostringstream os;
  const bool chunks = virtual_stages > 1;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    if (k) os << "\n";
    os << "stage " << k << ":";
    for (const Action& a : stages[k]) os << " " << sched::short_name(a, chunks);
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
  // Seconds on the host's clock; on simulated GPUs whose kernels are modeled,
  // on the modeled clock (which the waits below move), so that the balance
  // follows the cost model and not how fast the host happened to run.
  const bool modeled = gpu::kernels_modeled() && sample.device().is_gpu();
  auto now = [modeled] {
    return modeled ? gpu::modeled_now()
                   : std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const std::size_t n = model.size();
  std::vector<std::vector<double>> runs(n);
  for (int r = 0; r <= reps; ++r) {  // run 0 warms the caches and allocators up
    std::vector<double> t(n, 0.0);
    Tensor x = sample;
    x.wait_to_read();
    for (std::size_t i = 0; i < n; ++i) {
      const double t0 = now();
      x = model[i].forward(x);
      x.wait_to_read();
      t[i] += now() - t0;
    }
    Tensor d = Tensor::ones(x.engine(), x.shape(), x.device());
    d.wait_to_read();
    for (std::size_t i = n; i-- > 0;) {
      const double t0 = now();
      d = model[i].backward(d);
      d.wait_to_read();
      for (nn::Parameter* p : model[i].parameters())
        if (p->grad.defined()) p->grad.wait_to_read();
      t[i] += now() - t0;
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
