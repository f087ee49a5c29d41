// The public collectives: push-time checks shared by every transport, then
// the communicator's transport pushes the ops.
#include <string>
#include <vector>

#include "collectives/call.h"
#include "collectives/communicator_state.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/profiler.h"

namespace weft::parallel {
namespace detail {

const char* to_string(Kind kind) noexcept {
  switch (kind) {
    case Kind::allreduce: return "allreduce";
    case Kind::broadcast: return "broadcast";
    case Kind::reduce: return "reduce";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::all_gather: return "all_gather";
    case Kind::barrier: return "barrier";
    case Kind::send: return "send";
    case Kind::recv: return "recv";
  }
  return "?";
}

Call::Call(Kind kind, const Communicator& comm, const CollectiveOptions& options)
    : kind_(kind), comm_(comm), state_(*state_of(comm)), options_(options) {
  label_ = std::string(to_string(kind)) + (options.name.empty() ? "" : " '" + options.name + "'");
  // A captured op runs again at every replay, but a collective is one call:
  // its sequence number, its fingerprint and its peers' part are spent once
  // (a replayed ring step found its state gone: a crash, before this check).
  if (state_.engine->capturing())
    refuse("pushed while this thread captures ops for the engine (begin_capture): a collective is one call "
           "across its members and cannot be replayed; push it outside the capture, between replays");
}

void Call::commit() {
  sequence_ = state_.sequence.fetch_add(1, std::memory_order_relaxed) + 1;
  label_ += " #" + std::to_string(sequence_);
  record(-1);
}

void Call::record(int peer) {
  if (!flight_recording() || !state_.transport || !state_.transport->records_flight()) return;
  const bool rooted = kind_ == Kind::broadcast || kind_ == Kind::reduce;
  // The communicator's text only at its first entry (it allocates).
  const std::string described = state_.flight_id.load(std::memory_order_relaxed) == 0 ? comm_.str() : std::string();
  flight_ = flight_queued(state_, described, kind_, options_.name, sequence_, has_dtype_, dtype_, count_, peer,
                          rooted ? options_.root : -1);
}

void Call::commit_message(std::uint64_t k, int peer) {
  sequence_ = k;
  const bool across_processes = state_.local_ranks.size() != static_cast<std::size_t>(state_.size);
  label_ += std::string(kind_ == Kind::send ? " to " : " from ") + (across_processes ? "rank " : "member ") +
            std::to_string(peer) + " #" + std::to_string(k);
  record(peer);
}

std::size_t Call::check_message(const Tensor& t, int peer) const {
  if (!t.defined()) refuse("the tensor is undefined");
  if (&t.engine() != state_.engine) refuse(t.str() + " belongs to another engine");
  std::size_t k = 0;
  while (k < state_.devices.size() && state_.devices[k] != t.device()) ++k;
  if (k == state_.devices.size())
    refuse(t.str() + " is not on the device of a member this process drives (" + comm_.str() + ")");
  if (peer < 0 || peer >= state_.size)
    refuse("peer " + std::to_string(peer) + " is not a member (0.." + std::to_string(state_.size - 1) + ")");
  if (peer == state_.local_ranks[k]) refuse("peer " + std::to_string(peer) + " is the member itself");
  return k;
}

void Call::set_channel(int channel) {
  if (channel < 0 || channel >= kMaxChannels)
    refuse("channel " + std::to_string(channel) + " is outside 0.." + std::to_string(kMaxChannels - 1));
  channel_ = channel;
}

std::string Call::member(std::size_t k) const {
  const bool across_processes = state_.local_ranks.size() != static_cast<std::size_t>(state_.size);
  return std::string(across_processes ? "rank " : "member ") + std::to_string(state_.local_ranks[k]);
}

void Call::refuse(const std::string& why) const {
  throw InvalidArgument("weft::parallel::" + std::string(to_string(kind_)) + " (" + label_ + " on " + comm_.str() +
                        "): " + why);
}

void Call::check_tensors(const std::vector<Tensor>& tensors, const char* what, bool reduces) const {
  const std::size_t local = state_.local_ranks.size();
  if (tensors.size() != local)
    refuse(std::to_string(tensors.size()) + " " + what + " given, one per member this process drives wanted (" +
           std::to_string(local) + ")");
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    const std::string who = std::string(what) + " of " + member(k);
    if (!t.defined()) refuse(who + " is an undefined Tensor");
    for (std::size_t q = 0; q < k; ++q)
      if (tensors[q].var() == t.var())
        refuse(std::string(what) + " of " + member(q) + " and " + member(k) + " are the same tensor");
    if (&t.engine() != state_.engine) refuse(who + ", " + t.str() + ", belongs to another engine");
    if (t.device() != state_.devices[k])
      refuse(who + ", " + t.str() + ", is not on the member's device " + state_.devices[k].str());
    if (reduces && t.dtype() != DType::float32 && !is_half(t.dtype()))
      refuse(who + ", " + t.str() + ", is " + std::string(weft::to_string(t.dtype())) +
             " (reductions take float32, bfloat16 or float16)");
  }
}

void Call::check_same_size(const std::vector<Tensor>& tensors, const char* what) const {
  for (std::size_t k = 1; k < tensors.size(); ++k)
    if (tensors[k].dtype() != tensors[0].dtype())
      refuse(std::string("dtypes differ (every member gives the same): ") + member(0) + " has " +
             tensors[0].str() + ", " + member(k) + " has " + tensors[k].str());
  for (std::size_t k = 1; k < tensors.size(); ++k)
    if (tensors[k].numel() != tensors[0].numel())
      refuse(std::string(what) + " differ: " + member(0) + " has " + tensors[0].str() + ", " + member(k) + " has " +
             tensors[k].str());
}

void Call::check_root() const {
  if (options_.root < 0 || options_.root >= state_.size)
    refuse("root " + std::to_string(options_.root) + " is not a member (0.." + std::to_string(state_.size - 1) + ")");
}

void Call::check_distinct(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) const {
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].var() == outputs[k].var()) refuse(member(k) + "'s input and output are the same tensor");
}

