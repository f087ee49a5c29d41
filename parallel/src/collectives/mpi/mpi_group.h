// The MPI transport's shared pieces (internal to parallel/): MPI in this
// process, a communicator's state, one collective's job, its fingerprint,
// and the helpers every fiber uses to finish a job. Only the communication
// thread touches a job or a group's mutable state (see comm_thread.h),
// except where a member says otherwise: the fingerprints' verdict, the data
// gate and the broken flag are also read by a hold op that begins its data
// phase itself (begin_data_phase).
// docs/design/parallel-collectives.md, "As built".
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <utility>
#include <mutex>
#include <map>
#include <string>
#include <vector>

#include "collectives/call.h"
#include "collectives/comm_thread.h"
#include "collectives/communicator_state.h"
#include "collectives/mpi/mpi_heartbeat.h"
#include "collectives/mpi/mpi_lane.h"
#include "weft/checked_call.h"
#include "weft/completion.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace weft::parallel::detail {

std::string seconds_text(std::chrono::milliseconds t);  // "2 s", "1500 ms"

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
  int thread_level() const noexcept { return provided_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

 private:
  MpiProcess() {
    int initialized = 0, finalized = 0, provided = 0;
    WEFT_MPI_CHECK(MPI_Initialized(&initialized));
    WEFT_MPI_CHECK(MPI_Finalized(&finalized));
    if (finalized) throw InvalidArgument("weft::parallel::Communicator::mpi: MPI was already finalized");
    if (!initialized) {
      WEFT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      owns_ = true;
    } else {
      WEFT_MPI_CHECK(MPI_Query_thread(&provided));
    }
    provided_ = provided;
    if (provided < MPI_THREAD_SERIALIZED)
      throw InvalidArgument(
          "weft::parallel::Communicator::mpi: MPI was initialized with thread level " + std::to_string(provided) +
          "; Weft calls MPI from its communication thread and needs MPI_THREAD_SERIALIZED or more (MPI_Init_thread; "
          "with SERIALIZED, the application must not call MPI while Weft's collectives are in flight)");
    WEFT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    WEFT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    thread_ = std::make_unique<CommThread>();
  }

  // Unchecked MPI calls: at exit there is no caller left to tell.
  static void at_exit() {
    MpiProcess& p = get();
    p.thread_->stop();
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A blocking lane's call that never returned (its communicator broke)
    // would make MPI_Finalize wait for it forever: the job then ends
    // unfinalized, which mpirun reports.
    // So would a rank the heartbeat declared dead (mpi_heartbeat.h): the
    // launcher then ends the job, which a survivor's error has failed.
    if (p.owns_ && !finalized && BlockingLane::calls_in_mpi() == 0 && !death_declared()) MPI_Finalize();
  }

  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<CommThread> thread_;
};

// ---- fingerprints ------------------------------------------------------------------

// What every rank says about its n-th collective, compared before data
// moves. Fixed size, sent as bytes.
struct Fingerprint {
  std::uint64_t sequence = 0;
  std::int64_t count = 0;       // elements (the whole buffer for reduce_scatter and all_gather)
  std::uint64_t name_hash = 0;  // of the whole name (name holds its start)
  std::int32_t root = 0;        // broadcast and reduce; 0 otherwise
  std::uint8_t kind = 0, op = 0, dtype = 0;
  std::uint8_t failed = 0;  // send and recv only (a collective's Status says it)
  std::uint64_t shape_hash = 0;  // of the tensor's dimensions (send and recv compare it)
  char shape[32] = {};           // their text, "[2, 3]" (its start)
  char name[40] = {};
  char reason[88] = {};  // failed: what the input's failure said (its start)
};
static_assert(std::is_trivially_copyable_v<Fingerprint>);

// What a rank says about its own n-th collective as it enters the data
// phase (collectives only; their Fingerprint went out at push, when the
// input's state was not known yet).
struct Status {
  std::uint64_t sequence = 0;
  std::uint8_t failed = 0;
  char reason[88] = {};  // failed: what the input's failure said (its start)
};
static_assert(std::is_trivially_copyable_v<Status>);

// Same collective: everything but the failed flag and the reason.
bool same_call(const Fingerprint& a, const Fingerprint& b);
bool reduces(Kind kind);
// "allreduce(sum) 'grad.fc1' [4096] float32 as #17"
std::string describe(const Fingerprint& f);
void copy_text(char* dst, std::size_t capacity, const std::string& text);
// What a message's fingerprint says of its tensor's shape.
std::uint64_t shape_hash(const Shape& shape);
// What a failed input's exception says.
std::string failure_text(const std::exception_ptr& failure);
MPI_Datatype mpi_type(DType t);

