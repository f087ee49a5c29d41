// What a Communicator shares among its copies, and the interface of its
// transports (internal to parallel/).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/device.h"
#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace weft::parallel {

namespace detail {

class Call;
struct CommunicatorState;

// One transport per communicator: it pushes a collective whose arguments the
// public entry points (collectives.cpp) have checked. Tensors come in
// local_ranks() order.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string str() const = 0;
  // Before the call is committed: what this transport cannot carry (throws
  // InvalidArgument through call.refuse).
  virtual void check(const Call& call, std::int64_t elements) const {
    (void)call;
    (void)elements;
  }
  virtual void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) = 0;
  virtual void broadcast(const Call& call, const std::vector<Tensor>& tensors) = 0;
  virtual void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) = 0;
  virtual void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                              ReduceOp op) = 0;
  virtual void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) = 0;
  // Whether all_gather takes an input that is its output's own chunk as it
  // is (it never writes a member's own chunk); otherwise all_gather hands
  // such an input over as a copy.
  virtual bool all_gather_in_place() const { return false; }
  virtual void barrier(const Call& call) = 0;
  // Point to point from member `from` to member `to` (one of them local);
  // numbers the call with call.commit_message.
  virtual void send(Call& call, const Tensor& tensor, int from, int to) = 0;
  virtual void recv(Call& call, const Tensor& tensor, int from, int to) = 0;
  // Communicator::split across processes (collective over this
  // communicator's processes): the transport of the members whose colour is
  // this process's, over `into` (its engine, devices and options set; sets
  // its size and local_ranks). colors has one entry per member, each >= 0,
  // and this process's members share one.
  virtual std::unique_ptr<Transport> split(CommunicatorState& into, const std::vector<int>& colors) const;
  // Whether the flight recorder records this transport's calls (it reports
  // when each starts and ends); the others leave it to the communicators
  // they call, whose entries say what happened.
  virtual bool records_flight() const { return false; }
};

// An MPI group that spans whole nodes (CommunicatorOptions::ranks_per_node):
// this process's node and rail sub-communicators.
struct Tiers {
  Communicator node, rail;
  int nodes = 0, per_node = 0;
};

struct CommunicatorState {
  Engine* engine = nullptr;
  int size = 0;                    // members in the group
  std::vector<int> local_ranks;    // the members this process drives
  std::vector<Device> devices;     // devices[k]: local_ranks[k]'s device
  bool across_processes = false;   // an MPI communicator (Communicator::mpi or a split of one)
  CommunicatorOptions options;     // MPI: as given (a split keeps its parent's)
  std::atomic<std::uint64_t> sequence{0};  // collectives pushed so far (names them: "#3")
  std::unique_ptr<Transport> transport;
  std::shared_ptr<const Tiers> tiers;  // set when the group spans whole nodes
  std::atomic<std::uint64_t> flight_id{0};  // the flight recorder's number for it (0: none yet)
  ~CommunicatorState();
};

std::unique_ptr<Transport> make_local_transport(CommunicatorState& state);
// The deadline of one collective: options.timeout, else WEFT_COLLECTIVE_TIMEOUT
// (seconds), else 5 minutes. Throws InvalidArgument for a bad setting.
std::chrono::milliseconds collective_timeout(const CommunicatorOptions& options);
// Whether fingerprints are exchanged: options.fingerprints, else
// WEFT_COLLECTIVE_CHECK (0 or 1), else on.
bool collective_fingerprints(const CommunicatorOptions& options);
// Joins MPI_COMM_WORLD (collective); sets state.size and state.local_ranks.
std::unique_ptr<Transport> make_mpi_transport(CommunicatorState& state, const CommunicatorOptions& options);
// NCCL (nccl_collectives.cpp, built where NCCL was found: WEFT_HAVE_NCCL):
// wanted on the cuda backend unless WEFT_NCCL=0. In-process, with `ring` for
// what NCCL does not carry; across processes, bootstrapped and checked over
// `host` (the same ranks on cpu(0)), staged through it for the rest; sets
// state.size and local_ranks.
bool nccl_wanted();
std::unique_ptr<Transport> make_nccl_transport(CommunicatorState& state, std::unique_ptr<Transport> ring);
std::unique_ptr<Transport> make_nccl_mpi_transport(CommunicatorState& state, Communicator host,
                                                   const CommunicatorOptions& options);
// A GPU member across processes without NCCL: staged through host memory,
// over `host` (the same ranks on cpu(0)); sets state.size and local_ranks.
std::unique_ptr<Transport> make_staged_transport(CommunicatorState& state, Communicator host);
// Several devices per process: `local` over them, one MPI communicator per
// device (collective); sets state.size and state.local_ranks.
std::unique_ptr<Transport> make_hierarchical_transport(CommunicatorState& state, Communicator local,
                                                       const CommunicatorOptions& options);

}  // namespace detail

const std::shared_ptr<detail::CommunicatorState>& state_of(const Communicator& comm) noexcept;

}  // namespace weft::parallel
