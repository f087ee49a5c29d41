// Collectives across the processes of an MPI job: the fibers of one
// communicator's collectives (docs/design/parallel-collectives.md, "Across
// processes").
//
// A collective is one hold op per process (mpi_transport.cpp): an async
// tensor op on the member's device that holds its tensor while the
// collective runs. With fingerprints, its push hands the fingerprint to the
// group's record fiber, which sends it to every peer at once, receives
// theirs and compares them while the tensors' producers still run. When
// the hold op runs, the collective's own fiber runs the rest as
// straight-line code:
//
//   wait for the record fiber's verdict (a mismatch or a missing rank ends
//   it on every rank, named, without a data phase)
//   wait for the data gate      (MPI sees collectives in the same order everywhere)
//   send this rank's status (input valid, or failed and why) to every peer
//   and post the receives of theirs
//   post the non-blocking MPI collective and poll it with MPI_Test; or,
//   from 256 KiB, hand its blocking form to the communicator's blocking
//   lane (mpi_lane.h) and poll the ticket; without a lane (a rank without
//   MPI_THREAD_MULTIPLE, or WEFT_MPI_LANE=0), run Weft's ring for a large
//   allreduce. A rank whose input failed takes part with zeros.
//   once every peer's status is in: complete the hold op, with the first
//   failed input's error if any (the lane's thread does it after its call
//   when the statuses are in)
//
// No rank waits for its peers to reach a collective before entering its
// data phase: a rank whose previous call ended early starts its part of
// the next at once (docs/design/parallel-collectives.md, "What the check
// costs").
//
// Every MPI wait has the collective's deadline, which restarts when its
// turn comes. Only the communication thread and the lanes' threads call MPI
// (after MPI_Init_thread and the rank query at start-up).
//
// Nothing here throws: a fiber has no caller to throw to. An MPI call's
// code is compared with MPI_SUCCESS where it was made and passed on, and a
// failure fails the collective (fail_check, fail_broken) with
// WEFT_MPI_FAILURE's message (weft/checked_call.h), naming the call.

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/mpi/mpi_group.h"

namespace weft::parallel::detail {
namespace {

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

// An all_gather's send buffer: MPI_IN_PLACE when the input is the rank's
// own chunk of the output (MPI forbids aliased buffers otherwise).
const void* gather_source(const void* in, void* out, MPI_Datatype type, const std::vector<int>& displs, int rank) {
  int element = 0;
  MPI_Type_size(type, &element);
  const auto* own = static_cast<const unsigned char*>(out) +
                    static_cast<std::ptrdiff_t>(displs[static_cast<std::size_t>(rank)]) * element;
  return in == own ? MPI_IN_PLACE : in;
}

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
      return MPI_Iallgatherv(gather_source(job.in, job.out, job.type, job.displs, g.rank),
                             job.counts[static_cast<std::size_t>(g.rank)], job.type, job.out, job.counts.data(),
                             job.displs.data(), job.type, comm, request);
    case Kind::barrier: return MPI_Ibarrier(comm, request);
    case Kind::send:
    case Kind::recv: break;  // run_send, run_recv
  }
  return MPI_ERR_OTHER;
}

// The MPI call of post_data (non-blocking) or of blocking_call, by name.
const char* data_call(Kind kind, bool blocking) {
  switch (kind) {
    case Kind::allreduce: return blocking ? "MPI_Allreduce" : "MPI_Iallreduce";
    case Kind::broadcast: return blocking ? "MPI_Bcast" : "MPI_Ibcast";
    case Kind::reduce: return blocking ? "MPI_Reduce" : "MPI_Ireduce";
    case Kind::reduce_scatter: return blocking ? "MPI_Reduce_scatter" : "MPI_Ireduce_scatter";
    case Kind::all_gather: return blocking ? "MPI_Allgatherv" : "MPI_Iallgatherv";
    case Kind::barrier: return blocking ? "MPI_Barrier" : "MPI_Ibarrier";
    case Kind::send:
    case Kind::recv: break;
  }
  return "MPI";
}