// ---- one communicator ----------------------------------------------------------------

struct Job;

// What the fibers of one communicator share. The MPI handles and the
// settings are fixed at creation; the rest is touched by fibers only.
struct MpiGroup {
  int rank = 0, size = 1;
  int world_rank = -1;  // a split's: this process's rank in MPI_COMM_WORLD (-1: the group is the world)
  Device device;
  std::chrono::milliseconds timeout{};
  bool fingerprints = true;
  // Duplicates of MPI_COMM_WORLD, or of a split's communicator.
  MPI_Comm check = MPI_COMM_NULL;  // fingerprints; splits of this group
  MPI_Comm data = MPI_COMM_NULL;   // the collectives themselves (another)
  MPI_Comm p2p = MPI_COMM_NULL;    // send and recv (a third)
  MPI_Comm blocking = MPI_COMM_NULL;  // the blocking lane's calls (a fourth)
  // Large collectives' data phases, where every rank has MPI_THREAD_MULTIPLE
  // (null otherwise: they run non-blocking on the communication thread).
  std::unique_ptr<BlockingLane> lane;
  // Messages pushed so far to and from each (rank, channel) (frontend
  // threads, under the mutex). Channels keep apart the messages of
  // different pairs of members that share two ranks (hierarchical groups).
  std::mutex messages_mutex;
  std::map<std::pair<int, int>, std::uint64_t> sent, received;

  // Fingerprints pushed and not yet taken by the record fiber (any thread,
  // under the mutex), and whether that fiber runs.
  std::mutex records_mutex;
  std::vector<std::shared_ptr<Job>> records_in;
  bool record_fiber = false;

  // ---- communication thread only ----
  std::uint64_t next_record = 1;  // the sequence number whose fingerprint goes next
  // Statuses and data phases are posted in sequence order.
  SequenceGate data_gate;
  std::map<std::pair<int, int>, SequenceGate> send_gate, recv_gate;  // per (peer, channel): in push order
  std::string broken;  // set by the first error MPI cannot recover from (set_broken)
  // A member was declared dead by the heartbeat (mpi_heartbeat.h): every
  // wait on the group ends at once (CommThread::poll_until's `cut`), and
  // every failure on it says lost_why, naming lost_peer (kNoPeer: this rank
  // itself was declared dead).
  bool lost = false;
  std::string lost_why;
  int lost_peer = CommunicationError::kNoPeer;
  std::vector<int> world_ranks;  // each member's rank in MPI_COMM_WORLD (set at creation)
  std::atomic<bool> is_broken{false};  // any thread: `broken` is set
  std::atomic<int> gate_waiters{0};    // fibers waiting at the data gate (any thread reads)
  std::vector<float> scratch;  // the ring's landing chunk (one ring at a time)

  void set_broken(std::string why) {
    if (!broken.empty()) return;
    broken = std::move(why);
    is_broken.store(true, std::memory_order_release);
  }

  std::string str() const {
    return "MPI communicator of " + std::to_string(size) + " rank" + (size == 1 ? "" : "s") + " (rank " +
           std::to_string(rank) + " on " + device.str() + " here" +
           (world_rank >= 0 ? "; world rank " + std::to_string(world_rank) : std::string()) + ")";
  }

