// CPU kernels (ops/src/cpu) against the float64 references of reference.h:
// every kernel over random and edge-case shapes (0, 1, odd sizes, stride 2,
// padding, kernel == input, overlapping pool windows), backward kernels
// against central finite differences, the random generators' statistics and
// determinism, the label check of the loss, and results that do not depend
// on the intra-op thread count or on several threads calling at once.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/intra_op.h"
#include "ops/reference.h"
#include "random.h"
#include "weft/error.h"

namespace k = weft::kernels::cpu;
using namespace weft_test::ref;

namespace {

constexpr double kTol = 1e-4;  // relative to the largest magnitude of the expected output
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Sets the intra-op thread count for a scope and restores the previous one.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : saved_(k::intra_op_threads()) { k::set_intra_op_threads(n); }
  ~IntraOpThreads() { k::set_intra_op_threads(saved_); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int saved_;
};

std::string conv_str(const ConvGeometry& g) {
  return "n=" + std::to_string(g.n) + " c=" + std::to_string(g.c) + " h=" + std::to_string(g.h) +
         " w=" + std::to_string(g.w) + " o=" + std::to_string(g.o) + " k=" + std::to_string(g.kh) + "x" +
         std::to_string(g.kw) + " stride=" + std::to_string(g.stride) + " pad=" + std::to_string(g.pad);
}

std::string pool_str(const PoolGeometry& g) {
  return "n=" + std::to_string(g.n) + " c=" + std::to_string(g.c) + " h=" + std::to_string(g.h) +
         " w=" + std::to_string(g.w) + " kernel=" + std::to_string(g.kernel) + " stride=" + std::to_string(g.stride) +
         " pad=" + std::to_string(g.pad);
}

ConvGeometry conv(i64 n, i64 c, i64 h, i64 w, i64 o, i64 kh, i64 kw, i64 stride, i64 pad) {
  ConvGeometry g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.o = o, g.kh = kh, g.kw = kw, g.stride = stride, g.pad = pad;
  return g;
}

PoolGeometry pool(i64 n, i64 c, i64 h, i64 w, i64 kernel, i64 stride, i64 pad = 0) {
  PoolGeometry g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.kernel = kernel, g.stride = stride, g.pad = pad;
  return g;
}

// Same bits (NaN included), which operator== on floats would not say.
bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

std::vector<float> nan_vec(i64 n) { return std::vector<float>(static_cast<std::size_t>(n), kNaN); }

// Distinct values (a shuffled ramp): no ties, so a small finite-difference
// step never moves a max-pool window's maximum.
std::vector<float> distinct(Rng& rng, i64 n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = 0.01f * static_cast<float>(i) - 0.005f * static_cast<float>(n);
  std::shuffle(v.begin(), v.end(), rng.gen);
  return v;
}

std::vector<ConvGeometry> conv_shapes(Rng& rng) {
  std::vector<ConvGeometry> s = {
      conv(2, 3, 7, 7, 4, 3, 3, 1, 1),     // same padding
      conv(1, 1, 1, 1, 1, 1, 1, 1, 0),     // all ones
      conv(3, 2, 8, 6, 5, 3, 3, 2, 1),     // stride 2, padding 1
      conv(2, 3, 9, 7, 3, 3, 3, 2, 1),     // stride 2 over odd sizes
      conv(2, 3, 5, 5, 2, 5, 5, 1, 0),     // kernel == input
      conv(0, 3, 5, 5, 2, 3, 3, 1, 1),     // empty batch
      conv(2, 4, 6, 6, 3, 1, 1, 1, 0),     // 1x1: the image is its own column matrix
      conv(2, 3, 6, 6, 2, 1, 1, 2, 0),     // 1x1 with stride: not
      conv(2, 2, 9, 7, 3, 2, 3, 2, 0),     // non-square kernel
      conv(1, 2, 2, 2, 2, 3, 3, 1, 1),     // kernel larger than the input, padded
      conv(2, 3, 4, 4, 3, 3, 3, 1, 2),     // padding larger than half the kernel
      conv(2, 0, 4, 4, 3, 3, 3, 1, 1),     // no input channels: bias only
      conv(2, 2, 4, 4, 0, 3, 3, 1, 1),     // no output channels
      conv(4, 6, 13, 11, 5, 4, 4, 3, 2),   // stride 3
      conv(16, 1, 28, 28, 6, 5, 5, 1, 0),  // LeNet conv1
      conv(8, 6, 12, 12, 16, 5, 5, 1, 0),  // LeNet conv2
      conv(3, 16, 10, 10, 32, 3, 3, 1, 1), // big enough per image for gemm to split
      conv(7, 3, 7, 7, 4, 3, 3, 1, 1),     // 7x7 outputs: images in groups of 6, the last group of 1
      conv(70, 2, 3, 3, 3, 3, 3, 2, 1),    // 2x2 outputs: groups of 64 and 6
      conv(9, 4, 4, 4, 5, 1, 1, 1, 0),     // 1x1 stride 1 on small planes: grouped, not direct
  };
  for (int i = 0; i < 20; ++i) {
    ConvGeometry g = conv(rng.integer(0, 3), rng.integer(1, 4), rng.integer(1, 9), rng.integer(1, 9),
                          rng.integer(1, 5), 1, 1, rng.integer(1, 3), rng.integer(0, 2));
    g.kh = rng.integer(1, g.h + 2 * g.pad);
    g.kw = rng.integer(1, g.w + 2 * g.pad);
    s.push_back(g);
  }
  return s;
}

std::vector<PoolGeometry> pool_shapes(Rng& rng) {
  std::vector<PoolGeometry> s = {
      pool(2, 3, 6, 6, 2, 2),  pool(1, 1, 1, 1, 1, 1),  // 1x1
      pool(2, 2, 7, 7, 3, 2),                           // overlapping windows, odd size
      pool(2, 2, 5, 4, 2, 1),                           // overlapping, stride 1
      pool(1, 3, 5, 5, 5, 1),                           // kernel == input
      pool(0, 3, 4, 4, 2, 2),                           // empty batch
      pool(3, 2, 9, 9, 3, 3),  pool(1, 1, 3, 5, 2, 2),  // leftover rows/columns no window covers
      pool(1, 1, 2, 2, 3, 1),                           // window larger than the input: empty output
      pool(4, 8, 32, 32, 2, 2),
      pool(2, 3, 28, 28, 3, 2, 1),                      // ResNet's stem pool: 3 stride 2 pad 1
      pool(1, 2, 7, 6, 3, 2, 1),                        // the same over odd sizes
      pool(1, 1, 1, 1, 3, 1, 1),                        // a window mostly padding
      pool(2, 1, 5, 5, 4, 3, 2),                        // pad == kernel / 2, stride past the kernel
      pool(1, 1, 2, 3, 2, 2, 1),                        // padded windows at both edges
  };
  for (int i = 0; i < 30; ++i) {
    PoolGeometry g = pool(rng.integer(0, 3), rng.integer(1, 4), rng.integer(1, 10), rng.integer(1, 10), 1,
                          rng.integer(1, 3));
    g.pad = i % 2 ? rng.integer(0, 2) : 0;
    g.kernel = rng.integer(std::max<i64>(1, 2 * g.pad), std::min(g.h, g.w) + 2 * g.pad);
    s.push_back(g);
  }
  return s;
}

}  // namespace

