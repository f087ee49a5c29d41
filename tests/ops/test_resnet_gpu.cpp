// ResNet-18 on a GPU against the same model on cpu(0): a few SGD steps give
// the same losses, parameter updates and batch-norm running statistics within
// tolerance, and evaluation mode uses the running statistics on both.
//
// Tolerances: simulated GPUs run the CPU kernels, so they agree to the bit;
// cuDNN sums in its own order, and batch norm over a batch of 4 at 2x2 and
// 1x1 resolution (layers 3 and 4) amplifies those roundings, so on a real
// GPU single elements of an update differ by up to 100 % where the element
// is small, while whole tensors agree to a few percent. Updates are therefore compared per tensor in relative L2 norm;
// elementwise, against the scale of the whole model's parameters.
#include <algorithm>
#include <cmath>

#include "gpu_test_util.h"
#include "weft/nn.h"

using namespace gputest;
namespace nn = weft::nn;
namespace ops = weft::ops;

namespace {

struct ResnetRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> initial, params, buffers;
};

double norm2(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// `steps` SGD steps on one batch of 4 images (32x32, the imagenet stem: every
// layer, the padded max pool included, at a fraction of the small stem's
// cost), then the loss in evaluation mode.
ResnetRun train_resnet(Engine& e, Device d, int steps) {
  const std::vector<float> images = random_values(4 * 32 * 32, 71, 0.0f, 1.0f);
  const std::vector<float> labels = {1, 7, 2, 2};
  auto net = nn::resnet18(e, d, 5, nn::ResNetOptions{.stem = nn::ResNetStem::imagenet});
  const Tensor x = Tensor::from_host(e, Shape{4, 1, 32, 32}, images, d);
  const Tensor y = Tensor::from_host(e, Shape{4}, labels, d);
  ResnetRun r;
  for (nn::Parameter* p : net->parameters()) r.initial.push_back(p->value.to_host());
  for (int s = 0; s < steps; ++s) {
    const ops::SoftmaxCrossEntropy sce = ops::softmax_cross_entropy(net->forward(x), y);
    net->backward(sce.dlogits);
    nn::sgd_step(net->parameters(), 0.002f);
    r.losses.push_back(sce.loss.item());
  }
  net->train(false);
  r.losses.push_back(ops::softmax_cross_entropy(net->forward(x), y).loss.item());
  for (nn::Parameter* p : net->parameters()) {
    CHECK(p->value.device() == d);
    r.params.push_back(p->value.to_host());
  }
  for (nn::Buffer* b : net->buffers()) r.buffers.push_back(b->value.to_host());
  e.wait_all();
  return r;
}

}  // namespace

TEST_CASE("gpu resnet - resnet18 steps on a gpu equal cpu within tolerance" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  constexpr int steps = 2;
  const ResnetRun cpu = train_resnet(*e, Device::cpu(0), steps);
  const ResnetRun gpu = train_resnet(*e, Device::gpu(0), steps);
  REQUIRE(gpu.losses.size() == steps + 1);
  MESSAGE("losses cpu " << cpu.losses[0] << " " << cpu.losses[1] << " " << cpu.losses[2] << ", gpu " << gpu.losses[0]
                        << " " << gpu.losses[1] << " " << gpu.losses[2]);
  for (std::size_t s = 0; s < gpu.losses.size(); ++s) {
    CHECK(std::isfinite(gpu.losses[s]));
    CHECK(gpu.losses[s] == doctest::Approx(cpu.losses[s]).epsilon(s == 0 ? 1e-4 : 2e-3));
  }
  REQUIRE(gpu.params.size() == cpu.params.size());
  // Every parameter elementwise against the model's scale; each update
  // (after - before) within 5 % in relative L2 norm, except updates below
  // 1e-6 of the largest: the biases ahead of a batch norm, whose gradient is
  // zero in exact arithmetic (rounding noise on both).
  double largest_update = 0, scale = 0;
  for (std::size_t i = 0; i < cpu.params.size(); ++i) {
    CHECK(gpu.initial[i] == cpu.initial[i]);  // the same initialization, to the bit
    largest_update = std::max(largest_update, norm2(minus(cpu.params[i], cpu.initial[i])));
    scale = std::max(scale, max_abs(cpu.params[i]));
  }
  double worst = 0;
  std::size_t compared = 0;
  for (std::size_t i = 0; i < gpu.params.size(); ++i) {
    expect_close(gpu.params[i], cpu.params[i], 2e-3, 2e-3 * scale, "parameter " + std::to_string(i));
    const std::vector<float> want = minus(cpu.params[i], cpu.initial[i]), got = minus(gpu.params[i], gpu.initial[i]);
    if (norm2(want) < 1e-6 * largest_update) continue;
    const double rel = norm2(minus(got, want)) / norm2(want);
    worst = std::max(worst, rel);
    ++compared;
    INFO("parameter " << i << ": update differs by " << rel << " in relative L2 norm");
    CHECK(rel <= 5e-2);
  }
  MESSAGE(compared << " of " << gpu.params.size() << " parameter updates compared; the largest relative L2 difference "
                   << worst);
  CHECK(compared >= gpu.params.size() / 2);
  REQUIRE(gpu.buffers.size() == cpu.buffers.size());
  for (std::size_t i = 0; i < gpu.buffers.size(); ++i)
    expect_close_scaled(gpu.buffers[i], cpu.buffers[i], 2e-3, "running statistic " + std::to_string(i));
}

// ResNet-50 built on a GPU: one training forward and backward of 2 images at
// 32x32 (shapes only: the blocks run at 8x8 down to 1x1), its parameters,
// gradients and output on that GPU.
TEST_CASE("gpu resnet - resnet50 forward and backward on a gpu give the shapes" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  const Device d = Device::gpu(0);
  auto net =
      nn::resnet50(*e, d, 7, nn::ResNetOptions{.in_channels = 3, .classes = 10, .stem = nn::ResNetStem::imagenet});
  const Tensor x = Tensor::from_host(*e, Shape{2, 3, 32, 32}, random_values(2 * 3 * 32 * 32, 72), d);
  const Tensor y = net->forward(x);
  CHECK(y.shape() == Shape{2, 10});
  CHECK(y.device() == d);
  const Tensor dx = net->backward(Tensor::ones(*e, y.shape(), d));
  CHECK(dx.shape() == Shape{2, 3, 32, 32});
  CHECK(dx.device() == d);
  for (nn::Parameter* p : net->parameters()) {
    CAPTURE(p->name);
    REQUIRE(p->grad.defined());
    CHECK(p->grad.shape() == p->value.shape());
    CHECK(p->grad.device() == d);
  }
  const std::vector<float> logits = y.to_host();
  CHECK(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
  e->wait_all();
}
