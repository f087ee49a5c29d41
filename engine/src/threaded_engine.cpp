#include "threaded_engine.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <thread>

#include "gpu_spans.h"
#include "gpu_sync.h"
#include "graph_impl.h"
#include "nvtx_ranges.h"
#include "pending_ops.h"
#include "weft/check_context.h"
#include "weft/gpu_sim.h"

namespace weft::detail {

namespace {

// Set while this thread runs (or skips) an inline op (OpOptions::run_inline):
// what that makes ready is queued, so inline runs never nest.
thread_local bool tls_running_inline = false;

// While this thread runs the body of an async node of a replay: the graph
// (its holder holds the variables a follow-up of the body must not touch).
thread_local const GraphImpl* tls_async_node_graph = nullptr;

// While profiling, the tracks this thread recorded inline bodies on (a
// track has one writer: each thread gets its own per engine and device).
struct InlineTrack {
  std::uint32_t engine_id;
  Device device;
  ProfilerTrack* track;
};
thread_local std::vector<InlineTrack> tls_inline_tracks;

// Grants `e` at once when its variable's queue is empty and the access is
// compatible with what runs; otherwise queues it. Caller holds the lock.
// Returns 1 when granted.
int link(VarEntry& e) noexcept {
  VarSlot& s = *e.slot;
  e.next = nullptr;
  if (s.tail) {  // the head is blocked (invariant), so is everything behind it
    s.tail->next = &e;
    s.tail = &e;
    return 0;
  }
  if (e.write ? (!s.write_running && s.running_reads == 0) : !s.write_running) {
    if (e.write)
      s.write_running = true;
    else
      ++s.running_reads;
    return 1;
  }
  s.head = s.tail = &e;
  return 0;
}

// Accesses granted under their variables' locks, whose ops are told after
// the lock is let go: telling an op (its count, its trace link) touches the
// lines the frontend has just written, and the frontend pushing the next op
// of a chain is waiting for this lock meanwhile. A long run of reads is told
// kHeld at a time under the lock, all but the last ones.
struct Grants {
  static constexpr int kHeld = 8;
  VarEntry* held[kHeld];
  int count = 0;
};

// Counts one granted access off its op; an op whose last access is granted
// goes onto `ready`.
void tell_granted(VarEntry& h, std::uint64_t by, OpBlock*& ready) noexcept {
  h.op->unblocked_by.store(by, std::memory_order_relaxed);  // published by the decrement below
  if (h.op->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    h.op->ready_next = ready;
    ready = h.op;
  }
}

// Releases one access and grants, in queue order, what can run next: a run of
// reads or one write. Granted accesses go into `grants`, to be told in order
// after the lock (tell_granted); a full `grants` is told here first. Caller
// holds the lock.
void release_and_grant(VarEntry& e, Grants& grants, OpBlock*& ready) noexcept {
  VarSlot& s = *e.slot;
  if (e.write) {
    assert(s.write_running && s.running_reads == 0);
    s.write_running = false;
  } else {
    assert(!s.write_running && s.running_reads > 0);
    --s.running_reads;
  }
  while (VarEntry* h = s.head) {
    const bool write = h->write;
    if (write) {
      if (s.write_running || s.running_reads != 0) break;
      s.write_running = true;
    } else {
      if (s.write_running) break;
      ++s.running_reads;
    }
    s.head = h->next;
    if (!s.head) s.tail = nullptr;
    // Unlinked: nobody else reaches `h` through this variable any more.
    if (grants.count == Grants::kHeld) {  // in grant order: the held ones first
      for (VarEntry* g : grants.held) tell_granted(*g, e.op->id, ready);
      grants.count = 0;
    }
    grants.held[grants.count++] = h;
    if (write) break;
  }
}

// Trace names of the stream roles (docs/trace-format.md).
std::string_view trace_role(gpu::StreamRole role) {
  return role == gpu::StreamRole::peer ? std::string_view("p2p") : gpu::to_string(role);
}
constexpr int kLaunchTrackOffset = 1000;
constexpr int kInlineTrackOffset = 2000;

std::size_t worker_slots(const ResolvedConfig& c) {
  return static_cast<std::size_t>(c.cpu_devices) * static_cast<std::size_t>(c.workers_per_cpu_device) +
         static_cast<std::size_t>(c.gpu_devices) * static_cast<std::size_t>(c.compute_streams_per_gpu + 4);
}
}  // namespace

ThreadedEngine::ThreadedEngine(ResolvedConfig config)
    : EngineBase(std::move(config)),
      counts_(worker_slots(config_)),
      resume_below_(std::max<std::size_t>(1, config_.max_inflight / 4)) {
  running_slots_ = worker_slots(config_);
  running_ = std::make_unique<std::atomic<const OpBlock*>[]>(running_slots_);
  for (std::size_t i = 0; i < running_slots_; ++i) running_[i].store(nullptr, std::memory_order_relaxed);
  std::size_t slot = 0;
  auto add_pool = [&](Device device, gpu::StreamRole role, int workers) {
    Pool& pool = pools_.emplace_back();
    pool.device = device;
    pool.role = role;
    pool.first_slot = slot;
    slot += static_cast<std::size_t>(workers);
    for (int w = 0; w < workers; ++w) {
      if (!device.is_gpu()) {
        pool.tracks.push_back(recorder_.track(device, w, "worker " + std::to_string(w), TrackKind::worker,
                                              device.str() + " workers"));
        continue;
      }
      // Per GPU worker two tracks: its stream as the GPU ran it (by role, then
      // stream), and the worker's host thread enqueuing the work.
      const std::string stream = std::string(trace_role(role)) + " stream " + std::to_string(w);
      const int index = static_cast<int>(role) * 100 + w;
      pool.tracks.push_back(recorder_.track(device, kLaunchTrackOffset + index, stream + " (launch)",
                                            TrackKind::launch, device.str() + " " + stream + " launch"));
      ProfilerTrack* gpu_side = recorder_.track(device, index, stream, TrackKind::stream, device.str() + " " + stream);
      pool.streams.push_back(std::make_unique<gpu::StreamResources>(
          device.index(), role,
          role == gpu::StreamRole::compute || role == gpu::StreamRole::priority ? config_.gpu_workspace_bytes : 0));
      pool.gpu_spans.push_back(std::make_unique<GpuSpanRecorder>(device.index(), gpu_side));
    }
  };
  pools_.reserve(static_cast<std::size_t>(config_.cpu_devices + config_.gpu_devices * kPoolsPerGpu));
  for (int d = 0; d < config_.cpu_devices; ++d)
    add_pool(Device::cpu(d), gpu::StreamRole::compute, config_.workers_per_cpu_device);
  for (int g = 0; g < config_.gpu_devices; ++g) {
    add_pool(Device::gpu(g), gpu::StreamRole::compute, config_.compute_streams_per_gpu);
    add_pool(Device::gpu(g), gpu::StreamRole::h2d, 1);
    add_pool(Device::gpu(g), gpu::StreamRole::d2h, 1);
    add_pool(Device::gpu(g), gpu::StreamRole::peer, 1);
    add_pool(Device::gpu(g), gpu::StreamRole::priority, 1);
  }
  for (std::size_t i = 0; i < pools_.size(); ++i)
    pools_[i].workers = std::make_unique<WorkerPool>(
        pools_[i].device, static_cast<int>(i), static_cast<int>(pools_[i].tracks.size()),
        static_cast<OpExecutor&>(*this),
        pools_[i].device.is_gpu() ? WorkerPool::Order::push : WorkerPool::Order::ready);
}

ThreadedEngine::~ThreadedEngine() {
  end_bulks();
  close_shared_vars();
  gpu::ScopedWaitCause cause(gpu::WaitCause::shutdown);
  drain();
  for (Pool& pool : pools_) pool.workers.reset();  // joins the workers
  synchronize_gpus();
  try {
    resolve_gpu_spans();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: GPU-side spans lost: %s\n", e.what());
  }
  pools_.clear();
  at_shutdown();
}

std::size_t ThreadedEngine::pool_of(const OpBlock& op) const noexcept {
  const auto index = static_cast<std::size_t>(op.device.index());
  if (!op.device.is_gpu()) return index;
  std::size_t role = 0;
  switch (op.property) {
    case OpProperty::normal: role = 0; break;
    case OpProperty::copy_to_device: role = 1; break;
    case OpProperty::copy_from_device: role = 2; break;
    case OpProperty::copy_peer: role = 3; break;
    case OpProperty::prioritized: role = 4; break;
  }
  return static_cast<std::size_t>(config_.cpu_devices) + index * kPoolsPerGpu + role;
}

void ThreadedEngine::resolve_gpu_spans() {
  for (Pool& pool : pools_)
    for (std::size_t w = 0; w < pool.gpu_spans.size(); ++w)
      pool.gpu_spans[w]->resolve(pool.streams[w]->handles().stream);
}

void ThreadedEngine::synchronize_gpus() noexcept {
  for (Pool& pool : pools_) {
    for (auto& stream : pool.streams) {
      try {
        stream->synchronize();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "weft: %s\n", e.what());
      }
    }
  }
}

