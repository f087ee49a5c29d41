// Half precision on CPU devices: the conversions' rounding (exact: nearest
// even, NaN and Inf kept, overflow to Inf, float16 subnormals), every op in
// bfloat16 and float16 against a float64 reference computed from the same
// rounded inputs (within the dtype's unit roundoff), TF32 rounding of GEMM
// inputs, mixed-dtype errors, loss-scaling ops, and layers under each
// precision. Each scenario on the naive and the threaded engine.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"
#include "weft/precision.h"
#include "weft/tensor.h"

namespace {

using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace ops = weft::ops;
namespace ref = weft_test::ref;
using Vec = std::vector<double>;
using i64 = std::int64_t;

const DType kHalves[] = {DType::bfloat16, DType::float16};

// The unit roundoff of a dtype (half the gap above 1).
double unit(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0x1p-24; }

float round_to(DType t, float v) {
  if (t == DType::bfloat16) return weft::bfloat16_to_float(weft::float_to_bfloat16(v));
  if (t == DType::float16) return weft::float16_to_float(weft::float_to_float16(v));
  return v;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A tensor of dtype t from random values, and the values it holds (rounded).
struct Input {
  Tensor t;
  std::vector<float> held;
  Vec wide() const { return Vec(held.begin(), held.end()); }
};
Input input(Engine& e, DType t, const Shape& s, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = random_values(static_cast<std::size_t>(s.numel()), seed, lo, hi);
  for (float& x : v) x = round_to(t, x);
  return {Tensor::from_host(e, s, v, Device::cpu(0), t), v};
}

// |got - want| <= tol for every element, tol = k units of t times max |want|
// plus k units of t times |want| (one rounding of the result, and float32
// work before it).
void check_half(const Tensor& got_t, DType t, const Vec& want, double k, const std::string& what) {
  INFO(what << " in " << weft::to_string(t));
  CHECK(got_t.dtype() == t);
  const std::vector<float> got = got_t.to_host();
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = k * unit(t) * (scale + std::abs(want[i])) + 1e-30;
    if (std::abs(got[i] - want[i]) > tol) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i] << " (tolerance " << tol << ")");
      return;
    }
  }
}

template <class F>
void for_each_engine(F&& fn) {
  for (const char* kind : {"naive", "threaded"}) {
    INFO("engine: " << kind);
    weft::EngineConfig c;
    c.kind = kind;
    c.cpu_devices = 1;
    c.workers_per_cpu_device = std::string(kind) == "naive" ? 1 : 2;
    auto engine = Engine::create(c);
    fn(*engine);
    engine->wait_all();
  }
}

// The nearest representable neighbours test: `r` is a nearest value of the
// type to x, and on a tie the one with an even last bit.
template <class Narrow, class Widen>
void check_nearest_even(float x, Narrow narrow, Widen widen, std::uint16_t max_finite_bits) {
  const std::uint16_t b = narrow(x);
  const float r = widen(b);
  if (std::isinf(r)) {
    CHECK(std::abs(x) >= widen(max_finite_bits));
    return;
  }
  const std::uint16_t mag = b & 0x7FFF;
  const float up = widen(static_cast<std::uint16_t>((b & 0x8000) | (mag + 1)));
  const float down = mag ? widen(static_cast<std::uint16_t>((b & 0x8000) | (mag - 1))) : -r;
  const double e = std::abs(static_cast<double>(x) - r);
  INFO("x = " << x << " rounded to " << r);
  CHECK(e <= std::abs(static_cast<double>(x) - up));
  CHECK(e <= std::abs(static_cast<double>(x) - down));
  if (e == std::abs(static_cast<double>(x) - up) || (mag && e == std::abs(static_cast<double>(x) - down)))
    CHECK((b & 1) == 0);
}

}  // namespace

