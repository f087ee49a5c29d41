// Collectives across the processes of an MPI job: the fiber of one
// collective (docs/design/parallel-collectives.md, "Across processes").
//
// A collective is one hold op per process (mpi_backend.cpp): an async
// tensor op on the member's device that holds its tensor while the
// collective runs. Its body hands a Job to the communication thread, where
// one fiber runs it as straight-line code:
//
//   wait for the check gate     (fibers post fingerprints in sequence order)
//   send this rank's fingerprint to every peer, receive theirs, poll
//   compare: a mismatch or a failed input ends it on every rank, named
//   wait for the data gate      (MPI sees collectives in the same order everywhere)
//   post the non-blocking MPI collective and poll it with MPI_Test; or,
//   from 256 KiB, hand its blocking form to the communicator's blocking
//   lane (mpi_lane.h) and poll the ticket; without a lane (a rank without
//   MPI_THREAD_MULTIPLE, or WEFT_MPI_LANE=0), run Weft's ring for a large
//   allreduce
//   complete the hold op (the lane's thread does it after its call)
//
// Every MPI wait has the collective's deadline, which restarts when a gate
// opens. Only the communication thread and the lanes' threads call MPI
// (after MPI_Init_thread and the rank query at start-up).

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpi_group.h"

namespace weft::parallel::detail {
namespace {

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

int post_data(Job& job, MPI_Request* request) {
  MpiGroup& g = *job.group;
  const MPI_Comm comm = g.data;
  switch (job.kind) {
    case Kind::allreduce:
      return MPI_Iallreduce(MPI_IN_PLACE, job.out, job.count, job.type, mpi_op(job.op), comm, request);
    case Kind::broadcast:
      return MPI_Ibcast(g.rank == job.root ? const_cast<void*>(job.in) : job.out, job.count, job.type, job.root, comm,
                        request);
    case Kind::reduce:
      if (g.rank == job.root)
        return MPI_Ireduce(MPI_IN_PLACE, job.out, job.count, job.type, mpi_op(job.op), job.root, comm, request);
      return MPI_Ireduce(job.in, nullptr, job.count, job.type, mpi_op(job.op), job.root, comm, request);
    case Kind::reduce_scatter:
      return MPI_Ireduce_scatter(job.in, job.out, job.counts.data(), job.type, mpi_op(job.op), comm, request);
    case Kind::all_gather:
      return MPI_Iallgatherv(job.in, job.counts[static_cast<std::size_t>(g.rank)], job.type, job.out,
                             job.counts.data(), job.displs.data(), job.type, comm, request);
    case Kind::barrier: return MPI_Ibarrier(comm, request);
    case Kind::send:
    case Kind::recv: break;  // run_send, run_recv
  }
  return MPI_ERR_OTHER;
}

// After the data phase: the average is the sum scaled where it was written.
void finish_data(const Job& job) {
  if (job.op != ReduceOp::average || job.group->size == 1) return;
  std::int64_t n = 0;
  if (job.kind == Kind::allreduce) n = job.count;
  if (job.kind == Kind::reduce && job.group->rank == job.root) n = job.count;
  if (job.kind == Kind::reduce_scatter) n = job.counts[static_cast<std::size_t>(job.group->rank)];
  auto* p = static_cast<float*>(job.out);
  const float scale = 1.0f / static_cast<float>(job.group->size);
  for (std::int64_t i = 0; i < n; ++i) p[i] *= scale;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Exchanges fingerprints; returns false once the job has been completed
// (mismatch, failed input, timeout, MPI error).
bool check_fingerprints(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const int n = g.size;
  if (!wait_turn(job, thread, g.check_gate, job.mine.sequence)) return false;
  std::vector<Fingerprint> theirs(static_cast<std::size_t>(n));
  theirs[static_cast<std::size_t>(g.rank)] = job.mine;
  // What this rank sends lives on the heap: a send still pending when the
  // fiber gives up cannot be taken back, and its buffer is then left to MPI.
  auto mine = std::make_unique<Fingerprint>(job.mine);
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(n), MPI_REQUEST_NULL), sends = recvs;
  // Leaves no buffer of this fiber to MPI: a cancelled receive's wait
  // returns at once whatever the peers do (MPI 4.1, section 3.8.4); pending
  // sends are freed and keep their buffer. Returns the peers whose
  // fingerprint never came.
  auto cancel_pending = [&] {
    std::vector<int> missing;
    bool sending = false;
    for (int peer = 0; peer < n; ++peer) {
      MPI_Request& r = recvs[static_cast<std::size_t>(peer)];
      if (r != MPI_REQUEST_NULL) {
        missing.push_back(peer);
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
      MPI_Request& q = sends[static_cast<std::size_t>(peer)];
      if (q != MPI_REQUEST_NULL) {
        MPI_Request_free(&q);
        sending = true;
      }
    }
    if (sending) static_cast<void>(mine.release());
    return missing;
  };
  for (int peer = 0; peer < n; ++peer) {
    if (peer == g.rank) continue;
    const auto p = static_cast<std::size_t>(peer);
    int rc = MPI_Irecv(&theirs[p], sizeof(Fingerprint), MPI_BYTE, peer, 0, g.check, &recvs[p]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(mine.get(), sizeof(Fingerprint), MPI_BYTE, peer, 0, g.check, &sends[p]);
    if (rc != MPI_SUCCESS) {
      cancel_pending();
      g.check_gate.pass(job.mine.sequence);
      fail_broken(job, "sending its fingerprint to rank " + std::to_string(peer) + " failed: " + mpi_error_text(rc),
                  peer);
      return false;
    }
  }
  g.check_gate.pass(job.mine.sequence);
  // Every request is tested every round (so that, at the deadline, the ones
  // still open name exactly the ranks that never joined).
  int mpi_rc = MPI_SUCCESS;
  auto all_done = [&](std::vector<MPI_Request>& requests) {
    bool done = true;
    for (MPI_Request& r : requests) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      if (const int rc = MPI_Test(&r, &flag, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
        mpi_rc = rc;
        return true;
      }
      done = done && flag;
    }
    return done;
  };
  const CommThread::Wait waited = thread.poll_until(
      [&] {
        const bool received = all_done(recvs);
        return all_done(sends) && received;
      },
      job.deadline);
  if (mpi_rc != MPI_SUCCESS) {
    cancel_pending();
    fail_broken(job, "exchanging fingerprints failed: " + mpi_error_text(mpi_rc));
    return false;
  }
  if (waited != CommThread::Wait::done) {
    const std::vector<int> missing = cancel_pending();
    if (waited == CommThread::Wait::stopping) {
      fail_broken(job, "the process is exiting");
    } else if (missing.empty()) {
      fail_broken(job, "its fingerprint was not delivered to every peer within " + seconds_text(g.timeout));
    } else {
      fail_broken(job,
                  rank_list(missing) + " never joined within " + seconds_text(g.timeout) +
                      " (CommunicatorOptions::timeout, WEFT_COLLECTIVE_TIMEOUT)",
                  missing.front());
    }
    return false;
  }
  // Every rank compares every record with rank 0's, so every rank raises
  // the same message.
  std::vector<int> differ;
  for (int r = 1; r < n; ++r)
    if (!same_call(theirs[static_cast<std::size_t>(r)], theirs[0])) differ.push_back(r);
  if (!differ.empty()) {
    std::string why = "collectives differ across ranks: rank 0 called " + describe(theirs[0]);
    for (std::size_t i = 0; i < differ.size() && i < 8; ++i)
      why += "; rank " + std::to_string(differ[i]) + " called " + describe(theirs[static_cast<std::size_t>(differ[i])]);
    if (differ.size() > 8) why += "; and " + std::to_string(differ.size() - 8) + " more ranks";
    const int peer = g.rank == 0 ? differ.front() : 0;
    complete(job, comm_error(job, why, peer));
    return false;
  }
  for (int r = 0; r < n; ++r) {
    const Fingerprint& f = theirs[static_cast<std::size_t>(r)];
    if (!f.failed) continue;
    if (r == g.rank) complete(job, job.failed_input);  // the original error, on the rank that had it
    else complete(job, comm_error(job, "rank " + std::to_string(r) + "'s input failed: " + std::string(f.reason), r));
    return false;
  }
  return true;
}

// How a data phase ended.
struct Outcome {
  int rc = MPI_SUCCESS;
  CommThread::Wait waited = CommThread::Wait::done;
  bool posted = false;  // MPI was given the tensors' memory
  bool completed = false;  // the job is complete already (the blocking lane did it)
};

// A data phase that is one non-blocking MPI collective, polled.
Outcome mpi_collective(Job& job, CommThread& thread) {
  Outcome out;
  MPI_Request request = MPI_REQUEST_NULL;
  out.rc = post_data(job, &request);
  job.group->data_gate.pass(job.mine.sequence);  // the next may post behind it
  if (out.rc != MPI_SUCCESS) return out;
  out.posted = true;
  out.waited = thread.poll_until([&] { return test_all({&request}, out.rc); }, job.deadline);
  if (out.rc == MPI_SUCCESS && out.waited == CommThread::Wait::done) finish_data(job);
  return out;
}

// Allreduce of large buffers where the communicator has no blocking lane:
// Open MPI's non-blocking allreduce runs at about half the speed of its
// blocking one, so large ones run Weft's own chunked ring over non-blocking point-to-point messages (reduce-scatter,
// then all-gather; the local_collectives.cpp ring across processes). Each
// chunk travels in segments, reduced as each lands, so reduction overlaps
// the transfer of the next (1 MiB segments: on this machine smaller ones
// pay more rendezvous hand-shakes than they save). Rings hold the data gate
// until they end (their messages carry the step as tag, unique while one
// ring runs at a time).
constexpr std::int64_t kRingBytes = 256 * 1024;
constexpr std::int64_t kRingSegment = 1024 * 1024 / sizeof(float);

Outcome ring_allreduce(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const int n = g.size, r = g.rank, right = (r + 1) % n, left = (r + n - 1) % n;
  auto member = [n](int x) { return ((x % n) + n) % n; };
  float* buf = static_cast<float*>(job.out);
  Outcome out;
  out.posted = true;
  std::vector<MPI_Request> recvs, sends;
  auto wait = [&](MPI_Request& request) {
    out.waited = thread.poll_until([&] { return test_all({&request}, out.rc); }, job.deadline);
    return out.rc == MPI_SUCCESS && out.waited == CommThread::Wait::done;
  };
  // On failure: receives are cancelled (their wait returns at once, so the
  // scratch chunk is free again); sends cannot be taken back and are freed,
  // leaving the tensor to MPI (the caller abandons its memory).
  auto give_up = [&] {
    for (MPI_Request& q : recvs)
      if (q != MPI_REQUEST_NULL) {
        MPI_Cancel(&q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
      }
    for (MPI_Request& q : sends)
      if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
    return out;
  };
  for (int step = 0; step < 2 * (n - 1); ++step) {
    // Reduce-scatter steps send chunk r - s and add chunk r - s - 1 in;
    // all-gather steps send chunk r + 1 - s and take chunk r - s as is.
    const bool reducing = step < n - 1;
    const int s = reducing ? step : step - (n - 1);
    const Chunk send_chunk = chunk(job.count, n, reducing ? member(r - s) : member(r + 1 - s));
    const Chunk recv_chunk = chunk(job.count, n, reducing ? member(r - s - 1) : member(r - s));
    if (reducing && static_cast<std::int64_t>(g.scratch.size()) < recv_chunk.size())
      g.scratch.resize(static_cast<std::size_t>(recv_chunk.size()));
    float* landing = reducing ? g.scratch.data() : buf + recv_chunk.begin;
    recvs.clear();
    sends.clear();
    for (std::int64_t off = 0; off < recv_chunk.size(); off += kRingSegment) {
      recvs.push_back(MPI_REQUEST_NULL);
      const int len = static_cast<int>(std::min(kRingSegment, recv_chunk.size() - off));
      if ((out.rc = MPI_Irecv(landing + off, len, MPI_FLOAT, left, step, g.data, &recvs.back())) != MPI_SUCCESS)
        return give_up();
    }
    for (std::int64_t off = 0; off < send_chunk.size(); off += kRingSegment) {
      sends.push_back(MPI_REQUEST_NULL);
      const int len = static_cast<int>(std::min(kRingSegment, send_chunk.size() - off));
      if ((out.rc = MPI_Isend(buf + send_chunk.begin + off, len, MPI_FLOAT, right, step, g.data, &sends.back())) !=
          MPI_SUCCESS)
        return give_up();
    }
    for (std::size_t k = 0; k < recvs.size(); ++k) {
      if (!wait(recvs[k])) return give_up();
      if (!reducing) continue;
      const std::int64_t off = static_cast<std::int64_t>(k) * kRingSegment;
      const std::int64_t len = std::min(kRingSegment, recv_chunk.size() - off);
      float* dst = buf + recv_chunk.begin + off;
      const float* src = landing + off;
      if (job.op == ReduceOp::max) {
        for (std::int64_t i = 0; i < len; ++i) dst[i] = std::max(dst[i], src[i]);
      } else {
        for (std::int64_t i = 0; i < len; ++i) dst[i] += src[i];
      }
    }
    for (MPI_Request& q : sends)
      if (!wait(q)) return give_up();
    if (reducing && step == n - 2 && job.op == ReduceOp::average) {
      // This rank's chunk is complete: scaled once here, it travels scaled.
      float* p = buf + recv_chunk.begin;
      const float scale = 1.0f / static_cast<float>(n);
      for (std::int64_t i = 0; i < recv_chunk.size(); ++i) p[i] *= scale;
    }
  }
  return out;
}

// Data phases from this size on run on the blocking lane (mpi_lane.h),
// where the communicator has one: below it, the hand-over to another thread
// costs more than the non-blocking call loses.
constexpr std::int64_t kLaneBytes = 256 * 1024;

bool on_lane(const Job& job) {
  const MpiGroup& g = *job.group;
  if (!g.lane || g.size == 1 || job.kind == Kind::barrier) return false;
  int element = 0;
  MPI_Type_size(job.type, &element);
  return static_cast<std::int64_t>(job.count) * element >= kLaneBytes;
}

// post_data's call in its blocking form, on the lane's communicator. It
// owns copies of what it needs: after a timeout it may outlive the job.
UniqueFunction<int()> blocking_call(const Job& job) {
  const MpiGroup& g = *job.group;
  return [kind = job.kind, in = job.in, out = job.out, count = job.count, type = job.type, op = mpi_op(job.op),
          root = job.root, rank = g.rank, comm = g.blocking, counts = job.counts, displs = job.displs]() mutable {
    switch (kind) {
      case Kind::allreduce: return MPI_Allreduce(MPI_IN_PLACE, out, count, type, op, comm);
      case Kind::broadcast: return MPI_Bcast(rank == root ? const_cast<void*>(in) : out, count, type, root, comm);
      case Kind::reduce:
        if (rank == root) return MPI_Reduce(MPI_IN_PLACE, out, count, type, op, root, comm);
        return MPI_Reduce(in, nullptr, count, type, op, root, comm);
      case Kind::reduce_scatter: return MPI_Reduce_scatter(in, out, counts.data(), type, op, comm);
      case Kind::all_gather:
        return MPI_Allgatherv(in, counts[static_cast<std::size_t>(rank)], type, out, counts.data(), displs.data(), type,
                              comm);
      case Kind::barrier:
      case Kind::send:
      case Kind::recv: break;
    }
    return MPI_ERR_OTHER;
  };
}

// A data phase on the blocking lane: handed over in sequence order (the
// data gate passes once it is queued), then polled with the deadline. On
// success the lane's thread finishes and completes the job itself, one
// thread hand-off less before the waiter learns of it.
Outcome lane_collective(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const std::shared_ptr<LaneTicket> ticket = g.lane->submit(blocking_call(job), [&job] {
    finish_data(job);
    complete(job);
  });
  g.data_gate.pass(job.mine.sequence);
  Outcome out;
  out.posted = true;
  auto ended = [&] { return ticket->state.load(std::memory_order_acquire) == LaneTicket::done; };
  out.waited = thread.poll_until(ended, job.deadline);
  if (out.waited != CommThread::Wait::done) {
    int expected = LaneTicket::pending;
    if (ticket->state.compare_exchange_strong(expected, LaneTicket::abandoned, std::memory_order_acq_rel))
      return out;  // the call stays in MPI; the caller fails the job
    // The lane won: it is finishing the job this very moment.
    while (!ended()) std::this_thread::yield();
    out.waited = CommThread::Wait::done;
  }
  out.rc = ticket->rc;
  out.completed = out.rc == MPI_SUCCESS;
  return out;
}

}  // namespace

// The fiber of one collective.
void run_collective(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const std::uint64_t seq = job.mine.sequence;
  if (!g.broken.empty()) {
    complete(job, comm_error(job, "the communicator is broken: " + g.broken));
  } else if (g.fingerprints ? check_fingerprints(job, thread) : true) {
    if (job.failed_input) {
      // Without fingerprints the peers cannot be told: they fail at their
      // timeout, and this rank stops using the communicator too.
      if (g.broken.empty()) g.broken = job.label + ": this rank's input failed (fingerprints are off)";
      complete(job, job.failed_input);
    } else if (job.check_only) {
      complete(job);
    } else if (wait_turn(job, thread, g.data_gate, seq)) {
      const bool ring = job.kind == Kind::allreduce && g.size > 1 &&
                        static_cast<std::int64_t>(job.count) * static_cast<std::int64_t>(sizeof(float)) >= kRingBytes;
      const Outcome out = on_lane(job) ? lane_collective(job, thread)
                          : ring         ? ring_allreduce(job, thread)
                                         : mpi_collective(job, thread);
      if (out.rc != MPI_SUCCESS || out.waited != CommThread::Wait::done) {
        if (out.posted) abandon_memory(job);
        if (out.rc != MPI_SUCCESS) {
          fail_broken(job, "MPI failed: " + mpi_error_text(out.rc));
        } else if (out.waited == CommThread::Wait::stopping) {
          fail_broken(job, "the process is exiting");
        } else {
          fail_broken(job, std::string("the data phase did not complete within ") + seconds_text(g.timeout) +
                               (g.fingerprints ? " although every rank joined"
                                               : " (fingerprints are off, WEFT_COLLECTIVE_CHECK=0: the ranks that "
                                                 "never joined are unknown)"));
        }
      } else if (!out.completed) {
        complete(job);
      }
    }
  }
  // Whatever happened, later collectives must not wait for this one.
  g.check_gate.pass(seq);
  g.data_gate.pass(seq);
}

}  // namespace weft::parallel::detail