void ThreadedEngine::on_worker_start(int pool, int worker) {
  const Pool& p = pools_[static_cast<std::size_t>(pool)];
  count_completions_in(p.first_slot + static_cast<std::size_t>(worker));
  // GPU workers never block on the GPU (their dependencies are stream
  // waits); a host wait counted under their cause is a bug (tests assert it).
  gpu::declare_thread_wait_cause(p.device.is_gpu() ? gpu::WaitCause::gpu_worker : gpu::WaitCause::cpu_worker);
  if (p.device.is_gpu()) gpu::set_device(p.device.index());
}

void ThreadedEngine::launch(OpBlock* op) {
  if (tls_async_node_graph != nullptr && current_op_scope() != nullptr) [[unlikely]]
    refuse_follow_up_of_async_node(op, *tls_async_node_graph);
  enter_inflight(op);
  submit(op);
}

void ThreadedEngine::submit(OpBlock* op) {
  VarEntry* first = op->begin_entries();
  VarEntry* last = op->end_entries();
  // Every lock first (in address order, as every pusher), so that two pushes
  // sharing variables are in the same order in all their queues.
  for (VarEntry* e = first; e != last; ++e) {
    e->slot->lock.lock();
    // Rechecked under the lock: a delete_var racing with this push either
    // queues behind it or makes it fail here, never in between.
    if (e->slot->generation.load(std::memory_order_relaxed) != e->generation) [[unlikely]] {
      const std::uint32_t id = e->var_id;  // the slot's own id may already name a new variable
      for (VarEntry* u = first; u <= e; ++u) u->slot->lock.unlock();
      std::string name = op->name;
      const unsigned epoch = op->epoch;
      release_block(op);
      leave_inflight(epoch);
      throw InvalidArgument("push (op '" + name + "'): var #" + std::to_string(id) + " was deleted");
    }
  }
  if (op->kind == OpKind::delete_var) first->slot->generation.fetch_add(1, std::memory_order_release);
  // Modeled time (simulated GPUs): a GPU op the frontend pushed is taken by
  // its pool in push order, so that its stream's order, and the modeled
  // clock, do not follow the host's timing. Ops pushed from op bodies are
  // left out: a body may wait for what it pushes.
  op->in_push_order = op->issue_s >= 0 && (op->kind == OpKind::user || op->kind == OpKind::bulk) &&
                      op->device.is_gpu() && current_op_scope() == nullptr;
  if (op->in_push_order) pools_[pool_of(*op)].workers->expect_in_order(op->id);
  // Then each variable is linked and let go at once: a pusher that locks it
  // next links behind this op there, and on any other variable they share
  // too (it must first get that variable's lock, still held here until this
  // op is linked in it).
  int granted = 0;
  for (VarEntry* e = first; e != last; ++e) {
    granted += link(*e);
    e->slot->lock.unlock();
  }
  if (op->pending.fetch_sub(granted + 1, std::memory_order_acq_rel) == granted + 1) {
    // Accesses queued at link were granted by producers that finished since.
    assert(granted == static_cast<int>(op->entry_count) ||
           op->unblocked_by.load(std::memory_order_relaxed) != 0);
    dispatch(op);
  }
}

