// oneTBB flow_graph: one continue_node per op, one edge per dependency, built
// and run inside the timed region (a flow graph has no "push into a running
// graph" mode, so building it is the price of expressing the dependencies).
#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include "measure.h"
#include "peer.h"

namespace weft_bench {
namespace {

namespace flow = oneapi::tbb::flow;
using Node = flow::continue_node<flow::continue_msg>;

class TbbFlowGraphPeer final : public Peer {
 public:
  explicit TbbFlowGraphPeer(int threads) : threads_(threads), arena_(threads) {}

  std::string_view name() const override { return "tbb_flow_graph"; }
  std::string describe() const override {
    return "task_arena of " + std::to_string(threads_) + " threads (the calling thread is one of them)";
  }

  // The last-writer table is bench scaffolding (a user would keep their own),
  // so clearing it stays outside the timing.
  void prepare(const ShapeSpec& shape, std::uint64_t*) override { last_writer_.assign(shape.items, nullptr); }

  double run(const ShapeSpec& shape, const Body& body, std::uint64_t* items) override {
    std::fill(last_writer_.begin(), last_writer_.end(), nullptr);
    const std::uint64_t iters = body.spin_iters;
    double seconds = 0;
    // The graph binds to the arena it is built in, which fixes the thread count
    // without touching TBB's global settings (the Weft engine links TBB too).
    arena_.execute([&] {
      auto g = std::make_unique<flow::graph>();
      // A deque never moves its elements, and nodes cannot be moved.
      auto nodes = std::make_unique<std::deque<Node>>();
      std::vector<Node*> roots;
      Stopwatch sw;
      for_each_op(shape, [&](const Op& op) {
        Node& n = nodes->emplace_back(*g, [op, items, iters](const flow::continue_msg&) { run_op(op, items, iters); });
        // The shapes have read-after-write and write-after-write hazards only
        // (no item is written after someone other than its writer read it), so
        // an edge from each input's last writer is the whole dependency set.
        Node* preds[3];
        int npreds = 0;
        auto add_pred = [&](std::uint32_t item) {
          Node* p = last_writer_[item];
          if (!p) return;
          for (int k = 0; k < npreds; ++k)
            if (preds[k] == p) return;
          preds[npreds++] = p;
        };
        for (std::uint32_t k = 0; k < op.nreads; ++k) add_pred(op.reads[k]);
        add_pred(op.write);
        for (int k = 0; k < npreds; ++k) flow::make_edge(*preds[k], n);
        if (npreds == 0) roots.push_back(&n);
        last_writer_[op.write] = &n;
      });
      for (Node* r : roots) r->try_put(flow::continue_msg());
      g->wait_for_all();
      seconds = sw.seconds();
      // Destroy the nodes before the graph they refer to; neither is timed.
      nodes.reset();
      g.reset();
    });
    return seconds;
  }

 private:
  int threads_;
  oneapi::tbb::task_arena arena_;
  std::vector<Node*> last_writer_;
};

}  // namespace

std::unique_ptr<Peer> make_tbb_flow_graph_peer(int threads) { return std::make_unique<TbbFlowGraphPeer>(threads); }

}  // namespace weft_bench
