// Dynamic loss scaling in DataParallel on CPU devices: with a power-of-two
// scale the trained values equal the unscaled run's; an Inf planted in one
// replica's gradients (after the reduction) skips the step on every replica,
// halves the scale and counts the skip; clean steps grow the scale after the
// interval; bad settings fail at construction. Each scenario over the naive
// engine and the threaded one at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <vector>

#include "data_parallel/loss_scaling_util.h"
#include "engine/engine_test_util.h"
#include "weft/error.h"

using namespace dp_test;

TEST_CASE("loss scaling: a power-of-two scale trains the same values as none") {
  const std::vector<Batch> batches = mlp_batches(3, 12);
  weft_test::with_each_engine(2, [&](Engine& e) {
    for (int replicas : {1, 2}) {
      INFO(replicas << " replicas");
      auto plain = data_parallel_run(e, mlp_model(), cpus(replicas), batches, 0.1f);
      auto scaled = data_parallel_run(e, mlp_model(), cpus(replicas), batches, 0.1f,
                                      {.loss_scaling = par::LossScaling{.init_scale = 1024.0f}});
      expect_close(values_of(scaled->replica(0)), values_of(plain->replica(0)), 1e-6, "scaled vs plain");
      CHECK(scaled->loss_scale() == 1024.0f);
      CHECK(scaled->skipped_steps() == 0);
      CHECK(plain->loss_scale() == 1.0f);
    }
  });
}

TEST_CASE("loss scaling: an Inf on one replica skips the step on every replica and halves the scale") {
  const std::vector<Batch> batches = mlp_batches(4, 12);
  weft_test::with_each_engine(2, [&](Engine& e) {
    par::LossScaling ls{.init_scale = 256.0f, .rule = {.growth_factor = 2.0f, .backoff_factor = 0.5f, .growth_interval = 2}};
    par::DataParallel dp(e, cpus(2), [&](Device d) { return mlp_model()(e, d, 0); }, {.loss_scaling = ls});
    step_with_planted_inf(dp, batches[0], 0.1f, false);
    const auto before0 = values_of(dp.replica(0)), before1 = values_of(dp.replica(1));
    CHECK(dp.skipped_steps() == 0);
    step_with_planted_inf(dp, batches[1], 0.1f, true, /*replica=*/1);
    // Replica 0's own gradients are finite: it skipped because replica 1 did.
    expect_close(values_of(dp.replica(0)), before0, 0, "replica 0 unchanged");
    expect_close(values_of(dp.replica(1)), before1, 0, "replica 1 unchanged");
    CHECK(dp.loss_scale() == 128.0f);
    CHECK(dp.skipped_steps() == 1);
    // Two clean steps: the interval is reached, the scale doubles.
    step_with_planted_inf(dp, batches[2], 0.1f, false);
    CHECK(dp.loss_scale() == 128.0f);
    step_with_planted_inf(dp, batches[3], 0.1f, false);
    CHECK(dp.loss_scale() == 256.0f);
    CHECK(dp.skipped_steps() == 1);
    const auto after0 = values_of(dp.replica(0)), after1 = values_of(dp.replica(1));
    expect_close(after1, after0, 0, "replicas equal");
    CHECK(after0 != before0);
  });
}

TEST_CASE("loss scaling: a bad initial scale is refused at construction") {
  weft_test::with_each_engine(1, [&](Engine& e) {
    for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity()})
      CHECK_THROWS_AS(par::DataParallel(e, cpus(1), [&](Device d) { return mlp_model()(e, d, 0); },
                                        {.loss_scaling = par::LossScaling{.init_scale = bad}}),
                      weft::InvalidArgument);
  });
}
