// 2-D pooling with implicit padding, and global average pooling. Every
// (image, channel) plane is independent, so planes are the parallel axis;
// backward walks one plane's windows in order, which keeps overlapping
// windows (stride < kernel) deterministic.
//
// Channels-last data (PoolGeometry::nhwc) goes through the same loops with
// strided planes (Planes below), so both layouts give the same bits.
//
// A window is clipped to the input: padded positions never win a max, and an
// average divides by kernel * kernel whatever the clipping (PyTorch's
// count_include_pad, the default of its AvgPool2d).
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

std::int64_t out_extent(std::int64_t in, std::int64_t pad, std::int64_t k, std::int64_t stride) {
  // A window larger than the padded input gives an empty output (out_h()
  // would round the negative span toward zero and claim one row).
  const std::int64_t span = in + 2 * pad - k;
  return span < 0 ? 0 : span / stride + 1;
}

Dims dims(const PoolGeometry& g) {
  if (g.kernel < 1 || g.stride < 1 || g.pad < 0 || 2 * g.pad > g.kernel || g.n < 0 || g.c < 0 || g.h < 0 || g.w < 0)
    throw Error("pool2d: invalid geometry (kernel " + std::to_string(g.kernel) + ", stride " +
                std::to_string(g.stride) + ", pad " + std::to_string(g.pad) + ")");
  Dims d{};
  d.planes = g.n * g.c;
  d.oh = out_extent(g.h, g.pad, g.kernel, g.stride);
  d.ow = out_extent(g.w, g.pad, g.kernel, g.stride);
  d.hw = g.h * g.w;
  d.ohw = d.oh * d.ow;
  return d;
}

// The part of output window (oh, ow) that lies inside the input: rows
// [r0, r1), columns [c0, c1).
struct Window {
  std::int64_t r0, r1, c0, c1;
};

Window window(const PoolGeometry& g, std::int64_t oh, std::int64_t ow) {
  const std::int64_t r = oh * g.stride - g.pad, c = ow * g.stride - g.pad;
  return Window{std::max<std::int64_t>(r, 0), std::min(r + g.kernel, g.h), std::max<std::int64_t>(c, 0),
                std::min(c + g.kernel, g.w)};
}

// Plane offset of the window's first largest element in row-major order.
// Forward and backward both use it, so the gradient goes exactly where the
// forward value came from.
std::int64_t first_max(const float* plane, std::int64_t w, const Window& win, std::int64_t st) {
  std::int64_t best = win.r0 * w + win.c0;
  float best_v = plane[best * st];
  for (std::int64_t i = win.r0; i < win.r1; ++i)
    for (std::int64_t j = win.c0; j < win.c1; ++j) {
      const float v = plane[(i * w + j) * st];
      if (v > best_v) {
        best_v = v;
        best = i * w + j;
      }
    }
  return best;
}

std::int64_t plane_grain(const PoolGeometry& g, const Dims& d) {
  return detail::grain_for(std::max(d.hw, d.ohw * g.kernel * g.kernel));
}

// body(plane index) for every plane, in parallel.
template <class Body>
void for_planes(const PoolGeometry& g, const Dims& d, const Body& body) {
  detail::parallel_for(d.planes, plane_grain(g, d), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) body(p);
  });
}

// Where plane p (image p / C, channel p % C) starts in the input (hw
// values) and in the output (ohw values), and the step between its values.
struct Planes {
  std::int64_t c, hw, ohw, step;
  bool nhwc;
  std::int64_t in(std::int64_t p) const noexcept { return nhwc ? (p / c) * hw * c + p % c : p * hw; }
  std::int64_t out(std::int64_t p) const noexcept { return nhwc ? (p / c) * ohw * c + p % c : p * ohw; }
};
Planes planes(const PoolGeometry& g, const Dims& d) { return Planes{g.c, d.hw, d.ohw, g.nhwc ? g.c : 1, g.nhwc}; }

}  // namespace

void avg_pool2d_forward(float* y, const float* x, const PoolGeometry& g) {
  const Dims d = dims(g);
  if (d.ohw == 0) return;
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const Planes pl = planes(g, d);
  const std::int64_t st = pl.step;
  for_planes(g, d, [&](std::int64_t p) {
    const float* xp = x + pl.in(p);
    float* yp = y + pl.out(p);
    for (std::int64_t oh = 0; oh < d.oh; ++oh)
      for (std::int64_t ow = 0; ow < d.ow; ++ow) {
        const Window win = window(g, oh, ow);
        float s = 0.0f;
        for (std::int64_t i = win.r0; i < win.r1; ++i)
          for (std::int64_t j = win.c0; j < win.c1; ++j) s += xp[(i * g.w + j) * st];
        yp[(oh * d.ow + ow) * st] = s * inv;
      }
  });
}

