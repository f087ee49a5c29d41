// DataParallel on CPU devices (simulated GPUs: the _gpu file,
// MPI ranks: the _mpi file): k steps on n devices with the batch split equal k steps on
// one device with the whole batch (LeNet and an MLP; even and uneven splits;
// one bucket, one per parameter, and in between; with and without overlap);
// no_sync equals summing the micro-batches' gradients; the bucket plan is
// reverse layer order and does not depend on the order a layer lists its
// parameters; an unused parameter is named in an error or counts as zero;
// bucket reductions are interleaved with backward in push order; a custom
// reduction replaces the allreduce; bad input names the problem. Each
// scenario over the naive engine and the threaded one at 1, 2, 4 and 8
// workers per device.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "data_parallel/data_parallel_util.h"
#include "weft/error.h"
#include "weft/ops.h"
#include "weft/parallel/metrics.h"

using namespace dp_test;
using weft_test::contains;
using weft_test::error_of;

namespace {

constexpr int kDevices = 4;

// Dense, but lists its parameters bias first.
class BiasFirstDense : public nn::Dense {
 public:
  using nn::Dense::Dense;
  std::vector<nn::Parameter*> parameters() override { return {&bias(), &weight()}; }
};

// An MLP whose second dense layer is a BiasFirstDense when `bias_first`.
std::unique_ptr<nn::Sequential> mlp_listing(Engine& e, Device d, bool bias_first) {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Dense>(e, 20, 32, d, nn::derive_seed(0, 0), nn::Init::kaiming_uniform, "fc1");
  net->emplace<nn::ReLU>();
  if (bias_first)
    net->emplace<BiasFirstDense>(e, 32, 5, d, nn::derive_seed(0, 1), nn::Init::xavier_uniform, "fc2");
  else
    net->emplace<nn::Dense>(e, 32, 5, d, nn::derive_seed(0, 1), nn::Init::xavier_uniform, "fc2");
  return net;
}

// Dense with an extra parameter its backward never sets.
class DenseWithSpare : public nn::Dense {
 public:
  DenseWithSpare(Engine& e, Device d) : nn::Dense(e, 32, 5, d, nn::derive_seed(0, 1), nn::Init::xavier_uniform, "fc2") {
    spare_.name = "fc2.spare";
    spare_.value = Tensor::ones(e, Shape{3}, d);
  }
  std::vector<nn::Parameter*> parameters() override { return {&weight(), &bias(), &spare_}; }

 private:
  nn::Parameter spare_;
};

std::unique_ptr<nn::Sequential> mlp_with_spare(Engine& e, Device d) {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Dense>(e, 20, 32, d, nn::derive_seed(0, 0), nn::Init::kaiming_uniform, "fc1");
  net->emplace<nn::ReLU>();
  net->emplace<DenseWithSpare>(e, d);
  return net;
}

}  // namespace

TEST_CASE("data parallel: split_rows is balanced, the first parts one larger") {
  CHECK(par::split_rows(10, 3) == std::vector<std::int64_t>{4, 3, 3});
  CHECK(par::split_rows(8, 2) == std::vector<std::int64_t>{4, 4});
  CHECK(par::split_rows(2, 4) == std::vector<std::int64_t>{1, 1, 0, 0});
  CHECK(contains(error_of([] { par::split_rows(4, 0); }), "parts must be positive"));
}

TEST_CASE("data parallel: MLP on n devices with the batch split equals one device with all of it") {
  const std::vector<Batch> batches = mlp_batches(3, 10);
  weft_test::with_each_engine(kDevices, [&](Engine& e) {
    const auto want = reference_run(e, mlp_model(), batches, 0.1f);
    for (int n = 1; n <= kDevices; ++n)
      for (std::size_t bucket : {std::size_t{0}, std::size_t{1024}, std::size_t{25} << 20})
        for (bool overlap : {true, false}) {
          const std::string what = std::to_string(n) + " devices, bucket " + std::to_string(bucket) + " bytes" +
                                   (overlap ? "" : ", no overlap");
          auto dp = data_parallel_run(e, mlp_model(), cpus(n), batches, 0.1f,
                                      {.bucket_bytes = bucket, .overlap = overlap});
          for (int r = 0; r < n; ++r) expect_close(values_of(dp->replica(r)), want, 1e-5, what + ", replica " + std::to_string(r));
        }
  });
}

