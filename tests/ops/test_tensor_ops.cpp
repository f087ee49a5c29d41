// The Tensor API end to end, on the naive and the threaded engine: every op
// against a float64 host reference (random, empty, size-1 and odd shapes),
// one random program giving bitwise equal results on both engines, copy
// chains across devices and their ordering against in-place writes, the
// messages of bad input, a failing op and the engine afterwards, allocator
// reuse through tensors, and tensors dropped while their ops are pending.
// Kernel-level checks live in test_cpu_kernels.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "ops/tensor_test_util.h"
#include "weft/gpu.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"

using namespace weft_optest;
namespace ops = weft::ops;
using weft::DType;
using weft::Engine;

namespace {

const Device cpu0 = Device::cpu(0);
const Device cpu1 = Device::cpu(1);

Tensor host_tensor(Engine& e, Shape shape, const std::vector<float>& data, Device d = cpu0) {
  return Tensor::from_host(e, std::move(shape), data, d);
}

// A few shapes every elementwise op sees: scalar, empty, size 1, odd, 3-d, larger.
std::vector<Shape> elementwise_shapes() {
  return {Shape{}, Shape{0}, Shape{0, 5}, Shape{1}, Shape{1, 1}, Shape{7, 13}, Shape{3, 4, 5}, Shape{257, 129}};
}

}  // namespace

// ---- creation and host transfer ------------------------------------------

TEST_CASE("tensor creation: zeros ones full from_host to_host item reshape" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    for (Device d : {cpu0, cpu1, Device::cpu_pinned(0)}) {
      INFO("device " << d.str());
      for (const Shape& s : elementwise_shapes()) {
        INFO("shape " << s.str());
        const auto n = static_cast<std::size_t>(s.numel());
        Tensor z = Tensor::zeros(e, s, d), o = Tensor::ones(e, s, d), f = Tensor::full(e, s, -2.5f, d);
        CHECK(z.shape() == s);
        CHECK(z.device() == d);
        CHECK(z.dtype() == DType::float32);
        CHECK(z.numel() == s.numel());
        CHECK(z.nbytes() == n * sizeof(float));
        CHECK(z.to_host() == std::vector<float>(n, 0.0f));
        CHECK(o.to_host() == std::vector<float>(n, 1.0f));
        CHECK(f.to_host() == std::vector<float>(n, -2.5f));
        Rng rng(n + 17);
        const std::vector<float> data = rng.vec(static_cast<i64>(n), -1e3f, 1e3f);
        Tensor h = Tensor::from_host(e, s, data, d);
        CHECK(h.to_host() == data);  // exact
      }
    }
    // item on a scalar and a one-element tensor
    CHECK(Tensor::full(e, Shape{}, 3.25f).item() == 3.25f);
    CHECK(Tensor::from_host(e, Shape{1, 1, 1}, std::vector<float>{-7.0f}, cpu1).item() == -7.0f);

    // from_host copies at push time: the caller's buffer may change at once.
    std::vector<float> buf = {1, 2, 3, 4, 5, 6};
    Tensor t = Tensor::from_host(e, Shape{2, 3}, buf);
    buf.assign(6, 0.0f);
    CHECK(t.to_host() == std::vector<float>{1, 2, 3, 4, 5, 6});

    // reshape shares storage and Var: an in-place write through the view shows in both.
    Tensor r = t.reshape(Shape{3, 2});
    CHECK(r.shape() == Shape{3, 2});
    CHECK(r.var() == t.var());
    CHECK(r.to_host() == t.to_host());
    Tensor flat = t.reshape(Shape{6});
    ops::axpy(2.0f, Tensor::ones(e, Shape{6}), flat);
    CHECK(t.to_host() == std::vector<float>{3, 4, 5, 6, 7, 8});
    CHECK(r.reshape(Shape{1, 6, 1}).to_host() == std::vector<float>{3, 4, 5, 6, 7, 8});
    CHECK(Tensor::zeros(e, Shape{0, 4}).reshape(Shape{4, 0, 3}).numel() == 0);

    // names show in str()
    Tensor named = Tensor::zeros(e, Shape{2, 3}, cpu1);
    named.set_name("conv1.weight");
    CHECK(named.name() == "conv1.weight");
    CHECK(named.str() == "Tensor 'conv1.weight' [2, 3] float32 on cpu(1)");
    CHECK(!Tensor().defined());
    CHECK(Tensor().str() == "Tensor (undefined)");
  });
}

TEST_CASE("tensor random: uniform and normal are counter-based and have the right moments" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    const i64 n = 200001;  // odd
    Tensor u = Tensor::uniform(e, Shape{n}, -2.0f, 3.0f, 42);
    Tensor u1 = Tensor::uniform(e, Shape{n}, -2.0f, 3.0f, 42, cpu1);
    Tensor u_other = Tensor::uniform(e, Shape{n}, -2.0f, 3.0f, 43);
    Tensor g = Tensor::normal(e, Shape{n}, 1.5f, 0.5f, 7);
    Tensor g1 = Tensor::normal(e, Shape{n}, 1.5f, 0.5f, 7, cpu1);
    const auto hu = u.to_host(), hg = g.to_host();
    CHECK(bitwise_equal(hu, u1.to_host()));  // same (seed, i) -> same value on every device
    CHECK(bitwise_equal(hg, g1.to_host()));
    CHECK(!bitwise_equal(hu, u_other.to_host()));
    double s = 0, s2 = 0;
    bool in_range = true;
    for (float v : hu) {
      in_range = in_range && v >= -2.0f && v <= 3.0f;
      s += v;
    }
    CHECK(in_range);
    CHECK(std::abs(s / n - 0.5) < 0.02);  // mean 0.5, sd of the mean ~0.0032
    s = 0;
    for (float v : hg) s += v, s2 += double(v) * v;
    const double mean = s / n, var = s2 / n - mean * mean;
    CHECK(std::abs(mean - 1.5) < 0.01);
    CHECK(std::abs(std::sqrt(var) - 0.5) < 0.01);
    // a prefix of a longer tensor: element i depends on (seed, i) only
    const auto short_u = Tensor::uniform(e, Shape{5, 7}, -2.0f, 3.0f, 42).to_host();
    CHECK(bitwise_equal(short_u, std::vector<float>(hu.begin(), hu.begin() + 35)));
    // degenerate ranges
    CHECK(Tensor::uniform(e, Shape{4}, 1.0f, 1.0f, 1).to_host() == std::vector<float>(4, 1.0f));
    CHECK(Tensor::normal(e, Shape{4}, 2.0f, 0.0f, 1).to_host() == std::vector<float>(4, 2.0f));
    CHECK(Tensor::uniform(e, Shape{0, 3}, 0.0f, 1.0f, 1).to_host().empty());
  });
}

// ---- elementwise -----------------------------------------------------------

TEST_CASE("elementwise ops against a float64 reference" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(1);
    for (const Shape& s : elementwise_shapes()) {
      INFO("shape " << s.str());
      const i64 n = s.numel();
      std::vector<float> a = rng.vec(n, -5.0f, 5.0f), b = rng.vec(n, -5.0f, 5.0f);
      // exact zeros and negative zero on the relu boundary
      if (n >= 4) a[0] = 0.0f, a[1] = -0.0f, a[2] = 1e-30f, a[3] = -1e-30f;
      const float alpha = -1.75f, sc = 0.375f;
      Tensor ta = host_tensor(e, s, a), tb = host_tensor(e, s, b);
      Vec add(n), sub(n), mul(n), adds(n), muls(n), relu(n), rgrad(n);
      for (i64 i = 0; i < n; ++i) {
        const double x = a[sz(i)], y = b[sz(i)];
        add[sz(i)] = x + y, sub[sz(i)] = x - y, mul[sz(i)] = x * y;
        adds[sz(i)] = x + sc, muls[sz(i)] = x * sc;
        relu[sz(i)] = x > 0 ? x : 0.0;
        rgrad[sz(i)] = x > 0 ? y : 0.0;
      }
      close(ops::add(ta, tb).to_host(), add, "add");
      close(ops::sub(ta, tb).to_host(), sub, "sub");
      close(ops::mul(ta, tb).to_host(), mul, "mul");
      close(ops::add_scalar(ta, sc).to_host(), adds, "add_scalar");
      close(ops::mul_scalar(ta, sc).to_host(), muls, "mul_scalar");
      close(ops::relu(ta).to_host(), relu, "relu");
      close(ops::relu_grad(ta, tb).to_host(), rgrad, "relu_grad");
      // the operators are the same ops
      close((ta + tb).to_host(), add, "operator+");
      close((ta - tb).to_host(), sub, "operator-");
      close((ta * tb).to_host(), mul, "operator*");
      close((ta + sc).to_host(), adds, "operator+ scalar");
      close((ta * sc).to_host(), muls, "operator* scalar");
      close(ta.relu().to_host(), relu, "Tensor::relu");
      // the result is a new tensor: inputs unchanged
      CHECK(ta.to_host() == a);
      CHECK(ta.relu().shape() == s);

      // axpy: in place, one more completed write on y's Var, x unchanged
      Tensor y = host_tensor(e, s, b);
      y.wait_to_read();
      const std::uint64_t v0 = e.version(y.var());
      ops::axpy(alpha, ta, y);
      Vec want(n);
      for (i64 i = 0; i < n; ++i) want[sz(i)] = double(b[sz(i)]) + alpha * double(a[sz(i)]);
      close(y.to_host(), want, "axpy");
      CHECK(e.version(y.var()) == v0 + 1);
      ops::axpy(1.0f, ta, y);
      y.wait_to_read();
      CHECK(e.version(y.var()) == v0 + 2);
      CHECK(ta.to_host() == a);
    }
    // x + x (the same tensor twice) and y += 1 * y (aliasing in place)
    Tensor t = Tensor::from_host(e, Shape{3}, std::vector<float>{1, -2, 3});
    CHECK((t + t).to_host() == std::vector<float>{2, -4, 6});
    ops::axpy(1.0f, t, t);
    CHECK(t.to_host() == std::vector<float>{2, -4, 6});
  });
}