void ThreadedEngine::dispatch(OpBlock* op) {
  if (op->kind == OpKind::graph) {
    start_graph(op);
    return;
  }
  if (op->kind != OpKind::user && op->kind != OpKind::bulk) {
    finish(op);  // barriers and deletions have no body
    return;
  }
  if (op->run_inline && !op->in_push_order && try_run_inline(op)) return;
  pools_[pool_of(*op)].workers->enqueue(op);
}

bool ThreadedEngine::try_run_inline(OpBlock* op) {
  // Never inside an op body (a done() called from a body, a push from one):
  // the body may hold what the inline one needs, and bodies must not nest.
  if (tls_running_inline || current_op_scope() != nullptr) return false;
  if (config_.gpu_devices > 0 && host_op_would_wait(*op)) return false;
  struct Running {
    Running() noexcept { tls_running_inline = true; }
    ~Running() { tls_running_inline = false; }
  } running;
  run(op, static_cast<int>(pool_of(*op)), -1);
  return true;
}

ProfilerTrack* ThreadedEngine::inline_track(Device device) {
  for (const InlineTrack& t : tls_inline_tracks)
    if (t.engine_id == engine_id_ && t.device == device) return t.track;
  const int n = inline_tracks_.fetch_add(1, std::memory_order_relaxed);
  ProfilerTrack* track = recorder_.track(device, kInlineTrackOffset + n, "inline " + std::to_string(n),
                                         TrackKind::worker, device.str() + " inline");
  tls_inline_tracks.push_back({engine_id_, device, track});
  return track;
}

