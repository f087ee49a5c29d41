// Writes one training forward and backward of weft::nn::gpt for
// tests/scripts/check_torch_peer_gpt.py, which loads the same weights into
// bench/torch_train_peer.py's GPT and compares:
//   weft-test-gpt-peer-dump FILE.safetensors
// A small tied GPT (vocab 32, context 16, 2 layers, 4 heads, width 32) on
// cpu(0) in float32, with weights large enough that GELU, softmax and layer
// norm are far from linear (U(-0.5, 0.5); layer norm weights 1 + U(-0.25,
// 0.25)), ids and targets [2, 12]. FILE holds "param.<name>" and
// "grad.<name>" for every parameter, "ids", "targets", "logits" [2, 12, 32]
// and "loss" [1], all float32; its metadata holds the configuration.
// Exit status 0 written, 1 failed (the message on stderr), 2 bad arguments.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "weft/checkpoint.h"
#include "weft/engine.h"
#include "weft/nn.h"
#include "weft/ops.h"
#include "weft/tensor.h"

namespace {

weft::checkpoint::HostTensor host(const std::string& name, const weft::Shape& shape, const std::vector<float>& v) {
  weft::checkpoint::HostTensor t{name, weft::DType::float32, shape, std::vector<std::byte>(v.size() * sizeof(float))};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());  // little-endian hosts only, as the format
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FILE.safetensors\n", argv[0]);
    return 2;
  }
  try {
    const weft::nn::GptConfig config{.vocab = 32, .context = 16, .layers = 2, .heads = 4, .width = 32};
    const std::int64_t b = 2, t = 12;
    auto engine = weft::Engine::create(weft::EngineConfig{});
    const weft::Device cpu = weft::Device::cpu(0);
    auto model = weft::nn::gpt(*engine, config, cpu, 1);
    std::mt19937 rng(29);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (weft::nn::Parameter* p : model->parameters()) {
      const bool norm_weight = p->name.find("ln_") != std::string::npos && p->name.ends_with(".weight");
      std::vector<float> v(static_cast<std::size_t>(p->value.numel()));
      for (float& x : v) x = norm_weight ? 1.0f + u(rng) / 2.0f : u(rng);
      p->value.copy_from(weft::Tensor::from_host(*engine, p->value.shape(), v, cpu));
    }
    std::uniform_int_distribution<int> id(0, static_cast<int>(config.vocab) - 1);
    std::vector<float> ids(static_cast<std::size_t>(b * t)), targets(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<float>(id(rng));
      targets[i] = static_cast<float>(id(rng));
    }
    const weft::Shape bt{b, t};
    std::vector<weft::checkpoint::HostTensor> out;
    for (weft::nn::Parameter* p : model->parameters()) out.push_back(host("param." + p->name, p->value.shape(), p->value.to_host()));
    const weft::Tensor logits = model->forward(weft::Tensor::from_host(*engine, bt, ids, cpu));
    const weft::ops::SoftmaxCrossEntropy l = weft::nn::lm_loss(logits, weft::Tensor::from_host(*engine, bt, targets, cpu));
    model->backward(l.dlogits);
    for (weft::nn::Parameter* p : model->parameters()) out.push_back(host("grad." + p->name, p->grad.shape(), p->grad.to_host()));
    out.push_back(host("ids", bt, ids));
    out.push_back(host("targets", bt, targets));
    out.push_back(host("logits", logits.shape(), logits.to_host()));
    out.push_back(host("loss", weft::Shape{1}, {l.loss.item()}));
    weft::checkpoint::write_safetensors(argv[1], out,
                                        {{"vocab", std::to_string(config.vocab)},
                                         {"context", std::to_string(config.context)},
                                         {"layers", std::to_string(config.layers)},
                                         {"heads", std::to_string(config.heads)},
                                         {"width", std::to_string(config.width)},
                                         {"config", config.describe()}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
  return 0;
}
