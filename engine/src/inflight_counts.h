// Ops in flight, counted so that neither the frontend nor the workers bounce
// one shared counter per op, and per push epoch so that wait_all can wait for
// "everything pushed before" while other threads keep pushing.
//
// pushed[e] counts ops pushed in epoch e (mod 2); completions are counted by
// each worker on its own cache line (plus one line shared by other threads).
// wait_all closes the current epoch (pushes go to the other one from then on)
// and waits until the closed epoch's completions catch up with its pushes.
// Ops pushed from inside an op join their parent's epoch: a wait_all waits for
// follow-ups its ops push. Reading completions before pushes makes a pending
// count an overestimate, never an underestimate.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace weft::detail {

class InflightCounts {
 public:
  // Both epochs' completion counts of one thread, on one cache line.
  struct alignas(64) Completions {
    std::atomic<std::uint64_t> done[2]{};
  };

  explicit InflightCounts(std::size_t worker_slots)
      : slots_(worker_slots + 1), completed_(std::make_unique<Completions[]>(slots_)) {}

  // A worker slot's counters; the last slot is shared by all other threads.
  Completions* completions_of(std::size_t slot) noexcept { return &completed_[slot]; }
  Completions* shared_completions() noexcept { return completions_of(slots_ - 1); }

  unsigned current_epoch() const noexcept { return epoch_.load(std::memory_order_acquire) & 1u; }
  // Closes the current epoch and returns it.
  unsigned close_epoch() noexcept { return epoch_.fetch_add(1, std::memory_order_acq_rel) & 1u; }

  void add_pushed(unsigned epoch) noexcept { pushed_[epoch].value.fetch_add(1, std::memory_order_seq_cst); }
  static void add_completed(Completions* counters, unsigned epoch) noexcept {
    counters->done[epoch].fetch_add(1, std::memory_order_seq_cst);
  }

  std::uint64_t pending(unsigned epoch) const noexcept {
    std::uint64_t done = completed(epoch);
    return pushed_[epoch].value.load(std::memory_order_seq_cst) - done;
  }
  std::uint64_t total() const noexcept { return pending(0) + pending(1); }
  std::uint64_t completed_total() const noexcept { return completed(0) + completed(1); }
  std::uint64_t pushed_total() const noexcept {
    return pushed_[0].value.load(std::memory_order_relaxed) + pushed_[1].value.load(std::memory_order_relaxed);
  }

 private:
  struct alignas(64) Counter {
    std::atomic<std::uint64_t> value{0};
  };
  std::uint64_t completed(unsigned epoch) const noexcept {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < slots_; ++i) sum += completed_[i].done[epoch].load(std::memory_order_seq_cst);
    return sum;
  }

  const std::size_t slots_;
  std::unique_ptr<Completions[]> completed_;
  Counter pushed_[2];
  alignas(64) std::atomic<std::uint32_t> epoch_{0};
};

}  // namespace weft::detail
