// Collectives on real GPUs through NCCL (built where NCCL was found; used
// on the cuda backend unless WEFT_NCCL=0): in-process over the group's GPUs,
// and across MPI processes bootstrapped over MPI (the unique id broadcast
// through Weft's own MPI communicator, as Horovod does).
//
// One NCCL communicator per local member, each with a communication stream
// of its own. A collective is a hold op on cpu(0) (it holds the GPU
// tensors; run_on_failed_input) whose body hands the launch to a fiber of a
// communication thread. The fiber launches the collectives of one clique in
// sequence order (NCCL deadlocks when ranks launch in different orders, and
// inputs become ready in any order), the local members' calls as one NCCL
// group, from that one thread; records an event on each communication
// stream; and polls the events and the communicators' asynchronous errors
// until the work is done, then completes the hold op. Past the deadline
// (WEFT_COLLECTIVE_TIMEOUT) or on an asynchronous error it aborts the
// communicators (ncclCommAbort): the collective fails naming itself, later
// ones fail at once.
//
// Across processes each collective is checked ahead: Weft's MPI
// communicator of cpu(0) sends its fingerprint at push (check_across) and
// fails a token tensor on every rank when the ranks disagree or a rank is
// missing; the NCCL hold op reads the token, so no rank then launches NCCL,
// and none waits. Whether the peers' inputs failed is not waited for before
// the launch: each rank sends its status as it launches (a rank whose input
// failed launches from zeros), and the collective completes once NCCL is
// done and every status is in (CheckAfter, call.h): failed on every rank,
// naming the rank, where one says its input failed.
//
// send/recv across processes are ncclSend/ncclRecv, each in its own NCCL
// group, on a communicator of two ranks per ordered pair and channel
// (sender, receiver), made at the first message (its unique id travels over
// MPI) with a stream of its own: a pair's messages then queue only behind
// that pair's, never behind a message in the other direction (a pipeline's
// activations and gradients cross both ways). Each message's records are
// exchanged first over MPI (check_message_across): shapes, dtypes or names
// that differ fail both ends naming both, a sender's failed input fails the
// receiver naming it, and neither launches.
//
// Uneven reduce_scatter and all_gather and barrier take the other path: the
// ring over device copies in-process, host staging across processes;
// in-process send/recv the ring's copies.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/call.h"
#include "collectives/comm_thread.h"
#include "collectives/communicator_state.h"
#include "collectives/local_phase.h"
#include "weft/checked_call.h"
#include "weft/env.h"
#include "weft/error.h"
#include "weft/gpu_streams.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor_op.h"

namespace weft::parallel::detail {
namespace {

// A failed NCCL call while creating a communicator: its error (the family's
// message, weft/checked_call.h) with `what`, the communicator, in front.
[[noreturn]] void creation_failed(const std::string& what, int rank, const Error& e) {
  throw CommunicationError(what + ": " + e.what(), rank);
}

// The communication thread of NCCL's fibers (MPI's is MpiProcess's: this
// one must not initialize MPI).
CommThread& nccl_thread() { return process_thread(ThreadPurpose::nccl); }

// What the collectives of one communicator share.
struct Clique {
  std::vector<Device> devices;  // the local members'
  std::vector<ncclComm_t> comms;
  std::vector<std::unique_ptr<gpu::StreamResources>> streams;  // one communication stream per local member
  std::chrono::milliseconds timeout{};
  // Across processes with fingerprints off: a rank whose input failed
  // cannot tell its peers, so it aborts (they fail at their deadline).
  bool peers_unchecked = false;
  std::mutex mutex;
  std::string broken;  // under the mutex: why the communicators were aborted (then null)
  SequenceGate gate;   // fibers only: launches in sequence order

  ~Clique() {
    // Every collective keeps the clique until its work is done: nothing of
    // ours is in flight. Aborted communicators are gone already.
    if (!broken.empty()) return;
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);  // a pair's is made at its first message
  }
  int size() const { return static_cast<int>(devices.size()); }
  ncclComm_t comm(int r) const { return comms[static_cast<std::size_t>(r)]; }
  gpu::Stream* stream(int r) const { return streams[static_cast<std::size_t>(r)]->handles().stream; }
  cudaStream_t native(int r) const { return static_cast<cudaStream_t>(gpu::native_handle(stream(r))); }
  std::string broken_now() {
    std::lock_guard lock(mutex);
    return broken;
  }
  // No NCCL call of ours may hang after a failure. Fibers of other
  // collectives still polling see `broken` and stop touching the handles.
  void abort(const std::string& why) {
    std::lock_guard lock(mutex);
    if (!broken.empty()) return;
    broken = why;
    for (ncclComm_t& c : comms) {
      if (c) ncclCommAbort(c);
      c = nullptr;
    }
  }
  // The communicators' trouble ("" while none): aborted, or an asynchronous
  // error of a member's; and whether one is still working (non-blocking
  // communicators). Fibers only (abort runs on fibers or before any).
  std::string async_error(bool* in_progress) {
    if (std::string b = broken_now(); !b.empty()) return "the communicator was aborted (" + b + ")";
    for (int r = 0; r < size(); ++r) {
      if (!comm(r)) continue;  // a pair's, not made yet
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm(r), &state);
      if (state == ncclInProgress) {
        if (in_progress) *in_progress = true;
      } else if (state != ncclSuccess) {
        return "local member " + std::to_string(r) + " (" + devices[static_cast<std::size_t>(r)].str() +
               "): " + ncclGetErrorString(state) + " (" + ncclGetLastError(comm(r)) + ")";
      }
    }
    return "";
  }
};

