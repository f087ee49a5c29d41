// Plain float64 reference implementations of the CPU kernels, written as the
// most direct loops over the definitions (no im2col, no blocking), for the
// kernel tests to compare against, plus small helpers to build inputs and
// compare outputs.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "conv_geometry.h"
#include "test_rng.h"

namespace weft_test::ref {

using weft::kernels::ConvGeometry;
using weft::kernels::BatchNormGeometry;
using weft::kernels::PoolGeometry;
using i64 = std::int64_t;
using Vec = std::vector<double>;

// ---- inputs and comparisons ------------------------------------------------

using weft_test::Rng;

inline Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// |got - want| <= rtol * max |want| for every element (exact equality when
// want is all zeros); reports the first element that is off.
inline void check_close(const std::vector<float>& got, const Vec& want, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what);
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rtol * scale)) {
      FAIL_CHECK(what << ": element " << i << " is " << got[i] << ", want " << want[i] << " (scale " << scale << ")");
      return;
    }
  }
}

// ---- BLAS and layers -------------------------------------------------------

// C = alpha * op(A) * op(B) + beta * C on the m x n block of C (row stride ldc).
inline void gemm(bool ta, bool tb, i64 m, i64 n, i64 k, double alpha, const Vec& a, i64 lda, const Vec& b, i64 ldb,
                 double beta, Vec& c, i64 ldc) {
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < n; ++j) {
      double s = 0.0;
      for (i64 p = 0; p < k; ++p) {
        const double av = ta ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)];
        const double bv = tb ? b[static_cast<std::size_t>(j * ldb + p)] : b[static_cast<std::size_t>(p * ldb + j)];
        s += av * bv;
      }
      double& cv = c[static_cast<std::size_t>(i * ldc + j)];
      cv = alpha * s + (beta == 0.0 ? 0.0 : beta * cv);
    }
}

inline Vec dense_forward(const Vec& x, const Vec& w, const Vec* b, i64 batch, i64 in, i64 out) {
  Vec y(static_cast<std::size_t>(batch * out));
  for (i64 r = 0; r < batch; ++r)
    for (i64 o = 0; o < out; ++o) {
      double s = b ? (*b)[static_cast<std::size_t>(o)] : 0.0;
      for (i64 i = 0; i < in; ++i) s += x[static_cast<std::size_t>(r * in + i)] * w[static_cast<std::size_t>(o * in + i)];
      y[static_cast<std::size_t>(r * out + o)] = s;
    }
  return y;
}

inline i64 conv_out(i64 in, i64 pad, i64 k, i64 stride) { return in + 2 * pad < k ? 0 : (in + 2 * pad - k) / stride + 1; }

// Calls f(x index, w index, y index) for every multiply-add of the convolution.
template <class F>
void conv_for_each(const ConvGeometry& g, F f) {
  const i64 oh = conv_out(g.h, g.pad, g.kh, g.stride), ow = conv_out(g.w, g.pad, g.kw, g.stride);
  for (i64 n = 0; n < g.n; ++n)
    for (i64 o = 0; o < g.o; ++o)
      for (i64 y = 0; y < oh; ++y)
        for (i64 xo = 0; xo < ow; ++xo)
          for (i64 c = 0; c < g.c; ++c)
            for (i64 ki = 0; ki < g.kh; ++ki)
              for (i64 kj = 0; kj < g.kw; ++kj) {
                const i64 ih = y * g.stride - g.pad + ki, iw = xo * g.stride - g.pad + kj;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                f(((n * g.c + c) * g.h + ih) * g.w + iw, ((o * g.c + c) * g.kh + ki) * g.kw + kj,
                  ((n * g.o + o) * oh + y) * ow + xo);
              }
}

inline i64 conv_y_size(const ConvGeometry& g) {
  return g.n * g.o * conv_out(g.h, g.pad, g.kh, g.stride) * conv_out(g.w, g.pad, g.kw, g.stride);
}

inline Vec conv_forward(const Vec& x, const Vec& w, const Vec* b, const ConvGeometry& g) {
  Vec y(static_cast<std::size_t>(conv_y_size(g)), 0.0);
  const i64 plane = conv_out(g.h, g.pad, g.kh, g.stride) * conv_out(g.w, g.pad, g.kw, g.stride);
  if (b)
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = (*b)[static_cast<std::size_t>((static_cast<i64>(i) / plane) % g.o)];
  conv_for_each(g, [&](i64 xi, i64 wi, i64 yi) {
    y[static_cast<std::size_t>(yi)] += x[static_cast<std::size_t>(xi)] * w[static_cast<std::size_t>(wi)];
  });
  return y;
}

