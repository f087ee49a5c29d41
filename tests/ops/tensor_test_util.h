// Helpers for the Tensor-API tests (test_tensor_ops.cpp): the two engine
// configurations every scenario runs on, random inputs, float64 host
// references written as the plainest loops over each op's definition
// (independent of ops/src and of reference.h), and comparisons.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "test_rng.h"
#include "test_workers.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/tensor.h"

namespace weft_optest {

using i64 = std::int64_t;
using Vec = std::vector<double>;
using weft::Device;
using weft::Shape;
using weft::Tensor;

// ---- engines ---------------------------------------------------------------

struct EngineSpec {
  std::string kind;
  weft::EngineConfig config() const {
    weft::EngineConfig c;
    c.kind = kind;
    c.cpu_devices = 2;
    c.workers_per_cpu_device = kind == "naive" ? 1 : 2;
    return c;
  }
};

inline const EngineSpec kEngines[] = {{"naive"}, {"threaded"}};

// Runs fn(engine) on a fresh naive engine, then on a fresh threaded one (two
// cpu devices, two workers each). fn must drop its Tensors before returning.
template <class F>
void for_each_engine(F&& fn) {
  for (const EngineSpec& spec : kEngines) {
    INFO("engine: " << spec.kind);
    auto engine = weft::Engine::create(spec.config());
    fn(*engine);
    engine->wait_all();
  }
}

// fn(engine) on the naive engine, then on the threaded one at each worker count.
template <class F>
void for_each_engine_and_workers(F&& fn) {
  std::vector<std::pair<std::string, int>> configs{{"naive", 1}};
  for (int w : weft_test::worker_counts()) configs.emplace_back("threaded", w);
  for (const auto& [kind, workers] : configs) {
    INFO("engine: " << kind << ", workers " << workers);
    weft::EngineConfig c;
    c.kind = kind;
    c.cpu_devices = 2;
    c.workers_per_cpu_device = workers;
    auto engine = weft::Engine::create(c);
    fn(*engine);
    engine->wait_all();
  }
}

// ---- inputs ----------------------------------------------------------------

using weft_test::Rng;

inline Vec dbl(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
inline std::size_t sz(i64 v) { return static_cast<std::size_t>(v); }

// ---- comparisons -----------------------------------------------------------

// |got - want| <= rtol * max(max |want|, floor) for every element; exact when
// the scale is 0. Reports the first element that is off.
inline bool close(const std::vector<float>& got, const Vec& want, const std::string& what, double rtol = 1e-4,
                  double floor = 0.0) {
  if (got.size() != want.size()) {
    FAIL_CHECK(what << ": " << got.size() << " elements, want " << want.size());
    return false;
  }
  double scale = floor;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rtol * scale)) {
      FAIL_CHECK(what << ": element " << i << " is " << got[i] << ", want " << want[i] << " (scale " << scale << ")");
      return false;
    }
  }
  return true;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The message of the weft::Error f() throws; a marker string otherwise.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const weft::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a weft::Error: ") + e.what() + ">";
  } catch (...) {
    return "<not a weft::Error>";
  }
  return "<no exception>";
}

inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// d/dp of loss(p) by central differences in float64, for every element of p.
inline Vec finite_differences(Vec p, const std::function<double(const Vec&)>& loss) {
  Vec g(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    const double h = 1e-6 * std::max(1.0, std::abs(keep));
    p[i] = keep + h;
    const double up = loss(p);
    p[i] = keep - h;
    const double down = loss(p);
    p[i] = keep;
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}

// ---- float64 references ----------------------------------------------------

// C[m, n] = op(A) op(B); A stored [m, k] (or [k, m] when ta), B [k, n] (or [n, k]).
inline Vec matmul(const Vec& a, const Vec& b, i64 m, i64 k, i64 n, bool ta, bool tb) {
  Vec c(sz(m * n), 0.0);
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < n; ++j) {
      double s = 0.0;
      for (i64 p = 0; p < k; ++p) s += a[sz(ta ? p * m + i : i * k + p)] * b[sz(tb ? j * k + p : p * n + j)];
      c[sz(i * n + j)] = s;
    }
  return c;
}

