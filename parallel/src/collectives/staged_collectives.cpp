// A GPU member of an MPI group without NCCL: each collective stages its
// GPU tensors through host memory (docs/design/parallel-collectives.md,
// "GPU members across processes"). The GPU tensors are copied to cpu(0) by
// the engine's copy workers (through pinned staging), the host copies go
// through an MPI communicator on cpu(0) — fingerprints, deadlines and
// failure reporting included — and the results are copied back. Every step
// is a public op or collective ordered by the tensors it shares with the
// next, so a failed input reaches every rank as it does on CPU members.
// Any dtype: the host collective reduces bfloat16 and float16 in float32.
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collectives/call.h"
#include "collectives/communicator_state.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace weft::parallel::detail {
namespace {

const Device kHost = Device::cpu(0);

class StagedTransport final : public Transport {
 public:
  StagedTransport(Device gpu, Communicator host) : gpu_(gpu), host_(std::move(host)) {}

  std::string str() const override {
    return "MPI communicator of " + std::to_string(host_.size()) + " ranks (rank " +
           std::to_string(host_.local_ranks().front()) + " with " + gpu_.str() + " here, staged through host memory)";
  }

  void check(const Call& call, std::int64_t elements) const override {
    Call probe(call.kind(), host_, call.options());
    state_of(host_)->transport->check(probe, elements);
  }

  void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    const Tensor& t = tensors[0];
    Tensor h = staged(t);
    parallel::allreduce(host_, {h}, op, call.options());
    unstage(t, h);
  }

  void broadcast(const Call& call, const std::vector<Tensor>& tensors) override {
    const Tensor& t = tensors[0];
    const bool root = rank() == call.options().root;
    Tensor h = root ? staged(t) : Tensor::empty(t.engine(), t.shape(), kHost, t.dtype());
    parallel::broadcast(host_, {h}, call.options());
    if (!root) unstage(t, h);
  }

  void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    const Tensor& t = tensors[0];
    Tensor h = staged(t);
    parallel::reduce(host_, {h}, op, call.options());
    if (rank() == call.options().root) unstage(t, h);
  }

  void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override {
    Tensor in = staged(inputs[0]), out = Tensor::empty(outputs[0].engine(), outputs[0].shape(), kHost, outputs[0].dtype());
    parallel::reduce_scatter(host_, {in}, {out}, op, call.options());
    unstage(outputs[0], out);
  }

  void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    Tensor in = staged(inputs[0]), out = Tensor::empty(outputs[0].engine(), outputs[0].shape(), kHost, outputs[0].dtype());
    parallel::all_gather(host_, {in}, {out}, call.options());
    unstage(outputs[0], out);
  }

  void barrier(const Call& call) override { parallel::barrier(host_, call.options()); }

  // The host communicator split, and a staged transport over its part.
  std::unique_ptr<Transport> split(CommunicatorState& into, const std::vector<int>& colors) const override {
    return make_staged_transport(into, host_.split(colors));
  }

  void send(Call& call, const Tensor& tensor, int, int to) override {
    Tensor h = staged(tensor);
    send_on(host_, h, to, call.channel(), call.options());
    std::lock_guard lock(mutex_);
    call.commit_message(++sent_[{to, call.channel()}], to);
  }

  void recv(Call& call, const Tensor& tensor, int from, int) override {
    Tensor h = Tensor::empty(tensor.engine(), tensor.shape(), kHost, tensor.dtype());
    recv_on(host_, h, from, call.channel(), call.options());
    unstage(tensor, h);
    std::lock_guard lock(mutex_);
    call.commit_message(++received_[{from, call.channel()}], from);
  }

 private:
  int rank() const { return host_.local_ranks().front(); }
  // A host copy of `t`, pushed now (so it holds t's value at the call).
  static Tensor staged(const Tensor& t) { return t.copy_to(kHost); }
  static void unstage(const Tensor& t, const Tensor& h) {
    Tensor into = t;
    into.copy_from(h);
  }

  Device gpu_;
  Communicator host_;  // the same ranks, on cpu(0)
  std::mutex mutex_;
  std::map<std::pair<int, int>, std::uint64_t> sent_, received_;  // messages numbered per (peer, channel)
};

}  // namespace

std::unique_ptr<Transport> make_staged_transport(CommunicatorState& state, Communicator host) {
  state.size = host.size();
  state.local_ranks = host.local_ranks();
  const Device gpu = state.devices.front();
  return std::make_unique<StagedTransport>(gpu, std::move(host));
}

}  // namespace weft::parallel::detail