// After the data phase: the average is the sum scaled where it was written;
// a half-precision result is rounded into its tensor.
void finish_data(Job& job) {
  if (job.op == ReduceOp::average && job.group->size > 1) {
    std::int64_t n = 0;
    if (job.kind == Kind::allreduce) n = job.count;
    if (job.kind == Kind::reduce && job.group->rank == job.root) n = job.count;
    if (job.kind == Kind::reduce_scatter) n = job.counts[static_cast<std::size_t>(job.group->rank)];
    auto* p = static_cast<float*>(job.out);
    const float scale = 1.0f / static_cast<float>(job.group->size);
    for (std::int64_t i = 0; i < n; ++i) p[i] *= scale;
  }
  narrow_half(job);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Pending receives are cancelled (a cancelled receive's wait returns at
// once whatever the peers do, MPI 4.1 section 3.8.4) and pending sends
// freed: their buffer (`sent`) is then left to MPI. Returns the peers whose
// receive never completed.
template <class T>
std::vector<int> cancel_pending(std::vector<MPI_Request>& recvs, std::vector<MPI_Request>& sends,
                                std::unique_ptr<T>& sent) {
  std::vector<int> missing;
  bool sending = false;
  for (std::size_t peer = 0; peer < recvs.size(); ++peer) {
    MPI_Request& r = recvs[peer];
    if (r != MPI_REQUEST_NULL) {
      missing.push_back(static_cast<int>(peer));
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
  }
  for (MPI_Request& q : sends)
    if (q != MPI_REQUEST_NULL) {
      MPI_Request_free(&q);
      sending = true;
    }
  if (sending) static_cast<void>(sent.release());
  return missing;
}

// Tests every request once (so that, at a deadline, the ones still open
// name exactly the peers that never answered); true when all are done, or
// when a test failed (`rc` says which; it is never reset to success, so
// one error survives later calls).
bool test_each(std::vector<MPI_Request>& requests, int& rc) {
  if (rc != MPI_SUCCESS) return true;
  bool done = true;
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    int flag = 0;
    if (const int tested = MPI_Test(&r, &flag, MPI_STATUS_IGNORE); tested != MPI_SUCCESS) {
      rc = tested;
      return true;
    }
    done = done && flag;
  }
  return done;
}

// Fingerprints go on the check communicator with tag 0, statuses with tag
// 1, each kind sent and received in sequence order on every rank (the
// record fiber's counter, the data gate), so that the k-th of each from a peer meets this
// rank's k-th receive. Every rank sends a fingerprint for every collective;
// a status only for those whose fingerprints matched (on every rank alike),
// so status receives are posted with the status, under the data gate: one
// posted earlier, for a collective that then failed its check, would take
// the next collective's status.
constexpr int kRecordTag = 0, kStatusTag = 1;

// ---- the record fiber: fingerprints from push on ----------------------------------
//
// One fiber per group while fingerprints are pending: it takes them from
// the pushes (records_in, any order of sequence numbers), sends each to
// every peer and posts the receives of theirs, in sequence order and at
// most kRecordsAhead ahead, then waits for the oldest one's peers, compares,
// and leaves the verdict in the job. One fiber polls MPI for all of them,
// whatever the number of collectives pushed ahead.
constexpr std::size_t kRecordsAhead = 64;

// Fails one job's check; after an error MPI cannot recover from, the
// communicator is broken (the later ones fail at once).
void fail_check(Job& job, const std::string& why, int peer = CommunicationError::kNoPeer, bool breaks = true) {
  MpiGroup& g = *job.group;
  if (breaks) g.set_broken(job.label + ": " + why);
  flight_dump_soon(job.label + " on " + g.str() + ": " + why);
  job.check_error = comm_error(job, breaks ? why + "; the communicator is broken" : why, peer);
  job.check = Job::Check::failed;
}

// True when the fingerprint went out; false when posting it failed the
// check.
bool post_record(Job& job) {
  MpiGroup& g = *job.group;
  const int n = g.size;
  job.theirs.assign(static_cast<std::size_t>(n), Fingerprint{});
  job.theirs[static_cast<std::size_t>(g.rank)] = job.mine;
  // What this rank sends lives on the heap: a send still pending when the
  // check gives up cannot be taken back, and its buffer is then left to MPI.
  job.record = std::make_unique<Fingerprint>(job.mine);
  job.record_recvs.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
  job.record_sends = job.record_recvs;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == g.rank) continue;
    const auto p = static_cast<std::size_t>(peer);
    const char* call = "MPI_Irecv";
    int rc = MPI_Irecv(&job.theirs[p], sizeof(Fingerprint), MPI_BYTE, peer, kRecordTag, g.check, &job.record_recvs[p]);
    if (rc == MPI_SUCCESS) {
      call = "MPI_Isend";
      rc = MPI_Isend(job.record.get(), sizeof(Fingerprint), MPI_BYTE, peer, kRecordTag, g.check, &job.record_sends[p]);
    }
    if (rc != MPI_SUCCESS) {
      cancel_pending(job.record_recvs, job.record_sends, job.record);
      fail_check(job, "exchanging fingerprints with rank " + std::to_string(peer) + ": " + WEFT_MPI_FAILURE(call, rc),
                 peer);
      return false;
    }
  }
  return true;
}

