#include "threaded_engine.h"

#include <cassert>
#include <thread>

namespace weft::detail {

namespace {

// The completion counter of the worker running on this thread.
struct WorkerCounter {
  const void* engine = nullptr;
  InflightCounts::Completions* counter = nullptr;
};
thread_local WorkerCounter tls_counter;

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

// Releases one access and grants, in queue order, what can run next: a run of
// reads or one write. Ops whose last access is granted are pushed onto
// `ready`. Caller holds the lock.
void release_and_grant(VarEntry& e, OpBlock*& ready) noexcept {
  VarSlot& s = *e.slot;
  if (e.write) {
    assert(s.write_running && s.running_reads == 0);
    s.write_running = false;
  } else {
    assert(!s.write_running && s.running_reads > 0);
    --s.running_reads;
  }
  while (VarEntry* h = s.head) {
    if (h->write) {
      if (s.write_running || s.running_reads != 0) break;
      s.write_running = true;
    } else {
      if (s.write_running) break;
      ++s.running_reads;
    }
    s.head = h->next;
    if (!s.head) s.tail = nullptr;
    if (h->op->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      h->op->ready_next = ready;
      ready = h->op;
    }
    if (h->write) break;
  }
}

}  // namespace

ThreadedEngine::ThreadedEngine(ResolvedConfig config)
    : EngineBase(std::move(config)),
      counts_(static_cast<std::size_t>(config_.cpu_devices) * static_cast<std::size_t>(config_.workers_per_cpu_device)),
      resume_below_(std::max<std::size_t>(1, config_.max_inflight / 4)) {
  tracks_.resize(static_cast<std::size_t>(config_.cpu_devices));
  for (int d = 0; d < config_.cpu_devices; ++d)
    for (int w = 0; w < config_.workers_per_cpu_device; ++w)
      tracks_[d].push_back(profiler_->track(Device::cpu(d), w, "worker " + std::to_string(w)));
  for (int d = 0; d < config_.cpu_devices; ++d)
    pools_.push_back(std::make_unique<WorkerPool>(Device::cpu(d), config_.workers_per_cpu_device,
                                                  static_cast<OpExecutor&>(*this)));
}

ThreadedEngine::~ThreadedEngine() {
  drain();
  pools_.clear();  // joins the workers
  at_shutdown();
}

void ThreadedEngine::drain() noexcept {
  closing_.store(true, std::memory_order_seq_cst);
  wait_until(drain_cv_, draining_, [&] { return counts_.total() == 0; });
  // A thread that completed the last async op may still be leaving
  // complete_async; it touches the engine until it decrements this.
  while (external_finishers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void ThreadedEngine::on_worker_start(Device device, int worker) {
  std::size_t slot = static_cast<std::size_t>(device.index()) * config_.workers_per_cpu_device + worker;
  tls_counter = {this, counts_.completions_of(slot)};
}

void ThreadedEngine::launch(OpBlock* op) {
  enter_inflight(op);
  submit(op);
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
    if (op->kind == OpKind::user && tls_counter.engine != this) {
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
  for (VarEntry* e = first; e != last; ++e) e->slot->lock.lock();
  // Rechecked under the locks: a delete_var racing with this push either
  // queues behind it or makes it fail here, never in between.
  for (VarEntry* e = first; e != last; ++e) {
    if (e->slot->generation.load(std::memory_order_relaxed) != e->generation) {
      const std::uint32_t id = e->var_id;  // the slot's own id may already name a new variable
      for (VarEntry* u = first; u != last; ++u) u->slot->lock.unlock();
      std::string name = op->name;
      const unsigned epoch = op->epoch;
      recycle(op);
      leave_inflight(epoch);
      throw Error("push (op '" + name + "'): var #" + std::to_string(id) + " was deleted");
    }
  }
  if (op->kind == OpKind::delete_var) first->slot->generation.fetch_add(1, std::memory_order_release);
  int granted = 0;
  for (VarEntry* e = first; e != last; ++e) granted += link(*e);
  for (VarEntry* e = first; e != last; ++e) e->slot->lock.unlock();
  if (op->pending.fetch_sub(granted + 1, std::memory_order_acq_rel) == granted + 1) dispatch(op);
}

void ThreadedEngine::dispatch(OpBlock* op) {
  if (op->kind != OpKind::user) {
    finish(op);  // barriers and deletions have no body
    return;
  }
  pools_[static_cast<std::size_t>(op->device.index())]->enqueue(op);
}

void ThreadedEngine::execute(OpBlock* op, int worker) {
  if (ErrorRef inherited = inherited_error(*op)) {
    op->error = std::move(inherited);  // skipped: the failure passes on to what it writes
    finish(op, true);
    return;
  }
  RunContext ctx{op->device, worker, op->name, this};
  const bool profiling = profiler_->running();
  std::string_view traced_name;
  std::int64_t start = 0;
  if (profiling) {
    traced_name = profiler_->intern(op->name);
    start = Profiler::now_ns();
  }
  const Device device = op->device;
  const std::uint64_t id = op->id;
  if (!op->async) {
    {
      OpScopeGuard scope(scope_key(), &op->name, device, op->epoch);
      try {
        op->fn(ctx);
      } catch (...) {
        fail(*op, std::current_exception());
      }
    }
    if (profiling) profiler_->record(tracks_[device.index()][worker], traced_name, id, start, Profiler::now_ns());
    finish(op, true);
    return;
  }
  // The op may complete (and its block be reused) before the body returns:
  // after the call only `state` and the copies above may be touched.
  auto* state = new AsyncCompletion(op, this);
  // The body may call done() and go on running: its captures must outlive
  // the op block's reuse, so the function moves out of the block first.
  AsyncOpFunction fn = std::move(op->async_fn);
  const std::string name = op->name;  // ctx.op_name must stay valid too
  const std::uint8_t epoch = op->epoch;
  ctx.op_name = name;
  // The body counts as in flight until it returns, even after done(): what it
  // pushes then belongs to this op's epoch, and neither wait_all nor the
  // destructor may miss it.
  counts_.add_pushed(epoch);
  {
    OpScopeGuard scope(scope_key(), &name, device, epoch);
    try {
      fn(ctx, Completion(state));
    } catch (...) {
      if (state->claim()) {
        fail(*op, std::current_exception());
        finish(op);
      } else {
        errors_.add(std::current_exception(), "(async op that threw after completing)");
      }
    }
  }
  if (profiling) profiler_->record(tracks_[device.index()][worker], traced_name, id, start, Profiler::now_ns());
  state->release_executor();
  leave_inflight(epoch);
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
  const unsigned epoch = op->epoch;
  OpBlock* ready = nullptr;
  for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e) {
    tbb::spin_mutex::scoped_lock lock(e->slot->lock);
    if (e->write) apply_write(*e->slot, *op);
    // A barrier reports the variable's state at its place in push order, not
    // whatever a later write left when the waiting thread wakes up.
    if (op->kind == OpKind::wait) op->signal->error = e->slot->error;
    release_and_grant(*e, ready);
  }
  if (op->kind == OpKind::wait) {
    std::lock_guard lock(wait_mutex_);
    op->signal->done.store(true, std::memory_order_release);  // the waiter may return now
    signal_cv_.notify_all();
  } else if (op->kind == OpKind::delete_var) {
    vars_.recycle(op->entries[0].slot);
  }
  recycle(op);
  // A single op made ready (a chain) may run next on this worker. Several go
  // through the queues, in grant order (the list was built newest first), so
  // that priorities and FIFO order decide among them.
  if (ready && !ready->ready_next) {
    if (!worker_is_done || ready->kind != OpKind::user ||
        !pools_[static_cast<std::size_t>(ready->device.index())]->run_next_here(ready))
      dispatch(ready);
  } else {
    OpBlock* ordered = nullptr;
    while (ready) {
      OpBlock* next = ready->ready_next;
      ready->ready_next = ordered;
      ordered = ready;
      ready = next;
    }
    while (ordered) {
      OpBlock* next = ordered->ready_next;
      dispatch(ordered);
      ordered = next;
    }
  }
  leave_inflight(epoch);
}

void ThreadedEngine::wait_for(Var var, bool write) {
  const char* call = write ? "wait_to_write" : "wait_to_read";
  refuse_wait_inside_op(call, &var);
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
}

void ThreadedEngine::wait_all() {
  refuse_wait_inside_op("wait_all", nullptr);
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
}

void ThreadedEngine::delete_var(Var var) {
  OpBlock* op = prepare(OpKind::delete_var, Device::cpu(0), {}, var, OpOptions{0, "delete_var"});
  enter_inflight(op);
  submit(op);
}

}  // namespace weft::detail
