// Collectives over several devices per process of an MPI job, composed of
// the in-process and the MPI collectives (docs/design/parallel-collectives.md,
// "Hierarchical"): each step is itself a collective pushed as engine ops, so
// the steps are ordered by the tensors they share and a failure anywhere
// reaches every member the way it does in each step. bfloat16 and float16
// reductions run the float32 form on float32 copies and round once at the
// end (through_float32.h), not once per step.
#include <array>
#include <map>
#include <mutex>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "collectives/call.h"
#include "collectives/communicator_state.h"
#include "collectives/through_float32.h"
#include "weft/error.h"
#include "weft/gpu_sim.h"
#include "weft/gpu_streams.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor_op.h"

namespace weft::parallel::detail {
namespace {

class HierarchicalTransport final : public Transport {
 public:
  HierarchicalTransport(const CommunicatorState& state, Communicator local, std::vector<Communicator> across,
                        int processes)
      : state_(&state), local_(std::move(local)), across_(std::move(across)), processes_(processes) {}

  std::string str() const override {
    const int per = static_cast<int>(across_.size());
    std::string devices;
    for (int k = 0; k < per; ++k) devices += (k ? ", " : "") + local_.device(k).str();
    return "MPI communicator of " + std::to_string(processes_ * per) + " members (" + std::to_string(processes_) +
           " ranks x " + std::to_string(per) + " devices; rank " + std::to_string(rank()) + " with " + devices +
           " here)";
  }

  void check(const Call& call, std::int64_t elements) const override {
    const Kind kind = call.kind();
    // Each part of an allreduce, and a whole tensor otherwise, crosses
    // processes through one MPI communicator.
    Call probe(kind, across_.front(), call.options());
    state_of(across_.front())->transport->check(probe, elements);
  }

  void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    if (is_half(tensors[0].dtype())) {
      const std::vector<Tensor> wide = widened(tensors);
      allreduce(call, wide, op);
      return narrow_into(tensors, wide, call.label(), call.options().priority);
    }
    allreduce_in_place(tensors, op, call.options().name, call.options().priority, call.label());
  }

  // The root member's tensor becomes the reduction; every other tensor is
  // only read. In-process reduce into a copy of the root device's tensor,
  // then across processes on that device's communicator, then (on the root's
  // process) into the root's tensor.
  void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override {
    const int per = static_cast<int>(across_.size());
    const int root = call.options().root, root_process = root / per, root_device = root % per;
    const std::string& name = call.options().name;
    const int priority = call.options().priority;
    const auto k = static_cast<std::size_t>(root_device);
    if (is_half(tensors[0].dtype())) {
      const std::vector<Tensor> wide = widened(tensors);
      reduce(call, wide, op);
      if (rank() == root_process) narrow_into({tensors[k]}, {wide[k]}, call.label(), priority);
      return;
    }
    Tensor partial = copy_of(tensors[k], call.label() + " copy");
    std::vector<Tensor> in_process = tensors;
    in_process[k] = partial;
    parallel::reduce(local_, in_process, step_of(op),
                     {.name = name + " (in-process)", .priority = priority, .root = root_device});
    parallel::reduce(across_[k], {partial}, step_of(op), {.name = name, .priority = priority, .root = root_process});
    if (rank() != root_process) return;
    if (op == ReduceOp::average) scale(partial, call.label() + " average", priority);
    copy_into(tensors[k], partial, 0, partial.numel(), call.label() + " result", priority);
  }

  // Member m's output becomes chunk m of the reduction of every input. Each
  // member reorders its input into column order (see all_gather), the
  // process reduce-scatters it into one part per device (part k: column k),
  // and each device's communicator reduce-scatters its part across the
  // processes, which leaves member (p, k)'s chunk on it: every byte crosses
  // each link once, as in a plain reduce-scatter.
  void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override {
    const int per = static_cast<int>(across_.size());
    const std::int64_t count = inputs[0].numel();
    const std::string& name = call.options().name;
    const int priority = call.options().priority;
    Engine& engine = inputs[0].engine();
    if (is_half(inputs[0].dtype())) {
      std::vector<Tensor> wide_outputs;
      for (const Tensor& o : outputs) wide_outputs.push_back(Tensor::empty(engine, o.shape(), o.device()));
      reduce_scatter(call, widened(inputs), wide_outputs, op);
      return narrow_into(outputs, wide_outputs, call.label(), priority);
    }
    std::vector<Tensor> columns, parts;
    for (int k = 0; k < per; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      columns.push_back(Tensor::empty(engine, Shape{count}, local_.device(k)).set_role(MemoryRole::communication));
      permute(inputs[kk], columns[kk], column_order(count, /*to_columns=*/true), call.label() + " in column order",
              priority);
      parts.push_back(
          Tensor::empty(engine, Shape{chunk(count, per, k).size()}, local_.device(k)).set_role(MemoryRole::communication));
    }
    parallel::reduce_scatter(local_, columns, parts, step_of(op), {.name = name + " (in-process)", .priority = priority});
    for (int k = 0; k < per; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      parallel::reduce_scatter(across_[kk], {parts[kk]}, {outputs[kk]}, step_of(op),
                               {.name = name + " (column " + std::to_string(k) + ")", .priority = priority});
      if (op == ReduceOp::average) scale(outputs[kk], call.label() + " average", priority);
    }
  }