// The oldest posted fingerprint's end: every peer's arrived (compared), or
// the deadline passed, or MPI failed, or the process is exiting.
void decide(Job& job, CommThread::Wait waited, int mpi_rc) {
  MpiGroup& g = *job.group;
  const int n = g.size;
  if (mpi_rc != MPI_SUCCESS) {
    cancel_pending(job.record_recvs, job.record_sends, job.record);
    return fail_check(job, "exchanging fingerprints: " + WEFT_MPI_FAILURE("MPI_Test", mpi_rc));
  }
  if (waited != CommThread::Wait::done) {
    const std::vector<int> missing = cancel_pending(job.record_recvs, job.record_sends, job.record);
    if (waited == CommThread::Wait::stopping) return fail_check(job, "the process is exiting");
    if (missing.empty())
      return fail_check(job, "its fingerprint was not delivered to every peer within " + seconds_text(g.timeout));
    return fail_check(job,
                      rank_list(missing) + " never joined within " + seconds_text(g.timeout) +
                          " (CommunicatorOptions::timeout, WEFT_COLLECTIVE_TIMEOUT)",
                      missing.front());
  }
  // Every rank compares every record with rank 0's, so every rank raises
  // the same message (and no rank sends a status for this collective).
  std::vector<int> differ;
  for (int r = 1; r < n; ++r)
    if (!same_call(job.theirs[static_cast<std::size_t>(r)], job.theirs[0])) differ.push_back(r);
  if (differ.empty()) {
    job.check = Job::Check::matched;
    return;
  }
  std::string why = "collectives differ across ranks: rank 0 called " + describe(job.theirs[0]);
  for (std::size_t i = 0; i < differ.size() && i < 8; ++i)
    why += "; rank " + std::to_string(differ[i]) + " called " + describe(job.theirs[static_cast<std::size_t>(differ[i])]);
  if (differ.size() > 8) why += "; and " + std::to_string(differ.size() - 8) + " more ranks";
  fail_check(job, why, g.rank == 0 ? differ.front() : 0, /*breaks=*/false);
}

