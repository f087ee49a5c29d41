// Helpers of the memory-format tests (test_memory_format.cpp and
// test_memory_format_gpu.cpp): random host data, the convolution, pooling
// and batch-norm cases run in both formats, and comparisons whose
// tolerances come from the dtype's rounding.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "weft/engine.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"
#include "weft/tensor.h"

namespace weft_nhwc {

using weft::Device;
using weft::DType;
using weft::MemoryFormat;
using weft::Shape;
using weft::Tensor;
namespace ops = weft::ops;

inline std::vector<float> host_values(std::int64_t n, unsigned key, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(key);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

inline Tensor channels_last(const Tensor& t) { return ops::to_memory_format(t, MemoryFormat::channels_last); }

// The relative tolerance of two results computed from the same inputs in a
// different order and rounded to `t`: a few of its units in the last place
// (float32's from the summation order of a convolution's GEMM).
inline double rounding_of(DType t) {
  switch (t) {
    case DType::bfloat16: return 2.0 / 128;   // 2 ulps at 8 mantissa bits
    case DType::float16: return 2.0 / 1024;  // 2 ulps at 11
    default: return 1e-5;
  }
}

// Every |got - want| <= rtol * max(1, max |want|); names the first element off.
inline void check_near(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                       const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what << ": " << got.size() << " vs " << want.size() << " elements");
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= rtol * scale)) {
      FAIL_CHECK(what << ": element " << i << " is " << got[i] << ", want " << want[i] << " (tolerance "
                      << rtol * scale << ")");
      return;
    }
}

inline void check_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what << ": " << got.size() << " vs " << want.size() << " elements");
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))) {
      FAIL_CHECK(what << ": element " << i << " is " << got[i] << ", want " << want[i] << " (bitwise)");
      return;
    }
}

// A parameter after training steps in one format against the other: each
// element within rtol of the parameters' scale, and the update (got -
// initial against want - initial) within rtol_l2 in relative L2 norm. The
// two formats round differently, and a ReLU whose input lies that close to
// 0 passes a gradient in one and not in the other, so single elements of an
// update may differ by a whole gradient element while the update as a whole
// agrees.
// `floor`: an rms difference per element always allowed (convolution biases
// before batch norm get gradients of rounding noise only).
inline void check_update(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<float>& initial, double rtol, double rtol_l2, double floor,
                         const std::string& what) {
  check_near(got, want, rtol, what);
  double diff = 0, norm = 0;
  for (std::size_t j = 0; j < want.size() && j < got.size() && j < initial.size(); ++j) {
    diff += std::pow(static_cast<double>(got[j]) - want[j], 2);
    norm += std::pow(static_cast<double>(want[j]) - initial[j], 2);
  }
  CHECK_MESSAGE(std::sqrt(diff) <= rtol_l2 * std::sqrt(norm) + floor * std::sqrt(static_cast<double>(want.size())),
                what << ": the update differs by " << std::sqrt(diff) << " in L2, its norm is " << std::sqrt(norm));
}

struct ConvCase {
  std::int64_t n, c, h, w, o, k, stride, pad;
  bool bias;
  std::string str() const {
    std::string out;  // appended piece by piece (GCC 12 warns falsely on "n" + std::to_string)
    for (const auto& [key, v] : {std::pair<const char*, std::int64_t>{"n", n}, {" c", c}, {" h", h}, {" w", w},
                                 {" o", o}, {" k", k}, {" s", stride}, {" p", pad}}) {
      out += key;
      out += std::to_string(v);
    }
    if (bias) out += " bias";
    return out;
  }
};

// Odd shapes: 3 channels, H != W, stride 2 with padding, a 1x1 filter (the
// direct path), a 1x1 filter at stride 2 (ResNet's projection), a filter as
// large as the padded input.
inline const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {2, 3, 5, 7, 4, 3, 2, 1, true},  {3, 3, 6, 4, 5, 1, 1, 0, false}, {2, 4, 7, 5, 3, 3, 1, 1, true},
      {1, 2, 4, 4, 2, 2, 2, 0, false}, {2, 3, 3, 5, 2, 5, 1, 1, true},  {2, 4, 6, 5, 3, 1, 2, 0, false},
      {4, 8, 8, 8, 16, 3, 1, 1, false},
  };
  return cases;
}