// The element type NCCL reduces: float32 and the half types natively (NCCL
// accumulates halves in float32 inside each kernel and rounds per hop).
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::bfloat16: return ncclBfloat16;
    case DType::float16: return ncclFloat16;
    default: return ncclFloat32;
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::average: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

// The NCCL calls of one collective: local member r's, given the memory.
using Calls = std::function<void(int r, const Phase& phase)>;

// What a collective across processes adds to its launch.
struct Launch {
  // The peers' statuses, compared once NCCL is done (check_across's).
  std::shared_ptr<CheckAfter> after;
  // A rank whose own input failed launches all the same, from zeros of this
  // size (its peers launched already), and fails.
  std::size_t stand_in_bytes = 0;
  // Before the launch, once its turn came: makes a pair's communicator at
  // its first message ("" or why not).
  std::function<std::string(const Phase&, Clock::time_point deadline, CommThread&)> prepare;
};

// A failed input's stand-in on member 0's communication stream: zeros, and
// freed behind the launch in stream order (cudaMallocAsync).
void* stand_in(Clique& clique, std::size_t bytes) {
  void* p = nullptr;
  gpu::set_device(clique.devices.front().index());
  WEFT_CUDA_CHECK(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, clique.native(0)));
  WEFT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, clique.native(0)));
  return p;
}

