// The memory behind one or more Tensors (reshape shares it) and the engine Var
// that orders every op on it.
#pragma once

#include <cstddef>
#include <memory>
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
    if (!block && bytes) block = allocator->allocate(bytes, stream);
  }
  void* data() const noexcept { return block.ptr; }

  Engine* engine;
  Device device;
  DType dtype;
  std::size_t bytes;
  Allocator* allocator;
  Var var;
  Block block;
  std::string name;  // for messages (Tensor::set_name)
  // True until the op that creates the tensor is pushed (frontend only): that
  // op allocates; later writers work in place and find the memory there.
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
