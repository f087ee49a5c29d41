// The MPI transport's shared helpers (mpi_group.h).
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/elements.h"
#include "collectives/mpi/mpi_group.h"

namespace weft::parallel::detail {

std::string seconds_text(std::chrono::milliseconds t) {
  const long long ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.sequence == b.sequence && a.count == b.count && a.name_hash == b.name_hash && a.root == b.root &&
         a.kind == b.kind && a.op == b.op && a.dtype == b.dtype;
}

bool reduces(Kind kind) {
  return kind == Kind::allreduce || kind == Kind::reduce || kind == Kind::reduce_scatter;
}

// "allreduce(sum) 'grad.fc1' [4096] float32 as #17"
std::string describe(const Fingerprint& f) {
  const auto kind = static_cast<Kind>(f.kind);
  std::string s = to_string(kind);
  if (reduces(kind)) s.append("(").append(to_string(static_cast<ReduceOp>(f.op))).append(")");
  if (f.name[0]) s += " '" + std::string(f.name) + (std::strlen(f.name) + 1 == sizeof f.name ? "...'" : "'");
  const bool message = kind == Kind::send || kind == Kind::recv;
  if (message && f.shape[0])  // a message's shape: its ends compare it
    s += " " + std::string(f.shape) + " " + std::string(weft::to_string(static_cast<DType>(f.dtype)));
  else if (kind != Kind::barrier)
    s += " [" + std::to_string(f.count) + "] " + std::string(weft::to_string(static_cast<DType>(f.dtype)));
  if (kind == Kind::broadcast || kind == Kind::reduce) s += " root " + std::to_string(f.root);
  if (kind == Kind::send) s += " to rank " + std::to_string(f.root);
  if (kind == Kind::recv) s += " from rank " + std::to_string(f.root);
  return s + " as #" + std::to_string(f.sequence);
}

std::uint64_t shape_hash(const Shape& shape) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a over the rank and the dimensions
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(shape.rank());
  for (const std::int64_t d : shape.dims()) mix(static_cast<std::uint64_t>(d));
  return h;
}

void copy_text(char* dst, std::size_t capacity, const std::string& text) {
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string failure_text(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::uint8: return MPI_UINT8_T;
    case DType::float16:
    case DType::bfloat16: return MPI_UINT16_T;  // moved, never reduced
  }
  return MPI_BYTE;
}

// Completes the hold op. The job lets go of the tensors first: once the
// hold op is complete, a waiter may destroy the engine they belong to.
void complete(Job& job, std::exception_ptr error) {
  flight_completed(job.flight, error);
  job.tensors.clear();
  Completion done = std::move(job.done);
  done(std::move(error));
}

std::exception_ptr comm_error(const Job& job, const std::string& why, int peer) {
  const MpiGroup& g = *job.group;
  // After a declared death, whatever way the job gave up, the death is why.
  if (g.lost)
    return std::make_exception_ptr(
        CommunicationError(job.label + " on " + g.str() + ": " + g.lost_why, g.rank, g.lost_peer));
  return std::make_exception_ptr(
      CommunicationError(job.label + " on " + job.group->str() + ": " + why, job.group->rank, peer));
}

// The communicator cannot be trusted any more (MPI cannot cancel a started
// collective): later collectives on it fail at once with this message.
void fail_broken(Job& job, const std::string& why, int peer) {
  MpiGroup& g = *job.group;
  g.set_broken(job.label + ": " + why);
  flight_dump_soon(job.label + " on " + g.str() + ": " + why);
  complete(job, comm_error(job, why + "; the communicator is broken", peer));
}

// A data phase that never completed: MPI may still write into the tensors'
// memory, so it is never freed.
void abandon_memory(Job& job) {
  static_cast<void>(new std::vector<Tensor>(std::move(job.tensors)));
  if (!job.stand_in.empty()) static_cast<void>(new std::vector<std::byte>(std::move(job.stand_in)));
  if (!job.wide.empty()) static_cast<void>(new std::vector<float>(std::move(job.wide)));
}

void widen_half(Job& job) {
  if (job.half == DType::float32) return;
  const MpiGroup& g = *job.group;
  const std::int64_t whole = job.count;
  const std::int64_t part = job.counts.empty() ? whole : job.counts[static_cast<std::size_t>(g.rank)];
  // What MPI reads (in: null for an in-place allreduce or a reduce's root,
  // whose output is also its input) and writes (out: null for a reduce's
  // other ranks).
  const std::int64_t in = job.in ? whole : 0;
  const std::int64_t out = job.out ? (job.kind == Kind::reduce_scatter ? part : whole) : 0;
  job.wide.resize(static_cast<std::size_t>(in + out));
  if (job.in) {
    widen(job.wide.data(), job.in, job.half, in);
    job.in = job.wide.data();
  }
  if (job.out) {
    if (job.kind != Kind::reduce_scatter) widen(job.wide.data() + in, job.out, job.half, out);
    job.narrow_to = job.out;
    job.narrow_count = out;
    job.out = job.wide.data() + in;
  }
}

void narrow_half(Job& job) {
  if (!job.narrow_to) return;
  narrow(job.narrow_to, static_cast<const float*>(job.out), job.half, job.narrow_count);
  job.narrow_to = nullptr;
}

// Waits until `gate` lets `seq` through; false once the job was completed
// (the communicator broke, or the process is exiting). No deadline of its
// own: the collectives before it have theirs, and whatever ends them passes
// the gate. The job's deadline then counts from the gate's opening, so that
// a collective whose input was ready early does not time out behind one
// whose input is legitimately late.
bool wait_turn(Job& job, CommThread& thread, const SequenceGate& gate, std::uint64_t seq) {
  MpiGroup& g = *job.group;
  if (thread.poll_until([&] { return gate.open(seq) || !g.broken.empty(); }, Clock::time_point::max()) ==
      CommThread::Wait::stopping) {
    fail_broken(job, "the process is exiting");
    return false;
  }
  if (!g.broken.empty()) {
    complete(job, comm_error(job, "the communicator is broken: " + g.broken));
    return false;
  }
  job.deadline = std::max(job.deadline, Clock::now() + g.timeout);
  return true;
}

// Tests each request once; true when all are done, or when a test failed
// (`rc` says which).
bool test_all(std::initializer_list<MPI_Request*> requests, int& rc) {
  for (MPI_Request* r : requests) {
    if (*r == MPI_REQUEST_NULL) continue;
    int flag = 0;
    if ((rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return true;
    if (!flag) return false;
  }
  return true;
}

}  // namespace weft::parallel::detail