// ---- reductions ------------------------------------------------------------

TEST_CASE("reductions: sum mean argmax" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(2);
    for (const Shape& s : {Shape{}, Shape{1}, Shape{7, 13}, Shape{3, 4, 5}, Shape{100003}, Shape{300, 301}}) {
      INFO("shape " << s.str());
      const i64 n = s.numel();
      const auto x = rng.vec(n, -1.0f, 2.0f);
      double total = 0, abs_total = 0;
      for (float v : x) total += v, abs_total += std::abs(v);
      Tensor t = host_tensor(e, s, x);
      Tensor ts = ops::sum(t), tm = ops::mean(t);
      CHECK(ts.shape() == Shape{});
      CHECK(tm.shape() == Shape{});
      // scaled by the sum of magnitudes: the float result of a long sum
      close({ts.item()}, {total}, "sum", 1e-5, abs_total);
      close({tm.item()}, {total / double(n)}, "mean", 1e-5, abs_total / double(n));
      close({t.sum().item()}, {total}, "Tensor::sum", 1e-5, abs_total);
      close({t.mean().item()}, {total / double(n)}, "Tensor::mean", 1e-5, abs_total / double(n));
    }
    // empty: sum 0, mean NaN
    Tensor empty = Tensor::zeros(e, Shape{0, 5});
    CHECK(ops::sum(empty).item() == 0.0f);
    CHECK(std::isnan(ops::mean(empty).item()));
    CHECK(std::isnan(Tensor::zeros(e, Shape{0}).mean().item()));

    // argmax: lowest index among ties
    const std::vector<float> m = {
        1, 5, 5, 0,     // tie between 1 and 2 -> 1
        -1, -1, -1, -1,  // all equal -> 0
        0, 0, 0, 9,     // last
        -3, -2, -7, -2,  // tie among negatives -> 1
    };
    CHECK(ops::argmax(host_tensor(e, Shape{4, 4}, m)).to_host() == std::vector<float>{1, 0, 3, 1});
    CHECK(ops::argmax(host_tensor(e, Shape{1, 1}, {4.0f})).to_host() == std::vector<float>{0});
    Tensor am0 = ops::argmax(Tensor::zeros(e, Shape{0, 5}));
    CHECK(am0.shape() == Shape{0});
    CHECK(am0.to_host().empty());
    for (auto [rows, cols] : {std::pair<i64, i64>{7, 13}, {64, 1}, {3, 1000}}) {
      INFO(rows << "x" << cols);
      // quantized values: ties are common
      std::vector<float> x(sz(rows * cols));
      for (float& v : x) v = static_cast<float>(rng.integer(0, 4));
      std::vector<float> want(sz(rows));
      for (i64 r = 0; r < rows; ++r) {
        i64 best = 0;
        for (i64 c = 1; c < cols; ++c)
          if (x[sz(r * cols + c)] > x[sz(r * cols + best)]) best = c;
        want[sz(r)] = static_cast<float>(best);
      }
      Tensor am = ops::argmax(host_tensor(e, Shape{rows, cols}, x, cpu1));
      CHECK(am.shape() == Shape{rows});
      CHECK(am.device() == cpu1);
      CHECK(am.to_host() == want);
    }
  });
}

// ---- matmul ----------------------------------------------------------------

TEST_CASE("matmul: all four transpose combinations over random and degenerate shapes" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(3);
    struct Mkn {
      i64 m, k, n;
    };
    std::vector<Mkn> sizes = {{1, 1, 1}, {7, 13, 5}, {0, 3, 4}, {3, 0, 4}, {4, 5, 0}, {1, 17, 1},
                              {17, 1, 9}, {33, 65, 31}, {130, 70, 129}, {300, 100, 200} /* split into pieces */};
    for (int i = 0; i < 4; ++i)
      sizes.push_back({rng.integer(1, 40), rng.integer(1, 40), rng.integer(1, 40)});
    for (const Mkn& z : sizes)
      for (int tr = 0; tr < 4; ++tr) {
        const bool ta = tr & 1, tb = tr & 2;
        INFO("m=" << z.m << " k=" << z.k << " n=" << z.n << " trans_a=" << ta << " trans_b=" << tb);
        const auto a = rng.vec(z.m * z.k), b = rng.vec(z.k * z.n);
        Tensor A = host_tensor(e, ta ? Shape{z.k, z.m} : Shape{z.m, z.k}, a);
        Tensor B = host_tensor(e, tb ? Shape{z.n, z.k} : Shape{z.k, z.n}, b);
        Tensor C = ops::matmul(A, B, ta, tb);
        CHECK(C.shape() == Shape{z.m, z.n});
        const auto got = C.to_host();
        close(got, matmul(dbl(a), dbl(b), z.m, z.k, z.n, ta, tb), "matmul");
        if (z.k == 0) CHECK(got == std::vector<float>(sz(z.m * z.n), 0.0f));  // zeros, not garbage
        if (!ta && !tb) CHECK(bitwise_equal(A.matmul(B).to_host(), got));
      }
  });
}

// ---- dense -----------------------------------------------------------------

TEST_CASE("dense and dense_backward against a float64 reference" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(4);
    struct Case {
      i64 batch, in, out;
    };
    for (const Case& c : {Case{0, 13, 5}, Case{1, 1, 1}, Case{7, 13, 5}, Case{33, 64, 10}, Case{3, 0, 4}})
      for (bool with_bias : {true, false}) {
        INFO("batch=" << c.batch << " in=" << c.in << " out=" << c.out << " bias=" << with_bias);
        const auto x = rng.vec(c.batch * c.in), w = rng.vec(c.out * c.in), b = rng.vec(c.out), dy = rng.vec(c.batch * c.out);
        Tensor X = host_tensor(e, Shape{c.batch, c.in}, x, cpu1), W = host_tensor(e, Shape{c.out, c.in}, w, cpu1);
        Tensor B = with_bias ? host_tensor(e, Shape{c.out}, b, cpu1) : Tensor();
        Tensor Y = ops::dense(X, W, B);
        CHECK(Y.shape() == Shape{c.batch, c.out});
        CHECK(Y.device() == cpu1);
        Vec want = matmul(dbl(x), dbl(w), c.batch, c.in, c.out, false, true);
        if (with_bias)
          for (i64 r = 0; r < c.batch; ++r)
            for (i64 o = 0; o < c.out; ++o) want[sz(r * c.out + o)] += b[sz(o)];
        close(Y.to_host(), want, "dense");

        ops::DenseGrads g = ops::dense_backward(X, W, host_tensor(e, Shape{c.batch, c.out}, dy, cpu1));
        CHECK(g.dx.shape() == X.shape());
        CHECK(g.dw.shape() == W.shape());
        CHECK(g.db.shape() == Shape{c.out});
        close(g.dx.to_host(), matmul(dbl(dy), dbl(w), c.batch, c.out, c.in, false, false), "dense dx");
        close(g.dw.to_host(), matmul(dbl(dy), dbl(x), c.out, c.batch, c.in, true, false), "dense dw");
        Vec db(sz(c.out), 0.0);
        for (i64 r = 0; r < c.batch; ++r)
          for (i64 o = 0; o < c.out; ++o) db[sz(o)] += dy[sz(r * c.out + o)];
        close(g.db.to_host(), db, "dense db");
        if (c.batch == 0) {  // batch 0: zero gradients, not garbage
          CHECK(g.dw.to_host() == std::vector<float>(sz(c.out * c.in), 0.0f));
          CHECK(g.db.to_host() == std::vector<float>(sz(c.out), 0.0f));
        }
      }
  });
}

// ---- convolution -----------------------------------------------------------

TEST_CASE("conv2d forward and backward against a float64 reference" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(5);
    const std::vector<Conv> cases = {
        {2, 3, 7, 9, 4, 3, 3, 1, 0},    // plain
        {2, 3, 9, 7, 4, 3, 3, 2, 1},    // stride 2, pad 1, odd sizes
        {1, 1, 1, 1, 1, 1, 1, 1, 0},    // everything 1
        {3, 2, 5, 5, 3, 5, 5, 1, 0},    // kernel == input: 1x1 output
        {1, 2, 4, 6, 2, 3, 1, 1, 1},    // non-square kernel
        {2, 4, 6, 6, 5, 1, 1, 2, 0},    // 1x1 kernel, stride 2
        {0, 3, 5, 5, 2, 3, 3, 1, 1},    // empty batch
        {4, 8, 16, 15, 8, 3, 3, 2, 1},  // a little larger
        {1, 3, 2, 2, 2, 3, 3, 1, 1},    // pad makes a 2x2 input fit a 3x3 filter
    };
    for (const Conv& g : cases)
      for (bool with_bias : {true, false}) {
        INFO(g.str() << " bias=" << with_bias);
        const auto x = rng.vec(g.n * g.c * g.h * g.w), w = rng.vec(g.o * g.c * g.kh * g.kw), b = rng.vec(g.o);
        const ops::Conv2dParams p{g.stride, g.pad};
        Tensor X = host_tensor(e, g.x_shape(), x), W = host_tensor(e, g.w_shape(), w);
        Tensor B = with_bias ? host_tensor(e, Shape{g.o}, b) : Tensor();
        Tensor Y = ops::conv2d(X, W, B, p);
        CHECK(Y.shape() == g.y_shape());
        const Vec bd = dbl(b);
        close(Y.to_host(), conv_forward(g, dbl(x), dbl(w), with_bias ? &bd : nullptr), "conv2d");
        if (!with_bias) continue;
        const auto dy = rng.vec(g.y_shape().numel());
        Tensor DY = host_tensor(e, g.y_shape(), dy);
        Tensor DX = ops::conv2d_backward_data(DY, W, g.x_shape(), p);
        CHECK(DX.shape() == g.x_shape());
        close(DX.to_host(), conv_backward_data(g, dbl(dy), dbl(w)), "conv2d_backward_data");
        ops::ConvFilterGrads fg = ops::conv2d_backward_filter(X, DY, g.w_shape(), p);
        CHECK(fg.dw.shape() == g.w_shape());
        CHECK(fg.db.shape() == Shape{g.o});
        close(fg.dw.to_host(), conv_backward_filter(g, dbl(x), dbl(dy)), "conv2d_backward_filter dw");
        close(fg.db.to_host(), conv_backward_bias(g, dbl(dy)), "conv2d_backward_filter db");
      }
  });
}

