// Every op on gpu(0) against the same op on cpu(0) of the same engine, over
// random data, odd shapes and edge sizes (0 and 1 elements, empty batches,
// k == 0 products). Tolerances: creation, copies and single-rounding
// elementwise ops are (nearly) exact; reductions and the loss accumulate in
// double on both sides (1e-5); cuBLAS/cuDNN sum in another order than the
// CPU kernels (1e-3 of the result's magnitude).
#include <iterator>
#include <limits>

#include "gpu_test_util.h"

using namespace gputest;
namespace ops = weft::ops;

namespace {

using Outputs = std::vector<Tensor>;

// Runs make(cpu(0)) and make(gpu(0)) and compares output by output.
template <class Make>
void compare_devices(const std::string& what, Make make, double rtol, double atol_of_max, double atol = 0) {
  INFO(what);
  const Outputs want_t = make(Device::cpu(0));
  const Outputs got_t = make(Device::gpu(0));
  REQUIRE(got_t.size() == want_t.size());
  for (std::size_t i = 0; i < got_t.size(); ++i) {
    const std::string label = what + " output " + std::to_string(i);
    INFO(label);
    CHECK(got_t[i].device() == Device::gpu(0));
    CHECK(want_t[i].device() == Device::cpu(0));
    REQUIRE(got_t[i].shape() == want_t[i].shape());
    const std::vector<float> want = want_t[i].to_host();
    const std::vector<float> got = got_t[i].to_host();
    CHECK(got.size() == static_cast<std::size_t>(got_t[i].numel()));
    expect_close(got, want, rtol, atol + atol_of_max * max_abs(want), label);
  }
}

// The same host data on any device.
Tensor input(Engine& e, Device d, const Shape& s, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return Tensor::from_host(e, s, random_values(static_cast<std::size_t>(s.numel()), seed, lo, hi), d);
}

// Random values with exact zeros sprinkled in (relu's boundary).
Tensor input_with_zeros(Engine& e, Device d, const Shape& s, std::uint64_t seed) {
  std::vector<float> v = random_values(static_cast<std::size_t>(s.numel()), seed);
  for (std::size_t i = 0; i < v.size(); i += 7) v[i] = (i / 7) % 2 ? 0.0f : -0.0f;
  return Tensor::from_host(e, s, v, d);
}

const std::vector<Shape>& elementwise_shapes() {
  static const std::vector<Shape> shapes{Shape{0}, Shape{}, Shape{1}, Shape{31}, Shape{3, 5, 7}, Shape{257, 3},
                                         Shape{100003}, Shape{1 << 20}};
  return shapes;
}

std::unique_ptr<Engine> gpu_engine() { return make_engine({.kind = "threaded", .gpu_devices = 1}); }

}  // namespace

TEST_CASE("gpu ops - creation matches cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  for (std::int64_t n : {0, 1, 2, 999, 1000003}) {
    const Shape s{n};
    const std::string tag = " n=" + std::to_string(n);
    compare_devices("zeros" + tag, [&](Device d) { return Outputs{Tensor::zeros(*e, s, d)}; }, 0, 0);
    compare_devices("ones" + tag, [&](Device d) { return Outputs{Tensor::ones(*e, s, d)}; }, 0, 0);
    compare_devices("full" + tag, [&](Device d) { return Outputs{Tensor::full(*e, s, -2.5f, d)}; }, 0, 0);
    // Counter-based: the same values on every device.
    compare_devices("uniform" + tag, [&](Device d) { return Outputs{Tensor::uniform(*e, s, -3.0f, 5.0f, 42, d)}; },
                    0, 1e-6);
    compare_devices("normal" + tag,
                    [&](Device d) { return Outputs{Tensor::normal(*e, s, 0.5f, 2.0f, 43, d)}; }, 1e-5, 1e-6);
    const std::vector<float> u = Tensor::uniform(*e, s, -3.0f, 5.0f, 42, Device::gpu(0)).to_host();
    for (float x : u) REQUIRE((x >= -3.0f && x <= 5.0f));
  }
  // Different seeds differ; normal has roughly its moments.
  const std::vector<float> a = Tensor::normal(*e, Shape{1 << 20}, 1.0f, 3.0f, 1, Device::gpu(0)).to_host();
  const std::vector<float> b = Tensor::normal(*e, Shape{1 << 20}, 1.0f, 3.0f, 2, Device::gpu(0)).to_host();
  CHECK(a != b);
  double mean = 0, var = 0;
  for (float x : a) mean += x;
  mean /= static_cast<double>(a.size());
  for (float x : a) var += (x - mean) * (x - mean);
  var /= static_cast<double>(a.size());
  CHECK(mean == doctest::Approx(1.0).epsilon(0.02));
  CHECK(std::sqrt(var) == doctest::Approx(3.0).epsilon(0.02));
  e->wait_all();
}

