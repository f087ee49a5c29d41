// The op block: everything the engine keeps about one pushed op. Blocks are
// pooled per engine; a block is reused only when the op has finished and no
// Completion copy refers to it any more (refs == 0).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "error_log.h"
#include "var_table.h"
#include "weft/gpu_streams.h"
#include "weft/engine.h"

namespace weft::detail {

// Set by the engine when a barrier op (or a naive async op) completes.
struct WaitSignal {
  std::atomic<bool> done{false};  // stored under the engine's wait mutex
  ErrorRef error;                 // the variable's failure when the barrier ran
  std::vector<gpu::EventRef> events;  // GPU work the waiter must wait for on the host
};

enum class OpKind : std::uint8_t {
  user,        // pushed with push / push_async
  wait,        // wait_to_read / wait_to_write barrier: completes its waiter, changes nothing
  delete_var,  // recycles its variable's slot
  graph,       // a replay's holder: holds the graph's variables while its nodes run (graph_impl.h)
  graph_roots, // a worker claiming a replay's roots in chunks (GraphImpl::RootBatch)
  bulk,        // consecutive ops of one thread and device run as one (`bulk` lists them; bulk_collector.cpp)
};

struct GraphImpl;

class ThreadedEngine;

struct OpBlock {
  // Filled at push.
  OpFunction fn;
  AsyncOpFunction async_fn;
  std::string name;
  std::string shape;  // OpOptions::shape, kept only while profiling
  Device device;
  int priority = 0;
  OpKind kind = OpKind::user;
  OpProperty property = OpProperty::normal;
  bool async = false;
  bool run_on_failed_input = false;  // OpOptions::run_on_failed_input
  bool run_inline = false;           // OpOptions::run_inline
  bool defer_gpu_waits = false;      // OpOptions::defer_gpu_waits
  std::vector<gpu::EventRef> after_gpu_work;  // OpOptions::after_gpu_work
  std::uint8_t epoch = 0;  // push epoch (InflightCounts)
  std::uint64_t id = 0;  // push sequence number: FIFO among equal priorities
  std::uint64_t bytes = 0;         // OpOptions::bytes (traces)
  std::int64_t push_ns = -1;       // while profiling: when it was pushed
  double issue_s = -1;             // modeled time on simulated GPUs: the host's when it was pushed (weft/gpu_sim.h)
  bool in_push_order = false;      // modeled mode: its pool takes it in push order (WorkerPool::expect_in_order)
  // The op whose completion made it ready (traces' flow arrows). Every op that
  // grants one of its accesses stores its id before its decrement of
  // `pending`, so when push's own decrement is the last one (a producer that
  // finished while the push was linking), the id is there all the same.
  std::atomic<std::uint64_t> unblocked_by{0};
  ThreadedEngine* engine = nullptr;
  // Accesses, deduplicated; the first kInline live in the block itself.
  static constexpr std::size_t kInline = 4;
  VarEntry inline_entries[kInline];
  std::vector<VarEntry> more_entries;  // capacity is kept across reuse
  VarEntry* entries = inline_entries;
  std::uint32_t entry_count = 0;

  // Run state.
  std::atomic<std::int32_t> pending{0};  // accesses not yet granted, plus one held by push
  ErrorRef error;                        // set when the op failed or was skipped
  ErrorRef inherited;                    // run_on_failed_input: the failure it runs with
  struct WaitSignal* signal = nullptr;   // kind == wait (and naive async ops)
  OpBlock* ready_next = nullptr;         // links ops made ready by one completion

  // Capture and replay (graph_impl.h). A node of a captured graph is a block
  // the graph owns, reused by every replay: `graph` and `node` say which (a
  // graph_roots token: its graph and batch).
  // A holder (kind == graph) keeps its graph alive until the replay is done.
  GraphImpl* graph = nullptr;
  std::uint32_t node = 0;
  std::shared_ptr<GraphImpl> graph_keep;

  // kind == bulk: the collected ops, in push order, linked by ready_next
  // (they are never queued themselves). Recycled with the bulk.
  OpBlock* bulk = nullptr;

