// A rank that stops answering is named by every survivor within the
// heartbeat's timeout (WEFT_HEARTBEAT_TIMEOUT), not at the collective
// deadline. Run by check-heartbeat.sh under mpirun, three or more ranks:
// rank 1 stops itself (SIGSTOP) while the others wait in an allreduce. Each
// survivor must fail with weft::CommunicationError naming rank 1, its host
// and its silence, print one line with the time it took, and exit 3 (its
// exit skips MPI_Finalize, which would wait for rank 1, and the launcher
// ends the job). Times are wall-clock milliseconds, so that the script can
// compare the ranks' lines.
//
// With "finalize" (ctest runs it directly): the application initializes and
// finalizes MPI itself, and rank 0 finishes long (seconds) before the
// others: its heartbeat says goodbye, so nobody declares it dead, and it
// ends before MPI_Finalize (MPI_COMM_SELF's attribute callback), so it never
// calls MPI after it. Every rank prints "rank R: finished" and exits 0.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "weft/engine.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace {
long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int finalize_mode() {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  {
    auto engine = weft::Engine::create({.kind = "threaded"});
    namespace par = weft::parallel;
    const par::Communicator comm = par::Communicator::mpi(*engine, weft::Device::cpu(0));
    rank = comm.local_ranks()[0];
    weft::Tensor t = weft::Tensor::ones(*engine, weft::Shape{1024}, weft::Device::cpu(0));
    par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "only"});
    t.wait_to_read();
  }
  // Longer than WEFT_HEARTBEAT_TIMEOUT (2 s in ctest): rank 0 goes first.
  if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(4));
  MPI_Finalize();
  std::fprintf(stderr, "rank %d: finished\n", rank);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "finalize") return finalize_mode();
  auto engine = weft::Engine::create({.kind = "threaded"});
  namespace par = weft::parallel;
  const par::Communicator comm = par::Communicator::mpi(*engine, weft::Device::cpu(0));
  const int rank = comm.local_ranks()[0];
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  weft::Tensor t = weft::Tensor::ones(*engine, weft::Shape{1024}, weft::Device::cpu(0));
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "before"});
  t.wait_to_read();
  weft::Tensor u = weft::Tensor::ones(*engine, weft::Shape{1024}, weft::Device::cpu(0));
  u.wait_to_read();
  if (rank == 1) {
    std::fprintf(stderr, "rank 1: stopping pid %d at %lld\n", static_cast<int>(getpid()), now_ms());
    std::fflush(stderr);
    raise(SIGSTOP);
    // Continued: the others declared this rank dead, and say so.
    std::fprintf(stderr, "rank 1: continued at %lld\n", now_ms());
  }
  const long long start = now_ms();
  par::allreduce(comm, {u}, par::ReduceOp::sum, {.name = "after the stop"});
  try {
    u.wait_to_read();
  } catch (const weft::CommunicationError& e) {
    const std::string what = e.what();
    const bool named = what.find("rank 1 (host " + std::string(host) + ") has been silent for ") != std::string::npos &&
                       e.peer() == 1;
    std::fprintf(stderr, "rank %d: %s at %lld after %lld ms: %s\n", rank, named ? "named rank 1" : "WRONG MESSAGE",
                 now_ms(), now_ms() - start, what.c_str());
    return named ? 3 : 4;
  }
  std::fprintf(stderr, "rank %d: the allreduce completed without rank 1\n", rank);
  return 0;
}
