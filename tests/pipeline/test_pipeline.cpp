// Pipelines on CPU devices: the block-partition solver against brute
// force, and Pipeline — gradients and parameters after steps equal the
// unpipelined model on one device within 1e-5 for every schedule (GPipe,
// 1F1B, ZB-H1, interleaved, one read from text) and checkpoint mode, uneven
// balances and chunk counts that do not divide the batch; recomputation
// equal to keeping activations; 1F1B keeping at most K - k micro-batches;
// weight gradients run where the list puts them; batch norm's running
// statistics counted once under recomputation; bad input named; the stages'
// ops named in traces. The schedules themselves: test_pipeline_schedule.cpp.
// Engines: naive and threaded at 1, 2, 4 and 8 workers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_workers.h"
#include "data_parallel/data_parallel_util.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/ops.h"
#include "weft/optim.h"
#include "weft/parallel/metrics.h"
#include "weft/parallel/pipeline.h"
#include "weft/profiler.h"
#include "weft/tensor.h"

namespace par = weft::parallel;
namespace nn = weft::nn;
using dp_test::Batch;
using dp_test::cpus;
using weft::Device;
using weft::Engine;
using weft::EngineConfig;
using weft::Shape;
using weft::Tensor;

namespace {

// Every scenario: naive, then threaded at 1, 2, 4, 8 workers; `cpus` CPU devices.
template <class F>
void with_each_engine(int cpus, F&& fn) {
  {
    INFO("naive engine");
    auto e = Engine::create(EngineConfig{.kind = "naive", .cpu_devices = cpus});
    fn(*e);
  }
  for (int workers : weft_test::worker_counts()) {
    INFO("threaded engine, " << workers << " workers per device");
    auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = cpus, .workers_per_cpu_device = workers});
    fn(*e);
  }
}

// Largest |a - b| / max(1, |b|) over every element.
double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, std::abs(static_cast<double>(a[i][j]) - b[i][j]) / std::max(1.0, std::abs(static_cast<double>(b[i][j]))));
  }
  return worst;
}

std::vector<std::vector<float>> grads_of(nn::Sequential& net) {
  std::vector<std::vector<float>> out;
  for (nn::Parameter* p : net.parameters()) out.push_back(p->grad.to_host());
  return out;
}

struct RunResult {
  std::vector<std::vector<float>> grads, params;  // the last step's gradients, the parameters after
  std::vector<float> losses;
};

// `steps` SGD steps of `make`'s model on one device.
RunResult reference(Engine& e, const dp_test::ModelFn& make, const std::vector<Batch>& batches, float lr) {
  auto net = make(e, Device::cpu(0), 0);
  RunResult r;
  for (const Batch& b : batches) {
    const Tensor x = Tensor::from_host(e, b.x_shape, b.x);
    const Tensor y = Tensor::from_host(e, Shape{b.x_shape[0]}, b.y);
    const auto sce = weft::ops::softmax_cross_entropy(net->forward(x), y);
    net->backward(sce.dlogits);
    r.losses.push_back(sce.loss.item());
    r.grads = grads_of(*net);
    nn::sgd_step(net->parameters(), lr);
  }
  r.params = dp_test::values_of(*net);
  return r;
}

RunResult pipelined(Engine& e, const dp_test::ModelFn& make, const std::vector<Batch>& batches, float lr,
                    par::PipelineOptions options, std::vector<int>* peaks = nullptr) {
  auto net = make(e, Device::cpu(0), 0);
  par::Pipeline pipe(e, *net, std::move(options));
  RunResult r;
  for (const Batch& b : batches) {
    const Tensor x = Tensor::from_host(e, b.x_shape, b.x);
    const Tensor y = Tensor::from_host(e, Shape{b.x_shape[0]}, b.y);
    const Tensor loss = pipe.train_step(x, y);
    r.losses.push_back(loss.item());
    r.grads = grads_of(*net);
    pipe.step(lr);
    if (peaks) *peaks = pipe.peak_saved();
  }
  for (int k = 0; k < pipe.stages(); ++k) {
    const auto [first, last] = pipe.layers(k);
    for (int i = first; i < last; ++i)
      for (nn::Parameter* p : (*net)[static_cast<std::size_t>(i)].parameters()) CHECK(p->value.device() == pipe.device(k));
  }
  r.params = dp_test::values_of(*net);
  return r;
}

