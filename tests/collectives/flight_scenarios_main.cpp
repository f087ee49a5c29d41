// Injected failures across ranks for the flight recorder, run by
// check-flight.sh under mpirun (timeout 2 s). Two collectives complete on
// every rank (#1, #2), then collective #3, allreduce 'step', goes wrong:
//
//   skip   rank 1 never calls it (it sleeps): the others fail at their
//          deadline and dump; mpirun then ends rank 1, which dumps on SIGTERM.
//   kind   the last rank calls broadcast 'step' instead: the fingerprints
//          differ and every rank dumps.
//   stall  rank 1's op 'stuck in backward', which writes the tensor, sleeps
//          8 s: rank 1's allreduce waits for it, its recorder dumps when the
//          allreduce has been pending longer than the timeout; rank 0 fails
//          at its deadline and dumps.
//   kill   rank 1 is killed (SIGKILL) before it: mpirun ends rank 0, which
//          dumps on SIGTERM.
//
// A rank whose collective failed waits for its dump to be written, then
// exits with status 3 (without MPI_Finalize: the communicator is broken).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/parallel/flight_recorder.h"
#include "weft/tensor.h"

namespace par = weft::parallel;

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario != "skip" && scenario != "kind" && scenario != "stall" && scenario != "kill") {
    std::fprintf(stderr, "usage: weft-test-flight-scenario skip|kind|stall|kill\n");
    return 2;
  }
  auto engine = weft::Engine::create({.kind = "threaded"});
  par::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(2);
  const par::Communicator comm = par::Communicator::mpi(*engine, weft::Device::cpu(0), options);
  const int rank = comm.local_ranks()[0];
  const int size = comm.size();
  weft::Tensor t = weft::Tensor::ones(*engine, weft::Shape{1024}, weft::Device::cpu(0)).set_name("grad");
  par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "warmup"});
  par::broadcast(comm, {t}, {.name = "weights"});
  t.wait_to_read();

  if (scenario == "skip" && rank == 1) {
    std::fprintf(stderr, "rank 1: skipping allreduce 'step'\n");
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  if (scenario == "kill" && rank == 1) {
    std::fprintf(stderr, "rank 1: killed\n");
    ::raise(SIGKILL);
  }
  if (scenario == "stall" && rank == 1)
    engine->push([] { std::this_thread::sleep_for(std::chrono::seconds(8)); }, {}, {t.var()},
                 {.name = "stuck in backward"});
  if (scenario == "kind" && rank == size - 1)
    par::broadcast(comm, {t}, {.name = "step"});
  else
    par::allreduce(comm, {t}, par::ReduceOp::sum, {.name = "step"});
  try {
    t.wait_to_read();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    // The dump is written by the recorder's thread: wait for it.
    const std::string path = par::flight_record_path();
    for (int i = 0; i < 100 && ::access(path.c_str(), R_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fflush(stderr);
    std::_Exit(3);
  }
  std::fprintf(stderr, "rank %d: allreduce 'step' completed\n", rank);
  return 0;
}