// conv2d, conv2d_backward_data and conv2d_backward_filter of one case on
// `device` in dtype `t`, NHWC against NCHW; the formats of the results, and
// a filter given channels_last (converted by the op) too.
inline void check_conv_case(weft::Engine& e, Device device, DType t, const ConvCase& k, double rtol) {
  INFO("conv " << k.str() << " " << weft::to_string(t) << " on " << device.str());
  const Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c, k.k, k.k};
  const ops::Conv2dParams p{k.stride, k.pad};
  const std::int64_t oh = (k.h + 2 * k.pad - k.k) / k.stride + 1, ow = (k.w + 2 * k.pad - k.k) / k.stride + 1;
  const Shape ys{k.n, k.o, oh, ow};
  const Tensor x = Tensor::from_host(e, xs, host_values(xs.numel(), 11), device, t);
  const Tensor w = Tensor::from_host(e, ws, host_values(ws.numel(), 12), device, t);
  const Tensor b = k.bias ? Tensor::from_host(e, Shape{k.o}, host_values(k.o, 13), device, t) : Tensor();
  const Tensor dy = Tensor::from_host(e, ys, host_values(ys.numel(), 14), device, t);

  const Tensor y0 = ops::conv2d(x, w, b, p);
  const Tensor dx0 = ops::conv2d_backward_data(dy, w, xs, p);
  const ops::ConvFilterGrads g0 = ops::conv2d_backward_filter(x, dy, ws, p);

  const Tensor xl = channels_last(x), dyl = channels_last(dy);
  const Tensor y1 = ops::conv2d(xl, w, b, p);
  const Tensor y2 = ops::conv2d(xl, channels_last(w), b, p);  // the filter channels_last as well
  const Tensor dx1 = ops::conv2d_backward_data(dyl, w, xs, p);
  const ops::ConvFilterGrads g1 = ops::conv2d_backward_filter(xl, dyl, ws, p);
  const ops::ConvFilterGrads g2 = ops::conv2d_backward_filter(xl, dy, ws, p, MemoryFormat::channels_last);

  CHECK(y1.memory_format() == MemoryFormat::channels_last);
  CHECK(dx1.memory_format() == MemoryFormat::channels_last);
  CHECK(g1.dw.memory_format() == MemoryFormat::contiguous);
  CHECK(g2.dw.memory_format() == MemoryFormat::channels_last);
  CHECK(y1.shape() == ys);
  const std::vector<float> want_y = y0.to_host(), want_dx = dx0.to_host(), want_dw = g0.dw.to_host();
  check_near(y1.to_host(), want_y, rtol, "y");
  check_near(y2.to_host(), want_y, rtol, "y with a channels_last filter");
  check_near(dx1.to_host(), want_dx, rtol, "dx");
  check_near(g1.dw.to_host(), want_dw, rtol, "dw");
  check_near(g2.dw.to_host(), want_dw, rtol, "dw (channels_last)");
  check_near(g1.db.to_host(), g0.db.to_host(), rtol, "db");
}

