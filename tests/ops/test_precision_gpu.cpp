// Half precision on GPUs: every op of the mixed-precision path in bfloat16
// and float16 on gpu(0) against the same op on cpu(0) of the same engine (on
// simulated GPUs the very same kernels: equal; on CUDA, cuBLAS / cuDNN / the
// CUDA kernels: within a few units of the dtype), TF32 GEMMs, the loss-scaling
// ops, and LeNet's gradients under each precision. Each scenario over the
// naive engine and the threaded one at several worker counts.
#include <limits>

#include "gpu_test_util.h"
#include "weft/nn.h"
#include "weft/precision.h"

using namespace gputest;
namespace ops = weft::ops;
using weft::DType;

namespace {

double half_unit(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0x1p-20; }

// Both outputs within k units of t times their magnitude.
void expect_gpu_matches_cpu(const Tensor& gpu_out, const Tensor& cpu_out, double k, const std::string& what) {
  INFO(what << " in " << weft::to_string(cpu_out.dtype()));
  CHECK(gpu_out.dtype() == cpu_out.dtype());
  CHECK(gpu_out.device().is_gpu());
  const std::vector<float> got = gpu_out.to_host(), want = cpu_out.to_host();
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  const double tol = simulated() ? 0.0 : k * half_unit(cpu_out.dtype()) * scale;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(static_cast<double>(got[i]) - want[i]) > tol) {
      FAIL_CHECK("element " << i << ": gpu " << got[i] << ", cpu " << want[i] << " (tolerance " << tol << ")");
      return;
    }
}

Tensor precision_data(Engine& e, Device d, const Shape& s, std::uint64_t seed, DType t) {
  return Tensor::from_host(e, s, random_values(static_cast<std::size_t>(s.numel()), seed), d, t);
}

}  // namespace

TEST_CASE("gpu precision - half ops on a GPU equal the CPU's") {
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [](Engine& e) {
    const Device g = Device::gpu(0), c = Device::cpu(0);
    for (DType t : {DType::bfloat16, DType::float16}) {
      auto both = [&](auto make, double k, const std::string& what) {
        expect_gpu_matches_cpu(make(g), make(c), k, what);
      };
      both([&](Device d) { return ops::cast(precision_data(e, d, Shape{1001}, 1, DType::float32), t); }, 0, "cast");
      both([&](Device d) { return ops::cast(precision_data(e, d, Shape{77}, 1, t), DType::float32); }, 0, "cast back");
      both([&](Device d) { return ops::add(precision_data(e, d, Shape{300}, 2, t), precision_data(e, d, Shape{300}, 3, t)); }, 0, "add");
      both([&](Device d) { return ops::relu_grad(precision_data(e, d, Shape{300}, 2, t), precision_data(e, d, Shape{300}, 3, t)); }, 0,
           "relu_grad");
      both([&](Device d) { return ops::scale_by(precision_data(e, d, Shape{50}, 4, t), Tensor::full(e, Shape{1}, 8.0f, d)); }, 0,
           "scale_by");
      both([&](Device d) { return ops::sum(precision_data(e, d, Shape{5000}, 5, t)); }, 2, "sum");
      both([&](Device d) { return ops::matmul(precision_data(e, d, Shape{33, 70}, 6, t), precision_data(e, d, Shape{70, 19}, 7, t)); }, 4,
           "matmul");
      both([&](Device d) { return ops::matmul(precision_data(e, d, Shape{70, 33}, 6, t), precision_data(e, d, Shape{19, 70}, 7, t), true, true); },
           4, "matmul transposed");
      both([&](Device d) {
        return ops::dense(precision_data(e, d, Shape{9, 40}, 8, t), precision_data(e, d, Shape{12, 40}, 9, t), precision_data(e, d, Shape{12}, 10, t));
      }, 4, "dense");
      both([&](Device d) {
        return ops::dense_backward(precision_data(e, d, Shape{9, 40}, 8, t), precision_data(e, d, Shape{12, 40}, 9, t),
                                   precision_data(e, d, Shape{9, 12}, 11, t)).dw;
      }, 4, "dense_backward dw");
      const ops::Conv2dParams p{1, 1};
      both([&](Device d) {
        return ops::conv2d(precision_data(e, d, Shape{4, 3, 10, 9}, 12, t), precision_data(e, d, Shape{8, 3, 3, 3}, 13, t),
                           precision_data(e, d, Shape{8}, 14, t), p);
      }, 4, "conv2d");
      both([&](Device d) {
        return ops::conv2d_backward_data(precision_data(e, d, Shape{4, 8, 10, 9}, 15, t), precision_data(e, d, Shape{8, 3, 3, 3}, 13, t),
                                         Shape{4, 3, 10, 9}, p);
      }, 4, "conv2d_backward_data");
      both([&](Device d) {
        return ops::conv2d_backward_filter(precision_data(e, d, Shape{4, 3, 10, 9}, 12, t), precision_data(e, d, Shape{4, 8, 10, 9}, 15, t),
                                           Shape{8, 3, 3, 3}, p).dw;
      }, 8, "conv2d_backward_filter");
      both([&](Device d) { return ops::max_pool2d(precision_data(e, d, Shape{2, 3, 8, 8}, 16, t), {3, 2, 1}); }, 0, "max_pool2d");
      both([&](Device d) { return ops::avg_pool2d(precision_data(e, d, Shape{2, 3, 8, 8}, 16, t), {2, 2, 0}); }, 1, "avg_pool2d");
      both([&](Device d) { return ops::global_avg_pool2d(precision_data(e, d, Shape{2, 3, 8, 8}, 16, t)); }, 1, "global_avg_pool2d");
      both([&](Device d) {
        Tensor rm = Tensor::zeros(e, Shape{3}, d), rv = Tensor::ones(e, Shape{3}, d);
        return ops::batch_norm_train(precision_data(e, d, Shape{4, 3, 5, 5}, 17, t), Tensor::ones(e, Shape{3}, d),
                                     Tensor::zeros(e, Shape{3}, d), rm, rv).y;
      }, 4, "batch_norm_train");
      both([&](Device d) {
        return ops::softmax_cross_entropy(precision_data(e, d, Shape{6, 10}, 18, t),
                                          Tensor::from_host(e, Shape{6}, std::vector<float>{0, 1, 2, 3, 9, 9}, d)).dlogits;
      }, 2, "softmax_cross_entropy");
    }
  });
}

