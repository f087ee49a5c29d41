#include "worker_pool.h"

#include <cassert>

#include "op_block.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WEFT_CPU_RELAX() _mm_pause()
#else
#define WEFT_CPU_RELAX() ((void)0)
#endif

namespace weft::detail {

namespace {
thread_local const WorkerPool* tls_pool = nullptr;

// Spinning before sleeping keeps a busy pool from paying a futex wake per op;
// yielding in the second phase leaves the core to the frontend on small
// machines where workers and the pushing thread share cores.
constexpr int kPauseSpins = 64;
constexpr int kYieldSpins = 64;
}  // namespace

WorkerPool::WorkerPool(Device device, int workers, OpExecutor& executor) : device_(device), executor_(executor) {
  threads_.reserve(static_cast<std::size_t>(workers));
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { run(i); });
}

WorkerPool::~WorkerPool() {
  stopping_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  for (auto& t : threads_) t.join();
  assert(fifo_.empty() && prioritized_.empty());
}

bool WorkerPool::owns_current_thread() const noexcept { return tls_pool == this; }

void WorkerPool::enqueue(OpBlock* op) {
  if (op->priority == 0) {
    fifo_.push(op);
  } else {
    prioritized_.push(Prioritized{op->priority, op->id, op});
    prioritized_count_.fetch_add(1, std::memory_order_seq_cst);
  }
  // Pairs with the sleeper's increment-then-recheck: either it sees our op or
  // we see it sleeping.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_relaxed) > 0) {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    epoch_.notify_one();
  }
}

OpBlock* WorkerPool::try_take() {
  OpBlock* op = nullptr;
  if (prioritized_count_.load(std::memory_order_acquire) > 0) {
    Prioritized top;
    if (prioritized_.try_pop(top)) {
      prioritized_count_.fetch_sub(1, std::memory_order_relaxed);
      if (top.priority > 0 || !fifo_.try_pop(op)) return top.op;
      // A negative priority yields to the FIFO; put it back, same place in line.
      prioritized_.push(top);
      prioritized_count_.fetch_add(1, std::memory_order_relaxed);
      return op;
    }
  }
  if (fifo_.try_pop(op)) return op;
  return nullptr;
}

OpBlock* WorkerPool::take_or_sleep() {
  for (int i = 0; i < kPauseSpins; ++i) {
    if (OpBlock* op = try_take()) return op;
    WEFT_CPU_RELAX();
  }
  for (int i = 0; i < kYieldSpins; ++i) {
    if (OpBlock* op = try_take()) return op;
    std::this_thread::yield();
  }
  while (true) {
    std::uint32_t epoch = epoch_.load(std::memory_order_seq_cst);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (OpBlock* op = try_take()) {
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      return op;
    }
    if (stopping_.load(std::memory_order_seq_cst)) {
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      return nullptr;
    }
    epoch_.wait(epoch, std::memory_order_seq_cst);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    if (OpBlock* op = try_take()) return op;
  }
}

void WorkerPool::run(int worker) {
  tls_pool = this;
  executor_.on_worker_start(device_, worker);
  while (OpBlock* op = take_or_sleep()) executor_.execute(op, worker);
  tls_pool = nullptr;
}

}  // namespace weft::detail
