// Causal attention on a GPU against float64 references of the forward, lse
// and all three gradients (computed from the full masked softmax): on
// simulated GPUs the CPU kernel runs as stream-ordered work, on CUDA the
// batched-GEMM kernels (attention.cu). Also: two runs give the same bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "gpu_test_util.h"
#include "weft/dtype.h"
#include "weft/error.h"
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

// The largest difference relative to the largest |want| of the tensor
// (planes [0, planes) of `per_plane` elements each).
double worst_of_largest(const std::vector<float>& got, const std::vector<PlaneGrads>& refs,
                        std::vector<double> PlaneGrads::*field) {
  double diff = 0, largest = 0;
  std::size_t off = 0;
  for (const PlaneGrads& r : refs) {
    const std::vector<double>& want = r.*field;
    for (std::size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::abs(got[off + i] - want[i]));
      largest = std::max(largest, std::abs(want[i]));
    }
    off += want.size();
  }
  return diff / std::max(largest, 1e-30);
}

}  // namespace

TEST_CASE("gpu attention - causal attention on a GPU matches float64 references") {
  WEFT_REQUIRE_GPU();
  const float scale = 0.25f;
  // [2, 2, 70, 16]: one row chunk of the CUDA path; [1, 2, 600, 64]: three
  // (256, 256 and 88 rows), so the GEMMs' skipped keys and the chunks' edges
  // count; [1, 3, 257, 5]: a last chunk of one row, and an odd head width
  // (leading dimensions and offsets of no alignment for the half GEMMs).
  const std::vector<weft::Shape> shapes{{2, 2, 70, 16}, {1, 2, 600, 64}, {1, 3, 257, 5}};
  // References per (shape, dtype): the inputs hold the dtype's values, the same on every engine.
  std::map<std::pair<std::size_t, DType>, std::vector<PlaneGrads>> refs;
  gputest::with_each_gpu_engine(1, [&](weft::Engine& e) {
    const weft::Device g = weft::Device::gpu(0);
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      const weft::Shape& s = shapes[si];
      const i64 b = s[0], h = s[1], t = s[2], d = s[3];
      const auto n = static_cast<std::size_t>(s.numel());
      for (DType dt : {DType::float32, DType::bfloat16, DType::float16}) {
        const std::string dtype_name(weft::to_string(dt)), shape_name = s.str();
        CAPTURE(dtype_name);
        CAPTURE(shape_name);
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
        std::vector<PlaneGrads>& r = refs[{si, dt}];
        if (r.empty())
          for (i64 p = 0; p < b * h; ++p) {
            const i64 off = p * t * d;
            r.push_back(reference(host[0].data() + off, host[1].data() + off, host[2].data() + off,
                                  host[3].data() + off, t, d, scale));
          }
        // Relative to each tensor's largest element: float32 within a few
        // 2^-20 (sums of up to T products in float32); halves within a few
        // units of the dtype (each output rounded once; on CUDA the
        // probabilities and score gradients also enter their GEMMs rounded
        // to the dtype, as in FlashAttention-2 and cuDNN).
        const double unit = dt == DType::float32 ? 0x1p-20 : roundoff(dt);
        const double tol_out = 4 * unit, tol_grad = 8 * unit;
        CHECK(worst_of_largest(out, r, &PlaneGrads::out) <= tol_out);
        CHECK(worst_of_largest(lse, r, &PlaneGrads::lse) <= 4 * 0x1p-20);  // float32 whatever the dtype
        CHECK(worst_of_largest(dq, r, &PlaneGrads::dq) <= tol_grad);
        CHECK(worst_of_largest(dk, r, &PlaneGrads::dk) <= tol_grad);
        CHECK(worst_of_largest(dv, r, &PlaneGrads::dv) <= tol_grad);
        // And element by element against 1 + |want|, as the CPU tests do.
        const double tol = 1e-5 + (dt == DType::float32 ? 0.0 : 2 * roundoff(dt));
        const double tol_elem_grad = dt == DType::float32 ? 1e-5 : 8 * roundoff(dt);
        for (i64 p = 0; p < b * h; ++p) {
          const i64 off = p * t * d;
          const PlaneGrads& rp = r[static_cast<std::size_t>(p)];
          CAPTURE(p);
          CHECK(worst(out, rp.out, off) <= tol);
          CHECK(worst(lse, rp.lse, p * t) <= 1e-5);
          CHECK(worst(dq, rp.dq, off) <= tol_elem_grad);
          CHECK(worst(dk, rp.dk, off) <= tol_elem_grad);
          CHECK(worst(dv, rp.dv, off) <= tol_elem_grad);
        }
      }
    }
  });
}

TEST_CASE("gpu attention - two runs of causal attention give the same bits") {
  WEFT_REQUIRE_GPU();
  const weft::Shape s{2, 3, 300, 32};  // two row chunks on CUDA
  const auto n = static_cast<std::size_t>(s.numel());
  const float scale = 0.2f;
  // Deterministic: the backward takes the GEMM path even where cuDNN's
  // fused one would run (its dq accumulates with atomics).
  auto e = gputest::make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 2, .conv_algo = "deterministic"});
  const weft::Device g = weft::Device::gpu(0);
  for (DType dt : {DType::float32, DType::bfloat16, DType::float16}) {
    const std::string dtype_name(weft::to_string(dt));
    CAPTURE(dtype_name);
    weft::Tensor in[4];
    for (int x = 0; x < 4; ++x)
      in[x] = weft::Tensor::from_host(*e, s, gputest::random_values(n, 70 + static_cast<std::uint64_t>(x)), g, dt);
    std::vector<std::vector<float>> runs[2];
    for (auto& run : runs) {
      ops::CausalAttention a = ops::causal_attention(in[0], in[1], in[2], scale);
      ops::CausalAttentionGrads gr = ops::causal_attention_backward(in[0], in[1], in[2], a.out, in[3], a.lse, scale);
      run = {a.out.to_host(), a.lse.to_host(), gr.dq.to_host(), gr.dk.to_host(), gr.dv.to_host()};
    }
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (std::size_t x = 0; x < 5; ++x) gputest::expect_bits_equal(runs[1][x], runs[0][x], names[x]);
    // Not a constant: the outputs depend on the inputs.
    CHECK(gputest::max_abs(runs[0][0]) > 0.0);
  }
}