TEST_CASE("precision - conversions round to nearest even, keep NaN and Inf, overflow to Inf") {
  using weft::bfloat16_to_float;
  using weft::float16_to_float;
  using weft::float_to_bfloat16;
  using weft::float_to_float16;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // bfloat16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  CHECK(float_to_bfloat16(1.0f) == 0x3F80);
  CHECK(float_to_bfloat16(1.0f + 0x1p-8f) == 0x3F80);
  CHECK(float_to_bfloat16(1.0f + 3 * 0x1p-8f) == 0x3F82);
  CHECK(float_to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81);
  CHECK(float_to_bfloat16(-2.0f) == 0xC000);
  CHECK(float_to_bfloat16(inf) == 0x7F80);
  CHECK(float_to_bfloat16(-inf) == 0xFF80);
  CHECK(float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7F80);  // past the largest bfloat16
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(nan))));
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(std::bit_cast<float>(0x7F800001u)))));  // low-payload NaN
  // float16: range, ties and subnormals.
  CHECK(float_to_float16(1.0f) == 0x3C00);
  CHECK(float_to_float16(65504.0f) == 0x7BFF);
  CHECK(float_to_float16(65519.0f) == 0x7BFF);
  CHECK(float_to_float16(65520.0f) == 0x7C00);
  CHECK(float_to_float16(-1e6f) == 0xFC00);
  CHECK(float_to_float16(0x1p-24f) == 0x0001);              // the smallest subnormal
  CHECK(float_to_float16(0x1p-25f) == 0x0000);              // a tie with 0: to even
  CHECK(float_to_float16(0x1.8p-25f) == 0x0001);
  CHECK(float_to_float16(3 * 0x1p-25f) == 0x0002);          // 1.5 units: tie to even (2)
  CHECK(float_to_float16(0x1p-14f) == 0x0400);              // the smallest normal
  CHECK(float_to_float16(0x1p-14f - 0x1p-25f) == 0x0400);   // rounds up into the normals
  CHECK(float_to_float16(-0.0f) == 0x8000);
  CHECK(std::isnan(float16_to_float(float_to_float16(nan))));
  CHECK(float16_to_float(0x0001) == 0x1p-24f);
  CHECK(float16_to_float(0x8400) == -0x1p-14f);
  // Every half value converts to float32 and back to itself.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f16 = float16_to_float(h), bf = bfloat16_to_float(h);
    if (std::isnan(f16)) CHECK(std::isnan(float16_to_float(float_to_float16(f16))));
    else if (float_to_float16(f16) != h) FAIL("float16 " << b << " does not round-trip");
    if (std::isnan(bf)) CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(bf))));
    else if (float_to_bfloat16(bf) != h) FAIL("bfloat16 " << b << " does not round-trip");
  }
  // Random floats over many binades: the nearest value, ties to even.
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(std::uniform_real_distribution<float>(-2, 2)(rng), std::uniform_int_distribution(-26, 17)(rng));
    check_nearest_even(x, float_to_float16, float16_to_float, 0x7BFF);
    check_nearest_even(x, float_to_bfloat16, bfloat16_to_float, 0x7F7F);
  }
  // TF32 keeps 10 mantissa bits, ties to even.
  CHECK(weft::round_to_tf32(1.0f + 0x1p-11f) == 1.0f);
  CHECK(weft::round_to_tf32(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);
  CHECK(weft::round_to_tf32(1.0f + 0x1p-12f) == 1.0f);
  CHECK(weft::round_to_tf32(inf) == inf);
}

