#include "comm_thread.h"

#include <algorithm>
#include <memory>
#include <utility>

#include <boost/fiber/fiber.hpp>
#include <boost/fiber/fixedsize_stack.hpp>
#include <boost/fiber/operations.hpp>

namespace weft::parallel::detail {
namespace {
// MPI's progress engine runs on a fiber's stack inside MPI_Test.
constexpr std::size_t kFiberStack = 256 * 1024;
// Rounds without progress spin this long before the thread starts sleeping.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kMaxSleep = std::chrono::microseconds(500);
}  // namespace

CommThread::CommThread() : thread_([this] { loop(); }) {}

CommThread::~CommThread() { stop(); }

void CommThread::spawn(UniqueFunction<void()> body) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(body));
  }
  wake_.notify_one();
}

void CommThread::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void CommThread::yield() { boost::this_fiber::yield(); }

void CommThread::loop() {
  std::uint64_t seen = 0;
  Clock::time_point idle_since = Clock::now();
  for (;;) {
    std::deque<UniqueFunction<void()>> batch;
    {
      std::unique_lock lock(mutex_);
      auto woken = [&] { return stop_ || !queue_.empty(); };
      if (live_ == 0) {
        wake_.wait(lock, woken);
      } else {
        // Nothing progressed for a while: sleep a fraction of the idle time
        // (a peer is late; waking often only burns the core it needs).
        const auto idle = Clock::now() - idle_since;
        if (idle > kSpin)
          wake_.wait_for(lock, std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(idle / 16),
                                          std::chrono::microseconds(5), kMaxSleep),
                         woken);
      }
      if (stop_) stopping_ = true;
      if (stop_ && queue_.empty() && live_ == 0) return;
      batch.swap(queue_);
    }
    for (auto& body : batch) {
      ++live_;
      boost::fibers::fiber(std::allocator_arg, boost::fibers::fixedsize_stack(kFiberStack),
                           [this, body = std::move(body)]() mutable {
                             body();
                             body = {};  // what it captured goes on this fiber, not later
                             --live_;
                             ++progress_;
                           })
          .detach();
    }
    yield();  // every ready fiber runs once
    if (!batch.empty() || progress_ != seen) {
      seen = progress_;
      idle_since = Clock::now();
    }
  }
}

}  // namespace weft::parallel::detail
