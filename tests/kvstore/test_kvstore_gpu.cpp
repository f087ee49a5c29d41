// KVStore with GPU values (simulated GPUs in CI): the device kind placing
// keys on the GPUs and summing there over peer copies, the local kind
// summing GPU values on the host; values from GPUs and CPU devices mixed in
// one push; an SGD updater running on the GPU that holds the key. Bit-exact
// against serial sums (integers in float). Each scenario over the naive
// engine and the threaded one at 1, 2, 4 and 8 workers and streams.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "gpu_test_util.h"
#include "collectives/collective_values.h"
#include "weft/parallel/kvstore.h"

namespace {

using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace par = weft::parallel;

// values(r, count, salt) on devices[r].
std::vector<Tensor> on(Engine& e, const std::vector<Device>& devices, std::int64_t count, int salt) {
  return collective_test::member_tensors(e, static_cast<int>(devices.size()), count,
                                         [&](int r) { return devices[static_cast<std::size_t>(r)]; }, salt);
}

std::vector<float> sum_of(int n, std::int64_t count, int salt) {
  return collective_test::reduced(n, count, par::ReduceOp::sum, salt);
}

}  // namespace

TEST_CASE("gpu kvstore - the device kind places keys on the GPUs and sums there" * doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  gputest::with_each_gpu_engine(gputest::member_gpus(), [](Engine& e) {
    par::KVStore store(e, par::KVStoreKind::device);
    const int n = gputest::member_gpus();
    std::vector<Device> all;
    for (int g = 0; g < n; ++g) all.push_back(Device::gpu(g));
    // One key per GPU, equal sizes: each on its own GPU, in order.
    for (int k = 0; k < n; ++k) store.init(k, Tensor::zeros(e, Shape{1003}));
    for (int k = 0; k < n; ++k) CHECK(store.placement(k) == Device::gpu(k));
    for (int k = 0; k < n; ++k) {
      INFO("key " << k);
      store.push(k, on(e, all, 1003, k));
      std::vector<Tensor> outs;
      for (const Device& d : all) outs.push_back(Tensor::empty(e, Shape{1003}, d));
      outs.push_back(Tensor::empty(e, Shape{1003}, Device::cpu(0)));
      store.pull(k, outs);
      for (const Tensor& out : outs) CHECK(out.to_host() == sum_of(n, 1003, k));
    }
  });
}

TEST_CASE("gpu kvstore - GPU and CPU values mixed in one push, on every kind in process" * doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  gputest::with_each_gpu_engine(gputest::member_gpus(), [](Engine& e) {
    std::vector<Device> mixed = {Device::gpu(0), Device::cpu(0), Device::gpu(gputest::member_gpus() - 1)};
    for (par::KVStoreKind kind : {par::KVStoreKind::local, par::KVStoreKind::device}) {
      INFO(par::to_string(kind));
      par::KVStore store(e, kind);
      store.init("w", Tensor::zeros(e, Shape{13}, Device::gpu(0)));
      CHECK(store.placement("w") == (kind == par::KVStoreKind::local ? Device::cpu(0) : Device::gpu(0)));
      std::vector<Tensor> grads = on(e, mixed, 13, 4);
      store.pushpull("w", grads, grads);
      for (const Tensor& g : grads) CHECK(g.to_host() == sum_of(3, 13, 4));
    }
  });
}

TEST_CASE("gpu kvstore - an SGD updater runs on the GPU holding the key, once per push" * doctest::timeout(600)) {
  WEFT_REQUIRE_GPU();
  gputest::with_each_gpu_engine(gputest::member_gpus(), [](Engine& e) {
    par::KVStore store(e, par::KVStoreKind::device);
    const std::int64_t count = 257;
    store.init("fc.weight", Tensor::from_host(e, Shape{count}, collective_test::values(0, count, 7), Device::gpu(0)));
    std::atomic<int> calls{0};
    const par::Updater sgd = par::sgd_updater(0.25f);
    store.set_updater([&](const par::Key& key, const Tensor& merged, Tensor& stored) {
      ++calls;
      CHECK(stored.device().is_gpu());
      sgd(key, merged, stored);
    });
    std::vector<float> want = collective_test::values(0, count, 7);
    std::vector<Device> all;
    for (int g = 0; g < gputest::member_gpus(); ++g) all.push_back(Device::gpu(g));
    for (int step = 0; step < 4; ++step) {
      store.push("fc.weight", on(e, all, count, 20 + step));
      const std::vector<float> g = sum_of(gputest::member_gpus(), count, 20 + step);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] -= 0.25f * g[i];
    }
    CHECK(calls == 4);
    Tensor out = Tensor::empty(e, Shape{count}, Device::cpu(0));
    store.pull("fc.weight", {out});
    CHECK(out.to_host() == want);
  });
}
