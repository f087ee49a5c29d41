// Pipelines in every precision on CPU devices: bf16, and fp16 with dynamic
// loss scaling, train as the unpipelined model on one device in the same
// precision (GPipe, 1F1B, ZB-H1; within 1e-3, and bf16 farther from float32
// than from it); an Inf in one stage's gradients makes every stage skip the
// step and back the scale off alike, and the next clean step updates again;
// fp16 without loss scaling and scaling rules that cannot work are refused
// by name. Engines: naive and threaded at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "pipeline/pipeline_precision_util.h"
#include "test_workers.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/parallel/pipeline.h"

using namespace pipe_precision;
using weft::EngineConfig;

namespace {

template <class F>
void precision_each_engine(F&& fn) {
  {
    INFO("naive engine");
    auto e = Engine::create(EngineConfig{.kind = "naive", .cpu_devices = 2});
    fn(*e);
  }
  for (int workers : weft_test::worker_counts()) {
    INFO("threaded engine, " << workers << " workers per device");
    auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = workers});
    fn(*e);
  }
}

std::vector<std::vector<float>> precision_values(nn::Sequential& net) { return dp_test::values_of(net); }

// Largest |a - b| / max(1, |b|).
double precision_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, std::abs(static_cast<double>(a[i][j]) - b[i][j]) / std::max(1.0, std::abs(static_cast<double>(b[i][j]))));
  }
  return worst;
}

bool precision_all_finite(const Tensor& t) {
  const std::vector<float> v = t.to_host();
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

}  // namespace

TEST_CASE("pipeline in bf16 and fp16 (loss scaling) trains as one device in the same precision") {
  const std::vector<Batch> batches = dp_test::mlp_batches(3, 12);
  const float lr = 0.1f;
  // fp16's scale: small enough that the whole batch's half weight gradients
  // stay finite in the reference (a skip there and not in the pipeline, or
  // the reverse, would be a test of rounding, not of the pipeline).
  const par::LossScaling scaling{.init_scale = 1024.0f};
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const std::optional<par::LossScaling> ls =
        p == Precision::fp16 ? std::optional<par::LossScaling>(scaling) : std::nullopt;
    auto ref_engine = Engine::create(EngineConfig{.kind = "naive"});
    Trained want = train_one_device(*ref_engine, dp_test::mlp_model(), batches, p, ls, lr);
    Trained want_fp32 = train_one_device(*ref_engine, dp_test::mlp_model(), batches, Precision::fp32, std::nullopt, lr);
    const auto want_values = precision_values(*want.net), fp32_values = precision_values(*want_fp32.net);
    precision_each_engine([&](Engine& e) {
      for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
        const std::string what = std::string(weft::to_string(p)) + ", " + schedule;
        INFO(what);
        auto net = dp_test::mlp_model()(e, Device::cpu(0), 0);
        par::Pipeline pipe(e, *net,
                           {.balance = {2, 3}, .devices = dp_test::cpus(2), .chunks = 4, .schedule = schedule,
                            .precision = p, .loss_scaling = ls});
        CHECK((*net)[0].precision() == p);
        CHECK((*net)[4].precision() == p);
        std::vector<float> losses;
        for (const Batch& b : batches) {
          const Tensor loss = pipe.train_step(Tensor::from_host(e, b.x_shape, b.x),
                                              Tensor::from_host(e, Shape{b.x_shape[0]}, b.y));
          CHECK(loss.dtype() == DType::float32);
          losses.push_back(loss.item());
          pipe.step(lr);
        }
        for (nn::Parameter* param : net->parameters()) {
          CHECK(param->value.dtype() == DType::float32);  // master weights
          CHECK(param->grad.dtype() == DType::float32);
        }
        for (std::size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(want.losses[i]).epsilon(1e-2));
        const auto got = precision_values(*net);
        const double same = precision_rel_diff(got, want_values), from_fp32 = precision_rel_diff(got, fp32_values);
        CHECK(same < 1e-3);
        // bf16 was applied: its rounding (8 bits) moves the weights from
        // float32's farther than micro-batches move them from the whole
        // batch's. (fp16's 11 bits do not: there both are of one size.)
        if (p == Precision::bf16) CHECK(from_fp32 > same);
        for (int rank = 0; rank < pipe.ranks(); ++rank) {
          CHECK(pipe.loss_scale(rank) == want.scale);
          CHECK(pipe.skipped_steps(rank) == want.skipped);
        }
        e.wait_all();
      }
    });
  }
}

