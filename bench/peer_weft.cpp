// Weft as a user would drive it: the default engine (no tuning of workers or
// the in-flight bound), one Var per data item, push + wait_all ("weft"); the
// same ops captured once and replayed ("replay": Engine::begin_capture /
// end_capture outside the timed run, then replay + wait_all); and pushed in
// bulks of kBulkSize ("bulk": a BulkScope around the pushes, MXNet's bulk
// execution at about its default training size of 15).
#include <span>
#include <vector>

#include "measure.h"
#include "peer.h"
#include "weft/engine.h"
#include "weft/op_graph.h"

namespace weft_bench {
namespace {

enum class Mode { push, replay, bulk };
constexpr std::size_t kBulkSize = 16;

class WeftPeer final : public Peer {
 public:
  explicit WeftPeer(Mode mode)
      : engine_(weft::Engine::create(weft::EngineConfig{})), cpu_(weft::Device::cpu(0)), mode_(mode) {}

  ~WeftPeer() override {
    // Give the vars back the documented way rather than leaving them to the
    // engine's destructor; a failure here no longer affects any result.
    try {
      graph_ = weft::OpGraph();
      for (const weft::Var& v : vars_) engine_->delete_var(v);
      engine_->wait_all();
    } catch (...) {
    }
  }

  std::string_view name() const override {
    return mode_ == Mode::replay ? "replay" : mode_ == Mode::bulk ? "bulk" : "weft";
  }

  std::string describe() const override {
    return "kind " + std::string(engine_->kind()) + ", workers " + std::to_string(engine_->workers(cpu_)) +
           ", max_inflight " + std::to_string(engine_->max_inflight()) + " (EngineConfig{} defaults)" +
           (mode_ == Mode::replay ? "; the shape captured once (untimed), each run one replay"
            : mode_ == Mode::bulk ? "; pushed in bulks of " + std::to_string(kBulkSize) + " (BulkScope)"
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
  void push_ops(const ShapeSpec& shape, const Body& body, std::uint64_t* items) {
    const std::uint64_t iters = body.spin_iters;
    weft::Engine& e = *engine_;
    const weft::Var* vars = vars_.data();
    const weft::Device cpu = cpu_;
    for_each_op(shape, [&](const Op& op) {
      weft::Var reads[2];
      for (std::uint32_t k = 0; k < op.nreads; ++k) reads[k] = vars[op.reads[k]];
      // The op captures its description by value (20 bytes + 16): it fits the
      // UniqueFunction's inline buffer, so pushing does not allocate.
      e.push([op, items, iters](weft::RunContext&) { run_op(op, items, iters); }, cpu,
             std::span<const weft::Var>(reads, op.nreads), vars[op.write]);
    });
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
  weft::OpGraph graph_;
  Captured captured_;
};

}  // namespace

std::unique_ptr<Peer> make_weft_peer() { return std::make_unique<WeftPeer>(Mode::push); }
std::unique_ptr<Peer> make_weft_replay_peer() { return std::make_unique<WeftPeer>(Mode::replay); }
std::unique_ptr<Peer> make_weft_bulk_peer() { return std::make_unique<WeftPeer>(Mode::bulk); }

}  // namespace weft_bench
