// DataParallel's half-precision bucket reduction on 2 CPU devices: one
// bucket reduced exactly as documented (each replica's part rounded, the sum
// rounded once); a few bf16 training steps, with and without error
// feedback, within bf16's rounding of the float32 reduction; error feedback
// keeping the accumulated error well below the plain cast's. Each scenario
// over the naive engine and the threaded one at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include "data_parallel/half_reduction_util.h"
#include "engine/engine_test_util.h"

using namespace dp_half_test;

TEST_CASE("data parallel: the half-precision reduction of a bucket rounds each part, then the sum once") {
  weft_test::with_each_engine(2, [](Engine& e) { check_bucket(e, cpus(2)); });
}

TEST_CASE("data parallel: bf16 gradient reduction equals the float32 one within bf16 rounding") {
  weft_test::with_each_engine(2, [](Engine& e) { check_training(e, cpus(2)); });
}

TEST_CASE("data parallel: error feedback keeps the accumulated rounding error below the plain cast's") {
  weft_test::with_each_engine(2, [](Engine& e) { check_error_feedback(e, cpus(2)); });
}

TEST_CASE("data parallel: the half-precision reduction refuses a dtype that is not half precision") {
  auto e = weft::Engine::create({.kind = "threaded", .cpu_devices = 2});
  check_refusals(*e, cpus(2));
}
