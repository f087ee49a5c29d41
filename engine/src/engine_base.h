// What the threaded and naive engines share: variables, validation of pushed
// ops, the error rules and the profiler hookup. The engines differ only in
// when and where an op runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine_config.h"
#include "error_log.h"
#include "nvtx_ranges.h"
#include "object_pool.h"
#include "op_block.h"
#include "profiler_recorder.h"
#include "var_table.h"
#include "weft/engine.h"

namespace weft::detail {

class EngineBase : public Engine {
 public:
  Var new_var(std::string_view name) override { return vars_.create(name); }
  std::uint64_t version(Var var) const override;
  void set_var_name(Var var, std::string_view name) override;
  std::string var_name(Var var) const override;
  std::string_view kind() const noexcept override { return config_.kind; }
  std::vector<Device> devices() const override;
  int workers(Device device) const override;
  std::size_t max_inflight() const noexcept override { return config_.max_inflight; }
  Allocator& allocator(Device device) override;

  // Capture is shared (op_graph.cpp); how a graph runs is replay_graph().
  void begin_capture(CaptureOptions options = {}) override;
  OpGraph end_capture() override;
  void replay(const OpGraph& graph) override;
  bool capturing() const noexcept override;

  // Bulking is shared (bulk_collector.cpp); how a flushed bulk runs is launch_bulk().
  std::size_t set_bulk_size(std::size_t ops) override;
  std::size_t bulk_size() const noexcept override;

  // Validation is shared; what happens to a valid op is the engine's launch().
  void push_op(OpFunction fn, Device device, VarList reads, VarList writes, OpOptions options) final;
  void push_async_op(AsyncOpFunction fn, Device device, VarList reads, VarList writes, OpOptions options) final;

 protected:
  explicit EngineBase(ResolvedConfig config);
  ~EngineBase() override;

  // A filled op block with deduplicated accesses sorted by variable (the lock
  // order). Throws weft::Error naming the op and the culprit on bad input.
  OpBlock* prepare(OpKind kind, Device device, VarList reads, VarList writes, OpOptions&& options);
  void recycle(OpBlock* op) noexcept;
  // Above the id of every op pushed so far (what a reported error still reaches).
  std::uint64_t id_bound() const noexcept { return next_op_id_.load(std::memory_order_acquire) + 1; }
  // While profiling: the push time, and the op's accesses for the dependency graph.
  void record_push(OpBlock& op);
  // Takes a valid, prepared user op: run it, or queue it behind its variables.
  virtual void launch(OpBlock* op) = 0;
  // Runs a sealed, non-empty graph whose variables were alive at the call.
  virtual void replay_graph(const std::shared_ptr<GraphImpl>& graph) = 0;
  // Whether replay_graph runs GPU segments as stream graphs (end_capture
  // then folds them: GraphImpl::fold_gpu_segments).
  virtual bool runs_stream_graphs() const noexcept { return false; }
  // While this thread captures for this engine: records the prepared op
  // (returning its block to the pool) and returns true. Throws when it
  // captures for another engine.
  bool capture_push(OpBlock* op);
  // A pool block that runs node i of the graph as a pushed op would (fresh
  // id; its body calls the node's): for engines that replay by pushing.
  OpBlock* instantiate(const std::shared_ptr<GraphImpl>& graph, std::uint32_t i);
  // Bulking (bulk_collector.cpp). While this thread bulks for this engine:
  // collects the prepared op and returns true, or pushes what was collected first
  // when the op cannot join it and returns false (the caller launches the
  // op). Pushes from inside ops are never collected.
  bool bulk_push(OpBlock* op);
  // Pushes what this thread collected for this engine. Waits, deletions,
  // capture and replay call it first: what was collected comes before them.
  void flush_bulk();
  void restore_bulk_size(std::size_t ops) noexcept override;
  // Pushes `count` collected ops (launch_bulk; nothing for none).
  void launch_collected(OpBlock* first, std::size_t count);
  // delete_var flushes first, but deletes even when the flush fails: the
  // failure, if any, to rethrow once the deletion is queued.
  std::exception_ptr flush_bulk_for_deletion() noexcept;
  // Runs a flushed bulk: `count` >= 1 prepared ops of one device, property
  // and priority, in push order, linked by ready_next. The default launches
  // them one by one (the naive engine: the oracle of a bulk).
  virtual void launch_bulk(OpBlock* first, std::size_t count);

 public:
  // A thread that bulked for this engine ended: what it collected is pushed
  // (a failure is kept for wait_all). Called under the engine's life lock.
  void thread_ended_bulking(OpBlock* first, std::size_t count) noexcept;

 protected:
  // "bulk of 3 ops ('first' .. 'last')": errors and traces name a bulk so.
  static std::string bulk_name(const OpBlock* first, std::size_t count);
  // Engines call it first in their destructor: pushes what this thread
  // collected, warns when other threads still bulk.
  void end_bulks() noexcept;
  // Sorts the op's accesses by variable (the order push takes their locks
  // in) and merges duplicates: a variable read and written is written (and read).
  static void sort_accesses(OpBlock& op) noexcept;

  // Waiting on the capturing engine from the capturing thread would wait for
  // ops that have not run: refuse it, naming the call.
  void refuse_wait_while_capturing(std::string_view call, const Var* var) const;

  // The key op scopes are tagged with: the same pointer from every subclass.
  const void* scope_key() const noexcept { return static_cast<const EngineBase*>(this); }
  // Waiting from inside an op of this engine would deadlock (the op holds its
  // variables, maybe the last worker): refuse it, naming the op.
  void refuse_wait_inside_op(std::string_view call, const Var* var) const;
  // The error an op must inherit from a variable it reads, if any.
  ErrorRef inherited_error(OpBlock& op) const noexcept;
  // Records the exception the op threw (or was completed with).
  void fail(OpBlock& op, std::exception_ptr error);
  // A write completed: count it and store (or clear) the op's error on the
  // variable. Caller holds the variable's lock.
  static void apply_write(VarSlot& slot, const OpBlock& op) noexcept;
  // Rethrows the failure if nobody reported it yet (the first report wins).
  void report(const ErrorRef& error);
  static ErrorRef error_of(VarSlot& slot);  // under the variable's lock
  // wait_all's report: rethrows the first unreported failure, forgets all.
  void report_all_errors();

  bool has_device(Device device) const noexcept;
  std::string device_list() const;  // "cpu(0)..cpu(1) and gpu(0)..gpu(0)"

  // Dumps the trace and prints the summary when the config asked; warns about
  // errors nobody waited for. Engines call it once drained.
  void at_shutdown() noexcept;

  ResolvedConfig config_;
  NvtxDomains nvtx_;  // one per device, for Nsight (nvtx_ranges.h)
  ProfilerRecorder recorder_;  // what the engine records into profiler()
  // Before the variables and ops: tensors' storage may be freed while the
  // engine drains.
  std::vector<std::unique_ptr<Allocator>> cpu_allocators_, gpu_allocators_;
  std::unique_ptr<Allocator> pinned_allocator_;
  const std::uint32_t engine_id_;
  VarTable vars_;
  ErrorLog errors_;
  ObjectPool<OpBlock> ops_;
  std::atomic<int> bulking_threads_{0};  // threads whose bulk size for this engine is above 1
  // Written by every push: a cache line of its own, so that workers reading
  // the members around it do not pull it away from the frontend.
  alignas(64) std::atomic<std::uint64_t> next_op_id_{0};  // ids handed out: 1..next_op_id_
  char next_op_id_pad_[64 - sizeof(std::atomic<std::uint64_t>)] = {};
};

}  // namespace weft::detail
