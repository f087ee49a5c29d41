// Half precision on GPUs: every op of the mixed-precision path in bfloat16
// and float16 on gpu(0) against a float64 reference computed here in plain
// loops from the op's own (rounded) inputs, within the dtype's rounding
// (bfloat16: 2^-8 relative per rounding, float16: 2^-11) times a few units
// for the op, plus float32 accumulation over the reduction's length; TF32
// GEMMs, the loss-scaling ops, and LeNet's gradients under each precision
// against float32's on the CPU, and the kernels' packed and one-element paths
// (aligned and misaligned views, every tail length). On CUDA these are cuBLAS, cuDNN (convolutions,
// batch norm) and the CUDA kernels; on simulated GPUs the CPU kernels, which
// the same references check. Each scenario over the naive engine and the
// threaded one at several worker counts.
#include <limits>

#include "gpu_test_util.h"
#include "weft/nn.h"
#include "weft/precision.h"

using namespace gputest;
namespace ops = weft::ops;
using weft::DType;

namespace {

// The unit roundoff of a dtype (half its spacing relative to a power of two):
// bfloat16 keeps 8 significant bits, float16 11, TF32 11, float32 24.
double half_unit(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0x1p-24; }

using Ref = std::vector<double>;

Ref values_of(const Tensor& t) {
  const std::vector<float> v = t.to_host();
  return Ref(v.begin(), v.end());
}

// `got` within (k units of its dtype + `terms` float32 roundings) of the
// largest reference magnitude: k counts the roundings to the dtype an op may
// make (its output's, an intermediate's), `terms` the length of the longest
// sum behind an element (float32 accumulation). Returns the largest error in
// units of the dtype, for the message.
double expect_near_reference(const Tensor& got_t, const Ref& want, double k, std::int64_t terms,
                             const std::string& what) {
  INFO(what << " in " << weft::to_string(got_t.dtype()));
  CHECK(got_t.device().is_gpu());
  const std::vector<float> got = got_t.to_host();
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  const double u = half_unit(got_t.dtype());
  const double tol = (k * u + static_cast<double>(terms) * 0x1p-24) * scale;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, err);
    if (!(err <= tol)) {
      FAIL_CHECK("element " << i << ": gpu " << got[i] << ", float64 reference " << want[i] << " (tolerance " << tol
                            << ")");
      return worst / (u * std::max(scale, 1e-30));
    }
  }
  CHECK(scale > 0);  // a reference of zeros would prove nothing
  return worst / (u * std::max(scale, 1e-30));
}

Tensor precision_data(Engine& e, Device d, const Shape& s, std::uint64_t seed, DType t) {
  return Tensor::from_host(e, s, random_values(static_cast<std::size_t>(s.numel()), seed), d, t);
}

// C[m][n] = sum_k A(m, k) B(k, n), A and B read through index functions.
template <class A, class B>
Ref gemm_ref(std::int64_t m, std::int64_t n, std::int64_t kk, A a, B b) {
  Ref c(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (std::int64_t k = 0; k < kk; ++k) acc += a(i, k) * b(k, j);
      c[static_cast<std::size_t>(i * n + j)] = acc;
    }
  return c;
}

struct Nchw {
  std::int64_t n, c, h, w;
  std::size_t at(std::int64_t a, std::int64_t b, std::int64_t y, std::int64_t x) const {
    return static_cast<std::size_t>(((a * c + b) * h + y) * w + x);
  }
};

}  // namespace

