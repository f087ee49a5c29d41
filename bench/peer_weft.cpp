// Weft as a user would drive it: the default engine (no tuning of workers or
// the in-flight bound), one Var per data item, push + wait_all ("weft"); the
// same ops captured once and replayed ("replay": Engine::begin_capture /
// end_capture outside the timed run, then replay + wait_all); and pushed in
// bulks of kBulkSize ("bulk": a BulkScope around the pushes, MXNet's bulk
// execution at about its default training size of 15). Two more time the
// halves of "weft" apart ("push_alone", "drain_alone": held_windows below).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "measure.h"
#include "peer.h"
#include "weft/engine.h"
#include "weft/op_graph.h"

namespace weft_bench {
namespace {

enum class Mode { push, replay, bulk, push_alone, drain_alone };
constexpr std::size_t kBulkSize = 16;
constexpr std::size_t kHeldWindow = 4096;  // ops per held window (push_alone, drain_alone)

class WeftPeer final : public Peer {
 public:
  explicit WeftPeer(Mode mode) : engine_(weft::Engine::create(config(mode))), cpu_(weft::Device::cpu(0)), mode_(mode) {}

  ~WeftPeer() override {
    // Give the vars back the documented way rather than leaving them to the
    // engine's destructor; a failure here no longer affects any result.
    try {
      graph_ = weft::OpGraph();
      for (const weft::Var& v : vars_) engine_->delete_var(v);
      if (!trigger_.is_null()) engine_->delete_var(trigger_);
      engine_->wait_all();
    } catch (...) {
    }
  }

  std::string_view name() const override {
    switch (mode_) {
      case Mode::push: return "weft";
      case Mode::replay: return "replay";
      case Mode::bulk: return "bulk";
      case Mode::push_alone: return "push_alone";
      case Mode::drain_alone: return "drain_alone";
    }
    return "?";
  }

  // The defaults, but for the held windows: a window and its held op fit
  // under the in-flight bound, so that its pushes never wait.
  static weft::EngineConfig config(Mode mode) {
    weft::EngineConfig c;
    if (mode == Mode::push_alone || mode == Mode::drain_alone) c.max_inflight = 2 * kHeldWindow;
    return c;
  }

  std::string describe() const override {
    const bool held = mode_ == Mode::push_alone || mode_ == Mode::drain_alone;
    return "kind " + std::string(engine_->kind()) + ", workers " + std::to_string(engine_->workers(cpu_)) +
           ", max_inflight " + std::to_string(engine_->max_inflight()) +
           (held ? " (EngineConfig{} defaults but the bound)" : " (EngineConfig{} defaults)") +
           (mode_ == Mode::replay ? "; the shape captured once (untimed), each run one replay"
            : mode_ == Mode::bulk ? "; pushed in bulks of " + std::to_string(kBulkSize) + " (BulkScope)"
            : mode_ == Mode::push_alone || mode_ == Mode::drain_alone
                ? "; windows of " + std::to_string(kHeldWindow) + " ops pushed behind a held op, then run: times the " +
                      (mode_ == Mode::push_alone ? "pushes" : "runs")
                : std::string());
  }

  // Vars are created once and reused by every later shape and repetition: the
  // bench measures scheduling, not variable creation.
  void prepare(const ShapeSpec& shape, std::uint64_t* /*items*/) override {
    vars_.reserve(shape.items);
    while (vars_.size() < shape.items) vars_.push_back(engine_->new_var());
  }

  double run(const ShapeSpec& shape, const Body& body, std::uint64_t* items) override {
    if (mode_ == Mode::push) {
      Stopwatch sw;
      push_ops(shape, body, items);
      engine_->wait_all();
      return sw.seconds();
    }
    if (mode_ == Mode::push_alone || mode_ == Mode::drain_alone) return held_windows(shape, body, items);
    if (mode_ == Mode::bulk) {
      Stopwatch sw;
      {
        weft::BulkScope bulk(*engine_, kBulkSize);
        push_ops(shape, body, items);
      }
      engine_->wait_all();
      return sw.seconds();
    }
    const Captured key{shape.kind, shape.ops, body.spin_iters, items};
    if (!graph_.valid() || !(key == captured_)) {
      graph_ = weft::OpGraph();  // the previous shape's ops go first
      engine_->begin_capture();
      push_ops(shape, body, items);
      graph_ = engine_->end_capture();
      captured_ = key;
    }
    Stopwatch sw;
    engine_->replay(graph_);
    engine_->wait_all();
    return sw.seconds();
  }