// CUDA only: both CUDA paths (WEFT_ATTENTION_IMPL=gemm and =fused, cuDNN's
// scaled-dot-product attention graph) against the float64 references, and
// against each other; `fused` on float32 (no fused path) is a weft::Error
// naming the variable, the op and the dtype.
TEST_CASE("gpu attention - fused cuDNN and batched-GEMM paths agree with float64 references") {
  WEFT_REQUIRE_GPU();
  if (gputest::simulated()) {
    std::printf("[weft-skip] the fused cuDNN path is CUDA only (simulated GPUs run the CPU kernel)\n");
    return;
  }
  const float scale = 0.125f;
  // D = 16, 64, 128 (multiples of 8 up to the fused path's 128); T = 70
  // (not a multiple of 64) and 600 (several of the GEMM path's row chunks).
  const std::vector<weft::Shape> shapes{{2, 2, 70, 16}, {1, 2, 600, 64}, {1, 2, 192, 128}};
  auto e = gputest::make_engine({.gpu_devices = 1});
  const weft::Device g = weft::Device::gpu(0);
  for (const weft::Shape& s : shapes) {
    const i64 b = s[0], h = s[1], t = s[2], d = s[3];
    const auto n = static_cast<std::size_t>(s.numel());
    for (DType dt : {DType::bfloat16, DType::float16}) {
      const std::string dtype_name(weft::to_string(dt)), shape_name = s.str();
      CAPTURE(dtype_name);
      CAPTURE(shape_name);
      std::vector<float> host[4];
      weft::Tensor in[4];
      for (int x = 0; x < 4; ++x) {
        in[x] = weft::Tensor::from_host(*e, s, gputest::random_values(n, 90 + static_cast<std::uint64_t>(x)), g, dt);
        host[x] = in[x].to_host();
      }
      std::vector<PlaneGrads> r;
      for (i64 p = 0; p < b * h; ++p) {
        const i64 off = p * t * d;
        r.push_back(reference(host[0].data() + off, host[1].data() + off, host[2].data() + off, host[3].data() + off,
                              t, d, scale));
      }
      std::map<std::string, std::vector<std::vector<float>>> results;
      for (const char* impl : {"gemm", "fused"}) {
        CAPTURE(impl);
        weft_test::EnvGuard env("WEFT_ATTENTION_IMPL", impl);
        ops::CausalAttention a = ops::causal_attention(in[0], in[1], in[2], scale);
        ops::CausalAttentionGrads gr = ops::causal_attention_backward(in[0], in[1], in[2], a.out, in[3], a.lse, scale);
        std::vector<std::vector<float>> got{a.out.to_host(), a.lse.to_host(), gr.dq.to_host(), gr.dk.to_host(),
                                            gr.dv.to_host()};
        const double unit = roundoff(dt);
        CHECK(worst_of_largest(got[0], r, &PlaneGrads::out) <= 4 * unit);
        CHECK(worst_of_largest(got[1], r, &PlaneGrads::lse) <= 4 * 0x1p-20);
        CHECK(worst_of_largest(got[2], r, &PlaneGrads::dq) <= 8 * unit);
        CHECK(worst_of_largest(got[3], r, &PlaneGrads::dk) <= 8 * unit);
        CHECK(worst_of_largest(got[4], r, &PlaneGrads::dv) <= 8 * unit);
        CHECK(gputest::max_abs(got[0]) > 0.0);
        results[impl] = std::move(got);
      }
      // Fused against GEMM, relative to each tensor's largest element: each
      // is within its bound of the reference, so within twice of the other.
      const char* names[] = {"out", "lse", "dq", "dk", "dv"};
      for (std::size_t x = 0; x < 5; ++x) {
        CAPTURE(names[x]);
        const std::vector<float>& fused = results["fused"][x];
        const std::vector<float>& gemm = results["gemm"][x];
        double diff = 0, largest = 0;
        for (std::size_t i = 0; i < gemm.size(); ++i) {
          diff = std::max(diff, static_cast<double>(std::abs(fused[i] - gemm[i])));
          largest = std::max(largest, static_cast<double>(std::abs(gemm[i])));
        }
        const double bound = x == 1 ? 8 * 0x1p-20 : (x == 0 ? 8 : 16) * roundoff(dt);
        CHECK(diff / std::max(largest, 1e-30) <= bound);
      }
    }
  }
  // fused where there is no fused path: float32.
  weft_test::EnvGuard env("WEFT_ATTENTION_IMPL", "fused");
  const weft::Shape s{1, 1, 8, 8};
  weft::Tensor q = weft::Tensor::from_host(*e, s, gputest::random_values(64, 5), g, DType::float32);
  const std::string msg = weft_test::error_of([&] {
    ops::CausalAttention a = ops::causal_attention(q, q, q, scale);
    (void)a.out.to_host();
  });
  CHECK(msg.find("causal_attention") != std::string::npos);
  CHECK(msg.find("WEFT_ATTENTION_IMPL=fused") != std::string::npos);
  CHECK(msg.find("float32") != std::string::npos);
  CHECK(msg.find("[1, 1, 8, 8]") != std::string::npos);
}