struct Conv {
  i64 n, c, h, w, o, kh, kw, stride, pad;
  i64 oh() const { return (h + 2 * pad - kh) / stride + 1; }
  i64 ow() const { return (w + 2 * pad - kw) / stride + 1; }
  Shape x_shape() const { return Shape{n, c, h, w}; }
  Shape w_shape() const { return Shape{o, c, kh, kw}; }
  Shape y_shape() const { return Shape{n, o, oh(), ow()}; }
  i64 xi(i64 b, i64 ch, i64 y, i64 x) const { return ((b * c + ch) * h + y) * w + x; }
  i64 wi(i64 f, i64 ch, i64 y, i64 x) const { return ((f * c + ch) * kh + y) * kw + x; }
  i64 yi(i64 b, i64 f, i64 y, i64 x) const { return ((b * o + f) * oh() + y) * ow() + x; }
  std::string str() const {
    return "n=" + std::to_string(n) + " c=" + std::to_string(c) + " h=" + std::to_string(h) + " w=" +
           std::to_string(w) + " o=" + std::to_string(o) + " k=" + std::to_string(kh) + "x" + std::to_string(kw) +
           " stride=" + std::to_string(stride) + " pad=" + std::to_string(pad);
  }
};

// Output-centric: each output is its bias plus the window's products.
inline Vec conv_forward(const Conv& g, const Vec& x, const Vec& w, const Vec* b) {
  Vec y(sz(g.n * g.o * g.oh() * g.ow()));
  for (i64 n = 0; n < g.n; ++n)
    for (i64 o = 0; o < g.o; ++o)
      for (i64 oy = 0; oy < g.oh(); ++oy)
        for (i64 ox = 0; ox < g.ow(); ++ox) {
          double s = b ? (*b)[sz(o)] : 0.0;
          for (i64 c = 0; c < g.c; ++c)
            for (i64 ky = 0; ky < g.kh; ++ky)
              for (i64 kx = 0; kx < g.kw; ++kx) {
                const i64 iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
                if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) s += x[sz(g.xi(n, c, iy, ix))] * w[sz(g.wi(o, c, ky, kx))];
              }
          y[sz(g.yi(n, o, oy, ox))] = s;
        }
  return y;
}

// Input-centric: each input gathers the outputs whose windows cover it.
inline Vec conv_backward_data(const Conv& g, const Vec& dy, const Vec& w) {
  Vec dx(sz(g.n * g.c * g.h * g.w));
  for (i64 n = 0; n < g.n; ++n)
    for (i64 c = 0; c < g.c; ++c)
      for (i64 iy = 0; iy < g.h; ++iy)
        for (i64 ix = 0; ix < g.w; ++ix) {
          double s = 0.0;
          for (i64 o = 0; o < g.o; ++o)
            for (i64 ky = 0; ky < g.kh; ++ky)
              for (i64 kx = 0; kx < g.kw; ++kx) {
                const i64 ty = iy + g.pad - ky, tx = ix + g.pad - kx;  // = oy * stride
                if (ty < 0 || tx < 0 || ty % g.stride || tx % g.stride) continue;
                const i64 oy = ty / g.stride, ox = tx / g.stride;
                if (oy >= g.oh() || ox >= g.ow()) continue;
                s += dy[sz(g.yi(n, o, oy, ox))] * w[sz(g.wi(o, c, ky, kx))];
              }
          dx[sz(g.xi(n, c, iy, ix))] = s;
        }
  return dx;
}

inline Vec conv_backward_filter(const Conv& g, const Vec& x, const Vec& dy) {
  Vec dw(sz(g.o * g.c * g.kh * g.kw));
  for (i64 o = 0; o < g.o; ++o)
    for (i64 c = 0; c < g.c; ++c)
      for (i64 ky = 0; ky < g.kh; ++ky)
        for (i64 kx = 0; kx < g.kw; ++kx) {
          double s = 0.0;
          for (i64 n = 0; n < g.n; ++n)
            for (i64 oy = 0; oy < g.oh(); ++oy)
              for (i64 ox = 0; ox < g.ow(); ++ox) {
                const i64 iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
                if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) s += dy[sz(g.yi(n, o, oy, ox))] * x[sz(g.xi(n, c, iy, ix))];
              }
          dw[sz(g.wi(o, c, ky, kx))] = s;
        }
  return dw;
}

inline Vec conv_backward_bias(const Conv& g, const Vec& dy) {
  Vec db(sz(g.o), 0.0);
  for (i64 n = 0; n < g.n; ++n)
    for (i64 o = 0; o < g.o; ++o)
      for (i64 p = 0; p < g.oh() * g.ow(); ++p) db[sz(o)] += dy[sz((n * g.o + o) * g.oh() * g.ow() + p)];
  return db;
}

