// The naive engine runs every op synchronously, in the pushing thread, one at a
// time. It shares validation and the error rules with the threaded engine, so
// it is both the debugging engine (a stack trace points at the push) and the
// oracle the threaded engine is tested against.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "engine_base.h"
#include "weft/gpu_streams.h"

namespace weft::detail {

class NaiveEngine final : public EngineBase, private AsyncOwner {
 public:
  explicit NaiveEngine(ResolvedConfig config);
  ~NaiveEngine() override;

  void wait_to_read(Var var) override;
  void wait_to_write(Var var) override;
  void wait_all() override;
  void delete_var(Var var) override;
  std::size_t inflight() const noexcept override { return inflight_.load(std::memory_order_relaxed); }
  std::vector<PendingOp> pending_ops() const override;

 private:
  void launch(OpBlock* op) override;
  // Pushes the nodes again, in capture order: the oracle of replay.
  void replay_graph(const std::shared_ptr<GraphImpl>& graph) override;
  void complete_async(OpBlock* op, std::exception_ptr error) override;
  // Runs the op now, or, when pushed from inside an op, once the outermost
  // running op has finished: push order says a follow-up runs after its parent.
  void run(OpBlock* op);
  void run_now(OpBlock* op);
  ProfilerTrack* thread_track(Device device);

  // Ops run one at a time even when several threads push; recursive so an op
  // may push follow-up ops, which run at once, nested.
  std::recursive_mutex run_mutex_;
  std::deque<OpBlock*> deferred_;        // guarded by run_mutex_
  int running_ = 0;                      // guarded by run_mutex_: run() is on the stack
  std::vector<OpBlock*> pending_async_;  // async ops waiting for done(), outermost first
  std::mutex async_mutex_;
  std::condition_variable async_cv_;
  std::atomic<std::size_t> inflight_{0};
  // What pending_ops reports, kept apart from run_mutex_ (held by the thread
  // running ops): the ops on a running thread's stack, outermost first, and
  // the ops waiting for their turn (deferred, or their pusher waits for
  // run_mutex_). An op leaves them before its block is recycled.
  mutable std::mutex shown_mutex_;
  std::vector<const OpBlock*> shown_running_;
  std::vector<const OpBlock*> shown_waiting_;
  void show_waiting(const OpBlock* op);
  std::mutex tracks_mutex_;
  std::map<std::thread::id, int> thread_index_;
  std::vector<std::unique_ptr<gpu::StreamResources>> gpu_streams_;  // one per GPU
};

}  // namespace weft::detail
