// Capture and replay: what both engines share — recording pushes into a
// graph, resolving its dependencies once, the misuse checks. How a graph
// runs is each engine's replay_graph. docs/design/capture-replay.md.
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "engine_base.h"
#include "graph_impl.h"

namespace weft {

std::size_t OpGraph::ops() const noexcept { return impl_ ? impl_->captured : 0; }
std::size_t OpGraph::dependencies() const noexcept { return impl_ ? impl_->succ.size() : 0; }
std::size_t OpGraph::gpu_segments() const noexcept { return impl_ ? impl_->segments.size() : 0; }
std::size_t OpGraph::gpu_segment_ops() const noexcept {
  std::size_t n = 0;
  if (impl_)
    for (const auto& s : impl_->segments) n += s.ops;
  return n;
}
std::size_t OpGraph::vars() const noexcept { return impl_ && !impl_->vars.empty() ? impl_->vars.size() - 1 : 0; }

namespace detail {

namespace {
// The capture this thread is recording (one at a time per thread).
struct CaptureState {
  const EngineBase* engine = nullptr;
  std::shared_ptr<GraphImpl> graph;
};
thread_local CaptureState tls_capture;

std::string label(const std::string& name) { return name.empty() ? std::string("(unnamed)") : "'" + name + "'"; }
}  // namespace

GraphImpl::~GraphImpl() {
  if (self.is_null() || !life) return;
  std::shared_lock lock(life->mutex);
  if (life->engine == nullptr) return;  // its variables ended with it
  try {
    life->engine->delete_var(self);
  } catch (const std::exception&) {  // the engine is ending: nothing to free
  }
}

void GraphImpl::add(OpBlock& op) {
  if (nodes.size() % kChunk == 0) chunks.push_back(std::make_unique<OpBlock[]>(kChunk));
  OpBlock* node = &chunks.back()[nodes.size() % kChunk];
  node->copy_accesses_and_options(op);
  node->fn = std::move(op.fn);
  node->async_fn = std::move(op.async_fn);
  node->name = std::move(op.name);
  node->graph = this;
  node->node = static_cast<std::uint32_t>(nodes.size());
  nodes.push_back(node);
}

void GraphImpl::fold_gpu_segments() {
  auto foldable = [](const OpBlock& op) {
    return op.device.is_gpu() && !op.async && !op.run_inline && op.after_gpu_work.empty();
  };
  auto same_segment = [](const OpBlock& a, const OpBlock& b) {
    return a.device == b.device && a.property == b.property && a.priority == b.priority;
  };
  std::vector<OpBlock*> folded;
  std::vector<std::uint32_t> first;
  const std::size_t n = nodes.size();
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i + 1;
    if (foldable(*nodes[i]))
      while (j < n && foldable(*nodes[j]) && same_segment(*nodes[i], *nodes[j])) ++j;
    first.push_back(static_cast<std::uint32_t>(i));
    segment_of.push_back(j - i < 2 ? -1 : static_cast<std::int32_t>(segments.size()));
    if (j - i < 2) {
      nodes[i]->node = static_cast<std::uint32_t>(folded.size());
      folded.push_back(nodes[i]);
      i = j;
      continue;
    }
    // The segment's node: the union of its members' accesses (written where
    // any writes, read where any reads), each variable once.
    Segment& s = segments.emplace_back();
    s.ops = static_cast<std::uint32_t>(j - i);
    s.node = std::make_unique<OpBlock>();
    OpBlock& node = *s.node;
    std::vector<VarEntry> all;
    std::unordered_map<VarSlot*, std::size_t> at;
    for (std::size_t k = i; k < j; ++k) {
      OpBlock& op = *nodes[k];
      op.node = static_cast<std::uint32_t>(k);  // a member: its place in capture order
      op.ready_next = k + 1 < j ? nodes[k + 1] : nullptr;
      for (const VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) {
        auto [it, fresh] = at.try_emplace(e->slot, all.size());
        if (fresh) {
          all.push_back(*e);
          all.back().op = &node;
          all.back().next = nullptr;
        } else {
          all[it->second].write |= e->write;
          all[it->second].read |= e->read;
        }
      }
    }
    node.reserve_entries(all.size());
    for (const VarEntry& e : all) node.entries[node.entry_count++] = e;
    node.kind = OpKind::bulk;
    node.bulk = nodes[i];
    node.device = nodes[i]->device;
    node.priority = nodes[i]->priority;
    node.property = nodes[i]->property;
    node.graph = this;
    node.node = static_cast<std::uint32_t>(folded.size());
    node.name = "stream graph of " + std::to_string(j - i) + " ops on " + node.device.str() + " ('" +
                nodes[i]->name + "' .. '" + nodes[j - 1]->name + "')";
    folded.push_back(&node);
    i = j;
  }
  nodes = std::move(folded);
  first_op = std::move(first);
}

void GraphImpl::seal(Var self_var, VarSlot* self_slot, bool fold) {
  self = self_var;
  captured = nodes.size();
  if (fold) {
    fold_gpu_segments();
  } else {
    first_op.resize(captured);
    for (std::size_t i = 0; i < captured; ++i) first_op[i] = static_cast<std::uint32_t>(i);
  }
  const std::size_t n = nodes.size();
  // Per variable, the last writer and the readers since: a read depends on
  // the last write, a write on the last write and every read since.
  struct History {
    std::int64_t writer = -1;
    std::vector<std::uint32_t> readers;
    std::size_t var = 0;  // index in `vars`
  };
  std::unordered_map<VarSlot*, History> history;
  std::vector<std::vector<std::uint32_t>> out(n);
  std::vector<std::uint32_t> stamp(n, ~std::uint32_t{0});
  in_degree.assign(n, 0);
  for (std::uint32_t i = 0; i < n; ++i) {
    auto edge_from = [&](std::uint32_t from) {
      if (stamp[from] == i) return;  // each pair once
      stamp[from] = i;
      out[from].push_back(i);
      ++in_degree[i];
    };
    OpBlock& node = *nodes[i];
    for (VarEntry* e = node.begin_entries(); e != node.end_entries(); ++e) {
      auto [it, fresh] = history.try_emplace(e->slot);
      History& h = it->second;
      if (fresh) {
        h.var = vars.size();
        VarEntry& u = vars.emplace_back(*e);
        u.op = nullptr;
        u.next = nullptr;
        u.write = u.read = false;
      }
      vars[h.var].write |= e->write;
      vars[h.var].read |= e->read;
      if (h.writer >= 0) edge_from(static_cast<std::uint32_t>(h.writer));
      if (e->write) {
        for (std::uint32_t r : h.readers) edge_from(r);
        h.writer = i;
        h.readers.clear();
      } else {
        h.readers.push_back(i);
      }
    }
  }
  VarEntry& own = vars.emplace_back();
  own.slot = self_slot;
  own.generation = VarAccess::generation(self_var);
  own.var_id = self_var.id();
  own.write = true;
  std::sort(vars.begin(), vars.end(), [](const VarEntry& a, const VarEntry& b) { return std::less<>()(a.slot, b.slot); });
  succ_begin.assign(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) succ_begin[i + 1] = succ_begin[i] + static_cast<std::uint32_t>(out[i].size());
  succ.reserve(succ_begin[n]);
  for (auto& list : out) succ.insert(succ.end(), list.begin(), list.end());
  for (std::uint32_t i = 0; i < n; ++i)
    if (in_degree[i] == 0) roots.push_back(i);
  pending = std::make_unique<std::atomic<std::int32_t>[]>(n);
  free_holders.reserve(kFreeHolders);
}

OpBlock* GraphImpl::acquire_holder() {
  {
    std::lock_guard lock(holders_mutex);
    if (!free_holders.empty()) {
      OpBlock* holder = free_holders.back().release();
      free_holders.pop_back();
      return holder;
    }
  }
  // A holder in use belongs to its replay (released by release_holder).
  auto holder = std::make_unique<OpBlock>();
  holder->reserve_entries(vars.size());
  for (std::size_t k = 0; k < vars.size(); ++k) {
    holder->entries[k] = vars[k];
    holder->entries[k].op = holder.get();
  }
  holder->entry_count = static_cast<std::uint32_t>(vars.size());
  holder->name = "replay";
  holder->device = Device::cpu(0);
  holder->kind = OpKind::graph;
  return holder.release();
}

void GraphImpl::release_holder(OpBlock* holder) noexcept {
  std::unique_ptr<OpBlock> owned(holder);
  owned->error.reset();
  owned->ready_next = nullptr;
  std::lock_guard lock(holders_mutex);
  // A few stay for the next replays; more queued at once were a burst.
  if (free_holders.size() < kFreeHolders) {
    try {
      free_holders.push_back(std::move(owned));
    } catch (...) {  // (reserved by seal: never) the holder is freed instead
    }
  }
}

const VarEntry* GraphImpl::deleted_var(const OpBlock** user, std::uint32_t* index) const noexcept {
  auto uses = [](const OpBlock& op, const VarSlot* slot) {
    for (const VarEntry* e = op.entries; e != op.entries + op.entry_count; ++e)
      if (e->slot == slot) return true;
    return false;
  };
  for (const VarEntry& v : vars) {
    if (v.slot->generation.load(std::memory_order_acquire) == v.generation) continue;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const OpBlock& b = *nodes[i];
      if (!uses(b, v.slot)) continue;
      *user = &b;
      *index = first_op[i];
      if (b.kind == OpKind::bulk)  // a folded segment: the member that uses it
        for (const OpBlock* m = b.bulk; m != nullptr; m = m->ready_next, ++*index)
          if (uses(*m, v.slot)) {
            *user = m;
            break;
          }
      return &v;
    }
    *user = nullptr;
    *index = static_cast<std::uint32_t>(captured);
    return &v;
  }
  return nullptr;
}

