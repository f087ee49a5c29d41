// DataParallel with ZeRO sharding on CPU devices: each stage (optimizer,
// gradients, parameters) gives the weights of Shard::none with the same
// optimizer — bit for bit where the sums run in the same order (stage 1's
// allreduce is none's; an in-process reduce-scatter over 2 members sums as
// the ring does), within 1e-5 otherwise — for LeNet and a small residual
// network, with AdamW and momentum SGD, on 2 and 4 members; with loss
// scaling (a skipped step) and gradient clipping; with no_sync; on one
// member. Memory: state_bytes() follows ZeRO's accounting and stage 3 holds
// no full parameters between steps (FullParameters gathers them). Each
// scenario over the naive engine and the threaded one at 1, 2, 4 and 8
// workers.
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "data_parallel/zero_util.h"
#include "engine/engine_test_util.h"

using namespace zero_test;
using weft_test::contains;
using weft_test::error_of;

namespace {

constexpr par::Shard kZeroStages[] = {par::Shard::optimizer, par::Shard::gradients, par::Shard::parameters};

}  // namespace

TEST_CASE("zero: every stage gives Shard::none's weights (LeNet, AdamW and momentum SGD, 2 and 4 members)" *
          doctest::timeout(600)) {
  const std::vector<Batch> batches = lenet_batches(2, 8);
  weft_test::with_each_engine(4, [&](Engine& e) {
    for (std::size_t members : {std::size_t{2}, std::size_t{4}})
      for (const optim::OptimizerOptions& opt :
           {optim::OptimizerOptions::adamw(1e-3f), optim::OptimizerOptions::sgd(0.05f, 0.9f, 1e-4f)}) {
        // Under TSan each member count with one optimizer (AdamW on 2, momentum
        // SGD on 4): the threads are those of the member count, the optimizer
        // only changes the arithmetic on each shard; ASan runs all four pairs.
        if (weft_test::kThreadSanitized && (members == 2) != (opt.algorithm == optim::Algorithm::adamw)) continue;
        const par::DataParallelOptions base{.bucket_bytes = std::size_t{64} << 10};
        auto ref = data_parallel_run(e, lenet_model(), cpus(static_cast<int>(members)), batches, opt.lr,
                                     zero_options(par::Shard::none, opt, base));
        const auto want = zero_weights(*ref);
        for (par::Shard shard : kZeroStages) {
          const std::string what = zero_what(shard, members, opt);
          auto dp = data_parallel_run(e, lenet_model(), cpus(static_cast<int>(members)), batches, opt.lr,
                                      zero_options(shard, opt, base));
          CHECK(dp->steps() == 2);
          for (int r = 0; r < dp->replicas(); ++r) {
            const auto got = zero_weights(*dp, r);
            if (shard == par::Shard::optimizer || members == 2)
              zero_expect_bitwise(got, want, what + ", replica " + std::to_string(r));
            else
              expect_close(got, want, 1e-5, what + ", replica " + std::to_string(r));
          }
        }
      }
  });
}

TEST_CASE("zero: a residual network (batch norm, several layers per leaf) under every stage equals Shard::none" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = zero_residual_batches(3, 6);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(2e-3f);
  weft_test::with_each_engine(2, [&](Engine& e) {
    auto ref = data_parallel_run(e, zero_residual_model(), cpus(2), batches, opt.lr,
                                 zero_options(par::Shard::none, opt, {.bucket_bytes = 1024}));
    const auto want = zero_weights(*ref);
    for (par::Shard shard : kZeroStages) {
      auto dp = data_parallel_run(e, zero_residual_model(), cpus(2), batches, opt.lr,
                                  zero_options(shard, opt, {.bucket_bytes = 1024}));
      for (int r = 0; r < 2; ++r) {
        zero_expect_bitwise(zero_weights(*dp, r), want, zero_what(shard, 2, opt) + ", replica " + std::to_string(r));
        // Batch norm's running statistics stay per replica, as unsharded.
        const auto& got_buffers = dp->replica(r).buffers();
        const auto& want_buffers = ref->replica(r).buffers();
        REQUIRE(got_buffers.size() == want_buffers.size());
        for (std::size_t i = 0; i < got_buffers.size(); ++i)
          CHECK(got_buffers[i]->value.to_host() == want_buffers[i]->value.to_host());
      }
    }
  });
}