void ThreadedEngine::run_body(OpBlock* op, Pool& pool, int worker, RunContext& ctx, const SpanInfo* traced) {
  CheckContextGuard check(op->name, op->device);
  // Modeled time: what the op issues comes no earlier than its push.
  gpu::ScopedModeledIssue issue(op->issue_s);
  if (!op->device.is_gpu()) {
    if (config_.gpu_devices > 0) {
      host_op_wait(*op);     // GPU producers of what it reads (and, writing, its GPU readers)
      host_op_publish(*op);  // its writes supersede that history
    }
    op->fn(ctx);
    return;
  }
  const gpu::WorkerHandles& h = pool.streams[static_cast<std::size_t>(worker)]->handles();
  ctx.gpu = &h;
  gpu_op_wait(*op, h.stream);
  for (const gpu::EventRef& e : op->after_gpu_work) e->stream_wait(h.stream);
  // While profiling, two timing events bracket the op's work on its stream.
  GpuSpanRecorder* timing = traced ? pool.gpu_spans[static_cast<std::size_t>(worker)].get() : nullptr;
  if (timing) timing->begin(h.stream);
  // Publishing first: what orders later users after this op must happen even
  // if it throws; the timing event (which never throws) may follow it.
  auto after_body = [&] {
    gpu_op_publish(*op, op->device.index(), h.stream);
    if (timing) timing->end(h.stream, *traced);
  };
  try {
    op->fn(ctx);
  } catch (...) {
    // Whatever the body enqueued before failing still runs on the stream:
    // later users of the buffers must order after it all the same.
    after_body();
    throw;
  }
  after_body();
}

