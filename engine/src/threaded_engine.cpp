#include "threaded_engine.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <thread>

#include "gpu_spans.h"
#include "gpu_sync.h"
#include "graph_impl.h"
#include "nvtx_ranges.h"
#include "weft/check_context.h"

namespace weft::detail {

namespace {

// The completion counter of the worker running on this thread.
struct WorkerCounter {
  const void* engine = nullptr;
  InflightCounts::Completions* counter = nullptr;
};
thread_local WorkerCounter tls_counter;

// Set while this thread runs (or skips) an inline op (OpOptions::run_inline):
// what that makes ready is queued, so inline runs never nest.
thread_local bool tls_running_inline = false;

// While this thread runs the body of an async node of a replay: the graph
// (its gate holds the variables a follow-up of the body must not touch).
thread_local const GraphImpl* tls_async_node_graph = nullptr;

// While profiling, the tracks this thread recorded inline bodies on (a
// track has one writer: each thread gets its own per engine and device).
struct InlineTrack {
  std::uint32_t engine_id;
  Device device;
  Profiler::Track* track;
};
thread_local std::vector<InlineTrack> tls_inline_tracks;

// While a worker claims a replay's roots (run_roots): the nodes it finished,
// counted off the graph's `remaining` in one step at the end.
// Nodes of that graph its roots made ready on this worker's device wait in
// `local` (a bounded stack, run before the next chunk) instead of the queue.
struct RootClaim {
  GraphImpl* graph = nullptr;
  int lane = -1;
  std::int64_t done = 0;
  std::vector<OpBlock*> local;
};
thread_local RootClaim tls_root_claim;
constexpr std::size_t kRootChunk = 16;   // roots claimed at once
constexpr std::size_t kLocalReady = 64;  // beyond: through the queue, where other workers find them

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

}  // namespace

namespace {
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
  std::size_t slot = 0;
  auto add_lane = [&](Device device, gpu::StreamRole role, int workers) {
    Lane& lane = lanes_.emplace_back();
    lane.device = device;
    lane.role = role;
    lane.first_slot = slot;
    slot += static_cast<std::size_t>(workers);
    for (int w = 0; w < workers; ++w) {
      if (!device.is_gpu()) {
        lane.tracks.push_back(profiler_->track(device, w, "worker " + std::to_string(w), TrackKind::worker,
                                               device.str() + " workers"));
        continue;
      }
      // Per GPU worker two tracks: its stream as the GPU ran it (by role, then
      // stream), and the worker's host thread enqueuing the work.
      const std::string stream = std::string(trace_role(role)) + " stream " + std::to_string(w);
      const int index = static_cast<int>(role) * 100 + w;
      lane.tracks.push_back(profiler_->track(device, kLaunchTrackOffset + index, stream + " (launch)",
                                             TrackKind::launch, device.str() + " " + stream + " launch"));
      Profiler::Track* gpu_side =
          profiler_->track(device, index, stream, TrackKind::stream, device.str() + " " + stream);
      lane.streams.push_back(std::make_unique<gpu::StreamResources>(
          device.index(), role,
          role == gpu::StreamRole::compute || role == gpu::StreamRole::priority ? config_.gpu_workspace_bytes : 0));
      lane.gpu_spans.push_back(std::make_unique<GpuSpanRecorder>(device.index(), gpu_side));
    }
  };
  lanes_.reserve(static_cast<std::size_t>(config_.cpu_devices + config_.gpu_devices * kLanesPerGpu));
  for (int d = 0; d < config_.cpu_devices; ++d)
    add_lane(Device::cpu(d), gpu::StreamRole::compute, config_.workers_per_cpu_device);
  for (int g = 0; g < config_.gpu_devices; ++g) {
    add_lane(Device::gpu(g), gpu::StreamRole::compute, config_.compute_streams_per_gpu);
    add_lane(Device::gpu(g), gpu::StreamRole::h2d, 1);
    add_lane(Device::gpu(g), gpu::StreamRole::d2h, 1);
    add_lane(Device::gpu(g), gpu::StreamRole::peer, 1);
    add_lane(Device::gpu(g), gpu::StreamRole::priority, 1);
  }
  for (std::size_t i = 0; i < lanes_.size(); ++i)
    lanes_[i].pool = std::make_unique<WorkerPool>(
        lanes_[i].device, static_cast<int>(i), static_cast<int>(lanes_[i].tracks.size()),
        static_cast<OpExecutor&>(*this),
        lanes_[i].device.is_gpu() ? WorkerPool::Order::push : WorkerPool::Order::ready);
}

ThreadedEngine::~ThreadedEngine() {
  end_bulks();
  close_shared_vars();
  gpu::ScopedWaitCause cause(gpu::WaitCause::shutdown);
  drain();
  for (Lane& lane : lanes_) lane.pool.reset();  // joins the workers
  synchronize_gpus();
  try {
    resolve_gpu_spans();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: GPU-side spans lost: %s\n", e.what());
  }
  lanes_.clear();
  at_shutdown();
}

std::size_t ThreadedEngine::lane_of(const OpBlock& op) const noexcept {
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
  return static_cast<std::size_t>(config_.cpu_devices) + index * kLanesPerGpu + role;
}

void ThreadedEngine::resolve_gpu_spans() {
  for (Lane& lane : lanes_)
    for (std::size_t w = 0; w < lane.gpu_spans.size(); ++w)
      lane.gpu_spans[w]->resolve(*profiler_, lane.streams[w]->handles().stream);
}

void ThreadedEngine::synchronize_gpus() noexcept {
  for (Lane& lane : lanes_) {
    for (auto& stream : lane.streams) {
      try {
        stream->synchronize();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "weft: %s\n", e.what());
      }
    }
  }
}

