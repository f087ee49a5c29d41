// send and recv across MPI processes (mpi_group.h; the protocol is in the
// comment below).
#include <memory>
#include <string>
#include <vector>

#include "collectives/mpi/mpi_group.h"

namespace weft::parallel::detail {
namespace {

// ---- send and recv ------------------------------------------------------------------
//
// Per pair of ranks, the k-th send meets the k-th recv: each side posts its
// messages in push order through a per-peer gate. With fingerprints, the
// sender sends its record and its data at once, the receiver checks the
// record before taking the data (into the tensor, or into a scratch buffer
// when it does not match) and replies with its own, so both ends see a
// mismatch and name both sides. A check-only message (check_message_across,
// for NCCL's send/recv) exchanges the records and moves no data.

// Channel c uses tags 3c + 1 .. 3c + 3 (Call::kMaxChannels keeps them under
// the 32767 every MPI allows).
constexpr int kHeaderTag = 1, kDataTag = 2, kReplyTag = 3;
struct Tags {
  int header, data, reply;
  explicit Tags(int channel) : header(3 * channel + kHeaderTag), data(3 * channel + kDataTag), reply(3 * channel + kReplyTag) {}
};

struct Wire {
  Fingerprint header, reply;
};

bool same_message(const Fingerprint& a, const Fingerprint& b) {
  return a.name_hash == b.name_hash && a.count == b.count && a.dtype == b.dtype && a.shape_hash == b.shape_hash;
}

std::string message_mismatch(const Fingerprint& a, int rank_a, const Fingerprint& b, int rank_b) {
  if (rank_b < rank_a) return message_mismatch(b, rank_b, a, rank_a);
  return "send and recv differ: rank " + std::to_string(rank_a) + " called " + describe(a) + "; rank " +
         std::to_string(rank_b) + " called " + describe(b);
}


// Leaves no buffer to MPI that is about to go: receives are cancelled (a
// cancelled request's wait returns at once); a send still pending may be
// matched by a slow receiver and cannot be taken back, so its memory (the
// wire, the tensors) is never freed.
void give_up(std::initializer_list<MPI_Request*> recvs, std::initializer_list<MPI_Request*> sends,
             std::unique_ptr<Wire>& wire, Job& job) {
  for (MPI_Request* r : recvs)
    if (*r != MPI_REQUEST_NULL) {
      MPI_Cancel(r);
      MPI_Wait(r, MPI_STATUS_IGNORE);
    }
  bool left = false;
  for (MPI_Request* r : sends)
    if (*r != MPI_REQUEST_NULL) {
      MPI_Request_free(r);
      left = true;
    }
  if (left) {
    static_cast<void>(wire.release());
    abandon_memory(job);
  }
}

// Why a message failed: an MPI call (`call` returned `rc`), the process
// exiting, or `late`. A fiber does not throw: the message fails its job.
std::string waited_text(const char* call, int rc, CommThread::Wait waited, const std::string& late) {
  if (rc != MPI_SUCCESS) return WEFT_MPI_FAILURE(call, rc);
  if (waited == CommThread::Wait::stopping) return "the process is exiting";
  return late;
}

}  // namespace

void run_send(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const int peer = job.root;
  SequenceGate& gate = g.send_gate[{peer, job.channel}];
  const Tags tags(job.channel);
  const std::uint64_t seq = job.mine.sequence;
  if (!wait_turn(job, thread, gate, seq)) return gate.pass(seq);
  if (!g.fingerprints && job.failed_input) {
    // The receiver cannot be told: it fails at its timeout.
    g.set_broken(job.label + ": this rank's input failed (fingerprints are off)");
    complete(job, job.failed_input);
    return gate.pass(seq);
  }
  if (job.check_only && !g.fingerprints) {  // nothing to check (NCCL moves the data)
    complete(job);
    return gate.pass(seq);
  }
  auto wire = std::make_unique<Wire>();
  wire->header = job.mine;
  MPI_Request header = MPI_REQUEST_NULL, data = MPI_REQUEST_NULL, reply = MPI_REQUEST_NULL;
  int rc = MPI_SUCCESS;
  const char* call = "MPI_Isend";  // the call that returned rc
  if (g.fingerprints) {
    rc = MPI_Isend(&wire->header, sizeof(Fingerprint), MPI_BYTE, peer, tags.header, g.p2p, &header);
    if (rc == MPI_SUCCESS) {
      call = "MPI_Irecv";
      rc = MPI_Irecv(&wire->reply, sizeof(Fingerprint), MPI_BYTE, peer, tags.reply, g.p2p, &reply);
    }
  }
  if (rc == MPI_SUCCESS && !job.failed_input && !job.check_only) {
    call = "MPI_Isend";
    rc = MPI_Isend(job.in, job.count, job.type, peer, tags.data, g.p2p, &data);
  }
  gate.pass(seq);
  if (rc == MPI_SUCCESS) call = "MPI_Test";
  const CommThread::Wait waited =
      rc != MPI_SUCCESS ? CommThread::Wait::done
                        : thread.poll_until([&] { return test_all({&header, &data, &reply}, rc); }, job.deadline, &job.group->lost);
  if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
    give_up({&reply}, {&header, &data}, wire, job);
    fail_broken(job,
                waited_text(call, rc, waited,
                            "rank " + std::to_string(peer) + " did not receive it within " + seconds_text(g.timeout) +
                                " (CommunicatorOptions::timeout, WEFT_COLLECTIVE_TIMEOUT)"),
                peer);
    return;
  }
  if (job.failed_input) return complete(job, job.failed_input);
  if (g.fingerprints && !same_message(wire->header, wire->reply))
    return complete(job, comm_error(job, message_mismatch(wire->header, g.rank, wire->reply, peer), peer));
  complete(job);
}