// The fiber of one collective: waits for its turn, launches, polls, completes.
void run(const std::shared_ptr<Clique>& clique, const std::shared_ptr<Phase>& phase, std::uint64_t seq,
         const Calls& calls, std::exception_ptr failed_input, CommThread& thread, const Launch& launch = {}) {
  auto fail = [&](const std::string& why) {
    clique->abort(phase->what + ": " + why);
    phase->done(std::make_exception_ptr(CommunicationError(phase->what + ": " + why, CommunicationError::kNoPeer)));
  };
  // The hold did not wait for its tensors' GPU producers and handed their
  // history over (OpOptions::defer_gpu_waits): this fiber waits for them
  // first, holding no worker, so that every way out below comes after them
  // and the collective's deadline starts once its inputs exist. (A producer's
  // failure surfaces here and fails the collective.)
  std::exception_ptr producer_failed;
  if (thread.poll_until(
          [&] {
            for (const gpu::EventRef& e : phase->gpu_waits) {
              try {
                if (!e->done()) return false;
              } catch (...) {
                if (!producer_failed) producer_failed = std::current_exception();
              }
            }
            return true;
          },
          Clock::time_point::max()) == CommThread::Wait::stopping)
    for (const gpu::EventRef& e : phase->gpu_waits) {
      try {
        e->host_wait();  // exiting: nothing polls any more
      } catch (...) {
        if (!producer_failed) producer_failed = std::current_exception();
      }
    }
  if (!failed_input) failed_input = producer_failed;
  // The collectives before this one have deadlines of their own.
  if (thread.poll_until([&] { return clique->gate.open(seq); }, Clock::time_point::max()) ==
      CommThread::Wait::stopping) {
    clique->gate.pass(seq);
    return phase->done(std::make_exception_ptr(
        CommunicationError(phase->what + ": the process is exiting", CommunicationError::kNoPeer)));
  }
  // The check let every rank launch (its token completed), and this rank's
  // own input failed: it launches from zeros, its status says why, and
  // every rank fails once the statuses are in.
  const bool launch_anyway =
      failed_input && launch.after && launch.after->entered.load(std::memory_order_acquire) &&
      !clique->peers_unchecked;
  if (failed_input && !launch_anyway) {
    clique->gate.pass(seq);
    if (clique->peers_unchecked) clique->abort(phase->what + ": this rank's input failed (fingerprints are off)");
    return phase->done(failed_input);
  }
  if (const std::string broken = clique->broken_now(); !broken.empty()) {
    clique->gate.pass(seq);
    return phase->done(std::make_exception_ptr(
        CommunicationError(phase->what + ": the NCCL communicator is broken: " + broken, CommunicationError::kNoPeer)));
  }
  const auto deadline = Clock::now() + clique->timeout;
  if (launch.prepare) {
    if (const std::string why = launch.prepare(*phase, deadline, thread); !why.empty()) {
      clique->gate.pass(seq);
      return fail(why);
    }
  }
  void* zeros = nullptr;
  try {
    if (launch_anyway) {
      ::weft::detail::CheckContextGuard context(phase->what, clique->devices.front());
      zeros = stand_in(*clique, launch.stand_in_bytes);
      for (void*& p : phase->out) p = zeros;
      for (const void*& p : phase->in) p = zeros;
    }
  } catch (const std::exception& e) {
    clique->gate.pass(seq);
    return fail(std::string("a stand-in for its failed input: ") + e.what());
  }
  try {
    WEFT_NCCL_CHECK(ncclGroupStart());
    try {
      for (int r = 0; r < clique->size(); ++r) {
        // A failed call names the member's device (weft/checked_call.h).
        ::weft::detail::CheckContextGuard context(phase->what, clique->devices[static_cast<std::size_t>(r)]);
        calls(r, *phase);
      }
    } catch (...) {
      ncclGroupEnd();  // the group depth is per thread, shared by every clique
      throw;
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
  } catch (const std::exception& e) {
    clique->gate.pass(seq);
    return fail(std::string("launching failed: ") + e.what());  // some members may have launched
  }
  if (zeros) {  // after the launch, in stream order
    try {
      ::weft::detail::CheckContextGuard context(phase->what, clique->devices.front());
      WEFT_CUDA_CHECK(cudaFreeAsync(zeros, clique->native(0)));
    } catch (const std::exception& e) {
      clique->gate.pass(seq);
      return fail(std::string("freeing the stand-in for its failed input: ") + e.what());
    }
  }
  // A non-blocking communicator enqueues after ncclGroupEnd returned: the
  // next collective may be launched, and the events recorded, once it is
  // done.
  std::string async;
  const CommThread::Wait enqueued = thread.poll_until(
      [&] {
        bool in_progress = false;
        async = clique->async_error(&in_progress);
        return !async.empty() || !in_progress;
      },
      deadline);
  clique->gate.pass(seq);
  if (enqueued != CommThread::Wait::done) return fail("NCCL did not enqueue it in time; the communicator was aborted");
  if (!async.empty()) return fail("NCCL reported " + async + "; the communicator was aborted");
  std::vector<gpu::EventRef> events;
  try {
    for (int r = 0; r < clique->size(); ++r)
      events.emplace_back(gpu::Event::record(clique->devices[static_cast<std::size_t>(r)].index(), clique->stream(r)));
  } catch (const std::exception& e) {
    return fail(std::string("recording its events failed: ") + e.what());
  }
  std::string stream_failure;
  const CommThread::Wait waited = thread.poll_until(
      [&] {
        async = clique->async_error(nullptr);
        if (!async.empty()) return true;
        try {
          for (const gpu::EventRef& e : events)
            if (!e->done()) return false;
        } catch (const std::exception& e) {
          stream_failure = e.what();  // the stream's work failed
        }
        return true;
      },
      deadline);
  if (waited == CommThread::Wait::timeout)
    return fail("not complete within " + std::to_string(clique->timeout.count()) +
                " ms (WEFT_COLLECTIVE_TIMEOUT); the communicator was aborted");
  if (waited == CommThread::Wait::stopping) return fail("the process is exiting");
  if (!async.empty()) return fail("NCCL reported " + async + "; the communicator was aborted");
  if (!stream_failure.empty()) return fail("its stream failed: " + stream_failure + "; the communicator was aborted");
  if (launch_anyway) return phase->done(failed_input);
  if (launch.after) {
    // Each peer sent its status before it launched, and NCCL is done: a
    // delivery, which the MPI side bounds with its own deadline.
    if (thread.poll_until([&] { return launch.after->settled.load(std::memory_order_acquire); },
                          Clock::time_point::max()) == CommThread::Wait::stopping)
      return phase->done(std::make_exception_ptr(
          CommunicationError(phase->what + ": the process is exiting", CommunicationError::kNoPeer)));
    if (launch.after->error) return phase->done(launch.after->error);
  }
  phase->done();
}

const Device kHold = Device::cpu(0);

void push_op(const Call& call, const std::shared_ptr<Clique>& clique, const std::vector<Tensor>& reads,
             const std::vector<Tensor>& writes, Calls calls, Launch launch);

// A call that took a sequence number and will never launch (its push
// failed): the communicator is aborted — peers across processes would wait
// for this rank's launch — and the next collectives pass, failing at once.
void give_up_turn(const std::shared_ptr<Clique>& clique, std::uint64_t seq, const std::string& why) {
  static_cast<void>(nccl_thread().spawn([clique, seq, why] {
    clique->abort(why);
    clique->gate.pass(seq);
  }));
}

// The hold op of one NCCL collective (reads, then writes, as the collective
// documents them; `reads` may end with a check token), run even when an
// input failed, so that it passes its turn.
void push_nccl(const Call& call, const std::shared_ptr<Clique>& clique, const std::vector<Tensor>& reads,
               const std::vector<Tensor>& writes, Calls calls, Launch launch = {}) {
  try {
    push_op(call, clique, reads, writes, std::move(calls), std::move(launch));
  } catch (...) {
    give_up_turn(clique, call.sequence(), call.label() + ": its push failed on this rank");
    throw;
  }
}

void push_op(const Call& call, const std::shared_ptr<Clique>& clique, const std::vector<Tensor>& reads,
             const std::vector<Tensor>& writes, Calls calls, Launch launch) {
  push_tensor_op_async(
      kHold, reads, writes,
      [clique, what = call.label(), seq = call.sequence(), calls = std::move(calls), launch = std::move(launch)](
          RunContext& ctx, const TensorData& d, Completion done) mutable {
        auto phase = std::make_shared<Phase>();
        phase->what = what;
        phase->in.assign(d.inputs.begin(), d.inputs.end());
        phase->out = d.outputs;
        phase->done = std::move(done);
        if (ctx.gpu_waits) phase->gpu_waits = *ctx.gpu_waits;
        CommThread& thread = nccl_thread();
        if (!thread.spawn([clique, phase, seq, calls = std::move(calls), launch = std::move(launch),
                           failed = ctx.failed_input, &thread] { run(clique, phase, seq, calls, failed, thread, launch); }))
          phase->done(std::make_exception_ptr(
              CommunicationError(what + ": the process is exiting", CommunicationError::kNoPeer)));
      },
      OpOptions{.priority = call.options().priority,
                .name = call.label(),
                .run_on_failed_input = true,
                .run_inline = true,
                .defer_gpu_waits = true});
}

// A call another path carries took a sequence number: let the next through.
void pass_turn(const std::shared_ptr<Clique>& clique, std::uint64_t seq) {
  static_cast<void>(nccl_thread().spawn([clique, seq] { clique->gate.pass(seq); }));
}

std::shared_ptr<Clique> new_clique(const std::vector<Device>& devices, const CommunicatorOptions& options);

std::string members_text(const std::vector<Device>& devices) {
  std::string s;
  for (std::size_t i = 0; i < devices.size(); ++i) s += (i ? ", " : " ") + devices[i].str();
  return s;
}

// ---- in-process: one clique over the group's GPUs ----------------------------------

class NcclLocalTransport final : public Transport {
 public:
  NcclLocalTransport(std::shared_ptr<Clique> clique, std::unique_ptr<Transport> ring)
      : clique_(std::move(clique)), ring_(std::move(ring)) {}

  std::string str() const override {
    const int n = clique_->size();
    return "in-process NCCL communicator of " + std::to_string(n) + " GPU member" + (n == 1 ? "" : "s") + ":" +
           members_text(clique_->devices);
  }

  void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    const auto count = static_cast<std::size_t>(tensors[0].numel());
    const ncclDataType_t type = nccl_type(tensors[0].dtype());
    push_nccl(call, clique_, tensors, tensors, [clique = clique_, count, type, op](int r, const Phase& p) {
      WEFT_NCCL_CHECK(
          ncclAllReduce(p.out_at(r), p.out_at(r), count, type, nccl_op(op), clique->comm(r), clique->native(r)));
    });
  }
  void broadcast(const Call& call, const std::vector<Tensor>& tensors) override {
    const int root = call.options().root;
    const std::size_t bytes = tensors[0].nbytes();
    // The root's tensor is read, the others written (as bytes: any dtype).
    push_nccl(call, clique_, {tensors[static_cast<std::size_t>(root)]}, all_but(tensors, root),
              [clique = clique_, root, bytes](int r, const Phase& p) {
                void* into = r == root ? const_cast<void*>(p.in_at(0)) : p.out_at(r < root ? r : r - 1);
                WEFT_NCCL_CHECK(
                    ncclBroadcast(p.in_at(0), into, bytes, ncclUint8, root, clique->comm(r), clique->native(r)));
              });
  }
  void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    const int root = call.options().root;
    const auto count = static_cast<std::size_t>(tensors[0].numel());
    const ncclDataType_t type = nccl_type(tensors[0].dtype());
    // Read: the others in member order, then the root (reduced in place).
    std::vector<Tensor> reads = all_but(tensors, root);
    reads.push_back(tensors[static_cast<std::size_t>(root)]);
    push_nccl(call, clique_, reads, {tensors[static_cast<std::size_t>(root)]},
              [clique = clique_, root, count, type, op](int r, const Phase& p) {
                const void* from = r == root ? p.out_at(0) : p.in_at(r < root ? r : r - 1);
                void* into = r == root ? p.out_at(0) : nullptr;
                WEFT_NCCL_CHECK(
                    ncclReduce(from, into, count, type, nccl_op(op), root, clique->comm(r), clique->native(r)));
              });
  }
  // NCCL's reduce-scatter and all-gather take equal chunks; uneven ones
  // take the ring.
  void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override {
    const std::int64_t count = inputs[0].numel();
    if (count % clique_->size() != 0) {
      pass_turn(clique_, call.sequence());
      return ring_->reduce_scatter(call, inputs, outputs, op);
    }
    const auto part = static_cast<std::size_t>(count / clique_->size());
    const ncclDataType_t type = nccl_type(inputs[0].dtype());
    push_nccl(call, clique_, inputs, outputs, [clique = clique_, part, type, op](int r, const Phase& p) {
      WEFT_NCCL_CHECK(ncclReduceScatter(p.in_at(r), p.out_at(r), part, type, nccl_op(op), clique->comm(r),
                                        clique->native(r)));
    });
  }
  void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    const std::int64_t count = outputs[0].numel();
    if (count % clique_->size() != 0) {
      pass_turn(clique_, call.sequence());
      return ring_->all_gather(call, inputs, outputs);
    }
    const std::size_t part_bytes = outputs[0].nbytes() / static_cast<std::size_t>(clique_->size());
    push_nccl(call, clique_, inputs, outputs, [clique = clique_, part_bytes](int r, const Phase& p) {
      WEFT_NCCL_CHECK(
          ncclAllGather(p.in_at(r), p.out_at(r), part_bytes, ncclUint8, clique->comm(r), clique->native(r)));
    });
  }
  void barrier(const Call& call) override {
    pass_turn(clique_, call.sequence());
    ring_->barrier(call);
  }
  void send(Call& call, const Tensor& tensor, int from, int to) override { ring_->send(call, tensor, from, to); }
  void recv(Call& call, const Tensor& tensor, int from, int to) override { ring_->recv(call, tensor, from, to); }

 private:
  std::shared_ptr<Clique> clique_;
  std::unique_ptr<Transport> ring_;  // what NCCL does not carry
};