void ThreadedEngine::drain() noexcept {
  closing_.store(true, std::memory_order_seq_cst);
  wait_until(drain_cv_, draining_, [&] { return counts_.total() == 0; });
  // A thread that completed the last async op may still be leaving
  // complete_async; it touches the engine until it decrements this.
  while (external_finishers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void ThreadedEngine::on_worker_start(int lane, int worker) {
  Lane& l = lanes_[static_cast<std::size_t>(lane)];
  tls_counter = {this, counts_.completions_of(l.first_slot + static_cast<std::size_t>(worker))};
  // GPU workers never block on the GPU (their dependencies are stream
  // waits); a host wait counted under their cause is a bug (tests assert it).
  gpu::declare_thread_wait_cause(l.device.is_gpu() ? gpu::WaitCause::gpu_worker : gpu::WaitCause::cpu_worker);
  if (l.device.is_gpu()) gpu::set_device(l.device.index());
}

void ThreadedEngine::launch(OpBlock* op) {
  if (tls_async_node_graph != nullptr && current_op_scope() != nullptr) [[unlikely]]
    refuse_follow_up_of_async_node(op);
  enter_inflight(op);
  submit(op);
}

void ThreadedEngine::launch_bulk(OpBlock* first, std::size_t count) {
  if (count == 1) {  // pushed as itself (submit checks its variables)
    first->ready_next = nullptr;
    launch(first);
    return;
  }
  OpBlock* bulk = nullptr;
  try {
    bulk = ops_.acquire();
    bulk->name = bulk_name(first, count);
    std::size_t accesses = 0;
    for (const OpBlock* op = first; op != nullptr; op = op->ready_next) accesses += op->entry_count;
    bulk->reserve_entries(accesses);
  } catch (...) {  // out of memory: nothing is pushed, nothing kept
    if (bulk) recycle(bulk);
    for (OpBlock* op = first; op != nullptr;) {
      OpBlock* next = op->ready_next;
      op->ready_next = nullptr;
      recycle(op);
      op = next;
    }
    throw;
  }
  OpBlock* last = first;
  while (last->ready_next) last = last->ready_next;
  // The union: members mostly share variables (a chain of 16 ops touches one
  // or two), so duplicates are merged as they come while the union is small
  // and the sort sees few entries; beyond kScan, sort_accesses merges them.
  constexpr std::uint32_t kScan = 32;
  for (OpBlock* op = first; op != nullptr; op = op->ready_next) {
    for (const VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e) {
      VarEntry* same = nullptr;
      if (bulk->entry_count <= kScan)
        for (VarEntry* u = bulk->entries; u != bulk->entries + bulk->entry_count && !same; ++u)
          if (u->slot == e->slot) same = u;
      if (same) {
        same->write |= e->write;
        same->read |= e->read;
        if (same->generation != e->generation) same->generation = 0;  // as sort_accesses: a deleted variable
        continue;
      }
      VarEntry& u = bulk->entries[bulk->entry_count++];
      u = *e;
      u.op = bulk;
      u.next = nullptr;
    }
  }
  sort_accesses(*bulk);
  bulk->bulk = first;  // from here on the members are recycled with the bulk
  bulk->device = first->device;
  bulk->priority = first->priority;
  bulk->property = first->property;
  bulk->kind = OpKind::bulk;
  bulk->async = false;
  // The last member's id: its place among equal priorities, and what the
  // ops it makes ready were unblocked by (traces).
  bulk->id = last->id;
  bulk->bytes = 0;
  bulk->unblocked_by.store(0, std::memory_order_relaxed);
  bulk->push_ns = -1;
  bulk->pending.store(static_cast<std::int32_t>(bulk->entry_count) + 1, std::memory_order_relaxed);
  launch(bulk);
}

void ThreadedEngine::refuse_follow_up_of_async_node(OpBlock* op) {
  const GraphImpl& g = *tls_async_node_graph;
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

template <class Pred>
void ThreadedEngine::wait_until(std::condition_variable& cv, std::atomic<std::int32_t>& waiters, Pred done) {
  std::unique_lock lock(wait_mutex_);
  waiters.fetch_add(1, std::memory_order_seq_cst);
  cv.wait(lock, done);
  waiters.fetch_sub(1, std::memory_order_relaxed);
}

void ThreadedEngine::enter_inflight(OpBlock* op) {
  const OpScope* parent = running_op_of(scope_key());
  if (parent) {
    // A follow-up joins its parent's epoch and never blocks: the worker that
    // would have to drain the backlog is the one pushing.
    op->epoch = parent->epoch;
  } else {
    // Workers never block on the bound either, even outside an op body (a
    // capture's destructor may push).
    if ((op->kind == OpKind::user || op->kind == OpKind::graph || op->kind == OpKind::bulk) &&
        tls_counter.engine != this) {
      // Counts read by other threads may be newer than `pushed`: differences
      // saturate at zero instead of wrapping into "over the bound".
      const std::uint64_t pushed = counts_.pushed_total();
      const std::uint64_t seen = completed_seen_.load(std::memory_order_relaxed);
      if (pushed > seen && pushed - seen >= config_.max_inflight) {
        const std::uint64_t completed = counts_.completed_total();
        completed_seen_.store(completed, std::memory_order_relaxed);
        // Wait for the backlog to fall well below the bound, so the frontend
        // sleeps once per many ops instead of trading the last slot back and
        // forth with the workers.
        if (pushed > completed && pushed - completed >= config_.max_inflight)
          wait_until(throttle_cv_, throttled_, [&] { return counts_.total() < resume_below_; });
      }
    }
    op->epoch = static_cast<std::uint8_t>(counts_.current_epoch());
  }
  counts_.add_pushed(op->epoch);
}

bool ThreadedEngine::drained() const noexcept {
  return closing_.load(std::memory_order_acquire) ? counts_.total() == 0
                                                 : counts_.pending(draining_epoch_.load(std::memory_order_acquire)) == 0;
}

void ThreadedEngine::leave_inflight(unsigned epoch) noexcept {
  InflightCounts::add_completed(tls_counter.engine == this ? tls_counter.counter : counts_.shared_completions(), epoch);
  // Pairs with wait_until's increment-then-check: it sees our count or we see it.
  const bool throttled = throttled_.load(std::memory_order_seq_cst) > 0;
  const bool draining = draining_.load(std::memory_order_seq_cst) > 0;
  if (!throttled && !draining) return;
  const bool wake_throttled = throttled && counts_.total() < resume_below_;
  const bool wake_draining = draining && drained();
  if (!wake_throttled && !wake_draining) return;
  std::lock_guard lock(wait_mutex_);
  if (wake_throttled) throttle_cv_.notify_all();
  if (wake_draining) drain_cv_.notify_all();
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
  if (op->run_inline && try_run_inline(op)) return;
  lanes_[lane_of(*op)].pool->enqueue(op);
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
  run(op, static_cast<int>(lane_of(*op)), -1);
  return true;
}

Profiler::Track* ThreadedEngine::inline_track(Device device) {
  for (const InlineTrack& t : tls_inline_tracks)
    if (t.engine_id == engine_id_ && t.device == device) return t.track;
  const int n = inline_tracks_.fetch_add(1, std::memory_order_relaxed);
  Profiler::Track* track = profiler_->track(device, kInlineTrackOffset + n, "inline " + std::to_string(n),
                                            TrackKind::worker, device.str() + " inline");
  tls_inline_tracks.push_back({engine_id_, device, track});
  return track;
}

void ThreadedEngine::run_body(OpBlock* op, Lane& lane, int worker, RunContext& ctx, const SpanInfo* traced) {
  CheckContextGuard check(op->name, op->device);
  if (!op->device.is_gpu()) {
    if (config_.gpu_devices > 0) {
      host_op_wait(*op);     // GPU producers of what it reads (and, writing, its GPU readers)
      host_op_publish(*op);  // its writes supersede that history
    }
    op->fn(ctx);
    return;
  }
  const gpu::WorkerHandles& h = lane.streams[static_cast<std::size_t>(worker)]->handles();
  ctx.gpu = &h;
  gpu_op_wait(*op, h.stream);
  for (const gpu::EventRef& e : op->after_gpu_work) e->stream_wait(h.stream);
  // While profiling, two timing events bracket the op's work on its stream.
  GpuSpanRecorder* timing = traced ? lane.gpu_spans[static_cast<std::size_t>(worker)].get() : nullptr;
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

void ThreadedEngine::run(OpBlock* op, int lane_index, int worker) {
  if (op->kind == OpKind::graph_roots) {
    run_roots(op, lane_index, worker);
    return;
  }
  if (op->kind == OpKind::bulk) {
    run_bulk(op, lane_index, worker);
    return;
  }
  const bool on_worker = worker >= 0;
  if (ErrorRef inherited = inherited_error(*op)) {
    if (!op->run_on_failed_input) {
      op->error = std::move(inherited);  // skipped: the failure passes on to what it writes
      finish(op, on_worker);
      return;
    }
    op->inherited = std::move(inherited);
  }
  Lane& lane = lanes_[static_cast<std::size_t>(lane_index)];
  RunContext ctx{op->device, worker, op->name, this};
  if (op->inherited) ctx.failed_input = op->inherited->error;
  const bool profiling = profiler_->running();
  SpanInfo traced;
  if (profiling) {
    traced = SpanInfo{profiler_->intern(op->name), op->id, Profiler::now_ns(),
                      0, op->push_ns, op->unblocked_by.load(std::memory_order_relaxed),
                      op->bytes, op->property};
  }
  const Device device = op->device;
  assert(on_worker || op->async);  // push() refuses run_inline
  if (!op->async) {
    {
      OpScopeGuard scope(scope_key(), &op->name, device, op->epoch);
      NvtxRange range(nvtx_.of(device), op->name.c_str(), op->property);
      try {
        run_body(op, lane, worker, ctx, profiling ? &traced : nullptr);
      } catch (...) {
        fail(*op, std::current_exception());
      }
    }
    if (profiling) {
      traced.end_ns = Profiler::now_ns();
      profiler_->record(lane.tracks[static_cast<std::size_t>(worker)], traced);
    }
    finish(op, true);
    return;
  }
  // Async ops run on CPU devices only (push_async refuses GPUs): settle the
  // GPU history of their variables before the body may complete them (with
  // defer_gpu_waits the body orders its GPU work after that history instead).
  EventList gpu_waits;
  if (config_.gpu_devices > 0) {
    try {
      if (op->defer_gpu_waits) {
        for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e)
          collect_events(*e->slot, e->write, gpu_waits);
        ctx.gpu_waits = &gpu_waits;
      } else {
        host_op_wait(*op);
      }
      host_op_publish(*op);
    } catch (...) {
      fail(*op, std::current_exception());
      finish(op, on_worker);
      return;
    }
  }
  // The op may complete (and its block be reused) before the body returns:
  // after the call only `state` and the copies above may be touched.
  auto* state = new AsyncCompletion(op, this);
  // The body may call done() and go on running: its captures must outlive
  // the op block's reuse, so the function moves out of the block first. A
  // graph's node keeps its body (replays call it again): the graph stays
  // alive, and its replay unfinished, until the body returns.
  std::shared_ptr<GraphImpl> graph = op->graph ? op->graph->shared_from_this() : nullptr;
  AsyncOpFunction moved = graph ? AsyncOpFunction() : std::move(op->async_fn);
  AsyncOpFunction& fn = graph ? op->async_fn : moved;
  const std::string name = op->name;  // ctx.op_name must stay valid too
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
      if (state->claim()) {
        // defer_gpu_waits: the variables' GPU history was handed to the body,
        // which failed before ordering anything after it; the op's successors
        // must still come after that work.
        for (const gpu::EventRef& e : gpu_waits) {
          try {
            e->host_wait();
          } catch (...) {  // that work's own failure: the op fails anyway
          }
        }
        fail(*op, std::current_exception());
        finish(op);
      } else {
        errors_.add(std::current_exception(), "(async op that threw after completing)");
      }
    }
  }
  if (profiling) {
    traced.end_ns = Profiler::now_ns();
    profiler_->record(on_worker ? lane.tracks[static_cast<std::size_t>(worker)] : inline_track(device), traced);
  }
  state->release_executor();
  if (graph) node_done(*graph);
  leave_inflight(epoch);
}

void ThreadedEngine::run_bulk(OpBlock* bulk, int lane_index, int worker) {
  Lane& lane = lanes_[static_cast<std::size_t>(lane_index)];
  const Device device = bulk->device;
  const bool profiling = profiler_->running();
  RunContext ctx{device, worker, {}, this};
  // A GPU bulk's stream waits once, before the first member, for the GPU
  // producers of the whole union (what any member depends on, the first
  // waits for); a CPU member settles its own variables below.
  gpu::Stream* stream = nullptr;
  GpuSpanRecorder* timing = nullptr;
  ErrorRef settle_failed;
  if (device.is_gpu()) {
    const gpu::WorkerHandles& h = lane.streams[static_cast<std::size_t>(worker)]->handles();
    ctx.gpu = &h;
    stream = h.stream;
    try {
      gpu_op_wait(*bulk, stream);
    } catch (...) {  // the stream cannot be ordered after the inputs: every member fails
      settle_failed = errors_.add(std::current_exception(), bulk->name);
    }
    if (profiling) timing = lane.gpu_spans[static_cast<std::size_t>(worker)].get();
  }
  const bool settle_host = !device.is_gpu() && config_.gpu_devices > 0;
  std::uint64_t unblocked_by = bulk->unblocked_by.load(std::memory_order_relaxed);
  bool launched = false;  // a replay's segment launched as a stream graph
  if (stream && !settle_failed && bulk->graph != nullptr && bulk->graph->gpu_graphs) {
    try {
      launched = launch_segment(*bulk, stream, ctx, lane, worker, timing);
    } catch (...) {  // the launch failed: so does every member
      launched = true;
      const ErrorRef failed = errors_.add(std::current_exception(), bulk->name);
      for (OpBlock* op = bulk->bulk; op != nullptr; op = op->ready_next) op->error = failed;
    }
  }
  if (launched) {
    for (OpBlock* op = bulk->bulk; op != nullptr; op = op->ready_next)
      for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e)
        if (e->write) apply_write(*e->slot, *op);
  }
  for (OpBlock* op = launched ? nullptr : bulk->bulk; op != nullptr; op = op->ready_next) {
    // As run() does for a pushed op, with what the members before it wrote
    // already applied: a member reading a failed one's output is skipped.
    if (settle_failed) {
      op->error = settle_failed;
    } else if (ErrorRef inherited = inherited_error(*op)) {
      if (op->run_on_failed_input) {
        op->inherited = std::move(inherited);
      } else {
        op->error = std::move(inherited);
      }
    }
    if (!op->error) {
      ctx.op_name = op->name;
      ctx.failed_input = op->inherited ? op->inherited->error : nullptr;
      SpanInfo traced;
      if (profiling)
        traced = SpanInfo{profiler_->intern(op->name), op->id, Profiler::now_ns(), 0, op->push_ns, unblocked_by,
                          op->bytes, op->property};
      {
        OpScopeGuard scope(scope_key(), &op->name, device, bulk->epoch);
        CheckContextGuard check(op->name, device);
        NvtxRange range(nvtx_.of(device), op->name.c_str(), op->property);
        if (timing) timing->begin(stream);
        try {
          // A CPU member on an engine with GPUs settles its own variables'
          // GPU history, as a pushed op does (a failure there is its own).
          if (settle_host) {
            host_op_wait(*op);
            host_op_publish(*op);
          }
          op->fn(ctx);
        } catch (...) {
          fail(*op, std::current_exception());
        }
        if (timing) timing->end(stream, traced);
      }
      if (profiling) {
        traced.end_ns = Profiler::now_ns();
        profiler_->record(lane.tracks[static_cast<std::size_t>(worker)], traced);
      }
    }
    // Its writes count now (versions, errors), without the variables'
    // locks: the bulk holds their write access, so no other op looks.
    for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e)
      if (e->write) apply_write(*e->slot, *op);
    unblocked_by = op->id;
  }
  // Whatever the members enqueued (even those that threw) orders later users
  // — unless the stream could not be ordered after the inputs: then nothing
  // ran, and the variables' GPU history stays as it was.
  if (stream && !settle_failed) {
    try {
      gpu_op_publish(*bulk, device.index(), stream);
    } catch (...) {  // later users could not order after the work: its outputs fail
      const ErrorRef failed = errors_.add(std::current_exception(), bulk->name);
      for (VarEntry* e = bulk->begin_entries(); e != bulk->end_entries(); ++e) {
        if (!e->write) continue;
        std::lock_guard lock(e->slot->lock);
        e->slot->error = failed;
      }
    }
  }
  finish(bulk, true);
}