void check_equal(const RunResult& got, const RunResult& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) CHECK(got.losses[i] == doctest::Approx(want.losses[i]).epsilon(1e-5));
  CHECK(max_rel_diff(got.grads, want.grads) < 1e-5);
  CHECK(max_rel_diff(got.params, want.params) < 1e-5);
}

}  // namespace

TEST_CASE("pipeline partition is optimal: against brute force on random costs") {
  std::mt19937_64 gen(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(gen() % 8);
    const int parts = 1 + static_cast<int>(gen() % static_cast<std::uint64_t>(n));
    std::vector<double> costs;
    for (int i = 0; i < n; ++i) costs.push_back(static_cast<double>(gen() % 20));
    const std::vector<int> got = par::partition(costs, parts);
    REQUIRE(static_cast<int>(got.size()) == parts);
    auto largest = [&](const std::vector<int>& sizes) {
      double worst = 0;
      std::size_t at = 0;
      for (int size : sizes) {
        double sum = 0;
        for (int j = 0; j < size; ++j) sum += costs[at++];
        worst = std::max(worst, sum);
      }
      return worst;
    };
    int total = 0;
    for (int size : got) {
      CHECK(size >= 1);
      total += size;
    }
    CHECK(total == n);
    // Brute force: every way to cut n items into `parts` non-empty blocks.
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> sizes(static_cast<std::size_t>(parts), 1);
    std::function<void(int, int)> walk = [&](int part, int left) {
      if (part == parts - 1) {
        sizes[static_cast<std::size_t>(part)] = left;
        best = std::min(best, largest(sizes));
        return;
      }
      for (int s = 1; s <= left - (parts - part - 1); ++s) {
        sizes[static_cast<std::size_t>(part)] = s;
        walk(part + 1, left - s);
      }
    };
    walk(0, n);
    CHECK(largest(got) == best);
  }
  CHECK(par::partition({1, 1, 1, 1}, 2) == std::vector<int>{2, 2});
  CHECK(par::partition({10, 1, 1, 1}, 2)[0] == 1);
  CHECK_THROWS_WITH_AS(par::partition({1, 2}, 3), doctest::Contains("3 parts of 2 costs"), weft::InvalidArgument);
  CHECK_THROWS_AS(par::partition({1, -2}, 1), weft::InvalidArgument);
  CHECK(par::predicted_bubble(4, 12) == doctest::Approx(3.0 / 15.0));
}

