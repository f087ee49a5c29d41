// A rank that fails mid-collective must end the job, never leave the others
// waiting silently. Run by check-rank-dies.sh under mpirun, two ranks:
//
//   (no argument)  rank 1 aborts while rank 0 waits in an allreduce; Open
//                  MPI's launcher sees the abnormal exit and ends the job,
//                  so mpirun returns non-zero within seconds (the collective
//                  timeout is 300 s).
//   stalled        fingerprints off, timeout 3 s: rank 1 never calls a large
//                  allreduce, whose data phase rank 0 has handed to its
//                  blocking lane (mpi_lane.h). Rank 0's waiter gets the
//                  named timeout; the lane's thread stays inside MPI, so rank
//                  0 exits without MPI_Finalize (which would wait for it
//                  forever) and the launcher ends the job.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

int main(int argc, char** argv) {
  const bool stalled = argc > 1 && std::string(argv[1]) == "stalled";
  auto engine = weft::Engine::create({.kind = "threaded"});
  namespace par = weft::parallel;
  par::CommunicatorOptions options;
  if (stalled) {
    options.fingerprints = false;
    options.timeout = std::chrono::seconds(3);
  }
  const par::Communicator comm = par::Communicator::mpi(*engine, weft::Device::cpu(0), options);
  const int rank = comm.local_ranks()[0];
  // Large enough for the blocking lane (256 KiB and more).
  weft::Tensor t = weft::Tensor::ones(*engine, weft::Shape{stalled ? 1 << 20 : 1024}, weft::Device::cpu(0));
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "before"});
  t.wait_to_read();
  if (rank == 1) {
    if (stalled) {
      std::fprintf(stderr, "rank 1: not joining\n");
      std::this_thread::sleep_for(std::chrono::seconds(20));
      return 0;
    }
    std::fprintf(stderr, "rank 1: dying\n");
    std::abort();
  }
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "never completes"});
  try {
    t.wait_to_read();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  std::fprintf(stderr, "rank %d: the collective completed without rank 1\n", rank);
  return 0;
}