TEST_CASE("precision - cast, from_host and to_host round exactly as the conversions") {
  for_each_engine([](Engine& e) {
    std::vector<float> v = random_values(1000, 3, -70000.0f, 70000.0f);
    v.insert(v.end(), {0.0f, -0.0f, 1e-8f, -3e-6f, 65520.0f, std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()});
    const Shape s{static_cast<i64>(v.size())};
    Tensor x = Tensor::from_host(e, s, v);
    for (DType t : kHalves) {
      INFO(weft::to_string(t));
      const Tensor h = ops::cast(x, t), direct = Tensor::from_host(e, s, v, Device::cpu(0), t);
      CHECK(h.dtype() == t);
      CHECK(h.nbytes() == v.size() * 2);
      const std::vector<float> got = h.to_host(), got_direct = direct.to_host(), back = ops::cast(h, DType::float32).to_host();
      for (std::size_t i = 0; i < v.size(); ++i) {
        const float want = round_to(t, v[i]);
        if (std::isnan(want)) {
          CHECK(std::isnan(got[i]));
          CHECK(std::isnan(back[i]));
          continue;
        }
        if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want) ||
            std::bit_cast<std::uint32_t>(got_direct[i]) != std::bit_cast<std::uint32_t>(want) ||
            std::bit_cast<std::uint32_t>(back[i]) != std::bit_cast<std::uint32_t>(want))
          FAIL("element " << i << " = " << v[i] << ": want " << want << ", cast " << got[i] << ", from_host "
                          << got_direct[i] << ", back " << back[i]);
      }
      // half -> other half goes through float32 exactly.
      const DType other = t == DType::bfloat16 ? DType::float16 : DType::bfloat16;
      const std::vector<float> cross = ops::cast(h, other).to_host();
      for (std::size_t i = 0; i < v.size(); ++i)
        if (!std::isnan(got[i]) && cross[i] != round_to(other, got[i]))
          FAIL("element " << i << ": " << got[i] << " to " << weft::to_string(other) << " gave " << cross[i]);
      Tensor z = Tensor::zeros(e, Shape{5}, Device::cpu(0), t), o = Tensor::full(e, Shape{3}, 1.0f / 3, Device::cpu(0), t);
      CHECK(z.to_host() == std::vector<float>(5, 0.0f));
      CHECK(o.to_host() == std::vector<float>(3, round_to(t, 1.0f / 3)));
      CHECK(o.copy_to(Device::cpu(0)).to_host() == o.to_host());
    }
  });
}

TEST_CASE("precision - elementwise ops, reductions and slices in bfloat16 and float16") {
  for_each_engine([](Engine& e) {
    for (DType t : kHalves) {
      for (const Shape& s : {Shape{0}, Shape{1}, Shape{37}, Shape{3, 70}, Shape{70001}}) {
        INFO("shape " << s.str());
        const Input a = input(e, t, s, 1), b = input(e, t, s, 2);
        const std::size_t n = a.held.size();
        Vec add(n), sub(n), mul(n), adds(n), muls(n), relu(n), rgrad(n), axpy(n), scaled(n);
        double sum = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double p = a.held[i], q = b.held[i];
          add[i] = p + q;
          sub[i] = p - q;
          mul[i] = p * q;
          adds[i] = p + 0.3f;
          muls[i] = p * -1.7f;
          relu[i] = p > 0 ? p : 0;
          rgrad[i] = p > 0 ? q : 0;
          axpy[i] = q + 0.5f * p;
          scaled[i] = p * 4.0;
          sum += p;
        }
        check_half(ops::add(a.t, b.t), t, add, 1, "add");
        check_half(ops::sub(a.t, b.t), t, sub, 1, "sub");
        check_half(ops::mul(a.t, b.t), t, mul, 1, "mul");
        check_half(ops::add_scalar(a.t, 0.3f), t, adds, 1, "add_scalar");
        check_half(ops::mul_scalar(a.t, -1.7f), t, muls, 1, "mul_scalar");
        check_half(ops::relu(a.t), t, relu, 0, "relu (exact)");
        check_half(ops::relu_grad(a.t, b.t), t, rgrad, 0, "relu_grad (exact)");
        Tensor y = Tensor::from_host(e, s, b.held, Device::cpu(0), t);
        ops::axpy(0.5f, a.t, y);
        check_half(y, t, axpy, 1, "axpy");
        check_half(ops::scale_by(a.t, Tensor::full(e, Shape{1}, 4.0f)), t, scaled, 0, "scale_by (exact)");
        check_half(ops::sum(a.t), t, Vec{sum}, 1, "sum");
        check_half(ops::mean(a.t), t, Vec{n ? sum / static_cast<double>(n) : 0.0}, n ? 1 : 0, n ? "mean" : "mean of none");
        if (s.rank() == 2) {
          const Tensor rows = ops::slice_rows(a.t, 1, 3);
          check_half(rows, t, Vec(a.held.begin() + 70, a.held.begin() + 210), 0, "slice_rows (exact)");
          const std::vector<float> am = ops::argmax(a.t).to_host();
          for (i64 r = 0; r < 3; ++r) {
            const auto row = a.held.begin() + r * 70;
            CHECK(am[static_cast<std::size_t>(r)] == static_cast<float>(std::max_element(row, row + 70) - row));
          }
          CHECK(ops::argmax(a.t).dtype() == DType::float32);
        }
      }
    }
  });
}