TEST_CASE("pipeline equals the unpipelined model: every schedule and checkpoint mode, uneven balances and chunks") {
  const std::vector<Batch> batches = dp_test::mlp_batches(2, 11);  // 11 rows: chunks 2, 3, 4 do not divide it
  const RunResult want = [&] {
    auto e = Engine::create(EngineConfig{.kind = "naive"});
    return reference(*e, dp_test::mlp_model(), batches, 0.1f);
  }();
  // The MLP 20-32-16-5 is 5 layers: fc1 relu fc2 relu fc3.
  struct Config {
    std::vector<int> balance;
    int chunks;
  };
  const Config configs[] = {{{5}, 3}, {{2, 3}, 4}, {{1, 3, 1}, 2}, {{1, 1, 1, 2}, 5}, {{4, 1}, 11}};
  with_each_engine(4, [&](Engine& e) {
    for (const Config& c : configs)
      for (const char* schedule : {"gpipe", "1f1b", "zb-h1"})
        for (par::Checkpoint cp : {par::Checkpoint::never, par::Checkpoint::except_last, par::Checkpoint::always}) {
          std::ostringstream what;
          what << schedule << ", " << c.balance.size() << " stages, chunks " << c.chunks << ", checkpoint "
               << par::to_string(cp);
          const RunResult got = pipelined(e, dp_test::mlp_model(), batches, 0.1f,
                                          {.balance = c.balance, .devices = cpus(static_cast<int>(c.balance.size())),
                                           .chunks = c.chunks, .checkpoint = cp, .schedule = schedule});
          check_equal(got, want, what.str());
        }
    // Interleaved: two model chunks per device (micro-batches in groups of
    // the devices), and a schedule read from text.
    for (int chunks : {2, 4})
      for (par::Checkpoint cp : {par::Checkpoint::never, par::Checkpoint::always}) {
        const RunResult got = pipelined(e, dp_test::mlp_model(), batches, 0.1f,
                                        {.balance = {1, 1, 1, 2}, .devices = cpus(2), .chunks = chunks,
                                         .virtual_stages = 2, .checkpoint = cp, .schedule = "interleaved-1f1b"});
        check_equal(got, want, "interleaved-1f1b, chunks " + std::to_string(chunks) + ", checkpoint " +
                                   std::string(par::to_string(cp)));
      }
    const RunResult from_text = pipelined(
        e, dp_test::mlp_model(), batches, 0.1f,
        {.balance = {2, 3}, .devices = cpus(2), .chunks = 2, .custom = [](int, int) {
           return par::Schedule::parse("F0 F1 B1 W1 B0 W0\nF0 B0 F1 B1 W1 W0\n", "text");
         }});
    check_equal(from_text, want, "a schedule from text");
  });
}

TEST_CASE("pipeline optimizers: momentum SGD and AdamW per stage equal the unpipelined model's") {
  const std::vector<Batch> batches = dp_test::mlp_batches(3, 11);
  for (const weft::optim::OptimizerOptions& opt :
       {weft::optim::OptimizerOptions::sgd(0.05f, 0.9f, 1e-4f, /*nesterov=*/true),
        weft::optim::OptimizerOptions::adamw(1e-3f, 0.01f)}) {
    INFO(opt.str());
    RunResult want;
    {
      auto e = Engine::create(EngineConfig{.kind = "naive"});
      auto net = dp_test::mlp_model()(*e, Device::cpu(0), 0);
      weft::optim::Optimizer optimizer(net->parameters(), opt);
      for (const Batch& b : batches) {
        const Tensor x = Tensor::from_host(*e, b.x_shape, b.x);
        const Tensor y = Tensor::from_host(*e, Shape{b.x_shape[0]}, b.y);
        const auto sce = weft::ops::softmax_cross_entropy(net->forward(x), y);
        net->backward(sce.dlogits);
        want.losses.push_back(sce.loss.item());
        want.grads = grads_of(*net);
        optimizer.step();
      }
      want.params = dp_test::values_of(*net);
    }
    with_each_engine(2, [&](Engine& e) {
      auto net = dp_test::mlp_model()(e, Device::cpu(0), 0);
      par::Pipeline pipe(e, *net, {.balance = {2, 3}, .devices = cpus(2), .chunks = 3, .schedule = "1f1b",
                                   .optimizer = opt});
      RunResult got;
      for (const Batch& b : batches) {
        const Tensor x = Tensor::from_host(e, b.x_shape, b.x);
        const Tensor y = Tensor::from_host(e, Shape{b.x_shape[0]}, b.y);
        got.losses.push_back(pipe.train_step(x, y).item());
        got.grads = grads_of(*net);
        pipe.step();
      }
      got.params = dp_test::values_of(*net);
      check_equal(got, want, opt.str());
      // Each stage's state lives on its device, named after its parameter.
      const std::vector<nn::Buffer*> state = pipe.optimizer_state();
      REQUIRE_FALSE(state.empty());
      CHECK(state.front()->name.rfind("fc1.weight.", 0) == 0);
      CHECK(state.back()->value.device() == Device::cpu(1));
    });
  }
}

