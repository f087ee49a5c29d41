// One device's workers and their ready queue.
//
// Ready ops of priority 0 (the common case) wait in a FIFO: a bounded ring,
// spilling into a oneTBB concurrent_queue when full (new ops keep spilling
// until the spill drains, so FIFO order holds). The rest wait in a oneTBB
// concurrent priority queue ordered by (priority, push sequence). A worker takes a positive-priority op first,
// then the FIFO, then negative priorities.
//
// A pool in push order (GPU pools) keeps every op in the priority queue, so
// that among ready ops of equal priority the one pushed first is taken
// first, whenever it became ready. Its workers only enqueue work on streams,
// which run it in the order given: an op taken ahead of an earlier-pushed
// one would hold that one behind whatever it stream-waits for (a chain of
// copies of one result behind the first copy of the next result, which waits
// for a kernel still running). Idle workers spin briefly, then
// sleep on an event count; a push wakes one only when someone sleeps, so a
// busy pool costs one load per push.
//
// Under simulated GPUs' modeled mode (virtual time), ops the frontend pushed
// are taken strictly in push order (expect_in_order at push): a ready op
// waits for every earlier-pushed one of its pool, so the order of a stream's
// work, and with it the modeled clock, does not follow which op the host
// happened to make ready first (docs/design/simulated-gpus.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/concurrent_priority_queue.h>
#include <oneapi/tbb/concurrent_queue.h>

#include "ready_ring.h"
#include "weft/device.h"

namespace weft::detail {

struct OpBlock;

class OpExecutor {
 public:
  // `pool` is the pool's index in its engine (one pool per CPU device, several
  // per GPU), `worker` the thread's index in the pool.
  virtual void execute(OpBlock* op, int pool, int worker) = 0;
  virtual void on_worker_start(int pool, int worker) = 0;

 protected:
  ~OpExecutor() = default;
};

class WorkerPool {
 public:
  enum class Order { ready, push };
  // `index`: the pool's index in its engine, passed on to the executor.
  WorkerPool(Device device, int index, int workers, OpExecutor& executor, Order order = Order::ready);
  ~WorkerPool();  // stops and joins; the queue must be empty
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void enqueue(OpBlock* op);
  // Modeled mode: the op `id` (OpBlock::in_push_order) was pushed for this
  // pool; once ready it is taken only after every op expected before it.
  void expect_in_order(std::uint64_t id);
  // Called by a worker of this pool for an op its own completion made ready:
  // when nothing else is queued the op runs next on this worker, skipping the
  // queue and any wake-up (a dependency chain stays on one warm thread).
  // Returns false (and does nothing) otherwise.
  bool run_next_here(OpBlock* op) noexcept;
  Device device() const noexcept { return device_; }
  int size() const noexcept { return static_cast<int>(threads_.size()); }
  bool owns_current_thread() const noexcept;

 private:
  struct Prioritized {
    int priority;
    std::uint64_t id;
    OpBlock* op;
  };
  struct ByPriority {
    bool operator()(const Prioritized& a, const Prioritized& b) const noexcept {
      // true when a runs after b
      return a.priority != b.priority ? a.priority < b.priority : a.id > b.id;
    }
  };

  OpBlock* try_take();
  void wake_one() noexcept;
  bool has_work() const noexcept;
  OpBlock* take_or_sleep();
  void run(int worker);

  Device device_;
  int index_;
  Order order_;
  OpExecutor& executor_;
  bool fifo_push(OpBlock* op);
  OpBlock* fifo_pop();
  bool fifo_empty() const noexcept;

  // Ops in push order (modeled mode): the ids pushed and not yet taken, and
  // those of them that are ready; the first is taken when it is both.
  OpBlock* take_in_order();
  std::mutex in_order_mutex_;
  std::set<std::uint64_t> in_order_expected_;
  std::map<std::uint64_t, OpBlock*> in_order_ready_;
  alignas(64) std::atomic<std::int64_t> in_order_count_{0};  // in_order_ready_'s size

  static constexpr std::size_t kRingCapacity = 1024;
  ReadyRing<OpBlock> ring_{kRingCapacity};
  tbb::concurrent_queue<OpBlock*> spill_;
  alignas(64) std::atomic<std::int64_t> spilled_{0};
  tbb::concurrent_priority_queue<Prioritized, ByPriority> prioritized_;
  alignas(64) std::atomic<std::int64_t> prioritized_count_{0};
  alignas(64) std::atomic<std::uint32_t> epoch_{0};
  alignas(64) std::atomic<std::int32_t> sleepers_{0};
  std::atomic<std::int32_t> spinning_{0};  // workers searching for work
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

}  // namespace weft::detail