void Call::check_chunks(const std::vector<Tensor>& tensors, const char* what, std::int64_t count, DType dtype) const {
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    const int r = state_.local_ranks[k];
    const std::int64_t want = chunk(count, state_.size, r).size();
    if (t.numel() != want || t.dtype() != dtype)
      refuse(std::string(what) + " of " + member(k) + ", " + t.str() + ", should have " + std::to_string(want) +
             " elements of " + std::string(weft::to_string(dtype)) + " (chunk " + std::to_string(r) + " of " +
             std::to_string(count) + ")");
  }
}

}  // namespace detail

using detail::Call;
using detail::Kind;

namespace {

// Below this an allreduce across nodes goes to MPI whole: the hierarchy's
// three collectives cost three latencies where bandwidth does not yet count.
constexpr std::size_t kTieredBytes = std::size_t{256} << 10;

// An allreduce across whole nodes: reduce-scatter in the node, allreduce of
// this rank's part on its rail, all-gather in the node (CommunicatorOptions::
// ranks_per_node). Average of averages over equal nodes is the average.
void allreduce_tiered(const detail::Tiers& tiers, const Tensor& t, ReduceOp op, const CollectiveOptions& options) {
  const std::string& name = options.name;
  const int place = tiers.node.local_ranks().front();
  const Chunk part = chunk(t.numel(), tiers.per_node, place);
  Tensor mine = Tensor::empty(t.engine(), Shape{part.size()}, t.device(), t.dtype())
                    .set_role(MemoryRole::communication)
                    .set_name(name + " (node part)");
  CollectiveOptions step = options;
  step.name = name + " (node reduce-scatter)";
  reduce_scatter(tiers.node, {t}, {mine}, op, step);
  step.name = name + " (rail)";
  allreduce(tiers.rail, {mine}, op, step);
  step.name = name + " (node all-gather)";
  all_gather(tiers.node, {mine}, {t}, step);
}

}  // namespace

void allreduce(const Communicator& comm, const std::vector<Tensor>& tensors, ReduceOp op, CollectiveOptions options) {
  Call call(Kind::allreduce, comm, options);
  call.check_tensors(tensors, "tensors", true);
  call.check_same_size(tensors, "tensor sizes");
  if (const auto& tiers = call.state().tiers; tiers && tensors.size() == 1 && tensors[0].nbytes() >= kTieredBytes) {
    Profiler::note("allreduce " + call.label(), "hierarchical over " + std::to_string(tiers->nodes) + " nodes x " +
                                                  std::to_string(tiers->per_node) + " ranks, " +
                                                  std::to_string(tensors[0].nbytes()) + " bytes");
    return allreduce_tiered(*tiers, tensors[0], op, options);
  }
  call.state().transport->check(call, tensors[0].numel());
  call.set_payload(tensors[0].dtype(), tensors[0].numel());
  call.commit();
  call.state().transport->allreduce(call, tensors, op);
}

void broadcast(const Communicator& comm, const std::vector<Tensor>& tensors, CollectiveOptions options) {
  Call call(Kind::broadcast, comm, options);
  call.check_tensors(tensors, "tensors", false);
  call.check_same_size(tensors, "tensor sizes");
  call.check_root();
  call.state().transport->check(call, tensors[0].numel());
  call.set_payload(tensors[0].dtype(), tensors[0].numel());
  call.commit();
  call.state().transport->broadcast(call, tensors);
}