TEST_CASE("pipeline equals the unpipelined LeNet on CPU devices") {
  const std::vector<Batch> batches = dp_test::lenet_batches(2, 9);
  auto ref_engine = Engine::create(EngineConfig{.kind = "naive"});
  const RunResult want = reference(*ref_engine, dp_test::lenet_model(), batches, 0.1f);
  with_each_engine(3, [&](Engine& e) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      const RunResult got = pipelined(e, dp_test::lenet_model(), batches, 0.1f,
                                      {.balance = {3, 4, 3}, .devices = cpus(3), .chunks = 4,
                                       .checkpoint = par::Checkpoint::except_last, .schedule = schedule});
      check_equal(got, want, std::string("LeNet, ") + schedule);
    }
  });
}

TEST_CASE("pipeline recomputation gives bitwise the gradients of keeping activations") {
  const std::vector<Batch> batches = dp_test::lenet_batches(1, 8);
  with_each_engine(2, [&](Engine& e) {
    std::vector<RunResult> runs;
    for (par::Checkpoint cp : {par::Checkpoint::never, par::Checkpoint::always, par::Checkpoint::except_last})
      runs.push_back(pipelined(e, dp_test::lenet_model(), batches, 0.1f,
                               {.balance = {5, 5}, .devices = cpus(2), .chunks = 4, .checkpoint = cp}));
    for (std::size_t r = 1; r < runs.size(); ++r) {
      CAPTURE(r);
      CHECK(runs[r].losses == runs[0].losses);
      CHECK(runs[r].grads == runs[0].grads);
    }
  });
}

TEST_CASE("pipeline 1f1b keeps at most K - k micro-batches per stage, gpipe M, recomputation one") {
  const std::vector<Batch> batches = dp_test::mlp_batches(1, 16);
  with_each_engine(4, [&](Engine& e) {
    std::vector<int> peaks;
    pipelined(e, dp_test::mlp_model(), batches, 0.1f,
              {.balance = {2, 1, 1, 1}, .devices = cpus(4), .chunks = 8, .schedule = "1f1b"}, &peaks);
    CHECK(peaks == std::vector<int>{4, 3, 2, 1});
    pipelined(e, dp_test::mlp_model(), batches, 0.1f,
              {.balance = {2, 1, 1, 1}, .devices = cpus(4), .chunks = 8, .schedule = "gpipe"}, &peaks);
    CHECK(peaks == std::vector<int>{8, 8, 8, 8});
    pipelined(e, dp_test::mlp_model(), batches, 0.1f,
              {.balance = {2, 1, 1, 1}, .devices = cpus(4), .chunks = 8, .checkpoint = par::Checkpoint::always,
               .schedule = "gpipe"},
              &peaks);
    CHECK(peaks == std::vector<int>{1, 1, 1, 1});
  });
}

TEST_CASE("pipeline weight gradients run where the list puts them: ZB-H1 defers them, 1F1B does not") {
  // ZB-H1 with 2 stages and 3 micro-batches: stage 1 runs F0 B0 F1 B1 W0 F2
  // B2 W1 W2, its first weight gradient after the second input gradient.
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = 2});
  const Batch b = dp_test::random_batch(12, {20}, 5, 3);
  for (const char* schedule : {"zb-h1", "1f1b"}) {
    INFO(schedule);
    auto net = dp_test::mlp_model()(*e, Device::cpu(0), 0);
    par::Pipeline pipe(*e, *net, {.balance = {3, 2}, .devices = cpus(2), .chunks = 3, .schedule = schedule});
    e->profiler().clear();
    e->profiler().start();
    (void)pipe.train_step(Tensor::from_host(*e, b.x_shape, b.x), Tensor::from_host(*e, Shape{12}, b.y)).item();
    e->wait_all();
    e->profiler().stop();
    std::int64_t b1_end = 0, w0_start = std::numeric_limits<std::int64_t>::max();
    for (const weft::Span& s : e->profiler().spans()) {
      if (s.name.find("[stage 1 B1]") != std::string_view::npos) b1_end = std::max(b1_end, s.end_ns);
      if (s.name.find("[stage 1 W0]") != std::string_view::npos) w0_start = std::min(w0_start, s.start_ns);
    }
    REQUIRE(b1_end > 0);
    REQUIRE(w0_start < std::numeric_limits<std::int64_t>::max());
    if (std::string(schedule) == "zb-h1") CHECK(w0_start >= b1_end);
    else CHECK(w0_start < b1_end);
  }
}