TEST_CASE("intra-op thread count is settable, validated and restored" * doctest::timeout(60)) {
  const int before = k::intra_op_threads();
  CHECK(before >= 1);
  CHECK(k::intra_op_arena().max_concurrency() == before);
  {
    IntraOpThreads t(3);
    CHECK(k::intra_op_threads() == 3);
    CHECK(k::intra_op_arena().max_concurrency() == 3);
    CHECK_THROWS_AS(k::set_intra_op_threads(0), weft::Error);
    CHECK_THROWS_AS(k::set_intra_op_threads(-2), weft::Error);
    CHECK(k::intra_op_threads() == 3);  // a refused value changes nothing
  }
  CHECK(k::intra_op_threads() == before);
}

TEST_CASE("fill, copy and the elementwise kernels match float64 references" * doctest::timeout(120)) {
  Rng rng(1);
  for (i64 n : {i64{0}, i64{1}, i64{7}, i64{1000}, (i64{1} << 17) + 3}) {
    CAPTURE(n);
    const auto a = rng.vec(n), b = rng.vec(n);
    const Vec da = to_double(a), db = to_double(b);
    std::vector<float> y = nan_vec(n);
    Vec want(static_cast<std::size_t>(n));
    auto expect = [&](auto f, const char* what) {
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = f(i);
      check_close(y, want, kTol, what);
    };

    k::fill(y.data(), n, 2.5f);
    expect([](std::size_t) { return 2.5; }, "fill");
    k::copy(y.data(), a.data(), n);
    CHECK(y == a);
    k::add(y.data(), a.data(), b.data(), n);
    expect([&](std::size_t i) { return da[i] + db[i]; }, "add");
    k::sub(y.data(), a.data(), b.data(), n);
    expect([&](std::size_t i) { return da[i] - db[i]; }, "sub");
    k::mul(y.data(), a.data(), b.data(), n);
    expect([&](std::size_t i) { return da[i] * db[i]; }, "mul");
    k::add_scalar(y.data(), a.data(), -0.75f, n);
    expect([&](std::size_t i) { return da[i] - 0.75; }, "add_scalar");
    k::mul_scalar(y.data(), a.data(), 3.0f, n);
    expect([&](std::size_t i) { return da[i] * 3.0; }, "mul_scalar");
    y = b;
    k::axpy(y.data(), -1.5f, a.data(), n);
    expect([&](std::size_t i) { return db[i] - 1.5 * da[i]; }, "axpy");
    k::relu(y.data(), a.data(), n);
    expect([&](std::size_t i) { return std::max(da[i], 0.0); }, "relu");
    k::relu_grad(y.data(), a.data(), b.data(), n);
    expect([&](std::size_t i) { return da[i] > 0.0 ? db[i] : 0.0; }, "relu_grad");

    // In place: the output aliases an input.
    y = a;
    k::add(y.data(), y.data(), b.data(), n);
    expect([&](std::size_t i) { return da[i] + db[i]; }, "add in place");
    y = a;
    k::relu(y.data(), y.data(), n);
    expect([&](std::size_t i) { return std::max(da[i], 0.0); }, "relu in place");
  }
}

TEST_CASE("relu_grad matches finite differences of relu" * doctest::timeout(60)) {
  Rng rng(2);
  const i64 n = 301;
  std::vector<float> x = rng.vec(n);
  for (auto& v : x) v = v >= 0 ? v + 0.01f : v - 0.01f;  // keep clear of the kink
  const auto dy = rng.vec(n);
  Vec dx_ref = to_double(x), ddy = to_double(dy);
  const Vec g = numeric_grad(
      [&] {
        double s = 0.0;
        for (std::size_t i = 0; i < dx_ref.size(); ++i) s += std::max(dx_ref[i], 0.0) * ddy[i];
        return s;
      },
      dx_ref, 1e-4);
  std::vector<float> dx = nan_vec(n);
  k::relu_grad(dx.data(), x.data(), dy.data(), n);
  check_close(dx, g, kTol, "relu_grad vs finite differences");
}

TEST_CASE("sum accumulates in double and writes 0 for an empty input" * doctest::timeout(60)) {
  Rng rng(3);
  for (i64 n : {i64{0}, i64{1}, i64{17}, i64{100000}, (i64{1} << 20) + 5}) {
    CAPTURE(n);
    const auto x = rng.vec(n, 0.0f, 1.0f);
    float y = kNaN;
    k::sum(&y, x.data(), n);
    const Vec dx = to_double(x);
    check_close({y}, {std::accumulate(dx.begin(), dx.end(), 0.0)}, 1e-6, "sum");
  }
  // 2^24 + 1 in float would round away every added 1: double does not.
  std::vector<float> ones((1 << 24) + 8, 1.0f);
  float y = 0.0f;
  k::sum(&y, ones.data(), static_cast<i64>(ones.size()));
  CHECK(y == static_cast<float>(ones.size()));
}

