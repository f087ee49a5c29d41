// A bounded multi-producer multi-consumer FIFO of ready ops (Vyukov's
// sequence-numbered ring). Why not only tbb::concurrent_queue: every op of
// every device passes through here, and the ring costs one CAS for the
// producer and one for the consumer on a handful of cache lines, where the
// oneTBB queue touched several more lines per op and was the top entry of the
// engine's profile (docs/design/engine-invariants.md, "Workers"). The pool
// falls back to a tbb::concurrent_queue when the ring is full.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace weft::detail {

template <class T>
class ReadyRing {
 public:
  explicit ReadyRing(std::size_t capacity_pow2) : cells_(new Cell[capacity_pow2]), mask_(capacity_pow2 - 1) {
    for (std::size_t i = 0; i < capacity_pow2; ++i) cells_[i].sequence.store(i, std::memory_order_relaxed);
  }

  bool try_push(T* item) noexcept {
    std::size_t pos = tail_.load(std::memory_order_relaxed);
    Cell* cell;
    while (true) {
      cell = &cells_[pos & mask_];
      std::size_t seq = cell->sequence.load(std::memory_order_acquire);
      auto diff = static_cast<std::intptr_t>(seq) - static_cast<std::intptr_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;  // full
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
    cell->item = item;
    cell->sequence.store(pos + 1, std::memory_order_release);
    return true;
  }

  T* try_pop() noexcept {
    std::size_t pos = head_.load(std::memory_order_relaxed);
    Cell* cell;
    while (true) {
      cell = &cells_[pos & mask_];
      std::size_t seq = cell->sequence.load(std::memory_order_acquire);
      auto diff = static_cast<std::intptr_t>(seq) - static_cast<std::intptr_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return nullptr;  // empty (or the next push is still being written)
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
    T* item = cell->item;
    cell->sequence.store(pos + mask_ + 1, std::memory_order_release);
    return item;
  }

  // A hint under concurrency: exact only when nobody pushes or pops.
  bool empty() const noexcept {
    return head_.load(std::memory_order_seq_cst) >= tail_.load(std::memory_order_seq_cst);
  }

 private:
  struct Cell {
    std::atomic<std::size_t> sequence;
    T* item;
  };
  std::unique_ptr<Cell[]> cells_;
  const std::size_t mask_;
  alignas(64) std::atomic<std::size_t> tail_{0};
  alignas(64) std::atomic<std::size_t> head_{0};
};

}  // namespace weft::detail