TEST_CASE("pipeline with batch norm: one chunk equals the unpipelined ResNet, recomputation counts statistics once") {
  // ResNet-18 with the ImageNet stem on 32x32 inputs, 15 layers in 2 stages.
  const dp_test::ModelFn resnet = [](Engine& e, Device d, std::uint64_t seed) {
    return nn::resnet18(e, d, seed, nn::ResNetOptions{.stem = nn::ResNetStem::imagenet});
  };
  const std::vector<Batch> batches = {dp_test::random_batch(4, {1, 32, 32}, 10, 5)};
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2});
  const RunResult want = reference(*e, resnet, batches, 0.01f);
  const RunResult one = pipelined(*e, resnet, batches, 0.01f, {.balance = {7, 8}, .devices = cpus(2), .chunks = 1});
  check_equal(one, want, "ResNet-18, one chunk");

  // Two chunks: statistics per micro-batch; with recomputation the running
  // statistics still see each micro-batch once.
  auto buffers_after = [&](par::Checkpoint cp) {
    auto net = resnet(*e, Device::cpu(0), 0);
    par::Pipeline pipe(*e, *net, {.balance = {7, 8}, .devices = cpus(2), .chunks = 2, .checkpoint = cp});
    const Batch& b = batches[0];
    (void)pipe.train_step(Tensor::from_host(*e, b.x_shape, b.x), Tensor::from_host(*e, Shape{4}, b.y)).item();
    std::vector<std::vector<float>> out;
    for (nn::Buffer* buf : net->buffers()) out.push_back(buf->value.to_host());
    return out;
  };
  const auto kept = buffers_after(par::Checkpoint::never);
  CHECK(buffers_after(par::Checkpoint::always) == kept);
}

