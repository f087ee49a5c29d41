// Collectives across the processes of an MPI job
// (docs/design/parallel-collectives.md, "Across processes").
//
// A collective is one hold op per process: an async tensor op on the
// member's device that holds its tensor while the collective runs. Its body
// hands a Job to the communication thread, where one fiber runs it as
// straight-line code:
//
//   wait for the check gate     (fibers post fingerprints in sequence order)
//   send this rank's fingerprint to every peer, receive theirs, poll
//   compare: a mismatch or a failed input ends it on every rank, named
//   wait for the data gate      (MPI sees collectives in the same order everywhere)
//   post the non-blocking MPI collective, poll it with MPI_Test
//   complete the hold op
//
// Every wait has the collective's deadline. Only the communication thread
// calls MPI (after MPI_Init_thread and the rank query at start-up).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "call.h"
#include "comm_thread.h"
#include "communicator_state.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor_op.h"

namespace weft::parallel::detail {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

std::string seconds_text(std::chrono::milliseconds t) {
  const long long ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

// ---- MPI in this process ---------------------------------------------------------

// MPI initialized (by Weft or by the application) and the communication
// thread running; lives until exit, when the thread stops and, if Weft
// initialized MPI, MPI is finalized.
class MpiProcess {
 public:
  static MpiProcess& get() {
    static MpiProcess* process = [] {
      auto* p = new MpiProcess();  // never deleted: at_exit ends what needs ending
      std::atexit(at_exit);
      return p;
    }();
    return *process;
  }
  CommThread& thread() { return *thread_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

 private:
  MpiProcess() {
    int initialized = 0, finalized = 0, provided = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) throw InvalidArgument("weft::parallel::Communicator::mpi: MPI was already finalized");
    if (!initialized) {
      if (const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided); rc != MPI_SUCCESS)
        throw CommunicationError("weft::parallel::Communicator::mpi: MPI_Init_thread failed: " + mpi_error_text(rc),
                                 -1);
      owns_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
      throw InvalidArgument(
          "weft::parallel::Communicator::mpi: MPI was initialized with thread level " + std::to_string(provided) +
          "; Weft calls MPI from its communication thread and needs MPI_THREAD_SERIALIZED or more (MPI_Init_thread; "
          "with SERIALIZED, the application must not call MPI while Weft's collectives are in flight)");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    thread_ = std::make_unique<CommThread>();
  }

  static void at_exit() {
    MpiProcess& p = get();
    p.thread_->stop();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (p.owns_ && !finalized) MPI_Finalize();
  }

  bool owns_ = false;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<CommThread> thread_;
};

// ---- options from the environment -----------------------------------------------

std::chrono::milliseconds resolve_timeout(const CommunicatorOptions& options) {
  if (options.timeout) {
    if (options.timeout->count() <= 0)
      throw InvalidArgument("weft::parallel::Communicator::mpi: CommunicatorOptions::timeout must be positive");
    return *options.timeout;
  }
  const char* text = std::getenv("WEFT_COLLECTIVE_TIMEOUT");
  if (!text || !*text) return std::chrono::minutes(5);
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(seconds > 0) || seconds > 1e7)
    throw InvalidArgument("WEFT_COLLECTIVE_TIMEOUT='" + std::string(text) +
                          "': want a positive number of seconds, such as 300 or 2.5");
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000 + 0.5));
}

bool resolve_fingerprints(const CommunicatorOptions& options) {
  if (options.fingerprints) return *options.fingerprints;
  const char* text = std::getenv("WEFT_COLLECTIVE_CHECK");
  if (!text || !*text) return true;
  const std::string value(text);
  if (value == "1") return true;
  if (value == "0") return false;
  throw InvalidArgument("WEFT_COLLECTIVE_CHECK='" + value + "': want 1 (fingerprints on, the default) or 0 (off)");
}

// ---- fingerprints ------------------------------------------------------------------

// What every rank says about its n-th collective, compared before data
// moves. Fixed size, sent as bytes.
struct Fingerprint {
  std::uint64_t sequence = 0;
  std::int64_t count = 0;       // elements (the whole buffer for reduce_scatter and all_gather)
  std::uint64_t name_hash = 0;  // of the whole name (name holds its start)
  std::int32_t root = 0;        // broadcast and reduce; 0 otherwise
  std::uint8_t kind = 0, op = 0, dtype = 0, failed = 0;
  char name[40] = {};
  char reason[88] = {};  // failed: what the input's failure said (its start)
};
static_assert(std::is_trivially_copyable_v<Fingerprint>);

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.sequence == b.sequence && a.count == b.count && a.name_hash == b.name_hash && a.root == b.root &&
         a.kind == b.kind && a.op == b.op && a.dtype == b.dtype;
}