bool ThreadedEngine::launch_segment(OpBlock& segment, gpu::Stream* stream, RunContext& ctx, Lane& lane, int worker,
                                    GpuSpanRecorder* timing) {
  GraphImpl& g = *segment.graph;
  GraphImpl::Segment& s = g.segments[static_cast<std::size_t>(g.segment_of[segment.node])];
  if (s.failed) return false;
  // A member that would be skipped, or run with a failure: op by op, so that
  // each fails or runs as pushed (the graph stays for the next replay).
  for (OpBlock* op = segment.bulk; op != nullptr; op = op->ready_next)
    if (inherited_error(*op)) return false;
  gpu::StreamGraph* graph = s.graph_for(stream);
  if (graph == nullptr && std::find(s.warmed.begin(), s.warmed.end(), stream) == s.warmed.end()) {
    s.warmed.push_back(stream);  // the warm-up on this stream: op by op
    return false;
  }
  if (graph == nullptr) {
    // What the bodies enqueue is recorded, not run; the launch below runs it.
    std::string why;
    try {
      gpu::begin_stream_capture(stream);
      try {
        for (OpBlock* op = segment.bulk; op != nullptr; op = op->ready_next) {
          ctx.op_name = op->name;
          ctx.failed_input = nullptr;
          OpScopeGuard scope(scope_key(), &op->name, segment.device, segment.epoch);
          CheckContextGuard check(op->name, segment.device);
          op->fn(ctx);
        }
      } catch (const std::exception& e) {
        why = "op '" + std::string(ctx.op_name) + "' threw while captured: " + e.what();
      } catch (...) {
        why = "op '" + std::string(ctx.op_name) + "' threw while captured";
      }
      std::string ended;
      std::unique_ptr<gpu::StreamGraph> made = gpu::end_stream_capture(stream, &ended);
      if (why.empty() && !made) why = ended;
      if (why.empty()) {
        graph = made.get();
        s.graphs.emplace_back(stream, std::move(made));
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (graph == nullptr) {
      s.failed = true;
      std::fprintf(stderr, "weft: replay: %s runs op by op from now on: %s\n", segment.name.c_str(), why.c_str());
      return false;
    }
  }
  // One span for the launch (a failure to trace it loses the span, not the launch).
  bool profiling = profiler_->running();
  SpanInfo traced;
  if (profiling) {
    try {
      traced = SpanInfo{profiler_->intern(segment.name), segment.id, Profiler::now_ns(), 0, -1,
                        segment.unblocked_by.load(std::memory_order_relaxed), 0, segment.property};
    } catch (...) {
      profiling = false;
    }
  }
  {
    NvtxRange range(nvtx_.of(segment.device), segment.name.c_str(), segment.property);
    if (timing && profiling) timing->begin(stream);
    gpu::launch_stream_graph(*graph, stream);
    if (timing && profiling) timing->end(stream, traced);
  }
  if (profiling) {
    traced.end_ns = Profiler::now_ns();
    try {
      profiler_->record(lane.tracks[static_cast<std::size_t>(worker)], traced);
    } catch (...) {
    }
  }
  return true;
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
  // A gate goes back to its graph; the graph may end with the last hold.
  std::shared_ptr<GraphImpl> keep = std::move(op->graph_keep);
  keep->release_gate(op);
}

void ThreadedEngine::dispatch_ready(OpBlock* ready, bool worker_is_done, bool first_here) {
  // A single op made ready (a chain) may run next on this worker. Several go
  // through the queues, in grant order (the list was built newest first), so
  // that priorities and FIFO order decide among them — except a replay's
  // nodes (first_here): the first in capture order may run next here.
  if (ready && !ready->ready_next) {
    if (!worker_is_done || (ready->kind != OpKind::user && ready->kind != OpKind::bulk) ||
        !lanes_[lane_of(*ready)].pool->run_next_here(ready))
      dispatch(ready);
  } else {
    OpBlock* ordered = nullptr;
    while (ready) {
      OpBlock* next = ready->ready_next;
      ready->ready_next = ordered;
      ordered = ready;
      ready = next;
    }
    if (ordered && first_here && worker_is_done && lanes_[lane_of(*ordered)].pool->run_next_here(ordered))
      ordered = ordered->ready_next;
    while (ordered) {
      OpBlock* next = ordered->ready_next;
      dispatch(ordered);
      ordered = next;
    }
  }
}

void ThreadedEngine::replay_graph(const std::shared_ptr<GraphImpl>& graph) {
  OpBlock* gate = graph->acquire_gate();
  // The gate's id and its nodes' after it, taken now: in push order, as if
  // the nodes were pushed here (what a failure reported later still reaches,
  // and the order among equal priorities).
  gate->id = next_op_id_.fetch_add(graph->captured + 1, std::memory_order_relaxed) + 1;
  gate->unblocked_by.store(0, std::memory_order_relaxed);
  gate->push_ns = -1;
  gate->graph_keep = graph;
  gate->pending.store(static_cast<std::int32_t>(gate->entry_count) + 1, std::memory_order_relaxed);
  enter_inflight(gate);
  submit(gate);  // rechecks every variable under its lock
}

void ThreadedEngine::start_graph(OpBlock* gate) {
  // The last node may finish, and the gate drop the graph, before this returns.
  const std::shared_ptr<GraphImpl> keep = gate->graph_keep;
  GraphImpl& g = *keep;
  assert(g.gate == nullptr && "replays of one graph never overlap (they write its own variable)");
  g.gate = gate;
  const std::size_t n = g.nodes.size();
  if (!g.batched) batch_roots(g);
  // Every node, and every token (one that finds no root left still runs
  // later: the replay must not end before it).
  std::size_t tokens = 0;
  for (const GraphImpl::RootBatch& b : g.root_batches) tokens += b.tokens.size();
  g.remaining.store(static_cast<std::int64_t>(n + tokens), std::memory_order_relaxed);
  g.first_id = gate->id + 1;  // reserved by replay_graph
  // The node blocks themselves are reset one by one as they become ready
  // (arm_node): a large graph is walked once per replay, not twice.
  for (std::size_t i = 0; i < n; ++i) g.pending[i].store(g.in_degree[i], std::memory_order_relaxed);
  // Released by the dispatches below (the pending counts are set). The
  // nodes are not counted in flight one by one: the gate is, until the
  // last of them is done.
  for (GraphImpl::RootBatch& b : g.root_batches) {
    b.claimed->store(0, std::memory_order_relaxed);
    for (auto& token : b.tokens) lanes_[b.lane].pool->enqueue(token.get());
  }
  for (std::uint32_t r : g.single_roots) {
    OpBlock* node = g.nodes[r];
    arm_node(g, *node, gate->id);
    dispatch(node);
  }
}

void ThreadedEngine::arm_node(GraphImpl& g, OpBlock& node, std::uint64_t unblocked_by) {
  std::uint64_t id = g.first_id + g.first_op[node.node];
  node.epoch = g.gate->epoch;
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
  std::vector<std::vector<std::uint32_t>> per_lane(lanes_.size());
  for (std::uint32_t r : g.roots) {
    const OpBlock& node = *g.nodes[r];
    // Prioritized roots keep their place in the priority queue.
    if (node.device.is_gpu() || node.priority != 0 || node.run_inline) {
      g.single_roots.push_back(r);
    } else {
      per_lane[lane_of(node)].push_back(r);
    }
  }
  for (std::uint32_t lane = 0; lane < per_lane.size(); ++lane) {
    std::vector<std::uint32_t>& nodes = per_lane[lane];
    if (nodes.size() < 2 * kRootChunk) {
      g.single_roots.insert(g.single_roots.end(), nodes.begin(), nodes.end());
      continue;
    }
    GraphImpl::RootBatch& b = g.root_batches.emplace_back();
    b.lane = lane;
    const std::size_t tokens =
        std::min<std::size_t>(static_cast<std::size_t>(lanes_[lane].pool->size()), nodes.size() / kRootChunk);
    b.nodes = std::move(nodes);
    for (std::size_t t = 0; t < tokens; ++t) {
      auto token = std::make_unique<OpBlock>();
      token->kind = OpKind::graph_roots;
      token->device = lanes_[lane].device;
      token->graph = &g;
      token->node = static_cast<std::uint32_t>(g.root_batches.size() - 1);
      b.tokens.push_back(std::move(token));
    }
  }
  std::sort(g.single_roots.begin(), g.single_roots.end());  // capture order
}

void ThreadedEngine::run_roots(OpBlock* token, int lane, int worker) {
  GraphImpl& g = *token->graph;
  GraphImpl::RootBatch& b = g.root_batches[token->node];
  const std::size_t n = b.nodes.size();
  RootClaim& claim = tls_root_claim;
  claim.graph = &g;
  claim.lane = lane;
  claim.done = 0;
  for (;;) {
    const std::size_t first = b.claimed->fetch_add(kRootChunk, std::memory_order_relaxed);
    if (first >= n) break;
    const std::size_t last = std::min(n, first + kRootChunk);
    for (std::size_t i = first; i < last; ++i) {
      OpBlock* node = g.nodes[b.nodes[i]];
      arm_node(g, *node, g.gate->id);
      run(node, lane, worker);
    }
    // What they made ready, depth first (its inputs are in this core's cache).
    while (!claim.local.empty()) {
      OpBlock* next = claim.local.back();
      claim.local.pop_back();
      run(next, lane, worker);
    }
  }
  const std::int64_t done = claim.done + 1;  // and the token itself
  claim.graph = nullptr;
  claim.lane = -1;
  // May end the replay, and the graph with the token: nothing after this.
  if (g.remaining.fetch_sub(done, std::memory_order_acq_rel) == done) {
    OpBlock* gate = std::exchange(g.gate, nullptr);
    finish(gate);
  }
}

void ThreadedEngine::finish_node(OpBlock* op, bool worker_is_done) {
  GraphImpl& g = *op->graph;
  // The gate holds every variable the graph writes: no other op can look at
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
          static_cast<int>(lane_of(*ready)) == claim.lane) {
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
  OpBlock* gate = std::exchange(g.gate, nullptr);
  finish(gate);  // releases the variables; drops the gate's hold on the graph
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
  {
    // Close the epoch of everything pushed so far; later pushes (from other
    // threads) go to the next one and are not waited for.
    std::lock_guard serial(wait_all_mutex_);
    unsigned closed;
    {
      std::lock_guard lock(wait_mutex_);
      closed = counts_.close_epoch();
      draining_epoch_.store(closed, std::memory_order_release);
    }
    wait_until(drain_cv_, draining_, [&] { return counts_.pending(closed) == 0; });
  }
  report_all_errors();
  for (Lane& lane : lanes_)
    for (auto& stream : lane.streams) stream->synchronize();
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