TEST_CASE("pipeline refuses bad input with named errors") {
  auto e = Engine::create(EngineConfig{.kind = "naive", .cpu_devices = 2});
  auto make = [&] { return dp_test::mlp_model()(*e, Device::cpu(0), 0); };
  auto net = make();
  auto error = [&](par::PipelineOptions o) {
    try {
      par::Pipeline p(*e, *net, std::move(o));
    } catch (const weft::InvalidArgument& err) {
      return std::string(err.what());
    }
    return std::string("(no error)");
  };
  CHECK(error({.balance = {2, 2}, .devices = cpus(2)}).find("sums to 4 layers but the model has 5") != std::string::npos);
  CHECK(error({.balance = {5, 0}, .devices = cpus(2)}).find("stage 1 of the balance has 0 layers") != std::string::npos);
  CHECK(error({.balance = {1, 1, 3}, .devices = cpus(2)}).find("3 stages but only 2 devices") != std::string::npos);
  CHECK(error({.balance = {2, 3}, .devices = {Device::cpu(0), Device::cpu(5)}}).find("cpu(5) is not one of") !=
        std::string::npos);
  CHECK(error({.balance = {2, 3}, .devices = cpus(2), .chunks = 0}).find("chunks must be at least 1") !=
        std::string::npos);
  CHECK(error({.balance = {2, 3}, .devices = cpus(2), .schedule = "zigzag"}).find("unknown schedule") !=
        std::string::npos);
  par::Pipeline pipe(*e, *net, {.balance = {2, 3}, .devices = cpus(2), .chunks = 4});
  const Tensor x3 = Tensor::zeros(*e, Shape{3, 20});
  CHECK_THROWS_WITH_AS(pipe.train_step(x3, Tensor::zeros(*e, Shape{3})),
                       doctest::Contains("a batch of 3 rows cannot make 4 micro-batches"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(pipe.train_step(Tensor::zeros(*e, Shape{8, 20}), Tensor::zeros(*e, Shape{7})),
                       doctest::Contains("labels"), weft::InvalidArgument);
  CHECK_THROWS_AS(par::checkpoint_from_string("sometimes"), weft::InvalidArgument);
}

TEST_CASE("pipeline names each stage's ops in traces, and the bubble comes from them") {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2});
  auto net = dp_test::mlp_model()(*e, Device::cpu(0), 0);
  par::Pipeline pipe(*e, *net, {.balance = {3, 2}, .devices = cpus(2), .chunks = 4});
  const Batch b = dp_test::random_batch(16, {20}, 5, 3);
  e->profiler().start();
  (void)pipe.train_step(Tensor::from_host(*e, b.x_shape, b.x), Tensor::from_host(*e, Shape{16}, b.y)).item();
  e->wait_all();
  e->profiler().stop();
  const std::vector<weft::Span> spans = e->profiler().spans();
  bool dense_f2_on_stage1 = false, dense_b1_on_stage0 = false;
  for (const weft::Span& s : spans) {
    dense_f2_on_stage1 = dense_f2_on_stage1 || (s.name == "dense [stage 1 F2]" && s.device == Device::cpu(1));
    dense_b1_on_stage0 = dense_b1_on_stage0 || (s.name == "dense_backward_data [stage 0 B1]" && s.device == Device::cpu(0));
  }
  CHECK(dense_f2_on_stage1);
  CHECK(dense_b1_on_stage0);
  const std::vector<double> bubble = par::measured_bubble(spans, 2);
  REQUIRE(bubble.size() == 2);
  for (double v : bubble) CHECK((v >= 0.0 && v < 1.0));

  // A stage runs its actions in the schedule's order, not as soon as their
  // inputs allow: with 1F1B, stage 0's third forward (whose input exists from
  // the start) waits for the first micro-batch's backward.
  auto net2 = dp_test::mlp_model()(*e, Device::cpu(0), 0);
  par::Pipeline one_f(*e, *net2, {.balance = {3, 2}, .devices = cpus(2), .chunks = 3, .schedule = "1f1b"});
  e->profiler().clear();
  e->profiler().start();
  (void)one_f.train_step(Tensor::from_host(*e, b.x_shape, b.x), Tensor::from_host(*e, Shape{16}, b.y)).item();
  e->wait_all();
  e->profiler().stop();
  std::int64_t b0_end = 0, f2_start = std::numeric_limits<std::int64_t>::max();
  int b0_spans = 0, f2_spans = 0;
  for (const weft::Span& s : e->profiler().spans()) {
    if (s.name.find("[stage 0 B0]") != std::string_view::npos || s.name.find("[stage 0 W0]") != std::string_view::npos) {
      b0_end = std::max(b0_end, s.end_ns);
      ++b0_spans;
    }
    if (s.name.find("[stage 0 F2]") != std::string_view::npos) {
      f2_start = std::min(f2_start, s.start_ns);
      ++f2_spans;
    }
  }
  REQUIRE(b0_spans > 0);
  REQUIRE(f2_spans > 0);
  CHECK(f2_start >= b0_end);

  // The figure itself, on spans made up for it: stage 0 busy [0, 4) and
  // [6, 8), stage 1 busy [2, 8) of a window [0, 8): bubbles 0.25 and 0.25.
  std::vector<weft::Span> made;
  auto span = [&](const char* name, std::int64_t a, std::int64_t z) {
    weft::Span s;
    s.name = name;
    s.start_ns = a;
    s.end_ns = z;
    made.push_back(s);
  };
  span("dense [stage 0 F0]", 0, 3);
  span("relu [stage 0 F0]", 2, 4);  // overlapping spans count once
  span("dense [stage 0 B0]", 6, 8);
  span("dense [stage 1 F0]", 2, 8);
  span("copy cpu(0)->cpu(1) [stage 0 S0]", 4, 6);
  made.back().property = weft::OpProperty::copy_peer;  // copies are not compute
  const std::vector<double> figure = par::measured_bubble(made, 2);
  CHECK(figure[0] == doctest::Approx(0.25));
  CHECK(figure[1] == doctest::Approx(0.25));
}
