// Dynamic loss scaling across MPI processes (ctest runs this binary alone and
// under mpirun with 2 and 3 ranks): an Inf planted on the last rank's first
// replica skips the step on every replica of every rank and halves the scale
// everywhere; the next clean step updates all of them alike.
#include <doctest/doctest.h>

#include <vector>

#include "data_parallel/loss_scaling_util.h"
#include "engine/engine_test_util.h"
#include "mpi_test_util.h"

using namespace dp_test;

TEST_CASE("distributed loss scaling: an Inf on one replica of one rank skips the step on every rank" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = mlp_batches(3, 12);
  weft_test::with_each_engine(2, [&](Engine& e) {
    par::DataParallel dp(e, cpus(2), [&](Device d) { return mlp_model()(e, d, 0); },
                         {.distributed = true, .loss_scaling = par::LossScaling{.init_scale = 64.0f}});
    const bool last_rank = dp.process_rank() == dp.processes() - 1;
    step_with_planted_inf(dp, batches[0], 0.1f, false);
    const auto before = values_of(dp.replica(0));
    step_with_planted_inf(dp, batches[1], 0.1f, last_rank, /*replica=*/0);
    expect_close(values_of(dp.replica(0)), before, 0, "unchanged on this rank");
    expect_close(values_of(dp.replica(1)), before, 0, "unchanged on this rank's second replica");
    CHECK(dp.loss_scale() == 32.0f);
    CHECK(dp.skipped_steps() == 1);
    step_with_planted_inf(dp, batches[2], 0.1f, false);
    CHECK(values_of(dp.replica(0)) != before);
    CHECK(dp.skipped_steps() == 1);
  });
}