TEST_CASE("precision - matmul and dense in bfloat16 and float16 accumulate in float32") {
  for_each_engine([](Engine& e) {
    for (DType t : kHalves) {
      for (auto [m, k, n] : {std::tuple<i64, i64, i64>{1, 1, 1}, {7, 300, 5}, {64, 33, 17}, {3, 0, 4}}) {
        INFO("m k n = " << m << " " << k << " " << n);
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            const Input a = input(e, t, ta ? Shape{k, m} : Shape{m, k}, 3), b = input(e, t, tb ? Shape{n, k} : Shape{k, n}, 4);
            Vec c(static_cast<std::size_t>(m * n), 0.0);
            ref::gemm(ta, tb, m, n, k, 1.0, a.wide(), ta ? m : k, b.wide(), tb ? k : n, 0.0, c, n);
            // Float32 accumulation of k products: well inside a few units of the half.
            check_half(ops::matmul(a.t, b.t, ta, tb), t, c, 2, "matmul");
          }
        if (k == 0) continue;
        const Input x = input(e, t, Shape{m, k}, 5), w = input(e, t, Shape{n, k}, 6), bias = input(e, t, Shape{n}, 7),
                    dy = input(e, t, Shape{m, n}, 8);
        const Vec bw = bias.wide();
        check_half(ops::dense(x.t, w.t, bias.t), t, ref::dense_forward(x.wide(), w.wide(), &bw, m, k, n), 2, "dense");
        ops::DenseGrads g = ops::dense_backward(x.t, w.t, dy.t);
        Vec dx(static_cast<std::size_t>(m * k), 0.0), dw(static_cast<std::size_t>(n * k), 0.0), db(static_cast<std::size_t>(n), 0.0);
        ref::gemm(false, false, m, k, n, 1.0, dy.wide(), n, w.wide(), k, 0.0, dx, k);
        ref::gemm(true, false, n, k, m, 1.0, dy.wide(), n, x.wide(), k, 0.0, dw, k);
        for (i64 i = 0; i < m; ++i)
          for (i64 j = 0; j < n; ++j) db[static_cast<std::size_t>(j)] += dy.held[static_cast<std::size_t>(i * n + j)];
        check_half(g.dx, t, dx, 2, "dense_backward dx");
        check_half(g.dw, t, dw, 2, "dense_backward dw");
        check_half(g.db, t, db, 2, "dense_backward db");
        check_half(ops::dense_backward_data(dy.t, w.t), t, dx, 2, "dense_backward_data");
        check_half(ops::dense_backward_weight(x.t, dy.t).dw, t, dw, 2, "dense_backward_weight");
      }
    }
  });
}