bool reduces(Kind kind) {
  return kind == Kind::allreduce || kind == Kind::reduce || kind == Kind::reduce_scatter;
}

// "allreduce(sum) 'grad.fc1' [4096] float32 as #17"
std::string describe(const Fingerprint& f) {
  const auto kind = static_cast<Kind>(f.kind);
  std::string s = to_string(kind);
  if (reduces(kind)) s += "(" + std::string(to_string(static_cast<ReduceOp>(f.op))) + ")";
  if (f.name[0]) s += " '" + std::string(f.name) + (std::strlen(f.name) + 1 == sizeof f.name ? "...'" : "'");
  if (kind != Kind::barrier)
    s += " [" + std::to_string(f.count) + "] " + std::string(weft::to_string(static_cast<DType>(f.dtype)));
  if (kind == Kind::broadcast || kind == Kind::reduce) s += " root " + std::to_string(f.root);
  if (kind == Kind::send) s += " to rank " + std::to_string(f.root);
  if (kind == Kind::recv) s += " from rank " + std::to_string(f.root);
  return s + " as #" + std::to_string(f.sequence);
}

void copy_text(char* dst, std::size_t capacity, const std::string& text) {
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::uint8: return MPI_UINT8_T;
    case DType::float16:
    case DType::bfloat16: return MPI_UINT16_T;  // moved, never reduced
  }
  return MPI_BYTE;
}

// ---- one communicator ----------------------------------------------------------------

// What the fibers of one communicator share. The MPI handles and the
// settings are fixed at creation; the rest is touched by fibers only.
struct MpiGroup {
  int rank = 0, size = 1;
  Device device;
  std::chrono::milliseconds timeout{};
  bool fingerprints = true;
  MPI_Comm check = MPI_COMM_NULL;  // fingerprints (a duplicate of MPI_COMM_WORLD)
  MPI_Comm data = MPI_COMM_NULL;   // the collectives themselves (another)
  MPI_Comm p2p = MPI_COMM_NULL;    // send and recv (a third)
  // Messages pushed so far to and from each rank (frontend threads).
  std::unique_ptr<std::atomic<std::uint64_t>[]> sent, received;

  // ---- communication thread only ----
  SequenceGate check_gate, data_gate;
  std::vector<SequenceGate> send_gate, recv_gate;  // per peer: messages posted in push order
  std::string broken;  // set by the first error MPI cannot recover from
  std::vector<float> scratch;  // the ring's landing chunk (one ring at a time)

  std::string str() const {
    return "MPI communicator of " + std::to_string(size) + " rank" + (size == 1 ? "" : "s") + " (rank " +
           std::to_string(rank) + " on " + device.str() + " here)";
  }

  ~MpiGroup() {
    if (check == MPI_COMM_NULL) return;
    // A broken communicator may have requests in flight: leave it to MPI.
    if (!broken.empty()) return;
    CommThread& thread = MpiProcess::get().thread();
    auto free = [check = check, data = data, p2p = p2p]() mutable {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      MPI_Comm_free(&check);
      MPI_Comm_free(&data);
      MPI_Comm_free(&p2p);
    };
    if (thread.on_this_thread()) free();
    else static_cast<void>(thread.spawn(std::move(free)));  // after exit: MPI is gone anyway
  }
};

// One collective on its way through the communication thread.
struct Job {
  std::shared_ptr<MpiGroup> group;
  Fingerprint mine;
  std::string label;  // "allreduce 'grad' #3"
  Kind kind = Kind::barrier;
  ReduceOp op = ReduceOp::sum;
  MPI_Datatype type = MPI_BYTE;
  int count = 0, root = 0;
  const void* in = nullptr;  // what this rank sends (null: in place)
  void* out = nullptr;       // what it receives
  std::vector<int> counts, displs;  // reduce_scatter and all_gather: per rank
  // The tensors, so that an abandoned collective can keep their memory
  // (fail_broken); dropped before the hold op completes otherwise.
  std::vector<Tensor> tensors;
  // Set by the hold op; called through complete() or fail_broken().
  Completion done;
  std::exception_ptr failed_input;
  Clock::time_point deadline;
};

