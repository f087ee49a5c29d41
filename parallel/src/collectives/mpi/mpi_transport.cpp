// The MPI transport: Communicator::mpi's settings, the hold ops that hand
// collectives and messages to the communication thread, and the creation of
// a communicator (mpi_group.h; docs/design/parallel-collectives.md).
#include <algorithm>
#include <climits>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/mpi/mpi_group.h"
#include "weft/env.h"
#include "weft/tensor_op.h"

namespace weft::parallel::detail {

// ---- options from the environment -----------------------------------------------

std::chrono::milliseconds collective_timeout(const CommunicatorOptions& options) {
  if (options.timeout) {
    if (options.timeout->count() <= 0)
      throw InvalidArgument("weft::parallel::Communicator: CommunicatorOptions::timeout must be positive");
    return *options.timeout;
  }
  const double seconds = env::real_if("WEFT_COLLECTIVE_TIMEOUT", 300, [](double s) { return s > 0 && s <= 1e7; },
                                      "a positive number of seconds, such as 300 or 2.5");
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000 + 0.5));
}

bool collective_fingerprints(const CommunicatorOptions& options) {
  if (options.fingerprints) return *options.fingerprints;
  return env::flag_or("WEFT_COLLECTIVE_CHECK", true, "fingerprints on", "off");
}