TEST_CASE("pipeline loss scaling: an Inf in one stage's gradients makes every stage skip and back off alike") {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    precision_each_engine([&](Engine& e) {
      for (const char* schedule : {"gpipe", "zb-h1"}) {
        const std::string what = std::string(weft::to_string(p)) + ", " + schedule;
        INFO(what);
        auto net = dp_test::mlp_model()(e, Device::cpu(0), 0);
        zero_first_column(*net);
        // Stage 0: fc1 relu; stage 1: fc2 relu fc3.
        par::Pipeline pipe(e, *net,
                           {.balance = {2, 3}, .devices = dp_test::cpus(2), .chunks = 3, .schedule = schedule,
                            .precision = p, .loss_scaling = par::LossScaling{.init_scale = 65536.0f}});
        const auto before = precision_values(*net);
        const Batch bad = overflowing_batch(6);
        const Tensor loss = pipe.train_step(Tensor::from_host(e, bad.x_shape, bad.x),
                                            Tensor::from_host(e, Shape{6}, bad.y));
        CHECK(std::isfinite(loss.item()));
        // The Inf is in stage 0's first weight gradient only.
        const auto params = net->parameters();
        CHECK_FALSE(precision_all_finite(params[0]->grad));
        for (std::size_t i = 1; i < params.size(); ++i) CHECK(precision_all_finite(params[i]->grad));
        pipe.step(0.1f);
        CHECK(precision_rel_diff(precision_values(*net), before) == 0.0);  // every stage skipped
        for (int rank = 0; rank < 2; ++rank) {
          CHECK(pipe.loss_scale(rank) == 32768.0f);
          CHECK(pipe.skipped_steps(rank) == 1);
        }
        // The scaler's state goes with the optimizer's into checkpoints.
        std::vector<std::string> names;
        for (const nn::Buffer* b : pipe.optimizer_state())
          if (b->name.find(".loss_scale.") != std::string::npos) {
            names.push_back(b->name);
            if (b->name.ends_with(".scale")) CHECK(b->value.item() == 32768.0f);
            if (b->name.ends_with(".skipped")) CHECK(b->value.item() == 1.0f);
          }
        CHECK(names == std::vector<std::string>{"pipeline.stage0.loss_scale.scale", "pipeline.stage0.loss_scale.growth_tracker",
                                                "pipeline.stage0.loss_scale.skipped", "pipeline.stage1.loss_scale.scale",
                                                "pipeline.stage1.loss_scale.growth_tracker",
                                                "pipeline.stage1.loss_scale.skipped"});
        // A clean batch: every stage updates; the scale holds.
        const Batch good = dp_test::random_batch(6, {20}, 5, 5);
        (void)pipe.train_step(Tensor::from_host(e, good.x_shape, good.x), Tensor::from_host(e, Shape{6}, good.y));
        pipe.step(0.1f);
        const auto after = precision_values(*net);
        for (int k = 0; k < 2; ++k) {
          const auto [first, last] = pipe.layers(k);
          double moved = 0;
          std::size_t index = 0;
          for (int i = 0; i < first; ++i) index += (*net)[static_cast<std::size_t>(i)].parameters().size();
          for (int i = first; i < last; ++i)
            for (std::size_t j = 0; j < (*net)[static_cast<std::size_t>(i)].parameters().size(); ++j, ++index)
              moved = std::max(moved, precision_rel_diff({after[index]}, {before[index]}));
          CHECK(moved > 0.0);
          CHECK(pipe.loss_scale(k) == 32768.0f);
          CHECK(pipe.skipped_steps(k) == 1);
        }
        e.wait_all();
      }
    });
  }
}

TEST_CASE("pipeline precision: fp16 without loss scaling and scaling rules that cannot work are refused by name") {
  auto e = Engine::create(EngineConfig{.kind = "naive", .cpu_devices = 2});
  auto net = dp_test::mlp_model()(*e, Device::cpu(0), 0);
  const par::PipelineOptions base{.balance = {2, 3}, .devices = dp_test::cpus(2), .chunks = 2};
  auto with = [&](auto change) {
    par::PipelineOptions o = base;
    change(o);
    return o;
  };
  CHECK_THROWS_WITH_AS(par::Pipeline(*e, *net, with([](auto& o) { o.precision = Precision::fp16; })),
                       doctest::Contains("precision fp16, whose gradients underflow without a loss scale"),
                       weft::InvalidArgument);
  CHECK((*net)[0].precision() == Precision::fp32);  // a refused pipeline leaves the model as it was
  // A model set to fp16 by hand is judged alike.
  net->set_precision(Precision::fp16);
  CHECK_THROWS_WITH_AS(par::Pipeline(*e, *net, base), doctest::Contains("layer 0 (Dense"), weft::InvalidArgument);
  net->set_precision(Precision::fp32);
  for (float init : {0.0f, -1.0f, INFINITY, NAN})
    CHECK_THROWS_WITH_AS(par::Pipeline(*e, *net, with([&](auto& o) { o.loss_scaling = par::LossScaling{.init_scale = init}; })),
                         doctest::Contains("LossScaling::init_scale"), weft::InvalidArgument);
  const weft::ops::LossScaleRule bad_rules[] = {
      {.growth_factor = 0.5f}, {.backoff_factor = 0.0f}, {.backoff_factor = 2.0f}, {.growth_interval = 0}};
  for (const auto& rule : bad_rules)
    CHECK_THROWS_WITH_AS(par::Pipeline(*e, *net, with([&](auto& o) { o.loss_scaling = par::LossScaling{.rule = rule}; })),
                         doctest::Contains("cannot work"), weft::InvalidArgument);
  // Valid ones build; a rank that is not there is named.
  par::Pipeline plain(*e, *net, base);
  CHECK(plain.loss_scale() == 1.0f);
  CHECK(plain.skipped_steps() == 0);
  auto half_net = dp_test::mlp_model()(*e, Device::cpu(0), 0);
  par::Pipeline pipe(*e, *half_net, with([](auto& o) {
                       o.precision = Precision::fp16;
                       o.loss_scaling = par::LossScaling{};
                     }));
  CHECK(pipe.loss_scale() == 65536.0f);
  CHECK(pipe.skipped_steps(1) == 0);
  CHECK_THROWS_WITH_AS((void)pipe.loss_scale(2), doctest::Contains("loss_scale: rank 2 of 2"), weft::InvalidArgument);
  e->wait_all();
}