  ~MpiGroup() {
    unwatch_group(this);
    lane.reset();  // idle unless broken (no job refers to the group any more)
    if (check == MPI_COMM_NULL) return;
    // A broken communicator may have requests in flight: leave it to MPI.
    if (!broken.empty()) return;
    CommThread& thread = MpiProcess::get().thread();
    auto free = [check = check, data = data, p2p = p2p, blocking = blocking]() mutable {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      MPI_Comm_free(&check);
      MPI_Comm_free(&data);
      MPI_Comm_free(&p2p);
      MPI_Comm_free(&blocking);
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
  int channel = 0;  // send and recv: tags of its own per channel
  bool check_only = false;  // fingerprints, then done: the data moves elsewhere (NCCL)
  std::shared_ptr<CheckAfter> after;  // check_only: the statuses are compared after the token (call.h)
  const void* in = nullptr;  // what this rank sends (null: in place)
  void* out = nullptr;       // what it receives
  std::vector<int> counts, displs;  // reduce_scatter and all_gather: per rank
  // A reduction of bfloat16 or float16 tensors: the tensors' dtype. Its data
  // phase runs in float32 (type MPI_FLOAT) on `wide`, which the hold op
  // fills from the tensors (widen_half); the result is rounded once into
  // `narrow_to` (narrow_half). float32 otherwise.
  DType half = DType::float32;
  std::vector<float> wide;
  void* narrow_to = nullptr;
  std::int64_t narrow_count = 0;
  // The tensors, so that an abandoned collective can keep their memory
  // (fail_broken); dropped before the hold op completes otherwise.
  std::vector<Tensor> tensors;
  // Set by the hold op; called through complete() or fail_broken().
  Completion done;
  std::exception_ptr failed_input;
  Clock::time_point deadline;
  // Collectives with fingerprints: the group's record fiber exchanges the
  // job's fingerprint from its push on and leaves the verdict here; the
  // job's own fiber reads it, and so may its hold op (begin_data_phase, on
  // another thread: the error is written before the verdict).
  enum class Check { pending, matched, failed };
  std::atomic<Check> check{Check::pending};
  std::exception_ptr check_error;  // failed: what every rank's collective fails with
  std::vector<Fingerprint> theirs;  // the peers' fingerprints, by rank
  std::vector<MPI_Request> record_recvs, record_sends;
  std::unique_ptr<Fingerprint> record;  // what this rank sent (left to MPI if a send never completes)
  // Collectives with fingerprints: each peer's status for this sequence
  // (received into `statuses`, posted with this rank's, under the data gate).
  std::vector<Status> statuses;
  std::vector<MPI_Request> status_recvs, status_sends;
  std::unique_ptr<Status> status;  // what this rank sent (left to MPI if a send never completes)
  // A rank whose input failed still takes part in the data phase, with
  // this memory (zeros) in place of the tensors', so that no peer waits.
  std::vector<std::byte> stand_in;
  bool lane_completed = false;  // the blocking lane's thread completed the job
  // The hold op began the data phase itself (begin_data_phase): the status
  // went out (or posting it failed, as began_failure says) and the call is
  // on the lane (ticket); the fiber only waits for its end.
  bool began = false;
  std::string began_failure;
  std::shared_ptr<LaneTicket> ticket;
  // The job's fiber started (its hold op ran), and when: the record fiber's
  // deadline for its fingerprints counts from then at the earliest.
  bool started = false;
  Clock::time_point started_at;
  FlightTicket flight;  // the flight recorder's entry (flight.h)
};
// Completes the hold op. The job lets go of the tensors first: once the
// hold op is complete, a waiter may destroy the engine they belong to.
void complete(Job& job, std::exception_ptr error = nullptr);
// Hands a collective's fingerprint to its group's record fiber (started
// when none runs). Any thread, at push, in any order of sequence numbers.
void queue_fingerprint(const std::shared_ptr<Job>& job);
std::exception_ptr comm_error(const Job& job, const std::string& why, int peer = CommunicationError::kNoPeer);
// The communicator cannot be trusted any more (MPI cannot cancel a started
// collective): later collectives on it fail at once with this message.
void fail_broken(Job& job, const std::string& why, int peer = CommunicationError::kNoPeer);
// A data phase that never completed: MPI may still write into the tensors'
// memory, so it is never freed.
void abandon_memory(Job& job);
// Half-precision reductions: the tensors' memory (job.in and job.out, as
// bound by the hold op) widened into job.wide, which takes their place;
// and, once the data phase is done, the result rounded into the tensor.
void widen_half(Job& job);
void narrow_half(Job& job);
// Waits until `gate` lets `seq` through; false once the job was completed.
bool wait_turn(Job& job, CommThread& thread, const SequenceGate& gate, std::uint64_t seq);
// Tests each request once; true when all are done, or when a test failed
// (`rc` says which).
bool test_all(std::initializer_list<MPI_Request*> requests, int& rc);

// A collective bound for the blocking lane whose fingerprints matched
// already and whose turn at the data gate has come begins its data phase on
// the hold op's own thread: its status goes out and the call goes to the
// lane at once, without waiting for its fiber to start (after a lane call,
// the next collective's hold op runs on the lane's thread, which then finds
// it queued). True when it did (Job::began); the fiber, spawned after, then
// only waits for the end. Any thread; the lane implies MPI_THREAD_MULTIPLE.
bool begin_data_phase(Job& job);
// A job begun by its hold op whose fiber never started (the process is
// exiting): its status requests are cancelled or left to MPI, and its lane
// call is abandoned (its memory kept), or waited for where the lane is
// finishing it.
void drop_lane_call(Job& job);

// The fibers: a collective (mpi_collectives.cpp), a send and a recv
// (mpi_messages.cpp).
void run_collective(Job& job, CommThread& thread);
void run_send(Job& job, CommThread& thread);
void run_recv(Job& job, CommThread& thread);

}  // namespace weft::parallel::detail