  void broadcast(const Call& call, const std::vector<Tensor>& tensors) override {
    const int per = static_cast<int>(across_.size());
    const int root = call.options().root, root_process = root / per, root_device = root % per;
    const std::string& name = call.options().name;
    const int priority = call.options().priority;
    // Across processes on the root's device index, then within each process.
    parallel::broadcast(across_[static_cast<std::size_t>(root_device)], {tensors[static_cast<std::size_t>(root_device)]},
                        {.name = name, .priority = priority, .root = root_process});
    parallel::broadcast(local_, tensors, {.name = name + " (in-process)", .priority = priority, .root = root_device});
  }

  void barrier(const Call& call) override {
    parallel::barrier(across_.front(), {.name = call.options().name, .priority = call.options().priority});
  }

  // Member (p, k) — process p's device k, member p * per + k — contributes
  // chunk(count, N, p * per + k). The members of one device index k form a
  // column whose chunks, in process order, are exactly chunk(C_k, P, p) of
  // their total C_k = chunk(count, per, k).size() (both give the first ones
  // one element more). So: gather each column across processes on its
  // device's communicator, gather the columns in-process ([column 0 |
  // column 1 | ...], column k at chunk(count, per, k)), and let each member
  // put the pieces in member order.
  void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    const int per = static_cast<int>(across_.size());
    const std::int64_t count = outputs[0].numel();
    const DType dtype = outputs[0].dtype();
    const std::string& name = call.options().name;
    const int priority = call.options().priority;
    Engine& engine = outputs[0].engine();
    std::vector<Tensor> columns, gathered;
    for (int k = 0; k < per; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      columns.push_back(Tensor::empty(engine, Shape{chunk(count, per, k).size()}, local_.device(k), dtype)
                            .set_role(MemoryRole::communication));
      parallel::all_gather(across_[kk], {inputs[kk]}, {columns[kk]},
                           {.name = name + " (column " + std::to_string(k) + ")", .priority = priority});
      gathered.push_back(Tensor::empty(engine, Shape{count}, local_.device(k), dtype).set_role(MemoryRole::communication));
    }
    parallel::all_gather(local_, columns, gathered, {.name = name + " (in-process)", .priority = priority});
    for (int k = 0; k < per; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      permute(gathered[kk], outputs[kk], column_order(count, /*to_columns=*/false), call.label() + " in member order",
              priority);
    }
  }

  // Member order (member p * per + k's chunk of `count` at chunk(count,
  // members, p * per + k)) against column order (column k at chunk(count,
  // per, k), member (p, k) at chunk(C_k, processes, p) within it): each
  // member's piece as (destination, source, elements), to columns or back.
  std::vector<std::array<std::int64_t, 3>> column_order(std::int64_t count, bool to_columns) const {
    const int per = static_cast<int>(across_.size()), members = processes_ * per;
    std::vector<std::array<std::int64_t, 3>> pieces;
    for (int p = 0; p < processes_; ++p)
      for (int k = 0; k < per; ++k) {
        const Chunk member = chunk(count, members, p * per + k);
        const Chunk column = chunk(count, per, k);
        const std::int64_t in_column = column.begin + chunk(column.size(), processes_, p).begin;
        pieces.push_back(to_columns ? std::array{in_column, member.begin, member.size()}
                                    : std::array{member.begin, in_column, member.size()});
      }
    return pieces;
  }

  // dst = src with its pieces moved (same device, same dtype).
  static void permute(const Tensor& src, const Tensor& dst, std::vector<std::array<std::int64_t, 3>> pieces,
                      const std::string& name, int priority) {
    push_tensor_op(
        dst.device(), {src}, {dst},
        [pieces = std::move(pieces), element = dtype_size(dst.dtype())](RunContext& ctx, const TensorData& d) {
          auto* out = static_cast<unsigned char*>(d.outputs[0]);
          const auto* in = static_cast<const unsigned char*>(d.inputs[0]);
          for (const auto& [to, from, n] : pieces)
            copy_bytes(ctx, out + static_cast<std::size_t>(to) * element, in + static_cast<std::size_t>(from) * element,
                       static_cast<std::size_t>(n) * element);
        },
        {.priority = priority, .name = name});
  }