TEST_CASE("gpu precision - half ops on a GPU match float64 references") {
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [](Engine& e) {
    const Device g = Device::gpu(0);
    for (DType t : {DType::bfloat16, DType::float16}) {
      auto data = [&](const Shape& s, std::uint64_t seed) { return precision_data(e, g, s, seed, t); };
      {
        const Tensor x = precision_data(e, g, Shape{1001}, 1, DType::float32);
        expect_near_reference(ops::cast(x, t), values_of(x), 1, 0, "cast");
        const Tensor h = data(Shape{77}, 1);
        expect_near_reference(ops::cast(h, DType::float32), values_of(h), 0, 0, "cast back");
      }
      const Tensor a = data(Shape{300}, 2), b = data(Shape{300}, 3);
      const Ref av = values_of(a), bv = values_of(b);
      {
        Ref sum(300), grad(300);
        for (std::size_t i = 0; i < 300; ++i) sum[i] = av[i] + bv[i], grad[i] = av[i] > 0 ? bv[i] : 0.0;
        expect_near_reference(ops::add(a, b), sum, 1, 0, "add");
        expect_near_reference(ops::relu_grad(a, b), grad, 0, 0, "relu_grad");
      }
      {
        const Tensor x = data(Shape{50}, 4);
        Ref want = values_of(x);
        for (double& v : want) v *= 8;
        expect_near_reference(ops::scale_by(x, Tensor::full(e, Shape{1}, 8.0f, g)), want, 0, 0, "scale_by");
      }
      {
        const Tensor x = data(Shape{5000}, 5);
        double acc = 0;
        for (double v : values_of(x)) acc += v;
        expect_near_reference(ops::sum(x), Ref{acc}, 2, 5000, "sum");
      }
      {
        const Tensor x = data(Shape{33, 70}, 6), w = data(Shape{70, 19}, 7);
        const Ref xv = values_of(x), wv = values_of(w);
        expect_near_reference(
            ops::matmul(x, w),
            gemm_ref(33, 19, 70, [&](auto i, auto k) { return xv[static_cast<std::size_t>(i * 70 + k)]; },
                     [&](auto k, auto j) { return wv[static_cast<std::size_t>(k * 19 + j)]; }),
            2, 70, "matmul");
        const Tensor xt = data(Shape{70, 33}, 6), wt = data(Shape{19, 70}, 7);
        const Ref xtv = values_of(xt), wtv = values_of(wt);
        expect_near_reference(
            ops::matmul(xt, wt, true, true),
            gemm_ref(33, 19, 70, [&](auto i, auto k) { return xtv[static_cast<std::size_t>(k * 33 + i)]; },
                     [&](auto k, auto j) { return wtv[static_cast<std::size_t>(j * 70 + k)]; }),
            2, 70, "matmul transposed");
      }
      {
        const Tensor x = data(Shape{9, 40}, 8), w = data(Shape{12, 40}, 9), bias = data(Shape{12}, 10),
                     dy = data(Shape{9, 12}, 11);
        const Ref xv = values_of(x), wv = values_of(w), bv2 = values_of(bias), dyv = values_of(dy);
        Ref y = gemm_ref(9, 12, 40, [&](auto i, auto k) { return xv[static_cast<std::size_t>(i * 40 + k)]; },
                         [&](auto k, auto j) { return wv[static_cast<std::size_t>(j * 40 + k)]; });
        for (std::size_t i = 0; i < y.size(); ++i) y[i] += bv2[i % 12];
        expect_near_reference(ops::dense(x, w, bias), y, 2, 41, "dense");
        expect_near_reference(
            ops::dense_backward(x, w, dy).dw,
            gemm_ref(12, 40, 9, [&](auto o, auto n) { return dyv[static_cast<std::size_t>(n * 12 + o)]; },
                     [&](auto n, auto k) { return xv[static_cast<std::size_t>(n * 40 + k)]; }),
            2, 9, "dense_backward dw");
      }
      {
        const ops::Conv2dParams p{1, 1};  // stride 1, pad 1: the output has the input's size
        const Nchw xs{4, 3, 10, 9}, ys{4, 8, 10, 9}, ws{8, 3, 3, 3};
        const Tensor x = data(Shape{4, 3, 10, 9}, 12), w = data(Shape{8, 3, 3, 3}, 13), bias = data(Shape{8}, 14),
                     dy = data(Shape{4, 8, 10, 9}, 15);
        const Ref xv = values_of(x), wv = values_of(w), bv2 = values_of(bias), dyv = values_of(dy);
        Ref y(static_cast<std::size_t>(4 * 8 * 10 * 9)), dx(xv.size()), dw(wv.size());
        for (std::int64_t n = 0; n < 4; ++n)
          for (std::int64_t o = 0; o < 8; ++o)
            for (std::int64_t oy = 0; oy < 10; ++oy)
              for (std::int64_t ox = 0; ox < 9; ++ox) {
                double acc = bv2[static_cast<std::size_t>(o)];
                for (std::int64_t c = 0; c < 3; ++c)
                  for (std::int64_t ky = 0; ky < 3; ++ky)
                    for (std::int64_t kx = 0; kx < 3; ++kx) {
                      const std::int64_t iy = oy - 1 + ky, ix = ox - 1 + kx;
                      if (iy < 0 || iy >= 10 || ix < 0 || ix >= 9) continue;
                      acc += xv[xs.at(n, c, iy, ix)] * wv[ws.at(o, c, ky, kx)];
                      dx[xs.at(n, c, iy, ix)] += dyv[ys.at(n, o, oy, ox)] * wv[ws.at(o, c, ky, kx)];
                      dw[ws.at(o, c, ky, kx)] += dyv[ys.at(n, o, oy, ox)] * xv[xs.at(n, c, iy, ix)];
                    }
                y[ys.at(n, o, oy, ox)] = acc;
              }
        expect_near_reference(ops::conv2d(x, w, bias, p), y, 4, 28, "conv2d");
        expect_near_reference(ops::conv2d_backward_data(dy, w, Shape{4, 3, 10, 9}, p), dx, 4, 72, "conv2d_backward_data");
        expect_near_reference(ops::conv2d_backward_filter(x, dy, Shape{8, 3, 3, 3}, p).dw, dw, 4, 360,
                              "conv2d_backward_filter");
      }
      {
        const Nchw xs{2, 3, 8, 8};
        const Tensor x = data(Shape{2, 3, 8, 8}, 16);
        const Ref xv = values_of(x);
        Ref mx, avg, gap;
        for (std::int64_t n = 0; n < 2; ++n)
          for (std::int64_t c = 0; c < 3; ++c) {
            for (std::int64_t oy = 0; oy < 4; ++oy)  // kernel 3, stride 2, pad 1: (8 + 2 - 3) / 2 + 1 = 4
              for (std::int64_t ox = 0; ox < 4; ++ox) {
                double m = -std::numeric_limits<double>::infinity();
                for (std::int64_t ky = 0; ky < 3; ++ky)
                  for (std::int64_t kx = 0; kx < 3; ++kx) {
                    const std::int64_t iy = oy * 2 - 1 + ky, ix = ox * 2 - 1 + kx;
                    if (iy >= 0 && iy < 8 && ix >= 0 && ix < 8) m = std::max(m, xv[xs.at(n, c, iy, ix)]);
                  }
                mx.push_back(m);
              }
            for (std::int64_t oy = 0; oy < 4; ++oy)  // kernel 2, stride 2
              for (std::int64_t ox = 0; ox < 4; ++ox) {
                double s = 0;
                for (std::int64_t ky = 0; ky < 2; ++ky)
                  for (std::int64_t kx = 0; kx < 2; ++kx) s += xv[xs.at(n, c, oy * 2 + ky, ox * 2 + kx)];
                avg.push_back(s / 4);
              }
            double s = 0;
            for (std::int64_t i = 0; i < 64; ++i) s += xv[xs.at(n, c, 0, 0) + static_cast<std::size_t>(i)];
            gap.push_back(s / 64);
          }
        expect_near_reference(ops::max_pool2d(x, {3, 2, 1}), mx, 0, 0, "max_pool2d");
        expect_near_reference(ops::avg_pool2d(x, {2, 2, 0}), avg, 1, 4, "avg_pool2d");
        expect_near_reference(ops::global_avg_pool2d(x), gap, 1, 64, "global_avg_pool2d");
      }
      {
        const Nchw xs{4, 3, 5, 5};
        const Tensor x = data(Shape{4, 3, 5, 5}, 17);
        const Ref xv = values_of(x);
        Ref y(xv.size());
        for (std::int64_t c = 0; c < 3; ++c) {
          double mean = 0, var = 0;
          for (std::int64_t n = 0; n < 4; ++n)
            for (std::int64_t i = 0; i < 25; ++i) mean += xv[xs.at(n, c, 0, 0) + static_cast<std::size_t>(i)];
          mean /= 100;
          for (std::int64_t n = 0; n < 4; ++n)
            for (std::int64_t i = 0; i < 25; ++i) {
              const double d = xv[xs.at(n, c, 0, 0) + static_cast<std::size_t>(i)] - mean;
              var += d * d;
            }
          var /= 100;  // biased: the batch's own
          const double inv = 1 / std::sqrt(var + 1e-5);
          for (std::int64_t n = 0; n < 4; ++n)
            for (std::int64_t i = 0; i < 25; ++i) {
              const std::size_t at = xs.at(n, c, 0, 0) + static_cast<std::size_t>(i);
              y[at] = (xv[at] - mean) * inv;
            }
        }
        Tensor rm = Tensor::zeros(e, Shape{3}, g), rv = Tensor::ones(e, Shape{3}, g);
        expect_near_reference(
            ops::batch_norm_train(x, Tensor::ones(e, Shape{3}, g), Tensor::zeros(e, Shape{3}, g), rm, rv).y, y, 4,
            100, "batch_norm_train");
      }
      {
        const Tensor logits = data(Shape{6, 10}, 18);
        const std::vector<float> labels{0, 1, 2, 3, 9, 9};
        const Ref z = values_of(logits);
        Ref d(z.size());
        for (std::size_t r = 0; r < 6; ++r) {
          double zmax = z[r * 10], denom = 0;
          for (std::size_t j = 0; j < 10; ++j) zmax = std::max(zmax, z[r * 10 + j]);
          for (std::size_t j = 0; j < 10; ++j) denom += std::exp(z[r * 10 + j] - zmax);
          for (std::size_t j = 0; j < 10; ++j)
            d[r * 10 + j] =
                (std::exp(z[r * 10 + j] - zmax) / denom - (static_cast<float>(j) == labels[r] ? 1.0 : 0.0)) / 6;
        }
        expect_near_reference(ops::softmax_cross_entropy(logits, Tensor::from_host(e, Shape{6}, labels, g)).dlogits, d,
                              2, 10, "softmax_cross_entropy");
      }
    }
  });
}