TEST_CASE("data parallel: LeNet on 2 devices with batch b/2 each equals one device with batch b") {
  const std::vector<Batch> batches = lenet_batches(2, 8);
  weft_test::with_each_engine(kDevices, [&](Engine& e) {
    const auto want = reference_run(e, lenet_model(), batches, 0.1f);
    for (std::size_t bucket : {std::size_t{0}, std::size_t{64} << 10, std::size_t{25} << 20}) {
      auto dp = data_parallel_run(e, lenet_model(), cpus(2), batches, 0.1f, {.bucket_bytes = bucket});
      for (int r = 0; r < 2; ++r)
        expect_close(values_of(dp->replica(r)), want, 1e-5, "bucket " + std::to_string(bucket) + ", replica " + std::to_string(r));
    }
    // An uneven split: 7 rows over 2 devices (4 and 3), each weighted by its share.
    const std::vector<Batch> odd = lenet_batches(2, 7, 5);
    auto dp = data_parallel_run(e, lenet_model(), cpus(2), odd, 0.1f, {.bucket_bytes = 0});
    expect_close(values_of(dp->replica(1)), reference_run(e, lenet_model(), odd, 0.1f), 1e-5, "7 rows on 2 devices");
  });
}

TEST_CASE("data parallel: no_sync over k micro-batches equals one step on their summed gradients") {
  const std::vector<Batch> batches = mlp_batches(6, 9);
  weft_test::with_each_engine(kDevices, [&](Engine& e) {
    for (int k : {2, 3}) {
      // Steps of k batches each: the reference sums each group's gradients.
      std::vector<std::vector<float>> want;
      {
        auto net = mlp_model()(e, Device::cpu(0), 0);
        std::vector<Batch> group;
        // The reference run restarts from its seed; chain the groups by hand.
        const std::vector<nn::Parameter*> params = net->parameters();
        for (std::size_t i = 0; i < batches.size(); ++i) {
          group.push_back(batches[i]);
          if (group.size() < static_cast<std::size_t>(k)) continue;
          std::vector<Tensor> sums;
          for (const Batch& b : group) {
            Tensor x = Tensor::from_host(e, b.x_shape, b.x);
            Tensor y = Tensor::from_host(e, Shape{b.x_shape[0]}, b.y);
            net->backward(weft::ops::softmax_cross_entropy(net->forward(x), y).dlogits);
            for (std::size_t j = 0; j < params.size(); ++j) {
              if (sums.size() <= j) sums.push_back(Tensor::zeros(e, params[j]->value.shape()));
              weft::ops::axpy(1.0f, params[j]->grad, sums[j]);
            }
          }
          for (std::size_t j = 0; j < params.size(); ++j) weft::ops::sgd_update(params[j]->value, sums[j], 0.05f);
          group.clear();
        }
        want = values_of(*net);
      }
      for (int n : {1, 2, 3}) {
        auto dp = data_parallel_run(e, mlp_model(), cpus(n), batches, 0.05f, {.bucket_bytes = 512}, k);
        for (int r = 0; r < n; ++r)
          expect_close(values_of(dp->replica(r)), want, 1e-5,
                       "k " + std::to_string(k) + ", " + std::to_string(n) + " devices, replica " + std::to_string(r));
      }
    }
  });
}

