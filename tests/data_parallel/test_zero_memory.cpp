// ZeRO's memory on CPU devices, from the allocators' statistics (never wall
// time): on a model whose training state outweighs its activations, each
// stage's peak per member follows ZeRO's accounting within 10% and falls
// from stage to stage; stage 3 gathers at most prefetch_layers + 1 layers at
// once and gives the same weights whatever the prefetch; recomputation
// inside data parallelism and ZeRO gives the same weights; bad settings are
// named. Each scenario over the naive engine and the threaded one at 1, 2,
// 4 and 8 workers.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "data_parallel/zero_memory_util.h"
#include "engine/engine_test_util.h"

using namespace zero_test;
using weft_test::contains;
using weft_test::error_of;

namespace {

constexpr std::int64_t kWidth = 256;
constexpr int kLayers = 8;
constexpr par::Shard kStages[] = {par::Shard::none, par::Shard::optimizer, par::Shard::gradients,
                                  par::Shard::parameters};

struct Peak {
  double bytes = 0, activations = 0, parameters = 0;
};

// One warm-up step, then the largest member's allocator peak over a second.
Peak peak_of_step(Engine& e, par::DataParallel& dp, const std::vector<Batch>& batches) {
  train_steps(dp, {batches[0]});
  e.wait_all();
  for (Device d : dp.devices()) e.allocator(d).reset_peak();
  train_steps(dp, {batches[1]});
  e.wait_all();
  Peak out;
  for (Device d : dp.devices()) {
    const weft::MemoryStats m = weft::memory_stats(e, d);
    if (static_cast<double>(m.peak_in_use) < out.bytes) continue;
    out.bytes = static_cast<double>(m.peak_in_use);
    out.activations = static_cast<double>(role_of(m, MemoryRole::activations));
    out.parameters = static_cast<double>(role_of(m, MemoryRole::parameters));
  }
  return out;
}

par::DataParallelOptions memory_options(par::Shard shard) {
  // One layer per bucket (a layer's weight is 256 KiB).
  return zero_options(shard, optim::OptimizerOptions::adamw(1e-3f), {.bucket_bytes = std::size_t{64} << 10});
}

}  // namespace

TEST_CASE("zero memory: each stage's peak follows ZeRO's accounting and falls stage by stage (AdamW, 4 members)" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = wide_mlp_batches(2, 16, kWidth);
  weft_test::with_each_engine(4, [&](Engine& e) {
    std::vector<double> peaks;
    for (par::Shard shard : kStages) {
      const std::string what = "Shard::" + std::string(par::to_string(shard));
      INFO(what);
      e.wait_all();
      par::DataParallel dp(e, cpus(4), [&](Device d) { return wide_mlp_model(kWidth, kLayers)(e, d, 0); },
                           memory_options(shard));
      const Peak peak = peak_of_step(e, dp, batches);
      const double want = zero_expected_peak(dp, shard, false, 2, peak.activations);
      INFO("peak " << peak.bytes << " bytes, ZeRO's accounting " << want << " (activations " << peak.activations << ")");
      CHECK(peak.bytes <= 1.10 * want);
      CHECK(peak.bytes >= 0.90 * want - 4.0 * kWidth * kWidth);  // stage 3: one gathered layer fewer may coincide
      peaks.push_back(peak.bytes);
    }
    for (std::size_t i = 1; i < peaks.size(); ++i) CHECK_MESSAGE(peaks[i] < peaks[i - 1], "stage " << i);
    CHECK(peaks[3] <= 0.40 * peaks[0]);
  });
}

TEST_CASE("zero memory: stage 3 gathers at most prefetch_layers + 1 layers at once, with the same weights" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = wide_mlp_batches(2, 16, kWidth);
  const double layer = 4.0 * (kWidth * kWidth + kWidth);
  weft_test::with_each_engine(4, [&](Engine& e) {
    std::vector<std::vector<float>> first;
    std::vector<double> gathered;
    for (int prefetch : {0, 1, 2}) {
      INFO("prefetch_layers " << prefetch);
      par::DataParallelOptions options = memory_options(par::Shard::parameters);
      options.prefetch_layers = prefetch;
      par::DataParallel dp(e, cpus(4), [&](Device d) { return wide_mlp_model(kWidth, kLayers)(e, d, 0); }, options);
      const Peak peak = peak_of_step(e, dp, batches);
      double psi = 0;
      for (const par::GradientBucket& b : dp.buckets()) psi += static_cast<double>(b.elements);
      // The member's master chunk (a quarter of the parameters) and the
      // gathered layers.
      const double held = peak.parameters - psi;
      INFO("parameters at the peak: " << peak.parameters << " bytes, " << held / layer << " layers gathered");
      CHECK(held <= (prefetch + 1) * layer * 1.02);
      gathered.push_back(held);
      const std::vector<std::vector<float>> w = zero_weights(dp);
      if (first.empty()) first = w;
      else zero_expect_bitwise(w, first, "prefetch " + std::to_string(prefetch) + " against 0");
    }
    CHECK(gathered[0] < gathered[2]);
  });
}

TEST_CASE("zero memory: recomputed segments under data parallelism and every stage give the plain weights" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = zero_residual_batches(2, 8);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(1e-3f);
  ModelFn recomputed = [](Engine& e, Device d, std::uint64_t seed) {
    auto net = zero_residual_net(e, d, seed);
    net->recompute(4);
    return net;
  };
  weft_test::with_each_engine(2, [&](Engine& e) {
    for (par::Shard shard : kStages) {
      auto plain = data_parallel_run(e, zero_residual_model(), cpus(2), batches, opt.lr, zero_options(shard, opt));
      auto dp = data_parallel_run(e, recomputed, cpus(2), batches, opt.lr, zero_options(shard, opt));
      zero_expect_bitwise(zero_weights(*dp), zero_weights(*plain), "recomputed, " + zero_what(shard, 2, opt));
      // Batch norm's running statistics saw each batch once.
      const std::vector<nn::Buffer*> a = dp->replica(0).buffers(), b = plain->replica(0).buffers();
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(a[i]->value.to_host() == b[i]->value.to_host(), a[i]->name);
    }
  });
}

TEST_CASE("zero memory: a prefetch depth out of range and offload without GPU members are named" *
          doctest::timeout(60)) {
  auto e = weft::Engine::create({.kind = "naive", .cpu_devices = 2});
  auto make = [&](par::DataParallelOptions options) {
    par::DataParallel dp(*e, cpus(2), [&](Device d) { return nn::mlp(*e, {4, 3, 2}, d, 0); }, options);
  };
  par::DataParallelOptions options{.shard = par::Shard::parameters};
  options.prefetch_layers = -1;
  CHECK(contains(error_of([&] { make(options); }), "prefetch_layers -1 is out of range [0, 2]"));
  options.prefetch_layers = 3;
  CHECK(contains(error_of([&] { make(options); }), "prefetch_layers 3 is out of range [0, 2]"));
  options.prefetch_layers = 2;
  CHECK_NOTHROW(make(options));
  options.offload = Device::cpu_pinned(0);
  CHECK(contains(error_of([&] { make(options); }), "with replicas on cpu(0): the replicas' memory is host memory"));
  options.offload = Device::gpu(0);
  CHECK(contains(error_of([&] { make(options); }), "offload to gpu(0): the optimizer state is offloaded to a host device"));
  options.offload = Device::cpu(7);
  CHECK(contains(error_of([&] { make(options); }), "offload to cpu(7), which this engine does not have"));
}