// ---- across processes: this rank's GPU in a clique bootstrapped over MPI ------------

class NcclAcrossTransport final : public Transport {
 public:
  NcclAcrossTransport(std::shared_ptr<Clique> clique, Communicator host, std::unique_ptr<Transport> staged,
                      CommunicatorOptions options)
      : clique_(std::move(clique)), host_(std::move(host)), staged_(std::move(staged)), options_(std::move(options)) {}

  std::string str() const override {
    return "NCCL communicator of " + std::to_string(host_.size()) + " ranks (rank " +
           std::to_string(host_.local_ranks().front()) + " with" + members_text(clique_->devices) +
           " here, bootstrapped and checked over MPI)";
  }
  void check(const Call& call, std::int64_t elements) const override { staged_->check(call, elements); }

  void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    const Tensor& t = tensors[0];
    const auto count = static_cast<std::size_t>(t.numel());
    const ncclDataType_t type = nccl_type(t.dtype());
    push_checked(call, t, op, {t}, {t}, [clique = clique_, count, type, op](int r, const Phase& p) {
      WEFT_NCCL_CHECK(
          ncclAllReduce(p.out_at(0), p.out_at(0), count, type, nccl_op(op), clique->comm(r), clique->native(r)));
    });
  }
  void broadcast(const Call& call, const std::vector<Tensor>& tensors) override {
    const Tensor& t = tensors[0];
    const int root = call.options().root;
    const std::size_t bytes = t.nbytes();
    const bool here = rank() == root;
    push_checked(call, t, ReduceOp::sum, here ? std::vector<Tensor>{t} : std::vector<Tensor>{},
                 here ? std::vector<Tensor>{} : std::vector<Tensor>{t},
                 [clique = clique_, root, bytes, here](int r, const Phase& p) {
                   void* buffer = here ? const_cast<void*>(p.in_at(0)) : p.out_at(0);
                   WEFT_NCCL_CHECK(
                       ncclBroadcast(buffer, buffer, bytes, ncclUint8, root, clique->comm(r), clique->native(r)));
                 });
  }
  void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    const Tensor& t = tensors[0];
    const int root = call.options().root;
    const auto count = static_cast<std::size_t>(t.numel());
    const bool here = rank() == root;
    const ncclDataType_t type = nccl_type(t.dtype());
    push_checked(call, t, op, {t}, here ? std::vector<Tensor>{t} : std::vector<Tensor>{},
                 [clique = clique_, root, count, type, op, here](int r, const Phase& p) {
                   void* into = here ? p.out_at(0) : nullptr;
                   WEFT_NCCL_CHECK(ncclReduce(p.in_at(0), into, count, type, nccl_op(op), root, clique->comm(r),
                                              clique->native(r)));
                 });
  }
  void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override {
    const std::int64_t count = inputs[0].numel();
    if (count % host_.size() != 0) {
      pass_turn(clique_, call.sequence());
      return staged_->reduce_scatter(call, inputs, outputs, op);
    }
    const auto part = static_cast<std::size_t>(count / host_.size());
    const ncclDataType_t type = nccl_type(inputs[0].dtype());
    push_checked(call, inputs[0], op, inputs, outputs, [clique = clique_, part, type, op](int r, const Phase& p) {
      WEFT_NCCL_CHECK(ncclReduceScatter(p.in_at(0), p.out_at(0), part, type, nccl_op(op), clique->comm(r),
                                        clique->native(r)));
    });
  }
  void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    const std::int64_t count = outputs[0].numel();
    if (count % host_.size() != 0) {
      pass_turn(clique_, call.sequence());
      return staged_->all_gather(call, inputs, outputs);
    }
    const std::size_t part_bytes = outputs[0].nbytes() / static_cast<std::size_t>(host_.size());
    push_checked(
        call, outputs[0], ReduceOp::sum, inputs, outputs, [clique = clique_, part_bytes](int r, const Phase& p) {
          WEFT_NCCL_CHECK(
              ncclAllGather(p.in_at(0), p.out_at(0), part_bytes, ncclUint8, clique->comm(r), clique->native(r)));
        });
  }
  void barrier(const Call& call) override {
    pass_turn(clique_, call.sequence());
    staged_->barrier(call);
  }
  void send(Call& call, const Tensor& tensor, int from, int to) override {
    (void)from;
    message(call, tensor, to, true);
  }
  void recv(Call& call, const Tensor& tensor, int from, int to) override {
    (void)to;
    message(call, tensor, from, false);
  }
  // The host communicator split, and a clique bootstrapped over its part.
  std::unique_ptr<Transport> split(CommunicatorState& into, const std::vector<int>& colors) const override {
    return make_nccl_mpi_transport(into, host_.split(colors), into.options);
  }

 private:
  int rank() const { return host_.local_ranks().front(); }
  // The fingerprint check over MPI, then the NCCL hold op, which reads the
  // check's token (the last of its reads). The token does not wait for the
  // peers' statuses: they are compared once NCCL is done (CheckAfter).
  void push_checked(const Call& call, const Tensor& described, ReduceOp op, std::vector<Tensor> reads,
                    const std::vector<Tensor>& writes, Calls calls) {
    Tensor token = Tensor::empty(described.engine(), Shape{0}, kHold);
    Launch launch;
    launch.after = std::make_shared<CheckAfter>();
    for (const Tensor& t : reads) launch.stand_in_bytes = std::max(launch.stand_in_bytes, t.nbytes());
    for (const Tensor& t : writes) launch.stand_in_bytes = std::max(launch.stand_in_bytes, t.nbytes());
    try {
      check_across(host_, call.kind(), described, reads, token, op, call.options(), launch.after);
    } catch (...) {
      give_up_turn(clique_, call.sequence(), call.label() + ": its check failed to push on this rank");
      throw;
    }
    reads.push_back(token);
    push_nccl(call, clique_, reads, writes, std::move(calls), std::move(launch));
  }

  // ---- send and recv: a communicator of two ranks per ordered pair and channel ----

  // This rank's messages to (or from) one peer on one channel.
  struct Link {
    std::shared_ptr<Clique> clique;  // one member (this rank's GPU), its communicator made at the first message
    Tensor id;                       // cpu(0): the unique id's bits, sent (receiver: received) over MPI
    std::uint64_t messages = 0;      // pushed so far: the gate's numbers
  };

  // The unique id of a pair travels on a channel of its own, apart from the
  // messages' checks (channel c's checks on c, its id on kMaxChannels - 1 - c).
  static int id_channel(int channel) { return Call::kMaxChannels - 1 - channel; }

  Link& link(const Call& call, int peer, bool sending) {
    const auto key = std::make_tuple(peer, call.channel(), sending);
    auto found = links_.find(key);
    if (found != links_.end()) return found->second;
    Engine& engine = *call.state().engine;
    const std::string pair = sending ? "rank " + std::to_string(rank()) + " -> rank " + std::to_string(peer)
                                     : "rank " + std::to_string(peer) + " -> rank " + std::to_string(rank());
    const CollectiveOptions id_options{.name = "NCCL unique id " + pair + " channel " + std::to_string(call.channel())};
    Link made;
    made.clique = new_clique(clique_->devices, options_);
    made.clique->peers_unchecked = clique_->peers_unchecked;
    made.clique->comms.assign(1, nullptr);
    static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0);
    constexpr std::size_t kFloats = sizeof(ncclUniqueId) / sizeof(float);
    if (sending) {  // the sender makes the pair's id and sends it
      ncclUniqueId id{};
      {
        ::weft::detail::CheckContextGuard context(call.label(), clique_->devices.front());
        WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
      }
      std::vector<float> bits(kFloats, 0.0f);
      std::memcpy(bits.data(), &id, sizeof id);
      made.id = Tensor::from_host(engine, Shape{static_cast<std::int64_t>(kFloats)}, bits, kHold);
      send_on(host_, made.id, peer, id_channel(call.channel()), id_options);
    } else {
      made.id = Tensor::empty(engine, Shape{static_cast<std::int64_t>(kFloats)}, kHold);
      recv_on(host_, made.id, peer, id_channel(call.channel()), id_options);
    }
    return links_.emplace(key, std::move(made)).first->second;
  }

  // One message: its records exchanged over MPI (a token fails on both ends
  // when they differ, and on the receiver when the sender's input failed),
  // then ncclSend or ncclRecv on the pair's communicator, which the first
  // message that launches makes (non-blocking, polled against the deadline).
  void message(Call& call, const Tensor& tensor, int peer, bool sending) {
    std::lock_guard lock(links_mutex_);
    Link& l = link(call, peer, sending);
    const std::uint64_t k = ++l.messages;
    call.commit_message(k, peer);
    const std::shared_ptr<Clique> clique = l.clique;
    Tensor token = Tensor::empty(tensor.engine(), Shape{0}, kHold);
    try {
      check_message_across(host_, sending ? Kind::send : Kind::recv, tensor, peer, call.channel(), token,
                           call.options());
    } catch (...) {
      give_up_turn(clique, k, call.label() + ": its check failed to push on this rank");
      throw;
    }
    std::vector<Tensor> reads, writes;
    if (sending) reads.push_back(tensor);
    else writes.push_back(tensor);
    reads.push_back(token);
    // Every message reads the pair's id (there once it arrived) and makes
    // the pair's communicator if no message before it did: the first may
    // have failed its check on both ends and launched nothing.
    reads.push_back(l.id);
    Launch launch;
    launch.prepare = [clique, sending, id_at = static_cast<int>(reads.size()) - 1, what = call.label()](
                         const Phase& phase, Clock::time_point deadline, CommThread& thread) -> std::string {
      if (clique->comms[0]) return "";  // fibers of one thread, in the pair's order: no race
      return make_pair_comm(*clique, phase.in_at(id_at), sending, what, deadline, thread);
    };
    const std::size_t bytes = tensor.nbytes();
    push_nccl(call, clique, reads, writes, [clique, bytes, sending](int r, const Phase& p) {
      // In the pair's communicator the sender is rank 0, the receiver rank 1.
      if (sending) WEFT_NCCL_CHECK(ncclSend(p.in_at(0), bytes, ncclUint8, 1, clique->comm(r), clique->native(r)));
      else WEFT_NCCL_CHECK(ncclRecv(p.out_at(0), bytes, ncclUint8, 0, clique->comm(r), clique->native(r)));
    }, std::move(launch));
  }

  // On the NCCL thread, at a pair's first message: its communicator of two
  // ranks, created non-blocking and polled, so that a peer that never makes
  // it fails this rank at the deadline, naming the message.
  static std::string make_pair_comm(Clique& clique, const void* id_bits, bool sending, const std::string& what,
                                    Clock::time_point deadline, CommThread& thread) {
    ncclUniqueId id{};
    std::memcpy(&id, id_bits, sizeof id);
    gpu::set_device(clique.devices.front().index());  // ncclCommInitRank's device: the calling thread's current one
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
      ::weft::detail::CheckContextGuard context(what, clique.devices.front());
      WEFT_NCCL_CHECK(ncclCommInitRankConfig(&clique.comms[0], 2, id, sending ? 0 : 1, &config));
    } catch (const std::exception& e) {
      clique.comms[0] = nullptr;
      return std::string("making the pair's NCCL communicator: ") + e.what();
    }
    ncclResult_t state = ncclInProgress;
    const CommThread::Wait made = thread.poll_until(
        [&] {
          ncclCommGetAsyncError(clique.comms[0], &state);
          return state != ncclInProgress;
        },
        deadline);
    if (made == CommThread::Wait::done && state == ncclSuccess) return "";
    if (made == CommThread::Wait::done)
      return std::string("making the pair's NCCL communicator: ") + ncclGetErrorString(state);
    return made == CommThread::Wait::stopping
               ? std::string("the process is exiting")
               : "the peer did not make the pair's NCCL communicator within " +
                     std::to_string(clique.timeout.count()) + " ms (WEFT_COLLECTIVE_TIMEOUT)";
  }

  std::shared_ptr<Clique> clique_;
  Communicator host_;                // the same ranks on cpu(0): bootstrap and fingerprints
  std::unique_ptr<Transport> staged_;  // what NCCL does not carry
  CommunicatorOptions options_;        // the pairs' cliques take its timeout
  std::mutex links_mutex_;             // pushes of messages (frontend threads)
  std::map<std::tuple<int, int, bool>, Link> links_;  // (peer, channel, sending)
};