void reduce(const Communicator& comm, const std::vector<Tensor>& tensors, ReduceOp op, CollectiveOptions options) {
  Call call(Kind::reduce, comm, options);
  call.check_tensors(tensors, "tensors", true);
  call.check_same_size(tensors, "tensor sizes");
  call.check_root();
  call.state().transport->check(call, tensors[0].numel());
  call.set_payload(tensors[0].dtype(), tensors[0].numel());
  call.commit();
  call.state().transport->reduce(call, tensors, op);
}

void reduce_scatter(const Communicator& comm, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                    ReduceOp op, CollectiveOptions options) {
  Call call(Kind::reduce_scatter, comm, options);
  call.check_tensors(inputs, "inputs", true);
  call.check_tensors(outputs, "outputs", true);
  call.check_same_size(inputs, "input sizes");
  call.check_distinct(inputs, outputs);
  call.check_chunks(outputs, "output", inputs[0].numel(), inputs[0].dtype());
  call.state().transport->check(call, inputs[0].numel());
  call.set_payload(inputs[0].dtype(), inputs[0].numel());
  call.commit();
  call.state().transport->reduce_scatter(call, inputs, outputs, op);
}

void all_gather(const Communicator& comm, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                CollectiveOptions options) {
  Call call(Kind::all_gather, comm, options);
  call.check_tensors(inputs, "inputs", false);
  call.check_tensors(outputs, "outputs", false);
  call.check_same_size(outputs, "output sizes");
  call.check_chunks(inputs, "input", outputs[0].numel(), outputs[0].dtype());
  // In place (MPI_IN_PLACE's case): an input that is its output's own chunk
  // (a view). The in-process transports take it as it is; the others get a
  // copy, taken in push order.
  std::vector<Tensor> sources = inputs;
  const std::int64_t count = outputs[0].numel();
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].var() != outputs[k].var()) continue;
    const Chunk own = chunk(count, call.state().size, call.state().local_ranks[k]);
    if (inputs[k].numel() > 0 && inputs[k].storage_offset() != outputs[k].storage_offset() + own.begin)
      call.refuse(call.member(k) + "'s input " + inputs[k].str() + " overlaps its output " + outputs[k].str() +
                  " other than as its own chunk (elements [" + std::to_string(own.begin) + ", " +
                  std::to_string(own.end) + ") of it)");
  }
  call.state().transport->check(call, count);
  call.set_payload(outputs[0].dtype(), count);
  call.commit();
  for (std::size_t k = 0; k < inputs.size() && !call.state().transport->all_gather_in_place(); ++k)
    if (inputs[k].var() == outputs[k].var()) {
      sources[k] = Tensor::empty(inputs[k].engine(), inputs[k].shape(), inputs[k].device(), inputs[k].dtype())
                       .set_role(MemoryRole::communication);
      sources[k].copy_from(inputs[k]);
    }
  call.state().transport->all_gather(call, sources, outputs);
}

void barrier(const Communicator& comm, CollectiveOptions options) {
  Call call(Kind::barrier, comm, options);
  call.state().transport->check(call, 0);
  call.commit();
  call.state().transport->barrier(call);
}

void send(const Communicator& comm, const Tensor& tensor, int peer, CollectiveOptions options) {
  detail::send_on(comm, tensor, peer, 0, options);
}

void recv(const Communicator& comm, const Tensor& tensor, int peer, CollectiveOptions options) {
  detail::recv_on(comm, tensor, peer, 0, options);
}

namespace detail {

void send_on(const Communicator& comm, const Tensor& tensor, int peer, int channel, const CollectiveOptions& options) {
  Call call(Kind::send, comm, options);
  call.set_channel(channel);
  const std::size_t k = call.check_message(tensor, peer);
  call.state().transport->check(call, tensor.numel());
  call.set_payload(tensor.dtype(), tensor.numel());
  call.state().transport->send(call, tensor, call.state().local_ranks[k], peer);
}

void recv_on(const Communicator& comm, const Tensor& tensor, int peer, int channel, const CollectiveOptions& options) {
  Call call(Kind::recv, comm, options);
  call.set_channel(channel);
  const std::size_t k = call.check_message(tensor, peer);
  call.state().transport->check(call, tensor.numel());
  call.set_payload(tensor.dtype(), tensor.numel());
  call.state().transport->recv(call, tensor, peer, call.state().local_ranks[k]);
}

}  // namespace detail

}  // namespace weft::parallel
