// weft::parallel — collectives as engine ops.
//
// A Communicator is a group of members, each a device. A collective takes
// the tensors of the members this process drives (local_ranks(), in that
// order), pushes engine ops and returns at once. It is ordered with every
// other op on those tensors: ops pushed before it that write them run first,
// ops pushed after it that touch them wait for it. A failed input fails the
// collective on every member, naming the failure. Across processes nothing
// hangs silently: a collective whose fingerprint (sequence number, kind,
// name, dtype, element count, root, reduce op) differs between ranks fails
// on every rank with a weft::CommunicationError naming both sides; one not
// complete within the timeout fails naming the ranks that never joined, and
// breaks the communicator (later collectives on it fail at once). A process
// that stops answering altogether is declared dead by the MPI job's
// heartbeat (WEFT_HEARTBEAT_INTERVAL, default 1 s; WEFT_HEARTBEAT_TIMEOUT,
// default 10 s; process-wide, so no CommunicatorOptions field): every
// survivor's pending and later collectives on communicators that include it
// fail with a weft::CommunicationError naming its rank, host and silence,
// and the process then exits without MPI_Finalize. Tensors
// are float32, bfloat16 or float16 (the same dtype on every member; data
// moves keep it, reductions of the halves sum in float32 and round to
// nearest even once, except NCCL's, which may round each hop). How each kind
// of group moves data: docs/design/parallel-collectives.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/engine.h"
#include "weft/tensor.h"

namespace weft::parallel {

enum class ReduceOp : std::uint8_t { sum, average, max };
std::string_view to_string(ReduceOp op) noexcept;

struct CollectiveOptions {
  std::string name;  // in messages and traces: "allreduce 'grad.fc1'"
  int priority = 0;  // of every op the collective pushes
  int root = 0;      // broadcast and reduce
};

// How an MPI communicator guards against hangs. Unset fields come from the
// environment, then the defaults.
struct CommunicatorOptions {
  // A collective not complete this long after this rank's input was ready
  // fails (WEFT_COLLECTIVE_TIMEOUT, in seconds; default 300 s).
  std::optional<std::chrono::milliseconds> timeout;
  // Exchange fingerprints before each collective (WEFT_COLLECTIVE_CHECK=0
  // turns them off for measured runs; default on). Without them a mismatch
  // is undefined behaviour of MPI, and a rank whose input failed does not
  // take part: its peers fail at the timeout.
  std::optional<bool> fingerprints;
  // Ranks per node across processes, consecutive ranks sharing a node
  // (mpirun's default placement, by slot; WEFT_RANKS_PER_NODE; unset, 0 or
  // 1: not known, one tier). When a one-device-per-process group spans two
  // or more whole nodes, its allreduces of at least 256 KiB run
  // hierarchically: reduce-scatter among the node's ranks, allreduce of each
  // rank's part with the ranks in its place on the other nodes (its rail: a
  // NIC per GPU carries its own share), all-gather in the node; smaller ones
  // go to MPI whole. Sums come out in another order (equal within rounding).
  std::optional<int> ranks_per_node;
};

namespace detail {
struct CommunicatorState;
}

class Communicator {
 public:
  // An in-process group: member i is devices[i] (distinct devices of
  // `engine`, all CPU devices or all GPUs). Throws weft::InvalidArgument
  // naming the bad device. On GPUs a collective is stream-ordered GPU work:
  // no engine worker waits on the host for it or for its inputs.
  static Communicator local(Engine& engine, std::vector<Device> devices);
  // One member per process of an MPI job (MPI_COMM_WORLD): this process is
  // member MPI rank, on `device` (a CPU device or a GPU of `engine`; a GPU's
  // tensors go through NCCL where it is used, on the cuda backend of a build
  // with NCCL unless WEFT_NCCL=0, and are otherwise staged through cpu(0)).
  // Collective:
  // every process creates its communicators in the same order. Initializes
  // MPI (MPI_THREAD_MULTIPLE) if nobody has, and then finalizes it at exit;
  // if you initialized it, ask for at least MPI_THREAD_SERIALIZED and keep
  // MPI alive while collectives are in flight. Weft calls MPI from its
  // communication thread only. Without mpirun it is a group of one.
  static Communicator mpi(Engine& engine, Device device, CommunicatorOptions options = {});
  // Several devices per process (hierarchical): every process gives as many
  // distinct CPU devices or GPUs of `engine`, and process p's devices[k] is
  // member p * devices.size() + k. Every collective and send/recv works as
  // in the forms above (in-process steps, then one MPI communicator per
  // device index across processes); each pair of members keeps its own
  // send/recv push order. A single device is the form above.
  static Communicator mpi(Engine& engine, std::vector<Device> devices, CommunicatorOptions options = {});