void ThreadedEngine::run(OpBlock* op, int pool_index, int worker) {
  if (op->kind == OpKind::graph_roots) {
    run_roots(op, pool_index, worker);
    return;
  }
  if (op->kind == OpKind::bulk) {
    run_bulk(op, pool_index, worker);
    return;
  }
  if (ErrorRef inherited = inherited_error(*op)) {
    if (!op->run_on_failed_input) {
      op->error = std::move(inherited);  // skipped: the failure passes on to what it writes
      finish(op, worker >= 0);
      return;
    }
    op->inherited = std::move(inherited);
  }
  Pool& pool = pools_[static_cast<std::size_t>(pool_index)];
  RunContext ctx{op->device, worker, op->name, this};
  if (op->inherited) ctx.failed_input = op->inherited->error;
  const bool profiling = profiler_->running();
  SpanInfo traced;
  if (profiling) {
    traced = SpanInfo{recorder_.intern(op->name), op->id, Profiler::now_ns(),
                      0, op->push_ns, op->unblocked_by.load(std::memory_order_relaxed),
                      op->bytes, op->property};
  }
  assert(worker >= 0 || op->async);  // push() refuses run_inline
  if (!op->async)
    run_sync(op, pool, worker, ctx, profiling ? &traced : nullptr);
  else
    run_async(op, pool, worker, ctx, profiling ? &traced : nullptr);
}

void ThreadedEngine::run_sync(OpBlock* op, Pool& pool, int worker, RunContext& ctx, SpanInfo* traced) {
  // Seen by pending_ops while the body runs (an op without variables holds
  // nothing and could finish under its feet: not published).
  std::atomic<const OpBlock*>* shown =
      op->entry_count > 0 ? &running_[pool.first_slot + static_cast<std::size_t>(worker)] : nullptr;
  if (shown) shown->store(op, std::memory_order_release);
  {
    OpScopeGuard scope(scope_key(), &op->name, op->device, op->epoch);
    NvtxRange range(nvtx_.of(op->device), op->name.c_str(), op->property);
    try {
      run_body(op, pool, worker, ctx, traced);
    } catch (...) {
      fail(*op, std::current_exception());
    }
  }
  // Before finish, whose first variable lock publishes it.
  if (shown) shown->store(nullptr, std::memory_order_relaxed);
  if (traced) {
    traced->end_ns = Profiler::now_ns();
    recorder_.record(pool.tracks[static_cast<std::size_t>(worker)], *traced);
  }
  finish(op, true);
}

std::vector<PendingOp> ThreadedEngine::pending_ops() const {
  return snapshot_pending(vars_, [&](std::vector<const OpBlock*>& runs) {
    for (std::size_t i = 0; i < running_slots_; ++i)
      if (const OpBlock* op = running_[i].load(std::memory_order_acquire)) runs.push_back(op);
  });
}

void ThreadedEngine::run_async(OpBlock* op, Pool& pool, int worker, RunContext& ctx, SpanInfo* traced) {
  EventList gpu_waits;
  if (config_.gpu_devices > 0 && !settle_async_inputs(*op, ctx, gpu_waits)) {
    finish(op, worker >= 0);
    return;
  }
  // The op may complete (and its block be reused) before the body returns:
  // after the call only `state` and the copies below may be touched.
  auto* state = new AsyncCompletion(op, this);
  // The body may call done() and go on running: its captures must outlive
  // the op block's reuse, so the function moves out of the block first. A
  // graph's node keeps its body (replays call it again): the graph stays
  // alive, and its replay unfinished, until the body returns.
  std::shared_ptr<GraphImpl> graph = op->graph ? op->graph->shared_from_this() : nullptr;
  AsyncOpFunction moved = graph ? AsyncOpFunction() : std::move(op->async_fn);
  AsyncOpFunction& fn = graph ? op->async_fn : moved;
  const std::string name = op->name;  // ctx.op_name must stay valid too
  const Device device = op->device;
  const std::uint8_t epoch = op->epoch;
  const OpProperty property = op->property;
  ctx.op_name = name;
  // The body counts as in flight until it returns, even after done(): what it
  // pushes then belongs to this op's epoch, and neither wait_all nor the
  // destructor may miss it.
  counts_.add_pushed(epoch);
  if (graph) graph->remaining.fetch_add(1, std::memory_order_relaxed);  // the node is not done: remaining > 0
  struct AsyncNodeScope {
    const GraphImpl* outer;
    explicit AsyncNodeScope(const GraphImpl* g) noexcept : outer(std::exchange(tls_async_node_graph, g)) {}
    ~AsyncNodeScope() { tls_async_node_graph = outer; }
  } async_node_scope(graph ? graph.get() : tls_async_node_graph);
  {
    OpScopeGuard scope(scope_key(), &name, device, epoch);
    CheckContextGuard check(name, device);
    NvtxRange range(nvtx_.of(device), name.c_str(), property);
    try {
      fn(ctx, Completion(state));
    } catch (...) {
      async_body_threw(op, state, gpu_waits);
    }
  }
  if (traced) {
    traced->end_ns = Profiler::now_ns();
    recorder_.record(worker >= 0 ? pool.tracks[static_cast<std::size_t>(worker)] : inline_track(device), *traced);
  }
  state->release_executor();
  if (graph) node_done(*graph);
  leave_inflight(epoch);
}

