// The transformer's ops but attention (GELU, softmax, layer norm) on CPU
// devices: forward against float64 references written here, backward against
// float64 central finite differences of the scalar loss sum(out * r) for
// fixed random r (which is the dy handed to the backward op), forward in
// bfloat16 and float16 within their roundings, and the argument errors. Each
// case runs on the naive engine and on the threaded one at every worker count
// of test_workers.h.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tensor_test_util.h"
#include "test_workers.h"
#include "weft/engine.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"

namespace {

using weft::DType;
using weft::Engine;
using weft_optest::close;
using weft_optest::error_of;
using weft_optest::finite_differences;
using weft_optest::for_each_engine_and_workers;
using weft_optest::has;
using weft_optest::i64;
using weft_optest::Rng;
using weft_optest::sz;
using weft_optest::Vec;
namespace ops = weft::ops;
using weft::Device;
using weft::Shape;
using weft::Tensor;

std::vector<float> random_floats(Rng& rng, i64 n, float lo, float hi) {
  std::vector<float> v(sz(n));
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}
Vec dbl(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
Vec dbl_rounded(const std::vector<float>& v, DType t) {
  Vec out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    float f = v[i];
    if (t == DType::bfloat16) f = weft::bfloat16_to_float(weft::float_to_bfloat16(f));
    if (t == DType::float16) f = weft::float16_to_float(weft::float_to_float16(f));
    out[i] = f;
  }
  return out;
}
// One unit in the last place at 1 of each dtype.
double unit(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0x1p-24; }

// ---- float64 references ------------------------------------------------------

constexpr double kC = 0.7978845608028654, kA = 0.044715;

Vec ref_gelu(const Vec& x) {
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = 0.5 * x[i] * (1.0 + std::tanh(kC * (x[i] + kA * x[i] * x[i] * x[i])));
  return y;
}

Vec ref_softmax(const Vec& x, i64 rows, i64 cols) {
  Vec y(x.size());
  for (i64 r = 0; r < rows; ++r) {
    double m = x[sz(r * cols)];
    for (i64 j = 1; j < cols; ++j) m = std::max(m, x[sz(r * cols + j)]);
    double s = 0.0;
    for (i64 j = 0; j < cols; ++j) s += std::exp(x[sz(r * cols + j)] - m);
    for (i64 j = 0; j < cols; ++j) y[sz(r * cols + j)] = std::exp(x[sz(r * cols + j)] - m) / s;
  }
  return y;
}

struct RefLayerNorm {
  Vec y, mean, rstd;
};
RefLayerNorm ref_layer_norm(const Vec& x, const Vec& w, const Vec& b, i64 rows, i64 cols, double eps) {
  RefLayerNorm out{Vec(x.size()), Vec(sz(rows)), Vec(sz(rows))};
  for (i64 r = 0; r < rows; ++r) {
    double m = 0.0;
    for (i64 j = 0; j < cols; ++j) m += x[sz(r * cols + j)];
    m /= static_cast<double>(cols);
    double v = 0.0;
    for (i64 j = 0; j < cols; ++j) v += (x[sz(r * cols + j)] - m) * (x[sz(r * cols + j)] - m);
    const double inv = 1.0 / std::sqrt(v / static_cast<double>(cols) + eps);
    out.mean[sz(r)] = m;
    out.rstd[sz(r)] = inv;
    for (i64 j = 0; j < cols; ++j) out.y[sz(r * cols + j)] = (x[sz(r * cols + j)] - m) * inv * w[sz(j)] + b[sz(j)];
  }
  return out;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

Tensor on(Engine& e, Shape s, const std::vector<float>& v, DType t = DType::float32) {
  Tensor x = Tensor::from_host(e, std::move(s), v, Device::cpu(0));
  return t == DType::float32 ? x : ops::cast(x, t);
}
std::vector<float> host(const Tensor& t) {
  return t.dtype() == DType::float32 ? t.to_host() : ops::cast(t, DType::float32).to_host();
}

const Shape kSmall{3, 4, 7};    // 12 rows of 7
const Shape kWide{96, 130};     // rows split across workers
constexpr i64 kSmallRows = 12, kSmallCols = 7;

}  // namespace

TEST_CASE("transformer ops: gelu forward and backward against float64" * doctest::timeout(120)) {
  Rng rng(61);
  const i64 n = kSmall.numel();
  const std::vector<float> x = random_floats(rng, n, -4.0f, 4.0f), r = random_floats(rng, n, -1.0f, 1.0f);
  const Vec want_y = ref_gelu(dbl(x));
  const Vec want_dx = finite_differences(dbl(x), [&](const Vec& p) { return dot(ref_gelu(p), dbl(r)); });
  const std::vector<float> xw = random_floats(rng, kWide.numel(), -6.0f, 6.0f);
  const Vec want_wide = ref_gelu(dbl(xw));
  for_each_engine_and_workers([&](Engine& e) {
    Tensor tx = on(e, kSmall, x);
    close(ops::gelu(tx).to_host(), want_y, "gelu", 1e-6);
    close(ops::gelu_backward(tx, on(e, kSmall, r)).to_host(), want_dx, "gelu_backward", 1e-6);
    close(ops::gelu(on(e, kWide, xw)).to_host(), want_wide, "gelu wide", 1e-6);
  });
}

TEST_CASE("transformer ops: softmax forward and backward against float64" * doctest::timeout(120)) {
  Rng rng(62);
  const i64 n = kSmall.numel();
  // Large logits: the shift by the row max keeps exp finite.
  std::vector<float> x = random_floats(rng, n, -3.0f, 3.0f);
  x[5] = 80.0f, x[6] = 95.0f;
  const std::vector<float> r = random_floats(rng, n, -1.0f, 1.0f);
  const Vec want_y = ref_softmax(dbl(x), kSmallRows, kSmallCols);
  const Vec want_dx = finite_differences(
      dbl(x), [&](const Vec& p) { return dot(ref_softmax(p, kSmallRows, kSmallCols), dbl(r)); });
  const std::vector<float> xw = random_floats(rng, kWide.numel(), -5.0f, 5.0f);
  const std::vector<float> rw = random_floats(rng, kWide.numel(), -1.0f, 1.0f);
  const Vec want_wide = ref_softmax(dbl(xw), kWide[0], kWide[1]);
  // The wide backward's reference: dx = y (dy - sum(dy y)) in float64.
  Vec want_wide_dx(want_wide.size());
  for (i64 row = 0; row < kWide[0]; ++row) {
    double s = 0.0;
    for (i64 j = 0; j < kWide[1]; ++j) s += want_wide[sz(row * kWide[1] + j)] * rw[sz(row * kWide[1] + j)];
    for (i64 j = 0; j < kWide[1]; ++j)
      want_wide_dx[sz(row * kWide[1] + j)] = want_wide[sz(row * kWide[1] + j)] * (rw[sz(row * kWide[1] + j)] - s);
  }
  for_each_engine_and_workers([&](Engine& e) {
    Tensor y = ops::softmax(on(e, kSmall, x));
    CHECK(y.shape() == kSmall);
    close(y.to_host(), want_y, "softmax", 1e-6);
    close(ops::softmax_backward(y, on(e, kSmall, r)).to_host(), want_dx, "softmax_backward", 1e-5);
    Tensor yw = ops::softmax(on(e, kWide, xw));
    close(yw.to_host(), want_wide, "softmax wide", 1e-6);
    close(ops::softmax_backward(yw, on(e, kWide, rw)).to_host(), want_wide_dx, "softmax_backward wide", 1e-5);
    // A one-dimensional x is one row.
    close(ops::softmax(on(e, Shape{kSmallCols}, std::vector<float>(x.begin(), x.begin() + kSmallCols))).to_host(),
          Vec(want_y.begin(), want_y.begin() + kSmallCols), "softmax rank 1", 1e-6);
  });
}

TEST_CASE("transformer ops: layer norm forward and backward against float64" * doctest::timeout(120)) {
  Rng rng(63);
  const i64 n = kSmall.numel();
  const std::vector<float> x = random_floats(rng, n, -2.0f, 3.0f), r = random_floats(rng, n, -1.0f, 1.0f);
  const std::vector<float> w = random_floats(rng, kSmallCols, 0.5f, 1.5f), b = random_floats(rng, kSmallCols, -0.5f, 0.5f);
  const double eps = 1e-5;
  const RefLayerNorm want = ref_layer_norm(dbl(x), dbl(w), dbl(b), kSmallRows, kSmallCols, eps);
  const auto loss_x = [&](const Vec& p) {
    return dot(ref_layer_norm(p, dbl(w), dbl(b), kSmallRows, kSmallCols, eps).y, dbl(r));
  };
  const auto loss_w = [&](const Vec& p) {
    return dot(ref_layer_norm(dbl(x), p, dbl(b), kSmallRows, kSmallCols, eps).y, dbl(r));
  };
  const auto loss_b = [&](const Vec& p) {
    return dot(ref_layer_norm(dbl(x), dbl(w), p, kSmallRows, kSmallCols, eps).y, dbl(r));
  };
  const Vec want_dx = finite_differences(dbl(x), loss_x), want_dw = finite_differences(dbl(w), loss_w),
            want_db = finite_differences(dbl(b), loss_b);
  // Wide: forward only against the reference, backward's dweight / dbias
  // against their float64 sums (rows split across workers, summed in order).
  const i64 wr = kWide[0], wc = kWide[1];
  const std::vector<float> xw = random_floats(rng, kWide.numel(), -4.0f, 4.0f), rw = random_floats(rng, kWide.numel(), -1.0f, 1.0f);
  const std::vector<float> ww = random_floats(rng, wc, 0.5f, 1.5f), bw = random_floats(rng, wc, -0.5f, 0.5f);
  const RefLayerNorm want_w = ref_layer_norm(dbl(xw), dbl(ww), dbl(bw), wr, wc, eps);
  Vec want_w_dw(sz(wc), 0.0), want_w_db(sz(wc), 0.0);
  for (i64 i = 0; i < wr; ++i)
    for (i64 j = 0; j < wc; ++j) {
      const std::size_t k = sz(i * wc + j);
      want_w_dw[sz(j)] += rw[k] * (xw[k] - want_w.mean[sz(i)]) * want_w.rstd[sz(i)];
      want_w_db[sz(j)] += rw[k];
    }
  std::vector<float> first_dw;  // the same bits at every worker count
  for_each_engine_and_workers([&](Engine& e) {
    Tensor tx = on(e, kSmall, x), tw = on(e, Shape{kSmallCols}, w), tb = on(e, Shape{kSmallCols}, b);
    ops::LayerNormForward f = ops::layer_norm(tx, tw, tb);
    CHECK(f.y.shape() == kSmall);
    CHECK(f.mean.shape() == Shape{kSmallRows});
    CHECK(f.mean.dtype() == DType::float32);
    close(f.y.to_host(), want.y, "layer_norm y", 1e-6);
    close(f.mean.to_host(), want.mean, "layer_norm mean", 1e-6);
    close(f.rstd.to_host(), want.rstd, "layer_norm rstd", 1e-6);
    ops::LayerNormGrads g = ops::layer_norm_backward(tx, on(e, kSmall, r), tw, f.mean, f.rstd);
    close(g.dx.to_host(), want_dx, "layer_norm dx", 1e-5);
    close(g.dweight.to_host(), want_dw, "layer_norm dweight", 1e-5);
    close(g.dbias.to_host(), want_db, "layer_norm dbias", 1e-5);

    Tensor txw = on(e, kWide, xw), tww = on(e, Shape{wc}, ww);
    ops::LayerNormForward fw = ops::layer_norm(txw, tww, on(e, Shape{wc}, bw));
    close(fw.y.to_host(), want_w.y, "layer_norm wide y", 1e-6);
    ops::LayerNormGrads gw = ops::layer_norm_backward(txw, on(e, kWide, rw), tww, fw.mean, fw.rstd);
    close(gw.dweight.to_host(), want_w_dw, "layer_norm wide dweight", 1e-5);
    close(gw.dbias.to_host(), want_w_db, "layer_norm wide dbias", 1e-5);
    if (first_dw.empty()) first_dw = gw.dweight.to_host();
    else CHECK(weft_optest::bitwise_equal(gw.dweight.to_host(), first_dw));
  });
}

TEST_CASE("transformer ops: bfloat16 and float16 forward within the dtype's rounding" * doctest::timeout(120)) {
  Rng rng(64);
  const i64 n = kSmall.numel();
  const std::vector<float> x = random_floats(rng, n, -3.0f, 3.0f), r = random_floats(rng, n, -1.0f, 1.0f);
  const std::vector<float> w = random_floats(rng, kSmallCols, 0.5f, 1.5f), b = random_floats(rng, kSmallCols, -0.5f, 0.5f);
  for (DType t : {DType::bfloat16, DType::float16}) {
    INFO("dtype " << weft::to_string(t));
    // References from the inputs as the dtype holds them; the output's one
    // rounding (and float32 arithmetic) within 2 units of the largest value.
    const Vec xr = dbl_rounded(x, t), rr = dbl_rounded(r, t);
    const Vec want_gelu = ref_gelu(xr), want_soft = ref_softmax(xr, kSmallRows, kSmallCols);
    const RefLayerNorm want_ln = ref_layer_norm(xr, dbl(w), dbl(b), kSmallRows, kSmallCols, 1e-5);
    const Vec want_gelu_dx =
        finite_differences(xr, [&](const Vec& p) { return dot(ref_gelu(p), rr); });
    const double tol = 2.0 * unit(t);
    for_each_engine_and_workers([&](Engine& e) {
      Tensor tx = on(e, kSmall, x, t);
      Tensor y = ops::gelu(tx);
      CHECK(y.dtype() == t);
      close(host(y), want_gelu, "gelu", tol);
      close(host(ops::gelu_backward(tx, on(e, kSmall, r, t))), want_gelu_dx, "gelu_backward", tol);
      Tensor s = ops::softmax(tx);
      CHECK(s.dtype() == t);
      close(host(s), want_soft, "softmax", tol);
      ops::LayerNormForward f = ops::layer_norm(tx, on(e, Shape{kSmallCols}, w), on(e, Shape{kSmallCols}, b));
      CHECK(f.y.dtype() == t);
      CHECK(f.mean.dtype() == DType::float32);
      close(host(f.y), want_ln.y, "layer_norm y", tol);
      // The statistics stay float32: far closer than the dtype's unit.
      close(f.mean.to_host(), want_ln.mean, "layer_norm mean", 1e-6, 1.0);
      close(f.rstd.to_host(), want_ln.rstd, "layer_norm rstd", 1e-6);
    });
  }
}

TEST_CASE("transformer ops: bad arguments name the op, the tensor and the shape" * doctest::timeout(60)) {
  auto engine = Engine::create(weft::EngineConfig{});
  Engine& e = *engine;
  Tensor x = Tensor::zeros(e, Shape{2, 3});
  Tensor w3 = Tensor::ones(e, Shape{3}), b3 = Tensor::zeros(e, Shape{3});
  std::string m = error_of([&] { ops::softmax(Tensor::zeros(e, Shape{})); });
  CHECK_MESSAGE(has(m, "softmax: x "), m);
  CHECK_MESSAGE(has(m, "scalar"), m);
  m = error_of([&] { ops::softmax(Tensor::zeros(e, Shape{2, 0})); });
  CHECK_MESSAGE(has(m, "empty last dimension"), m);
  m = error_of([&] { ops::softmax_backward(x, Tensor::zeros(e, Shape{3, 2})); });
  CHECK_MESSAGE(has(m, "softmax_backward: dy "), m);
  CHECK_MESSAGE(has(m, "[3, 2]"), m);
  m = error_of([&] { ops::gelu_backward(x, Tensor::zeros(e, Shape{2, 4})); });
  CHECK_MESSAGE(has(m, "gelu_backward: dy "), m);
  m = error_of([&] { ops::gelu_backward(x, ops::cast(x, DType::bfloat16)); });
  CHECK_MESSAGE(has(m, "gelu_backward"), m);
  CHECK_MESSAGE(has(m, "bfloat16"), m);
  m = error_of([&] { ops::layer_norm(x, Tensor::ones(e, Shape{4}), b3); });
  CHECK_MESSAGE(has(m, "layer_norm: weight "), m);
  CHECK_MESSAGE(has(m, "want [3]"), m);
  m = error_of([&] { ops::layer_norm(x, w3, ops::cast(b3, DType::float16)); });
  CHECK_MESSAGE(has(m, "layer_norm"), m);
  CHECK_MESSAGE(has(m, "bias"), m);
  m = error_of([&] { ops::layer_norm(x, w3, b3, ops::LayerNormParams{0.0f}); });
  CHECK_MESSAGE(has(m, "eps must be a positive number"), m);
  ops::LayerNormForward f = ops::layer_norm(x, w3, b3);
  m = error_of([&] { ops::layer_norm_backward(x, x, w3, f.rstd, Tensor::ones(e, Shape{3})); });
  CHECK_MESSAGE(has(m, "layer_norm_backward: rstd "), m);
  CHECK_MESSAGE(has(m, "one per row"), m);
  Tensor nchw = Tensor::zeros(e, Shape{1, 2, 2, 2});
  m = error_of([&] { ops::softmax(ops::to_memory_format(nchw, weft::MemoryFormat::channels_last)); });
  CHECK_MESSAGE(has(m, "softmax"), m);
  CHECK_MESSAGE(has(m, "channels_last"), m);
  e.wait_all();
}

namespace {

// y = weight's rows the ids name, in float64: [ids..., width].
Vec ref_embedding(const Vec& w, const std::vector<float>& ids, i64 width) {
  Vec y(ids.size() * sz(width));
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (i64 j = 0; j < width; ++j) y[i * sz(width) + sz(j)] = w[sz(static_cast<i64>(ids[i]) * width + j)];
  return y;
}

std::vector<float> random_ids(Rng& rng, i64 n, i64 vocab) {
  std::vector<float> ids(sz(n));
  for (float& v : ids) v = static_cast<float>(rng.integer(0, vocab - 1));
  return ids;
}

}  // namespace

TEST_CASE("transformer ops: embedding lookup and its scatter-add backward against float64" * doctest::timeout(120)) {
  Rng rng(65);
  const i64 vocab = 11, width = 5;
  const Shape ids_shape{2, 3};
  std::vector<float> ids = random_ids(rng, ids_shape.numel(), vocab);
  ids[4] = ids[1];  // a repeated id: its gradient rows add up
  const std::vector<float> w = random_floats(rng, vocab * width, -1.0f, 1.0f);
  const std::vector<float> r = random_floats(rng, ids_shape.numel() * width, -1.0f, 1.0f);
  const Vec want_y = ref_embedding(dbl(w), ids, width);
  const Vec want_dw = finite_differences(dbl(w), [&](const Vec& p) { return dot(ref_embedding(p, ids, width), dbl(r)); });
  // Many ids over a small table: rows gather hundreds of additions each.
  const i64 big_vocab = 40, big_width = 33, big_n = 3000;
  const std::vector<float> big_ids = random_ids(rng, big_n, big_vocab);
  const std::vector<float> big_dy = random_floats(rng, big_n * big_width, -1.0f, 1.0f);
  Vec want_big(sz(big_vocab * big_width), 0.0);
  for (i64 i = 0; i < big_n; ++i)
    for (i64 j = 0; j < big_width; ++j)
      want_big[sz(static_cast<i64>(big_ids[sz(i)]) * big_width + j)] += big_dy[sz(i * big_width + j)];
  std::vector<float> first_big;  // the same bits at every worker count
  for_each_engine_and_workers([&](Engine& e) {
    Tensor tw = on(e, Shape{vocab, width}, w), tids = on(e, ids_shape, ids);
    Tensor y = ops::embedding(tw, tids);
    CHECK(y.shape() == Shape{2, 3, width});
    close(y.to_host(), want_y, "embedding", 0.0);  // copies: exact
    Tensor dw = ops::embedding_backward(tids, on(e, Shape{2, 3, width}, r), vocab);
    CHECK(dw.shape() == Shape{vocab, width});
    CHECK(dw.dtype() == DType::float32);
    close(dw.to_host(), want_dw, "embedding_backward", 1e-6);
    Tensor big = ops::embedding_backward(on(e, Shape{big_n}, big_ids), on(e, Shape{big_n, big_width}, big_dy), big_vocab);
    const std::vector<float> got = big.to_host();
    close(got, want_big, "embedding_backward, many ids", 1e-5);
    if (first_big.empty()) first_big = got;
    else CHECK(weft_optest::bitwise_equal(got, first_big));
    // Half tables: the rows as stored, and a float32 gradient from half dy.
    for (DType t : {DType::bfloat16, DType::float16}) {
      INFO("dtype " << weft::to_string(t));
      Tensor yh = ops::embedding(on(e, Shape{vocab, width}, w, t), tids);
      CHECK(yh.dtype() == t);
      close(host(yh), ref_embedding(dbl_rounded(w, t), ids, width), "embedding", 0.0);
      const Vec rr = dbl_rounded(r, t);
      close(ops::embedding_backward(tids, on(e, Shape{2, 3, width}, r, t), vocab).to_host(),
            finite_differences(dbl(w), [&](const Vec& p) { return dot(ref_embedding(p, ids, width), rr); }),
            "embedding_backward", 1e-6);
    }
  });
}

TEST_CASE("transformer ops: an id outside the vocabulary fails the op, naming ids, the index and the size" *
          doctest::timeout(60)) {
  for_each_engine_and_workers([](Engine& e) {
    Tensor w = Tensor::ones(e, Shape{11, 4});
    std::vector<float> ids{0, 1, 2, 3, 4, 5};
    ids[5] = 11.0f;  // at [1, 2]
    Tensor y = ops::embedding(w, on(e, Shape{2, 3}, ids));
    std::string m = error_of([&] { (void)y.to_host(); });
    CHECK_MESSAGE(has(m, "embedding: ids "), m);
    CHECK_MESSAGE(has(m, "hold 11 at index [1, 2]"), m);
    CHECK_MESSAGE(has(m, "ids in [0, 11)"), m);
    CHECK_MESSAGE(has(m, "weight"), m);
    CHECK_NOTHROW(e.wait_all());
    // Negative and fractional ids too; the backward checks alike.
    ids[5] = 3.0f;
    ids[0] = -1.0f;
    Tensor dw = ops::embedding_backward(on(e, Shape{6}, ids), Tensor::ones(e, Shape{6, 4}), 11);
    m = error_of([&] { (void)dw.to_host(); });
    CHECK_MESSAGE(has(m, "embedding_backward: ids"), m);
    CHECK_MESSAGE(has(m, "hold -1 at index [0]"), m);
    ids[0] = 0.5f;
    m = error_of([&] { (void)ops::embedding(w, on(e, Shape{6}, ids)).to_host(); });
    CHECK_MESSAGE(has(m, "hold 0.5 at index [0]"), m);
    // The engine goes on.
    ids[0] = 0.0f;
    CHECK(ops::embedding(w, on(e, Shape{6}, ids)).to_host() == std::vector<float>(24, 1.0f));
    // Shapes and dtypes at push time.
    m = error_of([&] { ops::embedding(Tensor::ones(e, Shape{11}), on(e, Shape{6}, ids)); });
    CHECK_MESSAGE(has(m, "embedding"), m);
    CHECK_MESSAGE(has(m, "weight"), m);
    m = error_of([&] { ops::embedding(w, ops::cast(on(e, Shape{6}, ids), DType::bfloat16)); });
    CHECK_MESSAGE(has(m, "ids"), m);
    m = error_of([&] { ops::embedding_backward(on(e, Shape{6}, ids), Tensor::ones(e, Shape{5, 4}), 11); });
    CHECK_MESSAGE(has(m, "embedding_backward: dy "), m);
    CHECK_MESSAGE(has(m, "[5, 4]"), m);
  });
}

namespace {

// C[b] = op(A[b]) op(B[b]) in float64; A stored [B, M, K] or [B, K, M].
Vec ref_bmm(const Vec& a, const Vec& b, i64 batch, i64 m, i64 k, i64 n, bool ta, bool tb) {
  Vec c(sz(batch * m * n), 0.0);
  for (i64 q = 0; q < batch; ++q)
    for (i64 i = 0; i < m; ++i)
      for (i64 j = 0; j < n; ++j) {
        double s = 0.0;
        for (i64 p = 0; p < k; ++p)
          s += a[sz(q * m * k + (ta ? p * m + i : i * k + p))] * b[sz(q * k * n + (tb ? j * k + p : p * n + j))];
        c[sz(q * m * n + i * n + j)] = s;
      }
  return c;
}

}  // namespace

TEST_CASE("transformer ops: batched matmul with transposes against float64, gradients by finite differences" *
          doctest::timeout(120)) {
  Rng rng(66);
  const i64 batch = 3, m = 4, k = 6, n = 5;
  const std::vector<float> a = random_floats(rng, batch * m * k, -1.0f, 1.0f);
  const std::vector<float> b = random_floats(rng, batch * k * n, -1.0f, 1.0f);
  const std::vector<float> r = random_floats(rng, batch * m * n, -1.0f, 1.0f);
  // loss = sum(C * r), C = A B: dA = r B^T and dB = A^T r, as the op computes them.
  const Vec want_da = finite_differences(
      dbl(a), [&](const Vec& p) { return dot(ref_bmm(p, dbl(b), batch, m, k, n, false, false), dbl(r)); });
  const Vec want_db = finite_differences(
      dbl(b), [&](const Vec& p) { return dot(ref_bmm(dbl(a), p, batch, m, k, n, false, false), dbl(r)); });
  // Wide enough that gemm splits its matrices and the batch spreads over threads.
  const i64 wb = 6, wm = 70, wk = 96, wn = 130;
  const std::vector<float> wa = random_floats(rng, wb * wm * wk, -1.0f, 1.0f);
  const std::vector<float> wbv = random_floats(rng, wb * wk * wn, -1.0f, 1.0f);
  const Vec want_wide = ref_bmm(dbl(wa), dbl(wbv), wb, wm, wk, wn, false, false);
  std::vector<float> first_wide;
  for_each_engine_and_workers([&](Engine& e) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      INFO("trans_a " << ta << " trans_b " << tb);
      // The same values stored transposed when asked.
      std::vector<float> as(a.size()), bs(b.size());
      for (i64 q = 0; q < batch; ++q) {
        for (i64 i = 0; i < m; ++i)
          for (i64 p = 0; p < k; ++p) as[sz(q * m * k + (ta ? p * m + i : i * k + p))] = a[sz(q * m * k + i * k + p)];
        for (i64 p = 0; p < k; ++p)
          for (i64 j = 0; j < n; ++j) bs[sz(q * k * n + (tb ? j * k + p : p * n + j))] = b[sz(q * k * n + p * n + j)];
      }
      Tensor c = ops::batched_matmul(on(e, ta ? Shape{batch, k, m} : Shape{batch, m, k}, as),
                                     on(e, tb ? Shape{batch, n, k} : Shape{batch, k, n}, bs), ta, tb);
      CHECK(c.shape() == Shape{batch, m, n});
      close(c.to_host(), ref_bmm(dbl(as), dbl(bs), batch, m, k, n, ta, tb), "batched_matmul", 1e-6);
    }
    Tensor ta = on(e, Shape{batch, m, k}, a), tb = on(e, Shape{batch, k, n}, b), tr = on(e, Shape{batch, m, n}, r);
    close(ops::batched_matmul(tr, tb, false, true).to_host(), want_da, "dA = dC B^T", 1e-6);
    close(ops::batched_matmul(ta, tr, true, false).to_host(), want_db, "dB = A^T dC", 1e-6);
    const std::vector<float> got = ops::batched_matmul(on(e, Shape{wb, wm, wk}, wa), on(e, Shape{wb, wk, wn}, wbv)).to_host();
    close(got, want_wide, "batched_matmul wide", 1e-5);
    if (first_wide.empty()) first_wide = got;
    else CHECK(weft_optest::bitwise_equal(got, first_wide));
    for (DType t : {DType::bfloat16, DType::float16}) {
      INFO("dtype " << weft::to_string(t));
      Tensor ch = ops::batched_matmul(on(e, Shape{batch, m, k}, a, t), on(e, Shape{batch, k, n}, b, t));
      CHECK(ch.dtype() == t);
      // float32 accumulation of the rounded inputs, one rounding on store.
      close(host(ch), ref_bmm(dbl_rounded(a, t), dbl_rounded(b, t), batch, m, k, n, false, false), "batched_matmul",
            2.0 * unit(t));
    }
  });
}

TEST_CASE("transformer ops: batched matmul's shape errors name the operands" * doctest::timeout(60)) {
  auto engine = Engine::create(weft::EngineConfig{});
  Engine& e = *engine;
  std::string m = error_of([&] { ops::batched_matmul(Tensor::zeros(e, Shape{2, 3, 4}), Tensor::zeros(e, Shape{3, 4, 5})); });
  CHECK_MESSAGE(has(m, "batched_matmul: batch sizes differ"), m);
  CHECK_MESSAGE(has(m, "[2, 3, 4]"), m);
  m = error_of([&] { ops::batched_matmul(Tensor::zeros(e, Shape{2, 3, 4}), Tensor::zeros(e, Shape{2, 5, 4})); });
  CHECK_MESSAGE(has(m, "batched_matmul: inner dimensions differ"), m);
  CHECK_MESSAGE(has(m, "(4 vs 5)"), m);
  m = error_of([&] { ops::batched_matmul(Tensor::zeros(e, Shape{3, 4}), Tensor::zeros(e, Shape{4, 5})); });
  CHECK_MESSAGE(has(m, "batched_matmul"), m);
  CHECK_MESSAGE(has(m, "a"), m);
  e.wait_all();
}