// ---- pooling ---------------------------------------------------------------

TEST_CASE("avg and max pooling forward and backward against a float64 reference" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(6);
    const std::vector<Pool> cases = {
        {2, 3, 8, 8, 2, 2},   // the usual
        {2, 3, 7, 5, 2, 1},   // overlapping windows, odd sizes
        {1, 2, 6, 6, 2, 1},   // overlapping, square
        {1, 1, 9, 7, 3, 2},   // overlapping 3x3 stride 2
        {2, 2, 7, 7, 2, 2},   // a row and column left over
        {1, 1, 1, 1, 1, 1},   // 1x1
        {3, 2, 4, 4, 4, 1},   // window == input
        {0, 3, 4, 4, 2, 2},   // empty batch
    };
    for (const Pool& g : cases) {
      INFO(g.str());
      // distinct values: no ties inside a window
      std::vector<float> x(sz(g.x_shape().numel()));
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.001f - 3.0f;
      std::shuffle(x.begin(), x.end(), rng.gen);
      const ops::Pool2dParams p{g.kernel, g.stride};
      Tensor X = host_tensor(e, g.x_shape(), x, cpu1);
      Tensor A = ops::avg_pool2d(X, p), M = ops::max_pool2d(X, p);
      CHECK(A.shape() == g.y_shape());
      CHECK(M.shape() == g.y_shape());
      close(A.to_host(), avg_pool(g, dbl(x)), "avg_pool2d");
      const Vec max_want = max_pool(g, dbl(x));
      CHECK(M.to_host() == std::vector<float>(max_want.begin(), max_want.end()));  // exact: a selection
      const auto dy = rng.vec(g.y_shape().numel());
      Tensor DY = host_tensor(e, g.y_shape(), dy, cpu1);
      Tensor DA = ops::avg_pool2d_backward(DY, g.x_shape(), p), DM = ops::max_pool2d_backward(X, DY, p);
      CHECK(DA.shape() == g.x_shape());
      CHECK(DM.shape() == g.x_shape());
      close(DA.to_host(), avg_pool_backward(g, dbl(dy)), "avg_pool2d_backward");
      close(DM.to_host(), max_pool_backward(g, dbl(x), dbl(dy)), "max_pool2d_backward");
    }
  });
}

// ---- loss and optimizer ----------------------------------------------------

TEST_CASE("softmax_cross_entropy loss and dlogits against a float64 reference" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(7);
    struct Case {
      i64 rows, cols;
      float spread;
    };
    for (const Case& c : {Case{1, 1, 1.0f}, Case{1, 10, 3.0f}, Case{7, 13, 2.0f}, Case{64, 10, 5.0f},
                          Case{5, 4, 80.0f} /* large logits: exp would overflow unshifted */}) {
      INFO("rows=" << c.rows << " cols=" << c.cols << " spread=" << c.spread);
      const auto z = rng.vec(c.rows * c.cols, -c.spread, c.spread);
      std::vector<float> labels(sz(c.rows));
      for (float& l : labels) l = static_cast<float>(rng.integer(0, c.cols - 1));
      ops::SoftmaxCrossEntropy out =
          ops::softmax_cross_entropy(host_tensor(e, Shape{c.rows, c.cols}, z), host_tensor(e, Shape{c.rows}, labels));
      CHECK(out.loss.shape() == Shape{});
      CHECK(out.dlogits.shape() == Shape{c.rows, c.cols});
      const double loss = softmax_ce_loss(dbl(z), labels, c.rows, c.cols);
      close({out.loss.item()}, {loss}, "loss", 1e-4, 1.0);
      close(out.dlogits.to_host(), softmax_ce_grad(dbl(z), labels, c.rows, c.cols), "dlogits");
      if (c.cols == 1) CHECK(out.loss.item() == 0.0f);
    }
    // an empty batch runs and gives an empty gradient
    ops::SoftmaxCrossEntropy empty =
        ops::softmax_cross_entropy(Tensor::zeros(e, Shape{0, 3}), Tensor::zeros(e, Shape{0}));
    CHECK(empty.dlogits.to_host().empty());
    CHECK_NOTHROW(empty.loss.item());
  });
}

TEST_CASE("sgd_update with and without weight decay in place" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(8);
    for (const Shape& s : {Shape{}, Shape{0, 5}, Shape{1}, Shape{7, 13}, Shape{64, 33}})
      for (float wd : {0.0f, 0.01f, 0.5f}) {
        INFO("shape " << s.str() << " weight_decay " << wd);
        const i64 n = s.numel();
        const auto w = rng.vec(n, -2, 2), g = rng.vec(n, -2, 2);
        const float lr = 0.125f;
        Tensor W = host_tensor(e, s, w, cpu1), G = host_tensor(e, s, g, cpu1);
        W.wait_to_read();
        const std::uint64_t v0 = e.version(W.var());
        ops::sgd_update(W, G, lr, wd);
        Vec want(sz(n));
        for (i64 i = 0; i < n; ++i) want[sz(i)] = w[sz(i)] - double(lr) * (g[sz(i)] + double(wd) * w[sz(i)]);
        close(W.to_host(), want, "sgd_update");
        CHECK(e.version(W.var()) == v0 + 1);
        CHECK(G.to_host() == g);
        // a second step from the updated weights
        const auto w1 = W.to_host();
        ops::sgd_update(W, G, lr, wd);
        for (i64 i = 0; i < n; ++i) want[sz(i)] = w1[sz(i)] - double(lr) * (g[sz(i)] + double(wd) * w1[sz(i)]);
        close(W.to_host(), want, "sgd_update step 2");
      }
    // default weight decay is 0
    Tensor W = Tensor::full(e, Shape{3}, 2.0f), G = Tensor::ones(e, Shape{3});
    ops::sgd_update(W, G, 0.5f);
    CHECK(W.to_host() == std::vector<float>(3, 1.5f));
  });
}

// ---- naive vs threaded -----------------------------------------------------

namespace {

// A random program of `steps` ops over 10 [8, 8] tensors, half of them on
// cpu(1), including in-place axpy/sgd_update/copy_from and cross-device
// copies; returns every tensor's final values and the sums taken on the way.
std::vector<std::vector<float>> run_program(Engine& e, std::uint64_t seed, int steps) {
  Rng rng(seed);
  constexpr int kTensors = 10;
  const Shape s{8, 8};
  std::vector<std::vector<float>> results;
  {
    std::vector<Tensor> t;
    for (int i = 0; i < kTensors; ++i) t.push_back(Tensor::from_host(e, s, rng.vec(64), Device::cpu(i % 2)));
    std::vector<Tensor> sums;
    auto on = [&](const Tensor& x, Device d) { return x.device() == d ? x : x.copy_to(d); };
    auto pick = [&] { return static_cast<std::size_t>(rng.integer(0, kTensors - 1)); };
    for (int step = 0; step < steps; ++step) {
      const std::size_t d = pick(), j = pick(), k = pick();
      const Device dev = t[j].device();
      switch (rng.integer(0, 12)) {
        case 0: t[d] = (t[j] + on(t[k], dev)) * 0.5f; break;
        case 1: t[d] = (t[j] - on(t[k], dev)) * 0.5f; break;
        case 2: t[d] = t[j] * on(t[k], dev); break;
        case 3: t[d] = (t[j] + rng.uniform(-0.5f, 0.5f)) * 0.75f; break;
        case 4: t[d] = ops::relu(t[j]); break;
        case 5: t[d] = ops::relu_grad(t[j], on(t[k], dev)); break;
        case 6: {
          const bool ta = rng.integer(0, 1), tb = rng.integer(0, 1);
          t[d] = ops::matmul(t[j], on(t[k], dev), ta, tb) * 0.125f;
          break;
        }
        case 7: ops::axpy(rng.uniform(-0.25f, 0.25f), on(t[j], t[d].device()), t[d]); break;
        case 8: ops::sgd_update(t[d], on(t[j], t[d].device()), 0.1f, 0.01f); break;
        case 9: t[d] = t[j].copy_to(Device::cpu(static_cast<int>(rng.integer(0, 1)))); break;
        case 10:
          if (d != j) t[d].copy_from(t[j]);
          break;
        case 11: t[d] = ops::dense(t[j], on(t[k], dev), Tensor()) * 0.125f; break;
        case 12: sums.push_back(ops::sum(t[j])); break;
      }
    }
    for (const Tensor& x : t) results.push_back(x.to_host());
    for (const Tensor& x : sums) results.push_back(x.to_host());
  }
  return results;
}

}  // namespace

