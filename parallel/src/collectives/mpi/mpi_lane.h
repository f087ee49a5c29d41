// The blocking lane of an MPI communicator (internal to parallel/): one
// thread that makes blocking MPI collective calls, one at a time, in the
// order the communicator's fibers hand them over
// (docs/design/parallel-collectives.md, "The blocking lane").
//
// Why: at large sizes Open MPI's blocking collectives beat both its
// non-blocking ones (libnbc) and Weft's ring over point-to-point messages
// (docs/performance.md), and a fiber
// cannot make a blocking call without stopping every other fiber of the
// communication thread. So once every rank's fingerprint matched, the fiber
// hands the call to the lane, passes the data gate, and polls the ticket
// with the collective's deadline: a peer that never finishes is still a
// named error, never a silent hang. Such a call cannot be taken back: the
// lane's thread then stays inside MPI, the communicator is broken, and the
// tensors' memory is kept (abandon_memory).
//
// Calls run on a communicator of their own (MpiGroup::blocking), so their
// order is independent of the non-blocking collectives on MpiGroup::data;
// the lane runs them in hand-over order, which the data gate makes the
// collectives' sequence order on every rank. Needs MPI_THREAD_MULTIPLE on
// every rank (checked when the communicator is created).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "weft/unique_function.h"

namespace weft::parallel::detail {

class CommThread;

// What a fiber holds while its call runs on the lane. The lane's thread
// runs `on_success` itself (completing the collective without a hand-back
// to the communication thread) unless the fiber abandoned the ticket
// first; exactly one of the two wins the state's compare-exchange.
// `on_success` returns true when it completed the collective: the fiber
// then has nothing urgent left, and the lane wakes the thread only once no
// call is queued, and only if it sleeps quietly (CommThread::wait_woken).
struct LaneTicket {
  enum State : int { pending, finishing, done, abandoned };
  std::atomic<int> state{pending};
  int rc = 0;  // MPI's return code; read once state is done
  UniqueFunction<bool()> on_success;
};

class BlockingLane {
 public:
  // `notify` is woken whenever a call ends and its fiber has work left, so
  // that the fiber sees the end at once even when the thread was sleeping
  // between polls; and when the lane runs out of calls while the thread
  // sleeps quietly (its fibers all wait for calls of lanes).
  explicit BlockingLane(CommThread& notify);
  // Joins the thread when no call is in MPI; otherwise leaves it there
  // (detached; it owns what it touches).
  ~BlockingLane();
  BlockingLane(const BlockingLane&) = delete;
  BlockingLane& operator=(const BlockingLane&) = delete;

  // Queues `call` (a blocking MPI call returning MPI's code; it must own or
  // outlive everything it touches); `on_success` runs on the lane's thread
  // after a call that returned MPI_SUCCESS, while the ticket is pending.
  // Fibers of the communication thread.
  std::shared_ptr<LaneTicket> submit(UniqueFunction<int()> call, UniqueFunction<bool()> on_success);

  // Calls of any lane of the process inside MPI now (MpiProcess::at_exit:
  // MPI is not finalized under a call that can never return).
  static int calls_in_mpi() noexcept;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace weft::parallel::detail