TEST_CASE("argmax_rows returns the lowest index among ties" * doctest::timeout(60)) {
  Rng rng(4);
  for (auto [rows, cols] : std::vector<std::pair<i64, i64>>{{0, 5}, {1, 1}, {3, 1}, {7, 10}, {1000, 33}, {5, 4000}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    std::vector<float> x(static_cast<std::size_t>(rows * cols));
    for (auto& v : x) v = static_cast<float>(rng.integer(0, 3));  // many ties
    std::vector<float> y = nan_vec(rows);
    k::argmax_rows(y.data(), x.data(), rows, cols);
    for (i64 r = 0; r < rows; ++r) {
      const float* row = x.data() + r * cols;
      const auto want = std::max_element(row, row + cols) - row;  // the first of the largest
      REQUIRE(y[static_cast<std::size_t>(r)] == static_cast<float>(want));
    }
  }
}

TEST_CASE("gemm matches the reference for every transpose, shape, stride and split" * doctest::timeout(180)) {
  Rng rng(5);
  struct Shape {
    i64 m, n, k;
  };
  // The last two exceed the split threshold: one tall (split by rows of C),
  // one wide (split by columns).
  const std::vector<Shape> shapes = {{0, 3, 4}, {3, 0, 4},  {1, 1, 1},   {5, 7, 3},    {17, 1, 33},
                                     {1, 19, 8}, {64, 64, 64}, {300, 129, 70}, {24, 700, 150}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape& s : shapes)
        for (i64 pad : {0, 3})
          for (auto [alpha, beta] : std::vector<std::pair<float, float>>{{1.0f, 0.0f}, {0.5f, -1.5f}}) {
            CAPTURE(ta);
            CAPTURE(tb);
            CAPTURE(s.m);
            CAPTURE(s.n);
            CAPTURE(s.k);
            CAPTURE(pad);
            CAPTURE(beta);
            const i64 a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k;
            const i64 b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n;
            const i64 lda = a_cols + pad, ldb = b_cols + pad, ldc = s.n + pad;
            const auto a = rng.vec(a_rows * lda), b = rng.vec(b_rows * ldb);
            std::vector<float> c = rng.vec(s.m * ldc);
            constexpr float kSentinel = 123.0f;
            for (i64 i = 0; i < s.m; ++i)
              for (i64 j = 0; j < ldc; ++j) {
                float& v = c[static_cast<std::size_t>(i * ldc + j)];
                if (j >= s.n) v = kSentinel;   // outside C: must stay
                else if (beta == 0.0f) v = kNaN;  // beta == 0: C must not be read
              }
            Vec want = to_double(c);
            gemm(ta, tb, s.m, s.n, s.k, alpha, to_double(a), lda, to_double(b), ldb, beta, want, ldc);
            k::gemm(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            // The m x n block against the reference, the padding exactly as it was.
            std::vector<float> got_block;
            Vec want_block;
            bool padding_kept = true;
            for (i64 i = 0; i < s.m; ++i)
              for (i64 j = 0; j < ldc; ++j) {
                const auto at = static_cast<std::size_t>(i * ldc + j);
                if (j < s.n) {
                  got_block.push_back(c[at]);
                  want_block.push_back(want[at]);
                } else {
                  padding_kept = padding_kept && c[at] == kSentinel;
                }
              }
            check_close(got_block, want_block, kTol, "gemm");
            CHECK(padding_kept);
          }
}

TEST_CASE("gemm with k == 0 or alpha == 0 only scales C by beta" * doctest::timeout(60)) {
  const std::vector<float> a(12, 1.0f), b(12, 1.0f);
  std::vector<float> c(6, kNaN);
  k::gemm(false, false, 2, 3, 0, 1.0f, a.data(), 1, b.data(), 3, 0.0f, c.data(), 3);
  CHECK(c == std::vector<float>(6, 0.0f));
  c = {1, 2, 3, 4, 5, 6};
  k::gemm(false, false, 2, 3, 0, 1.0f, a.data(), 1, b.data(), 3, 2.0f, c.data(), 3);
  CHECK(c == std::vector<float>{2, 4, 6, 8, 10, 12});
  k::gemm(false, false, 2, 3, 4, 0.0f, a.data(), 4, b.data(), 3, 0.5f, c.data(), 3);
  CHECK(c == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("dense forward and backward match references and finite differences" * doctest::timeout(120)) {
  Rng rng(6);
  struct Shape {
    i64 batch, in, out;
  };
  for (const Shape s : std::vector<Shape>{{0, 4, 3}, {1, 1, 1}, {3, 5, 4}, {7, 13, 1}, {64, 784, 100}, {5, 0, 3}, {200, 300, 128}}) {
    CAPTURE(s.batch);
    CAPTURE(s.in);
    CAPTURE(s.out);
    const auto x = rng.vec(s.batch * s.in), w = rng.vec(s.out * s.in), b = rng.vec(s.out), dy = rng.vec(s.batch * s.out);
    const Vec dxv = to_double(x), dwv = to_double(w), dbv = to_double(b), ddy = to_double(dy);

    std::vector<float> y = nan_vec(s.batch * s.out);
    k::dense_forward(y.data(), x.data(), w.data(), b.data(), s.batch, s.in, s.out);
    check_close(y, dense_forward(dxv, dwv, &dbv, s.batch, s.in, s.out), kTol, "dense_forward");
    k::dense_forward(y.data(), x.data(), w.data(), nullptr, s.batch, s.in, s.out);
    check_close(y, dense_forward(dxv, dwv, nullptr, s.batch, s.in, s.out), kTol, "dense_forward without bias");

    std::vector<float> dx = nan_vec(s.batch * s.in), dw = nan_vec(s.out * s.in), db = nan_vec(s.out);
    k::dense_backward(dx.data(), dw.data(), db.data(), x.data(), w.data(), dy.data(), s.batch, s.in, s.out);
    Vec want_dx(dx.size()), want_dw(dw.size(), 0.0), want_db(db.size(), 0.0);
    for (i64 r = 0; r < s.batch; ++r)
      for (i64 o = 0; o < s.out; ++o) {
        const double g = ddy[static_cast<std::size_t>(r * s.out + o)];
        want_db[static_cast<std::size_t>(o)] += g;
        for (i64 i = 0; i < s.in; ++i) {
          want_dx[static_cast<std::size_t>(r * s.in + i)] += g * dwv[static_cast<std::size_t>(o * s.in + i)];
          want_dw[static_cast<std::size_t>(o * s.in + i)] += g * dxv[static_cast<std::size_t>(r * s.in + i)];
        }
      }
    check_close(dx, want_dx, kTol, "dense dx");
    check_close(dw, want_dw, kTol, "dense dw");
    check_close(db, want_db, kTol, "dense db");

    // Outputs not wanted are null and left alone.
    std::vector<float> only_db = nan_vec(s.out);
    k::dense_backward(nullptr, nullptr, only_db.data(), x.data(), w.data(), dy.data(), s.batch, s.in, s.out);
    CHECK(bitwise_equal(only_db, db));

    if (s.batch * s.in * s.out > 0 && s.batch * s.in * s.out < 1000) {
      Vec xs = dxv, ws = dwv, bs = dbv;
      auto loss = [&] { return dot(dense_forward(xs, ws, &bs, s.batch, s.in, s.out), ddy); };
      check_close(dx, numeric_grad(loss, xs, 1e-4), kTol, "dense dx vs finite differences");
      check_close(dw, numeric_grad(loss, ws, 1e-4), kTol, "dense dw vs finite differences");
      check_close(db, numeric_grad(loss, bs, 1e-4), kTol, "dense db vs finite differences");
    }
  }
}

TEST_CASE("conv2d forward and backward match references over many shapes" * doctest::timeout(180)) {
  Rng rng(7);
  for (const ConvGeometry& g : conv_shapes(rng)) {
    INFO(conv_str(g));
    const i64 xs = g.n * g.c * g.h * g.w, ws = g.o * g.c * g.kh * g.kw, ys = conv_y_size(g);
    const auto x = rng.vec(xs), w = rng.vec(ws), b = rng.vec(g.o), dy = rng.vec(ys);
    const Vec dxv = to_double(x), dwv = to_double(w), dbv = to_double(b), ddy = to_double(dy);

    std::vector<float> y = nan_vec(ys);
    k::conv2d_forward(y.data(), x.data(), w.data(), b.data(), g);
    check_close(y, conv_forward(dxv, dwv, &dbv, g), kTol, "conv forward");
    k::conv2d_forward(y.data(), x.data(), w.data(), nullptr, g);
    check_close(y, conv_forward(dxv, dwv, nullptr, g), kTol, "conv forward without bias");

    std::vector<float> dx = nan_vec(xs);
    k::conv2d_backward_data(dx.data(), dy.data(), w.data(), g);
    check_close(dx, conv_backward_data(ddy, dwv, g), kTol, "conv backward data");

    std::vector<float> dw = nan_vec(ws), db = nan_vec(g.o);
    k::conv2d_backward_filter(dw.data(), db.data(), x.data(), dy.data(), g);
    check_close(dw, conv_backward_filter(dxv, ddy, g), kTol, "conv backward filter");
    check_close(db, conv_backward_bias(ddy, g), kTol, "conv backward bias");
    std::vector<float> dw_only = nan_vec(ws);
    k::conv2d_backward_filter(dw_only.data(), nullptr, x.data(), dy.data(), g);
    CHECK(bitwise_equal(dw_only, dw));
  }
}

TEST_CASE("conv2d gradients match finite differences" * doctest::timeout(120)) {
  Rng rng(8);
  for (const ConvGeometry& g : {conv(2, 2, 5, 5, 3, 3, 3, 1, 1), conv(1, 2, 6, 5, 2, 3, 3, 2, 1),
                                conv(1, 1, 4, 4, 2, 4, 4, 1, 0), conv(2, 1, 5, 3, 2, 2, 1, 2, 0)}) {
    INFO(conv_str(g));
    const auto x = rng.vec(g.n * g.c * g.h * g.w), w = rng.vec(g.o * g.c * g.kh * g.kw), b = rng.vec(g.o);
    const auto dy = rng.vec(conv_y_size(g));
    Vec xs = to_double(x), ws = to_double(w), bs = to_double(b);
    const Vec ddy = to_double(dy);
    auto loss = [&] { return dot(conv_forward(xs, ws, &bs, g), ddy); };

    std::vector<float> dx = nan_vec(static_cast<i64>(x.size())), dw = nan_vec(static_cast<i64>(w.size())), db = nan_vec(g.o);
    k::conv2d_backward_data(dx.data(), dy.data(), w.data(), g);
    k::conv2d_backward_filter(dw.data(), db.data(), x.data(), dy.data(), g);
    check_close(dx, numeric_grad(loss, xs, 1e-4), kTol, "conv dx vs finite differences");
    check_close(dw, numeric_grad(loss, ws, 1e-4), kTol, "conv dw vs finite differences");
    check_close(db, numeric_grad(loss, bs, 1e-4), kTol, "conv db vs finite differences");
  }
}

TEST_CASE("pooling forward and backward match references over many shapes" * doctest::timeout(120)) {
  Rng rng(9);
  for (const PoolGeometry& g : pool_shapes(rng)) {
    INFO(pool_str(g));
    const i64 xs = g.n * g.c * g.h * g.w, ys = pool_y_size(g);
    // Small integers: many ties inside windows, so the first-maximum rule is exercised.
    std::vector<float> x(static_cast<std::size_t>(xs));
    for (auto& v : x) v = static_cast<float>(rng.integer(-3, 3));
    const auto dy = rng.vec(ys);
    const Vec dxv = to_double(x), ddy = to_double(dy);

    std::vector<float> y = nan_vec(ys), dx = nan_vec(xs);
    k::avg_pool2d_forward(y.data(), x.data(), g);
    check_close(y, avg_pool_forward(dxv, g), kTol, "avg pool forward");
    k::avg_pool2d_backward(dx.data(), dy.data(), g);
    check_close(dx, avg_pool_backward(ddy, g), kTol, "avg pool backward");

    y = nan_vec(ys);
    dx = nan_vec(xs);
    k::max_pool2d_forward(y.data(), x.data(), g);
    check_close(y, max_pool_forward(dxv, g), 0.0, "max pool forward");
    k::max_pool2d_backward(dx.data(), x.data(), dy.data(), g);
    check_close(dx, max_pool_backward(dxv, ddy, g), kTol, "max pool backward");
  }
}

TEST_CASE("max pool routes ties to the first maximum and accumulates overlapping windows" * doctest::timeout(60)) {
  // One 3x3 plane of zeros, 2x2 windows at stride 1: four overlapping windows
  // whose first maxima are their top-left corners.
  const PoolGeometry g = pool(1, 1, 3, 3, 2, 1);
  const std::vector<float> x(9, 0.0f), dy = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> dx = nan_vec(9);
  k::max_pool2d_backward(dx.data(), x.data(), dy.data(), g);
  CHECK(dx == std::vector<float>{1, 2, 0, 3, 4, 0, 0, 0, 0});

  // The centre is the maximum of all four windows: it gets every gradient.
  const std::vector<float> peak = {0, 0, 0, 0, 5, 0, 0, 0, 0};
  std::vector<float> y(4);
  k::max_pool2d_forward(y.data(), peak.data(), g);
  CHECK(y == std::vector<float>{5, 5, 5, 5});
  k::max_pool2d_backward(dx.data(), peak.data(), dy.data(), g);
  CHECK(dx == std::vector<float>{0, 0, 0, 0, 10, 0, 0, 0, 0});

  // Overlapping average windows: the centre of a 3x3 plane is in all four.
  k::avg_pool2d_backward(dx.data(), dy.data(), g);
  CHECK(dx == std::vector<float>{0.25f, 0.75f, 0.5f, 1.0f, 2.5f, 1.5f, 0.75f, 1.75f, 1.0f});
}

TEST_CASE("pooling gradients match finite differences" * doctest::timeout(60)) {
  Rng rng(10);
  for (const PoolGeometry& g : {pool(2, 2, 6, 6, 2, 2), pool(1, 2, 7, 7, 3, 2), pool(1, 1, 5, 4, 2, 1), pool(1, 1, 4, 4, 4, 1),
                                pool(1, 2, 7, 7, 3, 2, 1), pool(2, 1, 5, 6, 2, 2, 1)}) {
    INFO(pool_str(g));
    const auto x = distinct(rng, g.n * g.c * g.h * g.w);
    const auto dy = rng.vec(pool_y_size(g));
    Vec xs = to_double(x);
    const Vec ddy = to_double(dy);
    std::vector<float> dx = nan_vec(static_cast<i64>(x.size()));

    k::avg_pool2d_backward(dx.data(), dy.data(), g);
    check_close(dx, numeric_grad([&] { return dot(avg_pool_forward(xs, g), ddy); }, xs, 1e-4), kTol,
                "avg pool dx vs finite differences");
    k::max_pool2d_backward(dx.data(), x.data(), dy.data(), g);
    check_close(dx, numeric_grad([&] { return dot(max_pool_forward(xs, g), ddy); }, xs, 1e-4), kTol,
                "max pool dx vs finite differences");
  }
}

TEST_CASE("max pool never picks padding, even when every input is negative" * doctest::timeout(60)) {
  // 3x3 window, stride 2, pad 1 over a 3x3 plane of negatives: a padded zero
  // would win if padding took part.
  const PoolGeometry g = pool(1, 1, 3, 3, 3, 2, 1);
  const std::vector<float> x = {-9, -8, -7, -6, -5, -4, -3, -2, -1};
  std::vector<float> y = nan_vec(4);
  k::max_pool2d_forward(y.data(), x.data(), g);
  CHECK(y == std::vector<float>{-5, -4, -2, -1});
  // Averages divide by the whole 3x3 window: the top-left one sees 4 values.
  k::avg_pool2d_forward(y.data(), x.data(), g);
  CHECK(y[0] == doctest::Approx((-9 - 8 - 6 - 5) / 9.0));
}

TEST_CASE("global average pooling matches the reference" * doctest::timeout(60)) {
  Rng rng(21);
  for (auto [planes, hw] : {std::pair<i64, i64>{6, 49}, {1, 1}, {0, 16}, {5, 0}, {130, 16}, {3, 784}}) {
    CAPTURE(planes);
    CAPTURE(hw);
    const auto x = rng.vec(planes * hw), dy = rng.vec(planes);
    std::vector<float> y = nan_vec(planes);
    k::global_avg_pool2d_forward(y.data(), x.data(), planes, hw);
    check_close(y, global_avg_pool_forward(to_double(x), planes, hw), kTol, "global avg pool forward");
    std::vector<float> dx = nan_vec(planes * hw);
    k::global_avg_pool2d_backward(dx.data(), dy.data(), planes, hw);
    Vec xs = to_double(x);
    check_close(dx, numeric_grad([&] { return dot(global_avg_pool_forward(xs, planes, hw), to_double(dy)); }, xs, 1e-4),
                kTol, "global avg pool dx vs finite differences");
  }
}

namespace {

BatchNormGeometry bn(i64 n, i64 c, i64 hw) { return BatchNormGeometry{n, c, hw}; }

std::string bn_str(const BatchNormGeometry& g) {
  return "n=" + std::to_string(g.n) + " c=" + std::to_string(g.c) + " hw=" + std::to_string(g.hw);
}

}  // namespace

TEST_CASE("batch norm training forward matches the reference and updates the running statistics" *
          doctest::timeout(60)) {
  Rng rng(22);
  constexpr float eps = 1e-5f, momentum = 0.1f;
  for (const BatchNormGeometry& g : {bn(4, 3, 25), bn(2, 1, 1), bn(1, 2, 2), bn(7, 5, 9), bn(16, 8, 49), bn(3, 4, 1)}) {
    INFO(bn_str(g));
    const i64 size = g.n * g.c * g.hw;
    // A large offset per channel: the statistics must not cancel it away.
    std::vector<float> x = rng.vec(size);
    for (i64 i = 0; i < size; ++i) x[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)] * 2.0f + 100.0f * static_cast<float>((i / g.hw) % g.c);
    const auto gamma = rng.vec(g.c), beta = rng.vec(g.c);
    std::vector<float> rm = rng.vec(g.c), rv(static_cast<std::size_t>(g.c));
    for (auto& v : rv) v = rng.uniform(0.5f, 2.0f);
    const std::vector<float> rm0 = rm, rv0 = rv;
    std::vector<float> y = nan_vec(size), mean = nan_vec(g.c), invstd = nan_vec(g.c);
    k::batch_norm_forward_train(y.data(), mean.data(), invstd.data(), rm.data(), rv.data(), x.data(), gamma.data(),
                                beta.data(), g, eps, momentum);
    const BatchNormRef r = batch_norm_forward(to_double(x), to_double(gamma), to_double(beta), g.n, g.c, g.hw, eps);
    check_close(y, r.y, kTol, "batch norm y");
    check_close(mean, r.mean, 1e-6, "saved mean");
    Vec want_invstd(r.var.size()), want_rm(r.var.size()), want_rv(r.var.size());
    const double m = static_cast<double>(g.n * g.hw);
    for (std::size_t c = 0; c < r.var.size(); ++c) {
      want_invstd[c] = 1.0 / std::sqrt(r.var[c] + eps);
      want_rm[c] = 0.9 * rm0[c] + 0.1 * r.mean[c];
      want_rv[c] = 0.9 * rv0[c] + 0.1 * r.var[c] * m / (m - 1.0);  // unbiased
    }
    check_close(invstd, want_invstd, 1e-5, "saved inverse std");
    check_close(rm, want_rm, 1e-6, "running mean");
    check_close(rv, want_rv, 1e-5, "running var");
  }
  // One value per channel has no batch statistics.
  std::vector<float> one(2), stat(2), run(2);
  CHECK_THROWS_WITH_AS(k::batch_norm_forward_train(one.data(), stat.data(), stat.data(), run.data(), run.data(),
                                                   one.data(), one.data(), one.data(), bn(1, 2, 1), eps, momentum),
                       doctest::Contains("at least 2 values per channel"), weft::Error);
}

TEST_CASE("batch norm inference normalizes by the running statistics" * doctest::timeout(60)) {
  Rng rng(23);
  for (const BatchNormGeometry& g : {bn(4, 3, 25), bn(1, 1, 1), bn(0, 2, 4), bn(5, 6, 1)}) {
    INFO(bn_str(g));
    const i64 size = g.n * g.c * g.hw;
    const auto x = rng.vec(size), gamma = rng.vec(g.c), beta = rng.vec(g.c), rm = rng.vec(g.c);
    std::vector<float> rv(static_cast<std::size_t>(g.c));
    for (auto& v : rv) v = rng.uniform(0.1f, 3.0f);
    std::vector<float> y = nan_vec(size);
    k::batch_norm_forward_infer(y.data(), x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), g, 1e-3f);
    check_close(y, batch_norm_infer(to_double(x), to_double(gamma), to_double(beta), to_double(rm), to_double(rv), g.n,
                                    g.c, g.hw, 1e-3),
                kTol, "batch norm inference");
  }
}

TEST_CASE("batch norm backward matches finite differences of the training forward" * doctest::timeout(60)) {
  Rng rng(24);
  constexpr double eps = 1e-5;
  for (const BatchNormGeometry& g : {bn(4, 3, 5), bn(2, 2, 1), bn(3, 1, 7), bn(1, 2, 9), bn(6, 4, 4)}) {
    INFO(bn_str(g));
    const i64 size = g.n * g.c * g.hw;
    const auto x = rng.vec(size), gamma = rng.vec(g.c), beta = rng.vec(g.c), dy = rng.vec(size);
    std::vector<float> y = nan_vec(size), mean = nan_vec(g.c), invstd = nan_vec(g.c), rm(static_cast<std::size_t>(g.c)),
                       rv(static_cast<std::size_t>(g.c), 1.0f);
    k::batch_norm_forward_train(y.data(), mean.data(), invstd.data(), rm.data(), rv.data(), x.data(), gamma.data(),
                                beta.data(), g, static_cast<float>(eps), 0.1f);
    std::vector<float> dx = nan_vec(size), dgamma = nan_vec(g.c), dbeta = nan_vec(g.c);
    k::batch_norm_backward(dx.data(), dgamma.data(), dbeta.data(), x.data(), dy.data(), gamma.data(), mean.data(),
                           invstd.data(), g);
    Vec xs = to_double(x), gs = to_double(gamma), bs = to_double(beta);
    const Vec ddy = to_double(dy);
    auto loss = [&] { return dot(batch_norm_forward(xs, gs, bs, g.n, g.c, g.hw, eps).y, ddy); };
    check_close(dx, numeric_grad(loss, xs, 1e-4), 1e-3, "batch norm dx");
    check_close(dgamma, numeric_grad(loss, gs, 1e-4), 1e-4, "batch norm dgamma");
    check_close(dbeta, numeric_grad(loss, bs, 1e-4), 1e-4, "batch norm dbeta");
  }
}

TEST_CASE("softmax cross-entropy matches the reference and is stable for large logits" * doctest::timeout(60)) {
  Rng rng(11);
  for (auto [rows, cols] : std::vector<std::pair<i64, i64>>{{1, 1}, {3, 1}, {7, 10}, {64, 1000}, {1000, 10}}) {
    for (float offset : {0.0f, 1000.0f, -1e4f}) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(offset);
      std::vector<float> z = rng.vec(rows * cols, -20.0f, 20.0f), labels(static_cast<std::size_t>(rows));
      for (auto& v : z) v += offset;
      for (auto& l : labels) l = static_cast<float>(rng.integer(0, cols - 1));
      const Vec dz = to_double(z);
      float loss = kNaN;
      std::vector<float> grad = nan_vec(rows * cols);
      k::softmax_cross_entropy(&loss, grad.data(), z.data(), labels.data(), rows, cols);
      REQUIRE(std::isfinite(loss));
      check_close({loss}, {softmax_ce_loss(dz, labels, rows, cols)}, 1e-5, "loss");
      check_close(grad, softmax_ce_grad(dz, labels, rows, cols), kTol, "dlogits");
      float loss_only = kNaN;
      k::softmax_cross_entropy(&loss_only, nullptr, z.data(), labels.data(), rows, cols);
      CHECK(loss_only == loss);
    }
  }
  // One dominant logit per row, 1e4 apart: exp would overflow unshifted.
  const std::vector<float> z = {1e4f, -1e4f, 0.0f, 0.0f, 3e4f, 0.0f}, labels = {0.0f, 0.0f};
  float loss = kNaN;
  std::vector<float> grad(6);
  k::softmax_cross_entropy(&loss, grad.data(), z.data(), labels.data(), 2, 3);
  CHECK(loss == doctest::Approx(3e4 / 2).epsilon(1e-6));
  CHECK(grad[0] == 0.0f);
  CHECK(grad[3] == doctest::Approx(-0.5));
  CHECK(grad[4] == doctest::Approx(0.5));

  float empty_loss = kNaN;
  k::softmax_cross_entropy(&empty_loss, nullptr, nullptr, nullptr, 0, 10);
  CHECK(empty_loss == 0.0f);
}

TEST_CASE("softmax cross-entropy gradient matches finite differences" * doctest::timeout(60)) {
  Rng rng(12);
  const i64 rows = 5, cols = 7;
  const auto z = rng.vec(rows * cols, -3.0f, 3.0f);
  std::vector<float> labels(rows);
  for (auto& l : labels) l = static_cast<float>(rng.integer(0, cols - 1));
  float loss = 0.0f;
  std::vector<float> grad = nan_vec(rows * cols);
  k::softmax_cross_entropy(&loss, grad.data(), z.data(), labels.data(), rows, cols);
  Vec zs = to_double(z);
  check_close(grad, numeric_grad([&] { return softmax_ce_loss(zs, labels, rows, cols); }, zs, 1e-5), kTol,
              "dlogits vs finite differences");
}

TEST_CASE("softmax cross-entropy rejects labels that are not class indices, naming the row" * doctest::timeout(60)) {
  const i64 rows = 4, cols = 5;
  const std::vector<float> z(rows * cols, 0.0f);
  for (float bad : {3.5f, -1.0f, 5.0f, 1e10f, kNaN, std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    std::vector<float> labels = {0, 4, bad, 1};
    float loss = 0.0f;
    std::string msg;
    try {
      k::softmax_cross_entropy(&loss, nullptr, z.data(), labels.data(), rows, cols);
    } catch (const weft::Error& e) {
      msg = e.what();
    }
    CHECK(msg.find("row 2") != std::string::npos);
  }
  std::vector<float> labels = {0, 7, 1, -2};  // the first bad row is reported
  try {
    float loss = 0.0f;
    k::softmax_cross_entropy(&loss, nullptr, z.data(), labels.data(), rows, cols);
    FAIL("no error for label 7 of 5 classes");
  } catch (const weft::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("row 1") != std::string::npos);
    CHECK(msg.find('7') != std::string::npos);
  }
  labels = {0, 0, 2.5f, 0};
  try {
    float loss = 0.0f;
    k::softmax_cross_entropy(&loss, nullptr, z.data(), labels.data(), rows, cols);
    FAIL("no error for label 2.5");
  } catch (const weft::Error& e) {
    CHECK(std::string(e.what()).find("2.5") != std::string::npos);
  }
}

TEST_CASE("sgd_update applies the gradient and weight decay" * doctest::timeout(60)) {
  Rng rng(13);
  for (i64 n : {i64{0}, i64{1}, i64{999}, i64{1} << 17}) {
    CAPTURE(n);
    std::vector<float> w = rng.vec(n);
    const auto g = rng.vec(n);
    Vec want(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) want[i] = w[i] - 0.1 * (g[i] + 0.01 * w[i]);
    k::sgd_update(w.data(), g.data(), n, 0.1f, 0.01f);
    check_close(w, want, kTol, "sgd_update");
  }
}

TEST_CASE("uniform and normal have the expected statistics" * doctest::timeout(60)) {
  const i64 n = 100000;
  std::vector<float> u(n), z(n);
  k::uniform(u.data(), n, -2.0f, 3.0f, 42);
  k::normal(z.data(), n, 1.5f, 2.0f, 42);
  auto moments = [](const std::vector<float>& v) {
    double s = 0.0, s2 = 0.0;
    for (float x : v) s += x;
    const double mean = s / static_cast<double>(v.size());
    for (float x : v) s2 += (x - mean) * (x - mean);
    return std::pair{mean, std::sqrt(s2 / static_cast<double>(v.size()))};
  };
  // Standard errors at 1e5 samples are about 0.3% of the spread; the bounds
  // are several of them wide.
  const auto [umean, ustd] = moments(u);
  CHECK(std::abs(umean - 0.5) < 0.02);
  CHECK(std::abs(ustd - 5.0 / std::sqrt(12.0)) < 0.01 * 5.0 / std::sqrt(12.0));
  CHECK(*std::min_element(u.begin(), u.end()) >= -2.0f);
  CHECK(*std::max_element(u.begin(), u.end()) <= 3.0f);
  const auto [zmean, zstd] = moments(z);
  CHECK(std::abs(zmean - 1.5) < 0.03);
  CHECK(std::abs(zstd - 2.0) < 0.02 * 2.0);
  const auto within_one = std::count_if(z.begin(), z.end(), [](float x) { return std::abs(x - 1.5f) < 2.0f; });
  CHECK(std::abs(static_cast<double>(within_one) / n - 0.6827) < 0.01);
  for (float x : z) REQUIRE(std::isfinite(x));
}

TEST_CASE("uniform and normal are pure functions of seed and index" * doctest::timeout(60)) {
  const i64 n = 100000;
  std::vector<float> a(n), b(n), c(n), prefix(1001);
  k::uniform(a.data(), n, 0.0f, 1.0f, 7);
  k::uniform(b.data(), n, 0.0f, 1.0f, 7);
  k::uniform(c.data(), n, 0.0f, 1.0f, 8);
  k::uniform(prefix.data(), 1001, 0.0f, 1.0f, 7);
  CHECK(a == b);
  CHECK(std::equal(prefix.begin(), prefix.end(), a.begin()));  // no dependence on n or on the split
  CHECK(std::count(a.begin(), a.end(), 0.0f) < 10);
  i64 same = 0;
  for (i64 i = 0; i < n; ++i) same += a[static_cast<std::size_t>(i)] == c[static_cast<std::size_t>(i)];
  CHECK(same < n / 1000);
  for (i64 i : {i64{0}, i64{1}, i64{4095}, n - 1})
    CHECK(a[static_cast<std::size_t>(i)] == weft::kernels::uniform01(7, static_cast<std::uint64_t>(i)));

  k::normal(a.data(), n, 0.0f, 1.0f, 7);
  k::normal(b.data(), n, 0.0f, 1.0f, 7);
  k::normal(c.data(), n, 0.0f, 1.0f, 8);
  k::normal(prefix.data(), 1001, 0.0f, 1.0f, 7);
  CHECK(a == b);
  CHECK(std::equal(prefix.begin(), prefix.end(), a.begin()));
  same = 0;
  for (i64 i = 0; i < n; ++i) same += a[static_cast<std::size_t>(i)] == c[static_cast<std::size_t>(i)];
  CHECK(same < n / 1000);
  for (i64 i : {i64{0}, i64{1}, i64{4095}, n - 1})
    CHECK(a[static_cast<std::size_t>(i)] == weft::kernels::standard_normal(7, static_cast<std::uint64_t>(i)));
}

namespace {

// Every parallel kernel on inputs big enough to be split into several pieces
// (and gemm shapes past its split threshold, both by rows and by columns).
std::vector<std::vector<float>> run_every_kernel() {
  Rng rng(99);
  std::vector<std::vector<float>> out;
  const i64 n = (i64{1} << 18) + 7;
  const auto a = rng.vec(n), b = rng.vec(n);
  auto take = [&](i64 size, auto f) {
    std::vector<float> y = nan_vec(size);
    f(y.data());
    out.push_back(std::move(y));
  };
  take(n, [&](float* y) { k::fill(y, n, 3.0f); });
  take(n, [&](float* y) { k::copy(y, a.data(), n); });
  take(n, [&](float* y) { k::uniform(y, n, -1.0f, 1.0f, 5); });
  take(n, [&](float* y) { k::normal(y, n, 0.0f, 1.0f, 5); });
  take(n, [&](float* y) { k::add(y, a.data(), b.data(), n); });
  take(n, [&](float* y) { k::sub(y, a.data(), b.data(), n); });
  take(n, [&](float* y) { k::mul(y, a.data(), b.data(), n); });
  take(n, [&](float* y) { k::add_scalar(y, a.data(), 0.5f, n); });
  take(n, [&](float* y) { k::mul_scalar(y, a.data(), 0.5f, n); });
  take(n, [&](float* y) { k::copy(y, b.data(), n);
    k::axpy(y, 0.25f, a.data(), n); });
  take(n, [&](float* y) { k::relu(y, a.data(), n); });
  take(n, [&](float* y) { k::relu_grad(y, a.data(), b.data(), n); });
  take(n, [&](float* y) { k::copy(y, b.data(), n);
    k::sgd_update(y, a.data(), n, 0.1f, 0.01f); });
  take(1, [&](float* y) { k::sum(y, a.data(), n); });
  take(4096, [&](float* y) { k::argmax_rows(y, a.data(), 4096, 50); });

  const auto ga = rng.vec(300 * 300), gb = rng.vec(2000 * 300);
  take(300 * 200, [&](float* y) { k::gemm(false, false, 300, 200, 100, 1.0f, ga.data(), 100, gb.data(), 200, 0.0f, y, 200); });
  take(257 * 190, [&](float* y) { k::gemm(true, true, 257, 190, 77, 1.0f, ga.data(), 257, gb.data(), 77, 0.0f, y, 190); });
  take(20 * 2000, [&](float* y) { k::gemm(false, true, 20, 2000, 300, 1.0f, ga.data(), 300, gb.data(), 300, 0.0f, y, 2000); });
  take(33 * 1500, [&](float* y) { k::gemm(true, false, 33, 1500, 64, 1.0f, ga.data(), 33, gb.data(), 1500, 0.0f, y, 1500); });

  const auto dw = rng.vec(100 * 784), db = rng.vec(100), dy = rng.vec(64 * 100);
  take(64 * 100, [&](float* y) { k::dense_forward(y, a.data(), dw.data(), db.data(), 64, 784, 100); });
  out.push_back(nan_vec(64 * 784));
  out.push_back(nan_vec(100 * 784));
  out.push_back(nan_vec(100));
  k::dense_backward(out[out.size() - 3].data(), out[out.size() - 2].data(), out.back().data(), a.data(), dw.data(),
                    dy.data(), 64, 784, 100);

  const ConvGeometry g = conv(8, 3, 20, 20, 8, 5, 5, 1, 2);
  const auto cw = rng.vec(8 * 3 * 25), cb = rng.vec(8), cdy = rng.vec(conv_y_size(g));
  take(conv_y_size(g), [&](float* y) { k::conv2d_forward(y, a.data(), cw.data(), cb.data(), g); });
  take(8 * 3 * 400, [&](float* y) { k::conv2d_backward_data(y, cdy.data(), cw.data(), g); });
  out.push_back(nan_vec(8 * 3 * 25));
  out.push_back(nan_vec(8));
  k::conv2d_backward_filter(out[out.size() - 2].data(), out.back().data(), a.data(), cdy.data(), g);

  const PoolGeometry p = pool(8, 16, 32, 32, 3, 2);
  const auto pdy = rng.vec(pool_y_size(p));
  take(pool_y_size(p), [&](float* y) { k::avg_pool2d_forward(y, a.data(), p); });
  take(pool_y_size(p), [&](float* y) { k::max_pool2d_forward(y, a.data(), p); });
  take(8 * 16 * 1024, [&](float* y) { k::avg_pool2d_backward(y, pdy.data(), p); });
  take(8 * 16 * 1024, [&](float* y) { k::max_pool2d_backward(y, a.data(), pdy.data(), p); });

  const PoolGeometry pp = pool(8, 16, 32, 32, 3, 2, 1);
  const auto ppdy = rng.vec(pool_y_size(pp));
  take(pool_y_size(pp), [&](float* y) { k::max_pool2d_forward(y, a.data(), pp); });
  take(8 * 16 * 1024, [&](float* y) { k::max_pool2d_backward(y, a.data(), ppdy.data(), pp); });
  take(8 * 16, [&](float* y) { k::global_avg_pool2d_forward(y, a.data(), 8 * 16, 1024); });
  take(8 * 16 * 1024, [&](float* y) { k::global_avg_pool2d_backward(y, pdy.data(), 8 * 16, 1024); });

  const BatchNormGeometry bg{32, 16, 196};
  const auto gamma = rng.vec(16), beta = rng.vec(16), bdy = rng.vec(32 * 16 * 196);
  for (int i = 0; i < 4; ++i) out.push_back(nan_vec(16));
  std::vector<float>& mean = out[out.size() - 4];
  std::vector<float>& invstd = out[out.size() - 3];
  std::vector<float>& rm = out[out.size() - 2];
  std::vector<float>& rv = out.back();
  std::fill(rm.begin(), rm.end(), 0.0f);
  std::fill(rv.begin(), rv.end(), 1.0f);
  std::vector<float> by = nan_vec(32 * 16 * 196);
  k::batch_norm_forward_train(by.data(), mean.data(), invstd.data(), rm.data(), rv.data(), a.data(), gamma.data(),
                              beta.data(), bg, 1e-5f, 0.1f);
  const std::vector<float> bmean = mean, binvstd = invstd;
  out.push_back(std::move(by));
  take(32 * 16 * 196, [&](float* y) { k::batch_norm_forward_infer(y, a.data(), gamma.data(), beta.data(), bmean.data(),
                                                                  binvstd.data(), bg, 1e-5f); });
  out.push_back(nan_vec(16));
  out.push_back(nan_vec(16));
  take(32 * 16 * 196, [&](float* y) {
    k::batch_norm_backward(y, out[out.size() - 2].data(), out.back().data(), a.data(), bdy.data(), gamma.data(),
                           bmean.data(), binvstd.data(), bg);
  });

  std::vector<float> labels(512);
  for (auto& l : labels) l = static_cast<float>(rng.integer(0, 99));
  out.push_back(nan_vec(1));
  take(512 * 100, [&](float* y) { k::softmax_cross_entropy(out.back().data(), y, a.data(), labels.data(), 512, 100); });
  return out;
}

}  // namespace

TEST_CASE("every kernel gives bitwise identical results on 1, 2 and 4 intra-op threads" * doctest::timeout(180)) {
  std::vector<std::vector<float>> base;
  {
    IntraOpThreads t(1);
    base = run_every_kernel();
  }
  for (int threads : {2, 4}) {
    IntraOpThreads t(threads);
    const auto got = run_every_kernel();
    REQUIRE(got.size() == base.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(threads);
      CAPTURE(i);
      CHECK(bitwise_equal(got[i], base[i]));
    }
  }
}

TEST_CASE("kernels called from several threads at once agree with a lone call" * doctest::timeout(180)) {
  IntraOpThreads t(2);
  const auto base = run_every_kernel();
  constexpr int kCallers = 4;
  std::vector<std::vector<std::vector<float>>> got(kCallers);
  {
    std::vector<std::jthread> callers;
    for (int i = 0; i < kCallers; ++i) callers.emplace_back([&got, i] { got[static_cast<std::size_t>(i)] = run_every_kernel(); });
  }
  for (int c = 0; c < kCallers; ++c) {
    REQUIRE(got[static_cast<std::size_t>(c)].size() == base.size());
    for (std::size_t i = 0; i < base.size(); ++i) {
      CAPTURE(c);
      CAPTURE(i);
      CHECK(bitwise_equal(got[static_cast<std::size_t>(c)][i], base[i]));
    }
  }
}
