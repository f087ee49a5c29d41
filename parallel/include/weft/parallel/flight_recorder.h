// weft::parallel's flight recorder: what this process's collectives and
// messages were doing, for the post-mortem of a hang or a mismatch.
//
// Each process keeps a ring of its last N collectives, sends and receives
// (WEFT_FLIGHT_RECORDER entries, default 2000; 0: off): communicator, sequence
// number, kind, name, dtype, element count, peer or root, state (queued,
// started, completed, failed with its message) and when each state began.
// A dump writes it, with the engines' pending ops (Engine::pending_ops), as
// one JSON file per process: WEFT_FLIGHT_RECORDER_DIR (default: the working
// directory)/weft-flight-rank<R>.json (R: the MPI world rank; without MPI,
// weft-flight-pid<P>.json). Dumps happen at a collective's deadline, at a
// fingerprint mismatch, a heartbeat loss (a rank declared dead), when a
// collective of an MPI communicator has been pending longer than its timeout
// (the rank that is late dumps too) — the first of these in the process,
// which says the most —, on SIGUSR1, in a process with an MPI communicator
// on SIGTERM (then the process ends of it as before: mpirun sends it to the
// survivors of a rank that died), and on dump_flight_record.
// scripts/weft-flight merges the ranks' dumps and names the first divergence.
// Format and design: docs/design/parallel-collectives.md ("Flight recorder").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weft::parallel {

// Entries kept (0: the recorder is off). Read from WEFT_FLIGHT_RECORDER at
// first use (a number in [0, 1000000]; throws weft::InvalidArgument naming it).
std::size_t flight_recorder_capacity();
// Changes the capacity, emptying the ring; 0 turns recording off (and leaves
// the signal handlers in place once installed). For benchmarks and tests.
void set_flight_recorder_capacity(std::size_t entries);

// Writes this process's dump now, on the calling thread, with `reason` in
// it; returns the file's path, or "" when the recorder is off. Any thread
// (not a signal handler: SIGUSR1 does that). Throws weft::Error naming the
// file when it cannot be written.
std::string dump_flight_record(std::string_view reason);

// The path this process's dump goes to.
std::string flight_record_path();

}  // namespace weft::parallel