TEST_CASE("gpu ops - from_host to_host and item" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  for (std::int64_t n : {0, 1, 3, 4097, 3000001}) {
    std::vector<float> v = random_values(static_cast<std::size_t>(n), 7 + static_cast<std::uint64_t>(n), -1e6f, 1e6f);
    // Special values survive every copy bit for bit.
    const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()};
    for (std::size_t i = 0; i < v.size() && i < std::size(specials); ++i) v[i * 3 % v.size()] = specials[i];
    const Tensor g = Tensor::from_host(*e, Shape{n}, v, Device::gpu(0));
    CHECK(g.device() == Device::gpu(0));
    CHECK(g.shape() == Shape{n});
    expect_bits_equal(g.to_host(), v, "from_host/to_host n=" + std::to_string(n));
    // The pushed data was copied at push time: clobbering it changes nothing.
    std::vector<float> w = v;
    const Tensor g2 = Tensor::from_host(*e, Shape{n}, w, Device::gpu(0));
    std::fill(w.begin(), w.end(), 123.0f);
    expect_bits_equal(g2.to_host(), v, "from_host copies at push time n=" + std::to_string(n));
    // A reshape shares the storage.
    if (n == 4097) expect_bits_equal(g.reshape(Shape{17, 241}).to_host(), v, "reshape");
  }
  const std::vector<float> one{3.25f};
  CHECK(Tensor::from_host(*e, Shape{}, one, Device::gpu(0)).item() == 3.25f);
  CHECK(Tensor::from_host(*e, Shape{1}, one, Device::gpu(0)).item() == 3.25f);
  CHECK(Tensor::from_host(*e, Shape{1, 1, 1}, one, Device::gpu(0)).item() == 3.25f);
  CHECK(Tensor::full(*e, Shape{}, -7.5f, Device::gpu(0)).item() == -7.5f);
  CHECK_THROWS_AS((void)Tensor::zeros(*e, Shape{2}, Device::gpu(0)).item(), weft::Error);
  CHECK_THROWS_AS((void)Tensor::zeros(*e, Shape{0}, Device::gpu(0)).item(), weft::Error);
  e->wait_all();
}

