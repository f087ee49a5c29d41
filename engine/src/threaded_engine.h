// The threaded engine: per-device worker pools, dependency tracking per
// variable, a bounded number of ops in flight.
//
// An op's life: push links one entry per variable into the variable's queue
// (all its variables locked at once, in address order, so concurrent pushers
// agree on one order); each grant decrements the op's pending count; at zero
// the op goes to its device's ready queue; a worker runs it; finish() releases
// each variable, granting the next accesses in queue order, and the op block
// returns to the pool. See docs/design/engine-invariants.md.
//
// Files: threaded_engine.cpp (pools, granting, dispatch, running and
// finishing an op, waits), inflight_bound.cpp (the in-flight bound and
// drains), replay_runner.cpp (replays of captured graphs), bulk_runner.cpp
// (flushed bulks and GPU stream-graph segments).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "engine_base.h"
#include "gpu_sync.h"
#include "inflight_counts.h"
#include "worker_pool.h"

namespace weft::detail {

class GpuSpanRecorder;

class ThreadedEngine final : public EngineBase, private OpExecutor, private AsyncOwner {
 public:
  explicit ThreadedEngine(ResolvedConfig config);
  ~ThreadedEngine() override;

  void wait_to_read(Var var) override { wait_for(var, false); }
  void wait_to_write(Var var) override { wait_for(var, true); }
  void wait_all() override;
  void delete_var(Var var) override;
  std::size_t inflight() const noexcept override { return static_cast<std::size_t>(counts_.total()); }
  std::vector<PendingOp> pending_ops() const override;

 private:
  // One worker pool with what its workers own: pools 0..cpu_devices-1 are the
  // CPU devices; then, per GPU, compute, h2d, d2h, peer and priority pools,
  // each GPU worker with its own stream.
  struct Pool {
    Device device;
    gpu::StreamRole role = gpu::StreamRole::compute;
    std::size_t first_slot = 0;  // of its workers' completion counters
    std::vector<ProfilerTrack*> tracks;
    std::vector<std::unique_ptr<gpu::StreamResources>> streams;
    std::vector<std::unique_ptr<GpuSpanRecorder>> gpu_spans;  // per GPU worker
    std::unique_ptr<WorkerPool> workers;
  };
  static constexpr int kPoolsPerGpu = 5;
  std::size_t pool_of(const OpBlock& op) const noexcept;

  // --- Granting, dispatch, running and finishing (threaded_engine.cpp) ---
  void launch(OpBlock* op) override;
  // Links the op's accesses; runs or queues it when nothing blocks it.
  void submit(OpBlock* op);
  void dispatch(OpBlock* op);
  // Runs or queues what one completion made ready (`ready` newest first).
  void dispatch_ready(OpBlock* ready, bool worker_is_done, bool first_here = false);
  // OpOptions::run_inline: runs the op on this thread when it may (the
  // thread runs no op body; no unfinished GPU work to wait for).
  bool try_run_inline(OpBlock* op);
  void execute(OpBlock* op, int pool, int worker) override { run(op, pool, worker); }
  void on_worker_start(int pool, int worker) override;
  // Runs the op's body (or skips it) and finishes or hands over its
  // completion. worker -1: on a thread that is not one of the pool's workers.
  void run(OpBlock* op, int pool, int worker);
  // run() of a synchronous op: the body, its span, finish. `traced`: the
  // op's span while profiling, else null. Inline (defined and called in
  // threaded_engine.cpp only): a synchronous op costs no extra call.
  inline void run_sync(OpBlock* op, Pool& pool, int worker, RunContext& ctx, SpanInfo* traced);
  // run() of an async op: the body, which completes the op (now or later).
  void run_async(OpBlock* op, Pool& pool, int worker, RunContext& ctx, SpanInfo* traced);
  // An async op's GPU inputs settled before its body (or, with
  // defer_gpu_waits, handed to it in `gpu_waits`); false when that failed
  // (the op's error is set).
  bool settle_async_inputs(OpBlock& op, RunContext& ctx, EventList& gpu_waits);
  // An async op's body threw (called in its catch block).
  void async_body_threw(OpBlock* op, AsyncCompletion* state, const EventList& gpu_waits);
  void run_body(OpBlock* op, Pool& pool, int worker, RunContext& ctx, const SpanInfo* traced);
  // While profiling: the track of inline bodies run by this thread on `device`.
  ProfilerTrack* inline_track(Device device);
  void complete_async(OpBlock* op, std::exception_ptr error) override;
  // worker_is_done: called by a worker whose op body has returned, so the
  // first op this makes ready on its device may run next on it.
  void finish(OpBlock* op, bool worker_is_done = false);
  // Returns a finished op's block: to the pool, or a holder to its graph.
  void release_block(OpBlock* op) noexcept;
  void wait_for(Var var, bool write);
  // Moves completed GPU-side spans into the profiler (streams synchronized).
  void resolve_gpu_spans();
  void synchronize_gpus() noexcept;

