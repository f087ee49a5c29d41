// weft::optim on GPUs: each algorithm's step over parameters spread on two
// GPUs (one foreach op per GPU, and per-parameter ops) equals the same step on
// a CPU device bitwise (simulated GPUs run the CPU kernel; the CUDA kernels
// compute the same IEEE operations, optim_math.h), with device-side skip
// flags and gradient scales; the squared gradient norm and the clipping
// coefficient against the CPU's (the norm's double sums in another order on
// CUDA: within 1e-6 relative there).
#include <string>

#include "gpu_test_util.h"
#include "weft/nn.h"
#include "weft/optim.h"

using namespace gputest;
namespace nn = weft::nn;
namespace optim = weft::optim;

namespace {

const std::vector<Shape>& optim_gpu_shapes() {
  static const std::vector<Shape> shapes{Shape{6, 5}, Shape{6}, Shape{70000}, Shape{3, 3, 2, 2}, Shape{1}};
  return shapes;
}

struct OptimGpuModel {
  std::vector<std::unique_ptr<nn::Parameter>> params;
  std::vector<nn::Parameter*> list() const {
    std::vector<nn::Parameter*> out;
    for (const auto& p : params) out.push_back(p.get());
    return out;
  }
};

// Parameter k on devices[k % devices.size()].
OptimGpuModel optim_gpu_model(Engine& e, const std::vector<Device>& devices) {
  OptimGpuModel m;
  for (std::size_t k = 0; k < optim_gpu_shapes().size(); ++k) {
    const Shape& s = optim_gpu_shapes()[k];
    auto p = std::make_unique<nn::Parameter>();
    p->name = std::string{'p', static_cast<char>('0' + k)};  // p0, p1, ... (fewer than 10)
    p->value = Tensor::from_host(e, s, random_values(static_cast<std::size_t>(s.numel()), 10 + k),
                                 devices[k % devices.size()]);
    m.params.push_back(std::move(p));
  }
  return m;
}

void optim_gpu_set_grads(Engine& e, OptimGpuModel& m, std::int64_t t) {
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    nn::Parameter& p = *m.params[k];
    p.grad = Tensor::from_host(e, p.value.shape(),
                               random_values(static_cast<std::size_t>(p.value.numel()), 1000 + 37 * t + k, -2, 2),
                               p.value.device());
  }
}

std::vector<std::vector<float>> optim_gpu_snapshot(optim::Optimizer& opt) {
  std::vector<std::vector<float>> out;
  for (nn::Parameter* p : opt.parameters()) out.push_back(p->value.to_host());
  for (nn::Buffer* b : opt.state()) out.push_back(b->value.to_host());
  return out;
}

std::vector<Device> optim_gpus() {
  std::vector<Device> gpus{Device::gpu(0)};
  if (weft::gpu::device_count() > 1) gpus.push_back(Device::gpu(1));
  return gpus;
}

}  // namespace

TEST_CASE("gpu optim - each algorithm's step on GPUs equals the CPU device's bitwise" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  const int gpus = static_cast<int>(optim_gpus().size());
  std::vector<optim::OptimizerOptions> cases{optim::OptimizerOptions::sgd(0.05f, 0.0f, 1e-2f),
                                             optim::OptimizerOptions::sgd(0.02f, 0.9f, 1e-3f),
                                             optim::OptimizerOptions::sgd(0.02f, 0.9f, 0.0f, true),
                                             optim::OptimizerOptions::adam(1e-3f, 1e-2f),
                                             optim::OptimizerOptions::adamw(1e-3f, 1e-2f)};
  cases[1].dampening = 0.1f;
  with_each_gpu_engine(gpus, [&](Engine& e) {
    for (const optim::OptimizerOptions& base : cases) {
      for (bool foreach : {true, false}) {
        optim::OptimizerOptions o = base;
        o.foreach = foreach;
        INFO(o.str());
        OptimGpuModel g = optim_gpu_model(e, optim_gpus()), c = optim_gpu_model(e, {Device::cpu(0)});
        optim::Optimizer on_gpus(g.list(), o), on_cpu(c.list(), o);
        for (std::int64_t t = 0; t < 6; ++t) {
          optim_gpu_set_grads(e, g, t);
          optim_gpu_set_grads(e, c, t);
          // Step 2 skipped on every device; from step 3 the gradients are halved.
          optim::StepInputs gi, ci;
          for (const Device& d : optim_gpus()) {
            gi.skip.push_back(Tensor::full(e, Shape{1}, t == 2 ? 1.0f : 0.0f, d));
            if (t >= 3) gi.grad_scale.push_back(Tensor::full(e, Shape{1}, 0.5f, d));
          }
          ci.skip.push_back(Tensor::full(e, Shape{1}, t == 2 ? 1.0f : 0.0f, Device::cpu(0)));
          if (t >= 3) ci.grad_scale.push_back(Tensor::full(e, Shape{1}, 0.5f, Device::cpu(0)));
          const float lr = o.lr * (1.0f - 0.05f * static_cast<float>(t));
          on_gpus.step(lr, gi);
          on_cpu.step(lr, ci);
        }
        for (nn::Buffer* b : on_gpus.state()) CHECK(b->value.device().is_gpu());
        CHECK(optim_gpu_snapshot(on_gpus) == optim_gpu_snapshot(on_cpu));
        if (!o.state_names().empty()) CHECK(on_gpus.state().back()->value.item() == 5.0f);  // one step skipped
      }
    }
  });
}

TEST_CASE("gpu optim - the squared gradient norm and the clipping coefficient on a GPU" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [&](Engine& e) {
    OptimGpuModel g = optim_gpu_model(e, {Device::gpu(0)}), c = optim_gpu_model(e, {Device::cpu(0)});
    optim_gpu_set_grads(e, g, 0);
    optim_gpu_set_grads(e, c, 0);
    std::vector<Tensor> gg, cg;
    for (std::size_t k = 0; k < g.params.size(); ++k) {
      gg.push_back(g.params[k]->grad);
      cg.push_back(c.params[k]->grad);
    }
    const Tensor gn = optim::grad_norm_squared(gg), cn = optim::grad_norm_squared(cg);
    CHECK(gn.device() == Device::gpu(0));
    const float got = gn.item(), want = cn.item();
    // Against a float64 sum of squares of the same gradients (the GPU's
    // values: on simulated GPUs its kernel is the CPU's, so comparing the
    // two devices alone would prove nothing there).
    double ref = 0;
    for (const Tensor& t : gg)
      for (float v : t.to_host()) ref += static_cast<double>(v) * v;
    CHECK(ref > 0);
    CHECK(std::abs(static_cast<double>(got) - ref) <= 1e-6 * ref);
    CHECK(std::abs(got - want) <= 1e-6f * want);
    for (float max_norm : {1.0f, 1e6f}) {
      INFO("max_norm " << max_norm);
      // The same norm on both: the coefficient is the same IEEE operations.
      const Tensor same = Tensor::full(e, Shape{1}, want, Device::gpu(0));
      CHECK(optim::clip_coefficient(same, max_norm).item() == optim::clip_coefficient(cn, max_norm).item());
    }
    CHECK(optim::clip_coefficient(cn, 1e6f).item() == 1.0f);
  });
}
