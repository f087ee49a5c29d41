// nn::Recompute and Sequential::recompute: the same gradients, parameters
// updates and running statistics as the model without recomputation (bit for
// bit: the same ops on the same inputs), a lower activation peak, and the
// misuse errors. Each scenario on the naive engine and the threaded one at
// several worker counts.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "ops/layer_test_util.h"
#include "weft/nn.h"
#include "weft/ops.h"

namespace {

namespace nn = weft::nn;
using weft::Device;
using weft::Engine;
using weft::MemoryRole;
using weft::Shape;
using weft::Tensor;
using weft_test::contains;
using weft_test::error_of;
using weft_test::layers::bitwise_equal;
using weft_test::layers::random_vec;

// conv -> BN -> ReLU -> residual blocks -> pooling -> dense: batch norm's
// running statistics and a layer (Residual) of several layers.
std::unique_ptr<nn::Sequential> small_resnet(Engine& e, std::int64_t width = 8) {
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Conv2d>(e, 1, width, 3, nn::Conv2dParams{.stride = 1, .pad = 1}, Device::cpu(0), 11,
                           nn::Init::kaiming_uniform, "conv1");
  net->emplace<nn::BatchNorm>(e, width, Device::cpu(0), "bn1");
  net->emplace<nn::ReLU>();
  net->emplace<nn::Residual>(e, width, width, 1, false, Device::cpu(0), 12, "layer1");
  net->emplace<nn::Residual>(e, width, width, 1, false, Device::cpu(0), 13, "layer2");
  net->emplace<nn::Residual>(e, width, 2 * width, 2, true, Device::cpu(0), 14, "layer3");
  net->emplace<nn::GlobalAvgPool2d>();
  net->emplace<nn::Flatten>();
  net->emplace<nn::Dense>(e, 2 * width, 10, Device::cpu(0), 15, nn::Init::xavier_uniform, "fc");
  return net;
}

struct StepResult {
  std::vector<std::vector<float>> grads, buffers;
  std::vector<float> dx;
  std::size_t activation_peak = 0;  // the allocator's activations at its peak
};

// Two training steps (SGD in between), so the second sees updated weights
// and running statistics; the gradients and buffers after the second.
StepResult train_two_steps(Engine& e, nn::Sequential& net, std::int64_t batch, std::int64_t hw) {
  StepResult out;
  for (int step = 0; step < 2; ++step) {
    const Tensor x = Tensor::from_host(e, Shape{batch, 1, hw, hw}, random_vec(batch * hw * hw, 7 + step));
    std::vector<float> labels;
    for (std::int64_t i = 0; i < batch; ++i) labels.push_back(static_cast<float>((i * 3 + step) % 10));
    const Tensor y = Tensor::from_host(e, Shape{batch}, labels);
    e.wait_all();
    e.allocator(Device::cpu(0)).reset_peak();
    const Tensor logits = net.forward(x);
    const Tensor dx = net.backward(weft::ops::softmax_cross_entropy(logits, y).dlogits);
    if (step == 1) out.dx = dx.to_host();
    e.wait_all();
    out.activation_peak = e.allocator(Device::cpu(0)).stats().peak_by_role[static_cast<std::size_t>(MemoryRole::activations)];
    if (step == 0) nn::sgd_step(net.parameters(), 0.05f);
  }
  for (nn::Parameter* p : net.parameters()) out.grads.push_back(p->grad.to_host());
  for (nn::Buffer* b : net.buffers()) out.buffers.push_back(b->value.to_host());
  return out;
}

}  // namespace

TEST_CASE("recompute: gradients, running statistics and the input gradient equal the plain model's, bit for bit" *
          doctest::timeout(120)) {
  weft_test::with_each_engine(1, [](Engine& e) {
    auto plain = small_resnet(e);
    const StepResult want = train_two_steps(e, *plain, 6, 8);
    for (int segments : {2, 3, 5}) {
      INFO(segments << " segments");
      auto net = small_resnet(e);
      net->recompute(segments);
      // segments - 1 Recompute layers, then the last run as it was.
      for (std::size_t i = 0; i < net->size(); ++i)
        CHECK((dynamic_cast<nn::Recompute*>(&(*net)[i]) != nullptr) == (i + 1 < static_cast<std::size_t>(segments)));
      CHECK(nn::parameter_count(net->parameters()) == nn::parameter_count(plain->parameters()));
      const StepResult got = train_two_steps(e, *net, 6, 8);
      REQUIRE(got.grads.size() == want.grads.size());
      for (std::size_t i = 0; i < want.grads.size(); ++i) CHECK_MESSAGE(bitwise_equal(got.grads[i], want.grads[i]), i);
      // Batch norm's running statistics counted each batch once.
      REQUIRE(got.buffers.size() == want.buffers.size());
      for (std::size_t i = 0; i < want.buffers.size(); ++i)
        CHECK_MESSAGE(bitwise_equal(got.buffers[i], want.buffers[i]), "buffer " << i);
      CHECK(bitwise_equal(got.dx, want.dx));
    }
  });
}

TEST_CASE("recompute: the activation peak falls" * doctest::timeout(120)) {
  auto e = Engine::create({.kind = "threaded", .cpu_devices = 1});
  auto plain = small_resnet(*e, 16);
  const StepResult base = train_two_steps(*e, *plain, 16, 16);
  auto net = small_resnet(*e, 16);
  net->recompute(8);  // every layer a segment of its own, but the last two
  const StepResult got = train_two_steps(*e, *net, 16, 16);
  MESSAGE("activation peak: " << base.activation_peak << " bytes plain, " << got.activation_peak << " recomputed");
  CHECK(got.activation_peak < base.activation_peak * 2 / 3);
}