TEST_CASE("pack and unpack: flat runs, scaled, accumulated, and back" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(9);
    const std::vector<Shape> shapes{Shape{3, 4}, Shape{0}, Shape{1}, Shape{5}, Shape{2, 3, 2}};
    std::vector<std::vector<float>> data;
    std::vector<Tensor> srcs;
    i64 total = 0;
    for (const Shape& s : shapes) {
      data.push_back(rng.vec(s.numel(), -2, 2));
      srcs.push_back(host_tensor(e, s, data.back(), cpu1));
      total += s.numel();
    }
    Tensor flat = Tensor::zeros(e, Shape{total}, cpu1);
    ops::pack(srcs, flat, 0.5f);
    Vec want;
    for (const auto& d : data)
      for (float v : d) want.push_back(0.5 * v);
    close(flat.to_host(), want, "pack alpha 0.5");
    ops::pack(srcs, flat, -2.0f, /*accumulate=*/true);
    for (std::size_t k = 0, i = 0; k < data.size(); ++k)
      for (float v : data[k]) want[i++] += -2.0 * v;
    close(flat.to_host(), want, "pack accumulate");
    ops::pack(srcs, flat);  // alpha 1: a plain copy
    std::vector<float> concat;
    for (const auto& d : data) concat.insert(concat.end(), d.begin(), d.end());
    CHECK(flat.to_host() == concat);

    std::vector<Tensor> outs;
    for (const Shape& s : shapes) outs.push_back(Tensor::zeros(e, s, cpu1));
    ops::axpy(1.0f, flat, flat);  // 2x, so the unpacked runs differ from the srcs
    ops::unpack(flat, outs);
    for (std::size_t k = 0; k < outs.size(); ++k) {
      Vec twice;
      for (float v : data[k]) twice.push_back(2.0 * v);
      close(outs[k].to_host(), twice, "unpack run " + std::to_string(k));
    }

    // Bad input names the run.
    CHECK_THROWS_WITH_AS(ops::pack({}, flat), "pack: no srcs", weft::InvalidArgument);
    Tensor short_flat = Tensor::zeros(e, Shape{total - 1}, cpu1);
    const std::string too_many = "the srcs hold " + std::to_string(total) + " elements";
    CHECK_THROWS_WITH_AS(ops::pack(srcs, short_flat), doctest::Contains(too_many.c_str()), weft::InvalidArgument);
    std::vector<Tensor> moved = srcs;
    moved[3] = Tensor::zeros(e, Shape{5}, cpu0);
    CHECK_THROWS_WITH_AS(ops::pack(moved, flat), doctest::Contains("src 3"), weft::InvalidArgument);
    std::vector<Tensor> twice = {outs[0], outs[0]};
    Tensor flat24 = Tensor::zeros(e, Shape{24}, cpu1);
    CHECK_THROWS_WITH_AS(ops::unpack(flat24, twice), doctest::Contains("dsts 0 and 1 are one tensor"),
                         weft::InvalidArgument);
  });
}

// An op may have any number of outputs: a bucket's unpack writes one
// gradient per parameter, 65 of them in ResNet-18's second bucket. (The op
// layer once marked the outputs an op creates in a 32-bit mask and shifted
// past it for the 33rd: undefined behaviour, which UBSan reported.)
TEST_CASE("unpack into 70 tensors" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    constexpr int kOuts = 70;
    std::vector<float> values(static_cast<std::size_t>(kOuts * 3));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    const Tensor flat = host_tensor(e, Shape{kOuts * 3}, values, cpu1);
    std::vector<Tensor> outs;
    for (int k = 0; k < kOuts; ++k) outs.push_back(Tensor::empty(e, Shape{3}, cpu1));
    ops::unpack(flat, outs);
    for (int k = 0; k < kOuts; ++k) {
      const std::vector<float> got = outs[static_cast<std::size_t>(k)].to_host();
      CHECK(got == std::vector<float>{3.0f * k, 3.0f * k + 1, 3.0f * k + 2});
    }
  });
}

TEST_CASE("a random program gives bitwise identical results on naive and threaded" * doctest::timeout(60)) {
  for (std::uint64_t seed : {11u, 12u, 13u}) {
    INFO("program seed " << seed);
    std::vector<std::vector<std::vector<float>>> runs;
    for (const EngineSpec& spec : {kEngines[0], kEngines[1], kEngines[1]}) {
      auto e = Engine::create(spec.config());
      runs.push_back(run_program(*e, seed, 200));
      e->wait_all();
    }
    REQUIRE(runs[0].size() >= 10);
    bool finite = true;
    for (const auto& v : runs[0])
      for (float x : v) finite = finite && std::isfinite(x);
    CHECK(finite);  // the program stays in range, so equality means something
    for (std::size_t r = 1; r < runs.size(); ++r) {
      REQUIRE(runs[r].size() == runs[0].size());
      for (std::size_t i = 0; i < runs[0].size(); ++i) {
        INFO("run " << r << " result " << i);
        CHECK(bitwise_equal(runs[r][i], runs[0][i]));
      }
    }
  }
}

// ---- copies ----------------------------------------------------------------

TEST_CASE("copy chains across devices round-trip exactly" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Rng rng(9);
    std::vector<Device> chain = {cpu0, cpu1, Device::cpu_pinned(0), cpu0};
    if (weft::gpu::device_count() > 0) {
      chain.insert(chain.begin() + 2, Device::gpu(0));  // cpu1 -> gpu0 -> pinned
    } else {
      MESSAGE("the copy chain leaves out gpu(0): no GPU answers (the rest of the case runs)");
    }
    for (const Shape& s : {Shape{}, Shape{0, 3}, Shape{1}, Shape{7, 13}, Shape{1000, 37}}) {
      INFO("shape " << s.str());
      std::vector<float> data = rng.vec(s.numel(), -1e6f, 1e6f);
      if (data.size() >= 3) {
        data[0] = std::numeric_limits<float>::denorm_min();
        data[1] = -0.0f;
        data[2] = std::numeric_limits<float>::infinity();
      }
      // copy_to along the chain
      Tensor t = Tensor::from_host(e, s, data, chain[0]);
      for (std::size_t i = 1; i < chain.size(); ++i) {
        t = t.copy_to(chain[i]);
        CHECK(t.device() == chain[i]);
        CHECK(t.shape() == s);
      }
      CHECK(bitwise_equal(t.to_host(), data));
      // copy_from into tensors that already exist (filled with something else)
      std::vector<Tensor> dst;
      for (Device d : chain) dst.push_back(Tensor::full(e, s, 42.0f, d));
      dst[0].copy_from(Tensor::from_host(e, s, data, chain[0]));
      for (std::size_t i = 1; i < chain.size(); ++i) dst[i].copy_from(dst[i - 1]);
      for (std::size_t i = 0; i < chain.size(); ++i) {
        INFO("copy_from into " << chain[i].str());
        CHECK(bitwise_equal(dst[i].to_host(), data));
      }
      // copying a tensor onto itself (or its own view) leaves it as it was
      dst[1].copy_from(dst[1]);
      dst[1].copy_from(dst[1].reshape(s));
      CHECK(bitwise_equal(dst[1].to_host(), data));
      // same-device copy is a new tensor with its own Var
      Tensor same = dst[0].copy_to(chain[0]);
      CHECK(same.var() != dst[0].var());
      CHECK(bitwise_equal(same.to_host(), data));
    }
  });
}

TEST_CASE("copies see the version of the source in push order" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    const Shape s{123, 7};
    const auto n = static_cast<std::size_t>(s.numel());
    for (int round = 0; round < 20; ++round) {
      Tensor x = Tensor::ones(e, s);
      Tensor y = x.copy_to(cpu1);
      ops::axpy(2.0f, Tensor::full(e, s, 1.5f), x);  // x = 4
      Tensor z = x.copy_to(cpu1);
      Tensor p = x.copy_to(Device::cpu_pinned(0));
      Tensor w = Tensor::zeros(e, s, cpu1);
      w.copy_from(x);
      ops::axpy(1.0f, x, x);  // x = 8, after every copy above
      Tensor back = Tensor::zeros(e, s);
      back.copy_from(z);
      ops::axpy(-1.0f, Tensor::ones(e, s, cpu1), z);  // z = 3; back already copied 4
      CHECK(y.to_host() == std::vector<float>(n, 1.0f));
      CHECK(p.to_host() == std::vector<float>(n, 4.0f));
      CHECK(w.to_host() == std::vector<float>(n, 4.0f));
      CHECK(back.to_host() == std::vector<float>(n, 4.0f));
      CHECK(z.to_host() == std::vector<float>(n, 3.0f));
      CHECK(x.to_host() == std::vector<float>(n, 8.0f));
    }
  });
}

// ---- bad input ---------------------------------------------------------------

