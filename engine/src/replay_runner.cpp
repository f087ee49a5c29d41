// The threaded engine's replay runner: a captured graph's replay queued as
// one holder of the graph's variables, its nodes run as their captured
// dependencies allow once it is granted. docs/design/capture-replay.md.
#include <algorithm>
#include <cassert>
#include <memory>
#include <utility>
#include <vector>

#include "graph_impl.h"
#include "threaded_engine.h"

namespace weft::detail {

namespace {

// While a worker claims a replay's roots (run_roots): the nodes it finished,
// counted off the graph's `remaining` in one step at the end.
// Nodes of that graph its roots made ready on this worker's device wait in
// `local` (a bounded stack, run before the next chunk) instead of the queue.
struct RootClaim {
  GraphImpl* graph = nullptr;
  int pool = -1;
  std::int64_t done = 0;
  std::vector<OpBlock*> local;
};
thread_local RootClaim tls_root_claim;
constexpr std::size_t kRootChunk = 16;   // roots claimed at once
constexpr std::size_t kLocalReady = 64;  // beyond: through the queue, where other workers find them

}  // namespace

void ThreadedEngine::refuse_follow_up_of_async_node(OpBlock* op, const GraphImpl& g) {
  for (const VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e) {
    const auto held = std::lower_bound(g.vars.begin(), g.vars.end(), e->slot,
                                       [](const VarEntry& v, VarSlot* slot) { return std::less<>()(v.slot, slot); });
    if (held == g.vars.end() || held->slot != e->slot) continue;
    const std::string name = op->name;
    const std::uint32_t id = e->var_id;
    const std::string parent = *current_op_scope()->op_name;
    recycle(op);
    throw InvalidArgument("push (op '" + name + "') from inside the replayed async op '" + parent + "': it uses var #" +
                          std::to_string(id) +
                          ", which the replay holds until all its ops are done; if it completed the async op, it "
                          "would wait for the replay that waits for it. Push it outside the capture, or complete "
                          "the op without it");
  }
}

void ThreadedEngine::replay_graph(const std::shared_ptr<GraphImpl>& graph) {
  OpBlock* holder = graph->acquire_holder();
  // The holder's id and its nodes' after it, taken now: in push order, as if
  // the nodes were pushed here (what a failure reported later still reaches,
  // and the order among equal priorities).
  holder->id = next_op_id_.fetch_add(graph->captured + 1, std::memory_order_relaxed) + 1;
  holder->unblocked_by.store(0, std::memory_order_relaxed);
  holder->push_ns = -1;
  holder->graph_keep = graph;
  holder->pending.store(static_cast<std::int32_t>(holder->entry_count) + 1, std::memory_order_relaxed);
  enter_inflight(holder);
  submit(holder);  // rechecks every variable under its lock
}

void ThreadedEngine::start_graph(OpBlock* holder) {
  // The last node may finish, and the holder drop the graph, before this returns.
  const std::shared_ptr<GraphImpl> keep = holder->graph_keep;
  GraphImpl& g = *keep;
  assert(g.holder == nullptr && "replays of one graph never overlap (they write its own variable)");
  g.holder = holder;
  const std::size_t n = g.nodes.size();
  if (!g.batched) batch_roots(g);
  // Every node, and every token (one that finds no root left still runs
  // later: the replay must not end before it).
  std::size_t tokens = 0;
  for (const GraphImpl::RootBatch& b : g.root_batches) tokens += b.tokens.size();
  g.remaining.store(static_cast<std::int64_t>(n + tokens), std::memory_order_relaxed);
  g.first_id = holder->id + 1;  // reserved by replay_graph
  // The node blocks themselves are reset one by one as they become ready
  // (arm_node): a large graph is walked once per replay, not twice.
  for (std::size_t i = 0; i < n; ++i) g.pending[i].store(g.in_degree[i], std::memory_order_relaxed);
  // Released by the dispatches below (the pending counts are set). The
  // nodes are not counted in flight one by one: the holder is, until the
  // last of them is done.
  for (GraphImpl::RootBatch& b : g.root_batches) {
    b.claimed->store(0, std::memory_order_relaxed);
    for (auto& token : b.tokens) pools_[b.pool].workers->enqueue(token.get());
  }
  for (std::uint32_t r : g.single_roots) {
    OpBlock* node = g.nodes[r];
    arm_node(g, *node, holder->id);
    dispatch(node);
  }
}

void ThreadedEngine::arm_node(GraphImpl& g, OpBlock& node, std::uint64_t unblocked_by) {
  std::uint64_t id = g.first_id + g.first_op[node.node];
  node.epoch = g.holder->epoch;
  node.error.reset();
  node.inherited.reset();
  node.ready_next = nullptr;
  node.unblocked_by.store(unblocked_by, std::memory_order_relaxed);
  node.push_ns = -1;
  const bool profiling = profiler_->running();
  if (node.kind == OpKind::bulk) {  // a folded GPU segment: its ops in capture order, the node has the last id
    for (OpBlock* op = node.bulk; op != nullptr; op = op->ready_next) {
      op->id = id++;
      op->epoch = node.epoch;
      op->error.reset();
      op->inherited.reset();
      op->push_ns = -1;
      if (profiling) [[unlikely]] {
        try {
          record_push(*op);
        } catch (...) {  // the trace misses the op; the replay runs
        }
      }
    }
    node.id = id - 1;
    return;
  }
  node.id = id;
  if (profiling) [[unlikely]] {
    try {
      record_push(node);
    } catch (...) {  // the trace misses the op; the replay runs
    }
  }
}

void ThreadedEngine::batch_roots(GraphImpl& g) {
  g.batched = true;
  std::vector<std::vector<std::uint32_t>> per_pool(pools_.size());
  for (std::uint32_t r : g.roots) {
    const OpBlock& node = *g.nodes[r];
    // Prioritized roots keep their place in the priority queue.
    if (node.device.is_gpu() || node.priority != 0 || node.run_inline) {
      g.single_roots.push_back(r);
    } else {
      per_pool[pool_of(node)].push_back(r);
    }
  }
  for (std::uint32_t pool = 0; pool < per_pool.size(); ++pool) {
    std::vector<std::uint32_t>& nodes = per_pool[pool];
    if (nodes.size() < 2 * kRootChunk) {
      g.single_roots.insert(g.single_roots.end(), nodes.begin(), nodes.end());
      continue;
    }
    GraphImpl::RootBatch& b = g.root_batches.emplace_back();
    b.pool = pool;
    const std::size_t tokens =
        std::min<std::size_t>(static_cast<std::size_t>(pools_[pool].workers->size()), nodes.size() / kRootChunk);
    b.nodes = std::move(nodes);
    for (std::size_t t = 0; t < tokens; ++t) {
      auto token = std::make_unique<OpBlock>();
      token->kind = OpKind::graph_roots;
      token->device = pools_[pool].device;
      token->graph = &g;
      token->node = static_cast<std::uint32_t>(g.root_batches.size() - 1);
      b.tokens.push_back(std::move(token));
    }
  }
  std::sort(g.single_roots.begin(), g.single_roots.end());  // capture order
}

void ThreadedEngine::run_roots(OpBlock* token, int pool, int worker) {
  GraphImpl& g = *token->graph;
  GraphImpl::RootBatch& b = g.root_batches[token->node];
  const std::size_t n = b.nodes.size();
  RootClaim& claim = tls_root_claim;
  claim.graph = &g;
  claim.pool = pool;
  claim.done = 0;
  for (;;) {
    const std::size_t first = b.claimed->fetch_add(kRootChunk, std::memory_order_relaxed);
    if (first >= n) break;
    const std::size_t last = std::min(n, first + kRootChunk);
    for (std::size_t i = first; i < last; ++i) {
      OpBlock* node = g.nodes[b.nodes[i]];
      arm_node(g, *node, g.holder->id);
      run(node, pool, worker);
    }
    // What they made ready, depth first (its inputs are in this core's cache).
    while (!claim.local.empty()) {
      OpBlock* next = claim.local.back();
      claim.local.pop_back();
      run(next, pool, worker);
    }
  }
  const std::int64_t done = claim.done + 1;  // and the token itself
  claim.graph = nullptr;
  claim.pool = -1;
  // May end the replay, and the graph with the token: nothing after this.
  if (g.remaining.fetch_sub(done, std::memory_order_acq_rel) == done) {
    OpBlock* holder = std::exchange(g.holder, nullptr);
    finish(holder);
  }
}

void ThreadedEngine::finish_node(OpBlock* op, bool worker_is_done) {
  GraphImpl& g = *op->graph;
  // The holder holds every variable the graph writes: no other op can look at
  // them now (no lock needed), and the graph's edges order the nodes that
  // share one.
  for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e)
    if (e->write) apply_write(*e->slot, *op);
  OpBlock* ready = nullptr;
  for (std::uint32_t k = g.succ_begin[op->node]; k != g.succ_begin[op->node + 1]; ++k) {
    const std::uint32_t s = g.succ[k];
    // A node with one predecessor is ready now: no count to share (this
    // thread's release of what the node reads is the hand-off itself).
    if (g.in_degree[s] == 1 || g.pending[s].fetch_sub(1, std::memory_order_acq_rel) == 1) {
      OpBlock* next = g.nodes[s];
      arm_node(g, *next, op->id);
      next->ready_next = ready;
      ready = next;
    }
  }
  RootClaim& claim = tls_root_claim;
  if (claim.graph == &g) {
    // Inside run_roots: keep what runs on this device for after the chunk.
    // `ready` is newest first; so is what stays in it.
    OpBlock* rest = nullptr;
    OpBlock** tail = &rest;
    while (ready) {
      OpBlock* next = ready->ready_next;
      if (claim.local.size() < kLocalReady && ready->priority == 0 && !ready->run_inline &&
          static_cast<int>(pool_of(*ready)) == claim.pool) {
        claim.local.push_back(ready);
      } else {
        ready->ready_next = nullptr;
        *tail = ready;
        tail = &ready->ready_next;
      }
      ready = next;
    }
    ready = rest;
  }
  dispatch_ready(ready, worker_is_done, true);
  node_done(g);  // may end the graph (and `op`): nothing after this
}

void ThreadedEngine::node_done(GraphImpl& g) {
  if (tls_root_claim.graph == &g) {  // run_roots counts them off at its end
    ++tls_root_claim.done;
    return;
  }
  if (g.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  OpBlock* holder = std::exchange(g.holder, nullptr);
  finish(holder);  // releases the variables; drops the holder's hold on the graph
}

}  // namespace weft::detail