TEST_CASE("gpu ops - elementwise match cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  std::uint64_t seed = 100;
  for (const Shape& s : elementwise_shapes()) {
    const std::string tag = std::string(" ").append(s.str());  // (not " " + ...: GCC 12's -Wrestrict false positive)
    seed += 10;
    auto a = [&](Device d) { return input(*e, d, s, seed); };
    auto b = [&](Device d) { return input(*e, d, s, seed + 1); };
    // One rounding each: exact on both sides.
    compare_devices("add" + tag, [&](Device d) { return Outputs{ops::add(a(d), b(d))}; }, 0, 0);
    compare_devices("sub" + tag, [&](Device d) { return Outputs{ops::sub(a(d), b(d))}; }, 0, 0);
    compare_devices("mul" + tag, [&](Device d) { return Outputs{ops::mul(a(d), b(d))}; }, 0, 0);
    compare_devices("operators" + tag,
                    [&](Device d) { return Outputs{a(d) + b(d), a(d) - b(d), a(d) * b(d), a(d) + 0.5f, a(d) * -3.0f}; },
                    0, 0);
    compare_devices("add_scalar" + tag, [&](Device d) { return Outputs{ops::add_scalar(a(d), 1.75f)}; }, 0, 0);
    compare_devices("mul_scalar" + tag, [&](Device d) { return Outputs{ops::mul_scalar(a(d), -0.3f)}; }, 0, 0);
    compare_devices("relu" + tag, [&](Device d) { return Outputs{ops::relu(input_with_zeros(*e, d, s, seed + 2))}; },
                    0, 0);
    compare_devices("relu_grad" + tag,
                    [&](Device d) { return Outputs{ops::relu_grad(input_with_zeros(*e, d, s, seed + 2), b(d))}; }, 0,
                    0);
    // y + alpha x may or may not be fused into one rounding.
    compare_devices("axpy" + tag,
                    [&](Device d) {
                      Tensor y = b(d);
                      ops::axpy(0.37f, a(d), y);
                      ops::axpy(-1.5f, a(d), y);
                      return Outputs{y};
                    },
                    1e-6, 1e-7);
    compare_devices("pack and unpack" + tag,
                    [&](Device d) {
                      const std::vector<Tensor> srcs{a(d), Tensor::full(*e, Shape{3}, 2.0f, d), b(d)};
                      Tensor flat = Tensor::empty(*e, Shape{2 * s.numel() + 3}, d);
                      ops::pack(srcs, flat, 0.25f);
                      ops::pack(srcs, flat, -1.0f, /*accumulate=*/true);
                      std::vector<Tensor> outs{Tensor::empty(*e, s, d), Tensor::empty(*e, Shape{3}, d),
                                               Tensor::empty(*e, s, d)};
                      ops::unpack(flat, outs);
                      return Outputs{flat, outs[0], outs[1], outs[2]};
                    },
                    1e-6, 1e-7);
    compare_devices("sgd_update" + tag,
                    [&](Device d) {
                      Tensor w = a(d), w2 = b(d);
                      ops::sgd_update(w, b(d), 0.1f, 0.0f);
                      ops::sgd_update(w2, a(d), 0.05f, 0.01f);
                      ops::sgd_update(w2, a(d), 0.05f, 0.01f);
                      return Outputs{w, w2};
                    },
                    1e-6, 1e-7);
  }
  e->wait_all();
}

