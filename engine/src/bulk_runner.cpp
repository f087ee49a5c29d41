// The threaded engine's bulk runner: a flushed bulk pushed as one op over
// the union of its members' variables and run back to back on one worker,
// and a replay's GPU segment launched as one stream graph.
// docs/design/bulking.md, docs/design/capture-replay.md ("Stream graphs").
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "gpu_spans.h"
#include "graph_impl.h"
#include "nvtx_ranges.h"
#include "threaded_engine.h"
#include "weft/check_context.h"

namespace weft::detail {

void ThreadedEngine::launch_bulk(OpBlock* first, std::size_t count) {
  if (count == 1) {  // pushed as itself (submit checks its variables)
    first->ready_next = nullptr;
    launch(first);
    return;
  }
  OpBlock* bulk = nullptr;
  try {
    bulk = ops_.acquire();
    bulk->name = bulk_name(first, count);
    std::size_t accesses = 0;
    for (const OpBlock* op = first; op != nullptr; op = op->ready_next) accesses += op->entry_count;
    bulk->reserve_entries(accesses);
  } catch (...) {  // out of memory: nothing is pushed, nothing kept
    if (bulk) recycle(bulk);
    for (OpBlock* op = first; op != nullptr;) {
      OpBlock* next = op->ready_next;
      op->ready_next = nullptr;
      recycle(op);
      op = next;
    }
    throw;
  }
  OpBlock* last = first;
  while (last->ready_next) last = last->ready_next;
  // The union: members mostly share variables (a chain of 16 ops touches one
  // or two), so duplicates are merged as they come while the union is small
  // and the sort sees few entries; beyond kScan, sort_accesses merges them.
  constexpr std::uint32_t kScan = 32;
  for (OpBlock* op = first; op != nullptr; op = op->ready_next) {
    for (const VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e) {
      VarEntry* same = nullptr;
      if (bulk->entry_count <= kScan)
        for (VarEntry* u = bulk->entries; u != bulk->entries + bulk->entry_count && !same; ++u)
          if (u->slot == e->slot) same = u;
      if (same) {
        same->write |= e->write;
        same->read |= e->read;
        if (same->generation != e->generation) same->generation = 0;  // as sort_accesses: a deleted variable
        continue;
      }
      VarEntry& u = bulk->entries[bulk->entry_count++];
      u = *e;
      u.op = bulk;
      u.next = nullptr;
    }
  }
  sort_accesses(*bulk);
  bulk->bulk = first;  // from here on the members are recycled with the bulk
  bulk->device = first->device;
  bulk->priority = first->priority;
  bulk->property = first->property;
  bulk->kind = OpKind::bulk;
  bulk->async = false;
  // The last member's id: its place among equal priorities, and what the
  // ops it makes ready were unblocked by (traces).
  bulk->id = last->id;
  bulk->bytes = 0;
  bulk->unblocked_by.store(0, std::memory_order_relaxed);
  bulk->push_ns = -1;
  bulk->pending.store(static_cast<std::int32_t>(bulk->entry_count) + 1, std::memory_order_relaxed);
  launch(bulk);
}


void ThreadedEngine::run_bulk(OpBlock* bulk, int pool_index, int worker) {
  Pool& pool = pools_[static_cast<std::size_t>(pool_index)];
  const Device device = bulk->device;
  const bool profiling = profiler_->running();
  RunContext ctx{device, worker, {}, this};
  // A GPU bulk's stream waits once, before the first member, for the GPU
  // producers of the whole union (what any member depends on, the first
  // waits for); a CPU member settles its own variables below.
  gpu::Stream* stream = nullptr;
  GpuSpanRecorder* timing = nullptr;
  ErrorRef settle_failed;
  if (device.is_gpu()) {
    const gpu::WorkerHandles& h = pool.streams[static_cast<std::size_t>(worker)]->handles();
    ctx.gpu = &h;
    stream = h.stream;
    try {
      gpu_op_wait(*bulk, stream);
    } catch (...) {  // the stream cannot be ordered after the inputs: every member fails
      settle_failed = errors_.add(std::current_exception(), bulk->name);
    }
    if (profiling) timing = pool.gpu_spans[static_cast<std::size_t>(worker)].get();
  }
  const bool settle_host = !device.is_gpu() && config_.gpu_devices > 0;
  std::uint64_t unblocked_by = bulk->unblocked_by.load(std::memory_order_relaxed);
  bool launched = false;  // a replay's segment launched as a stream graph
  if (stream && !settle_failed && bulk->graph != nullptr && bulk->graph->gpu_graphs) {
    try {
      launched = launch_segment(*bulk, stream, ctx, pool, worker, timing);
    } catch (...) {  // the launch failed: so does every member
      launched = true;
      const ErrorRef failed = errors_.add(std::current_exception(), bulk->name);
      for (OpBlock* op = bulk->bulk; op != nullptr; op = op->ready_next) op->error = failed;
    }
  }
  if (launched) {
    for (OpBlock* op = bulk->bulk; op != nullptr; op = op->ready_next)
      for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e)
        if (e->write) apply_write(*e->slot, *op);
  }
  for (OpBlock* op = launched ? nullptr : bulk->bulk; op != nullptr; op = op->ready_next) {
    // As run() does for a pushed op, with what the members before it wrote
    // already applied: a member reading a failed one's output is skipped.
    if (settle_failed) {
      op->error = settle_failed;
    } else if (ErrorRef inherited = inherited_error(*op)) {
      if (op->run_on_failed_input) {
        op->inherited = std::move(inherited);
      } else {
        op->error = std::move(inherited);
      }
    }
    if (!op->error) {
      ctx.op_name = op->name;
      ctx.failed_input = op->inherited ? op->inherited->error : nullptr;
      SpanInfo traced;
      if (profiling)
        traced = SpanInfo{recorder_.intern(op->name), op->id, Profiler::now_ns(), 0, op->push_ns, unblocked_by,
                          op->bytes, op->property};
      {
        OpScopeGuard scope(scope_key(), &op->name, device, bulk->epoch);
        CheckContextGuard check(op->name, device);
        NvtxRange range(nvtx_.of(device), op->name.c_str(), op->property);
        if (timing) timing->begin(stream);
        try {
          // A CPU member on an engine with GPUs settles its own variables'
          // GPU history, as a pushed op does (a failure there is its own).
          if (settle_host) {
            host_op_wait(*op);
            host_op_publish(*op);
          }
          op->fn(ctx);
        } catch (...) {
          fail(*op, std::current_exception());
        }
        if (timing) timing->end(stream, traced);
      }
      if (profiling) {
        traced.end_ns = Profiler::now_ns();
        recorder_.record(pool.tracks[static_cast<std::size_t>(worker)], traced);
      }
    }
    // Its writes count now (versions, errors), without the variables'
    // locks: the bulk holds their write access, so no other op looks.
    for (VarEntry* e = op->begin_entries(); e != op->end_entries(); ++e)
      if (e->write) apply_write(*e->slot, *op);
    unblocked_by = op->id;
  }
  // Whatever the members enqueued (even those that threw) orders later users
  // — unless the stream could not be ordered after the inputs: then nothing
  // ran, and the variables' GPU history stays as it was.
  if (stream && !settle_failed) {
    try {
      gpu_op_publish(*bulk, device.index(), stream);
    } catch (...) {  // later users could not order after the work: its outputs fail
      const ErrorRef failed = errors_.add(std::current_exception(), bulk->name);
      for (VarEntry* e = bulk->begin_entries(); e != bulk->end_entries(); ++e) {
        if (!e->write) continue;
        std::lock_guard lock(e->slot->lock);
        e->slot->error = failed;
      }
    }
  }
  finish(bulk, true);
}