TEST_CASE("precision - convolutions, pooling, batch norm and the loss in bfloat16 and float16") {
  for_each_engine([](Engine& e) {
    for (DType t : kHalves) {
      const weft::kernels::ConvGeometry g{3, 4, 9, 8, 5, 3, 3, 2, 1};
      const Input x = input(e, t, Shape{g.n, g.c, g.h, g.w}, 11), w = input(e, t, Shape{g.o, g.c, g.kh, g.kw}, 12),
                  b = input(e, t, Shape{g.o}, 13), dy = input(e, t, Shape{g.n, g.o, g.out_h(), g.out_w()}, 14);
      const ops::Conv2dParams p{g.stride, g.pad};
      const Vec bw = b.wide();
      check_half(ops::conv2d(x.t, w.t, b.t, p), t, ref::conv_forward(x.wide(), w.wide(), &bw, g), 2, "conv2d");
      check_half(ops::conv2d_backward_data(dy.t, w.t, x.t.shape(), p), t, ref::conv_backward_data(dy.wide(), w.wide(), g),
                 2, "conv2d_backward_data");
      const ops::ConvFilterGrads fg = ops::conv2d_backward_filter(x.t, dy.t, w.t.shape(), p);
      check_half(fg.dw, t, ref::conv_backward_filter(x.wide(), dy.wide(), g), 2, "conv2d_backward_filter dw");
      check_half(fg.db, t, ref::conv_backward_bias(dy.wide(), g), 2, "conv2d_backward_filter db");

      const weft::kernels::PoolGeometry pg{2, 3, 7, 6, 3, 2, 1};
      const Input px = input(e, t, Shape{pg.n, pg.c, pg.h, pg.w}, 15), pdy = input(e, t, Shape{pg.n, pg.c, pg.out_h(), pg.out_w()}, 16);
      const ops::Pool2dParams pp{pg.kernel, pg.stride, pg.pad};
      check_half(ops::avg_pool2d(px.t, pp), t, ref::avg_pool_forward(px.wide(), pg), 2, "avg_pool2d");
      check_half(ops::avg_pool2d_backward(pdy.t, px.t.shape(), pp), t, ref::avg_pool_backward(pdy.wide(), pg), 2,
                 "avg_pool2d_backward");
      check_half(ops::max_pool2d(px.t, pp), t, ref::max_pool_forward(px.wide(), pg), 0, "max_pool2d (exact)");
      check_half(ops::max_pool2d_backward(px.t, pdy.t, pp), t, ref::max_pool_backward(px.wide(), pdy.wide(), pg), 1,
                 "max_pool2d_backward (overlapping windows add)");
      check_half(ops::global_avg_pool2d(px.t), t, ref::global_avg_pool_forward(px.wide(), pg.n * pg.c, pg.h * pg.w), 2,
                 "global_avg_pool2d");

      // Batch norm: x half, per-channel tensors float32, statistics in float32.
      const Input bx = input(e, t, Shape{4, 3, 5, 5}, 17, -2.0f, 3.0f);
      Tensor gamma = Tensor::from_host(e, Shape{3}, std::vector<float>{1.0f, 0.5f, -2.0f});
      Tensor beta = Tensor::from_host(e, Shape{3}, std::vector<float>{0.0f, 0.25f, 1.0f});
      Tensor rm = Tensor::zeros(e, Shape{3}), rv = Tensor::ones(e, Shape{3});
      const ops::BatchNormTrain bn = ops::batch_norm_train(bx.t, gamma, beta, rm, rv);
      const ref::BatchNormRef want = ref::batch_norm_forward(bx.wide(), {1.0, 0.5, -2.0}, {0.0, 0.25, 1.0}, 4, 3, 25, 1e-5);
      check_half(bn.y, t, want.y, 4, "batch_norm_train y");
      CHECK(bn.save_mean.dtype() == DType::float32);
      ref::check_close(bn.save_mean.to_host(), want.mean, 1e-6, "batch_norm_train mean (float32)");
      CHECK(rm.dtype() == DType::float32);
      const Input bdy = input(e, t, bx.t.shape(), 18);
      const ops::BatchNormGrads bg = ops::batch_norm_backward(bx.t, bdy.t, gamma, bn.save_mean, bn.save_invstd);
      CHECK(bg.dx.dtype() == t);
      CHECK(bg.dgamma.dtype() == DType::float32);
      // Reference: the float32 op on the same (exactly widened) values.
      const ops::BatchNormGrads bg32 = ops::batch_norm_backward(ops::cast(bx.t, DType::float32), ops::cast(bdy.t, DType::float32),
                                                                gamma, bn.save_mean, bn.save_invstd);
      const std::vector<float> dx32 = bg32.dx.to_host();
      check_half(bg.dx, t, Vec(dx32.begin(), dx32.end()), 2, "batch_norm_backward dx");
      ref::check_close(bg.dgamma.to_host(), ref::to_double(bg32.dgamma.to_host()), 1e-5, "batch_norm_backward dgamma");

      // Softmax cross-entropy: float32 loss from half logits.
      const Input z = input(e, t, Shape{6, 10}, 19, -4.0f, 4.0f);
      const std::vector<float> labels{0, 3, 9, 9, 1, 5};
      const ops::SoftmaxCrossEntropy ce = ops::softmax_cross_entropy(z.t, Tensor::from_host(e, Shape{6}, labels));
      CHECK(ce.loss.dtype() == DType::float32);
      CHECK(ce.loss.item() == doctest::Approx(ref::softmax_ce_loss(z.wide(), labels, 6, 10)).epsilon(1e-6));
      check_half(ce.dlogits, t, ref::softmax_ce_grad(z.wide(), labels, 6, 10), 1, "softmax_cross_entropy dlogits");
    }
  });
}

