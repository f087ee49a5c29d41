// The shape every in-process collective shares (internal to parallel/;
// docs/design/parallel-collectives.md).
//
// A collective is one *hold op*: an async tensor op that holds every
// member's tensors (writes what the collective writes, reads what it only
// reads) from the moment all their producers are done until the collective
// is done. Its body pushes the data phase: ops on the members' devices,
// ordered among themselves by internal per-chunk variables (never by the
// tensors, which the hold op holds); the phase's last op completes the hold
// op. So the collective is ordered with the rest of the program like any op,
// and a failed input fails it on every member through the engine's own rule
// (the hold op is skipped and its writes carry the failure). Every process
// drives all its members, so members never wait for one another across
// threads: no rendezvous is needed.
//
// On CPU members the hold op runs on the first member's device and the data
// phase touches memory directly. On GPU members the hold op runs on cpu(0)
// and only holds the tensors (tensor_op.h): it does not wait on the host for
// the GPU work that produced them (OpOptions::defer_gpu_waits) but keeps
// that work's events, and every op of the data phase — GPU ops on the
// members' streams — makes its stream wait for them (OpOptions::
// after_gpu_work); the last op, on a
// member's GPU, has a poll fiber complete the hold once their work is done
// (local_gpu_collectives.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collectives/call.h"
#include "weft/engine.h"
#include "weft/gpu_streams.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"

