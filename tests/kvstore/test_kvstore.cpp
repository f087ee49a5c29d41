// KVStore on CPU devices, local and device kinds (dist_sync: test_kvstore_mpi.cpp,
// GPUs: test_kvstore_gpu.cpp): push sums values from several devices bit for bit; the
// updater runs once per push; pull after push sees it without a wait;
// pushes to many keys in flight at once stay per key; the device kind places
// keys largest first on the least-loaded device; bad input names the key.
// Each scenario over the naive engine and the threaded one at 1, 2, 4 and 8
// workers per device.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"
#include "collectives/collective_values.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/ops.h"
#include "weft/parallel/kvstore.h"
#include "weft/tensor.h"

namespace {

using collective_test::values;
using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using weft_test::contains;
using weft_test::error_of;
namespace par = weft::parallel;

constexpr int kStoreDevices = 4;
const par::KVStoreKind kKinds[] = {par::KVStoreKind::local, par::KVStoreKind::device};

// values(r, count, salt) on cpu(r), for r < n.
std::vector<Tensor> device_values(Engine& e, int n, std::int64_t count, int salt) {
  return collective_test::member_tensors(e, n, count, [](int r) { return Device::cpu(r); }, salt);
}

std::vector<float> sum_of(int n, std::int64_t count, int salt) {
  return collective_test::reduced(n, count, par::ReduceOp::sum, salt);
}

}  // namespace

TEST_CASE("kvstore: push sums values from several devices, pull copies the value to several") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    for (par::KVStoreKind kind : kKinds) {
      INFO(par::to_string(kind));
      par::KVStore store(e, kind);
      const std::int64_t count = 1003;
      store.init(3, Tensor::zeros(e, Shape{count}));
      for (int n = 1; n <= kStoreDevices; ++n) {
        INFO(n << " values");
        store.push(3, device_values(e, n, count, n));
        std::vector<Tensor> outs;
        for (int r = 0; r < kStoreDevices; ++r) outs.push_back(Tensor::empty(e, Shape{count}, Device::cpu(r)));
        store.pull(3, outs);  // no wait: ordered after the push by the engine
        for (const Tensor& out : outs) CHECK(out.to_host() == sum_of(n, count, n));
      }
    }
  });
}

TEST_CASE("kvstore: the default updater assigns, a custom one runs once per push, where the value lives") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    for (par::KVStoreKind kind : kKinds) {
      INFO(par::to_string(kind));
      par::KVStore store(e, kind);
      const std::int64_t count = 13;
      store.init("w", Tensor::from_host(e, Shape{count}, values(0, count, 9)));
      store.push("w", device_values(e, 2, count, 1));
      store.push("w", device_values(e, 2, count, 2));  // replaces, does not add
      Tensor out = Tensor::empty(e, Shape{count});
      store.pull("w", {out});
      CHECK(out.to_host() == sum_of(2, count, 2));

      std::atomic<int> calls{0};
      const par::Updater sgd = par::sgd_updater(0.5f);
      store.set_updater([&](const par::Key& key, const Tensor& merged, Tensor& stored) {
        ++calls;
        CHECK(key == par::Key("w"));
        CHECK(stored.device() == store.placement("w"));
        CHECK(merged.device() == stored.device());
        sgd(key, merged, stored);
      });
      std::vector<float> want = sum_of(2, count, 2);
      for (int k = 0; k < 3; ++k) {
        store.push("w", device_values(e, 3, count, 10 + k));
        const std::vector<float> g = sum_of(3, count, 10 + k);
        for (std::size_t i = 0; i < want.size(); ++i) want[i] -= 0.5f * g[i];
      }
      CHECK(calls == 3);
      store.pull("w", {out});
      CHECK(out.to_host() == want);
    }
  });
}