TEST_CASE("bad input is a weft::Error naming the problem" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    Tensor a23 = Tensor::zeros(e, Shape{2, 3}), a32 = Tensor::zeros(e, Shape{3, 2});
    std::string m;

    SUBCASE("shape mismatch in elementwise ops names both shapes") {
      m = error_of([&] { ops::add(a23, a32); });
      CHECK(has(m, "add"));
      CHECK(has(m, "[2, 3]"));
      CHECK(has(m, "[3, 2]"));
      m = error_of([&] { (void)(a23 * a32); });
      CHECK(has(m, "mul"));
      CHECK(has(m, "[3, 2]"));
      m = error_of([&] { ops::axpy(1.0f, a32, a23); });
      CHECK(has(m, "axpy"));
      CHECK(has(m, "[2, 3]"));
      CHECK(has(m, "[3, 2]"));
      m = error_of([&] { ops::sgd_update(a23, a32, 0.1f); });
      CHECK(has(m, "sgd_update"));
      CHECK(has(m, "[3, 2]"));
      m = error_of([&] { ops::relu_grad(a23, Tensor::zeros(e, Shape{6})); });
      CHECK(has(m, "[6]"));
      m = error_of([&] { a23.copy_from(a32); });
      CHECK(has(m, "copy_from"));
      CHECK(has(m, "[3, 2]"));
      // a tensor's name appears in the message
      Tensor named = Tensor::zeros(e, Shape{4});
      named.set_name("fc.bias");
      CHECK(has(error_of([&] { ops::add(named, a23); }), "'fc.bias'"));
    }
    SUBCASE("matmul inner dimension mismatch") {
      m = error_of([&] { ops::matmul(a23, a23); });
      CHECK(has(m, "matmul"));
      CHECK(has(m, "inner"));
      CHECK(has(m, "3 vs 2"));
      m = error_of([&] { ops::matmul(a23, a23, true, true); });  // [2, 3]^T x [2, 3]^T: k 2 vs 3
      CHECK(has(m, "2 vs 3"));
      m = error_of([&] { ops::matmul(Tensor::zeros(e, Shape{6}), a23); });
      CHECK(has(m, "rank 2"));
      CHECK_NOTHROW(ops::matmul(a23, a23, false, true));
      CHECK_NOTHROW(ops::matmul(a23, a32, true, true));
    }
    SUBCASE("tensors on different devices name both devices") {
      Tensor b = Tensor::zeros(e, Shape{2, 3}, cpu1);
      for (const std::string& msg :
           {error_of([&] { ops::add(a23, b); }), error_of([&] { ops::matmul(a23, b, false, true); }),
            error_of([&] { ops::axpy(1.0f, b, a23); }),
            error_of([&] { ops::dense(a23, b, Tensor()); }),
            error_of([&] { ops::sgd_update(a23, b, 0.1f); })}) {
        INFO(msg);
        CHECK(has(msg, "cpu(0)"));
        CHECK(has(msg, "cpu(1)"));
        CHECK(has(msg, "different devices"));
      }
      // pinned memory is a device of its own as far as ops are concerned
      CHECK(has(error_of([&] { ops::add(a23, Tensor::zeros(e, Shape{2, 3}, Device::cpu_pinned(0))); }),
                "cpu_pinned(0)"));
    }
    SUBCASE("undefined tensors") {
      Tensor u;
      CHECK(has(error_of([&] { ops::add(u, a23); }), "undefined"));
      CHECK(has(error_of([&] { ops::add(a23, u); }), "undefined"));
      CHECK(has(error_of([&] { ops::relu(u); }), "undefined"));
      CHECK(has(error_of([&] { ops::sum(u); }), "undefined"));
      CHECK(has(error_of([&] { ops::mean(u); }), "undefined"));
      CHECK(has(error_of([&] { ops::matmul(u, a23); }), "undefined"));
      CHECK(has(error_of([&] { ops::axpy(1.0f, a23, u); }), "undefined"));
      CHECK(has(error_of([&] { ops::dense(u, a23, Tensor()); }), "undefined"));
      CHECK(has(error_of([&] { ops::dense(a23, u, Tensor()); }), "undefined"));
      CHECK(has(error_of([&] { ops::sgd_update(u, a23, 0.1f); }), "undefined"));
      CHECK(has(error_of([&] { ops::softmax_cross_entropy(u, a23); }), "undefined"));
      CHECK(has(error_of([&] { ops::max_pool2d(u); }), "undefined"));
      CHECK(has(error_of([&] { u.to_host(); }), "undefined"));
      CHECK(has(error_of([&] { u.item(); }), "undefined"));
      CHECK(has(error_of([&] { u.reshape(Shape{1}); }), "undefined"));
      CHECK(has(error_of([&] { u.copy_to(cpu0); }), "undefined"));
      CHECK(has(error_of([&] { a23.copy_from(u); }), "undefined"));
      CHECK(has(error_of([&] { (void)u.shape(); }), "undefined"));
      CHECK(has(error_of([&] { (void)u.engine(); }), "undefined"));
    }
    SUBCASE("undefined tensors in layer ops name the op") {
      // Only a bias may be undefined; any other undefined input is named with
      // its op, not reported as the generic "use of an undefined weft::Tensor".
      Tensor u;
      CHECK(has(error_of([&] { ops::dense(u, a23, Tensor()); }), "dense"));
      CHECK(has(error_of([&] { ops::conv2d(u, a23, Tensor()); }), "conv2d"));
      CHECK(has(error_of([&] { ops::sgd_update(u, a23, 0.1f); }), "sgd_update"));
      CHECK(has(error_of([&] { ops::softmax_cross_entropy(a23, u); }), "softmax_cross_entropy"));
      CHECK(has(error_of([&] { ops::max_pool2d(u); }), "max_pool2d: x is an undefined Tensor"));
      CHECK(has(error_of([&] { ops::avg_pool2d_backward(u, Shape{1, 1, 2, 2}); }), "avg_pool2d_backward"));
      CHECK(has(error_of([&] { ops::conv2d_backward_data(u, a23, Shape{1, 1, 2, 2}); }), "conv2d_backward_data"));
      CHECK(has(error_of([&] { ops::dense_backward(a23, a23, u); }), "dense_backward"));
    }
    SUBCASE("wrong dtype names it") {
      Tensor d64 = Tensor::empty(e, Shape{2, 3}, cpu0, DType::float64);
      CHECK(d64.dtype() == DType::float64);
      CHECK(d64.nbytes() == 6 * 8);
      CHECK(has(d64.str(), "float64"));
      m = error_of([&] { ops::add(d64, a23); });
      CHECK(has(m, "add"));
      CHECK(has(m, "float64"));
      CHECK(has(error_of([&] { ops::add(a23, d64); }), "float64"));
      CHECK(has(error_of([&] { ops::relu(d64); }), "float64"));
      CHECK(has(error_of([&] { d64.to_host(); }), "float64"));
      CHECK(d64.copy_to(cpu1).dtype() == DType::float64);  // copies move bytes of any dtype
      CHECK(has(error_of([&] { Tensor::zeros(e, Shape{2}, cpu0, DType::int32); }), "int32"));
      CHECK(Tensor::ones(e, Shape{2}, cpu0, DType::float16).to_host() == std::vector<float>{1, 1});
    }
    SUBCASE("conv and pool geometry") {
      Tensor x = Tensor::zeros(e, Shape{1, 3, 5, 5}), w = Tensor::zeros(e, Shape{2, 4, 3, 3});
      m = error_of([&] { ops::conv2d(x, w, Tensor()); });
      CHECK(has(m, "conv2d"));
      CHECK(has(m, "channels"));
      CHECK(has(m, "[1, 3, 5, 5]"));
      CHECK(has(m, "[2, 4, 3, 3]"));
      CHECK(has(error_of([&] { ops::conv2d(x, Tensor::zeros(e, Shape{2, 3, 3, 3}), Tensor::zeros(e, Shape{3})); }),
                "bias"));
      CHECK(has(error_of([&] { ops::conv2d(x, Tensor::zeros(e, Shape{2, 3, 7, 7}), Tensor()); }), "does not fit"));
      CHECK(has(error_of([&] { ops::conv2d(x, Tensor::zeros(e, Shape{2, 3, 3, 3}), Tensor(), {0, 0}); }),
                "stride 0"));
      CHECK(has(error_of([&] { ops::conv2d(a23, w, Tensor()); }), "[2, 3]"));
      CHECK(has(error_of([&] {
                  ops::conv2d_backward_data(Tensor::zeros(e, Shape{1, 2, 2, 2}), Tensor::zeros(e, Shape{2, 3, 3, 3}),
                                            Shape{1, 3, 5, 5});
                }),
                "dy [1, 2, 2, 2]"));
      m = error_of([&] { ops::max_pool2d(Tensor::zeros(e, Shape{1, 1, 3, 3}), {4, 1}); });
      CHECK(has(m, "max_pool2d"));
      CHECK(has(m, "window 4"));
      CHECK(has(m, "[1, 1, 3, 3]"));
      CHECK(has(error_of([&] { ops::avg_pool2d(Tensor::zeros(e, Shape{1, 1, 5, 3}), {4, 1}); }), "window 4"));
      CHECK(has(error_of([&] { ops::avg_pool2d(a23); }), "[2, 3]"));
      CHECK(has(error_of([&] { ops::avg_pool2d(Tensor::zeros(e, Shape{1, 1, 4, 4}), {2, 0}); }), "stride 0"));
      CHECK(has(error_of([&] {
                  ops::max_pool2d_backward(Tensor::zeros(e, Shape{1, 1, 4, 4}), Tensor::zeros(e, Shape{1, 1, 3, 3}));
                }),
                "dy [1, 1, 3, 3]"));
    }
    SUBCASE("dense shapes") {
      m = error_of([&] { ops::dense(a23, Tensor::zeros(e, Shape{4, 2}), Tensor()); });
      CHECK(has(m, "dense"));
      CHECK(has(m, "[4, 2]"));
      CHECK(has(error_of([&] { ops::dense(a23, Tensor::zeros(e, Shape{4, 3}), Tensor::zeros(e, Shape{5})); }),
                "b [5]"));
      CHECK(has(error_of([&] {
                  ops::dense_backward(a23, Tensor::zeros(e, Shape{4, 3}), Tensor::zeros(e, Shape{2, 5}));
                }),
                "dy [2, 5]"));
    }
    SUBCASE("labels shape mismatch and zero classes") {
      m = error_of([&] { ops::softmax_cross_entropy(Tensor::zeros(e, Shape{4, 3}), Tensor::zeros(e, Shape{5})); });
      CHECK(has(m, "softmax_cross_entropy"));
      CHECK(has(m, "labels [5]"));
      CHECK(has(m, "[4, 3]"));
      CHECK(has(error_of([&] {
                  ops::softmax_cross_entropy(Tensor::zeros(e, Shape{4, 3}), Tensor::zeros(e, Shape{4, 1}));
                }),
                "labels [4, 1]"));
      CHECK(has(error_of([&] { ops::softmax_cross_entropy(Tensor::zeros(e, Shape{4, 0}), Tensor::zeros(e, Shape{4})); }),
                "no classes"));
    }
    SUBCASE("from_host item reshape argmax sizes") {
      m = error_of([&] { Tensor::from_host(e, Shape{2, 3}, std::vector<float>(5)); });
      CHECK(has(m, "from_host"));
      CHECK(has(m, "5 values"));
      CHECK(has(m, "[2, 3]"));
      m = error_of([&] { Tensor::from_host(e, Shape{2}, std::vector<float>{1, 2}).item(); });
      CHECK(has(m, "item"));
      CHECK(has(m, "2 elements"));
      CHECK(has(error_of([&] { Tensor::zeros(e, Shape{0}).item(); }), "0 elements"));
      m = error_of([&] { a23.reshape(Shape{4, 2}); });
      CHECK(has(m, "reshape"));
      CHECK(has(m, "[4, 2]"));
      CHECK(has(m, "6 vs 8"));
      CHECK(has(error_of([&] { ops::argmax(Tensor::zeros(e, Shape{3, 0})); }), "no columns"));
      CHECK(has(error_of([&] { ops::argmax(Tensor::zeros(e, Shape{6})); }), "rank 2"));
      CHECK(has(error_of([&] { Tensor::uniform(e, Shape{2}, 1.0f, 0.0f, 1); }), "uniform"));
      CHECK(has(error_of([&] { Tensor::normal(e, Shape{2}, 0.0f, -1.0f, 1); }), "stddev"));
    }
    SUBCASE("unknown devices are named") {
      if (weft::gpu::device_count() == 0) {
        m = error_of([&] { Tensor::zeros(e, Shape{2}, Device::gpu(0)); });
        CHECK(has(m, "gpu(0)"));
        CHECK(has(error_of([&] { a23.copy_to(Device::gpu(0)); }), "gpu(0)"));
        CHECK(has(error_of([&] { Tensor::from_host(e, Shape{1}, std::vector<float>{1}, Device::gpu(0)); }),
                  "gpu(0)"));
        CHECK(has(error_of([&] { (void)memory_stats(e, Device::gpu(0)); }), "gpu(0)"));
      } else {
        MESSAGE("gpu(0) exists: not an unknown device here (the rest of the case runs)");
      }
      m = error_of([&] { Tensor::zeros(e, Shape{2}, Device::cpu(5)); });
      CHECK(has(m, "cpu(5)"));
      CHECK(has(m, "cpu(1)"));  // lists what exists
      CHECK(has(error_of([&] { a23.copy_to(Device::cpu(2)); }), "cpu(2)"));
      CHECK(has(error_of([&] { Tensor::from_host(e, Shape{1}, std::vector<float>{1}, Device::cpu(5)); }), "cpu(5)"));
      CHECK(has(error_of([&] { Tensor::ones(e, Shape{1}, Device::cpu_pinned(1)); }), "cpu_pinned(1)"));
      CHECK(has(error_of([&] { Tensor::uniform(e, Shape{1}, 0.0f, 1.0f, 1, Device::cpu(3)); }), "cpu(3)"));
    }
    // a failed push leaves nothing behind: the engine goes on
    CHECK(ops::add(a23, Tensor::ones(e, Shape{2, 3})).to_host() == std::vector<float>(6, 1.0f));
  });
}

