// 2-D pooling without padding. Every (image, channel) plane is independent,
// so planes are the parallel axis; backward walks one plane's windows in
// order, which keeps overlapping windows (stride < kernel) deterministic.
#include <algorithm>
#include <string>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "weft/error.h"

namespace weft::kernels::cpu {
namespace {

struct Dims {
  std::int64_t planes, oh, ow, hw, ohw;
};

Dims dims(const PoolGeometry& g) {
  if (g.kernel < 1 || g.stride < 1 || g.n < 0 || g.c < 0 || g.h < 0 || g.w < 0)
    throw Error("pool2d: invalid geometry (kernel " + std::to_string(g.kernel) + ", stride " +
                std::to_string(g.stride) + ")");
  Dims d{};
  d.planes = g.n * g.c;
  // A window larger than the input gives an empty output (out_h() would
  // round the negative span toward zero and claim one row).
  d.oh = g.h < g.kernel ? 0 : (g.h - g.kernel) / g.stride + 1;
  d.ow = g.w < g.kernel ? 0 : (g.w - g.kernel) / g.stride + 1;
  d.hw = g.h * g.w;
  d.ohw = d.oh * d.ow;
  return d;
}

// Offset, within the window starting at `win`, of its first largest element
// in row-major order. Forward and backward both use it, so the gradient goes
// exactly where the forward value came from.
std::int64_t first_max(const float* win, std::int64_t row_stride, std::int64_t k) {
  std::int64_t best = 0;
  float best_v = win[0];
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < k; ++j) {
      const float v = win[i * row_stride + j];
      if (v > best_v) {
        best_v = v;
        best = i * row_stride + j;
      }
    }
  return best;
}

std::int64_t plane_grain(const PoolGeometry& g, const Dims& d) {
  return detail::grain_for(std::max(d.hw, d.ohw * g.kernel * g.kernel));
}

}  // namespace

void avg_pool2d_forward(float* y, const float* x, const PoolGeometry& g) {
  const Dims d = dims(g);
  if (d.ohw == 0) return;
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  detail::parallel_for(d.planes, plane_grain(g, d), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const float* xp = x + p * d.hw;
      float* yp = y + p * d.ohw;
      for (std::int64_t oh = 0; oh < d.oh; ++oh)
        for (std::int64_t ow = 0; ow < d.ow; ++ow) {
          const float* win = xp + oh * g.stride * g.w + ow * g.stride;
          float s = 0.0f;
          for (std::int64_t i = 0; i < g.kernel; ++i)
            for (std::int64_t j = 0; j < g.kernel; ++j) s += win[i * g.w + j];
          yp[oh * d.ow + ow] = s * inv;
        }
    }
  });
}

void avg_pool2d_backward(float* dx, const float* dy, const PoolGeometry& g) {
  const Dims d = dims(g);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  detail::parallel_for(d.planes, plane_grain(g, d), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      float* dxp = dx + p * d.hw;
      const float* dyp = dy + p * d.ohw;
      std::fill(dxp, dxp + d.hw, 0.0f);
      for (std::int64_t oh = 0; oh < d.oh; ++oh)
        for (std::int64_t ow = 0; ow < d.ow; ++ow) {
          float* win = dxp + oh * g.stride * g.w + ow * g.stride;
          const float gv = dyp[oh * d.ow + ow] * inv;
          for (std::int64_t i = 0; i < g.kernel; ++i)
            for (std::int64_t j = 0; j < g.kernel; ++j) win[i * g.w + j] += gv;
        }
    }
  });
}

void max_pool2d_forward(float* y, const float* x, const PoolGeometry& g) {
  const Dims d = dims(g);
  if (d.ohw == 0) return;
  detail::parallel_for(d.planes, plane_grain(g, d), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const float* xp = x + p * d.hw;
      float* yp = y + p * d.ohw;
      for (std::int64_t oh = 0; oh < d.oh; ++oh)
        for (std::int64_t ow = 0; ow < d.ow; ++ow) {
          const float* win = xp + oh * g.stride * g.w + ow * g.stride;
          yp[oh * d.ow + ow] = win[first_max(win, g.w, g.kernel)];
        }
    }
  });
}

void max_pool2d_backward(float* dx, const float* x, const float* dy, const PoolGeometry& g) {
  const Dims d = dims(g);
  detail::parallel_for(d.planes, plane_grain(g, d), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const float* xp = x + p * d.hw;
      float* dxp = dx + p * d.hw;
      const float* dyp = dy + p * d.ohw;
      std::fill(dxp, dxp + d.hw, 0.0f);
      for (std::int64_t oh = 0; oh < d.oh; ++oh)
        for (std::int64_t ow = 0; ow < d.ow; ++ow) {
          const std::int64_t start = oh * g.stride * g.w + ow * g.stride;
          dxp[start + first_max(xp + start, g.w, g.kernel)] += dyp[oh * d.ow + ow];
        }
    }
  });
}

}  // namespace weft::kernels::cpu