// Pooling and batch norm, forward and backward, NHWC against NCHW. `exact`:
// bitwise (the CPU kernels run the same arithmetic in both layouts), else
// within rtol.
inline void check_pool_and_norm(weft::Engine& e, Device device, DType t, bool exact, double rtol) {
  INFO("pooling and batch norm, " << weft::to_string(t) << " on " << device.str());
  const auto same = [&](const Tensor& got, const Tensor& want, const char* what) {
    const bool kept = got.memory_format() == MemoryFormat::channels_last || got.shape().rank() != 4;
    CHECK_MESSAGE(kept, what);
    if (exact) check_bitwise(got.to_host(), want.to_host(), what);
    else check_near(got.to_host(), want.to_host(), rtol, what);
  };
  const Shape xs{2, 3, 7, 6};
  const Tensor x = Tensor::from_host(e, xs, host_values(xs.numel(), 21), device, t);
  const Tensor xl = channels_last(x);
  for (const ops::Pool2dParams p : {ops::Pool2dParams{3, 2, 1}, ops::Pool2dParams{2, 2, 0}, ops::Pool2dParams{3, 1, 1}}) {
    INFO("window " << p.kernel << " stride " << p.stride << " pad " << p.pad);
    const Tensor m0 = ops::max_pool2d(x, p), m1 = ops::max_pool2d(xl, p);
    same(m1, m0, "max_pool2d");
    const Tensor dy = Tensor::from_host(e, m0.shape(), host_values(m0.numel(), 22), device, t);
    same(ops::max_pool2d_backward(xl, channels_last(dy), p), ops::max_pool2d_backward(x, dy, p),
         "max_pool2d_backward");
    same(ops::max_pool2d_backward(xl, dy, p), ops::max_pool2d_backward(x, dy, p),
         "max_pool2d_backward, dy converted");
    same(ops::avg_pool2d(xl, p), ops::avg_pool2d(x, p), "avg_pool2d");
    same(ops::avg_pool2d_backward(channels_last(dy), xs, p), ops::avg_pool2d_backward(dy, xs, p),
         "avg_pool2d_backward");
  }
  same(ops::global_avg_pool2d(xl), ops::global_avg_pool2d(x), "global_avg_pool2d");
  const Tensor gdy = Tensor::from_host(e, Shape{2, 3, 1, 1}, host_values(6, 23), device, t);
  same(ops::global_avg_pool2d_backward(gdy, xs, MemoryFormat::channels_last),
       ops::global_avg_pool2d_backward(gdy, xs), "global_avg_pool2d_backward");

  // Batch norm: training (outputs, saved and running statistics), inference, backward.
  const Tensor gamma = Tensor::from_host(e, Shape{3}, host_values(3, 24, 0.5f, 1.5f), device);
  const Tensor beta = Tensor::from_host(e, Shape{3}, host_values(3, 25), device);
  Tensor rm0 = Tensor::zeros(e, Shape{3}, device), rv0 = Tensor::ones(e, Shape{3}, device);
  Tensor rm1 = Tensor::zeros(e, Shape{3}, device), rv1 = Tensor::ones(e, Shape{3}, device);
  const ops::BatchNormTrain t0 = ops::batch_norm_train(x, gamma, beta, rm0, rv0);
  const ops::BatchNormTrain t1 = ops::batch_norm_train(xl, gamma, beta, rm1, rv1);
  same(t1.y, t0.y, "batch_norm_train y");
  same(t1.save_mean, t0.save_mean, "save_mean");
  same(t1.save_invstd, t0.save_invstd, "save_invstd");
  same(rm1, rm0, "running_mean");
  same(rv1, rv0, "running_var");
  same(ops::batch_norm_infer(xl, gamma, beta, rm1, rv1), ops::batch_norm_infer(x, gamma, beta, rm0, rv0),
       "batch_norm_infer");
  const Tensor bdy = Tensor::from_host(e, xs, host_values(xs.numel(), 26), device, t);
  const ops::BatchNormGrads b0 = ops::batch_norm_backward(x, bdy, gamma, t0.save_mean, t0.save_invstd);
  const ops::BatchNormGrads b1 = ops::batch_norm_backward(xl, channels_last(bdy), gamma, t1.save_mean, t1.save_invstd);
  same(b1.dx, b0.dx, "batch_norm_backward dx");
  same(b1.dgamma, b0.dgamma, "dgamma");
  same(b1.dbeta, b0.dbeta, "dbeta");

  // More channels than one block of the CPU's channels-last batch norm (64).
  const Shape ws{2, 70, 3, 2};
  const Tensor xw = Tensor::from_host(e, ws, host_values(ws.numel(), 27), device, t);
  const Tensor gw = Tensor::from_host(e, Shape{70}, host_values(70, 28, 0.5f, 1.5f), device);
  const Tensor bw = Tensor::from_host(e, Shape{70}, host_values(70, 29), device);
  Tensor m0 = Tensor::zeros(e, Shape{70}, device), v0 = Tensor::ones(e, Shape{70}, device);
  Tensor m1 = Tensor::zeros(e, Shape{70}, device), v1 = Tensor::ones(e, Shape{70}, device);
  const ops::BatchNormTrain w0 = ops::batch_norm_train(xw, gw, bw, m0, v0);
  const ops::BatchNormTrain w1 = ops::batch_norm_train(channels_last(xw), gw, bw, m1, v1);
  same(w1.y, w0.y, "batch_norm_train y, 70 channels");
  same(v1, v0, "running_var, 70 channels");
  const Tensor wdy = Tensor::from_host(e, ws, host_values(ws.numel(), 30), device, t);
  same(ops::batch_norm_backward(channels_last(xw), wdy, gw, w1.save_mean, w1.save_invstd).dx,
       ops::batch_norm_backward(xw, wdy, gw, w0.save_mean, w0.save_invstd).dx, "batch_norm_backward dx, 70 channels");
}

}  // namespace weft_nhwc
