// GPT on GPUs: the same model (the same weights: one seed) trained on gpu(0)
// and on cpu(0) gives the same loss and gradients, in float32 within
// float32 rounding and in bf16 within bf16's; and on two GPUs under ZeRO
// stage 3 (the tied output projection gathering the embedding's weight) the
// same losses as on one GPU. On simulated GPUs the CPU kernels run; on a
// CUDA GPU the CUDA kernels, attention included.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "weft/nn.h"
#include "weft/optim.h"
#include "weft/parallel/data_parallel.h"

namespace gpt_gpu_test {

namespace nn = weft::nn;
namespace par = weft::parallel;

const nn::GptConfig kGptConfig{.vocab = 64, .context = 32, .layers = 2, .heads = 4, .width = 64};
constexpr std::int64_t kGptRows = 4, kGptSeq = 24;

std::vector<float> gpt_ids(std::uint64_t salt) {
  Rng rng(salt);
  std::vector<float> v(static_cast<std::size_t>(kGptRows * kGptSeq));
  for (float& x : v) x = static_cast<float>(rng.below(kGptConfig.vocab));
  return v;
}

struct GptResult {
  float loss = 0.0f;
  std::vector<std::vector<float>> grads;
};

GptResult gpt_run(Engine& e, Device d, weft::Precision p) {
  auto model = nn::gpt(e, kGptConfig, d, 11);
  model->set_precision(p);
  const Tensor x = Tensor::from_host(e, Shape{kGptRows, kGptSeq}, gpt_ids(1), d);
  const Tensor y = Tensor::from_host(e, Shape{kGptRows, kGptSeq}, gpt_ids(2), d);
  weft::ops::SoftmaxCrossEntropy l = nn::lm_loss(model->forward(x), y);
  model->backward(l.dlogits);
  GptResult r{l.loss.item(), {}};
  for (nn::Parameter* param : model->parameters()) r.grads.push_back(param->grad.to_host());
  return r;
}

}  // namespace gpt_gpu_test

using namespace gpt_gpu_test;  // NOLINT(google-build-using-namespace)

TEST_CASE("gpu gpt: loss and gradients on gpu(0) match cpu(0), float32 and bf16" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  for (weft::Precision p : {weft::Precision::fp32, weft::Precision::bf16}) {
    INFO("precision " << weft::to_string(p));
    // float32: accumulation orders differ on CUDA; bf16: a few units of 2^-8.
    const double rtol = p == weft::Precision::fp32 ? 1e-4 : 4e-2;
    auto e = make_engine({.cpu_devices = 1, .gpu_devices = 1});
    const GptResult want = gpt_run(*e, Device::cpu(0), p);
    const GptResult got = gpt_run(*e, Device::gpu(0), p);
    CHECK(std::abs(got.loss - want.loss) <= rtol * std::abs(want.loss));
    REQUIRE(got.grads.size() == want.grads.size());
    for (std::size_t i = 0; i < want.grads.size(); ++i) {
      double scale = 1e-6, worst = 0.0;
      for (float w : want.grads[i]) scale = std::max(scale, static_cast<double>(std::abs(w)));
      for (std::size_t j = 0; j < want.grads[i].size(); ++j)
        worst = std::max(worst, std::abs(static_cast<double>(got.grads[i][j]) - want.grads[i][j]) / scale);
      INFO("parameter " << i);
      CHECK(worst <= rtol * 4);
    }
    e->wait_all();
  }
}

TEST_CASE("gpu gpt: ZeRO stage 3 on two GPUs follows one GPU's losses" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPUS(2);
  auto losses = [](int gpus, par::Shard shard) {
    auto e = make_engine({.cpu_devices = 1, .gpu_devices = gpus});
    std::vector<Device> devices;
    for (int g = 0; g < gpus; ++g) devices.push_back(Device::gpu(g));
    par::DataParallelOptions options;
    options.shard = shard;
    options.optimizer.algorithm = weft::optim::Algorithm::adamw;
    options.optimizer.lr = 1e-3f;
    par::DataParallel dp(*e, devices, [&](Device d) { return nn::gpt(*e, kGptConfig, d, 11); }, options);
    std::vector<float> out;
    for (std::uint64_t step = 0; step < 5; ++step) {
      const std::vector<Tensor> x = dp.split_and_load(Shape{kGptRows, kGptSeq}, gpt_ids(10 + step));
      const std::vector<Tensor> y = dp.split_and_load(Shape{kGptRows, kGptSeq}, gpt_ids(20 + step));
      const std::vector<Tensor> logits = dp.forward(x);
      std::vector<Tensor> grads;
      double loss = 0.0;
      std::vector<Tensor> parts;
      for (std::size_t r = 0; r < logits.size(); ++r) {
        weft::ops::SoftmaxCrossEntropy l = nn::lm_loss(logits[r], y[r]);
        grads.push_back(l.dlogits);
        parts.push_back(l.loss);
      }
      dp.backward(grads);
      dp.step();
      for (std::size_t r = 0; r < parts.size(); ++r)
        loss += static_cast<double>(parts[r].item()) * static_cast<double>(x[r].shape()[0]) / kGptRows;
      out.push_back(static_cast<float>(loss));
    }
    e->wait_all();
    return out;
  };
  const std::vector<float> want = losses(1, par::Shard::none);
  const std::vector<float> got = losses(2, par::Shard::parameters);
  for (std::size_t s = 0; s < want.size(); ++s) {
    INFO("step " << s);
    CHECK(std::abs(got[s] - want[s]) <= 1e-5f * std::max(1.0f, std::abs(want[s])));
  }
}