bool ThreadedEngine::settle_async_inputs(OpBlock& op, RunContext& ctx, EventList& gpu_waits) {
  // Async ops run on CPU devices only (push_async refuses GPUs): settle the
  // GPU history of their variables before the body may complete them (with
  // defer_gpu_waits the body orders its GPU work after that history instead).
  try {
    if (op.defer_gpu_waits) {
      for (VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) collect_events(*e->slot, e->write, gpu_waits);
      ctx.gpu_waits = &gpu_waits;
    } else {
      host_op_wait(op);
    }
    host_op_publish(op);
  } catch (...) {
    fail(op, std::current_exception());
    return false;
  }
  return true;
}

void ThreadedEngine::async_body_threw(OpBlock* op, AsyncCompletion* state, const EventList& gpu_waits) {
  if (!state->claim()) {
    errors_.add(std::current_exception(), "(async op that threw after completing)");
    return;
  }
  // defer_gpu_waits: the variables' GPU history was handed to the body, which
  // failed before ordering anything after it; the op's successors must still
  // come after that work.
  for (const gpu::EventRef& e : gpu_waits) {
    try {
      e->host_wait();
    } catch (...) {  // that work's own failure: the op fails anyway
    }
  }
  fail(*op, std::current_exception());
  finish(op);
}

void ThreadedEngine::complete_async(OpBlock* op, std::exception_ptr error) {
  struct Finisher {  // the destructor waits for this thread to leave the engine
    std::atomic<std::int32_t>& count;
    explicit Finisher(std::atomic<std::int32_t>& c) : count(c) { count.fetch_add(1, std::memory_order_acq_rel); }
    ~Finisher() { count.fetch_sub(1, std::memory_order_acq_rel); }
  } finisher(external_finishers_);
  if (error) fail(*op, std::move(error));
  finish(op);
}

void ThreadedEngine::finish(OpBlock* op, bool worker_is_done) {
  if (op->graph != nullptr) {  // a node (tokens never finish)
    finish_node(op, worker_is_done);
    return;
  }
  const unsigned epoch = op->epoch;
  OpBlock* ready = nullptr;
  for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e) {
    // The access that was queued behind this one when it was granted (the
    // next op of a chain), most likely granted below: the frontend wrote it,
    // so start its line on its way before the lock is taken rather than under
    // it. Nobody writes e->next after the grant, which happened before this.
    if (e->next) __builtin_prefetch(e->next, 0, 3);
    Grants grants;
    {
      std::lock_guard lock(e->slot->lock);
      if (e->write) apply_write(*e->slot, *op);
      // A barrier reports the variable's state at its place in push order, not
      // whatever a later write left when the waiting thread wakes up.
      if (op->kind == OpKind::wait) {
        op->signal->error = e->slot->error;
        if (config_.gpu_devices > 0) collect_events(*e->slot, e->write, op->signal->events);
      }
      release_and_grant(*e, grants, ready);
    }
    for (int k = 0; k < grants.count; ++k) tell_granted(*grants.held[k], op->id, ready);
  }
  // What this completion made ready (traces draw an arrow from it).
  // Another op granting an access of the same op may have stored its id
  // after this one's; the last decrement names the op.
  for (OpBlock* r = ready; r != nullptr; r = r->ready_next)
    r->unblocked_by.store(op->id, std::memory_order_relaxed);
  if (op->kind == OpKind::wait) {
    std::lock_guard lock(wait_mutex_);
    op->signal->done.store(true, std::memory_order_release);  // the waiter may return now
    signal_cv_.notify_all();
  } else if (op->kind == OpKind::delete_var) {
    vars_.recycle(op->entries[0].slot);
  }
  release_block(op);
  dispatch_ready(ready, worker_is_done);
  leave_inflight(epoch);
}

