#include <algorithm>
#include <string>
#include <utility>

#include "collectives/communicator_state.h"
#include "collectives/flight.h"
#include "weft/env.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"

namespace weft::parallel {

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::average: return "average";
    case ReduceOp::max: return "max";
  }
  return "?";
}

Chunk chunk(std::int64_t count, int size, int rank) noexcept {
  const std::int64_t n = size, r = rank;
  const std::int64_t base = count / n, extra = count % n;
  const std::int64_t begin = r * base + std::min(r, extra);
  return Chunk{begin, begin + base + (r < extra ? 1 : 0)};
}

detail::CommunicatorState::~CommunicatorState() { detail::flight_forget(*this); }

Communicator Communicator::local(Engine& engine, std::vector<Device> devices) {
  static_cast<void>(detail::flight_recording());  // a bad WEFT_FLIGHT_RECORDER is refused here
  if (devices.empty()) throw InvalidArgument("weft::parallel::Communicator::local: no devices");
  const std::vector<Device> known = engine.devices();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const Device d = devices[i];
    if (!d.is_cpu() && !d.is_gpu())
      throw InvalidArgument("weft::parallel::Communicator::local: member " + std::to_string(i) + " is " + d.str() +
                            "; members are CPU devices or GPUs");
    if (d.is_gpu() != devices.front().is_gpu())
      throw InvalidArgument("weft::parallel::Communicator::local: member " + std::to_string(i) + " is " + d.str() +
                            " but member 0 is " + devices.front().str() +
                            "; a group's members are all CPU devices or all GPUs");
    if (std::find(known.begin(), known.end(), d) == known.end())
      throw InvalidArgument("weft::parallel::Communicator::local: member " + std::to_string(i) + " is " + d.str() +
                            ", which this engine does not have");
    for (std::size_t j = 0; j < i; ++j)
      if (devices[j] == d)
        throw InvalidArgument("weft::parallel::Communicator::local: members " + std::to_string(j) + " and " +
                              std::to_string(i) + " are both " + d.str());
  }
  auto state = std::make_shared<detail::CommunicatorState>();
  state->engine = &engine;
  state->size = static_cast<int>(devices.size());
  for (int r = 0; r < state->size; ++r) state->local_ranks.push_back(r);
  state->devices = std::move(devices);
  state->transport = detail::make_local_transport(*state);
  return Communicator(std::move(state));
}

Communicator Communicator::mpi(Engine& engine, Device device, CommunicatorOptions options) {
  const std::vector<Device> known = engine.devices();
  if (!device.is_cpu() && !device.is_gpu())
    throw InvalidArgument("weft::parallel::Communicator::mpi: " + device.str() +
                          " is neither a CPU device nor a GPU");
  if (std::find(known.begin(), known.end(), device) == known.end())
    throw InvalidArgument("weft::parallel::Communicator::mpi: " + device.str() + " is not a device of this engine");
  auto state = std::make_shared<detail::CommunicatorState>();
  state->engine = &engine;
  state->devices = {device};
  state->across_processes = true;
  state->options = options;
  if (device.is_gpu()) {
    // NCCL where built and wanted, else through host memory; either way
    // over a communicator of cpu(0) (of one tier: its collectives are this one's parts).
    CommunicatorOptions host_options = options;
    host_options.ranks_per_node = 0;
    Communicator host = Communicator::mpi(engine, Device::cpu(0), host_options);
#if WEFT_HAVE_NCCL
    if (detail::nccl_wanted())
      state->transport = detail::make_nccl_mpi_transport(*state, std::move(host), options);
    else
#endif
      state->transport = detail::make_staged_transport(*state, std::move(host));
  } else {
    static_cast<void>(detail::flight_recording());  // a bad WEFT_FLIGHT_RECORDER is refused here
    state->transport = detail::make_mpi_transport(*state, options);  // sets size and local_ranks
    detail::flight_set_rank(state->local_ranks.front());  // MPI_COMM_WORLD's rank
  }
  Communicator comm(std::move(state));
  // Whole nodes of consecutive ranks: a node and a rail sub-communicator
  // (collective, the same on every process).
  const int per_node = options.ranks_per_node ? *options.ranks_per_node
                                              : static_cast<int>(env::number_or("WEFT_RANKS_PER_NODE", 0, 0, 1 << 20));
  const int size = comm.size();
  if (per_node >= 2 && size > per_node) {
    if (size % per_node != 0)
      throw InvalidArgument("weft::parallel::Communicator::mpi: " + std::to_string(size) + " ranks do not fill nodes of " +
                            std::to_string(per_node) + " (CommunicatorOptions::ranks_per_node or WEFT_RANKS_PER_NODE)");
    std::vector<int> node(static_cast<std::size_t>(size)), rail(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      node[static_cast<std::size_t>(r)] = r / per_node;
      rail[static_cast<std::size_t>(r)] = r % per_node;
    }
    comm.state_->tiers = std::make_shared<const detail::Tiers>(
        detail::Tiers{comm.split(node), comm.split(rail), size / per_node, per_node});
  }
  return comm;
}

