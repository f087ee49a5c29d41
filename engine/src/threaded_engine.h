// The threaded engine: per-device worker pools, dependency tracking per
// variable, a bounded number of ops in flight.
//
// An op's life: push links one entry per variable into the variable's queue
// (all its variables locked at once, in address order, so concurrent pushers
// agree on one order); each grant decrements the op's pending count; at zero
// the op goes to its device's ready queue; a worker runs it; finish() releases
// each variable, granting the next accesses in queue order, and the op block
// returns to the pool. See docs/design/engine-invariants.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "engine_base.h"
#include "worker_pool.h"

namespace weft::detail {

class ThreadedEngine final : public EngineBase, private OpExecutor, private AsyncOwner {
 public:
  explicit ThreadedEngine(ResolvedConfig config);
  ~ThreadedEngine() override;

  void push(OpFunction fn, Device device, VarList reads, VarList writes, OpOptions options) override;
  void push_async(AsyncOpFunction fn, Device device, VarList reads, VarList writes, OpOptions options) override;
  void wait_to_read(Var var) override { wait_for(var, false); }
  void wait_to_write(Var var) override { wait_for(var, true); }
  void wait_all() override;
  void delete_var(Var var) override;
  std::size_t inflight() const noexcept override { return inflight_.load(std::memory_order_relaxed); }

 private:
  void execute(OpBlock* op, int worker) override;
  void on_worker_start(Device device, int worker) override;
  void complete_async(OpBlock* op, std::exception_ptr error) override;

  // Counts the op in flight; a frontend thread blocks while the bound is reached.
  void enter_inflight(bool may_block);
  void leave_inflight() noexcept;
  // Links the op's accesses; runs or queues it when nothing blocks it.
  void submit(OpBlock* op);
  void dispatch(OpBlock* op);
  void finish(OpBlock* op);
  void wait_for(Var var, bool write);
  void drain() noexcept;

  std::vector<std::unique_ptr<WorkerPool>> pools_;  // index = cpu device index
  std::vector<std::vector<Profiler::Track*>> tracks_;

  alignas(64) std::atomic<std::size_t> inflight_{0};
  alignas(64) std::atomic<std::int32_t> waiters_{0};  // threads blocked on inflight_
  std::atomic<std::int32_t> external_finishers_{0};   // non-worker threads inside complete_async
  const std::size_t resume_below_;                    // a blocked frontend resumes below this
  std::mutex wait_mutex_;
  std::condition_variable inflight_cv_;  // inflight_ fell to resume_below_ - 1 or to 0
  std::condition_variable signal_cv_;    // a barrier op completed
};

}  // namespace weft::detail
