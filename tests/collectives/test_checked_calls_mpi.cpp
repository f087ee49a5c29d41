// WEFT_MPI_CHECK (weft/checked_call.h): a failing MPI call becomes a
// weft::CommunicationError naming the call as written, MPI's text for the
// code and this process's rank; WEFT_MPI_FAILURE gives the same message for
// a failure handled where it happened.
#include <doctest/doctest.h>
#include <mpi.h>

#include <string>

#include "engine/engine_test_util.h"
#include "weft/checked_call.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"

using weft::Device;
using weft::Engine;
using weft_test::contains;
namespace par = weft::parallel;

TEST_CASE("a failing MPI call under WEFT_MPI_CHECK is a CommunicationError naming the call and the rank" *
          doctest::timeout(60)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 1});
  const par::Communicator comm = par::Communicator::mpi(*e, Device::cpu(0));  // MPI is up
  const int rank = comm.local_ranks()[0];
  // A communicator of this process alone that returns its errors
  // (MPI_COMM_WORLD's handler aborts the job).
  MPI_Comm self = MPI_COMM_NULL;
  WEFT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_SELF, &self));
  WEFT_MPI_CHECK(MPI_Comm_set_errhandler(self, MPI_ERRORS_RETURN));
  int value = 0;
  int group = 0;
  WEFT_MPI_CHECK(MPI_Comm_size(self, &group));
  CHECK(group == 1);
  try {
    WEFT_MPI_CHECK(MPI_Send(&value, 1, MPI_INT, 5, 0, self));  // rank 5 of a group of one
    FAIL("no error");
  } catch (const weft::CommunicationError& err) {
    CHECK(err.rank() == rank);
    CHECK(err.peer() == weft::CommunicationError::kNoPeer);
    const std::string m = err.what();
    INFO(m);
    CHECK(m.rfind("MPI_Send(&value, 1, MPI_INT, 5, 0, self) failed: MPI error ", 0) == 0);
    CHECK(contains(m, "invalid rank"));  // MPI_Error_string's text for MPI_ERR_RANK
    CHECK(contains(m, "test_checked_calls_mpi.cpp:"));
  }
  const std::string handled = WEFT_MPI_FAILURE("MPI_Isend", MPI_ERR_RANK);
  CHECK(handled.rfind("MPI_Isend failed: MPI error " + std::to_string(MPI_ERR_RANK) + " (", 0) == 0);
  CHECK(contains(handled, "invalid rank"));
  CHECK(!contains(handled, ".cpp"));
  WEFT_MPI_CHECK(MPI_Comm_free(&self));
}
