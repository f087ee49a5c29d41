#include "worker_pool.h"

#include <cassert>
#include <utility>

#include "op_block.h"
#include "spin_lock.h"  // WEFT_CPU_RELAX

namespace weft::detail {

namespace {
thread_local const WorkerPool* tls_pool = nullptr;
thread_local OpBlock* tls_next = nullptr;  // run_next_here's op, for the worker on this thread

// Spinning before sleeping keeps a busy pool from paying a futex wake per op;
// yielding in the second phase leaves the core to the frontend on small
// machines where workers and the pushing thread share cores.
constexpr int kPauseSpins = 32;
constexpr int kYieldSpins = 256;
}  // namespace

WorkerPool::WorkerPool(Device device, int index, int workers, OpExecutor& executor, Order order)
    : device_(device), index_(index), order_(order), executor_(executor) {
  threads_.reserve(static_cast<std::size_t>(workers));
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { run(i); });
}

WorkerPool::~WorkerPool() {
  stopping_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  for (auto& t : threads_) t.join();
  assert(fifo_empty() && prioritized_.empty() && in_order_ready_.empty() && in_order_expected_.empty());
}

bool WorkerPool::owns_current_thread() const noexcept { return tls_pool == this; }

bool WorkerPool::run_next_here(OpBlock* op) noexcept {
  if (tls_pool != this || tls_next || op->priority != 0 || op->in_push_order) return false;
  if (prioritized_count_.load(std::memory_order_relaxed) != 0 || !fifo_empty() ||
      in_order_count_.load(std::memory_order_relaxed) != 0)
    return false;
  tls_next = op;
  return true;
}

bool WorkerPool::fifo_push(OpBlock* op) {
  if (spilled_.load(std::memory_order_acquire) == 0 && ring_.try_push(op)) return true;
  spill_.push(op);
  spilled_.fetch_add(1, std::memory_order_seq_cst);
  return true;
}

OpBlock* WorkerPool::fifo_pop() {
  if (OpBlock* op = ring_.try_pop()) return op;
  OpBlock* op = nullptr;
  if (spilled_.load(std::memory_order_acquire) > 0 && spill_.try_pop(op)) {
    spilled_.fetch_sub(1, std::memory_order_seq_cst);
    return op;
  }
  return nullptr;
}

bool WorkerPool::fifo_empty() const noexcept {
  return ring_.empty() && spilled_.load(std::memory_order_seq_cst) == 0;
}

void WorkerPool::expect_in_order(std::uint64_t id) {
  std::lock_guard lock(in_order_mutex_);
  in_order_expected_.insert(id);
}

OpBlock* WorkerPool::take_in_order() {
  std::lock_guard lock(in_order_mutex_);
  if (in_order_ready_.empty() || in_order_expected_.empty() ||
      in_order_ready_.begin()->first != *in_order_expected_.begin())
    return nullptr;
  OpBlock* op = in_order_ready_.begin()->second;
  in_order_ready_.erase(in_order_ready_.begin());
  in_order_expected_.erase(in_order_expected_.begin());
  in_order_count_.fetch_sub(1, std::memory_order_seq_cst);
  return op;
}

void WorkerPool::enqueue(OpBlock* op) {
  if (op->in_push_order) {
    {
      std::lock_guard lock(in_order_mutex_);
      in_order_ready_.emplace(op->id, op);
    }
    in_order_count_.fetch_add(1, std::memory_order_seq_cst);
  } else if (op->priority == 0 && order_ == Order::ready) {
    fifo_push(op);
  } else {
    prioritized_.push(Prioritized{op->priority, op->id, op});
    prioritized_count_.fetch_add(1, std::memory_order_seq_cst);
  }
  // Pairs with a worker's "stop spinning, then recheck" in take_or_sleep:
  // either it sees our op or we see that nobody is searching.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (spinning_.load(std::memory_order_seq_cst) == 0 && sleepers_.load(std::memory_order_seq_cst) > 0) wake_one();
}

void WorkerPool::wake_one() noexcept {
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_one();
}

bool WorkerPool::has_work() const noexcept {
  return prioritized_count_.load(std::memory_order_seq_cst) != 0 || !fifo_empty() ||
         in_order_count_.load(std::memory_order_seq_cst) != 0;
}

OpBlock* WorkerPool::try_take() {
  OpBlock* op = nullptr;
  if (in_order_count_.load(std::memory_order_acquire) > 0 && (op = take_in_order())) return op;
  if (prioritized_count_.load(std::memory_order_acquire) > 0) {
    Prioritized top;
    if (prioritized_.try_pop(top)) {
      prioritized_count_.fetch_sub(1, std::memory_order_relaxed);
      if (top.priority > 0 || !(op = fifo_pop())) return top.op;
      // A negative priority yields to the FIFO; put it back, same place in
      // line, and make sure somebody will look for it.
      prioritized_.push(top);
      prioritized_count_.fetch_add(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (spinning_.load(std::memory_order_seq_cst) == 0 && sleepers_.load(std::memory_order_seq_cst) > 0) wake_one();
      return op;
    }
  }
  return fifo_pop();
}

// A worker out of work becomes a searcher (spinning_), then a sleeper. Pushes
// wake a sleeper only when nobody searches, and a searcher that finds work
// wakes the next one if more is queued (the scheme Go's scheduler uses): a
// busy frontend pays no wake-up per push, and idle workers join as work grows.
OpBlock* WorkerPool::take_or_sleep() {
  if (OpBlock* op = try_take()) return op;
  spinning_.fetch_add(1, std::memory_order_seq_cst);
  auto found = [this](OpBlock* op) {
    if (spinning_.fetch_sub(1, std::memory_order_seq_cst) == 1 && sleepers_.load(std::memory_order_seq_cst) > 0 &&
        has_work())
      wake_one();
    return op;
  };
  while (true) {
    // Poll with growing pauses: an empty queue polled in a tight loop pulls
    // its cache lines away from the thread that is about to push.
    for (int i = 0, pauses = 1; i < kPauseSpins; ++i, pauses = pauses < 64 ? pauses * 2 : 64) {
      if (OpBlock* op = try_take()) return found(op);
      for (int p = 0; p < pauses; ++p) WEFT_CPU_RELAX();
    }
    for (int i = 0; i < kYieldSpins; ++i) {
      if (OpBlock* op = try_take()) return found(op);
      std::this_thread::yield();
    }
    std::uint32_t epoch = epoch_.load(std::memory_order_seq_cst);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    spinning_.fetch_sub(1, std::memory_order_seq_cst);
    // Pairs with enqueue's fence: either our recheck sees its op, or it sees
    // that nobody is searching and wakes a sleeper.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (OpBlock* op = try_take()) {
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      spinning_.fetch_add(1, std::memory_order_seq_cst);
      return found(op);
    }
    if (stopping_.load(std::memory_order_seq_cst)) {
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      return nullptr;
    }
    epoch_.wait(epoch, std::memory_order_seq_cst);
    spinning_.fetch_add(1, std::memory_order_seq_cst);  // woken: search again
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void WorkerPool::run(int worker) {
  tls_pool = this;
  executor_.on_worker_start(index_, worker);
  while (OpBlock* op = take_or_sleep()) {
    do {
      executor_.execute(op, index_, worker);
      op = std::exchange(tls_next, nullptr);
    } while (op);
  }
  tls_pool = nullptr;
}

}  // namespace weft::detail