TEST_CASE("gpu precision - TF32 GEMMs and the loss-scaling ops on a GPU") {
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [](Engine& e) {
    const Device g = Device::gpu(0), c = Device::cpu(0);
    {
      ops::AllowTf32 on;
      Tensor a = precision_data(e, g, Shape{40, 50}, 1, DType::float32), b = precision_data(e, g, Shape{50, 30}, 2, DType::float32);
      expect_gpu_matches_cpu(ops::matmul(a, b), ops::matmul(a.copy_to(c), b.copy_to(c)), 40, "tf32 matmul");
    }
    Tensor scale = Tensor::full(e, Shape{1}, 4.0f, g), tracker = Tensor::zeros(e, Shape{1}, g), skipped = Tensor::zeros(e, Shape{1}, g);
    Tensor grad = Tensor::from_host(e, Shape{3}, std::vector<float>{4, 8, -12}, g);
    Tensor bad = Tensor::from_host(e, Shape{2}, std::vector<float>{1, std::numeric_limits<float>::quiet_NaN()}, g);
    Tensor found = ops::unscale_and_check({grad}, scale);
    CHECK(found.item() == 0.0f);
    CHECK(grad.to_host() == std::vector<float>{1, 2, -3});
    Tensor w = Tensor::ones(e, Shape{3}, g);
    ops::sgd_update(w, grad, 1.0f, 0.0f, found);
    CHECK(w.to_host() == std::vector<float>{0, -1, 4});
    Tensor found2 = ops::unscale_and_check({grad, bad}, scale);
    CHECK(found2.item() == 1.0f);
    ops::sgd_update(w, grad, 1.0f, 0.0f, found2);
    CHECK(w.to_host() == std::vector<float>{0, -1, 4});
    ops::update_loss_scale(scale, tracker, skipped, found2, {2.0f, 0.5f, 1});
    ops::update_loss_scale(scale, tracker, skipped, found, {2.0f, 0.5f, 1});
    ops::update_loss_scale(scale, tracker, skipped, found, {2.0f, 0.5f, 1});
    CHECK(scale.item() == 8.0f);
    CHECK(skipped.item() == 1.0f);
  });
}

TEST_CASE("gpu precision - LeNet's gradients under each precision on a GPU equal the CPU's") {
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [](Engine& e) {
    const std::vector<float> xs = random_values(4 * 28 * 28, 3);
    for (weft::Precision p : {weft::Precision::tf32, weft::Precision::bf16, weft::Precision::fp16}) {
      INFO(weft::to_string(p));
      std::vector<Tensor> grads;
      for (Device d : {Device::gpu(0), Device::cpu(0)}) {
        auto net = weft::nn::lenet(e, d, 1);
        net->set_precision(p);
        Tensor logits = net->forward(Tensor::from_host(e, Shape{4, 1, 28, 28}, xs, d));
        const auto ce = ops::softmax_cross_entropy(ops::cast(logits, DType::float32),
                                                   Tensor::from_host(e, Shape{4}, std::vector<float>{1, 2, 3, 4}, d));
        net->backward(ce.dlogits);
        grads.push_back(net->parameters()[0]->grad);
      }
      CHECK(grads[0].dtype() == DType::float32);
      const std::vector<float> a = grads[0].to_host(), b = grads[1].to_host();
      double scale = 0, err = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        scale = std::max(scale, std::abs(static_cast<double>(b[i])));
        err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
      }
      CHECK(err <= (simulated() ? 0.0 : 0.05 * scale));
    }
  });
}

TEST_CASE("gpu precision - deterministic convolution algorithms repeat bitwise on a GPU") {
  WEFT_REQUIRE_GPU();
  const std::vector<float> xs = random_values(8 * 28 * 28, 5);
  for (weft::Precision p : {weft::Precision::fp32, weft::Precision::bf16}) {
    INFO(weft::to_string(p));
    for (const char* algo : {"deterministic", "benchmark+deterministic"}) {
      INFO(algo);
      std::vector<std::vector<float>> runs;
      for (int run = 0; run < 2; ++run) {
        auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .conv_algo = algo});
        auto net = weft::nn::lenet(*e, Device::gpu(0), 2);
        net->set_precision(p);
        for (int step = 0; step < 2; ++step) {
          Tensor logits = net->forward(Tensor::from_host(*e, Shape{8, 1, 28, 28}, xs, Device::gpu(0)));
          net->backward(ops::softmax_cross_entropy(
                            ops::cast(logits, DType::float32),
                            Tensor::from_host(*e, Shape{8}, std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}, Device::gpu(0)))
                            .dlogits);
          weft::nn::sgd_step(net->parameters(), 0.1f);
        }
        runs.push_back(net->parameters()[0]->value.to_host());
        net.reset();
        e->wait_all();
      }
      CHECK(runs[0] == runs[1]);
    }
  }
}