bool ThreadedEngine::launch_segment(OpBlock& segment, gpu::Stream* stream, RunContext& ctx, Pool& pool, int worker,
                                    GpuSpanRecorder* timing) {
  GraphImpl& g = *segment.graph;
  GraphImpl::Segment& s = g.segments[static_cast<std::size_t>(g.segment_of[segment.node])];
  if (s.failed) return false;
  // A member that would be skipped, or run with a failure: op by op, so that
  // each fails or runs as pushed (the graph stays for the next replay).
  for (OpBlock* op = segment.bulk; op != nullptr; op = op->ready_next)
    if (inherited_error(*op)) return false;
  gpu::StreamGraph* graph = s.graph_for(stream);
  if (graph == nullptr && std::find(s.warmed.begin(), s.warmed.end(), stream) == s.warmed.end()) {
    s.warmed.push_back(stream);  // the warm-up on this stream: op by op
    return false;
  }
  if (graph == nullptr) {
    // What the bodies enqueue is recorded, not run; the launch below runs it.
    std::string why;
    try {
      gpu::begin_stream_capture(stream);
      try {
        for (OpBlock* op = segment.bulk; op != nullptr; op = op->ready_next) {
          ctx.op_name = op->name;
          ctx.failed_input = nullptr;
          OpScopeGuard scope(scope_key(), &op->name, segment.device, segment.epoch);
          CheckContextGuard check(op->name, segment.device);
          op->fn(ctx);
        }
      } catch (const std::exception& e) {
        why = "op '" + std::string(ctx.op_name) + "' threw while captured: " + e.what();
      } catch (...) {
        why = "op '" + std::string(ctx.op_name) + "' threw while captured";
      }
      std::string ended;
      std::unique_ptr<gpu::StreamGraph> made = gpu::end_stream_capture(stream, &ended);
      if (why.empty() && !made) why = ended;
      if (why.empty()) {
        graph = made.get();
        s.graphs.emplace_back(stream, std::move(made));
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (graph == nullptr) {
      s.failed = true;
      std::fprintf(stderr, "weft: replay: %s runs op by op from now on: %s\n", segment.name.c_str(), why.c_str());
      return false;
    }
  }
  // One span for the launch (a failure to trace it loses the span, not the launch).
  bool profiling = profiler_->running();
  SpanInfo traced;
  if (profiling) {
    try {
      traced = SpanInfo{recorder_.intern(segment.name), segment.id, Profiler::now_ns(), 0, -1,
                        segment.unblocked_by.load(std::memory_order_relaxed), 0, segment.property};
    } catch (...) {
      profiling = false;
    }
  }
  {
    NvtxRange range(nvtx_.of(segment.device), segment.name.c_str(), segment.property);
    if (timing && profiling) timing->begin(stream);
    gpu::launch_stream_graph(*graph, stream);
    if (timing && profiling) timing->end(stream, traced);
  }
  if (profiling) {
    traced.end_ns = Profiler::now_ns();
    try {
      recorder_.record(pool.tracks[static_cast<std::size_t>(worker)], traced);
    } catch (...) {
    }
  }
  return true;
}

}  // namespace weft::detail