  // Sub-communicators (MPI_Comm_split; process groups), for process grids
  // such as pipeline stages x data-parallel replicas: the members r whose
  // colors[r] equals the colour of this process's member, in rank order
  // (member i of the result is the i-th of them). colors has one entry per
  // member. Collective over every process of this communicator, in the same
  // order as its other communicators and collectives are made; every
  // process passes the same colors (compared across processes: a
  // difference throws weft::CommunicationError naming both ranks; a process
  // that never calls fails the others at the timeout). In one process, all
  // members must share a colour (or use Communicator::local over a subset);
  // with several devices per process, each process's members must share
  // one. The result has this communicator's options.
  Communicator split(const std::vector<int>& colors) const;

  int size() const noexcept;                           // members in the group
  const std::vector<int>& local_ranks() const noexcept;  // the members this process drives
  Device device(int rank) const;                       // a local member's device
  Engine& engine() const noexcept;
  // "in-process communicator of 2 members: cpu(0), cpu(1)",
  // "MPI communicator of 4 ranks (rank 1 on cpu(0) here)"
  std::string str() const;

 private:
  explicit Communicator(std::shared_ptr<detail::CommunicatorState> state) : state_(std::move(state)) {}
  friend const std::shared_ptr<detail::CommunicatorState>& state_of(const Communicator& comm) noexcept;
  std::shared_ptr<detail::CommunicatorState> state_;
};

// Every member's tensor becomes the reduction of all of them (in place).
void allreduce(const Communicator& comm, const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum,
               CollectiveOptions options = {});
// Every member's tensor becomes the root's.
void broadcast(const Communicator& comm, const std::vector<Tensor>& tensors, CollectiveOptions options = {});
// The root's tensor becomes the reduction of all of them; the others are
// only read.
void reduce(const Communicator& comm, const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum,
            CollectiveOptions options = {});
// Member r's output becomes chunk r of the reduction of the inputs: inputs
// have `count` elements each, output r has chunk(count, size, r).size().
void reduce_scatter(const Communicator& comm, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                    ReduceOp op = ReduceOp::sum, CollectiveOptions options = {});
// Every member's output becomes the concatenation of the inputs, member r's
// at chunk(count, size, r): the inverse of reduce_scatter's split. In place:
// a member's input may be its own chunk of its output (Tensor::view).
void all_gather(const Communicator& comm, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                CollectiveOptions options = {});
// Completes on every member once every member reached it.
void barrier(const Communicator& comm, CollectiveOptions options = {});

// Point to point, for pipeline stages. send: `tensor`, on the device of a
// member this process drives, goes to member `peer` (read). recv: `tensor`,
// on the device of a member this process drives, becomes what `peer` sends
// (written). The k-th send from member a to member b meets b's k-th recv from
// a; across processes they are checked like collectives (name, dtype,
// shape) and a mismatch fails both ends, naming both (a send only reads its
// tensor, so its errors reach wait_all); GPU members on NCCL's communicators
// send GPU to GPU (ncclSend/ncclRecv). In-process, the send is a snapshot
// taken in push order and its recv must be pushed after it, with the same
// shape and dtype (else InvalidArgument at push).
// options.root is unused.
void send(const Communicator& comm, const Tensor& tensor, int peer, CollectiveOptions options = {});
void recv(const Communicator& comm, const Tensor& tensor, int peer, CollectiveOptions options = {});

// The elements of `count` that member `rank` of `size` owns in
// reduce_scatter and all_gather: balanced, the first count % size members
// one more.
struct Chunk {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const noexcept { return end - begin; }
};
Chunk chunk(std::int64_t count, int size, int rank) noexcept;

}  // namespace weft::parallel