TEST_CASE("gpu ops - reductions match cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  std::uint64_t seed = 300;
  for (std::int64_t n : {0, 1, 2, 255, 256, 257, 100003, (1 << 20) + 3, 5 << 20}) {
    const Shape s{n};
    const std::string tag = " n=" + std::to_string(n);
    ++seed;
    // Positive data: sum |x| is the sum, so 1e-5 relative is the scale of the error.
    compare_devices("sum" + tag, [&](Device d) { return Outputs{ops::sum(input(*e, d, s, seed, 0.0f, 2.0f))}; }, 1e-5,
                    0);
    compare_devices("mean" + tag, [&](Device d) { return Outputs{input(*e, d, s, seed, 0.0f, 2.0f).mean()}; }, 1e-5, 0);
    // Mixed signs cancel: the error scale is the sum of magnitudes (~n/2).
    compare_devices("sum mixed" + tag, [&](Device d) { return Outputs{input(*e, d, s, seed + 1).sum()}; }, 1e-5, 0,
                    1e-6 * static_cast<double>(n));
  }
  // mean of nothing is NaN on both.
  CHECK(std::isnan(ops::mean(Tensor::zeros(*e, Shape{0}, Device::gpu(0))).item()));
  CHECK(ops::sum(Tensor::zeros(*e, Shape{0}, Device::gpu(0))).item() == 0.0f);
  CHECK(ops::sum(Tensor::ones(*e, Shape{3, 1000, 7}, Device::gpu(0))).item() == 21000.0f);

  for (const Shape& s : {Shape{0, 0}, Shape{0, 5}, Shape{1, 1}, Shape{7, 13}, Shape{300, 1001}, Shape{33, 64},
                         Shape{2, 100000}}) {
    ++seed;
    compare_devices("argmax " + s.str(), [&](Device d) { return Outputs{ops::argmax(input(*e, d, s, seed))}; }, 0, 0);
  }
  // Ties go to the lowest index on both.
  std::vector<float> ties(5 * 70, 1.0f);
  for (int c = 0; c < 70; ++c) ties[70 + c] = static_cast<float>(c % 9);          // row 1: max 8 first at 8
  ties[2 * 70 + 40] = 9.0f, ties[2 * 70 + 3] = 9.0f;                             // row 2: tie at 3 and 40
  for (int c = 0; c < 70; ++c) ties[3 * 70 + c] = -static_cast<float>(c);        // row 3: 0
  ties[4 * 70 + 69] = 2.0f;                                                      // row 4: the last column
  compare_devices("argmax ties",
                  [&](Device d) { return Outputs{ops::argmax(Tensor::from_host(*e, Shape{5, 70}, ties, d))}; }, 0, 0);
  const std::vector<float> idx = ops::argmax(Tensor::from_host(*e, Shape{5, 70}, ties, Device::gpu(0))).to_host();
  CHECK(idx == std::vector<float>{0.0f, 8.0f, 3.0f, 0.0f, 69.0f});
  e->wait_all();
}

TEST_CASE("gpu ops - matmul all transposes and edge sizes" * doctest::timeout(180)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  struct Mkn {
    std::int64_t m, k, n;
  };
  const Mkn sizes[] = {{0, 3, 4}, {3, 0, 4}, {3, 4, 0}, {0, 0, 0}, {1, 1, 1}, {1, 7, 1},
                       {7, 5, 3}, {64, 1, 33}, {2, 300, 2}, {127, 129, 131}, {513, 257, 129}};
  std::uint64_t seed = 500;
  for (const Mkn& z : sizes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const Shape sa = ta ? Shape{z.k, z.m} : Shape{z.m, z.k};
      const Shape sb = tb ? Shape{z.n, z.k} : Shape{z.k, z.n};
      seed += 2;
      const std::string what = "matmul m=" + std::to_string(z.m) + " k=" + std::to_string(z.k) +
                               " n=" + std::to_string(z.n) + (ta ? " A^T" : "") + (tb ? " B^T" : "");
      compare_devices(what,
                      [&](Device d) {
                        Tensor c = ops::matmul(input(*e, d, sa, seed), input(*e, d, sb, seed + 1), ta, tb);
                        CHECK(c.shape() == Shape{z.m, z.n});
                        return Outputs{c};
                      },
                      1e-3, 1e-3);
      if (z.k == 0 && z.m * z.n > 0) {
        // An empty inner dimension gives zeros, even into recycled memory.
        const std::vector<float> zeros =
            ops::matmul(input(*e, Device::gpu(0), sa, seed), input(*e, Device::gpu(0), sb, seed + 1), ta, tb)
                .to_host();
        for (float x : zeros) REQUIRE(x == 0.0f);
      }
    }
  }
  // Tensor::matmul is ops::matmul.
  compare_devices("Tensor::matmul",
                  [&](Device d) { return Outputs{input(*e, d, Shape{9, 4}, 1).matmul(input(*e, d, Shape{4, 6}, 2))}; },
                  1e-3, 1e-3);
  e->wait_all();
}