void run_records(const std::shared_ptr<MpiGroup>& group, CommThread& thread) {
  MpiGroup& g = *group;
  std::map<std::uint64_t, std::shared_ptr<Job>> waiting;  // taken, not yet posted
  std::deque<std::shared_ptr<Job>> posted;                // in sequence order
  // Takes what the pushes handed over and posts what may go; false once
  // there is nothing left (the fiber then ends: the next push starts another).
  auto take = [&] {
    {
      std::lock_guard lock(g.records_mutex);
      for (std::shared_ptr<Job>& j : g.records_in) waiting.emplace(j->mine.sequence, std::move(j));
      g.records_in.clear();
      if (waiting.empty() && posted.empty()) {
        g.record_fiber = false;
        return false;
      }
    }
    while (posted.size() < kRecordsAhead && !waiting.empty() && waiting.begin()->first == g.next_record) {
      std::shared_ptr<Job> job = std::move(waiting.begin()->second);
      waiting.erase(waiting.begin());
      ++g.next_record;
      if (!g.broken.empty()) {
        job->check_error = comm_error(*job, "the communicator is broken: " + g.broken);
        job->check = Job::Check::failed;
      } else if (thread.stopping()) {
        fail_check(*job, "the process is exiting");
      } else if (post_record(*job)) {
        posted.push_back(std::move(job));
      }
    }
    if (!g.broken.empty()) {
      // Out of order too: a number committed whose push then failed never
      // comes (MpiTransport::committed), and would hold the ones behind it.
      for (auto& [seq, job] : waiting) {
        job->check_error = comm_error(*job, "the communicator is broken: " + g.broken);
        job->check = Job::Check::failed;
      }
      waiting.clear();
    }
    return true;
  };
  auto arrived = [&] {
    std::lock_guard lock(g.records_mutex);
    return !g.records_in.empty();
  };
  while (take()) {
    if (posted.empty()) {
      // The next number's push is on its way (another thread took it), or
      // it failed, which breaks the communicator (take() then fails what
      // waits and, with nothing left, ends the fiber).
      if (thread.poll_until([&] { return arrived() || !g.broken.empty(); }, Clock::time_point::max()) ==
          CommThread::Wait::stopping) {
        for (auto& [seq, job] : waiting) fail_check(*job, "the process is exiting");
        waiting.clear();
        g.next_record = std::numeric_limits<std::uint64_t>::max();  // nothing more is posted
      }
      continue;
    }
    Job& head = *posted.front();
    // The deadline counts from its turn and from its hold op's run (its
    // fiber's start), whichever is later: a peer whose frontend is behind
    // while this rank's inputs are still being computed is not late yet.
    // Not the job's own deadline: the hold op's thread sets that.
    const Clock::time_point turn = Clock::now();
    int rc = MPI_SUCCESS;
    bool late = false;
    CommThread::Wait waited = thread.poll_until(
        [&] {
          take();  // later pushes post meanwhile (head stays posted: take never ends the fiber here)
          if (!g.broken.empty()) return true;
          const bool received = test_each(head.record_recvs, rc);
          if (test_each(head.record_sends, rc) && received) return true;
          late = head.started && Clock::now() >= std::max(turn, head.started_at) + g.timeout;
          return late;
        },
        Clock::time_point::max());
    if (late) waited = CommThread::Wait::timeout;
    bool exchanged = true;
    if (waited == CommThread::Wait::done && rc == MPI_SUCCESS && !g.broken.empty()) {
      const bool received = test_each(head.record_recvs, rc);
      exchanged = test_each(head.record_sends, rc) && received && rc == MPI_SUCCESS;
    }
    if (!exchanged) {
      // Broken meanwhile (another collective's error): nothing waits for
      // the peers' records any more.
      cancel_pending(head.record_recvs, head.record_sends, head.record);
      head.check_error = comm_error(head, "the communicator is broken: " + g.broken);
      head.check = Job::Check::failed;
    } else {
      decide(head, waited, rc);
    }
    posted.pop_front();
  }
}

}  // namespace

void queue_fingerprint(const std::shared_ptr<Job>& job) {
  MpiGroup& g = *job->group;
  CommThread& thread = MpiProcess::get().thread();
  bool running = false;
  {
    std::lock_guard lock(g.records_mutex);
    g.records_in.push_back(job);
    running = std::exchange(g.record_fiber, true);
  }
  if (running) {
    thread.wake();  // it may be sleeping between polls
    return;
  }
  if (!thread.spawn([group = job->group, &thread] { run_records(group, thread); })) {
    // The process is exiting: the collectives' fibers fail as they start.
    std::lock_guard lock(g.records_mutex);
    g.record_fiber = false;
  }
}