struct Pool {
  i64 n, c, h, w, kernel, stride;
  i64 oh() const { return (h - kernel) / stride + 1; }
  i64 ow() const { return (w - kernel) / stride + 1; }
  Shape x_shape() const { return Shape{n, c, h, w}; }
  Shape y_shape() const { return Shape{n, c, oh(), ow()}; }
  std::string str() const {
    return "n=" + std::to_string(n) + " c=" + std::to_string(c) + " h=" + std::to_string(h) + " w=" +
           std::to_string(w) + " kernel=" + std::to_string(kernel) + " stride=" + std::to_string(stride);
  }
};

// f(output index, input indices of its window in row-major order)
inline void pool_windows(const Pool& g, const std::function<void(i64, const std::vector<i64>&)>& f) {
  std::vector<i64> win;
  for (i64 plane = 0; plane < g.n * g.c; ++plane)
    for (i64 oy = 0; oy < g.oh(); ++oy)
      for (i64 ox = 0; ox < g.ow(); ++ox) {
        win.clear();
        for (i64 ky = 0; ky < g.kernel; ++ky)
          for (i64 kx = 0; kx < g.kernel; ++kx)
            win.push_back((plane * g.h + oy * g.stride + ky) * g.w + ox * g.stride + kx);
        f((plane * g.oh() + oy) * g.ow() + ox, win);
      }
}

inline Vec avg_pool(const Pool& g, const Vec& x) {
  Vec y(sz(g.n * g.c * g.oh() * g.ow()));
  pool_windows(g, [&](i64 yi, const std::vector<i64>& win) {
    double s = 0.0;
    for (i64 i : win) s += x[sz(i)];
    y[sz(yi)] = s / static_cast<double>(win.size());
  });
  return y;
}

inline Vec avg_pool_backward(const Pool& g, const Vec& dy) {
  Vec dx(sz(g.n * g.c * g.h * g.w), 0.0);
  pool_windows(g, [&](i64 yi, const std::vector<i64>& win) {
    for (i64 i : win) dx[sz(i)] += dy[sz(yi)] / static_cast<double>(win.size());
  });
  return dx;
}

inline i64 window_argmax(const Vec& x, const std::vector<i64>& win) {
  i64 best = win[0];
  for (i64 i : win)
    if (x[sz(i)] > x[sz(best)]) best = i;
  return best;
}

inline Vec max_pool(const Pool& g, const Vec& x) {
  Vec y(sz(g.n * g.c * g.oh() * g.ow()));
  pool_windows(g, [&](i64 yi, const std::vector<i64>& win) { y[sz(yi)] = x[sz(window_argmax(x, win))]; });
  return y;
}

inline Vec max_pool_backward(const Pool& g, const Vec& x, const Vec& dy) {
  Vec dx(x.size(), 0.0);
  pool_windows(g, [&](i64 yi, const std::vector<i64>& win) { dx[sz(window_argmax(x, win))] += dy[sz(yi)]; });
  return dx;
}

// Mean over rows of -log softmax(z)[label], and its gradient.
inline double softmax_ce_loss(const Vec& z, const std::vector<float>& labels, i64 rows, i64 cols) {
  double total = 0.0;
  for (i64 r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (i64 j = 0; j < cols; ++j) m = std::max(m, z[sz(r * cols + j)]);
    double s = 0.0;
    for (i64 j = 0; j < cols; ++j) s += std::exp(z[sz(r * cols + j)] - m);
    total += std::log(s) + m - z[sz(r * cols + static_cast<i64>(labels[sz(r)]))];
  }
  return total / static_cast<double>(rows);
}

inline Vec softmax_ce_grad(const Vec& z, const std::vector<float>& labels, i64 rows, i64 cols) {
  Vec g(z.size());
  for (i64 r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (i64 j = 0; j < cols; ++j) m = std::max(m, z[sz(r * cols + j)]);
    double s = 0.0;
    for (i64 j = 0; j < cols; ++j) s += std::exp(z[sz(r * cols + j)] - m);
    for (i64 j = 0; j < cols; ++j) {
      const double p = std::exp(z[sz(r * cols + j)] - m) / s;
      g[sz(r * cols + j)] = (p - (j == static_cast<i64>(labels[sz(r)]) ? 1.0 : 0.0)) / static_cast<double>(rows);
    }
  }
  return g;
}

}  // namespace weft_optest
