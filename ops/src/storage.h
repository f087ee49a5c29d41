// The memory behind one or more Tensors (reshape shares it) and the engine Var
// that orders every op on it.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "weft/allocator.h"
#include "weft/dtype.h"
#include "weft/engine.h"

namespace weft::detail {

struct Storage {
  Storage(Engine& e, Device d, DType t, std::size_t n, std::string_view name)
      : engine(&e), device(d), dtype(t), bytes(n), allocator(&e.allocator(d)), var(e.new_var(name)) {}
  // Runs when the last Tensor and the last op closure holding it are gone:
  // every op on it has completed, so the memory may go back to the cache
  // (the allocator waits for streams that still use it).
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Allocates on the op's stream; only the op that creates the tensor calls
  // it, holding the write access.
  void materialize(gpu::Stream* stream) {
    if (block || !bytes) return;
    const MemoryRole as = role.load(std::memory_order_acquire);
    block = allocator->allocate(bytes, stream, as);
    allocated.store(true, std::memory_order_release);
    // A set_role from the frontend meanwhile may have found no block yet.
    if (const MemoryRole now = role.load(std::memory_order_acquire); now != as) allocator->set_role(block, now);
  }
  // For ops that read a tensor no op has written (Tensor::empty): the
  // first of them to run allocates it (readers may run at once: locked).
  void materialize_for_read(gpu::Stream* stream) {
    std::lock_guard lock(read_alloc_mu);
    materialize(stream);
  }
  // Any thread: the role the memory is counted under (before or after it
  // is allocated).
  void set_role(MemoryRole r) {
    role.store(r, std::memory_order_release);
    if (allocated.load(std::memory_order_acquire)) allocator->set_role(block, r);
  }
  void* data() const noexcept { return block.ptr; }

  Engine* engine;
  Device device;
  DType dtype;
  std::size_t bytes;
  Allocator* allocator;
  Var var;
  Block block;  // written once, by materialize, before `allocated`
  std::atomic<bool> allocated{false};
  std::mutex read_alloc_mu;
  std::atomic<MemoryRole> role{MemoryRole::activations};
  std::string name;  // for messages (Tensor::set_name)
  // True until the op that creates the tensor is pushed (frontend only): that
  // op allocates; later writers work in place and find the memory there.
  // Ops that read it before (pushed while it is still true: uninitialized
  // memory, Tensor::empty) allocate it if they run first.
  bool creator_pending = true;
  // Under the simulator's modeled mode (weft/gpu_sim.h): which op's modeled
  // kernel should have produced the values ("'matmul' on gpu(0)"), when the
  // memory holds none; null when it holds real values. Set by the ops that
  // write the storage, read by the ops and host reads after them (the
  // engine orders both): launch.h's track_values.
  std::shared_ptr<const std::string> no_values;
};

using StoragePtr = std::shared_ptr<Storage>;

// Where host ops on this memory run: cpu_pinned memory is worked on by cpu(0).
inline Device exec_device(Device memory) {
  return memory.kind() == DeviceKind::cpu_pinned ? Device::cpu(0) : memory;
}

}  // namespace weft::detail