TEST_CASE("precision - AllowTf32 rounds float32 GEMM and convolution inputs to TF32, and only there") {
  for_each_engine([](Engine& e) {
    // Values with low mantissa bits set: TF32 drops them.
    const std::vector<float> av{1.0f + 0x1p-12f, 2.0f + 0x1p-11f, -3.0f - 0x1p-13f, 0.5f + 0x1p-14f};
    const std::vector<float> bv{1.0f + 0x1p-13f, 1.0f, 1.0f - 0x1p-20f, 3.0f};
    Tensor a = Tensor::from_host(e, Shape{1, 4}, av), b = Tensor::from_host(e, Shape{4, 1}, bv);
    double exact = 0, tf32 = 0;
    for (int i = 0; i < 4; ++i) {
      exact += static_cast<double>(av[i]) * bv[i];
      tf32 += static_cast<double>(weft::round_to_tf32(av[i])) * weft::round_to_tf32(bv[i]);
    }
    CHECK(ops::matmul(a, b).item() == doctest::Approx(exact).epsilon(1e-7));
    Tensor sum_before;
    {
      ops::AllowTf32 on;
      CHECK(ops::AllowTf32::active());
      CHECK(ops::matmul(a, b).item() == doctest::Approx(tf32).epsilon(1e-7));
      CHECK(ops::matmul(a, b).item() != doctest::Approx(exact).epsilon(1e-7));
      sum_before = ops::add(a, a);  // not a GEMM: exact
      {
        ops::AllowTf32 off(false);
        CHECK(ops::matmul(a, b).item() == doctest::Approx(exact).epsilon(1e-7));
      }
    }
    CHECK_FALSE(ops::AllowTf32::active());
    const std::vector<float> doubled = sum_before.to_host();
    for (int i = 0; i < 4; ++i) CHECK(doubled[static_cast<std::size_t>(i)] == 2 * av[static_cast<std::size_t>(i)]);
    // A 1x1 convolution is a GEMM too.
    Tensor x = Tensor::from_host(e, Shape{1, 4, 1, 1}, av), w = Tensor::from_host(e, Shape{1, 4, 1, 1}, bv);
    ops::AllowTf32 on;
    CHECK(ops::conv2d(x, w, Tensor()).item() == doctest::Approx(tf32).epsilon(1e-7));
  });
}

