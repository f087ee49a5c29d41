// The flight recorder's ring and dumps (flight_recorder.cpp; the public side
// is weft/parallel/flight_recorder.h). Internal to parallel/.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "weft/dtype.h"

namespace weft::parallel::detail {

enum class Kind : std::uint8_t;
struct CommunicatorState;

// One recorded call (0: not recorded: the recorder was off, or the
// transport leaves its calls to the communicators it calls).
struct FlightTicket {
  std::uint64_t record = 0;
};

// Whether calls are recorded now (one relaxed load).
// Reads WEFT_FLIGHT_RECORDER at its first call (throws InvalidArgument naming
// it for a bad value: communicators are created after calling it once).
bool flight_recording();
// A call took its sequence number: its entry, queued. `dtype` may be
// absent (barrier); `peer` is the other rank of a send or recv (-1
// otherwise), `root` a broadcast's or reduce's (-1 otherwise).
FlightTicket flight_queued(CommunicatorState& state, const std::string& comm, Kind kind, const std::string& name,
                           std::uint64_t sequence, bool has_dtype, DType dtype, std::int64_t count, int peer, int root);
// Its inputs are ready and this process takes part (the hold op runs).
void flight_started(FlightTicket ticket) noexcept;
// Done: completed, or failed with `error`'s message.
void flight_completed(FlightTicket ticket, const std::exception_ptr& error) noexcept;
// The communicator goes: its engine is not asked for pending ops any more.
void flight_forget(const CommunicatorState& state) noexcept;
// This process's MPI world rank (names the dump file).
void flight_set_rank(int rank) noexcept;
// Asks the recorder's thread to dump (a deadline passed, fingerprints
// differ): the first such request of the process is written; never blocks.
void flight_dump_soon(const std::string& reason) noexcept;

}  // namespace weft::parallel::detail