 private:
  void push_op(const Op& op, std::uint64_t* items, std::uint64_t iters) {
    const weft::Var* vars = vars_.data();
    weft::Var reads[2];
    for (std::uint32_t k = 0; k < op.nreads; ++k) reads[k] = vars[op.reads[k]];
    // The op captures its description by value (20 bytes + 16): it fits the
    // UniqueFunction's inline buffer, so pushing does not allocate.
    engine_->push([op, items, iters](weft::RunContext&) { run_op(op, items, iters); }, cpu_,
                  std::span<const weft::Var>(reads, op.nreads), vars[op.write]);
  }

  void push_ops(const ShapeSpec& shape, const Body& body, std::uint64_t* items) {
    const std::uint64_t iters = body.spin_iters;
    for_each_op(shape, [&](const Op& op) { push_op(op, items, iters); });
  }

  // The two halves of "weft", timed apart. The ops go in windows of
  // kHeldWindow; each window's variables are first written by one held op
  // (an async op whose completion waits; untimed), so the window's ops are
  // pushed with no worker touching what they use ("push_alone" times these
  // pushes). Then an op on a worker completes the held op, and the workers
  // run the window with nothing being pushed ("drain_alone" times from that
  // push until wait_all returns; polling the in-flight count instead would
  // pull the workers' counters away from them). The in-flight bound is twice
  // a window, so the pushes never block, and a window is long enough that
  // waking the workers (asleep by its release) costs a few ns per op.
  // Pushed ops would cost the slower half if the frontend and the workers
  // never touched the same lines at once: what "weft" costs beyond it is
  // what their meeting costs.
  double held_windows(const ShapeSpec& shape, const Body& body, std::uint64_t* items) {
    std::vector<Op> ops;
    ops.reserve(shape.ops);
    for_each_op(shape, [&](const Op& op) { ops.push_back(op); });
    weft::Engine& e = *engine_;
    if (trigger_.is_null()) trigger_ = e.new_var();
    std::vector<weft::Var> held;
    double timed = 0;
    for (std::size_t first = 0; first < ops.size(); first += kHeldWindow) {
      const std::size_t last = std::min(ops.size(), first + kHeldWindow);
      held.clear();
      for (std::size_t i = first; i < last; ++i) {
        held.push_back(vars_[ops[i].write]);
        for (std::uint32_t k = 0; k < ops[i].nreads; ++k) held.push_back(vars_[ops[i].reads[k]]);
      }
      std::sort(held.begin(), held.end(), [](const weft::Var& a, const weft::Var& b) { return a.id() < b.id(); });
      held.erase(std::unique(held.begin(), held.end()), held.end());
      std::mutex m;
      weft::Completion release;
      std::atomic<bool> holding{false};
      e.push_async(
          [&](weft::Completion done) {
            std::lock_guard lock(m);
            release = std::move(done);
            holding.store(true, std::memory_order_release);
          },
          cpu_, {}, held);
      while (!holding.load(std::memory_order_acquire)) std::this_thread::yield();
      Stopwatch pushing;
      for (std::size_t i = first; i < last; ++i) push_op(ops[i], items, body.spin_iters);
      const double pushed = pushing.seconds();
      Stopwatch draining;
      // Completed by a worker: what the release makes ready is dispatched
      // there, as when an op finishes, not by this thread.
      e.push(
          [&](weft::RunContext&) {
            std::lock_guard lock(m);
            release();
          },
          cpu_, {}, trigger_);
      e.wait_all();
      const double drained = draining.seconds();
      timed += mode_ == Mode::push_alone ? pushed : drained;
    }
    return timed;
  }

  // What the captured graph was captured for.
  struct Captured {
    ShapeKind kind = ShapeKind::independent;
    std::size_t ops = 0;
    std::uint64_t iters = 0;
    std::uint64_t* items = nullptr;
    bool operator==(const Captured&) const = default;
  };

  std::unique_ptr<weft::Engine> engine_;
  weft::Device cpu_;
  Mode mode_;
  std::vector<weft::Var> vars_;
  weft::Var trigger_;  // the held windows' releasing op writes it
  weft::OpGraph graph_;
  Captured captured_;
};

}  // namespace

std::unique_ptr<Peer> make_weft_peer() { return std::make_unique<WeftPeer>(Mode::push); }
std::unique_ptr<Peer> make_weft_replay_peer() { return std::make_unique<WeftPeer>(Mode::replay); }
std::unique_ptr<Peer> make_weft_bulk_peer() { return std::make_unique<WeftPeer>(Mode::bulk); }
std::unique_ptr<Peer> make_weft_push_alone_peer() { return std::make_unique<WeftPeer>(Mode::push_alone); }
std::unique_ptr<Peer> make_weft_drain_alone_peer() { return std::make_unique<WeftPeer>(Mode::drain_alone); }

}  // namespace weft_bench
