// The transformer's kernels: GELU (tanh form), softmax over the last
// dimension, layer normalization over it and the embedding lookup, forward
// and backward. Rows are independent and split across the arena; every sum
// runs in a fixed order in double, so results never depend on the split.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {
namespace {

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

// tanh in float32 without a libm call, so that GELU's loops vectorize
// (Cephes' tanhf: its error and std::tanh's against a float64 GELU are the
// same): an odd polynomial for |u| < 0.625, else 1 - 2 / (exp(2|u|) + 1)
// with exp by range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial
// (Cephes' expf). 2|u| is capped at 40, where tanh is 1 in float32, so 2^n
// stays a normal number. NaN in gives NaN out. The selects are bit masks:
// with -ftrapping-math GCC keeps `c ? a : b` on floats as a branch.
inline float gelu_select(bool c, float a, float b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(a) & m) | (std::bit_cast<std::uint32_t>(b) & ~m));
}

inline float gelu_exp(float x) {  // x in [0, 40]
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return y * scale;
}

inline float gelu_tanh(float u) {
  const std::uint32_t sign = std::bit_cast<std::uint32_t>(u) & 0x80000000u;
  const float a = std::bit_cast<float>(std::bit_cast<std::uint32_t>(u) & 0x7fffffffu);
  const float z = u * u;
  float small = -5.70498872745e-3f;
  small = small * z + 2.06390887954e-2f;
  small = small * z - 5.37397155531e-2f;
  small = small * z + 1.33314422036e-1f;
  small = small * z - 3.33332819422e-1f;
  small = small * z * u + u;
  const float e = gelu_exp(gelu_select(a < 20.0f, 2.0f * a, 40.0f));
  const float large = std::bit_cast<float>(std::bit_cast<std::uint32_t>(1.0f - 2.0f / (e + 1.0f)) | sign);
  return gelu_select(a < 0.625f, small, gelu_select(u == u, large, u));
}

}  // namespace

void gelu(float* y, const float* x, std::int64_t n) {
  detail::parallel_for(n, detail::grain_for(16), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      const float u = static_cast<float>(kGeluC) * (v + static_cast<float>(kGeluA) * v * v * v);
      y[i] = 0.5f * v * (1.0f + gelu_tanh(u));
    }
  });
}

void gelu_grad(float* dx, const float* x, const float* dy, std::int64_t n) {
  detail::parallel_for(n, detail::grain_for(16), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      const float u = static_cast<float>(kGeluC) * (v + static_cast<float>(kGeluA) * v * v * v);
      const float t = gelu_tanh(u);
      const float du = static_cast<float>(kGeluC) * (1.0f + 3.0f * static_cast<float>(kGeluA) * v * v);
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
  });
}

void softmax_rows(float* y, const float* x, std::int64_t rows, std::int64_t cols) {
  detail::parallel_for(rows, detail::grain_for(cols * 8), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const float* z = x + r * cols;
      float* out = y + r * cols;
      float zmax = z[0];
      for (std::int64_t j = 1; j < cols; ++j) zmax = zmax < z[j] ? z[j] : zmax;
      double denom = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) denom += std::exp(static_cast<double>(z[j]) - zmax);
      const double inv = 1.0 / denom;
      for (std::int64_t j = 0; j < cols; ++j)
        out[j] = static_cast<float>(std::exp(static_cast<double>(z[j]) - zmax) * inv);
    }
  });
}

void softmax_rows_backward(float* dx, const float* y, const float* dy, std::int64_t rows, std::int64_t cols) {
  detail::parallel_for(rows, detail::grain_for(cols * 4), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const float* p = y + r * cols;
      const float* g = dy + r * cols;
      double dot = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) dot += static_cast<double>(p[j]) * g[j];
      float* out = dx + r * cols;
      for (std::int64_t j = 0; j < cols; ++j)
        out[j] = static_cast<float>(static_cast<double>(p[j]) * (static_cast<double>(g[j]) - dot));
    }
  });
}

void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                        std::int64_t rows, std::int64_t cols, float eps) {
  detail::parallel_for(rows, detail::grain_for(cols * 4), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const float* v = x + r * cols;
      double s = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) s += v[j];
      const double m = s / static_cast<double>(cols);
      double ss = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) ss += (v[j] - m) * (v[j] - m);
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + static_cast<double>(eps));
      mean[r] = static_cast<float>(m);
      rstd[r] = static_cast<float>(inv);
      float* out = y + r * cols;
      for (std::int64_t j = 0; j < cols; ++j)
        out[j] = static_cast<float>((v[j] - m) * inv * weight[j] + bias[j]);
    }
  });
}