TEST_CASE("data parallel: buckets follow reverse layer order, whatever order a layer lists its parameters in") {
  weft_test::with_each_engine(kDevices, [](Engine& e) {
    // Replica 1 lists fc2's parameters bias first; the plan is the same.
    par::DataParallel dp(e, cpus(2), [&](Device d) { return mlp_listing(e, d, d.index() == 1); }, {.bucket_bytes = 0});
    REQUIRE(dp.buckets().size() == 4);
    const std::vector<std::string> order{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"};
    for (std::size_t b = 0; b < order.size(); ++b) {
      CHECK(dp.buckets()[b].index == static_cast<int>(b));
      CHECK(dp.buckets()[b].parameters == std::vector<std::string>{order[b]});
    }
    // Bucket capacity: fc2 (32*5 + 5 = 165 floats = 660 bytes) fills a
    // 600-byte bucket; fc1 takes the next.
    par::DataParallel two(e, cpus(2), [&](Device d) { return mlp_listing(e, d, d.index() == 0); }, {.bucket_bytes = 600});
    REQUIRE(two.buckets().size() == 2);
    CHECK(two.buckets()[0].parameters == std::vector<std::string>{"fc2.bias", "fc2.weight"});
    CHECK(two.buckets()[0].offsets == std::vector<std::int64_t>{0, 5});
    CHECK(two.buckets()[0].elements == 165);
    CHECK(two.buckets()[1].parameters == std::vector<std::string>{"fc1.bias", "fc1.weight"});
    CHECK(contains(two.describe_buckets(), "bucket 0: 165 elements (0.6 KiB): fc2.bias fc2.weight"));
    // And it trains like the reference.
    const std::vector<Batch> batches = mlp_batches(2, 6, 3);
    for (std::size_t b = 0; b < batches.size(); ++b) {
      std::vector<Tensor> x = two.split_and_load(batches[b].x_shape, batches[b].x);
      std::vector<Tensor> y = two.split_and_load(Shape{6}, batches[b].y);
      std::vector<Tensor> logits = two.forward(x);
      two.backward({weft::ops::softmax_cross_entropy(logits[0], y[0]).dlogits,
                    weft::ops::softmax_cross_entropy(logits[1], y[1]).dlogits});
      two.step(0.1f);
    }
    const ModelFn listing = [](Engine& en, Device d, std::uint64_t) { return mlp_listing(en, d, false); };
    expect_close(values_of(two.replica(1)), reference_run(e, listing, batches, 0.1f), 1e-5, "bias-first replica 0");
  });
}

TEST_CASE("data parallel: a parameter without a gradient is named, or counts as zero with allow_unused") {
  weft_test::with_each_engine(kDevices, [](Engine& e) {
    const std::vector<Batch> batches = mlp_batches(1, 4);
    auto step_once = [&](par::DataParallel& dp) {
      std::vector<Tensor> x = dp.split_and_load(batches[0].x_shape, batches[0].x);
      std::vector<Tensor> y = dp.split_and_load(Shape{4}, batches[0].y);
      std::vector<Tensor> logits = dp.forward(x);
      std::vector<Tensor> d;
      for (std::size_t r = 0; r < logits.size(); ++r) d.push_back(weft::ops::softmax_cross_entropy(logits[r], y[r]).dlogits);
      dp.backward(d);
      dp.step(0.1f);
    };
    for (int n : {1, 2}) {
      par::DataParallel strict(e, cpus(n), [&](Device d) { return mlp_with_spare(e, d); });
      CHECK(contains(error_of([&] { step_once(strict); }),
                     "parameter 'fc2.spare' of replica 0 on cpu(0) got no gradient from its layer (Dense(32 -> 5))"));
      e.wait_all();
      par::DataParallel lenient(e, cpus(n), [&](Device d) { return mlp_with_spare(e, d); }, {.allow_unused = true});
      step_once(lenient);
      step_once(lenient);
      for (int r = 0; r < n; ++r) {
        nn::Parameter* spare = lenient.replica(r).parameters().back();
        CHECK(spare->name == "fc2.spare");
        CHECK(spare->grad.to_host() == std::vector<float>(3, 0.0f));
        CHECK(spare->value.to_host() == std::vector<float>(3, 1.0f));
      }
    }
  });
}

TEST_CASE("data parallel: a custom reduction replaces the allreduce, bucket by bucket in reduction order") {
  weft_test::with_each_engine(kDevices, [](Engine& e) {
    par::DataParallel dp(e, cpus(2), [&](Device d) { return nn::mlp(e, {20, 32, 16, 5}, d, 0); }, {.bucket_bytes = 0});
    std::vector<int> seen;
    // Sum by hand through replica 0 (what reduce_bucket does with a
    // communicator), counting the calls.
    dp.set_reduction([&](const par::GradientBucket& bucket) {
      seen.push_back(bucket.index);
      Tensor other = bucket.flat[1].copy_to(Device::cpu(0));
      Tensor sum = bucket.flat[0];
      weft::ops::axpy(1.0f, other, sum);
      Tensor back = bucket.flat[1];
      back.copy_from(sum);
    });
    const std::vector<Batch> batches = mlp_batches(2, 8, 7);
    for (const Batch& b : batches) {
      std::vector<Tensor> x = dp.split_and_load(b.x_shape, b.x);
      std::vector<Tensor> y = dp.split_and_load(Shape{8}, b.y);
      std::vector<Tensor> logits = dp.forward(x);
      dp.backward({weft::ops::softmax_cross_entropy(logits[0], y[0]).dlogits,
                   weft::ops::softmax_cross_entropy(logits[1], y[1]).dlogits});
      dp.step(0.1f);
    }
    CHECK(seen == std::vector<int>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
    expect_close(values_of(dp.replica(1)), reference_run(e, mlp_model(), batches, 0.1f), 1e-5, "custom reduction");
  });
}

TEST_CASE("data parallel: each bucket's reduction is pushed right after its last gradient, before earlier layers") {
  // A profiled LeNet step with one bucket per layer: the first bucket's
  // reduction (fc2's) is pushed before conv1's backward; with overlap off,
  // after it.
  for (bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    auto e = weft_test::make_engine({.kind = "threaded", .workers = 2, .cpu_devices = 2});
    par::DataParallel dp(*e, cpus(2), [&](Device d) { return nn::lenet(*e, d, 0); },
                         {.bucket_bytes = 1, .overlap = overlap});
    const std::vector<Batch> batches = lenet_batches(1, 4);
    e->wait_all();
    e->profiler().start();
    std::vector<Tensor> x = dp.split_and_load(batches[0].x_shape, batches[0].x);
    std::vector<Tensor> y = dp.split_and_load(Shape{4}, batches[0].y);
    std::vector<Tensor> logits = dp.forward(x);
    dp.backward({weft::ops::softmax_cross_entropy(logits[0], y[0]).dlogits,
                 weft::ops::softmax_cross_entropy(logits[1], y[1]).dlogits});
    dp.step(0.1f);
    e->wait_all();
    e->profiler().stop();
    std::int64_t first_reduce_push = -1, last_conv_push = -1;
    for (const weft::Span& s : e->profiler().spans()) {
      const std::string name(s.name);
      if (contains(name, dp.comm_marker() + "0'") && (first_reduce_push < 0 || s.push_ns < first_reduce_push))
        first_reduce_push = s.push_ns;
      if (contains(name, "conv2d_backward") && s.push_ns > last_conv_push) last_conv_push = s.push_ns;
    }
    REQUIRE(first_reduce_push >= 0);
    REQUIRE(last_conv_push >= 0);
    CHECK((first_reduce_push < last_conv_push) == overlap);
    const par::CommOverlap o = par::comm_overlap(e->profiler().spans(), dp.comm_marker());
    CHECK(o.comm_ms > 0);
    CHECK(o.fraction >= 0);
    CHECK(o.fraction <= 1);
  }
}

TEST_CASE("data parallel: comm_overlap measures the reduction time that other ops ran under") {
  auto span = [](const char* name, std::int64_t a, std::int64_t b, weft::TrackKind kind = weft::TrackKind::worker) {
    weft::Span s;
    s.name = name;
    s.start_ns = a * 1000000;
    s.end_ns = b * 1000000;
    s.kind = kind;
    return s;
  };
  // Reduction 0-10 ms and 20-30 ms; compute 5-25 ms: 5 + 5 of 20 hidden. A
  // launch span over everything does not count.
  const std::vector<weft::Span> spans{span("allreduce 'grad bucket 0' #1 step", 0, 10),
                                      span("conv2d_backward_filter", 5, 25),
                                      span("allreduce 'grad bucket 1' #2 step", 20, 30),
                                      span("allreduce 'grad bucket 1' #2 step", 22, 28),
                                      span("dense", 0, 40, weft::TrackKind::launch)};
  const par::CommOverlap o = par::comm_overlap(spans, "'grad bucket ");
  CHECK(o.comm_ms == doctest::Approx(20));
  CHECK(o.hidden_ms == doctest::Approx(10));
  CHECK(o.fraction == doctest::Approx(0.5));
  CHECK(par::comm_overlap({}, "'grad bucket ").fraction == 0);
}

TEST_CASE("data parallel: bad input names the problem") {
  weft_test::with_each_engine(kDevices, [](Engine& e) {
    auto make = [&](Device d) { return nn::mlp(e, {4, 3}, d, 0); };
    CHECK(contains(error_of([&] { par::DataParallel(e, {}, make); }), "DataParallel: no devices"));
    CHECK(contains(error_of([&] { par::DataParallel(e, {Device::cpu(0), Device::cpu(0)}, make); }),
                   "devices 0 and 1 are both cpu(0)"));
    CHECK(contains(error_of([&] { par::DataParallel(e, {Device::cpu(9)}, make); }),
                   "device 0 is cpu(9), which this engine does not have"));
    CHECK(contains(error_of([&] { par::DataParallel(e, cpus(2), [](Device) { return std::unique_ptr<nn::Sequential>(); }); }),
                   "the factory returned no model for cpu(0)"));
    CHECK(contains(error_of([&] {
                     par::DataParallel(e, cpus(2), [&](Device d) {
                       return nn::mlp(e, {4, d.index() == 0 ? std::int64_t{3} : std::int64_t{2}}, d, 0);
                     });
                   }),
                   "replica 1 on cpu(1) differs from replica 0 in layer 0 (Dense(4 -> 3)): it has 'fc1.bias' [2] "
                   "where replica 0 has 'fc1.bias' [3]"));
    CHECK(contains(error_of([&] { par::DataParallel(e, cpus(1), [&](Device) { return nn::mlp(e, {4, 3}, Device::cpu(1), 0); }); }),
                   "replica 0's parameter 'fc1.bias' is on cpu(1), not cpu(0)"));

    par::DataParallel dp(e, cpus(3), make);
    std::vector<float> data(2 * 4, 0.5f);
    CHECK(contains(error_of([&] { dp.split_and_load(Shape{2, 4}, data); }),
                   "a batch of 2 rows cannot be split over 3 replicas"));
    CHECK(contains(error_of([&] { dp.split_and_load(Shape{3, 4}, data); }), "shape [3, 4] holds 12 values but the data has 8"));
    CHECK(contains(error_of([&] { dp.forward({Tensor::zeros(e, Shape{1, 4})}); }), "1 inputs for 3 replicas"));
    CHECK(contains(error_of([&] {
                     dp.forward({Tensor::zeros(e, Shape{1, 4}), Tensor::zeros(e, Shape{1, 4}), Tensor::zeros(e, Shape{1, 4})});
                   }),
                   "input 1 (Tensor [1, 4] float32 on cpu(0)) is not on cpu(1)"));
    CHECK(contains(error_of([&] {
                     dp.backward({Tensor::zeros(e, Shape{1, 3}), Tensor::zeros(e, Shape{1, 3}, Device::cpu(1)),
                                  Tensor::zeros(e, Shape{1, 3}, Device::cpu(2))});
                   }),
                   "no forward since the last backward"));
    std::vector<float> rows(3 * 4, 0.5f), labels{0, 1, 2};
    std::vector<Tensor> y = dp.split_and_load(Shape{3}, labels);
    std::vector<Tensor> logits = dp.forward(dp.split_and_load(Shape{3, 4}, rows));
    {
      auto guard = dp.no_sync();
      std::vector<Tensor> d;
      for (int r = 0; r < 3; ++r) d.push_back(weft::ops::softmax_cross_entropy(logits[static_cast<std::size_t>(r)], y[static_cast<std::size_t>(r)]).dlogits);
      dp.backward(d);
    }
    CHECK(contains(error_of([&] { dp.step(0.1f); }), "ran inside no_sync and are not reduced yet"));
    CHECK(contains(error_of([&] { dp.replica(3); }), "index 3 out of range (3 replicas)"));
    CHECK(dp.agree_steps(17) == 17);  // one process
    CHECK(contains(error_of([&] { dp.agree_steps(-1); }), "out of range"));
  });
}

TEST_CASE("data parallel: WEFT_BUCKET_BYTES sets the bucket capacity, a malformed value has the one message") {
  auto engine = Engine::create({.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = 1});
  Engine& e = *engine;
  auto make = [&](Device d) { return nn::mlp(e, {4, 3}, d, 0); };  // fc1.weight, fc1.bias
  {
    weft_test::EnvGuard bucket("WEFT_BUCKET_BYTES", "0");  // one bucket per parameter
    CHECK(par::DataParallel(e, cpus(2), make).buckets().size() == 2);
  }
  {
    weft_test::EnvGuard bucket("WEFT_BUCKET_BYTES", "");  // the default, 25 MiB: one bucket
    CHECK(par::DataParallel(e, cpus(2), make).buckets().size() == 1);
  }
  for (const char* bad : {"lots", "-1", "25MiB", "4 "}) {
    weft_test::EnvGuard bucket("WEFT_BUCKET_BYTES", bad);
    CHECK(weft_test::what_thrown<weft::InvalidArgument>([&] { par::DataParallel(e, cpus(2), make); }) ==
          "weft: environment variable WEFT_BUCKET_BYTES='" + std::string(bad) +
              "' is not a byte count (a whole number; 0: one bucket per parameter)");
  }
  // DataParallelOptions::bucket_bytes wins over the environment.
  weft_test::EnvGuard bucket("WEFT_BUCKET_BYTES", "lots");
  CHECK(par::DataParallel(e, cpus(2), make, {.bucket_bytes = 0}).buckets().size() == 2);
}
