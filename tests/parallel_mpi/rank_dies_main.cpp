// A rank dies in the middle of a collective: the others must fail, not wait
// for the timeout (300 s by default). Run by check-rank-dies.sh under
// mpirun: rank 1 aborts while rank 0 waits in an allreduce; Open MPI's
// launcher sees the abnormal exit and ends the job, so mpirun returns
// non-zero within seconds.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

int main() {
  auto engine = weft::Engine::create({.kind = "threaded"});
  namespace par = weft::parallel;
  const par::Communicator comm = par::Communicator::mpi(*engine, weft::Device::cpu(0));
  const int rank = comm.local_ranks()[0];
  weft::Tensor t = weft::Tensor::ones(*engine, weft::Shape{1024}, weft::Device::cpu(0));
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "before"});
  t.wait_to_read();
  if (rank == 1) {
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