TEST_CASE("gpu ops - dense forward and backward match cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  std::uint64_t seed = 700;
  for (std::int64_t batch : {0, 1, 33, 257}) {
    for (auto [in, out] : {std::pair<std::int64_t, std::int64_t>{17, 9}, {1, 1}, {300, 10}}) {
      for (bool bias : {true, false}) {
        seed += 4;
        const std::string tag = " batch=" + std::to_string(batch) + " in=" + std::to_string(in) +
                                " out=" + std::to_string(out) + (bias ? " bias" : "");
        compare_devices("dense" + tag,
                        [&](Device d) {
                          const Tensor b = bias ? input(*e, d, Shape{out}, seed + 2) : Tensor();
                          return Outputs{ops::dense(input(*e, d, Shape{batch, in}, seed),
                                                    input(*e, d, Shape{out, in}, seed + 1), b)};
                        },
                        1e-3, 1e-3);
        compare_devices("dense_backward" + tag,
                        [&](Device d) {
                          ops::DenseGrads g =
                              ops::dense_backward(input(*e, d, Shape{batch, in}, seed),
                                                  input(*e, d, Shape{out, in}, seed + 1),
                                                  input(*e, d, Shape{batch, out}, seed + 3));
                          return Outputs{g.dx, g.dw, g.db};
                        },
                        1e-3, 1e-3);
      }
    }
  }
  e->wait_all();
}

TEST_CASE("gpu ops - conv2d forward and backward match cpu" * doctest::timeout(240)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  struct Conv {
    std::int64_t n, c, h, w, o, kh, kw, stride, pad;
  };
  const Conv configs[] = {
      {2, 3, 9, 11, 4, 3, 3, 1, 0}, {1, 1, 5, 5, 1, 5, 5, 1, 0},  {3, 2, 13, 10, 5, 3, 2, 2, 1},
      {2, 3, 8, 8, 4, 1, 1, 1, 0},  {1, 4, 7, 7, 3, 3, 3, 3, 2},  {0, 3, 8, 8, 4, 3, 3, 1, 1},
      {2, 5, 17, 17, 6, 5, 5, 2, 2}, {1, 1, 1, 1, 1, 1, 1, 1, 0}, {4, 1, 28, 28, 6, 5, 5, 1, 2},
      {1, 2, 3, 3, 2, 3, 3, 1, 1},
  };
  std::uint64_t seed = 900;
  for (const Conv& g : configs) {
    const Shape xs{g.n, g.c, g.h, g.w}, ws{g.o, g.c, g.kh, g.kw};
    const ops::Conv2dParams p{g.stride, g.pad};
    const std::int64_t oh = (g.h + 2 * g.pad - g.kh) / g.stride + 1, ow = (g.w + 2 * g.pad - g.kw) / g.stride + 1;
    const Shape ys{g.n, g.o, oh, ow};
    char buf[160];
    std::snprintf(buf, sizeof buf, " x[%lld %lld %lld %lld] w[%lld %lld %lld %lld] stride %lld pad %lld",
                  static_cast<long long>(g.n), static_cast<long long>(g.c), static_cast<long long>(g.h),
                  static_cast<long long>(g.w), static_cast<long long>(g.o), static_cast<long long>(g.c),
                  static_cast<long long>(g.kh), static_cast<long long>(g.kw), static_cast<long long>(g.stride),
                  static_cast<long long>(g.pad));
    const std::string tag = buf;
    seed += 4;
    for (bool bias : {true, false}) {
      compare_devices(std::string("conv2d") + (bias ? " bias" : "") + tag,
                      [&](Device d) {
                        const Tensor b = bias ? input(*e, d, Shape{g.o}, seed + 2) : Tensor();
                        Tensor y = ops::conv2d(input(*e, d, xs, seed), input(*e, d, ws, seed + 1), b, p);
                        CHECK(y.shape() == ys);
                        return Outputs{y};
                      },
                      1e-3, 1e-3);
    }
    compare_devices("conv2d_backward_data" + tag,
                    [&](Device d) {
                      return Outputs{ops::conv2d_backward_data(input(*e, d, ys, seed + 3), input(*e, d, ws, seed + 1),
                                                               xs, p)};
                    },
                    1e-3, 1e-3);
    compare_devices("conv2d_backward_filter" + tag,
                    [&](Device d) {
                      ops::ConvFilterGrads fg =
                          ops::conv2d_backward_filter(input(*e, d, xs, seed), input(*e, d, ys, seed + 3), ws, p);
                      return Outputs{fg.dw, fg.db};
                    },
                    1e-3, 1e-3);
  }
  e->wait_all();
}