TEST_CASE("push-time errors name the tensors the user named" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    // A zero tensor with a name ("" leaves it unnamed).
    auto t = [&](Shape shape, const std::string& name, Device d = cpu0, DType dtype = DType::float32) {
      Tensor x = dtype == DType::float32 ? Tensor::zeros(e, std::move(shape), d)
                                         : Tensor::empty(e, std::move(shape), d, dtype);
      if (!name.empty()) x.set_name(name);
      return x;
    };
    std::string m;

    SUBCASE("matmul names both operands; unnamed ones show their shapes alone") {
      const Tensor x = t(Shape{3, 4}, "x"), w = t(Shape{5, 6}, "w");
      CHECK(error_of([&] { (void)x.matmul(w); }) ==
            "matmul: inner dimensions differ: 'x' [3, 4] x 'w' [5, 6] (4 vs 5)");
      CHECK(error_of([&] { ops::matmul(x, w, true, true); }) ==
            "matmul: inner dimensions differ: 'x' [3, 4]^T x 'w' [5, 6]^T (3 vs 6)");
      // unnamed tensors: their shapes alone
      CHECK(error_of([&] { ops::matmul(t(Shape{3, 4}, ""), t(Shape{5, 6}, "")); }) ==
            "matmul: inner dimensions differ: [3, 4] x [5, 6] (4 vs 5)");
      CHECK(error_of([&] { ops::matmul(t(Shape{6}, "v"), w); }) == "matmul: a must have rank 2, got 'v' [6]");
      CHECK(error_of([&] { ops::matmul(x, t(Shape{6}, "")); }) == "matmul: b must have rank 2, got [6]");
    }
    SUBCASE("binary elementwise: shapes, dtypes, devices, engines") {
      const Tensor x = t(Shape{2, 3}, "x"), y = t(Shape{3, 2}, "y");
      CHECK(error_of([&] { ops::add(x, y); }) == "add: shapes differ: 'x' [2, 3] vs 'y' [3, 2]");
      CHECK(error_of([&] { (void)(x - y); }) == "sub: shapes differ: 'x' [2, 3] vs 'y' [3, 2]");
      CHECK(error_of([&] { ops::mul(x, t(Shape{3, 2}, "")); }) == "mul: shapes differ: 'x' [2, 3] vs [3, 2]");
      CHECK(error_of([&] { ops::relu_grad(t(Shape{6}, "pre"), y); }) ==
            "relu_grad: shapes differ: 'pre' [6] vs 'y' [3, 2]");
      Tensor acc = t(Shape{2, 3}, "acc");
      CHECK(error_of([&] { ops::axpy(0.5f, y, acc); }) == "axpy: shapes differ: 'y' [3, 2] vs 'acc' [2, 3]");
      CHECK(error_of([&] { ops::add(t(Shape{2, 3}, "d", cpu0, DType::float64), x); }) ==
            "add: a 'd' [2, 3] on cpu(0) has dtype float64; this op supports float32, bfloat16 and float16");
      CHECK(error_of([&] { ops::add(x, t(Shape{2, 3}, "", cpu0, DType::int32)); }) ==
            "add: b [2, 3] on cpu(0) has dtype int32; this op supports float32, bfloat16 and float16");
      CHECK(error_of([&] { ops::add(x, t(Shape{2, 3}, "z", cpu1)); }) ==
            "add: operands on different devices: 'x' [2, 3] float32 on cpu(0) and 'z' [2, 3] float32 on cpu(1) "
            "(copy_to one of them first)");
      auto other = Engine::create(EngineSpec{"naive"}.config());
      Tensor elsewhere = Tensor::zeros(*other, Shape{2, 3}).set_name("elsewhere");
      CHECK(error_of([&] { ops::add(x, elsewhere); }) ==
            "add: 'x' [2, 3] and 'elsewhere' [2, 3] belong to different engines");
      elsewhere = Tensor();
      other->wait_all();
    }
    SUBCASE("unary and reductions: dtype and rank") {
      const Tensor d = t(Shape{4}, "d", cpu0, DType::float64);
      CHECK(has(error_of([&] { ops::relu(d); }), "relu: x 'd' [4] on cpu(0) has dtype float64"));
      CHECK(has(error_of([&] { ops::sum(d); }), "sum: x 'd' [4] on cpu(0) has dtype float64"));
      CHECK(has(error_of([&] { ops::mean(d); }), "mean: x 'd' [4] on cpu(0) has dtype float64"));
      CHECK(error_of([&] { ops::argmax(t(Shape{6}, "scores")); }) == "argmax: x must have rank 2, got 'scores' [6]");
      CHECK(error_of([&] { ops::argmax(t(Shape{3, 0}, "scores")); }) ==
            "argmax: x 'scores' [3, 0] has rows with no columns");
    }
    SUBCASE("slices, packs, item and reshape") {
      const Tensor x = t(Shape{2, 3}, "batch");
      CHECK(has(error_of([&] { ops::slice_rows(x, 1, 3); }), "rows [1, 3) of x 'batch' [2, 3], which has 2"));
      CHECK(has(error_of([&] { ops::slice_rows(t(Shape{}, "s"), 0, 0); }), "slice_rows: x 's' [] has no rows"));
      Tensor flat = t(Shape{5}, "bucket");
      m = error_of([&] { ops::pack({t(Shape{2}, "g0"), t(Shape{2}, "g1")}, flat); });
      CHECK(m == "pack: the srcs hold 4 elements but the packed tensor 'bucket' [5] holds 5");
      m = error_of([&] { ops::pack({t(Shape{2}, "g0"), t(Shape{3}, "g1", cpu1)}, flat); });
      CHECK(m == "pack: src 1 'g1' [3] float32 on cpu(1) is not on cpu(0), where the packed tensor 'bucket' [5] is");
      const Tensor g = t(Shape{2}, "g");
      m = error_of([&] { ops::unpack(t(Shape{4}, "bucket"), {g, g}); });
      CHECK(m == "unpack: dsts 0 and 1 are one tensor, 'g' [2]");
      CHECK(error_of([&] { (void)x.item(); }) == "item: 'batch' [2, 3] has 6 elements, not 1");
      CHECK(error_of([&] { (void)x.reshape(Shape{4}); }) ==
            "reshape: 'batch' [2, 3] cannot become [4] (6 vs 4 elements)");
    }
    SUBCASE("copies between shapes, dtypes, devices and engines") {
      Tensor dst = t(Shape{2, 3}, "dst");
      const Tensor src = t(Shape{3, 2}, "src", cpu1);
      CHECK(error_of([&] { dst.copy_from(src); }) == "copy_from: shapes differ: 'dst' [2, 3] vs 'src' [3, 2]");
      CHECK(error_of([&] { dst.copy_from(t(Shape{2, 3}, "wide", cpu1, DType::float64)); }) ==
            "copy_from: destination 'dst' [2, 3] is float32 but source 'wide' [2, 3] is float64 (cast one of them "
            "first: ops::cast)");
      // Copies move any dtype's bytes.
      CHECK(t(Shape{2}, "half", cpu0, DType::float16).copy_to(cpu1).dtype() == DType::float16);
      m = error_of([&] { (void)src.copy_to(Device::cpu(7)); });
      CHECK(has(m, "copy_to: cannot copy 'src' [3, 2] to cpu(7): not one of this engine's devices (cpu(0), cpu(1), "));
      CHECK(has(m, "cpu_pinned(0))"));
      CHECK(error_of([&] { (void)src.copy_to(Device::cpu_pinned(2)); }) ==
            "copy_to: cannot copy 'src' [3, 2] to cpu_pinned(2): only cpu_pinned(0) exists");
      auto other = Engine::create(EngineSpec{"naive"}.config());
      Tensor there = Tensor::zeros(*other, Shape{2, 3}).set_name("there");
      CHECK(error_of([&] { dst.copy_from(there); }) ==
            "copy_from: 'dst' [2, 3] and 'there' [2, 3] belong to different engines");
      there = Tensor();
      other->wait_all();
    }
    SUBCASE("dense and its backward halves") {
      const Tensor x = t(Shape{2, 3}, "in"), w = t(Shape{4, 2}, "fc.weight"), b = t(Shape{4}, "fc.bias");
      CHECK(error_of([&] { ops::dense(x, w, b); }) ==
            "dense: x 'in' [2, 3], w 'fc.weight' [4, 2], b 'fc.bias' [4] do not fit (want w [out, 3], b [out])");
      CHECK(has(error_of([&] { ops::dense(x, w, Tensor()); }), "b (none) do not fit"));
      CHECK(error_of([&] { ops::dense(t(Shape{2, 3, 1}, "img"), w, b); }) ==
            "dense: x must have rank 2, got 'img' [2, 3, 1]");
      CHECK(error_of([&] { ops::dense(x, t(Shape{4, 3}, "w64", cpu0, DType::float64), b); }) ==
            "dense: w 'w64' [4, 3] on cpu(0) has dtype float64; this op supports float32, bfloat16 and float16");
      CHECK(has(error_of([&] { ops::dense(x, t(Shape{4, 3}, "far", cpu1), b); }),
                "dense: operands on different devices: 'in' [2, 3] float32 on cpu(0) and 'far' [4, 3] float32 on "
                "cpu(1)"));
      const Tensor w43 = t(Shape{4, 3}, "fc.weight"), dy = t(Shape{2, 5}, "fc.out.grad");
      CHECK(error_of([&] { ops::dense_backward(x, w43, dy); }) ==
            "dense_backward: x 'in' [2, 3], w 'fc.weight' [4, 3], dy 'fc.out.grad' [2, 5] do not fit");
      CHECK(error_of([&] { ops::dense_backward_data(dy, w43); }) ==
            "dense_backward_data: dy 'fc.out.grad' [2, 5] and w 'fc.weight' [4, 3] do not fit (want w [5, in])");
      CHECK(error_of([&] { ops::dense_backward_weight(x, t(Shape{3, 4}, "g")); }) ==
            "dense_backward_weight: x 'in' [2, 3] and dy 'g' [3, 4] have different batch sizes");
    }
    SUBCASE("conv2d forward and backward") {
      const Tensor x = t(Shape{1, 3, 5, 5}, "img"), w = t(Shape{2, 4, 3, 3}, "conv.weight");
      CHECK(error_of([&] { ops::conv2d(x, w, Tensor()); }) ==
            "conv2d: input 'img' [1, 3, 5, 5] has 3 channels, filter 'conv.weight' [2, 4, 3, 3] expects 4");
      CHECK(error_of([&] { ops::conv2d(t(Shape{2, 3}, "flat"), w, Tensor()); }) ==
            "conv2d: input must be [N, C, H, W] and filter [O, C, KH, KW]; got 'flat' [2, 3] and 'conv.weight' "
            "[2, 4, 3, 3]");
      const Tensor w3 = t(Shape{2, 3, 3, 3}, "conv.weight");
      CHECK(error_of([&] { ops::conv2d(x, w3, t(Shape{3}, "conv.bias")); }) ==
            "conv2d: bias 'conv.bias' [3] does not match 2 output channels");
      CHECK(error_of([&] { ops::conv2d(x, t(Shape{2, 3, 7, 7}, "big"), Tensor()); }) ==
            "conv2d: filter 'big' [2, 3, 7, 7] does not fit input 'img' [1, 3, 5, 5] with pad 0");
      CHECK(error_of([&] { ops::conv2d_backward_data(t(Shape{1, 2, 2, 2}, "gy"), w3, Shape{1, 3, 5, 5}); }) ==
            "conv2d_backward_data: dy 'gy' [1, 2, 2, 2] does not match the output of input [1, 3, 5, 5] and filter "
            "'conv.weight' [2, 3, 3, 3]");
      CHECK(error_of([&] { ops::conv2d_backward_data(t(Shape{1, 2, 3, 3}, "gy"), w, Shape{1, 3, 5, 5}); }) ==
            "conv2d_backward_data: input [1, 3, 5, 5] has 3 channels, filter 'conv.weight' [2, 4, 3, 3] expects 4");
      CHECK(error_of([&] { ops::conv2d_backward_filter(x, t(Shape{1, 2, 2, 2}, "gy"), Shape{2, 3, 3, 3}); }) ==
            "conv2d_backward_filter: dy 'gy' [1, 2, 2, 2] does not match the output of input 'img' [1, 3, 5, 5] and "
            "filter [2, 3, 3, 3]");
    }
    SUBCASE("pooling") {
      const Tensor x = t(Shape{1, 1, 3, 3}, "act");
      CHECK(error_of([&] { ops::max_pool2d(x, {4, 1}); }) ==
            "max_pool2d: window 4 stride 1 pad 0 does not fit input 'act' [1, 1, 3, 3]");
      CHECK(error_of([&] { ops::avg_pool2d(t(Shape{2, 3}, "flat")); }) ==
            "avg_pool2d: input must be [N, C, H, W], got 'flat' [2, 3]");
      CHECK(error_of([&] { ops::max_pool2d_backward(t(Shape{1, 1, 4, 4}, "act"), t(Shape{1, 1, 3, 3}, "gy")); }) ==
            "max_pool2d_backward: dy 'gy' [1, 1, 3, 3] does not match input 'act' [1, 1, 4, 4]");
      CHECK(error_of([&] { ops::avg_pool2d_backward(t(Shape{1, 1, 3, 3}, "gy"), Shape{1, 1, 4, 4}); }) ==
            "avg_pool2d_backward: dy 'gy' [1, 1, 3, 3] does not match input [1, 1, 4, 4]");
      CHECK(error_of([&] { ops::global_avg_pool2d(t(Shape{2, 3}, "flat")); }) ==
            "global_avg_pool2d: x must have rank 4, got 'flat' [2, 3]");
      CHECK(has(error_of([&] { ops::global_avg_pool2d_backward(t(Shape{1, 2}, "gy"), Shape{1, 2, 3, 3}); }),
                "global_avg_pool2d_backward: dy 'gy' [1, 2] does not match input [1, 2, 3, 3]"));
    }
    SUBCASE("batch norm") {
      const Tensor x = t(Shape{2, 2, 3, 3}, "act"), beta = t(Shape{2}, "bn.bias");
      Tensor mean = t(Shape{2}, "bn.running_mean"), var = t(Shape{2}, "bn.running_var");
      CHECK(error_of([&] { ops::batch_norm_train(x, t(Shape{3}, "bn.weight"), beta, mean, var); }) ==
            "batch_norm_train: gamma 'bn.weight' [3] does not match x's 2 channels (want [2])");
      CHECK(error_of([&] { ops::batch_norm_infer(t(Shape{6}, "flat"), t(Shape{2}, "bn.weight"), beta, mean, var); }) ==
            "batch_norm_infer: x must be [N, C, H, W] or [N, C], got 'flat' [6]");
      CHECK(has(error_of([&] { ops::batch_norm_train(t(Shape{1, 2}, "one"), t(Shape{2}, "g"), beta, mean, var); }),
                "batch_norm_train: x 'one' [1, 2] has 1 value(s) per channel"));
      CHECK(has(error_of([&] { ops::batch_norm_infer(x, t(Shape{2}, "g"), beta, mean, t(Shape{2}, "rv", cpu1)); }),
                "'act' [2, 2, 3, 3] float32 on cpu(0) and 'rv' [2] float32 on cpu(1)"));
      const Tensor s = t(Shape{2}, "");
      CHECK(error_of([&] { ops::batch_norm_backward(x, t(Shape{2, 2, 3}, "gy"), s, s, s); }) ==
            "batch_norm_backward: dy 'gy' [2, 2, 3] does not match x 'act' [2, 2, 3, 3]");
    }
    SUBCASE("loss and sgd") {
      const Tensor logits = t(Shape{4, 3}, "logits");
      CHECK(error_of([&] { ops::softmax_cross_entropy(logits, t(Shape{5}, "labels")); }) ==
            "softmax_cross_entropy: labels 'labels' [5] do not match logits 'logits' [4, 3] (want [4])");
      CHECK(error_of([&] { ops::softmax_cross_entropy(t(Shape{4, 0}, "z"), t(Shape{4}, "")); }) ==
            "softmax_cross_entropy: logits 'z' [4, 0] have no classes");
      Tensor w = t(Shape{2, 3}, "fc.weight");
      CHECK(error_of([&] { ops::sgd_update(w, t(Shape{3, 2}, "fc.weight.grad"), 0.1f); }) ==
            "sgd_update: shapes differ: 'fc.weight' [2, 3] vs 'fc.weight.grad' [3, 2]");
      CHECK(has(error_of([&] { ops::sgd_update(w, t(Shape{2, 3}, "g", cpu1), 0.1f); }),
                "'g' [2, 3] float32 on cpu(1)"));
    }
  });
}