TEST_CASE("zero: loss scaling (a skipped step) and gradient clipping under every stage equal Shard::none" *
          doctest::timeout(300)) {
  std::vector<Batch> batches = mlp_batches(4, 12, 31);
  // An Inf in the second batch's first row: the first member's gradients
  // are NaN, every member skips the step (the scale backs off); clipping at
  // 0.05 is active on the others.
  batches[1].x[0] = std::numeric_limits<float>::infinity();
  const optim::OptimizerOptions opt = optim::OptimizerOptions::sgd(0.1f, 0.9f);
  const par::DataParallelOptions base{.bucket_bytes = 600,
                                      .loss_scaling = par::LossScaling{.init_scale = 1024.0f},
                                      .max_grad_norm = 0.05f};
  weft_test::with_each_engine(4, [&](Engine& e) {
    for (std::size_t members : {std::size_t{2}, std::size_t{3}}) {
      auto ref = data_parallel_run(e, mlp_model(), cpus(static_cast<int>(members)), batches, opt.lr,
                                   zero_options(par::Shard::none, opt, base));
      const auto want = zero_weights(*ref);
      CHECK(ref->skipped_steps() == 1);
      CHECK(ref->loss_scale() == 512.0f);
      for (par::Shard shard : kZeroStages) {
        const std::string what = zero_what(shard, members, opt);
        auto dp = data_parallel_run(e, mlp_model(), cpus(static_cast<int>(members)), batches, opt.lr,
                                    zero_options(shard, opt, base));
        CHECK_MESSAGE(dp->skipped_steps() == ref->skipped_steps(), what);
        CHECK_MESSAGE(dp->loss_scale() == ref->loss_scale(), what);
        // The norm's partial sums are added in another order: float rounding.
        for (int r = 0; r < dp->replicas(); ++r) expect_close(zero_weights(*dp, r), want, 1e-5, what);
      }
    }
  });
}

TEST_CASE("zero: no_sync accumulation and a single member under every stage equal Shard::none" * doctest::timeout(300)) {
  const std::vector<Batch> batches = mlp_batches(4, 10, 11);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adam(0.01f);
  weft_test::with_each_engine(2, [&](Engine& e) {
    for (int members : {1, 2}) {
      auto ref = data_parallel_run(e, mlp_model(), cpus(members), batches, opt.lr,
                                   zero_options(par::Shard::none, opt, {.bucket_bytes = 512}), 2);
      const auto want = zero_weights(*ref);
      for (par::Shard shard : kZeroStages) {
        auto dp = data_parallel_run(e, mlp_model(), cpus(members), batches, opt.lr,
                                    zero_options(shard, opt, {.bucket_bytes = 512}), 2);
        CHECK(dp->steps() == 2);
        for (int r = 0; r < members; ++r)
          zero_expect_bitwise(zero_weights(*dp, r), want,
                              zero_what(shard, static_cast<std::size_t>(members), opt) + ", no_sync every 2");
      }
    }
  });
}