bool EngineBase::capturing() const noexcept { return tls_capture.graph && tls_capture.engine == this; }

bool EngineBase::capture_push(OpBlock* op) {
  // Bodies running on this thread (inline ops) push as usual.
  if (!tls_capture.graph || current_op_scope() != nullptr) return false;
  if (tls_capture.engine != this) {
    std::string name = op->name;
    recycle(op);
    throw InvalidArgument("push (op " + label(name) +
                          "): this thread is capturing ops for another engine (begin_capture); a capture records "
                          "the pushes to one engine: end_capture() first");
  }
  try {
    tls_capture.graph->add(*op);
  } catch (...) {
    recycle(op);
    throw;
  }
  recycle(op);
  return true;
}

void EngineBase::refuse_wait_while_capturing(std::string_view call, const Var* var) const {
  if (!capturing() || current_op_scope() != nullptr) return;
  throw InvalidArgument(std::string(call) + (var ? "(" + vars_.describe(*var) + ")" : std::string("()")) +
                        " while this thread captures ops (begin_capture): the " +
                        std::to_string(tls_capture.graph->nodes.size()) +
                        " ops captured so far have not run; end_capture() and replay() the graph, then wait");
}

void EngineBase::begin_capture(CaptureOptions options) {
  if (const OpScope* scope = running_op_of(scope_key()))
    throw InvalidArgument("begin_capture called from inside op " + label(*scope->op_name) +
                          ": capture from the thread that pushes the ops");
  if (tls_capture.graph)
    throw InvalidArgument(std::string("begin_capture: this thread is already capturing") +
                          (tls_capture.engine == this ? "" : " for another engine") + " (" +
                          std::to_string(tls_capture.graph->nodes.size()) +
                          " ops so far); captures do not nest: end_capture() first");
  flush_bulk();  // what this thread collected comes before the capture
  auto graph = std::make_shared<GraphImpl>();
  graph->engine_id = engine_id_;
  graph->life = life();
  graph->gpu_graphs = options.gpu_graphs;
  tls_capture = {this, std::move(graph)};
}