TEST_CASE("a label out of range fails the op and the engine keeps working" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 1, 2, 3, 4, -1, 0, 1, 2};
    Tensor z = Tensor::from_host(e, Shape{3, 4}, logits);
    ops::SoftmaxCrossEntropy out =
        ops::softmax_cross_entropy(z, Tensor::from_host(e, Shape{3}, std::vector<float>{0, 7, 1}));
    // ops reading a failed output are skipped and pass the failure on
    Tensor after = out.dlogits * 2.0f;
    std::string m;
    try {
      (void)out.loss.to_host();
      m = "<no exception>";
    } catch (const weft::Error& err) {
      m = err.what();
    } catch (...) {
      m = "<not a weft::Error>";
    }
    INFO(m);
    CHECK(has(m, "softmax_cross_entropy"));
    CHECK(has(m, "label 7"));
    CHECK(has(m, "row 1"));
    // the record is reported once: a wait_all afterwards does not rethrow it
    CHECK_NOTHROW(e.wait_all());
    (void)after;

    // a second failure: this time the error surfaces through wait_all
    ops::SoftmaxCrossEntropy out2 =
        ops::softmax_cross_entropy(z, Tensor::from_host(e, Shape{3}, std::vector<float>{0, 1, -1}));
    CHECK(has(error_of([&] { e.wait_all(); }), "label -1"));
    CHECK_NOTHROW(e.wait_all());

    // and a third, reaching the waiter through an op that read the failed output
    ops::SoftmaxCrossEntropy out3 =
        ops::softmax_cross_entropy(z, Tensor::from_host(e, Shape{3}, std::vector<float>{0, 1, 2.5f}));
    Tensor downstream = ops::relu(out3.dlogits);
    CHECK(has(error_of([&] { downstream.wait_to_read(); }), "label 2.5"));
    CHECK_NOTHROW(e.wait_all());

    // the engine still works: new ops run, including a good loss on the same logits
    ops::SoftmaxCrossEntropy good =
        ops::softmax_cross_entropy(z, Tensor::from_host(e, Shape{3}, std::vector<float>{0, 3, 1}));
    const double want = softmax_ce_loss(dbl(logits), {0, 3, 1}, 3, 4);
    close({good.loss.item()}, {want}, "loss after the failure", 1e-5, 1.0);
    Tensor more = Tensor::ones(e, Shape{5, 5});
    for (int i = 0; i < 10; ++i) more = more + 1.0f;
    CHECK(more.to_host() == std::vector<float>(25, 11.0f));
    // the failed op's outputs can be rewritten and then read normally
    out.loss.copy_from(Tensor::full(e, Shape{}, 5.0f));
    CHECK(out.loss.item() == 5.0f);
    CHECK_NOTHROW(e.wait_all());
  });
}

