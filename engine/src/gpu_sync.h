// Stream-ordered completion: what each variable remembers about GPU work.
//
// A GPU op completes as soon as its body has enqueued its kernels: the engine
// records one event on the op's stream and stores it on the variables the op
// touched (the writer's event; one reader event per stream). The next op that
// the dependency queues grant then orders itself after that work without
// blocking a worker:
//   * a GPU op makes its stream wait (a stream wait, never a host wait) for the last
//     writer's event, and, when it writes, for the readers' events of other
//     streams; nothing at all when they ran on its own stream;
//   * a CPU op (or a wait_to_read/wait_to_write) waits for those events on
//     the host.
// The state is only read and written by ops holding a granted access to the
// variable (so writers are alone), under its own small lock because readers
// on several streams update it together. See docs/design/engine-invariants.md.
#pragma once

#include <vector>

#include "spin_lock.h"
#include "var_table.h"
#include "weft/gpu_streams.h"

namespace weft::detail {

struct OpBlock;

struct GpuVarState {
  SpinLock lock;
  gpu::EventRef writer;                 // last GPU write; empty after a CPU write
  std::vector<gpu::EventRef> readers;   // one per stream, since the last write
};

// Events a barrier must wait for, captured when the barrier is granted.
using EventList = std::vector<gpu::EventRef>;

// Before a GPU op's body: make `stream` wait for what the op depends on.
void gpu_op_wait(OpBlock& op, gpu::Stream* stream);
// After a GPU op's body: record its event and publish it on its variables.
void gpu_op_publish(OpBlock& op, int device, gpu::Stream* stream);
// Before a CPU op's body: wait on the host for GPU work it depends on. A
// CPU write makes the variable's GPU history irrelevant: it clears it.
void host_op_wait(OpBlock& op);
// Whether host_op_wait would block now: GPU work the op depends on is
// unfinished (or failed, which host_op_wait reports).
bool host_op_would_wait(OpBlock& op) noexcept;
void host_op_publish(OpBlock& op);
// A barrier on `slot`: the events to wait for on the host (writes: readers too).
void collect_events(VarSlot& slot, bool write, EventList& out);
void destroy_gpu_state_slow(VarSlot& slot) noexcept;
// Inline: recycling a variable no GPU op touched (every one on a CPU-only
// engine) costs one load.
inline void destroy_gpu_state(VarSlot& slot) noexcept {
  if (slot.gpu.load(std::memory_order_acquire) != nullptr) destroy_gpu_state_slow(slot);
}

}  // namespace weft::detail
