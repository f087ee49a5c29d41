// The blocking lane (mpi_lane.h).
#include "collectives/mpi/mpi_lane.h"

#include <mpi.h>

#include <chrono>
#include <utility>

#include "collectives/comm_thread.h"

namespace weft::parallel::detail {
namespace {
// After a call, the thread looks for the next this long before sleeping:
// gradient buckets arrive back to back, and a futex wake-up costs more.
constexpr auto kSpin = std::chrono::microseconds(50);
std::atomic<int> g_calls_in_mpi{0};
}  // namespace

// Shared by the lane and its thread, so that a thread left inside MPI by a
// lane being destroyed still owns everything it touches.
struct BlockingLane::State {
  std::mutex mutex;
  std::condition_variable wake;
  struct Item {
    UniqueFunction<int()> call;
    std::shared_ptr<LaneTicket> ticket;
  };
  std::deque<Item> queue;          // guarded by mutex
  bool stop = false;               // guarded by mutex
  bool in_call = false;            // guarded by mutex
  std::atomic<int> queued{0};      // queue.size(), for the spin
  CommThread* notify = nullptr;

  void run() {
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + kSpin;
      while (queued.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      Item item;
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stopping, nothing left
        item = std::move(queue.front());
        queue.pop_front();
        queued.fetch_sub(1, std::memory_order_relaxed);
        // Abandoned before it started (its fiber gave up: its deadline
        // passed behind a call stuck in MPI, or the process is exiting):
        // never entered, so no thread is left in MPI for it, and
        // MPI_Finalize is not raced by a late call.
        if (item.ticket->state.load(std::memory_order_acquire) == LaneTicket::abandoned) continue;
        in_call = true;
      }
      g_calls_in_mpi.fetch_add(1);
      const int rc = item.call();
      item.call = {};
      g_calls_in_mpi.fetch_sub(1);
      {
        std::lock_guard lock(mutex);
        in_call = false;
      }
      LaneTicket& t = *item.ticket;
      t.rc = rc;
      int expected = LaneTicket::pending;
      if (t.state.compare_exchange_strong(expected, LaneTicket::finishing, std::memory_order_acq_rel)) {
        const bool completed = rc == MPI_SUCCESS && t.on_success && t.on_success();
        t.on_success = {};
        t.state.store(LaneTicket::done, std::memory_order_release);
        // A fiber with work left is woken at once. One whose job is complete
        // only cleans up: while calls follow back to back it waits (the
        // futex wake-up would delay the next call), and once the lane runs
        // dry a thread sleeping quietly is woken to end it.
        if (!completed) {
          notify->wake();
        } else if (queued.load(std::memory_order_acquire) == 0) {
          notify->wake_if_quiet();
        }
      }  // else abandoned: its fiber is gone
    }
  }
};

BlockingLane::BlockingLane(CommThread& notify) : state_(std::make_shared<State>()) {
  state_->notify = &notify;
  thread_ = std::thread([state = state_] { state->run(); });
}

BlockingLane::~BlockingLane() {
  bool in_call = false;
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
    in_call = state_->in_call;
    // Calls never started are dropped: their fibers have given up (the
    // communicator is destroyed only once no job refers to it).
    state_->queue.clear();
    state_->queued.store(0, std::memory_order_relaxed);
  }
  state_->wake.notify_one();
  if (in_call) {
    thread_.detach();  // inside MPI for good (its fiber gave up): it keeps State alive
  } else {
    thread_.join();
  }
}

std::shared_ptr<LaneTicket> BlockingLane::submit(UniqueFunction<int()> call, UniqueFunction<bool()> on_success) {
  auto ticket = std::make_shared<LaneTicket>();
  ticket->on_success = std::move(on_success);
  {
    std::lock_guard lock(state_->mutex);
    state_->queue.push_back({std::move(call), ticket});
    state_->queued.fetch_add(1, std::memory_order_release);
  }
  state_->wake.notify_one();
  return ticket;
}

int BlockingLane::calls_in_mpi() noexcept { return g_calls_in_mpi.load(); }

}  // namespace weft::parallel::detail