namespace {

// Waits for the record fiber's verdict on this collective's fingerprints;
// false once the job was completed (they differ, a rank never joined, the
// process is exiting).
bool await_check(Job& job, CommThread& thread) {
  job.started = true;  // the record fiber's deadline for it runs from now on
  job.started_at = Clock::now();
  if (thread.poll_until([&] { return job.check != Job::Check::pending; }, Clock::time_point::max()) ==
      CommThread::Wait::stopping) {
    fail_broken(job, "the process is exiting");
    return false;
  }
  if (job.check == Job::Check::matched) return true;
  complete(job, job.check_error);
  return false;
}

// Tells every peer whether this rank's input is valid, and posts the
// receives of theirs, in sequence order (under the data gate), before this
// rank enters the data phase: no rank waits for another's status to enter
// it, and each completes only once it has them all. Returns "", or what
// failed (WEFT_MPI_FAILURE's message).
std::string send_status(Job& job) {
  MpiGroup& g = *job.group;
  job.statuses.assign(static_cast<std::size_t>(g.size), Status{});
  job.status_recvs.assign(static_cast<std::size_t>(g.size), MPI_REQUEST_NULL);
  for (int peer = 0; peer < g.size; ++peer) {
    if (peer == g.rank) continue;
    const auto p = static_cast<std::size_t>(peer);
    const int rc =
        MPI_Irecv(&job.statuses[p], sizeof(Status), MPI_BYTE, peer, kStatusTag, g.check, &job.status_recvs[p]);
    if (rc != MPI_SUCCESS) return WEFT_MPI_FAILURE("MPI_Irecv", rc);
  }
  job.status = std::make_unique<Status>();
  job.status->sequence = job.mine.sequence;
  if (job.failed_input) {
    job.status->failed = 1;
    copy_text(job.status->reason, sizeof job.status->reason, failure_text(job.failed_input));
  }
  job.status_sends.assign(static_cast<std::size_t>(g.size), MPI_REQUEST_NULL);
  for (int peer = 0; peer < g.size; ++peer) {
    if (peer == g.rank) continue;
    const int rc = MPI_Isend(job.status.get(), sizeof(Status), MPI_BYTE, peer, kStatusTag, g.check,
                             &job.status_sends[static_cast<std::size_t>(peer)]);
    if (rc != MPI_SUCCESS) return WEFT_MPI_FAILURE("MPI_Isend", rc);
  }
  return {};
}

// Every peer's status has arrived (tested once each; `rc` says whether a
// test failed).
bool statuses_arrived(Job& job, int& rc) { return test_each(job.status_recvs, rc) && rc == MPI_SUCCESS; }

// The collective's result once every status is in: the first failed
// input's error, by rank (this rank's own exception where it is the one),
// or null.
std::exception_ptr verdict(const Job& job) {
  const MpiGroup& g = *job.group;
  for (int r = 0; r < g.size; ++r) {
    if (r == g.rank) {
      if (job.failed_input) return job.failed_input;
      continue;
    }
    const Status& s = job.statuses[static_cast<std::size_t>(r)];
    if (s.sequence != job.mine.sequence)  // the statuses' order broke: a bug in Weft, named
      return comm_error(job, "rank " + std::to_string(r) + "'s status is for collective #" +
                                 std::to_string(s.sequence) + ", not this one (internal error)", r);
    if (s.failed) return comm_error(job, "rank " + std::to_string(r) + "'s input failed: " + std::string(s.reason), r);
  }
  return nullptr;
}

// After the data phase: completes the job once every peer's status is in
// (each was sent before its peer entered the data phase, so this is a
// delivery, not another meeting of the ranks).
void complete_with_statuses(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  int rc = MPI_SUCCESS;
  const CommThread::Wait waited = thread.poll_until([&] { return test_each(job.status_recvs, rc); }, job.deadline, &job.group->lost);
  if (rc != MPI_SUCCESS) return fail_broken(job, "receiving the peers' statuses: " + WEFT_MPI_FAILURE("MPI_Test", rc));
  if (waited != CommThread::Wait::done) {
    const std::vector<int> missing = cancel_pending(job.status_recvs, job.status_sends, job.status);
    if (waited == CommThread::Wait::stopping) return fail_broken(job, "the process is exiting");
    return fail_broken(job, rank_list(missing) + " never reached the data phase within " + seconds_text(g.timeout),
                       missing.empty() ? CommunicationError::kNoPeer : missing.front());
  }
  complete(job, verdict(job));
}

// A check whose statuses are compared after the fact (CheckAfter, call.h):
// the fingerprints matched and this rank's status went out, so the token
// completes now and the collective may launch; the peers' statuses, each
// sent before its rank launched, then only have to arrive, and settle
// `after` (the collective fails on every rank where one says its input
// failed).
void enter_after(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const std::shared_ptr<CheckAfter> after = job.after;
  auto settle = [&after](std::exception_ptr error) {
    after->error = std::move(error);
    after->settled.store(true, std::memory_order_release);
  };
  after->entered.store(true, std::memory_order_release);
  complete(job);  // this rank's own failed input: the collective reads it too
  if (!g.fingerprints) return settle(nullptr);
  int rc = MPI_SUCCESS;
  const CommThread::Wait waited =
      thread.poll_until([&] { return test_each(job.status_recvs, rc); }, job.deadline, &g.lost);
  if (rc != MPI_SUCCESS) {
    const std::string why = "receiving the peers' statuses: " + WEFT_MPI_FAILURE("MPI_Test", rc);
    g.set_broken(job.label + ": " + why);
    return settle(comm_error(job, why + "; the communicator is broken"));
  }
  if (waited != CommThread::Wait::done) {
    const std::vector<int> missing = cancel_pending(job.status_recvs, job.status_sends, job.status);
    const std::string why = waited == CommThread::Wait::stopping
                                ? std::string("the process is exiting")
                                : rank_list(missing) + " never reached the collective within " + seconds_text(g.timeout);
    g.set_broken(job.label + ": " + why);
    flight_dump_soon(job.label + " on " + g.str() + ": " + why);
    return settle(comm_error(job, why + "; the communicator is broken",
                             missing.empty() ? CommunicationError::kNoPeer : missing.front()));
  }
  settle(verdict(job));
}

// The statuses' last requests, whatever happened: receives still open are
// cancelled; sends are waited for (with the deadline: each is a small
// message already on its way), or left to MPI with their buffer.
void finish_statuses(Job& job, CommThread& thread) {
  int rc = MPI_SUCCESS;
  if (!job.status_sends.empty())
    thread.poll_until([&] { return test_each(job.status_sends, rc); }, job.deadline, &job.group->lost);
  cancel_pending(job.status_recvs, job.status_sends, job.status);
}

// A rank whose input failed enters the data phase all the same, with zeros
// in place of the tensors' memory (which it may not have): its peers then
// complete, and every rank fails the collective from the statuses.
void stand_in(Job& job) {
  const MpiGroup& g = *job.group;
  int element = 0;
  MPI_Type_size(job.type, &element);
  const std::int64_t whole = job.count;
  const std::int64_t part = job.counts.empty() ? whole : job.counts[static_cast<std::size_t>(g.rank)];
  const std::int64_t in = job.kind == Kind::all_gather ? part : whole;
  const std::int64_t out = job.kind == Kind::reduce_scatter ? part : whole;
  job.stand_in.assign(static_cast<std::size_t>((in + out) * element), std::byte{0});
  job.in = job.stand_in.data();
  job.out = job.stand_in.data() + in * element;
}

// How a data phase ended.
struct Outcome {
  int rc = MPI_SUCCESS;
  const char* call = "MPI_Test";  // the call that returned rc
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
  if (out.rc != MPI_SUCCESS) {
    out.call = data_call(job.kind, false);
    return out;
  }
  out.posted = true;
  out.waited = thread.poll_until([&] { return test_all({&request}, out.rc); }, job.deadline, &job.group->lost);
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
    out.waited = thread.poll_until([&] { return test_all({&request}, out.rc); }, job.deadline, &job.group->lost);
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
      if ((out.rc = MPI_Irecv(landing + off, len, MPI_FLOAT, left, step, g.data, &recvs.back())) != MPI_SUCCESS) {
        out.call = "MPI_Irecv";
        return give_up();
      }
    }
    for (std::int64_t off = 0; off < send_chunk.size(); off += kRingSegment) {
      sends.push_back(MPI_REQUEST_NULL);
      const int len = static_cast<int>(std::min(kRingSegment, send_chunk.size() - off));
      if ((out.rc = MPI_Isend(buf + send_chunk.begin + off, len, MPI_FLOAT, right, step, g.data, &sends.back())) !=
          MPI_SUCCESS) {
        out.call = "MPI_Isend";
        return give_up();
      }
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
  narrow_half(job);
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
        return MPI_Allgatherv(gather_source(in, out, type, displs, rank), counts[static_cast<std::size_t>(rank)], type,
                              out, counts.data(), displs.data(), type, comm);
      case Kind::barrier:
      case Kind::send:
      case Kind::recv: break;
    }
    return MPI_ERR_OTHER;
  };
}