void avg_pool2d_backward(float* dx, const float* dy, const PoolGeometry& g) {
  const Dims d = dims(g);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const Planes pl = planes(g, d);
  const std::int64_t st = pl.step;
  for_planes(g, d, [&](std::int64_t p) {
    float* dxp = dx + pl.in(p);
    const float* dyp = dy + pl.out(p);
    for (std::int64_t i = 0; i < d.hw; ++i) dxp[i * st] = 0.0f;
    for (std::int64_t oh = 0; oh < d.oh; ++oh)
      for (std::int64_t ow = 0; ow < d.ow; ++ow) {
        const Window win = window(g, oh, ow);
        const float gv = dyp[(oh * d.ow + ow) * st] * inv;
        for (std::int64_t i = win.r0; i < win.r1; ++i)
          for (std::int64_t j = win.c0; j < win.c1; ++j) dxp[(i * g.w + j) * st] += gv;
      }
  });
}

void max_pool2d_forward(float* y, const float* x, const PoolGeometry& g) {
  const Dims d = dims(g);
  if (d.ohw == 0) return;
  const Planes pl = planes(g, d);
  const std::int64_t st = pl.step;
  for_planes(g, d, [&](std::int64_t p) {
    const float* xp = x + pl.in(p);
    float* yp = y + pl.out(p);
    for (std::int64_t oh = 0; oh < d.oh; ++oh)
      for (std::int64_t ow = 0; ow < d.ow; ++ow)
        yp[(oh * d.ow + ow) * st] = xp[first_max(xp, g.w, window(g, oh, ow), st) * st];
  });
}

void max_pool2d_backward(float* dx, const float* x, const float* dy, const PoolGeometry& g) {
  const Dims d = dims(g);
  const Planes pl = planes(g, d);
  const std::int64_t st = pl.step;
  for_planes(g, d, [&](std::int64_t p) {
    const float* xp = x + pl.in(p);
    float* dxp = dx + pl.in(p);
    const float* dyp = dy + pl.out(p);
    for (std::int64_t i = 0; i < d.hw; ++i) dxp[i * st] = 0.0f;
    for (std::int64_t oh = 0; oh < d.oh; ++oh)
      for (std::int64_t ow = 0; ow < d.ow; ++ow)
        dxp[first_max(xp, g.w, window(g, oh, ow), st) * st] += dyp[(oh * d.ow + ow) * st];
  });
}

void global_avg_pool2d_forward(float* y, const float* x, std::int64_t planes, std::int64_t hw) {
  if (hw <= 0) {
    std::fill(y, y + std::max<std::int64_t>(planes, 0), 0.0f);  // nothing to average: 0, as an empty window
    return;
  }
  const double inv = 1.0 / static_cast<double>(hw);
  detail::parallel_for(planes, detail::grain_for(hw), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const float* xp = x + p * hw;
      double s = 0.0;
      for (std::int64_t i = 0; i < hw; ++i) s += xp[i];
      y[p] = static_cast<float>(s * inv);
    }
  });
}

void global_avg_pool2d_backward(float* dx, const float* dy, std::int64_t planes, std::int64_t hw) {
  if (hw <= 0) return;
  const float inv = static_cast<float>(1.0 / static_cast<double>(hw));
  detail::parallel_for(planes, detail::grain_for(hw), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) std::fill(dx + p * hw, dx + (p + 1) * hw, dy[p] * inv);
  });
}

void global_avg_pool2d_forward_nhwc(float* y, const float* x, std::int64_t n, std::int64_t hw, std::int64_t c) {
  if (hw <= 0) {
    std::fill(y, y + std::max<std::int64_t>(n * c, 0), 0.0f);
    return;
  }
  const double inv = 1.0 / static_cast<double>(hw);
  // Each (image, channel) in NCHW's order of values, so the sums are NCHW's bits.
  detail::parallel_for(n * c, detail::grain_for(hw), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const float* xp = x + (p / c) * hw * c + p % c;
      double s = 0.0;
      for (std::int64_t i = 0; i < hw; ++i) s += xp[i * c];
      y[p] = static_cast<float>(s * inv);
    }
  });
}

void global_avg_pool2d_backward_nhwc(float* dx, const float* dy, std::int64_t n, std::int64_t hw, std::int64_t c) {
  if (hw <= 0) return;
  const float inv = static_cast<float>(1.0 / static_cast<double>(hw));
  detail::parallel_for(n * hw, detail::grain_for(c), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const float* dyi = dy + (r / hw) * c;
      float* dxr = dx + r * c;
      for (std::int64_t k = 0; k < c; ++k) dxr[k] = dyi[k] * inv;
    }
  });
}

}  // namespace weft::kernels::cpu
