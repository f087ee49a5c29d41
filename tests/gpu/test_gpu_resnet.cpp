// ResNet-18 on a GPU against the same model on cpu(0): a few SGD steps give
// the same losses, weights and batch-norm running statistics within
// tolerance (cuDNN sums in its own order on a real GPU; simulated GPUs run
// the CPU kernels), and evaluation mode uses the running statistics on both.
#include <cmath>

#include "gpu_test_util.h"
#include "weft/nn.h"

using namespace gputest;
namespace nn = weft::nn;
namespace ops = weft::ops;

namespace {

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<float>> params, buffers;
};

// `steps` SGD steps on one batch of 4 images (32x32, the imagenet stem: every
// layer, the padded max pool included, at a fraction of the small stem's
// cost), then the loss in evaluation mode.
Run train(Engine& e, Device d, int steps) {
  const std::vector<float> images = random_values(4 * 32 * 32, 71, 0.0f, 1.0f);
  const std::vector<float> labels = {1, 7, 2, 2};
  auto net = nn::resnet18(e, d, 5, nn::ResNetOptions{.stem = nn::ResNetStem::imagenet});
  const Tensor x = Tensor::from_host(e, Shape{4, 1, 32, 32}, images, d);
  const Tensor y = Tensor::from_host(e, Shape{4}, labels, d);
  Run r;
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
  const Run cpu = train(*e, Device::cpu(0), steps);
  const Run gpu = train(*e, Device::gpu(0), steps);
  REQUIRE(gpu.losses.size() == steps + 1);
  MESSAGE("losses cpu " << cpu.losses[0] << " " << cpu.losses[1] << " " << cpu.losses[2] << ", gpu " << gpu.losses[0]
                        << " " << gpu.losses[1] << " " << gpu.losses[2]);
  for (std::size_t s = 0; s < gpu.losses.size(); ++s) {
    CHECK(std::isfinite(gpu.losses[s]));
    CHECK(gpu.losses[s] == doctest::Approx(cpu.losses[s]).epsilon(s == 0 ? 1e-4 : 2e-3));
  }
  REQUIRE(gpu.params.size() == cpu.params.size());
  for (std::size_t i = 0; i < gpu.params.size(); ++i)
    expect_close_scaled(gpu.params[i], cpu.params[i], 2e-3, "parameter " + std::to_string(i));
  REQUIRE(gpu.buffers.size() == cpu.buffers.size());
  for (std::size_t i = 0; i < gpu.buffers.size(); ++i)
    expect_close_scaled(gpu.buffers[i], cpu.buffers[i], 2e-3, "running statistic " + std::to_string(i));
}
