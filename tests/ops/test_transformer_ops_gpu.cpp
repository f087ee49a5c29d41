// The transformer's ops but attention on gpu(0) (CUDA kernels on a real GPU,
// the CPU kernels as stream work on a simulated one) against float64
// references written here: GELU, softmax, layer norm, embedding and batched
// matmul forward in float32, bfloat16 and float16, their backward in
// float32, and embedding's backward bit for bit twice under a deterministic
// conv_algo. Rows of 70 elements take more than one pass of a warp.
#include <cmath>

#include "gpu_test_util.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"

using namespace gputest;
namespace ops = weft::ops;

namespace {

using TfVec = std::vector<double>;
using weft::DType;

TfVec tf_dbl(const std::vector<float>& v, DType t = DType::float32) {
  TfVec out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    float f = v[i];
    if (t == DType::bfloat16) f = weft::bfloat16_to_float(weft::float_to_bfloat16(f));
    if (t == DType::float16) f = weft::float16_to_float(weft::float_to_float16(f));
    out[i] = f;
  }
  return out;
}
std::vector<float> tf_floats(const TfVec& v) { return std::vector<float>(v.begin(), v.end()); }
double tf_unit(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0x1p-20; }

Tensor tf_on(Engine& e, const Shape& s, const std::vector<float>& v, DType t = DType::float32) {
  Tensor x = Tensor::from_host(e, s, v, Device::gpu(0));
  return t == DType::float32 ? x : ops::cast(x, t);
}
std::vector<float> tf_host(const Tensor& t) {
  CHECK(t.device() == Device::gpu(0));
  return t.dtype() == DType::float32 ? t.to_host() : ops::cast(t, DType::float32).to_host();
}
void tf_close(const std::vector<float>& got, const TfVec& want, double rtol, const std::string& what) {
  const std::vector<float> w = tf_floats(want);
  expect_close(got, w, 0, rtol * std::max(1e-6, max_abs(w)), what);
}

constexpr std::int64_t kRows = 33, kCols = 70;
constexpr double kGc = 0.7978845608028654, kGa = 0.044715;

}  // namespace

TEST_CASE("gpu transformer ops - gelu, softmax and layer norm against float64" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  const Shape s{3, 11, kCols};
  const std::vector<float> x = random_values(kRows * kCols, 71, -3.0f, 3.0f), r = random_values(kRows * kCols, 72);
  const std::vector<float> w = random_values(kCols, 73, 0.5f, 1.5f), b = random_values(kCols, 74, -0.5f, 0.5f);
  for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
    INFO("dtype " << weft::to_string(t));
    const TfVec xv = tf_dbl(x, t), rv = tf_dbl(r, t), wv = tf_dbl(w), bv = tf_dbl(b);
    TfVec gelu(xv.size()), dgelu(xv.size()), soft(xv.size()), dsoft(xv.size()), ln(xv.size()), dln(xv.size());
    TfVec dw(kCols, 0.0), db(kCols, 0.0);
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const double v = xv[i], u = kGc * (v + kGa * v * v * v), th = std::tanh(u);
      gelu[i] = 0.5 * v * (1.0 + th);
      dgelu[i] = rv[i] * (0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * kGc * (1.0 + 3.0 * kGa * v * v));
    }
    for (std::int64_t row = 0; row < kRows; ++row) {
      const std::size_t o = static_cast<std::size_t>(row * kCols);
      double mx = xv[o], sum = 0.0, dotp = 0.0, mean = 0.0, var = 0.0;
      for (std::int64_t j = 0; j < kCols; ++j) mx = std::max(mx, xv[o + j]), mean += xv[o + j];
      for (std::int64_t j = 0; j < kCols; ++j) sum += std::exp(xv[o + j] - mx);
      for (std::int64_t j = 0; j < kCols; ++j) soft[o + j] = std::exp(xv[o + j] - mx) / sum, dotp += soft[o + j] * rv[o + j];
      for (std::int64_t j = 0; j < kCols; ++j) dsoft[o + j] = soft[o + j] * (rv[o + j] - dotp);
      mean /= kCols;
      for (std::int64_t j = 0; j < kCols; ++j) var += (xv[o + j] - mean) * (xv[o + j] - mean);
      const double rs = 1.0 / std::sqrt(var / kCols + 1e-5);
      double mg = 0.0, mgx = 0.0;
      for (std::int64_t j = 0; j < kCols; ++j) {
        const double xh = (xv[o + j] - mean) * rs, g = rv[o + j] * wv[j];
        ln[o + j] = xh * wv[j] + bv[j];
        mg += g / kCols, mgx += g * xh / kCols;
        dw[j] += rv[o + j] * xh, db[j] += rv[o + j];
      }
      for (std::int64_t j = 0; j < kCols; ++j)
        dln[o + j] = rs * (rv[o + j] * wv[j] - mg - (xv[o + j] - mean) * rs * mgx);
    }
    const double tol = 4.0 * tf_unit(t);
    Tensor tx = tf_on(*e, s, x, t), tr = tf_on(*e, s, r, t);
    tf_close(tf_host(ops::gelu(tx)), gelu, tol, "gelu");
    tf_close(tf_host(ops::gelu_backward(tx, tr)), dgelu, tol, "gelu_backward");
    Tensor y = ops::softmax(tx);
    tf_close(tf_host(y), soft, tol, "softmax");
    Tensor tw = tf_on(*e, Shape{kCols}, w), tb = tf_on(*e, Shape{kCols}, b);
    ops::LayerNormForward f = ops::layer_norm(tx, tw, tb);
    tf_close(tf_host(f.y), ln, tol, "layer_norm");
    if (t != DType::float32) continue;  // backward: float32
    tf_close(tf_host(ops::softmax_backward(y, tr)), dsoft, tol, "softmax_backward");
    ops::LayerNormGrads g = ops::layer_norm_backward(tx, tr, tw, f.mean, f.rstd);
    tf_close(tf_host(g.dx), dln, tol, "layer_norm dx");
    tf_close(tf_host(g.dweight), dw, tol, "layer_norm dweight");
    tf_close(tf_host(g.dbias), db, tol, "layer_norm dbias");
  }
  e->wait_all();
}