std::shared_ptr<Clique> new_clique(const std::vector<Device>& devices, const CommunicatorOptions& options) {
  auto clique = std::make_shared<Clique>();
  clique->devices = devices;
  clique->timeout = collective_timeout(options);
  for (const Device d : devices)
    clique->streams.push_back(std::make_unique<gpu::StreamResources>(d.index(), gpu::StreamRole::peer, 0));
  return clique;
}

}  // namespace

bool nccl_wanted() {
  if (gpu::backend() != gpu::Backend::cuda) return false;
  return env::flag_or("WEFT_NCCL", true, "NCCL for GPU members", "Weft's own paths");
}

std::unique_ptr<Transport> make_nccl_transport(CommunicatorState& state, std::unique_ptr<Transport> ring) {
  std::shared_ptr<Clique> clique = new_clique(state.devices, {});
  const int n = clique->size();
  std::vector<int> ordinals;
  for (const Device d : clique->devices) ordinals.push_back(d.index());
  clique->comms.resize(static_cast<std::size_t>(n));
  try {
    WEFT_NCCL_CHECK(ncclCommInitAll(clique->comms.data(), n, ordinals.data()));
  } catch (const Error& e) {
    clique->broken = "never created";  // nothing to destroy
    creation_failed("weft::parallel::Communicator::local (NCCL over" + members_text(state.devices) + ")",
                    CommunicationError::kNoPeer, e);
  }
  return std::make_unique<NcclLocalTransport>(std::move(clique), std::move(ring));
}