namespace weft::parallel::detail {

// The hold op's completion, which also ends the call's flight-recorder
// entry.
struct PhaseDone {
  Completion completion;
  FlightTicket flight;
  PhaseDone& operator=(Completion c) noexcept {
    completion = std::move(c);
    return *this;
  }
  void operator()(std::exception_ptr error = nullptr) const {
    flight_completed(flight, error);
    completion(std::move(error));
  }
};

// The members' memory and the hold op's completion, shared by the data
// phase's ops.
struct Phase {
  std::string what;             // "allreduce 'grad' #3"
  std::vector<const void*> in;  // what the hold op reads, in the order given to push_hold
  std::vector<void*> out;       // what it writes, likewise
  PhaseDone done;               // the hold op's
  // GPU members: the GPU work the tensors wait for (their producers, and the
  // readers of what the collective writes); every GPU op of the phase must
  // order its stream after it (OpOptions::after_gpu_work, or
  // order_after_inputs for streams outside the engine).
  std::vector<gpu::EventRef> gpu_waits;
  void order_after_inputs(gpu::Stream* stream) const {
    for (const gpu::EventRef& e : gpu_waits) e->stream_wait(stream);
  }
  const float* in_f(int k) const { return static_cast<const float*>(in[static_cast<std::size_t>(k)]); }
  float* out_f(int k) const { return static_cast<float*>(out[static_cast<std::size_t>(k)]); }
  const void* in_at(int k) const { return in[static_cast<std::size_t>(k)]; }
  void* out_at(int k) const { return out[static_cast<std::size_t>(k)]; }
};

// Pushes the hold op on `where`: `reads` and `writes` as the collective
// documents them (either may be empty); `start` pushes the data phase with
// the members' memory. `gpu_members`: the data phase is GPU ops, which take
// the GPU work they must follow from Phase::gpu_waits.
using PhaseStart = std::function<void(Engine&, const std::shared_ptr<Phase>&)>;
inline void push_hold(const Call& call, Device where, const std::vector<Tensor>& reads,
                      const std::vector<Tensor>& writes, PhaseStart start, bool gpu_members = false) {
  push_tensor_op_async(
      where, reads, writes,
      [what = call.label(), flight = call.flight(), start = std::move(start)](RunContext& ctx, const TensorData& d,
                                                                              Completion done) {
        flight_started(flight);
        auto phase = std::make_shared<Phase>();
        phase->what = what;
        phase->done.flight = flight;
        phase->in.assign(d.inputs.begin(), d.inputs.end());
        phase->out = d.outputs;
        phase->done = std::move(done);
        if (ctx.gpu_waits) phase->gpu_waits = *ctx.gpu_waits;
        start(*ctx.engine, phase);
      },
      OpOptions{.priority = call.options().priority, .name = call.label(), .defer_gpu_waits = gpu_members});
}

// The members' tensors in member order, `skip` left out.
inline std::vector<Tensor> all_but(const std::vector<Tensor>& tensors, int skip) {
  std::vector<Tensor> out;
  for (std::size_t r = 0; r < tensors.size(); ++r)
    if (static_cast<int>(r) != skip) out.push_back(tensors[r]);
  return out;
}

// Internal variables of one data phase: v[row][chunk], deleted when the
// last op holding them goes.
struct PhaseVars {
  std::vector<std::vector<SharedVar>> v;
  PhaseVars(Engine& e, const std::string& label, int rows, int chunks) : v(static_cast<std::size_t>(rows)) {
    for (int m = 0; m < rows; ++m)
      for (int c = 0; c < chunks; ++c)
        v[static_cast<std::size_t>(m)].emplace_back(e, label + " v" + std::to_string(m) + "." + std::to_string(c));
  }
  const Var& at(int row, int c) const { return v[static_cast<std::size_t>(row)][static_cast<std::size_t>(c)]; }
  std::vector<Var> all() const {
    std::vector<Var> out;
    for (const auto& row : v) out.insert(out.end(), row.begin(), row.end());
    return out;
  }
};

// The phase's last op on CPU members, on `where`: waits for every op of the
// phase (it writes all the phase's variables), then completes the hold op —
// with the failure of a phase op, if one failed.
inline void push_done(Engine& e, const std::shared_ptr<Phase>& phase,
                      const std::vector<std::shared_ptr<PhaseVars>>& vars, Device where, int priority) {
  std::vector<Var> writes;
  for (const auto& v : vars) {
    std::vector<Var> all = v->all();
    writes.insert(writes.end(), all.begin(), all.end());
  }
  // Read and written: a failure a phase op left on them reaches the body.
  e.push([phase, vars](RunContext& ctx) { phase->done(ctx.failed_input); }, where, writes, writes,
         {.priority = priority, .name = phase->what + " done", .run_on_failed_input = true});
}

// In-process send and recv: per (from, to), the snapshots sent and not yet
// received, in push order (no op waits for another member's push, so the
// naive engine runs them too).
class Mailboxes {
 public:
  // Numbers the send and keeps the snapshot `make()` pushes (under the lock:
  // one pair's snapshots stay in push order).
  template <class Make>
  void post(Call& call, int from, int to, Make make) {
    if (call.channel() != 0) call.refuse("in-process messages have no channels");
    std::lock_guard lock(mutex_);
    Box& box = boxes_[{from, to}];
    call.commit_message(box.sent + 1, to);
    box.pending.push_back(make());
    ++box.sent;
  }
  // The oldest snapshot from `from` to `to`, refused unless one waits with
  // `tensor`'s size and dtype; numbers the recv.
  Tensor take(Call& call, const Tensor& tensor, int from, int to) {
    if (call.channel() != 0) call.refuse("in-process messages have no channels");
    std::lock_guard lock(mutex_);
    Box& box = boxes_[{from, to}];
    if (box.pending.empty())
      call.refuse("no send from member " + std::to_string(from) + " to member " + std::to_string(to) +
                  " is waiting for it (in-process, a recv is pushed after its send)");
    const Tensor& sent = box.pending.front();
    if (sent.numel() != tensor.numel() || sent.dtype() != tensor.dtype())
      call.refuse("member " + std::to_string(from) + " sent " + std::to_string(sent.numel()) + " elements of " +
                  std::string(to_string(sent.dtype())) + ", this recv wants " + std::to_string(tensor.numel()) +
                  " elements of " + std::string(to_string(tensor.dtype())) + " (" + tensor.str() + ")");
    if (sent.shape() != tensor.shape())  // as across processes (the fingerprint's shape)
      call.refuse("member " + std::to_string(from) + " sent shape " + sent.shape().str() +
                  ", this recv wants shape " + tensor.shape().str() + " (" + tensor.str() + ")");
    Tensor snapshot = std::move(box.pending.front());
    box.pending.pop_front();
    call.commit_message(++box.received, from);
    return snapshot;
  }

 private:
  struct Box {
    std::deque<Tensor> pending;
    std::uint64_t sent = 0, received = 0;
  };
  std::mutex mutex_;
  std::map<std::pair<int, int>, Box> boxes_;
};

// GPU members: the ring over device copies (or NCCL: communicator_state.h).
std::unique_ptr<Transport> make_local_gpu_transport(CommunicatorState& state);

}  // namespace weft::parallel::detail