// Completes the hold op. The job lets go of the tensors first: once the
// hold op is complete, a waiter may destroy the engine they belong to.
void complete(Job& job, std::exception_ptr error = nullptr) {
  job.tensors.clear();
  Completion done = std::move(job.done);
  done(std::move(error));
}

std::exception_ptr comm_error(const Job& job, const std::string& why, int peer = CommunicationError::kNoPeer) {
  return std::make_exception_ptr(
      CommunicationError(job.label + " on " + job.group->str() + ": " + why, job.group->rank, peer));
}

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

// The communicator cannot be trusted any more (MPI cannot cancel a started
// collective): later collectives on it fail at once with this message.
void fail_broken(Job& job, const std::string& why, int peer = CommunicationError::kNoPeer) {
  MpiGroup& g = *job.group;
  if (g.broken.empty()) g.broken = job.label + ": " + why;
  complete(job, comm_error(job, why + "; the communicator is broken", peer));
}

// A data phase that never completed: MPI may still write into the tensors'
// memory, so it is never freed.
void abandon_memory(Job& job) { static_cast<void>(new std::vector<Tensor>(std::move(job.tensors))); }

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Waits until `gate` lets `seq` through; false once the job was completed
// (the communicator broke, or the process is exiting). No deadline of its
// own: the collectives before it have theirs, and whatever ends them passes
// the gate. The job's deadline then counts from the gate's opening, so that
// a collective whose input was ready early does not time out behind one
// whose input is legitimately late.
bool wait_turn(Job& job, CommThread& thread, const SequenceGate& gate, std::uint64_t seq) {
  MpiGroup& g = *job.group;
  if (thread.poll_until([&] { return gate.open(seq) || !g.broken.empty(); }, Clock::time_point::max()) ==
      CommThread::Wait::stopping) {
    fail_broken(job, "the process is exiting");
    return false;
  }
  if (!g.broken.empty()) {
    complete(job, comm_error(job, "the communicator is broken: " + g.broken));
    return false;
  }
  job.deadline = std::max(job.deadline, Clock::now() + g.timeout);
  return true;
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

// Tests each request once; true when all are done, or when a test failed
// (`rc` says which).
bool test_all(std::initializer_list<MPI_Request*> requests, int& rc) {
  for (MPI_Request* r : requests) {
    if (*r == MPI_REQUEST_NULL) continue;
    int flag = 0;
    if ((rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return true;
    if (!flag) return false;
  }
  return true;
}

// How a data phase ended.
struct Outcome {
  int rc = MPI_SUCCESS;
  CommThread::Wait waited = CommThread::Wait::done;
  bool posted = false;  // MPI was given the tensors' memory
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

// Allreduce of large buffers: Open MPI's non-blocking allreduce runs at
// about half the speed of its blocking one, so large ones run Weft's own
// chunked ring over non-blocking point-to-point messages (reduce-scatter,
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

// ---- send and recv ------------------------------------------------------------------
//
// Per pair of ranks, the k-th send meets the k-th recv: each side posts its
// messages in push order through a per-peer gate. With fingerprints, the
// sender sends its record and its data at once, the receiver checks the
// record before taking the data (into the tensor, or into a scratch buffer
// when it does not match) and replies with its own, so both ends see a
// mismatch and name both sides.

constexpr int kHeaderTag = 1, kDataTag = 2, kReplyTag = 3;

struct Wire {
  Fingerprint header, reply;
};

bool same_message(const Fingerprint& a, const Fingerprint& b) {
  return a.name_hash == b.name_hash && a.count == b.count && a.dtype == b.dtype;
}

std::string message_mismatch(const Fingerprint& a, int rank_a, const Fingerprint& b, int rank_b) {
  if (rank_b < rank_a) return message_mismatch(b, rank_b, a, rank_a);
  return "send and recv differ: rank " + std::to_string(rank_a) + " called " + describe(a) + "; rank " +
         std::to_string(rank_b) + " called " + describe(b);
}


// Leaves no buffer to MPI that is about to go: receives are cancelled (a
// cancelled request's wait returns at once); a send still pending may be
// matched by a slow receiver and cannot be taken back, so its memory (the
// wire, the tensors) is never freed.
void give_up(std::initializer_list<MPI_Request*> recvs, std::initializer_list<MPI_Request*> sends,
             std::unique_ptr<Wire>& wire, Job& job) {
  for (MPI_Request* r : recvs)
    if (*r != MPI_REQUEST_NULL) {
      MPI_Cancel(r);
      MPI_Wait(r, MPI_STATUS_IGNORE);
    }
  bool left = false;
  for (MPI_Request* r : sends)
    if (*r != MPI_REQUEST_NULL) {
      MPI_Request_free(r);
      left = true;
    }
  if (left) {
    static_cast<void>(wire.release());
    abandon_memory(job);
  }
}

std::string waited_text(int rc, CommThread::Wait waited, const std::string& late) {
  if (rc != MPI_SUCCESS) return "MPI failed: " + mpi_error_text(rc);
  if (waited == CommThread::Wait::stopping) return "the process is exiting";
  return late;
}

void run_send(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const int peer = job.root;
  SequenceGate& gate = g.send_gate[static_cast<std::size_t>(peer)];
  const std::uint64_t seq = job.mine.sequence;
  if (!wait_turn(job, thread, gate, seq)) return gate.pass(seq);
  if (!g.fingerprints && job.failed_input) {
    // The receiver cannot be told: it fails at its timeout.
    if (g.broken.empty()) g.broken = job.label + ": this rank's input failed (fingerprints are off)";
    complete(job, job.failed_input);
    return gate.pass(seq);
  }
  auto wire = std::make_unique<Wire>();
  wire->header = job.mine;
  MPI_Request header = MPI_REQUEST_NULL, data = MPI_REQUEST_NULL, reply = MPI_REQUEST_NULL;
  int rc = MPI_SUCCESS;
  if (g.fingerprints) {
    rc = MPI_Isend(&wire->header, sizeof(Fingerprint), MPI_BYTE, peer, kHeaderTag, g.p2p, &header);
    if (rc == MPI_SUCCESS) rc = MPI_Irecv(&wire->reply, sizeof(Fingerprint), MPI_BYTE, peer, kReplyTag, g.p2p, &reply);
  }
  if (rc == MPI_SUCCESS && !job.failed_input)
    rc = MPI_Isend(job.in, job.count, job.type, peer, kDataTag, g.p2p, &data);
  gate.pass(seq);
  const CommThread::Wait waited =
      rc != MPI_SUCCESS ? CommThread::Wait::done
                        : thread.poll_until([&] { return test_all({&header, &data, &reply}, rc); }, job.deadline);
  if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
    give_up({&reply}, {&header, &data}, wire, job);
    fail_broken(job,
                waited_text(rc, waited,
                            "rank " + std::to_string(peer) + " did not receive it within " + seconds_text(g.timeout) +
                                " (CommunicatorOptions::timeout, WEFT_COLLECTIVE_TIMEOUT)"),
                peer);
    return;
  }
  if (job.failed_input) return complete(job, job.failed_input);
  if (g.fingerprints && !same_message(wire->header, wire->reply))
    return complete(job, comm_error(job, message_mismatch(wire->header, g.rank, wire->reply, peer), peer));
  complete(job);
}

void run_recv(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const int peer = job.root;
  SequenceGate& gate = g.recv_gate[static_cast<std::size_t>(peer)];
  const std::uint64_t seq = job.mine.sequence;
  if (!wait_turn(job, thread, gate, seq)) return gate.pass(seq);
  const std::string late = "rank " + std::to_string(peer) + " sent nothing within " + seconds_text(g.timeout) +
                           " (CommunicatorOptions::timeout, WEFT_COLLECTIVE_TIMEOUT)";
  auto wire = std::make_unique<Wire>();
  wire->reply = job.mine;
  MPI_Request header = MPI_REQUEST_NULL, data = MPI_REQUEST_NULL, reply = MPI_REQUEST_NULL;
  int rc = MPI_SUCCESS;
  if (!g.fingerprints) {
    rc = MPI_Irecv(job.out, job.count, job.type, peer, kDataTag, g.p2p, &data);
    gate.pass(seq);
    const CommThread::Wait waited =
        rc != MPI_SUCCESS ? CommThread::Wait::done
                          : thread.poll_until([&] { return test_all({&data}, rc); }, job.deadline);
    if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
      give_up({&data}, {}, wire, job);
      return fail_broken(job, waited_text(rc, waited, late), peer);
    }
    return complete(job);
  }
  rc = MPI_Irecv(&wire->header, sizeof(Fingerprint), MPI_BYTE, peer, kHeaderTag, g.p2p, &header);
  const CommThread::Wait heard =
      rc != MPI_SUCCESS ? CommThread::Wait::done
                        : thread.poll_until([&] { return test_all({&header}, rc); }, job.deadline);
  if (rc != MPI_SUCCESS || heard != CommThread::Wait::done) {
    give_up({&header}, {}, wire, job);
    gate.pass(seq);
    return fail_broken(job, waited_text(rc, heard, late), peer);
  }
  const Fingerprint& h = wire->header;
  const bool match = same_message(h, job.mine);
  std::vector<unsigned char> discard;  // a mismatched message's data, taken and dropped
  if (!h.failed) {
    if (match) {
      rc = MPI_Irecv(job.out, job.count, job.type, peer, kDataTag, g.p2p, &data);
    } else {
      const auto type = static_cast<DType>(h.dtype);
      discard.resize(static_cast<std::size_t>(h.count) * dtype_size(type));
      rc = MPI_Irecv(discard.data(), static_cast<int>(h.count), mpi_type(type), peer, kDataTag, g.p2p, &data);
    }
  }
  gate.pass(seq);  // this message's data receive is posted: the next may post its own
  if (rc == MPI_SUCCESS)
    rc = MPI_Isend(&wire->reply, sizeof(Fingerprint), MPI_BYTE, peer, kReplyTag, g.p2p, &reply);
  const CommThread::Wait waited =
      rc != MPI_SUCCESS ? CommThread::Wait::done
                        : thread.poll_until([&] { return test_all({&data, &reply}, rc); }, job.deadline);
  if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
    give_up({&data}, {&reply}, wire, job);
    return fail_broken(job,
                       waited_text(rc, waited,
                                   "rank " + std::to_string(peer) + " announced the message, but its data did not "
                                                                   "arrive within " + seconds_text(g.timeout)),
                       peer);
  }
  if (h.failed)
    return complete(job, comm_error(job, "rank " + std::to_string(peer) + "'s input failed: " + std::string(h.reason),
                                    peer));
  if (!match) return complete(job, comm_error(job, message_mismatch(h, peer, job.mine, g.rank), peer));
  complete(job);
}

// The fiber of one collective (or message).
void run(Job& job, CommThread& thread) {
  if (job.kind == Kind::send) return run_send(job, thread);
  if (job.kind == Kind::recv) return run_recv(job, thread);
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
    } else if (wait_turn(job, thread, g.data_gate, seq)) {
      const bool ring = job.kind == Kind::allreduce && g.size > 1 &&
                        static_cast<std::int64_t>(job.count) * static_cast<std::int64_t>(sizeof(float)) >= kRingBytes;
      const Outcome out = ring ? ring_allreduce(job, thread) : mpi_collective(job, thread);
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
      } else {
        complete(job);
      }
    }
  }
  // Whatever happened, later collectives must not wait for this one.
  g.check_gate.pass(seq);
  g.data_gate.pass(seq);
}