TEST_CASE("kvstore: many keys in flight at once, pushes and pulls interleaved without waits") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    for (par::KVStoreKind kind : kKinds) {
      INFO(par::to_string(kind));
      par::KVStore store(e, kind);
      constexpr int kKeys = 12;
      std::vector<std::int64_t> counts;
      for (int k = 0; k < kKeys; ++k) {
        counts.push_back(1 + 97 * k);
        store.init(k, Tensor::zeros(e, Shape{counts.back()}));
      }
      // Round j pushes salt j to every key, then pulls every key into a
      // fresh tensor per device; nothing waits until the end.
      std::vector<std::vector<Tensor>> pulled(kKeys);
      for (int round = 0; round < 3; ++round)
        for (int k = 0; k < kKeys; ++k) {
          const int salt = 100 * round + k;
          const int n = 1 + (k + round) % kStoreDevices;
          store.push(k, device_values(e, n, counts[static_cast<std::size_t>(k)], salt));
          Tensor out = Tensor::empty(e, Shape{counts[static_cast<std::size_t>(k)]}, Device::cpu(k % kStoreDevices));
          store.pull(k, {out});
          pulled[static_cast<std::size_t>(k)].push_back(out);
        }
      for (int k = 0; k < kKeys; ++k)
        for (int round = 0; round < 3; ++round) {
          INFO("key " << k << ", round " << round);
          const int n = 1 + (k + round) % kStoreDevices;
          CHECK(pulled[static_cast<std::size_t>(k)][static_cast<std::size_t>(round)].to_host() ==
                sum_of(n, counts[static_cast<std::size_t>(k)], 100 * round + k));
        }
    }
  });
}

TEST_CASE("kvstore: pushpull into the pushed tensors is an allreduce") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    for (par::KVStoreKind kind : kKinds) {
      par::KVStore store(e, kind);
      const std::int64_t count = 7;
      store.init("g", Tensor::zeros(e, Shape{count}));
      std::vector<Tensor> grads = device_values(e, kStoreDevices, count, 5);
      store.pushpull("g", grads, grads);
      for (const Tensor& g : grads) CHECK(g.to_host() == sum_of(kStoreDevices, count, 5));
    }
  });
}

TEST_CASE("kvstore: the device kind places keys largest first on the least-loaded device") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    par::KVStore store(e, par::KVStoreKind::device, {.devices = {Device::cpu(0), Device::cpu(1)}});
    // Bytes: 4000 -> cpu(0); then 2000, 1600 and 40 -> cpu(1) (3640 < 4000).
    store.init({"small", "large", "medium", "fourth"},
               {Tensor::zeros(e, Shape{10}), Tensor::zeros(e, Shape{1000}), Tensor::zeros(e, Shape{500}),
                Tensor::zeros(e, Shape{400})});
    CHECK(store.placement("large") == Device::cpu(0));
    CHECK(store.placement("medium") == Device::cpu(1));
    CHECK(store.placement("fourth") == Device::cpu(1));
    CHECK(store.placement("small") == Device::cpu(1));
    // The next key goes to the lighter device.
    store.init("next", Tensor::zeros(e, Shape{100}));
    CHECK(store.placement("next") == Device::cpu(1));
    store.init("after", Tensor::zeros(e, Shape{200}));
    CHECK(store.placement("after") == Device::cpu(0));
    // Values come from anywhere; sums happen where the key lives.
    store.push("medium", device_values(e, kStoreDevices, 500, 3));
    Tensor out = Tensor::empty(e, Shape{500}, Device::cpu(3));
    store.pull("medium", {out});
    CHECK(out.to_host() == sum_of(kStoreDevices, 500, 3));
    CHECK(contains(store.str(), "device KVStore on cpu(0), cpu(1): 6 keys"));

    // Without a device list, the engine's GPUs (simulated ones where
    // WEFT_GPU_BACKEND=sim), else its CPU devices: equal keys go round them.
    std::vector<Device> expected;
    for (const Device& d : e.devices())
      if (d.is_gpu()) expected.push_back(d);
    if (expected.empty())
      for (const Device& d : e.devices())
        if (d.is_cpu()) expected.push_back(d);
    par::KVStore spread(e, par::KVStoreKind::device);
    const int keys = 2 * static_cast<int>(expected.size());
    for (int k = 0; k < keys; ++k) spread.init(k, Tensor::zeros(e, Shape{64}));
    for (int k = 0; k < keys; ++k)
      CHECK(spread.placement(k) == expected[static_cast<std::size_t>(k) % expected.size()]);
  });
}

TEST_CASE("kvstore: integer and name keys are distinct and print as such") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    par::KVStore store(e, par::KVStoreKind::local);
    store.init(3, Tensor::full(e, Shape{2}, 1.0f));
    store.init("3", Tensor::full(e, Shape{2}, 2.0f));
    CHECK(store.keys() == std::vector<par::Key>{3, "3"});  // integers first
    Tensor a = Tensor::empty(e, Shape{2}), b = Tensor::empty(e, Shape{2});
    store.pull(3, {a});
    store.pull("3", {b});
    CHECK(a.to_host() == std::vector<float>{1, 1});
    CHECK(b.to_host() == std::vector<float>{2, 2});
    CHECK(par::Key(3).str() == "key 3");
    CHECK(par::Key("fc1.weight").str() == "key 'fc1.weight'");
  });
}