TEST_CASE("precision - mixing dtypes is an InvalidArgument naming both tensors and dtypes") {
  for_each_engine([](Engine& e) {
    Tensor a = Tensor::ones(e, Shape{2, 3});
    a.set_name("activations");
    Tensor b = Tensor::ones(e, Shape{2, 3}, Device::cpu(0), DType::bfloat16);
    b.set_name("weights_bf16");
    auto says = [](auto&& f, std::vector<std::string> words) {
      try {
        f();
        FAIL("no error");
      } catch (const weft::InvalidArgument& err) {
        const std::string msg = err.what();
        for (const std::string& w : words) CHECK_MESSAGE(msg.find(w) != std::string::npos, msg << " lacks " << w);
      }
    };
    says([&] { ops::add(a, b); }, {"add", "activations", "float32", "weights_bf16", "bfloat16"});
    says([&] { ops::matmul(a, b.reshape(Shape{3, 2})); }, {"matmul", "float32", "bfloat16"});
    says([&] { ops::dense(b, a, Tensor()); }, {"dense", "bfloat16", "float32"});
    Tensor c = Tensor::ones(e, Shape{1, 1, 4, 4}, Device::cpu(0), DType::float16), w = Tensor::ones(e, Shape{1, 1, 3, 3});
    says([&] { ops::conv2d(c, w, Tensor()); }, {"conv2d", "float16", "float32"});
    says([&] { Tensor y = a; y.copy_from(b); }, {"copy_from", "float32", "bfloat16"});
    Tensor gamma16 = Tensor::ones(e, Shape{1}, Device::cpu(0), DType::float16), ones = Tensor::ones(e, Shape{1});
    Tensor rm = Tensor::zeros(e, Shape{1}), rv = Tensor::ones(e, Shape{1});
    says([&] { ops::batch_norm_train(c, gamma16, ones, rm, rv); }, {"batch_norm_train", "gamma", "float16", "float32"});
    Tensor w16 = Tensor::ones(e, Shape{3}, Device::cpu(0), DType::bfloat16);
    says([&] { ops::sgd_update(w16, w16, 0.1f); }, {"sgd_update", "bfloat16", "float32"});
    says([&] { ops::cast(a, DType::int32); }, {"cast", "int32"});
    says([&] { Tensor::zeros(e, Shape{2}, Device::cpu(0), DType::int64); }, {"int64"});
  });
}

TEST_CASE("precision - loss scaling ops: unscale, find Inf and NaN, skip, grow and back off") {
  for_each_engine([](Engine& e) {
    Tensor scale = Tensor::full(e, Shape{1}, 8.0f), tracker = Tensor::zeros(e, Shape{1}), skipped = Tensor::zeros(e, Shape{1});
    Tensor g1 = Tensor::from_host(e, Shape{3}, std::vector<float>{8, -16, 4}), g2 = Tensor::from_host(e, Shape{2}, std::vector<float>{2, 0});
    Tensor found = ops::unscale_and_check({g1, g2}, scale);
    CHECK(found.item() == 0.0f);
    CHECK(g1.to_host() == std::vector<float>{1, -2, 0.5f});
    CHECK(g2.to_host() == std::vector<float>{0.25f, 0});
    Tensor w = Tensor::from_host(e, Shape{3}, std::vector<float>{1, 1, 1});
    ops::sgd_update(w, g1, 0.5f, 0.0f, found);
    CHECK(w.to_host() == std::vector<float>{0.5f, 2, 0.75f});
    const ops::LossScaleRule rule{2.0f, 0.5f, 3};
    for (int i = 0; i < 2; ++i) ops::update_loss_scale(scale, tracker, skipped, found, rule);
    CHECK(scale.item() == 8.0f);
    CHECK(tracker.item() == 2.0f);
    ops::update_loss_scale(scale, tracker, skipped, found, rule);  // the third clean step: grow
    CHECK(scale.item() == 16.0f);
    CHECK(tracker.item() == 0.0f);
    // An Inf in one gradient, a NaN in another: found, the step skipped, the scale halved.
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      Tensor h = Tensor::from_host(e, Shape{2}, std::vector<float>{1, bad});
      Tensor f = ops::unscale_and_check({g2, h}, scale);
      CHECK(f.item() == 1.0f);
      ops::sgd_update(w, g1, 0.5f, 0.0f, f);
      CHECK(w.to_host() == std::vector<float>{0.5f, 2, 0.75f});
      ops::update_loss_scale(scale, tracker, skipped, f, rule);
    }
    CHECK(scale.item() == 4.0f);
    CHECK(skipped.item() == 2.0f);
    CHECK_THROWS_AS(ops::update_loss_scale(scale, tracker, skipped, found, ops::LossScaleRule{0.5f, 0.5f, 3}),
                    weft::InvalidArgument);
  });
}