  // Member (p, k) to member (q, j): within a process, the in-process
  // communicator's send; across processes, device k's communicator from
  // rank p to rank q on channel j (the receiver's device), so that each
  // pair of members has its own channel and push order. The receiver takes
  // the message on its device k into a tensor there, then copies it to its
  // own device j.
  void send(Call& call, const Tensor& tensor, int from, int to) override {
    if (call.channel() != 0) call.refuse("channels are this group's own (one per pair of devices)");
    const int per = static_cast<int>(across_.size());
    const int k = from % per, q = to / per, j = to % per;
    const CollectiveOptions options = message_options(call, from, to);
    if (q == rank())
      parallel::send(local_, tensor, j, options);
    else
      send_on(across_[static_cast<std::size_t>(k)], tensor, q, j, options);
    number(call, sent_, from, to, to);
  }
  void recv(Call& call, const Tensor& tensor, int from, int to) override {
    if (call.channel() != 0) call.refuse("channels are this group's own (one per pair of devices)");
    const int per = static_cast<int>(across_.size());
    const int p = from / per, k = from % per, j = to % per;
    const CollectiveOptions options = message_options(call, from, to);
    if (p == rank()) {
      parallel::recv(local_, tensor, k, options);
    } else if (k == j) {
      recv_on(across_[static_cast<std::size_t>(k)], tensor, p, j, options);
    } else {
      Tensor landing = Tensor::empty(tensor.engine(), tensor.shape(), local_.device(k), tensor.dtype());
      recv_on(across_[static_cast<std::size_t>(k)], landing, p, j, options);
      Tensor into = tensor;
      into.copy_from(landing);
    }
    number(call, received_, from, to, from);
  }

  // Each process's members share a colour (Communicator::split checked it):
  // every per-device MPI communicator is split by the processes' colours,
  // and this process's devices stay together, in a group of their own.
  std::unique_ptr<Transport> split(CommunicatorState& into, const std::vector<int>& colors) const override {
    const int per = static_cast<int>(across_.size());
    std::vector<int> by_process;
    for (int p = 0; p < processes_; ++p) by_process.push_back(colors[static_cast<std::size_t>(p * per)]);
    std::vector<Communicator> across;
    for (const Communicator& c : across_) across.push_back(c.split(by_process));
    const int processes = across.front().size(), rank = across.front().local_ranks().front();
    into.size = processes * per;
    into.local_ranks.clear();
    for (int k = 0; k < per; ++k) into.local_ranks.push_back(rank * per + k);
    return std::make_unique<HierarchicalTransport>(into, Communicator::local(*into.engine, into.devices),
                                                   std::move(across), processes);
  }

 private:
  int rank() const { return across_.front().local_ranks().front(); }
  const CommunicatorState& state_of_this() const { return *state_; }
  static ReduceOp step_of(ReduceOp op) { return op == ReduceOp::max ? ReduceOp::max : ReduceOp::sum; }

  // In-process reduce-scatter into one part per device, an MPI allreduce of
  // each part on its device's communicator (the parts cross at once), then
  // in-process all-gather. Average: summed everywhere, scaled once (the sum
  // of integers is exact, so results match a serial reference bit for bit).
  void allreduce_in_place(const std::vector<Tensor>& tensors, ReduceOp op, const std::string& name, int priority,
                          const std::string& label) {
    const int per = static_cast<int>(across_.size());
    const std::int64_t count = tensors[0].numel();
    Engine& engine = tensors[0].engine();
    std::vector<Tensor> parts;
    for (int k = 0; k < per; ++k)
      parts.push_back(
          Tensor::empty(engine, Shape{chunk(count, per, k).size()}, local_.device(k)).set_role(MemoryRole::communication));
    parallel::reduce_scatter(local_, tensors, parts, step_of(op),
                             {.name = name + " (in-process part)", .priority = priority});
    for (int k = 0; k < per; ++k) {
      Tensor& part = parts[static_cast<std::size_t>(k)];
      parallel::allreduce(across_[static_cast<std::size_t>(k)], {part}, step_of(op),
                          {.name = name + " (part " + std::to_string(k) + ")", .priority = priority});
      if (op == ReduceOp::average) scale(part, label + " average", priority);
    }
    parallel::all_gather(local_, parts, tensors, {.name = name + " (in-process whole)", .priority = priority});
  }