void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* x, const float* dy, const float* weight,
                         const float* mean, const float* rstd, std::int64_t rows, std::int64_t cols) {
  // dx per row: rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight.
  // dweight and dbias: each fixed chunk of rows (its size depends on the
  // shape only) sums its rows into its own partial row, in order, in double,
  // while it walks them for dx; the partials are then added chunk by chunk, in
  // order. The same bits for every thread count, and x and dy are read row by
  // row once.
  if (rows <= 0 || cols <= 0) {
    std::fill(dweight, dweight + std::max<std::int64_t>(cols, 0), 0.0f);
    std::fill(dbias, dbias + std::max<std::int64_t>(cols, 0), 0.0f);
    return;
  }
  const std::int64_t chunk = std::max<std::int64_t>(64, (rows + 255) / 256);
  const std::int64_t chunks = (rows + chunk - 1) / chunk;
  std::vector<double> part_w(static_cast<std::size_t>(chunks * cols)), part_b(static_cast<std::size_t>(chunks * cols));
  detail::parallel_for(chunks, detail::grain_for(chunk * cols * 8), [&](std::int64_t clo, std::int64_t chi) {
    std::vector<double> g(static_cast<std::size_t>(cols)), xhat(static_cast<std::size_t>(cols));
    for (std::int64_t c = clo; c < chi; ++c) {
      double* pw = part_w.data() + c * cols;
      double* pb = part_b.data() + c * cols;
      std::fill(pw, pw + cols, 0.0);
      std::fill(pb, pb + cols, 0.0);
      for (std::int64_t r = c * chunk; r < std::min(rows, (c + 1) * chunk); ++r) {
        const float* v = x + r * cols;
        const float* d = dy + r * cols;
        const double m = mean[r], inv = rstd[r];
        double sg = 0.0, sgx = 0.0;
        for (std::int64_t j = 0; j < cols; ++j) {
          const double dj = d[j];
          const double h = (v[j] - m) * inv;
          const double gj = dj * weight[j];
          g[static_cast<std::size_t>(j)] = gj;
          xhat[static_cast<std::size_t>(j)] = h;
          sg += gj;
          sgx += gj * h;
          pw[j] += dj * h;
          pb[j] += dj;
        }
        const double mg = sg / static_cast<double>(cols), mgx = sgx / static_cast<double>(cols);
        float* out = dx + r * cols;
        for (std::int64_t j = 0; j < cols; ++j)
          out[j] = static_cast<float>(inv * (g[static_cast<std::size_t>(j)] - mg - xhat[static_cast<std::size_t>(j)] * mgx));
      }
    }
  });
  detail::parallel_for(cols, detail::grain_for(chunks * 2), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t j = lo; j < hi; ++j) {
      double sw = 0.0, sb = 0.0;
      for (std::int64_t c = 0; c < chunks; ++c) {
        sw += part_w[static_cast<std::size_t>(c * cols + j)];
        sb += part_b[static_cast<std::size_t>(c * cols + j)];
      }
      dweight[j] = static_cast<float>(sw);
      dbias[j] = static_cast<float>(sb);
    }
  });
}

}  // namespace weft::kernels::cpu

namespace weft::kernels::cpu {
namespace {

// The position of the first id that is not a row index in [0, vocab), or -1.
std::int64_t first_bad_id(const float* ids, std::int64_t n, std::int64_t vocab) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = ids[i];
    if (!(v >= 0.0f) || !(static_cast<double>(v) < static_cast<double>(vocab)) || std::floor(v) != v) return i;
  }
  return -1;
}

}  // namespace

std::int64_t embedding_forward(float* y, const float* weight, const float* ids, std::int64_t n, std::int64_t vocab,
                               std::int64_t width) {
  if (const std::int64_t bad = first_bad_id(ids, n, vocab); bad >= 0) return bad;
  detail::parallel_for(n, detail::grain_for(width), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const float* row = weight + static_cast<std::int64_t>(ids[i]) * width;
      float* out = y + i * width;
      for (std::int64_t j = 0; j < width; ++j) out[j] = row[j];
    }
  });
  return -1;
}

std::int64_t embedding_backward(float* dweight, const float* ids, const float* dy, std::int64_t n, std::int64_t vocab,
                                std::int64_t width) {
  if (const std::int64_t bad = first_bad_id(ids, n, vocab); bad >= 0) return bad;
  // Counting sort of the positions by id (stable: each row's positions in
  // increasing order), then each row sums its positions in that order.
  std::vector<std::int64_t> start(static_cast<std::size_t>(vocab) + 1, 0), order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ++start[static_cast<std::size_t>(ids[i]) + 1];
  for (std::int64_t v = 0; v < vocab; ++v) start[static_cast<std::size_t>(v) + 1] += start[static_cast<std::size_t>(v)];
  {
    std::vector<std::int64_t> next(start.begin(), start.end() - 1);
    for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(next[static_cast<std::size_t>(ids[i])]++)] = i;
  }
  detail::parallel_for(vocab, detail::grain_for(width + 2 * n / std::max<std::int64_t>(vocab, 1)),
                       [&](std::int64_t lo, std::int64_t hi) {
                         for (std::int64_t v = lo; v < hi; ++v) {
                           float* out = dweight + v * width;
                           for (std::int64_t j = 0; j < width; ++j) out[j] = 0.0f;
                           for (std::int64_t k = start[static_cast<std::size_t>(v)];
                                k < start[static_cast<std::size_t>(v) + 1]; ++k) {
                             const float* g = dy + order[static_cast<std::size_t>(k)] * width;
                             for (std::int64_t j = 0; j < width; ++j) out[j] += g[j];
                           }
                         }
                       });
  return -1;
}

}  // namespace weft::kernels::cpu
