// Per-device caching allocators.
//
// Freed blocks stay cached by size class and are handed out again without a
// system call. GPU memory is stream-aware, as in PyTorch's caching allocator:
// a block belongs to the stream it was allocated on, and work on that stream
// may reuse it as soon as it is freed (stream order keeps the old work first);
// if other streams used it (record_use), it is reused only after events
// recorded on those streams at free time have completed. Host blocks that GPU
// copy streams touched follow the same rule. Out of memory is a weft::OutOfMemory
// naming the device, the request and the allocator's state, after the cache
// has been released and the allocation retried.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "weft/device.h"
#include "weft/gpu.h"  // gpu::Stream

namespace weft {

// What a block holds, for the accounting by role (MemoryStats, the
// profiler's memory track). The layer that knows sets it: nn's parameters
// and gradients, the optimizers' state, parallel/'s communication buffers
// (flat buckets in flight); everything else (ops' outputs: activations,
// their gradients and other temporaries) counts as activations.
enum class MemoryRole : std::uint8_t { activations, parameters, gradients, optimizer_state, communication };
inline constexpr std::size_t kMemoryRoles = 5;
std::string_view to_string(MemoryRole role) noexcept;  // "activations", ..., "optimizer_state", "communication"
using MemoryByRole = std::array<std::size_t, kMemoryRoles>;  // indexed by MemoryRole

struct MemoryStats {
  std::size_t in_use = 0;       // bytes handed out and not freed (rounded to the size class)
  std::size_t peak_in_use = 0;  // high-water mark of in_use
  std::size_t reserved = 0;     // bytes obtained from the system (in use + cached)
  std::uint64_t allocations = 0;
  std::uint64_t cache_hits = 0;  // allocations served from the cache
  MemoryByRole in_use_by_role{};  // in_use split by role
  MemoryByRole peak_by_role{};    // the split when in_use last reached peak_in_use
};

namespace detail {
struct BlockRecord;
}

// A block of device memory: ptr is valid until free.
struct Block {
  void* ptr = nullptr;
  std::size_t bytes = 0;  // as requested
  detail::BlockRecord* record = nullptr;
  explicit operator bool() const noexcept { return ptr != nullptr; }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Memory usable by work ordered after this call on `stream` (nullptr: the
  // host, or the default stream), counted under `role`. bytes == 0 gives an
  // empty block.
  virtual Block allocate(std::size_t bytes, gpu::Stream* stream = nullptr,
                         MemoryRole role = MemoryRole::activations) = 0;
  // Counts the block under `role` from now on.
  virtual void set_role(const Block& block, MemoryRole role) noexcept = 0;
  // `stream` (other than the allocating one) reads or writes the block.
  virtual void record_use(const Block& block, gpu::Stream* stream) = 0;
  virtual void free(Block block) noexcept = 0;
  // Returns cached blocks to the system (blocks still in use on a stream are kept).
  virtual void release_cached() noexcept = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() noexcept = 0;
  virtual Device device() const noexcept = 0;
  // "pinned" / "pageable (no GPU: pinned memory unavailable)" / "device"
  virtual std::string memory_kind() const = 0;
  // Called with the bytes in use (in all and by role) after every
  // allocation, free and change of role, under the allocator's lock (keep
  // it short; it must not allocate from this allocator). The profiler's
  // memory counters come from here. Exceptions it throws are dropped.
  using UsageObserver = std::function<void(Device device, std::size_t in_use, const MemoryByRole& by_role)>;
  virtual void set_observer(UsageObserver observer) = 0;
};

// cpu(i): 64-byte aligned pageable memory. cpu_pinned(i): page-locked memory
// from the GPU backend (cudaHostAlloc; host memory on simulated GPUs), or
// aligned pageable memory where no GPU answers (the memory_kind says so).
// gpu(i): the device's memory (cudaMalloc, or the simulated device's
// capacity). Throws weft::InvalidArgument for a device that does not exist.
std::unique_ptr<Allocator> make_caching_allocator(Device device);

}  // namespace weft
