// The key-value store: push sums values from several devices into the
// store, pull copies the value back to several, an updater decides how a
// push changes the value (the parameter-server pattern). Every call pushes
// engine ops and returns at once; to_host() below is the only wait.
#include <weft/ops.h>
#include <weft/parallel/kvstore.h>

#include <cstdio>
#include <vector>

namespace par = weft::parallel;
using weft::Device;
using weft::Shape;
using weft::Tensor;

// Prints the first element of each tensor and whether every one holds `want`.
static bool show(const char* what, const std::vector<Tensor>& ts, float want) {
  bool ok = true;
  std::printf("%-34s", what);
  for (const Tensor& t : ts) {
    const std::vector<float> v = t.to_host();  // waits for this tensor only
    for (float x : v) ok = ok && x == want;
    std::printf(" %s: %g", t.device().str().c_str(), v[0]);
  }
  std::printf("%s\n", ok ? "" : "   <- wrong");
  return ok;
}

int main() {
  auto engine = weft::Engine::create({.cpu_devices = 4});
  std::vector<Device> devices;  // four devices stand in for four GPUs
  for (int d = 0; d < 4; ++d) devices.push_back(Device::cpu(d));
  const Shape shape{2, 3};
  bool ok = true;

  // The device kind sums on a device (here the least loaded one); the local
  // kind would sum on the host.
  par::KVStore kv(*engine, par::KVStoreKind::device);
  kv.init(3, Tensor::full(*engine, shape, 2.0f));
  Tensor a = Tensor::zeros(*engine, shape);
  kv.pull(3, {a});
  ok &= show("init 3 to 2s, pull:", {a}, 2.0f);

  // Push from four devices: the store holds their sum (assignment is the
  // default updater).
  std::vector<Tensor> ones;
  for (const Device& d : devices) ones.push_back(Tensor::full(*engine, shape, 1.0f, d));
  kv.push(3, ones);
  kv.pull(3, {a});
  ok &= show("push 1s from 4 devices, pull:", {a}, 4.0f);

  // Pull to every device at once.
  std::vector<Tensor> outs;
  for (const Device& d : devices) outs.push_back(Tensor::zeros(*engine, shape, d));
  kv.pull(3, outs);
  ok &= show("pull to 4 devices:", outs, 4.0f);

  // An updater runs once per push, where the value lives: here
  // stored += 2 * (sum of the pushed values); an optimizer step such as
  // par::sgd_updater(lr) has the same shape.
  kv.set_updater([](const par::Key&, const Tensor& merged, Tensor& stored) { weft::ops::axpy(2.0f, merged, stored); });
  kv.push(3, ones);
  kv.pull(3, outs);
  ok &= show("updater stored += 2 * sum, pull:", outs, 12.0f);

  // Keys may be names too; pushpull is push then pull (an allreduce when the
  // outputs are the pushed tensors and the updater assigns).
  kv.set_updater({});
  kv.init("fc1.bias", Tensor::zeros(*engine, Shape{3}));
  std::vector<Tensor> grads;
  for (const Device& d : devices) grads.push_back(Tensor::full(*engine, Shape{3}, 0.5f, d));
  kv.pushpull("fc1.bias", grads, grads);
  ok &= show("pushpull 'fc1.bias' (0.5 each):", grads, 2.0f);

  std::printf("%s; key 3 lives on %s\n", kv.str().c_str(), kv.placement(3).str().c_str());
  return ok ? 0 : 1;
}