namespace {

// WEFT_MPI_LANE: 1 (the default) runs large collectives' data phases on the
// blocking lane where every rank has MPI_THREAD_MULTIPLE; 0 keeps them
// non-blocking on the communication thread (measurements, tests of that path).
bool mpi_lane_wanted() {
  return env::flag_or("WEFT_MPI_LANE", true, "a blocking lane for large collectives", "non-blocking calls only");
}

// The fiber of one job.
void run(Job& job, CommThread& thread) {
  if (job.kind == Kind::send) return run_send(job, thread);
  if (job.kind == Kind::recv) return run_recv(job, thread);
  run_collective(job, thread);
}

// On the communication thread: g's four communicators, duplicated from
// `parent` one at a time with g's deadline (a rank that never creates its
// communicator must not hang the others: MPI_Comm_idup is collective and
// non-blocking), and the blocking lane where every rank can use it. Returns
// why not, or "".
std::string duplicate_into(MpiGroup& g, MPI_Comm parent, CommThread& thread, bool lane_wanted) {
  // On the heap: MPI writes the new communicators when the requests
  // complete, which a rank arriving after the deadline makes happen after
  // this fiber has given up (the block is then left to MPI).
  struct Pending {
    MPI_Comm comms[4] = {MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL};
    MPI_Request requests[5] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                               MPI_REQUEST_NULL};
    int lane_level = 0;  // this rank's thread level (0 with WEFT_MPI_LANE=0), then every rank's least
  };
  auto pending = std::make_unique<Pending>();
  // One at a time: Open MPI 4.1 has hung with several MPI_Comm_idup of one
  // communicator outstanding at once (under ASan, one rank's duplicate
  // never completing; Open MPI's issue tracker discusses it).
  // The fifth step agrees on the blocking lane: every rank must use it for
  // the same collectives, so it runs only where all ranks can.
  const Clock::time_point deadline = Clock::now() + g.timeout;
  pending->lane_level = lane_wanted ? MpiProcess::get().thread_level() : 0;
  for (int i = 0; i < 5; ++i) {
    const int posted = i < 4 ? MPI_Comm_idup(parent, &pending->comms[i], &pending->requests[i])
                             : MPI_Iallreduce(MPI_IN_PLACE, &pending->lane_level, 1, MPI_INT, MPI_MIN,
                                              pending->comms[3], &pending->requests[i]);
    if (posted != MPI_SUCCESS) return WEFT_MPI_FAILURE(i < 4 ? "MPI_Comm_idup" : "MPI_Iallreduce", posted);
    int rc = MPI_SUCCESS;
    const auto waited = thread.poll_until([&] { return test_all({&pending->requests[i]}, rc); }, deadline);
    if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
      static_cast<void>(pending.release());
      return rc != MPI_SUCCESS ? "creating the communicator: " + WEFT_MPI_FAILURE("MPI_Test", rc)
             : waited == CommThread::Wait::stopping
                 ? std::string("the process is exiting")
                 : "not every rank created its communicator within " + seconds_text(g.timeout) +
                       " (communicators are created collectively, in the same order on every rank)";
    }
  }
  for (MPI_Comm c : pending->comms) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  {
    // Each member's world rank, for the heartbeat's declared deaths.
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(pending->comms[0], &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks(static_cast<std::size_t>(g.size));
    for (int r = 0; r < g.size; ++r) ranks[static_cast<std::size_t>(r)] = r;
    g.world_ranks.assign(ranks.size(), -1);
    MPI_Group_translate_ranks(mine, g.size, ranks.data(), world, g.world_ranks.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
  }
  g.check = pending->comms[0];
  g.data = pending->comms[1];
  g.p2p = pending->comms[2];
  g.blocking = pending->comms[3];
  if (pending->lane_level == MPI_THREAD_MULTIPLE) g.lane = std::make_unique<BlockingLane>(thread);
  watch_group(g);
  return "";
}

std::shared_ptr<MpiGroup> split_group(const std::shared_ptr<MpiGroup>& parent, const std::vector<int>& colors);

// ---- the transport ------------------------------------------------------------------

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(std::shared_ptr<MpiGroup> group) : group_(std::move(group)) {}
  std::string str() const override { return group_->str(); }

  void check(const Call& call, std::int64_t elements) const override {
    if (elements > INT_MAX)
      call.refuse(std::to_string(elements) + " elements: more than MPI's int counts can hold (" +
                  std::to_string(INT_MAX) + ")");
  }

  void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    committed(call, [&] {
      auto job = make_job(call, tensors[0], op);
      push(call, std::move(job), tensors, tensors, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
    });
  }
  void broadcast(const Call& call, const std::vector<Tensor>& tensors) override {
    committed(call, [&] {
      auto job = make_job(call, tensors[0], ReduceOp::sum);
      if (group_->rank == job->root) {
        push(call, std::move(job), tensors, {}, [](Job& j, const TensorData& d) { j.in = d.inputs[0]; });
      } else {
        push(call, std::move(job), {}, tensors, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
      }
    });
  }
  void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    committed(call, [&] {
      auto job = make_job(call, tensors[0], op);
      if (group_->rank == job->root) {
        push(call, std::move(job), tensors, tensors, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
      } else {
        push(call, std::move(job), tensors, {}, [](Job& j, const TensorData& d) { j.in = d.inputs[0]; });
      }
    });
  }
  void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override {
    committed(call, [&] {
      auto job = make_job(call, inputs[0], op);
      job->counts = chunk_counts(inputs[0].numel(), &job->displs);
      push(call, std::move(job), inputs, outputs, [](Job& j, const TensorData& d) {
        j.in = d.inputs[0];
        j.out = d.outputs[0];
      });
    });
  }
  // In place: MPI_IN_PLACE (mpi_collectives.cpp, gather_source).
  bool all_gather_in_place() const override { return true; }
  void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    committed(call, [&] {
      auto job = make_job(call, outputs[0], ReduceOp::sum);
      job->counts = chunk_counts(outputs[0].numel(), &job->displs);
      push(call, std::move(job), inputs, outputs, [](Job& j, const TensorData& d) {
        j.in = d.inputs[0];
        j.out = d.outputs[0];
      });
    });
  }
  void send(Call& call, const Tensor& tensor, int from, int to) override {
    (void)from;
    {
      std::lock_guard lock(group_->messages_mutex);
      call.commit_message(++group_->sent[{to, call.channel()}], to);
    }
    committed(call, [&] {
      auto job = make_job(call, tensor, ReduceOp::sum);
      job->root = job->mine.root = to;
      job->channel = call.channel();
      push(call, std::move(job), {tensor}, {}, [](Job& j, const TensorData& d) { j.in = d.inputs[0]; });
    });
  }
  void recv(Call& call, const Tensor& tensor, int from, int to) override {
    (void)to;
    {
      std::lock_guard lock(group_->messages_mutex);
      call.commit_message(++group_->received[{from, call.channel()}], from);
    }
    committed(call, [&] {
      auto job = make_job(call, tensor, ReduceOp::sum);
      job->root = job->mine.root = from;
      job->channel = call.channel();
      push(call, std::move(job), {}, {tensor}, [](Job& j, const TensorData& d) { j.out = d.outputs[0]; });
    });
  }
  // The fingerprint check of a collective whose data another library moves
  // (NCCL): the hold op reads the collective's inputs (so that a failed one
  // reaches every rank) and writes `token`, so that a mismatch, a failed
  // input or a missing rank fails it on every rank and the data phase,
  // which reads it, learns of it.
  void check_only(const Call& call, const Tensor& described, const std::vector<Tensor>& reads, const Tensor& token,
                  ReduceOp op, std::shared_ptr<CheckAfter> after) {
    committed(call, [&] {
      auto job = make_job(call, described, op);
      job->check_only = true;
      job->after = std::move(after);
      push(call, std::move(job), reads, {token}, [](Job&, const TensorData&) {});
    });
  }
  // The same for a message: its ends exchange their records and no data. A
  // send's hold op reads the tensor (its record says whether it failed); a
  // recv's reads nothing and so exchanges at once.
  void check_message_only(Call& call, const Tensor& described, int peer, const Tensor& token) {
    const bool sending = call.kind() == Kind::send;
    {
      std::lock_guard lock(group_->messages_mutex);
      auto& numbers = sending ? group_->sent : group_->received;
      call.commit_message(++numbers[{peer, call.channel()}], peer);
    }
    committed(call, [&] {
      auto job = make_job(call, described, ReduceOp::sum);
      job->root = job->mine.root = peer;
      job->channel = call.channel();
      job->check_only = true;
      push(call, std::move(job), sending ? std::vector<Tensor>{described} : std::vector<Tensor>{}, {token},
           [](Job&, const TensorData&) {});
    });
  }

  std::unique_ptr<Transport> split(CommunicatorState& into, const std::vector<int>& colors) const override {
    std::shared_ptr<MpiGroup> group = split_group(group_, colors);
    into.size = group->size;
    into.local_ranks = {group->rank};
    return std::make_unique<MpiTransport>(std::move(group));
  }

  bool records_flight() const override { return true; }

  void barrier(const Call& call) override {
    committed(call, [&] {
      auto job = make_job(call, Tensor(), ReduceOp::sum);
      send_fingerprint(job);
      call.state().engine->push_async(
          [job](RunContext& ctx, Completion done) mutable { start(std::move(job), ctx, std::move(done)); },
          group_->device, {}, {}, OpOptions{.priority = call.options().priority, .name = call.label(), .run_inline = true});
    });
  }


 private:
  std::shared_ptr<Job> make_job(const Call& call, const Tensor& t, ReduceOp op) const {
    auto job = std::make_shared<Job>();
    job->group = group_;
    job->label = call.label();
    job->flight = call.flight();
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
      f.shape_hash = shape_hash(t.shape());
      copy_text(f.shape, sizeof f.shape, t.shape().str());
      if (reduces(call.kind()) && is_half(t.dtype())) {  // reduced in float32 (widen_half)
        job->half = t.dtype();
        job->type = MPI_FLOAT;
      }
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
  void push(const Call& call, std::shared_ptr<Job> job, const std::vector<Tensor>& reads,
            const std::vector<Tensor>& writes, Bind bind) {
    for (const Tensor& t : reads) job->tensors.push_back(t);
    for (const Tensor& t : writes) job->tensors.push_back(t);
    send_fingerprint(job);
    push_tensor_op_async(
        group_->device, reads, writes,
        [job = std::move(job), bind](RunContext& ctx, const TensorData& d, Completion done) mutable {
          if (!ctx.failed_input) {
            bind(*job, d);
            widen_half(*job);
          }
          start(std::move(job), ctx, std::move(done));
        },
        OpOptions{.priority = call.options().priority, .name = call.label(), .run_on_failed_input = true, .run_inline = true});
  }

  // A collective's fingerprint leaves now, while the tensors' producers
  // still run: the group's record fiber sends it and compares the peers'
  // (mpi_collectives.cpp), and the collective's own fiber, started when the
  // hold op runs, finds the verdict in the job.
  void send_fingerprint(const std::shared_ptr<Job>& job) {
    if (group_->fingerprints && job->kind != Kind::send && job->kind != Kind::recv) queue_fingerprint(job);
  }

  // Everything after a call took its sequence number. If that throws (an
  // allocation, the engine refusing the push), the number never reaches
  // the record fiber or the gates, and the collectives behind it would wait
  // for it: the communicator is broken instead (break_after_failed_push),
  // and the error reaches the caller.
  template <class F>
  void committed(const Call& call, F&& body) {
    try {
      body();
    } catch (...) {
      break_after_failed_push(call);
      throw;
    }
  }

  // The call took its number but its push failed: later collectives would
  // wait at the gates for it, and the peers for its fingerprint. The
  // communicator is broken (on the communication thread, which owns that
  // state): later calls fail at once, the peers at their deadline; the
  // record fiber then fails the fingerprints it holds (mpi_collectives.cpp).
  void break_after_failed_push(const Call& call) {
    static_cast<void>(MpiProcess::get().thread().spawn([group = group_, label = call.label()] {
      group->set_broken(label + ": its push failed on this rank");
    }));
  }

  static void start(std::shared_ptr<Job> job, RunContext& ctx, Completion done) {
    flight_started(job->flight);
    job->done = std::move(done);
    job->failed_input = ctx.failed_input;
    // A send's header says why its input failed; a collective's fingerprint
    // left at push (the record fiber may be reading it now): its status
    // will say (mpi_collectives.cpp).
    if (job->failed_input && (job->kind == Kind::send || job->kind == Kind::recv)) {
      job->mine.failed = 1;
      copy_text(job->mine.reason, sizeof job->mine.reason, failure_text(job->failed_input));
    }
    job->deadline = Clock::now() + job->group->timeout;
    CommThread& thread = MpiProcess::get().thread();
    // Where it can, a collective bound for the blocking lane starts its
    // data phase here, without waiting for its fiber (mpi_group.h).
    const bool began = job->kind != Kind::send && job->kind != Kind::recv && begin_data_phase(*job);
    const std::shared_ptr<Job> kept = job;
    // Its fiber then only watches the lane's call: it need not wake the
    // communication thread (after a lane call, this runs on the lane's
    // thread, just before its next call).
    const bool watching = began && job->began_failure.empty();
    if (!thread.spawn([job = std::move(job), &thread] { run(*job, thread); },
                      watching ? CommThread::Start::soon : CommThread::Start::now)) {
      drop_lane_call(*kept);
      if (!kept->lane_completed)
        complete(*kept, comm_error(*kept, "the process is exiting (Weft's MPI communication thread has stopped)"));
    } else if (watching && kept->ticket->state.load(std::memory_order_acquire) == LaneTicket::done &&
               !kept->lane_completed) {
      // The call already ended, and the lane left the job to this fiber; its
      // wake-up may have come before the spawn and found no fiber to start
      // (the thread then sleeps again, quietly up to CommThread::kQuietSleep).
      // A lane that has not stored `done` yet wakes the thread after it, and
      // finds the fiber queued.
      thread.wake();
    }
  }

  std::shared_ptr<MpiGroup> group_;
};

// ---- sub-communicators ------------------------------------------------------------

// What ranks compare before a split: FNV-1a over the colors and their count.
std::uint64_t colors_hash(const std::vector<int>& colors) {
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(colors.size());
  for (const int c : colors) mix(static_cast<std::uint32_t>(c));
  return h;
}

std::string split_colors_text(const std::vector<int>& colors) {
  std::string text = "{";
  for (std::size_t i = 0; i < colors.size(); ++i) text += (i ? ", " : "") + std::to_string(colors[i]);
  return text + "}";
}

// The split's messages on the parent's check communicator (the fingerprints
// use tags 0 and 1 there: mpi_collectives.cpp).
constexpr int kSplitTag = 2;

// The group of the parent's ranks that share this rank's colour (collective
// over the parent), on the communication thread: every rank sends the hash
// of its colors to every other, polled with the parent's deadline (a rank
// that never calls is named); all equal, MPI_Comm_split of the parent's
// check communicator (blocking, but every rank has arrived), ranked as in
// the parent, and the group's four communicators duplicated from it.
std::shared_ptr<MpiGroup> split_group(const std::shared_ptr<MpiGroup>& parent, const std::vector<int>& colors) {
  MpiProcess& process = MpiProcess::get();
  const std::string what = "weft::parallel::Communicator::split (" + parent->str() + ")";
  if (parent->is_broken.load(std::memory_order_acquire))
    throw CommunicationError(what + ": the communicator is broken (an earlier collective on it failed)", parent->rank);
  auto group = std::make_shared<MpiGroup>();
  group->device = parent->device;
  group->timeout = parent->timeout;
  group->fingerprints = parent->fingerprints;
  group->world_rank = process.rank();
  struct Outcome {
    std::string error;
    int peer = CommunicationError::kNoPeer;
  };
  std::promise<Outcome> created;
  std::future<Outcome> result = created.get_future();
  CommThread& thread = process.thread();
  const bool lane_wanted = mpi_lane_wanted();
  const std::uint64_t hash = colors_hash(colors);
  const int color = colors[static_cast<std::size_t>(parent->rank)];
  const std::string mine = split_colors_text(colors);
  const bool spawned = thread.spawn([&created, &thread, lane_wanted, hash, color, &mine, p = parent.get(),
                                     g = group.get()] {
    const int n = p->size, me = p->rank;
    // On the heap: a peer that never calls leaves its requests to MPI.
    struct Pending {
      std::uint64_t mine = 0;
      std::vector<std::uint64_t> theirs;
      std::vector<MPI_Request> recvs, sends;
    };
    auto pending = std::make_unique<Pending>();
    pending->mine = hash;
    pending->theirs.assign(static_cast<std::size_t>(n), 0);
    pending->theirs[static_cast<std::size_t>(me)] = hash;
    pending->recvs.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    pending->sends.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const auto k = static_cast<std::size_t>(r);
      int rc = MPI_Irecv(&pending->theirs[k], 1, MPI_UINT64_T, r, kSplitTag, p->check, &pending->recvs[k]);
      if (rc == MPI_SUCCESS)
        rc = MPI_Isend(&pending->mine, 1, MPI_UINT64_T, r, kSplitTag, p->check, &pending->sends[k]);
      if (rc != MPI_SUCCESS) {
        static_cast<void>(pending.release());
        created.set_value({WEFT_MPI_FAILURE("MPI_Isend", rc), r});
        return;
      }
    }
    int rc = MPI_SUCCESS;
    const auto waited = thread.poll_until(
        [&] {
          bool all = true;
          for (auto* requests : {&pending->recvs, &pending->sends})
            for (MPI_Request& q : *requests) {
              if (q == MPI_REQUEST_NULL) continue;
              int flag = 0;
              if ((rc = MPI_Test(&q, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return true;
              if (!flag) all = false;
            }
          return all;
        },
        Clock::now() + p->timeout);
    if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
      std::string missing;
      int first = CommunicationError::kNoPeer, count = 0;
      for (int r = 0; r < n; ++r)
        if (pending->recvs[static_cast<std::size_t>(r)] != MPI_REQUEST_NULL) {
          missing += (count++ ? ", " : "") + std::to_string(r);
          if (first < 0) first = r;
        }
      static_cast<void>(pending.release());
      created.set_value(
          {rc != MPI_SUCCESS ? "comparing the colors: " + WEFT_MPI_FAILURE("MPI_Test", rc)
           : waited == CommThread::Wait::stopping
               ? std::string("the process is exiting")
               : std::string(count == 1 ? "rank " : "ranks ") + missing + " did not split this communicator within " +
                     seconds_text(p->timeout) +
                     " (a split is collective: every rank splits, in the same order as it makes its other "
                     "communicators and collectives)",
           first});
      return;
    }
    for (int r = 1; r < n; ++r)
      if (pending->theirs[static_cast<std::size_t>(r)] != pending->theirs[0]) {
        created.set_value({"ranks 0 and " + std::to_string(r) +
                               " passed different colors (every rank passes the same colors, one per member; this "
                               "rank passed " + mine + ")",
                           me == r ? 0 : r});
        return;
      }
    MPI_Comm sub = MPI_COMM_NULL;
    if ((rc = MPI_Comm_split(p->check, color, me, &sub)) != MPI_SUCCESS) {
      created.set_value({WEFT_MPI_FAILURE("MPI_Comm_split", rc)});
      return;
    }
    MPI_Comm_rank(sub, &g->rank);
    MPI_Comm_size(sub, &g->size);
    std::string error = duplicate_into(*g, sub, thread, lane_wanted);
    if (error.empty()) MPI_Comm_free(&sub);  // else left to MPI: a duplicate may still be under way
    created.set_value({std::move(error)});
  });
  if (!spawned) created.set_value({"the process is exiting (Weft's MPI communication thread has stopped)"});
  const Outcome outcome = result.get();
  if (!outcome.error.empty()) throw CommunicationError(what + ": " + outcome.error, parent->rank, outcome.peer);
  return group;
}

}  // namespace

void check_across(const Communicator& comm, Kind kind, const Tensor& described, const std::vector<Tensor>& reads,
                  const Tensor& token, ReduceOp op, const CollectiveOptions& options,
                  std::shared_ptr<CheckAfter> after) {
  auto* transport = dynamic_cast<MpiTransport*>(state_of(comm)->transport.get());
  if (!transport) throw Error("weft::parallel: check_across on a communicator that is not an MPI one");
  Call call(kind, comm, options);
  call.commit();
  transport->check_only(call, described, reads, token, op, std::move(after));
}

void check_message_across(const Communicator& comm, Kind kind, const Tensor& described, int peer, int channel,
                          const Tensor& token, const CollectiveOptions& options) {
  auto* transport = dynamic_cast<MpiTransport*>(state_of(comm)->transport.get());
  if (!transport) throw Error("weft::parallel: check_message_across on a communicator that is not an MPI one");
  if (kind != Kind::send && kind != Kind::recv) throw Error("weft::parallel: check_message_across of a collective");
  Call call(kind, comm, options);
  call.set_channel(channel);
  call.set_payload(described.dtype(), described.numel());  // checked already, as the message it checks (any device)
  transport->check_message_only(call, described, peer, token);
}

std::unique_ptr<Transport> make_mpi_transport(CommunicatorState& state, const CommunicatorOptions& options) {
  auto group = std::make_shared<MpiGroup>();
  group->device = state.devices.front();
  group->timeout = collective_timeout(options);
  group->fingerprints = collective_fingerprints(options);
  const HeartbeatSettings heartbeat = heartbeat_settings();
  MpiProcess& process = MpiProcess::get();
  group->rank = process.rank();
  group->size = process.size();
  if (const std::string dead = declared_deaths(); !dead.empty())
    throw CommunicationError("weft::parallel::Communicator::mpi (rank " + std::to_string(group->rank) + " of " +
                                 std::to_string(group->size) + "): " + dead,
                             group->rank);
  std::promise<std::string> created;
  std::future<std::string> result = created.get_future();
  CommThread& thread = process.thread();
  const bool lane_wanted = mpi_lane_wanted();
  const bool spawned = thread.spawn([&created, &thread, lane_wanted, heartbeat, g = group.get()] {
    // The first world communicator starts the heartbeat (collective: every
    // rank makes its world communicators in the same order).
    std::string error = start_heartbeat(thread, heartbeat, Clock::now() + g->timeout);
    if (error.empty()) error = duplicate_into(*g, MPI_COMM_WORLD, thread, lane_wanted);
    created.set_value(std::move(error));
  });
  if (!spawned) created.set_value("the process is exiting (Weft's MPI communication thread has stopped)");
  if (const std::string error = result.get(); !error.empty())
    throw CommunicationError("weft::parallel::Communicator::mpi (rank " + std::to_string(group->rank) + " of " +
                                 std::to_string(group->size) + "): " + error,
                             group->rank);
  state.size = group->size;
  state.local_ranks = {group->rank};
  return std::make_unique<MpiTransport>(std::move(group));
}

}  // namespace weft::parallel::detail