std::unique_ptr<Transport> make_nccl_mpi_transport(CommunicatorState& state, Communicator host,
                                                   const CommunicatorOptions& options) {
  Engine& engine = *state.engine;
  const Device gpu = state.devices.front();
  const int rank = host.local_ranks().front(), size = host.size();
  const std::string what =
      "weft::parallel::Communicator::mpi (rank " + std::to_string(rank) + ", NCCL on " + gpu.str() + ")";
  // Rank 0's unique id, broadcast through MPI as the bits of 32 floats
  // (copied, never computed on).
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0);
  constexpr std::size_t kFloats = sizeof(ncclUniqueId) / sizeof(float);
  ncclUniqueId id{};
  std::vector<float> bits(kFloats, 0.0f);
  if (rank == 0) {
    try {
      WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
    } catch (const Error& e) {
      creation_failed(what, rank, e);
    }
    std::memcpy(bits.data(), &id, sizeof id);
  }
  Tensor shared = Tensor::from_host(engine, Shape{static_cast<std::int64_t>(kFloats)}, bits, kHold);
  parallel::broadcast(host, {shared}, {.name = "NCCL unique id", .root = 0});
  bits = shared.to_host();  // throws, naming the rank, if a rank never joined
  std::memcpy(&id, bits.data(), sizeof id);
  // Non-blocking creation, polled with the deadline: a rank that never
  // creates its communicator must not hang the others.
  std::shared_ptr<Clique> clique = new_clique({gpu}, options);
  clique->peers_unchecked = !collective_fingerprints(options);
  clique->comms.resize(1);
  gpu::set_device(gpu.index());  // ncclCommInitRank's device: the calling thread's current one (left so)
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  try {
    WEFT_NCCL_CHECK(ncclCommInitRankConfig(&clique->comms[0], size, id, rank, &config));
  } catch (const Error& e) {
    clique->broken = "never created";
    creation_failed(what, rank, e);
  }
  const auto deadline = Clock::now() + clique->timeout;
  for (;;) {
    ncclResult_t state_now = ncclInProgress;
    ncclCommGetAsyncError(clique->comms[0], &state_now);
    if (state_now == ncclSuccess) break;
    if (state_now != ncclInProgress || Clock::now() >= deadline) {
      clique->abort("not created");
      throw CommunicationError(what + ": the NCCL communicator was not created" +
                                   (state_now != ncclInProgress ? std::string(": ") + ncclGetErrorString(state_now)
                                                                : " within " + std::to_string(clique->timeout.count()) +
                                                                      " ms (a rank never joined)"),
                               rank);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::unique_ptr<Transport> staged = make_staged_transport(state, host);  // sets size and local_ranks
  return std::make_unique<NcclAcrossTransport>(std::move(clique), std::move(host), std::move(staged), options);
}

}  // namespace weft::parallel::detail