void ThreadedEngine::release_block(OpBlock* op) noexcept {
  if (op->kind != OpKind::graph) {
    recycle(op);
    return;
  }
  // A holder goes back to its graph; the graph may end with the last hold.
  std::shared_ptr<GraphImpl> keep = std::move(op->graph_keep);
  keep->release_holder(op);
}

void ThreadedEngine::dispatch_ready(OpBlock* ready, bool worker_is_done, bool first_here) {
  // A single op made ready (a chain) may run next on this worker. Several go
  // through the queues, in grant order (the list was built newest first), so
  // that priorities and FIFO order decide among them — except a replay's
  // nodes (first_here): the first in capture order may run next here.
  if (ready && !ready->ready_next) {
    if (!worker_is_done || (ready->kind != OpKind::user && ready->kind != OpKind::bulk) ||
        !pools_[pool_of(*ready)].workers->run_next_here(ready))
      dispatch(ready);
  } else {
    OpBlock* ordered = nullptr;
    while (ready) {
      OpBlock* next = ready->ready_next;
      ready->ready_next = ordered;
      ordered = ready;
      ready = next;
    }
    if (ordered && first_here && worker_is_done && pools_[pool_of(*ordered)].workers->run_next_here(ordered))
      ordered = ordered->ready_next;
    while (ordered) {
      OpBlock* next = ordered->ready_next;
      dispatch(ordered);
      ordered = next;
    }
  }
}

void ThreadedEngine::wait_for(Var var, bool write) {
  const char* call = write ? "wait_to_write" : "wait_to_read";
  refuse_wait_inside_op(call, &var);
  flush_bulk();
  gpu::ScopedWaitCause cause(gpu::WaitCause::frontend);
  WaitSignal signal;
  OpBlock* op = write ? prepare(OpKind::wait, Device::cpu(0), {}, var, OpOptions{0, call})
                      : prepare(OpKind::wait, Device::cpu(0), var, {}, OpOptions{0, call});
  op->signal = &signal;
  enter_inflight(op);
  submit(op);
  // Short waits are the common case (a frontend reading back one result):
  // spin a little before paying for a sleep and a wake-up.
  for (int i = 0; i < 2000 && !signal.done.load(std::memory_order_acquire); ++i) std::this_thread::yield();
  if (!signal.done.load(std::memory_order_acquire)) {
    std::unique_lock lock(wait_mutex_);
    signal_cv_.wait(lock, [&] { return signal.done.load(std::memory_order_acquire); });
  }
  report(signal.error);
  // The last GPU writer (and, for a write, the GPU readers) completed in the
  // engine's sense when they enqueued their work; wait for the work itself.
  for (const gpu::EventRef& event : signal.events) event->host_wait();
}

void ThreadedEngine::wait_all() {
  refuse_wait_inside_op("wait_all", nullptr);
  flush_bulk();
  gpu::ScopedWaitCause cause(gpu::WaitCause::frontend);
  drain_pushed_so_far();
  report_all_errors();
  for (Pool& pool : pools_)
    for (auto& stream : pool.streams) stream->synchronize();
  resolve_gpu_spans();
}

void ThreadedEngine::delete_var(Var var) {
  // The deletion comes after what this thread collected, and happens even
  // when pushing that fails.
  const std::exception_ptr flush_failed = flush_bulk_for_deletion();
  OpBlock* op = prepare(OpKind::delete_var, Device::cpu(0), {}, var, OpOptions{0, "delete_var"});
  enter_inflight(op);
  submit(op);
  if (flush_failed) std::rethrow_exception(flush_failed);
}

}  // namespace weft::detail