inline Vec conv_backward_data(const Vec& dy, const Vec& w, const ConvGeometry& g) {
  Vec dx(static_cast<std::size_t>(g.n * g.c * g.h * g.w), 0.0);
  conv_for_each(g, [&](i64 xi, i64 wi, i64 yi) {
    dx[static_cast<std::size_t>(xi)] += dy[static_cast<std::size_t>(yi)] * w[static_cast<std::size_t>(wi)];
  });
  return dx;
}

inline Vec conv_backward_filter(const Vec& x, const Vec& dy, const ConvGeometry& g) {
  Vec dw(static_cast<std::size_t>(g.o * g.c * g.kh * g.kw), 0.0);
  conv_for_each(g, [&](i64 xi, i64 wi, i64 yi) {
    dw[static_cast<std::size_t>(wi)] += dy[static_cast<std::size_t>(yi)] * x[static_cast<std::size_t>(xi)];
  });
  return dw;
}

inline Vec conv_backward_bias(const Vec& dy, const ConvGeometry& g) {
  Vec db(static_cast<std::size_t>(g.o), 0.0);
  const i64 plane = conv_out(g.h, g.pad, g.kh, g.stride) * conv_out(g.w, g.pad, g.kw, g.stride);
  for (std::size_t i = 0; i < dy.size(); ++i) db[static_cast<std::size_t>((static_cast<i64>(i) / plane) % g.o)] += dy[i];
  return db;
}

// ---- pooling ---------------------------------------------------------------

inline i64 pool_out(i64 in, i64 k, i64 s, i64 pad = 0) { return in + 2 * pad < k ? 0 : (in + 2 * pad - k) / s + 1; }
inline i64 pool_y_size(const PoolGeometry& g) {
  return g.n * g.c * pool_out(g.h, g.kernel, g.stride, g.pad) * pool_out(g.w, g.kernel, g.stride, g.pad);
}

// Calls f(y index, x indices of the window inside the input, in row-major
// order); positions in the padding are left out.
template <class F>
void pool_for_each(const PoolGeometry& g, F f) {
  const i64 oh = pool_out(g.h, g.kernel, g.stride, g.pad), ow = pool_out(g.w, g.kernel, g.stride, g.pad);
  std::vector<i64> win;
  for (i64 p = 0; p < g.n * g.c; ++p)
    for (i64 y = 0; y < oh; ++y)
      for (i64 x = 0; x < ow; ++x) {
        win.clear();
        for (i64 i = 0; i < g.kernel; ++i)
          for (i64 j = 0; j < g.kernel; ++j) {
            const i64 r = y * g.stride - g.pad + i, c = x * g.stride - g.pad + j;
            if (r >= 0 && r < g.h && c >= 0 && c < g.w) win.push_back((p * g.h + r) * g.w + c);
          }
        f((p * oh + y) * ow + x, win);
      }
}

// Averages divide by the whole window, padding included (count_include_pad).
inline Vec avg_pool_forward(const Vec& x, const PoolGeometry& g) {
  Vec y(static_cast<std::size_t>(pool_y_size(g)));
  const double area = static_cast<double>(g.kernel * g.kernel);
  pool_for_each(g, [&](i64 yi, const std::vector<i64>& win) {
    double s = 0.0;
    for (i64 xi : win) s += x[static_cast<std::size_t>(xi)];
    y[static_cast<std::size_t>(yi)] = s / area;
  });
  return y;
}

inline Vec avg_pool_backward(const Vec& dy, const PoolGeometry& g) {
  Vec dx(static_cast<std::size_t>(g.n * g.c * g.h * g.w), 0.0);
  const double area = static_cast<double>(g.kernel * g.kernel);
  pool_for_each(g, [&](i64 yi, const std::vector<i64>& win) {
    for (i64 xi : win) dx[static_cast<std::size_t>(xi)] += dy[static_cast<std::size_t>(yi)] / area;
  });
  return dx;
}

// The first element of the window holding its largest value.
inline i64 first_max(const Vec& x, const std::vector<i64>& win) {
  i64 best = win[0];
  for (i64 xi : win)
    if (x[static_cast<std::size_t>(xi)] > x[static_cast<std::size_t>(best)]) best = xi;
  return best;
}

inline Vec max_pool_forward(const Vec& x, const PoolGeometry& g) {
  Vec y(static_cast<std::size_t>(pool_y_size(g)));
  pool_for_each(g, [&](i64 yi, const std::vector<i64>& win) {
    y[static_cast<std::size_t>(yi)] = x[static_cast<std::size_t>(first_max(x, win))];
  });
  return y;
}