TEST_CASE("kvstore: bad input is an error naming the key, at the call") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    par::KVStore store(e, par::KVStoreKind::local);
    store.init("fc1.weight", Tensor::zeros(e, Shape{4, 3}));
    auto err = [](auto&& fn) { return error_of(fn); };
    CHECK(contains(err([&] { store.push("fc2.weight", {Tensor::zeros(e, Shape{4, 3})}); }),
                   "push of key 'fc2.weight', which was never initialized"));
    CHECK(contains(err([&] { store.pull(7, {Tensor::zeros(e, Shape{4, 3})}); }),
                   "pull of key 7, which was never initialized"));
    CHECK(contains(err([&] { store.init("fc1.weight", Tensor::zeros(e, Shape{4, 3})); }),
                   "init of key 'fc1.weight', which is initialized already"));
    const Tensor wrong = Tensor::zeros(e, Shape{3, 4});
    CHECK(contains(err([&] { store.push("fc1.weight", {Tensor::zeros(e, Shape{4, 3}), wrong}); }),
                   "push of key 'fc1.weight': value 1 has shape [3, 4]; the key was initialized with [4, 3]"));
    CHECK(contains(err([&] { store.pull("fc1.weight", {Tensor::zeros(e, Shape{12})}); }),
                   "pull of key 'fc1.weight': out 0 has shape [12]"));
    CHECK(contains(err([&] { store.push("fc1.weight", {Tensor::empty(e, Shape{4, 3}, {}, weft::DType::bfloat16)}); }),
                   "value 0 is bfloat16; the store holds float32"));
    CHECK(contains(err([&] { store.push("fc1.weight", {}); }), "push of key 'fc1.weight' with no values"));
    CHECK(contains(err([&] { store.push("fc1.weight", {Tensor()}); }), "value 0 is an undefined tensor"));
    CHECK(contains(err([&] { store.init({"a", "a"}, {Tensor::zeros(e, Shape{1}), Tensor::zeros(e, Shape{1})}); }),
                   "init lists key 'a' twice"));
    CHECK(contains(err([&] { store.init({"a", "b"}, {Tensor::zeros(e, Shape{1})}); }), "init of 2 keys with 1 values"));
    CHECK(contains(err([&] { (void)par::parse_kvstore_kind("dist_async"); }),
                   "unknown KVStore kind 'dist_async' (kinds: local, device, dist_sync)"));
    CHECK(contains(err([&] { par::KVStore s(e, par::KVStoreKind::device, {.devices = {Device::cpu(9)}}); }),
                   "device cpu(9) is not a device of this engine"));
    CHECK(contains(err([&] { par::KVStore s(e, par::KVStoreKind::local, {.devices = {Device::cpu(1)}}); }),
                   "devices are for the device kind"));
    // Nothing was half done: the key still works.
    store.push("fc1.weight", {Tensor::full(e, Shape{4, 3}, 2.0f)});
    Tensor out = Tensor::empty(e, Shape{4, 3});
    store.pull("fc1.weight", {out});
    CHECK(out.to_host() == std::vector<float>(12, 2.0f));
  });
}

TEST_CASE("kvstore: two threads pushing one key never mix one push's sum with the other's update") {
  weft_test::with_each_engine(kStoreDevices, [](Engine& e) {
    for (par::KVStoreKind kind : kKinds) {
      INFO(par::to_string(kind));
      par::KVStore store(e, kind);
      const std::int64_t count = 64;
      store.init("acc", Tensor::zeros(e, Shape{count}));
      // stored += merged: each thread's pushes add its own value, whatever
      // the interleaving, as long as each update reads its own push's sum.
      store.set_updater(
          [](const par::Key&, const Tensor& merged, Tensor& stored) { weft::ops::axpy(1.0f, merged, stored); });
      constexpr int kPushes = 50;
      auto pusher = [&](float v) {
        for (int k = 0; k < kPushes; ++k)
          store.push("acc", {Tensor::full(e, Shape{count}, v, Device::cpu(0)),
                             Tensor::full(e, Shape{count}, v, Device::cpu(1))});
      };
      std::thread a(pusher, 1.0f), b(pusher, 100.0f);
      a.join();
      b.join();
      Tensor out = Tensor::empty(e, Shape{count});
      store.pull("acc", {out});
      CHECK(out.to_host() == std::vector<float>(count, kPushes * 2 * (1.0f + 100.0f)));
    }
  });
}
