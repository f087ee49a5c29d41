// One device's workers and their ready queue.
//
// Ready ops wait in two oneTBB queues: a FIFO for priority 0 (the common case,
// no ordering cost) and a concurrent priority queue ordered by (priority,
// push sequence) for the rest. A worker takes a positive-priority op first,
// then the FIFO, then negative priorities. Idle workers spin briefly, then
// sleep on an event count; a push wakes one only when someone sleeps, so a
// busy pool costs one load per push.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/concurrent_priority_queue.h>
#include <oneapi/tbb/concurrent_queue.h>

#include "weft/device.h"

namespace weft::detail {

struct OpBlock;

class OpExecutor {
 public:
  virtual void execute(OpBlock* op, int worker) = 0;
  virtual void on_worker_start(Device device, int worker) = 0;

 protected:
  ~OpExecutor() = default;
};

class WorkerPool {
 public:
  WorkerPool(Device device, int workers, OpExecutor& executor);
  ~WorkerPool();  // stops and joins; the queue must be empty
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void enqueue(OpBlock* op);
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
  OpBlock* take_or_sleep();
  void run(int worker);

  Device device_;
  OpExecutor& executor_;
  tbb::concurrent_queue<OpBlock*> fifo_;
  tbb::concurrent_priority_queue<Prioritized, ByPriority> prioritized_;
  alignas(64) std::atomic<std::int64_t> prioritized_count_{0};
  alignas(64) std::atomic<std::uint32_t> epoch_{0};
  alignas(64) std::atomic<std::int32_t> sleepers_{0};
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

}  // namespace weft::detail