  VarEntry* begin_entries() noexcept { return entries; }
  VarEntry* end_entries() noexcept { return entries + entry_count; }

  // Sizes the entry array for n accesses (entries never move once linked).
  void reserve_entries(std::size_t n) {
    if (n <= kInline) {
      entries = inline_entries;
    } else {
      more_entries.resize(n);
      entries = more_entries.data();
    }
    entry_count = 0;
  }

  // Takes `src`'s accesses (now this block's) and its options: device,
  // priority, property and the OpOptions flags. Not its body, name or run state.
  void copy_accesses_and_options(const OpBlock& src) {
    reserve_entries(src.entry_count);
    for (std::uint32_t k = 0; k < src.entry_count; ++k) {
      entries[k] = src.entries[k];
      entries[k].op = this;
      entries[k].next = nullptr;
    }
    entry_count = src.entry_count;
    device = src.device;
    priority = src.priority;
    kind = OpKind::user;
    property = src.property;
    async = src.async;
    run_on_failed_input = src.run_on_failed_input;
    run_inline = src.run_inline;
    defer_gpu_waits = src.defer_gpu_waits;
    after_gpu_work = src.after_gpu_work;
    bytes = src.bytes;
  }

  // Forget the op (captures are destroyed now: they may hold resources).
  void clear() noexcept {
    fn.reset();
    async_fn.reset();
    name.clear();
    shape.clear();
    error.reset();
    inherited.reset();
    run_on_failed_input = false;
    run_inline = false;
    in_push_order = false;
    defer_gpu_waits = false;
    after_gpu_work.clear();
    signal = nullptr;
    ready_next = nullptr;
    graph = nullptr;
    bulk = nullptr;
    entry_count = 0;
    entries = inline_entries;
    graph_keep.reset();  // may end the graph: last, after the block is forgotten
  }
};

// Whoever runs async ops: told when an op's Completion is called.
class AsyncOwner {
 public:
  virtual void complete_async(OpBlock* op, std::exception_ptr error) = 0;

 protected:
  ~AsyncOwner() = default;
};

// The shared state behind the Completion copies of one async op. It lives on
// the heap, apart from the op block, so a copy destroyed after the op finished
// (even after the engine is gone) touches only this state.
class AsyncCompletion final : public CompletionTarget {
 public:
  // Starts with two references: the Completion handed to the op and the
  // executing thread's, which it gives up with release_executor().
  AsyncCompletion(OpBlock* op, AsyncOwner* owner) : op_(op), owner_(owner), name_(op->name), device_(op->device) {}

  // The executing thread claims the completion when the op body threw.
  bool claim() noexcept { return !called_.exchange(true, std::memory_order_acq_rel); }
  void release_executor() noexcept { completion_release(); }

  void completion_retain() noexcept override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void completion_release() noexcept override;
  void completion_call(std::exception_ptr error) override;

 private:
  std::atomic<std::int32_t> refs_{2};
  std::atomic<bool> called_{false};
  OpBlock* op_;
  AsyncOwner* owner_;
  std::string name_;
  Device device_;
};

// Set while a thread runs an op body: pushes from inside ops skip the in-flight
// bound, and waits from inside ops are refused instead of deadlocking.
struct OpScope {
  const void* engine;
  const std::string* op_name;
  Device device;
  std::uint8_t epoch;  // pushes from inside the op join it
  const OpScope* outer;
};
const OpScope* current_op_scope() noexcept;
class OpScopeGuard {
 public:
  OpScopeGuard(const void* engine, const std::string* name, Device device, std::uint8_t epoch = 0) noexcept;
  ~OpScopeGuard();
  OpScopeGuard(const OpScopeGuard&) = delete;
  OpScopeGuard& operator=(const OpScopeGuard&) = delete;

 private:
  OpScope scope_;
};
// The innermost op of `engine` running on this thread, or nullptr.
const OpScope* running_op_of(const void* engine) noexcept;

}  // namespace weft::detail