TEST_CASE("a tensor whose allocation failed is an error for every later reader" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    // 2^38 floats: 1 TiB, more than the machine has. The creating op fails
    // with out-of-memory; readers pushed after that failure was reported must
    // fail with an error naming the cause, not dereference a null pointer.
    Tensor huge = Tensor::zeros(e, Shape{std::int64_t{1} << 38});
    CHECK(has(error_of([&] { (void)huge.to_host(); }), "out of memory on cpu(0)"));
    CHECK(has(error_of([&] { (void)ops::sum(huge).item(); }), "has no memory"));
    CHECK(has(error_of([&] { (void)huge.to_host(); }), "has no memory"));
    CHECK_NOTHROW(e.wait_all());
    CHECK((Tensor::ones(e, Shape{3}) + 1.0f).to_host() == std::vector<float>(3, 2.0f));
  });
}

// ---- memory ------------------------------------------------------------------

TEST_CASE("memory: a loop of same-shape tensors reuses the cache" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    const Shape s{256, 255};
    const std::size_t bytes = static_cast<std::size_t>(s.numel()) * sizeof(float);
    e.allocator(cpu0).release_cached();
    const weft::MemoryStats before = weft::memory_stats(e, cpu0);
    CHECK(before.in_use == 0);
    for (int i = 0; i < 100; ++i) {
      Tensor t = Tensor::full(e, s, static_cast<float>(i));
      Tensor u = t * 2.0f;
      CHECK(u.sum().item() == static_cast<float>(2.0 * i * s.numel()));
    }
    e.wait_all();
    const weft::MemoryStats after = weft::memory_stats(e, cpu0);
    INFO("allocations " << after.allocations << " cache_hits " << after.cache_hits << " reserved " << after.reserved
                        << " peak " << after.peak_in_use << " in_use " << after.in_use);
    CHECK(after.allocations - before.allocations == 300);  // t, u, the sum
    CHECK(after.cache_hits - before.cache_hits >= 150);
    // two live blocks per iteration, plus a little slack for a block freed by
    // a worker just after the frontend woke up: not 100x
    CHECK(after.reserved <= 8 * bytes);
    CHECK(after.peak_in_use <= 8 * bytes);
    CHECK(after.peak_in_use >= 2 * bytes);
    // everything dropped: nothing in use once the closures are gone
    CHECK(after.in_use <= 4 * bytes);
    e.allocator(cpu0).release_cached();
    CHECK(weft::memory_stats(e, cpu0).reserved == weft::memory_stats(e, cpu0).in_use);
  });
}

TEST_CASE("memory: peak_in_use covers the live tensors" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    e.allocator(cpu0).reset_peak();
    std::vector<Tensor> live;
    std::size_t live_bytes = 0;
    for (const Shape& s : {Shape{1}, Shape{7, 13}, Shape{1000, 3}, Shape{300, 301}, Shape{0, 9}}) {
      live.push_back(Tensor::uniform(e, s, 0.0f, 1.0f, 3));
      live_bytes += live.back().nbytes();
    }
    e.wait_all();
    const weft::MemoryStats m = weft::memory_stats(e, cpu0);
    CHECK(m.in_use >= live_bytes);
    CHECK(m.peak_in_use >= live_bytes);
    CHECK(m.reserved >= m.in_use);
    CHECK(m.peak_in_use >= m.in_use);
    // cpu(1) and pinned are separate allocators
    const weft::MemoryStats m1 = weft::memory_stats(e, cpu1);
    Tensor on1 = Tensor::zeros(e, Shape{1 << 16}, cpu1);
    on1.wait_to_read();
    CHECK(weft::memory_stats(e, cpu1).in_use >= m1.in_use + on1.nbytes());
    CHECK(weft::memory_stats(e, cpu0).in_use == m.in_use);
    Tensor pinned = Tensor::zeros(e, Shape{1000}, Device::cpu_pinned(0));
    pinned.wait_to_read();
    CHECK(weft::memory_stats(e, Device::cpu_pinned(0)).in_use >= pinned.nbytes());
  });
}

// ---- lifetime ----------------------------------------------------------------

TEST_CASE("tensors dropped while their ops are pending" * doctest::timeout(60)) {
  for_each_engine([](Engine& e) {
    const std::vector<float> data = {1, 2, 3, 4, 5, 6, 7};
    // y computed from a temporary x that is gone right after the push
    Tensor y;
    {
      Tensor x = Tensor::from_host(e, Shape{7}, data);
      y = x + 1.0f;
    }
    CHECK(y.to_host() == std::vector<float>{2, 3, 4, 5, 6, 7, 8});
    CHECK(ops::add_scalar(Tensor::from_host(e, Shape{7}, data), 1.0f).to_host() ==
          std::vector<float>{2, 3, 4, 5, 6, 7, 8});

    // A chain of temporaries, each dropped at once; on the threaded engine the
    // chain is held back by a blocked op so every handle is gone while pending.
    std::atomic<bool> open{e.kind() == "naive"};
    Tensor acc = Tensor::ones(e, Shape{64, 33});
    if (e.kind() != "naive")
      e.push([&open](weft::RunContext&) { open.wait(false); }, cpu0, {}, {acc.var()}, {0, "blocker"});
    Tensor result;
    Tensor view_result;
    {
      Tensor cur = acc;
      for (int i = 0; i < 50; ++i) cur = (cur + 1.0f) * 1.0f;
      result = ops::matmul(cur, Tensor::ones(e, Shape{33, 2}), false, false);
      view_result = cur.reshape(Shape{33, 64}).copy_to(cpu1);
      acc = Tensor();  // the source too
      // pushed-and-dropped ops with no handle left at all
      for (int i = 0; i < 20; ++i) (void)(ops::relu(cur) + ops::mul_scalar(cur, 2.0f));
    }
    open.store(true);
    open.notify_all();
    CHECK(result.to_host() == std::vector<float>(64 * 2, 51.0f * 33));
    CHECK(view_result.to_host() == std::vector<float>(64 * 33, 51.0f));
    CHECK(view_result.shape() == Shape{33, 64});

    // in-place ops on a tensor dropped right after the push
    Tensor keep_src = Tensor::full(e, Shape{100}, 3.0f);
    Tensor observed;
    {
      Tensor w = Tensor::ones(e, Shape{100});
      ops::sgd_update(w, keep_src, 0.5f);  // w = 1 - 1.5 = -0.5
      ops::axpy(2.0f, keep_src, w);        // w = 5.5
      observed = w.copy_to(cpu1);
    }
    CHECK(observed.to_host() == std::vector<float>(100, 5.5f));
    // everything dropped and drained: all memory goes back to the cache (a
    // worker may still be destroying the last closure when wait_all returns)
    observed = Tensor(), y = Tensor(), result = Tensor(), view_result = Tensor(), keep_src = Tensor();
    e.wait_all();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (weft::memory_stats(e, cpu0).in_use != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    CHECK(weft::memory_stats(e, cpu0).in_use == 0);
    CHECK(weft::memory_stats(e, cpu1).in_use == 0);
  });
}