void run_recv(Job& job, CommThread& thread) {
  MpiGroup& g = *job.group;
  const int peer = job.root;
  SequenceGate& gate = g.recv_gate[{peer, job.channel}];
  const Tags tags(job.channel);
  const std::uint64_t seq = job.mine.sequence;
  if (!wait_turn(job, thread, gate, seq)) return gate.pass(seq);
  const std::string late = "rank " + std::to_string(peer) + " sent nothing within " + seconds_text(g.timeout) +
                           " (CommunicatorOptions::timeout, WEFT_COLLECTIVE_TIMEOUT)";
  auto wire = std::make_unique<Wire>();
  wire->reply = job.mine;
  MPI_Request header = MPI_REQUEST_NULL, data = MPI_REQUEST_NULL, reply = MPI_REQUEST_NULL;
  int rc = MPI_SUCCESS;
  const char* call = "MPI_Irecv";  // the call that returned rc
  if (job.check_only && !g.fingerprints) {  // nothing to check (NCCL moves the data)
    gate.pass(seq);
    return complete(job);
  }
  if (!g.fingerprints) {
    rc = MPI_Irecv(job.out, job.count, job.type, peer, tags.data, g.p2p, &data);
    gate.pass(seq);
    if (rc == MPI_SUCCESS) call = "MPI_Test";
    const CommThread::Wait waited =
        rc != MPI_SUCCESS ? CommThread::Wait::done
                          : thread.poll_until([&] { return test_all({&data}, rc); }, job.deadline, &job.group->lost);
    if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
      give_up({&data}, {}, wire, job);
      return fail_broken(job, waited_text(call, rc, waited, late), peer);
    }
    return complete(job);
  }
  rc = MPI_Irecv(&wire->header, sizeof(Fingerprint), MPI_BYTE, peer, tags.header, g.p2p, &header);
  if (rc == MPI_SUCCESS) call = "MPI_Test";
  const CommThread::Wait heard =
      rc != MPI_SUCCESS ? CommThread::Wait::done
                        : thread.poll_until([&] { return test_all({&header}, rc); }, job.deadline, &job.group->lost);
  if (rc != MPI_SUCCESS || heard != CommThread::Wait::done) {
    give_up({&header}, {}, wire, job);
    gate.pass(seq);
    return fail_broken(job, waited_text(call, rc, heard, late), peer);
  }
  const Fingerprint& h = wire->header;
  const bool match = same_message(h, job.mine);
  std::vector<unsigned char> discard;  // a mismatched message's data, taken and dropped
  if (!h.failed && !job.check_only) {  // a check moves no data
    call = "MPI_Irecv";
    if (match) {
      rc = MPI_Irecv(job.out, job.count, job.type, peer, tags.data, g.p2p, &data);
    } else {
      const auto type = static_cast<DType>(h.dtype);
      discard.resize(static_cast<std::size_t>(h.count) * dtype_size(type));
      rc = MPI_Irecv(discard.data(), static_cast<int>(h.count), mpi_type(type), peer, tags.data, g.p2p, &data);
    }
  }
  gate.pass(seq);  // this message's data receive is posted: the next may post its own
  if (rc == MPI_SUCCESS) {
    call = "MPI_Isend";
    rc = MPI_Isend(&wire->reply, sizeof(Fingerprint), MPI_BYTE, peer, tags.reply, g.p2p, &reply);
  }
  if (rc == MPI_SUCCESS) call = "MPI_Test";
  const CommThread::Wait waited =
      rc != MPI_SUCCESS ? CommThread::Wait::done
                        : thread.poll_until([&] { return test_all({&data, &reply}, rc); }, job.deadline, &job.group->lost);
  if (rc != MPI_SUCCESS || waited != CommThread::Wait::done) {
    give_up({&data}, {&reply}, wire, job);
    return fail_broken(job,
                       waited_text(call, rc, waited,
                                   "rank " + std::to_string(peer) + " announced the message, but its data did not "
                                                                   "arrive within " + seconds_text(g.timeout)),
                       peer);
  }
  if (h.failed)
    return complete(job, comm_error(job, "rank " + std::to_string(peer) + "'s input failed: " + std::string(h.reason),
                                    peer));
  if (!match) return complete(job, comm_error(job, message_mismatch(h, peer, job.mine, g.rank), peer));
  complete(job);
}

}  // namespace weft::parallel::detail