  // --- The in-flight bound (inflight_bound.cpp) ---
  // Counts the op in flight in its push epoch; a frontend thread blocks while
  // the bound is reached.
  void enter_inflight(OpBlock* op);
  void leave_inflight(unsigned epoch) noexcept;
  // A worker thread counts its completions in its own slot from now on.
  void count_completions_in(std::size_t slot) noexcept;
  bool drained() const noexcept;
  template <class Pred>
  void wait_until(std::condition_variable& cv, std::atomic<std::int32_t>& waiters, Pred done);
  // Closes the epoch of everything pushed so far and waits until it is done
  // (later pushes go to the next epoch and are not waited for).
  void drain_pushed_so_far();
  // Waits until nothing is in flight and no thread is inside complete_async.
  void drain() noexcept;

  // --- The replay runner (replay_runner.cpp) ---
  bool runs_stream_graphs() const noexcept override { return config_.gpu_devices > 0; }
  // Queues a holder of the graph's variables; once granted, start_graph
  // runs the nodes as their dependencies allow and the last one releases it.
  void replay_graph(const std::shared_ptr<GraphImpl>& graph) override;
  void start_graph(OpBlock* holder);
  // A push from inside the body of a replayed async node of `graph` that
  // uses one of the replay's variables: refused (it could only run after the
  // replay, which waits for the node). Throws naming both ops.
  void refuse_follow_up_of_async_node(OpBlock* op, const GraphImpl& graph);
  // Readies a node block for this replay (id, errors, trace): when it
  // becomes ready, so each block is touched once per replay.
  void arm_node(GraphImpl& graph, OpBlock& node, std::uint64_t unblocked_by);
  // At a graph's first replay: its roots grouped by CPU device into batches.
  void batch_roots(GraphImpl& graph);
  // A graph_roots token on a worker: claims and runs roots until none is left.
  void run_roots(OpBlock* token, int pool, int worker);
  // A node of a running graph is done: its writes are applied, its
  // successors counted down, the holder released after the last node.
  void finish_node(OpBlock* op, bool worker_is_done);
  // One of the graph's nodes (or an async node's body) is done.
  void node_done(GraphImpl& graph);

  // --- The bulk runner (bulk_runner.cpp) ---
  // A flushed bulk becomes one op over the union of its members' variables.
  void launch_bulk(OpBlock* first, std::size_t count) override;
  // Runs a bulk's members back to back on one worker, each with its own
  // error handling, writes and trace span.
  void run_bulk(OpBlock* bulk, int pool, int worker);
  // A replay's GPU segment (CaptureOptions::gpu_graphs) as one stream graph
  // launched on `stream`, captured first when this stream has none: true
  // when launched, false when it must run op by op (its first replay, a
  // failed input, a capture that failed). A span for the launch when timed.
  bool launch_segment(OpBlock& segment, gpu::Stream* stream, RunContext& ctx, Pool& pool, int worker,
                      GpuSpanRecorder* timing);

  std::vector<Pool> pools_;
  // Per worker (its completion slot): the synchronous op with variables
  // whose body it runs, else null. Written by the worker only (a store
  // before and after the body); pending_ops reads it under every
  // variable's lock, which keeps such an op from finishing.
  std::unique_ptr<std::atomic<const OpBlock*>[]> running_;
  std::size_t running_slots_ = 0;

  InflightCounts counts_;
  alignas(64) std::atomic<std::uint64_t> completed_seen_{0};  // a frontend's last sum of the completions
  std::mutex wait_all_mutex_;                                 // one wait_all closes an epoch at a time
  std::atomic<unsigned> draining_epoch_{0};
  alignas(64) std::atomic<std::int32_t> throttled_{0};  // frontends blocked on the bound
  std::atomic<std::int32_t> draining_{0};              // threads in wait_all / the destructor
  std::atomic<bool> closing_{false};                   // the destructor drains everything
  std::atomic<std::int32_t> external_finishers_{0};    // non-worker threads inside complete_async
  std::atomic<int> inline_tracks_{0};                  // inline_track()s handed out
  const std::size_t resume_below_;                     // a blocked frontend resumes below this (bound / 4)
  std::mutex wait_mutex_;
  std::condition_variable throttle_cv_;  // in flight fell below resume_below_
  std::condition_variable drain_cv_;     // nothing in flight
  std::condition_variable signal_cv_;    // a barrier op completed
};

}  // namespace weft::detail