TEST_CASE("gpu ops - pooling forward and backward match cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  struct Pool {
    std::int64_t n, c, h, w, kernel, stride, pad = 0;
  };
  const Pool configs[] = {{2, 3, 8, 8, 2, 2},      {1, 2, 9, 7, 3, 2},    {3, 1, 5, 5, 2, 1},
                          {1, 1, 1, 1, 1, 1},      {0, 2, 4, 4, 2, 2},    {2, 4, 6, 6, 3, 3},
                          {1, 3, 33, 17, 4, 3},    {8, 6, 28, 28, 2, 2},  {4, 8, 28, 28, 3, 2, 1},
                          {1, 2, 7, 6, 3, 2, 1},   {2, 1, 5, 5, 4, 3, 2}, {1, 1, 1, 1, 3, 1, 1}};
  std::uint64_t seed = 1100;
  for (const Pool& g : configs) {
    const Shape xs{g.n, g.c, g.h, g.w};
    const ops::Pool2dParams p{g.kernel, g.stride, g.pad};
    const Shape ys{g.n, g.c, (g.h + 2 * g.pad - g.kernel) / g.stride + 1, (g.w + 2 * g.pad - g.kernel) / g.stride + 1};
    const std::string tag = " x" + xs.str() + " kernel " + std::to_string(g.kernel) + " stride " +
                            std::to_string(g.stride) + " pad " + std::to_string(g.pad);
    seed += 2;
    compare_devices("avg_pool2d" + tag,
                    [&](Device d) {
                      Tensor y = ops::avg_pool2d(input(*e, d, xs, seed), p);
                      CHECK(y.shape() == ys);
                      return Outputs{y};
                    },
                    1e-5, 1e-6);
    compare_devices("avg_pool2d_backward" + tag,
                    [&](Device d) { return Outputs{ops::avg_pool2d_backward(input(*e, d, ys, seed + 1), xs, p)}; },
                    1e-5, 1e-6);
    compare_devices("max_pool2d" + tag, [&](Device d) { return Outputs{ops::max_pool2d(input(*e, d, xs, seed), p)}; },
                    0, 0);
    // Overlapping windows (stride < kernel) add several gradients into one input.
    compare_devices("max_pool2d_backward" + tag,
                    [&](Device d) {
                      return Outputs{ops::max_pool2d_backward(input(*e, d, xs, seed), input(*e, d, ys, seed + 1), p)};
                    },
                    1e-6, 1e-7);
  }
  e->wait_all();
}

TEST_CASE("gpu ops - global average pooling matches cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  std::uint64_t seed = 1200;
  for (const Shape& xs : {Shape{2, 3, 5, 7}, Shape{1, 1, 1, 1}, Shape{0, 4, 3, 3}, Shape{64, 512, 4, 4},
                          Shape{3, 2, 28, 28}}) {
    seed += 2;
    const Shape ys{xs[0], xs[1], 1, 1};
    compare_devices("global_avg_pool2d x" + xs.str(),
                    [&](Device d) { return Outputs{ops::global_avg_pool2d(input(*e, d, xs, seed))}; }, 1e-5, 1e-6);
    compare_devices("global_avg_pool2d_backward x" + xs.str(),
                    [&](Device d) { return Outputs{ops::global_avg_pool2d_backward(input(*e, d, ys, seed + 1), xs)}; },
                    1e-6, 1e-7);
  }
  e->wait_all();
}