Communicator Communicator::mpi(Engine& engine, std::vector<Device> devices, CommunicatorOptions options) {
  if (devices.empty()) throw InvalidArgument("weft::parallel::Communicator::mpi: no devices");
  if (devices.size() == 1) return mpi(engine, devices.front(), options);
  // Checks the devices like an in-process group, then joins the processes.
  Communicator local = Communicator::local(engine, devices);
  auto state = std::make_shared<detail::CommunicatorState>();
  state->engine = &engine;
  state->devices = std::move(devices);
  state->across_processes = true;
  state->options = options;
  state->transport = detail::make_hierarchical_transport(*state, std::move(local), options);  // sets size, local_ranks
  return Communicator(std::move(state));
}

namespace {

std::string colors_text(const std::vector<int>& colors) {
  std::string text = "{";
  for (std::size_t i = 0; i < colors.size(); ++i) text += (i ? ", " : "") + std::to_string(colors[i]);
  return text + "}";
}

}  // namespace

Communicator Communicator::split(const std::vector<int>& colors) const {
  const std::string what = "weft::parallel::Communicator::split (" + str() + ")";
  if (colors.size() != static_cast<std::size_t>(size()))
    throw InvalidArgument(what + ": " + std::to_string(colors.size()) + " colors for " + std::to_string(size()) +
                          " members; give one colour per member");
  for (std::size_t r = 0; r < colors.size(); ++r)
    if (colors[r] < 0)
      throw InvalidArgument(what + ": member " + std::to_string(r) + "'s colour is " + std::to_string(colors[r]) +
                            "; colours are 0 or more (every member belongs to one group)");
  // Members p * per .. p * per + per - 1 are one process's (in-process:
  // all of them; hierarchical: every process's, checked on every process
  // alike, so that all of them refuse the same colors).
  const auto per = state_->local_ranks.size();
  for (std::size_t r = 0; r < colors.size(); ++r) {
    const std::size_t first = r - r % per;
    if (colors[r] != colors[first])
      throw InvalidArgument(what + ": members " + std::to_string(first) + " and " + std::to_string(r) +
                            (state_->across_processes ? ", of one process," : "") + " have colours " +
                            std::to_string(colors[first]) + " and " + std::to_string(colors[r]) + " (colors " +
                            colors_text(colors) + "); " +
                            (state_->across_processes
                                 ? "a process's members share one colour"
                                 : "an in-process communicator's members share one colour: make a "
                                   "Communicator::local over each subset instead"));
  }
  if (!state_->across_processes) return Communicator::local(*state_->engine, state_->devices);  // its own sequence
  auto state = std::make_shared<detail::CommunicatorState>();
  state->engine = state_->engine;
  state->devices = state_->devices;
  state->across_processes = true;
  state->options = state_->options;
  state->transport = state_->transport->split(*state, colors);  // sets size and local_ranks
  return Communicator(std::move(state));
}

namespace detail {

std::unique_ptr<Transport> Transport::split(CommunicatorState& into, const std::vector<int>& colors) const {
  (void)into;
  (void)colors;
  throw InvalidArgument("weft::parallel::Communicator::split: " + str() + " cannot be split");
}

}  // namespace detail

int Communicator::size() const noexcept { return state_->size; }
const std::vector<int>& Communicator::local_ranks() const noexcept { return state_->local_ranks; }
Engine& Communicator::engine() const noexcept { return *state_->engine; }

Device Communicator::device(int rank) const {
  const auto& ranks = state_->local_ranks;
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end())
    throw InvalidArgument("weft::parallel::Communicator::device: rank " + std::to_string(rank) +
                          (rank >= 0 && rank < size() ? " is driven by another process (" : " outside (") + str() + ")");
  return state_->devices[static_cast<std::size_t>(it - ranks.begin())];
}

std::string Communicator::str() const { return state_->transport->str(); }

const std::shared_ptr<detail::CommunicatorState>& state_of(const Communicator& comm) noexcept { return comm.state_; }

}  // namespace weft::parallel