OpGraph EngineBase::end_capture() {
  if (!capturing())
    throw InvalidArgument(tls_capture.graph ? "end_capture: this thread captures for another engine"
                                            : "end_capture without begin_capture on this thread");
  std::shared_ptr<GraphImpl> graph = std::move(tls_capture.graph);
  tls_capture = {};
  const Var self = vars_.create("graph of " + std::to_string(graph->nodes.size()) + " ops");
  try {
    graph->seal(self, vars_.resolve(self, "end_capture"), graph->gpu_graphs && runs_stream_graphs());
  } catch (...) {
    delete_var(self);
    throw;
  }
  return OpGraph(std::move(graph));
}

void EngineBase::replay(const OpGraph& graph) {
  if (!graph.impl_) throw InvalidArgument("replay: an invalid OpGraph (default-constructed or moved from)");
  GraphImpl& g = *graph.impl_;
  if (g.engine_id != engine_id_)
    throw InvalidArgument("replay: the graph of " + std::to_string(g.captured) +
                          " ops was captured on another engine");
  if (tls_capture.graph && current_op_scope() == nullptr)
    throw InvalidArgument("replay while this thread captures ops (begin_capture): end_capture() first");
  const OpBlock* op = nullptr;
  std::uint32_t index = 0;
  if (const VarEntry* v = g.deleted_var(&op, &index)) {
    const Var var = VarAccess::make(v->slot, v->var_id, v->generation, engine_id_);
    std::string user = op ? " (used by captured op " + label(op->name) + ", #" + std::to_string(index) + " of " +
                                std::to_string(g.captured) + ")"
                          : std::string(" (the graph's own variable)");
    throw InvalidArgument("replay: var #" + std::to_string(var.id()) + user +
                          " was deleted after the capture; a graph replays on the variables it captured");
  }
  if (g.nodes.empty()) return;
  flush_bulk();  // what this thread collected comes before the replay
  replay_graph(graph.impl_);
}

OpBlock* EngineBase::instantiate(const std::shared_ptr<GraphImpl>& graph, std::uint32_t i) {
  const OpBlock& node = *graph->nodes[i];
  OpBlock* op = ops_.acquire();
  op->copy_accesses_and_options(node);
  op->name = node.name;
  op->shape = node.shape;
  // The body stays the graph's: the copy calls it, and keeps the graph alive.
  if (node.async) {
    op->async_fn = AsyncOpFunction([graph, i](RunContext& ctx, Completion done) {
      graph->nodes[i]->async_fn(ctx, std::move(done));
    });
  } else {
    op->fn = OpFunction([graph, i](RunContext& ctx) { graph->nodes[i]->fn(ctx); });
  }
  op->id = next_op_id_.fetch_add(1, std::memory_order_relaxed) + 1;
  op->unblocked_by.store(0, std::memory_order_relaxed);
  op->push_ns = -1;
  if (profiler_->running()) [[unlikely]] {
    try {
      record_push(*op);
    } catch (...) {
      recycle(op);
      throw;
    }
  }
  op->pending.store(static_cast<std::int32_t>(op->entry_count) + 1, std::memory_order_relaxed);
  return op;
}

}  // namespace detail
}  // namespace weft
