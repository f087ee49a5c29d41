#include "gpu_sync.h"

#include <algorithm>

#include "op_block.h"
#include "var_table.h"

namespace weft::detail {

namespace {

GpuVarState* state_of(VarSlot& slot) noexcept { return slot.gpu.load(std::memory_order_acquire); }

GpuVarState& ensure_state(VarSlot& slot) {
  GpuVarState* s = state_of(slot);
  if (s) return *s;
  // Concurrent readers may race to create it; one wins.
  auto* fresh = new GpuVarState;
  if (slot.gpu.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *s;
}

}  // namespace

void gpu_op_wait(OpBlock& op, gpu::Stream* stream) {
  for (VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) {
    GpuVarState* s = state_of(*e->slot);
    if (!s) continue;
    std::lock_guard lock(s->lock);
    // A pure write must still follow the previous writer: two streams writing
    // one buffer would otherwise race.
    if (s->writer) s->writer->stream_wait(stream);
    if (e->write)
      for (const gpu::EventRef& r : s->readers) r->stream_wait(stream);
  }
}

void gpu_op_publish(OpBlock& op, int device, gpu::Stream* stream) {
  gpu::EventRef done(gpu::Event::record(device, stream));
  for (VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) {
    GpuVarState& s = ensure_state(*e->slot);
    std::lock_guard lock(s.lock);
    if (e->write) {
      s.writer = done;
      s.readers.clear();
    } else {
      auto same = std::find_if(s.readers.begin(), s.readers.end(),
                               [&](const gpu::EventRef& r) { return r->stream() == stream; });
      if (same != s.readers.end())
        *same = done;  // later on the same stream: covers the earlier read
      else
        s.readers.push_back(done);
    }
  }
}

void host_op_wait(OpBlock& op) {
  for (VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) {
    GpuVarState* s = state_of(*e->slot);
    if (!s) continue;
    EventList events;
    collect_events(*e->slot, e->write, events);
    for (const gpu::EventRef& ev : events) {
      // Work already done needs no wait (and counts as none: an inline op
      // run by a GPU worker that made it ready finds its inputs done). A
      // failed query falls through to the wait, which reports the failure.
      bool done = false;
      try {
        done = ev->done();
      } catch (...) {
      }
      if (!done) ev->host_wait();
    }
  }
}

bool host_op_would_wait(OpBlock& op) noexcept {
  for (VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) {
    if (!state_of(*e->slot)) continue;
    EventList events;
    try {
      collect_events(*e->slot, e->write, events);
      for (const gpu::EventRef& ev : events)
        if (!ev->done()) return true;
    } catch (...) {
      return true;
    }
  }
  return false;
}

void host_op_publish(OpBlock& op) {
  for (VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) {
    if (!e->write) continue;
    GpuVarState* s = state_of(*e->slot);
    if (!s) continue;
    std::lock_guard lock(s->lock);
    s->writer.reset();
    s->readers.clear();
  }
}

void collect_events(VarSlot& slot, bool write, EventList& out) {
  GpuVarState* s = state_of(slot);
  if (!s) return;
  std::lock_guard lock(s->lock);
  if (s->writer) out.push_back(s->writer);
  if (write) out.insert(out.end(), s->readers.begin(), s->readers.end());
}

void destroy_gpu_state_slow(VarSlot& slot) noexcept { delete slot.gpu.exchange(nullptr, std::memory_order_acq_rel); }

}  // namespace weft::detail