inline Vec max_pool_backward(const Vec& x, const Vec& dy, const PoolGeometry& g) {
  Vec dx(x.size(), 0.0);
  pool_for_each(g, [&](i64 yi, const std::vector<i64>& win) {
    dx[static_cast<std::size_t>(first_max(x, win))] += dy[static_cast<std::size_t>(yi)];
  });
  return dx;
}

inline Vec global_avg_pool_forward(const Vec& x, i64 planes, i64 hw) {
  Vec y(static_cast<std::size_t>(planes), 0.0);
  for (i64 p = 0; p < planes; ++p) {
    for (i64 i = 0; i < hw; ++i) y[static_cast<std::size_t>(p)] += x[static_cast<std::size_t>(p * hw + i)];
    if (hw > 0) y[static_cast<std::size_t>(p)] /= static_cast<double>(hw);
  }
  return y;
}

// ---- batch normalization ---------------------------------------------------
// x as [n, c, hw]; statistics per channel, straight from the definitions.

struct BatchNormRef {
  Vec y, mean, var;  // var: biased, the one that normalizes
};

inline BatchNormRef batch_norm_forward(const Vec& x, const Vec& gamma, const Vec& beta, i64 n, i64 c, i64 hw,
                                       double eps) {
  BatchNormRef r{Vec(x.size()), Vec(static_cast<std::size_t>(c), 0.0), Vec(static_cast<std::size_t>(c), 0.0)};
  const double m = static_cast<double>(n * hw);
  auto at = [&](i64 i, i64 ch, i64 j) { return static_cast<std::size_t>((i * c + ch) * hw + j); };
  for (i64 ch = 0; ch < c; ++ch) {
    const auto k = static_cast<std::size_t>(ch);
    for (i64 i = 0; i < n; ++i)
      for (i64 j = 0; j < hw; ++j) r.mean[k] += x[at(i, ch, j)] / m;
    for (i64 i = 0; i < n; ++i)
      for (i64 j = 0; j < hw; ++j) r.var[k] += (x[at(i, ch, j)] - r.mean[k]) * (x[at(i, ch, j)] - r.mean[k]) / m;
    for (i64 i = 0; i < n; ++i)
      for (i64 j = 0; j < hw; ++j)
        r.y[at(i, ch, j)] = (x[at(i, ch, j)] - r.mean[k]) / std::sqrt(r.var[k] + eps) * gamma[k] + beta[k];
  }
  return r;
}

inline Vec batch_norm_infer(const Vec& x, const Vec& gamma, const Vec& beta, const Vec& mean, const Vec& var, i64 n,
                            i64 c, i64 hw, double eps) {
  Vec y(x.size());
  for (i64 i = 0; i < n; ++i)
    for (i64 ch = 0; ch < c; ++ch)
      for (i64 j = 0; j < hw; ++j) {
        const auto k = static_cast<std::size_t>(ch), e = static_cast<std::size_t>((i * c + ch) * hw + j);
        y[e] = (x[e] - mean[k]) / std::sqrt(var[k] + eps) * gamma[k] + beta[k];
      }
  return y;
}

// ---- loss ------------------------------------------------------------------

// Mean over rows of log(sum_j exp(z_j)) - z_label, via the shifted log-sum-exp.
inline double softmax_ce_loss(const Vec& z, const std::vector<float>& labels, i64 rows, i64 cols) {
  if (rows == 0) return 0.0;
  double total = 0.0;
  for (i64 r = 0; r < rows; ++r) {
    const double* row = z.data() + r * cols;
    const double m = *std::max_element(row, row + cols);
    double s = 0.0;
    for (i64 j = 0; j < cols; ++j) s += std::exp(row[j] - m);
    total += m + std::log(s) - row[static_cast<i64>(labels[static_cast<std::size_t>(r)])];
  }
  return total / static_cast<double>(rows);
}

inline Vec softmax_ce_grad(const Vec& z, const std::vector<float>& labels, i64 rows, i64 cols) {
  Vec g(z.size());
  for (i64 r = 0; r < rows; ++r) {
    const double* row = z.data() + r * cols;
    const double m = *std::max_element(row, row + cols);
    double s = 0.0;
    for (i64 j = 0; j < cols; ++j) s += std::exp(row[j] - m);
    for (i64 j = 0; j < cols; ++j) {
      const double p = std::exp(row[j] - m) / s - (j == static_cast<i64>(labels[static_cast<std::size_t>(r)]) ? 1.0 : 0.0);
      g[static_cast<std::size_t>(r * cols + j)] = p / static_cast<double>(rows);
    }
  }
  return g;
}

// ---- finite differences ----------------------------------------------------

// Central differences of the scalar f at x, element by element (x is restored).
template <class F>
Vec numeric_grad(F f, Vec& x, double h) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f();
    x[i] = keep - h;
    const double down = f();
    x[i] = keep;
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace weft_test::ref