TEST_CASE("precision - layers under each precision keep float32 parameters and gradients") {
  for_each_engine([](Engine& e) {
    const std::vector<float> xs = random_values(8 * 28 * 28, 21);
    const std::vector<float> labels{0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<std::vector<float>> ref_grads;
    for (weft::Precision p : {weft::Precision::fp32, weft::Precision::tf32, weft::Precision::bf16, weft::Precision::fp16}) {
      INFO("precision " << weft::to_string(p));
      auto net = weft::nn::lenet(e, Device::cpu(0), 5);
      net->set_precision(p);
      CHECK((*net)[0].precision() == p);
      Tensor x = Tensor::from_host(e, Shape{8, 1, 28, 28}, xs);
      Tensor logits = net->forward(x);
      CHECK(logits.dtype() == weft::compute_dtype(p));
      const ops::SoftmaxCrossEntropy ce =
          ops::softmax_cross_entropy(ops::cast(logits, DType::float32), Tensor::from_host(e, Shape{8}, labels));
      net->backward(ce.dlogits);
      for (weft::nn::Parameter* prm : net->parameters()) {
        CHECK(prm->value.dtype() == DType::float32);
        REQUIRE(prm->grad.defined());
        CHECK(prm->grad.dtype() == DType::float32);
      }
      // Each parameter's gradient points where the float32 one does: cosine
      // similarity above 1 - 40 units of the compute type (the first layer's
      // sums over 5408 products of both signs lose the most).
      const double floor = 1 - 40 * (p == weft::Precision::bf16 ? 0x1p-8 : p == weft::Precision::fp16 ? 0x1p-11 : 0x1p-11);
      std::vector<std::vector<float>> grads;
      for (weft::nn::Parameter* prm : net->parameters()) grads.push_back(prm->grad.to_host());
      if (p == weft::Precision::fp32) {
        ref_grads = grads;
        continue;
      }
      bool differs = false;
      for (std::size_t k = 0; k < grads.size(); ++k) {
        double dot = 0, na = 0, nb = 0;
        for (std::size_t i = 0; i < grads[k].size(); ++i) {
          dot += static_cast<double>(grads[k][i]) * ref_grads[k][i];
          na += static_cast<double>(grads[k][i]) * grads[k][i];
          nb += static_cast<double>(ref_grads[k][i]) * ref_grads[k][i];
          differs |= grads[k][i] != ref_grads[k][i];
        }
        INFO("parameter " << k);
        CHECK(dot / std::sqrt(na * nb) >= floor);
      }
      CHECK(differs);  // it did compute in another precision
    }
    CHECK(weft::parse_precision("bf16") == weft::Precision::bf16);
    CHECK_THROWS_AS(weft::parse_precision("fp8", "--precision"), weft::InvalidArgument);
  });
}

TEST_CASE("precision - deterministic runs are bitwise repeatable in every precision") {
  const std::vector<float> xs = random_values(16 * 28 * 28, 31);
  const std::vector<float> labels{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5};
  for (weft::Precision p : {weft::Precision::fp32, weft::Precision::tf32, weft::Precision::bf16, weft::Precision::fp16}) {
    INFO("precision " << weft::to_string(p));
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      weft::EngineConfig c;
      c.kind = "threaded";
      c.workers_per_cpu_device = 4;
      c.conv_algo = "deterministic";
      auto e = Engine::create(c);
      CHECK(e->conv_algo().deterministic);
      auto net = weft::nn::lenet(*e, Device::cpu(0), 3);
      net->set_precision(p);
      for (int step = 0; step < 3; ++step) {
        Tensor logits = net->forward(Tensor::from_host(*e, Shape{16, 1, 28, 28}, xs));
        net->backward(ops::softmax_cross_entropy(ops::cast(logits, DType::float32),
                                                 Tensor::from_host(*e, Shape{16}, labels)).dlogits);
        weft::nn::sgd_step(net->parameters(), 0.1f);
      }
      std::vector<float> all;
      for (weft::nn::Parameter* prm : net->parameters()) {
        const std::vector<float> v = prm->value.to_host();
        all.insert(all.end(), v.begin(), v.end());
      }
      runs.push_back(std::move(all));
      net.reset();
      e->wait_all();
    }
    REQUIRE(runs[0].size() == runs[1].size());
    CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0);
  }
}
