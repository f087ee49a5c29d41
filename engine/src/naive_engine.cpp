#include "naive_engine.h"

#include <algorithm>

#include "graph_impl.h"
#include "weft/check_context.h"

namespace weft::detail {

namespace {
// Two ops conflict when they share a variable that either writes.
bool conflict(const OpBlock& a, const OpBlock& b) {
  for (const VarEntry* x = a.entries; x != a.entries + a.entry_count; ++x)
    for (const VarEntry* y = b.entries; y != b.entries + b.entry_count; ++y)
      if (x->slot == y->slot && (x->write || y->write)) return true;
  return false;
}
}  // namespace

NaiveEngine::NaiveEngine(ResolvedConfig config) : EngineBase(std::move(config)) {
  for (int g = 0; g < config_.gpu_devices; ++g)
    gpu_streams_.push_back(
        std::make_unique<gpu::StreamResources>(g, gpu::StreamRole::compute, config_.gpu_workspace_bytes));
}

NaiveEngine::~NaiveEngine() {
  end_bulks();
  close_shared_vars();
  at_shutdown();
}

ProfilerTrack* NaiveEngine::thread_track(Device device) {
  std::lock_guard lock(tracks_mutex_);
  auto [it, fresh] = thread_index_.emplace(std::this_thread::get_id(), static_cast<int>(thread_index_.size()));
  return recorder_.track(device, it->second, "pushing thread " + std::to_string(it->second));
}

void NaiveEngine::launch(OpBlock* op) { run(op); }

void NaiveEngine::replay_graph(const std::shared_ptr<GraphImpl>& graph) {
  for (std::uint32_t i = 0; i < graph->nodes.size(); ++i) {
    // A node's body may have deleted a variable a later node uses: that
    // push would have failed, so does this one (replay checked them all
    // before the first node ran).
    const OpBlock& node = *graph->nodes[i];
    for (const VarEntry* e = node.entries; e != node.entries + node.entry_count; ++e)
      if (e->slot->generation.load(std::memory_order_acquire) != e->generation)
        throw InvalidArgument("replay (op '" + node.name + "', #" + std::to_string(i) + " of " +
                              std::to_string(graph->nodes.size()) + "): var #" + std::to_string(e->var_id) +
                              " was deleted by an op of this replay");
    run(instantiate(graph, i));
  }
}

void NaiveEngine::show_waiting(const OpBlock* op) {
  std::lock_guard lock(shown_mutex_);
  shown_waiting_.push_back(op);
}


std::vector<PendingOp> NaiveEngine::pending_ops() const {
  // Ops run one at a time: a waiting op waits for the running ones, on the
  // variables it shares with them (a write on either side), else on their
  // turn (`behind`: the innermost running op).
  std::vector<PendingOp> out;
  std::vector<std::uint32_t> ids;
  {
    std::lock_guard lock(shown_mutex_);
    auto describe = [](const OpBlock& op, bool running) {
      PendingOp p;
      p.id = op.id;
      p.name = op.name;
      p.device = op.device;
      p.running = running;
      return p;
    };
    std::vector<const OpBlock*> waiting = shown_waiting_;
    std::sort(waiting.begin(), waiting.end(), [](const OpBlock* a, const OpBlock* b) { return a->id < b->id; });
    for (const OpBlock* op : waiting) {
      PendingOp p = describe(*op, false);
      for (const VarEntry* e = op->entries; e != op->entries + op->entry_count; ++e) {
        PendingOp::Wait w;
        w.var = e->var_id;
        w.write = e->write;
        for (const OpBlock* r : shown_running_)
          for (const VarEntry* x = r->entries; x != r->entries + r->entry_count; ++x)
            if (x->slot == e->slot && (x->write || e->write) && w.holder == 0) {
              w.holder = r->id;
              w.holder_name = r->name;
              w.holder_running = true;
            }
        if (w.holder == 0 && !shown_running_.empty()) w.behind = shown_running_.back()->id;
        p.waits.push_back(std::move(w));
      }
      out.push_back(std::move(p));
    }
    for (const OpBlock* op : shown_running_)
      if (op->entry_count > 0) out.push_back(describe(*op, true));
  }
  for (PendingOp& p : out)
    for (PendingOp::Wait& w : p.waits) w.var_name = vars_.name_of(w.var);
  return out;
}

void NaiveEngine::run(OpBlock* op) {
  show_waiting(op);
  std::unique_lock run_lock(run_mutex_);
  inflight_.fetch_add(1, std::memory_order_relaxed);
  // Pushed while this thread is already running ops — from an op body, or
  // while an op is being cleaned up (its closure may drop the last SharedVar
  // of a variable that follow-ups still use): after what was pushed before.
  if (running_ > 0) {
    deferred_.push_back(op);  // still shown waiting
    return;
  }
  struct Running {
    int& depth;
    explicit Running(int& d) : depth(++d) {}
    ~Running() { --depth; }
  } running(running_);
  run_now(op);
  while (!deferred_.empty()) {
    OpBlock* next = deferred_.front();
    deferred_.pop_front();
    run_now(next);
  }
}

void NaiveEngine::run_now(OpBlock* op) {
  {
    std::lock_guard lock(shown_mutex_);
    if (auto it = std::find(shown_waiting_.begin(), shown_waiting_.end(), op); it != shown_waiting_.end())
      shown_waiting_.erase(it);
    shown_running_.push_back(op);
  }
  struct Unshow {
    NaiveEngine* e;
    void now() {
      if (!e) return;
      std::lock_guard lock(e->shown_mutex_);
      e->shown_running_.pop_back();
      e = nullptr;
    }
    ~Unshow() { now(); }
  } unshow{this};
  if (op->kind == OpKind::delete_var) {
    unshow.now();
    vars_.recycle(op->entries[0].slot);
    recycle(op);
    inflight_.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  ErrorRef inherited = inherited_error(*op);
  if (inherited && op->run_on_failed_input) op->inherited = std::move(inherited);
  if (inherited) {
    op->error = std::move(inherited);
  } else {
    RunContext ctx{op->device, 0, op->name, this};
    if (op->inherited) ctx.failed_input = op->inherited->error;
    const bool profiling = profiler_->running();
    std::int64_t start = profiling ? Profiler::now_ns() : 0;
    {
      OpScopeGuard scope(scope_key(), &op->name, op->device);
      NvtxRange range(nvtx_.of(op->device), op->name.c_str(), op->property);
      if (!op->async) {
        try {
          CheckContextGuard check(op->name, op->device);
          if (op->device.is_gpu()) {
            // Synchronous, as everything here: one stream per GPU, drained
            // after each op, so an op's outputs are final when push returns.
            const gpu::StreamResources& stream = *gpu_streams_[static_cast<std::size_t>(op->device.index())];
            gpu::set_device(op->device.index());
            ctx.gpu = &stream.handles();
            for (const gpu::EventRef& e : op->after_gpu_work) e->stream_wait(stream.handles().stream);
            op->fn(ctx);
            stream.synchronize();
          } else {
            op->fn(ctx);
          }
        } catch (...) {
          fail(*op, std::current_exception());
        }
      } else {
        // Synchronous even for async ops: wait here until the Completion is
        // called, from this thread or any other.
        WaitSignal signal;
        op->signal = &signal;
        auto* state = new AsyncCompletion(op, this);
        try {
          op->async_fn(ctx, Completion(state));
        } catch (...) {
          if (state->claim()) complete_async(op, std::current_exception());
          else errors_.add(std::current_exception(), "(async op that threw after completing)");
        }
        state->release_executor();
        // Follow-ups the body pushed may run while it is pending (one of them
        // may be what completes it), in push order, up to the first one that
        // touches the variables of this or any enclosing pending async op:
        // that one waits for the op in any engine.
        pending_async_.push_back(op);
        auto conflicts_with_pending = [&](const OpBlock& next) {
          for (const OpBlock* pending : pending_async_)
            if (conflict(next, *pending)) return true;
          return false;
        };
        std::unique_lock lock(async_mutex_);
        while (!signal.done.load(std::memory_order_acquire)) {
          if (!deferred_.empty() && !conflicts_with_pending(*deferred_.front())) {
            OpBlock* next = deferred_.front();
            deferred_.pop_front();
            lock.unlock();
            run_now(next);
            lock.lock();
            continue;
          }
          // Only this thread adds to deferred_ (others wait for run_mutex_),
          // so nothing but the completion can change what we wait for.
          async_cv_.wait(lock, [&] { return signal.done.load(std::memory_order_acquire); });
        }
        pending_async_.pop_back();
      }
    }
    if (profiling)
      recorder_.record(thread_track(op->device), SpanInfo{recorder_.intern(op->name), op->id, start,
                                                          Profiler::now_ns(), op->push_ns, 0, op->bytes,
                                                          op->property});
  }
  for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e) {
    if (!e->write) continue;
    std::lock_guard lock(e->slot->lock);
    apply_write(*e->slot, *op);
  }
  unshow.now();
  recycle(op);
  inflight_.fetch_sub(1, std::memory_order_relaxed);
}

void NaiveEngine::complete_async(OpBlock* op, std::exception_ptr error) {
  if (error) fail(*op, std::move(error));
  std::lock_guard lock(async_mutex_);
  op->signal->done.store(true, std::memory_order_release);
  async_cv_.notify_all();
}

void NaiveEngine::wait_to_read(Var var) {
  refuse_wait_inside_op("wait_to_read", &var);
  flush_bulk();
  VarSlot* slot = vars_.resolve(var, "wait_to_read");
  std::lock_guard run_lock(run_mutex_);  // ops pushed by other threads finish first
  report(error_of(*slot));
}

void NaiveEngine::wait_to_write(Var var) {
  refuse_wait_inside_op("wait_to_write", &var);
  flush_bulk();
  VarSlot* slot = vars_.resolve(var, "wait_to_write");
  std::lock_guard run_lock(run_mutex_);
  report(error_of(*slot));
}

void NaiveEngine::wait_all() {
  refuse_wait_inside_op("wait_all", nullptr);
  flush_bulk();
  std::lock_guard run_lock(run_mutex_);
  report_all_errors();
}

void NaiveEngine::delete_var(Var var) {
  // The deletion comes after what this thread collected, and happens even
  // when pushing that fails.
  const std::exception_ptr flush_failed = flush_bulk_for_deletion();
  // The handle dies now; the slot is recycled when the deletion runs, which
  // from inside an op is after the follow-ups pushed before it.
  OpBlock* op = prepare(OpKind::delete_var, Device::cpu(0), {}, var, OpOptions{0, "delete_var"});
  try {
    vars_.retire(var);
  } catch (...) {
    recycle(op);
    throw;
  }
  run(op);
  if (flush_failed) std::rethrow_exception(flush_failed);
}

}  // namespace weft::detail