// A data phase on the blocking lane: handed over in sequence order (the
// data gate passes once it is queued), then polled with the deadline. On
// success the lane's thread finishes and completes the job itself where
// every peer's status is in and none failed (the usual case: one thread
// hand-off less before the waiter learns of it); otherwise the fiber does.
// The lane's thread may test the status receives: the fiber leaves them
// alone until the ticket is done, and lanes exist only under
// MPI_THREAD_MULTIPLE.
void submit_to_lane(Job& job) {
  MpiGroup& g = *job.group;
  job.ticket = g.lane->submit(blocking_call(job), [&job] {
    finish_data(job);
    int rc = MPI_SUCCESS;
    if (job.group->fingerprints && (!statuses_arrived(job, rc) || verdict(job))) return false;
    job.lane_completed = true;
    complete(job);
    return true;
  });
  g.data_gate.pass(job.mine.sequence);
}

Outcome await_lane(Job& job, CommThread& thread) {
  LaneTicket& ticket = *job.ticket;
  Outcome out;
  out.posted = true;
  auto ended = [&] { return ticket.state.load(std::memory_order_acquire) == LaneTicket::done; };
  out.waited = thread.wait_woken(ended, job.deadline, &job.group->lost);  // the lane wakes the thread (mpi_lane.cpp)
  if (out.waited != CommThread::Wait::done) {
    int expected = LaneTicket::pending;
    if (ticket.state.compare_exchange_strong(expected, LaneTicket::abandoned, std::memory_order_acq_rel))
      return out;  // the call stays in MPI; the caller fails the job
    // The lane won: it is finishing the job this very moment.
    while (!ended()) std::this_thread::yield();
    out.waited = CommThread::Wait::done;
  }
  out.rc = ticket.rc;
  out.call = data_call(job.kind, true);
  out.completed = job.lane_completed;
  return out;
}

