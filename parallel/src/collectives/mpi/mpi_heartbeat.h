// The heartbeat of an MPI job (internal to parallel/): a rank that stops
// answering (stopped, stuck in a driver call, cut off) is declared dead on
// every survivor within WEFT_HEARTBEAT_TIMEOUT seconds, instead of at the
// collective deadline (WEFT_COLLECTIVE_TIMEOUT, 300 s).
//
// One fiber on the MPI communication thread, started with the process's
// first world communicator, beats to its two ring neighbours every
// WEFT_HEARTBEAT_INTERVAL seconds on a duplicate of MPI_COMM_WORLD of its
// own, and judges their silence by its own progress: time in which this
// process itself did not run is not counted against a neighbour. The rank
// that notices a silent neighbour tells every other rank; each survivor
// then fails the pending and later collectives of every communicator that
// includes the dead rank with weft::CommunicationError naming it, its host
// and how long it has been silent (docs/design/parallel-collectives.md,
// "Heartbeats").
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace weft::parallel::detail {

class CommThread;
struct MpiGroup;

struct HeartbeatSettings {
  bool on = true;  // WEFT_HEARTBEAT_INTERVAL=off: no heartbeat
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{10000};
};
// From WEFT_HEARTBEAT_INTERVAL and WEFT_HEARTBEAT_TIMEOUT; a malformed or
// out-of-range value throws InvalidArgument naming the variable. Any thread.
HeartbeatSettings heartbeat_settings();

// On the communication thread, inside the creation of a world communicator
// (collective: every rank calls it at the same point): the first call
// duplicates MPI_COMM_WORLD for the heartbeat, exchanges host names and
// starts the heartbeat's fiber; later calls do nothing. Returns "" or why
// not. `settings` are the first call's (the heartbeat is one per process).
std::string start_heartbeat(CommThread& thread, const HeartbeatSettings& settings,
                            std::chrono::steady_clock::time_point deadline);

// Communicators the heartbeat fails when one of their members is declared
// dead. watch_group: on the communication thread, once g's communicators
// exist (a group with a member dead already is lost at once);
// unwatch_group: any thread, before g goes.
void watch_group(MpiGroup& g);
void unwatch_group(MpiGroup* g);

// Why a new world communicator cannot be made ("" while no rank was
// declared dead): its creation is collective and the dead rank never joins.
// Any thread.
std::string declared_deaths();

// ---- the one place a declared death is reported inside the process ----------------
//
// Hooks run on the communication thread, in the order they were added,
// once per rank declared dead (whether this rank noticed the silence or
// was told by the rank that did), after the communicators that include
// the dead rank were failed. A hook must be quick and must not call MPI or
// wait for collectives; what it throws is dropped. (A flight recorder's
// dump on a heartbeat loss belongs here.)
struct RankDeath {
  int rank = -1;        // in MPI_COMM_WORLD; this rank's own when it was declared dead by the others
  std::string host;     // the dead rank's host
  std::chrono::milliseconds silent{0};  // how long it had been silent when it was declared dead
  int noticed_by = -1;  // the rank whose heartbeat noticed (world rank)
  std::string message;  // what the failed collectives say
};
using DeathHook = std::function<void(const RankDeath&)>;
void on_rank_death(DeathHook hook);  // any thread

// Whether a death was declared in this process (MpiProcess::at_exit: MPI_Finalize
// would wait for the dead rank forever). Any thread.
bool death_declared() noexcept;

}  // namespace weft::parallel::detail
