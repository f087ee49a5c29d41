// One collective call on its way in: its kind, name and sequence number,
// and the push-time checks every transport shares (internal to parallel/).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator_state.h"
#include "collectives/flight.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace weft::parallel::detail {

enum class Kind : std::uint8_t { allreduce, broadcast, reduce, reduce_scatter, all_gather, barrier, send, recv };
const char* to_string(Kind kind) noexcept;

class Call {
 public:
  Call(Kind kind, const Communicator& comm, const CollectiveOptions& options);

  Kind kind() const noexcept { return kind_; }
  const CollectiveOptions& options() const noexcept { return options_; }
  const Communicator& comm() const noexcept { return comm_; }
  CommunicatorState& state() const noexcept { return state_; }
  // The collective's number on its communicator (1, 2, ...), taken by
  // commit() once the checks passed, so that refused calls leave no gap:
  // across processes, rank k's n-th collective meets every other rank's n-th.
  std::uint64_t sequence() const noexcept { return sequence_; }
  // "allreduce 'grad.fc1' #17" ("#17" once committed).
  const std::string& label() const noexcept { return label_; }

  [[noreturn]] void refuse(const std::string& why) const;
  // One tensor per local member, defined, of this engine, on the member's
  // device, distinct; float32, bfloat16 or float16 where the collective
  // reduces.
  void check_tensors(const std::vector<Tensor>& tensors, const char* what, bool reduces) const;
  // Equal element counts and dtypes among the local members.
  void check_same_size(const std::vector<Tensor>& tensors, const char* what) const;
  void check_root() const;
  void check_distinct(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) const;
  // Member `local_ranks()[k]`'s tensor must hold `elements` elements.
  void check_chunks(const std::vector<Tensor>& tensors, const char* what, std::int64_t count, DType dtype) const;
  // "member 2" (in-process) or "rank 2" (across processes).
  std::string member(std::size_t k) const;

  // What the flight recorder notes of the call's data (before commit, or
  // commit_message).
  void set_payload(DType dtype, std::int64_t count) {
    has_dtype_ = true;
    dtype_ = dtype;
    count_ = count;
  }
  // The call's flight-recorder entry (taken by commit or commit_message
  // where the transport records its calls); the transport reports its start
  // and end with it.
  FlightTicket flight() const noexcept { return flight_; }

  void commit();
  // Point to point: the k-th message from one member to another is
  // numbered k among those two ("send 'act' to rank 1 #3").
  void commit_message(std::uint64_t k, int peer);
  // The local member whose device `t` is on (push-time check), and a peer
  // that is another member of the group.
  std::size_t check_message(const Tensor& t, int peer) const;
  // send and recv: the channel (0 for the public calls). Messages between
  // two members on different channels never meet; each channel keeps its
  // own push order.
  static constexpr int kMaxChannels = 1024;
  int channel() const noexcept { return channel_; }
  void set_channel(int channel);

 private:
  Kind kind_;
  const Communicator& comm_;
  CommunicatorState& state_;
  CollectiveOptions options_;
  std::uint64_t sequence_ = 0;
  int channel_ = 0;
  std::string label_;
  bool has_dtype_ = false;
  DType dtype_ = DType::float32;
  std::int64_t count_ = 0;
  FlightTicket flight_;
  void record(int peer);
};

// The peers' statuses of a check whose token does not wait for them
// (check_across with `after`): `entered` once the fingerprints matched and
// this rank's status went out, just before the token completes (the
// collective may launch); `settled` once every peer's status is in, or
// their wait failed, with `error` (written before it) saying which rank's
// input failed or who never came. Any thread reads them (acquire).
struct CheckAfter {
  std::atomic<bool> entered{false}, settled{false};
  std::exception_ptr error;
};

// Pushes only the fingerprint check of a collective `kind` of `described`
// (its size and dtype) on an MPI communicator, reading the collective's
// `reads` (any device: it holds them): fails `token` (written) on every
// rank when the ranks disagree or a rank is missing; moves no data. Without
// `after`, the token also waits for every peer's status and fails when one
// of their inputs failed (a meeting of the ranks); with it, the token
// completes once this rank's status went out, and `after` settles when the
// peers' statuses are in (docs/design/parallel-collectives.md, "NCCL").
void check_across(const Communicator& comm, Kind kind, const Tensor& described, const std::vector<Tensor>& reads,
                  const Tensor& token, ReduceOp op, const CollectiveOptions& options,
                  std::shared_ptr<CheckAfter> after = nullptr);
// Pushes only the fingerprint check of a message (send: this rank sends
// `described` to `peer`; recv: receives it), on an MPI communicator: the
// two ends exchange their records, so that `token` (written) fails on both
// ends, naming both, when the shapes, dtypes or names differ, and on the
// receiver when the sender's input failed (a send reads `described`; a
// recv reads nothing, so its exchange starts at push). Moves no data.
void check_message_across(const Communicator& comm, Kind kind, const Tensor& described, int peer, int channel,
                          const Tensor& token, const CollectiveOptions& options);

// send and recv on a channel of `comm` (the public send/recv use channel 0).
void send_on(const Communicator& comm, const Tensor& tensor, int peer, int channel, const CollectiveOptions& options);
void recv_on(const Communicator& comm, const Tensor& tensor, int peer, int channel, const CollectiveOptions& options);

}  // namespace weft::parallel::detail