TEST_CASE("zero: state_bytes follows ZeRO's accounting (AdamW, 4 members) and the allocator agrees" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = lenet_batches(1, 8);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(1e-3f);
  constexpr double kN = 4;
  for (par::Shard shard : {par::Shard::none, par::Shard::optimizer, par::Shard::gradients, par::Shard::parameters}) {
    auto e = weft::Engine::create({.kind = "threaded", .cpu_devices = 4});
    std::vector<std::size_t> before;
    for (int r = 0; r < 4; ++r) before.push_back(weft::memory_stats(*e, Device::cpu(r)).in_use);
    auto dp = data_parallel_run(*e, lenet_model(), cpus(4), batches, opt.lr, zero_options(shard, opt));
    e->wait_all();
    double psi = 0;  // parameters (stage 3 frees the replicas' values)
    for (const par::GradientBucket& b : dp->buckets()) psi += static_cast<double>(b.elements);
    // Parameters, gradients, optimizer state (exp_avg, exp_avg_sq), float32.
    const double want = shard == par::Shard::none        ? 16 * psi
                        : shard == par::Shard::optimizer ? 4 * psi + 4 * psi + 8 * psi / kN
                        : shard == par::Shard::gradients ? 4 * psi + 12 * psi / kN
                                                         : 16 * psi / kN;
    const std::vector<std::size_t> state = dp->state_bytes();
    REQUIRE(state.size() == 4);
    for (int r = 0; r < 4; ++r) {
      INFO("Shard::" << par::to_string(shard) << ", member " << r << ": state_bytes " << state[r] << ", ZeRO "
                     << want);
      CHECK(static_cast<double>(state[r]) >= 0.95 * want);
      CHECK(static_cast<double>(state[r]) <= 1.10 * want);
      // The allocator holds the state and, unsharded and in stage 1, the
      // flat buckets (one more copy of the gradients) besides: nothing of
      // the full model in stage 3.
      const std::size_t held = weft::memory_stats(*e, Device::cpu(r)).in_use - before[static_cast<std::size_t>(r)];
      const double buckets = shard <= par::Shard::optimizer ? 4 * psi : 0;
      INFO("allocator: " << held << " bytes held");
      CHECK(static_cast<double>(held) >= 0.95 * want);
      CHECK(static_cast<double>(held) <= 1.15 * (want + buckets) + 65536);
    }
    if (shard == par::Shard::parameters) {
      for (nn::Parameter* p : dp->replica(0).parameters()) CHECK_MESSAGE(!p->value.defined(), p->name);
      {
        auto full = dp->full_parameters();
        for (nn::Parameter* p : dp->replica(0).parameters()) CHECK_MESSAGE(p->value.defined(), p->name);
        CHECK(dp->state_bytes()[0] > state[0]);
      }
      for (nn::Parameter* p : dp->replica(0).parameters()) CHECK_MESSAGE(!p->value.defined(), p->name);
    }
  }
}

TEST_CASE("zero: FullParameters across a step shows the updated weights" * doctest::timeout(120)) {
  const std::vector<Batch> batches = mlp_batches(2, 8, 3);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(0.01f);
  weft_test::with_each_engine(2, [&](Engine& e) {
    auto ref = data_parallel_run(e, mlp_model(), cpus(2), batches, opt.lr, zero_options(par::Shard::none, opt));
    par::DataParallel dp(e, cpus(2), [&](Device d) { return nn::mlp(e, {20, 32, 16, 5}, d, 0); },
                         zero_options(par::Shard::parameters, opt));
    auto full = dp.full_parameters();
    train_steps(dp, batches);
    for (int r = 0; r < 2; ++r) zero_expect_bitwise(values_of(dp.replica(r)), zero_weights(*ref), "replica " + std::to_string(r));
  });
}

TEST_CASE("zero: misuse names the problem" * doctest::timeout(60)) {
  auto e = weft::Engine::create({.kind = "naive", .cpu_devices = 2});
  CHECK(par::parse_shard("gradients") == par::Shard::gradients);
  CHECK(par::parse_shard("3") == par::Shard::parameters);
  CHECK(contains(error_of([] { par::parse_shard("stage2", "--shard"); }), "--shard: 'stage2' is not a shard setting"));
  par::DataParallel dp(*e, cpus(2), [&](Device d) { return nn::mlp(*e, {4, 3}, d, 0); },
                       {.shard = par::Shard::gradients});
  CHECK(contains(error_of([&] { dp.set_reduction(par::half_precision_reduction(dp)); }),
                 "with Shard::gradients the buckets are reduce-scattered"));
  CHECK(contains(error_of([&] { dp.step(); }), "no reduced gradient for 'grad bucket 0 chunk 0'"));
  CHECK(dp.steps() == 0);
}