  // x *= 1 / members.
  void scale(const Tensor& x, const std::string& name, int priority) const {
    const float factor = 1.0f / static_cast<float>(processes_ * static_cast<int>(across_.size()));
    push_tensor_op(
        x.device(), {}, {x},
        [n = x.numel(), factor](RunContext& ctx, const TensorData& d) { weft::scale(ctx, d.out(0), factor, n); },
        {.priority = priority, .name = name});
  }

  // Within one device's memory: a memcpy on a CPU device, a copy enqueued on
  // the op's stream on a GPU.
  static void copy_bytes(RunContext& ctx, void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    if (ctx.gpu) {
      // A collective's GPU tensors hold no values under the modeled mode.
      gpu::ScopedUndefinedBytes undefined_bytes(gpu::kernels_modeled());
      gpu::memcpy_async(dst, src, bytes, gpu::CopyKind::device_to_device, ctx.gpu->stream);
    } else {
      std::memcpy(dst, src, bytes);
    }
  }

  // A new tensor on t's device with t's values.
  static Tensor copy_of(const Tensor& t, const std::string& name) {
    Tensor out = Tensor::empty(t.engine(), t.shape(), t.device(), t.dtype());
    push_tensor_op(
        t.device(), {t}, {out},
        [bytes = t.nbytes()](RunContext& ctx, const TensorData& d) {
          copy_bytes(ctx, d.outputs[0], d.inputs[0], bytes);
        },
        {.name = name});
    return out;
  }

  // dst (whole) = src[begin, begin + n), float32.
  static void copy_into(const Tensor& dst, const Tensor& src, std::int64_t begin, std::int64_t n,
                        const std::string& name, int priority) {
    push_tensor_op(
        dst.device(), {src}, {dst},
        [begin, n](RunContext& ctx, const TensorData& d) {
          copy_bytes(ctx, d.out(0), d.in(0) + begin, static_cast<std::size_t>(n) * sizeof(float));
        },
        {.priority = priority, .name = name});
  }
  // The steps of a message carry both members in their name, so that a
  // mismatch names them, not only the processes.
  static CollectiveOptions message_options(const Call& call, int from, int to) {
    CollectiveOptions o = call.options();
    o.name += " (member " + std::to_string(from) + " to member " + std::to_string(to) + ")";
    return o;
  }
  // Numbers the call among the messages of its pair of members.
  void number(Call& call, std::map<std::pair<int, int>, std::uint64_t>& counts, int from, int to, int peer) {
    std::lock_guard lock(mutex_);
    call.commit_message(++counts[{from, to}], peer);
  }

  const CommunicatorState* state_;    // the group's (outlives its transport)
  Communicator local_;                // this process's devices
  std::vector<Communicator> across_;  // across_[k]: device k of every process
  int processes_;
  std::mutex mutex_;
  std::map<std::pair<int, int>, std::uint64_t> sent_, received_;  // messages per (from, to) member
};

}  // namespace

std::unique_ptr<Transport> make_hierarchical_transport(CommunicatorState& state, Communicator local,
                                                       const CommunicatorOptions& options) {
  Engine& engine = *state.engine;
  const int per = static_cast<int>(state.devices.size());
  std::vector<Communicator> across;
  across.push_back(Communicator::mpi(engine, state.devices.front(), options));
  const int processes = across.front().size(), rank = across.front().local_ranks().front();
  // Every process must give as many devices: check on the first
  // communicator before creating the others (a process creating fewer
  // would leave the rest waiting in MPI).
  Tensor counts = Tensor::from_host(engine, Shape{2}, std::vector<float>{static_cast<float>(per), -static_cast<float>(per)},
                                    state.devices.front());
  allreduce(across.front(), {counts}, ReduceOp::max, {.name = "devices per process"});
  const std::vector<float> most_least = counts.to_host();
  if (most_least[0] != static_cast<float>(per) || -most_least[1] != static_cast<float>(per))
    throw InvalidArgument("weft::parallel::Communicator::mpi (rank " + std::to_string(rank) + "): this process gives " +
                          std::to_string(per) + " devices, but the processes give between " +
                          std::to_string(static_cast<int>(-most_least[1])) + " and " +
                          std::to_string(static_cast<int>(most_least[0])) + "; every process must give as many");
  for (int k = 1; k < per; ++k) across.push_back(Communicator::mpi(engine, state.devices[static_cast<std::size_t>(k)], options));
  state.size = processes * per;
  state.local_ranks.clear();
  for (int k = 0; k < per; ++k) state.local_ranks.push_back(rank * per + k);
  return std::make_unique<HierarchicalTransport>(state, std::move(local), std::move(across), processes);
}

}  // namespace weft::parallel::detail
