// Channels-last memory format on a GPU: the conversion op, convolutions
// (forward, both backward halves; cuDNN's NHWC descriptors on CUDA),
// pooling and batch norm in NHWC against NCHW on the same GPU and against
// the CPU, in float32, bfloat16 and float16, and a ResNet-18 training step
// channels_last against NCHW. Simulated GPUs run the CPU kernels, which give
// pooling and batch norm NCHW's bits; on CUDA they agree within the dtype's
// rounding.
#include <cmath>

#include "gpu_test_util.h"
#include "ops/memory_format_util.h"
#include "weft/nn.h"

using namespace gputest;
using namespace weft_nhwc;
namespace nn = weft::nn;

namespace {

const DType kGpuDtypes[] = {DType::float32, DType::bfloat16, DType::float16};

// On CUDA, batch norm and pooling reduce in other orders per layout: a few
// units of the dtype's rounding (float32: of its own).
double gpu_tolerance(DType t) { return t == DType::float32 ? 1e-5 : 2 * rounding_of(t); }

}  // namespace

TEST_CASE("gpu memory format - to_channels_last on a GPU stores what the CPU's does, to_host reads NCHW order" *
          doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  for (const char* kind : {"naive", "threaded"}) {
    INFO("engine " << kind);
    auto e = make_engine({.kind = kind, .gpu_devices = 1});
    for (DType t : kGpuDtypes) {
      INFO(weft::to_string(t));
      const Shape s{2, 3, 5, 4};
      std::vector<float> v(static_cast<std::size_t>(s.numel()));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
      const Tensor g = channels_last(Tensor::from_host(*e, s, v, Device::gpu(0), t));
      CHECK(g.memory_format() == MemoryFormat::channels_last);
      check_bitwise(g.to_host(), v, "to_host of a channels_last GPU tensor");
      // Its bytes moved to the CPU as they are: the CPU reads them as NHWC too.
      const Tensor on_cpu = g.copy_to(Device::cpu(0));
      CHECK(on_cpu.memory_format() == MemoryFormat::channels_last);
      check_bitwise(ops::contiguous(on_cpu).to_host(), v, "the GPU's NHWC bytes read back on the CPU");
      check_bitwise(ops::contiguous(g).to_host(), v, "to_contiguous on the GPU");
    }
    e->wait_all();
  }
}

TEST_CASE("gpu memory format - convolutions in NHWC equal NCHW on the GPU and on the CPU" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  for (DType t : kGpuDtypes)
    for (const ConvCase& k : conv_cases()) {
      check_conv_case(*e, Device::gpu(0), t, k, rounding_of(t));
      // NHWC on the GPU against NCHW on the CPU.
      INFO("gpu NHWC vs cpu NCHW, " << k.str() << " " << weft::to_string(t));
      const Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c, k.k, k.k};
      const ops::Conv2dParams p{k.stride, k.pad};
      const std::vector<float> xv = host_values(xs.numel(), 71), wv = host_values(ws.numel(), 72);
      const Tensor xg = channels_last(Tensor::from_host(*e, xs, xv, Device::gpu(0), t));
      const Tensor wg = Tensor::from_host(*e, ws, wv, Device::gpu(0), t);
      const Tensor xc = Tensor::from_host(*e, xs, xv, Device::cpu(0), t);
      const Tensor wc = Tensor::from_host(*e, ws, wv, Device::cpu(0), t);
      check_near(ops::conv2d(xg, wg, Tensor(), p).to_host(), ops::conv2d(xc, wc, Tensor(), p).to_host(),
                 rounding_of(t), "conv2d gpu NHWC vs cpu NCHW");
    }
  e->wait_all();
}

TEST_CASE("gpu memory format - pooling and batch norm in NHWC equal NCHW" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  for (DType t : kGpuDtypes) check_pool_and_norm(*e, Device::gpu(0), t, simulated(), gpu_tolerance(t));
  e->wait_all();
}

namespace {

struct GpuSteps {
  std::vector<float> losses;
  std::vector<std::vector<float>> initial, params;
};

GpuSteps resnet_gpu_steps(Engine& e, MemoryFormat format) {
  const Device d = Device::gpu(0);
  auto net = nn::resnet18(e, d, 9, nn::ResNetOptions{.in_channels = 3, .classes = 4});
  net->set_memory_format(format);
  const Tensor x = Tensor::from_host(e, Shape{4, 3, 32, 32}, host_values(4 * 3 * 32 * 32, 73, 0.0f, 1.0f), d);
  const Tensor y = Tensor::from_host(e, Shape{4}, std::vector<float>{1, 3, 0, 2}, d);
  GpuSteps r;
  for (nn::Parameter* p : net->parameters()) r.initial.push_back(p->value.to_host());
  for (int s = 0; s < 2; ++s) {
    const ops::SoftmaxCrossEntropy sce = ops::softmax_cross_entropy(net->forward(x), y);
    net->backward(sce.dlogits);
    nn::sgd_step(net->parameters(), 0.01f);
    r.losses.push_back(sce.loss.item());
  }
  for (nn::Parameter* p : net->parameters()) r.params.push_back(p->value.to_host());
  return r;
}

}  // namespace

TEST_CASE("gpu memory format - a ResNet-18 training step channels_last equals NCHW" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  const GpuSteps want = resnet_gpu_steps(*e, MemoryFormat::contiguous);
  const GpuSteps got = resnet_gpu_steps(*e, MemoryFormat::channels_last);
  // Simulated GPUs run the CPU kernels: the CPU case's tolerances. cuDNN's
  // batch norm over a batch of 4 at small resolutions amplifies roundings
  // (test_resnet_gpu.cpp): on CUDA, looser.
  const bool sim = simulated();
  check_near(got.losses, want.losses, sim ? 1e-4 : 1e-2, "losses");
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t i = 0; i < want.params.size(); ++i)
    check_update(got.params[i], want.params[i], want.initial[i], sim ? 1e-3 : 1e-2, sim ? 0.1 : 0.2, 1e-5,
                 "parameter " + std::to_string(i));
  e->wait_all();
}