// cuDNN's batch norm sums in its own order: 1e-4 of the result's magnitude.
TEST_CASE("gpu ops - batch norm training, inference and backward match cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  std::uint64_t seed = 1250;
  for (const Shape& xs : {Shape{4, 3, 5, 5}, Shape{2, 1, 1, 1}, Shape{16, 64, 14, 14}, Shape{7, 5}, Shape{3, 8, 1, 3}}) {
    seed += 4;
    const std::int64_t c = xs[1];
    const ops::BatchNormParams p{.eps = 1e-5f, .momentum = 0.2f};
    // An offset per channel, so the statistics have something to remove.
    auto x_on = [&](Device d) {
      std::vector<float> v = random_values(static_cast<std::size_t>(xs.numel()), seed, -2.0f, 2.0f);
      const std::int64_t hw = xs.numel() / std::max<std::int64_t>(1, xs[0] * c);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] += 3.0f * static_cast<float>((static_cast<std::int64_t>(i) / hw) % c);
      return Tensor::from_host(*e, xs, v, d);
    };
    const std::string tag = " x" + xs.str();
    compare_devices("batch_norm_train" + tag,
                    [&](Device d) {
                      Tensor rm = input(*e, d, Shape{c}, seed + 1), rv = input(*e, d, Shape{c}, seed + 2, 0.5f, 2.0f);
                      ops::BatchNormTrain t = ops::batch_norm_train(x_on(d), input(*e, d, Shape{c}, seed + 3),
                                                                    input(*e, d, Shape{c}, seed + 4), rm, rv, p);
                      return Outputs{t.y, t.save_mean, t.save_invstd, rm, rv};
                    },
                    1e-4, 1e-4);
    compare_devices("batch_norm_infer" + tag,
                    [&](Device d) {
                      return Outputs{ops::batch_norm_infer(x_on(d), input(*e, d, Shape{c}, seed + 3),
                                                           input(*e, d, Shape{c}, seed + 4), input(*e, d, Shape{c}, seed + 1),
                                                           input(*e, d, Shape{c}, seed + 2, 0.5f, 2.0f), p)};
                    },
                    1e-5, 1e-5);
    compare_devices("batch_norm_backward" + tag,
                    [&](Device d) {
                      const Tensor x = x_on(d), gamma = input(*e, d, Shape{c}, seed + 3);
                      Tensor rm = Tensor::zeros(*e, Shape{c}, d), rv = Tensor::ones(*e, Shape{c}, d);
                      const ops::BatchNormTrain t = ops::batch_norm_train(x, gamma, input(*e, d, Shape{c}, seed + 4), rm, rv, p);
                      const ops::BatchNormGrads g =
                          ops::batch_norm_backward(x, input(*e, d, xs, seed + 5), gamma, t.save_mean, t.save_invstd, p);
                      return Outputs{g.dx, g.dgamma, g.dbeta};
                    },
                    1e-4, 1e-4);
  }
  e->wait_all();
}

TEST_CASE("gpu ops - softmax cross entropy matches cpu" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = gpu_engine();
  std::uint64_t seed = 1300;
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{0, 3}, {1, 1}, {1, 5}, {7, 10}, {300, 1001},
                            {4096, 10}, {33, 64}}) {
    seed += 2;
    Rng rng(seed);
    std::vector<float> labels(static_cast<std::size_t>(rows));
    for (float& l : labels) l = static_cast<float>(rng.below(cols));
    const std::string tag = " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
    compare_devices("softmax_cross_entropy" + tag,
                    [&](Device d) {
                      // Large logits: the max shift must keep exp finite.
                      ops::SoftmaxCrossEntropy s = ops::softmax_cross_entropy(
                          input(*e, d, Shape{rows, cols}, seed, -40.0f, 60.0f),
                          Tensor::from_host(*e, Shape{rows}, labels, d));
                      CHECK(s.loss.shape() == Shape{});
                      return Outputs{s.loss, s.dlogits};
                    },
                    1e-5, 1e-6);
  }
  e->wait_all();
}