// ---- the backend ----------------------------------------------------------------------

class MpiBackend final : public Backend {
 public:
  explicit MpiBackend(std::shared_ptr<MpiGroup> group) : group_(std::move(group)) {}
  std::string str() const override { return group_->str(); }

  void check(const Call& call, std::int64_t elements) const override {
    if (elements > INT_MAX)
      call.refuse(std::to_string(elements) + " elements: more than MPI's int counts can hold (" +
                  std::to_string(INT_MAX) + ")");
  }

  void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    auto job = make_job(call, tensors[0], op);
    push(call, std::move(job), tensors, tensors, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
  }
  void broadcast(const Call& call, const std::vector<Tensor>& tensors) override {
    auto job = make_job(call, tensors[0], ReduceOp::sum);
    if (group_->rank == job->root) {
      push(call, std::move(job), tensors, {}, [](Job& j, const TensorData& d) { j.in = d.inputs[0]; });
    } else {
      push(call, std::move(job), {}, tensors, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
    }
  }
  void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    auto job = make_job(call, tensors[0], op);
    if (group_->rank == job->root) {
      push(call, std::move(job), tensors, tensors, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
    } else {
      push(call, std::move(job), tensors, {}, [](Job& j, const TensorData& d) { j.in = d.inputs[0]; });
    }
  }
  void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override {
    auto job = make_job(call, inputs[0], op);
    job->counts = chunk_counts(inputs[0].numel(), &job->displs);
    push(call, std::move(job), inputs, outputs, [](Job& j, const TensorData& d) {
      j.in = d.inputs[0];
      j.out = d.outputs[0];
    });
  }
  void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    auto job = make_job(call, outputs[0], ReduceOp::sum);
    job->counts = chunk_counts(outputs[0].numel(), &job->displs);
    push(call, std::move(job), inputs, outputs, [](Job& j, const TensorData& d) {
      j.in = d.inputs[0];
      j.out = d.outputs[0];
    });
  }
  void send(Call& call, const Tensor& tensor, int from, int to) override {
    (void)from;
    call.commit_message(group_->sent[static_cast<std::size_t>(to)].fetch_add(1) + 1, to);
    auto job = make_job(call, tensor, ReduceOp::sum);
    job->root = job->mine.root = to;
    push(call, std::move(job), {tensor}, {}, [](Job& j, const TensorData& d) { j.in = d.inputs[0]; });
  }
  void recv(Call& call, const Tensor& tensor, int from, int to) override {
    (void)to;
    call.commit_message(group_->received[static_cast<std::size_t>(from)].fetch_add(1) + 1, from);
    auto job = make_job(call, tensor, ReduceOp::sum);
    job->root = job->mine.root = from;
    push(call, std::move(job), {}, {tensor}, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
  }
  void barrier(const Call& call) override {
    auto job = make_job(call, Tensor(), ReduceOp::sum);
    try {
      call.state().engine->push_async(
          [job = std::shared_ptr<Job>(std::move(job))](RunContext& ctx, Completion done) mutable {
            start(std::move(job), ctx, std::move(done));
          },
          group_->device, {}, {}, OpOptions{.priority = call.options().priority, .name = call.label()});
    } catch (...) {
      break_after_failed_push(call);
      throw;
    }
  }

 private:
  std::unique_ptr<Job> make_job(const Call& call, const Tensor& t, ReduceOp op) const {
    auto job = std::make_unique<Job>();
    job->group = group_;
    job->label = call.label();
    job->kind = call.kind();
    job->op = op;
    const bool rooted = call.kind() == Kind::broadcast || call.kind() == Kind::reduce;
    job->root = rooted ? call.options().root : 0;
    Fingerprint& f = job->mine;
    f.sequence = call.sequence();
    f.kind = static_cast<std::uint8_t>(call.kind());
    f.op = reduces(call.kind()) ? static_cast<std::uint8_t>(op) : 0;
    f.root = job->root;
    f.name_hash = std::hash<std::string>{}(call.options().name);
    copy_text(f.name, sizeof f.name, call.options().name);
    if (t.defined()) {
      job->type = mpi_type(t.dtype());
      job->count = static_cast<int>(t.numel());
      f.count = t.numel();
      f.dtype = static_cast<std::uint8_t>(t.dtype());
    }
    return job;
  }

  std::vector<int> chunk_counts(std::int64_t count, std::vector<int>* displs) const {
    std::vector<int> counts;
    for (int r = 0; r < group_->size; ++r) {
      const Chunk k = chunk(count, group_->size, r);
      counts.push_back(static_cast<int>(k.size()));
      displs->push_back(static_cast<int>(k.begin));
    }
    return counts;
  }

  // The hold op: holds the tensors (reads / writes) until the fiber
  // completes it; runs even when an input failed, so that the peers learn
  // of it instead of waiting.
  template <class Bind>
  void push(const Call& call, std::unique_ptr<Job> job, const std::vector<Tensor>& reads,
            const std::vector<Tensor>& writes, Bind bind) {
    for (const Tensor& t : reads) job->tensors.push_back(t);
    for (const Tensor& t : writes) job->tensors.push_back(t);
    try {
      push_tensor_op_async(
          group_->device, reads, writes,
          [job = std::shared_ptr<Job>(std::move(job)), bind](RunContext& ctx, const TensorData& d,
                                                             Completion done) mutable {
            if (!ctx.failed_input) bind(*job, d);
            start(std::move(job), ctx, std::move(done));
          },
          OpOptions{.priority = call.options().priority, .name = call.label(), .run_on_failed_input = true});
    } catch (...) {
      break_after_failed_push(call);
      throw;
    }
  }

  // The call took its number but its push failed: later collectives would
  // wait at the gates for it, and the peers for its fingerprint. The
  // communicator is broken (on the communication thread, which owns that
  // state): later calls fail at once, the peers at their deadline.
  void break_after_failed_push(const Call& call) {
    static_cast<void>(MpiProcess::get().thread().spawn([group = group_, label = call.label()] {
      if (group->broken.empty()) group->broken = label + ": its push failed on this rank";
    }));
  }

  static void start(std::shared_ptr<Job> job, RunContext& ctx, Completion done) {
    job->done = std::move(done);
    job->failed_input = ctx.failed_input;
    if (job->failed_input) {
      job->mine.failed = 1;
      try {
        std::rethrow_exception(job->failed_input);
      } catch (const std::exception& e) {
        copy_text(job->mine.reason, sizeof job->mine.reason, e.what());
      } catch (...) {
        copy_text(job->mine.reason, sizeof job->mine.reason, "(not a std::exception)");
      }
    }
    job->deadline = Clock::now() + job->group->timeout;
    CommThread& thread = MpiProcess::get().thread();
    const std::shared_ptr<Job> kept = job;
    if (!thread.spawn([job = std::move(job), &thread] { run(*job, thread); }))
      complete(*kept, comm_error(*kept, "the process is exiting (Weft's MPI communication thread has stopped)"));
  }

  std::shared_ptr<MpiGroup> group_;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_backend(CommunicatorState& state, const CommunicatorOptions& options) {
  auto group = std::make_shared<MpiGroup>();
  group->device = state.devices.front();
  group->timeout = resolve_timeout(options);
  group->fingerprints = resolve_fingerprints(options);
  MpiProcess& process = MpiProcess::get();
  group->rank = process.rank();
  group->size = process.size();
  group->sent = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(group->size));
  group->received = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(group->size));
  group->send_gate.resize(static_cast<std::size_t>(group->size));
  group->recv_gate.resize(static_cast<std::size_t>(group->size));
  // Duplicate MPI_COMM_WORLD three times on the communication thread, with the
  // deadline (a rank that never creates its communicator must not hang the
  // others): MPI_Comm_idup is collective and non-blocking.
  std::promise<std::string> created;
  std::future<std::string> result = created.get_future();
  CommThread& thread = process.thread();
  const bool spawned = thread.spawn([&created, &thread, g = group.get()] {
    // On the heap: MPI writes the new communicators when the requests
    // complete, which a rank arriving after the deadline makes happen after
    // this fiber has given up (the block is then left to MPI).
    struct Pending {
      MPI_Comm comms[3] = {MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL};
      MPI_Request requests[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    };
    auto pending = std::make_unique<Pending>();
    for (int i = 0; i < 3; ++i)
      if (const int rc = MPI_Comm_idup(MPI_COMM_WORLD, &pending->comms[i], &pending->requests[i]); rc != MPI_SUCCESS) {
        if (i > 0) static_cast<void>(pending.release());
        created.set_value("MPI_Comm_idup failed: " + mpi_error_text(rc));
        return;
      }
    int done = 0;
    const auto waited = thread.poll_until(
        [&] {
          MPI_Testall(3, pending->requests, &done, MPI_STATUSES_IGNORE);
          return done != 0;
        },
        Clock::now() + g->timeout);
    if (waited != CommThread::Wait::done) {
      static_cast<void>(pending.release());
      created.set_value(waited == CommThread::Wait::stopping
                            ? std::string("the process is exiting")
                            : "not every rank created its communicator within " + seconds_text(g->timeout) +
                                  " (communicators are created collectively, in the same order on every rank)");
      return;
    }
    for (MPI_Comm c : pending->comms) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    g->check = pending->comms[0];
    g->data = pending->comms[1];
    g->p2p = pending->comms[2];
    created.set_value("");
  });
  if (!spawned) created.set_value("the process is exiting (Weft's MPI communication thread has stopped)");
  if (const std::string error = result.get(); !error.empty())
    throw CommunicationError("weft::parallel::Communicator::mpi (rank " + std::to_string(group->rank) + " of " +
                                 std::to_string(group->size) + "): " + error,
                             group->rank);
  state.size = group->size;
  state.local_ranks = {group->rank};
  return std::make_unique<MpiBackend>(std::move(group));
}

}  // namespace weft::parallel::detail