Outcome lane_collective(Job& job, CommThread& thread) {
  submit_to_lane(job);
  return await_lane(job, thread);
}

// Who never reached the data phase, by their statuses (tested once), for
// the message of a data phase that timed out.
std::string late_ranks(Job& job) {
  if (!job.group->fingerprints) return " (fingerprints are off, WEFT_COLLECTIVE_CHECK=0: the ranks that never joined are unknown)";
  int rc = MPI_SUCCESS;
  test_each(job.status_recvs, rc);
  std::vector<int> late;
  for (std::size_t r = 0; r < job.status_recvs.size(); ++r)
    if (job.status_recvs[r] != MPI_REQUEST_NULL) late.push_back(static_cast<int>(r));
  if (late.empty()) return " although every rank reached it";
  return ": " + rank_list(late) + " never reached it (no status came: " +
         (late.size() == 1 ? "its input was" : "their inputs were") +
         " not ready, or earlier collectives held it back)";
}

// How a data phase that was posted ends: failed and named, or complete
// once the statuses are in.
void end_data_phase(Job& job, CommThread& thread, const Outcome& out) {
  MpiGroup& g = *job.group;
  if (out.rc != MPI_SUCCESS || out.waited != CommThread::Wait::done) {
    if (out.posted) abandon_memory(job);
    if (out.rc != MPI_SUCCESS) return fail_broken(job, WEFT_MPI_FAILURE(out.call, out.rc));
    if (out.waited == CommThread::Wait::stopping) return fail_broken(job, "the process is exiting");
    return fail_broken(job, "the data phase did not complete within " + seconds_text(g.timeout) + late_ranks(job));
  }
  if (out.completed) return;
  if (g.fingerprints) return complete_with_statuses(job, thread);
  complete(job);
}