TEST_CASE("gpu transformer ops - embedding and batched matmul against float64" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  for (const char* algo : {"heuristic", "deterministic"}) {
    INFO("conv_algo " << algo);
    auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .conv_algo = algo});
    const std::int64_t vocab = 37, width = 70, n = 500;
    std::vector<float> ids = random_values(n, 75, 0.0f, static_cast<float>(vocab));
    for (float& v : ids) v = std::min(std::floor(v), static_cast<float>(vocab - 1));
    const std::vector<float> w = random_values(vocab * width, 76), dy = random_values(n * width, 77);
    TfVec want_dw(static_cast<std::size_t>(vocab * width), 0.0);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < width; ++j)
        want_dw[static_cast<std::size_t>(static_cast<std::int64_t>(ids[i]) * width + j)] += dy[i * width + j];
    Tensor tids = tf_on(*e, Shape{n}, ids);
    for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
      const TfVec wv = tf_dbl(w, t);
      TfVec want(static_cast<std::size_t>(n * width));
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < width; ++j)
          want[i * width + j] = wv[static_cast<std::size_t>(static_cast<std::int64_t>(ids[i]) * width + j)];
      tf_close(tf_host(ops::embedding(tf_on(*e, Shape{vocab, width}, w, t), tids)), want, 0.0, "embedding");
    }
    const std::vector<float> got = tf_host(ops::embedding_backward(tids, tf_on(*e, Shape{n, width}, dy), vocab));
    tf_close(got, want_dw, 1e-5, "embedding_backward");
    if (e->conv_algo().deterministic)
      CHECK(got == tf_host(ops::embedding_backward(tids, tf_on(*e, Shape{n, width}, dy), vocab)));

    const std::int64_t B = 5, M = 33, K = 40, N = 70;
    const std::vector<float> a = random_values(B * M * K, 78), bm = random_values(B * N * K, 79);
    for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
      INFO("dtype " << weft::to_string(t));
      const TfVec av = tf_dbl(a, t), bv = tf_dbl(bm, t);
      TfVec want(static_cast<std::size_t>(B * M * N), 0.0);  // a [B, M, K] x b^T, b [B, N, K]
      for (std::int64_t q = 0; q < B; ++q)
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j)
            for (std::int64_t p = 0; p < K; ++p)
              want[q * M * N + i * N + j] += av[q * M * K + i * K + p] * bv[q * N * K + j * K + p];
      tf_close(tf_host(ops::batched_matmul(tf_on(*e, Shape{B, M, K}, a, t), tf_on(*e, Shape{B, N, K}, bm, t), false,
                                           true)),
               want, 4.0 * tf_unit(t), "batched_matmul");
    }
    e->wait_all();
  }
}