TEST_CASE("gpu precision - TF32 GEMMs and the loss-scaling ops on a GPU") {
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [](Engine& e) {
    const Device g = Device::gpu(0);
    {
      ops::AllowTf32 on;
      Tensor a = precision_data(e, g, Shape{40, 50}, 1, DType::float32), b = precision_data(e, g, Shape{50, 30}, 2, DType::float32);
      // TF32 rounds each input to 11 significant bits: each product within
      // 2 x 2^-11 of its value, the sum within that of the sum of |products|.
      const Ref av = values_of(a), bv = values_of(b);
      const Ref want = gemm_ref(40, 30, 50, [&](auto i, auto k) { return av[static_cast<std::size_t>(i * 50 + k)]; },
                                [&](auto k, auto j) { return bv[static_cast<std::size_t>(k * 30 + j)]; });
      const Ref l1 = gemm_ref(40, 30, 50, [&](auto i, auto k) { return std::abs(av[static_cast<std::size_t>(i * 50 + k)]); },
                              [&](auto k, auto j) { return std::abs(bv[static_cast<std::size_t>(k * 30 + j)]); });
      const std::vector<float> got = ops::matmul(a, b).to_host();
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("tf32 matmul, element " << i << ": gpu " << got[i] << ", float64 reference " << want[i]);
        CHECK(std::abs(static_cast<double>(got[i]) - want[i]) <= (2 * 0x1p-11 + 50 * 0x1p-24) * l1[i]);
      }
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

// The reference is LeNet's float32 gradients on the CPU; each reduced
// precision on the GPU is within its dtype's error of them, as a relative L2
// distance over the first layer's weight gradient (on simulated GPUs, the CPU
// kernels: tf32 0.012, bf16 0.19, fp16 0.012; the bounds leave room for
// cuDNN's and cuBLAS's other orders, and a wrong kernel lands near 1).
TEST_CASE("gpu precision - LeNet's gradients under each precision on a GPU match float32's on the CPU") {
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [](Engine& e) {
    const std::vector<float> xs = random_values(4 * 28 * 28, 3);
    for (weft::Precision p : {weft::Precision::tf32, weft::Precision::bf16, weft::Precision::fp16}) {
      INFO(weft::to_string(p));
      std::vector<Tensor> grads;
      for (Device d : {Device::gpu(0), Device::cpu(0)}) {
        auto net = weft::nn::lenet(e, d, 1);
        net->set_precision(d.is_gpu() ? p : weft::Precision::fp32);
        Tensor logits = net->forward(Tensor::from_host(e, Shape{4, 1, 28, 28}, xs, d));
        const auto ce = ops::softmax_cross_entropy(ops::cast(logits, DType::float32),
                                                   Tensor::from_host(e, Shape{4}, std::vector<float>{1, 2, 3, 4}, d));
        net->backward(ce.dlogits);
        grads.push_back(net->parameters()[0]->grad);
      }
      CHECK(grads[0].dtype() == DType::float32);
      const std::vector<float> a = grads[0].to_host(), b = grads[1].to_host();
      REQUIRE(a.size() == b.size());
      double diff2 = 0, norm2 = 0;  // relative L2 distance: every element counts, none alone decides
      for (std::size_t i = 0; i < a.size(); ++i) {
        const double d = static_cast<double>(a[i]) - b[i];
        diff2 += d * d;
        norm2 += static_cast<double>(b[i]) * b[i];
      }
      const double rel = std::sqrt(diff2 / norm2);
      const double bound = p == weft::Precision::bf16 ? 0.25 : p == weft::Precision::fp16 ? 0.04 : 0.04;
      MESSAGE(weft::to_string(p) << ": gradient within " << rel << " (relative L2) of float32's on the CPU");
      CHECK(norm2 > 0);
      CHECK(rel <= bound);
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

TEST_CASE("gpu precision - packed and one-element kernel paths: views at odd offsets and lengths with tails match "
          "float64 references") {
  // The CUDA kernels move 16 bytes per access when every pointer of a call is
  // 16-byte aligned, with a one-by-one tail for the last n % 8 (halves) or
  // n % 4 (float32) elements, and one element per access otherwise: views at
  // offsets 1, 3 and 5 take the latter, offset 0 and 8 the former, and the
  // lengths leave every tail size. Softmax rows of 13 columns start
  // misaligned, rows of 16 aligned. Each result against a float64 reference
  // computed here from the view's own values.
  WEFT_REQUIRE_GPU();
  with_each_gpu_engine(1, [](Engine& e) {
    const Device g = Device::gpu(0);
    for (DType t : {DType::bfloat16, DType::float16, DType::float32}) {
      for (std::int64_t offset : {0, 1, 3, 5, 8}) {
        for (std::int64_t n : {1, 7, 8, 9, 15, 1003, 4096}) {
          const std::string at = ", offset " + std::to_string(offset) + ", " + std::to_string(n) + " elements";
          const auto view = [&](std::uint64_t draw) {
            return precision_data(e, g, Shape{offset + n + 9}, draw, t).view(offset, Shape{n});
          };
          const Tensor a = view(1), b = view(2), c = view(4), d = view(5);
          const Ref av = values_of(a), bv = values_of(b), cv = values_of(c), dv = values_of(d);
          const auto n_ = static_cast<std::size_t>(n);
          Ref sum(n_), prod(n_), scaled(n_), relu(n_), grad(n_);
          double total = 0;
          for (std::size_t i = 0; i < n_; ++i) {
            sum[i] = av[i] + bv[i];
            prod[i] = av[i] * bv[i];
            scaled[i] = av[i] * static_cast<double>(0.37f);
            relu[i] = std::max(cv[i], 0.0);
            grad[i] = cv[i] > 0 ? dv[i] : 0.0;
            total += av[i];
          }
          // Data of one sign could leave a relu of zeros (which proves nothing):
          // the reference of relu and relu_grad is checked only when nonzero.
          const bool any_positive = std::any_of(cv.begin(), cv.end(), [](double v) { return v > 0; });
          expect_near_reference(ops::add(a, b), sum, 1, 0, "add" + at);
          expect_near_reference(ops::mul(a, b), prod, 1, 0, "mul" + at);
          expect_near_reference(ops::mul_scalar(a, 0.37f), scaled, 1, 0, "mul_scalar" + at);
          if (any_positive) {
            expect_near_reference(ops::relu(c), relu, 0, 0, "relu" + at);
            expect_near_reference(ops::relu_grad(c, d), grad, 0, 0, "relu_grad" + at);
          }
          const DType to = t == DType::float32 ? DType::bfloat16 : DType::float32;
          expect_near_reference(ops::cast(a, to), av, to == DType::float32 ? 0 : 1, 0, "cast" + at);
          // The sum's tolerance is relative to |sum|: bound it by the sum of
          // magnitudes instead, as float32 accumulation errs in proportion.
          double magnitude = 0;
          for (double v : av) magnitude += std::abs(v);
          const std::vector<float> got = ops::sum(a).to_host();
          CHECK_MESSAGE(std::abs(got[0] - total) <= (2 * half_unit(t) + static_cast<double>(n) * 0x1p-24) * magnitude,
                        "sum" << at << " in " << weft::to_string(t) << ": gpu " << got[0] << ", float64 " << total);
        }
      }
      for (std::int64_t cols : {13, 16}) {
        const std::size_t rows = 37, k = static_cast<std::size_t>(cols);
        const Tensor logits = precision_data(e, g, Shape{37, cols}, 8, t);
        const std::vector<float> labels(rows, static_cast<float>(cols - 2));
        const Ref z = values_of(logits);
        Ref d(z.size());
        double loss = 0;
        for (std::size_t r = 0; r < rows; ++r) {
          double zmax = z[r * k], denom = 0;
          for (std::size_t j = 0; j < k; ++j) zmax = std::max(zmax, z[r * k + j]);
          for (std::size_t j = 0; j < k; ++j) denom += std::exp(z[r * k + j] - zmax);
          loss += (std::log(denom) + zmax - z[r * k + static_cast<std::size_t>(labels[r])]) / static_cast<double>(rows);
          for (std::size_t j = 0; j < k; ++j)
            d[r * k + j] = (std::exp(z[r * k + j] - zmax) / denom - (static_cast<float>(j) == labels[r] ? 1.0 : 0.0)) /
                           static_cast<double>(rows);
        }
        const ops::SoftmaxCrossEntropy ce = ops::softmax_cross_entropy(logits, Tensor::from_host(e, Shape{37}, labels, g));
        const std::string what = "softmax_cross_entropy, " + std::to_string(cols) + " columns";
        expect_near_reference(ce.loss, Ref{loss}, 4, 100, what + ": loss");
        expect_near_reference(ce.dlogits, d, 2, cols, what + ": dlogits");
      }
    }
  });
}