// The data phase of a collective whose fingerprints matched (or were not
// checked) and whose hold op ran; its turn has come (the data gate), or
// the hold op began it (Job::began).
void data_phase(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  if (job.began) {
    if (!job.began_failure.empty()) return fail_broken(job, "sending its status to the peers: " + job.began_failure);
    return end_data_phase(job, thread, await_lane(job, thread));
  }
  if (g.fingerprints) {
    if (const std::string failure = send_status(job); !failure.empty())
      return fail_broken(job, "sending its status to the peers: " + failure);
  } else if (job.failed_input) {
    // Without fingerprints the peers cannot be told: they fail at their
    // timeout, and this rank stops using the communicator too.
    g.set_broken(job.label + ": this rank's input failed (fingerprints are off)");
    return complete(job, job.failed_input);
  }
  if (job.check_only) {  // the data moves elsewhere (NCCL): the statuses are the whole collective
    g.data_gate.pass(job.mine.sequence);
    if (job.after) return enter_after(job, thread);
    return g.fingerprints ? complete_with_statuses(job, thread) : complete(job);
  }
  if (job.failed_input) stand_in(job);
  const bool ring = job.kind == Kind::allreduce && g.size > 1 &&
                    static_cast<std::int64_t>(job.count) * static_cast<std::int64_t>(sizeof(float)) >= kRingBytes;
  end_data_phase(job, thread,
                 on_lane(job) ? lane_collective(job, thread)
                 : ring       ? ring_allreduce(job, thread)
                              : mpi_collective(job, thread));
}

}  // namespace

// The fiber of one collective, from its hold op's run.
void run_collective(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const std::uint64_t seq = job.mine.sequence;
  if (job.began) {
    data_phase(job, thread);
  } else if (!g.fingerprints && !g.broken.empty()) {
    complete(job, comm_error(job, "the communicator is broken: " + g.broken));
  } else if (!g.fingerprints || await_check(job, thread)) {
    // Counted, so that a hold op passing the gate on another thread wakes
    // the thread (begin_data_phase).
    g.gate_waiters.fetch_add(1);
    const bool turn = wait_turn(job, thread, g.data_gate, seq);
    g.gate_waiters.fetch_sub(1);
    if (turn) data_phase(job, thread);
  }
  // Whatever happened, later collectives must not wait for this one.
  g.data_gate.pass(seq);
  finish_statuses(job, thread);
}

// On the hold op's thread (mpi_group.h). The verdict, the gate and the
// broken flag are read across threads; a turn at the gate is this job's
// alone, so nothing else posts a status or hands a call to the lane until
// it passes.
bool begin_data_phase(Job& job) {
  MpiGroup& g = *job.group;
  if (job.check_only || job.failed_input || !on_lane(job)) return false;
  if (g.fingerprints && job.check.load(std::memory_order_acquire) != Job::Check::matched) return false;
  if (!g.data_gate.turn_of(job.mine.sequence)) return false;  // earlier collectives are still to enter theirs
  // Last: a collective that broke the communicator did so before its
  // verdict or its gate pass, which the loads above saw. A broken
  // communicator's lane may be stuck in MPI: the fiber fails the job at once.
  if (g.is_broken.load(std::memory_order_acquire)) return false;
  job.began = true;
  if (g.fingerprints && !(job.began_failure = send_status(job)).empty()) return true;  // the fiber fails it
  submit_to_lane(job);
  // Fibers of later collectives waiting at the gate see the pass at their
  // next poll: wake the thread if it sleeps. (A fiber that starts waiting
  // just now may miss it and sleep one step, at most kMaxSleep.)
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (g.gate_waiters.load(std::memory_order_relaxed) > 0) MpiProcess::get().thread().wake();
  return true;
}

void drop_lane_call(Job& job) {
  if (!job.began) return;
  cancel_pending(job.status_recvs, job.status_sends, job.status);
  if (!job.ticket) return;
  int expected = LaneTicket::pending;
  if (job.ticket->state.compare_exchange_strong(expected, LaneTicket::abandoned, std::memory_order_acq_rel)) {
    abandon_memory(job);  // the call may still run: MPI would write into the tensors
    return;
  }
  while (job.ticket->state.load(std::memory_order_acquire) != LaneTicket::done) std::this_thread::yield();
}

}  // namespace weft::parallel::detail
