// Causal attention on a GPU: on simulated GPUs the CPU kernel runs as
// stream-ordered work, checked here against float64 references of the
// forward, lse and all three gradients (computed from the full masked
// softmax); on CUDA, where no kernel exists yet, the op is refused at push
// with an error naming it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "weft/dtype.h"
#include "weft/nn_ops.h"

namespace {

using weft::DType;
namespace ops = weft::ops;
using i64 = std::int64_t;

double roundoff(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0x1p-24; }

// Float64 forward and backward of one plane: P (t x t, masked softmax),
// out = P v, lse, and for dout: dv = P^T dout, ds = P * (dout v^T - delta)
// with delta_i = sum_j P_ij (dout v^T)_ij, dq = scale ds k, dk = scale ds^T q.
struct PlaneGrads {
  std::vector<double> out, lse, dq, dk, dv;
};
PlaneGrads reference(const float* q, const float* k, const float* v, const float* dout, i64 t, i64 d, double scale) {
  const auto n = static_cast<std::size_t>(t * d);
  PlaneGrads r{std::vector<double>(n), std::vector<double>(static_cast<std::size_t>(t)), std::vector<double>(n),
               std::vector<double>(n), std::vector<double>(n)};
  std::vector<double> p(static_cast<std::size_t>(t * t), 0.0), dp(static_cast<std::size_t>(t * t), 0.0);
  auto at = [t](std::vector<double>& m, i64 i, i64 j) -> double& { return m[static_cast<std::size_t>(i * t + j)]; };
  for (i64 i = 0; i < t; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (i64 j = 0; j <= i; ++j) {
      double s = 0;
      for (i64 c = 0; c < d; ++c) s += static_cast<double>(q[i * d + c]) * k[j * d + c];
      at(p, i, j) = s * scale;
      mx = std::max(mx, at(p, i, j));
    }
    double sum = 0;
    for (i64 j = 0; j <= i; ++j) sum += std::exp(at(p, i, j) - mx);
    r.lse[static_cast<std::size_t>(i)] = mx + std::log(sum);
    for (i64 j = 0; j <= i; ++j) at(p, i, j) = std::exp(at(p, i, j) - mx) / sum;
  }
  for (i64 i = 0; i < t; ++i) {
    double delta = 0;
    for (i64 j = 0; j <= i; ++j) {
      double s = 0;
      for (i64 c = 0; c < d; ++c) {
        r.out[static_cast<std::size_t>(i * d + c)] += at(p, i, j) * v[j * d + c];
        r.dv[static_cast<std::size_t>(j * d + c)] += at(p, i, j) * dout[i * d + c];
        s += static_cast<double>(dout[i * d + c]) * v[j * d + c];
      }
      at(dp, i, j) = s;
      delta += at(p, i, j) * s;
    }
    for (i64 j = 0; j <= i; ++j) {
      const double ds = at(p, i, j) * (at(dp, i, j) - delta) * scale;
      for (i64 c = 0; c < d; ++c) {
        r.dq[static_cast<std::size_t>(i * d + c)] += ds * k[j * d + c];
        r.dk[static_cast<std::size_t>(j * d + c)] += ds * q[i * d + c];
      }
    }
  }
  return r;
}

// Relative to 1 + |want|, the largest difference.
double worst(const std::vector<float>& got, const std::vector<double>& want, i64 off) {
  double w = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    w = std::max(w, std::abs(got[static_cast<std::size_t>(off) + i] - want[i]) / (1.0 + std::abs(want[i])));
  return w;
}

}  // namespace

TEST_CASE("gpu attention - causal attention on a GPU matches float64 references") {
  WEFT_REQUIRE_GPU();
  const i64 b = 2, h = 2, t = 70, d = 16;
  const weft::Shape s{b, h, t, d};
  const auto n = static_cast<std::size_t>(s.numel());
  const float scale = 0.25f;
  if (!gputest::simulated()) {
    auto e = gputest::make_engine({.gpu_devices = 1});
    const weft::Tensor q = weft::Tensor::zeros(*e, s, weft::Device::gpu(0));
    try {
      ops::causal_attention(q, q, q, scale);
      FAIL("causal_attention on a CUDA GPU was not refused");
    } catch (const weft::Error& err) {
      CHECK(std::string(err.what()).find("causal_attention: no CUDA kernel") != std::string::npos);
    }
    return;
  }
  gputest::with_each_gpu_engine(1, [&](weft::Engine& e) {
    const weft::Device g = weft::Device::gpu(0);
    for (DType dt : {DType::float32, DType::bfloat16}) {
      const std::string dtype_name(weft::to_string(dt));
      CAPTURE(dtype_name);
      std::vector<float> host[4];
      weft::Tensor in[4];
      for (int x = 0; x < 4; ++x) {
        in[x] = weft::Tensor::from_host(e, s, gputest::random_values(n, 50 + static_cast<std::uint64_t>(x)), g, dt);
        host[x] = in[x].to_host();  // the values the dtype holds
      }
      ops::CausalAttention a = ops::causal_attention(in[0], in[1], in[2], scale);
      ops::CausalAttentionGrads gr = ops::causal_attention_backward(in[0], in[1], in[2], a.out, in[3], a.lse, scale);
      const std::vector<float> out = a.out.to_host(), lse = a.lse.to_host(), dq = gr.dq.to_host(),
                               dk = gr.dk.to_host(), dv = gr.dv.to_host();
      // float32 arithmetic (forward; backward over its rounded out), and
      // the half's rounding of each output.
      const double tol = 1e-5 + (dt == DType::float32 ? 0.0 : 2 * roundoff(dt));
      const double tol_grad = dt == DType::float32 ? 1e-5 : 8 * roundoff(dt);
      for (i64 p = 0; p < b * h; ++p) {
        const i64 off = p * t * d;
        const PlaneGrads r = reference(host[0].data() + off, host[1].data() + off, host[2].data() + off,
                                       host[3].data() + off, t, d, scale);
        CAPTURE(p);
        CHECK(worst(out, r.out, off) <= tol);
        CHECK(worst(lse, r.lse, p * t) <= 1e-5);
        CHECK(worst(dq, r.dq, off) <= tol_grad);
        CHECK(worst(dk, r.dk, off) <= tol_grad);
        CHECK(worst(dv, r.dv, off) <= tol_grad);
      }
    }
  });
}
